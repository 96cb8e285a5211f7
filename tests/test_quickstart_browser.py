"""The README's quick start, walked in a real browser on the demo's own configuration
(``hub_config/``: the shared-password login, GPU tiers and quotas, the spawn form, the governor
and its policies), run on this test's free ports and directory with the governor's timers cut
from minutes to seconds.

alice logs in, picks an H100 on the spawn form (a second server is refused by her per-user
cap), runs the README's cell in a new notebook, reads the status JSON, and leaves the kernel
idle: the warning comes with its countdown, the GPU panel reads in three lines, the governor
checkpoints and stops the server, and the open tab says so in one state with the way back to
the Hub. She starts again from there: JupyterLab says what was saved (no "Select Kernel"
dialog, no news toast over it) and the README's restore line brings ``results`` back. The admin
then sees the dashboard (dark theme) and showback.

With ``JUPYTER_GPU_GOV_SCREENSHOTS=1`` it refreshes docs/images/ (gpu-panel.png,
stopped-tab.png, comeback.png, dashboard-dark.png; showback.png comes from the dashboard test,
whose showback has three teams).
"""

from __future__ import annotations

import contextlib
import json
import re
import textwrap
from pathlib import Path

import pytest
import requests
from browser import browser as chromium
from browser import explain_failure, log_in, needs_browser, screenshot_path
from demo_harness import ADMIN_PASSWORD, PASSWORD, demo_hub
from governor_harness import wait
from hub_harness import REPO, HubHarness

with contextlib.suppress(ImportError):  # without playwright, needs_browser skips
    from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.timeout(600), *needs_browser]

SLOW = 90_000  # ms: a loaded 2-core machine builds JupyterLab's page slowly


def readme_code() -> tuple[str, str]:
    """The quick start's cell (step 3) and its restore line, as the README shows them: the test
    runs what a reader would paste."""
    text = (REPO / "README.md").read_text()
    quick_start = text[
        text.index("## Quick start") : text.index("\n## ", text.index("## Quick start") + 3)
    ]
    blocks = [
        textwrap.dedent(block)
        for block in re.findall(r"^ *```python\n(.*?)^ *```", quick_start, re.M | re.S)
    ]
    (cell,) = [b for b in blocks if "simulate.hold(20480)" in b]
    (restore,) = [b for b in blocks if "checkpoint.restore()" in b]
    return cell.strip(), restore.strip()


# The demo's governor settings with seconds for minutes: warned after 3 s of idleness,
# checkpointed and stopped 17 s later; the zombie diagnosis after 2 s, so the panel names it.
GOVERNOR_CONFIG = """
c.GpuGovernor.cull_every = 1
c.GpuGovernor.diagnose_zombie_idle = 2
c.GpuGovernor.policy_defaults = dict(
    c.GpuGovernor.policy_defaults,
    warn_after="3s",
    cull_after="20s",
    user_activity_grace="1s",
    checkpoint_timeout="30s",
)
"""


@pytest.fixture
def hub(tmp_path: Path):
    with demo_hub(tmp_path, GOVERNOR_CONFIG) as harness:
        yield harness


def governor(hub: HubHarness, method: str, path: str, **body) -> requests.Response:
    """The governor's API as the demo's admin."""
    return requests.request(
        method,
        f"{hub.url}/services/gpu-gov/api/users/alice/server{path}",
        headers={"Authorization": f"token {hub.token('admin')}"},
        json=body or None,
        timeout=30,
    )


def run_cell(page: Page, index: int, code: str, prompt: str) -> None:
    """Type ``code`` into the notebook's cell ``index`` and run it in place; wait for its
    prompt. A run can be lost while JupyterLab swaps a new notebook's first kernel for another
    (the cell keeps "[ ]"): then it runs the cell again."""
    cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(index)
    cell.locator(".cm-content").click()
    page.keyboard.insert_text(code)  # no auto-closed brackets, no auto-indent
    started = re.compile(r"\[(\*|\d+)\]")
    for _ in range(3):
        cell.locator(".cm-content").click()
        page.keyboard.press("Control+Enter")
        try:
            expect(cell.locator(".jp-InputPrompt")).to_have_text(started, timeout=20_000)
            break
        except AssertionError:
            continue
    expect(cell.locator(".jp-InputPrompt")).to_contain_text(prompt, timeout=SLOW)


def test_the_readme_quick_start_in_a_browser(hub: HubHarness, tmp_path: Path) -> None:
    cell, restore = readme_code()
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.set_default_timeout(SLOW)
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("console", lambda m: print("CONSOLE", m.type, m.text[:300]))
        with explain_failure(page, tmp_path, hub.log_tail):
            walk_as_alice(page, hub, tmp_path, cell, restore)
        assert dialogs == []
        admin = browser.new_context(
            viewport={"width": 1400, "height": 900}, color_scheme="dark"
        ).new_page()
        admin.set_default_timeout(SLOW)
        with explain_failure(admin, tmp_path, hub.log_tail):
            visit_as_admin(admin, hub, tmp_path)


def walk_as_alice(page: Page, hub: HubHarness, shots: Path, cell: str, restore: str) -> None:
    # --- 1-2. log in with the demo password, pick an H100 on the spawn form ------------------
    log_in(page, hub.url, "alice", PASSWORD, "/hub/spawn")
    form = page.locator(".gpu-gov-form")
    expect(form.locator('label[data-tier="h100"] li[data-team="vision"]')).to_contain_text(
        "vision: 1 of 1 guaranteed left"
    )
    form.locator('input[name="profile"][value="h100"]').check()
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(r"/user/alice/lab"), timeout=180_000)
    # The server's GPU is idle from its start: an admin's exemption holds the governor off
    # until the cell has run, so its idle clock starts then, however long JupyterLab takes.
    wait(lambda: governor(hub, "GET", "").ok, 60, "the governor to know alice's server")
    r = governor(hub, "POST", "/exempt", reason="the test sets up", duration="1h")
    assert r.ok, r.text
    # A second server on another H100 is refused by her per-user cap, saying so.
    refused = hub.spawn_form(
        "alice", "second", {"profile": "h100"}, session=hub.login("alice", PASSWORD)
    )
    assert "per-user cap" in refused.text, refused.text[:2000]
    assert "Stop one of your servers first." in refused.text  # no smaller tier would fit

    # --- 3. JupyterLab, the GPU item, a new notebook running the README's cell ---------------
    status = page.locator(".jp-GpuGov-status")
    expect(status).to_be_visible(timeout=SLOW)
    page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first.wait_for()
    run_cell(page, 0, cell, "[1]")
    expect(page.locator(".jp-GpuGov-status-text")).to_contain_text("20.0 GiB", timeout=SLOW)

    # --- 4. the status report, as JSON ---------------------------------------------------------
    report = page.context.new_page()
    report.goto(f"{hub.url}/user/alice/jupyter-gpu-gov/status")
    body = json.loads(report.locator("body").inner_text())
    report.close()
    assert sum(d["memory_used_mb"] for d in body["devices"]) >= 20480, body["devices"]
    assert any(t["kind"] == "kernel" and t["gpu"]["memory_mb"] == 20480 for t in body["targets"])
    assert body["verdict"]["state"] == "exempt", body["verdict"]
    r = governor(hub, "DELETE", "/exempt", reason="now leave it idle")
    assert r.ok, r.text

    # --- 5. idle: the warning, the panel in three lines, the cull, the tab after it ---------
    warning = page.locator(".jp-Notification-Toast-warning").filter(has_text="GPU idle")
    expect(warning.locator(".jp-toast-message")).to_contain_text(
        re.compile(r"this server will be stopped in \d+s \(at .+\) unless you extend"),
        timeout=30_000,
    )
    for button in ("Extend 2m", "Checkpoint", "Stop server"):
        expect(warning.get_by_role("button", name=button)).to_be_visible()
    status.click()
    panel = page.locator(".jp-GpuGov-panel")
    lines = panel.locator(".jp-GpuGov-line")
    # The panel redraws at its own poll: on a loaded machine seconds after the toast (a base
    # run at load 10 still read "exempt" there 5 s on, expect's default).
    expect(lines.first).to_contain_text("this server will be stopped in", timeout=30_000)
    expect(lines.nth(1)).to_contain_text(
        "Likely cause: an idle kernel holding GPU memory", timeout=30_000
    )
    assert lines.count() <= 3
    expect(panel.locator(".jp-GpuGov-holder")).to_contain_text("Untitled.ipynb")
    expect(panel.locator(".jp-GpuGov-holder")).to_contain_text("20.0 GiB")
    assert "UTC" not in panel.inner_text()
    page.mouse.move(640, 400)
    body = panel.locator(".jp-GpuGov-panel-body")  # not the toast at the bottom of the page
    body.screenshot(path=str(screenshot_path("gpu-panel.png", shots)))

    overlay = page.locator(".jp-GpuGov-overlay")
    message = overlay.locator(".jp-GpuGov-stopped-message")
    expect(message).to_have_text(
        re.compile(r"^This server was stopped at .+ because its GPU was idle; checkpoint saved\.$"),
        timeout=120_000,
    )
    # One state: no warning left on screen, nothing that could act, one way back to the Hub.
    expect(warning).to_have_count(0)
    expect(overlay.locator("button")).to_have_count(0)
    hub_link = overlay.get_by_role("link", name="Start it again on the Hub")
    expect(hub_link).to_be_focused()
    expect(panel.locator(".jp-GpuGov-stopped-message")).to_have_text(message.inner_text())
    expect(page.locator(".jp-GpuGov-status-text")).to_have_text("GPU: server stopped")
    assert "Failed Dependency" not in page.locator("body").inner_text()
    page.screenshot(path=str(screenshot_path("stopped-tab.png", shots)))
    expect(page.locator(".jp-Dialog")).to_have_count(0)  # no "Restart?" or connection dialog

    # --- back to the Hub, start again: what was saved, and the restore line ------------------
    hub_link.click()
    # The spawn form, or first the Hub's "Launch Server" while it still stops the old one.
    form, launch = page.locator(".gpu-gov-form"), page.get_by_role("button", name="Launch Server")
    expect(form.or_(launch)).to_be_visible(timeout=SLOW)
    if launch.is_visible():
        launch.click()
    form.locator('input[name="profile"][value="h100"]').check()
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(r"/user/alice/lab"), timeout=180_000)
    wait(
        lambda: governor(hub, "GET", "").json()["verdict"]["state"] != "culled", 60, "a new server"
    )
    assert governor(hub, "POST", "/exempt", reason="the test restores", duration="1h").ok
    expect(page.locator(".jp-GpuGov-status")).to_have_class(
        re.compile("jp-GpuGov-state-exempt"), timeout=30_000
    )
    notice = page.locator(".Toastify__toast").filter(has_text="checkpoint saved")
    expect(notice).to_contain_text(
        re.compile(r"Stopped at .+ because its GPU was idle; checkpoint saved\.")
    )
    expect(notice.get_by_role("button", name="Open Untitled.ipynb")).to_be_visible()
    # Nothing covers it: no kernel dialog per restored notebook, no news question.
    page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first.wait_for()
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    expect(page.locator(".Toastify__toast").filter(has_text="news")).to_have_count(0)
    for label in notice.get_by_role("button").all_inner_texts():
        assert "\n" not in label.strip(), f"a button label wraps: {label!r}"
    page.mouse.move(640, 400)
    page.screenshot(path=str(screenshot_path("comeback.png", shots)))

    page.locator(".jp-NotebookPanel .jp-Cell .jp-InputPrompt").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new cell below
    expect(page.locator(".jp-NotebookPanel .jp-Cell")).to_have_count(2)
    run_cell(page, 1, restore, "[1]")
    expect(page.locator(".jp-NotebookPanel .jp-Cell").nth(1)).to_contain_text(
        "{'epoch': 3, 'loss': 0.25}"
    )


def visit_as_admin(page: Page, hub: HubHarness, shots: Path) -> None:
    # --- 6. the dashboard (dark theme) and showback ---------------------------------------
    log_in(page, hub.url, "admin", ADMIN_PASSWORD, "/services/gpu-gov/")
    servers = page.locator("#servers")
    expect(servers.locator('tr[data-server="alice/"]')).to_be_visible()
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert (
        background != "rgb(255, 255, 255)"
        and sum(int(x) for x in re.findall(r"\d+", background)[:3]) < 150
    ), f"not a dark page: {background}"
    page.screenshot(path=str(screenshot_path("dashboard-dark.png", shots)), full_page=True)
    page.goto(f"{hub.url}/services/gpu-gov/showback?group_by=user")
    expect(page.locator("#totals")).to_contain_text("alice")
    page.emulate_media(color_scheme="light")
    page.screenshot(path=str(shots / "showback-alice.png"), full_page=True)
