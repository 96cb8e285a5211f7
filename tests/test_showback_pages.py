"""The showback page and "My GPU usage" read as a team lead and finance read them: what a row
covers when the span cuts a session or a week (the real service app over HTTP, its ledger
written as the governor writes it)."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import html
import io
import json
import re
from datetime import timedelta

import pytest
from test_fuzz_api import ACCESS, ADMIN, ALICE, Service, call

from jupyter_gpu_gov.core import clock, ledger, rightsize
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

    assert f"last {days} days (UTC days from {since} to {clock.utcnow().date()})" in page
    rows = page[page.index("Per week") :]
    assert f"{monday} from {since} only vision 5.00" in rows


def test_a_month_across_a_tier_rename_is_the_tiers_under_its_name_now(service):
    """h100 was renamed h100-80gb (``formerly``) mid-month: finance's month by tier is one row
    under its name now, priced as it is, and ``tier=`` either name reads the whole month, in
    the API's JSON and CSV and on the page. It was two rows, and ``tier=h100-80gb`` left out
    the 15 days before the rename (26.25 of its 52.50 EUR)."""
    gov = service.governor
    gov.options = dataclasses.replace(
        gov.options,
        gpu_hour_cost={"h100-80gb": 2.5},
        currency="EUR",
        tier_sizes=rightsize.load_tier_sizes(
            [{"name": "h100-80gb", "memory_gb": 80, "weight": 1, "formerly": ["h100"]}]
        ),
    )
    deltas = {}
    first = clock.utcnow().date() - timedelta(days=30)
    for n in range(30):
        day = first + timedelta(days=n)
        owner = dataclasses.replace(VISION, tier="h100" if n < 15 else "h100-80gb")
        deltas[day, owner] = {ledger.IDLE_HELD: 0.7 * HOUR}
    gov.store.save_usage(deltas, [])
    month = f"since={first}&until={first + timedelta(days=29)}"

    for tier in ("", "&tier=h100-80gb", "&tier=h100"):
        r = call(service, "GET", f"api/usage?group_by=tier&{month}{tier}", ADMIN)
        assert r.status_code == 200, r.text
        assert [
            (row["tier"], row["gpu_hours_idle"], row["idle_cost"]) for row in r.json()["usage"]
        ] == [("h100-80gb", 21.0, 52.5)], tier
    r = call(service, "GET", f"api/usage?group_by=tier,day&{month}&format=csv", ADMIN)
    assert {line.split(",")[1] for line in r.text.splitlines()[1:]} == {"h100-80gb"}
    page = text(call(service, "GET", "showback?group_by=tier&days=31", ADMIN))
    totals = page[page.index("By tier") : page.index("Per day")]
    assert "h100-80gb 21.00" in totals and "h100 " not in totals, totals


def test_the_pages_totals_its_csv_and_the_api_agree_to_the_cent(service):
    """Finance reads a team's cost on the showback page, then adds up the page's CSV (by day)
    and asks the API for the same days: the same cents each way. The page showed idle cost
    alone (no cost), and its CSV's days added up to 8 cents less than its total."""
    gov = service.governor
    gov.options = dataclasses.replace(gov.options, gpu_hour_cost={"h100": 2.5}, currency="EUR")
    first = showback.days_back(30).date()
    gov.store.save_usage(
        {
            (first + timedelta(days=n), VISION): {
                ledger.IDLE_HELD: 1.337 * HOUR,
                ledger.ACTIVE: 2.2221 * HOUR,
            }
            for n in range(30)
        },
        [],
    )

    r = call(service, "GET", "showback?group_by=team&days=30", ADMIN)
    row = re.search(r'<table id="totals">.*?<td><bdi>vision</bdi></td>(.*?)</tr>', r.text, re.S)[1]
    idle_cost, cost = re.findall(r"([\d.]+) EUR", row)
    link = html.unescape(re.search(r'id="csv" href="[^"]*?(api/usage\?[^"]+)"', r.text)[1])
    days = list(csv.DictReader(io.StringIO(call(service, "GET", link, ADMIN).text)))
    assert len(days) == 30
    api = call(service, "GET", f"api/usage?group_by=team&since={first}", ADMIN).json()
    (month,) = api["usage"]
    for column, shown in (("idle_cost", idle_cost), ("cost", cost)):
        cents = sum(round(float(day[column]) * 100) for day in days)
        assert cents == round(float(shown) * 100) == round(month[column] * 100), column


def last_month(today):
    end = today.replace(day=1) - timedelta(days=1)
    return end.replace(day=1), end


def test_finance_reads_last_month_on_the_page_its_csv_to_the_cent(service):
    """Finance closes last month: one click on the page's "last month" shows its UTC days, the
    first to the last, and the page's totals, its CSV link's days and the API's month agree to
    the cent; the days before and after it are in none of them. The page had only "last N
    days" to today: a closed month was the API's or the CLI's alone."""
    gov = service.governor
    gov.options = dataclasses.replace(gov.options, gpu_hour_cost={"h100": 2.5}, currency="EUR")
    first, last = last_month(clock.utcnow().date())
    deltas = {}
    day = first - timedelta(days=3)
    while day <= clock.utcnow().date():  # the month, and days either side of it
        hours = 1.337 if first <= day <= last else 5.0
        deltas[day, VISION] = {ledger.IDLE_HELD: hours * HOUR, ledger.ACTIVE: 2.2221 * HOUR}
        day += timedelta(days=1)
    gov.store.save_usage(deltas, [])

    r = call(service, "GET", "showback?group_by=team", ADMIN)
    assert r.ok, r.text[:300]
    click = html.unescape(re.search(r'<a href="[^"]*?(showback\?[^"]+)">last month</a>', r.text)[1])
    r = call(service, "GET", click, ADMIN)
    assert r.ok, r.text[:300]
    n = (last - first).days + 1
    assert f"(UTC days from {first} to {last}, {n} days)" in text(r)
    row = re.search(r'<table id="totals">.*?<td><bdi>vision</bdi></td>(.*?)</tr>', r.text, re.S)[1]
    idle_h = re.findall(r'<td class="num">([\d.]+)</td>', row)[2]
    assert float(idle_h) == pytest.approx(1.337 * n, abs=0.01)
    idle_cost, cost = re.findall(r"([\d.]+) EUR", row)
    link = html.unescape(re.search(r'id="csv" href="[^"]*?(api/usage\?[^"]+)"', r.text)[1])
    days = list(csv.DictReader(io.StringIO(call(service, "GET", link, ADMIN).text)))
    assert sorted(d["period"] for d in days) == [
        (first + timedelta(days=i)).isoformat() for i in range(n)
    ]
    api = call(service, "GET", f"api/usage?group_by=team&since={first}&until={last}", ADMIN)
    (month,) = api.json()["usage"]
    for column, shown in (("idle_cost", idle_cost), ("cost", cost)):
        cents = sum(round(float(day[column]) * 100) for day in days)
        assert cents == round(float(shown) * 100) == round(month[column] * 100), column
    # The month's days only (a day either side is 5.00 idle GPU-h): within half a cent of
    # its exact price per bucket (two a day).
    assert abs(round(float(cost) * 100) - n * (1.337 + 2.2221) * 250) <= n


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("since=2026-11-30&until=2026-11-01", "'until' (2026-11-01) is before 'since' (2026-11-30)"),
        ("since=2026-11-31&until=2026-12-01", "'since' must be a UTC day as 2026-11-01; got '2026-11-31'"),
        ("since=2026-11-01&until=30.11.2026", "'until' must be a UTC day as 2026-11-01; got '30.11.2026'"),
        ("since=2026-11-01T00:00:00Z", "'since' must be a UTC day"),
        ("until=2026-11-30", "'since' is needed with 'until'"),
        ("since=2024-01-01&until=2025-12-31", "'since' to 'until' is 731 days; the page shows at most 366"),
        ("since=2026-11-01&days=30", "give 'days' or 'since' and 'until', not both"),
        ("since=2026-11-01&sinse=2026-11-02", "unknown parameter 'sinse'"),
        ("since=2026-11-01&since=2026-10-01", "'since' given 2 times"),
    ],
)  # fmt: skip
def test_a_bad_period_on_the_page_is_a_400_naming_its_field(service, query, named):
    """Finance's typo in a date shows no other days than asked: a 400 page naming the field."""
    r = call(service, "GET", f"showback?group_by=team&{query}", ADMIN)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    said = re.search(r'<p id="error-message">(.*?)</p>', r.text, re.S)
    assert said and named in html.unescape(said.group(1)), r.text[:500]


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


def test_a_name_holding_a_bidi_override_reorders_nothing_around_it(service):
    """A project named ``\\u202eevil`` (a choice its owner makes at spawn) and a user whose
    name holds U+202E once turned the rest of their row right to left on the showback page:
    the cells after them, and a name beside them, read reversed, as another's. Each such name
    is its own ``<bdi>`` now, escaped as before; the override ends with it."""
    rlo = "\u202e"
    mallory = ledger.Owner(f"mallory{rlo}", "vision", f"{rlo}evil", "h100")
    today = clock.utcnow().date()
    service.governor.store.save_usage(
        {(today, VISION): {ledger.ACTIVE: HOUR}, (today, mallory): {ledger.ACTIVE: HOUR}}, []
    )
    for dim, names in (("project", ("seg", f"{rlo}evil")), ("user", ("alice", f"mallory{rlo}"))):
        page = call(service, "GET", f"showback?group_by={dim}&days=7", ADMIN).text
        for name in names:
            assert f"<td><bdi>{html.escape(name)}</bdi></td>" in page, (dim, name)
        # Nowhere unisolated: each override is in a <bdi>, a tooltip's isolate (U+2068 ...
        # U+2069), or a chart's legend, an SVG text of its own holding the name alone.
        for alone in (r"<bdi>[^<]*</bdi>", "\u2068[^\u2069]*\u2069", r'class="legend">[^<]*<'):
            page = re.sub(alone, "", page)
        assert rlo not in page, dim
