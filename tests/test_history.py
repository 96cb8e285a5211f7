"""The governor's history (``replay.history``): what it keeps, how it stores it, and its export
as a replay trace that ``replay`` and ``what-if`` read as they are."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict

import pytest

from benchmarks.replay.generate import generate
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.replay import parse_lines, policies_from_config, replay
from jupyter_gpu_gov.replay.engine import EPOCH
from jupyter_gpu_gov.replay.history import (
    KEYFRAME_S,
    MAX_GAP_S,
    STORAGE_COLUMNS,
    HistoryRow,
    Pseudonyms,
    context_of,
    export_trace,
    pack,
    parse_context,
    unpack,
    worth_recording,
)
from jupyter_gpu_gov.replay.whatif import compare

T0 = EPOCH.timestamp()  # the replay clock's t = 0
STEP = 300


def history_of(samples) -> list[HistoryRow]:
    """What the governor would have seen at each step of a replay trace, one pass a step, and
    the pass after each server's last row, where it has stopped."""
    by_server = defaultdict(list)
    for s in samples:
        by_server[s.server].append(s)
    rows = []
    for server, mine in by_server.items():
        user_last = hub_last = None
        for i, s in enumerate(mine):
            t = T0 + s.t
            if s.user_active:
                user_last = t
            if s.user_active or s.kernel_busy or s.connections:
                hub_last = t
            rows.append(
                HistoryRow(
                    t=t,
                    server=server,
                    started=T0 + mine[0].t,
                    profile=s.profile,
                    team=s.team,
                    labels=dict(s.labels),
                    reports=s.reports,
                    gpu_sm=s.gpu_sm if s.reports else None,
                    dcgm_sm=None if s.reports else s.gpu_sm,
                    gpu_mem_mb=s.gpu_mem_mb,
                    holds_context=s.holds_context,
                    kernel_busy=s.kernel_busy,
                    connections=s.connections,
                    user_last=user_last,
                    hub_last=hub_last,
                    # A hook that fails is known from the first checkpoint's outcome on.
                    checkpoint="failed" if i == 0 and s.checkpoint_fails else None,
                )
            )
        last = rows[-1]
        rows.append(HistoryRow(t=last.t + STEP, server=server, started=last.started, stopped=True))
    rows.sort(key=lambda r: r.t)
    return rows


def kept(rows: list[HistoryRow]) -> list[HistoryRow]:
    last: dict = {}
    out = []
    for row in rows:
        if worth_recording(last.get(row.server), row):
            out.append(row)
            last[row.server] = row
    return out


def through_sqlite(rows: list[HistoryRow]) -> list[HistoryRow]:
    """Store the rows as ``STORAGE_COLUMNS`` say and read them back in time order."""
    db = sqlite3.connect(":memory:")
    db.execute(f"CREATE TABLE h ({', '.join(f'{n} {k}' for n, k in STORAGE_COLUMNS)})")
    runs, contexts = {}, {}
    marks = ", ".join("?" * len(STORAGE_COLUMNS))
    for row in rows:
        run = runs.setdefault(row.session, len(runs))
        ctx = contexts.setdefault(context_of(row), len(contexts))
        db.execute(f"INSERT INTO h VALUES ({marks})", pack(row, run, ctx))
    sessions = {i: s for s, i in runs.items()}
    texts = {i: parse_context(c) for c, i in contexts.items()}
    return [unpack(v, sessions[v[1]], texts[v[2]]) for v in db.execute("SELECT * FROM h")]


@pytest.fixture(scope="module")
def trace() -> list[str]:
    return [json.dumps(row) for row in generate(6, 3, seed=2, step=STEP)]


def test_an_exported_history_replays_like_the_trace_it_recorded(trace):
    original = list(parse_lines(trace))
    rows = history_of(original)
    stored = through_sqlite(kept(rows))
    assert len(stored) < 0.8 * len(rows)  # an idle stretch costs a row every 15 minutes
    lines = list(export_trace(stored, step=STEP))
    exported = list(parse_lines(lines))  # the replay reader takes it as it is
    assert len(exported) == len(original)
    by_key = {(s.server, s.t): s for s in original}
    for s in exported:
        was = by_key[(s.server, s.t)]
        assert s.started == original_start(original, s.server)
        assert (s.kernel_busy, s.user_active, s.holds_context, s.reports) == (
            was.kernel_busy,
            was.user_active,
            was.holds_context,
            was.reports,
        )
        assert (s.gpu_sm is None) == (was.gpu_sm is None)
        if s.gpu_sm is not None:
            assert s.gpu_sm == pytest.approx(was.gpu_sm, abs=0.0105)
        assert s.gpu_mem_mb == pytest.approx(was.gpu_mem_mb, abs=64)
        assert (s.team, s.profile, dict(s.labels)) == (was.team, was.profile, dict(was.labels))
    # The policy does on the export what it did on the trace.
    policies = policies_from_config(None)
    decided = [(a.t, a.server, a.action) for a in replay(original, policies)]
    assert decided
    assert [(a.t, a.server, a.action) for a in replay(exported, policies)] == decided


def original_start(samples, server: str) -> float:
    return next(s.t for s in samples if s.server == server)


def test_the_governors_actions_ride_along_and_what_if_reads_them_as_recorded():
    rows = []
    for i in range(12):  # an hour of an idle GPU, warned at 30 min, culled at 55 min
        t = T0 + 300 * i
        actions = ("warn",) if i == 6 else ("checkpoint",) if i == 10 else ()
        actions = ("cull",) if i == 11 else actions
        rows.append(
            HistoryRow(
                t=t,
                server="ada/",
                started=T0,
                team="nlp",
                gpu_sm=0.0,
                gpu_mem_mb=9000,
                holds_context=True,
                state="idle",
                actions=actions,
                cull_reason="gpu-idle" if i == 11 else None,
                checkpoint="done" if i == 11 else None,
            )
        )
    rows.append(HistoryRow(t=T0 + 3600, server="ada/", started=T0, stopped=True))
    lines = list(export_trace(rows, step=300))
    assert [json.loads(line).get("actions") for line in lines if "actions" in line] == [
        ["warn"],
        ["checkpoint"],
        ["cull"],
    ]
    assert json.loads(lines[-1])["cull_reason"] == "gpu-idle"
    (recorded,) = compare(lambda: parse_lines(lines), [])
    assert (recorded.total.warnings, recorded.total.checkpoints, recorded.total.culls) == (1, 1, 1)
    assert dict(recorded.total.culls_by_reason) == {"gpu-idle": 1}


def test_an_outage_of_the_governor_is_unknown_never_idle():
    rows = []
    for minutes in [*range(0, 20), *range(180, 300)]:  # the governor was down 2h40m
        rows.append(
            HistoryRow(
                t=T0 + 60 * minutes,
                server="ada/",
                started=T0,
                gpu_sm=0.0,
                gpu_mem_mb=9000,
                holds_context=True,
            )
        )
    # Up to the last pass: an idle server's last kept row may be a keyframe before it.
    lines = list(export_trace(kept(rows), step=300, until=rows[-1].t))
    samples = list(parse_lines(lines))
    assert [s.t for s in samples] == list(range(0, 300 * 60, 300))
    # The last kept row is a keyframe (15 min): no row from anyone for more than two
    # keyframes (MAX_GAP_S) from there is an outage, its lines without a GPU reading.
    gap = [s for s in samples if 15 * 60 + MAX_GAP_S < s.t < 180 * 60]
    assert gap and all(s.gpu_sm is None for s in gap)
    # Nothing is culled on an unknown GPU: the cull waits for the governor to be back.
    culls = [a.t for a in replay(samples, policies_from_config(None)) if a.action == "cull"]
    assert culls and culls[0] > 180 * 60


def test_a_start_within_a_second_of_a_minute_exports_a_trace_what_if_reads():
    # The Hub gives ``started`` to the millisecond; history keeps ``t`` in whole seconds. A
    # server started 0.85 s past a minute, first seen on that pass, once exported a first line
    # whose ``t`` came before its ``started``, and what-if refused the whole trace.
    started = T0 + 600 + 0.85
    rows = [
        HistoryRow(t=started + 60 * i, server="ada/", started=started, gpu_sm=0.5) for i in range(5)
    ]
    lines = list(export_trace(through_sqlite(rows), step=60))
    samples = list(parse_lines(lines))
    assert [s.t for s in samples][:2] == [600, 660]
    assert all(s.started == 600 for s in samples)


def test_a_window_begun_a_moment_before_a_pass_keeps_that_pass():
    # A what-if asked from ``since`` = 12:00:00.00002, the governor's pass a moment later: the
    # row is kept as 12:00:00 (whole seconds). Its line was dropped as before ``since``, the
    # replay saw the idle server a minute late and, the server stopped 31 minutes on, never
    # replayed the cull the governor made at 30 (a flake of the what-if hub test).
    since = T0 + 3600
    rows = [
        HistoryRow(t=since + 60 * i, server="ada/", started=since, gpu_sm=0.0) for i in range(32)
    ]
    rows.append(HistoryRow(t=since + 60 * 32, server="ada/", started=since, stopped=True))
    lines = list(export_trace(through_sqlite(rows), step=60, since=since + 2e-5))
    assert json.loads(lines[0])["t"] == 3600
    policies = load_policies([], {"checkpoint": False, "warn_after": "10m", "cull_after": "30m"})
    culls = [a.t for a in replay(parse_lines(lines), policies) if a.action == "cull"]
    assert culls == [3600 + 30 * 60]


def test_a_server_culled_and_started_again_within_a_step_exports_a_trace_what_if_reads():
    # The README's "export the last hour, then what-if" on the demo hub: alice's server is
    # culled at 4 min and she starts it again at 4 min 40 s. The culled run's last line (with
    # its cull) and the new run's first line share a 5-minute step; what-if once refused the
    # export for it ("does not come after"), though each (server, started) is a run of its own.
    first = [
        HistoryRow(t=T0 + 60 * i, server="ada/", started=T0, gpu_sm=0.0, gpu_mem_mb=9000)
        for i in range(4)
    ]
    first.append(
        HistoryRow(
            t=T0 + 240,
            server="ada/",
            started=T0,
            actions=("cull",),
            cull_reason="gpu-idle",
            stopped=True,
        )
    )
    again = T0 + 280
    second = [
        HistoryRow(t=again + 60 * i, server="ada/", started=again, gpu_sm=0.5) for i in range(6)
    ]
    lines = list(export_trace([*first, *second], step=300))
    samples = list(parse_lines(lines))
    assert [(s.t, s.started) for s in samples][:3] == [(0, 0), (300, 0), (300, 280)]
    (recorded,) = compare(lambda: parse_lines(lines), [])
    assert recorded.total.culls == 1


def test_an_idle_server_costs_a_row_each_keyframe_a_working_one_a_row_each_pass():
    idle = [
        HistoryRow(t=T0 + 60 * m, server="a/", started=T0, gpu_sm=0.0, gpu_mem_mb=9000)
        for m in range(120)
    ]
    assert len(kept(idle)) == 120 * 60 / KEYFRAME_S
    working = [
        HistoryRow(t=T0 + 60 * m, server="b/", started=T0, gpu_sm=0.5 + (m % 2) / 10)
        for m in range(120)
    ]
    assert len(kept(working)) == 120
    # A person's interaction, an action or a stop is always kept.
    touched = [
        *idle[:3],
        HistoryRow(
            t=idle[3].t, server="a/", started=T0, gpu_sm=0.0, gpu_mem_mb=9000, user_last=idle[3].t
        ),
    ]
    assert kept(touched)[-1] is touched[-1]


def test_pseudonyms_hide_users_and_server_names_and_stay_stable_under_a_key():
    row = HistoryRow(
        t=T0,
        server="alice/thesis",
        started=T0,
        labels={"gpu-gov/user": "alice", "gpu-gov/project": "seg"},
        gpu_sm=0.0,
    )
    other = HistoryRow(t=T0, server="bob/", started=T0, gpu_sm=0.0)
    key = b"k" * 32

    def export(key: bytes) -> list[dict]:
        return [json.loads(x) for x in export_trace([row, other], pseudonyms=Pseudonyms(key))]

    first = export(key)
    text = json.dumps(first)
    assert "alice" not in text and "thesis" not in text and "bob" not in text
    alice, bob = first
    user, _, name = alice["server"].partition("/")
    assert alice["labels"]["gpu-gov/user"] == user and name and name != user
    assert bob["server"].endswith("/")  # the default server keeps its empty name
    assert export(key) == first  # the same key: the same pseudonyms
    assert export(b"x" * 32)[0]["server"] != alice["server"]
    with pytest.raises(ValueError, match="16 bytes"):
        Pseudonyms(b"short")
