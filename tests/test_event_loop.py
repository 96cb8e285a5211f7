"""The service's event loop (``c.GpuGovernor.event_loop``): uvloop where it is installed, the
standard library's on request, and a clear refusal where uvloop is asked for and missing."""

from __future__ import annotations

import asyncio
import sys

import pytest
import test_hub_accept as accept
import test_protocol_server as protocol
import test_reconcile_yields as yields

from jupyter_gpu_gov.hub import protocol_server
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.event_loop import loop_factory, running_loop_name

uvloop = pytest.importorskip("uvloop", reason="uvloop is installed with the hub extra")


def _run_on(choice: str, main):
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)


async def _name() -> str:
    return running_loop_name()


def test_the_default_is_auto_and_auto_or_uvloop_run_on_uvloop():
    assert GpuGovernor().event_loop == "auto"
    assert _run_on("auto", _name()) == "uvloop"
    assert _run_on("uvloop", _name()) == "uvloop"
    assert _run_on("asyncio", _name()) == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_refuses_to_start(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now raises ImportError
    assert _run_on("auto", _name()) == "asyncio"
    app = GpuGovernor(event_loop="uvloop")
    with pytest.raises(SystemExit) as stopped:
        app.start()  # refused before anything runs
    said = str(stopped.value)
    assert "event_loop = 'uvloop', but uvloop cannot be imported" in said
    assert "pip install uvloop" in said and "'asyncio'" in said


def test_an_unknown_loop_is_named_in_the_error(capsys):
    with pytest.raises(SystemExit):
        GpuGovernor().initialize(["--GpuGovernor.event_loop=tokio"])
    assert "GpuGovernor.event_loop must be one of auto, uvloop, asyncio, got 'tokio'" in (
        capsys.readouterr().err
    )
    app = GpuGovernor()
    app.initialize(["--GpuGovernor.event_loop=AsyncIO"])
    assert app.event_loop == "asyncio"


@pytest.mark.parametrize(
    "scenario",
    [
        accept.test_while_connections_come_fast_those_that_come_meanwhile_wait_then_are_all_answered,
        accept.test_stopping_while_holding_leaves_the_listener_closed,
        accept.test_connections_wait_in_line_while_the_service_is_stalled,
    ],
    ids=["batched", "stopped-while-holding", "stalled"],
)
def test_batched_requests_hold_on_uvloop(scenario, monkeypatch):
    """The service's server (its own protocol, the batches' timer, the listen queue) does the
    same on libuv's loop as on the standard one."""
    monkeypatch.setattr(protocol_server, "time", accept.RateClock())  # as test_hub_accept's
    _run_on("uvloop", scenario())


@pytest.mark.parametrize(
    "scenario",
    [
        protocol.test_http11_keeps_the_connection_and_close_or_http10_ends_it,
        protocol.test_pipelined_requests_are_answered_in_order_each_complete,
        protocol.test_a_streamed_answer_is_chunked_for_http11_and_close_delimited_for_http10,
        protocol.test_a_direct_route_answers_with_its_status_and_a_content_length,
        protocol.test_bytes_sent_while_an_answer_is_pending_are_not_buffered_without_bound,
        protocol.test_each_idle_connection_is_closed_at_its_own_deadline_not_before,
    ],
    ids=["keep-alive", "pipelined", "streamed", "direct", "bounded", "idle-deadlines"],
)
def test_the_http_server_serves_alike_on_uvloop(scenario):
    """uvloop's transports (its own flow control, pause and resume of reading) under the
    service's HTTP server, as the service runs by default."""
    _run_on("uvloop", scenario())


def test_a_report_sent_during_a_pass_is_answered_before_its_next_slice_on_uvloop(
    tmp_path, monkeypatch
):
    """The pass's turns for the reports (``incremental.let_reports_in``) on libuv's loop too."""
    scenario = yields.test_a_report_sent_during_a_pass_is_answered_before_its_next_slice
    _run_on("uvloop", scenario(tmp_path, monkeypatch))
