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
    own packed windows: a week of one a minute is 10,080, about 1 MB).

    Packed, because at 10,000 servers the history is most of the service's memory: its default
    250,000 windows fill in 25 minutes at one a minute each. A window is kept as when it was
    added and the numbers it has, in the server's ``array('d')``, with a 16-bit mask of which
    it has and ``kernel_busy`` as two of its bits (a missing number, ``nan`` as ``None``, takes
    no room), and its ``(node, server)`` once for a run of windows with the same (a third bit
    marks where a run starts): about 122 bytes with its place in the FIFO when three of its
    numbers are missing (130 with a reference each, 146 when each missing number took 8; about
    590 as a ``Window`` object: docs/benchmarks-history.md, "Issue 26, wave 12"). ``of``,
    ``windows`` and ``unpack`` give back windows equal to those added."""

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
            if not packed.masks:
                del by_server[key]

    def of(self, key: str) -> list[Window]:
        """One server's windows, oldest first."""
        packed = self._by_server.get(key)
        return list(unpack([packed.parts()])) if packed is not None else []

    def windows(self) -> list[Window]:
        """Every window, server by server, each server's oldest first."""
        return list(unpack(self.snapshot()))

    def snapshot(self) -> list[tuple[array, array, list]]:
        """A copy of the packed windows (``unpack`` reads it), cheap enough to take on the event
        loop and read in another thread while this history goes on."""
        return [
            (array("d", p.numbers), array("H", p.masks), p.labels[:])
            for p in self._by_server.values()
        ]


def unpack(snapshot: Iterable[tuple[array, array, list]]) -> Iterator[Window]:
    """The windows of a ``History.snapshot``, one at a time."""
    for _, window in stamped(snapshot):
        yield window


def stamped(snapshot: Iterable[tuple[array, array, list]]) -> Iterator[tuple[float, Window]]:
    """The windows of a ``History.snapshot`` with when each was added, one at a time."""
    for numbers, masks, labels in snapshot:
        yield from _Packed.read(numbers, masks, labels)


_NUMBERS = COLUMNS[2:]  # after node and server
_BUSY = _NUMBERS.index("kernel_busy")
_VALUES = tuple(c for c in _NUMBERS if c != "kernel_busy")  # kept as numbers, when known
_BUSY_KNOWN = 1 << len(_VALUES)  # the mask's bits past the values': kernel_busy known, true
_BUSY_TRUE = _BUSY_KNOWN << 1
_RUN_STARTS = _BUSY_TRUE << 1  # the window's (node, server) is the next of the labels'
_VALUE_BITS = _BUSY_KNOWN - 1
assert COLUMNS[:2] == ("node", "server") and _RUN_STARTS < 1 << 16


def _places(mask: int) -> tuple[int, ...]:
    """Where in a window's numbers (``_NUMBERS``) each number a mask says it has goes."""
    return tuple(i + (i >= _BUSY) for i in range(len(_VALUES)) if mask >> i & 1)


_PLACES: dict[int, tuple[int, ...]] = {}  # by mask: the few masks a fleet's windows have


class _Packed:
    """One server's windows: ``numbers`` (when added, then the numbers it has), ``masks`` (one
    a window: which numbers, ``kernel_busy``, whether a run of the same label starts there) and
    ``labels``, one a run: a server's windows almost always share one."""

    __slots__ = ("labels", "masks", "numbers")

    def __init__(self) -> None:
        self.numbers = array("d")
        self.masks = array("H")
        self.labels: list[tuple[str | None, str | None]] = []

    def add(self, window: Window, now: float) -> None:
        columns = vars(window)  # every column is a field: what getattr reads, without a call
        row, mask = [now], 0
        for bit, column in enumerate(_VALUES):
            value = columns[column]
            if value is not None and value == value:  # nan: missing, as it reads back
                row.append(value)
                mask |= 1 << bit
        busy = columns["kernel_busy"]
        if busy is not None:
            busy = array("d", (busy,))[0]  # a number as the array takes one, else TypeError
            if busy == busy:
                mask |= _BUSY_KNOWN | (_BUSY_TRUE if busy == 1.0 else 0)
        label = (window.node, window.server)
        labels = self.labels
        fresh = not self.masks or labels[-1] != label
        self.numbers.fromlist(row)  # all or nothing: not a number raises TypeError
        self.masks.append(mask | _RUN_STARTS if fresh else mask)
        if fresh:
            labels.append(label)

    def drop_oldest(self) -> None:
        masks = self.masks
        del self.numbers[: 1 + (masks[0] & _VALUE_BITS).bit_count()]
        del masks[0]
        if not masks or masks[0] & _RUN_STARTS:
            del self.labels[0]  # its run ended with it
        else:
            masks[0] |= _RUN_STARTS  # the run goes on from here

    def parts(self) -> tuple[array, array, list]:
        return self.numbers, self.masks, self.labels

    @staticmethod
    def read(numbers: array, masks: array, labels: list) -> Iterator[tuple[float, Window]]:
        at, blank, runs = 0, [None] * len(_NUMBERS), iter(labels)
        node = server = None
        for mask in masks:
            if mask & _RUN_STARTS:
                node, server = next(runs)
            places = _PLACES.get(mask)
            if places is None:
                places = _PLACES[mask] = _places(mask & _VALUE_BITS)
            added, end = numbers[at], at + 1 + len(places)
            values: list = blank[:]
            for place, value in zip(places, numbers[at + 1 : end], strict=True):
                values[place] = value
            if mask & _BUSY_KNOWN:
                values[_BUSY] = bool(mask & _BUSY_TRUE)
            at = end
            yield added, Window(node, server, *values)
