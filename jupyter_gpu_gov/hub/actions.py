"""Carrying out what the policy decided: each action is put on record first, then done —
a warning or notice (the verdict carries it), an interrupt or a checkpoint (asked in the
verdict: the governor never calls a user's server), a cull through the Hub API, and
jupyterhub-idle-culler's deletion of inactive users."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from ..core import clock
from ..core.durations import format_duration
from ..core.policy import Decision, Policy, evolve
from ..core.report import gpu_signal, user_last_activity
from ..core.text import stored_name
from ..core.vocabulary import (
    ADMIN,
    CHECKPOINT,
    CHECKPOINT_DONE,
    CHECKPOINT_FAILED,
    CHECKPOINT_REQUESTED,
    CHECKPOINT_TIMEOUT,
    CULL,
    GPU_IDLE,
    INTERRUPT,
    NOTICES,
    OWNER_STOP,
    SHUTDOWN_KERNELS,
    STOP_SERVER,
    WARNED,
    WARNINGS,
)
from . import metrics, outbound
from .checkpoints import CheckpointResult, checkpoint_fields
from .hubapi import HubApiError, HubServer, NotSent
from .tables import AuditRow, ServerRow, record_of, set_record

log = logging.getLogger("jupyter_gpu_gov.hub")


if TYPE_CHECKING:
    from .incremental import DecidedOn
    from .reconcile import _Batch


# A culled server the Hub still lists as ready this long after its cull was not stopped.
CULL_RETRY_AFTER = timedelta(minutes=2)
# A cull the Hub failed (5xx, no answer) is tried again after CULL_RETRY_AFTER, twice as long
# after each failure in a row up to this: not at every pass, each on record again.
CULL_BACKOFF_MOST = timedelta(minutes=30)


class CullFailed(NamedTuple):
    """The Hub failed this session's cull ``failures`` times in a row; tried again at ``at``."""

    session: datetime | None
    failures: int
    at: datetime


class Actions:
    """The pass's actions (a part of ``Governor``)."""

    def _act(
        self,
        action: str,
        server: HubServer,
        row: ServerRow,
        decision: Decision,
        server_policy: Policy,
        batch: _Batch,
    ):
        """Put an action on record (``batch.audits``, written before anything is done); return
        the coroutine that carries it out, if it is more than its record (a cull)."""
        dry = self.options.dry_run
        audits = batch.audits
        if action in WARNINGS or action in NOTICES:
            if action in WARNINGS:
                metrics.WARNINGS.inc()
            why = decision.notice or decision.reason
            audits.append(self._audit_row(row, action, why, dry_run=dry))
        elif action == INTERRUPT:
            # Asked in the server's verdict, before its checkpoint (hub/outbound.py).
            kernels = self._busy_gpu_kernels(row.key)
            details = {"kernels": list(kernels)}
            if not dry:
                self._interrupts[row.key] = outbound.KernelRequest(
                    outbound.INTERRUPT, kernels, clock.utcnow(), decision.reason
                )
                details["outcome"] = f"asked the server to interrupt {len(kernels)} kernel(s)"
            audits.append(
                self._audit_row(row, action, decision.reason, dry_run=dry, details=details)
            )
        elif action == CHECKPOINT:
            audits.append(self._audit_row(row, "checkpoint", decision.reason, dry_run=dry))
            requested_at = decision.record.checkpoint_requested_at
            if dry:
                self._checkpoints[row.key] = CheckpointResult(
                    CHECKPOINT_DONE, {"dry_run": True}, requested_at, dry_run=True
                )
            # Else the verdict asks the server (hub/outbound.py); its report brings the result.
        elif action == CULL:
            # The checkpoint of this deadline, if one was taken (not one of an earlier stretch).
            checkpointed = decision.record.checkpoint_status in (
                CHECKPOINT_DONE,
                CHECKPOINT_FAILED,
                CHECKPOINT_TIMEOUT,
            )
            manifest = row.checkpoint_manifest if checkpointed else None
            fields = checkpoint_fields(manifest)
            details = {
                "cull_action": server_policy.cull_action,
                "cull_reason": decision.cull_reason,
                "checkpoint": manifest,
                "checkpoint_id": fields["id"],
                "checkpoint_path": fields["path"],
                "policy": server_policy.name,
            }
            audit = self._audit_row(row, "cull", decision.reason, dry_run=dry, details=details)
            audits.append(audit)
            if not dry:
                fresh = self._read_this_pass(server)
                return self._carry_out_cull(
                    server, row, decision, server_policy, audit, batch, fresh, self._as_of(row)
                )
        return None

    def _interrupt_again(self, row: ServerRow) -> None:
        """The interrupt asked with a checkpoint is held in memory only: a service restart
        before the server fetched it lost it, and the checkpoint was asked alone while the
        record says the cell was interrupted and the cell ran on. The kernels still running
        the cell they ran when the interrupt went on record are asked again (not one started
        since: that cell is not the one interrupted)."""
        record = record_of(row)
        if (
            self.options.dry_run
            or row.key in self._interrupts
            or record.interrupted_at is None
            or record.checkpoint_status != CHECKPOINT_REQUESTED
            or record.checkpoint_requested_at != record.interrupted_at
            or row.key not in self.reports
        ):
            return
        kernels = tuple(
            t["id"]
            for t in self.reports[row.key].report["targets"]
            if t["kind"] == "kernel"
            and t["gpu"]["holds_context"]
            and t.get("execution_state") == "busy"
            and (clock.parse(t.get("busy_since")) or record.interrupted_at) < record.interrupted_at
        )
        if kernels:
            self._interrupts[row.key] = outbound.KernelRequest(
                outbound.INTERRUPT, kernels, clock.utcnow(), row.reason
            )

    def _cull_again(
        self,
        server: HubServer,
        row: ServerRow,
        decision: Decision,
        server_policy: Policy,
        now: datetime,
        batch: _Batch,
    ) -> None:
        """A server still running, ready, long after its cull went on record: the service
        stopped between recording the cull and carrying it out (or the Hub did not stop it).
        The cull is carried out again, once every ``CULL_RETRY_AFTER``, never decided anew."""
        culled_at = record_of(row).culled_at
        if self.options.dry_run or culled_at is None or now - culled_at < CULL_RETRY_AFTER:
            return
        failed = self._cull_failures.get(row.key)
        if failed is not None and failed.session == row.session_started and now < failed.at:
            return  # the Hub failed it: tried again after a pause (``_cull_failed``)
        if row.cull_reason == OWNER_STOP:  # the owner asked for the server to stop, not its kernels
            server_policy = replace(server_policy, cull_action=STOP_SERVER)
        set_record(row, replace(record_of(row), culled_at=now))
        batch.changed.append(row)
        why = f"{row.reason} (still running {format_duration(now - culled_at)} later: asked again)"
        audit = self._audit_row(
            row, "cull-retry", why, details={"cull_action": server_policy.cull_action}
        )
        batch.audits.append(audit)
        fresh = self._read_this_pass(server)
        batch.jobs.append(
            self._carry_out_cull(
                server, row, decision, server_policy, audit, batch, fresh, self._as_of(row)
            )
        )

    def _as_of(self, row: ServerRow) -> tuple:
        """What a cull is decided on that may change before it is carried out: the row's
        record and the server's latest report (``_changed_since``)."""
        return record_of(row), self.reports.get(row.key)

    def _changed_since(
        self, row: ServerRow, as_of: tuple, decision: Decision, server_policy: Policy
    ) -> str | None:
        """Why a cull no longer stands, or None. The event loop ran between its decision and
        now (the rest of the pass, the store's write, a slow Hub): a person's request changed
        the record (an admin's exemption or cull, an approval, the owner's Stop), or, for an
        idle GPU, a report since shows a cell running, GPU work or the owner at work — what
        the decision would have held the cull for (a hard deadline is not held)."""
        decided, received = as_of
        if record_of(row) is not decided:
            return f"its record changed since it was decided ({row.state}: {row.reason})"
        latest = self.reports.get(row.key)
        if (
            decision.cull_reason != GPU_IDLE
            or latest is None
            or latest is received
            or row.key in self._distrusted  # a report the records contradict is not believed
        ):
            return None
        signal = gpu_signal(
            latest.report,
            idle_threshold=server_policy.idle_threshold,
            cull_action=server_policy.cull_action,
        )
        if signal.kernel_busy_since is not None:
            return "a cell started since it was decided"
        if signal.active:
            return "the GPU worked since it was decided"
        before = user_last_activity(received.report) if received is not None else None
        now = user_last_activity(latest.report)
        if now is not None and (before is None or now > before):
            return "its owner was at work since it was decided"
        return None

    async def _carry_out_cull(
        self,
        server: HubServer,
        row: ServerRow,
        decision: Decision,
        server_policy: Policy,
        audit: AuditRow,
        batch: _Batch,
        fresh: bool,
        as_of: tuple,
    ) -> None:
        """The cull whose decision and audit row are on record; its outcome goes on that row.
        Not ``fresh``: decided on a Hub model not read in this pass, which is read first
        (``Incremental._still_as_decided``). Then what changed here since it was decided
        (``as_of``, ``_changed_since``) is read, again once the DELETE holds its slot to the
        Hub, the last thing before the Hub is asked."""
        # Counted first: shutting kernels down drops the server's report.
        gpus = self._gpus_held(row.key, server)
        try:
            changed = None if fresh else await self._still_as_decided(server, row)
            changed = changed or self._changed_since(row, as_of, decision, server_policy)
            if changed is None:
                # Checked again once the DELETE holds its slot to the Hub (a burst of culls
                # waits for slots, minutes against a slow Hub), then the Hub's own session:
                # its owner may have stopped and started it since, its new process silent yet.
                still = partial(self._changed_since, row, as_of, decision, server_policy)
                outcome = await self._cull(server, row, server_policy, still, server.started)
        except NotSent as withdrawn:
            changed = str(withdrawn)
            self.hub_listing.waiting.add(server.user)  # asked for at the next pass
        except Exception as error:  # recorded, decided and tried again after a pause
            log.error("gpu-gov: cull of %s failed: %s", row.key, error)
            again = self._cull_failed(row)
            why = (
                f"{decision.reason}; not culled: {error}; tried again at {again:%Y-%m-%d %H:%M} UTC"
            )
            if record_of(row) is as_of[0] and row.cull_reason in (OWNER_STOP, ADMIN):
                # A person's stop stands: sent again (``_cull_again``), never decided anew.
                set_record(row, replace(record_of(row), reason=why))
            elif record_of(row) is as_of[0]:  # (not a person's record made meanwhile)
                set_record(row, replace(record_of(row), state=WARNED, culled_at=None, reason=why))
            batch.after.append(row)
            batch.outcomes.append(self._audit_row(row, "cull-failed", why, details=audit.details))
            return
        if changed is not None:
            why = f"{decision.reason}; not culled: {changed}"
            self._not_culled(row, as_of[0], why, audit, batch)
            return
        self._cull_failures.pop(row.key, None)
        audit.details = {**audit.details, **self._cull_outcome(row, server_policy, outcome)}
        batch.completed.append(audit)
        batch.after.append(row)
        metrics.CULLS.labels(decision.cull_reason or GPU_IDLE, server_policy.cull_action).inc()
        if decision.cull_reason == GPU_IDLE:
            metrics.GPUS_RECLAIMED.inc(gpus)

    def _cull_outcome(self, row: ServerRow, server_policy: Policy, outcome: str) -> dict:
        """A cull's outcome for its audit row; a kernel shutdown's kernels with it, on record
        for a restart (``_shutdowns_on_record``)."""
        asked = self._shutdowns.get(row.key)
        if server_policy.cull_action == SHUTDOWN_KERNELS and asked is not None:
            return {"outcome": outcome, "kernels": list(asked.kernels)}
        return {"outcome": outcome}

    def _shutdowns_on_record(self, now: datetime) -> None:
        """The kernel shutdowns asked before this service started, still within their time
        (``report_stale_after``, as ``outbound.forget_answered``): held in memory only, they
        were lost at the restart, and the idle kernels kept their GPUs for a new cycle. Each is
        asked again as it was (its kernels' ids name those kernels only); a report showing them
        gone answers it."""
        if self.options.dry_run:
            return
        for audit in self.store.audit_since("cull", now - self.options.report_stale_after):
            details = audit.details if isinstance(audit.details, Mapping) else {}
            kernels = details.get("kernels")
            row = self.rows.get(audit.server_key or "")
            # (only a kernel shutdown's outcome names kernels: an admin's has no cull_action)
            if row is not None and row.running and isinstance(kernels, list):
                self._shutdowns[row.key] = outbound.KernelRequest(
                    outbound.SHUTDOWN, tuple(map(str, kernels)), audit.at, audit.reason
                )

    def _cull_failed(self, row: ServerRow) -> datetime:
        """When a cull the Hub just failed is tried again."""
        last = self._cull_failures.get(row.key)
        failures = last.failures + 1 if last and last.session == row.session_started else 1
        pause = min(CULL_RETRY_AFTER * 2 ** (failures - 1), CULL_BACKOFF_MOST)
        at = clock.utcnow() + pause
        self._cull_failures[row.key] = CullFailed(row.session_started, failures, at)
        return at

    def _cull_held(
        self, row: ServerRow, decided: DecidedOn, decision: Decision, now: datetime
    ) -> Decision:
        """A cull the Hub failed is not taken again before its time (``_cull_failed``): the
        server stays warned, its reason saying why and when, with nothing more on record."""
        failed = self._cull_failures.get(row.key)
        if (
            CULL not in decision.actions
            or failed is None
            or failed.session != row.session_started
            or now >= failed.at
        ):
            return decision
        return evolve(decision, record=decided.record, actions=())

    def _not_culled(self, row: ServerRow, decided, why: str, audit: AuditRow, batch) -> None:
        """A cull skipped, on record; the server is warned again (its record left as a person
        made it) and decided at the next pass."""
        if record_of(row) is decided:
            set_record(row, replace(decided, state=WARNED, culled_at=None))
        batch.after.append(row)
        batch.outcomes.append(self._audit_row(row, "cull-skipped", why, details=audit.details))
        self._unkeep(row.key)

    async def _cull(
        self,
        server: HubServer,
        row: ServerRow,
        server_policy: Policy,
        last_check=None,
        session: datetime | None = None,
    ) -> str:
        if server_policy.cull_action == SHUTDOWN_KERNELS and row.key in self.reports:
            # Asked in the server's verdict: the governor never calls a user's server.
            kernels = outbound.kernels_on_gpu(self.reports[row.key].report)
            self._shutdowns[row.key] = outbound.KernelRequest(
                outbound.SHUTDOWN, kernels, clock.utcnow(), row.reason
            )
            # The server keeps running without a GPU: start over with a fresh record.
            fresh = record_of(row).next_session()
            set_record(row, replace(fresh, reason=f"kernels shut down: {row.reason}"))
            self.reports.pop(row.key, None)
            return f"asked the server to shut down {len(kernels)} kernel(s)"
        remove = self.options.remove_named_servers and bool(server.name)
        # As jupyterhub-idle-culler: the user goes too once none of their servers runs, if
        # inactive (or created) long enough as the Hub saw them before the stop (a stop is
        # activity); after a slow stop, a later pass finds them among the inactive users.
        user = await self.hub.get_user(server.user) if self.options.cull_users else None
        outcome = await self.hub.stop_server(server.user, server.name, remove, last_check, session)
        self._stops[row.key] = row.session_started  # (an admin's cull now sends it no more)
        if user is not None and outcome == "stopped" and self._user_expired(user):
            now = await self.hub.get_user(server.user)
            if now is not None and not now.get("servers"):
                await self.hub.delete_user(server.user)
                outcome += "; user deleted (cull_users)"
        return outcome

    def _user_expired(self, model: Mapping, now: datetime | None = None) -> bool:
        """jupyterhub-idle-culler's rule for deleting a user (``--cull-users``): inactive for
        ``--timeout`` (never active: since created), or created ``--max-age`` ago; admins only
        with ``--cull-admin-users``."""
        o = self.options
        if model.get("admin") and not o.cull_admin_users:
            return False
        now = now or clock.utcnow()
        created, last = clock.parse(model.get("created")), clock.parse(model.get("last_activity"))
        age = now - created if created else None
        inactive = now - last if last else age
        if inactive is not None and inactive >= o.timeout:
            return True
        return bool(o.max_age and age is not None and age >= o.max_age)

    async def _cull_inactive_users(self, now: datetime, audits: list[AuditRow]) -> None:
        """``--cull-users``: users with no running server are deleted by the same rule."""
        try:
            async for model in self.hub.iter_users(state="inactive"):
                if not self._user_expired(model, now):
                    continue
                why = "no running server; inactive or too old (cull_users)"
                if not self.options.dry_run:
                    await self.hub.delete_user(model["name"])
                audits.append(
                    AuditRow(
                        at=clock.utcnow(),
                        server_key=None,
                        user=stored_name(model["name"]),
                        action="delete-user",
                        reason=why,
                        actor="governor",
                        dry_run=self.options.dry_run,
                    )
                )
        except HubApiError as error:  # tried again next pass
            log.error("gpu-gov: culling inactive users failed: %s", error)

    def _busy_gpu_kernels(self, key: str) -> tuple[str, ...]:
        """The kernels holding a GPU that the server's last report shows executing a cell."""
        received = self.reports.get(key)
        if received is None:
            return ()
        return tuple(
            t["id"]
            for t in received.report["targets"]
            if t["kind"] == "kernel"
            and t["gpu"]["holds_context"]
            and t.get("execution_state") == "busy"
        )

    def _in_background(self, coroutine) -> None:
        """Run a coroutine as a task the governor keeps (and cancels at close)."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
