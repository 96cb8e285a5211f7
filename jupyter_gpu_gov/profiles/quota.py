"""Team quotas with Kueue's semantics, and admission as a pure function.

Per team and tier: a *guaranteed* number of devices (Kueue's nominal quota), a *borrowing limit*
beyond it from what others leave unused (absent: no limit, as in Kueue), and a *lending limit*
(absent: all of the team's unused guarantee may be lent). Per team: an optional per-user cap in
GPU-equivalents and a priority. Borrowed grants are labelled; a team within its guarantee that
finds the cards taken by borrowers may reclaim them (Kueue's ``reclaimWithinCohort: Any``), and a
borrowing team may reclaim what lower-priority teams borrowed::

    load_quotas({
        "vision": {"guaranteed": {"h100": 4}, "borrowing_limit": {"h100": 2}, "user_cap": 2},
        "nlp": {"guaranteed": {"h200-1g": 8}, "tiers": ["h200-1g", "h100"], "priority": 10},
    }, tiers)

``admit(request, usage, capacity, quotas, tiers)`` says yes or no with a sentence a researcher can
act on. Pure: no JupyterHub or Kubernetes imports.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# What held a refused request back (``Admission.limit``): defined with the queue's records,
# which carry it to the governor.
from ..core.queue import BORROWING, CAPACITY, USER_CAP
from ..core.text import in_sentence, listed
from ..core.traits import check_number
from .tiers import (
    MAX_TIER_DEVICES,
    Tier,
    card_sharing,
    check_entry,
    frees_cards_for,
    may_free_cards_for,
)

_EPS = 1e-9
MAX_TEAM_GPUS = 1e6  # a user's cap, in GPU-equivalents: a million cards
MAX_PRIORITY = 1_000_000  # a team's priority, either way
_KEYS = {"guaranteed", "borrowing_limit", "lending_limit", "tiers", "user_cap", "priority"}


class QuotaError(ValueError):
    """A quota entry that cannot be used; the message names the team and the key."""


@dataclass(frozen=True)
class TeamQuota:
    team: str
    tiers: frozenset[str]  # the tiers this team may ask for
    guaranteed: Mapping[str, int] = field(default_factory=dict)  # devices per tier
    borrowing_limit: Mapping[str, int] = field(default_factory=dict)  # absent: unlimited
    lending_limit: Mapping[str, int] = field(default_factory=dict)  # absent: all unused
    user_cap: float | None = None  # GPU-equivalents one user may hold at once
    priority: int = 0


@dataclass(frozen=True)
class Grant:
    """A server that holds (or is starting on) GPUs of a tier."""

    server: str  # "user/" or "user/name"
    user: str
    team: str
    tier: str
    devices: int
    weight: float  # GPU-equivalents
    borrowed: bool = False
    priority: int = 0
    started: datetime | None = None


class Held:
    """Grants indexed as admission counts them: per tier and team, by user, by server, and the
    borrowed ones per tier; on top of ``base`` (an index shared, not copied) when given. The
    spawn queue's line admits each request waiting with those let in ahead added as it goes:
    from an index that is O(waiting + held), from the list of grants O(waiting x held)."""

    def __init__(self, grants: Iterable[Grant] = (), base: Held | None = None) -> None:
        self.base = base
        self.grants: list[Grant] = []  # these, without the base's
        self._devices: dict[tuple[str, str | None], int] = {}  # (tier, team); team None: all
        self._users: dict[str, list[Grant]] = {}
        self._servers: dict[str, list[Grant]] = {}
        self._borrowed: dict[str, list[Grant]] = {}
        for grant in grants:
            self.add(grant)

    def add(self, grant: Grant) -> None:
        self.grants.append(grant)
        devices = self._devices
        for key in ((grant.tier, grant.team), (grant.tier, None)):
            devices[key] = devices.get(key, 0) + grant.devices
        self._users.setdefault(grant.user, []).append(grant)
        self._servers.setdefault(grant.server, []).append(grant)
        if grant.borrowed:
            self._borrowed.setdefault(grant.tier, []).append(grant)

    def devices(self, tier: str, team: str | None = None, but: str = "") -> int:
        """Devices held on ``tier`` (by ``team``; None: by all), server ``but``'s left out."""
        count = self._devices.get((tier, team), 0)
        for grant in self._servers.get(but, ()):
            if grant.tier == tier and (team is None or grant.team == team):
                count -= grant.devices
        return count + (self.base.devices(tier, team, but) if self.base else 0)

    def of_user(self, user: str) -> list[Grant]:
        return [*(self.base.of_user(user) if self.base else ()), *self._users.get(user, ())]

    def borrowed(self, tier: str) -> list[Grant]:
        return [*(self.base.borrowed(tier) if self.base else ()), *self._borrowed.get(tier, ())]


class Counted(Held):
    """Grants by key (a server's database row), put and dropped one at a time: the hub's count
    kept between spawns (``profiles/grant_count.py``). Read as ``Held`` reads, in key order
    whatever the order of the changes; ``without(key)``: the same, that key's grant left out
    (a server's own row, which its admission does not count)."""

    def __init__(self) -> None:
        self.base = None
        self._by_key: dict[Any, Grant] = {}
        self._devices: dict[tuple[str, str | None], int] = {}
        self._users: dict[str, dict[Any, Grant]] = {}
        self._servers: dict[str, dict[Any, Grant]] = {}
        self._borrowed: dict[str, dict[Any, Grant]] = {}
        self._sorted: list[Grant] | None = None

    def add(self, grant: Grant) -> None:
        raise TypeError("a Counted index is changed by key: put(key, grant)")

    def get(self, key) -> Grant | None:
        return self._by_key.get(key)

    def keys(self):
        return self._by_key.keys()

    def put(self, key, grant: Grant | None) -> None:
        """``key`` now holds ``grant`` (None: nothing)."""
        if self._by_key.get(key) == grant:
            return
        self.drop(key)
        if grant is None:
            return
        self._by_key[key] = grant
        for k in ((grant.tier, grant.team), (grant.tier, None)):
            self._devices[k] = self._devices.get(k, 0) + grant.devices
        self._users.setdefault(grant.user, {})[key] = grant
        self._servers.setdefault(grant.server, {})[key] = grant
        if grant.borrowed:
            self._borrowed.setdefault(grant.tier, {})[key] = grant
        self._sorted = None

    def drop(self, key) -> None:
        grant = self._by_key.pop(key, None)
        if grant is None:
            return
        for k in ((grant.tier, grant.team), (grant.tier, None)):
            left = self._devices.get(k, 0) - grant.devices
            if left:
                self._devices[k] = left
            else:
                self._devices.pop(k, None)
        for index, name in (
            (self._users, grant.user),
            (self._servers, grant.server),
            (self._borrowed, grant.tier),
        ):
            held = index.get(name)
            if held is not None and held.pop(key, None) is not None and not held:
                del index[name]
        self._sorted = None

    @property
    def grants(self) -> list[Grant]:  # type: ignore[override]
        if self._sorted is None:
            self._sorted = [self._by_key[k] for k in sorted(self._by_key)]
        return self._sorted

    def __iter__(self):
        return iter(self.grants)

    def __len__(self) -> int:
        return len(self._by_key)

    def devices(self, tier: str, team: str | None = None, but: str = "") -> int:
        count = self._devices.get((tier, team), 0)
        for grant in self._servers.get(but, {}).values():
            if grant.tier == tier and (team is None or grant.team == team):
                count -= grant.devices
        return count

    def of_user(self, user: str) -> list[Grant]:
        held = self._users.get(user, {})
        return [held[k] for k in sorted(held)]

    def borrowed(self, tier: str) -> list[Grant]:
        held = self._borrowed.get(tier, {})
        return [held[k] for k in sorted(held)]

    def without(self, key) -> Held:
        own = self._by_key.get(key)
        return self if own is None else _Without(self, own)


class _Without(Held):
    """A ``Counted`` index read without one of its grants."""

    def __init__(self, counted: Counted, own: Grant) -> None:
        self.base, self._counted, self._own = None, counted, own

    def add(self, grant: Grant) -> None:
        raise TypeError("read-only: layer a Held on it")

    @property
    def grants(self) -> list[Grant]:  # type: ignore[override]
        return [g for g in self._counted.grants if g is not self._own]

    def __iter__(self):
        return iter(self.grants)

    def __len__(self) -> int:
        return len(self._counted) - 1

    def devices(self, tier: str, team: str | None = None, but: str = "") -> int:
        count, own = self._counted.devices(tier, team, but), self._own
        if own.server != but and own.tier == tier and (team is None or own.team == team):
            count -= own.devices  # (a grant of server ``but`` is already left out)
        return count

    def of_user(self, user: str) -> list[Grant]:
        return [g for g in self._counted.of_user(user) if g is not self._own]

    def borrowed(self, tier: str) -> list[Grant]:
        return [g for g in self._counted.borrowed(tier) if g is not self._own]


def indexed(usage: Sequence[Grant] | Held) -> Held:
    return usage if isinstance(usage, Held) else Held(usage)


@dataclass(frozen=True)
class Request:
    server: str
    user: str
    team: str
    tier: str


@dataclass(frozen=True)
class Admission:
    allowed: bool
    reason: str  # a sentence for the researcher: why, and what to do when refused
    borrowed: bool = False
    # Borrowed grants whose release would let this request in, best to reclaim first.
    reclaim: tuple[Grant, ...] = ()
    limit: str = ""  # why refused: CAPACITY, USER_CAP, BORROWING, LINE or "" (core.queue)


@dataclass(frozen=True)
class TierUse:
    """What a team has and has left on one tier: the spawn form's line."""

    tier: str
    team_used: int
    guaranteed: int
    in_use: int  # devices of the tier held by everyone
    capacity: int | None
    admission: Admission
    cards: int | None = None  # devices of the tier's kind the machine has, any tier's or free

    @property
    def guaranteed_left(self) -> int:
        return max(0, self.guaranteed - self.team_used)


def load_quotas(
    entries: Mapping[str, Mapping[str, Any]], tiers: Mapping[str, Tier]
) -> dict[str, TeamQuota]:
    """Validate admin-written quotas (team → dict) against the known tiers."""
    if not isinstance(entries, Mapping):
        raise QuotaError(f"quotas must be a dict of team: quota, got {type(entries).__name__}")
    quotas = {}
    for team, entry in entries.items():
        label = f"quota for team {team!r}"
        if not isinstance(team, str) or not team:
            raise QuotaError(f"quota team names must be non-empty strings, got {team!r}")
        check_entry(label, entry, _KEYS, QuotaError)
        try:
            quotas[team] = _quota(team, entry, tiers)
        except ValueError as error:
            raise QuotaError(f"{label}: {error}") from None
    return quotas


def _quota(team: str, entry: Mapping[str, Any], tiers: Mapping[str, Tier]) -> TeamQuota:
    amounts = {
        key: _amounts(entry, key, tiers)
        for key in ("guaranteed", "borrowing_limit", "lending_limit")
    }
    named = entry.get("tiers")
    if named is None:
        allowed = set(amounts["guaranteed"]) | set(amounts["borrowing_limit"])
    elif named == "*":
        allowed = set(tiers)
    else:
        if not isinstance(named, list | tuple) or not all(isinstance(t, str) for t in named):
            raise ValueError(f"'tiers' must be a list of tier names or '*', got {named!r}")
        _known(named, tiers, "tiers")
        allowed = set(named) | set(amounts["guaranteed"])
    cap = entry.get("user_cap")
    if cap is not None:  # 10**400 raised OverflowError at float(), naming nothing
        check_number(
            "'user_cap'",
            cap,
            0,
            MAX_TEAM_GPUS,
            above=True,
            unit="GPU-equivalents",
            error=ValueError,
        )
    priority = entry.get("priority", 0)
    check_number("'priority'", priority, -MAX_PRIORITY, MAX_PRIORITY, whole=True, error=ValueError)
    return TeamQuota(
        team=team,
        tiers=frozenset(allowed),
        guaranteed=amounts["guaranteed"],
        borrowing_limit=amounts["borrowing_limit"],
        lending_limit=amounts["lending_limit"],
        user_cap=None if cap is None else float(cap),
        priority=priority,
    )


def _amounts(entry: Mapping, key: str, tiers: Mapping[str, Tier]) -> dict[str, int]:
    value = entry.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{key!r} must be a dict of tier: devices, got {value!r}")
    _known(value, tiers, key)
    for tier, amount in value.items():
        check_number(
            f"'{key}.{tier}'",
            amount,
            0,
            MAX_TIER_DEVICES,
            whole=True,
            unit="devices",
            error=ValueError,
        )
        count = tiers[tier].count
        if amount % count:
            raise ValueError(
                f"'{key}.{tier}' counts devices and a server of {tier!r} takes {count}: give a "
                f"multiple of {count}, got {amount}"
            )
    return dict(value)


def _known(names: Iterable[str], tiers: Mapping[str, Tier], key: str) -> None:
    for name in names:
        if name not in tiers:
            raise ValueError(
                f"{key!r} names tier {name!r}, which is not defined (tiers: {', '.join(tiers)})"
            )


def admit(
    request: Request,
    usage: Sequence[Grant] | Held,
    capacity: Mapping[str, int | None],
    quotas: Mapping[str, TeamQuota],
    tiers: Mapping[str, Tier],
    cards_held: Mapping[str, str] | None = None,
) -> Admission:
    """May ``request`` start now, given what ``usage`` holds? (The request's own server, if it
    appears in ``usage``, is not counted against it.) ``capacity``: devices per tier; a tier
    without an entry is bounded by quotas alone. ``cards_held``: server -> the product
    (``nvidia.com/gpu.product``) of the cards it holds, where known (a pod's node, a
    workstation's devices): a capability class's borrowed server is reclaimed for a named
    card's guarantee only on a card of it."""
    tier = tiers.get(request.tier)
    if tier is None:
        return Admission(
            False,
            f"There is no GPU tier {in_sentence(repr(request.tier))} (tiers: {listed(tiers)}).",
        )
    quota = quotas.get(request.team)
    if quota is None:
        return Admission(
            False,
            f"Team {in_sentence(repr(request.team))} has no GPU quota. Choose another team, or ask your hub admin "
            "to give this team a quota.",
        )
    # Names from outside (a team's, an admin's tier name) each an isolate in the sentence.
    name, team = in_sentence(tier.display_name), in_sentence(quota.team)
    if tier.name not in quota.tiers:
        offered = listed(tiers[t].display_name for t in tiers if t in quota.tiers) or "none"
        return Admission(False, f"{name} is not offered to team {team} (offered: {offered}).")

    # Tiers whose servers hold cards this tier can use (one card and a pair; a named card and a
    # class it is in): their borrowed servers are reclaimed for a guarantee too, or a borrowed
    # pair (or H100 for "any 80 GB card") kept a team from its guarantee.
    sharing = card_sharing(tiers, tier)
    # A capability class that takes this tier's card: its servers on one (``cards_held``) too.
    maybe = (
        tuple(t for t, other in tiers.items() if may_free_cards_for(other, tier))
        if cards_held
        else ()
    )
    if not isinstance(usage, Held):  # only what this admission reads: an index costs more
        within, wider = _keeping_tiers(tiers, tier)
        reads = {
            *sharing,
            *maybe,
            *within,
            *(t for w in wider for t in card_sharing(tiers, tiers[w])),
        }
        usage = Held(g for g in usage if g.tier in reads or g.user == request.user)

    def on_its_cards(g: Grant) -> bool:
        return g.tier not in maybe or cards_held.get(g.server) in tier.card.products

    refusal = _over_user_cap(request, tier, quota, usage, tiers)
    if refusal:
        return refusal

    need = tier.count
    in_use = usage.devices(tier.name, but=request.server)
    team_used = usage.devices(tier.name, quota.team, but=request.server)
    guaranteed = quota.guaranteed.get(tier.name, 0)
    cap = capacity.get(tier.name)
    free_after = float("inf") if cap is None else cap - in_use - need

    if team_used + need <= guaranteed:
        if free_after >= 0:
            return Admission(
                True,
                f"Within team {team}'s guarantee: {team_used + need} of {guaranteed} "
                f"{_devices(tier, guaranteed)} in use with this server.",
            )
        # Cards the team is guaranteed are held by other teams' borrowed servers.
        reclaim = _reclaim(
            usage, request, quota, quotas, -free_after, on_its_cards, (*sharing, *maybe)
        )
        # Cards other tiers' servers hold are not in this tier's count ("the only card is in
        # use" on a workstation of 3, 2 of them a pair's): named, without a total.
        shared = {
            in_sentence(tiers[t].display_name): n
            for t in sharing[1:]
            if (n := usage.devices(t, but=request.server))
        }
        for t in maybe:  # a class's servers known to hold this tier's card
            on = [g for g in usage.borrowed(t) if g.server != request.server and on_its_cards(g)]
            if on:
                shared[in_sentence(tiers[t].display_name)] = sum(g.devices for g in on)
        if reclaim:
            return Admission(
                False,
                f"{_all_in_use(tier, cap, shared)}, some borrowed by other teams beyond their "
                f"guarantee. Team {team} is within its guarantee, so "
                f"{_count(sum(g.devices for g in reclaim))} being taken back from them: try again "
                "in a few minutes.",
                reclaim=reclaim,
                limit=CAPACITY,
            )
        return Admission(False, f"{_all_in_use(tier, cap, shared)}. {_retry(tier)}", limit=CAPACITY)

    over = team_used + need - guaranteed
    limit = quota.borrowing_limit.get(tier.name)
    if limit is not None and over > limit:
        # The limit first, then what the team holds: "uses 3 and may borrow at most 3 more"
        # read as 3 more still to take, in the very refusal that said there were none.
        devices = _devices(tier, limit)
        if guaranteed:
            may = (
                f"may borrow at most {limit} {devices} beyond its guarantee of {guaranteed}"
                if limit
                else f"may not borrow beyond its guarantee of {guaranteed} {_devices(tier, guaranteed)}"
            )
        else:
            may = f"has no guarantee on {name} and " + (
                f"may borrow at most {limit} {devices}" if limit else "may not borrow any"
            )
        already = max(0, team_used - guaranteed)
        holds = "it holds none"
        if team_used:
            borrowed = f"{already} of them borrowed" if already else "none borrowed"
            if already == team_used:
                borrowed = "all borrowed"
            holds = f"it holds {team_used}, {borrowed}"
        needs = f"{',' if team_used else ''} and this server needs {need}" if need > 1 else ""
        advice = (
            f"Stop one of the team's servers on {name}, or pick another tier."
            if team_used
            else "Pick another tier."  # beyond the limit on its own: stopping nothing helps
        )
        return Admission(False, f"Team {team} {may}; {holds}{needs}. {advice}", limit=BORROWING)
    if guaranteed:
        state = f"team {team}'s guarantee of {guaranteed} {_devices(tier, guaranteed)} is in use"
    else:
        state = f"team {team} has no guarantee on {name}"
    reserved = _reserved_for_others(usage, request, quota, quotas, tiers, capacity)
    if free_after - reserved >= 0:
        return Admission(
            True,
            f"Borrowed from the shared pool: {state}. Borrowed servers are given back first when "
            "another team needs its guarantee.",
            borrowed=True,
        )
    reclaim = _reclaim(
        usage,
        request,
        quota,
        quotas,
        reserved - free_after,
        lambda g: g.priority < quota.priority and on_its_cards(g),
        (*sharing, *maybe),
    )
    if reclaim:
        return Admission(
            False,
            f"No {name} is free to borrow, but team {team} outranks teams that borrowed "
            "some: they are being reclaimed, try again in a few minutes.",
            reclaim=reclaim,
            limit=CAPACITY,
        )
    why = "are in use" if reserved <= 0 else "are in use or kept for other teams' guarantees"
    borrow = f"none is free to borrow: the others {why}"
    if cap is not None and cap <= team_used:  # a workstation's two cards, both the team's
        borrow = f"there is no other {name} to borrow"
    return Admission(
        False, f"{state[0].upper()}{state[1:]}, and {borrow}. {_retry(tier)}", limit=CAPACITY
    )


def tier_use(
    user: str,
    team: str,
    usage: Sequence[Grant] | Held,
    capacity: Mapping[str, int | None],
    quotas: Mapping[str, TeamQuota],
    tiers: Mapping[str, Tier],
    server: str = "",
    decide: Callable[..., Admission] | None = None,
    cards: Mapping[str, int | None] | None = None,
) -> list[TierUse]:
    """For each tier offered to ``team``: what the team holds, and whether a new server of
    ``user`` would be admitted (and borrowed). ``decide``: admission (default ``admit``; the
    spawner passes admission behind the requests waiting in line). ``cards``: devices per tier
    the machine has, whichever tier holds them (the form's total)."""
    decide = decide or admit
    quota = quotas.get(team)
    if quota is None:
        return []
    usage = indexed(usage)
    lines = []
    for name in tiers:
        if name not in quota.tiers:
            continue
        lines.append(
            TierUse(
                tier=name,
                team_used=usage.devices(name, team, but=server),
                guaranteed=quota.guaranteed.get(name, 0),
                in_use=usage.devices(name, but=server),
                capacity=capacity.get(name),
                admission=decide(Request(server, user, team, name), usage, capacity, quotas, tiers),
                cards=(cards or {}).get(name),
            )
        )
    return lines


def _over_user_cap(request, tier, quota, usage: Held, tiers) -> Admission | None:
    if quota.user_cap is None:
        return None
    mine = [g for g in usage.of_user(request.user) if g.server != request.server]
    held = sum(g.weight for g in mine)
    if held + tier.weight <= quota.user_cap + _EPS:
        return None
    holding = ", ".join(
        f"{_server_label(g.server)} on {in_sentence(tiers[g.tier].display_name if g.tier in tiers else g.tier)}"
        for g in mine
    )
    # Advise a smaller tier only when the team has one that would fit under the cap now.
    fits = [
        t
        for name, t in tiers.items()
        if name in quota.tiers
        and t.weight < tier.weight
        and held + t.weight <= quota.user_cap + _EPS
    ]
    largest = in_sentence(max(fits, key=lambda t: t.weight).display_name) if fits else ""
    if not mine:  # beyond the cap on its own: stopping nothing helps
        advice = f"Pick a smaller tier ({largest} fits)." if fits else "Pick a smaller tier."
    elif fits:
        advice = f"Stop one of your servers, or pick a smaller tier ({largest} fits)."
    else:
        advice = "Stop one of your servers first."
    return Admission(
        False,
        f"You may hold {_gpu_equivalents(quota.user_cap)} at once (team {in_sentence(quota.team)}'s "
        f"per-user cap); you hold {held:.3g} ({holding or 'nothing'}) and "
        f"{in_sentence(tier.display_name)} counts {tier.weight:.2g}. {advice}",
        limit=USER_CAP,
    )


def _reserved_for_others(usage: Held, request, quota, quotas, tiers, capacity) -> float:
    """Devices of the request's tier that other teams keep for themselves: the unused guarantee
    they do not lend, on every tier that can use its cards. Those of the tiers whose cards it
    can use (``card_sharing``: its own, a pair of its model, a named card in its class) are
    among its free cards: all kept. A wider class (an "any 80 GB card" guarantee, for an
    H100) may be met by other cards too: kept only as far as its own free cards, less this
    server, fall short of what it keeps (said on this tier's scale: a borrow is refused when
    it would leave that class less free than its teams keep)."""
    tier = tiers[request.tier]
    kept: dict[str, int] = {}

    def keeps(name: str) -> int:  # what other teams keep of ``name``'s cards
        if name not in kept:
            kept[name] = 0
            for other in quotas.values():
                lendable = other.lending_limit.get(name)
                if other.team == quota.team or lendable is None:
                    continue
                held = usage.devices(name, other.team, but=request.server)
                kept[name] += max(0, max(0, other.guaranteed.get(name, 0) - held) - lendable)
        return kept[name]

    within, wider = _keeping_tiers(tiers, tier)
    reserved = sum(keeps(t) for t in within)
    cap = capacity.get(tier.name)
    if cap is None:
        return reserved
    free = cap - usage.devices(tier.name, but=request.server)
    for name in wider:
        wider_cap = capacity.get(name)
        keeping = sum(keeps(t) for t in card_sharing(tiers, tiers[name]))
        if wider_cap is not None and keeping:
            wider_free = wider_cap - usage.devices(name, but=request.server)
            reserved = max(reserved, keeping - wider_free + free)
    return reserved


def _keeping_tiers(tiers: Mapping[str, Tier], tier: Tier) -> tuple[tuple[str, ...], list[str]]:
    """The tiers whose unused guarantees other teams may keep of ``tier``'s cards: those whose
    cards it can use (``card_sharing``), and the wider ones that can use its cards but others
    too (a capability class, for a named card in it; a wider class)."""
    within = card_sharing(tiers, tier)
    wider = [
        name for name, other in tiers.items() if name not in within and frees_cards_for(tier, other)
    ]
    return within, wider


def _reclaim(
    usage: Held, request, quota, quotas, shortfall: float, eligible, sharing: Sequence[str]
) -> tuple[Grant, ...]:
    """Borrowed grants of other teams on the tiers ``sharing`` the request's cards that would
    cover ``shortfall`` devices: lowest priority first, then the most recently started
    (Kueue's order), or nothing if they cannot cover it. Only a team's excess over its
    guarantee on the grant's tier is taken: a grant labelled borrowed at spawn is within the
    guarantee once enough of the team's other servers have stopped."""
    candidates = sorted(
        (
            g
            for tier in sharing
            for g in usage.borrowed(tier)
            if g.server != request.server and g.team != quota.team and eligible(g)
        ),
        key=lambda g: (g.priority, -(g.started.timestamp() if g.started else 0)),
    )
    excess: dict[tuple[str, str], int] = {}
    for team, tier in {(g.team, g.tier) for g in candidates}:
        other = quotas.get(team)
        excess[team, tier] = usage.devices(tier, team, but=request.server) - (
            other.guaranteed.get(tier, 0) if other else 0
        )
    chosen, covered = [], 0
    for grant in candidates:
        if covered >= shortfall:
            break
        if excess[grant.team, grant.tier] <= 0:
            continue
        chosen.append(grant)
        covered += grant.devices
        excess[grant.team, grant.tier] -= grant.devices
    return tuple(chosen) if covered >= shortfall else ()


def _gpu_equivalents(x: float) -> str:
    return f"{x:.3g} GPU-equivalent" + ("" if x == 1 else "s")


def _count(n: int) -> str:
    return "1 is" if n == 1 else f"{n} are"


def _all_in_use(tier: Tier, cap: int, shared: Mapping[str, int]) -> str:
    if shared:  # cards of this model that other tiers' servers hold too
        held = ", ".join(f"{n} by {name} servers" for name, n in shared.items())
        return f"All {_devices(tier, 2)} are in use ({held})"
    if cap == 0:
        return f"There is no {_devices(tier, 1)} here"
    if cap == 1:
        return f"The only {_devices(tier, 1)} is in use"
    return f"All {cap} {_devices(tier, cap)} are in use"


# A name that counts its cards ("2 x H100 80 GB, NVLink"): a figure before it would read as a
# second count ("at most 2 2 x H100 cards").
_COUNTED_NAME = re.compile(r"\d+\s*[x\u00d7*]", re.IGNORECASE)


def _devices(tier: Tier, n: int | float | None) -> str:
    unit = {"mig": "slice", "shared": "share"}.get(tier.kind, "card")
    unit = unit if n == 1 else unit + "s"
    name = in_sentence(tier.display_name)
    if _COUNTED_NAME.match(tier.display_name.strip()):
        return f"{unit} on {name}"
    return f"{name} {unit}"


def _retry(tier: Tier) -> str:
    return f"Try again later, or pick another tier than {in_sentence(tier.display_name)}."


def _server_label(server: str) -> str:
    name = server.partition("/")[2]
    return f"server {in_sentence(repr(name))}" if name else "your default server"
