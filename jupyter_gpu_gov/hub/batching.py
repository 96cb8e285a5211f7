"""A performance measure, kept apart: accepting the reports' connections in batches
(docs/benchmarks.md, "Report ingest over HTTP"). With ``accept_interval`` 0 it is tornado's
plain ``HTTPServer``."""

from __future__ import annotations

import contextlib
import resource

from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop

from ..core.wire import REPORT_CONNECTION_IDLE_S

# Connections the kernel keeps waiting for the service to accept (tornado's default: 128). At
# 10,000 servers 167 come a second, and the batching leaves them waiting by design; when the
# loop stalls longer than 0.8 s (a starved CPU), 128 overflow, and a dropped connection is
# tried again by the server's kernel only 1, 3, 7, 15... s later: a report late by seconds
# (docs/benchmarks.md, "Issue 26, wave 8"). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 1024


class BatchingHTTPServer(HTTPServer):
    """An ``HTTPServer`` that accepts connections in batches: once it has accepted, it leaves
    new connections in the listen queue for ``accept_interval`` seconds, then takes all that
    came meanwhile at once.

    Why: at 10,000 servers a report arrives every 6 ms, each on its own connection, and a lone
    request costs the service several times the CPU of one answered right after another (the
    interpreter's caches have gone cold in between). Taken a few at a time, the reports cost
    less CPU, for at most ``accept_interval`` more latency (the figures: docs/benchmarks.md). It batches only while connections come fast enough for a pause to gather two
    or more (over the last second, at least ``2 / accept_interval`` a second); slower, each is
    accepted at once. Connections already accepted (keep-alive) are never held back, nor is
    anything the service itself sends (Hub API calls, checkpoint requests).
    """

    def initialize(self, *args, accept_interval: float = 0.0, **kwargs) -> None:
        # Each server keeps its report connection open between reports (server/reporter.py):
        # closed once idle longer than a report interval, and a file descriptor per server.
        kwargs.setdefault("idle_connection_timeout", REPORT_CONNECTION_IDLE_S)
        _allow_open_files()
        super().initialize(*args, **kwargs)
        self.accept_interval = accept_interval
        self._batch_fds: list[int] = []
        self._batch_paused = False
        self._batch_stopped = False
        self._batch_rate = 0.0  # connections a second over the last window (>= 1 s)
        self._batch_count = 0
        self._batch_window = 0.0

    def add_sockets(self, sockets) -> None:
        sockets = list(sockets)
        super().add_sockets(sockets)
        self._batch_fds.extend(sock.fileno() for sock in sockets)

    def handle_stream(self, stream, address) -> None:
        super().handle_stream(stream, address)
        if self.accept_interval <= 0:
            return
        loop = IOLoop.current()
        now = loop.time()
        if now - self._batch_window >= 1.0:
            self._batch_rate = self._batch_count / (now - self._batch_window)
            self._batch_window, self._batch_count = now, 0
        self._batch_count += 1
        worth_it = self._batch_rate * self.accept_interval >= 2
        if worth_it and not self._batch_paused and not self._batch_stopped:
            # Stop watching the listening sockets (the connections already waiting are still
            # taken by the accept loop this one came from) until the interval is over.
            self._batch_paused = True
            for fd in self._batch_fds:
                loop.update_handler(fd, 0)
            loop.call_later(self.accept_interval, self._resume)

    def _resume(self) -> None:
        self._batch_paused = False
        if not self._batch_stopped:
            loop = IOLoop.current()
            for fd in self._batch_fds:
                loop.update_handler(fd, IOLoop.READ)

    def stop(self) -> None:
        self._batch_stopped = True
        super().stop()


def _allow_open_files() -> None:
    """Raise the soft limit on open files to the hard one: a connection kept per reporting
    server would pass a soft limit of 1,024 at about a thousand servers (accept then fails)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # ValueError: an unlimited hard limit above the kernel's ceiling; then the soft one stays.
    with contextlib.suppress(ValueError, OSError):
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
