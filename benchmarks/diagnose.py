"""Root-cause diagnosis on simulated windows: the counterfactual model against the rules.

    python -m benchmarks.diagnose [--train-servers 360] [--test-servers 180] [--windows 60]

Train set: ``--train-servers`` simulated servers (``diagnose.simulate``, seed ``--seed``) on
the seven node configurations of ``simulate.NODES``. Test set: ``--test-servers`` other
servers on the same configurations (seed ``--seed + 100``) plus ``--held-out-servers`` on a
configuration the training never saw (``simulate.HELD_OUT_NODE``, seed ``--seed + 101``).
The model is trained on the train set's windows without their labels (as the service trains
on its history); the rules need no training.

Prints accuracy per label and overall (windows whose ``sm_active`` is missing are left out:
``unknown`` is the only answer there, and both methods give it) for

- ``model``:  ``Diagnoser`` (``diagnose/counterfactual.py``): each window read in its server's
  context (``features.in_context``: the median of its server's last running windows), in
  training and in scoring, as the service and ``jupyter-gpu-gov diagnose`` read them;
- ``rules``:  ``rules.baseline`` (low-GPU gate 50 %) on single windows: the baseline as the
  issue defines it;
- ``rules+ctx``: the same rules on the windows in context, as the model reads them (so the
  context's share of the gain shows);
- ``rules10``: the rules with the issue's "GPU < 10 %" gate, single windows;
- ``ceiling``, ``ceiling+ctx``: a supervised classifier trained *with* the train set's labels
  on the same columns plus ``sm_active`` and the node, on single windows and on windows in
  context — a reference for how separable the windows are, not something the service could
  run (it has no labels);

then accuracy per node, training time (median of ``--fits``) and online latency per window
(median over single-window ``diagnose`` calls, on windows that reach the model and on all).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter, defaultdict

from jupyter_gpu_gov.diagnose import rules
from jupyter_gpu_gov.diagnose.counterfactual import Diagnoser, _before_model
from jupyter_gpu_gov.diagnose.features import FEATURES, to_vector
from jupyter_gpu_gov.diagnose.labels import LABELS, UNKNOWN
from jupyter_gpu_gov.diagnose.simulate import HELD_OUT_NODE, NODES, generate


def _accuracy(rows, predicted) -> dict:
    hits, totals = Counter(), Counter()
    for (_, truth), label in zip(rows, predicted, strict=True):
        if truth == UNKNOWN:
            continue
        totals[truth] += 1
        hits[truth] += label == truth
    out = {label: hits[label] / totals[label] for label in LABELS if totals[label]}
    out["overall"] = sum(hits.values()) / max(1, sum(totals.values()))
    return out


def _ceiling(train, test, context=None) -> list[str]:
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingClassifier

    nodes = {node.name: float(i) for i, node in enumerate(NODES)}  # an unseen node: missing

    def matrix(rows):
        return np.array(
            [[w.sm_active, *to_vector(w), nodes.get(w.node, np.nan)] for w, _ in rows],
            dtype=float,
        )

    if context is not None:
        train = list(zip(context([w for w, _ in train]), [t for _, t in train], strict=True))
        test = list(zip(context([w for w, _ in test]), [t for _, t in test], strict=True))
    known = [(w, t) for w, t in train if t != UNKNOWN]
    X = matrix(known)
    classifier = HistGradientBoostingClassifier(
        max_iter=200, categorical_features=[X.shape[1] - 1], random_state=0
    )
    classifier.fit(X, [t for _, t in known])
    predicted = list(classifier.predict(matrix(test)))
    return [
        UNKNOWN if w.sm_active is None else p for (w, _), p in zip(test, predicted, strict=True)
    ]


def _single_column(rows) -> dict:
    """Per label, the best one-threshold split on a single column (chosen with the labels,
    either direction, over running windows where the column is known): balanced accuracy."""
    running = [(w, t) for w, t in rows if t != UNKNOWN and w.kernel_busy is not False]
    out = {}
    for label in LABELS:
        if label == "zombie":
            continue  # idle by definition: its windows are not running
        best = (0.0, "")
        for column in ("sm_active", *FEATURES):
            pairs = sorted(
                (float(getattr(w, column)), t == label)
                for w, t in running
                if getattr(w, column) is not None
            )
            positives = sum(y for _, y in pairs)
            negatives = len(pairs) - positives
            if not positives or not negatives:
                continue
            seen_pos = seen_neg = 0
            for k, (value, y) in enumerate(pairs):
                seen_pos += y
                seen_neg += not y
                if k + 1 < len(pairs) and pairs[k + 1][0] == value:
                    continue
                low = (seen_pos / positives + (negatives - seen_neg) / negatives) / 2
                best = max(best, (max(low, 1 - low), column))
        out[label] = best
    return out


def run(args) -> dict:
    train = generate(args.train_servers, args.windows, args.seed)
    test = generate(args.test_servers, args.windows, args.seed + 100, first_server=10_000)
    test += generate(
        args.held_out_servers, args.windows, args.seed + 101, (HELD_OUT_NODE,), first_server=20_000
    )
    windows = [w for w, _ in train]

    fits = []
    for _ in range(args.fits):
        started = time.perf_counter()
        model = Diagnoser().fit(windows)
        fits.append(time.perf_counter() - started)

    in_context = model.in_context([w for w, _ in test])
    results = {
        "model": [d.label for d in model.diagnose_many([w for w, _ in test])],
        "rules": [rules.baseline(w).label for w, _ in test],
        "rules+ctx": [rules.baseline(w).label for w in in_context],
        "rules10": [rules.baseline(w, low_gpu=rules.LOW_GPU_STRICT).label for w, _ in test],
    }
    if args.ceiling:
        results["ceiling"] = _ceiling(train, test)
        results["ceiling+ctx"] = _ceiling(train, test, model.in_context)

    # One window scored alone with its server's earlier windows, as the service scores it
    # (the context read included).
    step = max(1, len(test) // args.latency_windows)
    times, model_times = [], []
    for i in range(0, len(test), step):
        w = test[i][0]
        earlier = [x for x, _ in test[max(0, i - 16) : i] if x.server == w.server]
        started = time.perf_counter()
        model.diagnose(w, earlier)
        elapsed = time.perf_counter() - started
        times.append(elapsed)
        if _before_model(w) is None:
            model_times.append(elapsed)

    by_node = defaultdict(list)
    for i, (w, _) in enumerate(test):
        by_node[w.node].append(i)
    return {
        "train_windows": len(train),
        "trained_on": model.trained_on,
        "test_windows": len(test),
        "test_scored": sum(1 for _, t in test if t != UNKNOWN),
        "truth": Counter(t for _, t in test),
        "accuracy": {name: _accuracy(test, labels) for name, labels in results.items()},
        "by_node": {
            node: {
                name: _accuracy([test[i] for i in idx], [labels[i] for i in idx])["overall"]
                for name, labels in results.items()
            }
            for node, idx in sorted(by_node.items())
        },
        "confusion": Counter(
            (t, p) for (_, t), p in zip(test, results["model"], strict=True) if t != p
        ),
        "single_column": _single_column(test),
        "fit_s": statistics.median(fits),
        "latency_ms": statistics.median(times) * 1000,
        "latency_model_ms": statistics.median(model_times) * 1000 if model_times else None,
        "latency_batch_ms": _batch_ms(model, [w for w, _ in test]),
    }


def _batch_ms(model, windows) -> float:
    started = time.perf_counter()
    model.diagnose_many(windows)
    return (time.perf_counter() - started) / max(1, len(windows)) * 1000


def _print(figures: dict) -> None:
    accuracy = figures["accuracy"]
    names = list(accuracy)
    print(
        f"diagnose: train {figures['train_windows']} windows ({figures['trained_on']} running), "
        f"test {figures['test_windows']} windows ({figures['test_scored']} with sm_active; "
        f"held-out node {HELD_OUT_NODE.name})"
    )
    print("  accuracy          " + "".join(f"{n:>12}" for n in names) + "   test windows")
    for label in (*LABELS, "overall"):
        cells = "".join(f"{accuracy[n].get(label, float('nan')) * 100:11.1f}%" for n in names)
        count = figures["test_scored"] if label == "overall" else figures["truth"][label]
        print(f"  {label:<18}{cells}   {count}")
    print("  by node           " + "".join(f"{n:>12}" for n in names))
    for node, values in figures["by_node"].items():
        print(f"  {node:<18}" + "".join(f"{values[n] * 100:11.1f}%" for n in names))
    top = figures["confusion"].most_common(6)
    print(
        "  model's most frequent errors (truth -> said: windows): "
        + ", ".join(f"{t}->{p}: {c}" for (t, p), c in top)
    )
    print(
        "  best single column per label (balanced accuracy, threshold chosen with the labels): "
        + ", ".join(
            f"{label} {value * 100:.1f}% ({column})"
            for label, (value, column) in figures["single_column"].items()
        )
    )
    model_ms = figures["latency_model_ms"]
    print(
        f"  training {figures['fit_s']:.2f} s; online per window: median "
        f"{figures['latency_ms']:.3f} ms (all), "
        f"{model_ms:.3f} ms (reaching the model); batch {figures['latency_batch_ms']:.4f} ms"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-servers", type=int, default=360)
    parser.add_argument("--test-servers", type=int, default=180)
    parser.add_argument("--held-out-servers", type=int, default=30)
    parser.add_argument("--windows", type=int, default=60, help="windows per server")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fits", type=int, default=3, help="trainings timed")
    parser.add_argument("--latency-windows", type=int, default=500)
    parser.add_argument(
        "--no-ceiling", dest="ceiling", action="store_false", help="skip the supervised reference"
    )
    args = parser.parse_args(argv)
    _print(run(args))


if __name__ == "__main__":
    main()
