"""A server's reports share one kept connection to the governor (``server/reporter.py``), and
nothing a kept connection can do wrong loses a report or hides an error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import pytest
from tornado import web
from tornado.netutil import bind_sockets

from jupyter_gpu_gov.hub.protocol_server import ProtocolHTTPServer
from jupyter_gpu_gov.server.reporter import GovernorError, Reporter


class Governor(web.RequestHandler):
    """The report endpoint as a client sees it: a verdict for a good report, a 400 naming the
    field for a bad one; which connection each report came on."""

    def initialize(self, seen: list) -> None:
        self.seen = seen

    async def post(self):
        report = json.loads(self.request.body)
        self.seen.append((self.request.connection, report))
        if "slow" in report:
            await asyncio.sleep(report["slow"])
        if "answer" in report:  # not the governor: a proxy's page, a redirect to a login
            status, body = report["answer"]
            self.set_status(status)
            if status == 302:
                self.set_header("Location", "/hub/login")
            self.finish(body)
            return
        if "bad" in report:
            self.set_status(400)
            self.finish({"status": 400, "message": "invalid report: 'server.user' is required"})
            return
        auth = self.request.headers["Authorization"]
        self.finish({"verdict": {"n": report["n"], "auth": auth}})


async def _serve(seen: list, port: int = 0, **settings) -> tuple[ProtocolHTTPServer, int]:
    app = web.Application([(r"/services/gpu-gov/api/reports", Governor, {"seen": seen})])
    server = ProtocolHTTPServer(app, max_body_size=1 << 20, **settings)
    sockets = bind_sockets(port, "127.0.0.1")
    await server.add_sockets(sockets)
    return server, sockets[0].getsockname()[1]


async def _stop(server: ProtocolHTTPServer) -> None:
    server.stop()
    await server.close_all_connections()


class Setup:
    """A governor endpoint and a server's reporter; ``restart`` serves the port anew."""

    def __init__(self, timeout: float, report_interval: float, server, port: int, seen):
        self.seen: list = seen
        self.server, self.port = server, port
        url = f"http://127.0.0.1:{self.port}/services/gpu-gov/"
        self.reporter = Reporter(
            url, "server-token", logging.getLogger("test"), timeout, report_interval
        )

    async def restart(self, **settings) -> None:
        await _stop(self.server)  # closes every connection it holds
        self.server, _ = await _serve(self.seen, self.port, **settings)

    def streams(self) -> list[int]:
        """Which connection each report came on."""
        return [id(connection) for connection, _ in self.seen]


@contextlib.asynccontextmanager
async def reporting(timeout: float = 20.0, report_interval: float = 5.0):
    seen: list = []
    setup = Setup(timeout, report_interval, *await _serve(seen), seen)
    try:
        yield setup
    finally:
        setup.reporter.close()
        await _stop(setup.server)


async def test_reports_share_one_connection_and_errors_still_name_the_field():
    async with reporting() as s:
        verdicts = [await s.reporter.send({"n": n}) for n in range(3)]
        assert verdicts == [{"n": n, "auth": "token server-token"} for n in range(3)]
        with pytest.raises(GovernorError) as refused:
            await s.reporter.send({"bad": True})
        assert refused.value.status == 400 and "'server.user'" in refused.value.message
        assert (await s.reporter.send({"n": 9}))["n"] == 9  # a 400 does not cost the connection
        assert len(set(s.streams())) == 1


@pytest.mark.parametrize("report_interval", [5.0, 600.0], ids=["kept", "per-report"])
@pytest.mark.parametrize(
    "answer",
    [
        (200, "<html><title>Sign in</title></html>"),
        (302, ""),
        (200, "[1, 2]"),
        (200, "{}"),
        (200, '{"verdict": null}'),
        (200, '{"verdict": "active"}'),
    ],
    ids=["page", "redirect", "list", "no-verdict", "null", "text"],
)
async def test_an_answer_without_a_verdict_is_an_error_naming_it(report_interval, answer):
    """What answers in the governor's place (a proxy's page, a redirect to a login, JSON that
    is no verdict) is a GovernorError, which the server logs as a report not accepted; once a
    KeyError or TypeError out of the sampling tick, or a verdict that was not one."""
    async with reporting(report_interval=report_interval) as s:
        with pytest.raises(GovernorError) as error:
            await s.reporter.send({"n": 1, "answer": answer})
        assert error.value.status == answer[0]
        assert "no verdict" in error.value.message, error.value.message
        assert (await s.reporter.send({"n": 2}))["n"] == 2


async def test_a_connection_the_governor_closed_meanwhile_costs_no_report():
    """A restart, or the governor's idle timeout: the report goes out on a new connection."""
    async with reporting() as s:
        await s.reporter.send({"n": 1})
        await s.restart()
        assert await s.reporter.send({"n": 2}) == {"n": 2, "auth": "token server-token"}
        assert s.streams()[0] != s.streams()[1]

        await s.restart(idle_timeout=0.2)
        await s.reporter.send({"n": 3})
        await asyncio.sleep(0.5)  # the governor closes the idle connection
        assert (await s.reporter.send({"n": 4}))["n"] == 4
        assert s.streams()[-1] != s.streams()[-2]


async def test_no_governor_and_a_silent_governor_are_errors_then_reports_resume():
    async with reporting(timeout=0.5) as s:
        with pytest.raises(GovernorError) as silent:
            await s.reporter.send({"n": 1, "slow": 2})
        assert silent.value.status == 599
        assert (await s.reporter.send({"n": 2}))["n"] == 2  # on a new connection
        assert s.streams()[-1] != s.streams()[0]
        await _stop(s.server)
        with pytest.raises(GovernorError) as gone:
            await s.reporter.send({"n": 3})
        assert gone.value.status == 599 and "did not answer" in gone.value.message


async def test_a_report_sent_while_one_is_unanswered_goes_on_a_connection_of_its_own():
    async with reporting() as s:
        slow = asyncio.ensure_future(s.reporter.send({"n": 1, "slow": 0.5}))
        await asyncio.sleep(0.1)
        assert (await s.reporter.send({"n": 2}))["n"] == 2
        assert (await slow)["n"] == 1
        assert (await s.reporter.send({"n": 3}))["n"] == 3
        streams = s.streams()
        assert streams[1] != streams[0] and streams[2] == streams[0]  # the kept one again


async def test_a_server_that_reports_seldom_holds_no_connection_between_reports():
    """At the default interval (60 s, past the governor's idle timeout) each report has its
    own connection, closed after the answer: the governor holds none per server."""
    async with reporting(report_interval=60.0) as s:
        assert [(await s.reporter.send({"n": n}))["n"] for n in range(3)] == [0, 1, 2]
        assert len(set(s.streams())) == 3
        for _ in range(200):  # the governor's end sees each close as the loop comes to it
            if all(connection.closed for connection, _ in s.seen):
                break
            await asyncio.sleep(0.05)
        assert all(connection.closed for connection, _ in s.seen)
