"""The usage ledger's side of the governor: an observation of each server a pass looks at (the
others the ledger's sweep sees as they were), culls and extensions counted, the ledger written
to the store every ``usage_write_every``; and each session's measured use, for right-sizing."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from ..core import clock, grant, ledger, rightsize
from ..core.policy import ServerView
from ..core.text import stored_name
from ..diagnose import cluster
from . import metrics
from .hubapi import HubServer
from .store import StoreUnavailable
from .tables import AuditRow

log = logging.getLogger("jupyter_gpu_gov.hub")


class _Use:
    """A server's measured GPU use this session, from its reports (for right-sizing)."""

    def __init__(self, session: str | None):
        self.session = session  # the report's server.started: a new value, a new session
        self.meter = rightsize.Meter()  # the same peaks the what-if measures from a trace

    def add(self, report: Mapping, at: datetime) -> None:
        holders = [t["gpu"] for t in report["targets"] if t["gpu"]["holds_context"]]
        if holders:
            memory = sum(g.get("memory_mb") or 0 for g in holders)
            activity = max((g.get("sm") or 0 for g in holders), default=0)
            self.meter.add(memory, activity, at)

    def measured(self) -> rightsize.Use | None:
        return self.meter.measured()


_LEDGER_EVENTS = {"cull": "culls", "extend": "extensions", "approve": "extensions"}


_BILLED = (*ledger.STATES, ledger.UNOBSERVED)  # what GPU_SECONDS counts, by state


def owner_of(view: ServerView) -> ledger.Owner:
    # (The user's name as the ledger keeps it: bounded, text every store takes.)
    user = stored_name(view.user)
    return ledger.Owner(user, view.team or "", view.project or "", view.tier or "")


class Usage:
    """The usage ledger and measured use (a part of ``Governor``)."""

    def _observe(self, server: HubServer, view: ServerView, now: datetime) -> None:
        """One look at a running server for the usage ledger."""
        key = view.key
        received = self.reports.get(key)
        fresh = received is not None and now - received.at <= self.options.report_stale_after
        # A report that contradicts the Hub's records is not believed (``trusted``): nor billed.
        report = received.report if fresh and not self._distrusted.get(key) else None
        gpus = self.gpu_equivalents(view, report, server)
        if view.gpu is None or view.gpu.active is None:
            state = ledger.UNKNOWN
        elif view.gpu.active:
            state = ledger.ACTIVE
        elif report is not None and any(t["gpu"]["holds_context"] for t in report["targets"]):
            state = ledger.IDLE_HELD
        else:
            state = ledger.IDLE_FREE
        self.ledger.observe(
            ledger.Observation(
                server=key,
                session=clock.isoformat(server.started) or "unknown",
                at=now,
                owner=owner_of(view),
                gpus=gpus,
                state=state,
                started=server.started,
                right_size_share=self._right_size_share(view),
            )
        )

    def _right_size_share(self, view: ServerView) -> float | None:
        """The share of its tier the server's measured use fits in (``None``: no smaller tier
        fits, or none is configured)."""
        if not self.options.tier_sizes:
            return None
        row = self.rows.get(view.key)
        fit = self._right_size_fit(row) if row is not None else None
        current = self.options.tier_sizes.get(view.tier or "")
        return fit[0].weight / current.weight if fit and current else None

    def gpu_equivalents(
        self, view: ServerView, report: Mapping | None, server: HubServer | None = None
    ) -> float:
        """GPU-equivalents a server holds: its grant's ``gpu-gov/weight``, else the tier's
        configured weight, else what the Hub's records say it holds (the devices the
        workstation allocator pinned, the GPUs DCGM attributes to its pod: a whole GPU 1, a
        MIG slice its share of compute), else its reported devices, else 1 for a server with a
        GPU tier, else 0 (no GPU). The records before the report: a report naming its whole
        card a "1g.10gb" slice was billed a seventh of it."""
        weight = grant.weight(view.labels)
        if weight is not None:
            return weight
        tier_weight = self.options.by_tier(self.options.tier_weights, view.tier)
        if tier_weight is not None:
            return float(tier_weight)
        granted, found = self._records_of(server) if server is not None else (None, ())
        pinned = granted.devices if granted is not None else ()
        if pinned:  # the allocator's leaves: which instance, not only which profile
            return float(sum(cluster.mig_share(d.mig_profile) for d in pinned))
        leaves = {(e.uuid, e.gpu_instance_id): e.mig_profile for e in found}
        if leaves:
            return float(sum(cluster.mig_share(profile) for profile in leaves.values()))
        if report is not None and report["backend"] not in ("none", "unavailable"):
            return float(sum(cluster.mig_share(d.get("mig_profile")) for d in report["devices"]))
        return 1.0 if view.tier and view.tier != "no-gpu" else 0.0

    def _count(self, audits: Sequence[AuditRow]) -> None:
        """Culls (once done: their row has its outcome) and extensions count in the ledger."""
        for row in audits:
            if row.dry_run or (row.action == "cull" and "outcome" not in (row.details or {})):
                continue
            name = _LEDGER_EVENTS.get(row.action)
            if name == "extensions" and not row.reason.startswith(("granted", "extension app")):
                continue  # refused or waiting for an admin: no time was given
            server_row = self.row(row.server_key) if row.server_key else None
            if name is None or server_row is None:
                continue
            owner = ledger.Owner(
                server_row.user,
                server_row.team or "",
                server_row.project or "",
                server_row.tier or "",
            )
            self.ledger.event(row.server_key, owner, row.at, name)

    def flush_usage(self) -> None:
        """Write what the ledger has accrued: before anyone reads the usage, and at stop."""
        self._save_usage(force=True)

    def _save_usage(self, force: bool = False) -> None:
        """The ledger's accruals, written every ``usage_write_every`` (``force``: now)."""
        drained = self._drain_usage(force)
        if drained is not None:
            try:
                self.store.save_usage(*drained[1:])
            except StoreUnavailable as error:
                self._usage_refused(error, *drained)
            else:
                self._usage_written(drained[1])

    async def flush_usage_async(self) -> None:
        """``flush_usage``, the event loop running while it is written (a page's)."""
        await self._save_usage_async(force=True)

    async def _save_usage_async(self, force: bool = False) -> None:
        """``_save_usage``, the event loop running while it is written (a pass's)."""
        drained = self._drain_usage(force)
        if drained is not None:
            try:
                await self.store.save_usage_async(*drained[1:])
            except StoreUnavailable as error:
                self._usage_refused(error, *drained)
            else:
                self._usage_written(drained[1])

    def _drain_usage(self, force: bool) -> tuple | None:
        """(when last written, deltas, sessions) if a write is due. Drained now, written at
        ``now``: another write asked before this one is on record is not due yet."""
        now = clock.utcnow()
        last = self._usage_written_at
        if not force and last is not None and now - last < self.options.usage_write_every:
            return None
        self._usage_written_at = now
        return (last, *self.ledger.drain())

    def _usage_refused(self, error: StoreUnavailable, last, deltas, sessions) -> None:
        """Kept for the next write, which is due again."""
        log.error("gpu-gov: %s; the usage ledger is written later", error)
        metrics.STORE_ERRORS.inc()
        self.ledger.give_back(deltas, sessions)
        self._usage_written_at = last

    def _usage_written(self, deltas: dict) -> None:
        counters = {}  # (team, state) -> its series, looked up once (labels() is not free)
        for (_, owner), values in deltas.items():
            for state in _BILLED:
                if values.get(state):
                    counter = counters.get((owner.team, state))
                    if counter is None:
                        counter = counters[owner.team, state] = metrics.GPU_SECONDS.labels(
                            owner.team, state
                        )
                    counter.inc(values[state])
