"""How much of each physical GPU card is handed out, for the diagnosis's fragmentation figure
(``GET api/diagnosis``): DCGM's view where it sees the card, else the running servers' reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..diagnose import cluster
from .dcgm import GpuEvidence


def allocation(reports: Iterable[Mapping], evidence: Iterable[GpuEvidence] = ()) -> list[float]:
    """Per physical card, the share allocated (``diagnose.cluster.card_shares``): DCGM's view
    where it sees the card (a whole card or MIG instance held by a pod: allocated; none: free;
    a time-sliced card: its memory in use), else the running servers' reports (a device a
    server holds alone: allocated in full, whatever memory it uses; a shared one: its memory
    share; a MIG slice: its profile's share)."""
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
    for report in reports:
        for d in report.get("devices") or ():
            card = d.get("parent_uuid") or d.get("uuid")
            if not card or card in dcgm_cards:
                continue
            profile = d.get("mig_profile")
            if profile:
                share = cluster.mig_share(profile)
            elif d.get("shared"):
                share = _memory_share(
                    d.get("memory_used_mb"),
                    None if d.get("memory_total_mb") is None or d.get("memory_used_mb") is None
                    else d["memory_total_mb"] - d["memory_used_mb"],
                )  # fmt: skip
            else:
                share = 1.0
            seen[(card, profile, d.get("uuid"))] = (card, profile, share)
    return cluster.card_shares(seen.values())


def _memory_share(used: float | None, free: float | None) -> float | None:
    if used is None or free is None or used + free <= 0:
        return None
    return min(1.0, used / (used + free))
