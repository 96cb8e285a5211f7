"""The service's HTTP server handles requests in batches while they come fast
(``GpuGovernor.accept_interval``), and no connection is dropped while it is stalled."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from tornado import web
from tornado.netutil import bind_sockets

from jupyter_gpu_gov.hub import protocol_server
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.protocol_server import ProtocolHTTPServer


class Hello(web.RequestHandler):
    def get(self):
        self.finish("hello")


async def _get(port: int) -> tuple[bytes, float]:
    """One request on a new connection; the answer and when it came (perf_counter)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await reader.read()
    writer.close()
    return answer, time.perf_counter()


async def _serve(interval: float) -> tuple[ProtocolHTTPServer, int]:
    server = ProtocolHTTPServer(
        web.Application([(r"/", Hello)]), max_body_size=1024, accept_interval=interval
    )
    sockets = bind_sockets(0, "127.0.0.1")
    await server.add_sockets(sockets)
    return server, sockets[0].getsockname()[1]


class RateClock:
    """The clock the server measures its connection rate by (``protocol_server.time``): its
    second ends when the test says, not when a loaded machine has made ``n`` connections (on
    the real clock, 25 connections had to come within 1.25 s for 20 a second: a -n 2 run
    beside busy loops failed so). The connections, and the interval they are held, are real."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def rate_clock(monkeypatch) -> RateClock:
    clock = RateClock()
    monkeypatch.setattr(protocol_server, "time", clock)
    return clock


async def _busy(server: ProtocolHTTPServer, port: int, n: int = 10) -> None:
    """``n`` connections one after another (none held back: the rate is not known yet), then
    past the end of the one-second window, so the server knows it gets ``n`` a second."""
    for _ in range(n):
        answer, _ = await _get(port)
        assert answer.endswith(b"hello")
        assert not server.holding
    protocol_server.time.now += 1.05


async def test_while_connections_come_fast_those_that_come_meanwhile_wait_then_are_all_answered():
    server, port = await _serve(0.3)  # batching pays from 2 / 0.3 = 6.7 connections a second
    try:
        await _busy(server, port)  # 10 a second
        started = time.perf_counter()
        first, first_at = await _get(port)
        assert first.endswith(b"hello") and server.holding
        # Handling it started a batch: these wait until the interval is over, then are
        # handled together.
        answers = await asyncio.gather(*(_get(port) for _ in range(5)))
        assert all(answer.endswith(b"hello") for answer, _ in answers)
        assert min(at for _, at in answers) - started >= 0.25
        assert first_at < min(at for _, at in answers)
    finally:
        server.stop()


async def test_slower_connections_are_accepted_at_once():
    server, port = await _serve(0.3)
    try:
        await _busy(server, port, n=3)  # 3 a second: a pause would gather about one
        for _ in range(3):
            answer, _ = await _get(port)
            assert answer.endswith(b"hello") and not server.holding
    finally:
        server.stop()


async def test_no_interval_accepts_each_connection_at_once():
    server, port = await _serve(0.0)
    try:
        await _busy(server, port)
        answer, _ = await _get(port)
        assert answer.endswith(b"hello") and not server.holding
    finally:
        server.stop()


async def test_stopping_while_holding_leaves_the_listener_closed():
    server, port = await _serve(0.1)  # batching pays from 20 connections a second
    await _busy(server, port, n=25)
    answer, _ = await _get(port)
    assert answer.endswith(b"hello") and server.holding
    server.stop()
    await asyncio.sleep(0.2)  # the release after the interval must not reopen anything
    with pytest.raises(OSError):
        await _get(port)


async def test_connections_wait_in_line_while_the_service_is_stalled():
    """While the service's loop does not run (a starved CPU), a second's reports at 10,000
    servers and more (167) wait in its listen queue, each then answered: none is dropped for its
    server's kernel to try again seconds later (tornado's default queue held 128)."""
    app = GpuGovernor()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        app.ip, app.port = "127.0.0.1", probe.getsockname()[1]
    server = ProtocolHTTPServer(web.Application([(r"/", Hello)]), max_body_size=1024)
    await app._listen(server)
    clients: list[socket.socket] = []
    try:
        for _ in range(300):  # the loop does not run meanwhile: the kernel holds them all
            clients.append(socket.create_connection(("127.0.0.1", app.port), timeout=0.5))
        for client in clients:
            client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            client.setblocking(False)

        async def answer(client: socket.socket) -> bytes:
            reader, writer = await asyncio.open_connection(sock=client)
            data = await reader.read()
            writer.close()
            return data

        answers = await asyncio.gather(*(answer(c) for c in clients))
        assert all(a.endswith(b"hello") for a in answers)
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_accept_interval_is_checked(capsys):
    assert GpuGovernor().accept_interval == 0.02
    app = GpuGovernor()
    app.initialize(["--GpuGovernor.accept_interval=0"])
    assert app.accept_interval == 0
    for bad in ("-1", "2"):
        with pytest.raises(SystemExit):
            GpuGovernor().initialize([f"--GpuGovernor.accept_interval={bad}"])
        assert (
            "GpuGovernor.accept_interval must be a number of seconds from 0 to 1, "
            f"got {float(bad)}" in capsys.readouterr().err
        )
