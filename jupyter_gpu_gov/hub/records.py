"""The governor's writes to its store: a pass's decisions on record before any is acted on,
the outcomes after, a person's request in one transaction, and the audit rows they carry."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core import clock
from ..core.policy import Record
from ..core.text import stored_name
from ..core.vocabulary import INTERRUPT
from . import metrics, outbound
from .store import StoreUnavailable
from .tables import AuditRow, ExtensionRow, ServerRow, record_of, set_record

if TYPE_CHECKING:
    from .reconcile import _Batch

log = logging.getLogger("jupyter_gpu_gov.hub")


# Seconds passes pause after the store refused a pass's decisions.
STORE_RETRY_AFTER = 5.0


class Records:
    """What the governor puts on record (a part of ``Governor``)."""

    def save_audits(self, audits: Sequence[AuditRow]) -> None:
        """Store audit rows; culls and extensions also count in the usage ledger."""
        self.store.audit(audits)
        self._count(audits)
        self._save_usage()

    async def save_decisions(self, rows: Sequence[ServerRow], audits: Sequence[AuditRow]) -> bool:
        """A pass's decisions and their audit rows, on record before any is acted on (written
        in the store's writer thread while the loop answers reports). False when the store
        cannot take them: nothing is acted on, and what this service holds in memory is
        dropped, so the next pass decides again from what the store has."""
        # Until they are on record, the servers' verdicts ask nothing new of them (a report
        # answered meanwhile got the checkpoint a write then failed to record).
        self._unrecorded = frozenset(row.key for row in rows)
        try:
            await self.store.save_async(rows, audits)
        except StoreUnavailable as error:
            self._refused(error)
            # An interrupt rides on the verdict from its decision, with the checkpoint asked
            # with it (the rows, read again from the store, no longer ask it): not on record,
            # it is not asked.
            asked = (a.server_key for a in audits if a.action == INTERRUPT and not a.dry_run)
            outbound.dropped(asked, self._interrupts)
            return False
        finally:
            self._unrecorded = frozenset()
        self._count(audits)
        await self._save_usage_async()
        return True

    def _refused(self, error: StoreUnavailable) -> None:
        log.error("gpu-gov: %s; acting on nothing until it can be written", error)
        metrics.STORE_ERRORS.inc()
        self._rows = None
        self._store_down_until = time.monotonic() + STORE_RETRY_AFTER

    def save_outcomes(
        self, rows: Sequence[ServerRow], audits: Sequence[AuditRow], completed: Sequence[AuditRow]
    ) -> None:
        """What the actions came to: a cull's outcome on its audit row, a failed cull's row."""
        try:
            self.store.save(rows, audits, updated_audits=completed)
        except StoreUnavailable as error:
            self._outcomes_lost(error, len(completed) + len(audits))
        self._count(completed)

    async def save_outcomes_async(
        self, rows: Sequence[ServerRow], audits: Sequence[AuditRow], completed: Sequence[AuditRow]
    ) -> None:
        """``save_outcomes``, the event loop running while they are written (a pass's)."""
        try:
            await self.store.save_async(rows, audits, updated_audits=completed)
        except StoreUnavailable as error:
            self._outcomes_lost(error, len(completed) + len(audits))
        self._count(completed)

    def _outcomes_lost(self, error: StoreUnavailable, actions: int) -> None:
        # done, and its decision is on record: say so
        log.error("gpu-gov: %s; the outcome of %d action(s) is not on record", error, actions)
        metrics.STORE_ERRORS.inc()
        self._rows = None

    def _commit(
        self,
        row: ServerRow,
        record: Record,
        audits: Sequence[AuditRow],
        *,
        extensions: Sequence[ExtensionRow] = (),
        updated_extensions: Sequence[ExtensionRow] = (),
        cull_reason: str | None = None,
    ) -> None:
        """A person's request, all or nothing: the row's new record, its audit row and any
        extension requests, in one transaction. If the store cannot take it, the row stays as
        it was and ``StoreUnavailable`` says why; nothing was changed or done."""
        before, before_reason = record_of(row), row.cull_reason
        set_record(row, record)
        row.cull_reason = cull_reason or row.cull_reason
        try:
            self.store.save([row], audits, extensions, updated_extensions=updated_extensions)
        except StoreUnavailable:
            metrics.STORE_ERRORS.inc()
            set_record(row, before)
            row.cull_reason = before_reason
            raise
        self._count(audits)
        self._save_usage()

    def _audit_row(
        self,
        row: ServerRow | None,
        action: str,
        reason: str,
        *,
        actor: str = "governor",
        dry_run: bool = False,
        details: dict | None = None,
    ) -> AuditRow:
        return AuditRow.made(
            at=clock.utcnow(),
            server_key=row and row.key,  # None: not about a server (a node)
            user=row and row.user,
            action=action,
            reason=reason,
            actor=actor,
            dry_run=dry_run,
            details=details,
        )

    def _skipped(self, key: str, user: str, error: Exception, batch: _Batch) -> None:
        """A server whose decision failed: logged, audited (once per distinct error), skipped
        this pass; the others are decided as usual."""
        what = f"{type(error).__name__}: {error}"[:500]
        log.error("gpu-gov: deciding %s failed, skipped this pass: %s", key, what, exc_info=True)
        if self._failing.get(key) != what:
            self._failing[key] = what
            batch.audits.append(
                AuditRow(
                    at=clock.utcnow(),
                    server_key=key,
                    user=stored_name(user),
                    action="error",
                    reason=f"not decided (skipped until it can be): {what}",
                    actor="governor",
                )
            )
