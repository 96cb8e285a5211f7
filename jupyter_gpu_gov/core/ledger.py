"""The usage ledger: GPU-equivalent seconds per server session, split by what the GPU did, in
buckets per UTC day and owner (user, team, project, tier). Pure: stdlib only, time passed in.

The governor observes every running server once per reconcile pass. Between two observations
of one server session the ledger bills the time *as it was seen at the first of the two*
(sample and hold): ``gpus`` GPU-equivalents in one of four states,

- ``active``: the GPU did work;
- ``idle_held``: no GPU work, but a process holds a GPU context (memory);
- ``idle_free``: no GPU work and no context, yet the GPU is allocated to the server;
- ``unknown``: no (fresh) report, an API that cannot say, a server without the extension. Unknown
  is never idle: it is billed as allocated, never as idle, and never costed as idle.

Rules that keep the sums honest:

- A second is billed at most once per server: an observation at or before the last one bills
  nothing; a new session of the same server ends the old one no later than the new one started.
- A gap between two observations longer than ``max_gap`` (the service was down, the hub did not
  answer) is billed to no state: it is counted as ``unobserved`` (GPU-equivalent seconds, kept
  apart from ``allocated``) so nothing disappears silently, and nobody pays idle for an outage.
- The first observation of a session bills from the session's start (the hub's ``started``) when
  that is within ``max_gap``, in the state first seen; a server that stops is billed up to the
  moment it was stopped (``close``), when that is within ``max_gap`` of the last observation.
- Intervals that cross UTC midnight are split between the two days.

A server not observed in a pass while it runs as it was (the governor looked at nothing it
reads: the same session, owner, GPUs, state and right-sizing share) is *held*: each pass ends
with one ``sweep`` that sees every held session as it was, without visiting any of them. The
time up to the last sweep is billed, as observed, when the session is next observed, when it
stops, or when the ledger is drained (its write, every few minutes) — what observing each of
them at every pass would bill, in fewer and longer pieces. A sweep more than ``max_gap`` after
the last (the service was down) bills that gap to every held session as ``unobserved``; a
server the pass could not decide is not seen (``skip``) until observed again.

Right-sizing: while a smaller tier would hold the server's measured use (``right_size_share``,
its share of the GPU-equivalents held), the GPU-equivalent seconds it would have freed are
counted too (``right_size_freed``), beside the state, never instead of it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import date, datetime, time, timedelta, timezone
from itertools import groupby

ACTIVE, IDLE_HELD, IDLE_FREE, UNKNOWN = "active", "idle_held", "idle_free", "unknown"
STATES = (ACTIVE, IDLE_HELD, IDLE_FREE, UNKNOWN)
UNOBSERVED = "unobserved"
EVENTS = ("culls", "extensions")
RIGHT_SIZE_FREED = "right_size_freed"
FIELDS = (*STATES, UNOBSERVED, *EVENTS, RIGHT_SIZE_FREED)  # what a bucket holds
# The spawn queue's, in buckets of their own (from the governor's audit trail, not the usage
# table): seconds waited by requests that started, and how many started or expired.
QUEUE_WAIT, QUEUE_STARTS, QUEUE_EXPIRED = "queue_wait", "queue_starts", "queue_expired"
DIMENSIONS = ("user", "team", "project", "tier")
PERIODS = ("day", "week", "all")


@dataclass(frozen=True, slots=True)  # one or two per running server: no __dict__ each
class Owner:
    """Who a GPU-second is billed to ("" where unknown: no team, no project)."""

    user: str
    team: str = ""
    project: str = ""
    tier: str = ""

    def get(self, dimension: str) -> str:
        return getattr(self, dimension)


@dataclass(frozen=True)
class Observation:
    server: str  # "user/name"
    session: str  # identifies the session (the hub's start time); a new value, a new session
    at: datetime
    owner: Owner
    gpus: float  # GPU-equivalents held; 0: holds no GPU (nothing is billed)
    state: str  # one of STATES
    started: datetime | None = None  # when the session started, if known
    # The share of ``gpus`` a right-sized tier would hold (below 1), if one would do.
    right_size_share: float | None = None


@dataclass(slots=True)  # one per running server: no __dict__ each
class Session:
    """One server session: its totals and where the ledger last saw it (the cursor)."""

    server: str
    session: str
    owner: Owner
    first_at: datetime
    at: datetime  # billed up to here
    gpus: float
    state: str
    totals: dict[str, float] = field(default_factory=dict)  # FIELDS -> GPU-eq s, or counts
    ended_at: datetime | None = None
    right_size_share: float | None = None  # as last observed (not stored)
    held: bool = False  # seen as it was by every sweep since its last observation (not stored)

    @property
    def allocated(self) -> float:
        return sum(self.totals.get(s, 0.0) for s in STATES)

    def snapshot(self) -> Session:
        """A copy that later observations leave alone. Copies the fields directly: a drain
        copies every running server's session, and ``dataclasses.replace`` costs 5 µs a call."""
        copy = Session(*_fields_of(self))
        copy.totals = dict(self.totals)
        return copy


_fields_of = operator.attrgetter(*(f.name for f in fields(Session)))  # in ``__init__``'s order


BucketKey = tuple[date, Owner]


class Ledger:
    """Accrues observations into per-session totals and per-(day, owner) deltas; ``drain()``
    hands the deltas (and the sessions that changed) to whoever persists them."""

    def __init__(self, max_gap: timedelta, sessions: Iterable[Session] = ()):
        if max_gap <= timedelta(0):
            raise ValueError("max_gap must be positive")
        self.max_gap = max_gap
        self.open: dict[str, Session] = {s.server: s for s in sessions if s.ended_at is None}
        self._deltas: dict[BucketKey, dict[str, float]] = {}
        self._changed: dict[tuple[str, str], Session] = {}
        self.swept: datetime | None = None  # the last sweep: held sessions are seen up to it

    # -- feeding -------------------------------------------------------------------------------

    def observe(self, obs: Observation) -> None:
        if obs.state not in STATES:
            raise ValueError(f"unknown ledger state {obs.state!r}")
        current = self.open.get(obs.server)
        if current is not None:
            self._settle(current)
        if current is not None and current.session != obs.session:
            end = obs.at if obs.started is None else max(current.at, min(obs.at, obs.started))
            self.close(obs.server, end)
            current = None
        if current is None:
            since = obs.at
            if obs.started is not None and timedelta(0) <= obs.at - obs.started <= self.max_gap:
                since = obs.started
            current = Session(
                obs.server, obs.session, obs.owner, since, since, obs.gpus, obs.state, {}
            )
            self.open[obs.server] = current
        self._bill(current, obs.at)
        if obs.owner != current.owner:  # an equal one is kept: the day's bucket holds it too
            current.owner = obs.owner
        current.gpus, current.state = obs.gpus, obs.state
        current.right_size_share = obs.right_size_share
        current.held = True
        self._changed[(current.server, current.session)] = current

    def sweep(self, at: datetime) -> None:
        """A pass at ``at`` saw every held session as it was (their servers run, nothing they
        bill moved): each is seen up to ``at`` without a visit. After a gap longer than
        ``max_gap`` since the last sweep, the gap is billed to each as ``unobserved``."""
        last = self.swept
        if last is not None and at - last > self.max_gap:
            for s in self.open.values():
                if s.held:
                    self._settle(s)
                    self._bill(s, at)
        if last is None or at > last:
            self.swept = at

    def skip(self, server: str) -> None:
        """A running server this pass could not observe (its decision failed): seen up to the
        last sweep, and by none after it until it is observed again."""
        current = self.open.get(server)
        if current is not None:
            self._settle(current)
            current.held = False

    def close(self, server: str, at: datetime) -> Session | None:
        """The server stopped at ``at`` (or was found gone then): bill up to it, end the
        session."""
        current = self.open.pop(server, None)
        if current is None:
            return None
        self._settle(current)
        self._bill(current, at)
        current.ended_at = max(at, current.at)
        self._changed[(current.server, current.session)] = current
        return current

    def event(self, server: str, owner: Owner, at: datetime, name: str, count: int = 1) -> None:
        """A cull or an extension, counted on the server's session and in the day's bucket."""
        if name not in EVENTS:
            raise ValueError(f"unknown ledger event {name!r}")
        current = self.open.get(server)
        if current is not None:
            owner = current.owner
            current.totals[name] = current.totals.get(name, 0) + count
            self._changed[(current.server, current.session)] = current
        self._add((at.astimezone(timezone.utc).date(), owner), name, count)

    def shift(self, delta: timedelta) -> None:
        """The wall clock stepped by ``delta``: every open session's cursors move with it."""
        for s in self.open.values():
            s.at += delta
        if self.swept is not None:
            self.swept += delta

    def _settle(self, s: Session) -> None:
        """Bill what the sweeps saw of a held session: as it was, every step within
        ``max_gap``."""
        if s.held and self.swept is not None:
            self._bill(s, self.swept, observed=True)

    def _bill(self, s: Session, until: datetime, observed: bool = False) -> None:
        if until <= s.at:
            return  # a second is billed at most once
        start, s.at = s.at, until
        self._changed[(s.server, s.session)] = s  # written at the next drain
        if s.gpus <= 0:
            return
        what = UNOBSERVED if until - start > self.max_gap and not observed else s.state
        share = s.right_size_share if what != UNOBSERVED else None
        for day, seconds in split_days(start, until):
            amount = seconds * s.gpus
            s.totals[what] = s.totals.get(what, 0.0) + amount
            self._add((day, s.owner), what, amount)
            if share is not None and 0 <= share < 1:
                freed = amount * (1 - share)
                s.totals[RIGHT_SIZE_FREED] = s.totals.get(RIGHT_SIZE_FREED, 0.0) + freed
                self._add((day, s.owner), RIGHT_SIZE_FREED, freed)

    def _add(self, key: BucketKey, name: str, amount: float) -> None:
        bucket = self._deltas.setdefault(key, {})
        bucket[name] = bucket.get(name, 0.0) + amount

    # -- handing over --------------------------------------------------------------------------

    def drain(self) -> tuple[dict[BucketKey, dict[str, float]], list[Session]]:
        """The bucket deltas and changed sessions since the last drain (then forgotten)."""
        for s in self.open.values():
            self._settle(s)
        deltas, changed = self._deltas, list(self._changed.values())
        self._deltas, self._changed = {}, {}
        return deltas, [s.snapshot() for s in changed]

    def give_back(self, deltas: dict[BucketKey, dict[str, float]], sessions: list[Session]) -> None:
        """What a drain handed over that could not be written: it goes with the next drain."""
        for key, values in deltas.items():
            for name, amount in values.items():
                self._add(key, name, amount)
        for s in sessions:
            live = self.open.get(s.server)
            current = live if live is not None and live.session == s.session else s
            self._changed.setdefault((s.server, s.session), current)


def split_days(start: datetime, end: datetime) -> list[tuple[date, float]]:
    """``[start, end)`` as (UTC day, seconds) pieces."""
    start, end = start.astimezone(timezone.utc), end.astimezone(timezone.utc)
    if start.date() == end.date():  # the usual case: a pass's minute, within one day
        return [(start.date(), (end - start).total_seconds())] if start < end else []
    pieces = []
    while start < end:
        midnight = datetime.combine(start.date() + timedelta(days=1), time(), timezone.utc)
        stop = min(end, midnight)
        pieces.append((start.date(), (stop - start).total_seconds()))
        start = stop
    return pieces


# -- showback ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    day: date
    owner: Owner
    values: Mapping[str, float]


def period_of(day: date, period: str) -> str:
    if period == "day":
        return day.isoformat()
    if period == "week":  # ISO weeks, named by their Monday
        return (day - timedelta(days=day.weekday())).isoformat()
    return "all"


def summarize(
    buckets: Iterable[Bucket],
    group_by: Sequence[str],
    period: str = "all",
    cost_per_hour: Callable[[str], float] = lambda tier: 0.0,
) -> list[dict]:
    """Showback rows: per period and group, GPU-hours allocated, active, idle (held memory or
    not), unknown and unobserved, what the idle hours cost, culls and extensions.

    ``group_by`` names dimensions (user, team, project, tier); ``cost_per_hour(tier)`` is the
    price of one GPU-equivalent hour of that tier. Rows are sorted by period then group.

    Costs are counted in whole cents a bucket (a UTC day of one user, team, project and tier,
    the ledger's finest line), each rounded once, and a row sums its buckets' cents: a
    month's total by team is then, to the cent, the sum of its rows by day or by user, as a
    finance person adds them up (rounding each row's sum apart, a month by team was 5 cents
    off its days').
    """
    _check(group_by, period)
    rows: dict[tuple, dict] = {}
    for b in buckets:
        key = (period_of(b.day, period), *(b.owner.get(d) for d in group_by))
        row = rows.get(key)
        if row is None:
            row = rows[key] = {
                "period": key[0],
                **dict(zip(group_by, key[1:], strict=True)),
                **{f"{s}_s": 0.0 for s in (*STATES, UNOBSERVED)},
                "idle_cents": 0,
                "cents": 0,
                "saving_cents": 0,
                "culls": 0,
                "extensions": 0,
                "freed_s": 0.0,
                "queue_wait_s": 0.0,
                QUEUE_STARTS: 0,
                QUEUE_EXPIRED: 0,
            }
        price = cost_per_hour(b.owner.tier)
        for s in (*STATES, UNOBSERVED):
            row[f"{s}_s"] += b.values.get(s, 0.0)
        idle = b.values.get(IDLE_HELD, 0.0) + b.values.get(IDLE_FREE, 0.0)
        allocated = sum(b.values.get(s, 0.0) for s in STATES)
        row["idle_cents"] += round(idle / 36 * price)  # seconds / 3600 * price * 100
        row["cents"] += round(allocated / 36 * price)
        # What a right-sized tier would have saved, at this tier's price per GPU-equivalent.
        row["saving_cents"] += round(b.values.get(RIGHT_SIZE_FREED, 0.0) / 36 * price)
        for e in EVENTS:
            row[e] += round(b.values.get(e, 0))
        row["freed_s"] += b.values.get(RIGHT_SIZE_FREED, 0.0)
        row["queue_wait_s"] += b.values.get(QUEUE_WAIT, 0.0)
        for e in (QUEUE_STARTS, QUEUE_EXPIRED):
            row[e] += round(b.values.get(e, 0))
    return [_hours(rows[k]) for k in sorted(rows)]


def summarize_periods(
    buckets: Iterable[Bucket],
    group_by: Sequence[str],
    period: str = "all",
    cost_per_hour: Callable[[str], float] = lambda tier: 0.0,
) -> Iterator[dict]:
    """``summarize``'s rows, in its order, from ``buckets`` in day order, a period at a time:
    what is held is one period's rows, not the span's (a year by user and day is 3.65 M rows
    at 10,000 users)."""
    _check(group_by, period)
    for _, chunk in groupby(buckets, key=lambda b: period_of(b.day, period)):
        yield from summarize(chunk, group_by, period, cost_per_hour)


def _check(group_by: Sequence[str], period: str) -> None:
    for dim in group_by:
        if dim not in DIMENSIONS:
            raise ValueError(f"cannot group by {dim!r}: one of {', '.join(DIMENSIONS)}")
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}, got {period!r}")


def _hours(row: dict) -> dict:
    seconds = {s: row.pop(f"{s}_s") for s in (*STATES, UNOBSERVED)}
    allocated = sum(seconds[s] for s in STATES)
    idle = seconds[IDLE_HELD] + seconds[IDLE_FREE]
    events = {e: row.pop(e) for e in EVENTS}
    freed = row.pop("freed_s")
    queue = {
        QUEUE_STARTS: row.pop(QUEUE_STARTS),
        "queue_hours": round(row.pop("queue_wait_s") / 3600, 4),  # waited by those started
        QUEUE_EXPIRED: row.pop(QUEUE_EXPIRED),
    }
    costs = {"idle_cost": row.pop("idle_cents") / 100, "cost": row.pop("cents") / 100}
    saving = row.pop("saving_cents") / 100
    return {
        **row,
        "gpu_hours_allocated": round(allocated / 3600, 4),
        "gpu_hours_active": round(seconds[ACTIVE] / 3600, 4),
        "gpu_hours_idle": round(idle / 3600, 4),
        "gpu_hours_idle_held": round(seconds[IDLE_HELD] / 3600, 4),
        "gpu_hours_idle_free": round(seconds[IDLE_FREE] / 3600, 4),
        "gpu_hours_unknown": round(seconds[UNKNOWN] / 3600, 4),
        "gpu_hours_unobserved": round(seconds[UNOBSERVED] / 3600, 4),
        "utilisation": round(seconds[ACTIVE] / allocated, 4) if allocated else None,
        # GPU-hours a right-sized tier (a smaller one the measured use fits) would have freed.
        "gpu_hours_right_size_freed": round(freed / 3600, 4),
        **costs,
        **events,
        **queue,
        "right_size_saving": saving,
    }


def utilisation_histogram(sessions: Iterable[Session], bins: int = 10) -> list[float]:
    """GPU-hours by the utilisation (active / allocated) of the session they belong to:
    ``bins`` equal bins over 0..1 (a session with unknown hours counts them as not active)."""
    hist = [0.0] * bins
    for s in sessions:
        allocated = s.allocated
        if allocated <= 0:
            continue
        share = s.totals.get(ACTIVE, 0.0) / allocated
        hist[min(bins - 1, int(share * bins))] += allocated / 3600
    return [round(h, 4) for h in hist]


__all__ = [
    "ACTIVE",
    "DIMENSIONS",
    "EVENTS",
    "FIELDS",
    "IDLE_FREE",
    "IDLE_HELD",
    "PERIODS",
    "RIGHT_SIZE_FREED",
    "STATES",
    "UNKNOWN",
    "UNOBSERVED",
    "Bucket",
    "Ledger",
    "Observation",
    "Owner",
    "Session",
    "split_days",
    "summarize",
    "summarize_periods",
    "utilisation_histogram",
]
