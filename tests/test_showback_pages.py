"""The showback page and "My GPU usage" read as a team lead and finance read them: what a row
covers when the span cuts a session or a week (the real service app over HTTP, its ledger
written as the governor writes it)."""

from __future__ import annotations

import asyncio
import html
import json
import re
from datetime import timedelta

import pytest
from test_fuzz_api import ACCESS, ADMIN, ALICE, Service, call

from jupyter_gpu_gov.core import clock, ledger
from jupyter_gpu_gov.hub import showback

HOUR = 3600.0
VISION = ledger.Owner("alice", "vision", "seg", "h100")


@pytest.fixture
def service(tmp_path, monkeypatch):
    service = Service(tmp_path, monkeypatch)
    yield service
    service.stop()


def text(response) -> str:
    assert response.ok, response.text[:300]
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", response.text)))


def test_a_session_begun_before_the_30_days_says_its_hours_are_its_whole_run(service, frozen_clock):
    """alice's server ran 10 days, 5 of them before "My GPU usage"'s 30 days: its session row
    holds all 240 idle hours (the ledger keeps a session's totals), the cards above the 120 of
    the window. The row said neither, and read as 240 idle hours in the last 30 days."""
    since = showback.days_back(30)  # (frozen_clock: the page's day too, even at midnight)
    began = since - timedelta(days=5)
    deltas = {
        (began.date() + timedelta(days=d), VISION): {ledger.IDLE_HELD: 24 * HOUR} for d in range(10)
    }
    session = ledger.Session(
        "alice/", "s1", VISION, began, began + timedelta(days=10), 1.0, ledger.IDLE_HELD,
        {ledger.IDLE_HELD: 240 * HOUR}, began + timedelta(days=10),
    )  # fmt: skip
    service.governor.store.save_usage(deltas, [session])

    page = text(call(service, "GET", "me", ALICE))

    assert "120.00 of them idle" in page  # the window's days only
    assert "Sessions that ran in the last 30 days" in page
    row = page[page.index("Sessions that ran") :]
    assert "240.00" in row and "before these 30 days" in row
    assert f"(UTC days from {since.date()})" in row
    assert "its whole run" in row and "add up to more than" in row


def test_a_week_the_span_cuts_says_which_of_its_days_it_counts(service, frozen_clock):
    """Showback per week names a week by its Monday; with 14 days back from a Wednesday, the
    first row named for a Monday held only the days from the span's first, read as a week."""
    # (frozen_clock: the page counts from the test's day, even across midnight.)
    days = 14 if (clock.utcnow().date() - timedelta(days=13)).weekday() else 13
    since = showback.days_back(days).date()
    monday = since - timedelta(days=since.weekday())
    service.governor.store.save_usage({(since, VISION): {ledger.ACTIVE: 5 * HOUR}}, [])

    page = text(call(service, "GET", f"showback?group_by=team&period=week&days={days}", ADMIN))

    assert f"last {days} days (UTC days from {since})" in page
    rows = page[page.index("Per week") :]
    assert f"{monday} from {since} only vision 5.00" in rows


def test_my_page_says_a_reclaim_it_warned_of_is_withdrawn(service):
    """alice's borrowed server was warned it would be given back; the team that asked no longer
    needs it and the hub lifted the reclaim. Her page showed the warning in the server's reason
    and, once lifted, simply nothing: it says the deadline is lifted, for a while."""
    gov = service.governor
    assert "No longer asked back" not in text(call(service, "GET", "me", ALICE))
    lifted = {"server": "alice/", "team": "vision", "asked_at": "2026-01-05T10:00:00Z", "by": "v/"}
    gov.spawn_queue._withdrawn([lifted], clock.utcnow())
    page = text(call(service, "GET", "me", ALICE))
    assert "No longer asked back" in page and "the deadline you were warned of is lifted" in page
    gov.spawn_queue._withdrawn([lifted], clock.utcnow() - timedelta(minutes=16))  # said enough
    assert "No longer asked back" not in text(call(service, "GET", "me", ALICE))


def test_a_reclaim_lifted_before_a_restart_is_not_said_in_the_new_session(service):
    """alice's reclaim was lifted, then she stopped her server and started it again within the
    notice's 15 minutes. The new session was never warned of a deadline: its JupyterLab (the
    verdict) and her page said "reclaim lifted" all the same, of the session before."""
    gov = service.governor
    lifted = {"server": "alice/", "team": "vision", "asked_at": "2026-01-05T10:00:00Z", "by": "v/"}
    gov.spawn_queue._withdrawn([lifted], clock.utcnow() - timedelta(minutes=2))
    assert gov.verdict("alice/")["reclaim_withdrawn"]  # the session it was for: said
    service.hub.add_server("alice", started=clock.utcnow() - timedelta(seconds=30))  # restarted
    asyncio.run_coroutine_threadsafe(gov.reconcile(), service.loop).result(60)

    assert gov.row("alice/").session_started > clock.utcnow() - timedelta(minutes=1)
    assert gov.verdict("alice/")["reclaim_withdrawn"] is None
    assert json.loads(gov.answer("alice/"))["verdict"]["reclaim_withdrawn"] is None
    assert "No longer asked back" not in text(call(service, "GET", "me", ALICE))


@pytest.mark.parametrize("hub_ahead_s", [600, -600])
def test_a_reclaim_lifted_is_said_for_its_session_whatever_the_clocks(service, hub_ahead_s):
    """The notice was dropped when the Hub's ``started`` of the server was later than the
    governor's time of the withdrawal: one clock read against another. With the Hub's clock
    10 minutes ahead, a server started just before the lift read as started after it (the
    notice never said); 10 minutes behind, a server restarted just after the lift read as
    started before it (the new session, never warned, told its reclaim was lifted). The
    notice is now for the session it was lifted on, the Hub's ``started`` against itself."""
    gov = service.governor
    hub_now = clock.utcnow() + timedelta(seconds=hub_ahead_s)  # what the Hub's clock says now

    def started_again(at):
        service.hub.add_server("alice", started=at)
        asyncio.run_coroutine_threadsafe(gov.reconcile(), service.loop).result(60)

    def said() -> bool:
        verdict = gov.verdict("alice/")["reclaim_withdrawn"]
        assert json.loads(gov.answer("alice/"))["verdict"]["reclaim_withdrawn"] == verdict
        return verdict is not None

    started_again(hub_now - timedelta(minutes=1))  # the session warned, by the Hub's clock
    lifted = {"server": "alice/", "team": "vision", "asked_at": "2026-01-05T10:00:00Z", "by": "v/"}
    gov.spawn_queue._withdrawn([lifted], clock.utcnow())
    assert said()  # the session it was lifted on (ahead: dropped as "started since")
    gov.spawn_queue.restore_withdrawn()  # as a restart reads it back: the same
    assert said()
    started_again(hub_now + timedelta(minutes=2))  # stopped and started again since
    assert not said()  # (behind: said to the new session as if it had been warned)
    assert "No longer asked back" not in text(call(service, "GET", "me", ALICE))


def test_a_leads_read_before_the_groups_are_read_says_when_to_come_back(service):
    """Before the governor's pass read the Hub's groups, a team lead's showback and usage are a
    503 "try again shortly", with no ``Retry-After``: JupyterHub's clients and a browser could
    not tell when. It comes with one, on the JSON and on the page, and a read after it is
    answered."""
    service.hub.add_group("cv-lab", users=["lena"], properties={"gpu-gov/team": "vision"})
    scope = "custom:gpu-gov:showback!group=cv-lab"
    service.hub.add_user_token("lena", "lena-token", extra_scopes=[ACCESS, scope])
    gov = service.governor
    gov._context = type(gov._context)()  # as a fresh governor's (or a standby's): none read
    assert gov.teams_by_group is None
    for path in ("api/usage?group_by=team", "showback"):
        r = call(service, "GET", path, "lena-token")
        assert r.status_code == 503 and "try again shortly" in html.unescape(r.text), r.text
        assert r.headers.get("Retry-After") == "10", (path, dict(r.headers))
    asyncio.run_coroutine_threadsafe(gov.reconcile(), service.loop).result(60)
    for path in ("api/usage?group_by=team", "showback"):
        r = call(service, "GET", path, "lena-token")
        assert r.ok and "Retry-After" not in r.headers, (path, r.status_code, r.text[:300])
