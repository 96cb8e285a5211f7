"""``jupyter-gpu-gov replay``: traces through the live policy and through the stock cullers.

The traces under tests/data/traces/ step every 10 minutes. With the default policy a GPU idle
from t=0 is warned at 30 min, checkpointed at 1 h and culled a step later, once the checkpoint
is in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpu_gov.core.policy import PolicyError, load_policies
from jupyter_gpu_gov.replay import (
    Action,
    TraceError,
    idle_culler,
    kernel_culler,
    parse_lines,
    policies_from_config,
    read_trace,
    replay,
    score,
)

TRACES = Path(__file__).parent / "data" / "traces"
SCRIPT = Path(sys.executable).with_name("jupyter-gpu-gov")
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "jupyter_gpu_gov.cli"]


def run_policy(name: str, config: Path | None = None) -> list[Action]:
    policies = policies_from_config(str(config) if config else None)
    return list(replay(read_trace(str(TRACES / name)), policies))


def steps(actions: list[Action]) -> list[tuple[float, str, str]]:
    return [(a.t, a.server, a.action) for a in actions]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "replay", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def config(tmp_path):
    def write(text: str) -> Path:
        path = tmp_path / "gpu_gov_config.py"
        path.write_text(text)
        return path

    return write


# -- the policy and the stock cullers on the same traces ----------------------------------------


def test_zombie_with_open_tab_is_warned_checkpointed_and_culled():
    actions = run_policy("zombie_open_tab.jsonl")
    assert steps(actions) == [
        (1800, "alice/", "warn"),
        (3600, "alice/", "checkpoint"),
        (4200, "alice/", "cull"),
    ]
    assert "GPU idle since 2026-01-01 00:00 UTC" in actions[0].reason
    assert "GPU idle for 1h 10m" in actions[-1].reason
    assert "checkpoint saved" in actions[-1].reason


@pytest.mark.parametrize("baseline", [idle_culler, kernel_culler])
def test_zombie_with_open_tab_survives_the_stock_cullers(baseline):
    # The tab keeps Hub activity fresh, and the kernel culler leaves connected kernels alone.
    assert list(baseline(read_trace(str(TRACES / "zombie_open_tab.jsonl")))) == []


def test_silent_training_loop_is_never_culled_by_the_policy():
    assert run_policy("background_training.jsonl") == []


@pytest.mark.parametrize(
    ("baseline", "cull_t", "reason"),
    [(idle_culler, 3600, "idle-culler"), (kernel_culler, 4200, "kernel culler")],
)
def test_silent_training_loop_is_killed_by_the_stock_cullers(baseline, cull_t, reason):
    trace = str(TRACES / "background_training.jsonl")
    actions = list(baseline(read_trace(trace)))
    assert steps(actions) == [(cull_t, "carol/train", "cull")]
    assert reason in actions[0].reason
    summary = score(read_trace(trace), actions)
    assert summary.false_culls == 1
    assert summary.gpu_hours_work_lost == pytest.approx((10800 - cull_t) / 3600)
    assert summary.gpu_hours_reclaimed == 0


def test_server_without_extension_gets_the_idle_culler_rule():
    # No report and no DCGM reading (no gpu_sm): only the Hub's activity is known.
    actions = run_policy("no_extension.jsonl")
    assert steps(actions) == [(3600, "dave/", "cull")]
    assert "sends no GPU report" in actions[0].reason


def with_dcgm(trace: str, sm: float) -> list[str]:
    """The trace as seen on a cluster with dcgm-exporter: ``gpu_sm`` on every row."""
    rows = [json.loads(line) for line in (TRACES / trace).read_text().splitlines()]
    rows += [{**rows[-1], "t": rows[-1]["t"] + 600 * i} for i in (1, 2)]  # 20 min longer
    return [json.dumps({**row, "gpu_sm": sm}) for row in rows]


def test_server_without_extension_is_governed_by_dcgm():
    # DCGM sees the idle card, never the kernels, and the governor calls no user's server
    # (hub/evidence.py): a cell may be running, so the cull waits busy_grace (2 h) after a
    # warning at 30 min; without the extension nobody can be asked for a checkpoint.
    actions = list(
        replay(parse_lines(with_dcgm("no_extension.jsonl", 0.0)), policies_from_config(None))
    )
    assert steps(actions) == [(1800, "dave/", "warn"), (7200, "dave/", "cull")]
    assert "DCGM" in actions[0].reason and "a cell may be running" in actions[0].reason
    assert "no checkpoint (it sends no GPU report)" in actions[1].reason
    # A kernel executing a cell without a word to anyone (a CPU stage) is stopped all the
    # same when busy_grace ends, as the hub does: nothing it reads can tell it from an idle one.
    busy = [
        json.dumps({**json.loads(row), "kernel_busy": True})
        for row in with_dcgm("no_extension.jsonl", 0.0)
    ]
    assert list(replay(parse_lines(busy), policies_from_config(None))) == actions


def test_busy_gpu_of_a_server_without_extension_is_never_culled():
    # The stock rule would cut it at 1 h (nobody touches the server); DCGM sees the GPU work.
    rows = with_dcgm("no_extension.jsonl", 0.8)
    assert steps(idle_culler(parse_lines(rows))) == [(3600, "dave/", "cull")]
    assert list(replay(parse_lines(rows), policies_from_config(None))) == []


def test_unknown_gpu_is_never_idle():
    actions = run_policy("unknown_gpu.jsonl")
    assert "erin/" not in {a.server for a in actions}  # unknown all along
    # frank/ is idle for 50 min (warned at 30), unknown for 30, then idle again: the idle
    # clock paused while unknown, so the 1 h cull comes 30 min late.
    assert steps(actions) == [
        (1800, "frank/", "warn"),
        (5400, "frank/", "checkpoint"),
        (6000, "frank/", "cull"),
    ]


def cell_rows(
    busy_hours: float, then: str = "idle", hours: float = 12, cpu: float | None = None
) -> list[str]:
    """A server that holds its GPU idle while a cell runs on the CPU for ``busy_hours``, then
    the kernel goes idle (``then``: "idle") or the GPU works ("gpu"), a step every 10 min;
    ``cpu``: the cell's kernel's CPU cores, as the report's ``targets[].cpu`` says."""
    rows = []
    for i in range(int(hours * 6)):
        busy = i < busy_hours * 6
        sm = 0.8 if not busy and then == "gpu" else 0.0
        row = {"t": i * 600, "server": "ann/", "gpu_sm": sm, "gpu_mem_mb": 4096}
        if cpu is not None:
            row |= {"cpu_cores": cpu if busy else 0.003, "iowait": 0.0, "read_mb_s": 0.0}
        rows.append(json.dumps(row | {"holds_context": True, "kernel_busy": busy}))
    return rows


def test_a_long_cpu_stage_is_not_culled_and_gets_a_notice():
    # Four hours of CPU work before training: the default busy_grace (2 h) ends with a notice.
    actions = list(replay(parse_lines(cell_rows(4, then="gpu")), policies_from_config(None)))
    assert [(a.t, a.action) for a in actions] == [(7200, "notice")]
    assert "a kernel is executing a cell" in actions[0].reason and "Extend" in actions[0].reason


def test_a_cell_that_never_ends_is_interrupted_at_the_busy_limit():
    # `while True: time.sleep(60)`: notice at 2 h, warning at 8 h, interrupt and checkpoint
    # at 8 h 30 min; the kernel and its state stay, and the idle rules cull after their own
    # notice (after_interrupt "warn", the default). With "cull" the server is culled once the
    # checkpoint is saved, as the warning then says.
    actions = list(replay(parse_lines(cell_rows(24, hours=12)), policies_from_config(None)))
    assert [(a.t, a.action) for a in actions] == [
        (7200, "notice"),
        (28800, "warn"),
        (30600, "interrupt"),
        (30600, "checkpoint"),
        (31200, "warn"),
        (33000, "checkpoint"),
        (33600, "cull"),
    ]
    assert "the cell interrupted and checkpointed at" in actions[1].reason
    cull = load_policies([], {"after_interrupt": "cull"})
    actions = list(replay(parse_lines(cell_rows(24, hours=12)), cull))
    assert [(a.t, a.action) for a in actions][4:] == [(31200, "cull")]
    assert "the cell interrupted and checkpointed, then the server stopped" in actions[1].reason


def test_a_quiet_cell_is_interrupted_at_its_own_limit_a_cpu_stage_is_not():
    # `while not done(): time.sleep(60)`, its kernel at 0.2 % of a core, under a policy that
    # sets quiet_cell_limit (2 h; off by default): warned then, interrupted and checkpointed
    # after the notice, then culled by the idle rules after their own notice. A CPU stage (two
    # cores) of the same length only gets the notice.
    policies = load_policies([], {"quiet_cell_limit": "2h"})
    actions = list(replay(parse_lines(cell_rows(24, hours=6, cpu=0.002)), policies))
    assert [(a.t, a.action) for a in actions] == [
        (7200, "warn"),
        (9000, "interrupt"),
        (9000, "checkpoint"),
        (9600, "warn"),  # the kernel kept: the idle rules' own notice
        (11400, "checkpoint"),
        (12000, "cull"),
    ]
    assert "the quiet-cell limit of 2h" in actions[0].reason
    actions = list(replay(parse_lines(cell_rows(24, hours=6, cpu=2.0)), policies))
    assert [(a.t, a.action) for a in actions] == [(7200, "notice")]


def test_by_default_a_quiet_cell_waits_for_the_busy_limit():
    """A cell waiting quietly on a job elsewhere reads as a sleep loop that waits for nothing;
    by default neither is interrupted before busy_limit (8 h): only the notice comes."""
    actions = list(
        replay(parse_lines(cell_rows(24, hours=6, cpu=0.002)), policies_from_config(None))
    )
    assert [(a.t, a.action) for a in actions] == [(7200, "notice")]


def test_exempt_label_is_never_culled():
    assert run_policy("exempt.jsonl") == []


def test_failed_checkpoint_postpones_the_cull_a_bounded_time():
    # Each failure warns again and postpones the cull: by the notice (30 min), then twice that
    # but never more than checkpoint_max_delay (1 h) past the cull's own time (1 h); after
    # checkpoint_retries (2) the cull proceeds.
    actions = run_policy("checkpoint_fails.jsonl")
    assert [(a.t, a.action) for a in actions] == [
        (1800, "warn"),
        (3600, "checkpoint"),
        (4200, "warn"),
        (6000, "checkpoint"),
        (6600, "warn"),
        (7200, "checkpoint"),
        (7800, "cull"),
    ]
    assert "checkpoint failed (2 of 2 retries): cull postponed to" in actions[4].reason
    assert "culling anyway (after 3 failed checkpoints)" in actions[-1].reason


def test_a_hook_that_failed_last_session_is_not_waited_for_again():
    # The same server, started again after its cull (its hook still raises): the governor
    # remembers the three failures in a row, so with checkpoint_broken_after (off by default)
    # the next session's first failure culls.
    text = (TRACES / "checkpoint_fails.jsonl").read_text().splitlines()
    first = [json.loads(line) | {"started": 0} for line in text if line.strip()]
    again = [r | {"t": r["t"] + 86400, "started": 86400} for r in first]
    lines = [json.dumps(r) for r in first + again]
    two = load_policies([], {"checkpoint_broken_after": 2})
    actions = list(replay(parse_lines(lines), two))
    second = [(a.t - 86400, a.action) for a in actions if a.t >= 86400]
    assert second == [(1800, "warn"), (3600, "checkpoint"), (4200, "cull")]
    assert "its hook had failed 3 times in a row before: taken as broken" in actions[-1].reason
    # Another server of the same user learns nothing from it.
    other = [r | {"server": "hal/other"} for r in again]
    lines = [json.dumps(r) for r in first + other]
    actions = list(replay(parse_lines(lines), two))
    assert [a.action for a in actions if a.t >= 86400][-1:] == ["cull"]
    assert len([a for a in actions if a.t >= 86400]) == 7


def test_max_age_by_tier_label(config):
    path = config(
        'c.GpuGovernor.policies = [{"name": "tier-a", "match": {"tiers": ["A"]}, "max_age": "3h"}]'
    )
    actions = run_policy("max_age.jsonl", path)
    # ian/ (label gpu-gov/tier A) reaches 3 h; jo/ (tier C) gets the default policy.
    assert steps(actions) == [
        (7200, "ian/", "warn"),
        (10800, "ian/", "checkpoint"),
        (11400, "ian/", "cull"),
    ]
    assert "max age" in actions[0].reason


def test_the_tier_max_age_label_of_the_profile_layer_is_honoured(tmp_path):
    """The profile layer labels servers with their tier's max age (gpu-gov/max-age, seconds)."""
    trace = tmp_path / "tier_max_age.jsonl"
    rows = (
        (TRACES / "max_age.jsonl")
        .read_text()
        .replace('"gpu-gov/tier": "A"}', '"gpu-gov/tier": "A", "gpu-gov/max-age": "7200"}')
    )
    trace.write_text(rows)
    actions = list(replay(read_trace(str(trace)), policies_from_config(None)))
    assert steps(actions)[:2] == [(3600, "ian/", "warn"), (7200, "ian/", "checkpoint")]
    assert "maximum age of 2h for this tier" in actions[0].reason


def test_cull_action_decides_whether_a_server_without_context_holds_a_gpu(config):
    # An allocated GPU with no context is still held (stop-server)...
    assert [a.action for a in run_policy("no_context.jsonl")] == ["warn", "checkpoint", "cull"]
    # ...but there is nothing to shut down on a shared GPU; the open tab keeps it active.
    path = config(
        'c.GpuGovernor.policies.append({"name": "ws", "cull_action": "shutdown-kernels"})'
    )
    assert run_policy("no_context.jsonl", path) == []


def test_service_timeout_is_the_default_for_servers_without_reports(config):
    path = config("c.GpuGovernor.timeout = 1800")
    assert steps(run_policy("no_extension.jsonl", path)) == [(1800, "dave/", "cull")]


def test_policy_defaults_apply(config):
    path = config('c.GpuGovernor.policy_defaults = {"warn_after": "1h", "cull_after": "2h"}')
    assert steps(run_policy("zombie_open_tab.jsonl", path)) == [
        (3600, "alice/", "warn"),
        (7200, "alice/", "checkpoint"),
        (7800, "alice/", "cull"),
    ]


# -- scoring ------------------------------------------------------------------------------------


def test_score_of_the_zombie():
    trace = str(TRACES / "zombie_open_tab.jsonl")
    summary = score(read_trace(trace), run_policy("zombie_open_tab.jsonl"))
    assert summary.as_dict() == {
        "servers": 1,
        "warnings": 1,
        "checkpoints": 1,
        "culls": 1,
        "gpu_hours_held": 3.0,
        "gpu_hours_idle_held": 3.0,
        "gpu_hours_reclaimed": pytest.approx((10800 - 4200) / 3600, abs=1e-4),
        "gpu_hours_work_lost": 0.0,
        "false_culls": 0,
        "warned_cull_share": 1.0,
        "median_idle_to_reclaim_s": 4200,
    }


def test_truth_label_makes_a_cull_false():
    lines = [
        json.dumps({"t": t, "server": "a/", "gpu_sm": 0.0, "gpu_mem_mb": 100, "truth": truth})
        for t, truth in ((0, "zombie"), (60, "data_io"), (120, "data_io"))
    ]
    summary = score(parse_lines(lines), [Action(60, "a/", "cull", "test")])
    assert summary.false_culls == 1
    assert summary.median_idle_to_reclaim_s == 60


# -- the trace format ---------------------------------------------------------------------------


def test_reader_defaults_and_unknown_keys():
    (sample,) = parse_lines(['{"t": 5, "server": "bob/gpu", "gpu_mem_mb": 10, "truth": "zombie"}'])
    assert (sample.user, sample.name, sample.gpu_sm) == ("bob", "gpu", None)
    assert sample.holds_context and sample.reports and sample.connections == 0
    assert sample.extra == {"truth": "zombie"}


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"t": 60, "server": "a/", "gpu_sm": "high"}', ["line 2", "'gpu_sm'"]),
        ('{"t": 60, "server": "a/", "gpu_sm": 42}', ["line 2", "'gpu_sm'", "[0, 1]"]),
        ('{"t": 60, "server": "a"}', ["line 2", "'server'"]),
        ('{"server": "a/"}', ["line 2", "'t'"]),
        ('{"t": 0, "server": "a/"}', ["line 2", "'t'", "does not come after"]),
        ('{"t": 60, "server": "a/", "started": -1e20}', ["line 2", "'started'", "out of range"]),
        ("[" * 100_000, ["line 2", "not valid JSON", "nested"]),
        ('{"t": 60, "server": "a/", "reports": "yes"}', ["line 2", "'reports'"]),
        ('{"t": 60, "server": "a/", "labels": {"x": [1]}}', ["line 2", "'labels.x'"]),
        ('{"t": 60, "server": "a/", "cpu_cores": -1}', ["line 2", "'cpu_cores'", ">= 0"]),
        ('{"t": 60, "server": "a/", "iowait": 2}', ["line 2", "'iowait'", "[0, 1]"]),
        ('{"t": 60, "server": "a/", "read_mb_s": "fast"}', ["line 2", "'read_mb_s'"]),
        ('{"t": 60, "server": "a/"', ["line 2", "not valid JSON"]),
        # JSON's numbers have no bound: past a float's, past what Python converts, past the
        # replay clock's datetimes (each was a traceback, OverflowError or ValueError).
        ('{"t": 1' + "0" * 400 + ', "server": "a/"}', ["line 2", "'t'", "integer past 1e308"]),
        ('{"t": 60, "server": "a/", "gpu_sm": 1' + "0" * 400 + "}", ["line 2", "'gpu_sm'"]),
        ('{"t": 60, "server": "a/", "started": -1' + "0" * 400 + "}", ["line 2", "'started'"]),
        ('{"t": 1' + "0" * 5000 + ', "server": "a/"}', ["line 2", "a number too long to read"]),
    ],
)
def test_bad_line_names_the_line_and_the_field(line, words):
    with pytest.raises(TraceError) as error:
        list(parse_lines(['{"t": 0, "server": "a/"}', line]))
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize("t", [-9e10, -62135596800.0 - 1e9])
def test_a_time_no_datetime_holds_is_the_lines_error_not_a_traceback(tmp_path, t):
    # The replay clock counts from 2026: -9e10 s is before the year 1, and its replay was an
    # OverflowError's traceback.
    trace = tmp_path / "trace.jsonl"
    rows = [{"t": t + 60 * i, "server": "a/", "gpu_sm": 0.0, "gpu_mem_mb": 1} for i in range(3)]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = cli(str(trace))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "line 1: field 't'" in result.stderr and "out of range" in result.stderr


@pytest.mark.parametrize("stdin", [False, True])
def test_a_line_of_megabytes_is_named_and_read_no_further(tmp_path, stdin):
    # A file handed to the admin: Python read a line whole (50 MB took 132 MB), then took it
    # as a sample with one key more.
    trace = tmp_path / "trace.jsonl"
    line = json.dumps({"t": 60, "server": "a/", "note": "x" * 3_000_000})
    trace.write_text('{"t": 0, "server": "a/"}\n' + line + "\n")
    result = cli("-", stdin=trace.read_text()) if stdin else cli(str(trace))
    assert result.returncode == 2, result.stderr[-300:]
    assert "line 2: longer than 1,048,576 characters" in result.stderr
    assert len(result.stderr) < 500


def test_an_error_quoting_a_value_of_megabytes_shows_its_start(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"t": 0, "server": "a/", "gpu_sm": "y" * 1_000_000}) + "\n")
    result = cli(str(trace))
    assert result.returncode == 2
    assert "line 1: field 'gpu_sm': expected a number, got 'yyy" in result.stderr
    assert "more characters)" in result.stderr and len(result.stderr) < 2500


def test_a_trace_piped_in_is_read_as_a_file_is_in_bounded_memory(tmp_path, monkeypatch, capsys):
    """``replay -`` kept every line of standard input (a month's trace piped in is gigabytes):
    it is copied to a temporary file, a piece at a time, and streamed twice as a file is, with
    the same answers."""
    import tracemalloc

    from jupyter_gpu_gov import cli as command

    path = tmp_path / "trace.jsonl"  # 20,000 samples, 2 MB
    with path.open("w") as file:
        for t in range(0, 400 * 60, 60):
            for s in range(50):
                row = {"t": t, "server": f"u{s}/", "gpu_sm": 0.0 if s % 5 else 0.5}
                file.write(json.dumps({**row, "gpu_mem_mb": 100, "profile": "gpu"}) + "\n")

    def replayed(argument: str, source: Path = path) -> tuple[int, str, str]:
        with open(source) as stdin, open(tmp_path / "out", "w") as out:
            monkeypatch.setattr("sys.stdin", stdin)
            monkeypatch.setattr("sys.stdout", out)
            status = command.main(["replay", argument])
        return status, (tmp_path / "out").read_text(), capsys.readouterr().err

    small = tmp_path / "small.jsonl"  # (imports, caches: not measured)
    small.write_text(path.read_text().split("\n", 1)[0] + "\n")
    replayed("-", small)
    tracemalloc.start()
    try:
        piped = replayed("-")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert piped == replayed(str(path)) and piped[0] == 0 and piped[1].count('"cull"') == 40
    assert peak < 1_500_000, f"{peak / 1e6:.1f} MB"  # before: 3.3 MB (0.33 MB now)


def test_bad_policy_names_the_entry_and_the_key(config):
    path = config('c.GpuGovernor.policies = [{"name": "tier-a"}, {"name": "short", "cul": 1}]')
    with pytest.raises(PolicyError, match=r"policy 1 \('short'\): unknown key 'cul'"):
        policies_from_config(str(path))


# -- the command line ---------------------------------------------------------------------------


def test_cli_prints_actions_and_summary(tmp_path):
    out = tmp_path / "summary.json"
    result = cli(str(TRACES / "zombie_open_tab.jsonl"), "--summary-json", str(out))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [set(line) for line in lines] == [{"t", "server", "action", "reason"}] * 3
    assert [(line["t"], line["action"]) for line in lines] == [
        (1800, "warn"),
        (3600, "checkpoint"),
        (4200, "cull"),
    ]
    summary = json.loads(result.stderr.splitlines()[-1])
    assert summary == json.loads(out.read_text())
    assert (summary["by"], summary["culls"], summary["warnings"]) == ("policy", 1, 1)


def test_cli_baseline_and_stdin():
    trace = (TRACES / "background_training.jsonl").read_text()
    result = cli("-", "--baseline", "idle-culler", "--timeout", "2h", stdin=trace)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["t"] for line in result.stdout.splitlines()] == [7200]
    summary = json.loads(result.stderr.splitlines()[-1])
    assert (summary["by"], summary["servers"], summary["false_culls"]) == ("idle-culler", 1, 1)


def test_cli_malformed_trace_prints_nothing_and_exits_2(tmp_path):
    trace = tmp_path / "bad.jsonl"
    good = (TRACES / "zombie_open_tab.jsonl").read_text().splitlines()
    trace.write_text("\n".join([*good[:-1], '{"t": 99999, "server": "alice/", "gpu_sm": "x"}']))
    result = cli(str(trace))
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"line {len(good)}" in result.stderr and "gpu_sm" in result.stderr


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_cli_a_trace_that_is_not_utf8_names_its_line(tmp_path, source):
    """A trace saved as Latin-1 (``josé`` as one byte): the line and column are named, exit 2,
    nothing printed; once a traceback."""
    good = (TRACES / "zombie_open_tab.jsonl").read_bytes().splitlines()
    latin1 = '{"t": 0, "server": "jos\xe9/"}'.encode("latin-1")
    trace = b"\n".join([*good[:2], latin1, *good[2:]]) + b"\n"
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(trace)
    args = [str(path)] if source == "file" else ["-"]
    result = subprocess.run(
        [*CLI, "replay", *args],
        input=trace if source == "stdin" else None,
        capture_output=True,
        timeout=60,
    )
    stderr = result.stderr.decode()
    assert (result.returncode, result.stdout) == (2, b""), stderr
    assert "line 3, character 24: not UTF-8 (byte 0xe9)" in stderr and "Traceback" not in stderr, (
        stderr
    )


def test_cli_bad_policy_exits_2(config):
    path = config(
        'c.GpuGovernor.policies = [{"name": "short", "warn_after": "2h", "cull_after": "1h"}]'
    )
    result = cli(str(TRACES / "zombie_open_tab.jsonl"), "--config", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "policy 0 ('short')" in result.stderr and "'cull_after'" in result.stderr


def test_a_server_without_a_tier_label_is_matched_as_the_service_matches_it(tmp_path, config):
    """The service reads a server with no grant as on the tier its ``profile`` names, labelled
    with its team and tier (``hub/ownership.py``); a replay read its tier from the label alone,
    so a trace written with ``profile`` (architecture.md's example) never matched a policy on
    ``tiers`` or on those labels: what-if predicted nothing for a candidate that the apply then
    enforced."""
    path = config(
        "c.GpuGovernor.policies = ["
        '{"name": "tier-a", "match": {"tiers": ["A"]}, "max_age": "3h"},'
        '{"name": "vision", "match": {"labels": {"gpu-gov/team": "vision"}}, "max_age": "2h"}]'
    )
    trace = tmp_path / "profiles.jsonl"
    rows = (TRACES / "max_age.jsonl").read_text()
    rows = rows.replace('"labels": {"gpu-gov/tier": "A"}', '"profile": "A", "labels": {}')
    rows = rows.replace('"labels": {"gpu-gov/tier": "C"}', '"team": "vision", "labels": {}')
    trace.write_text(rows)
    actions = list(replay(read_trace(str(trace)), policies_from_config(str(path))))
    assert steps(actions) == [
        (3600, "jo/", "warn"),
        (7200, "ian/", "warn"),
        (7200, "jo/", "checkpoint"),
        (7800, "jo/", "cull"),
        (10800, "ian/", "checkpoint"),
        (11400, "ian/", "cull"),
    ]
