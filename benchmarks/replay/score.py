"""Reclamation replay: one trace through every policy, scored against its ground truth.

    python -m benchmarks.replay [--servers 40 --days 30 --seed 1 --step 300 [--no-dcgm]
                                 [--default-servers] | --trace FILE]
                                [--policy-defaults JSON] [--json]

The trace (generated, see ``generate.py``, or a file with ``truth`` on every row) is replayed
through no culling, jupyterhub-idle-culler's rule at 1 h and at 8 h, jupyter-server's kernel
culler (1 h, ``cull_connected`` and ``cull_busy`` off) and this project's shipped default
policy, with the ``jupyter_gpu_gov.replay`` engine the CLI uses; the default policy also as a
governor without DCGM sees the trace (servers without the extension then unknown), with and
without jupyterhub-idle-culler's fallback rule for them. Each run is scored the same way:

- reclaimed: the share of ``idle_held`` GPU-hours (rows holding GPU memory or a context) at or
  after the server's cull. A row lasts until its server's next row; a server's last row lasts as
  long as the one before it.
- false culls: culls whose cull step (the server's first row at or after the cull) is live
  work — ``active`` (the GPU computing, at any SM), ``cpu_phase`` (a pipeline's CPU phase, its
  GPU phase next) or ``standby`` (an exempt server): the issue's "culls of servers whose GPU
  was active", widened to work that is running.
- owner back: culls whose step is ``present``: the GPU idle past the policy's limits, and the
  owner arriving at the notebook in that step, before any interaction the governor could see.
  Not live work, but the moment a person notices: counted apart, never hidden.
- Work that would have resumed after an ``idle_held`` cull step (the owner came back later)
  does not make a cull false either; it is counted as "culls before a return", the price of
  reclaiming.
- warned: the share of culls with a warning to that server at or before the cull.
- idle→reclaim: median time from the start of the idle stretch (the first of the consecutive
  held rows before the cull whose truth is not ``active``) to culls whose step is ``idle_held``.
- Hard deadlines: a server's maximum age (its ``gpu-gov/max-age`` label, from its first row)
  and a reclaim of a borrowed GPU (``gpu-gov/reclaim`` plus the default ``reclaim_grace``, 15
  min). **deadlines kept**: of the deadlines a server's trace reaches, the share whose GPU was
  given back by then plus ``DEADLINE_SLACK`` (the bounded checkpoint retry: two
  ``checkpoint_timeout`` of 5 min, and a few minutes of passes) and one step. A cull at or after
  a deadline is the admin's rule, not a false cull: culls are false only before it.
- **cells killed**: culls and interrupts, not at a hard deadline, whose step has the kernel
  executing a cell that does live work (``kernel_busy`` and a truth of live work): a running
  cell lost by surprise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial

from jupyter_gpu_gov.core.clock import parse as parse_time
from jupyter_gpu_gov.core.durations import format_duration
from jupyter_gpu_gov.core.policy import (
    BORROWED_LABEL,
    EXEMPT_LABEL,
    MAX_AGE_LABEL,
    RECLAIM_LABEL,
    Policy,
    PolicyError,
    load_policies,
)
from jupyter_gpu_gov.replay import (
    Action,
    Sample,
    idle_culler,
    parse_lines,
    read_trace,
    replay,
)
from jupyter_gpu_gov.replay.baselines import kernel_culler
from jupyter_gpu_gov.replay.engine import EPOCH

from .generate import DEFAULT_STEP, LIVE_TRUTHS, PRESENT, RECLAIMABLE, WORK_TRUTHS, generate

HOUR = 3600
DEADLINE_SLACK = 15 * 60  # seconds, plus a step: the bounded retry of a hard deadline
RECLAIM_GRACE = Policy().reclaim_grace.total_seconds()
Run = Callable[[Iterable[Sample]], Iterable[Action]]


def policies(defaults: dict | None = None) -> dict[str, Run]:
    """Each run under comparison, by the name the table shows; ``defaults`` refine the shipped
    default policy (``c.GpuGovernor.policy_defaults``) in this project's runs."""
    ours = load_policies([], defaults)
    blind = load_policies([], {**(defaults or {}), "inactive_timeout": None})
    return {
        "no culling": lambda samples: (),
        "idle-culler 1h": partial(idle_culler, timeout=HOUR),
        "idle-culler 8h": partial(idle_culler, timeout=8 * HOUR),
        "kernel culler 1h": partial(kernel_culler, timeout=HOUR),
        "jupyter-gpu-gov default": partial(replay, policies=ours),
        # On a cluster without dcgm-exporter: servers without the extension are known only by
        # their Hub activity, and get jupyterhub-idle-culler's rule (``inactive_timeout``)...
        "default, no DCGM": lambda samples: replay(without_dcgm(samples), ours),
        # ...or, with ``inactive_timeout: None``, are never culled.
        "default, no DCGM, no fallback": lambda samples: replay(without_dcgm(samples), blind),
    }


def without_dcgm(samples: Iterable[Sample]) -> Iterator[Sample]:
    """The trace as a governor without DCGM sees it: no GPU reading where no report comes."""
    for sample in samples:
        yield sample if sample.reports else replace(sample, gpu_sm=None)


@dataclass
class Result:
    policy: str
    idle_held_gpu_hours: float = 0.0
    reclaimed_gpu_hours: float = 0.0
    # The same, on servers that send reports (the rest get the idle-culler fallback rule).
    reporting_idle_held_gpu_hours: float = 0.0
    reporting_reclaimed_gpu_hours: float = 0.0
    culls: int = 0
    warned_culls: int = 0
    false_culls: int = 0
    culls_at_owner_return: int = 0
    culls_before_return: int = 0
    median_idle_to_reclaim_s: float | None = None
    cells_killed: int = 0
    deadlines: int = 0
    deadlines_kept: int = 0
    false_culls_by_scenario: dict[str, int] = field(default_factory=dict)
    unwarned_culls_by_scenario: dict[str, int] = field(default_factory=dict)
    cells_killed_by_scenario: dict[str, int] = field(default_factory=dict)
    deadlines_missed_by_scenario: dict[str, int] = field(default_factory=dict)

    @property
    def reclaimed_share(self) -> float:
        return _share(self.reclaimed_gpu_hours, self.idle_held_gpu_hours)

    @property
    def reporting_reclaimed_share(self) -> float:
        return _share(self.reporting_reclaimed_gpu_hours, self.reporting_idle_held_gpu_hours)

    @property
    def warned_share(self) -> float | None:
        return self.warned_culls / self.culls if self.culls else None

    @property
    def deadlines_kept_share(self) -> float | None:
        return self.deadlines_kept / self.deadlines if self.deadlines else None

    def as_dict(self) -> dict:
        figures = asdict(self) | {
            "reclaimed_share": self.reclaimed_share,
            "reporting_reclaimed_share": self.reporting_reclaimed_share,
            "warned_share": self.warned_share,
            "deadlines_kept_share": self.deadlines_kept_share,
        }
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


class _Server:
    """One server's running score."""

    __slots__ = (
        "cull_t",
        "culled",
        "deadline",
        "deadline_seen",
        "first_t",
        "idle_start",
        "interrupts",
        "last",
        "returned",
        "span",
        "warned",
    )

    def __init__(self, cull_t: float | None, warned: bool, interrupts: list[float], first_t: float):
        self.cull_t = cull_t
        self.warned = warned
        self.interrupts = interrupts  # times, oldest first
        self.first_t = first_t
        self.culled = False  # its cull step has been seen
        self.returned: bool | None = None  # culled idle: did live work follow? (None: not so)
        self.idle_start: float | None = None
        self.last: Sample | None = None
        self.span = 0.0
        self.deadline: float | None = None  # the earliest hard deadline its rows name
        self.deadline_seen = False  # a row at or after it exists

    def note_deadline(self, row: Sample) -> None:
        if row.labels.get(EXEMPT_LABEL) == "true":
            return  # the admin's exemption wins over deadlines
        found = []
        age = row.labels.get(MAX_AGE_LABEL)
        if age and age.isdigit():
            found.append(self.first_t + int(age))
        asked = row.labels.get(RECLAIM_LABEL)
        if asked and row.labels.get(BORROWED_LABEL) == "true":
            with contextlib.suppress(ValueError):  # not a time: no deadline
                found.append((parse_time(asked) - EPOCH).total_seconds() + RECLAIM_GRACE)
        if found:
            self.deadline = min([*found, *([self.deadline] if self.deadline else [])])
        if self.deadline is not None and row.t >= self.deadline:
            self.deadline_seen = True

    def at_deadline(self, t: float) -> bool:
        return self.deadline is not None and t >= self.deadline


def evaluate(name: str, samples: Iterable[Sample], actions: Iterable[Action]) -> Result:
    """Score one run's actions against the truth of the trace it ran on."""
    cull_at: dict[tuple, float] = {}
    first_warn: dict[tuple, float] = {}
    interrupts: dict[tuple, list[float]] = {}
    for action in actions:
        if action.action == "warn":
            first_warn.setdefault(action.session, action.t)
        elif action.action == "cull":
            cull_at.setdefault(action.session, action.t)
        elif action.action == "interrupt":
            interrupts.setdefault(action.session, []).append(action.t)
    result = Result(name)
    waits: list[float] = []
    false_by: Counter[str] = Counter()
    unwarned_by: Counter[str] = Counter()
    killed_by: Counter[str] = Counter()
    missed_by: Counter[str] = Counter()
    servers: dict[tuple, _Server] = {}

    def running_cell_lost(server: _Server, row: Sample, scenario: str) -> None:
        if server.at_deadline(row.t) or not row.kernel_busy:
            return
        if row.extra.get("truth") in WORK_TRUTHS:
            result.cells_killed += 1
            killed_by[scenario] += 1

    def close(server: _Server, row: Sample, span: float) -> None:
        if not row.holds_gpu_memory or row.extra.get("truth") != RECLAIMABLE:
            return
        hours = span / HOUR
        reclaimed = hours if server.cull_t is not None and row.t >= server.cull_t else 0.0
        result.idle_held_gpu_hours += hours
        result.reclaimed_gpu_hours += reclaimed
        if row.reports:
            result.reporting_idle_held_gpu_hours += hours
            result.reporting_reclaimed_gpu_hours += reclaimed

    for row in samples:
        server = servers.get(row.session)
        if server is None:
            cull_t = cull_at.get(row.session)
            warned = cull_t is not None and first_warn.get(row.session, cull_t + 1) <= cull_t
            stops = interrupts.get(row.session, [])
            first_t = row.t if row.started is None else row.started
            server = servers[row.session] = _Server(cull_t, warned, stops, first_t)
        if server.last is not None:
            server.span = row.t - server.last.t
            close(server, server.last, server.span)
        server.last = row
        if not server.culled:
            server.note_deadline(row)
        truth = row.extra.get("truth")
        if row.holds_gpu_memory and truth != "active":
            server.idle_start = row.t if server.idle_start is None else server.idle_start
        else:
            server.idle_start = None
        # The fallback rule, not the GPU policy, decides servers that send no report.
        scenario = str(row.extra.get("scenario", "?")) + ("" if row.reports else " (no report)")
        while server.interrupts and server.interrupts[0] <= row.t:
            if server.interrupts.pop(0) == row.t:
                running_cell_lost(server, row, scenario)
        if server.cull_t is None or row.t < server.cull_t:
            continue
        if not server.culled:
            server.culled = True
            running_cell_lost(server, row, scenario)
            if server.at_deadline(row.t):
                pass  # the admin's rule (max age, a reclaim): kept or not, below
            elif truth in WORK_TRUTHS:
                result.false_culls += 1
                false_by[scenario] += 1
            elif truth == PRESENT:
                result.culls_at_owner_return += 1
            else:
                server.returned = False
                if truth == RECLAIMABLE and server.idle_start is not None:
                    waits.append(server.cull_t - server.idle_start)
            if not server.warned:
                unwarned_by[scenario] += 1
        elif truth in LIVE_TRUTHS and server.returned is False:
            server.returned = True
    for server in servers.values():
        if server.last is not None:
            close(server, server.last, server.span)
        if server.deadline_seen:
            result.deadlines += 1
            given_back = server.cull_t is not None and (
                server.cull_t <= server.deadline + DEADLINE_SLACK + server.span
            )
            result.deadlines_kept += given_back
            if not given_back:
                missed_by[str(server.last.extra.get("scenario", "?"))] += 1

    result.culls = len(cull_at)
    result.warned_culls = sum(s.warned for s in servers.values() if s.cull_t is not None)
    result.culls_before_return = sum(s.returned is True for s in servers.values())
    result.median_idle_to_reclaim_s = statistics.median(waits) if waits else None
    result.false_culls_by_scenario = dict(sorted(false_by.items()))
    result.unwarned_culls_by_scenario = dict(sorted(unwarned_by.items()))
    result.cells_killed_by_scenario = dict(sorted(killed_by.items()))
    result.deadlines_missed_by_scenario = dict(sorted(missed_by.items()))
    return result


def run_all(samples: Callable[[], Iterator[Sample]], defaults: dict | None = None) -> list[Result]:
    """Every policy over the same trace; ``samples()`` reads it afresh each time."""
    results = []
    for name, run in policies(defaults).items():
        actions = list(run(samples()))
        results.append(evaluate(name, samples(), actions))
    return results


COLUMNS = (
    "policy",
    "reclaimed",
    "reporting",
    "cells killed",
    "deadlines kept",
    "false culls",
    "owner back",
    "warned",
    "idle→reclaim",
    "culls",
    "before return",
)


def table(results: list[Result]) -> str:
    """A plain-text table, then the false and unwarned culls of each policy by scenario."""
    lines = [COLUMNS]
    for r in results:
        wait = r.median_idle_to_reclaim_s
        lines.append(
            (
                r.policy,
                f"{r.reclaimed_share:.1%}",
                f"{r.reporting_reclaimed_share:.1%}",
                str(r.cells_killed),
                "-" if r.deadlines_kept_share is None else f"{r.deadlines_kept_share:.0%}",
                str(r.false_culls),
                str(r.culls_at_owner_return),
                "-" if r.warned_share is None else f"{r.warned_share:.0%}",
                "-" if wait is None else format_duration(wait),
                str(r.culls),
                str(r.culls_before_return),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    text = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]
    for title, counts_of in (
        ("false culls", lambda r: r.false_culls_by_scenario),
        ("unwarned culls", lambda r: r.unwarned_culls_by_scenario),
        ("running cells killed", lambda r: r.cells_killed_by_scenario),
        ("deadlines missed", lambda r: r.deadlines_missed_by_scenario),
    ):
        for r in results:
            if counts_of(r):
                by = ", ".join(f"{k} {v}" for k, v in counts_of(r).items())
                text.append(f"{title} of {r.policy}: {by}")
    return "\n".join(text)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of policy keys, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=40, help="users to generate (default 40)")
    parser.add_argument("--days", type=int, default=30, help="days to generate (default 30)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step", type=int, default=DEFAULT_STEP, help="seconds per sample")
    parser.add_argument(
        "--trace", metavar="FILE", help="score this trace instead of generating one"
    )
    parser.add_argument(
        "--no-dcgm",
        action="store_true",
        help="generate a cluster without dcgm-exporter (generate.py --no-dcgm)",
    )
    parser.add_argument(
        "--default-servers",
        action="store_true",
        help="each user's sessions on user/, as a hub reuses it (generate.py --default-servers)",
    )
    parser.add_argument(
        "--policy-defaults",
        metavar="JSON",
        type=_json_object,
        help='refine the default policy, e.g. \'{"warn_after": "1h", "cull_after": "2h"}\'',
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.trace:
        source = {"trace": args.trace}
        samples = partial(read_trace, args.trace)
    else:
        source = {k: getattr(args, k) for k in ("servers", "days", "seed", "step")}
        source["dcgm"] = not args.no_dcgm
        if args.default_servers:
            source["default_servers"] = True
        rows = partial(
            generate,
            args.servers,
            args.days,
            args.seed,
            args.step,
            source["dcgm"],
            args.default_servers,
        )
        samples = lambda: parse_lines(json.dumps(row) for row in rows())  # noqa: E731
    if args.policy_defaults is not None:
        try:
            load_policies([], args.policy_defaults)
        except PolicyError as error:
            parser.error(f"--policy-defaults: {error}")
        source["policy_defaults"] = args.policy_defaults
    results = run_all(samples, args.policy_defaults)
    if args.json:
        print(json.dumps({**source, "policies": [r.as_dict() for r in results]}))
        return
    held = results[0].idle_held_gpu_hours
    print(
        "reclamation replay:",
        ", ".join(f"{k} {v}" for k, v in source.items()),
        f"— {held:,.0f} idle-held GPU-hours",
    )
    print(table(results))
