"""Deciding only what changed (issue 26; a part of ``Governor``): which kept decisions hold
(``hub/unchanged.py``), which servers a pass between full passes looks at
(``hub/deadlines.py``: the marks and the heap of next times), and the Hub model a cull rests on.

Between full listings a server is decided on the Hub model its user's listing last brought
(``hub/listing.py``: a model that moved moves the user's activity, and the pass lists the users
active since the last listing). A warning, a checkpoint request or an interrupt may rest on
that model; a cull, which takes a GPU away, rests on a model read in this pass: the pass's
listing when it brought the user, else one ``GET /users/{name}`` just before the cull, which is
skipped (``cull-skipped``) when the server changed since (stopped, restarted, new activity).
A pass reads at most ``listing.fresh_reads`` users so; the culls past it wait for the next pass
(``cull-waits``, on record once per wait), their decision not taken.

A pass between full listings visits only the servers its listing brought or it looks at: a
report is compared with what its server's kept decision read as it arrives (``_note_report``),
the running servers are what the last pass knew less the listed users' servers the listing did
not bring (``Running``: by user), and what the others would have done at every pass is done
once for all of them (the ledger's sweep, the history's keyframes in a heap, the gauges kept
per server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial

from ..core import clock, policy
from ..core.policy import Decision, Policy, Record, ServerView, evolve
from ..core.vocabulary import CHECKPOINT_REQUESTED, CULL, NOTICES, WARNINGS
from . import trusted
from .dcgm import DcgmSnapshot, GpuEvidence, moved_gpus
from .evidence import Received
from .hubapi import HubServer
from .tables import ServerRow, changes_row, record_of
from .unchanged import DcgmRead, Kept, dcgm_read, same_report
from .views import cause_of

# A pass looks at (here) or decides (hub/reconcile.py) this many servers, then lets the event
# loop run, reports waiting above all: 10,000 servers at once held it 1-12 s
# (docs/benchmarks-history.md, "Issue 26, wave 10").
YIELD_EVERY = 32
# Turns of the standard event loop a report takes from its connection to its answer, one each:
# the connection accepted, its transport made (asyncio's own task), the protocol told, then the
# request read and answered.
REPORT_TURNS = 4
# What a decision kept after it wrote (``_keep_settled``) may have put on record: a change of
# state, a warning or a notice (``Actions._act``: an audit row, nothing more to do).
SETTLED_AUDITS = frozenset({"state", *WARNINGS, *NOTICES})


async def let_reports_in() -> None:
    """Where a pass lets the event loop run: ``REPORT_TURNS`` turns, so that a report which
    arrived during the slice just spent is answered before the next slice. One turn moved each
    report one step a slice: at 10,000 servers its answer took 4-5 slices of 5 ms during a pass,
    the p99 55-76 ms (docs/benchmarks-history.md, "Issue 26, wave 18"). A turn with nothing ready
    costs microseconds, so a pass with no report waiting is not slowed."""
    for _ in range(REPORT_TURNS):
        await asyncio.sleep(0)


@dataclass
class LookedAt:
    """Between full passes: the servers looked at, with their kept views (``None``: decide
    it); the others, neither marked nor due, keep their decisions."""

    views: dict[str, ServerView | None] = field(default_factory=dict)


class Running(dict):
    """The running servers by key, as of the last pass, and their keys by user: a pass that
    listed only some users finds which of their servers stopped without walking every one."""

    __slots__ = ("by_user",)

    def __init__(self) -> None:
        super().__init__()
        # A tuple of keys, not a set: most users run one server (a set of one: 216 bytes).
        self.by_user: dict[str, tuple[str, ...]] = {}

    def __setitem__(self, key: str, server: HubServer) -> None:
        if key not in self:
            self.by_user[server.user] = (*self.by_user.get(server.user, ()), key)
        super().__setitem__(key, server)

    def __delitem__(self, key: str) -> None:
        self.pop(key)

    def pop(self, key: str, *default):
        if key not in self:
            return super().pop(key, *default)
        server = super().pop(key)
        keys = tuple(k for k in self.by_user[server.user] if k != key)
        if keys:
            self.by_user[server.user] = keys
        else:
            del self.by_user[server.user]
        return server


class Incremental:
    """Kept decisions and the servers to look at (a part of ``Governor``)."""

    async def _plan_listing(
        self, full: bool, groups, rows, now: datetime, everyone: bool = False
    ) -> LookedAt:
        """Which servers this pass lists from the Hub (hub/listing.py): every one, or between
        full passes the users active since the last listing. Only the servers marked or due
        since the last pass are looked at (hub/deadlines.py); ``everyone``: every kept server
        is (the diagnosis model changed, or DCGM's GPUs came or went). The others keep their
        view, if listed, while their model did not change."""
        for key in self.due.take_written():  # reports not written by ingest (which notes its own)
            self._note_report(key)
        if full:
            self.due.clear()
        await self.hub_listing.plan(self.hub, full, groups)
        kept = LookedAt()
        look = self.due.take(now)
        self._compared = {}  # the last pass's: of its context
        if full:
            return kept
        if everyone:
            look.update(self.unchanged.kept)
        servers = self._servers
        for turn, key in enumerate(look, 1):
            if turn % YIELD_EVERY == 0:  # reports come in meanwhile (``look`` is this pass's)
                await let_reports_in()
            server = servers.get(key)
            if server is None:
                continue  # stopped
            kept.views[key] = self._kept_view(key, server, rows.get(key), now)
        return kept

    def _inputs(self, key: str, server: HubServer, received: Received | None) -> tuple:
        """What a decision of this server reads besides its Hub model, report and record, to
        compare with its kept decision's: the diagnosis's cause, and what it reads of DCGM's
        records (``_dcgm_inputs``), noted for the decision that may follow in this pass."""
        evidence = self._dcgm_inputs(server, received)
        self._compared[key] = (self._context, server, received, evidence)
        return (cause_of(self.root_cause(key)), *evidence)

    def _decided_inputs(
        self, key: str, server: HubServer, received: Received | None, view: ServerView
    ) -> tuple:
        """``_inputs`` as the decision just taken on ``view`` read them: its cause is the
        view's; what it read of DCGM is what this pass compared, on the same Hub model and
        report (the same pass's records and reads), else worked out now (worked out again
        after each comparison, about 3 % of a pass at 10,000 servers)."""
        compared = self._compared.pop(key, None)
        if (
            compared is not None
            and compared[0] is self._context
            and compared[1] is server
            and compared[2] is received
        ):
            evidence = compared[3]
        else:
            evidence = self._dcgm_inputs(server, received)
        return ((view.cause, view.cause_confident), *evidence)

    def _dcgm_inputs(self, server: HubServer, received: Received | None) -> tuple:
        """What a decision of this server reads of DCGM's records (``unchanged.dcgm_read``: the
        Hub's records' GPUs, the report's by pod and by UUID)."""
        context, read = self._context, self._dcgm_reading
        evidence = tuple(map(read, self._granted_evidence(server)))
        if received is not None:
            report = received.report
            evidence += (None, *map(read, self._evidence(report, context.by_uuid, context.by_pod)))
            evidence += (None, *map(read, self._evidence(report, context.by_uuid, {})))
        return evidence

    # The reads of the last DCGM read's records by their ids (records ``_world`` keeps alive).
    _dcgm_reads: Mapping[int, DcgmRead] = {}  # (replaced whole, never changed)
    _dcgm_read_as: tuple = ()  # the idle thresholds and PCIe floor ``_dcgm_read`` reads by

    def _dcgm_reading(self, e: GpuEvidence) -> DcgmRead:
        """What a decision reads of this record (``unchanged.dcgm_read``)."""
        read = self._dcgm_reads.get(id(e))
        return self._dcgm_read()(e) if read is None else read

    def _dcgm_read(self) -> Callable[[GpuEvidence], DcgmRead]:
        """``unchanged.dcgm_read`` under this pass's policies (the same while they are)."""
        thresholds = frozenset(p.idle_threshold for p in self._pass_policies)
        wanted = (thresholds, self.options.pcie_floor_bytes_per_s)
        if wanted != self._dcgm_read_as:
            self._dcgm_read_as, self._dcgm_reader = wanted, dcgm_read(*wanted)
        return self._dcgm_reader

    def _special(self, key: str) -> bool:
        """Something is waiting on the server that the kept inputs do not show."""
        return (
            key in self._checkpoints
            or key in self._shutdowns
            or key in self._interrupts
            or key in self._distrusted
            or key in self._failing
            or key in self._cull_waiting
            or key in self._cull_failures
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
        stale_at = self._stale_at(key, received)
        inputs = partial(self._inputs, key, server, received)
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
        inputs = self._decided_inputs(key, server, received, view)
        keys = trusted.dcgm_keys(self._records_of(server)[0], received.report if received else None)
        kept = Kept(server, received, inputs, row, record_of(row), view, until, keys)
        self.unchanged.keep(key, kept)
        self.due.at(key, _earliest(until, stale_at))

    def _keep_settled(
        self, key, server, row, received, view, server_policy: Policy, now, batch, marks
    ) -> None:
        """A decision that changed its server's row with nothing left to do (no job; its audit
        rows, if any, a change of state, a warning or a notice: ``SETTLED_AUDITS``) is kept as
        a steady one is when deciding again on the same inputs would change nothing
        (``_settled``): else every change was decided again at the next pass, to write nothing
        (at 10,000 servers, a fifth of a pass's decisions: docs/benchmarks-history.md, "Issue
        26, wave 40")."""
        audits = batch.audits[marks[1] :]
        if not self.unchanged.enabled or any(a.action not in SETTLED_AUDITS for a in audits):
            self._unkeep(key)
            return
        again = self._settled(view, record_of(row), server_policy, row, now)
        if again is None:
            self._unkeep(key)
            return
        until = policy.holds_until(view, record_of(row), server_policy, again, now)
        self._keep(key, server, row, received, view, until, now)

    def _settled(
        self, view: ServerView, record: Record, server_policy: Policy, row: ServerRow, now
    ) -> Decision | None:
        """The decision the next pass would take on the same inputs and ``record`` (the one
        just decided, on the row), when it would not change the row (``tables.changes_row``,
        ``Governor._govern``'s test); else None. As ``_govern`` takes it, with no GPU failing (it is not kept then): the
        checkpoint's timeout and ``health.prepare`` first, neither of which may move it."""
        asked = record.checkpoint_requested_at
        if (
            record.checkpoint_status == CHECKPOINT_REQUESTED
            and asked is not None
            and now - asked >= server_policy.checkpoint_timeout
        ):
            return None  # it times out at the next pass
        prepared, same = self.health.prepare(view, record, None)
        if same != record or prepared != view:
            return None
        again = policy.decide(view, record, server_policy, now)
        return None if changes_row(row, record, again, server_policy.name) else again

    def _commit(self, row: ServerRow, record, audits, **changes) -> None:
        """A person's request (``Records._commit``) changed the row's record outside a pass:
        its kept decision read the old one, so the next pass looks at it."""
        super()._commit(row, record, audits, **changes)
        self.due.mark(row.key)

    def _unkeep(self, key: str) -> None:
        """Its decision is not kept: decide it again at the next pass."""
        self.unchanged.forget(key)
        self.due.mark(key)

    def _note_report(self, key: str) -> None:
        """A report was just kept (``Governor.ingest``): compared once, now, with what its
        server's kept decision read, and the server marked for the next pass only if it moved
        — the pass never compares reports; else its kept decision holds until the new report
        goes stale. One of a server no pass saw running is forgotten once stale, unless a pass
        finds its server running (``_forget_stale_reports``).

        A kept decision holds no report but the latest (one report a server in memory, not two:
        docs/benchmarks-history.md, "Issue 26, wave 13"): one that read another report is forgotten
        now, as the pass would find it moved and decide the server; one that read the same (as
        far as a decision reads, ``same_report``: equal in what it compares) takes the new one
        in its place, which compares as the old did with any later report."""
        self.due.written.discard(key)
        if key not in self._servers:
            self._orphan(key)
            return
        kept, received = self.unchanged.kept.get(key), self.reports.get(key)
        if kept is not None and not same_report(received, kept.received):
            self._unkeep(key)
        elif self._report_moved(key, kept) or self._share_moved(key):
            self.due.mark(key)
        else:  # the same again: it goes stale later (else every server is due every few passes)
            kept.received = received
            self.due.at(key, _earliest(kept.until, self._stale_at(key, received)))

    def _share_moved(self, key: str) -> bool:
        """Whether the report moved the server's right-sizing share (its measured use) from
        what the ledger bills: the ledger's sweep bills a server not looked at as it was."""
        if not self.options.tier_sizes:
            return False  # no share to move
        kept, billed = self.unchanged.kept.get(key), self.ledger.open.get(key)
        if kept is None or billed is None:
            return False  # decided at the next pass anyway, or not billed yet
        return self._right_size_share(kept.view) != billed.right_size_share

    def _orphan(self, key: str) -> None:
        """A report of a server no pass sees running: looked at when it goes stale."""
        received = self.reports.get(key)
        if received is not None:
            stale_at = received.at + self.options.report_stale_after
            self._orphan_reports.at(key, stale_at.timestamp())

    def _forget_stale_reports(self, stopped: Iterable[str]) -> None:
        """Reports of servers not running (stopped, or not yet seen by a pass) are forgotten
        once stale; only those whose stale time came are looked at (a heap), not every one at
        every pass (thousands, after a wave of culls)."""
        for key in stopped:
            self._orphan(key)
        now = clock.utcnow()
        for key in self._orphan_reports.take(now.timestamp()):
            received = self.reports.get(key)
            if received is None or key in self._servers:
                continue  # gone already, or its server runs: kept
            if now - received.at > self.options.report_stale_after:
                del self.reports[key]
            else:  # a later report: looked at when it goes stale
                self._orphan(key)

    def _report_moved(self, key: str, kept: Kept | None) -> bool:
        """Whether the diagnosis the report brought differs from what the server's kept
        decision (which read the same report) read, or something waits that it does not show."""
        return (
            kept is None or self._special(key) or cause_of(self.root_cause(key)) != kept.evidence[0]
        )

    def _read_this_pass(self, server: HubServer) -> bool:
        """Whether the pass deciding now read this server's model (its user's listing)."""
        return self._deciding and server.user in self.hub_listing.listed

    def _cull_waits(
        self, server: HubServer, row: ServerRow, decided: DecidedOn, decision: Decision, audits
    ) -> Decision:
        """A cull decided on a model not read in this pass needs one read of its user before
        it (``_still_as_decided``, which is given what was decided on); past this pass's bound
        of those reads, the decision is not taken (its deadlines are): the record stays as it
        was, on record as such, and the next pass decides the server again."""
        if CULL not in decision.actions or self._read_this_pass(server):
            self._cull_waiting.discard(row.key)
            return decision
        if self._fresh_reads_left > 0:
            self._fresh_reads_left -= 1
            self._decided_on[row.key] = decided
            self._cull_waiting.discard(row.key)
            return decision
        if row.key not in self._cull_waiting:  # on record once, when it first waits
            self._cull_waiting.add(row.key)
            why = (
                f"{decision.reason}: waits for the next pass (this pass read its most users"
                f" before their culls, {self._fresh_reads})"
            )
            audits.append(self._audit_row(row, "cull-waits", why))
        return evolve(decision, record=decided.record, actions=())

    async def _still_as_decided(self, server: HubServer, row: ServerRow) -> str | None:
        """Just before a cull decided on a model not read in this pass: the server's model read
        now. A server stopped, restarted or otherwise changed since, or with new activity on
        the Hub that its policy, deciding again, would not cull, is not culled: this says why
        (the cull is skipped on record, ``Actions._not_culled``), and the next pass asks for
        its user and decides it on what the Hub says then. None: the cull stands."""
        decided = self._decided_on.pop(row.key, None)
        now, _ = await self.hub.get_server(server.user, server.name)
        if now == server:
            return None
        if now is None:
            what = "the server stopped"
        elif now.started != server.started:
            what = "the server restarted"
        elif now.pending or not now.ready:
            what = f"the Hub is busy with it ({now.pending or 'not ready'})"
        elif replace(now, last_activity=server.last_activity) != server:
            what = "its Hub model changed"
        elif decided is None or not decided.culls(now.last_activity):
            what = "new activity on the Hub"
        else:  # activity that does not reset the policy's clock (a tab open on an idle GPU)
            return None
        self.hub_listing.waiting.add(server.user)  # asked for at the next pass
        return f"{what} since it was decided"

    def _world_changed(self, snapshot: DcgmSnapshot | None, now: datetime) -> bool:
        """Whether what every kept decision read at once moved since the last pass: the
        diagnosis model, DCGM's GPUs (one came or went). The servers whose DCGM records moved
        in what a decision reads of them (a GPU's activity, memory or health: ``unchanged.
        dcgm_read``, ``dcgm.moved_gpus``; not its power, clocks or PCIe bytes, which move at
        every scrape) are marked to be looked at again, and those whose CPU stage began or ended (hub/pod_cpu.py, hub/proc_cpu.py) to
        be decided again: a read that moved a tenth of the GPUs looked at every kept server
        (10,000 servers: 1.1 s a pass, docs/benchmarks-history.md, "Issue 26, wave 38")."""
        for key in self.pod_cpu.changed(now) | self.proc_cpu.changed(now):
            self.due.mark(key)
        evidence = snapshot.evidence if snapshot else ()
        trained = self.diagnosis.training.trained_at
        # What a decision reads of each record: one that moved only in what no decision reads
        # (its power, clocks: every scrape of a real exporter) marks nobody.
        read = self._dcgm_read()
        last = self._world
        if not last or evidence is not last[0] or read is not last[3]:
            reads = tuple(map(read, evidence))
            self._dcgm_reads = dict(zip(map(id, evidence), reads, strict=True))
        else:
            reads = last[2]
        self._world = (evidence, trained, reads, read)
        if not last or trained != last[1]:
            return True
        if evidence is last[0]:
            return False
        moved = moved_gpus(last[2], reads)
        if moved is None:
            return True
        if moved:
            for key, kept in self.unchanged.kept.items():
                if not moved.isdisjoint(kept.dcgm_keys):
                    self.due.mark(key)
        return False


@dataclass(frozen=True)
class DecidedOn:
    """What a cull was decided on: the policy's inputs, to decide again on the Hub's activity
    read just before it."""

    view: ServerView
    record: Record
    policy: Policy
    now: datetime

    def culls(self, hub_last_activity: datetime | None) -> bool:
        view = evolve(self.view, hub_last_activity=hub_last_activity)
        return CULL in policy.decide(view, self.record, self.policy, self.now).actions


def _earliest(*times: datetime | None) -> datetime | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
