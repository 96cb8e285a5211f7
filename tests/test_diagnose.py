"""Root-cause diagnosis: rules, windows, the simulator, the counterfactual model (the CI
evaluation on a simulated set), fragmentation and ``jupyter-gpu-gov diagnose``."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_gpu_gov.cli import EXIT_USAGE, main
from jupyter_gpu_gov.diagnose import rules, simulate
from jupyter_gpu_gov.diagnose.counterfactual import UNEXPLAINED, Diagnoser, fragmentation
from jupyter_gpu_gov.diagnose.features import (
    COLUMNS,
    FEATURES,
    Window,
    in_context,
    read_windows,
    to_vector,
    windows_from_report,
    with_context,
)
from jupyter_gpu_gov.diagnose.labels import HINTS, LABELS, UNKNOWN

pytest.importorskip("sklearn")

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
        (
            {"sm_active": 0.05, "gpu_mem_frac": 0.3, "user_idle_s": 9e4, "kernel_busy": False},
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


def test_every_label_has_a_hint_and_only_healthy_and_unknown_have_none():
    for label in (*LABELS, "fragmentation", UNKNOWN):
        assert (HINTS[label] == "") == (label in ("healthy", UNKNOWN))


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


@pytest.mark.parametrize(
    "text, where",
    [
        ("server,sm_active\na/,0.5\nb/,x\n", "line 3, column sm_active: expected a number"),
        ("server,sm_active\na/,1.5\n", "line 2, column sm_active: must be in [0, 1]"),
        ("server,cpu_cores\na/,-1\n", "line 2, column cpu_cores: must be >= 0"),
        ("server,kernel_busy\na/,maybe\n", "line 2, column kernel_busy: expected true or false"),
        ("server,sm_active\na/,nan\n", "line 2, column sm_active: expected a finite number"),
        ("a,b\n1,2\n", "line 1: no diagnosis columns"),
        ('{"sm_active": 0.1}\n{"sm_active": true}\n', "line 2, column sm_active"),
        ('{"server": 3}\n', "line 1, column server: expected a string"),
        ('{"sm_active": 0.1}\n[1]\n', "line 2: expected a JSON object"),
        ('{"sm_active": 0.1}\n{bad\n', "line 2: not JSON"),
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
    assert simulate.generate(12, 20, seed=5) == simulate.generate(12, 20, seed=5)
    assert simulate.generate(12, 20, seed=5) != simulate.generate(12, 20, seed=6)


def test_the_simulator_covers_every_label_with_missing_values():
    rows = simulate.generate(84, 20, seed=2)
    truths = Counter(t for _, t in rows)
    assert set(LABELS) <= set(truths)
    per_server = Counter(dict((x.server, t) for x, t in rows if t != UNKNOWN).values())
    assert set(per_server.values()) == {14}  # 84 servers, six scenarios in equal numbers
    for column in COLUMNS[3:]:
        values = [getattr(window, column) for window, _ in rows]
        assert any(v is None for v in values), f"{column} is never missing"
        assert any(v is not None for v in values)
    assert all(t == UNKNOWN for window, t in rows if window.sm_active is None)
    nodes = {n.name: n for n in simulate.NODES}
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
    docs/benchmarks.md; 120 servers: with 60, ten per label, one chance draw of memory sizes
    decides the small_work figure)."""
    rows = [(w_, t) for w_, t in simulate.generate(120, 30, seed=3) if t not in (UNKNOWN,)]
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
    assert simulate.main(["--servers", "6", "--windows", "3", "--seed", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 18
    row = json.loads(lines[0])
    assert set(row) == {*COLUMNS, "truth"}
    assert simulate.main(["--servers", "2", "--windows", "2", "--format", "csv"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == ",".join([*COLUMNS, "truth"])
    assert len(read_windows(io.StringIO(text), name="x.csv")) == 4


# -- the counterfactual model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def evaluation():
    """The CI evaluation: train on one simulated set, score another (other seed, other
    servers, plus a node configuration the model never saw). A smaller set than the
    benchmark's (``python -m benchmarks.diagnose``)."""
    train = simulate.generate(180, 40, seed=1)
    test = simulate.generate(72, 40, seed=101, first_server=10_000)
    test += simulate.generate(
        12, 40, seed=102, nodes=(simulate.HELD_OUT_NODE,), first_server=20_000
    )
    model = Diagnoser().fit([window for window, _ in train])
    said = [d.label for d in model.diagnose_many([window for window, _ in test])]
    ruled = [rules.baseline(window).label for window, _ in test]
    scored = [i for i, (_, truth) in enumerate(test) if truth != UNKNOWN]

    def accuracy(labels):
        return sum(labels[i] == test[i][1] for i in scored) / len(scored)

    return {
        "model": model,
        "test": test,
        "said": said,
        "accuracy": accuracy(said),
        "rules": accuracy(ruled),
    }


def test_the_model_beats_the_rules_on_a_held_out_simulated_set(evaluation):
    # Measured 0.900 (model) against 0.600 (rules): issue 7's target (>= 90 %, >= 25 points)
    # on this set; the benchmark's larger sets give 89.3-93.3 % over ten seeds, 90.6 % on
    # average (docs/benchmarks.md).
    assert evaluation["accuracy"] >= 0.88
    assert evaluation["accuracy"] - evaluation["rules"] >= 0.27
    assert all(
        label == UNKNOWN
        for (window, _), label in zip(evaluation["test"], evaluation["said"], strict=True)
        if window.sm_active is None
    )


def test_small_kernels_are_told_from_an_idle_gpu_by_the_engine_activity(evaluation):
    # Where DCGM reports GR_ENGINE_ACTIVE, SM activity per unit of engine time shows kernels
    # too small to fill the GPU; without it a launch-bound loop looks CPU-bound.
    rows = [
        (w, t)
        for w, t in evaluation["test"]
        if t == "small_work" and w.gr_active is not None and w.kernel_busy
    ]
    model = evaluation["model"]

    def accuracy(windows):
        said = model.diagnose_many(windows)
        return sum(d.label == "small_work" for d in said) / len(said)

    seen = accuracy([w for w, _ in rows])
    blind = accuracy([replace(w, gr_active=None) for w, _ in rows])
    assert len(rows) > 100 and seen >= 0.75 and seen - blind >= 0.2, (seen, blind)  # 0.83, 0.52


def _top(diagnosis):
    causes = {k: v for k, v in diagnosis.contributions.items() if k != UNEXPLAINED}
    return max(causes, key=causes.get)


BUSY = {"tensor_active": 0.1, "pcie_mb_s": 100.0, "read_mb_s": 50.0, "user_idle_s": 100.0}


def test_a_starved_loader(evaluation):
    model = evaluation["model"]
    loader = w(
        sm_active=0.2, cpu_iowait=0.5, cpu_cores=0.4, gpu_mem_frac=0.6, dram_active=0.07, **BUSY
    )
    result = model.diagnose(loader)
    assert result.label == "data_io" and result.source == "model"
    # On this small training set the regressor learns next to no I/O-wait effect (the
    # benchmark's larger one does: +0.09 here), so the CPU split names it: an idle process.
    assert result.contributions["cpu_iowait"] >= 0
    assert result.hint == HINTS["data_io"]
    # Without I/O wait (no delay accounting), an idle process with an idle GPU is waiting.
    blind = w(
        node="a100-sxm", sm_active=0.2, cpu_cores=0.3, gpu_mem_frac=0.6, dram_active=0.08, **BUSY
    )
    assert model.diagnose(blind).label == "data_io"
    # Blocked on reads 46 % of the window while other threads keep 1.4 cores busy (a loader
    # decoding what it read, measured on an H200): the reads hold the GPU up, not the CPU.
    busy_reader = w(sm_active=0.02, gr_active=0.02, cpu_iowait=0.46, cpu_cores=1.4, **BUSY)
    assert model.diagnose(busy_reader).label == "data_io"


def test_memory_bound_small_work_and_a_cpu_loop(evaluation):
    model = evaluation["model"]
    membound = model.diagnose(
        w(
            sm_active=0.45,
            cpu_iowait=0.02,
            cpu_cores=2.0,
            gpu_mem_frac=0.5,
            dram_active=0.45,
            **BUSY,
        )
    )
    assert membound.label == "memory_bandwidth" and _top(membound) == "dram_active"
    # Tiny kernels: the engine runs 60 % of the time, the SMs are active 8 % (DCGM).
    tiny = dict(sm_active=0.08, gr_active=0.6, cpu_iowait=0.01, cpu_cores=0.95, dram_active=0.03)
    small = model.diagnose(w(gpu_mem_frac=0.05, **tiny, **BUSY))
    assert small.label == "small_work"
    # How much memory the loop holds says nothing about it (a healthy loop held 1.4 % of an H200).
    assert model.diagnose(w(gpu_mem_frac=0.9, **tiny, **BUSY)).label == "small_work"
    # Busy with long memory-bound kernels: every SM "active", DRAM at its practical peak.
    saturated = model.diagnose(w(sm_active=0.98, gr_active=0.99, dram_active=0.89, **BUSY))
    assert saturated.label == "memory_bandwidth"
    assert model.diagnose(w(sm_active=0.98, gr_active=0.99, dram_active=0.4, **BUSY)).label == (
        "healthy"
    )
    loop = model.diagnose(
        w(sm_active=0.2, cpu_iowait=0.01, cpu_cores=1.0, gpu_mem_frac=0.6, dram_active=0.07, **BUSY)
    )
    assert loop.label == "cpu_serial"
    assert loop.contributions[UNEXPLAINED] > max(
        v for k, v in loop.contributions.items() if k != UNEXPLAINED
    )


def _loops(node, kinds, per_kind=60):
    """Windows of one node: for each kind (sm, gr, dram, cores), ``per_kind`` windows of one
    server each, with a little noise so that every column varies."""
    rows = []
    for k, (sm, gr, dram, cores) in enumerate(kinds):
        for i in range(per_kind):
            jitter = 1.0 + 0.01 * ((i * 7 + k) % 5 - 2)
            rows.append(
                w(
                    node=node,
                    server=f"{node}-{k}-{i}/",
                    sm_active=sm * jitter,
                    gr_active=gr * jitter,
                    dram_active=dram * jitter,
                    cpu_cores=cores,
                    cpu_iowait=0.0,
                )
            )
    return rows


def test_dram_is_read_against_the_nodes_peak_and_the_best_state_computes():
    """A node whose best loops move little data does not call its ordinary loops memory-bound
    (their DRAM per kernel time is twice the best's, far from the card's peak); the best state
    is the best of the loops that compute, not a memory-bound loop's busy-looking SMs; a node
    that never ran a memory-bound loop does not call its heaviest ordinary one memory-bound."""
    fast = (0.85, 0.95, 0.19, 1.0)  # DRAM 0.2 of kernel time
    cpu_loop = (0.30, 0.33, 0.15, 1.0)  # 0.45: an ordinary mix, one core busy all the time
    memory = (0.97, 0.98, 0.9, 1.0)  # 0.92: at the interface's peak
    history = _loops("card", [fast, cpu_loop, memory]) + _loops("plain", [fast, cpu_loop])
    model = Diagnoser(min_node_windows=30, min_windows=50, context=1).fit(history)
    card, plain = model.state("card"), model.state("plain")
    assert card.best_sm == pytest.approx(0.85, abs=0.02)  # not the memory-bound loop's 0.97
    assert card.best["dram_active"] == pytest.approx(0.2, abs=0.02)
    assert card.peak["dram_active"] == pytest.approx(0.92, abs=0.03)
    assert plain.peak["dram_active"] == pytest.approx(0.45, abs=0.03)

    def label(node, sm, gr, dram, cores):
        return model.diagnose(
            w(node=node, sm_active=sm, gr_active=gr, dram_active=dram, cpu_cores=cores,
              cpu_iowait=0.0)
        ).label  # fmt: skip

    assert label("card", *cpu_loop) == "cpu_serial"
    assert label("card", *memory) == "memory_bandwidth"
    assert label("card", *fast) == "healthy"
    assert label("plain", *cpu_loop) == "cpu_serial"  # its own peak, but under the floor


def test_before_the_model(evaluation):
    model = evaluation["model"]
    assert model.diagnose(w(sm_active=None, cpu_iowait=0.9)).label == "unknown"
    zombie = w(sm_active=0.0, gpu_mem_frac=0.4, user_idle_s=2 * IDLE, kernel_busy=False)
    assert model.diagnose(zombie).label == "zombie"
    assert model.diagnose(zombie).source == "rules"
    assert (
        model.diagnose(
            w(sm_active=0.0, gpu_mem_frac=0.4, user_idle_s=60.0, kernel_busy=False)
        ).label
        == "healthy"
    )
    assert model.diagnose(w(sm_active=0.9, cpu_cores=3.0)).label == "healthy"
    # An unseen node is scored with every node's best state.
    unseen = w(node="elsewhere", sm_active=0.2, cpu_iowait=0.5, cpu_cores=0.4, gpu_mem_frac=0.6)
    assert model.diagnose(unseen).label == "data_io"


def test_too_little_history_falls_back_to_the_rules():
    rows = [window for window, _ in simulate.generate(6, 5, seed=1)]
    model = Diagnoser().fit(rows)
    assert not model.fitted
    window = w(sm_active=0.3, cpu_iowait=0.5)
    assert model.diagnose(window) == rules.baseline(window)


def test_save_and_load(evaluation, tmp_path):
    model, test = evaluation["model"], evaluation["test"]
    path = tmp_path / "model.pkl"
    model.save(path)
    loaded = Diagnoser.load(path)
    windows = [window for window, _ in test[:400]]
    assert loaded.diagnose_many(windows) == model.diagnose_many(windows)
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a diagnosis model"):
        Diagnoser.load(bad)


def test_scoring_is_fast_and_batch_matches_single(evaluation):
    import time

    model, test = evaluation["model"], evaluation["test"]
    windows = [window for window, _ in test[:: len(test) // 200]]
    assert [model.diagnose(x) for x in windows] == model.diagnose_many(windows)
    times = []
    for window in windows:
        started = time.perf_counter()
        model.diagnose(window)
        times.append(time.perf_counter() - started)
    assert sorted(times)[len(times) // 2] < 0.010


# -- fragmentation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "used, waiting, flagged",
    [
        ([0.5, 0.5, 1.0], 1, True),  # a whole card free, in two halves
        ([0.5, 0.5, 1.0], 0, False),  # nobody waits
        ([0.5, 0.5, 0.0], 2, False),  # a card is free: not fragmentation
        ([0.75, 0.75, 1.0], 3, False),  # half a card free in all
        ([0.3, 1.0, 1.0], 1, False),  # one partly used card
        ([0.25, 0.5, 0.6, 1.0], 1, True),
        ([], 5, False),
    ],
)
def test_fragmentation(used, waiting, flagged):
    result = fragmentation(used, waiting)
    assert (result is not None) == flagged
    if flagged:
        assert result.label == "fragmentation"
        assert result.hint == HINTS["fragmentation"]
        assert result.contributions["waiting"] == waiting


# -- the command line ----------------------------------------------------------------------------


def _rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def windows_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("diagnose") / "windows.jsonl"
    rows = simulate.generate(42, 20, seed=4)
    path.write_text("".join(json.dumps({**x.as_dict(), "truth": t}) + "\n" for x, t in rows))
    return path, rows


def test_cli_trains_on_the_file_and_prints_one_line_per_row(windows_file, capsys):
    path, rows = windows_file
    assert main(["diagnose", str(path)]) == 0
    out, err = capsys.readouterr()
    printed = _rows(out)
    assert len(printed) == len(rows)
    assert [(p["server"], p["t"]) for p in printed] == [(x.server, x.t) for x, _ in rows]
    assert set(printed[0]) == {"server", "t", "label", "contributions", "hint", "source"}
    assert {p["label"] for p in printed} <= {*LABELS, UNKNOWN}
    assert all(
        p["label"] == UNKNOWN
        for p, (x, _) in zip(printed, rows, strict=True)
        if x.sm_active is None
    )
    summary = json.loads(err)
    assert summary["by"] == "model trained on FILE" and summary["windows"] == len(rows)
    assert any(p["source"] == "model" for p in printed)


def test_cli_baseline_and_a_saved_model(windows_file, tmp_path, capsys):
    path, rows = windows_file
    assert main(["diagnose", str(path), "--baseline"]) == 0
    baseline = _rows(capsys.readouterr().out)
    assert [p["label"] for p in baseline] == [rules.baseline(x).label for x, _ in rows]
    model = tmp_path / "m.pkl"
    assert main(["diagnose", str(path), "--save-model", str(model)]) == 0
    trained = _rows(capsys.readouterr().out)
    assert main(["diagnose", str(path), "--model", str(model)]) == 0
    assert _rows(capsys.readouterr().out) == trained


def test_cli_csv(tmp_path, capsys):
    path = tmp_path / "w.csv"
    path.write_text(CSV)
    assert main(["diagnose", str(path)]) == 0  # too little history: the rules answer
    out, err = capsys.readouterr()
    printed = _rows(out)
    assert [p["label"] for p in printed] == ["data_io", "zombie", "unknown"]
    assert [p["server"] for p in printed] == ["alice/", "bob/x", "carol/"]
    assert printed[0]["hint"] == HINTS["data_io"] and printed[0]["source"] == "rules"
    assert "too few to train" in json.loads(err)["note"]
    assert main(["diagnose", str(path), "--save-model", str(tmp_path / "m.pkl")]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and "no model to save" in err and not (tmp_path / "m.pkl").exists()


@pytest.mark.parametrize(
    "name, text, where",
    [
        ("w.csv", "server,sm_active\na/,0.5\nb/,high\n", "line 3, column sm_active"),
        (
            "w.jsonl",
            '{"sm_active": 0.5}\n{"sm_active": 0.2, "kernel_busy": "sometimes"}\n',
            "line 2, column kernel_busy",
        ),
    ],
)
def test_cli_bad_file_exits_2_naming_line_and_column(tmp_path, capsys, name, text, where):
    path = tmp_path / name
    path.write_text(text)
    assert main(["diagnose", str(path)]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        err.count("\n") == 1 and where in err and err.startswith("jupyter-gpu-gov diagnose: error:")
    )


def test_cli_missing_file_and_bad_model(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "nope.csv")]) == EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err
    path = tmp_path / "w.csv"
    path.write_text(CSV)
    bad = tmp_path / "bad.pkl"
    bad.write_text("nope")
    assert main(["diagnose", str(path), "--model", str(bad)]) == EXIT_USAGE
    assert "cannot load --model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["diagnose", str(path), "--baseline", "--model", str(bad)])
    assert caught.value.code == EXIT_USAGE


# -- windows measured on a real GPU --------------------------------------------------------------

H200_DATA = Path(__file__).parent.parent / "benchmarks" / "data"
H200_RUNS = sorted(H200_DATA.glob("gpu-faults-h200-*.csv"))


@pytest.mark.parametrize("variant", ["strong", "moderate", "fresh"])
def test_windows_measured_on_an_h200(evaluation, variant):
    """Faults injected into a PyTorch loop on an H200 (``benchmarks/gpu_faults.py``: the
    server extension's sampler over NVML, GPM in DCGM's place on the ``-gpm`` node), scored by
    the model trained on simulated history only: the H200 is a node it has never seen. (The
    ``mild`` faults are too close to the card's best for a borrowed best state: next test.)
    ``fresh`` was collected after the model's last change."""
    path = H200_DATA / f"gpu-faults-h200-{variant}.csv"
    model = evaluation["model"]
    windows = read_windows(path)
    with open(path) as f:
        scenarios = [(row["scenario"], row["truth"]) for row in csv.DictReader(f)]
    said = [d.label for d in model.diagnose_many(windows)]
    by = {}
    for window, (scenario, truth), label in zip(windows, scenarios, said, strict=True):
        by.setdefault((window.node.rsplit("-", 1)[1], scenario), []).append((truth, label))

    def right(node, scenario):
        pairs = by[(node, scenario)]
        return sum(t == label for t, label in pairs) / len(pairs)

    for node in ("gpm", "nvml"):
        for scenario in ("healthy", "zombie", "data_io", "cpu_serial"):
            assert right(node, scenario) >= 0.75, (node, scenario, by[(node, scenario)])
    # Tiny kernels show in GPM's occupancy; with NVML alone a launch-bound loop looks CPU-bound.
    assert right("gpm", "small_work") >= 0.75
    if variant != "moderate":  # 0.5-1 GiB tensors: long kernels, DRAM at its peak
        assert min(right("gpm", "memory_bound"), right("nvml", "memory_bound")) >= 0.75
    scored = [pair for (node, _), pairs in by.items() if node == "gpm" for pair in pairs]
    model_right = sum(t == label for t, label in scored) / len(scored)
    rules_right = sum(
        rules.baseline(window).label == truth
        for window, (_, truth) in zip(windows, scenarios, strict=True)
        if window.node.endswith("-gpm")
    ) / len(scored)
    # Measured 0.75-0.857 (rules 0.429-0.571). Two scenarios are not one cause: a loop that
    # sleeps computes nothing and reads nothing (the model reads it as a wait: `data_io`),
    # and the moderate run's 16 MiB elementwise loop is launch-bound more than memory-bound.
    assert model_right >= 0.75 and model_right - rules_right >= 0.25, (model_right, rules_right)


@pytest.mark.parametrize("path", H200_RUNS, ids=lambda p: p.stem)
def test_windows_measured_on_an_h200_with_the_nodes_history(path):
    """As the service runs once the node has history: trained on the simulated history plus
    the H200's own windows, unlabelled; the node's best state is its own."""
    windows = read_windows(path)
    with open(path) as f:
        truths = [row["truth"] for row in csv.DictReader(f)]
    history = [window for window, _ in simulate.generate(180, 40, seed=1)]
    model = Diagnoser(min_node_windows=30).fit(history + windows)
    said = model.diagnose_many(windows)
    for kind in ("-gpm", "-nvml"):
        mine = [i for i, window in enumerate(windows) if window.node.endswith(kind)]
        right = sum(said[i].label == truths[i] for i in mine) / len(mine)
        ruled = sum(rules.baseline(windows[i]).label == truths[i] for i in mine) / len(mine)
        # measured 0.714-0.857 against the rules' 0.286-0.571 (the sleep loop and the
        # moderate elementwise loop: the test above)
        assert right >= 0.7 and right - ruled >= 0.25, (kind, right, ruled)
