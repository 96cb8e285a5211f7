"""The server extension against a real jupyter-server, real ipykernel kernels and terminals, on
simulated GPUs: what a researcher's server reports at /jupyter-gpu-gov/status."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpu_gov import simulate
from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.vocabulary import STATES
from jupyter_gpu_gov.events import VERDICT_SCHEMA_ID

pytestmark = pytest.mark.timeout(120)
SECOND = timedelta(seconds=1)


@pytest.fixture
def jp_server_config():
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpu_gov": True}},
        "GpuGovApp": {"backend": "simulated", "sample_interval": 0.5},
    }


@pytest.fixture(autouse=True)
def _no_backend_env(monkeypatch):
    monkeypatch.delenv("JUPYTER_GPU_GOV_BACKEND", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


async def status(jp_fetch) -> dict:
    response = await jp_fetch("jupyter-gpu-gov", "status", params={"refresh": "1"})
    assert response.code == 200
    return json.loads(response.body)


def target(report: dict, kind: str, ident: str) -> dict:
    for entry in report["targets"]:
        if entry["kind"] == kind and entry["id"] == ident:
            return entry
    raise AssertionError(f"no {kind} {ident} in {[t['id'] for t in report['targets']]}")


async def wait_for(jp_fetch, check, timeout=20.0):
    """Poll the status until ``check(report)`` is truthy; return the report."""
    deadline = time.monotonic() + timeout
    while True:
        report = await status(jp_fetch)
        if check(report):
            return report
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met; last report: {json.dumps(report)[:2000]}")
        await asyncio.sleep(0.2)


class Kernel:
    """A real ipykernel started through the REST API, driven through its channels."""

    def __init__(self, serverapp, kernel_id):
        self.id = kernel_id
        self.client = serverapp.kernel_manager.get_kernel(kernel_id).client()

    async def run(self, code: str) -> list[str]:
        outputs: list[str] = []

        def collect(msg):
            if msg["msg_type"] == "stream":
                outputs.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                outputs.append("\n".join(msg["content"]["traceback"]))

        reply = await self.client.execute_interactive(code, output_hook=collect, timeout=30)
        assert reply["content"]["status"] == "ok", outputs
        return outputs


@pytest.fixture
def start_kernel(jp_fetch, jp_serverapp):
    """Sync on purpose: pytest-jupyter runs the tests' coroutines on its own loop."""
    started: list[Kernel] = []

    async def _start() -> Kernel:
        tries = 3
        while True:
            response = await jp_fetch(
                "api", "kernels", method="POST", body=json.dumps({"name": "python3"})
            )
            kernel = Kernel(jp_serverapp, json.loads(response.body)["id"])
            kernel.client.start_channels()
            try:
                await kernel.client.wait_for_ready(timeout=60)
            except RuntimeError:
                # "Kernel died before replying": jupyter_client picks free TCP ports and the
                # kernel binds them later; a test running at once may take one meanwhile (and
                # the oldest jupyter_client restarts the kernel on the same ports). Not ours.
                kernel.client.stop_channels()
                await jp_fetch("api", "kernels", kernel.id, method="DELETE")
                tries -= 1
                if not tries:
                    raise
                continue
            started.append(kernel)
            return kernel

    yield _start
    for kernel in started:
        kernel.client.stop_channels()


async def test_idle_kernel_holding_memory_is_reported_holding_with_no_activity(
    jp_fetch, start_kernel
):
    kernel = await start_kernel()
    await kernel.run("from jupyter_gpu_gov import simulate; simulate.hold(20480)")

    # The kernel sends its "idle" status after the cell's reply, and the server learns it on
    # its own channel: on a loaded machine the first report after the reply may still say
    # busy. Idle as the server sees it, holding its memory:
    report = await wait_for(
        jp_fetch,
        lambda r: (
            target(r, "kernel", kernel.id)["gpu"]["holds_context"]
            and target(r, "kernel", kernel.id)["execution_state"] == "idle"
        ),
    )

    assert report["schema"] == 1 and report["backend"] == "simulated"
    entry = target(report, "kernel", kernel.id)
    assert entry["name"] == "python3"
    gpu = entry["gpu"]
    assert gpu["memory_mb"] == 20480
    assert gpu["sm"] == 0.0
    assert gpu["confidence"] == "exact"
    assert gpu["last_active"] is None and gpu["idle_since"] is not None
    device = next(d for d in report["devices"] if d["uuid"] == gpu["devices"][0])
    assert device["memory_used_mb"] == 20480 and device["activity"] == 0.0
    assert device["memory_activity"] is None  # the simulated backend does not model it
    assert report["window"]["gpu_active_fraction"] == 0.0


async def test_a_gpu_just_taken_is_idle_since_it_was_taken_not_since_the_server_started(
    jp_fetch, start_kernel
):
    # The server's idle stretch started with the server: a notebook that worked on the CPU
    # for an hour, then moved its model to the GPU, read "GPU idle since" that hour's start
    # until its training cell ran, and the governor warned it at once (warn_after long past).
    # On a loaded machine the governed hub's silent training loop was warned so: a sample
    # between its hold() and its thread's first load().
    kernel = await start_kernel()
    await status(jp_fetch)  # sampled without a GPU
    await asyncio.sleep(0.1)
    before = clock.utcnow()
    await kernel.run("from jupyter_gpu_gov import simulate; simulate.hold(4096)")
    report = await wait_for(
        jp_fetch, lambda r: target(r, "kernel", kernel.id)["gpu"]["holds_context"]
    )
    assert report["window"]["gpu_active_fraction"] == 0.0
    assert clock.parse(report["window"]["gpu_idle_since"]) >= before, report["window"]


async def test_background_gpu_thread_counts_as_active_while_kernel_is_idle(
    jp_fetch, start_kernel, jp_serverapp
):
    kernel = await start_kernel()
    # A silent training loop: the cell returns at once, the thread keeps the GPU busy.
    await kernel.run(
        "import threading, time\n"
        "from jupyter_gpu_gov import simulate\n"
        "simulate.hold(4096)\n"
        "def train():\n"  # its GPU work runs on until the kernel ends: steps renewed on the
        "    simulate.load(0.8)\n"  # wall clock lapsed when a loaded machine stalled the thread
        "    while True:\n"
        "        time.sleep(0.5)\n"
        "threading.Thread(target=train, daemon=True).start()\n"
    )

    report = await wait_for(
        jp_fetch,
        lambda r: (
            (target(r, "kernel", kernel.id)["gpu"]["sm"] or 0) >= 0.5
            and target(r, "kernel", kernel.id)["execution_state"] == "idle"
        ),
    )
    gpu = target(report, "kernel", kernel.id)["gpu"]
    assert gpu["last_active"] is not None and gpu["idle_since"] is None
    assert report["window"]["gpu_last_active"] is not None
    # GPU work counts as server activity for the Hub's last_activity.
    assert jp_serverapp.web_app.settings["gpu_last_activity"] is not None


async def test_a_run_left_to_itself_is_not_a_person_at_the_notebook(
    jp_fetch, jp_serverapp, start_kernel
):
    # A background thread printing progress keeps Jupyter Server's kernel activity fresh; the
    # report's last_activity (the governor's "person at the notebook") stays at the cell that
    # started it, so a run that ends unattended does not look like its owner just left.
    kernel = await start_kernel()
    before = clock.utcnow()
    await kernel.run(
        "import threading, time\n"
        "def progress():\n"
        "    for step in range(20):\n"
        "        print(step, flush=True)\n"
        "        time.sleep(0.1)\n"
        "threading.Thread(target=progress).start()\n"
    )

    def person(report):
        return clock.parse(report["server"]["last_activity"])

    started = person(await wait_for(jp_fetch, lambda r: person(r) >= before))
    await asyncio.sleep(2.5)  # the thread prints all along
    assert jp_serverapp.kernel_manager.get_kernel(kernel.id).last_activity > started + 1.5 * SECOND
    assert person(await status(jp_fetch)) == started
    # An open tab reconnecting asks for kernel_info: not a person either.
    await kernel.client.kernel_info(reply=True)
    assert person(await status(jp_fetch)) == started
    # Someone running a cell is.
    await kernel.run("x = 1")
    await wait_for(jp_fetch, lambda r: person(r) > started)


async def test_process_started_from_a_terminal_is_attributed_to_the_terminal(
    jp_fetch, jp_serverapp
):
    response = await jp_fetch("api", "terminals", method="POST", body="{}")
    name = json.loads(response.body)["name"]
    terminal = jp_serverapp.web_app.settings["terminal_manager"].terminals[name]
    # --for: the holder ends by itself even if closing the terminal does not end it.
    hold = f"{sys.executable} -m jupyter_gpu_gov.simulate hold 3072 --load 0.4 --for 300"
    terminal.ptyproc.write(f"{hold}\r")
    pids: list[int] = []
    try:
        # The holder takes its memory, then its load (two steps): a sample may fall between.
        report = await wait_for(
            jp_fetch,
            lambda r: (
                target(r, "terminal", name)["gpu"]["memory_mb"] == 3072
                and target(r, "terminal", name)["gpu"]["sm"]
            ),
        )
        gpu = target(report, "terminal", name)["gpu"]
        pids = gpu["pids"]
        assert gpu["confidence"] == "exact"
        assert gpu["sm"] == pytest.approx(0.4)
        assert all(
            t["kind"] != "kernel" or not t["gpu"]["holds_context"] for t in report["targets"]
        )
    finally:
        await jp_fetch("api", "terminals", name, method="DELETE")
        # Closing a terminal signals its shell; a job it started may outlive it: end ours.
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


async def test_two_kernels_on_two_devices_are_told_apart(jp_fetch, start_kernel):
    first, second = await start_kernel(), await start_kernel()
    await first.run("from jupyter_gpu_gov import simulate; simulate.hold(1000, device=0)")
    await second.run(
        "from jupyter_gpu_gov import simulate; simulate.hold(2000, device=1); simulate.load(0.3, device=1)"
    )

    report = await wait_for(
        jp_fetch,
        lambda r: (
            target(r, "kernel", first.id)["gpu"]["holds_context"]
            and target(r, "kernel", second.id)["gpu"]["holds_context"]
        ),
    )
    leaves = [d["uuid"] for d in report["devices"]]
    one, two = target(report, "kernel", first.id)["gpu"], target(report, "kernel", second.id)["gpu"]
    assert (one["devices"], one["memory_mb"], one["sm"]) == ([leaves[0]], 1000, 0.0)
    assert two["devices"] == [leaves[1]] and two["memory_mb"] == 2000
    # Leaf 1 of the default simulated machine is a MIG slice: no utilisation API, so the
    # kernel holds a context but its activity is unknown, never idle.
    assert report["devices"][1]["mig_profile"] is not None
    assert two["sm"] is None and two["confidence"] == "unknown"


async def test_backend_failure_mid_run_reports_unknown_never_idle(jp_fetch, start_kernel):
    kernel = await start_kernel()
    await kernel.run("from jupyter_gpu_gov import simulate; simulate.hold(8192)")
    await wait_for(jp_fetch, lambda r: target(r, "kernel", kernel.id)["gpu"]["memory_mb"] == 8192)

    simulate.fail("GPU is lost")
    try:
        report = await status(jp_fetch)
        assert report["backend"] == "unavailable"
        assert "lost" in report["error"]
        gpu = target(report, "kernel", kernel.id)["gpu"]
        assert gpu["holds_context"] is True
        assert gpu["sm"] is None and gpu["memory_mb"] is None
        assert gpu["confidence"] == "unknown" and gpu["idle_since"] is None
        assert all(d["activity"] is None for d in report["devices"])
        assert {d["health"]["status"] for d in report["devices"]} == {"unknown"}
    finally:
        simulate.recover()

    report = await wait_for(jp_fetch, lambda r: r["backend"] == "simulated")
    assert target(report, "kernel", kernel.id)["gpu"]["memory_mb"] == 8192


async def test_a_gpu_lost_mid_run_is_unhealthy_and_its_kernel_unknown_never_idle(
    jp_fetch, start_kernel
):
    kernel = await start_kernel()
    # The kernel's own GPU (the first leaf, the whole H100), as it would use it.
    await kernel.run("from jupyter_gpu_gov import simulate; simulate.hold(8192)")
    report = await wait_for(
        jp_fetch, lambda r: target(r, "kernel", kernel.id)["gpu"]["memory_mb"] == 8192
    )
    assert report["devices"][0]["health"] == {
        "status": "ok",
        "reasons": [],
        "action": None,
        "warnings": [],
    }

    await kernel.run("simulate.fail(xid=79)")  # what the driver does when the card drops out
    try:
        report = await status(jp_fetch)
        assert report["backend"] == "simulated" and report["error"] is None
        lost, other = report["devices"][0], report["devices"][1]
        assert lost["health"]["status"] == "unhealthy" and lost["health"]["action"] == "reset"
        assert lost["health"]["reasons"][0] == "XID 79: the GPU fell off the bus"
        assert lost["activity"] is None and lost["memory_used_mb"] is None
        assert other["health"]["status"] == "ok"  # the MIG GPU is another card
        gpu = target(report, "kernel", kernel.id)["gpu"]
        assert gpu["holds_context"] is True and gpu["devices"] == [lost["uuid"]]
        assert gpu["sm"] is None and gpu["confidence"] == "unknown" and gpu["idle_since"] is None
        assert report["window"]["gpu_idle_since"] is None
    finally:
        simulate.heal()
    report = await wait_for(jp_fetch, lambda r: r["devices"][0]["health"]["status"] == "ok")
    assert target(report, "kernel", kernel.id)["gpu"]["memory_mb"] == 8192


async def test_gpu_processes_of_the_server_itself_are_other(jp_fetch):
    # The extension publishes its simulated devices from its worker thread at start-up: a
    # report with devices says it has (a loaded machine may take a while).
    await wait_for(jp_fetch, lambda r: r["devices"])
    simulate.hold(512)  # this test process is the server process
    try:
        report = await wait_for(jp_fetch, lambda r: any(t["kind"] == "other" for t in r["targets"]))
        other = next(t for t in report["targets"] if t["kind"] == "other")
        assert other["gpu"]["memory_mb"] == 512
    finally:
        simulate.release()


@pytest.mark.parametrize("authorization", ["", "token not-the-token"])
async def test_status_requires_authentication(jp_fetch, authorization):
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("jupyter-gpu-gov", "status", headers={"Authorization": authorization})
    assert info.value.code == 403


async def test_metrics_and_events_report_the_kernel(jp_fetch, jp_serverapp, start_kernel):
    events: list[dict] = []

    async def listener(logger, schema_id, data):
        events.append(dict(data))

    from jupyter_gpu_gov.events import GPU_STATE_SCHEMA_ID

    jp_serverapp.event_logger.add_listener(schema_id=GPU_STATE_SCHEMA_ID, listener=listener)
    kernel = await start_kernel()
    await kernel.run("from jupyter_gpu_gov import simulate; simulate.hold(2048)")
    await wait_for(jp_fetch, lambda r: target(r, "kernel", kernel.id)["gpu"]["holds_context"])

    metrics = (await jp_fetch("metrics")).body.decode()
    memory_lines = [
        line
        for line in metrics.splitlines()
        if line.startswith("jupyter_gpu_gov_target_memory_bytes") and kernel.id in line
    ]
    assert memory_lines and float(memory_lines[0].split()[-1]) == 2048 * 1024 * 1024

    for _ in range(300):
        if any(e["target_id"] == kernel.id and e["state"] == "idle" for e in events):
            break
        await asyncio.sleep(0.1)
    change = next(e for e in events if e["target_id"] == kernel.id and e["state"] == "idle")
    assert change["previous_state"] == "none" and change["memory_mb"] == 2048


async def test_bad_backend_choice_names_the_setting(monkeypatch):
    from jupyter_gpu_gov.gpu.backends import resolve_choice

    monkeypatch.setenv("JUPYTER_GPU_GOV_BACKEND", "cuda")
    with pytest.raises(ValueError, match=r"JUPYTER_GPU_GOV_BACKEND='cuda' is not one of"):
        resolve_choice("auto")


async def test_checkpoint_saves_every_open_notebook(jp_fetch, jp_root_dir):
    import nbformat

    nbformat.write(nbformat.v4.new_notebook(), jp_root_dir / "train.ipynb")
    body = {"path": "train.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    body = {"path": "draft.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))  # never saved

    response = await jp_fetch(
        "jupyter-gpu-gov", "checkpoint", method="POST", body=json.dumps({"reason": "test"})
    )
    manifest = json.loads(response.body)
    assert manifest["status"] == "done" and manifest["errors"] == []
    assert [n["path"] for n in manifest["notebooks"]] == ["train.ipynb"]
    assert manifest["skipped"] == [{"path": "draft.ipynb", "why": "not saved to disk yet"}]
    checkpoints = json.loads((await jp_fetch("api", "contents", "train.ipynb", "checkpoints")).body)
    assert [c["id"] for c in checkpoints] == [manifest["notebooks"][0]["checkpoint_id"]]
    assert (await status(jp_fetch))["checkpoint"]["status"] == "done"


async def test_governor_checkpoint_lets_a_connected_frontend_save_first(
    jp_fetch, jp_serverapp, jp_root_dir
):
    import nbformat

    nbformat.write(nbformat.v4.new_notebook(), jp_root_dir / "train.ipynb")
    body = {"path": "train.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    app.frontend_checkpoint_grace = 20
    app.report = {"targets": [{"kind": "kernel", "connections": 1}]}  # a browser tab is open

    governor = asyncio.ensure_future(
        jp_fetch(
            "jupyter-gpu-gov",
            "checkpoint",
            method="POST",
            body=json.dumps({"reason": "cull", "source": "governor"}),
            request_timeout=60,
        )
    )
    # The frontend hears of the request (the verdict), saves, then asks for the checkpoint.
    for _ in range(300):
        if (app.verdict or {}).get("checkpoint") == "requested":
            break
        await asyncio.sleep(0.1)
    assert app.verdict["checkpoint"] == "requested"
    frontend = await jp_fetch(
        "jupyter-gpu-gov",
        "checkpoint",
        method="POST",
        body=json.dumps({"reason": "cull", "source": "frontend"}),
    )
    answer = json.loads((await governor).body)
    assert answer == json.loads(frontend.body)
    assert answer["saved_by_frontend_first"] is True and answer["status"] == "done"


async def test_governor_checkpoint_without_a_browser_does_not_wait(
    jp_fetch, jp_serverapp, monkeypatch
):
    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    app.report = {"targets": [{"kind": "kernel", "connections": 0}]}
    # A grace no request outlasts: an offer made to no browser would never be answered.
    monkeypatch.setattr(app, "frontend_checkpoint_grace", 3600.0)
    response = await jp_fetch(
        "jupyter-gpu-gov",
        "checkpoint",
        method="POST",
        body=json.dumps({"reason": "cull", "source": "governor"}),
        request_timeout=60,
    )
    assert json.loads(response.body)["saved_by_frontend_first"] is False
    assert (app.verdict or {}).get("checkpoint") != "requested"  # nothing was offered


async def test_a_real_kernel_reports_its_cpu_through_the_status_route(jp_fetch, start_kernel):
    kernel = await start_kernel()
    await kernel.run(
        "import threading\n"
        "def spin():\n"
        "    while True: pass\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
    )
    report = await wait_for(
        jp_fetch,
        lambda r: any(
            # A spinning thread: a whole core on a quiet machine, a share of one on a loaded
            # one; an idle kernel reads about 0.01.
            t["id"] == kernel.id and (t.get("cpu") or {}).get("cores", 0) > 0.15
            for t in r["targets"]
        ),
    )
    cpu = next(t for t in report["targets"] if t["id"] == kernel.id)["cpu"]
    assert set(cpu) == {"cores", "iowait", "read_mb_s", "seconds", "top_thread"}
    assert cpu["iowait"] is None or 0 <= cpu["iowait"] <= 1


class GovernorAsking:
    """The governor as a server's reporter meets it: each report is answered with a verdict
    carrying ``requests`` (the governor never calls the server)."""

    def __init__(self, requests: dict):
        self.requests = requests
        self.reports: list[dict] = []

    async def send(self, report: dict) -> dict:
        self.reports.append(report)
        return {"state": "checkpointing", "checkpoint": "requested", "requests": self.requests}


@pytest.mark.parametrize("state", [*STATES, "hibernated"])
async def test_a_verdict_in_any_state_reaches_the_frontend_and_its_requests_are_done(
    jp_serverapp, start_kernel, monkeypatch, state
):
    """With JupyterLab open (a subscriber to the server's events), each verdict is emitted as
    an event, which validates it against the verdict schema. A state the schema did not list
    (``busy``: the busy limit; ``gpu-failed``) failed the emit, so the verdict's requests
    were never done: the busy limit's interrupt never came. A state this server does not know
    (a newer governor's) is no event, and its requests are still done."""
    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    kernel = await start_kernel()
    interrupted = []
    monkeypatch.setattr(jp_serverapp.kernel_manager, "interrupt_kernel", interrupted.append)
    when = "2026-01-05T09:00:00.000Z"
    asked = {"interrupt_kernels": {"requested_at": when, "kernels": [kernel.id]}}

    class Governor:
        async def send(self, report: dict) -> dict:
            return {"state": state, "checkpoint": "none", "requests": asked}

    emitted = []
    handler = logging.Handler()
    handler.emit = emitted.append  # as the frontend's subscription: a handler of the events
    jp_serverapp.event_logger.register_handler(handler)
    app.reporter = Governor()
    try:
        await app.send_report(await app.latest_report(refresh=True))
        deadline = time.monotonic() + 20
        while app._request_tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        jp_serverapp.event_logger.remove_handler(handler)
    assert interrupted == [kernel.id]
    verdicts = [r.msg for r in emitted if r.msg.get("__schema__") == VERDICT_SCHEMA_ID]
    assert [v["state"] for v in verdicts] == ([state] if state in STATES else [])


async def test_the_server_does_what_its_verdict_asks_and_only_to_its_own_kernels(
    jp_fetch, jp_serverapp, start_kernel
):
    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    ours, other = await start_kernel(), await start_kernel()
    bobs = "0c6f2a8e-1f0e-4c59-8d1b-5a3e0b7d2c11"  # a kernel id of another server
    asked_at = "2026-01-05T09:00:00.000Z"  # the governor's clock, not this server's
    governor = GovernorAsking(
        {
            "checkpoint": {"requested_at": asked_at, "reason": "idle", "cull_reason": "gpu-idle"},
            # Ids that are not its own, nor strings, are passed over, not the end of the request.
            "shutdown_kernels": {
                "requested_at": asked_at,
                "kernels": [["x"], {"id": ours.id}, None, bobs, "../x", ours.id],
            },
        }
    )
    app.reporter = governor
    app.frontend_checkpoint_grace = 0
    await app.send_report(await app.latest_report(refresh=True))
    deadline = time.monotonic() + 60
    while app._request_tasks and time.monotonic() < deadline:
        await asyncio.sleep(0.1)

    kernels = {k["id"] for k in json.loads((await jp_fetch("api", "kernels")).body)}
    assert ours.id not in kernels and other.id in kernels  # only the named one of its own
    done = governor.reports[-1]["checkpoint"]
    assert done["requested_at"] == asked_at and done["status"] == "done"
    assert (
        done["manifest"]["cull_reason"] == "gpu-idle" and done["manifest"]["source"] == "governor"
    )
    # Asked again (every verdict repeats the request until it is answered): done once only.
    sent = len(governor.reports)
    await app.send_report(await app.latest_report(refresh=True))
    await asyncio.sleep(0.5)
    assert not app._request_tasks and len(governor.reports) == sent + 1


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, b"<html><body>Sign in to continue</body></html>"),  # an auth proxy's page
        (302, b""),  # a redirect to a login, not followed
        (200, b'{"status": "granted", "verdict": "granted"}'),  # a verdict that is no object
        (200, b'{"status": "granted", "verdict": null}'),
        (200, b"[1, 2]"),
    ],
)
async def test_an_extend_or_stop_answered_by_something_else_than_the_governor_is_a_502(
    jp_fetch, jp_serverapp, status, body
):
    """The owner's Extend and Stop are forwarded to the governor; what answered in its place
    (a proxy's login page, a redirect) was passed on with its status, and JupyterLab said
    "Extension granted" for a page that granted nothing: the GPU was then culled at the
    deadline the owner thought extended. A verdict that is not an object was kept, and the
    next verdict's comparison with it failed, so the governor's requests were never done."""
    from tornado import web
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    from jupyter_gpu_gov.server.reporter import Reporter

    class Page(web.RequestHandler):
        def post(self, *_):
            self.set_status(status)
            if status == 302:
                self.set_header("Location", "/hub/login")
            self.finish(body)

    sock, port = bind_unused_port()
    http = HTTPServer(web.Application([(r"/(.*)", Page)]))
    http.add_sockets([sock])
    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    app.reporter = Reporter(f"http://127.0.0.1:{port}/services/gpu-gov/", "t", app.log)
    before = {"state": "warned", "cull_at": "2026-01-05T09:00:00.000Z"}
    app.verdict = before
    try:
        for verb in ("extend", "stop"):
            with pytest.raises(HTTPClientError) as info:
                await jp_fetch(
                    "jupyter-gpu-gov", verb, method="POST", body=json.dumps({"reason": "x"})
                )
            assert info.value.code == 502, (verb, info.value.response.body)
            assert b"not the governor's" in info.value.response.body
            assert app.verdict is before
    finally:
        http.stop()


async def test_the_governors_retry_after_is_passed_on_to_jupyterlab(
    jp_fetch, jp_serverapp, tmp_path, monkeypatch
):
    """Extend and Stop are forwarded to the real governor service; past the owner's
    ``api_budget`` it answers 429 with ``Retry-After``, which the forwarder dropped: JupyterLab
    read the wait from the message's words. The header now comes through."""
    from test_report_budget import ALICE, SLOW, service

    from jupyter_gpu_gov.server.reporter import Reporter

    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    monkeypatch.setattr(
        app, "server_identity", {**app.server_identity, "user": "alice", "name": ""}
    )
    async with service(tmp_path, monkeypatch, api_budget=SLOW, api_burst=1) as (url, _, _):
        monkeypatch.setattr(app, "reporter", Reporter(url, ALICE, app.log))
        try:
            first = await jp_fetch(
                "jupyter-gpu-gov",
                "extend",
                method="POST",
                body='{"reason": "x"}',
                raise_error=False,
            )
            assert first.code != 429 and "Retry-After" not in first.headers
            for verb in ("extend", "stop"):
                answer = await jp_fetch(
                    "jupyter-gpu-gov",
                    verb,
                    method="POST",
                    body='{"reason": "x"}',
                    raise_error=False,
                )
                assert answer.code == 429, (verb, answer.body)
                assert 90 <= int(answer.headers["Retry-After"]) <= 101  # a unit at 0.01 a second
        finally:
            app.reporter.close()


async def a_kernel_stuck_after_2s(jp_fetch, jp_serverapp, jp_root_dir, monkeypatch):
    """A notebook's kernel on the simulated GPU, with a sample taken as stuck after 2 s (not
    10): the extension app."""
    import nbformat

    from jupyter_gpu_gov.server import app as server_app

    monkeypatch.setattr(server_app, "FRESH_SAMPLE_WAIT_S", 2.0, raising=False)
    monkeypatch.setattr(server_app, "STALE_AFTER_S", 2.0, raising=False)
    nbformat.write(nbformat.v4.new_notebook(), jp_root_dir / "train.ipynb")
    body = {"path": "train.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    return next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))


@pytest.mark.parametrize("route", ["checkpoint", "extend", "stop"])
@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 100_000, b"nested too deep"),
        (b'{"reason": ', b"not JSON"),
        (b"[1]", b"a JSON object"),
        (b'{"reason": 7}', b"'reason' must be a string"),
        (b'{"reason": "' + b"x" * 2001 + b'"}', b"at most 2000 characters"),
    ],
)
async def test_a_body_that_is_not_a_request_is_a_400_naming_why(jp_fetch, route, body, says):
    """A body nested past Python's recursion limit raised RecursionError (not a ValueError):
    a 500 'Unhandled error' where every other bad body is a 400 naming what is wrong."""
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("jupyter-gpu-gov", route, method="POST", body=body)
    assert info.value.code == 400, info.value.response.body
    assert says in info.value.response.body


async def test_a_gpu_driver_that_hangs_neither_hangs_a_checkpoint_nor_shows_as_the_gpu_now(
    jp_fetch, jp_serverapp, jp_root_dir, monkeypatch
):
    """A lost GPU (XID 79) or GSP timeouts can make every NVML call wait for minutes. The tick
    then holds the sampling lock, and the checkpoint, which wants a fresh sample first (and
    is wanted most when a GPU fails), waited behind it for good: no notebook or kernel state
    was saved, the Checkpoint button never answered, and the governor's request timed out as
    failed. Meanwhile the status showed the last sample, minutes old, as the GPU now."""
    import threading

    app = await a_kernel_stuck_after_2s(jp_fetch, jp_serverapp, jp_root_dir, monkeypatch)
    before = await status(jp_fetch)
    assert before["backend"] == "simulated"

    class SlowGovernor:  # a report waits on it, and the ticks with it: the driver answers
        async def send(self, report: dict) -> dict:
            await asyncio.sleep(4)
            return {"state": "idle"}

    app.reporter, app._last_report_at = SlowGovernor(), 0.0
    await asyncio.sleep(3.5)
    assert (await jp_fetch("jupyter-gpu-gov", "status")).body.count(b'"backend": "simulated"')
    app.reporter = None

    backend = app.sampler.backend
    answer = backend.sample
    # The driver hangs until the test's end (or ten minutes): an answer within a request's 30 s
    # is one that did not wait for it, however loaded the machine.
    driver = threading.Event()
    monkeypatch.setattr(backend, "sample", lambda: driver.wait(600) and answer())
    try:
        await asyncio.sleep(1.0)  # the timer's tick is now stuck in the driver
        response = await jp_fetch(
            "jupyter-gpu-gov",
            "checkpoint",
            method="POST",
            body=json.dumps({"reason": "the GPU failed"}),
            request_timeout=30,
        )
        manifest = json.loads(response.body)
        assert [n["path"] for n in manifest["notebooks"]] == ["train.ipynb"]

        await asyncio.sleep(2.5)
        for params in ({}, {"refresh": "1"}):
            response = await jp_fetch(
                "jupyter-gpu-gov", "status", params=params, request_timeout=30
            )
            shown = json.loads(response.body)
            assert shown["backend"] == "unavailable", params
            assert "no GPU sample since" in shown["error"]
    finally:
        driver.set()
    report = await wait_for(jp_fetch, lambda r: r["backend"] == "simulated")
    assert report["error"] is None


async def test_a_server_whose_gpu_driver_hangs_still_reports_and_takes_the_checkpoint_asked(
    jp_fetch, jp_serverapp, jp_root_dir, monkeypatch
):
    """Reports rode on ticks: with the driver hung, the server sent none, so no verdict came
    back, nor the checkpoint the governor asks for when a GPU fails (its request timed out
    as failed). While a tick is stuck, the server reports what a failing backend reports
    (``unavailable``: every reading unknown, never idle), and takes up the requests."""
    import threading

    from jupyter_gpu_gov.core.report import gpu_signal, validate

    app = await a_kernel_stuck_after_2s(jp_fetch, jp_serverapp, jp_root_dir, monkeypatch)
    await status(jp_fetch)
    asked_at = clock.isoformat(clock.utcnow())
    governor = GovernorAsking(
        {"checkpoint": {"requested_at": asked_at, "reason": "gpu failed", "cull_reason": None}}
    )
    app.frontend_checkpoint_grace = 0

    backend = app.sampler.backend
    answer = backend.sample
    driver = threading.Event()
    monkeypatch.setattr(backend, "sample", lambda: driver.wait(60) and answer())
    try:
        await asyncio.sleep(1.0)  # the timer's tick is now stuck in the driver
        app.reporter, app.report_interval, app._last_report_at = governor, 1.0, 0.0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            (r.get("checkpoint") or {}).get("requested_at") == asked_at
            and r["checkpoint"]["status"] == "done"
            for r in governor.reports
        ):
            await asyncio.sleep(0.2)
        # Prometheus too: the GPU cannot be read (it kept the last tick's gauges, backend up).
        metrics = (await jp_fetch("metrics")).body.decode()
        assert 'jupyter_gpu_gov_backend_up{backend="unavailable"} 0.0' in metrics
        assert "jupyter_gpu_gov_device_activity_ratio{" not in metrics
    finally:
        driver.set()
    assert governor.reports, "no report while the driver hung"
    first = governor.reports[0]
    validate(first)
    assert first["backend"] == "unavailable" and "has not answered" in first["error"]
    assert gpu_signal(first, idle_threshold=0.02, cull_action="stop-server").active is None
    done = [r for r in governor.reports if (r.get("checkpoint") or {}).get("status") == "done"]
    assert done, [r.get("checkpoint") for r in governor.reports]
    manifest = done[0]["checkpoint"]["manifest"]
    assert [n["path"] for n in manifest["notebooks"]] == ["train.ipynb"]


async def test_a_throttled_server_keeps_its_verdict_and_reports_only_past_the_retry_after(
    jp_fetch, jp_serverapp, caplog
):
    """Answered 429 (the governor's report budget), the server keeps its verdict (the
    JupyterLab panel reads the status as before, no error), sends nothing before the
    ``Retry-After``, says so once in its log, and reports at the first sample past it."""
    from tornado import web
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    from jupyter_gpu_gov.server.reporter import Reporter

    posts = []

    class Throttling(web.RequestHandler):
        def post(self, *_):
            posts.append(self.request.body)
            self.set_status(429)
            self.set_header("Retry-After", "100")
            self.finish(
                {"status": 429, "message": "too many reports from 'x': send again in 100 s"}
            )

    class Counted(Reporter):
        """Counts the reports on their way: the sample timer's (every 0.5 s) as well as ours."""

        on_the_way = 0

        async def _send(self, report):
            self.on_the_way += 1
            try:
                return await super()._send(report)
            finally:
                self.on_the_way -= 1

    async def answered():
        """Until every report sent so far has had its answer (on a loaded machine the timer's
        may still be on its way when ours has come back)."""
        for _ in range(600):
            if not reporter.on_the_way:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("a report still unanswered after 30 s")

    sock, port = bind_unused_port()
    http = HTTPServer(web.Application([(r"/(.*)", Throttling)]))
    http.add_sockets([sock])
    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    reporter = app.reporter = Counted(f"http://127.0.0.1:{port}/services/gpu-gov/", "t", app.log)
    before = {"state": "warned", "cull_at": "2026-01-05T09:00:00.000Z"}
    app.verdict = before
    try:
        with caplog.at_level(logging.DEBUG, logger=app.log.name):
            await app.send_report(await app.latest_report(refresh=True))
            await answered()
            sent = len(posts)  # the sample timer's report may have gone out beside ours
            for _ in range(2):
                await app.send_report(await app.latest_report(refresh=True))
        assert len(posts) == sent  # none past the 429 before its Retry-After
        assert app.verdict is before
        refused = [m for m in caplog.messages if "report not accepted" in m]
        assert len(refused) == sent and "429" in refused[0]  # not one per held report
        assert (await status(jp_fetch))["verdict"] == before  # the panel's status, as it was
        reporter.held_until = 0.0  # the Retry-After has passed: the next sample reports
        # An interval longer than this machine has been up (time.monotonic() counts from its
        # boot): a node booted within one interval still reports at the first sample past it.
        # On a machine up more than a day the setting's largest (86,400 s) is less than that:
        # the boot case cannot be made there; the report after the Retry-After still is.
        app.report_interval = min(time.monotonic() + 3600.0, 86_400.0)
        await app.sample_now()
        await answered()  # this sample's report, or that of the timer's tick it waited behind
        assert len(posts) > sent
    finally:
        http.stop()


@pytest.fixture
def _gpu_one_by_index(monkeypatch):
    """The server is given ``CUDA_VISIBLE_DEVICES=1`` (an admin's ``c.Spawner.environment``),
    with no ``CUDA_DEVICE_ORDER``: CUDA's own default, fastest first."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    yield
    os.environ.pop("CUDA_DEVICE_ORDER", None)


async def test_gpus_named_by_index_are_counted_by_the_kernels_as_by_the_sampler(
    _gpu_one_by_index, jp_fetch, start_kernel
):
    """The sampler reads index 1 in NVML's order (PCI bus order); CUDA counts fastest first
    unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: on a machine with mixed cards the kernel's GPU 1
    was another card than the one the sampler watched (the kernel's work read as nobody's,
    and its own card idle). The server's kernels now count as NVML does."""
    report = await status(jp_fetch)
    kernel = await start_kernel()
    out = await kernel.run('import os; print(os.environ.get("CUDA_DEVICE_ORDER"))')
    assert "".join(out).strip() == "PCI_BUS_ID"
    assert [d["uuid"] for d in report["devices"]] == [simulate.devices()[1]["uuid"]]


@pytest.fixture
def _gpu_one_by_index_fastest_first(monkeypatch):
    """The server is given ``CUDA_VISIBLE_DEVICES=1`` and ``CUDA_DEVICE_ORDER=FASTEST_FIRST``
    (an admin's ``c.Spawner.environment``), on a machine with two GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")


async def test_gpus_named_by_index_in_cudas_own_order_read_unknown_never_idle(
    _gpu_one_by_index_fastest_first, jp_fetch
):
    """CUDA counts fastest first there, by a heuristic NVIDIA does not spell out; the sampler
    counts in NVML's order. It was only warned of, and the sampler went on watching NVML's
    GPU 1: where that was not the kernels' card, their work read as nobody's and the card
    the server was said to hold read idle. Which card it is cannot be told: the GPU use now
    reads unknown (never idle), and the report says how to name the GPUs instead."""
    report = await status(jp_fetch)
    assert report["backend"] == "unavailable"
    assert "CUDA_DEVICE_ORDER=FASTEST_FIRST" in report["error"]
    assert "name them by UUID" in report["error"]
    assert report["devices"] == [] and report["window"]["gpu_idle_since"] is None


async def test_a_stop_ends_the_sampling_in_flight_before_the_loop_closes(jp_serverapp, monkeypatch):
    """The server is stopped while a sample waits on the GPU driver, with a status refresh
    waiting behind it: the extension's stop ends both. Left running, the sampling coroutine was
    closed with the event loop, its tick lock released on a closed loop ("Event loop is
    closed" in CI, at a server's stop)."""
    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    app.ensure_sampling()
    driver = asyncio.Event()  # the driver does not answer before the stop

    async def waits_on_the_driver(targets, server):
        await driver.wait()

    monkeypatch.setattr(app.sampler, "tick", waits_on_the_driver)
    await app._sample_within(0.05)  # a refresh, still in the driver after its wait
    await asyncio.sleep(0.6)  # the timer's next tick too, behind the refresh's lock

    def sampling() -> list[asyncio.Task]:
        names = ("GpuGovApp.sample_now", "every")
        return [
            t for t in asyncio.all_tasks() if t.get_coro().__qualname__ in names and not t.done()
        ]

    assert len(sampling()) >= 2  # the refresh and the timer
    await app.stop_extension()
    assert sampling() == []


async def test_a_stop_ends_a_checkpoint_asked_through_the_api(jp_serverapp, jp_fetch, monkeypatch):
    """The server is stopped while a checkpoint its owner (or the frontend, answering the
    governor's request) asked through POST checkpoint waits on a kernel's hooks: the stop ends
    it as it ends the governor's own, and the request is answered 503 (not left pending with
    the checkpoint lock held, closed with the event loop)."""
    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    hooks = asyncio.Event()  # the kernel's hooks do not end before the stop
    started = asyncio.Event()

    async def waits_on_the_hooks(*args, **kwargs):
        started.set()
        await hooks.wait()

    monkeypatch.setattr("jupyter_gpu_gov.server.app.take_checkpoint", waits_on_the_hooks)
    asked = asyncio.ensure_future(
        jp_fetch("jupyter-gpu-gov", "checkpoint", method="POST", body="{}", raise_error=False)
    )
    await asyncio.wait_for(started.wait(), 30)

    await app.stop_extension()
    response = await asyncio.wait_for(asked, 30)
    assert response.code == 503
    assert b"stopping" in response.body
    assert app.checkpoint["status"] == "failed"
    assert not app._checkpoint_lock.locked()


async def test_a_checkpoint_the_governor_refuses_is_not_taken_one_it_cannot_hear_is(
    jp_fetch, jp_serverapp, tmp_path, monkeypatch
):
    """A checkpoint asked of the server is told to the governor first, to be on record by who
    asked (a real governor service). Its refusal (the token of alice's server telling of a
    checkpoint on bob's) refuses the checkpoint, nothing taken; a governor that does not
    answer holds back no one's save."""
    from test_report_budget import ALICE, service
    from tornado.testing import bind_unused_port

    from jupyter_gpu_gov.server.reporter import Reporter

    app = next(iter(jp_serverapp.extension_manager.extension_apps["jupyter_gpu_gov"]))
    monkeypatch.setattr(app, "checkpoint_dir", str(tmp_path / "checkpoints"))

    def taken() -> int:
        root = tmp_path / "checkpoints"
        return len(list(root.iterdir())) if root.is_dir() else 0

    async def ask(owner: str):
        identity = {**app.server_identity, "user": owner, "name": ""}
        monkeypatch.setattr(app, "server_identity", identity)
        return await jp_fetch(
            "jupyter-gpu-gov", "checkpoint", method="POST", body="{}", raise_error=False
        )

    async with service(tmp_path, monkeypatch) as (url, governor, _):
        monkeypatch.setattr(app, "reporter", Reporter(url, ALICE, app.log))
        try:
            mine = await ask("alice")
            assert mine.code == 200 and taken() == 1, mine.body
            rows = [
                a for a in governor.store.audit_rows("alice/") if a.action == "checkpoint-asked"
            ]
            assert [a.actor for a in rows] == ["user:alice"]
            refused = await ask("bob")
        finally:
            app.reporter.close()
    assert refused.code == 403 and b"the governor refused" in refused.body, refused.body
    assert taken() == 1
    sock, port = bind_unused_port()
    sock.close()  # nothing listens there
    monkeypatch.setattr(app, "reporter", Reporter(f"http://127.0.0.1:{port}/", "t", app.log))
    unheard = await ask("alice")
    assert unheard.code == 200 and json.loads(unheard.body)["status"] == "done"
    assert taken() == 2
