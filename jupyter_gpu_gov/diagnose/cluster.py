"""The cluster: what each cause costs, per team and per node, and fragmentation.

``CostLedger`` sums the servers' diagnoses into GPU-hours: each scored window adds the time
since the server's previous one (capped), times the GPU-equivalents it holds, to its cause,
with the SM activity it reached (utilisation) and the share of that time that fixing the cause
would give back (*recoverable*: all of it for a zombie, whose GPU a cull frees; for a loop held
back, its shortfall against its node's fed state). Days are kept apart, so a report covers the
last N days. O(1) per window; the report is O(teams x nodes x causes).

``fragmentation`` flags GPUs partly allocated while spawns wait for one: pending (the Hub is
starting them, e.g. pods waiting for a node), queued (in the spawn queue for a card) or
refused lately for want of a free GPU — not waiting for a quota: that is a policy
(``core.queue.FOR_A_GPU``).
A card counts by what is *allocated* on it, not by the memory in use: an exclusive whole card
is allocated in full, however little memory its server uses, so it is never fragmented.

``placement`` says, on a cluster (Kubernetes, where no DCGM needs to see a card), what blocks
each such spawn: free devices split across nodes so that none has what it asks
(fragmentation), too few free (shortage), or nothing (it fits), from the nodes and pods the
hub's admission reads (``profiles.cluster.room``, sent at the spawn queue's sync).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from itertools import chain, repeat

from ..core.queue import FRESH_FOR_S
from .labels import FRAGMENTATION, HEALTHY, HINTS, LABELS, UNCERTAIN, ZOMBIE, Diagnosis, diagnosis

CAUSES = tuple(label for label in LABELS if label != HEALTHY)
# A healthy window whose kernel runs no cell: a GPU held and waiting (someone there, or not
# away long enough for a zombie), not a loop working: booked apart, so that `healthy` is the
# GPU time of working loops (a team lead read 39 % of a demo's hours "healthy" at 0 % SM).
IDLE = "idle"
IDLE_HINT = (
    "GPUs held by kernels running no cell, their owners still around (or not away long "
    "enough for a zombie): the idle policy reclaims them after its warning."
)
# What a window's time is booked to: its label (uncertain ones apart; idle as above), and the
# GPU time of servers whose diagnosis was unknown (no GPU signal) is not booked at all.
BOOKED = (*LABELS, IDLE, UNCERTAIN)


def booked_as(d: Diagnosis, kernel_busy: bool | None) -> str:
    """What a window's time is booked to: its label, or ``idle`` for a healthy one whose kernel
    is known to run no cell."""
    return IDLE if d.label == HEALTHY and kernel_busy is False else d.label


MAX_GAP_S = 600.0  # a window stands for at most this long (a server that stopped reporting)


def recoverable_share(d: Diagnosis) -> float:
    """The share of a window's GPU time fixing its cause would give back: a confident zombie
    all of it; a confident cause its shortfall against the node's fed state; else nothing."""
    if d.label == ZOMBIE:
        return 1.0
    if d.label in (HEALTHY, UNCERTAIN) or d.label not in LABELS:
        return 0.0
    share = d.gain.get("share")
    return min(1.0, max(0.0, share)) if isinstance(share, int | float) else 0.0


# The cost ledger's node for a server nothing its user cannot write places: the Hub's records
# name no node, DCGM reads none of its GPUs. Its report's card name was the key once, a name its
# user chose (a key a session).
UNPLACED = "(unplaced)"


class CostLedger:
    """GPU time by day, team, node and label: ``[gpu_s, sm_gpu_s, recoverable_gpu_s]``. A node
    is one a trusted source names (DCGM's Hostname, the Hub's records), else ``UNPLACED``."""

    def __init__(self, keep_days: int = 7):
        self.keep_days = max(1, keep_days)
        self.days: dict[date, dict[tuple[str, str, str], list[float]]] = {}

    def add(
        self,
        day: date,
        team: str,
        node: str,
        d: Diagnosis,
        gpu_seconds: float,
        sm: float | None,
        kernel_busy: bool | None = None,
    ) -> None:
        label = booked_as(d, kernel_busy)
        if label not in BOOKED or not gpu_seconds > 0:
            return
        bucket = self.days.get(day)
        if bucket is None:
            bucket = self.days[day] = {}
            for old in sorted(self.days)[: -self.keep_days]:
                del self.days[old]
        row = bucket.setdefault((team, node, label), [0.0, 0.0, 0.0])
        row[0] += gpu_seconds
        row[1] += gpu_seconds * (sm or 0.0)
        row[2] += gpu_seconds * recoverable_share(d)

    def report(self, since: date | None = None) -> dict:
        """Per cause, per team and per node: GPU-hours, mean SM activity, recoverable
        GPU-hours and each cause's share of all the GPU-hours booked (``since``: that day on)."""
        rows: dict[tuple[str, str, str], list[float]] = {}
        for day, bucket in self.days.items():
            if since is not None and day < since:
                continue
            for key, values in bucket.items():
                into = rows.setdefault(key, [0.0, 0.0, 0.0])
                for i, v in enumerate(values):
                    into[i] += v
        total = sum(v[0] for v in rows.values())

        def group(by: int | None) -> dict:
            out: dict = {}
            for key, values in rows.items():
                name = key[by] if by is not None else ""
                label = key[2]
                cell = out.setdefault(name, {}).setdefault(label, [0.0, 0.0, 0.0])
                for i, v in enumerate(values):
                    cell[i] += v
            return {name: _figures(cells, total) for name, cells in sorted(out.items())}

        return {
            "gpu_hours": round(total / 3600, 3),
            "causes": group(None).get("", _figures({}, total)),
            "teams": group(0),
            "nodes": group(1),
        }


def _figures(cells: Mapping[str, list[float]], total: float) -> dict:
    """Per label: ``gpu_hours``, ``utilisation`` (mean SM activity), ``recoverable_gpu_hours``
    (what fixing it would give) and ``share`` (of all GPU-hours booked)."""
    out = {}
    for label in BOOKED:
        gpu_s, sm_s, back_s = cells.get(label, (0.0, 0.0, 0.0))
        if gpu_s <= 0:
            continue
        out[label] = {
            "gpu_hours": round(gpu_s / 3600, 3),
            "utilisation": round(sm_s / gpu_s, 3),
            "recoverable_gpu_hours": round(back_s / 3600, 3),
            "share": round(gpu_s / total, 4) if total > 0 else 0.0,
        }
    return out


# -- fragmentation -------------------------------------------------------------------------------

FRAGMENT_MIN_FREE = 1.0  # a whole card's worth free, but scattered over partly allocated cards


@dataclass(frozen=True)
class Demand:
    """Spawns that wait for a GPU; ``None``: not known (not measured where this runs)."""

    pending: int | None = None  # the Hub has been starting them a while (pods waiting)
    queued: int | None = None  # in the spawn queue for a card (not for a quota)
    refused: int | None = None  # refused lately for want of a free GPU, and not waiting in line

    @property
    def waiting(self) -> int:
        return sum(n for n in (self.pending, self.queued, self.refused) if n and n > 0)

    def as_dict(self) -> dict:
        return {"pending": self.pending, "queued": self.queued, "refused": self.refused}


MIG_SLICES = 7  # the compute slices of a card MIG splits (A100, H100, H200, B200)


def mig_share(profile: str | None) -> float:
    """A MIG profile's share of its card's compute (``3g.40gb``: 3/7); 1 for a whole card, and
    for a profile no card has (a report's is its user's words: ``0g`` billed a GPU at nothing,
    400 digits raised OverflowError in every pass's look at the server)."""
    head = (profile or "").split("g.", 1)[0]
    if head in _SLICES:
        return round(int(head) / MIG_SLICES, 4)
    return 1.0


_SLICES = frozenset(str(n) for n in range(1, MIG_SLICES + 1))  # (ASCII digits: not '²')


def card_shares(slices: Iterable[tuple[str, str | None, float | None]]) -> list[float]:
    """Per physical card, the share allocated (0..1), from ``(card, mig_profile, share)``:
    a whole card's own share (1 when a server holds it exclusively, its memory share when
    time-sliced, 0 when free), or a MIG slice's (``mig_share`` when held, 0 when free), summed
    per card. Unknown shares (``None``) leave their card out."""
    cards: dict[str, float] = {}
    unknown: set[str] = set()
    for card, _, share in slices:
        if share is None or not math.isfinite(share):
            unknown.add(card)
            continue
        cards[card] = cards.get(card, 0.0) + max(0.0, share)
    return [min(1.0, v) for k, v in sorted(cards.items()) if k not in unknown]


def fragmentation(
    shares: Sequence[float], demand: Demand | int, *, min_free: float = FRAGMENT_MIN_FREE
) -> Diagnosis | None:
    """``fragmentation`` when spawns wait for a GPU while no card is free but the free shares
    of at least two partly allocated cards add up to ``min_free`` cards or more; else ``None``.
    ``shares``: per card, the share allocated (``card_shares``). Contributions:
    ``free_scattered`` (cards' worth free on partly allocated cards), ``partly_used`` (how
    many), ``waiting`` (spawns pending, queued or refused)."""
    waiting = demand.waiting if isinstance(demand, Demand) else max(0, int(demand or 0))
    used = [min(1.0, max(0.0, float(u))) for u in shares if isinstance(u, int | float)]
    used = [u for u in used if math.isfinite(u)]
    if waiting <= 0 or any(u == 0.0 for u in used):
        return None
    partly = [u for u in used if 0.0 < u < 1.0]
    free = sum(1.0 - u for u in partly)
    if len(partly) < 2 or free < min_free - 1e-9:
        return None
    return diagnosis(
        FRAGMENTATION,
        {
            "free_scattered": round(free, 3),
            "partly_used": float(len(partly)),
            "waiting": float(waiting),
        },
    )


def fragmentation_report(
    shares: Sequence[float], demand: Demand, unknown: str = "", nodes: Mapping | None = None
) -> dict:
    """The cluster's fragmentation as ``GET api/diagnosis`` shows it. No card counted is not
    zero cards: the figures are then ``None`` and ``unknown`` says which source is missing
    (``unknown``: the caller's words for it). ``nodes``: on a cluster, what blocks each
    waiting spawn (``placement``); known, it decides the flag (it knows what each asks for and
    where its pods may go: MIG slices free on two cards are no whole card); unknown, it says
    why, and the cards' figure stands, unknown itself without DCGM: never "not fragmented" on
    a reading that is not the cluster's now."""
    finding = fragmentation(shares, demand)
    flagged, hint = finding is not None, HINTS[FRAGMENTATION]
    if nodes is not None and not nodes.get("unknown"):
        flagged, hint = nodes.get(FRAGMENTATION, 0) > 0, NODES_HINT
    partly = [u for u in shares if 0 < u < 1]
    known = bool(shares)
    return {
        "flag": flagged,
        "label": FRAGMENTATION if flagged else None,
        "hint": hint if flagged else None,
        "unknown": None if known else (unknown or "no card's allocation is known"),
        "devices": len(shares) if known else None,
        "devices_free": sum(1 for u in shares if u == 0) if known else None,
        "devices_partly_used": len(partly) if known else None,
        "free_scattered": round(sum(1 - u for u in partly), 3) if known else None,  # cards' worth
        "spawns_waiting": demand.waiting if demand.as_dict() != Demand().as_dict() else None,
        "demand": demand.as_dict(),
        "nodes": None if nodes is None else dict(nodes),
    }


# -- on a cluster's nodes: what blocks each spawn waiting for a GPU -------------------------------

FITS, SHORTAGE, NEW_NODE = "fits", "shortage", "new_node"  # (and FRAGMENTATION)
NODES_HINT = (
    "Cards are free, but split across nodes so that none has what a waiting spawn asks for: "
    "let the servers holding a card or two on those nodes end (or move them together), or "
    "offer tiers of fewer cards."
)
STATES = ("pending", "queued", "refused")  # ``Demand``'s kinds, one per waiting request


def placement(
    asked: Iterable[tuple[str, str]], room: Mapping | None, since_s: float = 0.0
) -> dict | None:
    """What blocks each spawn waiting for a GPU on a cluster's nodes. ``asked``: one
    ``(tier, state)`` per request (``state``: one of ``STATES``); ``room``: where they could
    go, ``core.queue.room_from_json`` (None: no cluster said; then None), brought ``since_s``
    seconds ago: a reading then older than ``FRESH_FOR_S`` is unknown, never the cards now.

    A request is blocked by ``fragmentation`` when the devices free on the nodes its pods could
    land on add up to what it asks but no node has that many (a pair of cards, one free on
    each of two nodes); by a ``shortage`` when they do not add up; it ``fits`` when a node has
    room now (not the cards, then: the reading came after it was refused, or its pod is being
    placed); it waits for a ``new_node`` when no node has room for it but its tier's pool may
    still grow by what it asks (``pools``: ``GpuProfiles.node_pool_max``; a pool given by its
    node shape, ``node_devices``, by whole servers on each node it may add): the autoscaler adds
    a node for a Pending pod, whatever is free elsewhere. Requests compete: the largest are
    placed first, each where the least room is left (best fit); those left over go to the
    pools' growth, then are served from the scattered devices, in the same order, so two
    never count the same free card or the same device a pool may add. A device is counted as
    its resource is: a MIG slice is one slice (a request for one is never fragmented), and a
    card a pod holds is held whole, never free in part. ``unknown`` (the room's): nothing is said of any request.
    Nothing asked of a room the hub said: nothing blocked, however old its reading
    (``read_age_s`` None when it is not fresh)."""
    if room is None:
        return None
    asked = list(asked)
    age = room.get("read_age_s")
    age = None if age is None else age + max(0.0, since_s)
    why = room.get("unknown")
    if not asked and not why:  # nothing waits (the hub then reads no node): nothing is blocked
        totals = {FRAGMENTATION: 0, SHORTAGE: 0, FITS: 0, NEW_NODE: 0, "tier_unknown": 0}
        read = None if age is None or age > FRESH_FOR_S else round(age, 1)
        return {"unknown": None, "read_age_s": read, **totals, "requests": []}
    if not why and (age is None or age > FRESH_FOR_S):
        when = "never" if age is None else f"{age:.0f} s ago"
        why = f"the cluster's nodes were last read {when}: their free cards now are not known"
    if why:
        return {"unknown": why, "read_age_s": None, "requests": []}
    nodes = room.get("nodes") or {}
    tiers = room.get("tiers") or {}
    free = {node: dict(devices) for node, devices in nodes.items()}
    wanted: dict[str, int] = {}
    for tier, _ in asked:
        wanted[tier] = wanted.get(tier, 0) + 1

    def largest_first(tier: str) -> tuple:  # then those with the fewest nodes to go to
        return (-tiers[tier]["count"], len(tiers[tier]["nodes"]), tier)

    order = sorted((t for t in wanted if t in tiers), key=largest_first)
    placed: dict[str, int] = {}
    for tier in order:  # best fit, largest first: a tier's requests alike, node by node
        need, resource, left = tiers[tier]["count"], tiers[tier]["resource"], wanted[tier]
        for node in sorted(tiers[tier]["nodes"], key=lambda n: free.get(n, {}).get(resource, 0)):
            room_here = free.get(node, {}).get(resource, 0)
            fit = min(left, room_here // need)
            if fit > 0:
                free[node][resource] = room_here - fit * need
                left -= fit
        placed[tier] = wanted[tier] - left
    grows = dict(room.get("pools") or {})  # devices each pool may still add
    # Of a pool given by its node shape, the nodes it may add, as {devices free: nodes}: a
    # server's devices are on one node (two 3-card servers on an 8-card node, not 8/3).
    shaped = {
        pool: {per: grows.get(pool, 0) // per}
        for pool, per in (room.get("node_devices") or {}).items()
        if per > 0
    }
    added: dict[str, int] = {}
    for tier in order:  # the rest, on a node the autoscaler adds for a Pending pod
        need, pool = tiers[tier]["count"], tiers[tier].get("pool")
        left = wanted[tier] - placed[tier]
        if not pool:
            added[tier] = 0
        elif pool in shaped:
            added[tier] = left - _on_new_nodes(shaped[pool], need, left)
        else:
            added[tier] = min(left, grows.get(pool, 0) // need)
            grows[pool] = grows.get(pool, 0) - added[tier] * need
    fragmented: dict[str, int] = {}
    for tier in order:  # the rest, from what is scattered: consolidating would start them
        need, resource = tiers[tier]["count"], tiers[tier]["resource"]
        on = [n for n in tiers[tier]["nodes"] if free.get(n, {}).get(resource, 0) > 0]
        scattered = sum(free[n][resource] for n in on)
        served = min(wanted[tier] - placed[tier] - added[tier], scattered // need)
        fragmented[tier] = served
        take = served * need
        for node in on:
            used = min(take, free[node][resource])
            free[node][resource] -= used
            take -= used
    # Which of a tier's requests is placed does not matter: the states keep their order
    # (pending first: its pod is made), each tier's verdicts handed out in that order.
    verdicts: dict[str, Iterator[str]] = {}
    for tier in wanted:
        if tier not in tiers:
            verdicts[tier] = repeat("unknown")
            continue
        rest = wanted[tier] - placed[tier] - added[tier] - fragmented[tier]
        verdicts[tier] = chain(
            repeat(FITS, placed[tier]),
            repeat(NEW_NODE, added[tier]),
            repeat(FRAGMENTATION, fragmented[tier]),
            repeat(SHORTAGE, rest),
        )
    groups: dict[tuple[str, str, str], int] = {}
    rank = {state: i for i, state in enumerate(STATES)}
    for tier, state in sorted(asked, key=lambda a: (a[0], rank.get(a[1], len(STATES)))):
        key = (tier, state, next(verdicts[tier]))
        groups[key] = groups.get(key, 0) + 1
    requests = []
    for (tier, state, verdict), count in sorted(groups.items()):
        known = tiers.get(tier)
        devices = (
            [nodes.get(n, {}).get(known["resource"], 0) for n in known["nodes"]] if known else []
        )
        requests.append(
            {
                "tier": tier,
                "state": state,
                "count": count,
                "blocked_by": None if verdict == FITS else verdict,
                "needs": known["count"] if known else None,
                "resource": known["resource"] if known else None,
                "free": sum(devices) if known else None,  # on its nodes, as read
                "most_on_a_node": max(devices, default=0) if known else None,
                "nodes": known.get("nodes_total", len(known["nodes"])) if known else None,
                # devices its pool may still add (as read; None: no pool that grows)
                "pool_may_add": (room.get("pools") or {}).get(known.get("pool"))
                if known and known.get("pool")
                else None,
                # the devices of each node it may add (None: a pool given in devices, or none)
                "pool_node_devices": (room.get("node_devices") or {}).get(known.get("pool"))
                if known and known.get("pool")
                else None,
            }
        )
    for request in requests:
        request["says"] = _says(request)
    # (``unknown`` is the room's: requests on a tier the hub does not know are "tier_unknown")
    totals = {FRAGMENTATION: 0, SHORTAGE: 0, FITS: 0, NEW_NODE: 0, "tier_unknown": 0}
    for (_, _, verdict), count in groups.items():
        totals["tier_unknown" if verdict == "unknown" else verdict] += count
    return {"unknown": None, "read_age_s": round(age, 1), **totals, "requests": requests}


def _on_new_nodes(nodes: dict[int, int], need: int, left: int) -> int:
    """Places up to ``left`` servers of ``need`` devices on the nodes a pool may add
    (``nodes``: {devices free: how many such nodes}, updated), best fit: the nodes with the
    least room first, each filled with whole servers; returns the servers left over. O(the
    distinct room sizes), however many nodes."""
    for free in sorted(nodes):
        if left <= 0:
            break
        per, count = free // need, nodes[free]
        if per <= 0 or count <= 0:
            continue
        used = min(count, -(-left // per))  # nodes filled, the last maybe in part
        servers = min(left, used * per)
        nodes[free] -= used
        full, last = divmod(servers, per)
        after = free - per * need
        nodes[after] = nodes.get(after, 0) + full
        if last:
            nodes[free - last * need] = nodes.get(free - last * need, 0) + 1
        left -= servers
    return left


_STATE_WORDS = {"pending": "starting", "queued": "in line", "refused": "refused"}
_BLOCKED_WORDS = {
    None: "room on a node now (the cards are not what holds it)",
    FRAGMENTATION: "blocked by fragmentation: enough free in all, on no one node",
    SHORTAGE: "blocked by a shortage: too few free",
    NEW_NODE: "waiting for a node: none has room, and the autoscaler may add one",
    "unknown": "its tier is not one the hub knows",
}


def _says(request: Mapping) -> str:
    """A ``placement`` group in words, as the dashboard and the command line show it."""
    state = _STATE_WORDS.get(request["state"], request["state"])
    head = f"{request['count']} {state} for {request['tier']}"
    if request["needs"] is None:
        return f"{head}: {_BLOCKED_WORDS['unknown']}"
    grows, per = request.get("pool_may_add"), request.get("pool_node_devices")
    if grows is not None:
        n = grows // per if per else 0
        grows = f"; its pool may add {grows} more" + (
            f" ({n} node{'' if n == 1 else 's'} of {per})" if per else ""
        )
    return (
        f"{head} ({request['needs']} x {request['resource']} on one node): "
        f"{_BLOCKED_WORDS[request['blocked_by']]} — {request['free']} free on its "
        f"{request['nodes']} node{'' if request['nodes'] == 1 else 's'}, "
        f"at most {request['most_on_a_node']} on one{grows or ''}"
    )
