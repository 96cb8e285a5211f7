"""The history the governor keeps of its own passes, and its export as a replay trace.

At each pass the governor knows, per running server, what a replay needs and more: the GPU
signal it decided on (the report's SM activity and DCGM's), the memory held, whether a kernel
executes a cell, when a person last interacted and when the Hub last saw activity, the
ownership labels and the tier, and what it decided (state, policy, actions, the diagnosis).
A ``HistoryRow`` is that, for one server at one pass. The format is documented in docs/api.md
("History and what-if"); this module is its one definition:

- ``worth_recording`` says which rows to keep: a row that differs from the server's last kept
  one (SM to the hundredth, memory to 64 MiB), carries an action, a checkpoint's outcome or the
  server's stop, or comes ``KEYFRAME_S`` after the last kept one. An idle server costs four rows
  an hour, not sixty.
- ``pack`` and ``unpack`` (with ``parse_context``) give a row's compact storage (``STORAGE_COLUMNS``: integers, two
  dictionary ids, NULL where nothing happened), about 40 bytes a row in SQLite
  (``python -m benchmarks.history_export``).
- ``export_trace`` turns kept rows back into replay trace lines at a fixed ``step``: a pure
  function, rows in, JSON Lines out, that ``replay.read_trace`` reads as it is. Users (and
  server names) can be pseudonymised on the way (``Pseudonyms``).

Stdlib only, like ``core``: the governor records with it, the command line and the admin API
export with it.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from operator import attrgetter
from types import MappingProxyType

from ..core.vocabulary import (
    ACTIVE,
    CHECKPOINT_DONE,
    CHECKPOINT_FAILED,
    CHECKPOINT_TIMEOUT,
    USER_LABEL,
)
from .engine import EPOCH

HISTORY_VERSION = 1
# Seconds: a server's row is kept at least this often, even when nothing changed, so that an
# export can tell a quiet server from one the governor stopped seeing.
KEYFRAME_S = 900.0
# Seconds without any row, from any server, that mean the governor was not running: an export
# marks its servers' GPUs unknown over the outage (unknown is never idle).
MAX_GAP_S = 2 * KEYFRAME_S
DEFAULT_STEP_S = 300.0  # a sample every 5 minutes, as the reclamation benchmark's traces
SM_QUANTUM = 0.01  # what a change of SM activity must reach to be kept
MEMORY_QUANTUM_MB = 64.0  # and of memory
CHECKPOINT_OUTCOMES = (CHECKPOINT_DONE, CHECKPOINT_FAILED, CHECKPOINT_TIMEOUT)
_EPOCH_S = EPOCH.timestamp()  # the replay clock's t = 0, in Unix seconds


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One server at one pass of the governor. Times are Unix seconds (UTC)."""

    t: float  # the pass
    server: str  # "user/" or "user/name"
    started: float  # when this run of the server started: its session
    profile: str | None = None
    team: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # gpu-gov/* (tier, project, ...)
    reports: bool = True  # a fresh report from the server's extension
    gpu_sm: float | None = None  # the report's SM activity 0..1 (its busiest GPU holder)
    dcgm_sm: float | None = None  # DCGM's reading of the server's GPUs, where it sees them
    gpu_mem_mb: float = 0.0  # GPU memory its processes hold (the report's, else DCGM's)
    holds_context: bool = False
    kernel_busy: bool = False  # a kernel holding a GPU executes a cell
    connections: int = 0  # clients connected to its kernels
    user_last: float | None = None  # a person's last interaction, from the reports
    hub_last: float | None = None  # the Hub's last_activity (an open tab counts)
    checkpoint: str | None = None  # a checkpoint's outcome that came in this pass
    state: str = ACTIVE  # the policy's state after the pass
    policy: str = "default"  # the policy that governed it
    actions: tuple[str, ...] = ()  # what the governor did at this pass (core.policy's actions)
    cull_reason: str | None = None  # with a cull: core.policy.CULL_REASONS
    cause: str | None = None  # the diagnosis' label, when it names one
    stopped: bool = False  # the server had stopped at this pass: its run's last row

    @property
    def session(self) -> tuple[str, float]:
        return self.server, self.started

    @property
    def gpu_signal(self) -> float | None:
        """The SM activity the policy goes by: DCGM's where it reads the server's GPUs (the
        trusted source wins, ``core.policy.merge_evidence``), else the report's."""
        return self.dcgm_sm if self.dcgm_sm is not None else self.gpu_sm


# -- what to keep ------------------------------------------------------------------------------


# The fields a kept row must differ in, in the order ``content_of`` takes them.
CONTENT_FIELDS = (
    "profile",
    "team",
    "labels",
    "reports",
    "gpu_sm",
    "dcgm_sm",
    "gpu_mem_mb",
    "holds_context",
    "kernel_busy",
    "connections",
    "user_last",
    "hub_last",
    "state",
    "policy",
    "cause",
)
_SM_STEP = round(SM_QUANTUM * 1000)


def content_of(values: tuple) -> tuple:
    """``values`` of ``CONTENT_FIELDS``, rounded as the store keeps them: what a kept row must
    differ in (the governor compares a pass's with the last kept row's before it builds a
    row)."""
    sm, dcgm, memory = values[4:7]
    return (
        *values[:4],
        None if sm is None else activity_step(sm),
        None if dcgm is None else activity_step(dcgm),
        memory_step(memory),
        *values[7:],
    )


def activity_step(value: float) -> int:
    """The step of an activity (0..1) a kept row is compared in: ``SM_QUANTUM``."""
    return _permille(value) // _SM_STEP


def memory_step(mb: float) -> int:
    """The step of memory (MiB) a kept row is compared in: ``MEMORY_QUANTUM_MB``."""
    return int(mb // MEMORY_QUANTUM_MB)


content_values = attrgetter(*CONTENT_FIELDS)  # a row's, as a tuple


def content(row: HistoryRow) -> tuple:
    """``content_of`` a row."""
    return content_of(content_values(row))


def worth_recording(
    previous: HistoryRow | None, row: HistoryRow, keyframe: float = KEYFRAME_S
) -> bool:
    """Whether the governor keeps ``row``, given the last row it kept of that server."""
    return (
        previous is None
        or previous.session != row.session
        or bool(row.actions)
        or row.checkpoint is not None
        or row.stopped
        or row.t - previous.t >= keyframe
        or content(row) != content(previous)
    )


# -- storage -----------------------------------------------------------------------------------

# One row as the store keeps it: integers (seconds, permille, MiB), ids of two dictionaries that
# hold what changes seldom, and NULL where nothing happened (SQLite stores a NULL in its header
# alone). ``run`` is the id of (server, started); ``context`` the id of the JSON of
# (profile, team, labels, policy, state, cause); ``*_idle_s`` are seconds before ``t``.
STORAGE_COLUMNS = (
    ("t", "INTEGER NOT NULL"),
    ("run", "INTEGER NOT NULL"),
    ("context", "INTEGER NOT NULL"),
    ("sm", "INTEGER"),
    ("dcgm_sm", "INTEGER"),
    ("memory_mb", "INTEGER NOT NULL"),
    ("flags", "INTEGER NOT NULL"),  # 1 holds_context, 2 kernel_busy, 4 reports, 8 stopped
    ("connections", "INTEGER NOT NULL"),
    ("user_idle_s", "INTEGER"),
    ("hub_idle_s", "INTEGER"),
    ("actions", "TEXT"),  # comma-separated
    ("cull_reason", "TEXT"),
    ("checkpoint", "TEXT"),
)


def context_of(row: HistoryRow) -> str:
    """The JSON that ``context`` ids stand for (the same text for the same context)."""
    return json.dumps(
        [row.profile, row.team, dict(sorted(row.labels.items())), row.policy, row.state, row.cause],
        separators=(",", ":"),
    )


def pack(row: HistoryRow, run: int, context: int) -> tuple:
    """The values of ``STORAGE_COLUMNS`` for ``row``; ``run`` and ``context`` are the ids the
    store gave ``row.session`` and ``context_of(row)``."""
    flags = row.holds_context | row.kernel_busy << 1 | row.reports << 2 | row.stopped << 3
    return (
        int(row.t),
        run,
        context,
        None if row.gpu_sm is None else _permille(row.gpu_sm),
        None if row.dcgm_sm is None else _permille(row.dcgm_sm),
        round(row.gpu_mem_mb),
        flags,
        row.connections,
        None if row.user_last is None else max(0, int(row.t - row.user_last)),
        None if row.hub_last is None else max(0, int(row.t - row.hub_last)),
        ",".join(row.actions) or None,
        row.cull_reason,
        row.checkpoint,
    )


def parse_context(text: str) -> tuple:
    """What ``context_of`` wrote, for ``unpack``: parse each context once, and the rows that
    share it share its labels (read-only)."""
    profile, team, labels, policy, state, cause = json.loads(text)
    return profile, team, MappingProxyType(labels), policy, state, cause


def unpack(values: tuple, session: tuple[str, float], context: tuple) -> HistoryRow:
    """The row ``pack`` stored (times to the second, SM to the thousandth, memory to the MiB);
    ``context`` is ``parse_context`` of the text its id stands for."""
    t, _, _, sm, dcgm_sm, memory, flags, connections, user_idle, hub_idle = values[:10]
    actions, cull_reason, checkpoint = values[10:]
    profile, team, labels, policy, state, cause = context
    return HistoryRow(
        t=t,
        server=session[0],
        started=session[1],
        profile=profile,
        team=team,
        labels=labels,
        gpu_sm=None if sm is None else sm / 1000,
        dcgm_sm=None if dcgm_sm is None else dcgm_sm / 1000,
        gpu_mem_mb=memory,
        connections=connections,
        user_last=None if user_idle is None else t - user_idle,
        hub_last=None if hub_idle is None else t - hub_idle,
        checkpoint=checkpoint,
        state=state,
        policy=policy,
        actions=tuple(actions.split(",")) if actions else (),
        cull_reason=cull_reason,
        cause=cause,
        holds_context=bool(flags & 1),
        kernel_busy=bool(flags & 2),
        reports=bool(flags & 4),
        stopped=bool(flags & 8),
    )


def _permille(value: float) -> int:
    return round(min(max(value, 0.0), 1.0) * 1000)


# -- pseudonyms --------------------------------------------------------------------------------


class Pseudonyms:
    """Stable pseudonyms under a secret ``key``: the same user gets the same pseudonym in
    every export made with the key, and nobody without it can tell whose it is (HMAC-SHA256).
    A fresh random key per export makes exports unlinkable to each other."""

    def __init__(self, key: bytes):
        if len(key) < 16:
            raise ValueError("a pseudonymisation key needs at least 16 bytes")
        self._key = key
        self._cache: dict[tuple[str, str], str] = {}

    def user(self, name: str) -> str:
        return self._name("u", name)

    def server_name(self, name: str) -> str:
        """A named server's name; the default server keeps its empty name."""
        return self._name("s", name) if name else ""

    def _name(self, kind: str, name: str) -> str:
        pseudonym = self._cache.get((kind, name))
        if pseudonym is None:
            digest = hmac.new(self._key, f"{kind}:{name}".encode(), sha256).hexdigest()
            pseudonym = self._cache[(kind, name)] = f"{kind}-{digest[:12]}"
        return pseudonym


# -- export ------------------------------------------------------------------------------------


class _Run:
    """One run of a server as the export goes: its last kept row, and what happened since the
    last line (actions, a checkpoint's outcome)."""

    __slots__ = (
        "actions",
        "cull_reason",
        "fixed",
        "hook_fails",
        "key",
        "last_body",
        "last_key",
        "row",
        "stopped_at",
    )

    def __init__(self, row: HistoryRow, fixed: str):
        self.row = row
        self.fixed = fixed  # the line's part that changes seldom, JSON, without braces
        self.key = _fixed_part(row)  # what ``fixed`` was written from
        self.actions: list[str] = []
        self.cull_reason: str | None = None
        self.hook_fails = False  # its last checkpoint failed or timed out
        self.stopped_at: float | None = None
        self.last_key: tuple | None = None  # what its last quiet line's body was written from
        self.last_body = ""


def export_trace(
    rows: Iterable[HistoryRow],
    *,
    step: float = DEFAULT_STEP_S,
    since: float | None = None,
    until: float | None = None,
    pseudonyms: Pseudonyms | None = None,
    max_gap: float = MAX_GAP_S,
) -> Iterator[str]:
    """Replay trace lines (JSON, no newline) from kept rows in time order.

    A line for every run every ``step`` seconds (on the Unix clock's grid) from its first row
    to its stop (or its last row), holding each row's values until the next; ``t`` and
    ``started`` are on the replay clock (seconds from ``replay.EPOCH``, so ISO times in labels
    keep their meaning). Events between two lines land on the later one: ``user_active`` (a
    person interacted since the last line), ``connections`` for a server without reports whose
    Hub activity moved (what the replay reads as Hub activity), ``actions``, and
    ``checkpoint_fails`` from the run's last checkpoint outcome on. A gap of more than
    ``max_gap`` with no row from anyone is an outage: the runs then running get lines with no
    GPU reading (unknown) until rows come again. ``since``/``until`` (Unix seconds) bound the
    lines; pass rows from ``since - KEYFRAME_S`` on so that every run's state at ``since`` is
    known; the last line may fall up to a ``step`` after ``until``, to carry the actions
    since the line before. The governor's own columns (``state``, ``policy``, ``actions``, ``cull_reason``,
    ``cause``) come as keys replay ignores (the what-if reads ``actions`` as what was done).
    """
    if not step > 0:
        raise ValueError(f"step must be > 0 seconds, got {step!r}")
    runs: dict[tuple[str, float], _Run] = {}
    fixed_of = _fixed(pseudonyms)
    last_t: float | None = None  # of the last row read, from any server
    grid: float | None = None  # the next line's time
    for row in rows:
        if grid is None:
            # Rows keep ``t`` in whole seconds: ``since`` is read to the second too (a pass a
            # moment after ``since`` was kept a fraction before it, and lost its first line).
            start = row.t if since is None else max(row.t, math.floor(since))
            grid = math.ceil(start / step) * step
        while grid < row.t and (until is None or grid <= until):
            outage = last_t is not None and grid - last_t > max_gap
            yield from _lines(runs, grid, step, max_gap, outage)
            grid += step
        last_t = row.t
        run = runs.get(row.session)
        if run is None:
            run = runs[row.session] = _Run(row, fixed_of(row))
        elif run.key != (key := _fixed_part(row)):
            run.fixed, run.key = fixed_of(row), key
        run.row = row
        run.actions.extend(row.actions)
        run.cull_reason = row.cull_reason or run.cull_reason
        if row.checkpoint is not None:
            run.hook_fails = row.checkpoint != CHECKPOINT_DONE
        if row.stopped:
            run.stopped_at = row.t
    if grid is None or last_t is None:
        return
    # To ``until``, and at least to the grid point after the last row (within a step past
    # ``until``): the actions since the last line get theirs.
    end = math.ceil(last_t / step) * step
    if until is not None:
        end = until if last_t > until else max(end, until)
    while grid <= end:
        yield from _lines(runs, grid, step, max_gap, grid - last_t > max_gap)
        grid += step


def _lines(runs: dict, grid: float, step: float, max_gap: float, outage: bool) -> Iterator[str]:
    """Every running run's line at ``grid``. A run ends at its stop (after a last line if
    actions came since the previous one), or once nobody has seen it for ``max_gap`` while the
    governor ran (it stopped unseen); over an outage the runs then running go on, unknown."""
    ended = []
    for key, run in runs.items():
        stale = not outage and grid - run.row.t > max_gap
        if run.stopped_at is not None or stale:
            ended.append(key)
            if not run.actions:
                continue
        yield _line(run, grid, step, outage)
        run.actions.clear()
        run.cull_reason = None
    for key in ended:
        del runs[key]


def _line(run: _Run, grid: float, step: float, outage: bool) -> str:
    row = run.row
    since = grid - step
    person = not outage and row.user_last is not None and since < row.user_last <= grid
    hub = not outage and row.hub_last is not None and since < row.hub_last <= grid
    head = f'{{"t":{_number(grid - _EPOCH_S)},'
    # A quiet run's line differs from its last one in "t" alone: most lines of an idle server.
    same = (row, outage, person, hub, run.hook_fails)
    quiet = not run.actions and run.cull_reason is None
    last = run.last_key
    if quiet and last is not None and last[0] is row and last[1:] == same[1:]:
        return head + run.last_body
    parts = [run.fixed]
    sm = None if outage else row.gpu_signal
    if sm is not None:
        parts.append(f',"gpu_sm":{_number(round(sm, 3))}')
    parts.append(
        f',"gpu_mem_mb":{_number(row.gpu_mem_mb)}'
        f',"holds_context":{_bool(row.holds_context)}'
        f',"kernel_busy":{_bool(row.kernel_busy and not outage)}'
    )
    connections = 0 if outage else row.connections if row.reports else int(hub)
    parts.append(f',"user_active":{_bool(person)},"connections":{connections}')
    if run.hook_fails:
        parts.append(',"checkpoint_fails":true')
    parts.append(f',"state":{json.dumps(row.state)}')
    if run.actions:
        parts.append(f',"actions":{json.dumps(run.actions)}')
    if run.cull_reason is not None:
        parts.append(f',"cull_reason":{json.dumps(run.cull_reason)}')
    if row.cause is not None:
        parts.append(f',"cause":{json.dumps(row.cause)}')
    parts.append("}")
    body = "".join(parts)
    run.last_key, run.last_body = (same, body) if quiet else (None, "")
    return head + body


def _fixed_part(row: HistoryRow) -> tuple:
    return row.server, row.started, row.profile, row.team, row.labels, row.reports, row.policy


def _fixed(pseudonyms: Pseudonyms | None) -> Callable[[HistoryRow], str]:
    def fixed(row: HistoryRow) -> str:
        user, _, name = row.server.partition("/")
        labels = dict(row.labels)
        if pseudonyms is not None:
            user, name = pseudonyms.user(user), pseudonyms.server_name(name)
            if USER_LABEL in labels:
                labels[USER_LABEL] = pseudonyms.user(labels[USER_LABEL])
        # Whole seconds, as ``t`` is kept, and never after the row: a start 0.85 s past a
        # minute, with its first row kept as that minute, made a line that began before it.
        started = min(math.floor(row.started), math.floor(row.t))
        values = {"server": f"{user}/{name}", "started": _json_number(started - _EPOCH_S)}
        if row.profile is not None:
            values["profile"] = row.profile
        if row.team is not None:
            values["team"] = row.team
        values |= {"reports": row.reports, "labels": labels, "policy": row.policy}
        return json.dumps(values, separators=(",", ":"))[1:-1]

    return fixed


def _json_number(value: float) -> int | float:
    return int(value) if value == int(value) else float(value)


def _number(value: float) -> str:
    return str(_json_number(value))


def _bool(value: bool) -> str:
    return "true" if value else "false"


# -- what an export covers ---------------------------------------------------------------------


MIN_STEP_S = 60  # the governor records at most once a pass: a finer step only repeats rows


def export_span(
    since: str, until: str | None, step: str, now: float, flag: str = "--"
) -> tuple[float, float, float]:
    """An export's ``since``, ``until`` (``now`` when empty) and ``step`` in seconds, as the
    command line (``flag`` ``--``) and the admin API (``flag`` empty) take them. ``ValueError``
    naming the option and what is wrong."""
    from ..core.durations import parse_duration

    start = parse_since(since, now, f"{flag}since")
    if start > now:
        raise ValueError(f"{flag}since {since}: is to come (the history holds what has been)")
    # The history holds nothing later than now: lines to a later ``until`` were made up, every
    # running server's every step to it (to 9999: an export without end).
    end = min(parse_since(until, now, f"{flag}until"), now) if until else now
    if end < start:
        raise ValueError(f"{flag}until is before {flag}since ({until} < {since})")
    seconds = parse_duration(step, f"{flag}step").total_seconds()
    if not seconds >= MIN_STEP_S:
        raise ValueError(f"{flag}step must be at least {MIN_STEP_S} seconds, got {step!r}")
    return start, end, seconds


def parse_since(text: str, now: float, option: str = "--since") -> float:
    """A moment, in Unix seconds, from ``text``: a duration back from ``now`` (``14d``, ``1h``,
    ``90m``) or an ISO 8601 time (``2026-01-05T09:00:00Z``, UTC without a zone). ``ValueError``
    naming ``option`` and what it cannot read."""
    from datetime import datetime, timezone

    from ..core.durations import parse_duration

    text = (text or "").strip()
    try:
        return now - parse_duration(text).total_seconds()
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{option} {text}: not a duration (14d, 1h) nor a time (2026-01-05T09:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()
