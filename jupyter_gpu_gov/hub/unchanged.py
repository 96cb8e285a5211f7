"""Deciding only the servers whose inputs changed (issue 26; docs/benchmarks-history.md, "Scale").

A decision is a function of the server's Hub model, its last report, DCGM's evidence on its
GPUs, the team map, the policies, its record and the time. After a decision that changed
nothing (no row, audit or action), ``Unchanged`` keeps those inputs and ``policy.holds_until``
(until when the same inputs decide the same). At the next pass a server whose inputs are all
equal and whose time has not come keeps its decision: nothing would have been written, said
or done for it. Anything that cannot be compared cheaply (a checkpoint answer waiting, a
kernel shutdown asked, a report not believed, a failed decision) decides as before.

Every ``full_every`` passes (``Options.full_pass_every``) every server is decided, as a safety
net; ``1`` decides every server at every pass (the plain path, kept for comparison: tests
run both side by side and compare every verdict, row, audit and action).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter

from ..core.policy import Policy, Record, ServerView
from ..core.wire import Target, TargetGpu
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
        evidence: tuple,
        now: datetime,
        stale_at: datetime | None,
    ) -> ServerView | None:
        """The view a server was decided on when nothing it depends on changed and its time has
        not come (nor ``stale_at``, when its report or diagnosis goes stale), else ``None``
        (decide it)."""
        kept = self.kept.get(key)
        if (
            kept is None
            or (kept.until is not None and now >= kept.until)
            or (stale_at is not None and now >= stale_at)
            or row is not kept.row
            or not row.running
            or server != kept.server
            or not same_report(received, kept.received)
            or evidence != kept.evidence
            or record_of(row) != kept.record
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
