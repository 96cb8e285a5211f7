"""The governor's work, apart from the web layer: take reports in, reconcile every server
against the Hub, DCGM and the policies, carry out the actions, and record everything.

Every ``cull_every`` seconds ``reconcile()`` lists the Hub's ready servers once, reads DCGM
once, and calls ``core.policy.decide`` for each server. Reports arrive between cycles (pushed by
the servers) and are kept in memory; decisions, deadlines, extensions and the audit trail are in
the store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..core import clock, ledger, policy, rightsize
from ..core.durations import format_duration
from ..core.policy import (
    CHECKPOINT,
    CULL,
    INTERRUPT,
    NOTICES,
    WARNINGS,
    Decision,
    Policy,
    Record,
    ServerView,
    evolve,
)
from ..core.report import gpu_signal, user_last_activity
from ..core.teams import group_teams
from ..diagnose.cluster import Demand
from . import metrics
from .dcgm import DcgmSnapshot, DcgmSource, GpuEvidence, index_by_pod, index_by_uuid, is_idle
from .diagnosis import DiagnosisOptions, DiagnosisService, allocation
from .health import HealthOptions, HealthWatch
from .hubapi import HubApi, HubApiError, HubServer
from .ownership import resolve
from .store import AuditRow, ExtensionRow, ServerRow, Store, apply_decision, record_of, set_record

log = logging.getLogger("jupyter_gpu_gov.hub")


# Jupyter Server's kernel ids (UUIDs): a report's ids are the user's words, never a path.
KERNEL_ID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def server_key(user: str, name: str = "") -> str:
    """``user/`` or ``user/name``, as in the replay trace format."""
    return f"{user}/{name}"


@dataclass
class Received:
    report: dict
    at: datetime


# A report's checkpoint time is the server's clock, written to the millisecond; the governor's
# request time is its own, to the microsecond. A result this much older still answers.
CHECKPOINT_CLOCK_SLACK = timedelta(seconds=1)


@dataclass(frozen=True)
class CheckpointResult:
    """A finished checkpoint, waiting to be applied to the request it answers."""

    status: str  # done | failed
    manifest: dict | None
    requested_at: datetime | None  # when it was asked for (None: unknown)
    dry_run: bool = False

    def answers(self, record: Record) -> bool:
        """Whether this result answers the governor's current request: a checkpoint taken
        before it (the user's, or an earlier request's) does not."""
        if record.checkpoint_status != "requested":
            return False
        if record.checkpoint_requested_at is None:
            return True
        return (
            self.requested_at is not None
            and self.requested_at >= record.checkpoint_requested_at - CHECKPOINT_CLOCK_SLACK
        )


@dataclass(frozen=True)
class Options:
    """What the governor needs from its configuration (see ``GpuGovernor`` for the help)."""

    dry_run: bool = False
    report_stale_after: timedelta = timedelta(minutes=5)
    cull_default_servers: bool = True
    cull_named_servers: bool = True
    cull_admin_users: bool = True
    cull_users: bool = False
    # jupyterhub-idle-culler's --timeout and --max-age, for users (--cull-users): a user is
    # deleted when inactive that long, or created that long ago.
    timeout: timedelta = timedelta(hours=1)
    max_age: timedelta | None = None
    remove_named_servers: bool = False
    proxy_url: str = ""  # where to reach /user/<name>/ (checkpoints, kernel shutdown)
    service_token: str = ""
    concurrency: int = 10
    team_map: Mapping[str, str] = field(default_factory=dict)
    pcie_floor_bytes_per_s: float = 1_000_000
    diagnosis: DiagnosisOptions = field(default_factory=DiagnosisOptions)
    # The usage ledger: GPU-equivalents of a tier (else the grant's gpu-gov/weight, else the
    # reported devices), and the longest gap between two looks at a server that is billed.
    tier_weights: Mapping[str, float] = field(default_factory=dict)
    ledger_max_gap: timedelta = timedelta(minutes=3)
    # How often the ledger is written (and whenever it is read, and at stop): a row per running
    # server each time. A crash leaves the unwritten interval unobserved, as any outage.
    usage_write_every: timedelta = timedelta(minutes=5)
    # Showback: the price of one GPU-equivalent hour per tier (else the default), its
    # currency, and the GPU-equivalents each team is guaranteed (shown on "my GPU usage").
    gpu_hour_cost: Mapping[str, float] = field(default_factory=dict)
    gpu_hour_cost_default: float = 0.0
    currency: str = "USD"
    team_quotas: Mapping[str, float] = field(default_factory=dict)
    health: HealthOptions = field(default_factory=HealthOptions)
    # Right-sizing: what a server of each tier gets (``core.rightsize``); empty: no hints.
    tier_sizes: Mapping[str, rightsize.TierSize] = field(default_factory=dict)
    right_size_after: timedelta = rightsize.MIN_OBSERVED  # of reports, before a hint

    def cost_per_hour(self, tier: str) -> float:
        return float(self.gpu_hour_cost.get(tier, self.gpu_hour_cost_default))


@dataclass
class _Use:
    """A server's measured GPU use this session, from its reports (for right-sizing)."""

    session: str | None  # the report's server.started: a new value, a new session
    peak_memory_mb: float = 0.0
    peak_activity: float = 0.0
    first_held: datetime | None = None
    last_held: datetime | None = None

    def add(self, report: Mapping, at: datetime) -> None:
        holders = [t["gpu"] for t in report["targets"] if t["gpu"]["holds_context"]]
        if not holders:
            return
        memory = sum(g.get("memory_mb") or 0 for g in holders)
        activity = max((g.get("sm") or 0 for g in holders), default=0)
        self.peak_memory_mb = max(self.peak_memory_mb, memory)
        self.peak_activity = max(self.peak_activity, activity)
        self.first_held = self.first_held or at
        self.last_held = at

    def measured(self) -> rightsize.Use | None:
        if self.first_held is None:
            return None
        observed = self.last_held - self.first_held
        return rightsize.Use(self.peak_memory_mb, self.peak_activity, observed)


@dataclass
class _World:
    """What the last cycle learnt of the Hub and DCGM, reused to re-decide one server."""

    teams_by_group: Mapping[str, str] = field(default_factory=dict)
    by_uuid: Mapping = field(default_factory=dict)
    by_pod: Mapping = field(default_factory=dict)


@dataclass
class _Batch:
    """Rows to save, audit rows and actions gathered while deciding; finished together."""

    changed: list[ServerRow] = field(default_factory=list)
    audits: list[AuditRow] = field(default_factory=list)
    jobs: list = field(default_factory=list)

    async def finish(self, governor: Governor) -> None:
        await asyncio.gather(*self.jobs)
        governor.record(self.audits)  # first: what was done is on record whatever happens next
        governor.store.save_servers(self.changed)


@dataclass
class CycleResult:
    servers: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    dcgm_errors: Sequence[str] = ()


class Governor:
    def __init__(
        self,
        store: Store,
        hub: HubApi,
        policies: Sequence[Policy],
        options: Options,
        dcgm: DcgmSource | None = None,
    ):
        self.store = store
        self.hub = hub
        self.policies = list(policies)
        self.options = options
        self.dcgm = dcgm
        self.reports: dict[str, Received] = {}
        self.use: dict[str, _Use] = {}  # measured this session, for right-sizing
        self._checkpoints: dict[str, CheckpointResult] = {}  # finished, not yet applied
        self._tasks: set[asyncio.Task] = set()
        self._rows: dict[str, ServerRow] | None = None
        self._dcgm_task: asyncio.Future | None = None
        self._dcgm_latest: DcgmSnapshot | None = None
        self._servers: dict[str, HubServer] = {}  # running servers, as of the last cycle
        self._world = _World()
        self._cycle = asyncio.Lock()
        self.last_cycle: CycleResult | None = None
        self.diagnosis = DiagnosisService(options.diagnosis)
        self.health = HealthWatch(options.health)
        self.ledger = ledger.Ledger(options.ledger_max_gap, store.usage_sessions(open_only=True))
        self._usage_written_at: datetime | None = None  # None: the first pass writes
        # GPU spawns the Hub has been starting for longer than SPAWN_QUEUED_AFTER (on Kubernetes,
        # pods waiting for a GPU node), as of the last pass (``None`` before the first):
        # fragmentation is "GPUs partly used while spawns wait".
        self.spawns_waiting: int | None = None
        self.http = AsyncHTTPClient()
        # Optional scopes the service's token lacks (checked once, at the first pass).
        self.missing_scopes: frozenset[str] | None = None
        # Servers without the extension whose GPU DCGM sees idle: since when their Jupyter
        # API has shown a kernel executing (None: none), as of this pass.
        self._cells: dict[str, datetime | None] = {}

    # -- reports ------------------------------------------------------------------------------

    def ingest(self, report: dict) -> dict:
        """Keep a validated, authorised report; answer the server's current verdict."""
        key = server_key(report["server"]["user"], report["server"].get("name", ""))
        now = clock.utcnow()
        self.reports[key] = Received(report, now)
        session = report["server"].get("started")
        use = self.use.get(key)
        if use is None or use.session != session:
            use = self.use[key] = _Use(session)
        use.add(report, now)
        world = self._world
        row = self.row(key)
        billed = self.ledger.open.get(key)
        self.diagnosis.observe(
            key,
            report,
            self._evidence(report, world.by_uuid, world.by_pod),
            now,
            team=(row.team or "") if row is not None else None,
            gpus=billed.gpus if billed is not None else None,
        )
        result = _reported_checkpoint(report.get("checkpoint"))
        if result is not None and row is not None and result.answers(record_of(row)):
            self._checkpoints[key] = result  # a stale one never replaces the answer
        return self.verdict(key)

    def verdict(self, key: str) -> dict:
        row = self.row(key)
        if row is None:
            not_yet = Record(
                state=policy.UNKNOWN, reason="the governor has not assessed this server yet"
            )
            return policy.verdict(
                Decision(not_yet),
                self.policies[-1],
                dry_run=self.options.dry_run,
                root_cause=self.root_cause(key),
            )
        return verdict_of(
            row,
            self.policy_named(row.policy),
            dry_run=self.options.dry_run,
            root_cause=self.root_cause(key),
            right_size=self.right_size(row),
        )

    def root_cause(self, key: str) -> dict | None:
        """What the diagnosis says of the server's last report (``None`` once it is stale)."""
        return self.diagnosis.root_cause(key, self.options.report_stale_after)

    def right_size(self, row: ServerRow) -> dict | None:
        """The verdict's ``right_size``: a smaller tier this session's use fits, or None."""
        fit = self._right_size_fit(row)
        return fit and fit[1]

    def _right_size_fit(self, row: ServerRow) -> tuple[rightsize.TierSize, dict] | None:
        use = self.use.get(row.key)
        if not self.options.tier_sizes or use is None or not row.running:
            return None
        cause, _ = cause_of(self.root_cause(row.key))
        return rightsize.right_size(
            row.tier, use.measured(), self.options.tier_sizes, cause, self.options.right_size_after
        )

    def listing(self, row: ServerRow) -> dict:
        """A server as the admin API and the dashboard list it."""
        key = row.key
        return row_view(row, self.reports.get(key), self.root_cause(key), self.right_size(row))

    @property
    def rows(self) -> dict[str, ServerRow]:
        """Every server the governor knows, in memory: it is the store's only writer, so the
        database is read once, at start."""
        if self._rows is None:
            self._rows = self.store.servers()
        return self._rows

    def row(self, key: str) -> ServerRow | None:
        return self.rows.get(key)

    def server_rows(self, running_only: bool = True) -> list[ServerRow]:
        return [r for r in self.rows.values() if r.running or not running_only]

    def policy_named(self, name: str | None) -> Policy:
        return next((p for p in self.policies if p.name == name), self.policies[-1])

    # -- the cycle ----------------------------------------------------------------------------

    async def reconcile(self) -> CycleResult:
        async with self._cycle:  # a cull-now and the timer never reconcile at once
            started = time.perf_counter()
            try:
                result = await self._reconcile()
            finally:
                self._read_dcgm_next()
            result.duration_s = time.perf_counter() - started
            metrics.RECONCILE_SECONDS.observe(result.duration_s)
            self.last_cycle = result
            return result

    async def _reconcile(self) -> CycleResult:
        if self.missing_scopes is None:  # the first pass: which scopes, beside the rest
            scopes, groups, snapshot = await asyncio.gather(
                self._check_scopes(), self._groups(), self._dcgm_snapshot()
            )
            self.missing_scopes = scopes | (self.missing_scopes or frozenset())
        else:
            groups, snapshot = await asyncio.gather(self._groups(), self._dcgm_snapshot())
        self._world = _World(
            teams_by_group=group_teams(groups),
            by_uuid=index_by_uuid(snapshot.evidence) if snapshot else {},
            by_pod=index_by_pod(snapshot.evidence) if snapshot else {},
        )
        await self._read_cells()
        rows = self.rows
        batch = _Batch()
        now = clock.utcnow()
        self.health.observe_dcgm(snapshot, self._world.by_uuid, now)
        seen = set()
        waiting = 0
        # Decide each page of servers while the Hub API client fetches the next.
        # "active": ready servers and those the Hub is starting, which may wait for a GPU.
        async for server in self.hub.iter_servers(state="active"):
            if server.pending or not server.ready:
                waiting += _queued_for_a_gpu(server, now)
                continue  # the Hub is starting or stopping it
            key = server_key(server.user, server.name)
            seen.add(key)
            self._servers[key] = server
            view = self._govern(server, rows.get(key), now, batch)
            self._observe(server, view, now)
        for key, row in rows.items():
            if row.running and key not in seen:
                row.running = False  # stopped (by its owner, the Hub or us)
                self._servers.pop(key, None)
                self.use.pop(key, None)
                self.diagnosis.forget(key)
                batch.changed.append(row)
        for key in [k for k in self.ledger.open if k not in seen]:
            row = rows.get(key)
            # Stopped by us: billed to that moment; else to this pass, which found it gone.
            stopped = row.culled_at if row is not None and row.culled_at else now
            self.ledger.close(key, min(stopped, now))

        self.spawns_waiting = waiting
        self.health.finish_pass(seen, now)
        for node, patch, action, why in self.health.node_changes():
            batch.audits.append(self._audit(None, action, why, dry_run=self.options.dry_run))
            if not self.options.dry_run:
                self._spawn(self.health.patch_node(node, patch, action))
        if self.options.cull_users:
            batch.jobs.append(self._cull_inactive_users(now, batch.audits))
        await batch.finish(self)
        self._save_usage()
        self._forget_stale_reports(seen)
        self.diagnosis.maybe_train(now)  # in a worker; the pass does not wait for it
        pods = {}
        for key, received in self.reports.items():
            info = received.report["server"]
            pods[key] = (info.get("namespace") or "", info.get("pod") or "")
        metrics.observe_states(
            (row for row in rows.values() if row.running),
            {key: s.gpus for key, s in self.ledger.open.items()},
            pods,
        )
        counts: dict[str, int] = {}
        for row in batch.audits:
            counts[row.action] = counts.get(row.action, 0) + 1
        return CycleResult(len(seen), counts, dcgm_errors=snapshot.errors if snapshot else ())

    async def redecide(self, key: str) -> None:
        """Decide one server again now (after an extension, approval or exemption), with what
        the last cycle learnt of the Hub and DCGM, so its verdict shows the new deadline."""
        server = self._servers.get(key)
        if server is None:
            return
        async with self._cycle:
            batch = _Batch()
            self._govern(server, self.rows.get(key), clock.utcnow(), batch)
            await batch.finish(self)
            self._save_usage()

    def _govern(
        self, server: HubServer, row: ServerRow | None, now: datetime, batch: _Batch
    ) -> ServerView:
        """Decide one server and queue what follows: the row to save, audits, actions. Returns
        the view it decided on."""
        key = server_key(server.user, server.name)
        world = self._world
        ownership = resolve(
            server.user,
            server.user_options,
            server.groups,
            world.teams_by_group,
            self.options.team_map,
        )
        if row is None or (server.started and row.session_started != server.started):
            row = ServerRow(
                key=key, user=server.user, name=server.name, session_started=server.started
            )
            set_record(row, Record())
            self.rows[key] = row
        before = record_of(row)
        owners = (ownership.team, ownership.project, ownership.tier, ownership.profile)
        if (
            (row.team, row.project, row.tier, row.profile) != owners
            or row.labels != ownership.labels
            or not row.running
        ):
            row.team, row.project, row.tier, row.profile = owners
            row.labels, row.running = dict(ownership.labels), True
            batch.changed.append(row)

        record = self._apply_checkpoint_result(key, before, row, batch.audits)
        if key in self.reports and not row.reports:
            row.reports = True
            batch.changed.append(row)
        base = _base_view(server, ownership)
        chosen = policy.select(self.policies, base)  # policies match on who, not on the GPU
        record = self._checkpoint_timeout(row, record, chosen, now, batch.audits)
        view = self._with_gpu(base, chosen, now, row.reports, server)
        received = self.reports.get(key)
        evidence = (
            self._evidence(received.report, world.by_uuid, world.by_pod)
            if received is not None
            else self._pod_evidence(_pod_of(server))
        )
        failure = self.health.of_server(key, received and received.report, evidence, now)
        cause, confident = cause_of(self.root_cause(key))
        view = evolve(view, cause=cause, cause_confident=confident, excluded=self._excluded(server))
        view, record = self.health.prepare(view, record, failure)
        decision = self.health.review(
            policy.decide(view, record, chosen, now), failure, chosen, now
        )
        flagged = self.health.flag(key, decision.record, now)
        if flagged:
            batch.audits.append(self._audit(row, "gpu-unknown", flagged))
        # Most servers change nothing in a pass: touch the row (and the database) only if so.
        outputs = (decision.warn_at, decision.cull_at, chosen.name)
        if (
            decision.record != before
            or decision.actions
            or outputs != (row.warn_at, row.cull_at, row.policy)
            or (decision.cull_reason and decision.cull_reason != row.cull_reason)
        ):
            apply_decision(row, decision, chosen.name)
            batch.changed.append(row)
        if decision.state != before.state:
            batch.audits.append(
                self._audit(row, "state", f"{before.state} → {decision.state}: {decision.reason}")
            )
        if decision.actions:  # in order: an interrupt before its checkpoint, a warning first
            acts = (
                self._act(a, server, row, decision, chosen, batch.audits) for a in decision.actions
            )
            batch.jobs.append(_one_after_another(acts))
        return view

    # -- the usage ledger -----------------------------------------------------------------------

    def _observe(self, server: HubServer, view: ServerView, now: datetime) -> None:
        """One look at a running server for the usage ledger."""
        key = view.key
        received = self.reports.get(key)
        fresh = received is not None and now - received.at <= self.options.report_stale_after
        report = received.report if fresh else None
        gpus = self.gpu_equivalents(view, report)
        if view.gpu is None or view.gpu.active is None:
            state = ledger.UNKNOWN
        elif view.gpu.active:
            state = ledger.ACTIVE
        elif report is not None and any(t["gpu"]["holds_context"] for t in report["targets"]):
            state = ledger.IDLE_HELD
        else:
            state = ledger.IDLE_FREE
        row = self.rows.get(key)
        fit = self._right_size_fit(row) if row is not None else None
        current = self.options.tier_sizes.get(view.tier or "")
        self.ledger.observe(
            ledger.Observation(
                server=key,
                session=clock.isoformat(server.started) or "unknown",
                at=now,
                owner=owner_of(view),
                gpus=gpus,
                state=state,
                started=server.started,
                right_size_share=fit[0].weight / current.weight if fit and current else None,
            )
        )

    def gpu_equivalents(self, view: ServerView, report: Mapping | None) -> float:
        """GPU-equivalents a server holds: its grant's ``gpu-gov/weight``, else the tier's
        configured weight, else its reported devices (a whole GPU 1, a MIG slice its share of
        compute), else 1 for a server with a GPU tier, else 0 (no GPU)."""
        weight = view.labels.get(WEIGHT_LABEL)
        try:
            if weight is not None and float(weight) >= 0:
                return float(weight)
        except ValueError:
            pass
        tier = view.tier
        if tier in self.options.tier_weights:
            return float(self.options.tier_weights[tier])
        if report is not None and report["backend"] not in ("none", "unavailable"):
            return float(sum(_device_share(d) for d in report["devices"]))
        return 1.0 if tier and tier != "no-gpu" else 0.0

    def record(self, audits: Sequence[AuditRow]) -> None:
        """Store audit rows; culls and extensions also count in the usage ledger."""
        self.store.audit(audits)
        for row in audits:
            if row.dry_run:
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
        self._save_usage()

    def flush_usage(self) -> None:
        """Write what the ledger has accrued: before anyone reads the usage, and at stop."""
        self._save_usage(force=True)

    def _save_usage(self, force: bool = False) -> None:
        now = clock.utcnow()
        last = self._usage_written_at
        if not force and last is not None and now - last < self.options.usage_write_every:
            return
        self._usage_written_at = now
        deltas, sessions = self.ledger.drain()
        self.store.save_usage(deltas, sessions)
        counters = {}  # (team, state) -> its series: labels() costs 3 µs, a bucket a server
        for (_, owner), values in deltas.items():
            for state in _BILLED:
                if values.get(state):
                    counter = counters.get((owner.team, state))
                    if counter is None:
                        counter = counters[owner.team, state] = metrics.GPU_SECONDS.labels(
                            owner.team, state
                        )
                    counter.inc(values[state])

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

    async def background_done(self) -> None:
        """Wait for the work a pass leaves running (the next DCGM read)."""
        if self._dcgm_task is not None:
            await asyncio.wait([self._dcgm_task])

    def _read_dcgm_next(self) -> None:
        """Start the next pass's DCGM read now that this pass is done: it runs in the worker
        between passes, not alongside one, and is fresher when the next pass uses it than a read
        started as this pass began."""
        if self.dcgm is not None and self._dcgm_task is None:
            self._dcgm_task = asyncio.ensure_future(self.dcgm.fetch())

    async def _groups(self) -> list[dict]:
        if "list:groups" in (self.missing_scopes or ()):
            return []  # said once, at start-up
        try:
            return await self.hub.get_groups()
        except HubApiError as error:
            if (
                error.status == 403
            ):  # the scope is missing: said once (_check_scopes), not asked again
                self.missing_scopes = (self.missing_scopes or frozenset()) | {"list:groups"}
            else:
                log.warning(
                    "gpu-gov: cannot list groups (%s); teams come from user_options only", error
                )
            return []

    async def _check_scopes(self) -> frozenset[str]:
        """Which optional scopes the service's token lacks, each logged once with what it
        disables (a hub may give the governor only jupyterhub-idle-culler's four scopes)."""
        try:
            model = await self.hub.request("GET", "/user")
        except HubApiError as error:
            log.warning("gpu-gov: cannot read this service's scopes (%s); assuming all", error)
            return frozenset()
        held = model.get("scopes") if isinstance(model, Mapping) else None
        if not isinstance(held, list):
            return frozenset()
        missing = frozenset(s for s in OPTIONAL_SCOPES if not _holds(held, s))
        for scope in sorted(missing):
            log.warning("gpu-gov: the service's token lacks %s: %s", scope, OPTIONAL_SCOPES[scope])
        for scope in REQUIRED_SCOPES:
            if not _holds(held, scope):
                log.error("gpu-gov: the service's token lacks %s: it cannot govern", scope)
        return missing

    def _excluded(self, server: HubServer) -> str | None:
        """Why jupyterhub-idle-culler's flags leave a server alone (its maximum age still
        applies, as in that culler; ``cull_admin_users`` only spares admins' accounts from
        ``cull_users``)."""
        o = self.options
        if server.name == "" and not o.cull_default_servers:
            return "not governed: default servers are excluded (cull_default_servers=False)"
        if server.name and not o.cull_named_servers:
            return "not governed: named servers are excluded (cull_named_servers=False)"
        return None

    def _with_gpu(
        self,
        base: ServerView,
        chosen: Policy,
        now: datetime,
        reported: bool,
        server: HubServer | None = None,
    ) -> ServerView:
        """The view with what the server's report (and DCGM) say about its GPU (``server``:
        where DCGM may see its pod)."""
        received = self.reports.get(base.key)
        if received is None and reported:
            # It reported before (this service restarted): unknown until the next report.
            waiting = policy.GpuSignal(holds_gpu=True, active=None, detail="waiting for its report")
            return evolve(base, reports=True, gpu=waiting, reachable=False)
        if received is None:
            # No extension (or no report yet): DCGM alone where it sees the server's pod,
            # else jupyterhub-idle-culler's rule.
            dcgm = self._dcgm_only(_pod_of(server) if server else None, chosen, base.key)
            return base if dcgm is None else evolve(base, gpu=dcgm)
        report = received.report
        stale = now - received.at > self.options.report_stale_after
        if stale:
            since = f"{received.at:%Y-%m-%d %H:%M} UTC"  # a time, so the reason stays put
            gpu = policy.GpuSignal(holds_gpu=True, active=None, detail=f"no report since {since}")
        else:
            gpu = gpu_signal(
                report, idle_threshold=chosen.idle_threshold, cull_action=chosen.cull_action
            )
            world = self._world
            trusted = self._trusted_activity(report, chosen, world.by_uuid, world.by_pod)
            if trusted is not None and gpu.holds_gpu:
                active, disagreement = policy.merge_evidence(gpu.active, trusted)
                detail = "DCGM" + (f": {disagreement}" if disagreement else "")
                gpu = evolve(gpu, active=active, detail=detail)
        return evolve(
            base,
            reports=True,
            gpu=gpu,
            user_last_activity=user_last_activity(report),
            reachable=not stale and self.reaches_servers,
        )

    @property
    def reaches_servers(self) -> bool:
        """Whether the service can call user servers (checkpoints, interrupts): a proxy URL,
        and the access:servers scope."""
        return bool(self.options.proxy_url) and "access:servers" not in (self.missing_scopes or ())

    def _dcgm_only(
        self, pod: tuple[str | None, str] | None, chosen: Policy, key: str = ""
    ) -> policy.GpuSignal | None:
        """A server without the extension, as DCGM sees its pod's GPUs (None: it does not).
        DCGM sees the card, not the kernels: while its GPU idles the server's Jupyter API
        says which kernels execute (``_read_cells``); without that answer the policy assumes
        a cell may be running."""
        evidence = self._pod_evidence(pod)
        if not evidence:
            return None
        active = self._dcgm_activity(evidence, chosen)
        detail = "DCGM, no report" if active is not None else "DCGM, no report: no activity data"
        if active is False and key in self._cells:
            busy = self._cells[key]
            return policy.GpuSignal(True, False, kernel_busy_since=busy, detail=detail)
        return policy.GpuSignal(holds_gpu=True, active=active, sees_cells=False, detail=detail)

    async def _read_cells(self) -> None:
        """For servers without the extension whose GPU DCGM saw idle last pass, whether a
        kernel executes a cell: the kernel's execution state, from the server's own Jupyter
        API (``GET api/kernels``), as the extension would report it. One request per such
        server and pass; an answer missing or late leaves the cell unseen (assumed)."""
        if not self.reaches_servers:
            return
        due = [
            (key, server)
            for key, server in self._servers.items()
            if key not in self.reports
            and (row := self.rows.get(key)) is not None
            and row.state in (policy.IDLE, policy.BUSY, policy.WARNED)
            and not row.reports
        ]
        answers = await asyncio.gather(*(self._kernels_busy(s) for _, s in due))
        now = clock.utcnow()
        cells = {}
        for (key, _), busy in zip(due, answers, strict=True):
            if busy is not None:
                cells[key] = (self._cells.get(key) or now) if busy else None
        self._cells = cells

    async def _kernels_busy(self, server: HubServer) -> bool | None:
        try:
            kernels = await self._server_request(server.url, "api/kernels", "GET", timeout=5)
        except Exception as error:  # no answer: the cell stays unseen
            log.debug("gpu-gov: no kernels from %s: %s", server.full_name, error)
            return None
        if not isinstance(kernels, list):
            return None
        return any(isinstance(k, Mapping) and k.get("execution_state") == "busy" for k in kernels)

    def _pod_evidence(self, pod: tuple[str | None, str] | None) -> list[GpuEvidence]:
        """DCGM's records of a pod's GPUs (with or without its namespace in DCGM's labels)."""
        if pod is None:
            return []
        by_pod = self._world.by_pod
        return by_pod.get(pod) or by_pod.get((None, pod[1])) or []

    def _trusted_activity(self, report: dict, chosen: Policy, by_uuid, by_pod) -> bool | None:
        """DCGM's word on this server's GPUs: True if any is busy, False if all are idle,
        None when DCGM does not know them."""
        return self._dcgm_activity(self._evidence(report, by_uuid, by_pod), chosen)

    def _dcgm_activity(self, evidence: list[GpuEvidence], chosen: Policy) -> bool | None:
        verdicts = [
            is_idle(e, chosen.idle_threshold, self.options.pcie_floor_bytes_per_s) for e in evidence
        ]
        if not verdicts:
            return None
        if any(v is False for v in verdicts):
            return True
        if all(v is True for v in verdicts):
            return False
        return None

    @staticmethod
    def _evidence(report: Mapping, by_uuid, by_pod) -> list[GpuEvidence]:
        """DCGM's records of this server's GPUs: by its pod, else by its devices' UUIDs."""
        server = report["server"]
        evidence = list(by_pod.get((server.get("namespace"), server.get("pod")), ()))
        if not evidence:
            for device in report["devices"]:
                uuid = device.get("parent_uuid") or device["uuid"]
                candidates = by_uuid.get(uuid, ())
                if device.get("mig_profile"):
                    candidates = [e for e in candidates if e.mig_profile == device["mig_profile"]]
                else:
                    candidates = [e for e in candidates if e.mig_profile is None]
                evidence += candidates
        return evidence

    def health_view(self) -> dict:
        """``GET api/health``, with the server holding each GPU where DCGM names its pod."""
        now = clock.utcnow()
        view = self.health.admin_view(now, self.rows)
        by_pod = {}
        for key, server in self._servers.items():
            pod = _pod_of(server)
            if pod is not None:
                by_pod[pod] = by_pod[(None, pod[1])] = key
        for gpu in view["gpus"]:
            pod = gpu["pod"]
            if gpu["server"] is None and pod is not None:
                gpu["server"] = by_pod.get((pod["namespace"], pod["name"]))
        return view

    def diagnosis_summary(self, days: int = 7) -> dict:
        """``GET api/diagnosis``: causes, their cost per team and node, fragmentation (cards by
        what is allocated on them; spawns pending a GPU; no spawn queue or refusal record
        exists yet to count)."""
        running = [key for key, row in self.rows.items() if row.running]
        reports = [self.reports[key].report for key in running if key in self.reports]
        evidence = [e for records in self._world.by_uuid.values() for e in records]
        return self.diagnosis.summary(
            running,
            allocation(reports, evidence),
            Demand(pending=self.spawns_waiting),
            self.options.report_stale_after,
            teams={key: row.team or "" for key, row in self.rows.items()},
            days=days,
        )

    def _apply_checkpoint_result(
        self, key: str, record: Record, row: ServerRow, audits: list[AuditRow]
    ) -> Record:
        """The finished checkpoint that answers the current request, on the record and on
        record (``checkpoint-done`` or ``checkpoint-failed``); any other result is dropped."""
        result = self._checkpoints.pop(key, None)
        if result is None or not result.answers(record):
            return record
        row.checkpoint_manifest = result.manifest
        audits.append(
            self._audit(
                row,
                f"checkpoint-{result.status}",
                checkpoint_summary(result.status, result.manifest),
                dry_run=result.dry_run,
                details={
                    **checkpoint_fields(result.manifest),
                    "status": result.status,
                    "requested_at": clock.isoformat(record.checkpoint_requested_at),
                },
            )
        )
        return replace(record, checkpoint_status=result.status)

    def _checkpoint_timeout(
        self, row: ServerRow, record: Record, chosen: Policy, now: datetime, audits: list[AuditRow]
    ) -> Record:
        """No answer within the policy's checkpoint_timeout: a failed checkpoint, on record
        like one, so the admin view says so instead of showing an older checkpoint."""
        asked = record.checkpoint_requested_at
        if (
            record.checkpoint_status != "requested"
            or asked is None
            or now - asked < chosen.checkpoint_timeout
        ):
            return record
        error = f"no answer within {format_duration(chosen.checkpoint_timeout)}"
        row.checkpoint_manifest = {"error": error}
        audits.append(
            self._audit(
                row,
                "checkpoint-failed",
                checkpoint_summary("failed", row.checkpoint_manifest),
                details={
                    **checkpoint_fields(row.checkpoint_manifest),
                    "status": "timeout",
                    "requested_at": clock.isoformat(asked),
                },
            )
        )
        return replace(record, checkpoint_status="timeout")

    def _forget_stale_reports(self, running: set[str]) -> None:
        for key in list(self.reports):
            if (
                key not in running
                and clock.utcnow() - self.reports[key].at > self.options.report_stale_after
            ):
                del self.reports[key]

    # -- actions ------------------------------------------------------------------------------

    async def _act(
        self,
        action: str,
        server: HubServer,
        row: ServerRow,
        decision: Decision,
        chosen: Policy,
        audits: list[AuditRow],
    ) -> None:
        dry = self.options.dry_run
        if action in WARNINGS or action in NOTICES:
            if action in WARNINGS:
                metrics.WARNINGS.inc()
            why = decision.notice or decision.reason
            audits.append(self._audit(row, action, why, dry_run=dry))
        elif action == INTERRUPT:
            kernels = self._busy_gpu_kernels(row.key)
            details = {"kernels": kernels}
            if not dry:
                details["outcome"] = await self._interrupt(server, row.key, kernels)
            audits.append(self._audit(row, action, decision.reason, dry_run=dry, details=details))
        elif action == CHECKPOINT:
            audits.append(self._audit(row, "checkpoint", decision.reason, dry_run=dry))
            requested_at = decision.record.checkpoint_requested_at
            if dry:
                self._checkpoints[row.key] = CheckpointResult(
                    "done", {"dry_run": True}, requested_at, dry_run=True
                )
            else:
                self._spawn(self._checkpoint(row.key, server, chosen, decision))
        elif action == CULL:
            # The checkpoint of this deadline, if one was taken (not one of an earlier stretch).
            checkpointed = decision.record.checkpoint_status in ("done", "failed", "timeout")
            manifest = row.checkpoint_manifest if checkpointed else None
            fields = checkpoint_fields(manifest)
            details = {
                "cull_action": chosen.cull_action,
                "cull_reason": decision.cull_reason,
                "checkpoint": manifest,
                "checkpoint_id": fields["id"],
                "checkpoint_path": fields["path"],
                "policy": chosen.name,
            }
            if dry:
                audits.append(
                    self._audit(row, "cull", decision.reason, dry_run=True, details=details)
                )
                return
            # Counted first: shutting kernels down drops the server's report.
            gpus = self._gpus_held(row.key, server)
            try:
                details["outcome"] = await self._cull(server, row, chosen)
            except Exception as error:  # recorded, retried next cycle
                log.error("gpu-gov: cull of %s failed: %s", row.key, error)
                set_record(row, replace(record_of(row), state=policy.WARNED, culled_at=None))
                audits.append(
                    self._audit(row, "cull-failed", f"{decision.reason}; {error}", details=details)
                )
                return
            metrics.CULLS.labels(decision.cull_reason or "gpu-idle", chosen.cull_action).inc()
            if decision.cull_reason == "gpu-idle":
                metrics.GPUS_RECLAIMED.inc(gpus)
            audits.append(self._audit(row, "cull", decision.reason, details=details))

    async def _cull(self, server: HubServer, row: ServerRow, chosen: Policy) -> str:
        if chosen.cull_action == "shutdown-kernels" and row.key in self.reports:
            report = self.reports[row.key].report
            kernels = [
                t["id"]
                for t in report["targets"]
                if t["kind"] == "kernel" and t["gpu"]["holds_context"]
            ]
            for kernel_id in kernels:
                await self._server_request(server.url, f"api/kernels/{kernel_id}", "DELETE")
            # The server keeps running without a GPU: start over with a fresh record.
            set_record(row, replace(Record(), reason=f"kernels shut down: {row.reason}"))
            self.reports.pop(row.key, None)
            return f"shut down {len(kernels)} kernel(s)"
        remove = self.options.remove_named_servers and bool(server.name)
        # As jupyterhub-idle-culler: the user goes too once none of their servers runs, if
        # inactive (or created) long enough as the Hub saw them before the stop (a stop is
        # activity); after a slow stop, a later pass finds them among the inactive users.
        user = await self.hub.get_user(server.user) if self.options.cull_users else None
        outcome = await self.hub.stop_server(server.user, server.name, remove=remove)
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
                        user=model["name"],
                        action="delete-user",
                        reason=why,
                        actor="governor",
                        dry_run=self.options.dry_run,
                    )
                )
        except HubApiError as error:  # tried again next pass
            log.error("gpu-gov: culling inactive users failed: %s", error)

    def _busy_gpu_kernels(self, key: str) -> list[str]:
        """The kernels holding a GPU that the server's last report shows executing a cell."""
        received = self.reports.get(key)
        if received is None:
            return []
        return [
            t["id"]
            for t in received.report["targets"]
            if t["kind"] == "kernel"
            and t["gpu"]["holds_context"]
            and t.get("execution_state") == "busy"
            and KERNEL_ID.fullmatch(t["id"])
        ]

    async def _interrupt(self, server: HubServer, key: str, kernels: list[str]) -> str:
        """Interrupt the running cells (the busy limit): the kernels and their state stay."""
        done = []
        for kernel_id in kernels:
            try:
                await self._server_request(
                    server.url, f"api/kernels/{quote(kernel_id, safe='')}/interrupt", "POST"
                )
                done.append(kernel_id)
            except Exception as error:  # on record; the busy limit culls if the cell runs on
                log.warning(
                    "gpu-gov: interrupting kernel %s of %s failed: %s", kernel_id, key, error
                )
        return f"interrupted {len(done)} of {len(kernels)} kernel(s)"

    def _gpus_held(self, key: str, server: HubServer) -> int:
        """The GPUs a server holds: its report's devices, else DCGM's records of its pod."""
        received = self.reports.get(key)
        if received is not None:
            return len(received.report["devices"])
        return len(self._pod_evidence(_pod_of(server)))

    async def _checkpoint(
        self, key: str, server: HubServer, chosen: Policy, decision: Decision
    ) -> None:
        """Ask the server for a checkpoint and keep its answer for the next pass; the answer
        carries the time of this request, so it never settles a later one."""
        timeout = chosen.checkpoint_timeout.total_seconds()
        requested_at = decision.record.checkpoint_requested_at
        try:
            body = await self._server_request(
                server.url,
                "jupyter-gpu-gov/checkpoint",
                "POST",
                {
                    "reason": decision.reason,
                    "cull_reason": decision.cull_reason,
                    "source": "governor",
                },
                timeout=timeout,
            )
            status = "done" if body.get("status") == "done" else "failed"
            self._checkpoints[key] = CheckpointResult(status, body, requested_at)
        except Exception as error:
            log.warning("gpu-gov: checkpoint of %s failed: %s", key, error)
            failed = {"error": f"request failed: {error}"}
            self._checkpoints[key] = CheckpointResult("failed", failed, requested_at)

    async def _server_request(
        self, server_url: str, path: str, method: str, body=None, timeout: float = 30.0
    ) -> dict:
        """Call a user's server through the proxy with the service's own token."""
        url = f"{self.options.proxy_url.rstrip('/')}{server_url}{path}"
        request = HTTPRequest(
            url,
            method=method,
            headers={
                "Authorization": f"token {self.options.service_token}",
                "Content-Type": "application/json",
            },
            body=None if body is None and method != "POST" else json.dumps(body or {}),
            request_timeout=timeout,
            follow_redirects=False,
        )
        try:
            response = await self.http.fetch(request)
        except HTTPClientError as error:
            if method == "DELETE" and error.code == 404:
                return {}  # already gone
            raise
        return json.loads(response.body) if response.body else {}

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _audit(
        self,
        row: ServerRow | None,
        action: str,
        reason: str,
        *,
        actor: str = "governor",
        dry_run: bool = False,
        details: dict | None = None,
    ) -> AuditRow:
        return AuditRow(
            at=clock.utcnow(),
            server_key=row and row.key,  # None: not about a server (a node)
            user=row and row.user,
            action=action,
            reason=reason,
            actor=actor,
            dry_run=dry_run,
            details=details,
        )

    # -- people's requests --------------------------------------------------------------------

    async def extend(self, key: str, actor: str, reason: str) -> tuple[int, dict]:
        row = self._row(key)
        chosen = self.policy_named(row.policy)
        outcome = policy.extend(record_of(row), chosen, reason)
        if outcome.status != "refused":
            set_record(row, outcome.record)
            self.store.save_servers([row])
        seconds = chosen.extension_step.total_seconds() if outcome.status == "granted" else 0
        self.store.add_extension(
            ExtensionRow(
                server_key=key,
                requested_by=actor,
                requested_at=clock.utcnow(),
                seconds=seconds,
                reason=reason or "",
                status=outcome.status,
            )
        )
        self.record(
            [
                self._audit(
                    row,
                    "extend",
                    f"{outcome.status}: {outcome.message}; reason: {reason or '-'}",
                    actor=actor,
                )
            ]
        )
        metrics.EXTENSIONS.labels(outcome.status).inc()
        await self.redecide(key)
        code = {"granted": 200, "pending": 202, "refused": 409}[outcome.status]
        return code, {
            "status": outcome.status,
            "message": outcome.message,
            "verdict": self.verdict(key),
        }

    async def decide_extension(
        self, key: str, actor: str, approve: bool, seconds: float | None, reason: str
    ) -> dict:
        row = self._row(key)
        pending = [e for e in self.store.extensions("pending", key)]
        if not row.approval_pending or not pending:
            raise LookupError(f"no extension of {key} is waiting for approval")
        chosen = self.policy_named(row.policy)
        seconds = seconds if seconds is not None else chosen.extension_step.total_seconds()
        record = policy.approve(record_of(row), seconds) if approve else policy.deny(record_of(row))
        set_record(row, record)
        self.store.save_servers([row])
        for extension in pending:
            extension.status = "approved" if approve else "denied"
            extension.decided_by, extension.decided_at = actor, clock.utcnow()
            extension.decision_reason = reason
            extension.seconds = seconds if approve else 0
            self.store.update_extension(extension)
        what = f"approved {format_duration(seconds)}" if approve else "denied"
        self.record(
            [
                self._audit(
                    row,
                    "approve" if approve else "deny",
                    f"extension {what}; reason: {reason}",
                    actor=actor,
                )
            ]
        )
        await self.redecide(key)
        return {"status": "approved" if approve else "denied", "verdict": self.verdict(key)}

    async def exempt(self, key: str, actor: str, until: datetime | None, reason: str) -> dict:
        row = self._row(key)
        record = replace(record_of(row), exempt_until=until)
        if until is not None:  # the extensions the owner used stay on record
            record = replace(record.exempted(), exempt_until=until, state=policy.EXEMPT)
        set_record(row, record)
        self.store.save_servers([row])
        what = f"exempt until {clock.isoformat(until)}" if until else "exemption lifted"
        self.record([self._audit(row, "exempt", f"{what}; reason: {reason}", actor=actor)])
        await self.redecide(key)
        return {"status": "exempt" if until else "governed", "verdict": self.verdict(key)}

    async def cull_now(
        self, key: str, actor: str, reason: str, *, immediately: bool = False
    ) -> dict:
        """An admin takes the GPU back. As a hard deadline: the owner is told and a checkpoint
        taken first (bounded: ``checkpoint_timeout``, one retry), then the cull; a server
        without the extension is culled at once. ``immediately`` skips the checkpoint (a
        server that must go now), on record as such."""
        row = self._row(key)
        user, name = key.split("/", 1)
        chosen = self.policy_named(row.policy)
        why = f"culled by {actor}: {reason}"
        if self.options.dry_run:
            self.record([self._audit(row, "cull", why, actor=actor, dry_run=True)])
            return {"status": "dry-run", "verdict": self.verdict(key)}
        if not immediately:
            record = evolve(
                record_of(row),
                cull_requested_at=clock.utcnow(),
                cull_request_reason="admin",
                cull_request_why=why,
            )
            set_record(row, record)
            self.store.save_servers([row])
            self.record([self._audit(row, "cull-request", why, actor=actor)])
            await self.redecide(key)
            status = "culled" if row.state == policy.CULLED else "requested"
            return {"status": status, "verdict": self.verdict(key)}
        server = self._servers.get(key) or HubServer(user=user, name=name)
        why += " (immediately, no checkpoint)"
        outcome = await self._cull(server, row, chosen)
        if chosen.cull_action == "stop-server":  # shutdown-kernels already started it afresh
            set_record(
                row,
                replace(record_of(row), state=policy.CULLED, culled_at=clock.utcnow(), reason=why),
            )
        row.cull_reason = "admin"
        self.store.save_servers([row])
        metrics.CULLS.labels("admin", chosen.cull_action).inc()
        self.record([self._audit(row, "cull", why, actor=actor, details={"outcome": outcome})])
        return {"status": outcome, "verdict": self.verdict(key)}

    async def stop_by_owner(self, key: str, actor: str, reason: str) -> dict:
        """The owner gives the GPU back now (the Stop button). Answers at once: the request
        comes from the very server being stopped, which must not wait for its own end."""
        row = self._row(key)
        user, name = key.split("/", 1)
        why = f"stopped by {actor}" + (f": {reason}" if reason else "")
        set_record(
            row, replace(record_of(row), state=policy.CULLED, culled_at=clock.utcnow(), reason=why)
        )
        row.cull_reason = "owner"
        self.store.save_servers([row])
        self.record([self._audit(row, "stop", why, actor=actor)])
        self._spawn(self._stop_quietly(key, user, name))
        return {"status": "stopping", "verdict": self.verdict(key)}

    async def _stop_quietly(self, key: str, user: str, name: str) -> None:
        try:
            await self.hub.stop_server(user, name)
        except HubApiError as error:
            log.error("gpu-gov: stopping %s for its owner failed: %s", key, error)

    def _row(self, key: str) -> ServerRow:
        row = self.row(key)
        if row is None:
            raise KeyError(key)
        return row

    async def close(self) -> None:
        self.flush_usage()
        for task in [*self._tasks, self._dcgm_task]:
            if task is not None:
                task.cancel()
        await self.diagnosis.close()


WEIGHT_LABEL = "gpu-gov/weight"  # profiles.spawner: the grant's GPU-equivalents
_LEDGER_EVENTS = {"cull": "culls", "extend": "extensions", "approve": "extensions"}
_BILLED = (*ledger.STATES, ledger.UNOBSERVED)  # what GPU_SECONDS counts, by state


# What each optional scope of the service (hub/hubconfig.py) gives; without it the governor
# still works as jupyterhub-idle-culler does with list:users, read:users:activity, read:servers
# and delete:servers (REQUIRED_SCOPES).
OPTIONAL_SCOPES = {
    "list:groups": "teams are not read from Hub groups (only from user_options and team_map)",
    "read:users": "admin flags and group membership are unknown",
    "access:servers": (
        "servers are not asked for a checkpoint before a cull, running cells are not "
        "interrupted at the busy limit, and shutdown-kernels policies cannot act"
    ),
    "admin:server_state": "servers without the extension cannot be matched to DCGM's pods",
}
REQUIRED_SCOPES = ("list:users", "read:servers", "delete:servers")
# Scopes that include others (JupyterHub expands them in GET /user; a token may list either).
_SCOPE_PARENTS = {
    "list:users": ("users", "admin:users"),
    "read:users": ("users", "admin:users"),
    "read:users:activity": ("read:users", "users", "admin:users"),
    "read:servers": ("servers", "admin:servers"),
    "delete:servers": ("servers", "admin:servers"),
    "admin:server_state": ("admin:servers",),
    "list:groups": ("groups", "admin:groups"),
    "read:groups": ("groups", "admin:groups"),
}


def _holds(scopes: Sequence[str], scope: str) -> bool:
    """Whether ``scopes`` grant ``scope`` unfiltered (``access:servers!server=…`` does not)."""
    return scope in scopes or any(p in scopes for p in _SCOPE_PARENTS.get(scope, ()))


async def _one_after_another(coroutines) -> None:
    for coroutine in coroutines:
        await coroutine


def cause_of(root_cause: Mapping | None) -> tuple[str | None, bool]:
    """The diagnosis as the policy reads it: its label, and whether it is confident (a
    ``confident`` flag, or a ``confidence`` of at least CONFIDENT). No word of confidence is not
    confident: the cause is then named, never acted on."""
    if not isinstance(root_cause, Mapping) or not isinstance(root_cause.get("label"), str):
        return None, False
    confident = root_cause.get("confident")
    if not isinstance(confident, bool):
        level = root_cause.get("confidence")
        confident = (
            isinstance(level, int | float) and not isinstance(level, bool) and level >= CONFIDENT
        )
    return root_cause["label"], confident


CONFIDENT = 0.9


def owner_of(view: ServerView) -> ledger.Owner:
    return ledger.Owner(view.user, view.team or "", view.project or "", view.tier or "")


def _device_share(device: Mapping) -> float:
    """A reported device in GPU-equivalents: 1, or a MIG slice's compute share (``3g.40gb``:
    3/7)."""
    profile = device.get("mig_profile") or ""
    head = profile.split("g.", 1)[0]
    return round(int(head) / 7, 4) if head.isdigit() else 1.0


def _pod_of(server: HubServer) -> tuple[str | None, str] | None:
    """(namespace, pod) as KubeSpawner keeps them in its state (read with admin:server_state);
    None for other spawners, or without the scope."""
    state = server.spawner_state or {}
    pod, namespace = state.get("pod_name"), state.get("namespace")
    if not isinstance(pod, str) or not pod:
        return None
    return (namespace if isinstance(namespace, str) else None), pod


def _base_view(server: HubServer, ownership) -> ServerView:
    """Who the server is, and what the Hub knows of it."""
    return ServerView(
        user=server.user,
        name=server.name,
        profile=ownership.profile,
        tier=ownership.tier,
        team=ownership.team,
        project=ownership.project,
        labels=ownership.labels,
        started=server.started,
        hub_last_activity=server.last_activity,
    )


def verdict_of(
    row: ServerRow,
    chosen: Policy,
    *,
    dry_run: bool = False,
    root_cause: dict | None = None,
    right_size: dict | None = None,
) -> dict:
    decision = Decision(record_of(row), warn_at=row.warn_at, cull_at=row.cull_at)
    return policy.verdict(
        decision, chosen, dry_run=dry_run, root_cause=root_cause, right_size=right_size
    )


def row_view(
    row: ServerRow,
    report: Received | None,
    root_cause: dict | None = None,
    right_size: dict | None = None,
) -> dict:
    """A server as the admin API lists it; ``root_cause`` and ``right_size`` as in its
    verdict."""
    gpu = None
    if report is not None:
        r = report.report
        gpu = {
            "backend": r["backend"],
            "devices": [
                {
                    k: d.get(k)
                    for k in ("uuid", "name", "mig_profile", "memory_used_mb", "activity", "health")
                }
                for d in r["devices"]
            ],
            "memory_mb": sum(
                t["gpu"]["memory_mb"] or 0 for t in r["targets"] if t["gpu"]["holds_context"]
            ),
            "active_fraction": r["window"].get("gpu_active_fraction"),
            "reported_at": clock.isoformat(report.at),
        }
    return {
        "user": row.user,
        "name": row.name,
        "team": row.team,
        "project": row.project,
        "tier": row.tier,
        "profile": row.profile,
        "labels": row.labels or {},
        "running": row.running,
        "state": row.state,
        "reason": row.reason,
        "policy": row.policy,
        "idle_since": clock.isoformat(row.idle_since),
        "warn_at": clock.isoformat(row.warn_at),
        "cull_at": clock.isoformat(row.cull_at),
        "extensions_used": row.extensions_used,
        "approval_pending": row.approval_pending,
        "exempt_until": clock.isoformat(row.exempt_until),
        # The request in flight, else how the last checkpoint ended (a failed one stays listed,
        # with its errors, after the policy postponed the cull and cleared the request).
        "checkpoint": {
            "status": row.checkpoint_status or _result_status(row.checkpoint_manifest),
            **checkpoint_fields(row.checkpoint_manifest),
            "manifest": row.checkpoint_manifest,
        },
        "culled_at": clock.isoformat(row.culled_at),
        "gpu": gpu,
        "root_cause": root_cause,
        "right_size": right_size,
    }


def _reported_checkpoint(checkpoint) -> CheckpointResult | None:
    """The finished checkpoint a report carries (``{"requested_at", "status", "manifest"}``)."""
    if not isinstance(checkpoint, Mapping) or checkpoint.get("status") not in ("done", "failed"):
        return None
    manifest = checkpoint.get("manifest")
    when = checkpoint.get("requested_at")
    if when is None and isinstance(manifest, Mapping):
        when = manifest.get("requested_at")
    try:
        requested_at = clock.parse(when) if isinstance(when, str) else None
    except ValueError:
        requested_at = None
    return CheckpointResult(checkpoint["status"], manifest, requested_at)


def checkpoint_errors(manifest: Mapping | None) -> list[str]:
    """A checkpoint's problems, one readable line each: the manifest's errors, or the error of
    the request itself (unreachable server, timeout)."""
    if not isinstance(manifest, Mapping):
        return []
    lines = []
    for error in manifest.get("errors") or ():
        if isinstance(error, Mapping):  # older servers: {"path", "error"}
            text = ": ".join(str(error[k]) for k in ("path", "error", "message") if error.get(k))
        else:
            text = str(error)
        if text:
            lines.append(text)
    if not lines and manifest.get("error"):
        lines.append(str(manifest["error"]))
    return lines


def _result_status(manifest: Mapping | None) -> str | None:
    if not isinstance(manifest, Mapping):
        return None
    if manifest.get("status") in ("done", "failed"):
        return manifest["status"]
    return "failed" if manifest.get("error") else "done" if manifest.get("dry_run") else None


def checkpoint_fields(manifest: Mapping | None) -> dict:
    """Where a checkpoint is and what went wrong, for audit details and the admin view."""
    manifest = manifest if isinstance(manifest, Mapping) else {}
    return {
        "id": manifest.get("id"),
        "path": manifest.get("path"),
        "errors": checkpoint_errors(manifest),
    }


def checkpoint_summary(status: str, manifest: Mapping | None, shown: int = 3) -> str:
    """The audit reason of a finished checkpoint: where it is, or what went wrong."""
    manifest = manifest if isinstance(manifest, Mapping) else {}
    errors = checkpoint_errors(manifest)
    if status == "done" and not errors:
        if manifest.get("dry_run"):
            return "checkpoint skipped (dry run)"
        notebooks = len(manifest.get("notebooks") or ())
        where = f" in {manifest['path']}" if manifest.get("path") else ""
        plural = "" if notebooks == 1 else "s"
        return f"checkpoint saved{where} ({notebooks} notebook{plural})"
    if not errors:
        return f"checkpoint {status} (no error given)"
    more = len(errors) - shown
    text = "; ".join(errors[:shown]) + (f"; and {more} more" if more > 0 else "")
    return f"checkpoint {status}: {text}"


SPAWN_QUEUED_AFTER = timedelta(minutes=1)
GRANTED_TIER = "gpu-gov/tier"  # profiles.spawner.TIER: the spawn was admitted to a GPU tier


def _queued_for_a_gpu(server: HubServer, now: datetime) -> bool:
    """A spawn admitted to a GPU tier that the Hub has been starting for a while: it waits for
    a GPU to be placed (a spawn without a tier is not waiting for a GPU)."""
    tier = server.user_options.get(GRANTED_TIER)
    return (
        server.pending == "spawn"
        and isinstance(tier, str)
        and tier not in ("", "no-gpu")
        and server.started is not None
        and now - server.started >= SPAWN_QUEUED_AFTER
    )
