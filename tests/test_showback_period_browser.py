"""Finance closes last month on the showback page, in Debian's chromium (playwright), on a real
hub with the governor: one click on "last month" shows that month's UTC days and their totals,
the CSV link is of the same days, the date fields pick a period, and a period that cannot be
shown (its last day before its first) is a page naming the field, showing nothing else.

fiona holds ``custom:gpu-gov:showback`` (finance, no Hub admin). The ledger is written into the
governor's store before the hub starts, as its passes write it: last month at 1.5 idle and 0.5
active GPU-hours a day of vision's h100 (2.50 EUR an hour), the days either side at 4 idle.
"""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from browser import browser as chromium
from browser import log_in, needs_browser
from governor_harness import Gov, governed_hub, wait

from jupyter_gpu_gov.core import clock, ledger
from jupyter_gpu_gov.hub.store import Store

with contextlib.suppress(ImportError):  # without playwright, needs_browser skips
    from playwright.sync_api import expect

pytestmark = [pytest.mark.timeout(300), *needs_browser]

HOUR = 3600.0
SLOW = 30_000  # ms
FINANCE = """
c.JupyterHub.load_roles.extend([
    {"name": "finance", "users": ["fiona"], "scopes": ["custom:gpu-gov:showback"]},
])
"""
PRICES = "c.GpuGovernor.gpu_hour_cost = {'h100': 2.5}\nc.GpuGovernor.currency = 'EUR'\n"
VISION = ledger.Owner("alice", "vision", "seg", "h100")


def last_month():
    end = clock.utcnow().date().replace(day=1) - timedelta(days=1)
    return end.replace(day=1), end


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("showback-period")
    store = Store(f"sqlite:///{workdir / 'gpu-gov.sqlite'}")
    first, last = last_month()
    deltas, day = {}, first - timedelta(days=5)
    while day <= clock.utcnow().date():
        inside = first <= day <= last
        deltas[day, VISION] = (
            {ledger.IDLE_HELD: 1.5 * HOUR, ledger.ACTIVE: 0.5 * HOUR}
            if inside
            else {ledger.IDLE_HELD: 4 * HOUR}
        )
        day += timedelta(days=1)
    store.save_usage(deltas, [])
    store.engine.dispose()
    with governed_hub(workdir, hub_config=FINANCE, governor_config=PRICES) as hub:
        hub.create_user("fiona")
        gov = Gov(hub)
        gov.wait_up()
        wait(lambda: gov.passes() >= 1, 60, "a pass: the Hub's groups and their teams read")
        yield hub


def vision_totals(page) -> list[str]:
    row = page.locator("#totals tr", has_text="vision")
    return [cell.strip() for cell in row.locator("td").all_inner_texts()]


def test_finance_picks_last_month_and_reads_its_totals(hub):
    first, last = last_month()
    n = (last - first).days + 1
    with chromium() as browser:
        page = browser.new_page()
        page.set_default_timeout(SLOW)
        log_in(page, hub.url, "fiona", "any", "/services/gpu-gov/showback")
        expect(page.locator("#totals")).to_contain_text("vision")

        page.get_by_role("link", name="last month", exact=True).click()
        expect(page.locator("#span")).to_have_text(
            f"By team, (UTC days from {first} to {last}, {n} days)"
        )
        cells = vision_totals(page)
        # team, GPU-h, active, idle, …, idle cost, cost: the month's days only
        assert cells[1:4] == [f"{2 * n:.2f}", f"{0.5 * n:.2f}", f"{1.5 * n:.2f}"], cells
        assert cells[7:9] == [f"{3.75 * n:.2f} EUR", f"{5 * n:.2f} EUR"], cells
        expect(page.locator("#since")).to_have_value(first.isoformat())
        expect(page.locator("#until")).to_have_value(last.isoformat())
        csv_link = parse_qs(urlsplit(page.locator("#csv").get_attribute("href")).query)
        assert csv_link["since"] == [first.isoformat()] and csv_link["until"] == [last.isoformat()]
        csv_text = page.request.get(page.locator("#csv").evaluate("a => a.href")).text()
        days = re.findall(r"^(\d{4}-\d{2}-\d{2}),vision,", csv_text, re.M)
        assert len(days) == n and min(days) == str(first) and max(days) == str(last)

        # The date fields: its first ten days.
        tenth = first + timedelta(days=9)
        page.fill("#until", tenth.isoformat())
        page.get_by_role("button", name="Show").click()
        expect(page.locator("#span")).to_contain_text(f"from {first} to {tenth}, 10 days")
        assert vision_totals(page)[1:4] == ["20.00", "5.00", "15.00"]

        # Its last day before its first: a page naming the field, not other days' totals.
        page.fill("#since", last.isoformat())
        page.fill("#until", first.isoformat())
        page.get_by_role("button", name="Show").click()
        expect(page.locator("#error-message")).to_contain_text(
            f"'until' ({first}) is before 'since' ({last})"
        )
        expect(page.locator("#totals")).to_have_count(0)
