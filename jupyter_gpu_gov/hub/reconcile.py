"""The governor's work, apart from the web layer: take reports in, reconcile every server
against the Hub, DCGM and the policies, carry out the actions, and record everything.

Every ``cull_every`` seconds ``reconcile()`` lists the Hub's ready servers once, reads DCGM
once, and calls ``core.policy.decide`` for each server. Reports arrive between cycles (pushed by
the servers) and are kept in memory; decisions, deadlines, extensions and the audit trail are in
the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from ..core import clock, grant, ledger, policy, rightsize
from ..core.durations import format_duration
from ..core.policy import (
    Decision,
    Policy,
    Record,
    ServerView,
    evolve,
)
from ..core.report import gpu_signal, user_last_activity
from ..core.teams import group_teams
from ..core.vocabulary import (
    ADMIN,
    CHECKPOINT,
    CHECKPOINT_DONE,
    CHECKPOINT_FAILED,
    CHECKPOINT_REQUESTED,
    CHECKPOINT_TIMEOUT,
    CULL,
    CULLED,
    EXEMPT,
    GPU_IDLE,
    INTERRUPT,
    NOTICES,
    OWNER_STOP,
    SHUTDOWN_KERNELS,
    STOP_SERVER,
    TIER_LABEL,
    UNKNOWN,
    WARNED,
    WARNINGS,
    WEIGHT_LABEL,
    server_key,
)
from ..diagnose.cluster import Demand
from . import metrics, outbound, trusted
from .dcgm import DcgmSnapshot, DcgmSource, GpuEvidence, index_by_pod, index_by_uuid, is_idle
from .diagnosis import DiagnosisOptions, DiagnosisService, allocation
from .health import HealthOptions, HealthWatch
from .hubapi import HubApi, HubApiError, HubServer
from .ownership import resolve
from .store import (
    AuditRow,
    ExtensionRow,
    ServerRow,
    Store,
    StoreUnavailable,
    apply_decision,
    record_of,
    set_record,
)

log = logging.getLogger("jupyter_gpu_gov.hub")


@dataclass
class Received:
    report: dict
    at: datetime


# Seconds passes pause after the store refused a pass's decisions.
STORE_RETRY_AFTER = 5.0
# A culled server the Hub still lists as ready this long after its cull was not stopped.
CULL_RETRY_AFTER = timedelta(minutes=2)
# How often a report for a server the last pass did not see may ask the Hub about its user.
HUB_LOOKUP_EVERY = 10.0

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
        if record.checkpoint_status != CHECKPOINT_REQUESTED:
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
    concurrency: int = 10
    team_map: Mapping[str, str] = field(default_factory=dict)
    pcie_floor_bytes_per_s: float = 1_000_000
    # DCGM evidence older than this is unknown (a slow or stuck read must not cull on old news).
    dcgm_max_age: timedelta = timedelta(minutes=3)
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
    """What deciding gathered: rows to save, audit rows, the actions to carry out, and then
    their outcomes."""

    changed: list[ServerRow] = field(default_factory=list)
    audits: list[AuditRow] = field(default_factory=list)
    jobs: list = field(default_factory=list)
    # Filled by the jobs: rows they changed, new audit rows (a failed cull), rows with an outcome.
    after: list[ServerRow] = field(default_factory=list)
    outcomes: list[AuditRow] = field(default_factory=list)
    completed: list[AuditRow] = field(default_factory=list)
    saved: bool = False

    async def finish(self, governor: Governor) -> None:
        # Every decision and its audit row go on record before anything is done: when the store
        # cannot take them, nothing is done (the next pass decides again from the store).
        self.saved = governor.save_decisions(self.changed, self.audits)
        if not self.saved:
            for job in self.jobs:
                job.close()
            return
        await asyncio.gather(*self.jobs)
        governor.save_outcomes(self.after, self.outcomes, self.completed)


@dataclass
class CycleResult:
    servers: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    dcgm_errors: Sequence[str] = ()
    errors: Sequence[str] = ()


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
        self._failing: dict[str, str] = {}  # servers whose decision failed: the error, audited
        self._distrusted: dict[str, list[str]] = {}  # reports contradicting the Hub's records
        clock.watch_steps()  # a step of the wall clock is adopted at a pass, all at once
        self._store_down_until = 0.0  # monotonic: after a failed write, passes pause until then
        self._hub_lookups: dict[str, tuple[float, frozenset[str]]] = {}  # user -> (when, servers)
        # Kernel shutdowns asked of servers (in their verdicts), until their reports show it done.
        self._shutdowns: dict[str, outbound.KernelRequest] = {}
        # Cells asked to be interrupted (the busy limit), until their reports show it done.
        self._interrupts: dict[str, outbound.KernelRequest] = {}
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
        # Optional scopes the service's token lacks (checked once, at the first pass).
        self.missing_scopes: frozenset[str] | None = None

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

    async def hub_runs(self, key: str) -> bool:
        """Whether the Hub runs (or is starting) this server: reports for any other are refused,
        so no token can fill the governor's memory with servers that do not exist. Servers the
        last pass saw answer at once; others from the Hub, asked at most every
        ``HUB_LOOKUP_EVERY`` per user."""
        if key in self._servers:
            return True
        user, name = key.split("/", 1)
        now = time.monotonic()
        asked = self._hub_lookups.get(user)
        if asked is None or now - asked[0] > HUB_LOOKUP_EVERY:
            try:
                model = await self.hub.get_user(user)
            except HubApiError as error:
                log.warning("gpu-gov: cannot ask the Hub about %s: %s", key, error)
                return False
            if len(self._hub_lookups) > 10_000:
                self._hub_lookups.clear()
            asked = self._hub_lookups[user] = (now, frozenset((model or {}).get("servers") or ()))
        return name in asked[1]

    def verdict(self, key: str) -> dict:
        row = self.row(key)
        if row is None:
            not_yet = Record(state=UNKNOWN, reason="the governor has not assessed this server yet")
            return policy.verdict(
                Decision(not_yet),
                self.policies[-1],
                dry_run=self.options.dry_run,
                root_cause=self.root_cause(key),
            )
        verdict = verdict_of(
            row,
            self.policy_named(row.policy),
            dry_run=self.options.dry_run,
            root_cause=self.root_cause(key),
            right_size=self.right_size(row),
        )
        # What the server is asked to do: the governor never calls it (see hub/outbound.py).
        # A dry run asks nothing.
        verdict["requests"] = (
            {}
            if self.options.dry_run
            else outbound.requests(
                row.checkpoint_status,
                row.checkpoint_requested_at,
                row.reason,
                row.cull_reason,
                (self._shutdowns.get(key), self._interrupts.get(key)),
            )
        )
        return verdict

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
        if time.monotonic() < self._store_down_until:
            # The store refused the last pass's decisions: decide (and act) again only after a
            # pause, not a blocked write every pass.
            return CycleResult(errors=("the store is unavailable: this pass acts on nothing",))
        stepped = clock.adopt_step()
        if stepped:
            self._clock_stepped(timedelta(seconds=stepped))
        if self.missing_scopes is None:  # the first pass: which scopes, beside the rest
            scopes, groups, snapshot = await asyncio.gather(
                self._check_scopes(), self._groups(), self._dcgm_snapshot()
            )
            self.missing_scopes = scopes | (self.missing_scopes or frozenset())
        else:
            groups, snapshot = await asyncio.gather(self._groups(), self._dcgm_snapshot())
        snapshot = self._fresh(snapshot)
        self._world = _World(
            teams_by_group=group_teams(groups),
            by_uuid=index_by_uuid(snapshot.evidence) if snapshot else {},
            by_pod=index_by_pod(snapshot.evidence) if snapshot else {},
        )
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
            try:
                view = self._govern(server, rows.get(key), now, batch)
                self._observe(server, view, now)
            except Exception as error:  # one server's bad data never stops the pass
                self._skipped(key, server.user, error, batch)
            else:
                self._failing.pop(key, None)
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

        self._failing = {k: v for k, v in self._failing.items() if k in seen}
        self._distrusted = {k: v for k, v in self._distrusted.items() if k in seen}
        self._shutdowns = {k: v for k, v in self._shutdowns.items() if k in seen}
        self._interrupts = {k: v for k, v in self._interrupts.items() if k in seen}
        for pending in (self._shutdowns, self._interrupts):
            outbound.forget_answered(pending, self.reports, now, self.options.report_stale_after)
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
        for row in batch.audits if batch.saved else ():
            counts[row.action] = counts.get(row.action, 0) + 1
        errors = () if batch.saved else ("the store is unavailable: this pass acted on nothing",)
        dcgm_errors = snapshot.errors if snapshot else ()
        return CycleResult(len(seen), counts, dcgm_errors=dcgm_errors, errors=errors)

    def _clock_stepped(self, delta: timedelta) -> None:
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
        self.reports = {k: Received(r.report, r.at + delta) for k, r in self.reports.items()}
        self._checkpoints = {k: clock.shifted(c, delta) for k, c in self._checkpoints.items()}
        self._shutdowns = {k: clock.shifted(s, delta) for k, s in self._shutdowns.items()}
        self._interrupts = {k: clock.shifted(s, delta) for k, s in self._interrupts.items()}
        for session in self.ledger.open.values():
            session.at += delta
        if self._usage_written_at is not None:
            self._usage_written_at += delta
        if self._dcgm_latest is not None:
            self._dcgm_latest = clock.shifted(self._dcgm_latest, delta)
        why = f"the wall clock stepped by {delta.total_seconds():+.0f} s: deadlines, idle times and billed intervals kept as observed"
        audit = AuditRow(at=clock.utcnow(), action="clock-step", reason=why, actor="governor")
        self.save_decisions(rows, [audit])

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
                    user=user,
                    action="error",
                    reason=f"not decided (skipped until it can be): {what}",
                    actor="governor",
                )
            )

    async def redecide(self, key: str) -> None:
        """Decide one server again now (after an extension, approval or exemption), with what
        the last cycle learnt of the Hub and DCGM, so its verdict shows the new deadline.

        Not behind the pass lock: a pass waiting on a slow Hub must not hold up an owner's
        answer (the server's request would time out although the extension was granted).
        Deciding runs without an await, so it never interleaves with a pass's decisions."""
        server = self._servers.get(key)
        if server is None:
            return
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
            server.spawner_state,
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
        self._distrust(server, key, now, batch)
        view = self._with_gpu(base, chosen, now, row.reports, server)
        received = self.reports.get(key)
        evidence = (
            self._evidence(received.report, world.by_uuid, world.by_pod)
            if received is not None
            else self._granted_evidence(server)
        )
        failure = self.health.of_server(key, received and received.report, evidence, now)
        cause, confident = cause_of(self.root_cause(key))
        view = evolve(view, cause=cause, cause_confident=confident, excluded=self._excluded(server))
        view, record = self.health.prepare(view, record, failure)
        decided = policy.decide(view, record, chosen, now)
        decision = self.health.review(decided, failure, chosen, now, view.checkpointable)
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
        for action in decision.actions:
            job = self._act(action, server, row, decision, chosen, batch)
            if job is not None:
                batch.jobs.append(job)
        if before.state == decision.state == CULLED:
            self._cull_again(server, row, decision, chosen, now, batch)
        return view

    def _cull_again(
        self,
        server: HubServer,
        row: ServerRow,
        decision: Decision,
        chosen: Policy,
        now: datetime,
        batch: _Batch,
    ) -> None:
        """A server still running, ready, long after its cull went on record: the service
        stopped between recording the cull and carrying it out (or the Hub did not stop it).
        The cull is carried out again, once every ``CULL_RETRY_AFTER``, never decided anew."""
        culled_at = record_of(row).culled_at
        if self.options.dry_run or culled_at is None or now - culled_at < CULL_RETRY_AFTER:
            return
        set_record(row, replace(record_of(row), culled_at=now))
        batch.changed.append(row)
        why = f"{row.reason} (still running {format_duration(now - culled_at)} later: asked again)"
        audit = self._audit(row, "cull-retry", why, details={"cull_action": chosen.cull_action})
        batch.audits.append(audit)
        batch.jobs.append(self._carry_out_cull(server, row, decision, chosen, audit, batch))

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
        self._count(audits)
        self._save_usage()

    def save_decisions(self, rows: Sequence[ServerRow], audits: Sequence[AuditRow]) -> bool:
        """A pass's decisions and their audit rows, on record before any is acted on. False
        when the store cannot take them: nothing is acted on, and what this service holds in
        memory is dropped, so the next pass decides again from what the store has."""
        try:
            self.store.save(rows, audits)
        except StoreUnavailable as error:
            log.error("gpu-gov: %s; acting on nothing until it can be written", error)
            metrics.STORE_ERRORS.inc()
            self._rows = None
            self._store_down_until = time.monotonic() + STORE_RETRY_AFTER
            return False
        self._count(audits)
        self._save_usage()
        return True

    def save_outcomes(
        self, rows: Sequence[ServerRow], audits: Sequence[AuditRow], completed: Sequence[AuditRow]
    ) -> None:
        """What the actions came to: a cull's outcome on its audit row, a failed cull's row."""
        try:
            self.store.save(rows, audits, updated_audits=completed)
        except StoreUnavailable as error:  # done, and its decision is on record: say so
            log.error(
                "gpu-gov: %s; the outcome of %d action(s) is not on record",
                error,
                len(completed) + len(audits),
            )
            metrics.STORE_ERRORS.inc()
            self._rows = None
        self._count(completed)

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
        now = clock.utcnow()
        last = self._usage_written_at
        if not force and last is not None and now - last < self.options.usage_write_every:
            return
        deltas, sessions = self.ledger.drain()
        try:
            self.store.save_usage(deltas, sessions)
        except StoreUnavailable as error:  # kept for the next write
            log.error("gpu-gov: %s; the usage ledger is written later", error)
            metrics.STORE_ERRORS.inc()
            self.ledger.give_back(deltas, sessions)
            return
        self._usage_written_at = now
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
        pending = self._shutdowns.get(base.key)
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
        if received is None and reported:
            # It reported before (this service restarted): unknown until the next report.
            waiting = policy.GpuSignal(holds_gpu=True, active=None, detail="waiting for its report")
            return evolve(base, reports=True, gpu=waiting, reachable=False)
        granted = trusted.Granted.of(server.spawner_state) if server else None
        evidence = granted.evidence(self._world.by_uuid, self._world.by_pod) if granted else []
        if received is None:
            # No extension (or no report yet): DCGM alone where it sees the server's GPUs,
            # else jupyterhub-idle-culler's rule.
            dcgm = self._dcgm_only(evidence, chosen)
            return base if dcgm is None else evolve(base, gpu=dcgm)
        report = received.report
        stale = now - received.at > self.options.report_stale_after
        if stale:
            since = f"{received.at:%Y-%m-%d %H:%M} UTC"  # a time, so the reason stays put
            gpu = policy.GpuSignal(holds_gpu=True, active=None, detail=f"no report since {since}")
        elif self._distrusted.get(base.key):
            # Its report contradicts the Hub's records: not believed. DCGM alone on the GPUs
            # the records name, else as a server that sends no report (the Hub's activity).
            dcgm = self._dcgm_only(evidence, chosen, "its report is not believed")
            return evolve(base, reports=True, gpu=dcgm)
        else:
            gpu = gpu_signal(
                report, idle_threshold=chosen.idle_threshold, cull_action=chosen.cull_action
            )
            if granted is not None:
                # The records' GPUs: DCGM's word on them is final, busy or idle; an allocation
                # is held whatever the report says of contexts (stop-server).
                dcgm = self._dcgm_activity(evidence, chosen)
                allocated = bool(evidence) and chosen.cull_action == STOP_SERVER
                gpu = evolve(gpu, holds_gpu=gpu.holds_gpu or allocated)
            else:
                # GPUs named by the report alone: DCGM can prove them idle, never busy.
                world = self._world
                dcgm = self._dcgm_activity(self._evidence(report, world.by_uuid, {}), chosen)
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
            reachable=not stale,  # a fresh report: its verdict carries requests back
        )

    def _distrust(self, server: HubServer, key: str, now: datetime, batch: _Batch) -> None:
        """Check the server's fresh report against the Hub's records of its GPUs; when it
        contradicts them it is not believed, and the audit trail says why (once per change)."""
        received = self.reports.get(key)
        granted = trusted.Granted.of(server.spawner_state)
        found: list[str] = []
        if received is not None and granted is not None:
            evidence = granted.evidence(self._world.by_uuid, self._world.by_pod)
            found = trusted.contradictions(received.report, granted, evidence)
        before = self._distrusted.get(key, [])
        if found != before and found:
            why = "report not believed: " + "; ".join(found)
            batch.audits.append(
                AuditRow(
                    at=now,
                    server_key=key,
                    user=server.user,
                    action="report-distrusted",
                    reason=why[:2000],
                    actor="governor",
                )
            )
            log.warning("gpu-gov: %s: %s", key, why)
        if found:
            self._distrusted[key] = found
        else:
            self._distrusted.pop(key, None)

    def _dcgm_only(
        self, evidence: list[GpuEvidence], chosen: Policy, why: str = "no report"
    ) -> policy.GpuSignal | None:
        """A server as DCGM alone sees its GPUs (None: it does not). DCGM sees the card, not
        the kernels: the policy assumes a cell may be running."""
        if not evidence:
            return None
        active = self._dcgm_activity(evidence, chosen)
        detail = f"DCGM, {why}" + ("" if active is not None else ": no activity data")
        return policy.GpuSignal(holds_gpu=True, active=active, sees_cells=False, detail=detail)

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
                evidence += trusted.device_evidence(by_uuid, uuid, device.get("mig_profile"))
        return evidence

    def health_view(self) -> dict:
        """``GET api/health``, with the server holding each GPU where DCGM names its pod."""
        now = clock.utcnow()
        view = self.health.admin_view(now, self.rows)
        by_pod = {}
        for key, server in self._servers.items():
            granted = trusted.Granted.of(server.spawner_state)
            pod = granted.pod if granted is not None else None
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
            record.checkpoint_status != CHECKPOINT_REQUESTED
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
                checkpoint_summary(CHECKPOINT_FAILED, row.checkpoint_manifest),
                details={
                    **checkpoint_fields(row.checkpoint_manifest),
                    "status": CHECKPOINT_TIMEOUT,
                    "requested_at": clock.isoformat(asked),
                },
            )
        )
        return replace(record, checkpoint_status=CHECKPOINT_TIMEOUT)

    def _forget_stale_reports(self, running: set[str]) -> None:
        for key in list(self.reports):
            if (
                key not in running
                and clock.utcnow() - self.reports[key].at > self.options.report_stale_after
            ):
                del self.reports[key]

    # -- actions ------------------------------------------------------------------------------

    def _act(
        self,
        action: str,
        server: HubServer,
        row: ServerRow,
        decision: Decision,
        chosen: Policy,
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
            audits.append(self._audit(row, action, why, dry_run=dry))
        elif action == INTERRUPT:
            # Asked in the server's verdict, before its checkpoint (hub/outbound.py).
            kernels = self._busy_gpu_kernels(row.key)
            details = {"kernels": list(kernels)}
            if not dry:
                self._interrupts[row.key] = outbound.KernelRequest(
                    outbound.INTERRUPT, kernels, clock.utcnow(), decision.reason
                )
                details["outcome"] = f"asked the server to interrupt {len(kernels)} kernel(s)"
            audits.append(self._audit(row, action, decision.reason, dry_run=dry, details=details))
        elif action == CHECKPOINT:
            audits.append(self._audit(row, "checkpoint", decision.reason, dry_run=dry))
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
                "cull_action": chosen.cull_action,
                "cull_reason": decision.cull_reason,
                "checkpoint": manifest,
                "checkpoint_id": fields["id"],
                "checkpoint_path": fields["path"],
                "policy": chosen.name,
            }
            audit = self._audit(row, "cull", decision.reason, dry_run=dry, details=details)
            audits.append(audit)
            if not dry:
                return self._carry_out_cull(server, row, decision, chosen, audit, batch)
        return None

    async def _carry_out_cull(
        self,
        server: HubServer,
        row: ServerRow,
        decision: Decision,
        chosen: Policy,
        audit: AuditRow,
        batch: _Batch,
    ) -> None:
        """The cull whose decision and audit row are on record; its outcome goes on that row."""
        # Counted first: shutting kernels down drops the server's report.
        gpus = self._gpus_held(row.key, server)
        try:
            outcome = await self._cull(server, row, chosen)
        except Exception as error:  # recorded, retried next cycle
            log.error("gpu-gov: cull of %s failed: %s", row.key, error)
            set_record(row, replace(record_of(row), state=WARNED, culled_at=None))
            batch.after.append(row)
            batch.outcomes.append(
                self._audit(
                    row, "cull-failed", f"{decision.reason}; {error}", details=audit.details
                )
            )
            return
        audit.details = {**audit.details, "outcome": outcome}
        batch.completed.append(audit)
        batch.after.append(row)
        metrics.CULLS.labels(decision.cull_reason or GPU_IDLE, chosen.cull_action).inc()
        if decision.cull_reason == GPU_IDLE:
            metrics.GPUS_RECLAIMED.inc(gpus)

    async def _cull(self, server: HubServer, row: ServerRow, chosen: Policy) -> str:
        if chosen.cull_action == SHUTDOWN_KERNELS and row.key in self.reports:
            # Asked in the server's verdict: the governor never calls a user's server.
            kernels = outbound.kernels_on_gpu(self.reports[row.key].report)
            self._shutdowns[row.key] = outbound.KernelRequest(
                outbound.SHUTDOWN, kernels, clock.utcnow(), row.reason
            )
            # The server keeps running without a GPU: start over with a fresh record.
            set_record(row, replace(Record(), reason=f"kernels shut down: {row.reason}"))
            self.reports.pop(row.key, None)
            return f"asked the server to shut down {len(kernels)} kernel(s)"
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

    def _granted_evidence(self, server: HubServer) -> list[GpuEvidence]:
        """DCGM's records of the GPUs the Hub's records give a server (none without them)."""
        granted = trusted.Granted.of(server.spawner_state)
        return granted.evidence(self._world.by_uuid, self._world.by_pod) if granted else []

    def _gpus_held(self, key: str, server: HubServer) -> int:
        """The GPUs a server holds: its report's devices, else DCGM's records of its pod."""
        received = self.reports.get(key)
        if received is not None:
            return len(received.report["devices"])
        return len(self._granted_evidence(server))

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
        seconds = chosen.extension_step.total_seconds() if outcome.status == "granted" else 0
        request = ExtensionRow(
            server_key=key,
            requested_by=actor,
            requested_at=clock.utcnow(),
            seconds=seconds,
            reason=reason or "",
            status=outcome.status,
        )
        why = f"{outcome.status}: {outcome.message}; reason: {reason or '-'}"
        audit = self._audit(row, "extend", why, actor=actor)
        # A refused request changes nothing but is on record; a granted or pending one, all of
        # it or none (a store failure must not use an extension up without granting it).
        self._commit(row, outcome.record, [audit], extensions=[request])
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
        for extension in pending:
            extension.status = "approved" if approve else "denied"
            extension.decided_by, extension.decided_at = actor, clock.utcnow()
            extension.decision_reason = reason
            extension.seconds = seconds if approve else 0
        what = f"approved {format_duration(seconds)}" if approve else "denied"
        audit = self._audit(
            row,
            "approve" if approve else "deny",
            f"extension {what}; reason: {reason}",
            actor=actor,
        )
        self._commit(row, record, [audit], updated_extensions=pending)
        await self.redecide(key)
        return {"status": "approved" if approve else "denied", "verdict": self.verdict(key)}

    async def exempt(self, key: str, actor: str, until: datetime | None, reason: str) -> dict:
        row = self._row(key)
        record = replace(record_of(row), exempt_until=until)
        if until is not None:  # the extensions the owner used stay on record
            record = replace(record.exempted(), exempt_until=until, state=EXEMPT)
        what = f"exempt until {clock.isoformat(until)}" if until else "exemption lifted"
        self._commit(
            row, record, [self._audit(row, "exempt", f"{what}; reason: {reason}", actor=actor)]
        )
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
                cull_request_reason=ADMIN,
                cull_request_why=why,
            )
            self._commit(row, record, [self._audit(row, "cull-request", why, actor=actor)])
            await self.redecide(key)
            status = "culled" if row.state == CULLED else "requested"
            return {"status": status, "verdict": self.verdict(key)}
        server = self._servers.get(key) or HubServer(user=user, name=name)
        why += " (immediately, no checkpoint)"
        # On record before it is done (then its outcome), like the pass's culls.
        before = record_of(row)
        culled = replace(before, state=CULLED, culled_at=clock.utcnow(), reason=why)
        audit = self._audit(row, "cull", why, actor=actor, details={})
        self._commit(row, culled, [audit], cull_reason=ADMIN)
        try:
            outcome = await self._cull(server, row, chosen)
        except Exception as error:
            set_record(row, before)
            failed = self._audit(row, "cull-failed", f"{why}; {error}", actor=actor)
            self.save_outcomes([row], [failed], [])
            raise
        if chosen.cull_action == STOP_SERVER:  # shutdown-kernels already started it afresh
            set_record(row, culled)
        audit.details = {"outcome": outcome}
        self.save_outcomes([row], [], [audit])
        metrics.CULLS.labels(ADMIN, chosen.cull_action).inc()
        return {"status": outcome, "verdict": self.verdict(key)}

    async def stop_by_owner(self, key: str, actor: str, reason: str) -> dict:
        """The owner gives the GPU back now (the Stop button). Answers at once: the request
        comes from the very server being stopped, which must not wait for its own end."""
        row = self._row(key)
        user, name = key.split("/", 1)
        why = f"stopped by {actor}" + (f": {reason}" if reason else "")
        stopped = replace(record_of(row), state=CULLED, culled_at=clock.utcnow(), reason=why)
        self._commit(
            row, stopped, [self._audit(row, "stop", why, actor=actor)], cull_reason=OWNER_STOP
        )
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


_LEDGER_EVENTS = {"cull": "culls", "extend": "extensions", "approve": "extensions"}
_BILLED = (*ledger.STATES, ledger.UNOBSERVED)  # what GPU_SECONDS counts, by state


# What each optional scope of the service (hub/hubconfig.py) gives; without it the governor
# still works as jupyterhub-idle-culler does with list:users, read:users:activity, read:servers
# and delete:servers (REQUIRED_SCOPES).
OPTIONAL_SCOPES = {
    "list:groups": "teams are not read from Hub groups (only from user_options and team_map)",
    "read:users": "admin flags and group membership are unknown",
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
    if not isinstance(checkpoint, Mapping) or checkpoint.get("status") not in (
        CHECKPOINT_DONE,
        CHECKPOINT_FAILED,
    ):
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
    if manifest.get("status") in (CHECKPOINT_DONE, CHECKPOINT_FAILED):
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


def _queued_for_a_gpu(server: HubServer, now: datetime) -> bool:
    """A spawn admitted to a GPU tier that the Hub has been starting for a while: it waits for
    a GPU to be placed (a spawn without a tier is not waiting for a GPU)."""
    tier = grant.labels(server.spawner_state).get(TIER_LABEL)
    return (
        server.pending == "spawn"
        and isinstance(tier, str)
        and tier not in ("", "no-gpu")
        and server.started is not None
        and now - server.started >= SPAWN_QUEUED_AFTER
    )
