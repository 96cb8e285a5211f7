"""What the governor shows: a server's verdict, the admin listing, the health and diagnosis
views, and the reads the REST API and the pages make (``governor.audit_trail(...)``,
``governor.usage(...)``) — routes and pages talk to these, never to the store or the reports."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from ..core import browser_json, clock, policy, rightsize
from ..core.ledger import Session as LedgerSession
from ..core.policy import Decision, Policy, Record
from ..core.vocabulary import CHECKPOINT_REQUESTED, RECLAIM_LABEL, UNKNOWN
from ..core.wire import LineStart, Verdict
from ..diagnose import cluster
from ..diagnose.cluster import Demand
from . import outbound, showback, trusted
from .allocation import allocation
from .checkpoints import checkpoint_fields, result_status
from .evidence import Received
from .queue import Unopened
from .tables import AuditRow, ExtensionRow, Rows, ServerRow, record_of, set_record


def _encoded(verdict: dict) -> bytes:
    """A report's answer as the report route sends it."""
    return browser_json.dumps({"verdict": verdict}).encode()


# The answers kept on rows lately, each once: most busy servers under one policy are answered
# the same (~0.6 kB each, kept on each row: ~2 MB at 10,000 servers). Forgotten all at once
# when full, so what is held here stays small whatever the answers. (The Hub listing's shared
# choices and grants, hubapi._shared, stop adding when full instead: they change slowly, but
# an answer goes stale within minutes, and a cache that kept the first ones would soon share
# none.)
SHARED_ANSWERS_KEPT = 64
_shared_answers: dict[bytes, bytes] = {}


def _shared_answer(answer: bytes) -> bytes:
    """``answer``, or the equal one kept lately."""
    shared = _shared_answers.get(answer)
    if shared is None:
        if len(_shared_answers) >= SHARED_ANSWERS_KEPT:
            _shared_answers.clear()
        shared = _shared_answers[answer] = answer
    return shared


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
# On standby, the rows the holder wrote are read back from a little before the newest one read,
# and whole this often (``read_back_rows``).
READ_BACK_OVERLAP = timedelta(minutes=5)
READ_WHOLE_EVERY_S = 600.0


def match_text(match: Mapping[str, Any]) -> str:
    """A :func:`policy_view` match as an admin wrote it: ``teams: vision, nlp; labels: a=b``
    ("" among server names is the default server); "" when it matches everything."""

    def value(key, v):
        if key == "labels":
            return ", ".join(f"{a}={b}" for a, b in v.items())
        if key == "server_names":
            return ", ".join(n or "(default)" for n in v)
        return ", ".join(v)

    return "; ".join(f"{k}: {value(k, v)}" for k, v in match.items())


def policy_view(p: Policy) -> dict:
    """A policy as the API and the dashboard show it (durations in seconds)."""

    def seconds(value):
        return None if value is None else int(value.total_seconds())

    return {
        "name": p.name,
        "match": {
            k: (dict(v) if k == "labels" else list(v)) for k, v in vars(p.match).items() if v
        },
        "idle_threshold": p.idle_threshold,
        "warn_after_s": seconds(p.warn_after),
        "cull_after_s": seconds(p.cull_after),
        "user_activity_grace_s": seconds(p.user_activity_grace),
        "busy_grace_s": seconds(p.busy_grace),
        "busy_limit_s": seconds(p.busy_limit),
        "on_busy_limit": p.on_busy_limit,
        "after_interrupt": p.after_interrupt,
        "quiet_cell_limit_s": seconds(p.quiet_cell_limit),
        "away_after_s": seconds(p.away_after),
        "zombie_idle_s": seconds(p.zombie_idle),
        "presence_limit_s": seconds(p.presence_limit),
        "extension_step_s": seconds(p.extension_step),
        "max_extensions": p.max_extensions,
        "extension_reason": p.extension_reason,
        "max_age_s": seconds(p.max_age),
        "max_age_warning_s": seconds(p.max_age_warning),
        "checkpoint": p.checkpoint,
        "checkpoint_timeout_s": seconds(p.checkpoint_timeout),
        "on_checkpoint_failure": p.on_checkpoint_failure,
        "checkpoint_retries": p.checkpoint_retries,
        "checkpoint_max_delay_s": seconds(p.checkpoint_max_delay),
        "checkpoint_broken_after": p.checkpoint_broken_after,
        "cull_action": p.cull_action,
        "exempt": p.exempt,
        "inactive_timeout_s": seconds(p.inactive_timeout),
        "expected_duration_notice": p.expected_duration_notice,
    }


def verdict_of(
    row: ServerRow,
    server_policy: Policy,
    *,
    dry_run: bool = False,
    root_cause: dict | None = None,
    right_size: dict | None = None,
    requests: dict | None = None,
    started_from_line: tuple[LineStart, ...] = (),
    reclaim_withdrawn: datetime | None = None,
) -> Verdict:
    decision = Decision(
        record_of(row),
        warn_at=row.warn_at,
        cull_at=row.cull_at,
        at_deadline=row.at_deadline,
        policy_change=row.policy_change,
    )
    return policy.verdict(
        decision,
        server_policy,
        dry_run=dry_run,
        root_cause=root_cause,
        right_size=right_size,
        requests=requests,
        started_from_line=started_from_line,
        reclaim_withdrawn=reclaim_withdrawn,
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
                # (optional in the wire: a valid report without it made every listing a 500)
                t["gpu"].get("memory_mb") or 0
                for t in r["targets"]
                if t["gpu"]["holds_context"]
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
        # The Hub's ``started`` of the session governed: an admin's cull names it (``session``).
        "session": clock.isoformat(row.session_started),
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
            "status": row.checkpoint_status or result_status(row.checkpoint_manifest),
            **checkpoint_fields(row.checkpoint_manifest),
            "manifest": row.checkpoint_manifest,
            "failures_in_row": row.hook_failures,  # checkpoint_broken_after
        },
        "culled_at": clock.isoformat(row.culled_at),
        "gpu": gpu,
        "root_cause": root_cause,
        "right_size": right_size,
    }


class Views:
    """What the governor shows (a part of ``Governor``)."""

    # By user: their servers the spawn queue started, not opened yet (set each pass).
    line_starts: Mapping[str, tuple[Unopened, ...]] = MappingProxyType({})

    def verdict(self, key: str) -> dict:
        """The verdict the server's next report gets back (``core.wire.Verdict``, as JSON)."""
        row = self.row(key)
        if row is None:
            return self._not_assessed(key)
        return self._verdict(row, *self._verdict_inputs(row), self.reclaim_withdrawn(row))

    def answer(self, key: str) -> bytes:
        """A report's answer: ``{"verdict": <verdict(key)>}`` as JSON. Where the verdict is
        made of the row's record, its deadlines and its policy alone (no root cause, right
        size, request or line start: most servers, most reports), the bytes are kept on the
        row and given again while those are the same: the record and the policy the same
        objects (both frozen; the pass keeps a record it does not change), the deadlines equal
        (times print as they compare, to the millisecond in UTC; words are words). That is
        15 µs of a report's ~600 (docs/benchmarks-history.md, "Issue 26, wave 28")."""
        row = self.row(key)
        if row is None:
            return _encoded(self._not_assessed(key))
        server_policy, root_cause, right_size, asked, started = self._verdict_inputs(row)
        lifted = self.reclaim_withdrawn(row)  # (looked up once: each report's answer)
        if root_cause is not None or right_size is not None or asked or started or lifted:
            return _encoded(
                self._verdict(row, server_policy, root_cause, right_size, asked, started, lifted)
            )
        record, dry_run = record_of(row), self.options.dry_run
        kept = row._answer
        if (
            kept is not None
            and kept[0] is record
            and kept[1] is server_policy
            and kept[2] == row.warn_at
            and kept[3] == row.cull_at
            and kept[4] == row.at_deadline
            and kept[5] == row.policy_change
            and kept[6] is dry_run
        ):
            return kept[7]
        answer = _shared_answer(
            _encoded(self._verdict(row, server_policy, None, None, asked, started, None))
        )
        row._answer = (
            record,
            server_policy,
            row.warn_at,
            row.cull_at,
            row.at_deadline,
            row.policy_change,
            dry_run,
            answer,
        )
        return answer

    def _not_assessed(self, key: str) -> dict:
        not_yet = Record(state=UNKNOWN, reason="the governor has not assessed this server yet")
        return policy.verdict(
            Decision(not_yet),
            self.policies[-1],
            dry_run=self.options.dry_run,
            root_cause=self.root_cause(key),
        ).to_json()

    def _verdict_inputs(
        self, row: ServerRow
    ) -> tuple[Policy, dict | None, dict | None, dict | None, tuple[LineStart, ...]]:
        """What a row's verdict is made of besides the row: its policy, the root cause, the
        right size, what the server is asked to do and the line's starts."""
        key = row.key
        # What the server is asked to do: the governor never calls it (see hub/outbound.py).
        # A dry run asks nothing, and starts nothing from the line.
        asked, started = None, ()
        if not self.options.dry_run:
            started = self.started_from_line(row)
        # A governor on standby asks nothing either: its rows may be a pass behind the
        # holder's, which alone asks (hub/lease.py).
        if not self.options.dry_run and key not in self._unrecorded and self.acting:
            asked = outbound.requests(
                row.checkpoint_status,
                row.checkpoint_requested_at,
                row.reason,
                row.cull_reason,
                (self._shutdowns.get(key), self._interrupts.get(key)),
            )
        return (
            self.policy_named(row.policy),
            self.root_cause(key),
            self.right_size(row),
            asked,
            started,
        )

    def _verdict(
        self,
        row: ServerRow,
        server_policy: Policy,
        root_cause: dict | None,
        right_size: dict | None,
        asked: dict | None,
        started: tuple[LineStart, ...],
        reclaim_withdrawn: datetime | None,
    ) -> dict:
        return verdict_of(
            row,
            server_policy,
            dry_run=self.options.dry_run,
            root_cause=root_cause,
            right_size=right_size,
            requests=asked,
            started_from_line=started,
            reclaim_withdrawn=reclaim_withdrawn,
        ).to_json()

    def reclaim_withdrawn(self, row: ServerRow) -> datetime | None:
        """When a reclaim on the row's server was withdrawn, while its owner is still to be
        told (``hub/queue.py``); None once a reclaim stands on it again (a new warning), or
        when the server started since (the Hub's ``started``): the new session was never warned."""
        queue = getattr(self, "spawn_queue", None)  # a governor built without its passes
        if queue is None or (row.labels and RECLAIM_LABEL in row.labels):
            return None
        return queue.withdrawn_at(row.key, row.session_started)

    def lease_view(self, holder: bool = True) -> dict | None:
        """Whether this governor acts (holds the store's lease, ``hub/lease.py``) and, with
        ``holder`` (for admins: a pod's name is the cluster's, not a user's business), which
        one does, as last read. ``None``: a governor without a lease, built alone."""
        lease = self.store.lease
        if lease is None:
            return None
        view: dict = {"held": self.acting}
        if holder:
            who = lease.holder
            view["holder"] = (
                {"host": who.host, "pid": who.pid, "since": who.since}
                if who is not None and who.id
                else None
            )
        return view

    def started_from_line(self, row: ServerRow) -> tuple[LineStart, ...]:
        """The owner's other servers the spawn queue started and nobody has opened yet (as of
        the last pass: ``hub.queue.line_starts``)."""
        unopened_servers = self.line_starts.get(row.user)
        if not unopened_servers:
            return ()  # most owners, on every report: without a clock read
        now = clock.utcnow()
        return tuple(
            unopened.notice
            for unopened in unopened_servers
            if unopened.key != row.key and now < unopened.claim_by
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
    def rows(self) -> Rows:
        """Every server the governor knows, in memory: it is the store's only writer, so the
        database is read once, at start (on standby, what the holder writes is read back:
        ``read_back_rows``)."""
        if self._rows is not None and self._read_back_due:
            self._read_back()
        if self._rows is None:
            self._rows = Rows(self.store.servers())
            for row in self._rows.values():
                _asked_again_at_start(row, self._started)
            self._rows_read_at = time.monotonic()
            self._rows_read_to = _newest(self._rows.values())
        self._read_back_due = False
        return self._rows

    def read_back_rows(self) -> None:
        """On standby the holder writes the rows: at the next look at them (a report's, after
        the pass: the holder's pass has written by then), what it wrote since the last read
        is read back (each write stamps ``updated_at``; back ``READ_BACK_OVERLAP`` more, for
        a write stamped before an earlier one commits, or a holder's clock a little behind),
        not every row (10,000 rows read and built at each pass for a few changed). A whole
        read every ``READ_WHOLE_EVERY_S``, for a holder's clock stepped back further."""
        self._read_back_due = True

    def _read_back(self) -> None:
        if self._rows_read_to is None or (
            time.monotonic() - self._rows_read_at > READ_WHOLE_EVERY_S
        ):
            self._rows = None  # read whole
            return
        changed = self.store.servers(changed_since=self._rows_read_to - READ_BACK_OVERLAP)
        for key, row in changed.items():
            _asked_again_at_start(row, self._started)
            self._rows[key] = row
        # A row the holder forgot (``Governor._forget_stopped``, as a user's server stops) is
        # deleted, never written again: kept here it stayed listed until the whole read. The
        # users whose servers stopped lately keep here what the store keeps of them.
        stopped = {row.user for row in changed.values() if not row.running}
        if stopped:
            stored = self.store.server_keys(stopped)
            for user in stopped:
                for row in self._rows.of_user(user):
                    if row.key not in stored:
                        del self._rows[row.key]
        self._rows_read_to = max(
            self._rows_read_to, _newest(changed.values()) or self._rows_read_to
        )

    def row(self, key: str) -> ServerRow | None:
        """What the governor keeps of one server (``None``: a server it never saw)."""
        return self.rows.get(key)

    async def between_passes(self) -> None:
        """Returns when no pass is deciding: what is read then, before the next ``await``, is
        one pass's state (and its reports' since), never a pass's rows half decided. A
        listing's snapshot (``hub/listings.py``) waits here: at most the rest of a pass's
        deciding (a few seconds at 10,000 servers), never its culls."""
        while not self._decided.is_set():
            await self._decided.wait()

    async def of_one_pass(self, *reads: Callable[[], Any]) -> list:
        """What ``reads`` return (or their awaitables: ``listings.snapshot``), each in turns of
        the event loop of its own (reports are answered between two), all between the same two
        passes: read again, all of them, when a pass decided meanwhile."""
        from .incremental import let_reports_in  # (it reads this module's ``cause_of``)

        while True:
            await self.between_passes()
            began = self._passes_deciding
            out = []
            for read in reads:
                if out:
                    await let_reports_in()
                value = read()
                out.append(await value if inspect.isawaitable(value) else value)
            if began == self._passes_deciding and self._decided.is_set():
                return out

    def known_servers(self, running_only: bool = True) -> list[ServerRow]:
        """The rows of the servers the governor knows: those running, or all of them."""
        return [r for r in self.rows.values() if r.running or not running_only]

    def policy_named(self, name: str | None) -> Policy:
        return next((p for p in self.policies if p.name == name), self.policies[-1])

    def health_view(self, granted: Mapping[str, trusted.Granted | None] | None = None) -> dict:
        """``GET api/health``, with the server holding each GPU where DCGM names its pod;
        ``granted``: ``granted_now()``'s, else read here."""
        now = clock.utcnow()
        view = self.health.admin_view(now, self.rows)
        by_pod = _by_pod(self._granted() if granted is None else granted)
        for gpu in view["gpus"]:
            pod = gpu["pod"]
            if gpu["server"] is None and pod is not None:
                gpu["server"] = by_pod.get((pod["namespace"], pod["name"]))
        return view

    def _servers_by_pod(self) -> dict[tuple[str | None, str], str]:
        return _by_pod(self._granted())

    def _granted(self) -> dict[str, trusted.Granted | None]:
        """What the Hub's records say each running server holds (``trusted.Granted``)."""
        return _granted_of(self._servers)

    async def granted_now(self) -> dict[str, trusted.Granted | None]:
        """``_granted``, read in a worker from a copy of the running servers: 10,000 spawner
        states read are ~20-40 ms, twice for the dashboard (its health and diagnosis)."""
        servers = dict(self._servers)
        return await asyncio.get_running_loop().run_in_executor(None, _granted_of, servers)

    def diagnosis_summary(
        self, days: int = 7, granted: Mapping[str, trusted.Granted | None] | None = None
    ) -> dict:
        """``GET api/diagnosis``: causes, their cost per team and node, fragmentation (cards by
        what is allocated on them; spawns pending a GPU, waiting in line for one, or refused
        for want of one lately: the spawn queue's last sync)."""
        running = [key for key, row in self.rows.items() if row.running]
        # The devices the allocator pinned (the spawner's state), never those a report names:
        # its user writes it (docs/security.md).
        granted_by_key = self._granted() if granted is None else granted
        granted = [
            grant.devices
            for key in running
            if key in self._servers and (grant := granted_by_key.get(key)) is not None
        ]
        evidence = [e for records in self._context.by_uuid.values() for e in records]
        shares = allocation(granted, evidence, self.spawn_queue.cards)
        sync = self.spawn_queue
        asked = [
            *((tier, "pending") for tier in self.spawns_waiting_tiers),
            *((tier, "queued") for tier in sync.queued_tiers),
            *(
                (tier, "refused")
                for tier, n in ((sync.room or {}).get("refused") or {}).items()
                for _ in range(n)
            ),
        ]
        since = (clock.utcnow() - sync.room_at).total_seconds() if sync.room_at else 0.0
        return self.diagnosis.summary(
            running,
            shares,
            Demand(self.spawns_waiting, self.spawn_queue.queued, self.spawn_queue.refused),
            self.options.report_stale_after,
            teams={key: row.team or "" for key, row in self.rows.items()},
            days=days,
            cards_unknown="" if shares else self._cards_unknown(granted, evidence),
            nodes=cluster.placement(asked, sync.room, since),
        )

    def _cards_unknown(self, granted: list, evidence: list) -> str:
        """Why the fragmentation figure counts no card: which of its sources is missing."""
        if self.dcgm is None:
            dcgm = "DCGM is not configured (dcgm_exporter_urls or dcgm_prometheus_url)"
        elif not evidence:
            dcgm = "DCGM's last read named no GPU (it failed, is older than dcgm_max_age, or is yet to come)"
        else:
            dcgm = (
                "DCGM knows no card's allocation (time-sliced cards without their memory figures)"
            )
        if any(granted):
            mine = "the workstation allocator's records name no card whose allocation is known"
        else:
            mine = "no running server has the workstation allocator's record of its GPUs"
        return f"no card to count: {dcgm}, and {mine}"

    # -- what the REST API and the pages read (they never reach the store or the reports) ----

    def extensions(
        self,
        status: str | None = None,
        key: str | None = None,
        limit: int | None = None,
        before: int | None = None,
    ) -> list[ExtensionRow]:
        """Extension requests, newest first: of one status, of one server; at most ``limit``,
        older than ``before``."""
        return self.store.extensions(status, key, limit, before)

    def audit_trail(
        self,
        key: str | None = None,
        user: str | Collection[str] | None = None,
        limit: int = 200,
        before: int | None = None,
    ) -> list[AuditRow]:
        """The audit trail, newest first: of one server, of one user (or any of a set's: a
        name's kept forms); older than ``before``."""
        return self.store.audit_rows(server_key=key, user=user, limit=limit, before=before)

    def usage(
        self,
        group_by: Sequence[str],
        period: str,
        since: datetime | None,
        until: datetime | None = None,
        **owner: str | None,
    ) -> list[dict]:
        """Showback rows (``hub/showback.py``) from what the store has (``flush_usage`` first
        for the ledger as of the last pass)."""
        return showback.usage(self.store, self.options, group_by, period, since, until, **owner)

    def usage_rows(
        self,
        group_by: Sequence[str],
        period: str,
        since: datetime | None,
        until: datetime | None = None,
        **owner: str | None,
    ) -> Iterator[dict]:
        """``usage``'s rows, streamed (the exports: ``showback.usage_rows``)."""
        return showback.usage_rows(
            self.store, self.options, group_by, period, since, until, **owner
        )

    def usage_sessions(
        self, since: datetime, user: str | Collection[str] | None = None
    ) -> list[LedgerSession]:
        """Ledger sessions still open or ended after ``since``, newest first."""
        return self.store.usage_sessions(since=since, user=user)

    @property
    def teams_by_group(self) -> Mapping[str, str] | None:
        """The Hub's groups that name a team, and their teams, as the last pass read them (None:
        no pass has yet, the first's or a standby's)."""
        return self._context.teams_by_group if self._context.groups_read else None

    def gpus_held(self) -> dict[str, float]:
        """GPU-equivalents held now, by team (``""``: no team), from the ledger's open sessions."""
        held: dict[str, float] = {}
        for session in self.ledger.open.values():
            held[session.owner.team] = held.get(session.owner.team, 0.0) + session.gpus
        return held

    def open_session(self, key: str) -> LedgerSession | None:
        """The ledger's session of a running server (None: not billed yet)."""
        return self.ledger.open.get(key)


def _granted_of(servers: Mapping) -> dict[str, trusted.Granted | None]:
    return {key: trusted.Granted.of(server.spawner_state) for key, server in servers.items()}


def _by_pod(
    granted: Mapping[str, trusted.Granted | None],
) -> dict[tuple[str | None, str], str]:
    """The running servers by the pod the Hub's records name (``(namespace, pod)``, and
    ``(None, pod)`` for DCGM's records without a namespace)."""
    by_pod = {}
    for key, grant in granted.items():
        pod = grant.pod if grant is not None else None
        if pod is not None:
            by_pod[pod] = by_pod[(None, pod[1])] = key
    return by_pod


def _newest(rows: Iterable[ServerRow]) -> datetime | None:
    """The latest ``updated_at`` of ``rows`` (None: none has one)."""
    return max((r.updated_at for r in rows if r.updated_at is not None), default=None)


def _asked_again_at_start(row: ServerRow, started: datetime) -> None:
    """A checkpoint asked before this service started is asked again at its start: its server
    hears a request only in the verdicts this service answers, so an outage longer than
    ``checkpoint_timeout`` timed it out unheard (a false failure: a retry used up, or with
    ``on_checkpoint_failure: proceed`` a cull without a checkpoint). One asked with an
    interrupt moves with it: the two are one request, paired by their time (the interrupt is
    asked again of the cell running before it, ``Actions._interrupt_again``)."""
    asked = row.checkpoint_requested_at
    if row.checkpoint_status == CHECKPOINT_REQUESTED and asked and asked < started:
        again = {"checkpoint_requested_at": started}
        if asked == row.interrupted_at:
            again["interrupted_at"] = started
        set_record(row, policy.evolve(record_of(row), **again))
