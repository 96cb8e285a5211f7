"""Root-cause diagnosis: rules, windows, the simulator, the counterfactual model (the CI
evaluation on a simulated set), fragmentation and ``jupyter-gpu-gov diagnose``."""

from __future__ import annotations

import csv
import io
import json
import math
import pickle
import random
import re
import statistics
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_gpu_gov.cli import EXIT_USAGE, main
from jupyter_gpu_gov.diagnose import faults, rules
from jupyter_gpu_gov.diagnose.cluster import (
    CostLedger,
    Demand,
    card_shares,
    fragmentation,
    fragmentation_report,
    mig_share,
    placement,
)
from jupyter_gpu_gov.diagnose.counterfactual import Diagnoser, Params
from jupyter_gpu_gov.diagnose.features import (
    COLUMNS,
    CONTEXT_COLUMNS,
    CONTEXT_ROW,
    FEATURES,
    Window,
    in_context,
    is_running,
    parse_value,
    read_windows,
    to_vector,
    windows_from_report,
    with_context,
    with_packed_context,
)
from jupyter_gpu_gov.diagnose.labels import HINTS, LABELS, UNCERTAIN, UNKNOWN, diagnosis
from jupyter_gpu_gov.diagnose.reference import kind_of

IDLE = rules.ZOMBIE_IDLE_S


def w(**values) -> Window:
    base = {"node": "h100-sxm", "server": "alice/", "t": 60.0, "kernel_busy": True}
    return Window(**{**base, **values})


# -- rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values, label",
    [
        ({"sm_active": None, "gpu_mem_frac": 0.5}, "unknown"),
        # zombie: memory held, no GPU work, nobody for a while, kernel idle
        (
            {"sm_active": 0.0, "gpu_mem_frac": 0.3, "user_idle_s": IDLE, "kernel_busy": False},
            "zombie",
        ),
        (
            {"sm_active": 0.0, "gpu_mem_frac": 0.01, "user_idle_s": 9e4, "kernel_busy": False},
            "zombie",
        ),
        # ... every part must be known and true
        (
            {"sm_active": 0.0, "gpu_mem_frac": 0.3, "user_idle_s": IDLE - 1, "kernel_busy": False},
            "healthy",
        ),
        (
            {"sm_active": 0.0, "gpu_mem_frac": 0.3, "user_idle_s": None, "kernel_busy": False},
            "healthy",
        ),
        (
            {"sm_active": 0.0, "gpu_mem_frac": None, "user_idle_s": 9e4, "kernel_busy": False},
            "healthy",
        ),
        (
            {"sm_active": 0.0, "gpu_mem_frac": 0.0, "user_idle_s": 9e4, "kernel_busy": False},
            "healthy",
        ),
        # "no GPU work" tolerates a few percent of SM noise (an idle card reads 1-2.5 %)
        (
            {"sm_active": 0.03, "gpu_mem_frac": 0.3, "user_idle_s": 9e4, "kernel_busy": False},
            "zombie",
        ),
        (
            {"sm_active": 0.08, "gpu_mem_frac": 0.3, "user_idle_s": 9e4, "kernel_busy": False},
            "healthy",
        ),
        (
            {
                "sm_active": 0.0,
                "gpu_mem_frac": 0.3,
                "user_idle_s": 9e4,
                "kernel_busy": None,
                "cpu_cores": 0.0,
            },
            "small_work",
        ),
        # memory-bound: DRAM busy while the SMs are below 0.8
        ({"sm_active": 0.6, "dram_active": 0.55}, "memory_bandwidth"),
        ({"sm_active": 0.85, "dram_active": 0.7}, "healthy"),
        ({"sm_active": 0.6, "dram_active": 0.4}, "healthy"),
        # low GPU: I/O wait, then a saturated core, then little memory
        ({"sm_active": 0.3, "cpu_iowait": 0.35, "cpu_cores": 1.0}, "data_io"),
        ({"sm_active": 0.3, "cpu_iowait": 0.1, "cpu_cores": 1.0}, "cpu_serial"),
        (
            {"sm_active": 0.3, "cpu_iowait": None, "cpu_cores": 0.95, "gpu_mem_frac": 0.2},
            "cpu_serial",
        ),
        (
            {"sm_active": 0.3, "cpu_iowait": 0.0, "cpu_cores": 0.5, "gpu_mem_frac": 0.2},
            "small_work",
        ),
        ({"sm_active": 0.3, "cpu_iowait": 0.0, "cpu_cores": 0.5, "gpu_mem_frac": 0.9}, "healthy"),
        ({"sm_active": 0.3}, "healthy"),  # nothing to point at
    ],
)
def test_baseline_rules(values, label):
    result = rules.baseline(w(**values))
    assert result.label == label
    assert result.source == "rules"
    assert result.hint == HINTS[label]
    assert result.contributions == {}


def test_the_strict_gate_reads_gpu_below_ten_percent():
    window = w(sm_active=0.3, cpu_iowait=0.5, cpu_cores=0.5)
    assert rules.baseline(window).label == "data_io"
    assert rules.baseline(window, low_gpu=rules.LOW_GPU_STRICT).label == "healthy"
    assert rules.baseline(w(sm_active=0.05, cpu_iowait=0.5), low_gpu=0.1).label == "data_io"


def test_every_label_has_a_hint_and_only_healthy_unknown_and_uncertain_have_none():
    for label in (*LABELS, "fragmentation", UNKNOWN, UNCERTAIN):
        assert (HINTS[label] == "") == (label in ("healthy", UNKNOWN, UNCERTAIN))


# -- windows -------------------------------------------------------------------------------------

CSV = """node,server,t,sm_active,dram_active,tensor_active,pcie_mb_s,gpu_mem_frac,cpu_cores,cpu_iowait,read_mb_s,kernel_busy,user_idle_s,truth
n1,alice/,60,0.2,,,,0.5,0.4,0.5,30,true,10,data_io
n1,bob/x,60,0.0,0.0,0.0,0.1,0.3,0.0,0.0,0.0,FALSE,7200,zombie
n1,carol/,60,,,,,,,,,1,,unknown
"""


def test_read_csv_with_missing_values_booleans_and_unknown_columns(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text(CSV)
    rows = read_windows(path)
    assert [r.server for r in rows] == ["alice/", "bob/x", "carol/"]
    assert rows[0] == Window(
        "n1", "alice/", 60.0, 0.2, None, None, None, 0.5, 0.4, 0.5, 30.0, True, 10.0
    )
    assert rows[1].kernel_busy is False and rows[1].user_idle_s == 7200.0
    assert rows[2].sm_active is None and rows[2].kernel_busy is True
    vector = to_vector(rows[0])
    assert len(vector) == len(FEATURES) and math.isnan(vector[0])
    assert vector[FEATURES.index("kernel_busy")] == 1.0


def test_read_jsonl_and_by_content(tmp_path):
    lines = [
        {"node": "n1", "server": "a/", "t": 1, "sm_active": 0.5, "kernel_busy": True, "x": [1]},
        {"server": "b/", "sm_active": None, "kernel_busy": 0},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n\n"
    path = tmp_path / "windows.txt"  # no extension: told by the first character
    path.write_text(text)
    rows = read_windows(path)
    assert rows[0].sm_active == 0.5 and rows[0].kernel_busy is True
    assert rows[1] == Window(server="b/", kernel_busy=False)
    assert read_windows(io.StringIO(text)) == rows


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_jsonl_lines_end_at_newline_alone(tmp_path, separator):
    """JSON Lines ends a line at \\n alone: a JSON string may hold a line or paragraph
    separator or NEL raw (JSON escapes none of them; ``ensure_ascii=False`` writers leave them
    as they are), and a row of such a file was cut in two there ("line 1: not JSON"). A CRLF
    still ends a line (its CR is JSON's whitespace)."""
    row = {"node": "n1", "server": f"a{separator}b/", "sm_active": 0.5}
    text = json.dumps(row, ensure_ascii=False) + "\r\n" + json.dumps({"server": "c/"}) + "\n"
    path = tmp_path / "other-tool.jsonl"
    path.write_text(text, encoding="utf-8", newline="")
    expected = [Window(node="n1", server=f"a{separator}b/", sm_active=0.5), Window(server="c/")]
    assert read_windows(path) == expected
    assert read_windows(io.StringIO(text)) == expected


def test_files_written_by_other_tools_read_the_same(tmp_path):
    """What spreadsheets, pandas and csv.writer write: a byte-order mark, capitalised headers,
    ``nan``/``NA``/``null`` for a missing value, ``True``, ISO times; in JSON Lines ``NaN`` and a
    numbered node; a flag as ``1.0``, ``t`` or ``busy``. Each reads as the plain file does."""
    plain = "node,server,t,sm_active,gpu_mem_frac,kernel_busy\nn1,a/,1796378400,,0.5,true\n"
    other = (
        "\ufeffNode, Server ,T,SM_Active,GPU_MEM_FRAC,Kernel_Busy\r\n"
        "n1,a/,2026-12-04T10:00:00Z,nan,0.5,True\r\n"
    )
    path = tmp_path / "excel.csv"
    path.write_bytes(other.encode("utf-8"))
    assert read_windows(path) == read_windows(io.StringIO(plain), name="plain.csv")
    for missing in ("NaN", "NA", "N/A", "null", "None", " "):
        text = f"server,sm_active,kernel_busy\na/,{missing},{missing}\n"
        assert read_windows(io.StringIO(text)) == [Window(server="a/")]
    jsonl = '{"node": 3, "server": "a/", "t": "2026-12-04T10:00:00", "sm_active": NaN}\n'
    assert read_windows(io.StringIO(jsonl)) == [Window(node="3", server="a/", t=1796378400.0)]
    # A flag as pandas (a column with gaps made numbers), SQL exports and Jupyter say it.
    for busy, idle in (("1.0", "0.0"), ("t", "f"), ("Y", "N"), ("busy", "idle")):
        text = f"server,kernel_busy\na/,{busy}\nb/,{idle}\n"
        assert [w.kernel_busy for w in read_windows(io.StringIO(text))] == [True, False]
    flags = '{"server": "a/", "kernel_busy": 1.0}\n{"server": "b/", "kernel_busy": 0.0}\n'
    assert [w.kernel_busy for w in read_windows(io.StringIO(flags))] == [True, False]


@pytest.mark.parametrize(
    "text, where",
    [
        ("server,sm_active\na/,0.5\nb/,x\n", "line 3, column sm_active: expected a number"),
        ("server,sm_active\na/,1.5\n", "line 2, column sm_active: must be in [0, 1]"),
        ("server,cpu_cores\na/,-1\n", "line 2, column cpu_cores: must be >= 0"),
        ("server,kernel_busy\na/,maybe\n", "line 2, column kernel_busy: expected true or false"),
        ("server,sm_active\na/,inf\n", "line 2, column sm_active: expected a finite number"),
        ("server,t\na/,yesterday\n", "line 2, column t: expected seconds since 1970 or an ISO"),
        ("a,b\n1,2\n", "line 1: no diagnosis columns"),
        ('{"sm_active": 0.1}\n{"sm_active": true}\n', "line 2, column sm_active"),
        ('{"server": 3.5}\n', "line 1, column server: expected a string"),
        ('{"sm_active": 0.1}\n[1]\n', "line 2: expected a JSON object"),
        ('{"sm_active": 0.1}\n{bad\n', "line 2: not JSON"),
        ('{"sm_active": 0.1}\n' + "[" * 100_000 + "\n", "line 2: not JSON (nested"),
        # JSON's numbers have no bound: one past a float's was an OverflowError's traceback.
        ('{"t": 1' + "0" * 400 + "}\n", "line 1, column t: expected a finite number"),
        ('{"sm_active": -1' + "0" * 400 + "}\n", "line 1, column sm_active: expected a finite"),
    ],
)
def test_a_bad_value_names_line_and_column(text, where):
    with pytest.raises(ValueError, match=None) as caught:
        read_windows(io.StringIO(text))
    assert where in str(caught.value)


REPORT = {
    "schema": 1,
    "sampled_at": "2026-01-05T09:00:00Z",
    "backend": "nvml",
    "server": {"user": "alice", "name": "", "last_activity": "2026-01-05T08:00:00Z"},
    "devices": [{"uuid": "GPU-a", "memory_total_mb": 80000, "activity": 0.3, "shared": False}],
    "targets": [
        {
            "kind": "kernel",
            "id": "3f5d0c55-0c1c-4a52-9c59-8e3f8f0bd1a1",
            "execution_state": "busy",
            "gpu": {"devices": ["GPU-a"], "memory_mb": 20000, "sm": 0.25, "holds_context": True},
            "cpu": {"cores": 1.02, "iowait": 0.05, "read_mb_s": 12.5, "seconds": 60},
        },
        {
            "kind": "terminal",
            "id": "t1",
            "gpu": {"devices": [], "memory_mb": 0, "sm": None, "holds_context": False},
            "cpu": {"cores": 3.0, "iowait": 0.9, "read_mb_s": 500},
        },
    ],
    "window": {"seconds": 60},
}


def test_a_window_from_a_report():
    [window] = windows_from_report(REPORT, None, 1767603600.0 + 60)
    assert window == Window(
        node=None,
        server="alice/",
        t=1767603660.0,
        sm_active=0.25,
        gpu_mem_frac=0.25,
        cpu_cores=1.02,
        cpu_iowait=0.05,
        read_mb_s=12.5,
        kernel_busy=True,
        user_idle_s=3660.0,
    )
    dcgm = {"dram_active": 0.2, "tensor_active": None, "pcie_mb_s": 40.0, "node": "gpu-7"}
    [window] = windows_from_report(REPORT, None, None, dcgm=dcgm)
    assert (window.node, window.dram_active, window.pcie_mb_s, window.t) == (
        "gpu-7",
        0.2,
        40.0,
        1767603600.0,
    )
    # DCGM's SM activity sees how many SMs the kernels fill: it replaces NVML's time share.
    dcgm = {"sm_active": 0.1, "gr_active": 0.3, "dram_active": None}
    [window] = windows_from_report(REPORT, None, None, dcgm=dcgm)
    assert (window.sm_active, window.gr_active) == (0.1, 0.3)
    [window] = windows_from_report(REPORT, None, None, dcgm={"sm_active": None})
    assert (window.sm_active, window.gr_active) == (0.25, None)


def test_memory_activity_stands_in_for_dram_activity_without_dcgm():
    """NVML's memory utilisation (``devices[].memory_activity``) is ``dram_active`` where DCGM
    says nothing; DCGM's DRAM activity wins where there is one; a shared device's says
    nothing about this server; MIG instances have none."""
    nvml = json.loads(json.dumps(REPORT))
    nvml["devices"][0]["memory_activity"] = 0.41
    nvml["devices"].append(
        {"uuid": "GPU-b", "memory_total_mb": 80000, "activity": 0.9, "memory_activity": 0.95}
    )  # not one the holders use
    [window] = windows_from_report(nvml)
    assert window.dram_active == 0.41
    [window] = windows_from_report(nvml, dcgm={"dram_active": 0.2, "sm_active": None})
    assert window.dram_active == 0.2
    [window] = windows_from_report(nvml, dcgm={"dram_active": None})
    assert window.dram_active == 0.41
    nvml["devices"][0]["shared"] = True
    assert windows_from_report(nvml)[0].dram_active is None
    nvml["devices"][0].update(shared=False, memory_activity=None, mig_profile="1g.10gb")
    assert windows_from_report(nvml)[0].dram_active is None
    # No holder, an allocated GPU: the unshared devices'.
    idle = json.loads(json.dumps(nvml))
    idle["server"]["gpu_allocated"] = True
    idle["targets"] = []
    assert windows_from_report(idle)[0].dram_active == 0.95


def test_a_report_through_validation_to_a_window_keeps_memory_activity():
    from test_report import report

    from jupyter_gpu_gov.core.report import validate

    valid = validate(report(devices__0__memory_activity=0.3, targets__0__gpu__sm=0.5))
    [window] = windows_from_report(valid)
    assert window.dram_active == 0.3 and window.sm_active == 0.5


def test_in_context_is_the_median_of_a_servers_last_running_windows():
    def at(t, server="a/", **values):
        base = {"sm_active": 0.5, "cpu_cores": 1.0, "kernel_busy": True, "user_idle_s": t}
        return w(server=server, t=float(t), **{**base, **values})

    rows = [
        at(60, sm_active=0.2, cpu_cores=3.0, cpu_iowait=0.1),
        at(60, server="b/", sm_active=0.9),  # another server: not in a/'s context
        at(120, sm_active=0.4, cpu_cores=None),
        at(180, sm_active=0.9, kernel_busy=False),  # idle: untouched, and no context
        at(240, sm_active=0.6, cpu_cores=2.0, user_idle_s=5.0),
        at(300, sm_active=0.8, cpu_cores=1.0, gpu_mem_frac=0.3),
        at(2000, sm_active=0.1),  # beyond the horizon: alone
        at(2060, sm_active=None),  # no GPU signal: untouched
    ]
    out = in_context(rows, k=3, horizon_s=600)
    assert out[0] == rows[0] and out[1] == rows[1]
    assert out[2].sm_active == pytest.approx(0.3) and out[2].cpu_cores == 3.0  # missing: left out
    assert out[2].cpu_iowait == 0.1
    assert out[3] == rows[3]
    assert out[4].sm_active == pytest.approx(0.4) and out[4].cpu_cores == 2.5
    assert out[4].user_idle_s == 5.0 and out[4].kernel_busy is True  # the window's own
    assert out[5].sm_active == pytest.approx(0.6) and out[5].cpu_cores == 1.5  # last three
    assert out[5].gpu_mem_frac == 0.3
    assert out[6] == rows[6] and out[7] == rows[7]
    assert in_context(rows, k=1) == rows
    # Causal: a window reads only earlier ones, so scoring it online (with the windows before
    # it) gives what the file gives, and later rows change nothing.
    assert with_context(rows[5], rows[:5], 3, 600) == out[5]
    assert in_context(rows[:6], k=3, horizon_s=600) == out[:6]
    # A later window listed earlier does not count.
    assert with_context(rows[2], [rows[5]], 3, 600) == rows[2]
    # A file in another row order (newest first, by server) reads each window as in time order.
    shuffled = [rows[i] for i in (7, 5, 1, 3, 0, 6, 4, 2)]
    assert in_context(shuffled, k=3, horizon_s=600) == [out[i] for i in (7, 5, 1, 3, 0, 6, 4, 2)]


def test_the_context_read_from_packed_numbers_is_the_windows_context():
    """The service keeps a server's last running windows as numbers (``CONTEXT_ROW``) and reads
    a report's window with them (``with_packed_context``): the window ``with_context`` reads
    with the windows themselves, value for value, whatever the times, gaps and missing values."""
    rng = random.Random(36)

    def value():
        return rng.choice([None, 0.0, 1.0, 0.25, 0.5, rng.random(), rng.random() * 40])

    for _ in range(3000):
        earlier = []
        t = 1000.0
        for _ in range(rng.randint(0, 6)):
            t += rng.choice([-30.0, 0.0, 30.0, 60.0, 60.0, 700.0])
            columns = {c: value() for c in CONTEXT_COLUMNS}
            earlier.append(w(server="a/", t=t, kernel_busy=True, **{**columns, "sm_active": 0.5}))
        now = t + rng.choice([-60.0, 0.0, 60.0, 60.0, 650.0])
        columns = {c: value() for c in CONTEXT_COLUMNS}
        window = w(server=rng.choice(["a/", None]), t=rng.choice([now, now, None]), **columns)
        window = replace(window, kernel_busy=rng.choice([True, None, False]))
        numbers = [
            math.nan if (v := getattr(e, c)) is None else v for e in earlier for c in CONTEXT_ROW
        ]
        k, horizon = rng.choice([1, 2, 3, 4, 4, 6]), rng.choice([120.0, 600.0])
        expected = with_context(window, earlier, k, horizon)
        read = with_packed_context(window, numbers, k, horizon)
        assert vars(read) == vars(expected)
        assert (read is window) == (expected is window)


def test_windows_from_reports_that_say_less():
    assert windows_from_report(REPORT, REPORT) == []  # the same report again: no new window
    assert windows_from_report({**REPORT, "backend": "none", "targets": []}) == []
    no_gpu = json.loads(json.dumps(REPORT))
    no_gpu["targets"][0]["gpu"]["holds_context"] = False
    assert windows_from_report(no_gpu) == []  # holds no GPU, none allocated
    unknown = json.loads(json.dumps(REPORT))
    unknown["targets"][0]["gpu"]["sm"] = None
    unknown["targets"][0]["cpu"] = {"percent": 2.0, "iowait": 0.0}  # an older server's
    [window] = windows_from_report(unknown)
    assert window.sm_active is None and window.cpu_cores is None
    [window] = windows_from_report({**REPORT, "backend": "unavailable"})
    assert window.sm_active is None


# -- the simulator -------------------------------------------------------------------------------


def test_the_simulator_is_deterministic_by_seed():
    assert faults.generate(12, 20, seed=5) == faults.generate(12, 20, seed=5)
    assert faults.generate(12, 20, seed=5) != faults.generate(12, 20, seed=6)


def test_the_simulator_covers_every_label_with_missing_values():
    rows = faults.generate(84, 20, seed=2)
    truths = Counter(t for _, t in rows)
    assert set(LABELS) <= set(truths)
    per_server = Counter(dict((x.server, t) for x, t in rows if t != UNKNOWN).values())
    assert set(per_server.values()) == {14}  # 84 servers, six scenarios in equal numbers
    for column in COLUMNS[3:-1]:  # cpu_top_thread: newer than the simulator
        values = [getattr(window, column) for window, _ in rows]
        assert any(v is None for v in values), f"{column} is never missing"
        assert any(v is not None for v in values)
    assert all(t == UNKNOWN for window, t in rows if window.sm_active is None)
    nodes = {n.name: n for n in faults.NODES}
    for window, _ in rows:
        node = nodes[window.node]
        if not node.dcgm:  # NVML's memory utilisation stands in for DRAM activity
            assert window.gr_active is None and window.pcie_mb_s is None
        if not node.iowait:
            assert window.cpu_iowait is None


def test_no_single_feature_separates_a_fault_label():
    """No column alone separates a label: the best one-threshold split on one column, chosen
    *with* the labels (either direction, over the windows where the column is known), stays
    below 95 % balanced accuracy for every label (measured: 0.86-0.93 at best here, see
    docs/benchmarks-history.md; 120 servers: with 60, ten per label, one chance draw of memory sizes
    decides the small_work figure)."""
    rows = [(w_, t) for w_, t in faults.generate(120, 30, seed=3) if t not in (UNKNOWN,)]
    running = [(w_, t) for w_, t in rows if w_.kernel_busy is not False]
    for label in ("healthy", "data_io", "cpu_serial", "memory_bandwidth", "small_work"):
        best = 0.0
        for column in ("sm_active", *FEATURES):
            pairs = [(getattr(w_, column), t == label) for w_, t in running]
            pairs = [(float(v), y) for v, y in pairs if v is not None]
            positives = sum(y for _, y in pairs)
            negatives = len(pairs) - positives
            pairs.sort()
            seen_pos = seen_neg = 0
            for k, (value, y) in enumerate(pairs):
                seen_pos += y
                seen_neg += not y
                if k + 1 < len(pairs) and pairs[k + 1][0] == value:
                    continue  # a threshold falls between distinct values only
                low = (seen_pos / positives + (negatives - seen_neg) / negatives) / 2
                best = max(best, low, 1 - low)
        assert best < 0.95, (label, best)


def test_the_simulator_command_line(capsys):
    assert faults.main(["--servers", "6", "--windows", "3", "--seed", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 18
    row = json.loads(lines[0])
    assert set(row) == {*COLUMNS, "truth"}
    assert faults.main(["--servers", "2", "--windows", "2", "--format", "csv"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == ",".join([*COLUMNS, "truth"])
    assert len(read_windows(io.StringIO(text), name="x.csv")) == 4


@pytest.mark.parametrize("world", ["traces", "degraded", "sixteen"])
def test_the_second_rounds_worlds(world):
    """Deterministic by seed; every label; ``unknown`` wherever the GPU signal is missing; and
    what each world's docstring says of its measurement."""
    from benchmarks import worlds

    module = getattr(worlds, world)
    rows = module.generate(36, 20, 4)
    assert rows == module.generate(36, 20, 4) and rows != module.generate(36, 20, 5)
    assert set(LABELS) <= {t for _, t in rows}
    assert all(t == UNKNOWN for x, t in rows if x.sm_active is None)
    assert {x.node for x, _ in rows} <= {n.name for n in module.NODES}
    assert [x.t for x, _ in rows] == sorted(x.t for x, _ in rows)
    if world == "sixteen":  # the base columns only
        assert all(x.gr_active is None and x.cpu_top_thread is None for x, _ in rows)
    if world == "degraded":
        assert all(x.cpu_cores is None or x.cpu_cores <= 1.0 for x, _ in rows if "1vcpu" in x.node)
        for column in ("dram_active", "cpu_cores", "user_idle_s", "gr_active"):
            assert any(getattr(x, column) is None for x, _ in rows), column
        assert any(x.kernel_busy is None for x, _ in rows)  # terminals


def test_a_worlds_truth_follows_the_written_label_meanings():
    """docs/api.md "What each label means", on one of the worlds round four relabelled: decoding
    the input is ``data_io`` whoever runs it (workers, or the main thread with
    ``num_workers=0``); the loop's own Python is ``cpu_serial``; a launch-bound loop is
    ``small_work`` even where its kernels fill the SMs."""
    import random
    from dataclasses import replace as evolve

    from benchmarks.worlds import contention

    node, env = contention.NODES[0], contention.Env(thread=1.0, cap=64.0, storage=1.0)
    job = evolve(contention._job(random.Random(1), "healthy", node), t_gpu=50.0, fill=0.9,
                 kernels=100, launch_us=10.0, python_ms=1.0, workers=4, decode_ms=10.0)  # fmt: skip

    def limiter(**changes) -> str:
        return contention._step(evolve(job, **changes), node, env, cached=True)["limiter"]

    assert contention._step(job, node, env, cached=True)["busy"] > contention.FED
    assert limiter(workers=0, decode_ms=200.0) == "data_io"
    assert limiter(workers=2, decode_ms=800.0) == "data_io"
    assert limiter(python_ms=200.0) == "cpu_serial"
    assert limiter(kernels=20_000) == "small_work"  # 200 ms of launches for 50 ms of kernels


# -- the counterfactual model --------------------------------------------------------------------


# The CI leave-one-out check's worlds, and the floors each must keep (accuracy over answered
# windows, coverage, zombie recall) with the shipped constants, online, on a 60-server set —
# measured (2026-12-02, round five: model format 8, each NVML node's DRAM ceiling):
# roofline 0.88/0.87, fleet 0.85/0.87, pipeline 0.89/0.92, traces 0.68/0.93, degraded 0.73/0.95
# (its zombies 0.90: a missing memory or presence column is never a zombie), sixteen 0.94/0.80,
# contention 0.85/0.91 (0.92/0.92 before its decode-bound loaders were data_io), H200 0.98/0.86.
# Short of the targets on small sets whose nodes are young (docs/benchmarks-history.md has the full
# sets and says by how much).
HELD_OUT = {
    "roofline": (0.85, 0.85, 0.97),
    "fleet": (0.78, 0.78, 0.97),
    "pipeline": (0.81, 0.86, 0.97),
    "traces": (0.62, 0.85, 0.97),
    "degraded": (0.66, 0.88, 0.85),
    "sixteen": (0.88, 0.75, 0.97),
    "contention": (0.8, 0.85, 0.97),
}
# With the base columns alone (no gr_active, no cpu_top_thread), measured: roofline 0.79/0.89,
# fleet 0.75/0.81, pipeline 0.81/0.90, traces 0.63/0.85, degraded 0.68/0.94, sixteen the same,
# contention 0.81/0.89.
BASE_COLUMNS_FLOOR = 0.6
# Answers said surely (confidence 0.85 or more, zombies apart, as ``--calibration`` counts)
# right at least this often on every set: measured (round thirteen, ``cpu_serial`` at most
# ``residual`` sure) roofline 0.89, fleet 0.91, pipeline 0.84, traces 0.94, degraded 0.91,
# sixteen 1.0, contention 0.88, H200 1.0 (before it: traces 0.85, degraded 0.88).
SURE_FLOOR = 0.83


@pytest.fixture(scope="module")
def held_out():
    """The CI leave-one-out check: the shipped constants (``Params()``, set from physics, chosen
    on no world) scored online — windows in time order, each node learnt from its first
    windows — on worlds written apart from the model and from each other, with every column
    and with the base columns alone, and on the windows measured on an H200. ``python -m
    benchmarks.diagnose`` runs the full table."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    out = {}
    for world in HELD_OUT:
        rows = generate(world, 60, 30, 101)
        said = bench.online(rows, Params())
        out[world] = bench.figures(rows, said)
        out[world, "sure"] = bench.calibration(rows, said)[bench.BANDS[-2], bench.BANDS[-1]]
        design = bench.design_columns(rows)
        out[world, "design"] = bench.figures(design, bench.online(design, Params()))
    rows = bench.h200_rows()
    said = bench.online(rows, Params(), min_node_windows=10)
    out["h200"] = bench.figures(rows, said)
    out["h200", "sure"] = bench.calibration(rows, said)[bench.BANDS[-2], bench.BANDS[-1]]
    return out


def test_held_out_worlds_and_the_h200(held_out):
    for world, (accuracy, coverage, zombies) in HELD_OUT.items():
        f = held_out[world]
        assert f["zombie_recall"] >= zombies, (world, f)
        assert f["healthy_as_zombie"] <= 0.01, (world, f)
        assert f["coverage"] >= coverage and f["accuracy"] >= accuracy, (world, f)
        design = held_out[world, "design"]
        assert design["accuracy"] >= BASE_COLUMNS_FLOOR and design["healthy_as_zombie"] <= 0.01
        right, sure = held_out[world, "sure"]
        assert right >= SURE_FLOOR * sure, (world, right, sure)  # a sure answer means it
    h200 = held_out["h200"]
    assert h200["accuracy"] >= 0.92 and h200["coverage"] >= 0.8
    assert h200["zombie_recall"] == 1.0 and h200["healthy_as_zombie"] == 0.0
    right, sure = held_out["h200", "sure"]
    assert sure and right == sure


def test_the_confusion_matrix_puts_every_window_in_its_cell(capsys):
    """``benchmarks.diagnose --confusion`` prints each set's (truth, answer) counts: every
    labelled window in exactly one cell, the right answers on the diagonal."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    bench.main(["--tune-on", "--confusion", "--worlds", "sixteen", "--servers", "8",
                "--windows", "10"])  # fmt: skip
    out = capsys.readouterr().out
    table = out.split("\nsixteen (rows: truth; columns: answer)\n")[1].split("\n\n")[0]
    header, *lines = table.splitlines()
    answers = header.split()
    counts = {}
    for line in lines:
        truth, *cells = line.split()
        counts[truth] = dict(zip(answers, map(int, cells), strict=True))
    rows = generate("sixteen", 8, 10, 101, first_server=50_000)
    truths = Counter(truth for _, truth in rows)
    assert {k: sum(v.values()) for k, v in counts.items()} == {k: truths[k] for k in LABELS}
    f = bench.figures(rows, bench.online(rows, Params()))
    right = sum(counts[k].get(k[:10], 0) for k in LABELS)
    assert right == round(f["strict"] * f["windows"])
    assert "h200 (rows: truth; columns: answer)" in out


def test_a_constant_set_on_the_command_line_scores_the_shipped_row_with_it(capsys):
    """``benchmarks.diagnose --set NAME=VALUE``: the shipped row is the model with that constant
    changed (a round's change measured as the shipped one is), the output says so, and a name
    that is not a constant, or a value that is not a number, is refused by name."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    argv = ["--tune-on", "--worlds", "sixteen", "--servers", "8", "--windows", "10"]
    bench.main([*argv, "--set", "confident=0.45", "launch_time=0.1"])
    out = capsys.readouterr().out
    assert "shipped row with confident=0.45, launch_time=0.1" in out
    rows = generate("sixteen", 8, 10, 101, first_server=50_000)
    changed = bench.figures(rows, bench.online(rows, Params(confident=0.45, launch_time=0.1)))
    shipped = bench.figures(rows, bench.online(rows, Params()))
    assert changed["coverage"] > shipped["coverage"]  # fewer windows left uncertain
    row = next(line for line in out.splitlines() if line.startswith("physical (shipped)"))
    accuracy, coverage = re.findall(r"(\d+\.\d)/\s*(\d+\.\d)", row)[0]  # the sixteen cell
    assert (float(accuracy), float(coverage)) == (
        round(changed["accuracy"] * 100, 1),
        round(changed["coverage"] * 100, 1),
    )
    for bad in ("confidence=0.4", "confident", "confident=nan", "confident=x"):
        with pytest.raises(SystemExit) as stopped:
            bench.main([*argv, "--set", bad])
        assert stopped.value.code == 2
        assert repr(bad) in capsys.readouterr().err


def test_draws_score_a_change_on_the_same_windows_and_say_whether_it_passes_the_rule(capsys):
    """``benchmarks.diagnose --set NAME=VALUE --draws SEED ...``: every world's test set of each
    seed, and the H200 windows once, scored with the physical constants and with the change on
    the same windows; a set where accuracy or coverage falls 0.3 points (as printed) is marked,
    and the verdict names it; a change that loses nowhere is kept."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    argv = ["--tune-on", "--worlds", "roofline", "--servers", "20", "--windows", "20"]
    bench.main([*argv, "--set", "waiting=0.5", "--draws", "1", "2"])
    out = capsys.readouterr().out
    section = out.split("## each draw, the same windows")[1].split("\n## ")[0]
    assert "with waiting=0.5" in section.splitlines()[0]
    lines = [line for line in section.splitlines() if line.startswith(("roofline ", "h200 "))]
    assert [line.split()[:2] for line in lines] == [
        ["roofline", "101"], ["roofline", "102"], ["h200", "98.6/"],
    ]  # fmt: skip
    for line, seed in zip(lines, (101, 102), strict=False):
        rows = generate("roofline", 20, 20, seed, first_server=50_000)
        before = bench.figures(rows, bench.online(rows, Params()))
        after = bench.figures(rows, bench.online(rows, Params(waiting=0.5)))
        printed = [float(x) for x in re.findall(r"(\d+\.\d)/\s*(\d+\.\d)", line)[1]]
        assert printed == [round(after["accuracy"] * 100, 1), round(after["coverage"] * 100, 1)]
        assert line.endswith("!") == bool(bench.losses(before, after))
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: not kept: roofline 101: coverage")
    # the rule itself: 0.3 points lost as printed is a loss, 0.2 is not; zombies never
    shipped = {"accuracy": 0.9, "coverage": 0.9, "zombie_recall": 1.0, "healthy_as_zombie": 0.0}
    assert bench.losses(shipped, {**shipped, "coverage": 0.8975}) == []  # 90.0 -> 89.8 (rounded)
    assert bench.losses(shipped, {**shipped, "coverage": 0.897}) == ["coverage"]
    assert bench.losses(shipped, {**shipped, "zombie_recall": 0.99}) == ["zombie recall"]
    assert bench.losses(shipped, {**shipped, "healthy_as_zombie": 0.011}) == [
        "healthy called zombie"
    ]
    bench.main([*argv, "--set", "confident=0.55", "--draws", "1"])  # the shipped value
    assert "verdict: kept by the rule" in capsys.readouterr().out


def test_the_start_up_split_counts_each_servers_first_running_windows():
    """``benchmarks.diagnose --startup`` scores each server's first running windows (its
    start-up) apart from the rest: every labelled window in one part, and the start-up part
    exactly the first ``STARTUP`` running windows of each server."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    rows = generate("fleet", 12, 10, 101)
    parts = bench.startup_split(rows, bench.online(rows, Params()))
    running = Counter((w.node, w.server) for w, truth in rows if is_running(w) and truth != UNKNOWN)
    assert parts["start-up"]["windows"] == sum(min(n, bench.STARTUP) for n in running.values())
    everything = bench.figures(rows, bench.online(rows, Params()))
    assert parts["start-up"]["windows"] + parts["rest"]["windows"] == everything["windows"]


def test_calibration_counts_each_answer_in_its_band_of_confidence(capsys):
    """``benchmarks.diagnose --calibration``: every answered window but the zombies in exactly
    one band of confidence, its right answers counted there, and the uncertain ones apart."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    rows = generate("traces", 12, 20, 101)
    said = bench.online(rows, Params())
    bands = bench.calibration(rows, said)
    kept = [
        (truth, d)
        for (_, truth), d in zip(rows, said, strict=True)
        if truth not in (UNKNOWN, "zombie") and d.label not in (UNKNOWN, "zombie")
    ]
    answered = [(truth, d) for truth, d in kept if d.label != UNCERTAIN]
    assert list(bands) == [(Params().confident, 0.7), (0.7, 0.85), (0.85, 1.0), "uncertain"]
    assert sum(n for band, (_, n) in bands.items() if band != "uncertain") == len(answered)
    assert sum(r for band, (r, _) in bands.items() if band != "uncertain") == sum(
        d.label == truth for truth, d in answered
    )
    sure = [(truth, d) for truth, d in answered if d.confidence >= 0.85]
    assert bands[(0.85, 1.0)] == (sum(d.label == truth for truth, d in sure), len(sure))
    assert bands["uncertain"][1] == len(kept) - len(answered)
    bench.main(["--tune-on", "--calibration", "--worlds", "traces", "--servers", "8",
                "--windows", "10"])  # fmt: skip
    assert "\ntraces      0.55-0.70 " in capsys.readouterr().out


def test_abstentions_count_each_uncertain_window_and_answer_as_a_lower_threshold(capsys):
    """``benchmarks.diagnose --abstentions``: every uncertain window in one candidate pair, its
    likelier candidate counted right when it is the truth, the young nodes' share from the
    node's maturity at the time; and answering the likelier candidate down to a confidence is
    exactly the model with ``Params.confident`` lowered there."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    rows = generate("fleet", 30, 20, 101)
    maturity: list = []
    said = bench.online(rows, Params(), maturity=maturity)
    assert said == bench.online(rows, Params())  # recording maturity changes no answer
    assert len(maturity) == len(rows) and all(0.0 <= m <= 1.0 for m in maturity)
    found = bench.abstentions(rows, said, maturity)
    uncertain = [
        (truth, d, m)
        for (_, truth), d, m in zip(rows, said, maturity, strict=True)
        if truth != UNKNOWN and d.label == UNCERTAIN
    ]
    assert uncertain and found["uncertain"] == len(uncertain)
    assert sum(sum(truths.values()) for truths, _ in found["pairs"].values()) == len(uncertain)
    assert found["likelier_right"] == sum(d.cause == truth for truth, d, _ in uncertain)
    assert found["young"] == sum(m < 1.0 for _, _, m in uncertain)
    for lowest in (0.45, 0.0):
        lowered = bench.online(rows, Params(confident=lowest))
        assert found["frontier"][lowest] == bench.figures(rows, lowered)
    assert found["frontier"][0.0]["coverage"] == 1.0
    bench.main(["--tune-on", "--abstentions", "--worlds", "fleet", "--servers", "8",
                "--windows", "10"])  # fmt: skip
    assert "answered down to 0.50: " in capsys.readouterr().out


def test_cells_read_the_largest_wrong_cells_against_their_nodes_history(capsys):
    """``benchmarks.diagnose --cells``: the largest cells of running windows answered as another
    label than their truth, biggest first, each with the medians of its windows as the model
    read them — and the same window read against its node's reference is its own figure over
    the node's (a window at the node's fed level reads 1 there)."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    rows = generate("traces", 30, 20, 101)
    readings: list = []
    said = bench.online(rows, Params(), readings=readings)
    assert said == bench.online(rows, Params())  # reading the history changes no answer
    found = bench.cells(rows, said, readings, 3)
    wrong = Counter(
        (truth, d.label)
        for (w, truth), d in zip(rows, said, strict=True)
        if truth not in (UNKNOWN, d.label) and d.label not in (UNCERTAIN, UNKNOWN) and w.kernel_busy
    )
    assert [(t, a, n) for t, a, n, _ in found] == [(t, a, n) for (t, a), n in wrong.most_common(3)]
    truth, answer, _, medians = found[0]
    cell = [
        r for (w, t), d, r in zip(rows, said, readings, strict=True)
        if (t, d.label) == (truth, answer) and w.kernel_busy
    ]  # fmt: skip
    assert medians["cell"]["cpu_cores"] == statistics.median(r["cpu_cores"] for r in cell)
    model = Diagnoser(min_node_windows=5, min_node_servers=2).fit([w for w, _ in rows])
    mature = {key for key, ref in model.nodes.items() if model._maturity(ref) == 1.0}
    running = next(
        w for w, _ in rows if w.kernel_busy and w.gr_active and (w.node, kind_of(w)) in mature
    )
    level = model.nodes[running.node, kind_of(running)].fed_level
    at_level = replace(running, gr_active=level, sm_active=min(running.sm_active, level))
    assert bench.against_history(model, at_level)["kernel/fed"] == pytest.approx(1.0)
    bench.main(["--tune-on", "--cells", "2", "--worlds", "traces", "--servers", "8",
                "--windows", "10"])  # fmt: skip
    assert " windows\n" in capsys.readouterr().out


def test_tuning_on_one_world_and_scoring_another():
    """``tune`` chooses constants on one world's labels; they score the tuning set at least as
    well as the physical starting values, and hold on a world it never saw."""
    from benchmarks import diagnose as bench
    from benchmarks.worlds import generate

    grid = {k: bench.GRID[k] for k in ("fed", "io", "confident")}
    tuning = generate("roofline", 36, 30, 1)
    params = bench.tune(tuning, rounds=1, grid=grid)

    def objective(p, rows):
        return bench.objective(bench.figures(rows, bench.batch(rows, p)))

    assert objective(params, tuning) >= objective(bench.PHYSICAL, tuning) - 1e-9
    other = generate("pipeline", 36, 30, 101)
    f = bench.figures(other, bench.online(other, params))
    assert f["accuracy"] >= 0.7 and f["coverage"] >= 0.7, f


NODE = {"node": "fast", "kernel_busy": True, "user_idle_s": 120.0}


def _history(node: str, loops: dict, servers: int = 8, windows: int = 12, **shared) -> list:
    """Windows of one node: ``servers`` servers of each kind of loop (``loops``: name -> the
    window's values), ``windows`` each, a little noise so nothing is constant."""
    rows = []
    for k, (name, values) in enumerate(loops.items()):
        for s in range(servers):
            for i in range(windows):
                jitter = 1.0 + 0.02 * ((i * 7 + s * 3 + k) % 5 - 2)
                row = {c: v * jitter if isinstance(v, float) else v for c, v in values.items()}
                rows.append(
                    Window(
                        **{**NODE, **shared, "node": node},
                        server=f"{node}-{name}-{s}/",
                        t=1000.0 + 60 * i + s,
                        **row,
                    )
                )
    return sorted(rows, key=lambda r: r.t)


# Loops on a DCGM node: well fed, held up by the CPU, by reads, memory-bound, tiny kernels.
LOOPS = {
    "fed": {"sm_active": 0.62, "gr_active": 0.93, "dram_active": 0.25, "tensor_active": 0.3,
            "cpu_cores": 1.2, "cpu_iowait": 0.01, "read_mb_s": 20.0, "gpu_mem_frac": 0.4},
    "cpu": {"sm_active": 0.18, "gr_active": 0.27, "dram_active": 0.07, "tensor_active": 0.09,
            "cpu_cores": 1.01, "cpu_iowait": 0.0, "read_mb_s": 6.0, "gpu_mem_frac": 0.3},
    "reads": {"sm_active": 0.15, "gr_active": 0.22, "dram_active": 0.06, "tensor_active": 0.07,
              "cpu_cores": 0.4, "cpu_iowait": 0.5, "read_mb_s": 300.0, "gpu_mem_frac": 0.4},
    "memory": {"sm_active": 0.66, "gr_active": 0.95, "dram_active": 0.8, "tensor_active": 0.01,
               "cpu_cores": 1.0, "cpu_iowait": 0.0, "read_mb_s": 5.0, "gpu_mem_frac": 0.5},
    "tiny": {"sm_active": 0.05, "gr_active": 0.4, "dram_active": 0.02, "tensor_active": 0.0,
             "cpu_cores": 1.0, "cpu_iowait": 0.0, "read_mb_s": 1.0, "gpu_mem_frac": 0.03},
}  # fmt: skip
EXPECTED = {
    "fed": "healthy",
    "cpu": "cpu_serial",
    "reads": "data_io",
    "memory": "memory_bandwidth",
    "tiny": "small_work",
}


def _labels(model, rows) -> dict:
    said = model.diagnose_many(rows)
    out = {}
    for row, d in zip(rows, said, strict=True):
        out.setdefault(row.server.split("-")[1], Counter())[d.label] += 1
    return {kind: labels.most_common(1)[0][0] for kind, labels in out.items()}


def test_each_cause_from_what_defines_it():
    rows = _history("fast", LOOPS)
    model = Diagnoser().fit(rows)
    assert _labels(model, rows) == EXPECTED
    loop = model.diagnose(rows[-1])
    assert loop.source == "model" and 0.0 <= loop.confidence <= 1.0


def test_a_saturated_thread_tells_a_serial_loop_from_busy_loader_workers():
    """Without I/O wait (no delay accounting) a starved loop with two cores busy is either a
    serial loop plus helpers or a loader's workers decoding: the busiest thread tells."""
    rows = _history("fast", LOOPS)
    model = Diagnoser().fit(rows)
    starved = w(node="fast", sm_active=0.15, gr_active=0.22, dram_active=0.05,
                tensor_active=0.07, cpu_cores=2.0, read_mb_s=200.0, gpu_mem_frac=0.4)  # fmt: skip
    serial = model.diagnose(replace(starved, cpu_top_thread=1.0))
    loader = model.diagnose(replace(starved, cpu_top_thread=0.3))
    assert loader.label == "data_io" and loader.confident
    # One thread saturated while reading near what the node's storage gives: a serial loop, or
    # the main thread reading and decoding its own batches — both stay in the running, unsure.
    assert serial.label in ("cpu_serial", "uncertain") and not serial.confidence > 0.7
    assert set(serial.candidates) == {"cpu_serial", "data_io"}
    reading_little = model.diagnose(replace(starved, cpu_top_thread=1.0, read_mb_s=5.0))
    assert reading_little.label == "cpu_serial" and reading_little.confident


def test_a_busy_thread_that_reads_nothing_is_answered_host_work_but_never_surely():
    """A starved loop whose one thread computes through the GPU's idle time and which reads
    nothing is the host's own work by the likeliest reading — but a main thread decoding its
    batches from the page cache and a loop launch-bound on ordinary kernels show exactly that
    too. Answered ``cpu_serial``, in the lowest band of confidence; a loader blocked on reads
    (a sign of its own) stays sure."""
    model = Diagnoser().fit(_history("fast", LOOPS))
    starved = w(node="fast", sm_active=0.15, gr_active=0.22, dram_active=0.05,
                tensor_active=0.07, cpu_cores=1.0, cpu_top_thread=1.0, cpu_iowait=0.0,
                read_mb_s=0.0, gpu_mem_frac=0.4)  # fmt: skip
    host = model.diagnose(starved)
    assert host.label == "cpu_serial" and host.confident
    assert host.confidence == model.params.residual < 0.7, host
    # the probabilities underneath are unchanged: a lower bar answers it as surely as before
    assert (
        Diagnoser(model.params.replace(residual=1.0), nodes=model.nodes)
        .diagnose(starved)
        .confidence
        > 0.85
    )
    blocked = model.diagnose(replace(starved, cpu_top_thread=0.2, cpu_cores=0.3,
                                     cpu_iowait=0.6, read_mb_s=300.0))  # fmt: skip
    assert blocked.label == "data_io" and blocked.confidence > 0.85, blocked


def test_signals_are_read_against_the_nodes_own_history():
    """The same loops on a slow card (SM activity a third of the fast one's) and with a DRAM
    counter 1.4 times as high: a healthy loop at its node's normal stays healthy with a busy
    driver thread, not cpu_serial; an ordinary loop is not called memory-bound there."""
    slow = {
        name: {
            **values,
            "sm_active": values["sm_active"] / 3,
            "dram_active": min(1.0, values["dram_active"] * 1.4),
        }
        for name, values in LOOPS.items()
    }
    slow["fed"]["cpu_cores"] = 1.6  # a Python driver and two workers
    rows = _history("slow", slow) + _history("fast", LOOPS)
    model = Diagnoser().fit(rows)
    assert _labels(model, [r for r in rows if r.node == "slow"]) == EXPECTED
    # Without gr_active SM activity is the card's: the slow node's fed level is its own.
    blind = [replace(r, gr_active=None) for r in rows]
    model = Diagnoser().fit(blind)
    labels = _labels(model, [r for r in blind if r.node == "slow"])
    assert labels["fed"] == "healthy" and labels["reads"] == "data_io", labels
    # A CPU-bound loop and a launch-bound one look alike without the engine's activity: it
    # says so rather than guess.
    assert labels["cpu"] in ("cpu_serial", "uncertain"), labels


def test_an_unseen_node_is_learnt_online_from_its_first_windows():
    rows = _history("new", LOOPS, servers=6, windows=10)
    model = Diagnoser()
    first = None
    said = []
    for row in rows:
        model.observe(row)
        d = model.score(row)
        first = first or d
        said.append(d)
    late = said[len(said) // 2 :]
    right = sum(
        d.label == EXPECTED[r.server.split("-")[1]]
        for r, d in zip(rows[len(rows) // 2 :], late, strict=True)
    )
    assert right / len(late) >= 0.9
    assert not model.nodes[("new", "engine")].windows < 100


@pytest.mark.parametrize("sm", [0.0, 0.01, 0.025, 0.04])
def test_a_zombie_tolerates_a_few_percent_of_sm_noise(sm):
    model = Diagnoser()
    idle = w(sm_active=sm, gr_active=sm, gpu_mem_frac=0.4, user_idle_s=5 * 3600, kernel_busy=False)
    d = model.diagnose(idle)
    assert d.label == "zombie" and d.confident and d.confidence >= 0.6
    assert d.as_dict()["cause"] == "zombie"
    # Work, somebody here, no memory held, or unknown parts: not a zombie.
    assert model.diagnose(replace(idle, sm_active=0.2)).label != "zombie"
    assert model.diagnose(replace(idle, user_idle_s=600.0)).label == "healthy"
    assert model.diagnose(replace(idle, gpu_mem_frac=0.0)).label == "healthy"
    assert model.diagnose(replace(idle, sm_active=None)).label == "unknown"
    # Presence or memory not measured: not sure either way, and both causes named (a cull
    # needs a sure zombie; calling it healthy surely would be wrong as often as not).
    for unknown in (replace(idle, user_idle_s=None), replace(idle, gpu_mem_frac=None)):
        d = model.diagnose(unknown)
        assert d.label == "uncertain" and set(d.candidates) == {"zombie", "healthy"}


def test_forged_idle_windows_move_the_zombie_line_by_two_percent_at_most():
    """docs/security.md: a node's idle floor is learnt from every server's idle windows, forged
    reports' included. 1,000 idle windows at SM 0.24 teach a floor near 0.24, yet a neighbour's
    window at SM 0.15 (work) is no zombie: the floor raises the line by 0.02 at most
    (``Diagnoser._idle``), and no report can make another's work read as a confident zombie."""
    idle = {"gpu_mem_frac": 0.4, "user_idle_s": 5 * 3600, "kernel_busy": False}
    forged = [
        w(node="n", server=f"mallory-{i % 3}/", t=60.0 * i, sm_active=0.24, gr_active=0.24, **idle)
        for i in range(1000)
    ]
    honest = [  # the node's running loops, which its references need first
        w(node="n", server=f"honest-{i % 6}/", t=60.0 * i, sm_active=0.7, gr_active=0.9)
        for i in range(300)
    ]
    model = Diagnoser().fit(honest + forged)
    (ref,) = model.nodes.values()
    assert ref.idle_floor > 0.2  # what was forged is learnt
    bob = w(node="n", server="bob/", sm_active=0.15, gr_active=0.15, **idle)
    assert model.diagnose(bob).label != "zombie", model.diagnose(bob)
    assert model.diagnose(replace(bob, sm_active=0.01, gr_active=0.01)).label == "zombie"


def test_a_terminal_holding_memory_and_doing_nothing_is_a_zombie():
    model = Diagnoser()
    quiet = w(sm_active=0.01, gpu_mem_frac=0.3, user_idle_s=9 * 3600, kernel_busy=None,
              cpu_cores=0.02)  # fmt: skip
    d = model.diagnose(quiet)
    assert (
        d.label == "zombie"
        and d.confidence < model.diagnose(replace(quiet, kernel_busy=False)).confidence
    )
    assert model.diagnose(replace(quiet, cpu_cores=1.0)).label != "zombie"  # it computes
    assert model.diagnose(replace(quiet, cpu_cores=None)).label != "zombie"  # unknown


def test_an_idle_terminal_is_idle_not_a_starved_loop():
    """A terminal (no kernel state) whose process tree and GPU both do nothing runs nothing:
    healthy while its owner is around (not a loop held back by its host), a zombie once gone."""
    model = Diagnoser().fit(_history("fast", LOOPS))
    quiet = w(node="fast", sm_active=0.01, gr_active=0.01, gpu_mem_frac=0.3, user_idle_s=60.0,
              kernel_busy=None, cpu_cores=0.02, cpu_iowait=0.0, read_mb_s=0.0)  # fmt: skip
    assert model.diagnose(quiet).label == "healthy"
    assert model.diagnose(replace(quiet, user_idle_s=9 * 3600)).label == "zombie"
    # Its tree busy on the CPU while the GPU waits: a loop, read as one.
    assert model.diagnose(replace(quiet, cpu_cores=1.0)).label != "healthy"


def test_a_server_that_has_not_started_using_its_gpu_has_no_root_cause():
    """A server granted a card, with no kernel and no process on it, no memory held, the card
    quiet (the demo's every server before its first notebook): nothing runs to be held back, so
    no root cause, where it read "Not sure yet (data_io or cpu_serial)" with the data hint."""
    report = {
        "sampled_at": "2026-01-05T09:00:00Z",
        "server": {"user": "alice", "name": "", "gpu_allocated": True,
                   "last_activity": "2026-01-05T08:59:00Z"},
        "devices": [{"uuid": "GPU-1", "memory_used_mb": 0, "memory_total_mb": 81559,
                     "activity": 0}],
        "targets": [],
    }  # fmt: skip
    [window] = windows_from_report(report, None, None)
    assert (window.kernel_busy, window.cpu_cores, window.gpu_mem_frac) == (None, None, 0.0)
    for model in (Diagnoser(), Diagnoser().fit(_history("fast", LOOPS))):
        d = model.diagnose(replace(window, node="fast"))
        assert d.label == "healthy", d
        # Memory held: something unseen may run there, read as before.
        assert model.diagnose(replace(window, node="fast", gpu_mem_frac=0.3)).label != "healthy"


def test_memory_bound_needs_a_busy_gpu():
    """Kernels that stream memory at the node's DRAM peak are memory-bound when they keep the
    GPU busy; in a loop that starves the GPU, something else holds it back."""
    model = Diagnoser().fit(_history("fast", LOOPS))
    busy = w(node="fast", sm_active=0.66, gr_active=0.95, dram_active=0.8, tensor_active=0.01,
             cpu_cores=1.0, cpu_iowait=0.0, read_mb_s=5.0, gpu_mem_frac=0.5)  # fmt: skip
    assert model.diagnose(busy).label == "memory_bandwidth"
    starved = replace(busy, sm_active=0.31, gr_active=0.45, dram_active=0.36)
    assert model.diagnose(starved).cause != "memory_bandwidth"


def test_memory_bound_on_a_node_whose_dram_counter_reads_half():
    """A DRAM counter at half another card's scale: the memory-bound loop is still read as one
    (against the node's compute loops and its idle tensor pipes, not an absolute level), and the
    ordinary loop stays healthy."""
    half = {name: {**v, "dram_active": v["dram_active"] / 2} for name, v in LOOPS.items()}
    rows = _history("half", half)
    assert _labels(Diagnoser().fit(rows), rows) == EXPECTED


def test_memory_bound_where_nvmls_memory_utilisation_saturates_below_one():
    """NVML alone, on a card whose memory utilisation tops out at 0.92: memory-bound loops keep
    it at that ceiling, ordinary loops read 0.6. Some windows of the memory-bound loops catch
    the kernels in a gap (utilisation 0.7, memory still 0.88), so their ratio runs past 1 and
    the intensity's peak alone sits above the loops at the ceiling; read against the node's
    own ceiling they are memory-bound, and the ordinary loops stay healthy."""
    nvml = {
        "fed": {"sm_active": 0.97, "dram_active": 0.6, "cpu_cores": 1.2, "cpu_iowait": 0.01,
                "read_mb_s": 20.0, "gpu_mem_frac": 0.4},
        "cpu": {"sm_active": 0.3, "dram_active": 0.18, "cpu_cores": 1.01, "cpu_iowait": 0.0,
                "read_mb_s": 6.0, "gpu_mem_frac": 0.3},
        "memory": {"sm_active": 0.97, "dram_active": 0.9, "cpu_cores": 1.0, "cpu_iowait": 0.0,
                   "read_mb_s": 5.0, "gpu_mem_frac": 0.5},
        "gappy": {"sm_active": 0.7, "dram_active": 0.88, "cpu_cores": 1.0, "cpu_iowait": 0.0,
                  "read_mb_s": 5.0, "gpu_mem_frac": 0.5},
    }  # fmt: skip
    rows = _history("sat", nvml)
    model = Diagnoser().fit(rows)
    assert model.nodes[("sat", "nvml")].dram_ceiling == pytest.approx(0.92, abs=0.03)
    labels = _labels(model, rows)
    assert (labels["fed"], labels["cpu"], labels["memory"]) == (
        "healthy",
        "cpu_serial",
        "memory_bandwidth",
    )


def test_busy_kernels_that_fill_few_sms_are_small_work():
    model = Diagnoser().fit(_history("fast", LOOPS))
    tiny = w(node="fast", sm_active=0.2, gr_active=0.95, dram_active=0.05, tensor_active=0.0,
             cpu_cores=1.0, cpu_iowait=0.0, read_mb_s=1.0, gpu_mem_frac=0.05)  # fmt: skip
    assert model.diagnose(tiny).label == "small_work"
    assert model.diagnose(replace(tiny, sm_active=0.62)).label == "healthy"


def test_tiny_kernels_a_host_launches_now_and_then_do_not_make_it_small_work():
    """Launching tiny kernels back to back keeps them running a good share of the time (a
    kernel lasts microseconds, a launch tens of them); a loop whose kernels run 2 % of the time
    is busy with something else on its host."""
    model = Diagnoser().fit(_history("fast", LOOPS))
    host = w(node="fast", sm_active=0.004, gr_active=0.02, dram_active=0.001, tensor_active=0.0,
             cpu_cores=1.0, cpu_top_thread=1.0, cpu_iowait=0.0, read_mb_s=0.0,
             gpu_mem_frac=0.02)  # fmt: skip
    assert model.diagnose(host).label == "cpu_serial"
    launching = replace(host, sm_active=0.05, gr_active=0.35, dram_active=0.01)
    assert model.diagnose(launching).label == "small_work"


def test_a_loop_that_waits_and_reads_nothing_is_either_data_or_host():
    """A starved loop that neither computes nor reads: a ``time.sleep`` in the loop, or a wait on
    a network mount whose reads nobody counts. The columns cannot tell: uncertain, both named."""
    model = Diagnoser().fit(_history("fast", LOOPS))
    waiting = w(node="fast", sm_active=0.15, gr_active=0.22, dram_active=0.05,
                tensor_active=0.07, cpu_cores=0.05, cpu_iowait=0.0, read_mb_s=0.0,
                gpu_mem_frac=0.4)  # fmt: skip
    d = model.diagnose(waiting)
    assert d.label == "uncertain" and set(d.candidates) == {"data_io", "cpu_serial"}
    assert model.diagnose(replace(waiting, read_mb_s=250.0)).label == "data_io"


def test_without_any_input_column_a_busy_thread_is_either_data_or_host():
    """The main thread decoding its own batches is data_io (docs/api.md "What each label
    means"), a Python loop cpu_serial: both saturate a thread. With neither reads nor I/O wait
    measured nothing tells them apart: uncertain, both named, not a guess from the CPU; with
    the node's storage read at its pace it is the loader."""
    model = Diagnoser().fit(_history("fast", LOOPS))
    busy = w(node="fast", sm_active=0.18, gr_active=0.27, dram_active=0.07, tensor_active=0.09,
             cpu_cores=1.01, cpu_top_thread=1.0, gpu_mem_frac=0.3)  # fmt: skip
    d = model.diagnose(busy)
    assert d.label == "uncertain" and set(d.candidates) == {"data_io", "cpu_serial"}
    assert model.diagnose(replace(busy, read_mb_s=6.0, cpu_iowait=0.0)).label == "cpu_serial"
    assert model.diagnose(replace(busy, read_mb_s=300.0, cpu_iowait=0.5)).label == "data_io"


def test_a_healthy_loop_at_its_nodes_normal_where_memory_bound_loops_read_higher():
    """Without gr_active, SM activity is the card's: on this one healthy loops read 0.3 and
    memory-bound loops, their SMs waiting on memory, 0.55. The node's fed level is its compute
    loops', so a healthy loop with a busy Python driver is healthy, not a starved one."""
    slow = {
        "fed": {"sm_active": 0.3, "dram_active": 0.09, "tensor_active": 0.15, "cpu_cores": 1.5,
                "cpu_iowait": 0.01, "read_mb_s": 20.0, "gpu_mem_frac": 0.4},
        "cpu": {"sm_active": 0.08, "dram_active": 0.025, "tensor_active": 0.04,
                "cpu_cores": 1.01, "cpu_iowait": 0.0, "read_mb_s": 3.0, "gpu_mem_frac": 0.4},
        "memory": {"sm_active": 0.55, "dram_active": 0.5, "tensor_active": 0.01,
                   "cpu_cores": 1.0, "cpu_iowait": 0.0, "read_mb_s": 5.0, "gpu_mem_frac": 0.5},
    }  # fmt: skip
    rows = _history("slow", slow)
    labels = _labels(Diagnoser().fit(rows), rows)
    assert labels == {"fed": "healthy", "cpu": "cpu_serial", "memory": "memory_bandwidth"}


def test_uncertain_names_its_two_candidates():
    rows = _history("fast", LOOPS)
    model = Diagnoser().fit(rows)
    # Half fed: between healthy and a cause.
    middle = w(node="fast", sm_active=0.47, gr_active=0.7, dram_active=0.18, tensor_active=0.2,
               cpu_cores=1.0, cpu_iowait=0.0, read_mb_s=10.0, gpu_mem_frac=0.4)  # fmt: skip
    d = model.diagnose(middle)
    assert d.label == "uncertain" and len(d.candidates) == 2 and "healthy" in d.candidates
    assert d.confidence < model.params.confident and not d.confident
    assert d.cause == d.candidates[0]
    assert d.hint.startswith("Not sure yet")


def test_contributions_say_what_fixing_the_cause_gives():
    rows = _history("fast", LOOPS)
    model = Diagnoser().fit(rows)
    reads = next(r for r in rows if "-reads-" in r.server)
    d = model.diagnose(reads)
    assert d.label == "data_io"
    assert max(d.contributions, key=d.contributions.get) == "cpu_iowait"
    assert d.gain["node"] == pytest.approx(0.62 - reads.sm_active, abs=0.05)
    assert 0.6 < d.gain["share"] < 0.9


def test_save_load_batch_and_single():
    rows = _history("fast", LOOPS, servers=3)
    model = Diagnoser().fit(rows)
    windows = rows[::7]
    assert [model.diagnose(x) for x in windows] == model.diagnose_many(windows, context=False)


def test_save_and_load(tmp_path):
    rows = _history("fast", LOOPS, servers=3)
    model = Diagnoser().fit(rows)
    path = tmp_path / "model.pkl"
    model.save(path)
    loaded = Diagnoser.load(path)
    assert loaded.diagnose_many(rows) == model.diagnose_many(rows)
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a diagnosis model"):
        Diagnoser.load(bad)


def test_a_format_7_model_loads_and_learns_what_it_lacks(tmp_path):
    """A model saved before the DRAM ceiling existed (format 7) still loads: its node
    references get the figure empty, use the prior, and learn it from the next windows."""
    rows = _history("fast", LOOPS, servers=3)
    model = Diagnoser().fit(rows)
    data = {"format": 7, "diagnoser": model}
    old = pickle.loads(pickle.dumps(data))
    for ref in old["diagnoser"].nodes.values():
        del ref.__dict__["busy_dram"], ref.__dict__["dram_ceiling"]
    path = tmp_path / "old.pkl"
    path.write_bytes(pickle.dumps(old))
    loaded = Diagnoser.load(path)
    ref = loaded.nodes[("fast", "engine")]
    assert ref.busy_dram.total == 0 and math.isnan(ref.dram_ceiling)
    assert _labels(loaded, rows) == EXPECTED
    for row in loaded.in_context(rows):
        loaded.observe(row)
    ref.refresh()
    assert ref.dram_ceiling > 0
    path.write_bytes(pickle.dumps({**old, "format": 6}))
    with pytest.raises(ValueError, match="format 7 or 8"):
        Diagnoser.load(path)


def test_diagnose_many_learns_an_unseen_node_from_the_batch_without_changing_the_model():
    trained = Diagnoser().fit(_history("fast", LOOPS, servers=3))
    other = _history("other", LOOPS, servers=3)
    before = dict(trained.nodes)
    assert _labels(trained, other) == EXPECTED
    assert trained.nodes == before


# -- the cluster ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shares, demand, flagged",
    [
        ([0.5, 0.5, 1.0], Demand(pending=1), True),  # a whole card free, in two halves
        ([0.5, 0.5, 1.0], Demand(), False),  # nobody waits
        ([0.5, 0.5, 0.0], Demand(pending=2), False),  # a card is free: not fragmentation
        ([0.75, 0.75, 1.0], Demand(queued=3), False),  # half a card free in all
        ([0.3, 1.0, 1.0], Demand(refused=1), False),  # one partly allocated card
        ([0.25, 0.5, 0.6, 1.0], Demand(refused=1), True),  # refused for want of a GPU
        ([0.25, 0.5, 0.6, 1.0], Demand(queued=2), True),  # queued
        ([], Demand(pending=5), False),
    ],
)
def test_fragmentation(shares, demand, flagged):
    result = fragmentation(shares, demand)
    assert (result is not None) == flagged
    if flagged:
        assert result.label == "fragmentation"
        assert result.contributions["waiting"] == demand.waiting


def test_an_exclusive_whole_card_is_not_fragmented():
    # Two servers each hold a whole card alone, a quarter of its memory in use: allocated.
    assert card_shares([("GPU-a", None, 1.0), ("GPU-b", None, 1.0)]) == [1.0, 1.0]
    assert fragmentation([1.0, 1.0], Demand(pending=3)) is None
    # MIG slices add up per card: 3/7 + 2/7 held on one, 1/7 on another.
    shares = card_shares(
        [("A", "3g.40gb", mig_share("3g.40gb")), ("A", "2g.20gb", mig_share("2g.20gb")),
         ("B", "1g.10gb", mig_share("1g.10gb")), ("B", "3g.40gb", 0.0)]
    )  # fmt: skip
    assert shares == [pytest.approx(5 / 7, abs=1e-3), pytest.approx(1 / 7, abs=1e-3)]
    assert fragmentation(shares, Demand(pending=1)) is not None


def room(free: dict, tiers: dict, age: float = 1.0) -> dict:
    """A cluster's room as the sync carries it: ``free`` node -> resource -> devices free;
    ``tiers`` name -> (resource, count, nodes)."""
    return {
        "unknown": None,
        "read_age_s": age,
        "nodes": free,
        "tiers": {t: {"resource": r, "count": c, "nodes": n} for t, (r, c, n) in tiers.items()},
        "refused": {},
    }


GPU, SLICE = "nvidia.com/gpu", "nvidia.com/mig-3g.71gb"
NODES3 = ["a", "b", "c"]


@pytest.mark.parametrize(
    "free, asked, verdicts",
    [
        # 1 + 1 + 2 free, one pair: it fits on c (nothing blocks it).
        ({"a": 1, "b": 1, "c": 2}, ["pair"], ("fits",)),
        # Two pairs: one on c, the other has a card on a and one on b: fragmentation.
        ({"a": 1, "b": 1, "c": 2}, ["pair", "pair"], ("fits", "fragmentation")),
        # Three pairs on 1 + 1 + 1: one could start if consolidated, the others are short (the
        # same scattered cards are never counted for two).
        ({"a": 1, "b": 1, "c": 1}, ["pair"] * 3, ("fragmentation", "shortage", "shortage")),
        # One card free in all: a pair is short, not fragmented.
        ({"a": 1, "b": 0, "c": 0}, ["pair"], ("shortage",)),
        # Whole cards held whole: a single card never waits on fragmentation.
        ({"a": 1, "b": 1, "c": 0}, ["single"] * 3, ("fits", "fits", "shortage")),
        # Pairs go first (best fit): the single takes a's card, not one of c's two.
        ({"a": 1, "b": 0, "c": 2}, ["single", "pair"], ("fits", "fits")),
    ],
)
def test_what_blocks_each_waiting_spawn_on_the_nodes(free, asked, verdicts):
    tiers = {"pair": (GPU, 2, NODES3), "single": (GPU, 1, NODES3)}
    found = placement(
        [(t, "queued") for t in asked], room({n: {GPU: k} for n, k in free.items()}, tiers)
    )
    said: dict = {}
    for r in found["requests"]:
        said[r["blocked_by"] or "fits"] = said.get(r["blocked_by"] or "fits", 0) + r["count"]
    expected: dict = {}
    for v in verdicts:
        expected[v] = expected.get(v, 0) + 1
    assert said == expected, found
    assert (found["fits"], found["fragmentation"], found["shortage"]) == tuple(
        expected.get(v, 0) for v in ("fits", "fragmentation", "shortage")
    )
    report = fragmentation_report([], Demand(queued=len(asked)), "no card", found)
    assert report["flag"] is ("fragmentation" in verdicts)


def test_mig_slices_count_as_slices_on_the_nodes():
    """Slices are devices of their own resource: a slice request fits where one is free and is
    short where none is, never fragmented; free slices are no whole card (a whole-card request
    beside them is short), however many there are on two cards."""
    tiers = {"half": (SLICE, 1, ["h"]), "card": (GPU, 1, ["h"])}
    free = {"h": {SLICE: 2, GPU: 0}}
    found = placement([("half", "queued")] * 3 + [("card", "pending")], room(free, tiers))
    verdicts = {(r["tier"], r["blocked_by"]): r["count"] for r in found["requests"]}
    assert verdicts == {("half", None): 2, ("half", "shortage"): 1, ("card", "shortage"): 1}
    assert found["fragmentation"] == 0
    # The cards' figure (DCGM's shares) calls two partly sliced cards fragmented; the nodes,
    # which know what each spawn asks for, decide.
    report = fragmentation_report([3 / 7, 3 / 7], Demand(queued=4), "", found)
    assert report["flag"] is False and report["devices_partly_used"] == 2


def test_what_the_nodes_cannot_say_is_unknown_never_not_fragmented():
    tiers = {"pair": (GPU, 2, NODES3)}
    free = {"a": {GPU: 1}, "b": {GPU: 1}, "c": {GPU: 0}}
    asked = [("pair", "pending")]
    assert placement(asked, None) is None  # not a cluster: nothing said
    assert placement(asked, room(free, tiers))["fragmentation"] == 1
    for stale, why in (
        ({**room(free, tiers), "unknown": "GPU state unknown: the API failed"}, "the API failed"),
        (room(free, tiers, age=119.0), "last read 149 s ago"),  # fresh at the sync, 30 s on
        ({**room(free, tiers), "read_age_s": None}, "last read never"),
    ):
        found = placement(asked, stale, since_s=30.0)
        assert why in found["unknown"] and found["requests"] == [], found
        report = fragmentation_report([], Demand(pending=1), "no card to count", found)
        assert report["flag"] is False and report["nodes"]["unknown"] == found["unknown"]
    # A tier the hub does not know (removed since): that request is unknown, not a shortage.
    found = placement([("gone", "queued"), *asked], room(free, tiers))
    assert (found["tier_unknown"], found["fragmentation"], found["shortage"]) == (1, 1, 0)


def test_a_spawn_a_node_the_autoscaler_adds_would_take_waits_for_a_node():
    """A pool that may grow (``node_pool_max``): a request no node has room for now waits for
    the node the autoscaler adds, not on fragmentation; the pool's growth is shared by its
    tiers (a pair and a single on the same nodes) and spent once; past it, what is scattered
    and then a shortage, as without a pool. A node with nothing free need not be sent."""
    tiers = {"pair": (GPU, 2, ["a", "b"]), "single": (GPU, 1, ["a", "b"])}
    found = room({"a": {GPU: 1}, "b": {GPU: 1}}, tiers)
    for tier in found["tiers"].values():
        tier.update(pool="p", nodes_total=3)  # a third node, full, not sent
    found["pools"] = {"p": 3}  # one more node of 3 cards may come
    asked = [("pair", "pending")] * 3 + [("single", "queued")] * 2
    placed = placement(asked, found)
    verdicts = {(r["tier"], r["blocked_by"]): r["count"] for r in placed["requests"]}
    # Now: no node has two free, so the singles take a's and b's cards. Then the new node (3
    # cards) takes one pair, its last card too few for another; nothing is left scattered:
    # the other two pairs are short.
    assert verdicts == {
        ("pair", "new_node"): 1,
        ("pair", "shortage"): 2,
        ("single", None): 2,
    }, placed
    assert placed["new_node"] == 1 and placed["fragmentation"] == 0
    said = next(r["says"] for r in placed["requests"] if r["blocked_by"] == "new_node")
    assert "waiting for a node" in said and "its pool may add 3 more" in said, said
    assert "2 free on its 3 nodes" in said, said  # nodes_total, not the nodes sent
    # Without a pool the same pairs read as fragmentation and shortage: never a new node.
    found["pools"] = {}
    unpooled = placement(asked, found)
    assert unpooled["new_node"] == 0 and unpooled["shortage"] == 3, unpooled
    report = fragmentation_report([], Demand(pending=3, queued=2), "no card", placed)
    assert report["flag"] is False  # waiting for a node is not fragmentation


def test_a_pool_given_by_its_node_shape_takes_whole_servers_on_each_node_it_may_add():
    """A pool that may add two 8-card nodes (``node_devices``): 3-card servers take two a
    node, not 16 // 3 = 5; tiers of the pool share the nodes, best fit, largest first (a
    3-card server and a pair fill what two 3-card servers leave on one node). Randomised
    against placing each server on the fullest new node that takes it, one by one."""
    tiers = {"x3": (GPU, 3, []), "x2": (GPU, 2, []), "x1": (GPU, 1, [])}
    shaped = room({}, tiers)
    for tier in shaped["tiers"].values():
        tier["pool"] = "p"
    shaped["pools"], shaped["node_devices"] = {"p": 16}, {"p": 8}
    placed = placement([("x3", "queued")] * 5, shaped)
    assert (placed["new_node"], placed["shortage"]) == (4, 1), placed
    said = placed["requests"][0]["says"]
    assert "its pool may add 16 more (2 nodes of 8)" in said, said
    placed = placement([("x3", "queued")] * 5 + [("x2", "queued")] * 3, shaped)
    verdicts = {(r["tier"], r["blocked_by"]): r["count"] for r in placed["requests"]}
    # x3 first: 3+3 on one node, 3+3 on the other (2 left on each): the pairs take those.
    assert verdicts == {
        ("x3", "new_node"): 4,
        ("x3", "shortage"): 1,
        ("x2", "new_node"): 2,
        ("x2", "shortage"): 1,
    }, verdicts
    devices_alone = placement([("x3", "queued")] * 5, {**shaped, "node_devices": {}})
    assert devices_alone["new_node"] == 5  # a pool given in devices: as before

    rng = random.Random(37)
    for _ in range(300):
        per, count = rng.randint(1, 9), rng.randint(0, 6)
        shaped["pools"], shaped["node_devices"] = {"p": per * count}, {"p": per}
        asked = [(rng.choice(list(tiers)), "queued") for _ in range(rng.randint(0, 12))]
        nodes, expected = [per] * count, Counter()
        for tier in sorted(tiers, key=lambda t: -tiers[t][1]):
            need = tiers[tier][1]
            for _ in range(sum(1 for t, _ in asked if t == tier)):
                fits = [i for i, n in enumerate(nodes) if n >= need]
                if fits:
                    nodes[min(fits, key=lambda i: nodes[i])] -= need
                    expected[tier] += 1
        placed = placement(asked, shaped)
        got = Counter()
        for r in placed["requests"]:
            if r["blocked_by"] == "new_node":
                got[r["tier"]] += r["count"]
        assert got == expected, (per, count, asked, placed)


def test_a_room_the_sync_cannot_read_is_refused_naming_the_field():
    from jupyter_gpu_gov.core.queue import QueueFormatError, room_for_from_json, room_from_json

    # What the governor asks the room of: the tiers of the spawns its pass saw starting.
    assert room_for_from_json(None) is None  # an older governor: every tier
    assert room_for_from_json(["a100x2"]) == ["a100x2"]
    for bad in ("a100x2", [""], [1], ["t"] * 1001):
        with pytest.raises(QueueFormatError, match="'room_for'"):
            room_for_from_json(bad)

    good = room({"a": {GPU: 1}}, {"pair": (GPU, 2, ["a"])})
    assert room_from_json(good)["tiers"]["pair"]["count"] == 2
    assert room_from_json(None) is None
    for bad, field in (
        ([], "'room' must be an object"),
        ({**good, "read_age_s": "soon"}, "room.read_age_s"),
        ({**good, "nodes": {"a": {GPU: 1}} | {f"n{i}": {} for i in range(10_001)}}, "room.nodes"),
        (
            {**good, "tiers": {"pair": {"resource": GPU, "count": 0, "nodes": []}}},
            "room.tiers.pair",
        ),
        ({**good, "refused": {"pair": -1}}, "room.refused"),
        ({**good, "pools": {"p": -1}}, "room.pools"),
        ({**good, "node_devices": {"p": 0}}, "room.node_devices"),
        (
            {**good, "tiers": {"pair": {"resource": GPU, "count": 2, "nodes": ["a"], "pool": 3}}},
            "room.tiers.pair",
        ),
        (
            {
                **good,
                "tiers": {"pair": {"resource": GPU, "count": 2, "nodes": ["a"], "nodes_total": 0}},
            },
            "room.tiers.pair",
        ),
    ):
        with pytest.raises(QueueFormatError, match=re.escape(field)):
            room_from_json(bad)


def test_the_cost_ledger_books_gpu_hours_per_cause_team_and_node():
    from datetime import date

    ledger = CostLedger(keep_days=2)
    zombie = Diagnoser().diagnose(
        w(sm_active=0.0, gpu_mem_frac=0.4, user_idle_s=9e4, kernel_busy=False)
    )
    starved = diagnosis("data_io", source="model", gain={"node": 0.3, "share": 0.5})
    day = date(2026, 3, 1)
    ledger.add(day, "vision", "n1", zombie, 3600.0, 0.0)
    ledger.add(day, "vision", "n2", starved, 7200.0, 0.3)
    ledger.add(day, "nlp", "n2", starved, 3600.0, 0.3)
    ledger.add(day, "nlp", "n2", diagnosis("unknown"), 3600.0, None)  # not booked
    report = ledger.report()
    assert report["gpu_hours"] == 4.0
    assert report["causes"]["zombie"] == {
        "gpu_hours": 1.0, "utilisation": 0.0, "recoverable_gpu_hours": 1.0, "share": 0.25
    }  # fmt: skip
    assert report["causes"]["data_io"]["recoverable_gpu_hours"] == 1.5  # half of 3 GPU-hours
    assert report["teams"]["vision"]["data_io"]["gpu_hours"] == 2.0
    assert report["nodes"]["n2"]["data_io"]["gpu_hours"] == 3.0
    ledger.add(date(2026, 3, 2), "nlp", "n2", starved, 3600.0, 0.3)
    ledger.add(date(2026, 3, 3), "nlp", "n2", starved, 3600.0, 0.3)
    assert sorted(ledger.days) == [date(2026, 3, 2), date(2026, 3, 3)]  # two days kept
    assert ledger.report(since=date(2026, 3, 3))["gpu_hours"] == 1.0


# -- jupyter-gpu-gov diagnose --------------------------------------------------------------------


@pytest.fixture(scope="module")
def windows_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("d") / "windows.jsonl"
    rows = faults.generate(30, 30, seed=4)
    with open(path, "w") as f:
        for window, truth in rows:
            f.write(json.dumps({**window.as_dict(), "truth": truth}) + "\n")
    return path, rows


def test_cli_learns_from_the_file_and_prints_one_line_per_row(windows_file, capsys):
    path, rows = windows_file
    assert main(["diagnose", str(path)]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == len(rows)
    assert set(lines[0]) == {
        "server", "t", "label", "cause", "confidence", "confident", "candidates",
        "contributions", "gain", "hint", "source",
    }  # fmt: skip
    summary = json.loads(err)
    assert summary["windows"] == len(rows) and summary["by"] == "model learnt from FILE"
    right = sum(line["label"] == truth for line, (_, truth) in zip(lines, rows, strict=True))
    answered = sum(line["label"] != "uncertain" for line in lines)
    assert right / answered >= 0.8 and answered / len(lines) >= 0.8
    assert all(
        line["label"] == "unknown"
        for line, (w_, _) in zip(lines, rows, strict=True)
        if w_.sm_active is None
    )


def test_cli_reads_a_file_in_any_row_order_as_in_time_order(windows_file, tmp_path, capsys):
    """Another tool may write windows grouped by server or newest first: each row keeps its
    diagnosis, since its context and the node's learning follow ``t``, not the lines."""
    path, rows = windows_file
    assert main(["diagnose", str(path)]) == 0
    in_time = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0].server, -(rows[i][0].t or 0)))
    shuffled = tmp_path / "by-server-newest-first.jsonl"
    shuffled.write_text("".join(json.dumps(rows[i][0].as_dict()) + "\n" for i in order))
    assert main(["diagnose", str(shuffled)]) == 0
    by_server = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert by_server == [in_time[i] for i in order]


def test_times_in_milliseconds_to_nanoseconds_read_as_seconds(windows_file, tmp_path, capsys):
    """pandas writes times in JSON as milliseconds since 1970 (``date_unit`` may say micro- or
    nanoseconds): their size tells the unit, and the file reads as one in seconds does (its
    windows' context is found by time)."""
    path, rows = windows_file
    assert main(["diagnose", str(path)]) == 0
    in_seconds = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(w.t is None or w.t > 1e9 for w, _ in rows)  # since 1970, as a real file's
    for unit in (1_000, 1_000_000, 1_000_000_000):
        scaled = tmp_path / f"t-{unit}.jsonl"
        scaled.write_text(
            "".join(
                json.dumps({**w.as_dict(), "t": None if w.t is None else w.t * unit}) + "\n"
                for w, _ in rows
            )
        )
        assert main(["diagnose", str(scaled)]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [line.pop("t") for line in lines] == [
            None if w.t is None else pytest.approx(w.t) for w, _ in rows
        ]
        assert lines == [{k: v for k, v in line.items() if k != "t"} for line in in_seconds]
    assert parse_value("t", "1764892800000") == 1_764_892_800.0
    assert parse_value("t", 120.0) == 120.0  # a trace's own clock, in seconds


def test_cli_says_once_what_a_file_does_not_measure(windows_file, tmp_path, capsys):
    """A column with no value in the whole file is named in the summary with what its absence
    costs; without presence no window is a sure zombie (a cull needs one)."""
    path, rows = windows_file
    assert main(["diagnose", str(path)]) == 0
    assert "not_measured" not in json.loads(capsys.readouterr().err)
    assert any(truth == "zombie" for _, truth in rows)
    partial = tmp_path / "no-node-no-presence.jsonl"
    partial.write_text(
        "".join(
            json.dumps({k: v for k, v in w.as_dict().items() if k not in ("node", "user_idle_s")})
            + "\n"
            for w, _ in rows
        )
    )
    assert main(["diagnose", str(partial)]) == 0
    out, err = capsys.readouterr()
    missing = json.loads(err)["not_measured"]
    assert set(missing) == {"node", "user_idle_s"}
    assert (
        "one reference for all nodes" in missing["node"] and "sure zombie" in missing["user_idle_s"]
    )
    assert "zombie" not in {json.loads(line)["label"] for line in out.splitlines()}


def test_windows_of_unnamed_servers_are_not_read_as_one_servers(windows_file):
    """Without ``server`` a window's earlier windows are not known: it is read alone, not
    smoothed with other servers' windows on its node, and no task's best is learnt from it;
    its node becomes its own reference by its windows."""
    _, rows = windows_file
    running = [w for w, _ in rows if is_running(w) and w.t is not None]
    a, b = (replace(w, server=None, node="n1") for w in running[:2])
    a, b = replace(a, t=60.0, cpu_cores=0.1), replace(b, t=120.0, cpu_cores=3.0)
    assert in_context([a, b]) == [a, b]
    named = [replace(a, server="alice/"), replace(b, server="alice/")]
    assert in_context(named)[1].cpu_cores == pytest.approx(1.55)  # the same server's: smoothed
    model = Diagnoser().fit([replace(w, server=None) for w, _ in rows])
    assert model.tasks == {} and model.trained_on > 0
    # How many servers a node has seen is unknown: it becomes its own reference by its
    # windows alone. One named server's windows never make a node's reference.
    one = Diagnoser().fit([replace(w, server="a/") for w, _ in rows])
    for fitted, mature in ((model, True), (one, False)):
        refs = [r for r in fitted.nodes.values() if r.windows >= fitted.min_node_windows]
        assert refs and all(
            (r.maturity(fitted.min_node_windows, fitted.min_node_servers) == 1.0) is mature
            for r in refs
        )


def test_cli_baseline_and_a_saved_model(windows_file, tmp_path, capsys):
    path, _ = windows_file
    saved = tmp_path / "m.pkl"
    assert main(["diagnose", str(path), "--save-model", str(saved)]) == 0
    first = capsys.readouterr().out
    assert main(["diagnose", str(path), "--model", str(saved)]) == 0
    assert capsys.readouterr().out == first
    assert main(["diagnose", str(path), "--baseline"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {line["source"] for line in lines} == {"rules"}


def test_cli_csv(tmp_path, capsys):
    path = tmp_path / "w.csv"
    path.write_text(CSV)
    assert main(["diagnose", str(path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["label"] for line in lines] == ["data_io", "zombie", "unknown"]
    assert lines[1]["label"] == "zombie" and lines[1]["confident"] is True
    assert lines[2]["label"] == "unknown"


@pytest.mark.parametrize(
    "name, text, where",
    [
        ("bad.csv", "server,sm_active\na/,x\n", "line 2, column sm_active"),
        ("bad.jsonl", '{"sm_active": 2}\n', "line 1, column sm_active"),
    ],
)
def test_cli_bad_file_exits_2_naming_line_and_column(tmp_path, capsys, name, text, where):
    path = tmp_path / name
    path.write_text(text)
    assert main(["diagnose", str(path)]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and where in err


@pytest.mark.parametrize(
    "name, text, where",
    [
        # A cell over the csv module's 128 KiB limit (a log pasted into a note column).
        ("huge.csv", "server,sm_active,note\na/,0.5,x\nb/,0.5," + "x" * 200_000 + "\n", "line 3"),
        # An integer of 5,000 digits: past Python's limit on converting one.
        ("huge.jsonl", '{"server": "a/", "sm_active": 0.5}\n{"t": ' + "1" * 5000 + "}\n", "line 2"),
    ],
)
def test_cli_a_file_too_big_in_one_place_names_its_line(tmp_path, capsys, name, text, where):
    """These gave the csv module's traceback, or Python's words without the line."""
    path = tmp_path / name
    path.write_text(text)
    assert main(["diagnose", str(path)]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and f"error: {path}: {where}: " in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "name, text, where",
    [
        ("latin1.csv", "server,sm_active\na/,0.5\njos\xe9/,0.5\n", "line 3, character 4"),
        (
            "latin1.jsonl",
            '{"server": "a/", "sm_active": 0.5}\n{"server": "jos\xe9/", "sm_active": 0.5}\n',
            "line 2, character 16",
        ),
    ],
)
def test_cli_a_file_that_is_not_utf8_names_its_line_and_column(tmp_path, capsys, name, text, where):
    """A file saved as Latin-1 (``josé`` as one byte) is refused naming the file and where, as
    a bad value is; nothing is printed."""
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    assert main(["diagnose", str(path)]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and f"{path}: {where}: not UTF-8" in err, err


def test_cli_missing_file_and_bad_model(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "nope.csv")]) == EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err
    path = tmp_path / "w.csv"
    path.write_text(CSV)
    bad = tmp_path / "m.pkl"
    bad.write_bytes(b"junk")
    assert main(["diagnose", str(path), "--model", str(bad)]) == EXIT_USAGE
    assert "cannot load --model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["diagnose"])  # neither FILE nor --cluster
    with pytest.raises(SystemExit):
        main(["diagnose", str(path), "--cluster"])


def test_cli_cluster_report_from_the_service(capsys):
    """``--cluster`` reads ``GET api/diagnosis`` with the token and prints the report."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    answer = {
        "cost": {
            "days": 3,
            "gpu_hours": 10.0,
            "causes": {
                "zombie": {"gpu_hours": 4.0, "utilisation": 0.0, "recoverable_gpu_hours": 4.0,
                           "share": 0.4},
                "healthy": {"gpu_hours": 6.0, "utilisation": 0.7, "recoverable_gpu_hours": 0.0,
                            "share": 0.6},
            },
            "teams": {"vision": {"zombie": {"gpu_hours": 4.0, "utilisation": 0.0,
                                            "recoverable_gpu_hours": 4.0, "share": 0.4}}},
            "nodes": {},
        },
        "servers": [{"server": "alice/", "label": "uncertain", "cause": "data_io",
                     "confidence": 0.5, "confident": False,
                     "candidates": ["data_io", "cpu_serial"]}],
        "fragmentation": {"flag": True, "hint": "consolidate", "devices": 4,
                          "devices_partly_used": 2, "free_scattered": 1.0, "devices_free": 0,
                          "spawns_waiting": 1,
                          "demand": {"pending": 0, "queued": 1, "refused": None}},
    }  # fmt: skip
    seen = {}

    class Service(BaseHTTPRequestHandler):
        def do_GET(self):
            seen["path"], seen["auth"] = self.path, self.headers.get("Authorization")
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/services/gpu-gov/"
    try:
        assert main(["diagnose", "--cluster", "--days", "3", "--url", url, "--token", "t0k"]) == 0
        text = capsys.readouterr().out
        assert (
            main(["diagnose", "--cluster", "--format", "json", "--url", url, "--token", "t"]) == 0
        )
        assert json.loads(capsys.readouterr().out) == answer
        assert main(["diagnose", "--cluster", "--days", "0", "--url", url, "--token", "t"]) == 2
        assert main(["diagnose", "--cluster", "--url", url, "--token", ""]) == 2
    finally:
        server.shutdown()
    assert seen["path"].endswith("/api/diagnosis?days=7") or "days=" in seen["path"]
    assert seen["auth"] == "token t"
    assert "GPU-hours diagnosed, last 3 days: 10.0" in text
    assert "zombie" in text and "4.0 GPU-h" in text and "vision" in text
    assert "not sure: data_io or cpu_serial" in text
    assert "fragmentation: YES" in text
    assert "spawns waiting: 1 (starting 0, in line 1, refused in the last hour unknown)" in text


def test_cli_cluster_report_never_sends_the_token_where_a_redirect_points(capsys):
    """A wrong ``--url`` (a login page, a proxy sending the client elsewhere) answers with a
    redirect. urllib followed it with the ``Authorization`` header, to any host: the admin's
    token went wherever the answer pointed. Now the redirect is not followed and is named."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/services/"):
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/steal")
                self.end_headers()
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Elsewhere)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/services/gpu-gov/"
    try:
        assert main(["diagnose", "--cluster", "--url", url, "--token", "s3cret"]) == 2
    finally:
        server.shutdown()
    assert [path for path, _ in seen] == ["/services/gpu-gov/api/diagnosis?days=7"]
    said = capsys.readouterr().err
    assert "HTTP 302: redirected to http://127.0.0.1:" in said and "/steal, not followed" in said


# -- windows measured on a real GPU --------------------------------------------------------------

H200_DATA = Path(__file__).parent.parent / "benchmarks" / "data"
H200_RUNS = sorted(H200_DATA.glob("gpu-faults-h200-*.csv"))


@pytest.mark.parametrize("path", H200_RUNS, ids=lambda p: p.stem)
def test_windows_measured_on_an_h200(path):
    """Faults injected into a PyTorch loop on an H200 (``benchmarks/gpu_faults.py``: the
    server extension's sampler over NVML, GPM in DCGM's place on the ``-gpm`` node), the node
    learnt from its own windows, unlabelled."""
    windows = read_windows(path)
    with open(path) as f:
        truths = [row["truth"] for row in csv.DictReader(f)]
    model = Diagnoser(min_node_windows=10).fit(windows)
    said = model.diagnose_many(windows)
    for kind in ("-gpm", "-nvml"):
        mine = [i for i, window in enumerate(windows) if window.node.endswith(kind)]
        answered = [i for i in mine if said[i].label != "uncertain"]
        right = sum(said[i].label == truths[i] for i in answered) / len(answered)
        ruled = sum(rules.baseline(windows[i]).label == truths[i] for i in mine) / len(mine)
        # measured 0.5-1.0 against the rules' 0.29-0.57 (the mild run's faults cost the GPU a
        # third of its time: near healthy, and its 16 MiB elementwise loop is launch-bound)
        assert right >= 0.5 and right - ruled >= 0.2, (kind, right, ruled)
        assert len(answered) / len(mine) >= 0.7


def test_a_node_whose_loops_all_starve_does_not_call_them_fed():
    """Without the engine's activity a node's fed level is learnt from its own loops; a node
    whose loops are all starved has no fed loop to learn from, but no card's fed loops read
    under ``SM_FED_MIN``: a loop at 0.06 is starved on any card, not the node's normal."""
    starved = {
        "cpu": {"sm_active": 0.06, "dram_active": 0.02, "tensor_active": 0.02,
                "cpu_cores": 1.05, "cpu_top_thread": 1.0, "read_mb_s": 0.5,
                "gpu_mem_frac": 0.4, "cpu_iowait": 0.0},
        "reads": {"sm_active": 0.05, "dram_active": 0.02, "tensor_active": 0.02,
                  "cpu_cores": 0.3, "cpu_top_thread": 0.15, "read_mb_s": 300.0,
                  "gpu_mem_frac": 0.4, "cpu_iowait": 0.6},
    }  # fmt: skip
    rows = _history("slow", starved)
    assert _labels(Diagnoser().fit(rows), rows) == {"cpu": "cpu_serial", "reads": "data_io"}


def test_reading_nothing_tells_nothing_where_no_loop_is_seen_reading():
    """A waiting loop that reads nothing is a ``time.sleep`` or a wait on reads nobody counts;
    on a node whose loops are seen reading, reading nothing leans to the host; on a node
    whose storage's reads are never counted (a FUSE mount), it does not lean at all."""

    def model_of(reads: float) -> Diagnoser:
        loops = {name: {**values, "read_mb_s": reads if values["read_mb_s"] else 0.0}
                 for name, values in LOOPS.items()}  # fmt: skip
        return Diagnoser().fit(_history("n", loops))

    waiting = w(node="n", sm_active=0.15, gr_active=0.22, dram_active=0.05, tensor_active=0.07,
                cpu_cores=0.2, cpu_top_thread=0.2, read_mb_s=0.0, gpu_mem_frac=0.4)  # fmt: skip
    counted = model_of(200.0).diagnose(waiting)
    uncounted = model_of(0.0).diagnose(waiting)
    assert counted.cause == uncounted.cause == "data_io"
    # a waiting thread leans to data; reading nothing leans back where reads are counted
    assert counted.confidence < 0.6 < 0.75 < uncounted.confidence, (counted, uncounted)


def test_copies_outside_kernels_do_not_raise_the_nodes_dram_peak():
    """DRAM activity per unit of kernel time reads above 1 where memory moves outside kernels
    (copies while few kernels run); a memory interface is busy all the time at most, so those
    windows do not lift the node's peak past what its memory-bound loops can reach."""
    copies = {"sm_active": 0.3, "gr_active": 0.45, "dram_active": 0.9, "tensor_active": 0.05,
              "cpu_cores": 1.0, "cpu_iowait": 0.0, "read_mb_s": 5.0, "gpu_mem_frac": 0.5}  # fmt: skip
    rows = _history("fast", {**LOOPS, "copies": copies}, servers=3) + _history("fast", LOOPS)
    model = Diagnoser().fit(rows)
    assert model.nodes["fast", "engine"].peak <= 1.0
    memory = [r for r in rows if "-memory-" in r.server]
    assert _labels(model, memory) == {"memory": "memory_bandwidth"}


def test_a_tasks_reference_keeps_its_last_readings_packed():
    """A server's own best (the 90th percentile of its last ``TASK_KEEP`` running windows) is
    kept as numbers, not float objects: the service keeps one per running server (0.3 kB
    against a deque's 2.4; docs/benchmarks-history.md, "Issue 26, wave 14"). A model saved with the
    deque still learns."""
    import gc as collector
    from collections import deque

    from jupyter_gpu_gov.diagnose.reference import TASK_KEEP, TaskReference

    window = faults.generate(1, 1, seed=3)[0][0]
    task = TaskReference()
    for i in range(TASK_KEEP + 8):
        task.observe(replace(window, sm_active=i / 100, kernel_busy=True))
    task.observe(
        replace(window, sm_active=0.99, kernel_busy=False)
    )  # a waiting kernel: not its best
    last = [i / 100 for i in range(8, TASK_KEEP + 8)]
    assert list(task.sm) == last
    assert task.best_sm == sorted(last)[int(0.9 * TASK_KEEP)]
    assert not [o for o in collector.get_referents(task.sm) if isinstance(o, float)]
    old = TaskReference(sm=deque(last, maxlen=TASK_KEEP))  # as a format 8 model pickled it
    old.observe(replace(window, sm_active=0.5, kernel_busy=True))
    assert list(old.sm) == [*last[1:], 0.5]
