"""How many windows the governor's diagnosis history needs (``diagnose_max_windows``).

    python -m benchmarks.diagnose_history [--world fleet] [--servers 5000] [--windows 60]
        [--machines 100] [--sizes 5000,25000,50000,100000,250000] [--seed 1]

Every ``diagnose_train_every`` the service rebuilds its model from the history it keeps
(``hub/diagnosis_windows.History``: oldest out first, by count), then goes on learning online.
Here a fleet's past (``--servers`` servers of ``--world``, ``--windows`` windows each, every
world node split into ``--machines`` machines, a server on one: ten nodes become a thousand, as
DCGM names a fleet's hosts) goes through a ``History`` of each size in time order, the model is
rebuilt from it as the service does (``Diagnoser.fit`` on ``History.snapshot``), and other
servers of the same machines (seed ``--seed + 100``, a fifth as many) are scored:

- ``rebuilt``: the rebuilt model alone (each window in its server's context, nothing learnt
  from the test windows): what the history taught it;
- ``online``: the rebuilt model learning from each test window as it arrives, as the service
  goes on (size 0: the service before its first training, learning from nothing).

Figures: accuracy over the windows answered, coverage, strict accuracy (``uncertain`` wrong),
as ``benchmarks.diagnose`` counts them; the node references mature (enough windows and servers:
``Diagnoser.min_node_windows``, ``min_node_servers``), the windows a node; and a digest of
every answer, to compare two trees' histories (a storage change must not change one).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import time
from dataclasses import replace
from datetime import timedelta

from jupyter_gpu_gov.diagnose.counterfactual import Diagnoser
from jupyter_gpu_gov.diagnose.features import iter_in_context
from jupyter_gpu_gov.hub.diagnosis_windows import History, unpack

from .diagnose import figures
from .worlds import generate


def fleet(world: str, servers: int, windows: int, seed: int, machines: int, prefix: str):
    """``(window, truth)`` in time order, each world node split into ``machines`` machines."""
    rows = generate(world, servers, windows, seed)
    index: dict = {}
    out = []
    for w, truth in rows:
        i = index.setdefault(w.server, len(index))
        node = f"{w.node}#{i % machines}" if w.node else w.node
        out.append((replace(w, node=node, server=f"{prefix}{w.server}"), truth))
    out.sort(key=lambda r: r[0].t or 0.0)
    return out


def rebuilt(past, size: int) -> tuple[Diagnoser, float]:
    """The model the service rebuilds from a history of ``size`` windows of ``past``."""
    history = History(timedelta(days=3650), size)
    for w, _ in past:
        history.add(w.server, w, w.t or 0.0)
    started = time.process_time()
    model = Diagnoser().fit(unpack(history.snapshot()))
    return model, time.process_time() - started


def scores(model: Diagnoser, test, learn: bool) -> list:
    model = copy.deepcopy(model) if learn else model
    out = []
    windows = (w for w, _ in test)
    for w in iter_in_context(windows, model.context, model.context_horizon_s):
        if learn:
            model.observe(w)
        out.append(model.score(w))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", default="fleet")
    parser.add_argument("--servers", type=int, default=5000)
    parser.add_argument("--windows", type=int, default=60)
    parser.add_argument("--machines", type=int, default=100)
    parser.add_argument("--sizes", default="5000,25000,50000,100000,250000")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    past = fleet(args.world, args.servers, args.windows, args.seed, args.machines, "")
    test = fleet(
        args.world, max(1, args.servers // 5), args.windows, args.seed + 100, args.machines, "t-"
    )
    nodes = len({w.node for w, _ in past})
    print(
        f"{args.world}: {len(past)} past windows ({args.servers} servers, {nodes} nodes), "
        f"{len(test)} test windows"
    )
    print(
        "| history (windows) | a node | nodes mature | fit (s CPU) | rebuilt: accuracy | "
        "coverage | strict | online: accuracy | coverage | strict | digest |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size in [0, *sizes]:
        model, seconds = rebuilt(past, size) if size else (Diagnoser(), 0.0)
        mature = sum(
            ref.maturity(model.min_node_windows, model.min_node_servers) >= 1.0
            for ref in model.nodes.values()
        )
        digest = hashlib.sha256()
        cells = []
        for learn in (False, True):
            found = scores(model, test, learn)
            digest.update(repr([(d.label, d.confidence) for d in found]).encode())
            f = figures(test, found)
            cells += [f"{f['accuracy']:.3f}", f"{f['coverage']:.3f}", f"{f['strict']:.3f}"]
        kept = min(size, len(past))
        print(
            f"| {kept:,} | {kept / nodes:.0f} | {mature}/{len(model.nodes)} | {seconds:.1f} | "
            + " | ".join(cells)
            + f" | {digest.hexdigest()[:12]} |"
        )


if __name__ == "__main__":
    main()
