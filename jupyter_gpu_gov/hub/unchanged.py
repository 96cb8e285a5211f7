"""Deciding only the servers whose inputs changed (issue 26; docs/benchmarks-history.md, "Scale").

A decision is a function of the server's Hub model, its last report, DCGM's evidence on its
GPUs, the team map, the policies, its record and the time. After a decision that changed
nothing (no row, audit or action), ``Unchanged`` keeps those inputs and ``policy.holds_until``
(until when the same inputs decide the same). At the next pass a server whose inputs are all
equal and whose time has not come keeps its decision: nothing would have been written, said
or done for it. A decision that wrote its row (a change of state, a warning) with nothing left
to do is kept so too when deciding again on the same inputs would write nothing
(``Incremental._settled``). Anything that cannot be compared cheaply (a checkpoint answer waiting, a
kernel shutdown asked, a report not believed, a failed decision) decides as before.

Every ``full_every`` passes (``Options.full_pass_every``) every server is decided, as a safety
net; ``1`` decides every server at every pass (the plain path, kept for comparison: tests
run both side by side and compare every verdict, row, audit and action).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import NamedTuple

from ..core.health import Health
from ..core.policy import Policy, Record, ServerView
from ..core.wire import Target, TargetGpu
from ..replay.history import activity_step, memory_step
from .dcgm import GpuEvidence
from .evidence import Received
from .hubapi import HubServer
from .ingest import SECTIONS, KeptReport, Section
from .tables import ServerRow, record_of


@dataclass
class Kept:
    """What a server's last steady decision read, and the view it decided on."""

    server: HubServer
    # The report it read, or a later one the same for a decision (``same_report``): the latest
    # is kept in its place, so that no server's older report stays in memory for this.
    received: Received | None
    evidence: tuple  # what else it read: the cause, DCGM's evidence
    row: ServerRow
    record: Record
    view: ServerView
    until: datetime | None  # decide again from then on (None: not by time alone)
    # (and once its report or diagnosis goes stale: the hub works that out from the latest)
    # What it looked DCGM's records up by (``trusted.dcgm_keys``): a read that moved only
    # other GPUs' and pods' records leaves its decision as it was.
    dcgm_keys: tuple[str, ...] = ()


# What moves in every report without changing any decision: when it was taken, and each
# target's last activity and CPU use (read by the diagnosis, whose cause is compared apart, and
# by right-sizing, which the verdict reads live). ``decide`` reads neither. The rest of each
# kept section (``hub.ingest.Section``, absent fields too), compared at once.
_MOVING = frozenset(("sampled_at", "targets"))
_MOVING_TARGET = frozenset(("last_activity", "cpu", "gpu"))
_MOVING_GPU = frozenset(("last_active",))


def _steady(kind: type, moving: frozenset) -> attrgetter:
    return attrgetter(*(name for name in kind._names if name not in moving))


_STEADY_REPORT = _steady(KeptReport, _MOVING)
_STEADY_TARGET = _steady(SECTIONS[Target], _MOVING_TARGET)
_STEADY_GPU = _steady(SECTIONS[TargetGpu], _MOVING_GPU)


def same_report(a: Received | None, b: Received | None) -> bool:
    """The same report as far as a decision reads it. What arrives later only moves the
    staleness deadline later: the kept one falls due first."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    x, y = a.report, b.report
    if _STEADY_REPORT(x) != _STEADY_REPORT(y):
        return False
    xs, ys = x.targets, y.targets
    return len(xs) == len(ys) and all(map(_same_target, xs, ys))


def _same_target(x: Section, y: Section) -> bool:
    return _STEADY_TARGET(x) == _STEADY_TARGET(y) and _STEADY_GPU(x.gpu) == _STEADY_GPU(y.gpu)


class DcgmRead(NamedTuple):
    """What a pass reads of one DCGM record (``dcgm_read``): equal reads, the same decisions
    and the same history row. Which GPU and pod it is (how the record is found), its activity
    as each policy's idle threshold and the history's steps see it, whether its PCIe traffic
    reaches the floor (``dcgm.is_idle``), its memory used in the history's steps, its health."""

    uuid: str
    gpu_instance_id: int | None
    mig_profile: str | None
    namespace: str | None
    pod: str | None
    # (history's step, how many policies' idle thresholds it reaches); None: unknown
    activity: tuple[int, int] | None
    pcie_busy: bool | None  # at or over the floor; None: unknown
    memory: int | None  # history's step of memory used (``history.memory_step``)
    health: Health | None


def dcgm_read(
    idle_thresholds: Iterable[float], pcie_floor_bytes_per_s: float
) -> Callable[[GpuEvidence], DcgmRead]:
    """What a pass reads of a DCGM record, given the policies' idle thresholds and the PCIe
    floor. The rest of a record moves at every scrape of a real exporter though the GPU's work
    does not (power, memory free, clocks; a busy GPU's PCIe bytes; the SM, DRAM and tensor
    activity, which the diagnosis reads as a report arrives, its cause compared apart): compared
    whole, every server found in DCGM was looked at and decided again at every pass
    (docs/benchmarks-history.md, "Issue 26, wave 39"). The history reads the memory its GPUs
    use summed, where the report gives none: a sum that crosses a step while no GPU crosses its
    own is recorded at the server's next look or keyframe."""
    thresholds = sorted(set(idle_thresholds))
    # Each activity's (step, thresholds reached), by its value: a pass reads every record of
    # each new DCGM read (``Incremental._world_changed``), and an exporter's activities are
    # few values (its GPU_UTIL whole percents; a GPU that does not move reads the same).
    # At most ``_ACTIVITIES`` held. The record's read made by ``tuple.__new__``, as ``DcgmRead``'s
    # own ``__new__`` makes it, without that call.
    # At 10,000 servers (8,464 records) 37-73 -> 14-33 ms a read (medians 59 -> 21, load 11).
    steps: dict[float, tuple[int, int]] = {}
    new = tuple.__new__

    def stepped(activity: float) -> tuple[int, int]:
        if len(steps) >= _ACTIVITIES:
            steps.clear()
        step = steps[activity] = (activity_step(activity), bisect_right(thresholds, activity))
        return step

    def read(e: GpuEvidence) -> DcgmRead:
        activity, pcie, memory = e.activity, e.pcie_bytes_per_s, e.memory_used_mb
        return new(
            DcgmRead,
            (
                e.uuid,
                e.gpu_instance_id,
                e.mig_profile,
                e.namespace,
                e.pod,
                None if activity is None else (steps.get(activity) or stepped(activity)),
                None if pcie is None else pcie >= pcie_floor_bytes_per_s,
                None if memory is None else memory_step(memory),
                e.health,
            ),
        )

    return read


_ACTIVITIES = 1024  # activities ``dcgm_read`` holds the steps of (~0.15 MB at most)


class Unchanged:
    """The steady decisions of the last passes, by server key."""

    def __init__(self, full_every: int = 1):
        self.full_every = max(1, int(full_every))
        self.kept: dict[str, Kept] = {}
        self._passes = 0
        self._inputs: tuple = ()

    @property
    def enabled(self) -> bool:
        return self.full_every > 1

    def begin_pass(
        self, policies: Sequence[Policy], teams_by_group: Mapping[str, str], stepped: bool
    ) -> bool:
        """Start a pass; whether it decides every server (every ``full_every`` passes, after a
        step of the wall clock, and when the policies or team map changed)."""
        inputs = (tuple(policies), dict(teams_by_group))
        full = (
            not self.enabled
            or self._passes % self.full_every == 0
            or stepped
            or inputs != self._inputs
        )
        self._passes += 1
        self._inputs = inputs
        if full:
            self.kept.clear()
        return full

    def view(
        self,
        key: str,
        server: HubServer,
        row: ServerRow | None,
        received: Received | None,
        evidence: Callable[[], tuple],
        now: datetime,
        stale_at: datetime | None,
    ) -> ServerView | None:
        """The view a server was decided on when nothing it depends on changed and its time has
        not come (nor ``stale_at``, when its report or diagnosis goes stale), else ``None``
        (decide it). ``evidence`` gives what else it reads, worked out last: the dearest, and
        not needed once anything else moved."""
        kept = self.kept.get(key)
        if (
            kept is None
            or (kept.until is not None and now >= kept.until)
            or (stale_at is not None and now >= stale_at)
            or row is not kept.row
            or not row.running
            or server != kept.server
            or not same_report(received, kept.received)
            or record_of(row) != kept.record
            or evidence() != kept.evidence
        ):
            return None
        return kept.view

    def keep(self, key: str, kept: Kept | None) -> None:
        if kept is None or not self.enabled:
            self.kept.pop(key, None)
        else:
            self.kept[key] = kept

    def forget(self, key: str) -> None:
        self.kept.pop(key, None)
