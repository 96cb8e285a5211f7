"""Root-cause diagnosis, held out: every parameter chosen on one world, measured on the others.

    python -m benchmarks.diagnose [--servers 180] [--windows 60] [--seed 1] [--quick]
    python -m benchmarks.diagnose --tune-on --confusion    # the shipped constants alone, ~15 s

Worlds (``benchmarks/worlds``): ``project`` (the project's own simulator), ``roofline``,
``fleet``, ``pipeline``, ``archetypes``, ``traces``, ``degraded``, ``sixteen`` and
``contention``, each written from its own physics and apart from the model; plus the windows
measured on a real H200
(``benchmarks/data/gpu-faults-h200-*.csv``).

Protocol. The shipped constants are ``Params()``'s defaults, the values the physics gives
(``PHYSICAL``, argued in ``diagnose/counterfactual.py``); no world chose them, and every world
is scored with them. Beside them, for each world T: a *tuning* set (``--servers`` servers,
seed ``--seed``) on which ``tune`` chooses every constant of ``GRID`` (a coordinate search,
against the truth: the one place labels are used), and a *test* set of every world (other
servers, seed ``--seed + 100``). The model tuned on T scores every test set and the H200
windows; T's own test set is in-sample for its constants (marked ``*``). Scoring is *online*:
windows in time order, each node's reference learned from its first windows on, each window
scored as it arrives (``Diagnoser.observe`` then ``score``), as the service runs; ``--history``
adds the batch protocol (``fit`` on the whole test set unlabelled, then ``diagnose_many``, as
``jupyter-gpu-gov diagnose FILE`` runs).

Figures: accuracy over the windows the model answers (not ``uncertain``), coverage (the share it
answers), accuracy per label, zombie recall, the share of healthy windows called zombie, and
"strict" accuracy (``uncertain`` counted wrong); the rules (``rules.baseline``) on the same
windows; the shipped constants again on every test set with only the base columns (no
``gr_active``, no ``cpu_top_thread``: what a hub that does not report them, or a simulator that
does not write them, gives); then the online cost per window. ``--confusion`` adds every
world's confusion matrix (shipped constants, online: truth by row, answer by column,
``uncertain`` last), the cells the wrong answers are in; ``--startup`` the figures of each
server's first running windows (its start-up: the model and data loaded) apart from the rest;
``--calibration`` how often the answers are right in each band of confidence (is a sure
answer surer?) and how often an ``uncertain`` window's likelier candidate is the truth;
``--abstentions`` the ``uncertain`` windows by candidate pair (their truths, how many on young
nodes) and what answering the likelier candidate would give at lower thresholds;
``--cells N`` each world's N largest wrong cells (a truth answered as another label): the medians
of their windows as the model read them and of each signal against the node's reference and the
task's best then, beside the right answers of the truth and of the answer;
``--without COLUMN ...`` scores the test sets with those columns missing from every window, as a
file without them reads; ``--set NAME=VALUE ...`` scores the shipped row (and everything printed
of it, and the start of tuning) with those constants of ``Params`` changed: a change of constant
measured the way the shipped one is. ``--draws SEED ...`` scores every world's test set of each
tuning seed (and the H200 windows) with the physical constants and with ``--set``'s, on the same
windows, and says whether the change passes the rule the rounds keep (``losses``: no world loses
0.3 points of accuracy or coverage on any draw, zombie recall does not fall, at most 1 % of the
healthy windows called zombie); ``--tune-on --draws 1 201 -99`` alone prints the shipped row on
three draws.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from collections import Counter, deque
from dataclasses import fields, replace
from functools import partial
from pathlib import Path

from jupyter_gpu_gov.diagnose import rules
from jupyter_gpu_gov.diagnose.counterfactual import Diagnoser, Params
from jupyter_gpu_gov.diagnose.features import COLUMNS, is_running, read_windows
from jupyter_gpu_gov.diagnose.labels import HEALTHY, LABELS, UNCERTAIN, UNKNOWN, ZOMBIE
from jupyter_gpu_gov.diagnose.reference import dram_intensity, kernel_time, kind_of, occupancy

from .worlds import WORLDS, generate

DATA = Path(__file__).parent / "data"
H200 = "h200"
SHIPPED = "physical"

# The shipped constants: what the physics gives (``Params``' docstring argues each); ``tune``
# starts from them.
PHYSICAL = Params()

# The constants ``tune`` searches, and the values it tries for each.
GRID = {
    "fed": (0.65, 0.7, 0.75, 0.8, 0.85),
    "waiting": (0.5, 0.65, 0.75, 0.9),
    "io": (0.15, 0.25, 0.35, 0.5),
    "small": (0.55, 0.6, 0.7, 0.8),
    "light_traffic": (0.3, 0.4, 0.5, 0.6),
    "memory_bound": (0.55, 0.6, 0.65, 0.7, 0.75),
    "memory_heavy": (1.4, 1.8, 2.2, 2.6),
    "memory_fed": (0.4, 0.5, 0.6, 0.7),
    "saturated": (0.7, 0.85, 1.0),
    "underfilled": (0.3, 0.45, 0.6),
    "memory_weight": (0.0, 0.4, 0.55, 0.7, 0.85),
    "light_weight": (0.5, 0.65, 0.75, 0.9),
    "occupancy_says": (0.0, 0.3, 0.6, 0.9),
    "launch_time": (0.0, 0.03, 0.06, 0.1),
    "idle_thread": (0.25, 0.5, 0.75, 1.0),
    "reads_weight": (1.0, 2.0, 3.0),
    "unread_weight": (0.6, 1.2, 1.8),
    "io_weight": (1.0, 2.0, 3.0),
    "host_weight": (1.0, 1.5, 2.0),
    "storage_share": (3.0, 10.0, 30.0),
    "confident": (0.5, 0.55, 0.6, 0.65),
}
# The columns beyond the base ones: dropped for the "base columns" table.
OPTIONAL = ("gr_active", "cpu_top_thread")
MIN_COVERAGE = 0.9
MIN_GAIN = 0.003  # a constant moves from its physical value only for this much objective
# ``--draws``: a change is kept only if no world loses this much accuracy or coverage on any
# draw (0.3 points: more than the rounding of two figures to 0.1), zombie recall does not fall
# and at most ZOMBIE_FALSE of the healthy windows are called zombie.
RULE_LOSS = 3  # tenths of a point
ZOMBIE_FALSE = 0.01


# -- scoring ---------------------------------------------------------------------------------------


def online(
    rows,
    params: Params,
    min_node_windows: int = 30,
    maturity: list | None = None,
    readings: list | None = None,
) -> list:
    """Each window scored as it arrives, in time order (ties: as given), the model learning
    each node from its first windows on; diagnoses in the order of ``rows``. ``maturity``, a
    list: filled with how far each window's node (and kind) had replaced the prior by then
    (``NodeReference.maturity``; 0 where it has none), in the order of ``rows``. ``readings``,
    a list: filled with each window as the model read it (in context) and against its node's
    and task's history then (``against_history``)."""
    model = Diagnoser(params, min_node_windows=min_node_windows)
    recent: dict = {}
    out = [None] * len(rows)
    if maturity is not None:
        maturity[:] = [0.0] * len(rows)
    if readings is not None:
        readings[:] = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0].t or 0.0, i))
    for i in order:
        w = rows[i][0]
        earlier = recent.setdefault((w.node, w.server), deque(maxlen=model.context))
        read = model.with_context(w, earlier)
        model.observe(read)
        out[i] = model.score(read)
        if maturity is not None and (ref := model.nodes.get((w.node or "", kind_of(w)))):
            maturity[i] = ref.maturity(model.min_node_windows, model.min_node_servers)
        if readings is not None:
            readings[i] = against_history(model, read)
        if is_running(w) and w.t is not None:
            earlier.append(w)
    return out


def _ratio(a, b) -> float:
    return a / b if a is not None and b is not None and b > 0 else math.nan


def against_history(model: Diagnoser, w) -> dict:
    """A window (in context) as ``--cells`` prints it: its own columns, and — running — each
    signal against its node's reference (blended with the prior while the node is young, as
    the model reads it) and its SM activity against its task's best."""
    out = {c: math.nan if getattr(w, c) is None else getattr(w, c) for c in CELL_COLUMNS}
    if not is_running(w):
        return out
    kind = kind_of(w)
    ref = model.nodes.get((w.node or "", kind))
    figure = partial(model._reference, ref, kind)  # as the model reads the node
    task = model.tasks.get((w.node or "", w.server)) if w.server is not None else None
    usual = figure("log_mem")
    return out | {
        "kernel/fed": _ratio(kernel_time(w), figure("fed_level")),
        "occ/fed": _ratio(occupancy(w), figure("occupancy")),
        "dram/peak": _ratio(dram_intensity(w), figure("peak")),
        "dram/compute": _ratio(dram_intensity(w), figure("compute_dram")),
        "mem/usual": _ratio(w.gpu_mem_frac, math.exp(usual) if math.isfinite(usual) else None),
        "sm/task": _ratio(w.sm_active, task.best_sm if task is not None and task.sm else None),
    }


def batch(rows, params: Params, min_node_windows: int = 30) -> list:
    """``fit`` on the windows (unlabelled), then ``diagnose_many``."""
    windows = [w for w, _ in rows]
    model = Diagnoser(params, min_node_windows=min_node_windows).fit(windows)
    return model.diagnose_many(windows)


def figures(rows, diagnoses) -> dict:
    """Accuracy over answered windows, coverage, per label; zombie recall and false zombies."""
    hits, answered, total, confusion = Counter(), Counter(), Counter(), Counter()
    false_zombie = 0
    for (_, truth), d in zip(rows, diagnoses, strict=True):
        if truth == UNKNOWN:
            continue
        total[truth] += 1
        confusion[truth, d.label] += 1
        if d.label == UNCERTAIN:
            continue
        answered[truth] += 1
        hits[truth] += d.label == truth
        false_zombie += truth == HEALTHY and d.label == ZOMBIE
    n, a = sum(total.values()), sum(answered.values())
    return {
        "accuracy": sum(hits.values()) / max(1, a),
        "coverage": a / max(1, n),
        "strict": sum(hits.values()) / max(1, n),  # uncertain counted wrong
        "labels": {k: hits[k] / answered[k] for k in LABELS if answered[k]},
        "label_coverage": {k: answered[k] / total[k] for k in LABELS if total[k]},
        "zombie_recall": hits[ZOMBIE] / max(1, total[ZOMBIE]),
        "healthy_as_zombie": false_zombie / max(1, total[HEALTHY]),
        "windows": n,
        "confusion": dict(confusion),  # (truth, answer) -> windows
    }


def objective(f: dict) -> float:
    """What ``tune`` maximises: overall and worst-label accuracy, coverage at least 90 %."""
    worst = min(f["labels"].values(), default=0.0)
    return f["accuracy"] + 0.5 * worst - 4.0 * max(0.0, MIN_COVERAGE + 0.02 - f["coverage"])


def tune(rows, base: Params | None = None, rounds: int = 2, grid=GRID) -> Params:
    """Coordinate search of ``grid`` on labelled ``rows``: each constant in turn set to the
    value that scores best with the others fixed, ``rounds`` times over. The references are
    learnt once (they do not depend on these constants); the windows are rescored."""
    params = base or PHYSICAL
    windows = [w for w, _ in rows]
    model = Diagnoser(params).fit(windows)
    read = model.in_context(windows)

    def score(p: Params) -> float:
        model.params = p
        return objective(figures(rows, model.diagnose_many(read, context=False, learn=False)))

    best = score(params)
    for _ in range(rounds):
        for name, values in grid.items():
            for value in values:
                trial = params.replace(**{name: value})
                value_score = score(trial)
                if value_score > best + MIN_GAIN:
                    best, params = value_score, trial
    return params


# -- the H200 windows ------------------------------------------------------------------------------


def h200_rows() -> list:
    """Every measured window with its truth (node names kept apart per run)."""
    rows = []
    for path in sorted(DATA.glob("gpu-faults-h200-*.csv")):
        with open(path) as f:
            truths = [row["truth"] for row in csv.DictReader(f)]
        run = path.stem.rsplit("-", 1)[1]
        for w, truth in zip(read_windows(path), truths, strict=True):
            rows.append((w.__class__(**{**w.as_dict(), "node": f"{w.node}-{run}"}), truth))
    return rows


def score_world(rows, params: Params, protocol: str, small_nodes: bool = False) -> dict:
    minimum = 10 if small_nodes else 30
    run = online if protocol == "online" else batch
    return figures(rows, run(rows, params, minimum))


# A server's first running windows: its start-up (the model and data loaded, kernels compiled).
STARTUP = 3


def startup_split(rows, diagnoses, first: int = STARTUP) -> dict:
    """``figures`` of each server's first ``first`` running windows (in time order) and of
    every other window: how far the start-up is what the model gets wrong."""
    seen: Counter = Counter()
    parts: dict = {"start-up": ([], []), "rest": ([], [])}
    for i in sorted(range(len(rows)), key=lambda i: (rows[i][0].t or 0.0, i)):
        w = rows[i][0]
        running = is_running(w)
        part = parts["start-up" if running and seen[w.node, w.server] < first else "rest"]
        seen[w.node, w.server] += running
        part[0].append(rows[i])
        part[1].append(diagnoses[i])
    return {name: figures(r, d) for name, (r, d) in parts.items()}


# Bands of confidence, from the threshold of an answer (``Params.confident``) up.
BANDS = (0.7, 0.85, 1.0)


def calibration(rows, diagnoses, confident: float = PHYSICAL.confident) -> dict:
    """How often the answers are right in each band of confidence — ``(low, high)`` ->
    ``(right, answered)``, zombies apart (a definition, not a reading) — and, under
    ``"uncertain"``, how often an uncertain window's likelier candidate is the truth."""
    ranges = list(zip((confident, *BANDS[:-1]), BANDS, strict=True))
    right, counted = Counter(), Counter()
    for (_, truth), d in zip(rows, diagnoses, strict=True):
        if truth in (UNKNOWN, ZOMBIE) or d.label in (UNKNOWN, ZOMBIE):
            continue
        if d.label == UNCERTAIN:
            band, said = "uncertain", d.cause
        else:
            band = next((b for b in ranges if d.confidence < b[1]), ranges[-1])
            said = d.label
        right[band] += said == truth
        counted[band] += 1
    return {band: (right[band], counted[band]) for band in (*ranges, "uncertain")}


# Confidences down to which ``abstentions`` answers the likelier candidate (0: every window).
FRONTIER = (0.5, 0.45, 0.4, 0.0)


def abstentions(rows, diagnoses, maturity) -> dict:
    """Where the model says ``uncertain``: its windows by candidate pair (their truths, and how
    often the likelier candidate is the truth), how many are on young nodes (``maturity`` under
    1: the node not yet its own reference), and what answering the likelier candidate down to
    each confidence of ``FRONTIER`` would give — ``figures`` of the model with
    ``Params.confident`` lowered there, as an uncertain window's likelier candidate is the label
    it would then say."""
    truths: dict = {}  # candidate pair -> Counter of the truths
    right, young = Counter(), 0
    for (_, truth), d, mature in zip(rows, diagnoses, maturity, strict=True):
        if truth == UNKNOWN or d.label != UNCERTAIN:
            continue
        pair = "/".join(sorted(d.candidates))
        truths.setdefault(pair, Counter())[truth] += 1
        right[pair] += d.cause == truth
        young += mature < 1.0
    frontier = {}
    for lowest in FRONTIER:
        said = [
            replace(d, label=d.cause) if d.label == UNCERTAIN and d.confidence >= lowest else d
            for d in diagnoses
        ]
        frontier[lowest] = figures(rows, said)
    ranked = sorted(truths, key=lambda pair: -truths[pair].total())
    return {
        "uncertain": sum(c.total() for c in truths.values()),
        "likelier_right": right.total(),
        "young": young,
        "pairs": {pair: (truths[pair], right[pair]) for pair in ranked},
        "frontier": frontier,
    }


# ``--cells``: the columns a window shows, then its signals against its node's and task's history.
CELL_COLUMNS = ("sm_active", "gr_active", "dram_active", "tensor_active", "gpu_mem_frac",
                "cpu_cores", "cpu_top_thread", "cpu_iowait", "read_mb_s")  # fmt: skip
CELL_HISTORY = ("kernel/fed", "occ/fed", "dram/peak", "dram/compute", "mem/usual", "sm/task")


def cells(rows, diagnoses, readings, largest: int) -> list:
    """The ``largest`` off-diagonal cells of running windows (a truth answered as another
    label), biggest first: ``(truth, answer, windows, medians)``, ``medians`` of the cell's
    windows (``"cell"``) and, beside them, of the running windows its truth and its answer are
    right on (``"truth"``, ``"answer"``) — each a dict of every ``CELL_COLUMNS`` and
    ``CELL_HISTORY`` (nan: never measured there)."""
    groups: dict = {}
    for (w, truth), d, reading in zip(rows, diagnoses, readings, strict=True):
        if truth != UNKNOWN and d.label not in (UNCERTAIN, UNKNOWN) and is_running(w):
            groups.setdefault((truth, d.label), []).append(reading)

    def medians(readings) -> dict:
        out = {}
        for name in (*CELL_COLUMNS, *CELL_HISTORY):
            values = [r[name] for r in readings if name in r and not math.isnan(r[name])]
            out[name] = statistics.median(values) if values else math.nan
        return out

    wrong = sorted((k for k in groups if k[0] != k[1]), key=lambda k: -len(groups[k]))
    out = []
    for truth, answer in wrong[:largest]:
        rows_of = {"cell": (truth, answer), "truth": (truth, truth), "answer": (answer, answer)}
        found = {row: medians(groups.get(key, [])) for row, key in rows_of.items()}
        out.append((truth, answer, len(groups[truth, answer]), found))
    return out


def without_columns(rows, columns) -> list:
    """``rows`` with ``columns`` missing from every window, as a file without them reads."""
    return [(replace(w, **dict.fromkeys(columns)), truth) for w, truth in rows]


def design_columns(rows) -> list:
    """``rows`` with the columns beyond the base ones (``OPTIONAL``) missing."""
    return without_columns(rows, OPTIONAL)


def paired_draws(seeds, servers: int, windows: int, changed: Params, worlds) -> dict:
    """Every world's test set of each tuning seed in ``seeds`` (test seed ``seed + 100``, as the
    table's), and the H200 windows once, scored online with the physical constants and with
    ``changed``: ``(world, test seed) -> (shipped figures, changed figures)`` (the H200's seed:
    None). The same windows before and after: a change read on the paired difference, draw by
    draw, not against the spread between draws."""
    sets = {
        (n, seed + 100): generate(n, servers, windows, seed + 100, first_server=50_000)
        for seed in seeds
        for n in worlds
    }
    sets[(H200, None)] = h200_rows()
    out = {}
    for (e, seed), rows in sets.items():
        minimum = 10 if e == H200 else 30
        out[(e, seed)] = (figures(rows, online(rows, PHYSICAL, minimum)),
                          figures(rows, online(rows, changed, minimum)))  # fmt: skip
    return out


def losses(shipped: dict, changed: dict) -> list[str]:
    """What the change loses on one set by ``--draws``' rule (empty: nothing): accuracy or
    coverage down ``RULE_LOSS`` tenths of a point or more (figures rounded as printed), zombie
    recall down, more than ``ZOMBIE_FALSE`` of the healthy windows called zombie."""
    lost = []
    for name in ("accuracy", "coverage"):
        if round(changed[name] * 1000) - round(shipped[name] * 1000) <= -RULE_LOSS:
            lost.append(name)
    if changed["zombie_recall"] < shipped["zombie_recall"]:
        lost.append("zombie recall")
    if changed["healthy_as_zombie"] > ZOMBIE_FALSE:
        lost.append("healthy called zombie")
    return lost


# -- the table -------------------------------------------------------------------------------------


def run(args) -> dict:
    names = args.worlds or list(WORLDS)
    tests = {
        n: generate(n, args.servers, args.windows, args.seed + 100, first_server=50_000)
        for n in names
    }
    tests[H200] = h200_rows()
    if args.without:  # as a file without those columns reads (``features.unmeasured``)
        tests = {e: without_columns(rows, args.without) for e, rows in tests.items()}
    shipped = PHYSICAL.replace(**getattr(args, "set", None) or {})  # ``--set``: a change measured
    tuned, seconds = {SHIPPED: shipped}, {SHIPPED: 0.0}
    for name in args.tune_on if args.tune_on is not None else names:
        started = time.perf_counter()
        rows = generate(name, args.servers, args.windows, args.seed)
        tuned[name] = tune(rows, shipped, rounds=args.rounds) if args.rounds else shipped
        seconds[name] = time.perf_counter() - started
    protocols = ["online", "history"] if args.history else ["online"]
    table = {}
    for protocol in protocols:
        for t, params in tuned.items():
            for e, rows in tests.items():
                table[(protocol, t, e)] = score_world(rows, params, protocol, e == H200)
    design = {
        e: score_world(design_columns(rows), shipped, "online", e == H200)
        for e, rows in tests.items()
    }
    startup = {}
    if args.startup:
        for e, rows in tests.items():
            startup[e] = startup_split(rows, online(rows, shipped, 10 if e == H200 else 30))
    calibrated = {}
    if args.calibration:
        for e, rows in tests.items():
            said = online(rows, shipped, 10 if e == H200 else 30)
            calibrated[e] = calibration(rows, said, shipped.confident)
    confused = {}
    if args.cells:
        for e, rows in tests.items():
            readings: list = []
            said = online(rows, shipped, 10 if e == H200 else 30, readings=readings)
            confused[e] = cells(rows, said, readings, args.cells)
    abstained = {}
    if args.abstentions:
        for e, rows in tests.items():
            maturity: list = []
            said = online(rows, shipped, 10 if e == H200 else 30, maturity)
            abstained[e] = abstentions(rows, said, maturity)
    rules_figures = {
        e: figures(rows, [rules.baseline(w) for w, _ in rows]) for e, rows in tests.items()
    }
    draws = {}
    if args.draws:
        draws = paired_draws(args.draws, args.servers, args.windows, shipped, names)
    return {
        "draws": draws,
        "tuned": tuned,
        "seconds": seconds,
        "table": table,
        "design": design,
        "rules": rules_figures,
        "startup": startup,
        "calibration": calibrated,
        "abstentions": abstained,
        "cells": confused,
        "protocols": protocols,
        "latency": latency(tests[names[0]], shipped),
        "sizes": {e: len(rows) for e, rows in tests.items()},
    }


def latency(rows, params: Params, n: int = 2000) -> dict:
    """Online cost of one window: context, ``observe`` and ``score`` (the service's work per
    report), median and 99th percentile over ``n`` windows after a warm-up (2,000 windows, or
    half of a smaller set)."""
    model = Diagnoser(params)
    recent: dict = {}
    times = []
    warm = min(2000, len(rows) // 2)
    for i, (w, _) in enumerate(sorted(rows, key=lambda r: r[0].t or 0.0)[: n + warm]):
        started = time.perf_counter()
        earlier = recent.setdefault((w.node, w.server), deque(maxlen=model.context))
        read = model.with_context(w, earlier)
        model.observe(read)
        model.score(read)
        if is_running(w):
            earlier.append(w)
        if i >= warm:
            times.append(time.perf_counter() - started)
    times.sort()
    return {
        "median_ms": statistics.median(times) * 1000,
        "p99_ms": times[int(0.99 * (len(times) - 1))] * 1000,
    }


def _pct(x: float) -> str:
    return f"{x * 100:5.1f}"


def _labels_table(title: str, cells: dict) -> None:
    print(f"\n## {title}: accuracy over answered windows (coverage)")
    print(f"{'world':<11}" + "".join(f"{k:>18}" for k in LABELS)
          + "   overall/coverage  zombie-recall healthy->zombie strict")  # fmt: skip
    for e, f in cells.items():
        labels = [
            f"{_pct(f['labels'].get(k, float('nan')))} ({_pct(f['label_coverage'].get(k, 0))})"
            for k in LABELS
        ]
        print(
            f"{e:<11}" + "".join(f"{c:>18}" for c in labels)
            + f"   {_pct(f['accuracy'])}/{_pct(f['coverage'])}      {_pct(f['zombie_recall'])}"
            f"          {_pct(f['healthy_as_zombie'])} {_pct(f['strict'])}"
        )  # fmt: skip


def _confusion_table(world: str, f: dict) -> None:
    answers = (*LABELS, UNCERTAIN, UNKNOWN)
    cells = f["confusion"]
    shown = [a for a in answers if any(cells.get((t, a)) for t in LABELS)]
    print(f"\n{world} (rows: truth; columns: answer)")
    print(f"{'':<17}" + "".join(f"{a[:10]:>11}" for a in shown))
    for truth in LABELS:
        print(f"{truth:<17}" + "".join(f"{cells.get((truth, a), 0):>11}" for a in shown))


def _print(result: dict, args) -> None:
    table, tuned = result["table"], result["tuned"]
    evaluated = list(result["sizes"])
    for protocol in result["protocols"]:
        print(f"\n## accuracy over answered windows / coverage, %  ({protocol}; * in-sample)")
        print(f"{'constants':<19}" + "".join(f"{e:>14}" for e in evaluated))
        for t in tuned:
            cells = []
            for e in evaluated:
                f = table[(protocol, t, e)]
                mark = "*" if t == e else " "
                cells.append(f"{_pct(f['accuracy'])}/{_pct(f['coverage'])}{mark}")
            name = f"{t} (shipped)" if t == SHIPPED else f"tuned {t}"
            if t == SHIPPED and args.set:  # a change measured: say which
                print("shipped row with " + ", ".join(f"{k}={v:g}" for k, v in args.set.items()))
            print(f"{name:<19}" + "".join(f"{c:>14}" for c in cells))
        print(f"{'rules':<19}" + "".join(
            f"{_pct(result['rules'][e]['accuracy']):>14}" for e in evaluated
        ))  # fmt: skip
    for protocol in result["protocols"]:
        cells = {e: table[(protocol, SHIPPED, e)] for e in evaluated}
        _labels_table(f"shipped constants, per label ({protocol})", cells)
    _labels_table("shipped constants, base columns only (online)", result["design"])
    if args.confusion:
        print("\n## confusion matrices, shipped constants (online)")
        for e in evaluated:
            _confusion_table(e, table[("online", SHIPPED, e)])
    if result["startup"]:
        print(f"\n## each server's first {STARTUP} running windows against the rest"
              " (shipped constants, online): accuracy / coverage (strict), windows")  # fmt: skip
        for e, parts in result["startup"].items():
            cells = [
                f"{name} {_pct(f['accuracy'])}/{_pct(f['coverage'])} ({_pct(f['strict'])}) "
                f"{f['windows']:>6}"
                for name, f in parts.items()
            ]
            print(f"{e:<11} " + "   ".join(cells))
    if result["calibration"]:
        print("\n## calibration, shipped constants (online): % right (answers) in each band of"
              " confidence, zombies apart; uncertain: its likelier candidate")  # fmt: skip
        for e, bands in result["calibration"].items():
            cells = [
                f"{band if band == 'uncertain' else f'{band[0]:.2f}-{band[1]:.2f}'} "
                f"{_pct(right / answered) if answered else '    -'} ({answered:>5})"
                for band, (right, answered) in bands.items()
            ]
            print(f"{e:<11} " + "   ".join(cells))
    if result["abstentions"]:
        print("\n## abstentions, shipped constants (online): uncertain windows (on young nodes),"
              " likelier candidate right; by candidate pair, the truths; answering the likelier"
              " candidate down to a confidence: accuracy / coverage")  # fmt: skip
        for e, a in result["abstentions"].items():
            n = a["uncertain"]
            print(f"{e:<11} {n:>5} uncertain ({a['young']} on young nodes), likelier right "
                  f"{_pct(a['likelier_right'] / n) if n else '    -'} %")  # fmt: skip
            for pair, (truths, right) in list(a["pairs"].items())[:6]:
                n = truths.total()
                said = ", ".join(f"{k} {v}" for k, v in truths.most_common(4))
                print(f"{'':<11} {pair:<28} {n:>5}  likelier right {_pct(right / n)} %  {said}")
            cells = [
                f"{'all' if lowest == 0 else f'{lowest:.2f}'}: "
                f"{_pct(f['accuracy'])}/{_pct(f['coverage'])}"
                for lowest, f in a["frontier"].items()
            ]
            print(f"{'':<11} answered down to " + "   ".join(cells))
    if result["cells"]:
        _cells_table(result["cells"])
    if result["draws"]:
        _draws_table(result["draws"], args.set)
    print("\n## constants chosen on each world (differences from the physical values)")
    for t, params in tuned.items():
        if t == SHIPPED:
            continue
        changed = {
            k: getattr(params, k) for k in GRID if getattr(params, k) != getattr(PHYSICAL, k)
        }
        print(f"{t:<11} ({result['seconds'][t]:.0f} s) {changed}")
    lat = result["latency"]
    print(
        f"\nonline cost per window (context + observe + score): median {lat['median_ms']:.3f} ms,"
        f" p99 {lat['p99_ms']:.3f} ms; windows per test set: {result['sizes']}"
    )


def _cells_table(confused: dict) -> None:
    print("\n## the largest wrong cells of running windows (shipped constants, online): medians"
          " of the windows as read"
          " (in context), then against their node's reference and task's best; beside them the"
          " right answers of the truth and of the answer")  # fmt: skip
    names = (*CELL_COLUMNS, *CELL_HISTORY)
    short = [n.replace("_active", "").replace("cpu_", "").replace("gpu_", "") for n in names]
    for e, found in confused.items():
        for truth, answer, n, medians in found:
            print(f"\n{e}: {truth} read {answer}, {n} windows")
            print(f"{'':<24}" + "".join(f"{name[:12]:>13}" for name in short))
            for row, label in (("cell", "these"), ("truth", f"{truth} right"),
                               ("answer", f"{answer} right")):  # fmt: skip
                values = medians[row]
                print(f"{label[:23]:<24}" + "".join(
                    f"{'-' if math.isnan(values[k]) else f'{values[k]:.3g}':>13}" for k in names
                ))  # fmt: skip


def _draws_table(draws: dict, changes: dict) -> None:
    what = ", ".join(f"{k}={v:g}" for k, v in changes.items()) or "nothing changed"
    print(f"\n## each draw, the same windows with the physical constants and with {what}"
          " (online): accuracy / coverage (strict); ! a loss by the rule")  # fmt: skip
    lost_any = []
    for (e, seed), (before, after) in draws.items():
        lost = losses(before, after)
        if lost:
            lost_any.append(f"{e} {seed}: {', '.join(lost)}" if seed else f"{e}: {', '.join(lost)}")
        cells = [
            f"{_pct(f['accuracy'])}/{_pct(f['coverage'])} ({_pct(f['strict'])})"
            for f in (before, after)
        ]
        delta = "/".join(  # of the figures as printed, as the rule reads them
            f"{(round(after[k] * 1000) - round(before[k] * 1000)) / 10:+5.1f}"
            for k in ("accuracy", "coverage")
        )
        flag = " !" if lost else ""
        print(f"{e:<11} {seed or '':>5}  {cells[0]}  ->  {cells[1]}   {delta}{flag}")
    if changes:
        verdict = "kept by the rule" if not lost_any else "not kept: " + "; ".join(lost_any)
        print(f"verdict: {verdict}")


def _constant(text: str) -> tuple[str, float]:
    """``NAME=VALUE`` of ``--set``: a constant of ``Params`` and a finite number."""
    name, sep, value = text.partition("=")
    names = [f.name for f in fields(Params)]
    if not sep or name not in names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE, NAME one of {names}")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a finite number")
    return name, number


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=180, help="servers per set")
    parser.add_argument("--windows", type=int, default=60, help="windows per server")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="tuning rounds (0: no tuning)")
    parser.add_argument("--worlds", nargs="*", choices=list(WORLDS), help="default: all")
    parser.add_argument(
        "--tune-on", nargs="*", choices=list(WORLDS),
        help="worlds to tune on (default: --worlds; none given: the shipped constants alone)",
    )  # fmt: skip
    parser.add_argument("--history", action="store_true", help="also the batch protocol")
    parser.add_argument(
        "--confusion", action="store_true", help="every world's confusion matrix (shipped)"
    )
    parser.add_argument(
        "--startup", action="store_true",
        help=f"each server's first {STARTUP} running windows against the rest (shipped)",
    )  # fmt: skip
    parser.add_argument(
        "--calibration", action="store_true",
        help="answers right in each band of confidence, and uncertain's likelier candidate",
    )  # fmt: skip
    parser.add_argument(
        "--abstentions", action="store_true",
        help="uncertain windows by candidate pair, and what answering them would give",
    )  # fmt: skip
    parser.add_argument(
        "--without", nargs="+", default=[], metavar="COLUMN", choices=COLUMNS,
        help="score the test sets with these columns missing from every window",
    )  # fmt: skip
    parser.add_argument(
        "--set", nargs="+", default=[], metavar="NAME=VALUE", type=_constant,
        help="score the shipped row (and start tuning) with these constants of Params changed",
    )  # fmt: skip
    parser.add_argument(
        "--draws", nargs="+", type=int, default=[], metavar="SEED",
        help="score every world's test set of each tuning SEED (and the H200) with the physical"
        " constants and with --set's, paired, and say whether the change passes the rule",
    )  # fmt: skip
    parser.add_argument(
        "--cells", type=int, default=0, metavar="N",
        help="each world's N largest wrong cells: their windows against their node's and task's"
        " history, beside the right answers (shipped)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="60 servers of 40 windows, 1 round")
    args = parser.parse_args(argv)
    args.set = dict(args.set)
    if args.quick:
        args.servers, args.windows, args.rounds = 60, 40, 1
    _print(run(args), args)


if __name__ == "__main__":
    main()
