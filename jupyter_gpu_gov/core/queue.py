"""The spawn queue's one definition: a waiting request as the profile layer records it, the
order of the line, the estimated wait, and what the profile layer and the governor tell each
other.

A request that admission cannot let in now may wait in line. The profile layer records it in
the waiting server's spawner *state* (``gpu_gov_queue``): only the Hub writes state, so who
waits, for which tier and team, with which choices, since when and until when survives a hub
restart and cannot be forged. The governor starts a request that admission would let in through
the Hub's REST API, as its owner would, with the choices recorded: the spawner decides again from
a fresh count, and keeps only the user's choices (``core.grant.USER_CHOICES``).

The line: a team within its guarantee first, then the team's priority, then arrival
(:func:`rank`). Each pass the governor sends the profile layer when it expects the servers that
hold GPUs to give them back (:class:`Release`, from their deadlines and idle state) and gets the
line back (:class:`Waiting`: position, whether to start it now, the estimated wait, what holds
it back), with how many spawns the hub refused lately for want of a free GPU: the cluster
report's demand (:func:`waiting_for_a_gpu`, :func:`refused_from_json`).

Pure: the standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .clock import isoformat, parse
from .durations import format_duration, parse_duration
from .vocabulary import CLAIM_WITHIN_LABEL, QUEUED_AT_LABEL

QUEUE_STATE = "gpu_gov_queue"  # the spawner-state key of a waiting request
# How a request left the line (the governor's record of it).
STARTED, EXPIRED, CANCELLED = "started", "expired", "cancelled"
OUTCOMES = (STARTED, EXPIRED, CANCELLED)
# The hub scope of the governor's sync with the line (``POST /hub/api/gpu-gov/queue``).
QUEUE_SCOPE = "custom:gpu-gov:queue"

# What held a refused request back (``profiles.quota.Admission.limit``, sent with each request
# in line): the cards (or the line for them), the user's cap, the team's borrowing limit; "" for a
# refusal that waiting cannot change (no such tier, no quota, a tier not offered to the team).
CAPACITY, USER_CAP, BORROWING, LINE = "capacity", "user-cap", "borrowing", "line"
LIMITS = ("", CAPACITY, USER_CAP, BORROWING, LINE)
# Waiting for a free GPU, not for a quota or a policy: the demand that makes partly allocated
# cards fragmentation (``diagnose.cluster.Demand``).
FOR_A_GPU = frozenset({CAPACITY, LINE})
# The hub counts the spawns it refused for want of a free GPU over this window (``refused`` in
# the sync's answer): long enough to see a morning's retries, short enough to be now.
REFUSED_WITHIN = timedelta(hours=1)
MAX_REFUSED = 100_000
# A reading of the cards older than this is not their state now: unknown, never free (the
# workstation's NVML, ``profiles.local.LocalGpus``; the cluster's nodes and pods,
# ``profiles.cluster.ClusterGpus``, and the governor's copy of them, :func:`room_from_json`).
# The Hub's pages show a waiting server's place from the last reading without reading again
# (``queue_pages.places``); every step that counts reads just before (``gpu_refresh``), and
# each governor pass reads them for the line's sync: two passes at their longest (60 s each).
FRESH_FOR_S = 120.0
MAX_NODES = 10_000  # a cluster's nodes in the sync's ``room``; a room of more is not read

# A server the spawn queue started counts as opened once Hub activity comes this long after its
# start (the Hub stamps activity itself while a server starts).
CLAIM_SLACK = timedelta(seconds=60)

# Bounds on what crosses between the hub and the governor: a damaged record is ignored, never
# a reason to fail a pass.
MAX_NAME = 255
MAX_TEXT = 500
MAX_OPTIONS = 32


class QueueFormatError(ValueError):
    """A queue record or message that cannot be read; the message names the field."""


@dataclass(frozen=True)
class QueuedRequest:
    """A server waiting in line for a GPU."""

    user: str
    name: str  # "" for the default server
    team: str
    tier: str
    options: Mapping[str, str]  # the user's choices to start it with (profile, team, ...)
    queued_at: datetime
    expires_at: datetime

    @property
    def server(self) -> str:
        """``user/`` or ``user/name``, as the governor keys servers."""
        return f"{self.user}/{self.name}"

    def live(self, now: datetime) -> bool:
        return now < self.expires_at

    def left(self, outcome: str, now: datetime, why: str = "") -> dict[str, Any]:
        """How it left the line, for the governor's metering (``Departure``); ``why``: what
        its owner reads in the audit trail when the hub took it out."""
        return Departure(
            server=self.server,
            team=self.team,
            tier=self.tier,
            task_type=self.options.get("task_type", ""),
            outcome=outcome,
            waited_s=max(0.0, (now - self.queued_at).total_seconds()),
            why=why[:MAX_TEXT],
        ).to_json()

    def to_json(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "name": self.name,
            "team": self.team,
            "tier": self.tier,
            "options": dict(self.options),
            "queued_at": isoformat(self.queued_at),
            "expires_at": isoformat(self.expires_at),
        }

    @classmethod
    def from_json(cls, data: Any) -> QueuedRequest:
        if not isinstance(data, Mapping):
            raise QueueFormatError("a queued request must be an object")
        options = data.get("options")
        if (
            not isinstance(options, Mapping)
            or len(options) > MAX_OPTIONS
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= MAX_TEXT
                for k, v in options.items()
            )
        ):
            raise QueueFormatError("'options' must map at most 32 names to strings")
        queued_at, expires_at = _time(data, "queued_at"), _time(data, "expires_at")
        if expires_at < queued_at:
            raise QueueFormatError("'expires_at' is before 'queued_at'")
        return cls(
            user=_name(data, "user"),
            name=_name(data, "name", empty=True),
            team=_name(data, "team"),
            tier=_name(data, "tier"),
            options=dict(options),
            queued_at=queued_at,
            expires_at=expires_at,
        )


@dataclass(frozen=True)
class Departure:
    """A request that left the line: started, expired or cancelled, after waiting so long."""

    server: str
    team: str
    tier: str
    task_type: str
    outcome: str
    waited_s: float
    why: str = ""  # the hub's reason, when it took the request out (it can no longer start)

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "team": self.team,
            "tier": self.tier,
            "task_type": self.task_type,
            "outcome": self.outcome,
            "waited_s": self.waited_s,
            "why": self.why,
        }

    @classmethod
    def from_json(cls, data: Any) -> Departure:
        if not isinstance(data, Mapping) or data.get("outcome") not in OUTCOMES:
            raise QueueFormatError(f"a departure's 'outcome' must be one of {OUTCOMES}")
        waited = data.get("waited_s")
        if isinstance(waited, bool) or not isinstance(waited, int | float):
            raise QueueFormatError("'waited_s' must be a number of seconds")
        return cls(
            server=_name(data, "server"),
            team=_name(data, "team"),
            tier=_name(data, "tier"),
            task_type=_text(data.get("task_type"))[:32],
            outcome=data["outcome"],
            waited_s=min(max(0.0, float(waited)), 366 * 86400.0),
            why=_text(data.get("why")),
        )


def from_state(state: Mapping[str, Any] | None) -> QueuedRequest | None:
    """The request a spawner's state records (None: none, or one that cannot be read)."""
    recorded = (state or {}).get(QUEUE_STATE)
    if recorded is None:
        return None
    try:
        return QueuedRequest.from_json(recorded)
    except QueueFormatError:
        return None


def rank(within_guarantee: bool, priority: int, queued_at: datetime, server: str) -> tuple:
    """The sort key of the line: a team within its guarantee first, then higher priority, then
    earlier arrival (the server's name breaks a tie, so the order is total)."""
    return (not within_guarantee, -priority, queued_at, server)


@dataclass(frozen=True)
class Release:
    """When the governor expects a server to give its GPUs back, and why (None: it is in use
    with no deadline)."""

    at: datetime | None
    why: str = ""


@dataclass(frozen=True)
class Estimate:
    """How long a request should wait: ``until`` None when no release is known."""

    until: datetime | None
    why: str

    def wait(self, now: datetime) -> timedelta | None:
        return None if self.until is None else max(timedelta(0), self.until - now)

    def words(self, now: datetime) -> str:
        wait = self.wait(now)
        if wait is None:
            return self.why
        about = (
            "any moment now" if wait < timedelta(minutes=1) else f"about {format_duration(wait)}"
        )
        return f"{about} ({self.why})" if self.why else about


def estimate(position: int, releases: Sequence[Release], now: datetime) -> Estimate:
    """The wait of the ``position``-th in line (1: next) for GPUs held by servers with these
    expected releases: the ``position``-th earliest known release. Servers in use with no
    deadline free their GPUs at an unknown time: then there is no estimate, and it says so."""
    known = sorted((r for r in releases if r.at is not None), key=lambda r: r.at)
    return estimate_known(position, known, len(releases), now)


def estimate_known(position: int, known: Sequence[Release], count: int, now: datetime) -> Estimate:
    """``estimate`` from ``count`` servers' known releases, sorted earliest first."""
    if position < 1 or not count:
        return Estimate(now, "")
    if len(known) < position:
        return Estimate(
            None,
            "no estimate: the GPUs it waits for are in use, with no deadline in sight",
        )
    release = known[position - 1]
    return Estimate(max(release.at, now), release.why)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class Waiting:
    """A request in line as the profile layer sees it now: the sync's answer."""

    request: QueuedRequest
    position: int  # in the line of its tier; 1: next
    ready: bool  # admission lets it in now: the governor starts it
    reason: str  # why it waits (admission's sentence)
    within_guarantee: bool = False
    priority: int = 0
    until: datetime | None = None  # the estimate (None: none known)
    estimate: str = ""  # the estimate in words
    sooner: tuple[str, ...] = field(default_factory=tuple)  # smaller tiers free now
    limit: str | None = None  # what holds it back (LIMITS); None: not said (an older hub)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.request.to_json(),
            "position": self.position,
            "ready": self.ready,
            "reason": self.reason,
            "within_guarantee": self.within_guarantee,
            "priority": self.priority,
            "estimate_until": isoformat(self.until),
            "estimate": self.estimate,
            "sooner": list(self.sooner),
            "limit": self.limit,
        }

    @classmethod
    def from_json(cls, data: Any) -> Waiting:
        request = QueuedRequest.from_json(data)
        position, priority = data.get("position"), data.get("priority", 0)
        if not _whole(position) or position < 1 or not _whole(priority):
            raise QueueFormatError("'position' must be a whole number >= 1, 'priority' whole")
        sooner = data.get("sooner") or []
        if not isinstance(sooner, list) or not all(_short(s) for s in sooner[:16]):
            raise QueueFormatError("'sooner' must be a list of tier names")
        until, limit = data.get("estimate_until"), data.get("limit")
        if limit is not None and limit not in LIMITS:
            raise QueueFormatError(f"'limit' must be one of {LIMITS} or null")
        return cls(
            request=request,
            position=position,
            ready=data.get("ready") is True,
            reason=_text(data.get("reason")),
            within_guarantee=data.get("within_guarantee") is True,
            priority=priority,
            until=None if until is None else _time(data, "estimate_until"),
            estimate=_text(data.get("estimate")),
            sooner=tuple(sooner[:16]),
            limit=limit,
        )


def waiting_for_a_gpu(line: Sequence[Waiting]) -> int | None:
    """How many requests in ``line`` wait for a free GPU (``FOR_A_GPU``), not for a quota or a
    policy; None when one that waits does not say what for (an older hub): the count would
    then be a guess."""
    waiting = [w for w in line if not w.ready]
    if any(w.limit is None for w in waiting):
        return None
    return sum(w.limit in FOR_A_GPU for w in waiting)


def refused_from_json(value: Any) -> int | None:
    """The sync answer's ``refused`` (None: an older hub, which does not count them)."""
    if value is None:
        return None
    if not _whole(value) or not 0 <= value <= MAX_REFUSED:
        raise QueueFormatError(f"'refused' must be a whole number from 0 to {MAX_REFUSED}")
    return value


def room_from_json(value: Any) -> dict | None:
    """The sync answer's ``room`` (None: a hub with no cluster to read, a workstation's, or an
    older one): where a spawn waiting for a GPU could go now, from the cluster reading that
    admission counts on (``profiles.cluster.room``). ``unknown``: why there is no fresh reading
    (then nothing else counts); ``read_age_s``: how old the reading was at the answer;
    ``nodes``: per node, the devices free of each tier's resource; ``tiers``: per tier spawns
    wait for, its ``resource``, the ``count`` one server asks for, the ``nodes`` its pods could
    land on (those with one free; ``nodes_total``: all of them, as many when not said), and
    its ``pool`` (null: none that grows); ``pools``: per pool, the devices an autoscaler may
    still add to it; ``node_devices``: per pool given by its node shape, the devices of one
    node (those it may add come whole: a server's devices are on one node; absent from an
    older hub: devices alone); ``refused``: per tier, the spawns counted in ``refused``. Raises
    ``QueueFormatError``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise QueueFormatError("'room' must be an object")
    unknown = value.get("unknown")
    if unknown is not None and not isinstance(unknown, str):
        raise QueueFormatError("'room.unknown' must be text or null")
    age = value.get("read_age_s")
    if age is not None and not (
        isinstance(age, int | float) and not isinstance(age, bool) and 0 <= age < 1e9
    ):
        raise QueueFormatError("'room.read_age_s' must be a number of seconds or null")
    room: dict[str, Any] = {
        "unknown": _text(unknown) or None if unknown is not None else None,
        "read_age_s": None if age is None else float(age),
    }
    nodes = _names_to(value.get("nodes"), "room.nodes", MAX_NODES)
    room["nodes"] = {
        node: {r: n for r, n in _names_to(free, f"room.nodes.{node}", 100).items() if _count(n)}
        for node, free in nodes.items()
    }
    tiers = {}
    for name, tier in _names_to(value.get("tiers"), "room.tiers", 1000).items():
        on = tier.get("nodes") if isinstance(tier, Mapping) else None
        if not (
            isinstance(tier, Mapping)
            and _short(tier.get("resource"))
            and _count(tier.get("count"))
            and tier["count"] > 0
            and isinstance(on, list)
            and len(on) <= MAX_NODES
            and all(_short(n) for n in on)
        ):
            raise QueueFormatError(f"'room.tiers.{name}' needs a resource, a count and nodes")
        total, pool = tier.get("nodes_total", len(on)), tier.get("pool")
        if not (_count(total) and total >= len(on) and (pool is None or _short(pool))):
            raise QueueFormatError(f"'room.tiers.{name}' has a bad nodes_total or pool")
        tiers[name] = {
            "resource": tier["resource"],
            "count": tier["count"],
            "nodes": list(on),
            "nodes_total": total,
            "pool": pool,
        }
    room["tiers"] = tiers
    pools = _names_to(value.get("pools"), "room.pools", 1000)
    if not all(_count(n) for n in pools.values()):
        raise QueueFormatError("'room.pools' must count devices per pool")
    room["pools"] = dict(pools)
    per_node = _names_to(value.get("node_devices"), "room.node_devices", 1000)
    if not all(_count(n) and n > 0 for n in per_node.values()):
        raise QueueFormatError("'room.node_devices' must count a node's devices per pool")
    room["node_devices"] = dict(per_node)
    refused = _names_to(value.get("refused"), "room.refused", 1000)
    if not all(_count(n) for n in refused.values()) or sum(refused.values()) > MAX_REFUSED:
        raise QueueFormatError(
            f"'room.refused' must count spawns per tier, at most {MAX_REFUSED} in all"
        )
    room["refused"] = dict(refused)
    return room


def room_for_from_json(value: Any) -> list[str] | None:
    """The governor's sync's ``room_for``: the tiers of the spawns it saw the Hub starting,
    for which the hub says the cluster's ``room`` (beside those in line and refused). None:
    not said (an older governor), then the hub says every tier's. Raises
    ``QueueFormatError``."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > 1000 or not all(map(_short, value)):
        raise QueueFormatError("'room_for' must list at most 1000 tier names")
    return list(value)


def _names_to(value: Any, what: str, most: int) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > most or not all(map(_short, value)):
        raise QueueFormatError(f"{what!r} must map at most {most} names")
    return value


def _count(value: Any) -> bool:
    return _whole(value) and 0 <= value <= MAX_REFUSED * 10


def claim_by(
    labels: Mapping[str, str],
    started: datetime | None,
    user_last_activity: datetime | None,
    hub_last_activity: datetime | None,
) -> datetime | None:
    """Until when its owner may open a server the spawn queue started on their behalf before
    it is given back (its grant's ``gpu-gov/claim-within`` after its start); None when it did
    not start from the line, was opened already (a person's request to a kernel or terminal,
    in its report; or Hub activity after its start), or the label cannot be read. From the
    grant and the Hub: a user's choices cannot make a server look started from the line."""
    within = labels.get(CLAIM_WITHIN_LABEL)
    if not within or QUEUED_AT_LABEL not in labels or started is None:
        return None
    if user_last_activity is not None or (
        hub_last_activity is not None and hub_last_activity > started + CLAIM_SLACK
    ):
        return None
    try:
        return started + parse_duration(within)
    except ValueError:
        return None


def releases_to_json(releases: Mapping[str, Release]) -> dict[str, Any]:
    return {key: {"at": isoformat(r.at), "why": r.why} for key, r in releases.items()}


def releases_from_json(data: Any, limit: int = 100_000) -> dict[str, Release]:
    """The governor's forecast (server key → release); entries that cannot be read are left
    out (a forecast only informs an estimate)."""
    if not isinstance(data, Mapping):
        raise QueueFormatError("'releases' must be an object of server: release")
    releases = {}
    for key, entry in list(data.items())[:limit]:
        if not _short(key) or not isinstance(entry, Mapping):
            continue
        releases[key] = Release(_parse(entry.get("at")), _text(entry.get("why")))
    return releases


def _time(data: Mapping, key: str) -> datetime:
    when = _parse(data.get(key))
    if when is None:
        raise QueueFormatError(f"{key!r} must be an ISO 8601 time")
    return when


def _name(data: Mapping, key: str, empty: bool = False) -> str:
    value = data.get(key)
    if not isinstance(value, str) or len(value) > MAX_NAME or not (value or empty):
        raise QueueFormatError(f"{key!r} must be a name of at most {MAX_NAME} characters")
    return value


def _short(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**31


def _parse(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return parse(value)
    except ValueError:
        return None


def whole_ms(when: datetime) -> datetime:
    """``when`` to the millisecond, as records write it (a time read back compares equal)."""
    return when.replace(microsecond=when.microsecond // 1000 * 1000)
