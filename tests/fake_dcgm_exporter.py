"""A dcgm-exporter for tests: ``/metrics`` served over HTTP from a thread of its own, as a real
exporter (another process) answers whatever the governor's event loop is doing. A subclass says
what a GET answers (``answer``)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeExporter:
    def __init__(self) -> None:
        outer = self

        class Metrics(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.answer(self)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, request: BaseHTTPRequestHandler) -> None:
        """Write the answer to ``request`` (a GET of any path)."""
        raise NotImplementedError

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
