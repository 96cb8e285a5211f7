"""The governor's policy engine (DESIGN §6): pure, no I/O, time passed in.

``decide(view, record, policy, now)`` looks at what is known of one server this cycle (the
``ServerView``) and what the governor remembered of it (the ``Record``), and returns the new
record, the state a person would read, the deadlines, and the actions to take. The live service
and ``jupyter-gpu-gov replay`` both call it, so a replay shows exactly what the service would do.

States: ``active → idle → warned → checkpointing → culled``, plus ``exempt`` and ``unknown``.
Unknown GPU data never leads to a cull on GPU grounds.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from .clock import parse as parse_time
from .durations import format_duration, parse_duration

EXEMPT_LABEL = "gpu-gov/exempt"
# The tier's maximum age in seconds, set by the profile layer at admission.
MAX_AGE_LABEL = "gpu-gov/max-age"
# Set by the profile layer on a borrowed server when a team within its guarantee is refused for
# want of the cards borrowers hold: when it was asked (ISO 8601), and for which team.
RECLAIM_LABEL, RECLAIM_FOR_LABEL = "gpu-gov/reclaim", "gpu-gov/reclaim-for"
BORROWED_LABEL = "gpu-gov/borrowed"
LABEL_PREFIX = "gpu-gov/"

ACTIVE, IDLE, WARNED, CHECKPOINTING, CULLED, EXEMPT, UNKNOWN = (
    "active",
    "idle",
    "warned",
    "checkpointing",
    "culled",
    "exempt",
    "unknown",
)

# Actions the service carries out (each idempotent, each audited with the decision's reason).
WARN, CHECKPOINT, CULL = "warn", "checkpoint", "cull"
# Warnings of a cull that GPU activity cannot put off.
MAX_AGE_WARN, RECLAIM_WARN = "max-age-warn", "reclaim-warn"


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

    def matches(self, view: ServerView) -> bool:
        return (
            (not self.profiles or view.profile in self.profiles)
            and (not self.tiers or view.tier in self.tiers)
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
    # Of GPU idleness; the warning's lead is cull_after - warn_after. With the holds below and
    # ``away_after``, this reclaims 95 % of the idle-held GPU-hours of a month of notebooks
    # (benchmarks/replay) and cuts no live work there; two hours reclaimed 90 %.
    warn_after: timedelta = timedelta(minutes=30)
    cull_after: timedelta = timedelta(hours=1)
    user_activity_grace: timedelta = timedelta(minutes=15)
    # An owner who has not interacted with the server for this long is away: when its GPU goes
    # idle (a training run or a "run all" finished unattended) the warning goes out at once and
    # the cull follows after the notice. ``warn_after`` spares a person at the notebook warnings
    # about short pauses; nobody is there to spare. None: the clock is the same for everyone.
    away_after: timedelta | None = timedelta(hours=2)
    # How long a running cell may leave its GPU idle (a CPU stage before its next GPU stage),
    # from when the GPU went idle: CPU stages of an hour or more are common in pipelines.
    busy_grace: timedelta = timedelta(hours=2)
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
    cull_action: str = "stop-server"  # or "shutdown-kernels"
    exempt: bool = False
    # jupyterhub-idle-culler's rule for servers with no GPU data: no report, no DCGM (None: never
    # cull them).
    inactive_timeout: timedelta | None = timedelta(hours=1)

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
}
_CHOICES = {
    "extension_reason": ("optional", "required"),
    "on_checkpoint_failure": ("postpone", "proceed"),
    "cull_action": ("stop-server", "shutdown-kernels"),
}
_MATCH_KEYS = {f.name for f in fields(Match)}
_POLICY_KEYS = {f.name for f in fields(Policy)}


class PolicyError(ValueError):
    """A policy entry that cannot be used; the message names the entry and the key."""


def load_policies(entries: Iterable[Mapping], defaults: Mapping | None = None) -> list[Policy]:
    """Validate admin-written policy dicts into ``Policy`` objects (first match wins).

    ``defaults`` fill every key an entry leaves out. A catch-all ``default`` policy built from
    the defaults is appended unless the last entry already matches everything.
    """
    base = _policy("defaults", dict(defaults or {}), Policy())
    policies = []
    names = set()
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise PolicyError(f"policy {index}: expected a dict, got {type(entry).__name__}")
        label = f"policy {index} ({entry.get('name', '?')!r})"
        if not entry.get("name") or not isinstance(entry["name"], str):
            raise PolicyError(f"policy {index}: 'name' is required (a non-empty string)")
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
        raise PolicyError(f"{label}: unknown key {sorted(unknown)[0]!r}")
    values = {}
    for key, value in entry.items():
        try:
            values[key] = _convert(key, value)
        except (TypeError, ValueError) as error:
            raise PolicyError(f"{label}: {error}") from None
    policy = replace(base, **values)
    if policy.cull_after < policy.warn_after:
        raise PolicyError(f"{label}: 'cull_after' must not be shorter than 'warn_after'")
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
                criteria[k] = {str(a): str(b) for a, b in v.items()}
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
            if value is None and key in ("max_age", "inactive_timeout", "away_after")
            else parse_duration(value, repr(key))
        )
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            raise ValueError(f"{key!r} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
        return value
    if key == "idle_threshold":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ValueError(f"'idle_threshold' must be a number in [0, 1], got {value!r}")
        return float(value)
    if key == "max_extensions":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"'max_extensions' must be a whole number >= 0, got {value!r}")
        return value
    if key in ("checkpoint", "exempt"):
        if not isinstance(value, bool):
            raise ValueError(f"{key!r} must be true or false, got {value!r}")
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
    ``__post_init__``): copies the instance's fields rather than calling ``__init__``, 0.6 µs
    against 6 µs; a pass makes about five per server."""
    fields_ = obj.__dict__
    if not changes.keys() <= fields_.keys():
        raise TypeError(
            f"{type(obj).__name__} has no field {sorted(changes.keys() - fields_.keys())}"
        )
    new = object.__new__(type(obj))
    new.__dict__.update(fields_)
    new.__dict__.update(changes)
    return new


# -- what is known of a server -----------------------------------------------------------------


@dataclass(frozen=True)
class GpuSignal:
    """The server's GPU this cycle, after merging its report with any trusted source."""

    holds_gpu: bool  # it holds a GPU (an allocation, or a context for shutdown-kernels)
    active: bool | None  # None: unknown (no data, stale data, an API that cannot say)
    idle_since: datetime | None = None  # when the current idle stretch began, if known
    kernel_busy_since: datetime | None = None  # a GPU-holding kernel is executing a cell
    # A report shows running cells; a trusted source alone (DCGM, for a server without the
    # extension) cannot, and then the policy assumes one runs (it holds a cull for busy_grace).
    sees_cells: bool = True
    detail: str = ""  # for reasons: where the evidence came from, disagreements


@dataclass(frozen=True)
class ServerView:
    user: str
    name: str = ""
    profile: str | None = None
    tier: str | None = None
    team: str | None = None
    project: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    started: datetime | None = None
    hub_last_activity: datetime | None = None  # what jupyterhub-idle-culler looks at
    user_last_activity: datetime | None = None  # people's interaction, not API polling or GPU
    reports: bool = False  # the server sends GPU reports
    gpu: GpuSignal | None = None  # None when it sends none (or they went stale)

    @property
    def key(self) -> str:
        return f"{self.user}/{self.name}"


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


@dataclass(frozen=True)
class Record:
    state: str = ACTIVE
    idle_since: datetime | None = None
    warned_at: datetime | None = None  # the warning for the current deadline went out
    extension_s: float = 0.0  # granted this idle stretch (by the owner, or an admin)
    extensions_used: int = 0
    approval_pending: bool = False
    postponed_until: datetime | None = None  # after a failed checkpoint (on_checkpoint_failure)
    checkpoint_status: str | None = None  # requested | done | failed | timeout
    checkpoint_requested_at: datetime | None = None
    max_age_warned_at: datetime | None = None
    paused_at: datetime | None = None  # GPU data became unknown: the idle clock stopped here
    exempt_until: datetime | None = None  # an admin grant
    culled_at: datetime | None = None
    reason: str = ""

    def new_idle_stretch(self) -> Record:
        """GPU work resumed: deadlines, warnings and extensions start over."""
        return evolve(
            self,
            idle_since=None,
            warned_at=None,
            extension_s=0.0,
            extensions_used=0,
            approval_pending=False,
            postponed_until=None,
            checkpoint_status=None,
            checkpoint_requested_at=None,
            paused_at=None,
        )


@dataclass(frozen=True)
class Decision:
    record: Record
    actions: tuple[str, ...] = ()
    warn_at: datetime | None = None
    cull_at: datetime | None = None
    cull_reason: str | None = None  # gpu-idle | max-age | reclaim | inactive | admin
    notice: str | None = None  # what a max-age or reclaim warning tells the user

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


def _hard_deadline(policy: Policy, view: ServerView):
    """The earliest cull that GPU activity cannot put off — the maximum age, or a reclaim of a
    borrowed GPU — as (when, warn from, why, cull reason); None when there is none."""
    found = []
    max_age, whose = max_age_of(policy, view)
    if max_age and view.started:
        at = view.started + max_age
        why = f"reached the maximum age of {format_duration(max_age)} for this {whose}"
        found.append((at, at - policy.max_age_warning, why, "max-age"))
    asked = _timestamp(view.labels.get(RECLAIM_LABEL))
    if asked is not None and view.labels.get(BORROWED_LABEL) == "true":
        team = view.labels.get(RECLAIM_FOR_LABEL) or "another team"
        why = f"team {team}, within its guarantee, needs this borrowed GPU back"
        found.append((asked + policy.reclaim_grace, asked, why, "reclaim"))
    return min(found, key=lambda d: d[0]) if found else None


def _timestamp(value: str | None) -> datetime | None:
    try:
        return parse_time(value) if value else None
    except ValueError:
        return None


def decide(view: ServerView, record: Record, policy: Policy, now: datetime) -> Decision:
    if record.state == CULLED:
        return Decision(record)  # idempotent: the service already acted

    if _is_exempt(view, record, policy, now):
        why = (
            f"exempt by policy {policy.name!r}"
            if policy.exempt
            else f"exempt until {record.exempt_until:%Y-%m-%d %H:%M} UTC"
            if record.exempt_until and now < record.exempt_until
            else f"exempt by label {EXEMPT_LABEL}"
        )
        return Decision(evolve(record.new_idle_stretch(), state=EXEMPT, reason=why))

    actions: list[str] = []
    notice = None
    deadline = _hard_deadline(policy, view)
    if deadline is not None:
        at, warn_from, why, cull_reason = deadline
        if now >= at:
            return _cull_with_checkpoint(record, policy, now, why, cull_reason, at, at)
        warned = record.max_age_warned_at
        if now >= warn_from and (warned is None or warned < warn_from):
            actions.append(RECLAIM_WARN if cull_reason == "reclaim" else MAX_AGE_WARN)
            record = evolve(record, max_age_warned_at=now)
            notice = (
                f"{why}: it will be given back at {at:%H:%M} UTC"
                if cull_reason == "reclaim"
                else f"{why.replace('reached', 'will reach')} at {at:%H:%M} UTC"
            )
    decision = _decide_on_activity(view, record, policy, now, actions)
    return evolve(decision, notice=notice) if notice else decision


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
    away = policy.away_after is not None and back is not None and now - back >= policy.away_after
    first_stage = timedelta(0) if away else policy.warn_after  # an away owner is warned at once
    cull_at = idle_since + first_stage + policy.notice + timedelta(seconds=record.extension_s)
    warn_at = cull_at - policy.notice
    holds = []
    grace = policy.user_activity_grace
    if record.warned_at is not None and back is not None and back > record.warned_at:
        # The owner came back after the warning went out: they get its full notice from their
        # last interaction, not a short grace (the warning may have been sent while they were away).
        grace = max(grace, policy.notice)
    # A running cell may leave its GPU idle for ``busy_grace`` (a CPU stage before its next GPU
    # stage), counted from when the GPU went idle under it: one long cell, or a "run all",
    # keeps the kernel busy for hours, and its CPU stages come late.
    # Without a report nobody can tell whether a cell runs: one is assumed to.
    busy_since = gpu.kernel_busy_since if gpu.sees_cells else idle_since
    busy = busy_since and max(busy_since, idle_since)
    running = "a kernel is executing a cell" if gpu.sees_cells else "a cell may be running"
    for not_before, what in (
        (_plus(back, grace), "recent user activity"),
        (_plus(busy, policy.busy_grace), running),
        (record.postponed_until, "a failed checkpoint"),
    ):
        if not_before is not None and not_before > cull_at:
            cull_at = not_before
            holds.append(what)
    if record.warned_at is not None:
        cull_at = max(cull_at, record.warned_at + policy.notice)  # every warning gets its notice

    if now < warn_at and record.warned_at is None:
        why = idle
        return Decision(evolve(record, state=IDLE, reason=why), tuple(actions), warn_at, cull_at)

    if record.warned_at is None:
        actions.append(WARN)
        record = evolve(record, warned_at=now)
        cull_at = max(cull_at, now + policy.notice)
    if now < cull_at:
        why = f"{idle}; {_cull_words(policy)} at {_at(cull_at)} unless extended"
        if away:
            why += f" (nobody has used the notebook since {_at(back)})"
        if holds:
            why += f" (held back by {', '.join(holds)})"
        return Decision(evolve(record, state=WARNED, reason=why), tuple(actions), warn_at, cull_at)

    why = f"{idle} (policy {policy.name!r}: cull after {format_duration(policy.cull_after)})"
    final = f"GPU idle for {format_duration(now - idle_since)}" + why[len("GPU idle") :]
    decision = _cull_with_checkpoint(record, policy, now, why, "gpu-idle", warn_at, cull_at, final)
    return evolve(decision, actions=tuple(actions) + decision.actions)


def _resume(record: Record, now: datetime) -> Record:
    """Known again after an unknown stretch: move the idle clock's marks past the pause."""
    pause = now - record.paused_at
    return evolve(
        record,
        paused_at=None,
        idle_since=_plus(record.idle_since, pause),
        warned_at=_plus(record.warned_at, pause),
        postponed_until=_plus(record.postponed_until, pause),
    )


def _at(when: datetime) -> str:
    return f"{when:%Y-%m-%d %H:%M} UTC"


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
    return Decision(record, (*actions, CULL), None, deadline, "inactive")


def _cull_with_checkpoint(
    record: Record,
    policy: Policy,
    now: datetime,
    why: str,
    cull_reason: str,
    warn_at: datetime | None,
    cull_at: datetime,
    final: str | None = None,
) -> Decision:
    """Checkpoint first when the policy says so; then cull, or postpone on failure.

    ``why`` explains the waiting states; ``final`` (default ``why``) is the cull's own reason."""
    if policy.checkpoint:
        status = record.checkpoint_status
        if (
            status == "requested"
            and now - record.checkpoint_requested_at >= policy.checkpoint_timeout
        ):
            status = "timeout"
        if status is None:
            record = evolve(
                record,
                state=CHECKPOINTING,
                checkpoint_status="requested",
                checkpoint_requested_at=now,
                reason=f"{why}; saving a checkpoint before the cull",
            )
            return Decision(record, (CHECKPOINT,), warn_at, cull_at, cull_reason)
        if status == "requested":
            record = evolve(
                record, state=CHECKPOINTING, reason=f"{why}; waiting for the checkpoint"
            )
            return Decision(record, (), warn_at, cull_at, cull_reason)
        if status in ("failed", "timeout") and policy.on_checkpoint_failure == "postpone":
            # Do not lose work: warn again, and retry the checkpoint after another notice.
            new_cull = now + max(policy.notice, policy.checkpoint_timeout)
            record = evolve(
                record,
                state=WARNED,
                postponed_until=new_cull,
                checkpoint_status=None,
                warned_at=now,
                reason=f"{why}; checkpoint {status}: cull postponed to {_at(new_cull)}",
            )
            return Decision(record, (WARN,), warn_at, new_cull, cull_reason)
        why = final or why
        if status in ("failed", "timeout"):
            why = f"{why}; checkpoint {status}, culling anyway (on_checkpoint_failure=proceed)"
        else:
            why = f"{why}; checkpoint saved"
    else:
        why = final or why
    record = evolve(record, state=CULLED, culled_at=now, reason=why)
    return Decision(record, (CULL,), warn_at, cull_at, cull_reason)


def _cull_words(policy: Policy) -> str:
    return "kernels shut down" if policy.cull_action == "shutdown-kernels" else "server stopped"


# -- extensions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtensionOutcome:
    record: Record
    status: str  # granted | pending | refused
    message: str


def extend(record: Record, policy: Policy, reason: str | None) -> ExtensionOutcome:
    """The owner asks for more time. Within ``max_extensions`` it is granted at once; beyond,
    it waits for an admin."""
    if record.state not in (IDLE, WARNED, CHECKPOINTING):
        return ExtensionOutcome(
            record, "refused", f"nothing to extend: the server is {record.state}"
        )
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
    record = _grant(record, policy.extension_step.total_seconds())
    record = evolve(record, extensions_used=record.extensions_used + 1)
    left = policy.max_extensions - record.extensions_used
    return ExtensionOutcome(
        record, "granted", f"extended by {format_duration(policy.extension_step)}; {left} left"
    )


def approve(record: Record, seconds: float) -> Record:
    """An admin grants ``seconds`` more (beyond the owner's own extensions)."""
    return evolve(_grant(record, seconds), approval_pending=False)


def deny(record: Record) -> Record:
    return evolve(record, approval_pending=False)


def _grant(record: Record, seconds: float) -> Record:
    # A pending checkpoint is called off and the next warning announces the new deadline.
    return evolve(
        record,
        extension_s=record.extension_s + seconds,
        warned_at=None,
        checkpoint_status=None,
        checkpoint_requested_at=None,
        state=WARNED if record.state == CHECKPOINTING else record.state,
    )


def verdict(
    decision: Decision, policy: Policy, *, dry_run: bool = False, root_cause: dict | None = None
) -> dict:
    """The verdict of DESIGN §5, as it rides back on a report's response. ``root_cause`` is the
    governor's diagnosis (``{"label", "hint", "contributions", "source"}``), passed in: it
    explains, it never decides."""
    from .clock import isoformat

    record = decision.record
    return {
        "state": record.state,
        "idle_since": isoformat(record.idle_since),
        "warn_at": isoformat(decision.warn_at),
        "cull_at": isoformat(decision.cull_at),
        "reason": record.reason,
        "extensions_left": max(0, policy.max_extensions - record.extensions_used),
        "extension_step_s": int(policy.extension_step.total_seconds()),
        "extension_reason": policy.extension_reason,
        "approval_pending": record.approval_pending,
        "policy": policy.name,
        "cull_action": policy.cull_action,
        "checkpoint": "requested" if record.checkpoint_status == "requested" else "none",
        "max_age_at": None,
        "dry_run": dry_run,
        "root_cause": root_cause,
    }
