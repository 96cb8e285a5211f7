"""Where the idle-held GPU-hours a policy does not reclaim go (issue 21's 95 % target).

    python -m benchmarks.replay.gap [--world month|lab] [--servers 40 --days 30 --seeds 1 2 3
        --step 300] [--candidate NAME=JSON ...] [--default-servers] [--json] [--detail]

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

``--detail`` splits each kind by what the governor knew at that step (``REASONS``): whether the
server reports (else only DCGM: no person's interaction, no cell), whether the owner is away
(``away_after``, 2 h, past the last interaction the reports name; never interacted in this run:
not known), and whether a tab is open (``connections``: its polling keeps the Hub's activity
fresh, so a warning could be shown). It reads the trace as the replay does; the default output
is unchanged.
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
AWAY = 2 * HOUR  # the default away_after


def reason(kind: str, row, back: float | None) -> str:
    """``kind``, split by what the governor could know at ``row`` (``--detail``)."""
    if not row.reports:
        return f"{kind}: no report (DCGM only)"
    if kind in ("running cell", "failing hook"):
        return kind
    who = (
        "owner ? (never interacted)"
        if back is None
        else ("owner away" if row.t - back >= AWAY else "owner < away_after")
    )
    tab = "tab open" if row.connections > 0 else "no tab"
    return f"{kind}: {who}, {tab}"


def missed(samples, actions, detail: bool = False) -> tuple[float, Counter]:
    """(idle-held GPU-hours, the hours not reclaimed by kind; ``detail``: by ``reason``)."""
    cull_at: dict = {}
    for action in actions:
        if action.action == "cull":
            cull_at.setdefault(action.session, action.t)
    last: dict = {}
    idle_since: dict = {}
    back: dict = {}  # a person's last interaction the reports name, per run of a server
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
        if detail:
            kind = reason(kind, row, back.get(row.session))
        left[kind] += hours

    span: dict = {}
    for row in samples:
        key = row.session
        previous = last.get(key)
        if previous is not None:
            span[key] = row.t - previous.t
            close(previous, span[key])
        if row.user_active and row.reports:
            back[key] = row.t
        if row.gpu_sm is None or row.gpu_sm >= IDLE:
            idle_since.pop(key, None)
        else:
            idle_since.setdefault(key, row.t)
        last[key] = row
    for key, row in last.items():  # a run's last row lasts as long as the one before it
        close(row, span.get(key, 0.0))
    return held, left


def _runs(args, detail: bool = False):
    """(seed, run, idle-held GPU-hours, missed) of each seed's world and each run's policy."""
    runs = {"default": {}, **dict(args.candidate)}
    for seed in args.seeds:
        rows = WORLDS[args.world](
            args.servers, args.days, seed, args.step, default_servers=args.default_servers
        )
        lines = [json.dumps(r) for r in rows]
        for name, defaults in runs.items():
            run = partial(replay, policies=load_policies([], defaults))
            held, left = missed(parse_lines(lines), list(run(parse_lines(lines))), detail=detail)
            yield seed, name, held, left


def main(argv=None) -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--detail", action="store_true", help="split by what the governor knew")
    args = parser.parse_args(argv)
    if args.detail:
        return detail(args)
    out = []
    for seed, name, held, left in _runs(args):
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


def detail(args) -> None:
    """Each run's missed points by ``reason``, a column per seed, GPU-hours and points."""
    table = {(name, seed): (held, left) for seed, name, held, left in _runs(args, detail=True)}
    if args.json:
        print(
            json.dumps(
                {f"{n} {s}": {"held": h, "left": dict(lt)} for (n, s), (h, lt) in table.items()}
            )
        )
        return
    for name in {"default": {}, **dict(args.candidate)}:
        print(f"{name}: GPU-hours (points) not reclaimed, seeds {' / '.join(map(str, args.seeds))}")
        reasons = sorted({r for (n, _), (_, left) in table.items() if n == name for r in left})
        for r in reasons:
            cells = []
            for seed in args.seeds:
                held, left = table[name, seed]
                cells.append(f"{left[r]:7.1f} ({100 * left[r] / held:4.2f})")
            print(f"  {r:55s} " + " / ".join(cells))
        cells = []
        for seed in args.seeds:
            held, left = table[name, seed]
            total = sum(left.values())
            cells.append(f"{total:7.1f} ({100 * total / held:4.2f}) of {held:,.0f}")
        print(f"  {'all':55s} " + " / ".join(cells))


if __name__ == "__main__":
    main()
