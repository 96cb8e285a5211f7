"""What the governor's diagnosis reads besides the report: the window's node and DCGM's columns
for the server's GPUs, and the bounded history of windows that training rebuilds the model from
(``hub/diagnosis.py`` scores and trains)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

from ..diagnose.features import Window
from .dcgm import GpuEvidence


def node_of(report: Mapping, evidence: Sequence[GpuEvidence]) -> str | None:
    """The window's ``node``: DCGM's hostname of the server's GPUs; without DCGM, the kind of
    GPU it uses ("NVIDIA H100 80GB HBM3", "… MIG 1g.18gb"), so servers on the same kind of card
    share a model (a report does not name its machine)."""
    hostnames = [e.hostname for e in evidence if e.hostname]
    if hostnames:
        return min(hostnames)
    for device in report.get("devices") or ():
        name = device.get("name")
        if name:
            profile = device.get("mig_profile")
            return f"{name} MIG {profile}" if profile and profile not in name else name
    return None


def dcgm_fields(evidence: Sequence[GpuEvidence]) -> dict:
    """A server's DCGM columns from the evidence of its GPUs: the busiest GPU's SM, GR-engine,
    DRAM and tensor activity (as the report's ``sm`` is its busiest device's), PCIe summed, in
    MB/s. Missing stays missing (none at all without evidence: most reports, without DCGM)."""
    if not evidence:
        return {}

    def busiest(values: Iterable[float | None]) -> float | None:
        known = [v for v in values if v is not None and math.isfinite(v)]
        return max(known) if known else None

    pcie = [e.pcie_bytes_per_s for e in evidence if e.pcie_bytes_per_s is not None]
    return {
        "sm_active": busiest(e.sm_active for e in evidence),
        "gr_active": busiest(e.gr_active for e in evidence),
        "dram_active": busiest(e.dram_active for e in evidence),
        "tensor_active": busiest(e.tensor_active for e in evidence),
        "pcie_mb_s": round(sum(pcie) / 1e6, 3) if pcie else None,
    }


class History:
    """Windows per server, oldest out first once older than ``max_age`` or beyond ``limit`` in
    all: one FIFO over every server, so a cap costs O(1) per window (and a move of the pointers
    to the server's own windows: a week of one a minute is 10,080, 80 kB).

    A server's windows are a list, not a deque: a deque holds a 0.5 kB block from its first
    item, and most servers hold a few windows (10,000 servers' deques were 10 MB)."""

    def __init__(self, max_age: timedelta, limit: int):
        self.max_age = max_age.total_seconds()
        self.limit = limit
        self.by_server: dict[str, list[Window]] = {}
        self._order: deque[tuple[float, str]] = deque()  # (when added, server) per window

    def __len__(self) -> int:
        return len(self._order)

    def add(self, key: str, window: Window, now: float) -> None:
        windows = self.by_server.get(key)
        if windows is None:
            self.by_server[key] = [window]
        else:
            windows.append(window)
        self._order.append((now, key))
        self.trim(now)

    def trim(self, now: float) -> None:
        order = self._order
        while order and (len(order) > self.limit or now - order[0][0] > self.max_age):
            _, key = order.popleft()
            windows = self.by_server[key]
            del windows[0]
            if not windows:
                del self.by_server[key]

    def windows(self) -> list[Window]:
        return [w for windows in self.by_server.values() for w in windows]
