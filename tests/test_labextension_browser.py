"""The JupyterLab extension in a real browser, against a real hub with the governor.

Chromium (Debian's ``/usr/bin/chromium``, driven by the ``playwright`` Python package; no
``playwright install``) logs in through the hub's login page, lands in JupyterLab on a
notebook whose kernel holds 20 GiB of simulated GPU memory, and then checks what a user sees
and does: the status bar item, the idle warning with its live countdown, **Extend** (through
the reason prompt, on record at the governor; the warning goes away, and comes back with the
later deadline), the GPU panel meanwhile (its few lines, its folded details, at the default
sidebar width and a wide one, in the light and the dark theme), the warning kept once across a
reload, **Checkpoint** (the dirty notebook is saved first) and **Stop server**, after which the
tab says the server stopped and nothing beneath can act. A second story: a borrowed GPU asked
back (the reclaim's warning), then the reclaim withdrawn, which the page says once in a toast,
in the GPU panel and as "reclaim lifted" in the status bar. With ``JUPYTER_GPU_GOV_SCREENSHOTS=1`` it
refreshes ``docs/images/gpu-warning.png`` (otherwise the screenshot goes to the test's
tmp_path).

Skipped, saying why, when chromium or playwright is missing; never green without a browser.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
from browser import browser as chromium
from browser import explain_failure, log_in, needs_browser, screenshot_path
from governor_harness import Gov, cancel, governed_hub, join, server_running, wait
from hub_harness import HubHarness
from test_reclaim_hub import PROFILES, SINGLEUSER, ivan_borrows_the_h100

with contextlib.suppress(ImportError):  # without playwright, needs_browser skips
    from playwright.sync_api import Page, expect

USER = "lena"
NOTEBOOK = "gpu-demo.ipynb"
SLOW = 60_000  # ms: a 2-core machine builds JupyterLab's page slowly

pytestmark = [pytest.mark.timeout(600), *needs_browser]

# Warned ~3 s into GPU idleness, culled after 5 minutes; Extend gives a minute, twice: the
# warning is away for that minute after an Extend right after it, and back with the later
# deadline when the new one's notice starts.
BROWSER_POLICY = {
    "name": "browser",
    "match": {"users": [USER]},
    "warn_after": "3s",
    "cull_after": "5m",
    "extension_step": "1m",
    "max_extensions": 2,
}

HOLD = "from jupyter_gpu_gov import simulate\n\nsimulate.hold(20480)  # MiB of simulated GPU memory"

COUNTDOWN = re.compile(r"in (?:(\d+)m )?(\d+)s \(at ([^)]+)\)")

WARNING_TOAST = ".jp-Notification-Toast-warning"


def countdown_seconds(text: str) -> tuple[int, str]:
    """'GPU idle: this server will be stopped in 4m 52s (at 10:04 AM) unless…' → (292, '10:04 AM')."""
    match = COUNTDOWN.search(text)
    assert match, f"no countdown in the warning: {text!r}"
    minutes, seconds, deadline = match.groups()
    return int(minutes or 0) * 60 + int(seconds), deadline


def parse_utc(when: str) -> datetime:
    return datetime.fromisoformat(when.replace("Z", "+00:00"))


def deadline_at(deadline: str) -> datetime:
    """'10:04 AM' (today) or 'Dec 3, 12:01 AM' (another day: a deadline across midnight) → the
    local time it names, the day that puts it nearest to now (a deadline is minutes away)."""
    day, _, clock = deadline.rpartition(", ")
    at = datetime.strptime(clock, "%I:%M %p").time()
    now = datetime.now()
    dates = [(now + timedelta(days=shift)).date() for shift in (-1, 0, 1)]
    if day:
        dates = [d for d in dates if f"{d:%b} {d.day}" == day]
        assert dates, f"{deadline!r} is not within a day of now"
    return min((datetime.combine(d, at) for d in dates), key=lambda t: abs(t - now))


def minutes_between(earlier: str, later: str) -> float:
    return (deadline_at(later) - deadline_at(earlier)).total_seconds() / 60


def notebook_json(source: str) -> dict:
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": uuid.uuid4().hex[:8],
                "metadata": {},
                "outputs": [],
                "source": source,
            }
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def lab_settings(tmp_path: Path) -> Path:
    """JupyterLab's settings for the servers: its own "official Jupyter news?" toast would
    cover ours, so it is switched off."""
    settings = tmp_path / "lab-settings"
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))
    return settings


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubHarness]:
    workdir = tmp_path / "hub"
    workdir.mkdir()
    with governed_hub(
        workdir,
        extra_policies=[BROWSER_POLICY],
        singleuser_env={"JUPYTERLAB_SETTINGS_DIR": str(lab_settings(tmp_path))},
        timeout=180,
    ) as hub:
        hub.create_user("govadmin")
        hub.start_server(USER)
        Gov(hub).wait_up()
        yield hub


def test_warning_extend_checkpoint_in_jupyterlab(hub: HubHarness, tmp_path: Path) -> None:
    gov = Gov(hub)
    token = hub.token(USER)
    auth = {"Authorization": f"token {token}"}
    contents = hub.user_url(USER, f"api/contents/{NOTEBOOK}")
    r = requests.put(
        contents,
        json={"type": "notebook", "content": notebook_json(HOLD)},
        headers=auth,
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    on_disk = hub.workdir / "home" / USER / NOTEBOOK
    assert on_disk.exists(), f"the server's root is not {on_disk.parent}"

    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.set_default_timeout(SLOW)
        with explain_failure(page, tmp_path, lambda: hub.log_tail(3000)):
            run_story(page, hub, gov, auth, contents, on_disk, tmp_path)


def luminance(locator, prop: str) -> float:
    """0 (black) .. 1 (white): a colour as computed in the page."""
    rgb = locator.evaluate(f"n => getComputedStyle(n).{prop}")
    r, g, b = (int(x) / 255 for x in re.findall(r"\d+", rgb)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def run_story(
    page: Page, hub: HubHarness, gov: Gov, auth: dict, contents: str, on_disk: Path, shots: Path
) -> None:
    # --- log in through the hub's login page (DummyAuthenticator: any password) -------------
    page.goto(f"{hub.url}/hub/login?next=/user/{USER}/lab/tree/{NOTEBOOK}")
    page.fill("#username_input", USER)
    page.fill("#password_input", "any password")
    page.click("#login_submit")
    page.wait_for_url(re.compile(rf"/user/{USER}/lab"), timeout=SLOW)
    editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    editor.wait_for(timeout=120_000)
    status = page.locator(".jp-GpuGov-status")
    status.wait_for()

    # --- the notebook's kernel holds 20 GiB of simulated GPU memory -------------------------
    def notebook_kernel() -> str | None:
        r = requests.get(hub.user_url(USER, "api/sessions"), headers=auth, timeout=30)
        for session in r.json():
            if session.get("path") == NOTEBOOK and session.get("kernel"):
                return session["kernel"]["id"]
        return None

    wait(notebook_kernel, 90, "the notebook's kernel session")
    editor.click()
    page.keyboard.press("Control+Enter")  # run the cell in place
    page.locator(".jp-NotebookPanel .jp-InputPrompt").filter(has_text="[1]").first.wait_for()

    # JupyterLab fills in the kernel's language_info on open, which makes the notebook dirty:
    # save it, so that "dirty" below means what the test typed.
    notebook_tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").filter(has_text=NOTEBOOK)
    page.locator(".jp-NotebookPanel .jp-Notebook").first.click(position={"x": 600, "y": 400})
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    wait(lambda: "jp-mod-dirty" not in (notebook_tab.get_attribute("class") or ""), 30, "a save")

    # --- the status bar shows it ---------------------------------------------------------------
    page.wait_for_function(
        "() => document.querySelector('.jp-GpuGov-status-text')?.textContent.includes('20.0 GiB')",
        timeout=SLOW,
    )
    status_text = status.inner_text()
    assert "20.0 GiB" in status_text, status_text

    # --- the warned verdict raises a notification with a live countdown -----------------------
    warning = page.locator(WARNING_TOAST).filter(has_text="GPU idle")
    message = warning.locator(".jp-toast-message")
    warning.first.wait_for(timeout=90_000)
    first_text = message.first.inner_text()
    read_at = time.monotonic()
    assert "this server will be stopped in" in first_text and "unless you extend" in first_text
    first_left, first_deadline = countdown_seconds(first_text)
    assert 200 < first_left <= 300, first_text
    # The countdown ticks: once the text changes, fewer seconds to the same deadline, by no
    # more than the time since (a loaded machine may take seconds to read a page).
    expect(message.first).not_to_have_text(first_text, timeout=30_000)
    later_text = message.first.inner_text()
    later_left, later_deadline = countdown_seconds(later_text)
    assert later_deadline == first_deadline, (first_text, later_text)
    assert 1 <= first_left - later_left <= time.monotonic() - read_at + 3, (
        f"countdown did not tick: {first_text!r} → {later_text!r}"
    )
    assert "jp-GpuGov-state-warned" in (status.get_attribute("class") or "")
    assert gov.verdict(USER)["state"] == "warned"

    # --- the screenshot for the docs -------------------------------------------------------
    page.mouse.move(640, 300)  # no hover effects on the toast's buttons
    page.screenshot(path=str(screenshot_path("gpu-warning.png", shots)), full_page=True)

    # --- Extend: the reason prompt, the governor's record, the new deadline -----------------
    before = gov.verdict(USER)
    extend = warning.first.locator("button.jp-toast-button", has_text="Extend")
    assert extend.inner_text().strip() == "Extend 1m"
    extend.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    assert "Why do you need the GPU longer?" in dialog.inner_text()
    dialog.locator("input").fill("finishing a figure")
    dialog.locator("button.jp-mod-accept").click()
    dialog.wait_for(state="detached")

    granted = page.locator(".jp-Notification-Toast-success").filter(has_text="Extension granted")
    granted.first.wait_for()
    granted_text = granted.first.inner_text()
    # What was left of the old deadline when the toast said this (a loaded machine takes long
    # between the first warning and here: count from now, not from then).
    old_left = (parse_utc(before["cull_at"]) - datetime.now(timezone.utc)).total_seconds()
    page.screenshot(path=str(shots / "extended.png"))
    extends = wait(
        lambda: [a for a in gov.audit(f"{USER}/") if a["action"] == "extend"],
        30,
        "an extend row in the governor's audit",
    )
    assert "finishing a figure" in json.dumps(extends[-1])
    after = gov.verdict(USER)
    assert after["cull_at"] > before["cull_at"] and after["extensions_left"] == 1
    # "Extension granted: the GPU stays with you until 12:09 PM (in 6m 55s). 1 extension left."
    match = re.search(r"until ([^(]+) \(in (?:(\d+)m )?(\d+)s\)", granted_text)
    assert match, granted_text
    granted_deadline = match[1].strip()
    granted_left = int(match[2] or 0) * 60 + int(match[3])
    assert granted_deadline != first_deadline, granted_text
    assert granted_left > old_left + 40, (old_left, granted_text)  # the step is a minute

    # The extension restarts the notice: the warning goes away until the new deadline is
    # within the policy's notice again (the governor's rule), and the status bar leaves red.
    warning.first.wait_for(state="detached", timeout=30_000)
    wait(
        lambda: "jp-GpuGov-state-warned" not in (status.get_attribute("class") or ""),
        30,
        "the status bar to leave the warned state",
    )

    # --- the GPU panel: a few lines, the holder, the details folded; narrow, wide, dark -------
    status.click()
    panel = page.locator(".jp-GpuGov-panel")
    holder = panel.locator(".jp-GpuGov-holder").filter(has_text=NOTEBOOK)
    expect(holder).to_contain_text("20.0 GiB")
    assert panel.locator(".jp-GpuGov-line").count() <= 3
    details = panel.locator("details.jp-GpuGov-details")
    assert details.get_attribute("open") is None  # folded until asked
    details.locator("summary").click()
    # "12:09 PM (in 6m 40s)"
    deadline = details.locator("dt:text-is('Deadline') + dd").inner_text()
    match = re.search(r"\(in (?:(\d+)m ?)?(?:(\d+)s)?\)", deadline)
    assert match, deadline
    old_left = (parse_utc(before["cull_at"]) - datetime.now(timezone.utc)).total_seconds()
    assert int(match[1] or 0) * 60 + int(match[2] or 0) > old_left + 40, deadline  # past it
    # Default sidebar width: nothing cut off; each holder is a name over its facts.
    assert panel.evaluate("n => n.scrollWidth <= n.clientWidth"), "the panel scrolls sideways"
    assert holder.evaluate("n => getComputedStyle(n).display") == "flex"
    page.screenshot(path=str(shots / "panel.png"))
    # A wide sidebar: the holders line up in columns.
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last
    box = handle.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] - 400, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    wait(lambda: panel.bounding_box()["width"] >= 500, 10, "a wide sidebar")
    assert holder.evaluate("n => getComputedStyle(n).display") == "grid"
    assert panel.evaluate("n => n.scrollWidth <= n.clientWidth")
    # The dark theme: the panel follows JupyterLab's colours.
    page.locator(".lm-MenuBar-itemLabel", has_text="Settings").click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Theme", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("JupyterLab Dark", exact=True).click()
    wait(lambda: luminance(panel, "backgroundColor") < 0.2, 30, "the dark theme")
    assert luminance(panel.locator(".jp-GpuGov-line").first, "color") > 0.6
    page.screenshot(path=str(shots / "panel-dark.png"))

    # --- the warning comes back with the later deadline when its notice starts ---------------
    message.first.wait_for(timeout=240_000)
    again_left, again_deadline = countdown_seconds(message.first.inner_text())
    # The warning goes out at the first pass once the new notice is due, and every warning
    # gets its full notice: the deadline is the granted one, or later by the pass's lateness
    # (seconds, but the clock shows minutes: it may read a minute later, never earlier).
    late = minutes_between(granted_deadline, again_deadline)
    assert 0 <= late <= 1, (again_deadline, granted_deadline)
    assert 200 < again_left <= 300
    assert gov.verdict(USER)["state"] == "warned"
    page.screenshot(path=str(shots / "warned-again.png"))

    # --- the warning survives a page reload, once ----------------------------------------------
    page.reload()
    warning.first.wait_for(timeout=SLOW)
    # Two polls come in after the restored warning (the first one handled by the time the
    # second arrives): neither may add a second warning.
    for _ in range(2):
        with page.expect_response(lambda r: "/jupyter-gpu-gov/status" in r.url, timeout=SLOW):
            pass
    assert warning.count() == 1, f"{warning.count()} warnings after a reload"
    reloaded_left, reloaded_deadline = countdown_seconds(message.first.inner_text())
    # A reload reconnects the kernel, which is the owner back at the notebook: the deadline
    # stands or moves later (an owner back after a warning gets its full notice), never earlier.
    assert minutes_between(again_deadline, reloaded_deadline) >= 0, reloaded_deadline
    assert reloaded_left > 0
    notebook_tab.first.wait_for(timeout=SLOW)
    editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
    editor.wait_for(timeout=SLOW)

    # --- Checkpoint now saves the dirty notebook first ----------------------------------------
    marker = f"typed-before-checkpoint-{uuid.uuid4().hex[:8]}"
    editor.click()
    page.keyboard.press("Control+End")
    page.keyboard.type(f"  # {marker}")
    wait(lambda: "jp-mod-dirty" in (notebook_tab.get_attribute("class") or ""), 30, "dirty tab")
    assert marker not in on_disk.read_text(), "saved before Checkpoint now was clicked"

    warning.first.locator("button.jp-toast-button", has_text="Checkpoint").click()
    done = page.locator(".jp-Notification-Toast-success").filter(has_text="Checkpoint saved")
    done.first.wait_for()
    done_text = done.first.inner_text()
    assert "1 unsaved document was saved first" in done_text, done_text
    saved = requests.get(contents, headers=auth, timeout=30).json()
    assert marker in saved["content"]["cells"][0]["source"], saved["content"]["cells"]
    assert marker in on_disk.read_text()
    assert "jp-mod-dirty" not in (notebook_tab.get_attribute("class") or "")
    # The server's checkpoint was taken after the save: it holds the typed text too.
    checkpoint = (
        on_disk.parent / ".ipynb_checkpoints" / NOTEBOOK.replace(".ipynb", "-checkpoint.ipynb")
    )
    assert checkpoint.exists() and marker in checkpoint.read_text()
    assert warning.count() == 1  # the warning stays up
    page.screenshot(path=str(shots / "checkpointed.png"))  # for a human looking at a failure

    # --- Stop server: asked first, then the tab says it is stopped, and nothing else acts ----
    warning.first.get_by_role("button", name="Stop server").click()
    confirm = page.locator(".jp-Dialog")
    expect(confirm).to_contain_text("Stop this server now?")
    confirm.locator("button.jp-mod-warn").click()
    overlay = page.locator(".jp-GpuGov-overlay")
    expect(overlay.locator(".jp-GpuGov-stopped-message")).to_have_text(
        re.compile(r"^You stopped this server at .+\.$")
    )
    expect(warning).to_have_count(0)
    assert page.locator("#main").get_attribute("inert") is not None  # nothing beneath acts
    wait(lambda: not server_running(hub, USER), 60, "the server to stop")


def test_a_withdrawn_reclaim_reads_in_jupyterlab(tmp_path: Path) -> None:
    """ivan (interns) borrows the one H100 and has JupyterLab open; vera (lab, guaranteed it)
    joins the line, and his page warns that the GPU is asked back. vera cancels: the hub lifts
    the reclaim at the governor's next sync, and his page says so where he looks (a toast, once:
    not again after a reload; a line in the GPU panel; "reclaim lifted" in the status bar, whose tooltip
    says it). Before, the status bar said nothing of it."""
    # His work is never idle-culled here; the reclaim's deadline is far enough not to come.
    keep = {"name": "borrower", "match": {"users": ["ivan"]}, "warn_after": "1h",
            "cull_after": "2h", "reclaim_grace": "10m"}  # fmt: skip
    workdir = tmp_path / "hub"
    workdir.mkdir()
    with governed_hub(
        workdir,
        hub_config=PROFILES,
        singleuser_config=SINGLEUSER,
        extra_policies=[keep],
        singleuser_env={"JUPYTERLAB_SETTINGS_DIR": str(lab_settings(tmp_path))},
        timeout=180,
    ) as hub:
        gov = ivan_borrows_the_h100(hub)
        with chromium() as browser:
            page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            page.set_default_timeout(SLOW)
            with explain_failure(page, tmp_path, lambda: hub.log_tail(3000)):
                lifted_story(page, hub, gov, tmp_path)


def lifted_story(page: Page, hub: HubHarness, gov: Gov, shots: Path) -> None:
    log_in(page, hub.url, "ivan", "any password", "/user/ivan/lab")
    status = page.locator(".jp-GpuGov-status")
    status.wait_for(timeout=120_000)
    status_text = page.locator(".jp-GpuGov-status-text")
    expect(status_text).to_have_text(re.compile(r"^GPU .+ · \d+%$"))  # its GPU, read

    # --- vera joins the line: his borrowed GPU is asked back, his page warns ----------------
    assert join(hub, "vera", {"profile": "h100"}).status_code == 302
    warning = page.locator(WARNING_TOAST)
    warning.first.wait_for(timeout=90_000)
    expect(warning.first).to_contain_text("Hard deadline: this server will be stopped")
    assert "reclaim-warn" in gov.actions("ivan/")

    # --- vera cancels: the reclaim is withdrawn, and his page says so -----------------------
    cancel(hub, "vera")
    wait(lambda: "reclaim-withdrawn" in gov.actions("ivan/"), 60, "the withdrawal on record")
    lifted = page.locator(".jp-Notification-Toast-info").filter(has_text="no longer asked back")
    lifted.first.wait_for(timeout=90_000)
    expect(warning).to_have_count(0)
    expect(status_text).to_have_text(re.compile(r"^GPU .+ · \d+% · reclaim lifted$"))
    tip = status.get_attribute("title") or ""
    assert "no longer asked back" in tip and "needs this borrowed GPU back" not in tip, tip
    status.click()
    line = page.locator(".jp-GpuGov-panel .jp-GpuGov-line").filter(has_text="no longer asked back")
    expect(line).to_have_count(1)  # the whole sentence (a toast shortens it)
    expect(line).to_contain_text("The deadline you were warned of is lifted")
    page.screenshot(path=str(shots / "reclaim-lifted.png"))  # for a human looking at a failure

    # --- a reload: the status bar still says it, the toast is not said again ----------------
    page.reload()
    status.wait_for(timeout=SLOW)
    expect(status_text).to_contain_text("reclaim lifted")
    for _ in range(2):  # two polls in: neither says it again
        with page.expect_response(lambda r: "/jupyter-gpu-gov/status" in r.url, timeout=SLOW):
            pass
    assert lifted.count() == 0, "the lifted reclaim was said again after a reload"
