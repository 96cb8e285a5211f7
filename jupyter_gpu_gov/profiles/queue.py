"""The spawn queue as admission sees it: who is next, and what a request may do while others
wait. Pure (``quota.admit`` over the hub's count and the waiting requests); the records are
``core.queue``'s, the spawner glue is in ``spawner.py`` and the pages and the governor's sync in ``queue_pages.py``.

The line (``core.queue.rank``): a team within its guarantee first, then priority, then arrival.
A request is measured against the count *and* the requests ranked ahead of it that admission
would let in now, as if they already held their GPUs: nobody jumps the line, and a request
ahead that could not start now anyway (its team is at its borrowing limit) blocks nobody. Two
waiting requests that compete for one freed GPU: the first in line is ready, the second waits;
the governor starts the ready ones through the Hub one after another, and the spawner decides
again from the hub's count at each start (brought up to date with its database in the same step),
so a stale view cannot overshoot a quota.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from ..core.queue import (
    BORROWING,
    CAPACITY,
    LINE,
    MAX_REFUSED,
    REFUSED_WITHIN,
    USER_CAP,
    Estimate,
    QueuedRequest,
    Release,
    Waiting,
    estimate_known,
    ordinal,
    rank,
)
from ..core.text import in_sentence
from .quota import (
    Admission,
    Grant,
    Held,
    Request,
    TeamQuota,
    admit,
    indexed,
)
from .tiers import Tier, card_sharing, may_free_cards_for

# Refusals that waiting can end: the cards are taken (or others wait for them first), the user's
# own cap, the team's borrowing limit.
QUEUEABLE = frozenset({CAPACITY, USER_CAP, BORROWING, LINE})


@dataclass
class Forecast:
    """The governor's latest forecast of when servers give their GPUs back (server key →
    release), kept in the hub process between its syncs; the queue is offered only while the
    governor is heard from, since nothing else starts a waiting server."""

    releases: Mapping[str, Release] = field(default_factory=dict)
    at: datetime | None = None  # when the governor last synced
    # Requests that left the line (expired, cancelled) since the governor last synced; a hub
    # restart loses these counts (never a request: those are in the spawners' state).
    left: list[dict] = field(default_factory=list)

    def heard_since(self, since: datetime) -> bool:
        return self.at is not None and self.at >= since


FORECAST = Forecast()  # one hub process, one forecast


class Refusals:
    """Servers whose spawn admission refused for want of a free GPU (``FOR_A_GPU``) and that
    neither joined the line nor started since, by when last refused, with the tier asked for:
    the cluster report's ``refused`` demand, sent on each sync. Kept in the hub process, where
    the spawner refuses (a restart forgets them); per server, so retrying one spawn counts
    once; and per user at most ``per_user`` servers (the newest refused), as many as they may
    wait in line with (``GpuProfiles.queue_per_user``): a server's name is its owner's choice,
    and one user asking for a server of a new name each second once counted 3,600 refused
    spawns an hour (the cluster's demand, which makes partly used cards fragmentation), and
    100,000 put every other user's refusals out of the record."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[datetime, str, str]] = {}  # oldest refusal first
        self._of: dict[str, dict[str, None]] = {}  # user -> their servers here, oldest first

    def refused(
        self, server: str, now: datetime, tier: str = "", user: str = "", per_user: int = 0
    ) -> str | None:
        """Counts ``server``'s refusal; returns the server of ``user``'s it no longer counts
        (their oldest, past ``per_user``; 0: no bound), for the log."""
        self.forget(server)
        self._at[server] = (now, tier, user)
        mine = self._of.setdefault(user, {})
        mine[server] = None
        cut = None
        if per_user and len(mine) > per_user:
            cut = next(iter(mine))
            self.forget(cut)
            mine.pop(cut, None)
        if len(self._at) > MAX_REFUSED:
            self.forget(next(iter(self._at)))
        return cut

    def forget(self, server: str) -> None:
        """It joined the line (counted there) or started."""
        entry = self._at.pop(server, None)
        mine = self._of.get(entry[2]) if entry is not None else None
        if mine is not None:
            mine.pop(server, None)
            if not mine:
                del self._of[entry[2]]

    def count(self, now: datetime) -> int:
        """Those refused within ``REFUSED_WITHIN`` (older ones are dropped)."""
        since = now - REFUSED_WITHIN
        while self._at and next(iter(self._at.values()))[0] < since:
            self.forget(next(iter(self._at)))
        return len(self._at)

    def tiers(self, now: datetime) -> dict[str, int]:
        """``count``'s, per tier asked for (the cluster report's placement of each)."""
        self.count(now)
        found: dict[str, int] = {}
        for _, tier, _ in self._at.values():
            found[tier] = found.get(tier, 0) + 1
        return found


REFUSED = Refusals()  # one hub process, one record


def within_guarantee(
    team: str,
    tier: str,
    usage: Sequence[Grant] | Held,
    quotas: Mapping[str, TeamQuota],
    need: int = 1,
) -> bool:
    quota = quotas.get(team)
    if quota is None:
        return False
    if isinstance(usage, Held):
        held = usage.devices(tier, team)
    else:
        held = sum(g.devices for g in usage if g.team == team and g.tier == tier)
    return held + need <= quota.guaranteed.get(tier, 0)


def _rank(
    request: Request,
    queued_at: datetime,
    usage: Held,
    quotas: Mapping[str, TeamQuota],
    tiers: Mapping[str, Tier],
) -> tuple:
    tier = tiers.get(request.tier)
    need = tier.count if tier else 1
    quota = quotas.get(request.team)
    return rank(
        within_guarantee(request.team, request.tier, usage, quotas, need),
        quota.priority if quota else 0,
        queued_at,
        request.server,
    )


def _of(queued: QueuedRequest) -> Request:
    return Request(queued.server, queued.user, queued.team, queued.tier)


def _holding(
    request: Request,
    admission: Admission,
    tiers: Mapping[str, Tier],
    quotas: Mapping[str, TeamQuota],
    at: datetime,
) -> Grant:
    """What an admitted request would hold: a grant as the count has it."""
    tier = tiers[request.tier]
    quota = quotas.get(request.team)
    return Grant(
        server=request.server,
        user=request.user,
        team=request.team,
        tier=tier.name,
        devices=tier.count,
        weight=tier.weight,
        borrowed=admission.borrowed,
        priority=quota.priority if quota else 0,
        started=at,
    )


def ordered(
    queued: Sequence[QueuedRequest],
    usage: Sequence[Grant] | Held,
    quotas: Mapping[str, TeamQuota],
    tiers: Mapping[str, Tier],
    now: datetime,
) -> list[QueuedRequest]:
    """The live requests, first in line first."""
    usage = indexed(usage)
    live = [q for q in queued if q.live(now) and q.tier in tiers]
    return sorted(live, key=lambda q: _rank(_of(q), q.queued_at, usage, quotas, tiers))


def admit_in_line(
    request: Request,
    usage: Sequence[Grant] | Held,
    capacity: Mapping[str, int | None],
    quotas: Mapping[str, TeamQuota],
    tiers: Mapping[str, Tier],
    *,
    queued: Sequence[QueuedRequest],
    now: datetime,
    queued_at: datetime | None = None,
    cards_held: Mapping[str, str] | None = None,
) -> Admission:
    """``quota.admit`` for ``request`` (waiting since ``queued_at``, or arriving now) behind the
    waiting requests ranked ahead of it. Refused only because of them: ``limit`` is LINE.
    ``cards_held``: ``admit``'s, for ``request``'s reclaims."""
    if not isinstance(usage, Held):
        live = [q for q in queued if q.live(now) and q.tier in tiers]
        if not any(q.server != request.server for q in live):  # nobody ahead: admission alone
            return admit(request, usage, capacity, quotas, tiers, cards_held)
        # Only what these admissions read (their tiers, their users): an index costs more.
        on = {request.tier, *(q.tier for q in live)}
        of = {request.user, *(q.user for q in live)}
        usage = Held(g for g in usage if g.tier in on or g.user in of)
    mine = _rank(request, queued_at or now, usage, quotas, tiers)
    held, ahead = Held(base=usage), 0
    for other in ordered(queued, usage, quotas, tiers, now):
        other_request = _of(other)
        if other.server == request.server:
            continue
        if _rank(other_request, other.queued_at, usage, quotas, tiers) >= mine:
            break
        admission = admit(other_request, held, capacity, quotas, tiers)
        if admission.allowed:
            held.add(_holding(other_request, admission, tiers, quotas, other.queued_at))
            ahead += other.tier == request.tier
    decided = admit(request, held, capacity, quotas, tiers, cards_held)
    if decided.allowed or not ahead or not admit(request, usage, capacity, quotas, tiers).allowed:
        return decided
    tier = in_sentence(tiers[request.tier].display_name)
    waiting = "1 request is" if ahead == 1 else f"{ahead} requests are"
    return Admission(
        False,
        f"{waiting} waiting in line for {tier} before you, and starts as soon as it frees.",
        limit=LINE,
    )


def line(
    queued: Sequence[QueuedRequest],
    usage: Sequence[Grant] | Held,
    capacity: Mapping[str, int | None],
    quotas: Mapping[str, TeamQuota],
    tiers: Mapping[str, Tier],
    releases: Mapping[str, Release],
    now: datetime,
    sooner_for: Callable[[QueuedRequest], bool] | None = None,
    cards_held: Mapping[str, str] | None = None,
) -> list[Waiting]:
    """Every live request in line order: its position in its tier's line, whether admission
    lets it in now (the ones ahead that it lets in counted as holding their GPUs: of two
    requests for one freed GPU only the first is ready), its estimated wait and what would
    start it sooner — for the requests ``sooner_for`` names (default all): each costs a pass
    over the line per smaller tier, so the whole line's took seconds at a few hundred
    requests, on the hub's event loop, at every Hub page a waiting user opened. The rest is
    O(waiting + held): admission counts from an index (``quota.Held``) that the requests let
    in are added to, and the estimates from the holders' releases sorted once per key.
    ``cards_held``: server -> the product of its cards, where known (``quota.admit``'s): a
    capability class's server known to hold a named card counts for that card's estimate."""
    usage = indexed(usage)
    held = Held(base=usage)
    result: list[Waiting] = []
    positions: dict[str, int] = {}
    estimates = _Estimates(usage, releases, now, tiers, cards_held)
    for request in ordered(queued, usage, quotas, tiers, now):
        asked = _of(request)
        admission = admit(asked, held, capacity, quotas, tiers)
        positions[request.tier] = positions.get(request.tier, 0) + 1
        if admission.allowed:
            held.add(_holding(asked, admission, tiers, quotas, request.queued_at))
        guess = estimates.wait(asked, admission)
        quota = quotas.get(request.team)
        result.append(
            Waiting(
                request=request,
                position=positions[request.tier],
                ready=admission.allowed,
                reason=admission.reason,
                within_guarantee=within_guarantee(
                    request.team, request.tier, usage, quotas, tiers[request.tier].count
                ),
                priority=quota.priority if quota else 0,
                until=guess.until,
                estimate=guess.words(now),
                sooner=sooner(asked, usage, capacity, quotas, tiers, queued, now)
                if sooner_for is None or sooner_for(request)
                else (),
                limit=admission.limit,
            )
        )
    return result


# The wait of a request for cards no server of this hub holds (another namespace's pods, a
# guarantee kept unlent, a request ahead about to take the last): no stop the governor plans
# frees one, so it is not "any moment now".
NOT_HELD_HERE = "no estimate: no stop the governor plans frees the GPUs it waits for"


class _Estimates:
    """The line's estimated waits (``wait``, in line order): from the deadlines and idle state
    of the servers whose release would let a request in (those holding cards of its tier: its
    own and those of the tiers whose servers free cards for it, ``tiers.card_sharing``, as a
    reclaimed pair frees two for a single card, and a capability class's servers known to hold
    its named card, ``cards_held``, as an "any 80 GB card" server on an H100 frees it for an
    H100; the user's own for their cap; the team's on the tier for its borrowing limit). The k-th request not ready among those waiting for the same
    waits for the earliest release by which the servers released hold the devices of k
    servers of its tier (of one tier alone: the k-th earliest). Each key's releases are sorted
    once, and the places counted as the line goes."""

    def __init__(
        self,
        usage: Held,
        releases: Mapping[str, Release],
        now: datetime,
        tiers: Mapping[str, Tier],
        cards_held: Mapping[str, str] | None = None,
    ) -> None:
        self.usage, self.releases, self.now, self.tiers = usage, releases, now, tiers
        self.cards_held = cards_held or {}
        self.holders: dict[tuple, list[Grant]] | None = None  # per key, on first need
        # per key: the known releases earliest first, the devices they free by each, and
        # how many servers hold what the key waits for
        self.known: dict[tuple, tuple[list[Release], list[int], int]] = {}
        self.waiting: dict[tuple, int] = {}  # requests not ready so far, per key

    def wait(self, request: Request, admission: Admission) -> Estimate:
        if admission.allowed:
            return Estimate(self.now, "it starts now")
        by_user = ("user", request.user)
        by_team = ("team", request.tier, request.team)
        by_tier = ("tier", request.tier)
        for key in (by_user, by_team, by_tier):
            self.waiting[key] = self.waiting.get(key, 0) + 1  # this one, and for those behind
        key = {USER_CAP: by_user, BORROWING: by_team}.get(admission.limit, by_tier)
        tier = self.tiers[request.tier]
        if key not in self.known:
            if self.holders is None:
                self.holders = {}
                for g in self.usage.grants:
                    for k in (("user", g.user), ("team", g.tier, g.team), ("tier", g.tier)):
                        self.holders.setdefault(k, []).append(g)
            if key is by_tier:
                holders = [
                    g
                    for t in card_sharing(self.tiers, tier)
                    for g in self.holders.get(("tier", t), ())
                ]
                if self.cards_held:  # a class's servers on this tier's card
                    holders += [
                        g
                        for t, other in self.tiers.items()
                        if may_free_cards_for(other, tier)
                        for g in self.holders.get(("tier", t), ())
                        if self.cards_held.get(g.server) in tier.card.products
                    ]
            else:
                holders = self.holders.get(key, [])
            known = sorted(
                ((r, g.devices) for g in holders if (r := self.releases.get(g.server)) and r.at),
                key=lambda pair: pair[0].at,
            )
            freed, total = [], 0
            for _, devices in known:
                total += devices
                freed.append(total)
            self.known[key] = ([r for r, _ in known], freed, len(holders))
        known, freed, count = self.known[key]
        if key is not by_tier:
            return estimate_known(self.waiting[key], known, count, self.now)
        if not count:  # refused with no server here on its cards: none of them frees one
            return Estimate(None, NOT_HELD_HERE)
        # The release by which the devices of this many servers of the tier are free.
        release = bisect_left(freed, self.waiting[key] * tier.count) + 1
        return estimate_known(release, known, count, self.now)


def sooner(
    request: Request,
    usage: Sequence[Grant],
    capacity: Mapping[str, int | None],
    quotas: Mapping[str, TeamQuota],
    tiers: Mapping[str, Tier],
    queued: Sequence[QueuedRequest],
    now: datetime,
) -> tuple[str, ...]:
    """Smaller tiers of the request's team that would start now, largest first."""
    quota, wanted = quotas.get(request.team), tiers.get(request.tier)
    if quota is None or wanted is None:
        return ()
    fits = [
        tier
        for name, tier in tiers.items()
        if name in quota.tiers
        and tier.weight < wanted.weight
        and admit_in_line(
            replace(request, tier=name), usage, capacity, quotas, tiers, queued=queued, now=now
        ).allowed
    ]
    return tuple(t.display_name for t in sorted(fits, key=lambda t: -t.weight))


def offer(
    request: Request,
    admission: Admission,
    usage: Sequence[Grant],
    capacity: Mapping[str, int | None],
    quotas: Mapping[str, TeamQuota],
    tiers: Mapping[str, Tier],
    queued: Sequence[QueuedRequest],
    releases: Mapping[str, Release],
    now: datetime,
    cards_held: Mapping[str, str] | None = None,
) -> Waiting | None:
    """The place a refused request would take if it joined the line now (None when waiting
    would not help): the spawn form's offer (``cards_held``: ``line``'s)."""
    if admission.allowed or admission.limit not in QUEUEABLE:
        return None
    joining = QueuedRequest(
        user=request.user,
        name=request.server.partition("/")[2],
        team=request.team,
        tier=request.tier,
        options={},
        queued_at=now,
        expires_at=now + timedelta(days=1),
    )
    others = [q for q in queued if q.server != request.server]
    order = line(
        [*others, joining],
        usage,
        capacity,
        quotas,
        tiers,
        releases,
        now,
        sooner_for=lambda q: q is joining,
        cards_held=cards_held,
    )
    return next((w for w in order if w.request.server == request.server), None)


def starts_when(limit: str | None) -> str:
    """What starts a request waiting in line for ``limit``: a card freeing anywhere helps no one
    at their own cap, nor a team at its borrowing limit."""
    if limit == USER_CAP:
        return "when one of your own GPU servers stops (you stop it, or it is culled)"
    if limit == BORROWING:
        return "when your team's servers on this tier stop, back within its borrowing limit"
    return "when the GPU frees"


def offer_words(waiting: Waiting, tiers: Mapping[str, Tier]) -> str:
    """The offer in words, after admission's refusal: 'Or wait in line: 2nd for H100 80 GB,
    about 25m (...). Sooner: Small slice is free now.'"""
    tier = in_sentence(tiers[waiting.request.tier].display_name)
    words = f"Or wait in line: {ordinal(waiting.position)} for {tier}"
    words += f", {waiting.estimate}." if waiting.estimate else "."
    if waiting.limit in (USER_CAP, BORROWING):  # not any card freeing: say what starts it
        words += f" It starts {starts_when(waiting.limit)}."
    if waiting.sooner:
        words += f" Sooner: {in_sentence(waiting.sooner[0])} is free now."
    return words
