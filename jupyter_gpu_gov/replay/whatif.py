"""What-if: what a policy (and a tier catalogue) would have done on a trace, side by side.

``measure`` scores any run's actions (the policy engine's, a stock culler's, none) on the trace
it ran on, overall, per team and per tier, in what an admin asks before changing a policy:

- *GPU-hours* are GPU-equivalent hours: a row's span times what the server holds (its
  ``gpu-gov/weight`` label, else its tier's weight in the catalogue, else 1 for a GPU tier or a
  server holding GPU memory, else 0). **Allocated**: held until the run's cull. A row lasts
  until its run's next row, and a run's last row ends it, as ``engine.score`` counts (the
  replay's summary): a trace's rows are samples at instants, an hour's every 5 minutes 13 of
  them (an exported history's: from ``since`` to ``until``, and a run's line after its stop
  carries the actions of a run that had ended). Of these, **active** with the GPU at or above
  ``ACTIVE_SM``, **idle** below it, **unknown** without a reading; **work** weighs each hour by
  its SM activity. **Utilisation** is work over the allocated hours whose activity is known
  (DCGM's mean SM activity of the GPUs given out); **active share** the active hours' share.
- **Reclaimed**: idle hours after the run's cull, given back; **idle left**: idle hours before
  it. **Work lost**: active hours after a cull, cut short.
- **Interruptions**: culls whose owner was back within ``OWNER_BACK_S`` (4 h): a person's
  interaction on the culled server's later rows, or the owner starting another server.
- **Running work killed**: culls and interrupts — not at a hard deadline (a maximum age, a
  reclaim, an admin's cull) — of a server whose GPU was working, or whose running cell went on
  to use the GPU before it ended. Those at a hard deadline are counted as **deadline culls**.
- **Right-sizing freed**: while a smaller tier of the catalogue would hold the server's measured
  peaks (``core.rightsize``, the governor's rule, from its reporting rows), the GPU-equivalents
  it would not have held.
- **Queue waits**, from a capacity model: each tier with a capacity is a pool of that many
  servers at once, first come first served, no borrowing between tiers and no MIG
  repartitioning. A run of a server asks for its tier when it starts and holds it until its cull
  or its end; one that finds the pool full waits until a server of the tier ends (and its hold
  moves by the wait). Only runs that started are in a trace: demand refused at the time, or
  never asked for, is not.

``compare`` runs the current and the candidate setups over the same trace (each run reads it
afresh) and measures them, with the trace as recorded (no action taken) beside them.
Stdlib only, like ``core``: the command line and, later, the dashboard call it.
"""

from __future__ import annotations

import heapq
import statistics
import textwrap
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any

from ..core import grant, rightsize
from ..core.durations import format_duration
from ..core.vocabulary import (
    ADMIN,
    CHECKPOINT,
    CULL,
    INTERRUPT,
    MAX_AGE,
    MAX_AGE_LABEL,
    NOTICES,
    RECLAIM,
    TIER_LABEL,
    WARN,
    WARNINGS,
)
from .engine import ACTIVE_SM, Action, at
from .trace import Sample

OWNER_BACK_S = 4 * 3600.0
HARD_DEADLINES = frozenset({MAX_AGE, RECLAIM, ADMIN})
NO_TEAM = "(no team)"
HOUR = 3600.0
Session = tuple[str, float | None]
Run = Callable[[Iterable[Sample]], Iterable[Action]]


# -- what a side is ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tiers:
    """The tier catalogue as a what-if needs it (built from ``c.GpuProfiles`` by the caller)."""

    sizes: Mapping[str, rightsize.TierSize] = field(default_factory=dict)
    # Servers of the tier that can run at once: its capacity in devices over a server's devices.
    slots: Mapping[str, int] = field(default_factory=dict)
    # The tier's maximum age in seconds (None: none): a server of a tier listed here gets it as
    # its gpu-gov/max-age label, as the profile layer writes it at admission.
    max_age: Mapping[str, float | None] = field(default_factory=dict)
    right_size_after: timedelta = rightsize.MIN_OBSERVED
    # GPU-equivalents a server of the tier holds when its grant says none, where they are not
    # the size's (the governor's ``c.GpuGovernor.tier_weights``, as its usage ledger counts).
    weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Setup:
    """One side of a comparison: a run (the policy engine with some policies, or a stock
    culler) and the tiers it runs on."""

    name: str
    run: Run
    tiers: Tiers = Tiers()
    policies: tuple[str, ...] = ()  # the names, for the reader


def tier_of(sample: Sample) -> str | None:
    return sample.labels.get(TIER_LABEL) or sample.profile


def with_tiers(samples: Iterable[Sample], tiers: Tiers) -> Iterator[Sample]:
    """The trace as it would have run on ``tiers``: each server of a listed tier carries that
    tier's maximum age (or none)."""
    if not tiers.max_age:
        yield from samples
        return
    for sample in samples:
        tier = tier_of(sample)
        if tier not in tiers.max_age:
            yield sample
            continue
        labels = {k: v for k, v in sample.labels.items() if k != MAX_AGE_LABEL}
        age = tiers.max_age[tier]
        if age:
            labels[MAX_AGE_LABEL] = str(int(age))
        yield replace(sample, labels=labels)


# -- figures -----------------------------------------------------------------------------------


@dataclass
class Totals:
    """The figures of one run, for everything or for one team or tier."""

    servers: int = 0  # runs of a server
    allocated_gpu_hours: float = 0.0
    active_gpu_hours: float = 0.0
    idle_left_gpu_hours: float = 0.0
    unknown_gpu_hours: float = 0.0
    work_gpu_hours: float = 0.0  # allocated hours weighed by SM activity
    reclaimed_gpu_hours: float = 0.0
    work_lost_gpu_hours: float = 0.0
    right_size_freed_gpu_hours: float = 0.0
    right_sized_servers: int = 0
    warnings: int = 0
    notices: int = 0
    checkpoints: int = 0
    interrupts: int = 0
    culls: int = 0
    culls_by_reason: Counter = field(default_factory=Counter)
    interruptions: int = 0
    running_work_killed: int = 0
    deadline_culls: int = 0
    requests_waited: int = 0
    wait_hours: float = 0.0
    waits_s: list = field(default_factory=list, repr=False)

    @property
    def known_gpu_hours(self) -> float:
        return self.allocated_gpu_hours - self.unknown_gpu_hours

    @property
    def utilisation(self) -> float | None:
        return _share(self.work_gpu_hours, self.known_gpu_hours)

    @property
    def active_share(self) -> float | None:
        return _share(self.active_gpu_hours, self.known_gpu_hours)

    @property
    def utilisation_right_sized(self) -> float | None:
        """Utilisation had each server run on the smaller tier right-sizing named."""
        return _share(self.work_gpu_hours, self.known_gpu_hours - self.right_size_freed_gpu_hours)

    @property
    def median_wait_s(self) -> float | None:
        return statistics.median(self.waits_s) if self.waits_s else None

    @property
    def max_wait_s(self) -> float | None:
        return max(self.waits_s) if self.waits_s else None

    def as_dict(self) -> dict[str, Any]:
        figures = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "waits_s"}
        figures["culls_by_reason"] = dict(sorted(self.culls_by_reason.items()))
        for name in (
            "utilisation",
            "active_share",
            "utilisation_right_sized",
            "median_wait_s",
            "max_wait_s",
        ):
            figures[name] = getattr(self, name)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 1e-9 else None


@dataclass
class Outcome:
    """One run measured: overall, per team and per tier."""

    name: str
    policies: tuple[str, ...] = ()
    rows: int = 0
    first_t: float | None = None
    last_t: float | None = None
    total: Totals = field(default_factory=Totals)
    teams: dict[str, Totals] = field(default_factory=lambda: defaultdict(Totals))
    tiers: dict[str, Totals] = field(default_factory=lambda: defaultdict(Totals))

    def each(self, team: str, tier: str) -> tuple[Totals, Totals, Totals]:
        return self.total, self.teams[team], self.tiers[tier]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "policies": list(self.policies),
            "total": self.total.as_dict(),
            "teams": {k: v.as_dict() for k, v in sorted(self.teams.items())},
            "tiers": {k: v.as_dict() for k, v in sorted(self.tiers.items())},
        }


class _Run:
    """One run of a server as ``measure`` goes."""

    __slots__ = (
        "cull_reason",
        "culled_at",
        "end",
        "first_t",
        "fit",
        "killed",
        "last",
        "meter",
        "owner_back",
        "sized",
        "team",
        "tier",
        "watch",
        "weight",
    )

    def __init__(self, sample: Sample, weight: float, culled_at: float | None):
        self.first_t = sample.t if sample.started is None else min(sample.started, sample.t)
        self.team = sample.team or NO_TEAM
        self.tier = tier_of(sample) or "(none)"
        self.weight = weight
        self.culled_at = culled_at
        self.cull_reason: str | None = None
        self.last: Sample | None = None
        self.end = sample.t
        self.meter = rightsize.Meter()
        self.fit: float | None = None  # the share of its GPU-equivalents a smaller tier needs
        self.sized = False  # right-sizing looked at its peaks as they are
        self.watch: list[float] = []  # cull and interrupt times whose cell is being watched
        self.killed = False
        self.owner_back = False


def weight_of(sample: Sample, tiers: Tiers) -> float:
    """GPU-equivalents the server holds, as the usage ledger counts them."""
    recorded = grant.weight(sample.labels)
    if recorded is not None:
        return recorded
    tier = tier_of(sample)
    if tier in tiers.weights:
        return float(tiers.weights[tier])
    if tier in tiers.sizes:
        return tiers.sizes[tier].weight
    if (tier and tier != "no-gpu") or sample.holds_gpu_memory:
        return 1.0
    return 0.0


def measure(
    name: str,
    samples: Iterable[Sample],
    actions: Iterable[Action],
    tiers: Tiers = Tiers(),
    *,
    policies: Sequence[str] = (),
    active_sm: float = ACTIVE_SM,
    owner_back_s: float = OWNER_BACK_S,
) -> Outcome:
    """Measure one run's ``actions`` on the trace they were taken on (see the module's
    docstring for every figure). Streams the trace once; keeps a few numbers per run."""
    outcome = Outcome(name, tuple(policies))
    by_run: dict[Session, list[Action]] = defaultdict(list)
    for action in actions:
        by_run[action.session].append(action)
    culled_at = {
        key: next((a.t for a in acts if a.action == CULL), None) for key, acts in by_run.items()
    }
    runs: dict[Session, _Run] = {}
    starts: dict[str, list[float]] = defaultdict(list)  # each user's runs' first rows

    def close(run: _Run, row: Sample, span: float) -> None:
        """Book the row's state for ``span`` seconds."""
        if span <= 0 or run.weight <= 0:
            return
        hours = span / HOUR * run.weight
        after = run.culled_at is not None and row.t >= run.culled_at
        totals = outcome.each(run.team, run.tier)
        if row.gpu_sm is None:
            if not after:
                for t in totals:
                    t.allocated_gpu_hours += hours
                    t.unknown_gpu_hours += hours
            return
        active = row.gpu_sm >= active_sm
        for t in totals:
            if after:
                if active:
                    t.work_lost_gpu_hours += hours
                else:
                    t.reclaimed_gpu_hours += hours
                continue
            t.allocated_gpu_hours += hours
            t.work_gpu_hours += hours * row.gpu_sm
            if active:
                t.active_gpu_hours += hours
            else:
                t.idle_left_gpu_hours += hours
            if run.fit is not None:
                t.right_size_freed_gpu_hours += hours * (1 - run.fit)

    def right_size(run: _Run, row: Sample) -> None:
        if not row.reports or not row.holds_context or run.tier not in tiers.sizes:
            return
        if run.meter.add(row.gpu_mem_mb, row.gpu_sm or 0.0, at(row.t)):
            run.sized = False
        use = run.meter.measured()
        if run.sized or use.observed < tiers.right_size_after:
            return
        run.sized = True
        fit = rightsize.right_size(run.tier, use, tiers.sizes, None, tiers.right_size_after)
        was = run.fit
        run.fit = None if fit is None else fit[0].weight / tiers.sizes[run.tier].weight
        if was is None and run.fit is not None:
            for t in outcome.each(run.team, run.tier):
                t.right_sized_servers += 1

    def watch_cell(run: _Run, row: Sample) -> None:
        """A cull or interrupt stopped work if the GPU was working, or if the running cell
        went on to use it before it ended."""
        while run.watch and run.watch[0] <= row.t:
            if row.gpu_sm is not None and row.gpu_sm >= active_sm:
                run.killed = True
            if run.killed or not row.kernel_busy:
                run.watch.clear()  # decided: work lost, or the cell ended without the GPU
            else:
                break  # the cell runs on: look at the next row

    for row in samples:
        outcome.rows += 1
        if outcome.first_t is None or row.t < outcome.first_t:
            outcome.first_t = row.t
        if outcome.last_t is None or row.t > outcome.last_t:
            outcome.last_t = row.t
        run = runs.get(row.session)
        if run is None:
            weight = weight_of(row, tiers)
            run = runs[row.session] = _Run(row, weight, culled_at.get(row.session))
            starts[row.user].append(run.first_t)
            for t in outcome.each(run.team, run.tier):
                t.servers += 1
            for action in by_run.get(row.session, ()):
                _count(action, run, outcome)
        if run.last is not None:
            close(run, run.last, row.t - run.last.t)
        run.last, run.end = row, row.t
        before_cull = run.culled_at is None or row.t < run.culled_at
        if before_cull:
            right_size(run, row)
        elif row.user_active and row.t <= run.culled_at + owner_back_s:
            run.owner_back = True
        if run.watch:
            watch_cell(run, row)

    for key, run in runs.items():
        culled = run.culled_at is not None
        if culled and not run.owner_back:
            run.owner_back = any(
                run.culled_at < start <= run.culled_at + owner_back_s
                for start in starts[key[0].partition("/")[0]]
            )
        totals = outcome.each(run.team, run.tier)
        for t in totals:
            if culled and run.owner_back:
                t.interruptions += 1
            if run.killed:
                t.running_work_killed += 1
    _queue(outcome, runs, tiers)
    return outcome


def _count(action: Action, run: _Run, outcome: Outcome) -> None:
    """Count one action; a cull or an interrupt outside a hard deadline watches its cell."""
    kind = action.action
    for t in outcome.each(run.team, run.tier):
        if kind in WARNINGS:
            t.warnings += 1
        elif kind in NOTICES or kind == "notice":
            t.notices += 1
        elif kind == CHECKPOINT:
            t.checkpoints += 1
        elif kind == INTERRUPT:
            t.interrupts += 1
        elif kind == CULL and action.t == run.culled_at:
            t.culls += 1
            t.culls_by_reason[action.cull_reason or "stock culler"] += 1
            t.deadline_culls += action.cull_reason in HARD_DEADLINES
    if kind == INTERRUPT or (
        kind == CULL and action.t == run.culled_at and action.cull_reason not in HARD_DEADLINES
    ):
        run.watch.append(action.t)
        run.watch.sort()


def _queue(outcome: Outcome, runs: Mapping[Session, _Run], tiers: Tiers) -> None:
    """First come, first served per tier with a capacity: who would have waited, how long."""
    by_tier: dict[str, list[_Run]] = defaultdict(list)
    for run in runs.values():
        if run.tier in tiers.slots and run.weight > 0:
            by_tier[run.tier].append(run)
    for tier, queue in by_tier.items():
        free = [float("-inf")] * max(tiers.slots[tier], 0)
        if not free:
            continue  # a tier with no capacity: nothing can start (nor did, in the model)
        for run in sorted(queue, key=lambda r: r.first_t):
            end = run.end if run.culled_at is None else min(run.culled_at, run.end)
            start = max(run.first_t, free[0])
            heapq.heapreplace(free, start + (end - run.first_t))
            wait = start - run.first_t
            if wait <= 0:
                continue
            for t in outcome.each(run.team, run.tier):
                t.requests_waited += 1
                t.wait_hours += wait / HOUR
                t.waits_s.append(wait)


# -- the comparison ----------------------------------------------------------------------------


RECORDED = "recorded"


def recorded_actions(samples: Iterable[Sample]) -> Iterator[Action]:
    """What the governor did when the trace was recorded: the ``actions`` (and
    ``cull_reason``) an exported history carries (``replay.history``); nothing for a trace
    without them."""
    for sample in samples:
        done = sample.extra.get("actions")
        if not isinstance(done, list):
            continue
        reason = sample.extra.get("cull_reason")
        for kind in done:
            if not isinstance(kind, str):
                continue
            name = WARN if kind in WARNINGS else "notice" if kind in NOTICES else kind
            cull_reason = reason if kind == CULL and isinstance(reason, str) else None
            yield Action(sample.t, sample.server, name, "recorded", sample.started, cull_reason)


def compare(samples: Callable[[], Iterator[Sample]], setups: Sequence[Setup]) -> list[Outcome]:
    """The trace as recorded (what the governor did then, if the trace says: else no action;
    on the first setup's tiers), then each setup's run, measured the same way. ``samples()``
    reads the trace afresh each time."""
    first = setups[0].tiers if setups else Tiers()
    outcomes = [measure(RECORDED, samples(), list(recorded_actions(samples())), first)]
    for setup in setups:
        actions = list(setup.run(with_tiers(samples(), setup.tiers)))
        trace = with_tiers(samples(), setup.tiers)
        outcomes.append(measure(setup.name, trace, actions, setup.tiers, policies=setup.policies))
    return outcomes


def report(outcomes: Sequence[Outcome], trace: Mapping[str, Any] | None = None) -> dict:
    """The JSON a machine (or the dashboard) reads: each run's figures, and the change from the
    second run (the current setup) to the last (the candidate)."""
    body: dict[str, Any] = {"trace": dict(trace or {})}
    body["runs"] = [o.as_dict() for o in outcomes]
    if len(outcomes) >= 3:
        body["change"] = _change(outcomes[1].total.as_dict(), outcomes[-1].total.as_dict())
    return body


def _change(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    change = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, int | float) and isinstance(old, int | float):
            change[key] = round(value - old, 4)
    return change


# -- the table a person reads ------------------------------------------------------------------


_ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, figure, format)
    ("GPU-hours allocated", "allocated_gpu_hours", "hours"),
    ("  active", "active_gpu_hours", "hours"),
    ("  idle left", "idle_left_gpu_hours", "hours"),
    ("  unknown", "unknown_gpu_hours", "hours"),
    ("GPU-hours reclaimed (idle)", "reclaimed_gpu_hours", "hours"),
    ("GPU work lost (active)", "work_lost_gpu_hours", "hours"),
    ("utilisation (mean SM)", "utilisation", "share"),
    ("active share", "active_share", "share"),
    ("utilisation, right-sized", "utilisation_right_sized", "share"),
    ("right-sizing freed GPU-hours", "right_size_freed_gpu_hours", "hours"),
    ("servers right-sizing names", "right_sized_servers", "count"),
    ("warnings", "warnings", "count"),
    ("notices (busy, overrun)", "notices", "count"),
    ("checkpoints", "checkpoints", "count"),
    ("interrupts", "interrupts", "count"),
    ("culls", "culls", "count"),
    ("  at a hard deadline", "deadline_culls", "count"),
    ("interruptions (owner back < 4 h)", "interruptions", "count"),
    ("running work killed", "running_work_killed", "count"),
    ("requests that waited for a GPU", "requests_waited", "count"),
    ("  hours waited, all requests", "wait_hours", "hours"),
    ("  median wait", "median_wait_s", "duration"),
    ("  longest wait", "max_wait_s", "duration"),
)
_TEAM_COLUMNS = (
    ("utilisation", "utilisation", "share"),
    ("reclaimed", "reclaimed_gpu_hours", "hours"),
    ("idle left", "idle_left_gpu_hours", "hours"),
    ("interruptions", "interruptions", "count"),
    ("killed", "running_work_killed", "count"),
    ("waited", "requests_waited", "count"),
    ("freed", "right_size_freed_gpu_hours", "hours"),
)


def figure_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    """The figures as rows of text cells: a header (the runs, then "change" from the current
    setup to the candidate), then one row per figure that any run has."""
    names = [o.name for o in outcomes]
    header = ["", *names] + (["change"] if len(outcomes) >= 3 else [])
    lines = [header]
    for label, key, kind in _ROWS:
        values = [getattr(o.total, key) for o in outcomes]
        if kind == "hours" and not any(values) and key != "reclaimed_gpu_hours":
            continue
        if kind in ("share", "duration") and all(v is None for v in values):
            continue
        cells = [_cell(v, kind) for v in values]
        if len(outcomes) >= 3:
            cells.append(_delta(values[1], values[-1], kind))
        lines.append([label, *cells])
    return lines


def table(outcomes: Sequence[Outcome], title: str = "") -> str:
    """The comparison as text: every figure per run, the change from the current setup to the
    candidate, then per team the figures that differ most between teams."""
    lines = figure_rows(outcomes)
    text = [title] if title else []
    text += _columns(lines)
    teams = sorted({team for o in outcomes for team in o.teams})
    if teams and len(outcomes) >= 2:
        runs = outcomes[1:]
        text.append("")
        text.append("per team (" + " → ".join(o.name for o in runs) + ")")
        rows = [["team", *(c[0] for c in _TEAM_COLUMNS)]]
        for team in teams:
            cells = [team]
            for _, key, kind in _TEAM_COLUMNS:
                values = [getattr(o.teams[team], key) if team in o.teams else None for o in runs]
                cells.append(" → ".join(_cell(v, kind) for v in values))
            rows.append(cells)
        text += _columns(rows)
    if said := notes(outcomes):
        text += ["", *said]
    return "\n".join(text)


_ACTIONS = ("warnings", "notices", "checkpoints", "interrupts", "culls")


def notes(outcomes: Sequence[Outcome], width: int | None = 92) -> list[str]:
    """What a reader new to the table needs: what "recorded" and the replayed runs are, and
    why the recorded culls differ from the current policy's replayed on the same trace. Lines
    of ``width`` characters; None: one paragraph each (a page wraps its own)."""
    if len(outcomes) < 2 or outcomes[0].name != RECORDED:
        return []
    recorded, current = outcomes[0].total, outcomes[1].total
    replayed = ", ".join(o.name for o in outcomes[1:])
    acted = any(getattr(recorded, name) for name in _ACTIONS)
    said = [
        "recorded: what the governor did when this history was recorded (the actions the "
        "trace carries)."
        if acted
        else "recorded: the trace with nothing done (it carries none of the governor's "
        "actions: not an exported history, or nothing was done then).",
        f"{replayed}: each policy replayed on the trace's samples, as if it had governed instead.",
    ]
    culls = f"recorded {_times(recorded.culls, 'cull')}, {outcomes[1].name} {current.culls:,}"
    if acted and recorded.culls > current.culls:
        said.append(
            f"{culls}: a server the governor culled stops at that cull in the trace. A replayed "
            "policy acts only at the trace's samples (one each export-trace --step, 5m by "
            "default), after its own warning and checkpoint, so its cull of such a server can "
            "fall after the run ended, and none is counted; nor does it know what came before "
            "the trace's first sample (an idle stretch begun earlier)."
        )
    elif acted and recorded.culls < current.culls:
        said.append(
            f"{culls}: the replayed policy culls servers the governor did not: the trace does "
            "not carry what held their cull off then (other policies in force, an owner's "
            "extension, an admin's exemption)."
        )
    if width is None:
        return said
    return [line for text in said for line in textwrap.wrap(text, width)]


def _times(count: int, what: str) -> str:
    return f"{count:,} {what}" + ("" if count == 1 else "s")


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "hours":
        return f"{value:,.1f}"
    if kind == "share":
        return f"{value:.1%}"
    if kind == "duration":
        return format_duration(value)
    return f"{value:,}"


def _delta(before: Any, after: Any, kind: str) -> str:
    if before is None or after is None:
        return "-"
    change = after - before
    if kind == "share":
        return f"{change * 100:+.1f} pts"
    if kind == "duration":
        return ("+" if change >= 0 else "-") + format_duration(abs(change))
    if kind == "hours":
        return f"{change:+,.1f}"
    return f"{change:+,}"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]
