"""The floor under a report's CPU: what a server costs per request before any of our code runs.

    python -m benchmarks.http_floor [--requests 3000] [--rate 167] [--rounds 2]

Each server answers ``POST /services/gpu-gov/api/reports`` with a fixed 12-byte JSON body and
does nothing else: no token check, no parsing of the body, no governor. This process sends
``--requests`` requests of a report's size (2.4 kB), each on a new connection (as a server's
reporter does at the default 60 s interval), paced at ``--rate`` a second (167: 10,000 servers
reporting every minute), and reads the server's CPU (utime + stime, ``/proc/<pid>/stat``) over
them. The servers:

- ``tornado``: a ``tornado.web.RequestHandler`` behind ``HTTPServer`` (what the service uses),
  on the standard library's event loop, and ``tornado-uvloop`` on uvloop;
- ``service-server``: the same handler on the service's own server
  (``hub/protocol_server.ProtocolHTTPServer``), ``-uvloop`` on uvloop;
  ``service-direct-uvloop``: a direct route of that server answering by a coroutine (a task a
  request), ``service-direct-sync-uvloop`` at once, as the report route answers nearly every
  report: the floor under a report in the service;
- ``protocol``: an ``asyncio.Protocol`` that finds the end of the head and the body by hand,
  on the standard loop, and ``protocol-uvloop`` on uvloop: the least a Python server can do.

Issue 26's ingest target (10 % of a core at 167 reports a second) allows 0.6 ms of CPU a
report in all; the figures say how much of that the HTTP server alone takes on this machine
(docs/benchmarks-history.md, "Issue 26, wave 16").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

PATH = "/services/gpu-gov/api/reports"
ANSWER = b'{"ok": true}'
SERVERS = (
    "tornado",
    "tornado-uvloop",
    "service-server",
    "service-server-uvloop",
    "service-direct-uvloop",
    "service-direct-sync-uvloop",
    "protocol",
    "protocol-uvloop",
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _serve_tornado(
    port: int, loop_factory, on_protocol: bool = False, direct: bool | str = False
) -> None:
    from tornado import httpserver, netutil, web

    from jupyter_gpu_gov.hub.protocol_server import ProtocolHTTPServer

    class Reports(web.RequestHandler):
        def post(self):
            self.set_header("Content-Type", "application/json")
            self.finish(ANSWER)

    async def main() -> None:
        app = web.Application([(PATH, Reports)], log_function=lambda handler: None)
        if on_protocol:

            async def answer(request):  # awaited: a task a request
                return 200, ANSWER

            def at_once(request):  # as the report route answers nearly every report
                return 200, ANSWER

            routes = {("POST", PATH): at_once if direct == "sync" else answer} if direct else {}
            server = ProtocolHTTPServer(app, max_body_size=1 << 20, xheaders=True, direct=routes)
            await server.add_sockets(netutil.bind_sockets(port, "127.0.0.1", backlog=1024))
        else:
            httpserver.HTTPServer(app, xheaders=True).listen(port, "127.0.0.1")
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


class _Answer(asyncio.Protocol):
    """Reads one request (head, then Content-Length bytes of body), answers, closes."""

    def connection_made(self, transport) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        length = 0
        for line in self.buffer[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) - end - 4 < length:
            return
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(ANSWER), ANSWER)
        )
        self.transport.close()


def _serve_protocol(port: int, loop_factory) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(_Answer, "127.0.0.1", port, backlog=1024)
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


def serve(kind: str, port: int) -> None:
    loop_factory = None  # the standard loop; uvloop made as the service makes it
    if kind.endswith("-uvloop"):
        import uvloop

        loop_factory = uvloop.new_event_loop
    if kind.startswith("protocol"):
        _serve_protocol(port, loop_factory)
    else:
        on_protocol = kind.startswith("service-")
        direct = kind.startswith("service-direct") and ("sync" if "-sync" in kind else True)
        _serve_tornado(port, loop_factory, on_protocol, direct=direct)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout_s} s")


def measure(kind: str, requests: int, rate: float) -> float:
    """The server's CPU per request, in ms, over ``requests`` paced at ``rate`` a second."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.http_floor", "--serve", kind, "--port", str(port)]
    )
    try:
        _wait_listening(port)
        body = b'{"report": "' + b"x" * 2400 + b'"}'
        request = (
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: token bench\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (PATH.encode(), len(body), body)
        )
        before, started = _cpu_s(server.pid), time.monotonic()
        for i in range(requests):
            wait = started + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with socket.create_connection(("127.0.0.1", port)) as connection:
                connection.sendall(request)
                answer = b""
                while chunk := connection.recv(65536):
                    answer += chunk
            if not answer.endswith(ANSWER):
                raise RuntimeError(f"{kind} answered {answer[:80]!r}")
        return 1000 * (_cpu_s(server.pid) - before) / requests
    finally:
        server.terminate()
        server.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=167.0, help="requests a second")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each server, interleaved")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return
    runs: dict[str, list[float]] = {kind: [] for kind in SERVERS}
    for _ in range(args.rounds):
        for kind in SERVERS:
            runs[kind].append(measure(kind, args.requests, args.rate))
    budget_ms = 1000 * 0.10 / args.rate  # issue 26: 10 % of one core at this rate
    print(
        "http_floor:",
        f"requests={args.requests} rate={args.rate:g} rounds={args.rounds}",
        f"budget_ms_per_report={budget_ms:.3f}",
        *(
            f"{kind}_cpu_ms_per_request={statistics.median(ms):.3f}"
            f"({','.join(f'{m:.3f}' for m in ms)})"
            for kind, ms in runs.items()
        ),
    )


if __name__ == "__main__":
    main()
