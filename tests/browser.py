"""What every browser test shares: Debian's chromium driven by the ``playwright`` package (no
``playwright install``), launched headless without a sandbox (we run as root) and without
background networking, the skip marks that say why a test cannot run, logging in through the
hub's login page, and the screenshots for the docs.

Screenshots go to ``docs/images/`` only with ``JUPYTER_GPU_GOV_SCREENSHOTS=1`` (a plain test
run leaves the tree clean); otherwise to the test's ``tmp_path``, for a human reading a failure.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    from playwright.sync_api import Browser, Page, Playwright, sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

CHROMIUM = Path("/usr/bin/chromium")
DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
# Headless without a sandbox (root) and without the calls home a fresh profile makes.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]

needs_browser = [
    pytest.mark.skipif(
        sync_playwright is None,
        reason="the playwright Python package is missing (pip install playwright)",
    ),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install -y chromium)"
    ),
]


def requires_browser(test):
    """``needs_browser`` for one test of a module that has others."""
    for mark in needs_browser:
        test = mark(test)
    return test


def launch(pw: Playwright) -> Browser:
    return pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


@contextlib.contextmanager
def browser() -> Iterator[Browser]:
    """A chromium for one test, closed afterwards whatever happens."""
    with sync_playwright() as pw:
        instance = launch(pw)
        try:
            yield instance
        finally:
            instance.close()


def log_in(page: Page, hub_url: str, user: str, password: str, next_path: str) -> None:
    """Through the hub's login form, as a person would; waits to land on ``next_path``."""
    page.goto(f"{hub_url}/hub/login?next={next_path}")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(re.escape(next_path.split("?")[0])))


def screenshot_path(name: str, tmp_path: Path) -> Path:
    """Where a docs screenshot goes: docs/images on request, else the test's tmp_path."""
    if os.environ.get("JUPYTER_GPU_GOV_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        return DOCS_IMAGES / name
    return tmp_path / name


@contextlib.contextmanager
def explain_failure(page: Page, tmp_path: Path, log_tail=lambda: "") -> Iterator[None]:
    """On a failure, say where the page was, which toasts it showed, and keep a screenshot."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # also pytest's Failed (a timeout)
        shot = tmp_path / "failure.png"
        with contextlib.suppress(Exception):
            page.screenshot(path=str(shot), full_page=True)
        toasts = ""
        with contextlib.suppress(Exception):
            toasts = " | ".join(page.locator(".Toastify__toast").all_inner_texts())
        raise AssertionError(
            f"{error}\n  page: {page.url}\n  toasts: {toasts or '(none)'}\n"
            f"  screenshot: {shot}\n  log tail:\n{log_tail()}"
        ) from error
