"""``jupyter-gpu-gov what-if``: the current and a candidate policy side by side on a trace.

The trace is a week of ten notebook servers from the reclamation benchmark's generator (the
same scenarios as the month-long benchmark: breaks, zombies, silent training, pipelines, hooks
that fail, a tier with a maximum age).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.replay.generate import generate
from jupyter_gpu_gov.core.rightsize import TierSize
from jupyter_gpu_gov.replay import parse_lines, policies_from_config, replay
from jupyter_gpu_gov.replay.whatif import Setup, Tiers, compare, measure

SCRIPT = Path(sys.executable).with_name("jupyter-gpu-gov")
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "jupyter_gpu_gov.cli"]
SOONER = 'c.GpuGovernor.policy_defaults = {"warn_after": "10m", "cull_after": "20m"}\n'
TIERS = """\
c.GpuProfiles.tiers = [
    {"name": "a100-80g", "gpu": "A100-80GB"},
    {"name": "h100-80g", "gpu": "H100-80GB", "max_age": "1d"},
    {"name": "mig-3g.40gb", "gpu": "A100-80GB", "mig": "3g.40gb"},
    {"name": "mig-1g.10gb", "gpu": "A100-80GB", "mig": "1g.10gb"},
]
c.GpuProfiles.capacity = {"a100-80g": 2, "h100-80g": 2, "mig-3g.40gb": 2, "mig-1g.10gb": 2}
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("whatif") / "week.jsonl"
    with path.open("w") as out:
        for row in generate(10, 7, seed=1, step=300):
            out.write(json.dumps(row) + "\n")
    return path


def what_if(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "what-if", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def runs(result: subprocess.CompletedProcess) -> dict[str, dict]:
    assert result.returncode == 0, result.stderr
    return {run["name"]: run for run in json.loads(result.stdout)["runs"]}


def test_a_candidate_that_culls_sooner_reclaims_more_and_interrupts_more(trace, tmp_path):
    candidate = tmp_path / "candidate.py"
    candidate.write_text(SOONER)
    by_name = runs(what_if(trace, "--policy", candidate, "--json"))
    recorded, current, sooner = (by_name[n]["total"] for n in ("recorded", "current", "candidate"))
    # As recorded (nothing culled), every idle hour is left idle.
    assert recorded["culls"] == 0 and recorded["reclaimed_gpu_hours"] == 0
    assert recorded["idle_left_gpu_hours"] > current["idle_left_gpu_hours"] > 0
    # Culling after 20 minutes instead of an hour gives back more idle GPU-hours, and stops
    # more servers whose owner was back within four hours; it kills no running cell either.
    assert sooner["reclaimed_gpu_hours"] > current["reclaimed_gpu_hours"] > 0
    assert sooner["idle_left_gpu_hours"] < current["idle_left_gpu_hours"]
    assert sooner["interruptions"] > current["interruptions"]
    assert sooner["warnings"] > current["warnings"]
    assert sooner["utilisation"] > current["utilisation"] > recorded["utilisation"]
    assert current["running_work_killed"] == sooner["running_work_killed"] == 0
    # Every figure per team adds up to the total.
    teams = by_name["candidate"]["teams"]
    assert len(teams) >= 3
    for key in ("reclaimed_gpu_hours", "idle_left_gpu_hours", "culls", "interruptions"):
        assert sum(t[key] for t in teams.values()) == pytest.approx(sooner[key], abs=1e-3)


def test_json_and_table_agree(trace, tmp_path):
    candidate = tmp_path / "candidate.py"
    candidate.write_text(SOONER)
    tiers = tmp_path / "tiers.py"
    tiers.write_text(TIERS)
    by_name = runs(what_if(trace, "--policy", candidate, "--tiers", tiers, "--json"))
    text = what_if(trace, "--policy", candidate, "--tiers", tiers)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()

    def row(label: str) -> list[str]:
        (line,) = [line for line in lines if line.startswith(label + "  ")]
        return line[len(label) :].split()

    names = ("recorded", "current", "candidate")
    for label, key in (
        ("GPU-hours reclaimed (idle)", "reclaimed_gpu_hours"),
        ("  idle left", "idle_left_gpu_hours"),
        ("GPU-hours allocated", "allocated_gpu_hours"),
    ):
        cells = row(label)
        for name, cell in zip(names, cells[:3], strict=True):
            assert float(cell.replace(",", "")) == pytest.approx(
                by_name[name]["total"][key], abs=0.05
            ), label
        change = by_name["candidate"]["total"][key] - by_name["current"]["total"][key]
        assert float(cells[3].replace(",", "")) == pytest.approx(change, abs=0.051)
    for label, key in (
        ("warnings", "warnings"),
        ("culls", "culls"),
        ("interruptions (owner back < 4 h)", "interruptions"),
        ("running work killed", "running_work_killed"),
        ("requests that waited for a GPU", "requests_waited"),
    ):
        cells = row(label)
        assert [int(c.replace(",", "")) for c in cells[:3]] == [
            by_name[n]["total"][key] for n in names
        ], label
    cells = row("utilisation (mean SM)")
    for name, cell in zip(names, cells[:3], strict=True):
        # The JSON's 4 decimals, rounded again to the table's 1 can differ by one in the last.
        assert float(cell.rstrip("%")) / 100 == pytest.approx(
            by_name[name]["total"]["utilisation"], abs=0.0006
        )
    # The capacity model: two servers of each tier at once make some requests wait when
    # nothing is culled, and fewer when the policies give the GPUs back.
    assert (
        by_name["recorded"]["total"]["requests_waited"]
        > by_name["current"]["total"]["requests_waited"]
    )
    # Per team, the same figures as the JSON's, current → candidate.
    team_rows = lines[lines.index(next(x for x in lines if x.startswith("per team"))) + 2 :]
    team_rows = team_rows[: team_rows.index("")]  # then the notes on what the columns are
    assert {line.split()[0] for line in team_rows} == set(by_name["candidate"]["teams"])
    for line in team_rows:
        team, _, reclaimed, *_ = re.split(r"\s{2,}", line)
        reclaimed = reclaimed.split(" → ")
        assert [float(x.replace(",", "")) for x in reclaimed] == [
            pytest.approx(by_name[n]["teams"][team]["reclaimed_gpu_hours"], abs=0.05)
            for n in ("current", "candidate")
        ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('c.GpuGovernor.policy_defaults = {"warn_after": "soon"}\n', "'warn_after': 'soon'"),
        (
            'c.GpuGovernor.policies = [{"name": "x", "match": {"teams": ["a"]}, "cull": 3}]\n',
            "'cull'",
        ),
    ],
)
def test_a_bad_candidate_gets_the_services_start_up_error_and_nothing_else(
    trace, tmp_path, text, words
):
    candidate = tmp_path / "candidate.py"
    candidate.write_text(text)
    result = what_if(trace, "--policy", candidate, "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert words in result.stderr
    # The hub service refuses the same file at start with the same words.
    env = {**os.environ, "JUPYTERHUB_API_TOKEN": "x", "JUPYTERHUB_API_URL": "http://127.0.0.1:9"}
    service = subprocess.run(
        [sys.executable, "-m", "jupyter_gpu_gov.hub", "--config", str(candidate)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert service.returncode != 0
    why = service.stderr.strip().rpartition("bad policy configuration: ")[2]
    assert why and result.stderr.strip().endswith(f"bad policy configuration: {why}")


def test_a_bad_tier_a_missing_file_or_a_bad_trace_is_refused_and_prints_nothing(trace, tmp_path):
    candidate = tmp_path / "candidate.py"
    candidate.write_text(SOONER)
    tiers = tmp_path / "tiers.py"
    tiers.write_text('c.GpuProfiles.tiers = [{"name": "x", "gpu": "no-such-card"}]\n')
    result = what_if(trace, "--policy", candidate, "--tiers", tiers)
    assert (result.returncode, result.stdout) == (2, "")
    assert "GpuProfiles.tiers" in result.stderr and "no-such-card" in result.stderr
    result = what_if(trace, "--policy", tmp_path / "nowhere.py")
    assert (result.returncode, result.stdout) == (2, "")
    assert "--policy" in result.stderr and "nowhere.py" in result.stderr
    misspelt = tmp_path / "misspelt.py"
    misspelt.write_text('c.Governor.policy_defaults = {"cull_after": "20m"}\n')
    result = what_if(trace, "--policy", misspelt)
    assert (result.returncode, result.stdout) == (2, "")
    assert "sets no c.GpuGovernor" in result.stderr and "c.Governor" in result.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(trace.read_text().splitlines()[0] + '\n{"t": "soon", "server": "a/"}\n')
    result = what_if(bad, "--policy", candidate)
    assert (result.returncode, result.stdout) == (2, "")
    assert "line 2" in result.stderr and "'t'" in result.stderr


def _row(t: float, server: str, **values) -> dict:
    return {"t": t, "server": server, "team": "nlp", "profile": "a100-80g", **values}


def test_a_server_started_again_is_a_new_run(tmp_path):
    """A hub reuses a server's name: each start (``started``) is governed and measured apart."""
    rows = []
    for t in range(0, 3 * 3600, 600):  # idle from the start: culled after about an hour
        rows.append(_row(t, "ada/", started=0, gpu_sm=0.0, gpu_mem_mb=9000, holds_context=True))
    for t in range(4 * 3600, 5 * 3600, 600):  # started again, working
        rows.append(_row(t, "ada/", started=4 * 3600, gpu_sm=0.9, gpu_mem_mb=9000))
    samples = list(parse_lines(json.dumps(r) for r in rows))
    actions = list(replay(samples, policies_from_config(None)))
    culls = [a for a in actions if a.action == "cull"]
    assert [a.started for a in culls] == [0]
    outcome = measure("default", samples, actions)
    assert outcome.total.servers == 2
    assert outcome.total.culls == 1
    # The owner started the server again within 4 h of the cull: an interruption.
    assert outcome.total.interruptions == 1
    # The second run, all of it: its lines from 4 h to 4 h 50 (a run's last line ends it).
    assert outcome.total.active_gpu_hours == pytest.approx(50 / 60)


def test_queue_waits_follow_the_capacity_of_each_tier():
    """One slot: a second run asking while the first holds it waits until the first is culled
    (or ends); culling the idle first run sooner shortens the wait."""
    rows = []
    for t in range(0, 6 * 3600 + 1, 300):  # idle all along, from t=0
        rows.append(_row(t, "ada/", gpu_sm=0.0, gpu_mem_mb=9000, holds_context=True))
    for t in range(1800, 3 * 3600 + 1, 300):  # asks at 30 min, works
        rows.append(_row(t, "bob/", gpu_sm=0.9, gpu_mem_mb=9000, holds_context=True))
    rows.sort(key=lambda r: r["t"])
    lines = [json.dumps(r) for r in rows]
    tiers = Tiers(sizes={"a100-80g": TierSize("a100-80g", "A100", 80, 1.0)}, slots={"a100-80g": 1})

    def run(config: str | None):
        return lambda samples: replay(samples, policies_from_config(config))

    def noop(samples):
        return iter(())

    recorded, nothing, default = compare(
        lambda: parse_lines(lines),
        [Setup("nothing", noop, tiers), Setup("default", run(None), tiers)],
    )
    assert recorded.total.as_dict() == nothing.total.as_dict()  # the trace has no actions
    # Nobody culls ada's idle GPU: bob waits for her run to end (6 h after it started).
    assert nothing.total.requests_waited == 1
    assert nothing.total.max_wait_s == pytest.approx(6 * 3600 - 1800)
    # The default culls it after about an hour of idleness: bob waits for that alone.
    assert default.total.requests_waited == 1
    assert 0 < default.total.max_wait_s < 2 * 3600
    assert default.teams["nlp"].requests_waited == 1


def test_a_candidates_tiers_are_its_own(trace, tmp_path):
    """A candidate that gives the h100 tier a 2 h maximum age (the current tiers: 1 day) culls
    servers of that tier at the deadline; the current side keeps the tiers of --tiers."""
    tiers = tmp_path / "tiers.py"
    tiers.write_text(TIERS)
    candidate = tmp_path / "candidate.py"
    candidate.write_text(TIERS.replace('"max_age": "1d"', '"max_age": "2h"'))
    by_name = runs(what_if(trace, "--policy", candidate, "--tiers", tiers, "--json"))
    current, shorter = by_name["current"], by_name["candidate"]
    assert "max-age" not in current["total"]["culls_by_reason"]
    assert shorter["total"]["culls_by_reason"]["max-age"] >= 1
    assert (
        shorter["tiers"]["h100-80g"]["deadline_culls"]
        > current["tiers"]["h100-80g"]["deadline_culls"]
    )
    # Elsewhere nothing changes: the other tiers' figures are the current ones.
    for tier in ("a100-80g", "mig-3g.40gb", "mig-1g.10gb"):
        if tier in current["tiers"]:
            assert shorter["tiers"][tier] == current["tiers"][tier]


def test_against_jupyterhub_idle_culler_as_deployed_today(trace, tmp_path):
    """An admin moving from jupyterhub-idle-culler compares it with the governor's policy."""
    candidate = tmp_path / "jupyterhub_config.py"
    candidate.write_text("# the shipped default policy\n")
    by_name = runs(what_if(trace, "--policy", candidate, "--current", "idle-culler", "--json"))
    culler, ours = by_name["current"], by_name["candidate"]
    assert culler["policies"] == ["idle-culler"] and ours["policies"] == ["default"]
    # The culler cuts training that runs without a kernel execution or a browser, and leaves
    # kernels behind open tabs holding their GPUs.
    assert culler["total"]["running_work_killed"] > 0 == ours["total"]["running_work_killed"]
    assert ours["total"]["reclaimed_gpu_hours"] > culler["total"]["reclaimed_gpu_hours"]
    assert ours["total"]["utilisation"] > culler["total"]["utilisation"]
    longer = runs(what_if(trace, "--policy", candidate, "--current", "idle-culler:8h", "--json"))
    assert longer["current"]["total"]["culls"] < culler["total"]["culls"]
    result = what_if(trace, "--policy", candidate, "--current", "idle-culler:soon")
    assert (result.returncode, result.stdout) == (2, "")
    assert "idle-culler:soon" in result.stderr


def test_the_table_shows_a_traces_names_not_terminal_controls(tmp_path):
    """A trace is a file admins pass around: a team named with escape sequences ran them in the
    terminal of whoever printed the what-if table. They are shown as escapes now."""
    trace = tmp_path / "trace.jsonl"
    source = Path(__file__).parent / "data" / "traces" / "background_training.jsonl"
    with source.open() as rows, trace.open("w") as out:
        for line in rows:
            out.write(json.dumps({**json.loads(line), "team": "nlp\x1b]0;pwned\x07\u202e"}) + "\n")
    candidate = tmp_path / "candidate.py"
    candidate.write_text(SOONER)
    result = what_if(trace, "--policy", candidate)
    assert result.returncode == 0, result.stderr
    assert "nlp\\x1b]0;pwned\\x07\\u202e" in result.stdout
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout


def test_the_demo_hours_recorded_cull_is_explained_beside_the_replays_none(tmp_path):
    """The README's what-if on the demo's hour (alice's idle kernel warned after a minute,
    culled at three): the table read "culls 1 0 0" under "recorded current candidate" and
    said no more, and the same policy seemed not to cull what it had culled. It now says what
    each column is and why the two differ: the cull ended the run in the trace, before the
    replayed policy (acting at the trace's 5-minute samples, after its checkpoint) reached its
    own."""
    from jupyter_gpu_gov.replay.history import HistoryRow, export_trace

    t0, idle = 1796530706.0, {"gpu_sm": 0.0, "gpu_mem_mb": 20480, "holds_context": True}
    alice = {"server": "alice/", "started": t0, "labels": {"gpu-gov/user": "alice"}, **idle}
    rows = [  # what the demo governor kept of that hour (hub/history.py)
        HistoryRow(t0, state="idle", **alice),
        HistoryRow(t0 + 60, state="warned", actions=("warn",), **alice),
        HistoryRow(t0 + 180, state="culled", actions=("cull",), cull_reason="gpu-idle", **alice),
        HistoryRow(t0 + 185, state="culled", stopped=True, **alice),
    ]
    trace = tmp_path / "last-hour.jsonl"
    trace.write_text("".join(line + "\n" for line in export_trace(rows)))
    demo = Path(__file__).resolve().parent.parent / "hub_config" / "gpu_gov_config.py"
    result = what_if(trace, "--policy", demo, "--current", demo)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^culls +1 +0 +0 ", out, re.M), out
    said = " ".join(out.split())
    assert "recorded: what the governor did" in said, out
    assert "current, candidate: each policy replayed on the trace" in said, out
    assert "recorded 1 cull, current 0: a server the governor culled stops at that cull" in said


def test_the_what_if_counts_a_traces_hours_as_the_replay_does():
    """An hour of the demo's history exported at 5-minute lines: alice's idle server, started
    a little before a line and culled three minutes in (its next line, after the stop, carries
    the cull), and bob working all hour (13 lines, from the hour's start to its
    end). ``replay``'s summary held 1.08 GPU-hours, the what-if 1.25: it counted each run's last
    line a step more (bob: 65 minutes of an hour; alice's line after her stop: a step of a run
    that had ended). A line lasts until its run's next line, and a run's last line ends it, in
    both: the same hours, and never more than the hour holds."""
    from jupyter_gpu_gov.replay import score
    from jupyter_gpu_gov.replay.history import HistoryRow, export_trace

    base = 1_800_000_000.0  # on the 5-minute grid
    start = base + 200
    alice = [
        HistoryRow(
            t=start + 10 * i, server="alice/", started=start, profile="1g.10gb", team="vision",
            gpu_sm=0.0, gpu_mem_mb=2000, holds_context=True, state="idle",
            actions=("warn",) if i == 6 else ("cull",) if i == 18 else (),
            cull_reason="gpu-idle" if i == 18 else None,
        )
        for i in range(19)
    ] + [
        HistoryRow(
            t=start + 190, server="alice/", started=start, profile="1g.10gb", team="vision",
            state="culled", stopped=True,
        )
    ]  # fmt: skip
    bob = [
        HistoryRow(
            t=base + 60 * i, server="bob/", started=base - 600, profile="h100", team="nlp",
            gpu_sm=0.8, gpu_mem_mb=9000, holds_context=True,
        )
        for i in range(61)
    ]  # fmt: skip
    rows = sorted(alice + bob, key=lambda r: r.t)
    lines = list(export_trace(rows, step=300, since=base, until=base + 3600))
    samples = list(parse_lines(lines))
    first, after_stop = [s for s in samples if s.server == "alice/"]  # (the stop between)
    assert after_stop.t - first.t == 300 and after_stop.extra["actions"] == ["cull"]
    assert sum(s.server == "bob/" for s in samples) == 13

    actions = list(replay(samples, policies_from_config(None)))
    replayed = score(samples, actions)
    measured = measure("current", samples, actions).total
    assert measured.allocated_gpu_hours == pytest.approx(replayed.gpu_hours_held)
    assert measured.reclaimed_gpu_hours == pytest.approx(replayed.gpu_hours_reclaimed)
    assert measured.allocated_gpu_hours == pytest.approx(1 + 5 / 60)  # bob's hour, alice's step
    by_team = measure("current", samples, actions).teams
    assert by_team["nlp"].allocated_gpu_hours == pytest.approx(1.0)  # the hour, not 65 minutes
