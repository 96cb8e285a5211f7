"""Checkpoint before the cull, and back after a restart, on a real hub with the governor.

erin  a notebook kernel registers its variables, holds GPU memory and goes idle: warned,
      checkpointed (hooks, notebook, manifest), culled; after a restart, one call brings the
      variables back, the server lists the checkpoint with the reason for the stop, and
      JupyterLab (in Debian's chromium) says so with the restore line to copy
fay   a hook that raises: the checkpoint fails, the cull is postponed (policy default) and the
      failure is on record for the admin
"""

from __future__ import annotations

import contextlib
import json
import re
from urllib.parse import urlsplit

import pytest
import websocket
from browser import browser as chromium
from browser import log_in, requires_browser
from governor_harness import Gov, governed_hub, server_running, wait
from hub_harness import HubHarness

with contextlib.suppress(ImportError):  # without playwright, needs_browser skips
    from playwright.sync_api import expect

pytestmark = pytest.mark.timeout(300)

NOTEBOOK = "train.ipynb"
SETUP = """
import numpy as np
from jupyter_gpu_gov import checkpoint, simulate
weights = np.arange(12.0).reshape(3, 4)
notes = {"epoch": 3, "loss": 0.25}
checkpoint.save_variables("weights", "notes")
simulate.hold(4096)
"""
FAILING = """
from jupyter_gpu_gov import checkpoint, simulate

@checkpoint.register
def upload_to_bucket(directory):
    raise RuntimeError("bucket unreachable")

simulate.hold(2048)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with governed_hub(tmp_path_factory.mktemp("checkpoint-cycle")) as hub:
        hub.create_user("govadmin")
        for user in ("erin", "fay"):
            hub.start_server(user)
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def notebook_session(hub: HubHarness, user: str) -> str:
    """Save ``train.ipynb`` and open it with a kernel, as JupyterLab does; the kernel's id."""
    headers = {"Authorization": f"token {hub.token(user)}"}
    model = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    r = hub.session.put(
        hub.user_url(user, f"api/contents/{NOTEBOOK}"),
        json={"type": "notebook", "content": model},
        headers=headers,
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    r = hub.session.post(
        hub.user_url(user, "api/sessions"),
        json={
            "path": NOTEBOOK,
            "name": NOTEBOOK,
            "type": "notebook",
            "kernel": {"name": "python3"},
        },
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return r.json()["kernel"]["id"]


def open_tab(hub: HubHarness, user: str, kernel: str) -> websocket.WebSocket:
    url = hub.user_url(user, f"api/kernels/{kernel}/channels")
    return websocket.create_connection(
        "ws" + url[len("http") :], header=[f"Authorization: token {hub.token(user)}"], timeout=30
    )


def test_culled_with_a_checkpoint_and_back_with_one_call(hub, gov):
    kernel = notebook_session(hub, "erin")
    hub.execute("erin", kernel, SETUP)
    tab = open_tab(hub, "erin", kernel)
    try:
        wait(lambda: not server_running(hub, "erin"), 120, "erin's idle server to be culled")
    finally:
        tab.close()

    audit = gov.audit("erin/")
    actions = [a["action"] for a in audit if a["action"] != "state"]
    assert actions == ["warn", "checkpoint", "checkpoint-done", "cull"], audit
    cull = (
        audit[-1]
        if audit[-1]["action"] == "cull"
        else next(a for a in audit if a["action"] == "cull")
    )
    manifest = cull["details"]["checkpoint"]
    assert manifest["status"] == "done" and manifest["errors"] == []
    assert cull["details"]["checkpoint_path"] == manifest["path"]
    assert manifest["cull_reason"] == "gpu-idle" and "GPU idle" in manifest["reason"]
    assert [n["path"] for n in manifest["notebooks"]] == [NOTEBOOK]
    (kernel_entry,) = [k for k in manifest["kernels"] if k["status"] != "no-hooks"]
    assert kernel_entry["status"] == "done"
    assert [h["name"] for h in kernel_entry["hooks"]] == ["variables"]

    # Back: a restarted server lists the checkpoint, and one call restores the variables.
    hub.start_server("erin")
    r = hub.get(hub.user_url("erin", "jupyter-gpu-gov/checkpoints"), token=hub.token("erin"))
    assert r.status_code == 200, r.text
    newest = r.json()["checkpoints"][0]
    assert (newest["id"], newest["cull_reason"], newest["status"]) == (
        manifest["id"],
        "gpu-idle",
        "done",
    )
    assert newest["notebooks"] == [NOTEBOOK]
    kernel = notebook_session(hub, "erin")
    out = hub.execute(
        "erin",
        kernel,
        "import json\nfrom jupyter_gpu_gov import checkpoint\n"
        "back = checkpoint.restore()\n"
        "print(json.dumps({'id': back.id, 'weights': back['weights'].tolist(), "
        "'notes': back['notes']}))",
    )
    restored = json.loads(out)
    assert restored["id"] == manifest["id"]
    assert restored["weights"] == [
        [0.0, 1.0, 2.0, 3.0],
        [4.0, 5.0, 6.0, 7.0],
        [8.0, 9.0, 10.0, 11.0],
    ]
    assert restored["notes"] == {"epoch": 3, "loss": 0.25}


def test_a_failing_hook_postpones_the_cull_and_is_on_record(hub, gov):
    kernel = notebook_session(hub, "fay")
    hub.execute("fay", kernel, FAILING)
    tab = open_tab(hub, "fay", kernel)
    try:
        failed = wait(
            lambda: [a for a in gov.audit("fay/") if a["action"] == "checkpoint-failed"],
            90,
            "fay's checkpoint to fail",
        )
        assert "upload_to_bucket" in failed[0]["reason"]
        assert "bucket unreachable" in failed[0]["reason"]
        # Postponed (the default): warned again, not culled, while the failure stands.
        wait(
            lambda: gov.actions("fay/")[-1:] == ["warn"] and gov.actions("fay/").count("warn") >= 2,
            30,
            "fay to be warned again",
        )
        # Passes, not seconds: a loaded machine's governor makes few in a sleep.
        passes = gov.passes()
        wait(lambda: gov.passes() >= passes + 4, 60, "four passes over the failure")
        assert server_running(hub, "fay")
        assert "cull" not in gov.actions("fay/")
        row = gov.admin("GET", "users/fay/server").json()
        assert row["checkpoint"]["status"] == "failed"
        assert any("bucket unreachable" in e for e in row["checkpoint"]["errors"]), row
    finally:
        tab.close()


@requires_browser
def test_jupyterlab_says_why_the_server_stopped_and_how_to_restore(hub):
    """After erin's cull and restart (the first test), JupyterLab shows the notice once."""
    if not server_running(hub, "erin"):
        pytest.skip("needs the first test's culled-and-restarted server")
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.grant_permissions(["clipboard-read", "clipboard-write"])
        page = context.new_page()
        page.set_default_timeout(90_000)
        log_in(page, hub.url, "erin", "any", "/user/erin/lab")
        notice = page.locator(".jp-toast-message").filter(has_text="checkpoint saved")
        # JupyterLab starting on a loaded machine takes longer than expect's 5 s.
        expect(notice).to_contain_text(
            re.compile(r"Stopped at .+ because its GPU was idle"), timeout=90_000
        )
        toast = page.locator(".Toastify__toast").filter(has_text="checkpoint saved")
        expect(toast.get_by_role("button", name=f"Open {NOTEBOOK}")).to_be_visible()
        toast.get_by_role("button", name="Copy restore code").click()
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied == "from jupyter_gpu_gov import checkpoint; checkpoint.restore()"
        toast.get_by_role("button", name="Dismiss").click()
        path = lambda response: urlsplit(response.url).path  # noqa: E731
        # After the reload the notice is decided on two answers (the checkpoint list and the
        # server's start): both waited for, then two frames for a toast to render. (A sleep
        # proved nothing on a loaded machine, where JupyterLab may not have asked by then.)
        with (
            page.expect_response(lambda r: path(r).endswith("/erin/jupyter-gpu-gov/checkpoints")),
            page.expect_response(lambda r: path(r).endswith("/erin/api/status")),
        ):
            page.reload()
        page.locator(".jp-GpuGov-status").wait_for()
        page.evaluate(
            "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
        )
        assert notice.count() == 0, "the dismissed checkpoint was announced again after a reload"
