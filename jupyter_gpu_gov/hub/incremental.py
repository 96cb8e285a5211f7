"""Deciding only what changed (issue 26; a part of ``Governor``): which kept decisions hold
(``hub/unchanged.py``), and which servers a pass between full passes looks at
(``hub/deadlines.py``: the marks and the heap of next times)."""

from __future__ import annotations

from datetime import datetime

from ..core.policy import ServerView
from .dcgm import DcgmSnapshot
from .evidence import Received
from .hubapi import HubServer
from .tables import ServerRow, record_of
from .unchanged import Kept, same_report
from .views import cause_of


class Incremental:
    """Kept decisions and the servers to look at (a part of ``Governor``)."""

    def _inputs(self, key: str, server: HubServer, received: Received | None) -> tuple:
        """What a decision of this server reads besides its Hub model, report and record: the
        diagnosis's cause, and DCGM's evidence (the Hub's records' GPUs, the report's by pod
        and by UUID)."""
        context = self._context
        evidence = (cause_of(self.root_cause(key)), *self._granted_evidence(server))
        if received is not None:
            report = received.report
            evidence += (None, *self._evidence(report, context.by_uuid, context.by_pod))
            evidence += (None, *self._evidence(report, context.by_uuid, {}))
        return evidence

    def _special(self, key: str) -> bool:
        """Something is waiting on the server that the kept inputs do not show."""
        return (
            key in self._checkpoints
            or key in self._shutdowns
            or key in self._interrupts
            or key in self._distrusted
            or key in self._failing
        )

    def _kept_view(
        self, key: str, server: HubServer, row: ServerRow | None, now: datetime
    ) -> ServerView | None:
        """The view of a server whose inputs did not change since its last steady decision
        (nothing to decide), else ``None``."""
        kept = self.unchanged.kept.get(key)
        if kept is None or self._special(key):
            return None
        received = self.reports.get(key)
        inputs = self._inputs(key, server, received)
        stale_at = self._stale_at(key, received)
        view = self.unchanged.view(key, server, row, received, inputs, now, stale_at)
        if view is not None:
            self.due.at(key, _earliest(kept.until, stale_at))
        return view

    def _stale_at(self, key: str, received: Received | None) -> datetime | None:
        """When the server's latest report, or its diagnosis, goes stale (a later report the
        same for a decision moves it on)."""
        scored = self.diagnosis.results.get(key)
        times = [r.at for r in (received, scored) if r is not None]
        return min(times) + self.options.report_stale_after if times else None

    def _keep(self, key, server, row, received, view, until, now) -> None:
        stale_at = self._stale_at(key, received)
        if (
            (until is not None and until <= now)
            or (stale_at is not None and stale_at <= now)
            or self._special(key)
        ):
            self._unkeep(key)
            return
        inputs = self._inputs(key, server, received)
        kept = Kept(server, received, inputs, row, record_of(row), view, until)
        self.unchanged.keep(key, kept)
        self.due.at(key, _earliest(until, stale_at))

    def _commit(self, row: ServerRow, record, audits, **changes) -> None:
        """A person's request (``Records._commit``) changed the row's record outside a pass:
        its kept decision read the old one, so the next pass looks at it."""
        super()._commit(row, record, audits, **changes)
        self.due.mark(row.key)

    def _unkeep(self, key: str) -> None:
        """Its decision is not kept: decide it again at the next pass."""
        self.unchanged.forget(key)
        self.due.mark(key)

    def _report_moved(self, key: str) -> bool:
        """Whether the report that arrived, or the diagnosis it brought, differs from what the
        server's kept decision read (most say again what the last one did)."""
        kept = self.unchanged.kept.get(key)
        return (
            kept is None
            or self._special(key)
            or not same_report(self.reports.get(key), kept.received)
            or cause_of(self.root_cause(key)) != kept.evidence[0]
        )

    def _world_changed(self, snapshot: DcgmSnapshot | None) -> bool:
        """Whether what every kept decision read at once moved since the last pass: DCGM's
        evidence (a GPU's activity, memory or health), the diagnosis model."""
        evidence = snapshot.evidence if snapshot else ()
        trained = self.diagnosis.training.trained_at
        last, self._world = self._world, (evidence, trained)
        if not last or trained != last[1]:
            return True
        return evidence is not last[0] and evidence != last[0]


def _earliest(*times: datetime | None) -> datetime | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
