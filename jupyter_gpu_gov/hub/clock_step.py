"""A step of the wall clock (NTP, a VM resumed), adopted at a pass: every time the governor
keeps moves by the step, so what was observed on the monotonic clock is what counts."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from ..core import clock
from .applied_policy import keep_moved_in_force
from .evidence import Received
from .store import StoreUnavailable
from .tables import AuditRow, record_of, set_record

log = logging.getLogger("jupyter_gpu_gov.hub")


class ClockStep:
    """Times kept as observed across a step of the wall clock (a part of ``Governor``)."""

    def _keep_to_the_stores_clock(self) -> None:
        """At a start or a takeover, before anything is read or received: when what the store
        keeps (a server's row, a billed interval) was written after the wall clock now reads,
        the clock stepped back while no governor here ran (a VM resumed with its clock
        corrected; the holder before on a machine whose clock was ahead). Everything then keeps
        to the clock those times were written by, and the first pass that acts adopts the step
        as one seen while running: every kept time moved back by as much, audited, the time no
        governor ran read as none (it cannot be told from the step). Left so, every idle time,
        notice and deadline counted from a time still to come: a warned server waited the
        whole step for its cull, an idle one read as not idle yet, no hour was billed."""
        kept = [self.store.newest_server_write()]
        kept += [session.at for session in self.ledger.open.values()]
        newest = max((t for t in kept if t is not None), default=None)
        now = clock.utcnow()
        if newest is None or (newest - now).total_seconds() <= clock.STEP_TOLERANCE:
            return
        log.warning(
            "gpu-gov: the store's times reach %s, %.0f s after now: the wall clock stepped "
            "back while no governor here ran; the first pass moves them back by as much",
            clock.isoformat(newest),
            (newest - now).total_seconds(),
        )
        clock.defer_step((now - newest).total_seconds())

    async def _clock_stepped(self, delta: timedelta) -> None:
        """The wall clock stepped by ``delta`` since the last pass: move every time the governor
        keeps by as much, so each idle stretch, warning's notice, exemption and billed interval
        lasts what was observed (on the monotonic clock), not what the step made of it."""
        log.warning(
            "gpu-gov: the wall clock stepped by %+.0f s; times kept as observed",
            delta.total_seconds(),
        )
        rows = list(self.rows.values())
        for row in rows:
            set_record(row, clock.shifted(record_of(row), delta))
            row.warn_at = row.warn_at and row.warn_at + delta
            row.cull_at = row.cull_at and row.cull_at + delta
        self._shift_kept(delta)
        why = f"the wall clock stepped by {delta.total_seconds():+.0f} s: deadlines, idle times and billed intervals kept as observed"
        audit = AuditRow(at=clock.utcnow(), action="clock-step", reason=why, actor="governor")
        if await self.save_decisions(rows, [audit]):
            try:
                await keep_moved_in_force(self.store, self.policies)
            except StoreUnavailable as error:  # a start reads them as they were (not_after)
                log.error("gpu-gov: the policies' in-force times, moved, are not kept: %s", error)
        else:
            # Not on record: the rows are read again from the store, as they were. The rest is
            # put back, and the step left to a pass that can record it (else those rows would
            # keep their times across it: a notice cut short by a forward step).
            self._shift_kept(-delta)
            clock.defer_step(delta.total_seconds())

    def _shift_kept(self, delta: timedelta) -> None:
        """Move the times kept in memory beside the rows by ``delta``."""
        self.reports = {
            k: Received(r.report, r.at + delta, r.gpu_since and r.gpu_since + delta)
            for k, r in self.reports.items()
        }
        self._checkpoints = {k: clock.shifted(c, delta) for k, c in self._checkpoints.items()}
        self._shutdowns = {k: clock.shifted(s, delta) for k, s in self._shutdowns.items()}
        self._interrupts = {k: clock.shifted(s, delta) for k, s in self._interrupts.items()}
        # (the session is the Hub's start, compared with the row's: not moved)
        self._cull_failures = {
            k: f._replace(at=f.at + delta) for k, f in self._cull_failures.items()
        }
        self.ledger.shift(delta)
        # When an applied policy came in force: the notices it gives count from then.
        self.policies = [
            p if p.in_force_since is None else replace(p, in_force_since=p.in_force_since + delta)
            for p in self.policies
        ]
        if self._usage_written_at is not None:
            self._usage_written_at += delta
        if self._dcgm_latest is not None:
            self._dcgm_latest = clock.shifted(self._dcgm_latest, delta)
