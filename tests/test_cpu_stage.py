"""A server without the extension whose container's CPU is busy while DCGM reads its GPU idle
(a CPU stage, issue 21): decided as a reported running cell, from a reading its user cannot
forge (``core.cpu_stage``); unknown or stale readings change nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from jupyter_gpu_gov.core import cpu_stage
from jupyter_gpu_gov.core import policy as p

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)

# The defaults' shape, in minutes: warned at 30, culled at 60 (busy_grace 120 holds it), a
# running cell's limit at 240.
POLICY = p.Policy(
    warn_after=timedelta(minutes=30),
    cull_after=timedelta(minutes=60),
    busy_grace=timedelta(minutes=120),
    busy_limit=timedelta(minutes=240),
)


def run(cpu, policy=POLICY, minutes=400, max_age=None, readings=None):
    """Decide once a minute a server that sends no report, DCGM reading its GPU idle, its
    container's CPU ``cpu(minute)`` cores (None: no reading); return the actions as (minute,
    action, state) and each minute's decision."""
    record, run_, seen, decisions = p.Record(), None, [], []
    for minute in range(minutes + 1):
        now = T0 + minute * MIN
        if readings is None or minute in readings:
            run_ = cpu_stage.fold(run_, now, cpu(minute), gap=5 * MIN)
        since = cpu_stage.busy_since(run_, now, max_age=max_age)
        gpu = p.dcgm_only(False, "DCGM, no report", since)
        view = p.ServerView("bob", started=T0, gpu=gpu)
        decision = p.decide(view, record, policy, now)
        record = decision.record
        decisions.append(decision)
        seen += [(minute, action, decision.state) for action in decision.actions]
        if decision.state == "culled":
            break
    return seen, decisions


def test_fold_keeps_the_start_of_a_run_of_busy_readings():
    run_ = None
    for minute, cores in enumerate([0.1, 0.6, 2.0, 0.9]):
        run_ = cpu_stage.fold(run_, T0 + minute * MIN, cores)
    assert run_ == cpu_stage.CpuRun(T0 + MIN, T0 + 3 * MIN)
    assert cpu_stage.busy_since(run_, T0 + 3 * MIN) is None  # 2 minutes: not yet sustained
    run_ = cpu_stage.fold(run_, T0 + 11 * MIN, 1.0)
    assert cpu_stage.busy_since(run_, T0 + 11 * MIN) == T0 + MIN
    # One quiet reading ends it; an unknown one forgets it; a gap breaks it.
    assert cpu_stage.fold(run_, T0 + 12 * MIN, 0.2) == cpu_stage.CpuRun(None, T0 + 12 * MIN)
    assert cpu_stage.fold(run_, T0 + 12 * MIN, None) is None
    gapped = cpu_stage.fold(run_, T0 + 30 * MIN, 1.0, gap=5 * MIN)
    assert gapped == cpu_stage.CpuRun(T0 + 30 * MIN, T0 + 30 * MIN)
    # An older reading than the last (a source that went back) changes nothing.
    assert cpu_stage.fold(run_, T0, 0.0) == run_
    # A reading gone stale is not known to be busy.
    assert cpu_stage.busy_since(run_, T0 + 20 * MIN, max_age=5 * MIN) is None


def test_a_cpu_stage_is_noticed_at_busy_grace_and_culled_only_past_busy_limit():
    """The long_cpu_stage kill: a CPU stage of hours, its GPU idle and context held, no
    extension. Today it is culled at busy_grace; with its container's CPU busy it gets the
    running cell's notice naming the cause, then the busy limit's warning, then the cull."""
    actions, decisions = run(lambda minute: 3.0)
    assert actions == [
        (120, "busy-notice", "busy"),
        (240, "warn", "warned"),
        (270, "cull", "culled"),
    ]
    notice = decisions[120].reason
    assert "the server's CPU is busy while its GPU idles (a CPU stage?)" in notice
    assert "press Extend" in notice
    assert "busy limit of 4h" in decisions[-1].reason
    assert decisions[-1].cull_reason == "busy-limit"


def test_without_a_busy_reading_the_server_is_culled_as_today():
    """Idle CPU, no reading at all, a reading gone stale, or busy only under the threshold:
    warned at 30 min, culled at busy_grace (DCGM alone)."""
    today = [(30, "warn", "warned"), (120, "cull", "culled")]
    assert run(lambda minute: 0.01)[0] == today
    assert run(lambda minute: None)[0] == today
    assert run(lambda minute: 0.3)[0] == today  # a download: under half a core
    # Readings that stop at minute 59 (metrics-server gone): a stage until they are stale
    # (max_age), then DCGM alone again: warned with a full notice, culled at busy_grace.
    stale = run(lambda minute: 3.0, max_age=5 * MIN, readings=range(60))[0]
    assert stale == [(65, "warn", "warned"), (120, "cull", "culled")]


def test_a_stage_that_ends_is_warned_again_with_a_full_notice():
    """A 3-hour stage: noticed at busy_grace; when its CPU goes quiet the idle rules take over
    and warn with a full notice, never a cull as the stage ends."""
    actions, _ = run(lambda minute: 3.0 if minute < 180 else 0.01)
    assert actions == [
        (120, "busy-notice", "busy"),
        (180, "warn", "warned"),
        (210, "cull", "culled"),
    ]


def test_extend_moves_the_busy_limit():
    record, run_ = p.Record(), None
    for minute in range(0, 131):
        now = T0 + minute * MIN
        run_ = cpu_stage.fold(run_, now, 2.0)
        view = p.ServerView(
            "bob", started=T0, gpu=p.dcgm_only(False, "DCGM", cpu_stage.busy_since(run_, now))
        )
        record = p.decide(view, record, POLICY, now).record
    assert record.state == "busy"
    granted = p.extend(record, replace(POLICY, max_extensions=1, extension_step=HOUR), None)
    assert granted.status == "granted"
    decision = p.decide(view, granted.record, POLICY, T0 + 131 * MIN)
    assert decision.state == "busy" and decision.cull_at == T0 + 330 * MIN


def test_hard_deadlines_still_apply():
    """max_age culls a CPU stage as it culls a running cell: with its warning first."""
    capped = replace(POLICY, max_age=timedelta(hours=3), max_age_warning=timedelta(minutes=30))
    actions, decisions = run(lambda minute: 3.0, capped)
    assert ("max-age-warn" in {a for _, a, _ in actions}) and actions[-1][1] == "cull"
    assert actions[-1][0] == 180 and decisions[-1].cull_reason == "max-age"


def test_the_replay_reads_a_no_report_rows_cpu_as_the_containers():
    """``jupyter-gpu-gov replay``: a ``reports: false`` row's ``cpu_cores`` is the container's
    CPU. A 4-hour CPU stage at 3 cores, its GPU idle (DCGM's ``gpu_sm`` 0): noticed at
    busy_grace (2 h), not culled while it runs; once it ends, warned with a full notice and
    culled after it. The same rows without ``cpu_cores`` are culled at busy_grace, as before."""
    import json

    from jupyter_gpu_gov.replay import parse_lines, replay

    def rows(cpu):
        for step in range(0, 5 * 3600 + 1, 600):
            row = {"t": step, "server": "a/", "reports": False, "gpu_sm": 0.0,
                   "gpu_mem_mb": 30000, "holds_context": True, "kernel_busy": step < 4 * 3600}  # fmt: skip
            if cpu:
                row["cpu_cores"] = 3.0 if step < 4 * 3600 else 0.01
            yield json.dumps(row)

    policies = p.load_policies([], {"checkpoint": False})
    seen = [(a.t, a.action) for a in replay(parse_lines(rows(True)), policies)]
    assert seen == [(7200, "notice"), (14400, "warn"), (16200, "cull")]
    before = [(a.t, a.action) for a in replay(parse_lines(rows(False)), policies)]
    assert before == [(1800, "warn"), (7200, "cull")]
