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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from ..core import clock, grant, ledger, policy
from ..core.policy import Policy, Record, ServerView, evolve
from ..core.teams import group_teams
from ..core.text import escaped, stored_name
from ..core.vocabulary import (
    ADMIN,
    CULLED,
    QUEUED_AT_LABEL,
    TIER_LABEL,
    WARNINGS,
    server_key,
)
from . import metrics, outbound
from .actions import Actions, CullFailed
from .checkpoints import CheckpointResult, Checkpoints
from .clock_step import ClockStep
from .dcgm import DcgmSnapshot, index_by_pod, index_by_uuid
from .dcgm_source import DcgmSource
from .deadlines import Due, NextTimes, Reports
from .diagnosis import DiagnosisService
from .evidence import Evidence, PassContext, Received
from .health import HealthWatch
from .history import History
from .hubapi import HubApi, HubServer
from .incremental import YIELD_EVERY, DecidedOn, Incremental, LookedAt, Running, let_reports_in
from .ingest import Ingest
from .listing import ACTIVITY_LAG, FRESH_READS_LEAST, HubListing, fresh_reads
from .options import Options
from .ownership import base_view, resolve
from .people import PeoplesRequests
from .pod_cpu import PodCpu
from .proc_cpu import ProcCpu
from .queue import QueueSync, line_starts
from .records import Records
from .scopes import HubAccess
from .store import Store, StoreUnavailable
from .tables import (
    AuditRow,
    Rows,
    ServerRow,
    apply_decision,
    changes_row,
    record_of,
    set_record,
)
from .unchanged import Unchanged
from .usage import Usage, _Use
from .views import Views, cause_of

log = logging.getLogger("jupyter_gpu_gov.hub")


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


@dataclass
class CycleResult:
    servers: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    dcgm_errors: Sequence[str] = ()
    errors: Sequence[str] = ()


class Governor(
    Incremental,
    Ingest,
    Views,
    Evidence,
    Checkpoints,
    Actions,
    Usage,
    Records,
    PeoplesRequests,
    HubAccess,
    ClockStep,
    History,
):
    """The governor: takes reports in and runs the pass. Each concern lives in its own module
    (``incremental``, ``ingest``, ``views``, ``evidence``, ``checkpoints``, ``actions``,
    ``usage``, ``records``, ``people``, ``scopes``, ``clock_step``, ``history``); this class holds the state they share
    and the pass that joins them."""

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
        self._started = clock.utcnow()  # checkpoints asked before are asked again (views.py)
        self.policies = list(policies)
        # What this pass decides on: an apply while it waits for the Hub governs from the next
        # pass (else servers decided after it were warned on it before its audit row's time).
        self._pass_policies = self.policies
        self.options = options
        self.dcgm = dcgm
        self.due = Due()  # between full passes, the servers to look at (hub/deadlines.py)
        # Reports of servers no pass saw running (yet), by when each goes stale.
        self._orphan_reports = NextTimes()
        self.reports = {}
        self.use: dict[str, _Use] = {}  # measured this session, for right-sizing
        self._checkpoints: dict[str, CheckpointResult] = {}  # finished, not yet applied
        self._tasks: set[asyncio.Task] = set()
        self._rows: Rows | None = None
        self._rows_read_at = 0.0  # time.monotonic() of the rows' last whole read
        self._rows_read_to: datetime | None = None  # the newest updated_at read (on standby)
        self._read_back_due = False  # on standby: the holder's writes read back at next look
        self._dcgm_task: asyncio.Future | None = None
        self._dcgm_latest: DcgmSnapshot | None = None
        self._servers = Running()  # running servers, as of the last cycle
        self._looked: set[str] = set()  # servers decided since the gauges were last published
        self._queued: set[str] = set()  # running servers the spawn queue started (their labels)
        self._cull_waiting: set[str] = set()  # culls waiting for a fresh read, on record once
        self.gauges = metrics.StateGauges()
        self._failing: dict[str, str] = {}  # servers whose decision failed: the error, audited
        self._distrusted: dict[str, list[str]] = {}  # reports contradicting the Hub's records
        # each server's distrust audited: since when, how often since, the changes not said
        self._distrust_said: dict[str, tuple[datetime, int, int]] = {}
        self._unrecorded: frozenset[str] = frozenset()  # decisions the store is writing
        # The GPUs DCGM has attributed to a server's pod this session (its start): all of them,
        # or the server cannot be proved idle (evidence._sees_all).
        self._pod_gpus: dict[str, tuple[datetime | None, frozenset]] = {}
        clock.watch_steps()  # a step of the wall clock is adopted at a pass, all at once
        self._store_down_until = 0.0  # monotonic: after a failed write, passes pause until then
        self._hub_lookups: dict[str, tuple[float, frozenset[str]]] = {}  # user -> (when, servers)
        # Kernel shutdowns asked of servers (in their verdicts), until their reports show it done.
        self._shutdowns: dict[str, outbound.KernelRequest] = {}
        # Cells asked to be interrupted (the busy limit), until their reports show it done.
        self._interrupts: dict[str, outbound.KernelRequest] = {}
        # Culls the Hub failed, until it takes one (hub/actions.py: tried again after a pause).
        self._cull_failures: dict[str, CullFailed] = {}
        # The session of each server the Hub took a stop of, until a pass finds it gone.
        self._stops: dict[str, datetime | None] = {}
        # By server, the answers to an owner's requests that changed nothing (a refused Extend)
        # or are under way (a Stop), and the record they were given on: given again on it,
        # they are not recorded again (hub/people.py).
        self._asked: dict[str, tuple[tuple, set[tuple]]] = {}
        self._context = PassContext()
        # What this pass compared of DCGM's records, by server (the pass's context, the Hub model,
        # the report, what was read): taken by its decision, the rest dropped at the next pass.
        self._compared: dict[str, tuple] = {}
        # The last server's Hub records and their DCGM records, by its model and the pass's
        # context (``Evidence._records_of``): one server's, read once for all that asks.
        self._granted_held: tuple = (None, None, None, ())
        self._indexed: tuple = ()  # the DCGM evidence the context's indexes are of
        self.unchanged = Unchanged(options.full_pass_every)
        self._world: tuple = ()  # what reaches every server at once, as of the last pass
        self.hub_listing = HubListing(
            options.full_pass_every, lag=options.hub_activity_lag or ACTIVITY_LAG
        )
        self._deciding = False  # a pass is deciding: the users its listing brought are fresh
        # Set but while a pass decides (its rows, half this pass's and half the last's): a
        # listing's snapshot waits for it (``between_passes``).
        self._decided = asyncio.Event()
        self._decided.set()
        self._passes_deciding = 0  # how many passes began deciding (``Views.of_one_pass``)
        # Users a pass may read one by one before its culls (hub/incremental.py), and left.
        self._fresh_reads = self._fresh_reads_left = FRESH_READS_LEAST
        self._decided_on: dict = {}  # key -> what a cull to read the Hub before was decided on
        self._cycle = asyncio.Lock()
        self.last_cycle: CycleResult | None = None
        self.diagnosis = DiagnosisService(options.diagnosis)
        self.health = HealthWatch(options.health)
        self.pod_cpu = PodCpu(options.pod_cpu)  # the containers' CPU: CPU stages (no report)
        self.proc_cpu = ProcCpu(options.proc_cpu)  # a workstation's server processes' CPU
        self.health.restore(store.dismissals())  # an admin's dismissals outlive a restart
        self.ledger = ledger.Ledger(options.ledger_max_gap, store.usage_sessions(open_only=True))
        self._keep_to_the_stores_clock()
        self._usage_written_at: datetime | None = None  # None: the first pass writes
        # GPU spawns the Hub has been starting for longer than SPAWN_QUEUED_AFTER (on Kubernetes,
        # pods waiting for a GPU node), as of the last pass (``None`` before the first):
        # fragmentation is "GPUs partly used while spawns wait".
        self.spawns_waiting: int | None = None
        self.spawns_waiting_tiers: tuple[str, ...] = ()  # their tiers (where could they go)
        # The spawn queue's sync after each pass (hub/app.py): the line's demand, too.
        self.spawn_queue = QueueSync(
            hub,
            store,
            options.dry_run,
            self.hub_listing,
            options.queue_retry_after,
            options.left_pod_retry,
        )
        self.spawn_queue.restore_withdrawn()  # a reclaim lifted before a restart is still said
        # Optional scopes the service's token lacks (checked once, at the first pass).
        self.missing_scopes: frozenset[str] | None = None

    @property
    def reports(self) -> dict[str, Received]:
        """The latest report of each server; a write marks the server (``hub/deadlines.py``)."""
        return self._reports

    @reports.setter
    def reports(self, reports: dict[str, Received]) -> None:
        self._reports = Reports(reports, self.due)
        for key in reports:  # a pass keeps those of running servers
            self._orphan(key)

    # -- the cycle ----------------------------------------------------------------------------

    async def reconcile(self) -> CycleResult:
        async with self._cycle:  # a cull-now and the timer never reconcile at once
            started = time.perf_counter()
            try:
                result = await self._reconcile()
            finally:
                if self.acting:  # (a standby decides nothing: it reads nothing from DCGM)
                    self._read_dcgm_next()
            result.duration_s = time.perf_counter() - started
            metrics.RECONCILE_SECONDS.observe(result.duration_s)
            self.last_cycle = result
            return result

    @property
    def acting(self) -> bool:
        """Whether this governor may act: it holds the store's lease (``hub/lease.py``), or
        runs without one (built alone, as in tests)."""
        lease = self.store.lease
        return lease is None or lease.held()

    def why_not_acting(self) -> str:
        """Why this governor acts on nothing now (while not ``acting``): another holds the
        lease, or its own lapsed (a locked store) until its next renewal."""
        lease = self.store.lease
        if lease is None or not lease.ours:
            return STANDBY
        return f"{lease.why_not_held()}; meanwhile it acts on nothing"

    def take_over(self) -> None:
        """This governor took the lease from another, which wrote meanwhile: what a start-up
        reads from the store is read again (the rows, the ledger's open sessions, which rows
        exist), and checkpoints asked before now are asked again (views.py), as at a restart."""
        self.store.forget_known()
        self.health.restore(self.store.dismissals())  # the other governor's admins' too
        self.spawn_queue.restore_withdrawn()  # the reclaims the other lifted, still to be said
        stepped = clock.adopt_step()  # on standby: what it kept (reports) to today's clock
        if stepped:
            self._shift_kept(timedelta(seconds=stepped))
        self._started = clock.utcnow()
        self._rows = None
        self._checkpoints.clear()  # (they answered the rows as read before)
        self.ledger = ledger.Ledger(
            self.options.ledger_max_gap, self.store.usage_sessions(open_only=True)
        )
        self._keep_to_the_stores_clock()  # (another's clock wrote them)
        self._usage_written_at = None
        self.missing_scopes = None  # the first pass's checks, again
        if self._dcgm_task is None:  # the first pass waits for a read, as at a start
            self._dcgm_latest = None

    async def _reconcile(self) -> CycleResult:
        if not self.acting:
            # Another governor holds the lease: no decision, action, bill or history here.
            # Reports are still taken in (warm for a takeover; forgotten once stale), answered
            # and authorised from the store as the holder writes it (what it wrote since the
            # last pass read back each pass).
            self.read_back_rows()
            # ...and the reclaims it lifted: a report answered here says so as the holder's does.
            self.spawn_queue.restore_withdrawn()
            self._forget_stale_reports(())
            return CycleResult(errors=(self.why_not_acting(),))
        if time.monotonic() < self._store_down_until:
            # The store refused the last pass's decisions: decide (and act) again only after a
            # pause, not a blocked write every pass.
            return CycleResult(errors=("the store is unavailable: this pass acts on nothing",))
        stepped = clock.adopt_step()
        if stepped:
            await self._clock_stepped(timedelta(seconds=stepped))
        if self.missing_scopes is None:  # the first pass: which scopes, beside the rest
            scopes, groups, snapshot, _, _ = await asyncio.gather(
                self._check_scopes(),
                self._groups(),
                self._dcgm_snapshot(),
                self.pod_cpu.read(clock.utcnow()),
                self.proc_cpu.read(clock.utcnow()),
            )
            self.missing_scopes = scopes | (self.missing_scopes or frozenset())
            self._shutdowns_on_record(clock.utcnow())
        else:
            groups, snapshot, _, _ = await asyncio.gather(
                self._groups(),
                self._dcgm_snapshot(),
                self.pod_cpu.read(clock.utcnow()),
                self.proc_cpu.read(clock.utcnow()),
            )
        snapshot = self._fresh(snapshot)
        evidence = snapshot.evidence if snapshot else ()
        by_uuid, by_pod = self._context.by_uuid, self._context.by_pod
        if evidence != self._indexed:  # (a record the read kept is the same object: quick)
            self._indexed = evidence
            by_uuid, by_pod = index_by_uuid(evidence), index_by_pod(evidence)
        if groups is None:  # the Hub failed to list them: the last pass's teams stand
            teams, read = self._context.teams_by_group, self._context.groups_read
        else:
            teams, read = group_teams(groups), True
        self._context = PassContext(teams, by_uuid, by_pod, groups_read=read)
        rows = self.rows
        batch = _Batch()
        now = clock.utcnow()
        self.health.observe_dcgm(snapshot, self._context.by_uuid, now)
        self._pass_policies = self.policies
        full = self.unchanged.begin_pass(
            self._pass_policies, self._context.teams_by_group, bool(stepped)
        )
        kept = await self._plan_listing(full, groups, rows, now, self._world_changed(snapshot, now))
        seen: set[str] = set()  # running servers this pass listed or looked at
        self._fresh_reads = self._fresh_reads_left = fresh_reads(
            len(self._servers), self.hub.page_size
        )
        self._decided_on.clear()  # of culls a failed write never carried out
        self._deciding = True
        self._decided.clear()
        self._passes_deciding += 1
        try:
            waiting = await self._decide_listed(kept, rows, now, batch, seen)
        finally:
            self._deciding = False
            # (what follows up to the next await, the servers found stopped, is this pass's
            # too: a snapshot waiting for this runs after it)
            self._decided.set()
        stopped = self._stopped(seen, rows)
        for key in stopped:
            self._servers.pop(key, None)
            row = rows.get(key)
            if row is not None and row.running:
                row.running = False  # stopped (by its owner, the Hub or us)
                self._admin_cull_dropped(row, None, batch.audits)
                self.use.pop(key, None)
                self.unchanged.forget(key)
                self.due.forget(key)
                self.diagnosis.forget(key)
                batch.changed.append(row)
            if key in self.ledger.open:
                # Stopped by us: billed to that moment; else to this pass, which found it gone.
                at = row.culled_at if row is not None and row.culled_at else now
                self.ledger.close(key, min(at, now))
            for kept in (
                self._failing,
                self._distrusted,
                self._distrust_said,
                self._shutdowns,
                self._interrupts,
                self._pod_gpus,
                self._stops,
                self._cull_failures,
                self._asked,
            ):
                kept.pop(key, None)
            self._queued.discard(key)
            self._cull_waiting.discard(key)
        self.ledger.sweep(now)  # the servers not looked at: as they were (core/ledger.py)
        self._record_keyframes(self.unchanged.kept, now)
        for pending in (self._shutdowns, self._interrupts):
            outbound.forget_answered(pending, self.reports, now, self.options.report_stale_after)
        self.spawns_waiting, self.spawns_waiting_tiers = len(waiting), tuple(waiting)
        self.spawn_queue.pending_tiers = self.spawns_waiting_tiers
        queued = {k: self._servers[k] for k in sorted(self._queued) if k in self._servers}
        self.line_starts = line_starts(queued, rows, self.reports)
        self.health.finish_pass(stopped, now)
        ended = self.health.take_ended()
        if ended and self.acting:  # (a standby's store is its active governor's to write)
            try:
                await self.store.save_async(undismissed=ended)
            except StoreUnavailable:  # deleted at a later pass; meanwhile new evidence shows
                self.health.ended.update(ended)
        patches = []  # sent once their audit rows are on record, not awaited by the pass
        for node, patch, action, why in self.health.node_changes():
            batch.audits.append(self._audit_row(None, action, why, dry_run=self.options.dry_run))
            if not self.options.dry_run:
                patches.append(self.health.patch_node(node, patch, action))
        if self.options.cull_users:
            batch.jobs.append(self._cull_inactive_users(now, batch.audits))
        await self._settle(batch)
        for patch in patches:
            if batch.saved and self.acting:  # (a pause since the write: the lease lapsed)
                self._in_background(patch)
            else:  # not on record: asked again at the next pass
                patch.close()
        if stopped and batch.saved and self.acting:
            await self._forget_stopped(rows, stopped)
        await self._record_pass(batch.audits if batch.saved else (), stopped, now)
        await self._save_usage_async()
        self._forget_stale_reports(stopped)
        self.diagnosis.maybe_train(now)  # in a worker; the pass does not wait for it
        if self.hub_listing.full:  # every server, as a safety net
            moved = {*rows, *self.gauges}
        else:
            moved = {*self._looked, *stopped, *(r.key for r in (*batch.changed, *batch.after))}
        await self._publish_gauges(moved)
        counts: dict[str, int] = {}
        for row in batch.audits if batch.saved else ():
            counts[row.action] = counts.get(row.action, 0) + 1
        errors = () if batch.saved else ("the store is unavailable: this pass acted on nothing",)
        dcgm_errors = snapshot.errors if snapshot else ()
        return CycleResult(len(self._servers), counts, dcgm_errors=dcgm_errors, errors=errors)

    async def _decide_listed(
        self, kept: LookedAt, rows, now, batch: _Batch, seen: set
    ) -> list[str]:
        """Decide (or keep) the servers this pass lists, then those looked at whose users the
        listing did not bring: they did nothing on the Hub since it last listed them
        (hub/incremental.py: what a cull on such a model needs). The others, neither listed nor
        looked at, are not visited: nothing they read moved. Returns how many spawns wait for
        a GPU (the tier of each)."""
        waiting: list[str] = []
        turns = _Turns()  # reports come in between two slices, as between two listing pages
        # Decide each page of servers while the Hub API client fetches the next.
        # "active": ready servers and those the Hub is starting, which may wait for a GPU.
        async for server in self.hub_listing.servers(self.hub):
            await turns.next()
            if server.pending or not server.ready:
                tier = _queued_for_a_gpu(server, now)
                if tier is not None:
                    waiting.append(tier)
                continue  # the Hub is starting or stopping it
            key = server_key(server.user, server.name)
            held = self.unchanged.kept.get(key)
            if held is None or server != held.server:  # a new model: compare everything
                self._decide_one(key, server, None, rows, now, batch, seen)
                continue
            server = held.server  # the same model: its kept decision's, not a second copy
            if key in kept.views:  # looked at this pass: its kept view, or decide
                self._decide_one(key, server, kept.views[key], rows, now, batch, seen)
            else:  # neither marked nor due, its model as it was: it keeps its decision
                seen.add(key)
                self._servers[key] = server
        if not self.hub_listing.full:  # (a full listing brought every running server)
            listed = self.hub_listing.listed
            for key, view in kept.views.items():
                await turns.next()
                server = self._servers[key]
                if server.user not in listed:
                    self._decide_one(key, server, view, rows, now, batch, seen)
        return waiting

    def _stopped(self, seen: set[str], rows) -> list[str]:
        """The servers running at the last pass that this one found gone. A full listing
        brought every running server: any other on record (running, billed) stopped. Between
        full listings, only a listed user's servers can have stopped (a stop moves its user's
        activity): those the listing did not bring ready."""
        if self.hub_listing.full:
            known = (*self._servers, *(k for k, r in rows.items() if r.running), *self.ledger.open)
            return [k for k in dict.fromkeys(known) if k not in seen]
        by_user = self._servers.by_user
        found = (k for u in self.hub_listing.listed for k in by_user.get(u, ()) if k not in seen)
        return sorted(found)

    def _decide_one(self, key, server, view, rows, now, batch: _Batch, seen: set) -> None:
        """Decide one running server (unless ``view``, kept from its last decision), and
        observe it for the ledger and the diagnosis. Its kept inputs are not compared here: a
        server looked at was compared as the pass planned (``_plan_listing``), and one with a
        new Hub model differs from its kept decision's (comparing again found the same: at
        10,000 servers about 4 % of a pass)."""
        seen.add(key)
        self._looked.add(key)
        self._servers[key] = server
        try:
            if view is None:
                view = self._govern(server, rows.get(key), now, batch)
            self._observe(server, view, now)
            self._record(server, view, now)  # its history (hub/history.py)
        except Exception as error:  # one server's bad data never stops the pass
            self._skipped(key, server.user, error, batch)
            self.due.mark(key)
            self.ledger.skip(key)  # not seen this pass
        else:
            self._failing.pop(key, None)

    async def _settle(self, batch: _Batch) -> None:
        """Every decision and its audit row go on record before anything is done: when the store
        cannot take them, nothing is done (the next pass decides again from the store)."""
        batch.saved = await self.save_decisions(batch.changed, batch.audits)
        if not batch.saved:
            for job in batch.jobs:
                job.close()
            return
        await asyncio.gather(*batch.jobs)
        await self.save_outcomes_async(batch.after, batch.outcomes, batch.completed)

    async def _forget_stopped(self, rows: Rows, stopped: Sequence[str]) -> None:
        """The rows of a user's stopped servers past ``stopped_kept_per_user`` (the longest
        stopped first; never one stopped in this pass), out of the store and of memory, said in
        the log. A server's name is its owner's choice: one who started a server of a new name
        in each pass left a row each for good (about 0.6 kB in memory a row), which every
        owner's page, listing and diagnosis read through. A forgotten server that starts again
        is a new one to the governor (a new session keeps no more than its checkpoint hook's
        failures)."""
        users = {row.user for key in stopped if (row := rows.get(key)) is not None}
        if not users:
            return
        # The stopped users' rows alone, not every row (``Rows.of_user``).
        mine = {user: [row for row in rows.of_user(user) if not row.running] for user in users}
        just = set(stopped)
        bound = self.options.stopped_kept_per_user
        forgotten: dict[str, list[str]] = {}
        for user, kept in mine.items():
            if len(kept) <= bound:
                continue
            kept.sort(key=lambda r: (r.key in just, r.updated_at or _EPOCH, r.key))
            cut = len(kept) - bound
            forgotten[user] = [r.key for r in kept[:cut] if r.key not in just]
        keys = [key for keys in forgotten.values() for key in keys]
        if not keys:
            return
        try:
            await self.store.forget_servers_async(keys)
        except StoreUnavailable as error:  # kept: forgotten at the user's next stop
            log.warning("gpu-gov: forgetting stopped servers' rows: %s", error)
            return
        for key in keys:
            if not (row := rows.get(key)) or not row.running:  # (started again meanwhile: kept)
                rows.pop(key, None)
        named = sorted(forgotten.items(), key=lambda item: -len(item[1]))
        log.info(
            "gpu-gov: forgot the rows of %d stopped servers, at most %d kept a user (the "
            "stopped most lately): %s",
            len(keys),
            bound,
            ", ".join(f"{escaped(user)} {len(cut)}" for user, cut in named[:10])
            + (f" and {len(named) - 10} more users" if len(named) > 10 else ""),
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
        self._looked.add(key)
        self._govern(server, self.rows.get(key), clock.utcnow(), batch)
        await self._settle(batch)
        await self._save_usage_async()

    def _admin_cull_dropped(
        self, row: ServerRow, started: datetime | None, audits: list[AuditRow]
    ) -> None:
        """An admin's Cull now still waiting (its checkpoint first) when the session it was
        for ended without it: the owner restarted (``started``: the new session, which does
        not carry it) or the server stopped (None: its owner, the Hub or a crash stopped it).
        On record as skipped, naming the request and the sessions, so the admin learns their
        cull did not happen; and settled: the record no longer holds it."""
        record = record_of(row)
        if record.cull_requested_at is None or record.cull_request_reason != ADMIN:
            return
        if record.state == CULLED:  # carried out: the Hub took the stop
            return
        why = record.cull_request_why or "a cull was asked for"
        old = clock.isoformat(row.session_started) or "none"
        if started is None:
            ended = (
                f"the server stopped before it was done, not stopped by the governor (that "
                f"session started {old})"
            )
        else:
            ended = (
                f"the server restarted before it was done (that session started {old}; the "
                f"running one {clock.isoformat(started)}). Cull the new one if it must go"
            )
        audits.append(self._audit_row(row, "cull-skipped", f"{why}; not culled: {ended}"))
        settled = evolve(
            record,
            cull_requested_at=None,
            cull_request_reason=None,
            cull_request_why="",
            checkpoint_status=None,
            checkpoint_requested_at=None,
            reason=f"{why}; not culled: {ended}",
        )
        set_record(row, settled)

    def _govern(
        self, server: HubServer, row: ServerRow | None, now: datetime, batch: _Batch
    ) -> ServerView:
        """Decide one server and queue what follows: the row to save, audits, actions. Returns
        the view it decided on."""
        key = server_key(server.user, server.name)
        marks = (len(batch.changed), len(batch.audits), len(batch.jobs))
        context = self._context
        ownership = resolve(
            server.user,
            server.user_options,
            server.spawner_state,
            server.groups,
            context.teams_by_group,
            self.options.team_map,
            self.options.tier_names,
        )
        if row is None or (server.started and row.session_started != server.started):
            if row is not None:
                self._admin_cull_dropped(row, server.started, batch.audits)
            # A new session keeps what the governor learned of the server (its hook's record).
            fresh = Record() if row is None else record_of(row).next_session()
            row = ServerRow(
                key=key,
                user=stored_name(server.user),
                name=stored_name(server.name),
                session_started=server.started,
            )
            set_record(row, fresh)
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
        if row.labels and QUEUED_AT_LABEL in row.labels:  # read by line_starts each pass
            self._queued.add(key)
        else:
            self._queued.discard(key)

        record = self._apply_checkpoint_result(key, before, row, batch.audits)
        if key in self.reports and not row.reports:
            row.reports = True
            batch.changed.append(row)
        # The row's labels, equal to the ownership's here: one dict a server, not two kept.
        base = base_view(server, ownership, self.options.hub_activity_lag, row.labels)
        # Policies match on who, not on the GPU.
        server_policy = policy.select(self._pass_policies, base)
        record = self._checkpoint_timeout(row, record, server_policy, now, batch.audits)
        self._distrust(server, key, now, batch)
        view = self._with_gpu(base, server_policy, now, row.reports, server)
        received = self.reports.get(key)
        # A report the records contradict is not believed, its health claims neither.
        report = received.report if received and key not in self._distrusted else None
        # Its GPU's health. One the Hub's records give no GPU holds none (``_with_gpu``): what
        # its report says of a GPU is its owner's word on a card not theirs, and DCGM's reading
        # of a card only that report names is not its own: neither flags it (docs/health.md).
        claims = None if grant.no_gpu(server.spawner_state) else report
        evidence = (
            self._report_evidence(claims, server)
            if claims is not None
            else self._granted_evidence(server)
        )
        failure = self.health.of_server(key, claims, evidence, now, server.spawner_state)
        cause, confident = cause_of(self.root_cause(key))
        view = evolve(view, cause=cause, cause_confident=confident, excluded=self._excluded(server))
        view, record = self.health.prepare(view, record, failure)
        decided = policy.decide(view, record, server_policy, now)
        if not WARNINGS.isdisjoint(decided.actions):
            # A warning's notice counts from when it is given, not from the pass's start: a
            # slow pass reached this server seconds later (8.3 s of a 24 s notice at load 14),
            # and a notice counted from then was that much short. Decided again as of now (in
            # the pass's frame of the wall clock: a step is adopted only between passes).
            now = max(now, clock.utcnow())
            decided = policy.decide(view, record, server_policy, now)
        decision = self.health.review(decided, failure, server_policy, now, view.checkpointable)
        decided = DecidedOn(view, record, server_policy, now)  # a cull's, to check before it
        decision = self._cull_held(row, decided, decision, now)
        decision = self._cull_waits(server, row, decided, decision, batch.audits)
        flagged = self.health.flag(key, decision.record, now)
        if flagged:
            batch.audits.append(self._audit_row(row, "gpu-unknown", flagged))
        if changes_row(row, before, decision, server_policy.name):
            apply_decision(row, decision, server_policy.name)
            batch.changed.append(row)
        if decision.state != before.state:
            batch.audits.append(
                self._audit_row(
                    row, "state", f"{before.state} → {decision.state}: {decision.reason}"
                )
            )
        for action in decision.actions:
            job = self._act(action, server, row, decision, server_policy, batch)
            if job is not None:
                batch.jobs.append(job)
        if before.state == decision.state == CULLED:
            self._cull_again(server, row, decision, server_policy, now, batch)
        self._interrupt_again(row)  # (after a restart)
        steady = marks == (len(batch.changed), len(batch.audits), len(batch.jobs))
        if steady and failure is None and self.unchanged.enabled:
            until = policy.holds_until(view, record, server_policy, decision, now)
            self._keep(key, server, row, received, view, until, now)
        elif failure is None and len(batch.jobs) == marks[2]:  # (nothing to do: no action)
            self._keep_settled(key, server, row, received, view, server_policy, now, batch, marks)
        else:
            self._unkeep(key)
        return view

    async def _publish_gauges(self, keys) -> None:
        """The running servers' gauges (``metrics.StateGauges``): those of ``keys`` (the
        servers decided or stopped since the last publish, or every one) set again, the loop
        running every ``GAUGES_PER_TURN`` of them (10,000 hold it ~30 ms), then published."""
        self._looked.clear()  # one decided meanwhile (a person's request) is published next
        rows, billed, servers, gauges = self.rows, self.ledger.open, self._servers, self.gauges
        for turn, key in enumerate(keys, 1):
            if turn % GAUGES_PER_TURN == 0:
                await let_reports_in()
            row = rows.get(key)
            if row is None or not row.running:
                gauges.drop(key)
                continue
            session, server = billed.get(key), servers.get(key)
            # The pod the Hub's records name (KubeSpawner's state), never a report's: PromQL
            # joins DCGM's series on it (docs/grafana.md), and a report naming another's pod
            # had their GPU's activity read as its own, or broke the join for every server
            # (two series of one pod).
            held = grant.pod(server.spawner_state) if server is not None else None
            pod = (held[0] or "", held[1]) if held is not None else ("", "")
            gauges.set(key, row, session.gpus if session is not None else 0.0, pod)
        gauges.publish()

    # -- which servers are governed -------------------------------------------------------------

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

    async def background_done(self) -> None:
        """Wait for the work a pass leaves running: the next DCGM read, and what it handed
        to the background once on record (node patches, a user's servers stopped)."""
        running = [t for t in (*self._tasks, self._dcgm_task) if t is not None]
        if running:
            await asyncio.wait(running)

    async def close(self) -> None:
        self.flush_usage()
        for task in [*self._tasks, self._dcgm_task]:
            if task is not None:
                task.cancel()
        await self.diagnosis.close()
        # Its HTTP client is tied to this event loop (libcurl's timers among it); a later
        # request on another loop opens a new one.
        self.hub.close()


class _Turns:
    """A pass's deciding in slices, the event loop running between two (``let_reports_in``):
    ``YIELD_EVERY`` servers or ``SLICE_S``, whichever comes first. 32 decisions took 10-30 ms of
    CPU at 10,000 servers (more on a loaded machine), each report arriving meanwhile waiting for
    all of them (docs/benchmarks-history.md, "Issue 26, wave 14")."""

    __slots__ = ("_left", "_until")

    def __init__(self) -> None:
        self._left, self._until = YIELD_EVERY - 1, time.perf_counter() + SLICE_S

    async def next(self) -> None:
        """Before each server: the loop runs if this slice is over."""
        self._left -= 1
        if self._left < 0 or time.perf_counter() >= self._until:
            await let_reports_in()
            self._left, self._until = YIELD_EVERY - 1, time.perf_counter() + SLICE_S


STANDBY = "on standby: another governor holds the store's lease; this one acts on nothing"
SLICE_S = 0.005  # a pass's longest run of deciding between two turns of the event loop
SPAWN_QUEUED_AFTER = timedelta(minutes=1)
GAUGES_PER_TURN = 1000  # servers' gauges set between two turns of the event loop
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _queued_for_a_gpu(server: HubServer, now: datetime) -> str | None:
    """The tier of a spawn admitted to a GPU tier that the Hub has been starting for a while:
    it waits for a GPU to be placed (None: it does not; a spawn without a tier never does)."""
    tier = grant.labels(server.spawner_state).get(TIER_LABEL)
    waits = (
        server.pending == "spawn"
        and isinstance(tier, str)
        and tier not in ("", "no-gpu")
        and server.started is not None
        and now - server.started >= SPAWN_QUEUED_AFTER
    )
    return tier if waits else None
