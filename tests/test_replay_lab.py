"""The second replay world (``benchmarks/replay/lab.py``, a research lab's month, written apart
from the policy): its traces are valid replay traces whose truth follows ``score.py``'s
definitions, and every policy replays them (``python -m benchmarks.replay --world lab``). Small
traces: a few seconds."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from benchmarks.replay import lab
from benchmarks.replay.generate import LIVE_TRUTHS, RECLAIMABLE
from benchmarks.replay.score import main, run_all
from jupyter_gpu_gov.replay import parse_lines, read_trace
from jupyter_gpu_gov.replay.engine import EPOCH

DEFAULT = "jupyter-gpu-gov default"
TRUTHS = {*LIVE_TRUTHS - {"standby"}, RECLAIMABLE, "idle_free"}  # no exempt standby here


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return [json.dumps(row) for row in lab.generate(12, 10, seed=2, step=300)]


def test_the_lab_world_writes_valid_traces_the_engine_reads(lines, tmp_path):
    path = tmp_path / "lab.jsonl"
    path.write_text("\n".join(lines) + "\n")
    samples = list(read_trace(str(path)))  # the CLI's reader: a bad row would stop it
    assert len(samples) == len(lines)
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    assert {s.extra["scenario"] for s in samples} == set(lab.SCENARIOS)
    assert {s.extra["truth"] for s in samples} == TRUTHS
    # The hub's default server, reused: each start a session of its own.
    assert all(s.name == "" and s.started is not None for s in samples)
    assert len({s.session for s in samples}) > 12
    # Hard deadlines, failing hooks and servers without the extension all occur.
    assert all("gpu-gov/max-age" in s.labels for s in samples)
    assert any("gpu-gov/reclaim" in s.labels for s in samples)
    assert any(s.checkpoint_fails for s in samples)
    without = [s for s in samples if not s.reports]
    assert without and all(s.cpu_cores is None and s.gpu_sm is not None for s in without)
    # Nobody starts a server at the weekend (2026-01-01, t = 0, is a Thursday).
    for start in {s.started for s in samples}:
        assert (EPOCH.weekday() + int(start // 86400)) % 7 < 5


def test_the_lab_worlds_truth_follows_the_scorers_definitions(lines):
    runs = defaultdict(list)
    for sample in parse_lines(lines):
        runs[sample.session].append(sample)
    for rows in runs.values():
        for i, row in enumerate(rows):
            truth = row.extra["truth"]
            # Memory is held from the first GPU cell on; before it, none.
            assert (row.gpu_mem_mb == 0) == (truth == "idle_free"), row
            if truth != "active":
                assert row.gpu_sm == 0, row  # the GPU idle: SM 0, the report's or DCGM's
            if truth == "cpu_phase":
                # A running cell whose next stage uses the GPU: busy until that stage comes.
                after = [r.extra["truth"] for r in rows[i:]]
                nxt = next(t for t in after if t != "cpu_phase")
                assert row.kernel_busy and nxt == "active", row


def test_every_policy_replays_the_lab_world(lines):
    results = {r.policy: r for r in run_all(lambda: parse_lines(lines))}
    ours = results[DEFAULT]
    assert ours.idle_held_gpu_hours > 0 and ours.deadlines > 0
    assert ours.warned_culls == ours.culls and ours.deadlines_kept == ours.deadlines
    for stock in ("idle-culler 1h", "kernel culler 1h"):
        assert results[stock].reclaimed_share < ours.reclaimed_share
        assert results[stock].warned_culls == 0


def test_the_cli_runs_a_named_world_and_names_it(capsys):
    main(["--world", "lab", "--servers", "3", "--days", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["world"] == "lab" and len(out["policies"]) == 7
    main(["--servers", "3", "--days", "3", "--json"])  # the default world: named as before
    assert "world" not in json.loads(capsys.readouterr().out)


def test_the_lift_study_measures_the_lab_on_its_own_tiers(capsys):
    """``benchmarks.replay.lift --world lab``, as replay and gap take it: the lab's trace, its
    GPU-hours counted on its own tiers (whole cards) and its requests queued on them."""
    from benchmarks.replay import lift

    lift.main(["--world", "lab", "--servers", "12", "--days", "7", "--json"])
    rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(lift.SHOWN)
    assert rows[DEFAULT]["idle_held_reclaimed"] > rows["idle-culler 1h"]["idle_held_reclaimed"]
    assert rows["no culling"]["requests_waited"] > 0  # 4 servers a tier at once: the line
    assert all(r["allocated_gpu_hours"] > 0 for r in rows.values())
    lift.main(["--servers", "12", "--days", "7", "--json"])  # the default world: the month's
    assert json.loads(capsys.readouterr().out) != list(rows.values())


@pytest.mark.parametrize("module", ["generate", "gap", "lab", "lift", "score"])
def test_each_replay_commands_help_says_what_it_does_in_whole_sentences(module, capsys):
    """``lift --help`` ended "give over doing nothing and", ``lab --help`` "written apart
    from": each printed its docstring's first line, half a sentence."""
    import importlib
    import re

    with pytest.raises(SystemExit):
        importlib.import_module(f"benchmarks.replay.{module}").main(["--help"])
    help_text = capsys.readouterr().out
    described = help_text.split("\n\n")[1]  # after the usage, before the options
    assert re.search(r"[.)]$", described.strip()), described


def test_the_lift_table_has_the_columns_docs_benchmarks_md_shows():
    """docs/benchmarks-history.md's lift table has an "active" column that the printed table lacked
    (it printed "right-sized", equal to utilisation on these traces): a reader running the
    command could not find the figures the document quotes."""
    from pathlib import Path

    from benchmarks.replay import lift

    doc = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks-history.md").read_text()
    section = doc.split("### Utilisation lift", 1)[1]
    head = next(line for line in section.splitlines() if line.startswith("| seed |"))
    documented = [c.strip() for c in head.strip("|").split("|")]
    row = {
        "utilisation": 0.1,
        "utilisation_right_sized": 0.1,
        "active_share": 0.2,
        "idle_held_reclaimed": 0.0,
        "interruptions": 0,
        "running_work_killed": 0,
        "cells_killed": 0,
        "requests_waited": 0,
        "wait_hours": 0.0,
    }
    runs = [{**row, "seed": 1, "run": name} for name in ("no culling", "idle-culler 1h")]
    printed = lift.table(runs).splitlines()[0]
    missing = [c for c in documented if c not in printed]
    assert not missing, (missing, printed)
