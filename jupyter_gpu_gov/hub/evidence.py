"""What the governor believes of a server's GPU: its report (kept as ``Received``), read
against the Hub's records of its GPUs (``hub/trusted.py``) and DCGM's evidence (``hub/dcgm.py``),
with stale or missing data unknown; and the DCGM reads between passes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..core import clock, grant, policy
from ..core.durations import format_duration
from ..core.policy import Policy, ServerView, evolve
from ..core.report import gpu_signal, tab_open, user_last_activity
from ..core.text import stored_name
from ..core.vocabulary import STOP_SERVER
from . import trusted
from .dcgm import DcgmSnapshot, GpuEvidence, is_idle
from .hubapi import HubServer
from .tables import AuditRow

log = logging.getLogger("jupyter_gpu_gov.hub")

if TYPE_CHECKING:
    from .reconcile import _Batch


@dataclass(slots=True)  # one per server: no __dict__ each
class Received:
    """A server's last report as the governor keeps it: validated, compact and read as the JSON
    object it was (``hub.ingest.compact_report``), and when it arrived (the governor's clock,
    never the server's)."""

    report: Mapping  # a ``hub.ingest.KeptReport``
    at: datetime
    # When the governor received this server process's first report holding a GPU: an idle
    # stretch starts no earlier (the report's ``gpu_idle_since`` is the server's word).
    gpu_since: datetime | None = None


@dataclass
class PassContext:
    """What the last cycle learnt of the Hub and DCGM, reused to re-decide one server."""

    teams_by_group: Mapping[str, str] = field(default_factory=dict)
    by_uuid: Mapping = field(default_factory=dict)
    by_pod: Mapping = field(default_factory=dict)
    groups_read: bool = False  # a pass read the Hub's groups (none has: teams_by_group is a guess)


class Evidence:
    """The GPU evidence of the pass (a part of ``Governor``)."""

    async def _dcgm_snapshot(self) -> DcgmSnapshot | None:
        """The latest DCGM snapshot. Only the first pass waits for a read; after that each pass
        takes what the read started at the end of the one before found (``_read_dcgm_next``),
        or, while a slow Prometheus has not answered yet, the snapshot before it."""
        if self.dcgm is None:
            return None
        task = self._dcgm_task
        if task is not None and (task.done() or self._dcgm_latest is None):
            self._dcgm_latest, self._dcgm_task = await task, None
        elif task is None and self._dcgm_latest is None:
            self._dcgm_latest = await self.dcgm.fetch()
        return self._dcgm_latest

    def _fresh(self, snapshot: DcgmSnapshot | None) -> DcgmSnapshot | None:
        """The snapshot, or none of its evidence once older than ``dcgm_max_age`` (a read
        still under way, or stuck): stale DCGM is unknown, never idle."""
        if snapshot is None or not snapshot.evidence:
            return snapshot
        age = timedelta(seconds=snapshot.age_s)
        if age <= self.options.dcgm_max_age:
            return snapshot
        error = (
            f"DCGM evidence read at {clock.isoformat(snapshot.fetched_at)} is "
            f"{format_duration(age)} old, past dcgm_max_age: every GPU is unknown to DCGM"
        )
        return replace(snapshot, evidence=(), errors=(*snapshot.errors, error))

    def _read_dcgm_next(self) -> None:
        """Start the next pass's DCGM read now that this pass is done: it runs in the worker
        between passes, not alongside one, and is fresher when the next pass uses it than a read
        started as this pass began."""
        if self.dcgm is not None and self._dcgm_task is None:
            self._dcgm_task = asyncio.ensure_future(self.dcgm.fetch())

    def _with_gpu(
        self,
        base: ServerView,
        server_policy: Policy,
        now: datetime,
        reported: bool,
        server: HubServer | None = None,
    ) -> ServerView:
        """The view with what the server's report (and DCGM) say about its GPU (``server``:
        where DCGM may see its pod).

        Unknown GPU data is never idle, for a server that may hold a GPU. One the Hub's records
        give no GPU (``core.grant.no_gpu``: the profile layer admitted it without one) and DCGM
        sees none on holds none: a driver that fails, a report that stops coming or claims an
        unavailable backend leave it governed as any CPU server (the idle-culler rule), not
        flagged unknown. GPU data its report does give (a context it holds) is still read."""
        view = self._reported_gpu(base, server_policy, now, reported, server)
        gpu = view.gpu
        if (
            gpu is None
            or gpu.active is not None
            or server is None
            or not grant.no_gpu(server.spawner_state)
            or base.key in self._shutdowns  # its GPU kernels were asked to shut down
        ):
            return view
        if self._records_of(server)[1]:  # a pod DCGM sees a GPU on
            return view
        detail = f"the Hub's records give it no GPU ({gpu.detail})" if gpu.detail else ""
        return evolve(view, gpu=policy.GpuSignal(holds_gpu=False, active=False, detail=detail))

    def _reported_gpu(
        self,
        base: ServerView,
        server_policy: Policy,
        now: datetime,
        reported: bool,
        server: HubServer | None,
    ) -> ServerView:
        key = base.key
        received = self.reports.get(key)
        pending = self._shutdowns.get(key)
        if (
            pending is not None
            and received is not None
            and not pending.answered_by(received.report)
        ):
            # Asked to shut its GPU kernels down, it has not yet: unknown until it does, or
            # until the request lapses (outbound.forget_answered) and the policy starts over.
            waiting = policy.GpuSignal(
                holds_gpu=True, active=None, detail="waiting for the server to shut kernels down"
            )
            return evolve(base, reports=True, gpu=waiting)
        granted, evidence = self._records_of(server) if server else (None, ())
        complete = not evidence or self._sees_all(key, server, granted, evidence)
        # Its container's CPU, where DCGM alone decides it (the pod the records name), or on
        # a workstation its process tree's (the pid the records name).
        pod = granted.pod if granted is not None else None
        self.pod_cpu.want(pod, key)
        cpu = self.pod_cpu.busy_since(pod, now)
        if pod is None and server is not None:
            self.proc_cpu.want(key, server.spawner_state, server.started)
            cpu = self.proc_cpu.busy_since(key, now)
        if received is None and reported:
            # It reported before (this service restarted): DCGM alone on the GPUs the records
            # name, else unknown until the next report.
            why = "waiting for its report"
            waiting = self._dcgm_only(evidence, server_policy, why, complete, cpu)
            waiting = waiting or policy.GpuSignal(holds_gpu=True, active=None, detail=why)
            return evolve(base, reports=True, gpu=waiting, reachable=False)
        if received is None:
            # No extension (or no report yet): DCGM alone where it sees the server's GPUs,
            # else jupyterhub-idle-culler's rule.
            dcgm = self._dcgm_only(evidence, server_policy, complete=complete, cpu_busy_since=cpu)
            return base if dcgm is None else evolve(base, gpu=dcgm)
        report = received.report
        stale = now - received.at > self.options.report_stale_after
        if stale:
            # DCGM alone on the GPUs the records name (a report that stops coming keeps no
            # GPU), else unknown.
            why = f"no report since {received.at:%Y-%m-%d %H:%M} UTC"  # a time: it stays put
            gpu = self._dcgm_only(evidence, server_policy, why, complete, cpu)
            gpu = gpu or policy.GpuSignal(holds_gpu=True, active=None, detail=why)
        elif self._distrusted.get(key):
            # Its report contradicts the Hub's records: not believed. DCGM alone on the GPUs
            # the records name, else as a server that sends no report (the Hub's activity).
            dcgm = self._dcgm_only(
                evidence, server_policy, "its report is not believed", complete, cpu
            )
            return evolve(base, reports=True, gpu=dcgm)
        else:
            gpu = gpu_signal(
                report,
                idle_threshold=server_policy.idle_threshold,
                cull_action=server_policy.cull_action,
            )
            if gpu.idle_since is not None:
                # Not before the governor saw this process hold a GPU, nor before the Hub
                # started its session: an older server's stretch (begun before it took the
                # GPU), or one its owner wrote, does not make its GPU look idle longer.
                hub_started = server.started if server is not None else None
                floor = max(filter(None, (gpu.idle_since, received.gpu_since, hub_started)))
                gpu = evolve(gpu, idle_since=floor)
            if granted is not None:
                # The records' GPUs: DCGM's word on them is final, busy or idle; an allocation
                # is held whatever the report says of contexts (stop-server).
                dcgm = self._dcgm_activity(evidence, server_policy, complete)
                allocated = bool(evidence) and server_policy.cull_action == STOP_SERVER
                gpu = evolve(gpu, holds_gpu=gpu.holds_gpu or allocated)
            else:
                # GPUs named by the report alone: DCGM can prove them idle, never busy.
                context = self._context
                dcgm = self._dcgm_activity(
                    self._evidence(report, context.by_uuid, {}), server_policy
                )
                dcgm = None if dcgm else dcgm
            if dcgm is not None and gpu.holds_gpu:
                active, disagreement = policy.merge_evidence(gpu.active, dcgm)
                detail = "DCGM" + (f": {disagreement}" if disagreement else "")
                gpu = evolve(gpu, active=active, detail=detail)
        return evolve(
            base,
            reports=True,
            gpu=gpu,
            user_last_activity=user_last_activity(report),
            tab_open=tab_open(report),
            reachable=not stale,  # a fresh report: its verdict carries requests back
        )

    def _distrust(self, server: HubServer, key: str, now: datetime, batch: _Batch) -> None:
        """Check the server's fresh report against the Hub's records of its GPUs; when it
        contradicts them it is not believed, and the audit trail says why (once per change)."""
        received = self.reports.get(key)
        found: list[str] = []
        if received is not None:
            granted, evidence = self._records_of(server)
            if granted is not None:
                found = trusted.contradictions(received.report, granted, evidence)
        before = self._distrusted.get(key, [])
        if found != before and found:
            # At most ``distrust_said_per_hour`` a server: its report is its owner's to write, and
            # one changing what it names (another pod's name, any GPU) at every pass wrote a
            # row and a WARNING of up to 2,000 characters a pass for each server.
            since, said, unsaid = self._distrust_said.get(key, (now, 0, 0))
            if now - since >= timedelta(hours=1):
                since, said = now, 0
            if said < self.options.distrust_said_per_hour:
                why = "report not believed: " + "; ".join(found)
                if unsaid:
                    why = f"{why[:1900]} ({unsaid} other contradictions since the last said)"
                batch.audits.append(
                    AuditRow(
                        at=now,
                        server_key=key,
                        user=stored_name(server.user),
                        action="report-distrusted",
                        reason=why[:2000],
                        actor="governor",
                    )
                )
                log.warning("gpu-gov: %s: %s", key, why)
                said, unsaid = said + 1, 0
            else:
                unsaid += 1
            self._distrust_said[key] = (since, said, unsaid)
        if found:
            self._distrusted[key] = found
        else:
            self._distrusted.pop(key, None)

    def _sees_all(
        self, key: str, server: HubServer, granted: trusted.Granted, evidence: Sequence[GpuEvidence]
    ) -> bool:
        """Whether DCGM has a record of every GPU the records give the server: each device the
        allocator pinned, and each GPU it attributed to the server's pod earlier in this session
        (a pod's GPUs are fixed for its life: one gone from DCGM fell off the bus, or its series
        did). A GPU it lost is unknown, so the others' idle cannot prove the server idle."""
        kept = self._pod_gpus.get(key)
        if granted.pod is not None and (len(evidence) > 1 or kept is not None):
            # Kept only for pods seen with several GPUs (one lost from one: no evidence at all).
            leaves = frozenset((e.uuid, e.gpu_instance_id) for e in evidence)
            session, seen = kept or (None, frozenset())
            if session != server.started:
                seen = frozenset()
            self._pod_gpus[key] = (server.started, seen | leaves)
            if not seen <= leaves:
                return False
        return not granted.unseen(self._context.by_uuid)

    def _dcgm_only(
        self,
        evidence: Sequence[GpuEvidence],
        server_policy: Policy,
        why: str = "no report",
        complete: bool = True,
        cpu_busy_since: datetime | None = None,
    ) -> policy.GpuSignal | None:
        """A server as DCGM alone sees its GPUs (None: it does not): ``policy.dcgm_only``,
        with its container's CPU busy since ``cpu_busy_since`` (hub/pod_cpu.py, or its process
        tree's on a workstation: hub/proc_cpu.py), if it is."""
        if not evidence:
            return None
        active = self._dcgm_activity(evidence, server_policy, complete)
        detail = f"DCGM, {why}" + ("" if active is not None else ": no activity data")
        if cpu_busy_since is not None:
            detail += f"; its CPU busy since {cpu_busy_since:%Y-%m-%d %H:%M} UTC"
        return policy.dcgm_only(active, detail, cpu_busy_since)

    def _dcgm_activity(
        self, evidence: Sequence[GpuEvidence], server_policy: Policy, complete: bool = True
    ) -> bool | None:
        """Busy if DCGM sees one of the GPUs busy; idle only if it sees them all (``complete``:
        it has a record of each), and each idle."""
        verdicts = [
            is_idle(e, server_policy.idle_threshold, self.options.pcie_floor_bytes_per_s)
            for e in evidence
        ]
        if not verdicts:
            return None
        if any(v is False for v in verdicts):
            return True
        if complete and all(v is True for v in verdicts):
            return False
        return None

    def _report_evidence(self, report: Mapping, server: HubServer | None) -> list[GpuEvidence]:
        """DCGM's records of the GPUs a report names: by its pod only where the Hub's records
        name a pod (KubeSpawner's, which a believed report agrees with), else by its devices'
        UUIDs. A report with no record behind it names any pod it likes, and took on that
        pod's GPU: its failure (the server never culled as idle), its activity in the history."""
        context = self._context
        held = self._granted_held
        if server is None:
            granted = None
        elif held[0] is server and held[1] is context:
            granted = held[2]  # the pass's read of it (``_records_of``)
        else:
            # A report's ingest (or a server the pass is not on): its records alone, not DCGM's
            # of them, and the pass's held server left in place.
            granted = trusted.Granted.of(server.spawner_state)
        by_pod = context.by_pod if granted is not None and granted.pod is not None else {}
        return self._evidence(report, context.by_uuid, by_pod)

    @staticmethod
    def _evidence(report: Mapping, by_uuid, by_pod) -> list[GpuEvidence]:
        """DCGM's records of this server's GPUs: by its pod, else by its devices' UUIDs."""
        if not by_uuid and not by_pod:
            return []  # no DCGM evidence (a pass asks up to five times a server)
        server = report["server"]
        evidence = list(by_pod.get((server.get("namespace"), server.get("pod")), ()))
        if not evidence:
            for device in report["devices"]:
                uuid = device.get("parent_uuid") or device["uuid"]
                evidence += trusted.device_evidence(by_uuid, uuid, device.get("mig_profile"))
        return evidence

    def _granted_evidence(self, server: HubServer) -> Sequence[GpuEvidence]:
        """DCGM's records of the GPUs the Hub's records give a server (none without them)."""
        return self._records_of(server)[1]

    def _records_of(
        self, server: HubServer
    ) -> tuple[trusted.Granted | None, Sequence[GpuEvidence]]:
        """What the Hub's records give the server (``trusted.Granted``; None: no record), and
        DCGM's records of those GPUs in this pass's context. Read from its Hub model (the
        server's spawner state), never its report, once for the model and context the pass is
        on: its decision, ledger observation and history row asked for it up to seven times."""
        held = self._granted_held
        if held[0] is server and held[1] is self._context:
            return held[2], held[3]
        context = self._context
        granted = trusted.Granted.of(server.spawner_state)
        evidence = tuple(granted.evidence(context.by_uuid, context.by_pod)) if granted else ()
        self._granted_held = (server, context, granted, evidence)
        return granted, evidence

    def _gpus_held(self, key: str, server: HubServer) -> int:
        """The GPUs a server holds: its report's devices, else DCGM's records of its pod."""
        received = self.reports.get(key)
        if received is not None:
            return len(received.report["devices"])
        return len(self._granted_evidence(server))
