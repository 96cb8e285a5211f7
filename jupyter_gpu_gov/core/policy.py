"""The governor's policy engine (docs/architecture.md, "The state machine"): pure, no I/O, time passed in.

``decide(view, record, policy, now)`` looks at what is known of one server this cycle (the
``ServerView``) and what the governor remembered of it (the ``Record``), and returns the new
record, the state a person would read, the deadlines, and the actions to take. The live service
and ``jupyter-gpu-gov replay`` both call it, so a replay shows exactly what the service would do.

States: ``active → idle → warned → checkpointing → culled``, plus ``busy`` (a cell runs while
its GPU idles, past ``busy_grace``), ``exempt`` and ``unknown``. Unknown GPU data never leads to a
cull on GPU grounds, and a running cell is never culled for idleness: it gets a notice, and only
after ``busy_limit`` is it interrupted (or, if the policy says so, its server culled). Hard
deadlines — the maximum age, a borrowed GPU reclaimed, an admin's cull — apply to running work
too, with the notice first; a failed checkpoint postpones them by one bounded retry at most.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from . import slotted
from .clock import isoformat
from .clock import parse as parse_time
from .cpu_stage import CPU_STAGE_WORDS
from .durations import format_duration, parse_duration
from .queue import claim_by
from .text import in_sentence, quoted
from .vocabulary import (
    ACTIVE,
    ADMIN,
    ADMIN_WARN,
    BORROWED_LABEL,
    BUSY,
    BUSY_LIMIT,
    BUSY_NOTICE,
    CHECKPOINT,
    CHECKPOINT_DONE,
    CHECKPOINT_FAILED,
    CHECKPOINT_REQUESTED,
    CHECKPOINT_TIMEOUT,
    CHECKPOINTING,
    CLAIM_WITHIN_LABEL,
    CULL,
    CULL_ACTIONS,
    CULLED,
    EXEMPT,
    EXEMPT_LABEL,
    EXPECTED_DURATION_LABEL,
    GPU_IDLE,
    IDLE,
    INACTIVE,
    INTERRUPT,
    MAX_AGE,
    MAX_AGE_LABEL,
    MAX_AGE_WARN,
    OVERRUN_NOTICE,
    POLICY_APPLIED,
    POLICY_CONFIG_CHANGED,
    RECLAIM,
    RECLAIM_FOR_LABEL,
    RECLAIM_LABEL,
    RECLAIM_WARN,
    SHUTDOWN_KERNELS,
    STOP_SERVER,
    TASK_TYPE_LABEL,
    TASK_TYPES,
    UNCLAIMED,
    UNKNOWN,
    WARN,
    WARNED,
    server_key,
)
from .wire import LineStart, Verdict

# -- policies ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """Which servers a policy applies to; every given criterion must match, empty means any."""

    profiles: tuple[str, ...] = ()
    tiers: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    server_names: tuple[str, ...] = ()  # glob patterns; "" is the default server
    labels: Mapping[str, str] = field(default_factory=dict)
    task_types: tuple[str, ...] = ()  # interactive | batch | inference

    def matches(self, view: ServerView) -> bool:
        return (
            (not self.task_types or view.task_type in self.task_types)
            and (not self.profiles or view.profile in self.profiles)
            and (
                not self.tiers
                or view.tier in self.tiers
                or any(name in self.tiers for name in view.tier_formerly)
            )
            and (not self.teams or view.team in self.teams)
            and (not self.users or view.user in self.users)
            and (
                not self.server_names
                or any(fnmatch.fnmatchcase(view.name, p) for p in self.server_names)
            )
            and all(view.labels.get(k) == v for k, v in self.labels.items())
        )


@dataclass(frozen=True)
class Policy:
    name: str = "default"
    match: Match = Match()
    # A GPU below this activity (0..1) is idle; DCGM evidence also needs PCIe under its floor.
    # Idle contexts read 0 and sampling noise about 1 %; a data-starved loop can read 2-5 %.
    idle_threshold: float = 0.02
    # Of GPU idleness; the warning's lead is cull_after - warn_after. What these defaults
    # reclaim, and what they cost, is measured in docs/benchmarks-history.md ("Reclamation replay").
    warn_after: timedelta = timedelta(minutes=30)
    cull_after: timedelta = timedelta(hours=1)
    user_activity_grace: timedelta = timedelta(minutes=15)
    # An owner who has not interacted with the server for this long is away: when its GPU goes
    # idle (a training run or a "run all" finished unattended) the warning goes out at once and
    # the cull follows after the notice. ``warn_after`` spares a person at the notebook warnings
    # about short pauses; nobody is there to spare. While the Hub then sees no activity on the
    # server (no tab open to show the warning), nobody can read it: its notice is the Hub's own
    # lag (``ServerView.hub_activity_lag``), not the full one. None: the clock is the same for
    # everyone.
    away_after: timedelta | None = timedelta(hours=2)
    # A zombie by the Hub's own record — the GPU idle and held, no cell running (the report),
    # and no Hub activity (no open tab, no kernel message, no request: a server can make its
    # Hub activity fresher, never older) — is culled this long after the later of its GPU's
    # idle start and the Hub's last activity, if sooner than cull_after. It is warned once the
    # silence outlasts the Hub's own lag (15 minutes): the rest is the warning's notice (at
    # least 15 minutes). Off by default (None: the same clock for every idle server): the
    # owner is by definition not there to see the warning, so a shorter clock is the admin's
    # choice to make, not a surprise to ship.
    zombie_idle: timedelta | None = None
    # The longest a person's interaction holds an idle GPU's cull, from the GPU's idle start
    # (plus the extensions granted): past it the warning's notice runs even while someone is
    # at the notebook, and only Extend (``max_extensions``) holds the GPU longer. A server's
    # word is all that says a person is there (docs/security.md), so without it a server
    # claiming an interaction every few minutes keeps an idle GPU until ``max_age``. None
    # (the default): a person at the notebook holds the cull for as long as they interact.
    presence_limit: timedelta | None = None
    # How long a running cell may leave its GPU idle (a CPU stage before its next GPU stage),
    # from when the GPU went idle: CPU stages of an hour or more are common in pipelines.
    busy_grace: timedelta = timedelta(hours=2)
    # Past busy_grace the owner gets a notice naming the cause, and the cell runs on. A running
    # cell (a ``time.sleep`` loop is one) holds its GPU at most this long from when the GPU
    # went idle: then the owner is warned and, after the notice, the cell is interrupted and a
    # checkpoint taken (``on_busy_limit: interrupt``), or the server culled (``cull``).
    busy_limit: timedelta = timedelta(hours=8)
    on_busy_limit: str = "interrupt"  # or "cull"
    # After that announced interrupt, its checkpoint saved: ``cull`` stops the server (or shuts
    # its kernels down) at once, as the warning said it would, unless its owner has been back
    # since the warning went out; the GPU has been idle for the limit and the notice, and the
    # state the cell left is saved. ``warn``: the idle rules start over with a warning and
    # notice of their own, then a second checkpoint. A failed checkpoint always takes ``warn``.
    after_interrupt: str = "warn"
    # A running cell whose kernel does nothing — no CPU, no I/O wait, no reads over the report's
    # window: a ``time.sleep``/poll loop, an ``input()`` — is held this long from when it went
    # quiet (and its GPU idle), then warned and, after the notice, acted on as at busy_limit.
    # Read as at least busy_grace, so a report saying "quiet" never makes the governor less
    # patient than DCGM alone (which holds every cull busy_grace in case a cell runs), and at
    # most busy_limit. None (the default): busy_limit for every running cell. Off unless an
    # admin sets it: a cell waiting on a job elsewhere (a cluster run, a download, a queue)
    # reads exactly as a sleep loop that waits for nothing, and at 2 h it interrupted 19-25
    # such live cells a month on the replay's lab world (docs/benchmarks-history.md).
    quiet_cell_limit: timedelta | None = None
    extension_step: timedelta = timedelta(hours=1)
    max_extensions: int = 2
    extension_reason: str = "optional"  # or "required"
    max_age: timedelta | None = None
    max_age_warning: timedelta = timedelta(hours=1)
    # How long a borrowed server keeps its GPU once a team within its guarantee asks for it.
    reclaim_grace: timedelta = timedelta(minutes=15)
    checkpoint: bool = True
    checkpoint_timeout: timedelta = timedelta(minutes=5)
    on_checkpoint_failure: str = "postpone"  # or "proceed"
    # ``postpone`` is bounded: a failed checkpoint postpones an idle cull by the notice, then
    # twice that, at most this many times and never more than checkpoint_max_delay past the
    # cull's own time; then the cull proceeds. A failure that passes (a disk being cleaned, a
    # network blip) gets two more tries over an hour; a hook that always fails costs an hour.
    # A hard deadline waits for one retry.
    checkpoint_retries: int = 2
    checkpoint_max_delay: timedelta = timedelta(hours=1)
    # A hook that failed this many times in a row at earlier deadlines (the governor counts
    # the failures its own requests got, across this server's deadlines and sessions; a saved
    # checkpoint resets the count) is taken as broken: waiting for it again saves nothing, so
    # its next failure culls at once, without the backoff above or a hard deadline's retry.
    # Off by default (None): the backoff is also the only patience a server whose state cannot
    # be saved gets, and where a server is reused its owners came back to more stopped
    # servers without a checkpoint (docs/benchmarks-history.md, round seven); 2 is the measured
    # value.
    checkpoint_broken_after: int | None = None
    cull_action: str = STOP_SERVER  # or SHUTDOWN_KERNELS
    exempt: bool = False
    # jupyterhub-idle-culler's rule for servers with no GPU data: no report, no DCGM (None: never
    # cull them).
    inactive_timeout: timedelta | None = timedelta(hours=1)
    # A notice when a server runs past the duration its owner expected at spawn (label
    # gpu-gov/expected-duration); it never culls.
    expected_duration_notice: bool = True
    # Not a key: since when this policy governs the servers it matches, when an admin's apply
    # or revert brought it in while the service ran (hub/applied_policy.py; None: in force
    # since start-up, as the config file's). No deadline it brings in falls before its full
    # notice from then: a warning given before it (of another policy's deadline) is given
    # again, once, with this policy's notice, and a maximum age or a reclaim's grace it
    # shortens counts its warning's notice from then.
    in_force_since: datetime | None = None
    # Not a key either: how it came in then, POLICY_APPLIED (an admin's apply or revert) or
    # POLICY_CONFIG_CHANGED (the config file's, changed since the service last ran): what the
    # owner is told brought a deadline in.
    in_force_by: str = POLICY_APPLIED

    @property
    def brought_in(self) -> str:
        """The words for how and when this policy came in (it has ``in_force_since``)."""
        at = _at(self.in_force_since)
        if self.in_force_by == POLICY_CONFIG_CHANGED:
            return f"the policy changed in the config file, in force at {at}"
        return f"a policy applied at {at}"

    @property
    def notice(self) -> timedelta:
        """How long a warning stands before the cull it announces."""
        return self.cull_after - self.warn_after


_DURATIONS = {
    "warn_after",
    "cull_after",
    "user_activity_grace",
    "busy_grace",
    "extension_step",
    "max_age",
    "max_age_warning",
    "reclaim_grace",
    "checkpoint_timeout",
    "inactive_timeout",
    "away_after",
    "busy_limit",
    "checkpoint_max_delay",
    "quiet_cell_limit",
    "zombie_idle",
    "presence_limit",
}
# Durations that may be null (off).
_OPTIONAL_DURATIONS = {
    "max_age",
    "inactive_timeout",
    "away_after",
    "quiet_cell_limit",
    "zombie_idle",
    "presence_limit",
}
_CHOICES = {
    "extension_reason": ("optional", "required"),
    "on_checkpoint_failure": ("postpone", "proceed"),
    "cull_action": CULL_ACTIONS,
    "on_busy_limit": ("interrupt", "cull"),
    "after_interrupt": ("cull", "warn"),
}
_MATCH_KEYS = {f.name for f in fields(Match)}
_POLICY_KEYS = {f.name for f in fields(Policy)} - {"in_force_since", "in_force_by"}


MAX_NAME = 255  # the store's column for the policy that governs a server (hub/tables.py)
# Each server's decision tries the policies in order; 20,000 (what a 1 MiB body holds) took
# seconds to check on the service's event loop, then about 15 ms each server decision.
MAX_POLICIES = 1000
# The most a count of a policy may be (max_extensions, checkpoint_retries,
# checkpoint_broken_after): a thousand extensions of an hour hold a GPU six weeks. Without a
# bound 10**300 was taken, and went out on the verdict as extensions_left (Infinity in JS).
MAX_COUNT = 1000


def canonical(value) -> Any:
    """A policy (or its ``Match``) as plain JSON values, only what differs from the defaults:
    what an unchanged policy is recognised by across releases (``hub/applied_policy.py``). A
    release that adds a field whose default keeps the old behaviour leaves it as it was;
    ``in_force_since`` and ``in_force_by`` are when and how, not what."""
    if isinstance(value, Policy | Match):
        out = {}
        for f in fields(value):
            v = getattr(value, f.name)
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if f.name not in ("in_force_since", "in_force_by") and v != default:
                out[f.name] = canonical(v)
        return out
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [canonical(v) for v in value]
    return value


class PolicyError(ValueError):
    """A policy entry that cannot be used; the message names the entry and the key."""


def load_policies(entries: Iterable[Mapping], defaults: Mapping | None = None) -> list[Policy]:
    """Validate admin-written policy dicts into ``Policy`` objects (first match wins).

    ``defaults`` fill every key an entry leaves out. A catch-all ``default`` policy built from
    the defaults is appended unless the last entry already matches everything.
    """
    for key in ("name", "match"):
        if key in (defaults or {}):
            # Each policy's own: a match here was the catch-all's too, and a server it did
            # not match had no policy at all (never warned, never culled; an error each pass).
            raise PolicyError(f"defaults: {key!r} is not a default: each policy has its own")
    entries = list(entries)
    if len(entries) > MAX_POLICIES:
        raise PolicyError(f"at most {MAX_POLICIES} policies, got {len(entries)}")
    base = _policy("defaults", dict(defaults or {}), Policy())
    policies = []
    names = set()
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise PolicyError(f"policy {index}: expected a dict, got {type(entry).__name__}")
        label = f"policy {index} ({entry.get('name', '?')!r:.60})"
        if not entry.get("name") or not isinstance(entry["name"], str):
            raise PolicyError(f"policy {index}: 'name' is required (a non-empty string)")
        if len(entry["name"]) > MAX_NAME:
            # A server's row keeps its policy's name: longer, and every pass's write failed
            # on PostgreSQL (SQLite ignores the length), no server governed.
            raise PolicyError(f"{label}: 'name' may be at most {MAX_NAME} characters")
        if entry["name"] in names:
            raise PolicyError(f"{label}: the name is used twice")
        names.add(entry["name"])
        policies.append(_policy(label, dict(entry), base))
    if not policies or policies[-1].match != Match():
        policies.append(replace(base, name="default"))
    return policies


def _policy(label: str, entry: dict, base: Policy) -> Policy:
    unknown = set(entry) - _POLICY_KEYS
    if unknown:
        raise PolicyError(f"{label}: unknown key {sorted(unknown)[0]!r:.60}")
    values = {}
    for key, value in entry.items():
        try:
            values[key] = _convert(key, value)
        except (TypeError, ValueError) as error:
            raise PolicyError(f"{label}: {error}") from None
    policy = replace(base, **values)
    if policy.cull_after <= policy.warn_after:
        # The difference is the warning's notice: none would warn and cull in one pass (every
        # server already past the limit when such a policy is applied).
        raise PolicyError(f"{label}: 'cull_after' must be longer than 'warn_after' (the notice)")
    if policy.busy_limit < policy.busy_grace:
        raise PolicyError(f"{label}: 'busy_limit' must not be shorter than 'busy_grace'")
    return policy


def _convert(key: str, value):
    if key == "match":
        if not isinstance(value, Mapping):
            raise ValueError("'match' must be a dict")
        unknown = set(value) - _MATCH_KEYS
        if unknown:
            raise ValueError(f"unknown key 'match.{sorted(unknown)[0]}'")
        criteria = {}
        for k, v in value.items():
            if k == "labels":
                if not isinstance(v, Mapping):
                    raise ValueError("'match.labels' must be a dict of label: value")
                for a, b in v.items():
                    # Labels are strings: True was read as 'True', which no label's value
                    # is ('true'), and the policy matched nothing, saying nothing.
                    if not isinstance(a, str) or not isinstance(b, str):
                        raise ValueError(
                            "'match.labels' must map label names to strings, got "
                            f"{a!r:.60}: {b!r:.60}"
                        )
                criteria[k] = dict(v)
            elif k == "task_types":
                items = [v] if isinstance(v, str) else v
                if not isinstance(items, list | tuple) or not all(i in TASK_TYPES for i in items):
                    raise ValueError(
                        f"'match.task_types' must name task types out of {', '.join(TASK_TYPES)},"
                        f" got {v!r:.60}"
                    )
                criteria[k] = tuple(items)
            else:
                items = [v] if isinstance(v, str) else v
                if not isinstance(items, list | tuple) or not all(
                    isinstance(i, str) for i in items
                ):
                    raise ValueError(f"'match.{k}' must be a string or a list of strings")
                criteria[k] = tuple(items)
        return Match(**criteria)
    if key in _DURATIONS:
        return (
            None
            if value is None and key in _OPTIONAL_DURATIONS
            else parse_duration(value, repr(key))
        )
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            raise ValueError(
                f"{key!r} must be one of {', '.join(_CHOICES[key])}, got {value!r:.60}"
            )
        return value
    if key == "idle_threshold":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ValueError(f"'idle_threshold' must be a number in [0, 1], got {value!r:.60}")
        return float(value)
    if key in ("max_extensions", "checkpoint_retries"):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            raise ValueError(
                f"{key!r} must be a whole number from 0 to {MAX_COUNT:,}, got {quoted(value)}"
            )
        return value
    if key == "checkpoint_broken_after":
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT
        ):
            raise ValueError(
                f"{key!r} must be a whole number from 1 to {MAX_COUNT:,} or null, "
                f"got {quoted(value)}"
            )
        return value
    if key in ("checkpoint", "exempt", "expected_duration_notice"):
        if not isinstance(value, bool):
            raise ValueError(f"{key!r} must be true or false, got {value!r:.60}")
        return value
    if key == "name":
        return value
    raise ValueError(f"unknown key {key!r}")  # pragma: no cover - guarded by _POLICY_KEYS


def select(policies: Iterable[Policy], view: ServerView) -> Policy:
    for policy in policies:
        if policy.match.matches(view):
            return policy
    raise LookupError("no policy matches")  # load_policies always appends a catch-all


_T = TypeVar("_T")


def evolve(obj: _T, /, **changes: Any) -> _T:
    """``dataclasses.replace`` for the frozen dataclasses below (plain fields, no
    ``__post_init__``): copies the instance's fields rather than calling ``__init__`` (a pass
    makes about five per server; the saving: docs/benchmarks-history.md, "With the usage
    ledger"); a slotted one by its copier (``_evolvable``), another by its ``__dict__``."""
    copier = _COPIERS.get(obj.__class__)
    if copier is not None:
        return copier(obj, changes)
    fields_ = obj.__dict__
    if not changes.keys() <= fields_.keys():
        raise TypeError(
            f"{type(obj).__name__} has no field {sorted(changes.keys() - fields_.keys())}"
        )
    new = object.__new__(type(obj))
    new.__dict__.update(fields_)
    new.__dict__.update(changes)
    return new


_COPIERS: dict[type, Any] = {}


def _evolvable(cls: type[_T]) -> type[_T]:
    """Register ``evolve``'s copier of a frozen, slotted dataclass (``core.slotted``). Slots:
    one of each is kept per server (its record, decision, view, GPU signal); the ``__dict__``s
    ``evolve`` made were ~290 bytes an instance, ~7 MB at 10,000 servers (docs/benchmarks.md,
    issue 26)."""
    _COPIERS[cls] = slotted.copier(cls)
    return cls


# -- what is known of a server -----------------------------------------------------------------


@_evolvable
@dataclass(frozen=True, slots=True)  # one kept per server: no __dict__ each
class GpuSignal:
    """The server's GPU this cycle, after merging its report with any trusted source."""

    holds_gpu: bool  # it holds a GPU (an allocation, or a context for shutdown-kernels)
    active: bool | None  # None: unknown (no data, stale data, an API that cannot say)
    idle_since: datetime | None = None  # when the current idle stretch began, if known
    kernel_busy_since: datetime | None = None  # a GPU-holding kernel is executing a cell
    # Every such kernel did nothing over the report's window (``is_quiet``): True; one
    # worked: False; None: not known (no CPU section, no cell running, DCGM alone).
    cell_quiet: bool | None = None
    # A report shows running cells; a trusted source alone (DCGM, for a server without the
    # extension) cannot, and then the policy assumes one runs (it holds a cull for busy_grace).
    sees_cells: bool = True
    # Where no report shows cells: since when a trusted reading of the server's own CPU (its
    # container's, as the kubelet measures it: ``core.cpu_stage``) has been busy. Treated as
    # a running cell (a CPU stage); None: not busy, or not known.
    cpu_busy_since: datetime | None = None
    detail: str = ""  # for reasons: where the evidence came from, disagreements


def dcgm_only(
    active: bool | None, detail: str, cpu_busy_since: datetime | None = None
) -> GpuSignal:
    """A server's GPUs as DCGM alone sees them (no extension, or its report missing, stale or
    not believed): held (the allocation the Hub's records name), busy or idle — never its
    cells. DCGM sees the card, not the kernels, and the governor calls no user's server, so
    the policy assumes a cell may be running (a cull waits ``busy_grace``). Its container's CPU
    busy (``cpu_busy_since``, ``core.cpu_stage``) is a CPU stage: decided as a running cell.
    The hub (hub/evidence.py) and the replay (replay/engine.py) both decide such a server
    from this."""
    return GpuSignal(
        holds_gpu=True,
        active=active,
        sees_cells=False,
        cpu_busy_since=cpu_busy_since,
        detail=detail,
    )


# JupyterHub's activity of a server lags what happens by up to this: the server posts its
# activity every 5 minutes (JUPYTERHUB_ACTIVITY_INTERVAL), the Hub gathers the proxy's every 5
# (last_activity_interval), with room for clock skew; hub/listing.py's incremental listing
# reads back this far. A shorter silence says nothing about who is there.
HUB_ACTIVITY_LAG = timedelta(minutes=15)
ACTIVITY_SKEW = timedelta(minutes=5)


def hub_activity_lag(interval: timedelta | None) -> timedelta | None:
    """How late the Hub's activity may be when its longer interval (the proxy's gathering, a
    server's posting) is ``interval``: both of them and room for skew, never under
    HUB_ACTIVITY_LAG (the defaults, 5 minutes each, give it). None: not known."""
    if interval is None:
        return None
    return max(HUB_ACTIVITY_LAG, 2 * interval + ACTIVITY_SKEW)


@_evolvable
@dataclass(frozen=True, slots=True)  # one kept per server: no __dict__ each
class ServerView(slotted.WeakReferable):  # the history refers to a view weakly
    user: str
    name: str = ""
    profile: str | None = None
    tier: str | None = None
    team: str | None = None
    project: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    started: datetime | None = None
    hub_last_activity: datetime | None = None  # what jupyterhub-idle-culler looks at
    # How late the Hub's activity of it may be (``hub_activity_lag``): a shorter silence says
    # nothing of who is there. None: not known, and a warning is never judged unread by it.
    hub_activity_lag: timedelta | None = HUB_ACTIVITY_LAG
    user_last_activity: datetime | None = None  # people's interaction, not API polling or GPU
    # Its report names a browser connected to a kernel or terminal (``targets[].connections``):
    # a tab open, whose polling keeps the Hub's activity fresh whether or not anyone is at it.
    # The server's word: it only ever shortens its own hold (``_unseen_since``). None: no report.
    tab_open: bool | None = None
    reports: bool = False  # the server sends GPU reports
    gpu: GpuSignal | None = None  # None when it sends none (or they went stale)
    # The governor can ask it for a checkpoint (its report is fresh and the service may reach
    # it): a server that runs no extension, or cannot be reached, is never asked.
    reachable: bool = True
    # The diagnosis of its last report (``zombie``, ``cpu_serial``, ...). Only a confident
    # diagnosis decides anything (a zombie is treated as an owner away); any names a cause.
    cause: str | None = None
    cause_confident: bool = False
    # Why the governor leaves it alone (jupyterhub-idle-culler's --cull-default-servers and
    # --cull-named-servers): only hard deadlines apply, as that culler applies --max-age.
    excluded: str | None = None
    # Names the tier had (a renamed tier's ``formerly``): a policy naming one still matches.
    tier_formerly: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return server_key(self.user, self.name)

    @property
    def task_type(self) -> str:
        """``interactive`` unless the label says ``batch`` or ``inference``."""
        kind = self.labels.get(TASK_TYPE_LABEL, "")
        return kind if kind in TASK_TYPES else TASK_TYPES[0]

    @property
    def checkpointable(self) -> bool:
        return self.reports and self.reachable and self.gpu is not None


# A kernel's process tree "does nothing" under these, over the sampler's window: an idle
# Python kernel reads 0.1-0.5 % of a core (heartbeats, ZMQ); a cell that computes, parses,
# or moves data at a few MB/s reads several percent or more, or waits on I/O, or reads.
QUIET_CORES = 0.02
QUIET_IOWAIT = 0.05
QUIET_READ_MB_S = 1.0


def is_quiet(cores: float | None, iowait: float | None, read_mb_s: float | None) -> bool | None:
    """Whether a process tree did nothing over a window (no CPU, no I/O wait, no reads), from
    the report's ``targets[].cpu``; None when its CPU is not known. An I/O figure the platform
    cannot read says nothing either way."""
    if cores is None:
        return None
    return (
        cores <= QUIET_CORES
        and (iowait is None or iowait <= QUIET_IOWAIT)
        and (read_mb_s is None or read_mb_s <= QUIET_READ_MB_S)
    )


def merge_evidence(
    report_active: bool | None, trusted_active: bool | None
) -> tuple[bool | None, str]:
    """Reports come from processes the user controls: they explain but cannot keep a GPU alive
    alone. A trusted source's "idle" wins over a report's "active" (and the disagreement is
    said), its "busy" always counts."""
    if trusted_active is None:
        return report_active, ""
    if trusted_active:
        return True, ""
    if report_active:
        return False, "the report says active but the trusted source says idle"
    return False, ""


# -- the governor's memory of a server ---------------------------------------------------------


@_evolvable
@dataclass(frozen=True, slots=True)  # one kept per server: no __dict__ each
class Record:
    state: str = ACTIVE
    idle_since: datetime | None = None
    warned_at: datetime | None = None  # the warning for the current deadline went out
    # A tab was open (``ServerView.tab_open``) when it went out: the Hub's activity since is
    # that tab's polling, not someone opening the notebook. Read only with ``warned_at``.
    warned_beside_tab: bool = False
    extension_s: float = 0.0  # granted this idle stretch (by the owner, or an admin)
    extensions_used: int = 0
    approval_pending: bool = False
    postponed_until: datetime | None = None  # after a failed checkpoint (on_checkpoint_failure)
    checkpoint_status: str | None = None  # requested | done | failed | timeout
    checkpoint_requested_at: datetime | None = None
    checkpoint_failures: int = 0  # of the current deadline
    # Failed checkpoints in a row, whatever the deadline or session (checkpoint_broken_after):
    # what the governor saw of its own requests, reset by a saved checkpoint.
    hook_failures: int = 0
    max_age_warned_at: datetime | None = None  # the warning of a hard deadline went out
    paused_at: datetime | None = None  # GPU data became unknown: the idle clock stopped here
    exempt_until: datetime | None = None  # an admin grant
    busy_noticed_at: datetime | None = None  # the notice of a cell running past busy_grace
    quiet_since: datetime | None = None  # the running cell's kernel has done nothing since
    interrupted_at: datetime | None = None  # the running cell was interrupted at busy_limit
    overrun_noticed_at: datetime | None = None  # it ran past the duration its owner expected
    # A cull asked for now (an admin's, or a cell the busy limit could not stop): a hard
    # deadline, with its cull reason (admin | busy-limit) and why, in words.
    cull_requested_at: datetime | None = None
    cull_request_reason: str | None = None
    cull_request_why: str = ""
    culled_at: datetime | None = None
    reason: str = ""

    def __eq__(self, other: object) -> bool:
        # Field by field, as the generated one, without its two tuples of every field
        # (``core.slotted.equality``): a pass compares each decided server's records twice.
        if other.__class__ is self.__class__:
            return _same_record(self, other)
        return NotImplemented

    def new_idle_stretch(self) -> Record:
        """GPU work resumed: deadlines, warnings and extensions start over."""
        return evolve(
            self,
            idle_since=None,
            warned_at=None,
            warned_beside_tab=False,
            extension_s=0.0,
            extensions_used=0,
            approval_pending=False,
            postponed_until=None,
            checkpoint_status=None,
            checkpoint_requested_at=None,
            checkpoint_failures=0,
            paused_at=None,
            busy_noticed_at=None,
            interrupted_at=None,
            quiet_since=None,
        )

    def next_session(self) -> Record:
        """A fresh record for the server's next session, keeping what the governor learned of
        the server itself: how its checkpoint hook has fared."""
        return Record(hook_failures=self.hook_failures)

    def exempted(self) -> Record:
        """Out of the idle policy's reach for a while: its clock and deadlines stop, the count
        of extensions the owner used (and a request waiting for an admin) stays on record."""
        return evolve(
            self.new_idle_stretch(),
            extensions_used=self.extensions_used,
            approval_pending=self.approval_pending,
        )


_same_record = slotted.equality(Record)


@_evolvable
@dataclass(frozen=True, slots=True)  # one kept per server: no __dict__ each
class Decision:
    record: Record
    actions: tuple[str, ...] = ()
    warn_at: datetime | None = None
    cull_at: datetime | None = None
    cull_reason: str | None = None  # one of CULL_REASONS
    notice: str | None = None  # what a hard deadline's warning, or a notice, tells the user
    # The hard deadline that sets ``cull_at``, in words once announced (its reason says it
    # too): whatever replaces this decision's state and reason keeps both.
    deadline_notice: str | None = None
    # What comes at ``cull_at`` when it is not a cull (the verdict's ``at_deadline``): INTERRUPT,
    # a running cell's limit that interrupts it and keeps the server (after_interrupt: warn).
    at_deadline: str | None = None
    # Its reason says a policy brought in while the server ran set its deadline or warning:
    # how it came in (``Policy.in_force_by``; the verdict's ``policy_change``), else None.
    policy_change: str | None = None

    @property
    def state(self) -> str:
        return self.record.state

    @property
    def reason(self) -> str:
        return self.record.reason


# -- the decision ------------------------------------------------------------------------------


def max_age_of(policy: Policy, view: ServerView) -> tuple[timedelta | None, str]:
    """The stricter of the policy's ``max_age`` and the tier's (label ``gpu-gov/max-age``), and
    which one it is. A label that cannot be read is ignored: the policy still applies."""
    label = view.labels.get(MAX_AGE_LABEL)
    try:
        tier = (parse_duration(label) or None) if label else None  # most servers have none
    except ValueError:
        tier = None
    if tier and (policy.max_age is None or tier < policy.max_age):
        return tier, "tier"
    return policy.max_age, "profile"


@dataclass(frozen=True)
class _Deadline:
    """A cull that GPU activity cannot put off."""

    at: datetime
    warn_from: datetime
    why: str
    cull_reason: str
    warning: str  # the warning action
    past: bool = False  # a maximum age its policy came in too late to announce in full
    policy_change: str | None = None  # its time set by a policy brought in (``Decision``'s)

    def notice(self) -> str:
        if self.past:
            return f"{self.why}: it will be stopped at {self.at:%H:%M} UTC"
        if self.cull_reason == MAX_AGE:
            return f"{self.why.replace('reached', 'will reach')} at {self.at:%H:%M} UTC"
        if self.cull_reason == RECLAIM:
            return f"{self.why}: it will be given back at {self.at:%H:%M} UTC"
        return f"{self.why}: the server will be stopped after a checkpoint"


def _hard_deadline(policy: Policy, view: ServerView, record: Record) -> _Deadline | None:
    """The earliest hard deadline — the maximum age, a reclaim of a borrowed GPU, a cull asked
    for (by an admin, or at the busy limit) — or None when there is none."""
    found = []
    # Applied while the server ran: a deadline the policy brings in (or brings forward) has
    # its warning's full notice from then, not a warning and a cull in the pass that first
    # reads it, nor the new notice counted from a warning an older policy gave (at once).
    # The warning goes out again (``warn_from``: after the older one), naming the new time.
    # A cull under way (its checkpoint asked for) met the deadline it announced: it goes on.
    since = policy.in_force_since if record.checkpoint_status is None else None
    max_age, whose = max_age_of(policy, view)
    if max_age and view.started:
        at = view.started + max_age
        why = f"reached the maximum age of {format_duration(max_age)} for this {whose}"
        floor = since and since + policy.max_age_warning
        if floor and at < floor:
            past = "past" if at <= since else f"reaching at {_at(at)}"
            why = f"{past} the maximum age of {format_duration(max_age)} for this {whose}"
            why += f" ({policy.brought_in})"
            found.append(
                _Deadline(floor, since, why, MAX_AGE, MAX_AGE_WARN, True, policy.in_force_by)
            )
        else:
            found.append(_Deadline(at, at - policy.max_age_warning, why, MAX_AGE, MAX_AGE_WARN))
    asked = _timestamp(view.labels.get(RECLAIM_LABEL))
    if asked is not None and view.labels.get(BORROWED_LABEL) == "true":
        team = view.labels.get(RECLAIM_FOR_LABEL) or "another team"
        why = f"team {in_sentence(team)}, within its guarantee, needs this borrowed GPU back"
        changed = None
        if since is not None and asked < since:
            grace = format_duration(policy.reclaim_grace)
            why += f" (its grace of {grace} from {policy.brought_in})"
            asked, changed = since, policy.in_force_by
        at = asked + policy.reclaim_grace
        found.append(_Deadline(at, asked, why, RECLAIM, RECLAIM_WARN, policy_change=changed))
    if record.cull_requested_at is not None:
        at = record.cull_requested_at
        why = record.cull_request_why or "a cull was asked for"
        found.append(_Deadline(at, at, why, record.cull_request_reason or ADMIN, ADMIN_WARN))
    return min(found, key=lambda d: d.at) if found else None


def _timestamp(value: str | None) -> datetime | None:
    try:
        return parse_time(value) if value else None
    except ValueError:
        return None


def decide(view: ServerView, record: Record, policy: Policy, now: datetime) -> Decision:
    if record.state == CULLED:
        return Decision(record)  # idempotent: the service already acted

    # A cull asked for (an admin's) overrides an exemption; nothing else does.
    if record.cull_requested_at is None and _is_exempt(view, record, policy, now):
        why = (
            f"exempt by policy {policy.name!r}"
            if policy.exempt
            else f"exempt until {record.exempt_until:%Y-%m-%d %H:%M} UTC"
            if record.exempt_until and now < record.exempt_until
            else f"exempt by label {EXEMPT_LABEL}"
        )
        return Decision(evolve(record.exempted(), state=EXEMPT, reason=why))

    actions: list[str] = []
    notice = None
    since, warned_before = policy.in_force_since, record.warned_at
    rewarn = (
        since is not None
        and warned_before is not None
        and warned_before < since
        and record.checkpoint_status is None  # else its deadline came: its cull goes on
    )
    if rewarn:
        # Warned of the deadline of the policy this one replaced: this policy's clock decides
        # afresh and warns again, once, with its full notice (never its notice counted from
        # the older warning: at once, under a shorter one). A longer one withdraws it.
        record = evolve(record, warned_at=None)
    deadline = _hard_deadline(policy, view, record)
    if deadline is None and record.max_age_warned_at is not None:
        # The hard deadline warned of is gone (a reclaim withdrawn, a maximum age a policy no
        # longer has): its warning no longer stands. Kept, it made the idle deadline left one
        # "whatever the GPU does" in the verdict (``hard_deadline``), which work puts off.
        record = evolve(record, max_age_warned_at=None)
    if deadline is not None:
        warned = record.max_age_warned_at
        if now >= deadline.warn_from and (warned is None or warned < deadline.warn_from):
            actions.append(deadline.warning)  # the notice first, even at the deadline itself
            record = evolve(record, max_age_warned_at=now)
            notice = deadline.notice()
        if now >= deadline.at:
            decision = _cull_with_checkpoint(
                record,
                policy,
                view,
                now,
                deadline.why,
                deadline.cull_reason,
                deadline.warn_from,
                deadline.at,
                hard=True,
            )
            return evolve(
                decision,
                actions=(*actions, *decision.actions),
                notice=notice,
                policy_change=deadline.policy_change,
            )
    if view.excluded is not None:
        record = evolve(record.exempted(), state=EXEMPT, reason=view.excluded)
        return Decision(record, tuple(actions), cull_at=deadline and deadline.at, notice=notice)

    unclaimed = _unclaimed(view, now)
    if unclaimed is not None:
        return _cull(record, now, unclaimed, None, now, UNCLAIMED)

    overrun = _overrun(view, policy, now)
    if overrun is not None and record.overrun_noticed_at is None:
        actions.append(OVERRUN_NOTICE)
        record = evolve(record, overrun_noticed_at=now)
        notice = notice or overrun
    decision = _decide_on_activity(view, record, policy, now, actions)
    kept = decision.record
    if (
        since is not None
        and decision.state == WARNED
        and kept.idle_since is not None
        and kept.warned_at is not None
        and kept.idle_since < since <= kept.warned_at
    ):
        # Warned under a policy applied during this stretch: the owner's panel says where
        # the deadline comes from (warned before it, that it changed).
        why = f"{kept.reason} (set by {policy.brought_in})"
        decision = evolve(
            decision, record=evolve(kept, reason=why), policy_change=policy.in_force_by
        )
    if overrun is not None:
        decision = evolve(
            decision, record=evolve(decision.record, reason=f"{decision.reason}; {overrun}")
        )
    if deadline is not None and decision.state != CULLED:
        decision = _with_hard_deadline(decision, deadline, now)
    if rewarn and WARN in decision.actions:
        notice = (
            notice
            or f"{decision.reason}; it replaces the deadline warned of at {_at(warned_before)}"
        )
    return evolve(decision, notice=notice) if notice else decision


def _with_hard_deadline(decision: Decision, deadline: _Deadline, now: datetime) -> Decision:
    """A hard deadline, whatever the GPU does, is when the server stops if nothing stops it
    sooner: its verdict says so (and the spawn queue's estimate counts on it); once announced,
    its reason says why, like the warning."""
    if decision.cull_at is not None and decision.cull_at <= deadline.at:
        return decision
    reason, words, changed = decision.reason, None, decision.policy_change
    if now >= deadline.warn_from:
        words = deadline.notice()
        reason = f"{reason}; {words}"
        changed = changed or deadline.policy_change
    record = evolve(decision.record, reason=reason)
    return evolve(
        decision,
        record=record,
        cull_at=deadline.at,
        deadline_notice=words,
        at_deadline=None,
        policy_change=changed,
    )


def keep_hard_deadline(replacement: Decision, decided: Decision) -> Decision:
    """``replacement`` (a decision another rule put in place of ``decided``, e.g. a failed GPU's
    notice) with ``decided``'s hard deadline: its ``cull_at`` and, once announced, its words."""
    if decided.cull_at is None or replacement.cull_at is not None:
        return replacement
    record = replacement.record
    if decided.deadline_notice and decided.deadline_notice not in record.reason:
        record = evolve(record, reason=f"{record.reason}; {decided.deadline_notice}")
    return evolve(
        replacement,
        record=record,
        cull_at=decided.cull_at,
        deadline_notice=decided.deadline_notice,
        at_deadline=decided.at_deadline,
        policy_change=replacement.policy_change
        or (decided.policy_change if decided.deadline_notice else None),
    )


def holds_until(
    view: ServerView, record: Record, policy: Policy, decision: Decision, now: datetime
) -> datetime | None:
    """Until when ``decide(view, record, policy, t)`` returns ``decision`` for every later ``t``:
    the earliest time at which the same inputs could decide differently (``None``: never, by
    time alone). ``now`` where that is not worked out here: decide again at the next pass.

    Worked out for the steady states most servers are in, with nothing to do: a GPU known
    active; known idle, before the warning (until ``warn_at``) or warned (until ``cull_at``),
    with no cell running; no GPU, active by jupyterhub-idle-culler's rule (until its
    ``cull_at``); waiting for a checkpoint before an idle or hard-deadline cull (until the
    request times out). Every other state (unknown, exempt, culled, a cell running, ...)
    answers ``now``. Besides those, the times that can move a steady decision on
    are the hard deadlines (and their warnings), the expected duration's notice, a queued
    spawn's time to be claimed and the owner becoming away; ``decide`` reads no other time on
    these paths: a new rule in ``decide`` that reads one must add it here
    (tests/test_governor_incremental.py compares the two paths)."""
    gpu = view.gpu
    # A checkpoint asked for before a cull, not answered yet: its answer arrives as a new
    # input (the report); without one, the request times out at a time of its own.
    waiting = (
        decision.state == CHECKPOINTING
        and record.checkpoint_status == CHECKPOINT_REQUESTED
        and record.checkpoint_requested_at is not None
    )
    if (
        decision.actions
        or decision.record != record
        or view.excluded is not None
        or record.cull_requested_at is not None
        or record.exempt_until is not None
        # A request still open that is not waited on here; one settled (status cleared, the
        # cull postponed after it failed or timed out) is read no more: the postponed cull
        # is ``cull_at``, below.
        or (
            record.checkpoint_requested_at is not None
            and record.checkpoint_status is not None
            and not waiting
        )
        or record.paused_at is not None
        or record.interrupted_at is not None
    ):
        return now
    times = []
    deadline = _hard_deadline(policy, view, record)
    if waiting:
        times.append(record.checkpoint_requested_at + policy.checkpoint_timeout)
        if deadline is not None and now >= deadline.at:
            pass  # past a hard deadline ``decide`` reads no activity: it stays past
        elif _steady_idle(gpu, record):
            _away_at(view, policy, times)
        else:
            return now
    elif gpu is None or not gpu.holds_gpu:  # jupyterhub-idle-culler's rule: its deadline
        if decision.state != ACTIVE:
            return now
        times.append(decision.cull_at)
    elif decision.state == ACTIVE and gpu.active is True:
        pass
    elif decision.state in (IDLE, WARNED) and _steady_idle(gpu, record):
        times.append(decision.warn_at if decision.state == IDLE else decision.cull_at)
        _away_at(view, policy, times)
    else:
        return now
    if deadline is not None:
        times += [deadline.warn_from, deadline.at]
    # The expected duration's notice, and a queued spawn's time to be claimed (``_unclaimed``).
    for label in (EXPECTED_DURATION_LABEL, CLAIM_WITHIN_LABEL):
        value = view.labels.get(label)
        if value and view.started is not None:
            try:
                duration = parse_duration(value)
            except ValueError:
                continue  # an unreadable label never falls due (as decide reads it)
            times.append(view.started + duration)
    # A time already past changes nothing more: the comparisons it settles stay settled.
    later = [t for t in times if t is not None and t > now]
    return min(later) if later else None


def _steady_idle(gpu: GpuSignal | None, record: Record) -> bool:
    """A GPU known idle, on a stretch already started, no cell running."""
    return (
        gpu is not None
        and gpu.holds_gpu
        and gpu.active is False
        and record.idle_since is not None
        and _running_cell(gpu, record.idle_since) is None
    )


def _away_at(view: ServerView, policy: Policy, times: list) -> None:
    """When the owner becomes away (``away_after`` past their last activity)."""
    back = view.user_last_activity
    if policy.away_after is not None and back is not None:
        times.append(back + policy.away_after)


def _unclaimed(view: ServerView, now: datetime) -> str | None:
    """Why a server the spawn queue started on its owner's behalf is given back: nobody opened
    it within the time the grant allows (``core.queue.claim_by``), else None. A server that
    does not report abstains: its kernels cannot be seen."""
    if view.gpu is None:
        return None
    due = claim_by(view.labels, view.started, view.user_last_activity, view.hub_last_activity)
    if due is None or now < due:
        return None
    return (
        f"started from the spawn queue at {_at(view.started)} and not opened within "
        f"{format_duration(due - view.started)}: its GPU is given back to the line"
    )


def _overrun(view: ServerView, policy: Policy, now: datetime) -> str | None:
    """Words for a server running past the duration its owner expected, else None."""
    label = view.labels.get(EXPECTED_DURATION_LABEL)
    if not policy.expected_duration_notice or not label or view.started is None:
        return None
    try:
        expected = parse_duration(label)
    except ValueError:
        return None
    if not expected or now < view.started + expected:
        return None
    return (
        f"running past the {format_duration(expected)} expected at spawn (since "
        f"{_at(view.started + expected)}): if its work is done, stop it to give the GPU back"
    )


def _decide_on_activity(
    view: ServerView, record: Record, policy: Policy, now: datetime, actions: list[str]
) -> Decision:
    gpu = view.gpu
    if gpu is None or not gpu.holds_gpu:
        return _inactive_rule(view, record, policy, now, actions, gpu)

    if gpu.active is None:
        # Unknown is never idle: no warning, no cull, and the idle clock pauses (warnings and
        # extensions already granted stand) until the GPU is known again.
        why = "GPU activity unknown" + (f" ({gpu.detail})" if gpu.detail else "")
        paused = evolve(record, state=UNKNOWN, reason=why, paused_at=record.paused_at or now)
        return Decision(paused, tuple(actions))

    if gpu.active:
        why = "GPU active" + (f" ({gpu.detail})" if gpu.detail else "")
        return Decision(evolve(record.new_idle_stretch(), state=ACTIVE, reason=why), tuple(actions))

    # GPU idle.
    if record.paused_at is not None:
        record = _resume(record, now)
        idle_since = record.idle_since or now  # an unknown stretch does not count as idle time
    elif record.idle_since is not None:
        idle_since = record.idle_since
    else:
        idle_since = min(gpu.idle_since or now, now)
    record = evolve(record, idle_since=idle_since)
    # Reasons name times, not running durations, so a record changes only when something
    # happens (the store then writes only transitions).
    idle = f"GPU idle since {_at(idle_since)}" + (f" ({gpu.detail})" if gpu.detail else "")

    back = view.user_last_activity
    if _interrupt_checkpoint_pending(record, policy):
        # A cell's limit interrupted it and asked for a checkpoint: once it has answered (or
        # not, in time), the server is culled as its warning said (after_interrupt), or the
        # idle rules take over with a warning of their own.
        status = _checkpoint_status(record, policy, now)
        if status == CHECKPOINT_REQUESTED:
            why = f"{idle}; the cell was interrupted past its limit; waiting for the checkpoint"
            # The stop the warning announced is due once it is saved (the interrupt's time).
            then = policy.after_interrupt == "cull"
            due, reason = (record.interrupted_at, BUSY_LIMIT) if then else (None, None)
            record = evolve(record, state=CHECKPOINTING, reason=why)
            at_deadline = None if then else INTERRUPT
            return Decision(
                record, tuple(actions), record.warned_at, due, reason, at_deadline=at_deadline
            )
        record = _hook_answered(record, status)
        warned = record.warned_at
        if (
            status == CHECKPOINT_DONE
            and policy.after_interrupt == "cull"
            and warned is not None
            and (back is None or back <= warned)  # nobody back since the warning
            and _running_cell(gpu, idle_since) is None  # the interrupt stopped the cell
        ):
            why = (
                f"{idle}; its cell was interrupted at {_at(record.interrupted_at)} past its "
                f"limit and a checkpoint saved: {_cull_words(policy)}, as the warning of "
                f"{_at(warned)} said"
            )
            record = evolve(record, checkpoint_status=None, checkpoint_requested_at=None)
            return evolve(
                _cull(record, now, why, warned, now, BUSY_LIMIT),
                actions=(*actions, CULL),
            )
        record = evolve(
            record, checkpoint_status=None, checkpoint_requested_at=None, warned_at=None
        )
    if record.interrupted_at is not None:
        idle += f"; its cell was interrupted at {_at(record.interrupted_at)} past its limit"

    # A confident diagnosis of a zombie (memory held, no GPU work, nobody there) is an owner
    # away; any other cause only explains.
    zombie = view.cause == "zombie" and view.cause_confident
    away = zombie or (
        policy.away_after is not None and back is not None and now - back >= policy.away_after
    )
    grace = policy.user_activity_grace
    if record.warned_at is not None and back is not None and back > record.warned_at:
        # The owner came back after the warning went out: they get its full notice from their
        # last interaction, not a short grace (the warning may have been sent while they were away).
        grace = max(grace, policy.notice)
    present_until = _plus(back, grace)

    cell = _running_cell(gpu, idle_since)
    quiet = cell is not None and gpu.cell_quiet is True
    if quiet != (record.quiet_since is not None):
        record = evolve(record, quiet_since=now if quiet else None)
    clock = _idle_clock(view, gpu, record, policy, idle_since, away, present_until)
    if cell is not None:
        if record.checkpoint_status is not None:
            # The checkpoint asked for before the cull no longer holds the kernel's state: the
            # cell is changing it (a cell submitted as the request went out runs before the
            # hooks, or they wait behind it). No cull lands while it runs; after it, the cull
            # asks for a checkpoint of its own, and a late answer to this one is dropped.
            record = evolve(record, checkpoint_status=None, checkpoint_requested_at=None)
        return _decide_running(view, record, policy, now, actions, idle, cell, clock, present_until)
    warn_at, cull_at, due, notice = clock.warn_at, clock.cull_at, clock.due, clock.notice

    if now < warn_at and record.warned_at is None:
        return Decision(evolve(record, state=IDLE, reason=idle), tuple(actions), warn_at, cull_at)

    if record.warned_at is None:
        actions.append(WARN)
        record = evolve(record, warned_at=now, warned_beside_tab=view.tab_open is True)
        if _unseen_since(view, gpu, record, policy) is not None:
            # Given with nobody there to read it: its notice is the Hub's lag from the start
            # (a deadline that moves later if someone turns up, never earlier).
            clock = _idle_clock(view, gpu, record, policy, idle_since, away, present_until)
            warn_at, cull_at, due, notice = clock.warn_at, clock.cull_at, clock.due, clock.notice
        cull_at = max(cull_at, now + notice)
        due = max(due, cull_at)
    if now < cull_at:
        if record.checkpoint_status is not None:
            # Asked for a cull that no longer comes now (a longer policy applied, the owner
            # back): the cull at the new time asks for a checkpoint of its own, never stops
            # the server on this one, saved before what was done since (as an extension does).
            record = evolve(record, checkpoint_status=None, checkpoint_requested_at=None)
        why = f"{idle}; {_cull_words(policy)} at {_at(cull_at)} unless extended"
        why += clock.why(back)
        return Decision(evolve(record, state=WARNED, reason=why), tuple(actions), warn_at, cull_at)

    why = f"{idle} (policy {policy.name!r}: cull after {format_duration(policy.cull_after)})"
    if warn_at < idle_since + policy.warn_after:
        # Warned early (nobody there: away_after, zombie_idle), culled after the notice, before
        # cull_after: the reason said "cull after 1h" of a cull at 31 minutes.
        rule = f"cull after the warning's notice of {format_duration(notice)}"
        why = f"{idle} (policy {policy.name!r}: {rule})" + clock.why(back)
    final = f"GPU idle for {format_duration(now - idle_since)}" + why[len("GPU idle") :]
    decision = _cull_with_checkpoint(
        record, policy, view, now, why, GPU_IDLE, warn_at, cull_at, final, due=due
    )
    return evolve(decision, actions=tuple(actions) + decision.actions)


@dataclass(frozen=True)
class _IdleClock:
    """The idle cull's times for the stretch so far: when the warning is due, the cull
    (``due``: before a failed checkpoint postponed it) and the warning's notice."""

    warn_at: datetime
    cull_at: datetime
    due: datetime
    notice: timedelta
    zombie: bool
    away: bool
    holds: tuple[str, ...]
    # The warning nobody can have read (``_unseen_since``), where that set the cull.
    unseen: datetime | None = None
    beside_tab: bool = False  # shown in a tab open when it went out (``warned_beside_tab``)

    def why(self, back: datetime | None) -> str:
        """What the reason adds to the deadline: who is (not) there, what holds it back."""
        why = ""
        if self.unseen is not None and self.beside_tab:
            why += (
                f" (nobody has used the notebook since {_at(back)}, nor acted since the warning"
                f" of {_at(self.unseen)}: a tab open polls whether or not anyone is at it, so"
                f" its notice is the Hub's own lag, {format_duration(self.notice)})"
            )
        elif self.unseen is not None:
            why += (
                f" (nobody has used the notebook since {_at(back)}, and the Hub has seen no"
                f" activity on it since the warning of {_at(self.unseen)}: no tab open to read"
                f" it, so its notice is the Hub's own lag, {format_duration(self.notice)})"
            )
        elif self.zombie:
            why += " (nobody is there: the GPU holds memory and does no work, and the Hub has seen no activity)"
        elif self.away:
            why += f" (nobody has used the notebook since {_at(back)})"
        if self.holds:
            why += f" (held back by {', '.join(self.holds)})"
        return why


def _idle_clock(
    view: ServerView,
    gpu: GpuSignal,
    record: Record,
    policy: Policy,
    idle_since: datetime,
    away: bool,
    present_until: datetime | None,
) -> _IdleClock:
    """The idle cull's clock: a GPU fact, the same whether or not a cell runs meanwhile, so a
    warning given before a short cell keeps its deadline through it."""
    # An away owner is warned at once. Not once the stretch was extended: the owner (or an
    # admin) was there and was told a deadline, which a later reading must not bring forward.
    zombie = view.cause == "zombie" and view.cause_confident
    extended = record.extension_s > 0 or record.extensions_used > 0
    first_stage = timedelta(0) if away and not extended else policy.warn_after
    extension = timedelta(seconds=record.extension_s)
    cull_at = idle_since + first_stage + policy.notice + extension
    notice = policy.notice
    warn_at = cull_at - notice
    silent = _silent_since(view, gpu, policy, idle_since)
    # Not known: the default's (zombie_idle, an admin's choice, is read as configured).
    lag = view.hub_activity_lag or HUB_ACTIVITY_LAG
    if silent is not None:
        # Nobody there by the Hub's record: the shorter clock. The Hub's activity lags by up
        # to its lag, so a silence is a silence only past it: the warning goes out then, with
        # the rest of zombie_idle (at least as long again) as its notice.
        window = max(policy.zombie_idle, 2 * lag)
        if silent + window + extension < cull_at:
            zombie, cull_at = True, silent + window + extension
            warn_at = min(warn_at, silent + lag + extension)
            notice = cull_at - warn_at
    unseen = _unseen_since(view, gpu, record, policy) if not extended else None
    if unseen is not None and unseen + lag < cull_at:
        # A warning nobody can read protects nobody: its notice is only as long as the Hub
        # needs to see someone arrive, who then gets the full notice (the rule no longer holds).
        cull_at, notice = unseen + lag, lag
    else:
        unseen = None
    if present_until is not None and policy.presence_limit is not None:
        present_until = min(present_until, idle_since + policy.presence_limit + extension)
    holds = []
    for not_before, what in (
        (present_until, "recent user activity"),
        # DCGM alone cannot see a running cell: the cull waits busy_grace in case one runs.
        (None if gpu.sees_cells else idle_since + policy.busy_grace, "a cell may be running"),
    ):
        if not_before is not None and not_before > cull_at:
            cull_at = not_before
            holds.append(what)
    if record.warned_at is not None:
        cull_at = max(cull_at, record.warned_at + notice)  # every warning gets its notice
    due = cull_at  # what failed checkpoints postpone, within checkpoint_max_delay
    if record.postponed_until is not None and record.postponed_until > cull_at:
        cull_at = record.postponed_until
        holds.append("a failed checkpoint")
    beside = unseen is not None and record.warned_beside_tab
    return _IdleClock(warn_at, cull_at, due, notice, zombie, away, tuple(holds), unseen, beside)


def _unseen_since(
    view: ServerView, gpu: GpuSignal, record: Record, policy: Policy
) -> datetime | None:
    """When the warning went out, if nobody can have read it: its owner was away by then
    (``away_after`` past their last interaction), nobody has interacted since, and the Hub has
    seen no activity on the server since (no tab opened, which would poll; no kernel message;
    no request) — or a tab was open when it went out (its report said so), whose polling keeps
    the Hub's activity fresh whether or not anyone is at it: then only a person's interaction
    (a cell, a completion, a widget, a terminal, Extend) says someone read it. None otherwise,
    or when not known: no report (a running cell could not be seen), no Hub activity at all. A
    server can make its Hub activity fresher, claim an interaction, and deny a tab, never the
    other way: each only holds the cull longer. Nor when the Hub's lag is not known: a Hub that
    gathers activity less often would read someone there as gone."""
    warned, last, back = record.warned_at, view.hub_last_activity, view.user_last_activity
    if warned is None or last is None or back is None or policy.away_after is None:
        return None
    if view.hub_activity_lag is None:
        return None
    if not (view.reports and gpu.sees_cells) or back + policy.away_after > warned:
        return None
    if back > warned or (last > warned and not record.warned_beside_tab):
        return None
    return warned


def _silent_since(
    view: ServerView, gpu: GpuSignal, policy: Policy, idle_since: datetime
) -> datetime | None:
    """Since when the server has been a zombie by the Hub's own record (``zombie_idle``): its
    GPU idle and held, no cell running as its report shows, and no Hub activity — the latest
    of the idle start, the Hub's last activity and a person's last interaction; None when the
    rule does not apply."""
    last = view.hub_last_activity  # unknown is never "nobody"
    if policy.zombie_idle is None or last is None:
        return None
    if not (view.reports and gpu.sees_cells and gpu.holds_gpu):
        return None
    # A person's interaction the report names may only make the clock more patient.
    return max(idle_since, last, view.user_last_activity or last)


@dataclass(frozen=True)
class _Cell:
    """A cell running while the GPU idles."""

    since: datetime  # the later of the cell's start and the GPU's idle start
    words: str


def _running_cell(gpu: GpuSignal, idle_since: datetime) -> _Cell | None:
    """A cell the report shows running (the kernel's execution state). DCGM alone cannot see
    one, nor can the Hub (a silent cell updates no activity, an open tab does): for a server
    without the extension the idle cull only waits busy_grace in case one runs, unless its
    container's CPU has been busy (``cpu_busy_since``): a CPU stage, decided as a cell."""
    if not gpu.sees_cells:
        if gpu.cpu_busy_since is None:
            return None
        return _Cell(max(gpu.cpu_busy_since, idle_since), CPU_STAGE_WORDS)
    if gpu.kernel_busy_since is None:
        return None
    return _Cell(max(gpu.kernel_busy_since, idle_since), "a kernel is executing a cell")


_CAUSE_WORDS = {
    "cpu_serial": "a CPU-bound step",
    "data_io": "waiting on data loading",
    "small_work": "too little work per step",
    "memory_bandwidth": "memory-bound kernels",
    "zombie": "a kernel holding memory that nobody uses",
}


def _decide_running(
    view: ServerView,
    record: Record,
    policy: Policy,
    now: datetime,
    actions: list[str],
    idle: str,
    cell: _Cell,
    clock: _IdleClock,
    present_until: datetime | None,
) -> Decision:
    """A cell runs while its GPU idles. It is never culled for idleness: past ``busy_grace``
    the owner gets a notice naming the cause, and past ``busy_limit`` (from the GPU's idle
    start, so that restarting cells does not reset it) a warning; after the notice the cell is
    interrupted and a checkpoint taken, or the server culled.

    A warning of the idle cull given before the cell started stands through it, deadline and
    all (``clock``): a short CPU cell neither withdraws it nor earns a second one. Only a cell
    still running at that deadline ends it: the cell's own rules take over, and once it ends
    the idle rules warn again with a full notice, so no cull lands as a long cell finishes."""
    idle_since = record.idle_since
    extension = timedelta(seconds=record.extension_s)
    limit = idle_since + policy.busy_limit + extension
    name = f"the busy limit of {format_duration(policy.busy_limit)}"
    doing = ""
    if record.quiet_since is not None and policy.quiet_cell_limit is not None:
        hold = min(max(policy.quiet_cell_limit, policy.busy_grace), policy.busy_limit)
        quiet_limit = max(cell.since, record.quiet_since) + hold + extension
        if quiet_limit < limit:
            limit = quiet_limit
            name = f"the quiet-cell limit of {format_duration(hold)}"
            doing = (
                ", its kernel doing nothing (no CPU, no I/O: a sleep or poll loop, an input()) "
                f"since {_at(record.quiet_since)}"
            )
    warned = record.warned_at
    # The idle cull's warning: given before this cell ran (a warning of the cell's own limit
    # comes busy_grace after its start at the earliest, and stands once given).
    idle_warning = warned is not None and warned < limit and warned < cell.since + policy.busy_grace
    standing = idle_warning and now < min(limit, clock.cull_at)
    if warned is not None and warned < limit and not standing:
        # A warning of an idle cull whose deadline the cell outlived, or of a limit since
        # moved later, does not stand for this one.
        record = evolve(record, warned_at=None)
    act_at = limit + policy.notice
    if record.warned_at is not None:
        act_at = max(act_at, record.warned_at + policy.notice)
    if present_until is not None and present_until > act_at:
        act_at = present_until  # somebody is at the notebook
    grace_end = cell.since + policy.busy_grace
    interruptible = view.checkpointable
    interrupt = interruptible and policy.on_busy_limit == "interrupt"
    interrupted = record.interrupted_at is not None and record.interrupted_at >= cell.since
    # The deadline interrupts the cell and keeps the server, unless a cull follows it.
    keeps = interrupt and not interrupted and policy.after_interrupt != "cull"
    at_deadline = INTERRUPT if keeps else None
    outcome = _cull_words(policy)
    if interrupt:
        # What after_interrupt does once the checkpoint is saved, said before it happens.
        outcome = "the cell interrupted and checkpointed" + (
            f", then the {outcome}" if policy.after_interrupt == "cull" else ""
        )
    running = f"{idle}; {cell.words} since {_at(cell.since)}{doing}"
    cause = _CAUSE_WORDS.get(view.cause or "")
    if cause:
        running += f" ({'the diagnosis' if view.cause_confident else 'maybe'}: {cause})"

    if standing:
        why = (
            f"{running}; {_cull_words(policy)} at {_at(clock.cull_at)} unless extended, not "
            f"while the cell runs{clock.why(view.user_last_activity)}"
        )
        record = evolve(record, state=WARNED, reason=why)
        return Decision(record, tuple(actions), clock.warn_at, clock.cull_at)
    if now < limit and record.warned_at is None:
        if now < grace_end:
            record = evolve(record, state=IDLE, reason=running)
            return Decision(record, tuple(actions), grace_end, act_at, at_deadline=at_deadline)
        if record.busy_noticed_at is None or record.busy_noticed_at < cell.since:
            actions.append(BUSY_NOTICE)
            record = evolve(record, busy_noticed_at=now)
        why = (
            f"{running}: if it will use the GPU again, press Extend; if not, stop it and give "
            f"the GPU back. {outcome.capitalize()} at {_at(act_at)} ({name}) unless extended"
        )
        record = evolve(record, state=BUSY, reason=why)
        return Decision(record, tuple(actions), grace_end, act_at, at_deadline=at_deadline)

    if record.warned_at is None:
        actions.append(WARN)
        record = evolve(record, warned_at=now, warned_beside_tab=view.tab_open is True)
        act_at = max(act_at, now + policy.notice)
    if now < act_at:
        why = f"{running}, past {name}: {outcome} at {_at(act_at)} unless extended"
        record = evolve(record, state=WARNED, reason=why)
        return Decision(record, tuple(actions), limit, act_at, at_deadline=at_deadline)

    why = (
        f"{cell.words} since {_at(cell.since)}{doing} with its GPU idle since {_at(idle_since)}: "
        f"past {name}"
    )
    first = ()
    if interruptible and not interrupted:
        first = (INTERRUPT,)  # the hooks of a checkpoint can run only once the cell stops
        record = evolve(record, interrupted_at=now)
        if interrupt:
            record = evolve(
                record,
                state=CHECKPOINTING,
                checkpoint_status=CHECKPOINT_REQUESTED,
                checkpoint_requested_at=now,
                reason=f"{why}: the cell was interrupted; saving a checkpoint",
            )
            # The checkpoint precedes a cull when after_interrupt says so: its request, and
            # the owner's "stopped because" at the next start, name the cull's reason.
            then = BUSY_LIMIT if policy.after_interrupt == "cull" else None
            acts = (*actions, INTERRUPT, CHECKPOINT)
            return Decision(record, acts, limit, act_at, then, at_deadline=at_deadline)
    # The policy culls at the limit, the cell cannot be interrupted, or it ran on after the
    # interrupt: a hard deadline from now on.
    record = evolve(
        record,
        cull_requested_at=now,
        cull_request_reason=BUSY_LIMIT,
        cull_request_why=why,
        max_age_warned_at=now,  # warned above
    )
    decision = _cull_with_checkpoint(
        record, policy, view, now, why, BUSY_LIMIT, limit, now, hard=True
    )
    return evolve(decision, actions=(*actions, *first, *decision.actions))


def _interrupt_checkpoint_pending(record: Record, policy: Policy) -> bool:
    return (
        policy.on_busy_limit == "interrupt"
        and record.interrupted_at is not None
        and record.checkpoint_status is not None
        and record.checkpoint_requested_at == record.interrupted_at
    )


def _resume(record: Record, now: datetime) -> Record:
    """Known again after an unknown stretch: move the idle clock's marks past the pause."""
    pause = now - record.paused_at
    return evolve(
        record,
        paused_at=None,
        idle_since=_plus(record.idle_since, pause),
        warned_at=_plus(record.warned_at, pause),
        postponed_until=_plus(record.postponed_until, pause),
        quiet_since=_plus(record.quiet_since, pause),
    )


def _at(when: datetime) -> str:
    # f"{when:%Y-%m-%d %H:%M} UTC", the same text without strftime (0.8 µs, not 1.9): a pass
    # writes one or two into each decided server's reason.
    return f"{when.year}-{when.month:02d}-{when.day:02d} {when.hour:02d}:{when.minute:02d} UTC"


def _plus(when: datetime | None, delta: timedelta) -> datetime | None:
    return None if when is None else when + delta


def _is_exempt(view: ServerView, record: Record, policy: Policy, now: datetime) -> bool:
    return (
        policy.exempt
        or view.labels.get(EXEMPT_LABEL, "").lower() == "true"
        or (record.exempt_until is not None and now < record.exempt_until)
    )


def _inactive_rule(
    view: ServerView,
    record: Record,
    policy: Policy,
    now: datetime,
    actions: list[str],
    gpu: GpuSignal | None,
) -> Decision:
    """jupyterhub-idle-culler's rule on Hub ``last_activity``, for servers with no GPU report
    (no extension, a CPU-only profile) or holding no GPU."""
    what = "holds no GPU" if gpu is not None else "sends no GPU report"
    last = view.hub_last_activity or view.started
    record = record.new_idle_stretch()
    if policy.inactive_timeout is None or last is None:
        return Decision(evolve(record, state=ACTIVE, reason=f"{what}; not culled"), tuple(actions))
    deadline = last + policy.inactive_timeout
    if now < deadline:
        why = f"{what}; last activity {_at(last)}"
        return Decision(evolve(record, state=ACTIVE, reason=why), tuple(actions), None, deadline)
    why = f"{what}; inactive since {_at(last)} (idle-culler rule: {format_duration(policy.inactive_timeout)})"
    record = evolve(record, state=CULLED, culled_at=now, reason=why)
    return Decision(record, (*actions, CULL), None, deadline, INACTIVE)


def _checkpoint_status(record: Record, policy: Policy, now: datetime) -> str | None:
    """The checkpoint's status, a request unanswered for checkpoint_timeout being a timeout."""
    status = record.checkpoint_status
    if (
        status == CHECKPOINT_REQUESTED
        and now - record.checkpoint_requested_at >= policy.checkpoint_timeout
    ):
        return CHECKPOINT_TIMEOUT
    return status


def _cull_with_checkpoint(
    record: Record,
    policy: Policy,
    view: ServerView,
    now: datetime,
    why: str,
    cull_reason: str,
    warn_at: datetime | None,
    cull_at: datetime,
    final: str | None = None,
    *,
    hard: bool = False,
    due: datetime | None = None,
) -> Decision:
    """Checkpoint first when the policy says so and the server can be asked; then cull, or on
    a failed checkpoint postpone (bounded) and retry.

    ``why`` explains the waiting states; ``final`` (default ``why``) is the cull's own reason.
    A ``hard`` deadline waits for one retry at most; an idle cull (due at ``due``) backs off
    ``checkpoint_retries`` times at most, never past ``checkpoint_max_delay``."""
    final = final or why
    if not policy.checkpoint:
        return _cull(record, now, final, warn_at, cull_at, cull_reason)
    if not view.checkpointable:
        # Nobody to ask: no extension (no report this session), or it cannot be reached.
        cannot = "it sends no GPU report" if not view.reports else "it cannot be reached"
        return _cull(
            record, now, f"{final}; no checkpoint ({cannot})", warn_at, cull_at, cull_reason
        )
    status = _checkpoint_status(record, policy, now)
    if status is None:
        record = evolve(
            record,
            state=CHECKPOINTING,
            checkpoint_status=CHECKPOINT_REQUESTED,
            checkpoint_requested_at=now,
            reason=f"{why}; saving a checkpoint before the cull",
        )
        return Decision(record, (CHECKPOINT,), warn_at, cull_at, cull_reason)
    if status == CHECKPOINT_REQUESTED:
        record = evolve(record, state=CHECKPOINTING, reason=f"{why}; waiting for the checkpoint")
        return Decision(record, (), warn_at, cull_at, cull_reason)
    if status == CHECKPOINT_DONE:
        record = _hook_answered(record, status)
        return _cull(record, now, f"{final}; checkpoint saved", warn_at, cull_at, cull_reason)

    failures = record.checkpoint_failures + 1
    broken = _broken_hook(record, policy)  # by the failures before this one
    record = _hook_answered(record, status)
    if policy.on_checkpoint_failure == "proceed":
        anyway = "on_checkpoint_failure=proceed"
    elif broken:
        anyway = broken
    elif hard:
        if failures <= 1:  # one bounded retry, no new warning
            record = evolve(
                record,
                state=CHECKPOINTING,
                checkpoint_status=CHECKPOINT_REQUESTED,
                checkpoint_requested_at=now,
                checkpoint_failures=failures,
                reason=f"{why}; checkpoint {status}: trying once more before the cull",
            )
            return Decision(record, (CHECKPOINT,), warn_at, cull_at, cull_reason)
        anyway = "a hard deadline waits for one retry only"
    else:
        backoff = max(policy.notice, policy.checkpoint_timeout) * 2 ** (failures - 1)
        new_cull = min(now + backoff, (due or cull_at) + policy.checkpoint_max_delay)
        if failures <= policy.checkpoint_retries and new_cull > now:
            # Do not lose work: say so, and try again later; a bounded number of times.
            record = evolve(
                record,
                state=WARNED,
                postponed_until=new_cull,
                checkpoint_status=None,
                checkpoint_failures=failures,
                reason=(
                    f"{why}; checkpoint {status} ({failures} of {policy.checkpoint_retries} "
                    f"retries): cull postponed to {_at(new_cull)}"
                ),
            )
            return Decision(record, (WARN,), warn_at, new_cull, cull_reason)
        anyway = (
            f"after {failures} failed checkpoints"
            if failures > policy.checkpoint_retries
            else f"checkpoint_max_delay of {format_duration(policy.checkpoint_max_delay)} spent"
        )
    final = f"{final}; checkpoint {status}, culling anyway ({anyway})"
    return _cull(record, now, final, warn_at, cull_at, cull_reason)


def _hook_answered(record: Record, status: str | None) -> Record:
    """Count the server's failed checkpoints in a row: a saved one resets the count, a timeout
    (perhaps the network's, not the hook's) leaves it as it is."""
    if status == CHECKPOINT_DONE and record.hook_failures:
        return evolve(record, hook_failures=0)
    if status == CHECKPOINT_FAILED:
        return evolve(record, hook_failures=record.hook_failures + 1)
    return record


def _broken_hook(record: Record, policy: Policy) -> str | None:
    """Why waiting for this server's checkpoint again saves nothing — the first failure of
    this deadline, after ``checkpoint_broken_after`` failures in a row at earlier ones (within
    one deadline ``checkpoint_retries`` rules) — else None."""
    after = policy.checkpoint_broken_after
    if after is None or record.checkpoint_failures or record.hook_failures < after:
        return None
    return (
        f"its hook had failed {record.hook_failures} times in a row before: taken as broken "
        f"(checkpoint_broken_after {after}), so no retry"
    )


def _cull(
    record: Record,
    now: datetime,
    why: str,
    warn_at: datetime | None,
    cull_at: datetime,
    cull_reason: str,
) -> Decision:
    record = evolve(record, state=CULLED, culled_at=now, reason=why)
    return Decision(record, (CULL,), warn_at, cull_at, cull_reason)


def _cull_words(policy: Policy) -> str:
    return "kernels shut down" if policy.cull_action == SHUTDOWN_KERNELS else "server stopped"


# -- extensions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtensionOutcome:
    record: Record
    status: str  # granted | pending | refused
    message: str


def extend(record: Record, policy: Policy, reason: str | None) -> ExtensionOutcome:
    """The owner asks for more time. Within ``max_extensions`` it is granted at once; beyond,
    it waits for an admin."""
    if record.state not in (IDLE, BUSY, WARNED, CHECKPOINTING):
        return ExtensionOutcome(
            record, "refused", f"nothing to extend: the server is {record.state}"
        )
    if record.cull_requested_at is not None:
        why = record.cull_request_why or "a cull was asked for"
        return ExtensionOutcome(record, "refused", f"the server is being stopped: {why}")
    if policy.extension_reason == "required" and not (reason or "").strip():
        return ExtensionOutcome(record, "refused", "a reason is required to extend")
    if record.approval_pending:
        return ExtensionOutcome(record, "pending", "an extension is already waiting for an admin")
    if record.extensions_used >= policy.max_extensions:
        record = evolve(record, approval_pending=True)
        return ExtensionOutcome(
            record,
            "pending",
            f"all {policy.max_extensions} extensions used: an admin must approve this one",
        )
    record = _grant(record, policy.extension_step.total_seconds(), policy)
    record = evolve(record, extensions_used=record.extensions_used + 1)
    left = policy.max_extensions - record.extensions_used
    return ExtensionOutcome(
        record, "granted", f"extended by {format_duration(policy.extension_step)}; {left} left"
    )


def approve(record: Record, seconds: float, policy: Policy | None = None) -> Record:
    """An admin grants ``seconds`` more (beyond the owner's own extensions)."""
    return evolve(_grant(record, seconds, policy), approval_pending=False)


def deny(record: Record) -> Record:
    return evolve(record, approval_pending=False)


def _grant(record: Record, seconds: float, policy: Policy | None = None) -> Record:
    # The time counts from the deadline the owner was told: a warning that went out late (a
    # slow pass) gave its full notice, past the idle clock's deadline by as much; granting
    # drops the warning, so that lateness joins the extension.
    if policy is not None and record.warned_at is not None and record.idle_since is not None:
        clock_warn_at = (
            record.idle_since + policy.warn_after + timedelta(seconds=record.extension_s)
        )
        seconds += max(0.0, (record.warned_at - clock_warn_at).total_seconds())
    # A pending checkpoint is called off and the next warning announces the new deadline.
    return evolve(
        record,
        extension_s=record.extension_s + seconds,
        warned_at=None,
        checkpoint_status=None,
        checkpoint_requested_at=None,
        checkpoint_failures=0,
        state=WARNED if record.state == CHECKPOINTING else record.state,
    )


def _hard_deadline_announced(decision: Decision) -> bool:
    """The owner was warned of a hard deadline (``max_age_warned_at``, set by its warning) and
    a cull is due: it comes whatever the GPU does, in any state but these. Not while a cell's
    limit comes first (``at_deadline``): ``cull_at`` is then its interrupt, which Extend moves."""
    record = decision.record
    return (
        record.max_age_warned_at is not None
        and decision.cull_at is not None
        and decision.at_deadline is None
        and record.state not in (CULLED, EXEMPT)
    )


def verdict(
    decision: Decision,
    policy: Policy,
    *,
    dry_run: bool = False,
    root_cause: dict | None = None,
    right_size: dict | None = None,
    requests: dict | None = None,
    started_from_line: tuple[LineStart, ...] = (),
    reclaim_withdrawn: datetime | None = None,
) -> Verdict:
    """The verdict (``core.wire.Verdict``), as it rides back on a report's response.
    ``root_cause`` is the governor's diagnosis, ``right_size`` a smaller tier its use fits,
    ``requests`` what the server is asked to do (``hub/outbound.py``; none by default) and
    ``started_from_line`` the owner's other servers the spawn queue started, passed in;
    ``reclaim_withdrawn`` when a reclaim on this server was lifted (said for a while)."""
    record = decision.record
    return Verdict(
        state=record.state,
        idle_since=isoformat(record.idle_since),
        warn_at=isoformat(decision.warn_at),
        cull_at=isoformat(decision.cull_at),
        reason=record.reason,
        hard_deadline=_hard_deadline_announced(decision),
        extensions_left=max(0, policy.max_extensions - record.extensions_used),
        extension_step_s=int(policy.extension_step.total_seconds()),
        extension_reason=policy.extension_reason,
        approval_pending=record.approval_pending,
        policy=policy.name,
        cull_action=policy.cull_action,
        at_deadline=decision.at_deadline,
        policy_change=decision.policy_change,
        reclaim_withdrawn=isoformat(reclaim_withdrawn),
        checkpoint=CHECKPOINT_REQUESTED
        if record.checkpoint_status == CHECKPOINT_REQUESTED
        else "none",
        dry_run=dry_run,
        root_cause=root_cause,
        right_size=right_size,
        requests=requests or {},
        started_from_line=started_from_line,
    )
