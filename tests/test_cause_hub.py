"""Acting on the cause, on a real hub: the governor and the profile layer as a workstation
deploys them (``add_gpu_profiles(c, spawner="simple")`` hands out simulated H100s; the
governor's right-sizing knows the tiers through configuration), real servers and kernels.
Timers are seconds instead of hours (the policies are the same code).

cpu    a cell runs on the CPU while its kernel holds the GPU idle: past busy_grace a notice
       names it, it is listed busy, Extend works, and it is not culled
quiet  a cell sleeps (no CPU, no I/O) while its kernel holds the GPU idle: past the quiet-cell
       limit it is warned in those words, then interrupted and checkpointed; the server stays
gil    a checkpoint hook that always raises does not hold back the maximum age: one retry, then
       the cull, and one warning (gil's server starts with the module: its clock runs while
       the others' tests do)
short  warned, its owner runs a short CPU cell (the GPU idle throughout): one warning, shown
       in JupyterLab all along with its deadline, and the cull at that deadline after the cell
sam    a notebook on a small model on a whole card: the governor names the MIG slice it fits,
       in the admin list, on the dashboard and in JupyterLab's GPU panel (Debian's chromium);
       its GPU at work, it is told of its maximum age (announced from the start) in
       JupyterLab's notification, not only in the panel
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
import requests
import websocket
from governor_harness import Gov, governed_hub, server_running, wait
from hub_harness import HubHarness

from jupyter_gpu_gov.core.clock import parse

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

pytestmark = pytest.mark.timeout(420)
CHROMIUM = Path("/usr/bin/chromium")

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
DEVICES = [H100] * 4
TIERS = [
    {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"},
    {"name": "h100-3g", "display_name": "Half an H100", "gpu": "H100-80GB", "mig": "3g.40gb"},
    {"name": "h100-1g", "display_name": "Small H100 slice", "gpu": "H100-80GB", "mig": "1g.10gb"},
]
USERS = ("cpu", "quiet", "gil", "short", "sam")
PROFILES = f"""
    from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles
    c.LocalGpus.backend = "simulated"
    c.LocalGpus.simulated_devices = {DEVICES!r}
    c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
    c.GpuProfiles.tiers = {TIERS!r}
    c.GpuProfiles.quotas = {{"lab": {{"guaranteed": {{"h100": {len(DEVICES)}}}, "tiers": "*"}}}}
    c.GpuProfiles.team_map = {dict.fromkeys(USERS, "lab")!r}
    add_gpu_profiles(c, spawner="simple")
"""
GOVERNOR = f"""
from jupyter_gpu_gov.profiles.estimate import tier_sizes
c.GpuGovernor.right_size_tiers = tier_sizes({TIERS!r})
c.GpuGovernor.right_size_after = 4  # seconds of reports (real hubs: an hour)
"""
# gil's server reaches its maximum age 40 s after it starts, warned 15 s before.
MAX_AGE = {"name": "max-age", "match": {"users": ["gil"]}, "max_age": "40s"}
MAX_AGE["max_age_warning"] = "15s"
# sam's reaches its maximum age in 30 minutes, announced from the start: a hard deadline on a
# server whose GPU works.
SAM_DEADLINE = {"name": "sam-max-age", "match": {"users": ["sam"]}, "max_age": "30m"}
SAM_DEADLINE["max_age_warning"] = "30m"

# A CPU stage: some work on the CPU every 20 ms (well over the quiet-cell threshold of 2 % of a
# core, without loading a 2-core machine), the GPU held and idle, for 40 s.
RUNNING_CELL = """
from jupyter_gpu_gov import simulate
import time
simulate.hold(2048)
end = time.monotonic() + 40
while time.monotonic() < end:
    sum(range(200_000))
    time.sleep(0.02)
"""
# A cell waiting on something that never comes: its kernel does nothing, the GPU held idle.
QUIET_CELL = """
from jupyter_gpu_gov import simulate
import time
simulate.hold(2048)
x = 41
time.sleep(600)
"""
# Quiet past 2 s, read as busy_grace (5 s), then a 6 s notice (cull_after - warn_after; the
# idle clock's own warning comes no sooner than 50 s, after this test's cell was interrupted).
# After the interrupt's checkpoint the idle rules start over (``after_interrupt``'s default).
QUIET = {"name": "quiet", "match": {"users": ["quiet"]}, "quiet_cell_limit": "2s"}
QUIET |= {"warn_after": "50s", "cull_after": "56s"}
# short's notice (40 s) outlasts a loaded machine's passes over its cell and after it.
SHORT = {"name": "short-cells", "match": {"users": ["short"]}, "warn_after": "3s"}
SHORT["cull_after"] = "43s"
# A short CPU step: CPU work until the test says it is done, the GPU held idle (the kernel's
# earlier cell took it).
SHORT_CELL = """
import os, time
while not os.path.exists({done!r}):
    sum(range(200_000))
    time.sleep(0.02)
"""
# quiet's server reads its kernels' CPU over 4 s instead of a minute: its kernel's start-up
# leaves the window in seconds.
QUIET_WINDOW = """
import os
if os.environ.get("JUPYTERHUB_USER") == "quiet":
    c.GpuGovApp.window_seconds = 4
"""
FAILING_HOOK = """
from jupyter_gpu_gov import checkpoint, simulate

@checkpoint.register
def upload_to_bucket(directory):
    raise RuntimeError("bucket unreachable")

simulate.hold(2048)
simulate.load(0.9)  # GPU work until the process ends: active, never idle-culled
"""
SMALL_MODEL = """
from jupyter_gpu_gov import simulate
simulate.hold(4096)  # a small model on an 80 GB card
simulate.load(0.05)  # serving it keeps 5 % of the card busy
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cause")
    with governed_hub(
        workdir,
        extra_policies=[MAX_AGE, SAM_DEADLINE, QUIET, SHORT],
        governor_config=GOVERNOR,
        hub_config=PROFILES,
        singleuser_config=f"c.GpuGovApp.simulated_devices = {DEVICES!r}\n" + QUIET_WINDOW,
        timeout=180,
    ) as hub:
        hub.create_user("govadmin")
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def spawn(hub: HubHarness, user: str) -> None:
    """A server on a whole H100, admitted by the profile layer (REST spawn with a profile)."""
    hub.create_user(user)
    r = hub.api("POST", f"users/{user}/server", json={"profile": "h100"})
    assert r.status_code in (201, 202), r.text
    hub.wait_for_server(user)
    options = hub.api("GET", f"users/{user}").json()["servers"][""]["user_options"]
    assert options.get("gpu-gov/tier") == "h100", options


def run_in_background(hub: HubHarness, user: str, code: str) -> websocket.WebSocket:
    """Start ``code`` in a new kernel without waiting for it (a cell left running), with its
    websocket open (a browser tab)."""
    kernel = hub.start_kernel(user)
    url = hub.user_url(user, f"api/kernels/{kernel}/channels")
    ws = websocket.create_connection(
        "ws" + url[len("http") :], header=[f"Authorization: token {hub.token(user)}"], timeout=30
    )
    execute(ws, user, code)
    return ws


def execute(ws: websocket.WebSocket, user: str, code: str) -> str:
    """Send ``code`` to run on a tab's kernel, as JupyterLab does; its message id."""
    header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": user}
    header |= {"session": uuid.uuid4().hex, "version": "5.3"}
    content = {"code": code, "silent": False, "store_history": False}
    content |= {"user_expressions": {}, "allow_stdin": False}
    msg = {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell"}
    ws.send(json.dumps(msg | {"content": content}))
    return header["msg_id"]


def verdict_when(gov: Gov, user: str, state: str, timeout: float) -> dict:
    """``user``'s verdict once it is in ``state``."""
    return wait(
        lambda: (v := gov.verdict(user))["state"] == state and v, timeout, f"{user} to be {state}"
    )


def actions(gov: Gov, user: str) -> list[str]:
    return [a for a in gov.actions(f"{user}/") if a != "extend"]


@pytest.fixture(scope="module", autouse=True)
def gil_started(hub):
    """gil's server, its failing hook running from the start, so that its maximum age (40 s)
    runs out while the other tests run; when it started."""
    spawn(hub, "gil")
    started = hub.api("GET", "users/gil").json()["servers"][""]["started"]
    tab = run_in_background(hub, "gil", FAILING_HOOK)
    yield started
    tab.close()


def test_a_cell_running_on_the_cpu_is_notified_listed_busy_and_not_culled(hub, gov):
    spawn(hub, "cpu")
    tab = run_in_background(hub, "cpu", RUNNING_CELL)
    try:
        # Past busy_grace (5 s of GPU idleness under a running cell): a notice, not a cull.
        verdict = verdict_when(gov, "cpu", "busy", 40)
        assert "a kernel is executing a cell" in verdict["reason"]
        assert "press Extend" in verdict["reason"] and "busy limit" in verdict["reason"]
        # The owner's own server hears it too (the status JupyterLab's panel shows).
        status = hub.user_url("cpu", "jupyter-gpu-gov/status")
        wait(
            lambda: hub.get(status, token=hub.token("cpu")).json()["verdict"]["state"] == "busy",
            20,
            "the server's own verdict to say busy",
        )
        # The admin list says it.
        listed = gov.admin("GET", "servers").json()["servers"]
        assert [s["state"] for s in listed if s["user"] == "cpu"] == ["busy"]
        # Extend works as for an idle kernel.
        r = requests.post(
            hub.user_url("cpu", "jupyter-gpu-gov/extend"),
            json={"reason": "the next stage trains"},
            headers={"Authorization": f"token {hub.token('cpu')}"},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["status"] == "granted", r.text
        gov.judged_after("cpu", 8)  # past cull_after (7 s) and busy_grace: still running, busy
        assert server_running(hub, "cpu") and gov.verdict("cpu")["state"] == "busy"
    finally:
        tab.close()
    # (Idle for seconds before the cell started, it may have been warned: that warning does
    # not stand once a cell runs.)
    done = actions(gov, "cpu")
    assert done.count("busy-notice") == 1, done  # one notice for the stage, not every pass
    since = done[done.index("busy-notice") :]
    assert not {"warn", "checkpoint", "cull"} & set(since), done


def next_output(tab: websocket.WebSocket, timeout: float) -> dict:
    """The next error or stream output the tab's kernel sends (its IOPub)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = json.loads(tab.recv())
        if msg.get("msg_type") in ("error", "stream"):
            return msg["content"]
    raise AssertionError(f"no output on the tab within {timeout:g} s")


def printed(tab: websocket.WebSocket, user: str, code: str, timeout: float) -> str:
    """What ``code`` prints on the tab's kernel, sent again while the kernel aborts requests
    (as it does for a moment after a cell ends in an error)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sent = execute(tab, user, code)
        text, status, idle = "", None, False
        while status is None or not idle:  # the reply (shell) and all output (IOPub)
            msg = json.loads(tab.recv())
            if msg["parent_header"].get("msg_id") != sent:
                continue
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
            elif msg["msg_type"] == "execute_reply":
                status = msg["content"]["status"]
            elif msg["msg_type"] == "status":
                idle = msg["content"]["execution_state"] == "idle"
        if status != "aborted":
            assert status == "ok", status
            return text
    raise AssertionError(f"{code!r} did not run within {timeout:g} s")


def test_a_quiet_cell_is_warned_then_interrupted_and_checkpointed_not_stopped(hub, gov):
    spawn(hub, "quiet")
    tab = run_in_background(hub, "quiet", QUIET_CELL)
    try:
        # Quiet (the sampler's 4 s window), then past the quiet-cell limit (5 s): warned, in
        # the quiet cell's words, of an interrupt and a checkpoint, not of a stop.
        verdict = verdict_when(gov, "quiet", "warned", 60)
        assert "its kernel doing nothing (no CPU, no I/O" in verdict["reason"], verdict
        assert "past the quiet-cell limit of 5s" in verdict["reason"], verdict
        assert "the cell interrupted and checkpointed at" in verdict["reason"], verdict
        assert "stopped" not in verdict["reason"], verdict
        # After the notice the cell is interrupted (the tab sees its KeyboardInterrupt); the
        # kernel and what the notebook computed stay.
        error = next_output(tab, 60)
        assert error.get("ename") == "KeyboardInterrupt", error
        assert printed(tab, "quiet", "print(x + 1)", 30) == "42\n"

        def saved():
            rows = [a["action"] for a in gov.audit("quiet/") if a["action"] != "state"]
            return "checkpoint-done" in rows and rows

        audit = wait(saved, 60, "quiet's checkpoint to be saved")
    finally:
        tab.close()
    warned = audit.index("warn")
    assert {"checkpoint", "cull"}.isdisjoint(audit[:warned]), audit
    assert audit[warned : warned + 4] == ["warn", "interrupt", "checkpoint", "checkpoint-done"]
    # Then the server idles, nobody there: the idle rules take over, with a warning of their
    # own before any stop.
    assert audit[warned + 4 : warned + 5] in ([], ["warn"]), audit


def test_a_failing_hook_does_not_hold_back_the_maximum_age(hub, gov, gil_started):
    # Due 40 s after the start; a checkpoint and one retry that fail at once: the cull
    # follows within two checkpoint_timeouts at most, and in practice a few passes.
    wait(lambda: not server_running(hub, "gil"), 100, "gil's server to reach its max age")
    audit = [a for a in gov.audit("gil/") if a["action"] != "state"]
    # (Idle for seconds before the cell started, on a loaded machine, it may have been warned
    # for idleness first: that warning does not stand once the GPU works.)
    first = next(i for i, a in enumerate(audit) if a["action"] == "max-age-warn")
    assert {a["action"] for a in audit[:first]} <= {"warn"}, audit
    audit = audit[first:]
    done = [a["action"] for a in audit]
    assert done == [
        "max-age-warn",
        "checkpoint",
        "checkpoint-failed",
        "checkpoint",
        "checkpoint-failed",
        "cull",
    ], audit
    assert "bucket unreachable" in audit[2]["reason"]
    cull = audit[-1]
    assert cull["details"]["cull_reason"] == "max-age"
    assert "culling anyway (a hard deadline waits for one retry only)" in cull["reason"]
    late = (parse(cull["at"]) - parse(gil_started)).total_seconds() - 40  # past the deadline
    assert 0 <= late < 2 * 20, late


def test_a_short_cpu_cell_after_the_warning_keeps_one_warning_and_no_cull_lands_during_it(
    hub, gov, tmp_path
):
    spawn(hub, "short")
    tab = run_in_background(
        hub, "short", "from jupyter_gpu_gov import simulate\nsimulate.hold(2048)"
    )
    status = hub.user_url("short", "jupyter-gpu-gov/status")

    def lab() -> dict:
        """The verdict JupyterLab shows: the one the server got back on its last report."""
        return hub.get(status, token=hub.token("short")).json().get("verdict") or {}

    try:
        warned = wait(lambda: (v := lab()).get("state") == "warned" and v, 60, "the warning")
        done = tmp_path / "stage-done"
        execute(tab, "short", SHORT_CELL.format(done=str(done)))
        during = wait(
            lambda: "a kernel is executing a cell" in (v := lab()).get("reason", "") and v,
            60,
            "JupyterLab's verdict to see the cell",
        )
        # The first report to show the cell may not yet carry its start as the owner's
        # activity (jupyter_server and the extension read the kernel's IOPub on two sockets,
        # in either order): its deadline then moves by that moment at the next report. What
        # holds is the deadline once the governor has judged a report made after the start.
        gov.judged_after("short", 1)
        during = gov.verdict("short")
        assert "a kernel is executing a cell" in during["reason"], during
        # The warning stands while the cell runs: the same warning on the same idle stretch
        # (a CPU cell does not make the GPU busy), its deadline no sooner (the owner was at
        # the notebook: their full notice counts from the cell they ran).
        assert during["state"] == "warned", during
        assert during["idle_since"] == warned["idle_since"], (warned, during)
        assert parse(during["cull_at"]) >= parse(warned["cull_at"]), (warned, during)
        assert "not while the cell runs" in during["reason"], during
        assert server_running(hub, "short")
        done.touch()
        wait(lambda: "executing a cell" not in lab().get("reason", ""), 60, "the cell's end")
        gov.judged_after("short", 1)
        after = lab()
        assert (after["state"], after["idle_since"], after["cull_at"]) == (
            "warned",
            warned["idle_since"],
            during["cull_at"],
        ), (during, after)
        assert actions(gov, "short") == ["warn"]  # one warning, not one after every cell
        # The cull comes at that deadline, after a checkpoint of its own.
        wait(lambda: not server_running(hub, "short"), 120, "short's cull")
    finally:
        tab.close()
    audit = [a for a in gov.audit("short/") if a["action"] != "state"]
    assert [a["action"] for a in audit] == ["warn", "checkpoint", "checkpoint-done", "cull"], audit
    assert parse(audit[1]["at"]) >= parse(during["cull_at"]), (audit, during)


@pytest.mark.skipif(sync_playwright is None, reason="the playwright Python package is missing")
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing")
def test_a_small_model_on_a_whole_card_is_told_the_slice_it_fits(hub, gov, tmp_path):
    spawn(hub, "sam")
    tab = run_in_background(hub, "sam", SMALL_MODEL)
    try:
        verdict = wait(
            lambda: (v := gov.verdict("sam"))["right_size"] and v, 60, "a right-sizing hint"
        )
        fit = verdict["right_size"]
        assert (fit["tier"], fit["label"]) == ("h100-1g", "Small H100 slice"), fit
        assert "at most 4.3 GB of GPU memory and 5% of the GPU" in fit["reason"], fit
        listed = gov.admin("GET", "users/sam/server").json()
        assert listed["right_size"] == fit
        dashboard = hub.login("govadmin").get(f"{hub.url}/services/gpu-gov/", timeout=30)
        assert "fits <bdi>Small H100 slice</bdi>" in dashboard.text  # the label isolated
        # Its GPU works (5 %), and its maximum age is announced: a hard deadline.
        verdict = wait(
            lambda: (v := gov.verdict("sam"))["hard_deadline"] and v, 30, "the deadline notice"
        )
        assert verdict["state"] == "active" and verdict["cull_at"], verdict

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM))
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(90_000)
                page.goto(f"{hub.url}/hub/login?next=/user/sam/lab")
                page.fill("#username_input", "sam")
                page.fill("#password_input", "any password")
                page.click("#login_submit")
                page.wait_for_url(re.compile(r"/user/sam/lab"))
                # The owner is told in a notification, as for an idle warning, not only in
                # the panel; Extend is not offered (it cannot move the deadline).
                toast = page.locator(".jp-Notification-Toast-warning", has_text="Hard deadline")
                toast.first.wait_for()
                notice = toast.first.inner_text()
                extend = toast.first.locator("button.jp-toast-button", has_text="Extend")
                offered = extend.count()
                page.locator(".jp-GpuGov-status").click()
                hint = page.locator(".jp-GpuGov-panel .jp-GpuGov-line", has_text="would fit")
                hint.wait_for()
                text = hint.inner_text()
                page.screenshot(path=str(tmp_path / "right-size.png"))
            finally:
                browser.close()
    finally:
        tab.close()
    assert text.startswith("This work would fit Small H100 slice: it used at most 4.3 GB"), text
    assert "this server will be stopped in" in notice and "whatever the GPU does" in notice
    assert offered == 0, notice
