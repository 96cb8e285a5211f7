"""Where the idle-held GPU-hours a policy does not reclaim go (issue 21's 95 % target).

    python -m benchmarks.replay.gap [--world month|lab] [--servers 40 --days 30 --seeds 1 2 3
        --step 300] [--candidate NAME=JSON ...] [--default-servers] [--json]

Every idle-held step (the trace's truth: GPU memory held, nothing and nobody using it) that the
run does not reclaim is put in the first of these that holds, in points of all idle-held
GPU-hours:

- ``grace``: within ``cull_after`` (1 h) of the GPU's idle start (the step SM went under the
  idle threshold, or the signal came back): the hour every idle stretch is given;
- ``running cell``: a cell runs (``kernel_busy``): a sleep loop, held to ``quiet_cell_limit``
  where the trace has the kernels' CPU figures, else to ``busy_limit``, and its notices;
- ``failing hook``: the server's checkpoint hook fails: the cull's bounded postponement;
- ``no extension``: the server sends no report (DCGM's reading: ``busy_grace``, 2 h);
- ``notice``: the rest, the warning's notice and the checkpoint's step beyond the first hour,
  and stretches that end (the owner back) before their cull comes.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import partial

from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.replay import parse_lines, replay

from .generate import RECLAIMABLE
from .lift import arguments
from .score import WORLDS

HOUR = 3600.0
IDLE = 0.02  # the default idle_threshold
GRACE = 3600.0  # the default cull_after
KINDS = ("grace", "running cell", "failing hook", "no extension", "notice")


def missed(samples, actions) -> tuple[float, Counter]:
    """(idle-held GPU-hours, the hours not reclaimed by kind)."""
    cull_at: dict = {}
    for action in actions:
        if action.action == "cull":
            cull_at.setdefault(action.session, action.t)
    last: dict = {}
    idle_since: dict = {}
    held = 0.0
    left: Counter = Counter()

    def close(row, span: float) -> None:
        nonlocal held
        if row.extra.get("truth") != RECLAIMABLE or not row.holds_gpu_memory:
            return
        hours = span / HOUR
        held += hours
        cull = cull_at.get(row.session)
        if cull is not None and row.t >= cull:
            return
        start = idle_since.get(row.session)
        if start is not None and row.t - start < GRACE:
            kind = "grace"
        elif row.kernel_busy:
            kind = "running cell"
        elif row.checkpoint_fails:
            kind = "failing hook"
        elif not row.reports:
            kind = "no extension"
        else:
            kind = "notice"
        left[kind] += hours

    span: dict = {}
    for row in samples:
        key = row.session
        previous = last.get(key)
        if previous is not None:
            span[key] = row.t - previous.t
            close(previous, span[key])
        if row.gpu_sm is None or row.gpu_sm >= IDLE:
            idle_since.pop(key, None)
        else:
            idle_since.setdefault(key, row.t)
        last[key] = row
    for key, row in last.items():  # a run's last row lasts as long as the one before it
        close(row, span.get(key, 0.0))
    return held, left


def main(argv=None) -> None:
    parser = arguments(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    runs = {"default": {}, **dict(args.candidate)}
    out = []
    for seed in args.seeds:
        rows = WORLDS[args.world](
            args.servers, args.days, seed, args.step, default_servers=args.default_servers
        )
        lines = [json.dumps(r) for r in rows]
        for name, defaults in runs.items():
            run = partial(replay, policies=load_policies([], defaults))
            held, left = missed(parse_lines(lines), list(run(parse_lines(lines))))
            points = {k: round(100 * left[k] / held, 2) for k in KINDS}
            out.append(
                {
                    "seed": seed,
                    "run": name,
                    "idle_held_gpu_hours": round(held, 1),
                    "reclaimed": round(100 - sum(points.values()), 2),
                    "missed_points": points,
                }
            )
    if args.json:
        print(json.dumps(out))
        return
    print("seed  run  idle-held GPU-h  reclaimed  | missed points: " + ", ".join(KINDS))
    for r in out:
        points = "  ".join(f"{r['missed_points'][k]:5.2f}" for k in KINDS)
        print(
            f"{r['seed']}  {r['run']}  {r['idle_held_gpu_hours']:,.0f}  {r['reclaimed']:.1f} %"
            f"  | {points}"
        )


if __name__ == "__main__":
    main()
