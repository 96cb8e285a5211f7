"""What the governor's diagnosis reads besides the report: the window's node and DCGM's columns
for the server's GPUs, and the bounded history of windows that training rebuilds the model from
(``hub/diagnosis.py`` scores and trains)."""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import timedelta

from ..core import grant
from ..core.vocabulary import TIER_LABEL
from ..diagnose.features import COLUMNS, Window
from . import trusted
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


def trusted_node(
    spawner_state: Mapping | None, profile: str | None, by_uuid: Mapping, by_pod: Mapping
) -> str | None:
    """A learnt window's node, from what its user cannot write: DCGM's hostname of the GPUs the
    Hub's records give the server (the allocator's devices, KubeSpawner's pod); else the tier
    admission granted it (``tier h100``: its kind of card, as the card a report named was);
    else, for KubeSpawner's pod, the profile it runs (``profile a100``: KubeSpawner enforces
    it); else None: nothing names it but the report, which a user writes at will (one naming
    another card, or another pod's GPUs, taught that node's reference what its servers'
    windows are read against)."""
    granted = trusted.Granted.of(spawner_state)
    if granted is not None:
        hostnames = [e.hostname for e in granted.evidence(by_uuid, by_pod) if e.hostname]
        if hostnames:
            return min(hostnames)
    tier = grant.labels(spawner_state).get(TIER_LABEL)
    if tier:
        return f"tier {tier}"
    if granted is not None and granted.pod is not None and profile:
        return f"profile {profile}"
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
    all: one FIFO over every server, so a cap costs O(1) per window (and a move of the server's
    own packed windows: a week of one a minute is 10,080, 1.1 MB).

    Packed, because at 10,000 servers the history is most of the service's memory: its default
    250,000 windows fill in 25 minutes at one a minute each. A window is kept as its numbers in
    the server's ``array('d')`` (``nan`` for missing, ``kernel_busy`` as 1 or 0) with when it
    was added, and one reference to its ``(node, server)`` (shared with the window before it
    when the same): about 146 bytes with its place in the FIFO, against about 590 as a
    ``Window`` object (docs/benchmarks-history.md, "Issue 26, wave 12"). ``of``, ``windows`` and
    ``unpack`` give back windows equal to those added."""

    def __init__(self, max_age: timedelta, limit: int):
        self.max_age = max_age.total_seconds()
        self.limit = limit
        self._by_server: dict[str, _Packed] = {}
        self._order: deque[str] = deque()  # the server of each window, oldest first

    def __len__(self) -> int:
        return len(self._order)

    @property
    def servers(self) -> int:
        return len(self._by_server)

    def add(self, key: str, window: Window, now: float) -> None:
        packed = self._by_server.get(key) or _Packed()
        packed.add(window, now)  # a window it cannot keep raises before anything changed
        self._by_server[key] = packed
        self._order.append(key)
        self.trim(now)

    def trim(self, now: float) -> None:
        order, by_server = self._order, self._by_server
        while order:
            key = order[0]
            packed = by_server[key]
            if len(order) <= self.limit and now - packed.numbers[0] <= self.max_age:
                break
            order.popleft()
            packed.drop_oldest()
            if not packed.labels:
                del by_server[key]

    def of(self, key: str) -> list[Window]:
        """One server's windows, oldest first."""
        packed = self._by_server.get(key)
        return list(packed.windows()) if packed is not None else []

    def windows(self) -> list[Window]:
        """Every window, server by server, each server's oldest first."""
        return list(unpack(self.snapshot()))

    def snapshot(self) -> list[tuple[array, list]]:
        """A copy of the packed windows (``unpack`` reads it), cheap enough to take on the event
        loop and read in another thread while this history goes on."""
        return [(array("d", p.numbers), p.labels[:]) for p in self._by_server.values()]


def unpack(snapshot: Iterable[tuple[array, list]]) -> Iterator[Window]:
    """The windows of a ``History.snapshot``, one at a time."""
    for numbers, labels in snapshot:
        yield from _Packed.read(numbers, labels)


_NUMBERS = COLUMNS[2:]  # after node and server
_BUSY = _NUMBERS.index("kernel_busy")
_STRIDE = 1 + len(_NUMBERS)  # when added, then the window's numbers
_NAN = math.nan  # a missing number, read once a column a window
assert COLUMNS[:2] == ("node", "server")


class _Packed:
    """One server's windows: ``numbers`` (``_STRIDE`` a window) and a label each."""

    __slots__ = ("labels", "numbers")

    def __init__(self) -> None:
        self.numbers = array("d")
        self.labels: list[tuple[str | None, str | None]] = []

    def add(self, window: Window, now: float) -> None:
        columns = vars(window)  # every column is a field: what getattr reads, without a call
        numbers = self.numbers
        # all or nothing, as extend(array(...)) added them
        numbers.fromlist([now, *[_NAN if (v := columns[c]) is None else v for c in _NUMBERS]])
        label = (window.node, window.server)
        labels = self.labels
        labels.append(labels[-1] if labels and labels[-1] == label else label)

    def drop_oldest(self) -> None:
        del self.numbers[:_STRIDE]
        del self.labels[0]

    def windows(self) -> Iterator[Window]:
        return self.read(self.numbers, self.labels)

    @staticmethod
    def read(numbers: array, labels: list) -> Iterator[Window]:
        for i, (node, server) in enumerate(labels):
            row = numbers[i * _STRIDE + 1 : (i + 1) * _STRIDE]
            values: list = [None if v != v else v for v in row]  # nan: missing
            busy = values[_BUSY]
            if busy is not None:
                values[_BUSY] = busy == 1.0
            yield Window(node, server, *values)
