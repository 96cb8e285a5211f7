"""The governor records its own history as it runs (``hub/history.py``), bounded by its
retention, and ``jupyter-gpu-gov export-trace`` writes it as a trace ``what-if`` reads."""

from __future__ import annotations

import json
from datetime import timedelta
from itertools import pairwise

import pytest
from fake_hub_api import FakeHub
from test_governor import H100_IDLE_GPU, Exporter, governor, report_for

from jupyter_gpu_gov import cli
from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.hub.history import HistoryOptions, read_history
from jupyter_gpu_gov.replay import parse_lines
from jupyter_gpu_gov.replay.history import export_trace
from jupyter_gpu_gov.replay.whatif import recorded_actions

POD = {"pod_name": "vllm-agg-0-vllmdecodeworker-s65j5", "namespace": "dynamo-workload"}


async def test_the_governor_records_what_it_saw_and_did_and_exports_it(tmp_path, restore_clock):
    """Two hours of passes a minute apart: alice's GPU idle (DCGM, no report) until she is
    warned and culled; bob's report says busy. Idle minutes are not all kept; the warning and
    the cull are, and the export replays as the what-if reads it."""
    exporter = Exporter("h100-8gpu-k8s-pod-attributed.txt")
    started = clock.utcnow()
    async with FakeHub() as hub:
        hub.add_server("alice", state=POD)
        hub.add_server("bob")
        gov = governor(hub, tmp_path, exporter.url)
        gov.policies = load_policies([], {"checkpoint": False})
        passes = 0
        for _ in range(125):
            gov.ingest(report_for("bob", H100_IDLE_GPU.replace("bc", "aa"), sm=0.8))
            await gov.reconcile()
            passes += 1
            clock.advance(60)
        assert not hub.running("alice")
    exporter.stop()

    rows = list(read_history(gov.store.engine))
    alice = [r for r in rows if r.server == "alice/"]
    bob = [r for r in rows if r.server == "bob/"]
    assert len(alice) < passes / 3  # an idle stretch is a keyframe every 15 min
    assert alice[0].dcgm_sm == 0.0 and alice[0].gpu_sm is None and not alice[0].reports
    assert [a for r in alice for a in r.actions] == ["warn", "cull"]
    assert next(r for r in alice if "cull" in r.actions).cull_reason == "gpu-idle"
    # Her last row says she stopped, with what was last seen (not a report she never sent).
    assert alice[-1].stopped and not alice[-1].reports and alice[-1].dcgm_sm == 0.0
    assert bob[0].gpu_sm == pytest.approx(0.8) and bob[0].holds_context and bob[0].reports
    assert all(r.team is None and r.state == "active" for r in bob)

    since = started.timestamp()
    lines = list(export_trace(read_history(gov.store.engine, since), since=since))
    samples = list(parse_lines(lines))
    assert {s.server for s in samples} == {"alice/", "bob/"}
    done = [(a.server, a.action) for a in recorded_actions(samples)]
    assert done == [("alice/", "warn"), ("alice/", "cull")]


async def test_history_past_its_retention_is_deleted_and_zero_records_none(tmp_path, restore_clock):
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path, history=HistoryOptions(retention=timedelta(hours=1)))
        await gov.reconcile()
        first = [r.t for r in read_history(gov.store.engine)]
        clock.advance(2 * 3600)
        gov._history._pruned_at = -1e9  # the next write prunes (once an hour)
        await gov.reconcile()
        assert min(r.t for r in read_history(gov.store.engine)) > max(first)

        (tmp_path / "off").mkdir()
        off = governor(hub, tmp_path / "off", history=HistoryOptions(retention=timedelta(0)))
        await off.reconcile()
    assert list(read_history(off.store.engine)) == []


def test_export_trace_writes_the_stores_history_and_names_bad_input(tmp_path, capsys):
    from jupyter_gpu_gov.hub.history import HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    from sqlalchemy import create_engine

    now = clock.utcnow().timestamp()
    log = HistoryLog(create_engine(db), HistoryOptions())
    log.append(
        HistoryRow(t=now - 3000 + 60 * i, server="ada/", started=now - 3000, gpu_sm=0.5)
        for i in range(40)
    )
    out = tmp_path / "trace.jsonl"
    assert cli.main(["export-trace", "--since", "1h", "--db-url", db, "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines and {json.loads(line)["server"] for line in lines} == {"ada/"}
    assert cli.main(["export-trace", "--since", "1h", "--db-url", db, "--pseudonymise"]) == 0
    hidden = capsys.readouterr().out
    assert "ada" not in hidden and '"server":"u-' in hidden
    # The trace is what what-if reads.
    candidate = tmp_path / "candidate.py"
    candidate.write_text('c.GpuGovernor.policy_defaults = {"cull_after": "45m"}\n')
    assert cli.main(["what-if", str(out), "--policy", str(candidate)]) == 0
    capsys.readouterr()
    for bad, words in (
        (["--since", "yesterday"], "--since yesterday: not a duration (14d, 1h) nor a time"),
        (["--since", "2h", "--until", "2001-01-01T00:00:00Z"], "--until is before --since"),
        (["--since", "1h", "--step", "0"], "--step must be at least 60 seconds"),
    ):
        assert cli.main(["export-trace", "--db-url", db, *bad]) == 2
        assert words in capsys.readouterr().err
    missing = f"sqlite:///{tmp_path / 'none.sqlite'}"
    assert cli.main(["export-trace", "--since", "1h", "--db-url", missing]) == 2
    assert "no such database" in capsys.readouterr().err


def test_export_trace_names_a_database_or_output_it_cannot_use_and_changes_nothing(
    tmp_path, capsys
):
    """A --db-url that was not the governor's store (the Hub's own database, a typo) had the
    history's tables created in it, and the export "succeeded" with nothing; a driver not
    installed, a scheme SQLAlchemy does not know, or an -o it cannot write gave a traceback.
    Each is now a line naming what is wrong, exit 2, and neither file is touched."""
    import sqlite3

    hub_db = tmp_path / "jupyterhub.sqlite"
    with sqlite3.connect(hub_db) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    kept = tmp_path / "kept.jsonl"
    kept.write_text("an earlier export\n")
    for url, output, words in (
        (f"sqlite:///{hub_db}", kept, "has no history of the governor's"),
        ("mysql://gov@db/gpu_gov", kept, "--db-url: cannot use"),
        ("nosuch://gov@db/gpu_gov", kept, "--db-url: cannot use"),
        (f"sqlite:///{hub_db}", tmp_path, "has no history of the governor's"),
    ):
        argv = ["export-trace", "--since", "1h", "--db-url", url, "-o", str(output)]
        assert cli.main(argv) == 2, url
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err
    with sqlite3.connect(hub_db) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert tables == {"users"} and kept.read_text() == "an earlier export\n"

    store = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    from sqlalchemy import create_engine

    from jupyter_gpu_gov.hub.history import HistoryLog

    HistoryLog(create_engine(store), HistoryOptions())  # the governor's store, its tables
    for output in (tmp_path, tmp_path / "no-such-folder" / "trace.jsonl"):
        argv = ["export-trace", "--since", "1h", "--db-url", store, "-o", str(output)]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert f"-o {output}: cannot write" in err and "Traceback" not in err, err


def test_an_export_until_a_time_to_come_ends_now(tmp_path, capsys):
    """The history holds nothing later than now, yet ``--until 9999-01-01`` (or the API's
    ``until=``) had every server still running written every step up to it, unknown: lines
    without end (7,647 for one server until 2027; the export never finished). An ``until``
    to come is now; a ``since`` to come is an error naming it."""
    from sqlalchemy import create_engine

    from jupyter_gpu_gov.hub.history import HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow, export_span

    now = clock.utcnow().timestamp()
    assert export_span("1h", "9999-01-01T00:00:00Z", "5m", now) == (now - 3600, now, 300)
    assert export_span("1h", "", "5m", now) == (now - 3600, now, 300)
    with pytest.raises(ValueError, match="since 2999-01-01T00:00:00Z: is to come"):
        export_span("2999-01-01T00:00:00Z", "", "5m", now, flag="")

    db = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    HistoryLog(create_engine(db), HistoryOptions()).append(
        HistoryRow(t=now - 3000 + 60 * i, server="ada/", started=now - 3000, gpu_sm=0.5)
        for i in range(40)
    )
    argv = ["export-trace", "--since", "1h", "--db-url", db, "--until", "9999-01-01T00:00:00Z"]
    assert cli.main(argv) == 0
    assert 9 <= len(capsys.readouterr().out.splitlines()) <= 12  # 50 minutes, a line per 5


async def test_what_if_on_the_recorded_history_predicts_the_candidates_difference(
    tmp_path, restore_clock
):
    """The policy admin's what-if reads the history the governor recorded: alice's idle GPU
    was culled after an hour; a candidate that waits three hours culls nobody on that past,
    and the live policy, replayed, culls her as the governor did."""
    from jupyter_gpu_gov.hub.policy_admin import what_if

    exporter = Exporter("h100-8gpu-k8s-pod-attributed.txt")
    since = clock.utcnow().timestamp()
    async with FakeHub() as hub:
        hub.add_server("alice", state=POD)
        gov = governor(hub, tmp_path, exporter.url)
        gov.policies = load_policies([], {"checkpoint": False})
        for _ in range(150):
            await gov.reconcile()
            clock.advance(60)
        assert not hub.running("alice")
    exporter.stop()
    patient = load_policies([], {"checkpoint": False, "cull_after": "3h", "busy_grace": "3h"})
    result = what_if(gov, patient, since, clock.utcnow().timestamp())
    culls = {run["name"]: run["total"]["culls"] for run in result["runs"]}
    assert culls == {"recorded": 1, "current": 1, "candidate": 0}
    assert result["change"]["culls"] == -1
    assert result["trace"]["servers"] == 1


async def test_what_if_weighs_a_tier_as_the_governor_does(tmp_path, restore_clock):
    """alice holds a MIG slice (the grant names the tier, no weight): the governor's ledger counts
    it as the quarter of a GPU ``tier_weights`` says, and the policy for that tier culls her idle
    server after 30 minutes. The policy page's what-if replays the same history on the same
    tiers: the same cull, the same GPU-hours as the ledger's."""
    from jupyter_gpu_gov.hub.policy_admin import what_if

    tiered = [{"name": "mig", "match": {"tiers": ["mig-1g"]}, "warn_after": "10m", "cull_after": "30m", "busy_grace": "30m"}]  # fmt: skip
    policies = load_policies(tiered, {"checkpoint": False, "warn_after": "2h", "cull_after": "3h"})
    exporter = Exporter("h100-8gpu-k8s-pod-attributed.txt")
    # From just past a minute: the first pass, kept in whole seconds, falls on the export's grid
    # (tests/test_history.py::test_a_window_begun_a_moment_before_a_pass_keeps_that_pass).
    clock.advance(60 - clock.utcnow().timestamp() % 60)
    since = clock.utcnow().timestamp()
    grant = {"gpu_gov_grant": {"gpu-gov/tier": "mig-1g", "gpu-gov/team": "vision"}}
    async with FakeHub() as hub:
        hub.add_server("alice", state={**POD, **grant})
        gov = governor(hub, tmp_path, exporter.url, tier_weights={"mig-1g": 0.25})
        gov.policies = policies
        for _ in range(45):
            await gov.reconcile()
            clock.advance(60)
        assert not hub.running("alice")
        gov.flush_usage()
    exporter.stop()
    (session,) = gov.store.usage_sessions(user="alice")
    ledger_hours = session.allocated / 3600
    assert 0.25 * 0.5 <= ledger_hours <= 0.25 * 0.6  # a quarter GPU for 30-36 minutes

    result = what_if(gov, policies, since, clock.utcnow().timestamp())
    runs = {run["name"]: run["total"] for run in result["runs"]}
    assert {name: run["culls"] for name, run in runs.items()} == {
        "recorded": 1,
        "current": 1,
        "candidate": 1,
    }
    for run in runs.values():  # within a history step (a minute) of a quarter GPU
        assert run["allocated_gpu_hours"] == pytest.approx(ledger_hours, abs=0.25 / 60 + 1e-4)


async def test_a_failing_history_never_fails_a_servers_decision(tmp_path, monkeypatch, caplog):
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path)

        def broken(*args):
            raise RuntimeError("history broke")

        monkeypatch.setattr(type(gov), "_history_values", broken)
        result = await gov.reconcile()
    assert result.servers == 1 and not result.errors
    assert gov.row("alice/").state != "error" and "alice/" not in gov._failing
    assert not [a for a in gov.store.audit_rows("alice/") if a.action == "error"]
    assert "history row not recorded" in caplog.text


def test_a_failed_write_leaves_no_run_or_context_id_behind(tmp_path, monkeypatch):
    """The ids a write made for its runs and contexts go with its transaction when it fails
    (SQLite gives them to the next insert): the next write makes them again, and every row
    reads back as its own server's, in its own context."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import OperationalError

    from jupyter_gpu_gov.hub.history import HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    engine = create_engine(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    log = HistoryLog(engine, HistoryOptions())
    now = clock.utcnow().timestamp()
    ada = HistoryRow(t=now, server="ada/", started=now - 60, team="vision")

    def locked(db, values):
        raise OperationalError("INSERT INTO gpu_gov_history", {}, Exception("database is locked"))

    monkeypatch.setattr(log._insert, "run", locked)
    with pytest.raises(OperationalError):
        log.append([ada])
    monkeypatch.undo()
    bob = HistoryRow(t=now + 60, server="bob/", started=now, team="speech")
    log.append([bob, HistoryRow(t=now + 60, server="ada/", started=now - 60, team="vision")])
    rows = read_history(engine)
    assert sorted((r.server, r.started, r.team) for r in rows) == [
        ("ada/", now - 60, "vision"),
        ("bob/", now, "speech"),
    ]


def test_a_servers_context_read_back_as_it_changes_and_changes_back(tmp_path):
    """A server's context (state, cause, labels) flips and flips back: each row reads back in
    its own, and each context's JSON is stored once."""
    from sqlalchemy import create_engine, func, select

    from jupyter_gpu_gov.hub.history import CONTEXTS, HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    engine = create_engine(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    log = HistoryLog(engine, HistoryOptions())
    now = clock.utcnow().timestamp()
    labels = {"gpu-gov/user": "ada"}
    states = [("active", None), ("idle", "zombie"), ("active", None), ("idle", "zombie")]
    for i, (state, cause) in enumerate(states):
        # (with bob, whose context stays)
        ada = HistoryRow(now + i, "ada/", now, labels=labels, state=state, cause=cause)
        log.append([ada, HistoryRow(now + i, "bob/", now, labels={"gpu-gov/user": "bob"})])
    log.append([HistoryRow(t=now + 9, server="ada/", started=now, labels={**labels, "x": "1"})])
    ada = [r for r in read_history(engine) if r.server == "ada/"]
    assert [(r.state, r.cause, dict(r.labels)) for r in ada] == [
        *((state, cause, labels) for state, cause in states),
        ("active", None, {**labels, "x": "1"}),
    ]
    with engine.connect() as db:
        assert db.execute(select(func.count()).select_from(CONTEXTS)).scalar() == 4


async def test_the_history_holds_no_view_no_pass_keeps(tmp_path, restore_clock):
    """The history skips a look at the view a pass keeps (``hub/unchanged.py``) without
    holding that view itself: once the pass lets it go, it is freed."""
    import weakref

    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path)
        await gov.reconcile()
        clock.advance(60)
        await gov.reconcile()
        assert len(list(read_history(gov.store.engine))) == 1  # the second pass: nothing new
        view = weakref.ref(gov.unchanged.kept["alice/"].view)
        gov.unchanged.forget("alice/")
        assert view() is None


# (a full pass looks at every server: the default every 10th, or next to never)
@pytest.mark.parametrize("full_every", [10, 1000])
async def test_a_server_warned_once_still_has_a_keyframe_every_15_minutes(
    tmp_path, restore_clock, full_every
):
    """alice's server runs for hours, nothing she does moves; at ten minutes she is warned of
    its maximum age (her state stays: the warning is the pass's only news of her). The
    warning is a row of its own, and the history still holds a row of hers at least every
    ``KEYFRAME_S`` (and a pass) after it: an admin reading it sees her running all along, not
    a gap from the warning on."""
    from jupyter_gpu_gov.replay.history import KEYFRAME_S

    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path, full_pass_every=full_every)
        gov.policies = load_policies(
            [], {"max_age": "3h", "max_age_warning": "170m", "inactive_timeout": "6h"}
        )
        for _ in range(90):  # an hour and a half, a pass a minute
            await gov.reconcile()
            clock.advance(60)
        assert hub.running("alice")

    rows = list(read_history(gov.store.engine))
    times = [r.t for r in rows if r.server == "alice/"]
    (warned,) = [r.t for r in rows if "max-age-warn" in r.actions]
    assert times[-1] - warned > 2 * KEYFRAME_S
    gaps = [b - a for a, b in pairwise(times)]
    assert max(gaps) <= KEYFRAME_S + 60, gaps


def test_an_hours_export_reads_the_runs_of_its_hour_not_every_run_ever(tmp_path):
    """Every run and context was read for every export, whatever its span: an hour's export
    of a store that had seen 1,000,000 sessions held 212 MB (the service's target is 300)."""
    import sqlite3
    import tracemalloc

    from sqlalchemy import create_engine

    from jupyter_gpu_gov.hub.history import HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    path = tmp_path / "gov.sqlite"
    engine = create_engine(f"sqlite:///{path}")
    log = HistoryLog(engine, HistoryOptions())
    now = clock.utcnow().timestamp()
    with sqlite3.connect(path) as db:  # 200,000 past sessions, their rows long pruned
        db.executemany(
            "INSERT INTO gpu_gov_history_runs (server, started) VALUES (?, ?)",
            ((f"user{i}/", now - 86400 * 400 + i) for i in range(200_000)),
        )
    log.append(
        HistoryRow(t=now - 60 * i, server="ada/", started=now - 3600, gpu_sm=0.5) for i in range(60)
    )
    list(read_history(engine, now - 3600))  # SQLAlchemy's compiled statements cached
    tracemalloc.start()
    try:
        rows = list(read_history(engine, now - 3600))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rows) == 60 and {(r.server, r.started) for r in rows} == {("ada/", now - 3600)}
    assert peak < 4_000_000, f"{peak / 1e6:.1f} MB"  # every run: 42 MB


def test_the_prune_takes_the_runs_and_contexts_no_kept_row_names(tmp_path, restore_clock):
    """Runs and contexts were never deleted: a run a session, 3.65 M a year at 10,000
    servers. Those the kept rows name stay, and a server still running whose run went with
    its rows (``max_rows``) is recorded under a new one."""
    from sqlalchemy import create_engine, func, select

    from jupyter_gpu_gov.hub.history import CONTEXTS, RUNS, HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    engine = create_engine(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    log = HistoryLog(engine, HistoryOptions(retention=timedelta(hours=1), max_rows=2))
    now = float(int(clock.utcnow().timestamp()))  # (rows keep whole seconds)

    def row(t, user, state="active"):
        return HistoryRow(t=t, server=f"{user}/", started=now - 7200, team=user, state=state)

    def write(rows):  # as a pass: its rows, then the prune's steps when due
        log.append(rows)
        while log.upkeep_step():
            pass

    write([row(now - 7200, "old", "idle")])  # the first write prunes: past the retention
    write([row(now - 60, "ada"), row(now - 60, "bob")])
    kept = [(r.t, r.server, r.started, r.team, r.state) for r in read_history(engine)]
    log._pruned_at = log._swept_at = -1e9  # the next write prunes, and sweeps (once a day)
    write([row(now, "cy")])  # max_rows: ada's row goes, and its run and context
    write([row(now + 60, "ada")])  # ada still runs: its run and context again
    with engine.connect() as db:
        named = {
            table.name: db.execute(select(func.count()).select_from(table)).scalar()
            for table in (RUNS, CONTEXTS)
        }
    assert named == {"gpu_gov_history_runs": 3, "gpu_gov_history_contexts": 3}  # bob, cy, ada
    rows = [(r.t, r.server, r.started, r.team, r.state) for r in read_history(engine)]
    assert rows == [
        kept[1],
        (now, "cy/", now - 7200, "cy", "active"),
        (now + 60, "ada/", now - 7200, "ada", "active"),
    ]


def _stale_store(tmp_path, now: float, servers: int = 40, passes: int = 30):
    """A store of ``passes`` rows of each of ``servers`` servers an hour old, past the
    retention, and a row a server now; its HistoryLog (a retention of 30 minutes)."""
    from sqlalchemy import create_engine

    from jupyter_gpu_gov.hub.history import HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    engine = create_engine(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    log = HistoryLog(engine, HistoryOptions(retention=timedelta(minutes=30)))
    log._pruned_at = 1e12  # (not yet: the test prunes)
    for p in range(passes):
        log.append(
            HistoryRow(t=now - 3600 + p, server=f"gone{i}/", started=now - 7200, team=f"t{i}")
            for i in range(servers)
        )
    log.append(HistoryRow(t=now, server=f"u{i}/", started=now - 60) for i in range(servers))
    return engine, log


def test_the_prune_and_sweep_never_read_a_whole_table_in_one_transaction(
    tmp_path, restore_clock, monkeypatch
):
    """The daily sweep scanned the whole history (a DISTINCT of each column) and the runs,
    in the transaction of one pass's write: 6.5-7.7 s at 10,000 servers, the store held for
    every write meanwhile. Now every statement of the prune and the sweep reads a range of a
    key or of the time index, in steps of a transaction each, and the end is the same: the
    rows past the retention gone, the runs and contexts only they named too."""
    from sqlalchemy import event, func, select

    from jupyter_gpu_gov.hub import history
    from jupyter_gpu_gov.hub.history import CONTEXTS, RUNS

    now = float(int(clock.utcnow().timestamp()))
    engine, log = _stale_store(tmp_path, now)
    # A batch a step, the smallest batches (raising=False: the code before had no steps).
    monkeypatch.setattr(history, "STEP_S", 0.0, raising=False)
    statements, commits = [], []

    @event.listens_for(engine, "before_cursor_execute")
    def seen(conn, cursor, statement, parameters, context, executemany):
        if not executemany and statement.lstrip().upper().startswith(("SELECT", "DELETE")):
            statements.append((statement, parameters))

    event.listen(engine, "commit", lambda conn: commits.append(len(statements)))
    log._swept_at = -1e12  # the sweep is due
    log.prune()
    event.remove(engine, "before_cursor_execute", seen)

    with engine.connect() as db:
        whole = []
        for statement, parameters in statements:
            plan = db.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
            whole += [(statement, row[-1]) for row in plan if row[-1].startswith("SCAN")]
        left = {
            table.name: db.execute(select(func.count()).select_from(table)).scalar()
            for table in (history.HISTORY, RUNS, CONTEXTS)
        }
    assert whole == []  # before: SCAN gpu_gov_history (twice), SCAN gpu_gov_history_runs...
    assert len(commits) > 3  # a transaction a batch here (before: one for all)
    assert left == {
        "gpu_gov_history": 40,
        "gpu_gov_history_runs": 40,
        "gpu_gov_history_contexts": 1,  # the servers running now share one
    }
    assert {r.server for r in read_history(engine)} == {f"u{i}/" for i in range(40)}


def test_rows_written_between_the_sweeps_steps_keep_their_runs_and_contexts(
    tmp_path, restore_clock, monkeypatch
):
    """The passes write between the sweep's steps: a row naming a run and a context the scan
    had not seen named (a server whose older rows the prune took, writing again under its
    cached ids) keeps them, and the export reads it whole."""
    from jupyter_gpu_gov.hub import history
    from jupyter_gpu_gov.replay.history import HistoryRow

    now = float(int(clock.utcnow().timestamp()))
    engine, log = _stale_store(tmp_path, now)
    monkeypatch.setattr(history, "STEP_S", 0.0)
    log._pruned_at, log._swept_at = -1e12, -1e12
    steps, later = 0, []
    while log.upkeep_step():
        steps += 1
        if steps % 3 == 0:  # a pass's write: gone7 again, its run and context cached
            row = HistoryRow(t=now + steps, server="gone7/", started=now - 7200, team="t7")
            log.append([row])
            later.append(row.t)
    assert later  # some were written while the sweep was under way
    again = [r for r in read_history(engine) if r.server == "gone7/"]
    assert [(r.t, r.started, r.team) for r in again] == [(t, now - 7200, "t7") for t in later]


def test_a_streamed_export_holds_no_read_open_between_its_chunks(tmp_path, monkeypatch):
    """An export read its rows through one statement open to its end (minutes, at the
    client's pace): SQLite's WAL could not be checkpointed meanwhile and grew while the
    governor wrote (PostgreSQL's vacuum was held back so). Now a chunk at a time, each in a
    short transaction: the governor's checkpoint goes through mid-export, and the rows are
    the same, in the same order, ties in time split across chunks included."""
    import sqlite3

    from sqlalchemy import create_engine

    from jupyter_gpu_gov.hub import history
    from jupyter_gpu_gov.hub.history import HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    path = tmp_path / "gov.sqlite"
    sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").close()  # as the Store has it
    engine = create_engine(f"sqlite:///{path}")
    log = HistoryLog(engine, HistoryOptions(retention=timedelta(days=3650)))
    log._pruned_at = 1e12
    for p in range(20):  # a pass's rows share their time: chunks of 7 split them
        log.append(
            HistoryRow(t=1e9 + 60 * p, server=f"u{i}/", started=1e9, team=f"t{i % 3}")
            for i in range(10)
        )
    whole = [(r.t, r.server, r.team) for r in read_history(engine)]
    assert len(whole) == 200 and whole == sorted(whole)

    monkeypatch.setattr(history, "CHUNK", 7)
    rows = read_history(engine)
    read = [next(rows) for _ in range(10)]  # mid-export: the second chunk being written
    log.append([HistoryRow(t=1e9 + 9999, server="late/", started=1e9)])  # the governor writes
    governor = sqlite3.connect(path)
    busy, frames, checkpointed = governor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    governor.close()
    assert (busy, checkpointed) == (0, frames)  # before: frames written after the read began left
    read += list(rows)
    assert [(r.t, r.server, r.team) for r in read][:200] == whole


def test_a_later_days_sweep_reads_back_only_what_the_pruned_rows_named(
    tmp_path, restore_clock, monkeypatch
):
    """The sweep's scan returned every run and context id each range of the history names,
    so its steps cost the writer 3-7 times the old single sweep (docs/benchmarks-history.md). Once a
    sweep has run, only the ids up to the highest the rows deleted since named can have lost
    their last row: a range returns only those still named. Here the servers running now
    (their runs and context made after the pruned rows') come back from no range, and the
    end is the full sweep's: the stale rows, their runs and contexts gone, the rest kept."""
    from sqlalchemy import create_engine, func, select

    from jupyter_gpu_gov.hub import history
    from jupyter_gpu_gov.hub.history import CONTEXTS, RUNS, HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    now = float(int(clock.utcnow().timestamp()))
    engine = create_engine(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    log = HistoryLog(engine, HistoryOptions(retention=timedelta(minutes=30)))
    log.append([HistoryRow(t=now - 7200, server="first/", started=now - 7200, team="f")])
    log._pruned_at = log._swept_at = -1e12
    log.prune()  # the day's sweep ran: the first since the service started checks all
    log._pruned_at = 1e12
    for p in range(30):
        log.append(
            HistoryRow(t=now - 3600 + p, server=f"gone{i}/", started=now - 7200, team=f"t{i}")
            for i in range(40)
        )
    log.append(HistoryRow(t=now, server=f"u{i}/", started=now - 60) for i in range(40))
    monkeypatch.setattr(history, "STEP_S", 0.0)  # a batch a step, the smallest batches
    sweeps = []
    original = history._Upkeep.__init__

    def kept(self, log):
        original(self, log)
        sweeps.append(self)

    monkeypatch.setattr(history._Upkeep, "__init__", kept)
    log._pruned_at = log._swept_at = -1e12  # a day on: the next prune sweeps
    log.prune()
    (sweep,) = sweeps
    assert sweep.sweeping
    assert (sweep.runs, sweep.contexts) == (set(), set())  # before: the 40 runs, 1 context
    with engine.connect() as db:
        left = {
            table.name: db.execute(select(func.count()).select_from(table)).scalar()
            for table in (history.HISTORY, RUNS, CONTEXTS)
        }
    assert left == {
        "gpu_gov_history": 40,
        "gpu_gov_history_runs": 40,
        "gpu_gov_history_contexts": 1,
    }
    assert {r.server for r in read_history(engine)} == {f"u{i}/" for i in range(40)}


def test_the_first_sweep_after_a_restart_resumes_from_the_store(
    tmp_path, restore_clock, monkeypatch
):
    """What the rows deleted since the last sweep named was kept in memory: the first sweep
    after every start of the service checked every run and context (4.6-5.7 s of the writer at
    5 M rows against 0.9 s; docs/benchmarks-history.md). It is kept in the store, written with the
    deletes: a new service process (or another governor taking the lease) goes on from it;
    the end is the full sweep's."""
    from sqlalchemy import create_engine, func, select

    from jupyter_gpu_gov.hub import history
    from jupyter_gpu_gov.hub.history import CONTEXTS, RUNS, HistoryLog
    from jupyter_gpu_gov.replay.history import HistoryRow

    now = float(int(clock.utcnow().timestamp()))
    url = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    options = HistoryOptions(retention=timedelta(minutes=30))
    engine = create_engine(url)
    log = HistoryLog(engine, options)
    log.append([HistoryRow(t=now - 7200, server="first/", started=now - 7200, team="f")])
    log._pruned_at = log._swept_at = -1e12
    log.prune()  # a sweep ran (this store's first checks every id)
    for p in range(30):
        log.append(
            HistoryRow(t=now - 3600 + p, server=f"gone{i}/", started=now - 7200, team=f"t{i}")
            for i in range(40)
        )
    log.append(HistoryRow(t=now, server=f"u{i}/", started=now - 60) for i in range(40))
    engine.dispose()

    engine = create_engine(url)  # the service restarted
    log = HistoryLog(engine, options)
    monkeypatch.setattr(history, "STEP_S", 0.0)  # a batch a step, the smallest batches
    sweeps = []
    original = history._Upkeep.__init__

    def kept(self, log):
        original(self, log)
        sweeps.append(self)

    monkeypatch.setattr(history._Upkeep, "__init__", kept)
    log.prune()  # its first prune sweeps
    (sweep,) = sweeps
    assert sweep.sweeping
    assert (sweep.runs, sweep.contexts) == (set(), set())  # before: every run and context
    assert log.deleted_named() == (0, 0)
    with engine.connect() as db:
        left = {
            table.name: db.execute(select(func.count()).select_from(table)).scalar()
            for table in (history.HISTORY, RUNS, CONTEXTS)
        }
    assert left == {
        "gpu_gov_history": 40,
        "gpu_gov_history_runs": 40,
        "gpu_gov_history_contexts": 1,
    }
    assert {r.server for r in read_history(engine)} == {f"u{i}/" for i in range(40)}


async def test_a_dcgm_figure_past_any_gpu_leaves_that_gpu_unknown_not_every_servers_history(
    tmp_path, restore_clock
):
    """An exporter that says a GPU holds 1e308 MiB (a broken counter, a forged series): the
    figure was taken as read, and the pass's history rows (every server's, one write) were not
    recorded (the store cannot hold the number). A figure past any GPU's is unknown, and
    named; the pass's history is kept."""
    exporter = Exporter("h100-8gpu-k8s-pod-attributed.txt")
    labels = (
        'gpu="0",UUID="GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",Hostname="gpu-node-1",'
        'container="main",namespace="dynamo-workload",pod="vllm-agg-0-vllmdecodeworker-s65j5"'
    )
    exporter.text += f"DCGM_FI_DEV_FB_USED{{{labels}}} 1e308\n"
    async with FakeHub() as hub:
        hub.add_server("alice", state=POD)
        hub.add_server("bob")
        gov = governor(hub, tmp_path, exporter.url)
        gov.ingest(report_for("bob", H100_IDLE_GPU.replace("bc", "aa"), sm=0.8))
        await gov.reconcile()
    exporter.stop()
    rows = list(read_history(gov.store.engine))
    assert {r.server for r in rows} == {"alice/", "bob/"}
    alice = next(r for r in rows if r.server == "alice/")
    assert alice.gpu_mem_mb == 0.0  # unknown, as without the series
