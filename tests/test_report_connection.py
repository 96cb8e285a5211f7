"""A server's reports share one kept connection to the governor (``server/reporter.py``), and
nothing a kept connection can do wrong loses a report or hides an error."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from tornado import web
from tornado.netutil import bind_sockets

from jupyter_gpu_gov.hub.batching import BatchingHTTPServer
from jupyter_gpu_gov.server.reporter import GovernorError, Reporter


class Governor(web.RequestHandler):
    """The report endpoint as a client sees it: a verdict for a good report, a 400 naming the
    field for a bad one; which connection each report came on."""

    def initialize(self, seen: list) -> None:
        self.seen = seen

    async def post(self):
        report = json.loads(self.request.body)
        self.seen.append((self.request.connection.stream, report))
        if "slow" in report:
            await asyncio.sleep(report["slow"])
        if "bad" in report:
            self.set_status(400)
            self.finish({"status": 400, "message": "invalid report: 'server.user' is required"})
            return
        auth = self.request.headers["Authorization"]
        self.finish({"verdict": {"n": report["n"], "auth": auth}})


def _serve(seen: list, port: int = 0, **settings) -> tuple[BatchingHTTPServer, int]:
    app = web.Application([(r"/services/gpu-gov/api/reports", Governor, {"seen": seen})])
    server = BatchingHTTPServer(app, **settings)
    sockets = bind_sockets(port, "127.0.0.1")
    server.add_sockets(sockets)
    return server, sockets[0].getsockname()[1]


async def _stop(server: BatchingHTTPServer) -> None:
    server.stop()
    await server.close_all_connections()


def _reporter(port: int, timeout: float = 20.0, report_interval: float = 5.0) -> Reporter:
    url = f"http://127.0.0.1:{port}/services/gpu-gov/"
    log = logging.getLogger("test")
    return Reporter(url, "server-token", log, timeout=timeout, report_interval=report_interval)


async def test_reports_share_one_connection_and_errors_still_name_the_field():
    seen: list = []
    server, port = _serve(seen)
    reporter = _reporter(port)
    try:
        verdicts = [await reporter.send({"n": n}) for n in range(3)]
        assert verdicts == [{"n": n, "auth": "token server-token"} for n in range(3)]
        with pytest.raises(GovernorError) as refused:
            await reporter.send({"bad": True})
        assert refused.value.status == 400 and "'server.user'" in refused.value.message
        assert (await reporter.send({"n": 9}))["n"] == 9  # a 400 does not cost the connection
        assert len({id(stream) for stream, _ in seen}) == 1
    finally:
        reporter.close()
        await _stop(server)


async def test_a_connection_the_governor_closed_meanwhile_costs_no_report():
    """A restart, or the governor's idle timeout: the report goes out on a new connection."""
    seen: list = []
    server, port = _serve(seen)
    reporter = _reporter(port)
    try:
        await reporter.send({"n": 1})
        await _stop(server)  # closes every connection it holds
        server, _ = _serve(seen, port)
        assert await reporter.send({"n": 2}) == {"n": 2, "auth": "token server-token"}
        assert seen[0][0] is not seen[1][0]

        await _stop(server)
        server, _ = _serve(seen, port, idle_connection_timeout=0.2)
        await reporter.send({"n": 3})
        await asyncio.sleep(0.5)  # the governor closes the idle connection
        assert (await reporter.send({"n": 4}))["n"] == 4
        assert seen[-1][0] is not seen[-2][0]
    finally:
        reporter.close()
        await _stop(server)


async def test_no_governor_and_a_silent_governor_are_errors_then_reports_resume():
    seen: list = []
    server, port = _serve(seen)
    reporter = _reporter(port, timeout=0.5)
    try:
        with pytest.raises(GovernorError) as silent:
            await reporter.send({"n": 1, "slow": 2})
        assert silent.value.status == 599
        assert (await reporter.send({"n": 2}))["n"] == 2  # on a new connection
        assert seen[-1][0] is not seen[0][0]
        await _stop(server)
        with pytest.raises(GovernorError) as gone:
            await reporter.send({"n": 3})
        assert gone.value.status == 599 and "did not answer" in gone.value.message
    finally:
        reporter.close()
        await _stop(server)


async def test_a_report_sent_while_one_is_unanswered_goes_on_a_connection_of_its_own():
    seen: list = []
    server, port = _serve(seen)
    reporter = _reporter(port)
    try:
        slow = asyncio.ensure_future(reporter.send({"n": 1, "slow": 0.5}))
        await asyncio.sleep(0.1)
        assert (await reporter.send({"n": 2}))["n"] == 2
        assert (await slow)["n"] == 1
        assert (await reporter.send({"n": 3}))["n"] == 3
        streams = [id(stream) for stream, _ in seen]
        assert streams[1] != streams[0] and streams[2] == streams[0]  # the kept one again
    finally:
        reporter.close()
        await _stop(server)


async def test_a_server_that_reports_seldom_holds_no_connection_between_reports():
    """At the default interval (60 s, past the governor's idle timeout) each report has its
    own connection, closed after the answer: the governor holds none per server."""
    seen: list = []
    server, port = _serve(seen)
    reporter = _reporter(port, report_interval=60.0)
    try:
        assert [(await reporter.send({"n": n}))["n"] for n in range(3)] == [0, 1, 2]
        assert len({id(stream) for stream, _ in seen}) == 3
        await asyncio.sleep(0.1)
        assert all(stream.closed() for stream, _ in seen)
    finally:
        reporter.close()
        await _stop(server)
