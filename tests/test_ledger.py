"""The usage ledger's arithmetic (``core.ledger``, pure): sample and hold between observations,
state changes, midnight, gaps (the service was down), restarts, new sessions of one server,
overlapping servers, events and the showback summary."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest

from jupyter_gpu_gov.core import ledger
from jupyter_gpu_gov.core.ledger import (
    ACTIVE,
    IDLE_FREE,
    IDLE_HELD,
    UNKNOWN,
    UNOBSERVED,
    Bucket,
    Ledger,
    Observation,
    Owner,
    split_days,
    summarize,
    utilisation_histogram,
)

T0 = datetime(2025, 3, 3, 10, 0, tzinfo=timezone.utc)  # a Monday
ALICE = Owner("alice", "vision", "seg", "h100")
BOB = Owner("bob", "nlp", "", "h100-3g")
GAP = timedelta(minutes=3)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def look(led, t, state, owner=ALICE, gpus=1.0, server="alice/", session="s1", started=None):
    led.observe(Observation(server, session, at(t), owner, gpus, state, started))


def totals(deltas) -> dict:
    out: dict[str, float] = {}
    for values in deltas.values():
        for k, v in values.items():
            out[k] = out.get(k, 0) + v
    return out


def test_time_is_billed_as_it_was_seen_at_the_start_of_each_interval():
    led = Ledger(GAP)
    look(led, 0, ACTIVE)
    look(led, 60, IDLE_HELD)  # 0..60 active
    look(led, 120, IDLE_HELD)  # 60..120 idle holding memory
    look(led, 150, IDLE_FREE)  # 120..150 idle held
    look(led, 210, UNKNOWN)  # 150..210 idle without a context
    look(led, 240, ACTIVE)  # 210..240 unknown: never idle
    deltas, sessions = led.drain()
    assert totals(deltas) == {ACTIVE: 60, IDLE_HELD: 90, IDLE_FREE: 60, UNKNOWN: 30}
    (session,) = sessions
    assert session.allocated == 240 and session.state == ACTIVE and session.at == at(240)


def test_gpu_equivalents_scale_the_seconds_and_ownership_changes_bill_the_old_owner_first():
    led = Ledger(GAP)
    look(led, 0, IDLE_HELD, gpus=0.5)
    look(led, 100, IDLE_HELD, gpus=2, owner=Owner("alice", "nlp", "seg", "h100"))
    look(led, 200, IDLE_HELD, gpus=2, owner=Owner("alice", "nlp", "seg", "h100"))
    deltas, _ = led.drain()
    by_team = {owner.team: values[IDLE_HELD] for (_, owner), values in deltas.items()}
    assert by_team == {"vision": 50.0, "nlp": 200.0}


def test_a_running_server_s_owner_is_kept_once_however_often_it_is_seen():
    """Every pass observes a server with an owner of its own making; an equal one is the same
    owner: the session and the day's bucket hold one object (memory: docs/benchmarks-history.md,
    "Issue 26, wave 15"), and a changed owner is taken, as before."""
    led = Ledger(GAP)
    for t in (0, 60, 120):
        look(led, t, ACTIVE, owner=Owner("alice", "vision", "seg", "h100"))
    ((_, billed),) = led.drain()[0]  # the day's bucket, by its owner
    assert led.open["alice/"].owner is billed
    look(led, 180, ACTIVE, owner=Owner("alice", "vision", "seg", "h100"))
    ((_, billed_next),) = led.drain()[0]
    assert billed_next is billed and led.open["alice/"].owner is billed
    look(led, 240, ACTIVE, owner=Owner("alice", "nlp", "seg", "h100"))
    assert led.open["alice/"].owner == Owner("alice", "nlp", "seg", "h100")


def test_a_second_is_never_billed_twice():
    led = Ledger(GAP)
    look(led, 0, ACTIVE)
    look(led, 60, ACTIVE)
    look(led, 60, ACTIVE)  # the same pass twice (a redecide)
    look(led, 30, ACTIVE)  # a clock that went back
    look(led, 90, ACTIVE)
    deltas, _ = led.drain()
    assert totals(deltas) == {ACTIVE: 90}


def test_overlapping_servers_each_bill_their_own_gpus_and_the_sums_add_up():
    led = Ledger(GAP)
    for t in range(0, 601, 60):
        look(led, t, ACTIVE)
        look(led, t, IDLE_HELD, server="alice/second", gpus=0.5)
        look(led, t + 30, IDLE_FREE, owner=BOB, server="bob/", session="b1", gpus=0.25)
    deltas, sessions = led.drain()
    assert totals(deltas) == {ACTIVE: 600, IDLE_HELD: 300, IDLE_FREE: 150}
    per_session = {s.server: s.allocated for s in sessions}
    assert per_session == {"alice/": 600, "alice/second": 300, "bob/": 150}
    assert sum(per_session.values()) == sum(totals(deltas).values())  # nothing lost


def test_a_gap_longer_than_max_gap_is_unobserved_not_idle():
    led = Ledger(GAP)
    look(led, 0, IDLE_HELD)
    look(led, 60, IDLE_HELD)
    look(led, 60 + 3600, IDLE_HELD)  # the service was down for an hour
    look(led, 60 + 3660, IDLE_HELD)
    deltas, (session,) = led.drain()
    assert totals(deltas) == {IDLE_HELD: 120, UNOBSERVED: 3600}
    assert session.allocated == 120  # the outage is not billed


def test_a_new_session_ends_the_old_one_when_it_started_and_bills_from_its_own_start():
    led = Ledger(GAP)
    look(led, 0, ACTIVE)
    look(led, 60, IDLE_HELD)
    # Stopped and started again between two passes: the new one started at 100.
    look(led, 120, ACTIVE, session="s2", started=at(100))
    look(led, 180, ACTIVE, session="s2", started=at(100))
    deltas, sessions = led.drain()
    first, second = sorted(sessions, key=lambda s: s.session)
    assert first.totals == {ACTIVE: 60, IDLE_HELD: 40} and first.ended_at == at(100)
    assert second.totals == {ACTIVE: 80} and second.first_at == at(100)
    assert totals(deltas) == {ACTIVE: 140, IDLE_HELD: 40}  # 0..180 once, 100..180 not twice


def test_a_start_long_before_the_first_look_is_not_billed():
    led = Ledger(GAP)
    look(led, 3600, ACTIVE, started=at(0))  # started during an outage an hour ago
    look(led, 3660, ACTIVE, started=at(0))
    deltas, _ = led.drain()
    assert totals(deltas) == {ACTIVE: 60}


def test_a_stopped_server_is_billed_up_to_its_stop_and_not_after():
    led = Ledger(GAP)
    look(led, 0, IDLE_HELD)
    led.close("alice/", at(45))
    led.close("alice/", at(90))  # already closed: nothing
    look(led, 120, ACTIVE, session="s2")
    deltas, sessions = led.drain()
    assert totals(deltas) == {IDLE_HELD: 45}
    ended = next(s for s in sessions if s.session == "s1")
    assert ended.ended_at == at(45) and "alice/" in led.open


def test_a_restarted_ledger_bills_on_from_the_saved_cursor():
    led = Ledger(GAP)
    look(led, 0, IDLE_HELD)
    look(led, 60, IDLE_HELD)
    first, saved = led.drain()
    # A new process, given the open sessions the store kept.
    again = Ledger(GAP, saved)
    look(again, 120, ACTIVE)  # a short restart: 60..120 as last seen (idle)
    look(again, 180, ACTIVE)
    second, (session,) = again.drain()
    assert totals(first) == {IDLE_HELD: 60}
    assert totals(second) == {IDLE_HELD: 60, ACTIVE: 60}
    assert session.totals == {IDLE_HELD: 120, ACTIVE: 60}


def test_held_servers_are_billed_at_the_drain_as_observing_each_at_every_pass_would_bill():
    """``sweep`` sees every held session (observed, not skipped since) as it was at a pass,
    without visiting it: billed at its next observation, its stop or the drain, the same totals
    as observing it at every pass, the whole span observed although it is longer than
    ``max_gap``; a gap longer than that between two sweeps is unobserved, and a server skipped
    (its decision failed) is seen by no sweep until it is observed again."""

    def look(led: Ledger, t: float, share: float = 0.5) -> None:
        led.observe(Observation("alice/", "s1", at(t), ALICE, 1.0, IDLE_HELD, None, share))

    every, swept = Ledger(GAP), Ledger(GAP)
    for led in (every, swept):
        look(led, 0)
    swept.sweep(at(0))
    for t in range(60, 901, 60):  # 15 minutes of passes, a minute apart
        look(every, t)
        swept.sweep(at(t))
    assert swept.open["alice/"].at == at(0)  # nothing billed yet
    swept.sweep(at(1500))  # the service was down 10 minutes: unobserved, for each held one
    look(every, 1500)
    for led in (every, swept):
        look(led, 1560, 0.25)  # a new share: the server is observed (1500..1560 at 0.5)
    swept.sweep(at(1620))
    look(every, 1620, 0.25)
    (a, sa), (b, sb) = every.drain(), swept.drain()
    assert totals(b) == pytest.approx(totals(a))
    assert totals(b) == pytest.approx(
        {
            IDLE_HELD: 900 + 120,
            UNOBSERVED: 600,
            ledger.RIGHT_SIZE_FREED: 900 * 0.5 + 60 * 0.5 + 60 * 0.75,
        }
    )
    assert sb[0].at == sa[0].at == at(1620) and sb[0].totals == pytest.approx(sa[0].totals)
    # Skipped at 1680 (not observed), then observed at 1860: 1620..1860 is one gap, unobserved.
    swept.sweep(at(1640))
    swept.skip("alice/")
    for t in (1680, 1740, 1800):
        swept.sweep(at(t))
    look(every, 1640, 0.25)
    for led in (every, swept):
        look(led, 1860, 0.25)
    (a, _), (b, _) = every.drain(), swept.drain()
    assert totals(b) == pytest.approx(totals(a))
    assert totals(b) == pytest.approx(
        {IDLE_HELD: 20, UNOBSERVED: 220, ledger.RIGHT_SIZE_FREED: 20 * 0.75}
    )
    # Stopped: billed up to the stop, what the sweeps saw first.
    swept.sweep(at(1920))
    swept.close("alice/", at(1940))
    assert totals(swept.drain()[0]) == pytest.approx({IDLE_HELD: 80, ledger.RIGHT_SIZE_FREED: 60})


def test_intervals_across_midnight_split_between_days():
    led = Ledger(timedelta(hours=1))
    start = datetime(2025, 3, 3, 23, 59, tzinfo=timezone.utc)
    led.observe(Observation("alice/", "s", start, ALICE, 1, ACTIVE))
    led.observe(Observation("alice/", "s", start + timedelta(minutes=2), ALICE, 1, ACTIVE))
    deltas, _ = led.drain()
    assert {day: v[ACTIVE] for (day, _), v in deltas.items()} == {
        date(2025, 3, 3): 60,
        date(2025, 3, 4): 60,
    }
    assert split_days(start, start) == []


def test_zero_gpus_bill_nothing_and_events_count():
    led = Ledger(GAP)
    look(led, 0, UNKNOWN, gpus=0)
    look(led, 60, UNKNOWN, gpus=0)
    led.event("alice/", ALICE, at(60), "culls")
    led.event("carol/", Owner("carol"), at(60), "extensions")  # no session: still counted
    deltas, (session,) = led.drain()
    assert totals(deltas) == {"culls": 1, "extensions": 1}
    assert session.totals == {"culls": 1}
    with pytest.raises(ValueError):
        led.event("alice/", ALICE, at(60), "naps")
    with pytest.raises(ValueError):
        look(led, 120, "asleep")


def test_summarize_groups_by_period_and_owner_and_prices_idle_by_tier():
    day = date(2025, 3, 3)
    buckets = [
        Bucket(day, ALICE, {ACTIVE: 3600, IDLE_HELD: 7200, "culls": 1}),
        Bucket(day + timedelta(days=1), ALICE, {IDLE_FREE: 3600, UNKNOWN: 1800}),
        Bucket(day, BOB, {ACTIVE: 1800, IDLE_HELD: 1800, "extensions": 2}),
        Bucket(day + timedelta(days=7), BOB, {UNOBSERVED: 3600}),
    ]
    prices = {"h100": 3.0, "h100-3g": 1.0}
    by_team = summarize(buckets, ["team"], "week", lambda tier: prices.get(tier, 0.0))
    assert [(r["period"], r["team"]) for r in by_team] == [
        ("2025-03-03", "nlp"),
        ("2025-03-03", "vision"),
        ("2025-03-10", "nlp"),
    ]
    nlp, vision, later = by_team
    assert vision["gpu_hours_allocated"] == 4.5 and vision["gpu_hours_active"] == 1
    assert vision["gpu_hours_idle"] == 3 and vision["gpu_hours_unknown"] == 0.5
    assert vision["idle_cost"] == 9.0 and vision["cost"] == 13.5
    assert vision["utilisation"] == round(1 / 4.5, 4) and vision["culls"] == 1
    assert nlp["idle_cost"] == 0.5 and nlp["extensions"] == 2
    assert later["gpu_hours_allocated"] == 0 and later["gpu_hours_unobserved"] == 1
    assert later["utilisation"] is None
    (everything,) = summarize(buckets, [], "all")
    assert everything["gpu_hours_allocated"] == 5.5 and everything["idle_cost"] == 0
    with pytest.raises(ValueError):
        summarize(buckets, ["colour"])
    with pytest.raises(ValueError):
        summarize(buckets, ["team"], "month")


def test_a_months_cost_by_team_is_to_the_cent_the_sum_of_its_rows_by_day_and_user():
    """Finance adds up the CSV's rows by day (or by user) and compares them with the month's
    total by team: the same cents, whatever the grouping. Each row's cost was its sum rounded
    apart: a month of these came to 111.94 by team and 111.90 by day."""
    carol = Owner("carol", "vision", "", "h100")
    buckets = []
    for n in range(30):
        day = date(2026, 11, 1) + timedelta(days=n)
        buckets.append(Bucket(day, ALICE, {IDLE_HELD: 1.337 * 3600, ACTIVE: 2.2221 * 3600}))
        buckets.append(Bucket(day, carol, {IDLE_FREE: 0.1555 * 3600, UNKNOWN: 0.0119 * 3600}))

    def price(tier: str) -> float:
        return 2.5

    def cents(rows: list[dict], column: str) -> int:
        return sum(round(row[column] * 100) for row in rows)

    (month,) = summarize(buckets, ["team"], "all", price)
    for group_by, period in ((["team"], "day"), (["team", "user"], "day"), (["user"], "all")):
        rows = summarize(buckets, group_by, period, price)
        for column in ("idle_cost", "cost"):
            assert cents(rows, column) == round(month[column] * 100), (group_by, period, column)


def test_the_utilisation_histogram_weighs_sessions_by_their_gpu_hours():
    led = Ledger(GAP)
    look(led, 0, ACTIVE)
    look(led, 180, IDLE_HELD, server="bob/", owner=BOB)
    look(led, 180, ACTIVE)
    look(led, 360, IDLE_HELD, server="bob/", owner=BOB)
    _, sessions = led.drain()
    hist = utilisation_histogram(sessions, bins=4)
    assert hist == [0.05, 0.0, 0.0, 0.05]  # bob: 0 % for 3 min, alice: 100 % for 3 min
    assert ledger.DIMENSIONS == ("user", "team", "project", "tier")


def test_a_right_sized_tier_counts_the_gpu_hours_it_would_have_freed():
    """While a smaller tier would hold the server's use (its share of the GPU-equivalents),
    the rest is counted as freeable, in any observed state, never over a gap."""
    led = Ledger(GAP)
    led.observe(Observation("alice/", "s1", at(0), ALICE, 1.0, IDLE_HELD))
    led.observe(Observation("alice/", "s1", at(60), ALICE, 1.0, ACTIVE, right_size_share=0.25))
    led.observe(Observation("alice/", "s1", at(120), ALICE, 1.0, IDLE_HELD, right_size_share=0.25))
    led.observe(Observation("alice/", "s1", at(900), ALICE, 1.0, IDLE_HELD, right_size_share=0.25))
    deltas, (session,) = led.drain()
    # 60..120 active, right-sized: 45 s freeable; 120..900 is a gap (the service was down).
    assert totals(deltas)[ledger.RIGHT_SIZE_FREED] == pytest.approx(45)
    assert session.totals[ledger.RIGHT_SIZE_FREED] == pytest.approx(45)
    (row,) = summarize([Bucket(T0.date(), ALICE, totals(deltas))], ["user"])
    assert row["gpu_hours_right_size_freed"] == pytest.approx(45 / 3600, abs=1e-4)


def test_what_a_right_sized_tier_would_have_saved_is_priced_as_its_hours_are():
    """Finance asks what right-sizing would have saved, in money: the GPU-hours it would have
    freed at the tier's price, in cents a bucket as the costs are (only the hours were
    given, and the tiers' prices were the admin's to look up)."""
    days = [date(2026, 11, 1) + timedelta(days=n) for n in range(3)]
    buckets = [
        Bucket(d, ALICE, {IDLE_HELD: 3600, ledger.RIGHT_SIZE_FREED: 0.7 * 3600}) for d in days
    ]
    buckets.append(Bucket(days[0], BOB, {ACTIVE: 3600, ledger.RIGHT_SIZE_FREED: 0.5 * 3600}))
    prices = {"h100": 2.5, "h100-3g": 1.0}
    by_user = summarize(buckets, ["user"], "all", prices.get)
    assert [
        (r["user"], r["gpu_hours_right_size_freed"], r["right_size_saving"]) for r in by_user
    ] == [
        ("alice", 2.1, 5.25),
        ("bob", 0.5, 0.5),
    ]
    (everyone,) = summarize(buckets, [], "all", prices.get)
    assert everyone["right_size_saving"] == 5.75
