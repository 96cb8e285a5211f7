"""Utilisation lift: what the default policy, and policies you name, give over doing nothing and
over jupyterhub-idle-culler, on the reclamation benchmark's month-long traces (``--world``: the
month written beside the policy, ``generate.py``, the default; or the lab written apart from
it, ``lab.py``).

    python -m benchmarks.replay.lift [--world month|lab] [--servers 40 --days 30 --seeds 1 2 3
        --step 300] [--candidate NAME=JSON ...] [--default-servers] [--json]

Each run is measured twice on the same trace: by ``replay.whatif.measure`` (what
``jupyter-gpu-gov what-if`` prints: utilisation of the GPU-hours given out, right-sizing,
interruptions, running work killed, queue waits) and by ``score.evaluate`` (the share of the
idle-held GPU-hours reclaimed, cells killed and false culls, from the trace's truth). A
``--candidate`` is the default policy with ``policy_defaults`` refined by the JSON, e.g.
``busy4h='{"busy_limit": "4h"}'``. GPU-hours count GPU-equivalents (a MIG 3g slice 3/7 of a
card) of the generator's tiers; a tier has the capacity of a third of the users' servers at
once (``--slots``), for the queue model.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.rightsize import TierSize
from jupyter_gpu_gov.replay import parse_lines, replay
from jupyter_gpu_gov.replay.whatif import Tiers, measure

from . import generate, lab
from .score import WORLDS, evaluate, policies

# Each world's tiers as the catalogue would give them: memory in GB and GPU-equivalents.
A100_80G = TierSize("a100-80g", "A100 80 GB", 80, 1.0)
SIZES = {
    "month": {
        "a100-80g": A100_80G,
        "h100-80g": TierSize("h100-80g", "H100 80 GB", 80, 1.0),
        "mig-3g.40gb": TierSize("mig-3g.40gb", "A100 3g.40gb", 40, 3 / 7),
        "mig-1g.10gb": TierSize("mig-1g.10gb", "A100 1g.10gb", 10, 1 / 7),
    },
    "lab": {
        "a100-80g": A100_80G,
        "a100-40g": TierSize("a100-40g", "A100 40 GB", 40, 1.0),
        "l40s-48g": TierSize("l40s-48g", "L40S 48 GB", 48, 1.0),
    },
}
assert set(SIZES) == set(WORLDS)
assert set(SIZES["month"]) == {name for name, _ in generate.PROFILES}
assert set(SIZES["lab"]) == {name for name, _ in lab.PROFILES}
SHOWN = ("no culling", "idle-culler 1h", "jupyter-gpu-gov default")


def runs(candidates: dict[str, dict]) -> dict:
    stock = policies()
    chosen = {name: stock[name] for name in SHOWN}
    for name, defaults in candidates.items():
        chosen[name] = partial(replay, policies=load_policies([], defaults))
    return chosen


def one_seed(args, seed: int, candidates: dict[str, dict]) -> list[dict]:
    rows = WORLDS[args.world](
        args.servers, args.days, seed, args.step, default_servers=args.default_servers
    )
    lines = [json.dumps(r) for r in rows]
    slots = max(1, args.servers // args.slots)
    sizes = SIZES[args.world]
    tiers = Tiers(sizes=sizes, slots=dict.fromkeys(sizes, slots))
    out = []
    for name, run in runs(candidates).items():
        actions = list(run(parse_lines(lines)))
        figures = measure(name, parse_lines(lines), actions, tiers).total
        truth = evaluate(name, parse_lines(lines), actions)
        out.append(
            {
                "seed": seed,
                "run": name,
                "utilisation": figures.utilisation,
                "utilisation_right_sized": figures.utilisation_right_sized,
                "active_share": figures.active_share,
                "allocated_gpu_hours": round(figures.allocated_gpu_hours, 1),
                "reclaimed_gpu_hours": round(figures.reclaimed_gpu_hours, 1),
                "right_size_freed_gpu_hours": round(figures.right_size_freed_gpu_hours, 1),
                "idle_held_reclaimed": truth.reclaimed_share,
                "interruptions": figures.interruptions,
                "running_work_killed": figures.running_work_killed,
                "cells_killed": truth.cells_killed,
                "false_culls": truth.false_culls,
                "requests_waited": figures.requests_waited,
                "wait_hours": round(figures.wait_hours, 1),
            }
        )
    return out


def table(rows: list[dict]) -> str:
    head = (
        "seed",
        "run",
        "utilisation",
        "active",
        "right-sized",
        "lift vs none",
        "vs idle-culler",
        "idle-held reclaimed",
        "interruptions",
        "killed",
        "waited (hours)",
    )
    lines = [head]
    base = {(r["seed"], r["run"]): r for r in rows}
    for r in rows:
        none = base[(r["seed"], "no culling")]["utilisation"]
        culler = base[(r["seed"], "idle-culler 1h")]["utilisation"]
        lines.append(
            (
                str(r["seed"]),
                r["run"],
                f"{r['utilisation']:.1%}",
                f"{r['active_share']:.1%}",
                f"{r['utilisation_right_sized']:.1%}",
                f"{(r['utilisation'] - none) * 100:+.1f} pts",
                f"{(r['utilisation'] - culler) * 100:+.1f} pts",
                f"{r['idle_held_reclaimed']:.1%}",
                str(r["interruptions"]),
                f"{r['running_work_killed']} / {r['cells_killed']}",
                f"{r['requests_waited']} ({r['wait_hours']:,.0f})",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _candidate(text: str) -> tuple[str, dict]:
    name, _, value = text.partition("=")
    defaults = json.loads(value)
    load_policies([], defaults)  # a bad one fails here, with the policy's own words
    return name, defaults


def arguments(description: str) -> argparse.ArgumentParser:
    """The options this study and ``gap`` share: the traces, the candidates, the output."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--world",
        choices=sorted(WORLDS),
        default="month",
        help="the generator: month (generate.py, default) or lab (lab.py)",
    )
    parser.add_argument("--servers", type=int, default=40)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--step", type=int, default=300)
    parser.add_argument("--candidate", type=_candidate, action="append", default=[])
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--default-servers",
        action="store_true",
        help="sessions on each user's default server, as a hub reuses it (generate.py)",
    )
    return parser


def main(argv=None) -> None:
    parser = arguments(__doc__.split("\n\n")[0])  # its first sentence, whole
    parser.add_argument("--slots", type=int, default=3, help="users per server of a tier")
    args = parser.parse_args(argv)
    candidates = dict(args.candidate)
    rows = [row for seed in args.seeds for row in one_seed(args, seed, candidates)]
    if args.json:
        print(json.dumps(rows))
    else:
        print(table(rows))


if __name__ == "__main__":
    main()
