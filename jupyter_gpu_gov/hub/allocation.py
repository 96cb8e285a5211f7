"""How much of each physical GPU card is handed out, for the diagnosis's fragmentation figure
(``GET api/diagnosis``): DCGM's view where it sees the card, else the workstation allocator's
records of what it pinned for each server, and the cards the workstation hub reads (its
allocator's NVML: a card none of them is pinned on is free). Never a server's report: its user
writes it, and a report naming made-up cards (or other users' cards as free) would move the
figure."""

from __future__ import annotations

from collections.abc import Iterable

from ..core.grant import GrantedDevice
from ..diagnose import cluster
from .dcgm import GpuEvidence


def allocation(
    granted: Iterable[Iterable[GrantedDevice]],
    evidence: Iterable[GpuEvidence] = (),
    cards: Iterable[str] = (),
) -> list[float]:
    """Per physical card, the share allocated (``diagnose.cluster.card_shares``): DCGM's view
    where it sees the card (a whole card or MIG instance held by a pod: allocated; none: free;
    a time-sliced card: its memory in use), else the devices the allocator pinned for the
    running servers (``granted``, one list a server, from its spawner's state: a whole card
    held by one server is allocated in full; a MIG slice, its profile's share; a card pinned
    for several servers, time-sliced, is unknown without DCGM and left out). ``cards``: the
    physical cards the workstation hub's allocator reads (the spawn queue's sync): one neither
    DCGM sees nor any running server's devices are pinned on is free. A card none of these
    knows of is not in the figure."""
    seen: dict[tuple, tuple[str, str | None, float | None]] = {}
    for e in evidence:
        card = e.uuid
        slot = (card, e.mig_profile, e.gpu_instance_id)
        held = e.pod is not None
        if e.mig_profile:
            share = cluster.mig_share(e.mig_profile) if held else 0.0
        elif not held:
            share = 0.0
        else:
            share = 1.0
        if slot in seen and held and not e.mig_profile:  # several pods: time-sliced
            share = _memory_share(e.memory_used_mb, e.memory_free_mb)
        seen[slot] = (card, e.mig_profile, share)
    dcgm_cards = {card for card, _, _ in seen.values()}
    for devices in granted:
        for d in devices:
            card = d.parent_uuid or d.uuid
            if card in dcgm_cards:
                continue
            slot = (card, d.mig_profile, d.uuid)
            share = cluster.mig_share(d.mig_profile) if d.mig_profile else 1.0
            if slot in seen:  # pinned for several servers: time-sliced, its use unknown here
                share = None
            seen[slot] = (card, d.mig_profile, share)
    counted = {card for card, _, _ in seen.values()}
    for card in cards:
        if card not in counted:
            seen[(card, None, None)] = (card, None, 0.0)
    return cluster.card_shares(seen.values())


def _memory_share(used: float | None, free: float | None) -> float | None:
    if used is None or free is None or used + free <= 0:
        return None
    return min(1.0, used / (used + free))
