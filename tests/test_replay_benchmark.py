"""The reclamation replay (benchmarks/replay): the scorer's definitions on a hand-made trace, then
every policy on a small generated trace (20 users, 14 days, seed 1: about 7 s).

The figures asserted for the default policy are the ones it reaches on this trace (docs/
benchmarks.md has the month-long figures and what is left), so a regression in the policy, the
engine or the generator fails here.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from benchmarks.replay.generate import LIVE_TRUTHS, SCENARIOS, WORK_TRUTHS, generate
from benchmarks.replay.score import evaluate, run_all, table
from jupyter_gpu_gov.replay import Action, parse_lines

DEFAULT = "jupyter-gpu-gov default"


def rows(*steps: tuple[str, float]) -> list[str]:
    """One server, a step every 10 minutes: (truth, gpu_sm) each, holding 1 GiB."""
    return [
        json.dumps({"t": i * 600, "server": "a/", "gpu_sm": sm, "gpu_mem_mb": 1024, "truth": truth})
        for i, (truth, sm) in enumerate(steps)
    ]


def test_a_cull_in_an_idle_held_step_reclaims_the_rest_and_counts_a_return():
    trace = rows(
        ("active", 0.9), ("idle_held", 0), ("idle_held", 0), ("idle_held", 0), ("present", 0)
    )
    actions = [Action(600, "a/", "warn", ""), Action(1800, "a/", "cull", "")]
    result = evaluate("test", parse_lines(trace), actions)
    assert result.idle_held_gpu_hours == pytest.approx(0.5)
    assert result.reclaimed_gpu_hours == pytest.approx(1 / 6)  # the third idle step
    assert (result.culls, result.warned_culls, result.false_culls) == (1, 1, 0)
    assert result.culls_before_return == 1  # the owner came back: not false, counted apart
    assert result.median_idle_to_reclaim_s == 1200


@pytest.mark.parametrize("truth", sorted(WORK_TRUTHS))
def test_a_cull_in_a_step_of_live_work_is_false(truth):
    trace = rows(("idle_held", 0), (truth, 0), ("idle_held", 0))
    result = evaluate("test", parse_lines(trace), [Action(600, "a/", "cull", "")])
    assert (result.false_culls, result.culls_at_owner_return) == (1, 0)
    assert result.warned_share == 0
    assert result.false_culls_by_scenario == {"?": 1}


def test_a_cull_as_the_owner_arrives_is_counted_apart():
    trace = rows(("idle_held", 0), ("present", 0), ("active", 0.8))
    result = evaluate("test", parse_lines(trace), [Action(600, "a/", "cull", "")])
    assert (result.false_culls, result.culls_at_owner_return, result.culls) == (0, 1, 1)


def busy_rows(*steps: tuple[str, bool], **labels: str) -> list[str]:
    """One server, a step every 10 minutes: (truth, kernel busy) each, GPU idle, 1 GiB held."""
    return [
        json.dumps(
            {"t": i * 600, "server": "a/", "gpu_sm": 0.0, "gpu_mem_mb": 1024, "truth": truth}
            | {"kernel_busy": busy, "labels": labels}
        )
        for i, (truth, busy) in enumerate(steps)
    ]


def test_a_cull_or_interrupt_of_a_running_cell_is_a_cell_killed():
    trace = busy_rows(("cpu_phase", True), ("cpu_phase", True), ("cpu_phase", True))
    interrupted = evaluate("test", parse_lines(trace), [Action(600, "a/", "interrupt", "")])
    assert (interrupted.cells_killed, interrupted.culls) == (1, 0)
    culled = evaluate("test", parse_lines(trace), [Action(1200, "a/", "cull", "")])
    assert (culled.cells_killed, culled.false_culls) == (1, 1)
    assert culled.cells_killed_by_scenario == {"?": 1}
    # Interrupted and culled in one step (a hard deadline's order): one cell lost, not two.
    both = [Action(600, "a/", "interrupt", ""), Action(600, "a/", "cull", "")]
    assert evaluate("test", parse_lines(trace), both).cells_killed == 1
    # A sleep loop holds the GPU doing nothing for anyone: interrupting it loses no work.
    loop = busy_rows(("idle_held", True), ("idle_held", True))
    assert evaluate("test", parse_lines(loop), [Action(0, "a/", "interrupt", "")]).cells_killed == 0
    # On a server without the extension (no report) the cell is counted apart: the governor
    # could not see it.
    blind = [json.dumps({**json.loads(row), "reports": False}) for row in trace]
    culled = evaluate("test", parse_lines(blind), [Action(1200, "a/", "cull", "")])
    assert (culled.cells_killed, culled.cells_killed_no_report) == (1, 1)
    assert culled.cells_killed_by_scenario == {"? (no report)": 1}
    lines = table([culled, replace(culled, policy="idle-culler 1h", cells_killed_no_report=2)])
    assert "cells killed of test: 0 with the extension, 1 without (on those: idle-culler 1h 2)" in (
        lines.splitlines()
    )


def test_a_hard_deadline_is_kept_when_the_gpu_is_given_back_in_time():
    # A maximum age of 20 minutes from the first row: due at t=1200, 15 min slack and a step.
    trace = busy_rows(*[("cpu_phase", True)] * 6, **{"gpu-gov/max-age": "1200"})
    for cull_t, kept in ((1200, 1), (2400, 1), (3000, 0)):
        result = evaluate("test", parse_lines(trace), [Action(cull_t, "a/", "cull", "")])
        assert (result.deadlines, result.deadlines_kept) == (1, kept)
        # At the deadline a running cell is the admin's rule, not a surprise, nor a false cull.
        assert (result.cells_killed, result.false_culls) == (0, 0)
    missed = evaluate("test", parse_lines(trace), [])
    assert missed.deadlines_missed_by_scenario == {"?": 1}
    early = evaluate("test", parse_lines(trace), [Action(600, "a/", "cull", "")])
    assert early.deadlines == 0 and early.cells_killed == 1  # culled before the deadline


@pytest.fixture(scope="module")
def results():
    def samples():
        return parse_lines(json.dumps(row) for row in generate(20, 14, seed=1, step=300))

    truths = Counter((s.extra["scenario"], s.extra["truth"]) for s in samples())
    assert {scenario for scenario, _ in truths} == {*SCENARIOS, "batch_standby"}
    assert {truth for _, truth in truths} == {*LIVE_TRUTHS, "idle_held", "idle_free"}
    found = {r.policy: r for r in run_all(samples)}
    print(table(list(found.values())))  # shown with -s, or when a test fails
    return found


def test_default_policy(results):
    ours = results[DEFAULT]
    # The GPU policy reclaims what the hour's grace, the busy limit of cells that hold a GPU
    # doing nothing, and hooks that always fail (an hour at most) leave, on servers that report
    # and (through DCGM) on those that do not...
    assert ours.reporting_reclaimed_share >= 0.94
    assert ours.reclaimed_share >= 0.94
    assert ours.median_idle_to_reclaim_s <= 3600 + 300  # cull_after, then the checkpoint
    # ...keeps every hard deadline (a maximum age, a reclaim: failing hooks included), kills no
    # running cell (CPU stages of 1-5 h; sleep loops only at the busy limit, no surprise): on
    # a server with the extension its report shows the cell; without it, DCGM sees the card
    # alone, and the container's CPU (the kubelet's reading, a ``reports: false`` row's
    # ``cpu_cores``) shows the stage, decided as the hub does (core.cpu_stage)...
    assert ours.deadlines > 0 and ours.deadlines_kept == ours.deadlines
    assert ours.cells_killed == ours.cells_killed_no_report == 0
    # ...cuts no training (even starved under 5 % SM), pipeline stage or standby work but those
    # cells, and warns before every cull. What is left: owners arriving just as the cull falls.
    assert all(scenario.endswith("(no report)") for scenario in ours.false_culls_by_scenario)
    assert ours.warned_culls == ours.culls
    assert 0 < ours.culls_at_owner_return <= 6
    # Without DCGM, servers without the extension are unknown: jupyterhub-idle-culler's rule
    # reclaims some of their hours, and cannot warn...
    blind = results["default, no DCGM"]
    assert blind.reporting_reclaimed_share == ours.reporting_reclaimed_share
    assert blind.reclaimed_share < ours.reclaimed_share - 0.05
    # ...and without that rule they are never culled.
    without = results["default, no DCGM, no fallback"]
    assert (without.false_culls, without.warned_culls) == (0, without.culls)
    assert without.reclaimed_share < blind.reclaimed_share


def test_baselines_against_the_default_policy(results):
    ours = results[DEFAULT]
    nothing = results["no culling"]
    assert (nothing.culls, nothing.reclaimed_gpu_hours) == (0, 0)
    for name in ("idle-culler 1h", "idle-culler 8h", "kernel culler 1h"):
        stock = results[name]
        assert stock.reclaimed_share < ours.reclaimed_share / 2
        assert stock.warned_culls == 0
        # Silent training in a background thread looks idle to them; exempt standby too.
        assert stock.false_culls_by_scenario["silent_training"] > 0
        assert stock.false_culls_by_scenario["batch_standby"] > 0
    for name in ("idle-culler 1h", "kernel culler 1h"):
        assert results[name].false_culls > ours.false_culls
        # They know no maximum age of a tier and no reclaim of a borrowed GPU.
        assert results[name].deadlines_kept < results[name].deadlines


def test_the_gap_study_accounts_for_every_idle_held_hour_the_default_leaves():
    """``benchmarks.replay.gap`` splits what the default does not reclaim by why: its parts add
    up to the benchmark's own shortfall, and a lever moves only its own part."""
    from benchmarks.replay.gap import missed
    from jupyter_gpu_gov.core.policy import load_policies
    from jupyter_gpu_gov.replay import replay

    lines = [json.dumps(row) for row in generate(12, 7, seed=3, step=300)]
    default = list(replay(parse_lines(lines), load_policies([])))
    held, left = missed(parse_lines(lines), default)
    truth = evaluate("default", parse_lines(lines), default)
    assert held == pytest.approx(truth.idle_held_gpu_hours)
    assert 1 - sum(left.values()) / held == pytest.approx(truth.reclaimed_share)
    assert left["grace"] > 0 and left["failing hook"] > 0
    proceed = list(
        replay(parse_lines(lines), load_policies([], {"on_checkpoint_failure": "proceed"}))
    )
    _, after = missed(parse_lines(lines), proceed)
    assert after["failing hook"] < left["failing hook"] / 4
    assert after["running cell"] == pytest.approx(left["running cell"])


def test_on_default_servers_the_governor_remembers_a_broken_hook_from_one_start_to_the_next():
    """``--default-servers``: each user's sessions on ``user/`` (with their ``started``), the
    rows otherwise the same. Rules that keep nothing from one start to the next score exactly
    as on per-session keys; a hook that failed before is not waited for again, so the failing
    hooks' share falls, the running cells' does not move."""
    from benchmarks.replay.gap import missed
    from jupyter_gpu_gov.core.policy import load_policies
    from jupyter_gpu_gov.replay import replay

    keyed = [json.dumps(row) for row in generate(16, 7, seed=2, step=300)]
    reused = [json.dumps(row) for row in generate(16, 7, seed=2, step=300, default_servers=True)]
    names = {json.loads(line)["server"] for line in reused}
    assert all(name.endswith("/") for name in names) and len(names) == 16
    strip = [
        {k: v for k, v in json.loads(line).items() if k not in ("server", "started")}
        for line in reused
    ]
    assert strip == [{k: v for k, v in json.loads(line).items() if k != "server"} for line in keyed]
    forgets = load_policies([], {"checkpoint_broken_after": None})
    default = load_policies([], {"checkpoint_broken_after": 2})

    def left(lines, policies):
        return missed(parse_lines(lines), list(replay(parse_lines(lines), policies)))[1]

    assert left(reused, forgets) == pytest.approx(left(keyed, forgets))
    remembered, fresh = left(reused, default), left(keyed, default)
    assert remembered["failing hook"] < fresh["failing hook"] / 2
    assert remembered["running cell"] == pytest.approx(fresh["running cell"])
