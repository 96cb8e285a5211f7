"""The governor's side of the spawn queue (``core.queue``; the line itself lives in the hub,
``profiles/queue_pages.py``).

After each pass the governor syncs with the hub: it sends when it expects each server it
governs to give its GPUs back (a planned cull or maximum age: ``cull_at``; none known for a
server in use), and gets the line back. Each request admission would let in now is started
through the Hub's REST API, as its owner would start it, with the choices recorded: the spawner
decides again from a fresh count (a stale line overshoots nothing), audited before it is taken.
Queue time — started, expired or cancelled — is metered per team, tier and task type
(``jupyter_gpu_gov_queue_wait_seconds``). A server started from the line that nobody has opened
yet rides on the verdicts of its owner's other servers (``line_starts``), so JupyterLab open on
one of them says so. A hub without the profile layer has no line: the sync
answers 404 and the governor stops asking until it restarts. The last sync's requests waiting
for a free GPU and the hub's recent refusals for want of one are the cluster report's demand
(``queued``, ``refused``: fragmentation).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from prometheus_client import Gauge, Histogram

from ..core import clock, ledger
from ..core.ledger import Bucket, Owner
from ..core.queue import (
    CANCELLED,
    EXPIRED,
    FOR_A_GPU,
    QUEUED_AT_LABEL,
    STARTED,
    Departure,
    QueueFormatError,
    Release,
    Waiting,
    claim_by,
    refused_from_json,
    releases_to_json,
    room_from_json,
    waiting_for_a_gpu,
)
from ..core.report import MAX_CLOCK_SKEW, user_last_activity
from ..core.text import in_sentence, stored_name
from ..core.wire import MAX_LINE_STARTS, MAX_TEXT, LineStart
from . import metrics
from .evidence import Received
from .hubapi import HubApi, HubApiError, HubServer, _q
from .listing import HubListing
from .store import Store
from .tables import AuditRow, ServerRow

# A start the Hub refused is not tried every pass (the default; ``queue_retry_after``).
RETRY_AFTER = timedelta(minutes=1)
LEFT_POD_RETRY = timedelta(seconds=15)  # a left pod's delete, asked and audited again (default)
# Audit actions: a start from the line (before it is made), one made, a request that left it.
START, STARTED_ACTION, LEFT = "queue-start", "queue-started", "queue-left"
RECLAIM_WITHDRAWN = "reclaim-withdrawn"  # a reclaim the hub lifted (its asker left the line)
# How long a withdrawn reclaim rides on its server's verdict (``reclaim_withdrawn``): JupyterLab
# tells the owner, who was warned of the deadline, that it is lifted. Kept in memory, read back
# from its audit row (``restore_withdrawn``) by a governor that did not sync it.
RECLAIM_WITHDRAWN_NOTICE = timedelta(minutes=15)
MAX_WITHDRAWN = 10_000  # servers whose notice is kept at once


@dataclass(frozen=True)
class Withdrawn:
    """A reclaim the hub lifted: when (the governor's clock, as the verdict says it), and the
    session it was lifted on (the Hub's ``started`` as the governor's row had it; None: not
    known, an audit row of an earlier release). The notice is for that session alone: its
    start is compared with the server's as the Hub says it, never with the governor's time."""

    at: datetime
    session: datetime | None


def _session_of(audit: AuditRow) -> datetime | None:
    """The session a ``reclaim-withdrawn`` audit row names (None: it names none)."""
    session = (audit.details or {}).get("session")
    try:
        return clock.parse(session) if isinstance(session, str) else None
    except ValueError:
        return None


log = logging.getLogger("jupyter_gpu_gov.hub")

QUEUE_WAIT = Histogram(
    "jupyter_gpu_gov_queue_wait_seconds",
    "Time spawn requests waited in line, by how they left it (started, expired, cancelled)",
    ["team", "tier", "task_type", "outcome"],
    buckets=(60, 300, 900, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 24 * 3600, float("inf")),
    registry=metrics.REGISTRY,
)
QUEUED = Gauge(
    "jupyter_gpu_gov_queued_requests",
    "Spawn requests waiting in line at the last sync",
    registry=metrics.REGISTRY,
)


def releases(rows: Mapping[str, ServerRow]) -> dict[str, Release]:
    """When each running server is expected to give its GPUs back: its planned cull (idle,
    maximum age, reclaim), else unknown."""
    found = {}
    for key, row in rows.items():
        if row.cull_at is not None:
            # Not who holds it: the estimate is shown to other users.
            found[key] = Release(
                row.cull_at, f"a server holding it is due to stop by {row.cull_at:%H:%M} UTC"
            )
        else:
            found[key] = Release(None, "")
    return found


@dataclass(frozen=True)
class Unopened:
    """A running server the spawn queue started on its owner's behalf, not opened yet."""

    key: str
    claim_by: datetime
    notice: LineStart  # as the verdicts of the owner's other servers carry it


def line_starts(
    servers: Mapping[str, HubServer],
    rows: Mapping[str, ServerRow],
    reports: Mapping[str, Received],
) -> dict[str, tuple[Unopened, ...]]:
    """By user, their running servers the spawn queue started that nobody has opened yet
    (``core.queue.claim_by``), from the grant's labels and the Hub's model of each: worked out
    once a pass, read by every verdict (``Views.verdict``)."""
    found: dict[str, list[Unopened]] = {}
    for key, server in servers.items():
        row = rows.get(key)
        labels = row.labels if row is not None else None
        if not labels or QUEUED_AT_LABEL not in labels:
            continue  # most servers: one look-up
        received = reports.get(key)
        due = claim_by(
            labels,
            server.started,
            user_last_activity(received.report) if received is not None else None,
            server.last_activity,
        )
        # The Hub's path to the server: a relative link, never another origin.
        url = server.url
        if due is None or not url.startswith("/") or url.startswith("//") or len(url) > MAX_TEXT:
            continue
        notice = LineStart(
            name=server.name,
            url=url,
            tier=row.tier,
            started=clock.isoformat(server.started),
            claim_by=clock.isoformat(due),
        )
        found.setdefault(server.user, []).append(Unopened(key, due, notice))
    return {user: tuple(entries[:MAX_LINE_STARTS]) for user, entries in found.items()}


class QueueSync:
    """One sync per pass; ``hub``: the governor's Hub API client; ``listing``: the governor's
    (a user whose server's grant the hub changed is read again at the next pass);
    ``retry_after``: how long a start the Hub refused, or that failed, waits to be tried again;
    ``left_pod_retry``: how long a left pod's failed delete waits to be asked again."""

    def __init__(
        self,
        hub: HubApi,
        store: Store,
        dry_run: bool = False,
        listing: HubListing | None = None,
        retry_after: timedelta = RETRY_AFTER,
        left_pod_retry: timedelta = LEFT_POD_RETRY,
    ):
        self.hub, self.store, self.dry_run, self.listing = hub, store, dry_run, listing
        self.retry_after, self.left_pod_retry = retry_after, left_pod_retry
        self.absent = False  # no profile layer in this hub (or no scope for it): stop asking
        # The cluster report's demand as of the last sync (``core.queue.waiting_for_a_gpu``,
        # ``refused_from_json``): None before one, without a line, or when the hub cannot say.
        self.queued: int | None = None
        self.refused: int | None = None
        # The tiers of the requests ``queued`` counts, and where on a cluster's nodes they and
        # the refused spawns could go (``core.queue.room_from_json``; None: not a cluster's
        # hub, or no sync yet), as of ``room_at``: the fragmentation figure per request.
        self.queued_tiers: tuple[str, ...] = ()
        self.pending_tiers: tuple[str, ...] = ()  # the pass's spawns waiting for a GPU (set by it)
        self.room: dict | None = None
        self.room_at: datetime | None = None
        # The physical cards a workstation hub's allocator reads, as of the last sync (the
        # fragmentation figure's free cards without DCGM); empty: none said (a cluster's hub).
        self.cards: tuple[str, ...] = ()
        # Starts the Hub refused, by server: tried again after retry_after, not every pass.
        self._refused: dict[str, datetime] = {}
        # Starts the Hub took, by server: the request's queued_at, and when. The same request
        # back in line is a start that failed after the Hub took it (its pod never created:
        # the spawner keeps its place): tried again after retry_after, its wait metered once.
        self._started: dict[str, tuple[datetime, datetime]] = {}
        self._left_pods: dict[str, datetime] = {}  # uid -> when its delete was last asked
        # Reclaims the hub withdrew, by server: when (the verdict's ``reclaim_withdrawn``), and
        # on which session. Their audit rows are their record: read back at a start, a takeover
        # and each standby pass (``restore_withdrawn``).
        self._withdrawn_at: dict[str, Withdrawn] = {}

    async def sync(self, now: datetime | None = None) -> list[Waiting]:
        if self.absent:
            return []
        now = now or clock.utcnow()
        body = {
            "releases": releases_to_json(releases(self.store.servers(running_only=True))),
            # The room is said for the tiers spawns wait for: the hub knows those in line and
            # refused; those the Hub is starting, the governor's pass saw.
            "room_for": sorted(set(self.pending_tiers)),
        }
        try:
            answer = await self.hub.request("POST", "gpu-gov/queue", body)
        except HubApiError as error:
            # Not known now (the last sync's figures kept while this one was under way).
            self.queued = self.refused = None
            self.cards = ()
            self._room_unknown(f"the spawn queue sync with the hub failed ({error})")
            if error.status == 404:
                self.absent = True
                log.info("gpu-gov: the hub has no spawn queue (no profile layer)")
            elif error.status == 403:
                self.absent = True
                log.error(
                    "gpu-gov: the hub refused the spawn queue sync (%s): the service needs the "
                    "scopes add_governor grants (custom:gpu-gov:queue, servers); waiting "
                    "servers will not start until the service restarts with them",
                    error,
                )
            else:
                log.warning("gpu-gov: spawn queue sync failed: %s", error)
            return []
        line = self._read(answer)
        if isinstance(answer, Mapping) and answer.get("reclaims_withdrawn"):
            self._withdrawn(answer["reclaims_withdrawn"], now)
        if isinstance(answer, Mapping) and answer.get("left_pods"):
            await self._delete_left_pods(answer["left_pods"], now)
        QUEUED.set(len(line))
        for waiting in line:
            request = waiting.request
            refused = self._refused.get(request.server)
            started = self._started.get(request.server)
            if started is not None and started[0] == request.queued_at:  # its start failed
                refused = max(refused, started[1]) if refused else started[1]
            if waiting.ready and (refused is None or now - refused >= self.retry_after):
                await self._start(waiting, now)
        waiting_now = {w.request.server for w in line}
        for server, (_, at) in list(self._started.items()):
            if server not in waiting_now and now - at >= self.retry_after:
                del self._started[server]
        # A refused start of a request no longer in line is forgotten the same way: a server's
        # name is its owner's choice, and each name whose start the Hub refused (a named
        # server over the Hub's limit) was kept for the service's life.
        for server, at in list(self._refused.items()):
            if server not in waiting_now and now - at >= self.retry_after:
                del self._refused[server]
        return line

    def _room_unknown(self, why: str, said: bool = False) -> None:
        """A cluster's room, said before (or ``said`` now, unreadable), is not known now:
        unknown, never what it was. A hub that never said one has none (a workstation's)."""
        if self.room is not None or said:
            self.room = {"unknown": why, "read_age_s": None, "nodes": {}, "tiers": {}}
            self.room["refused"], self.room_at = {}, clock.utcnow()

    def _read(self, answer) -> list[Waiting]:
        if not isinstance(answer, Mapping):
            self.queued = self.refused = None
            self.cards = ()
            self._room_unknown("the hub's answer to the spawn queue sync cannot be read")
            return []
        try:
            self.room, self.room_at = room_from_json(answer.get("room")), clock.utcnow()
        except QueueFormatError as error:
            log.warning("gpu-gov: spawn queue: %s", error)
            self._room_unknown(f"the hub's room cannot be read: {error}", said=True)
        cards = answer.get("cards")
        self.cards = tuple(
            card
            for card in (cards if isinstance(cards, list) else ())[:10_000]
            if isinstance(card, str) and 0 < len(card) <= MAX_TEXT
        )
        line = []
        for entry in (answer.get("line") or [])[:10_000]:
            try:
                line.append(Waiting.from_json(entry))
            except QueueFormatError as error:  # one bad entry never stops the others
                log.warning("gpu-gov: spawn queue: an entry cannot be read: %s", error)
        self.queued = waiting_for_a_gpu(line)
        self.queued_tiers = tuple(
            w.request.tier for w in line if not w.ready and w.limit in FOR_A_GPU
        )
        try:
            self.refused = refused_from_json(answer.get("refused"))
        except QueueFormatError as error:
            self.refused = None
            log.warning("gpu-gov: spawn queue: %s", error)
        # A server's cancels in one sync are one row saying how many: its owner may join and
        # cancel as fast as the hub answers (~28 times a second), a row each. The rows of the
        # sync are one write: each was a transaction of its own, ~1,700 a pass on the loop.
        departures: dict[tuple | int, list[Departure]] = {}
        for entry in (answer.get("left") or [])[:10_000]:
            try:
                departure = Departure.from_json(entry)
            except QueueFormatError as error:
                log.warning("gpu-gov: spawn queue: a departure cannot be read: %s", error)
                continue
            cancel = departure.outcome == CANCELLED
            alike = (departure.server, departure.why) if cancel else len(departures)  # else apart
            departures.setdefault(alike, []).append(departure)
        rows = []
        for same in departures.values():
            departure = same[0]
            why = f": {departure.why}" if departure.why else ""
            times = f"; {len(same)} times since the last sync" if len(same) > 1 else ""
            for each in same:
                self._observe(each)
            rows.append(
                self._row(departure, LEFT, f"left the line ({departure.outcome}{why})", times)
            )
        if rows:
            self.store.audit(rows)
        return line

    def _withdrawn(self, entries, now: datetime) -> None:
        """The reclaims the hub lifted: the spawn in line they were asked for left it, and no
        spawn still waiting needs the card (``profiles.spawner.withdraw_reclaims``). On record
        for the borrower, whose user is read again at the next pass (a grant's change moves no
        activity: the incremental listing would bring it only at the next full one, the
        deadline and its warning standing in the verdict until then)."""
        rows = []
        for entry in entries[:1000] if isinstance(entries, list) else ():
            if not isinstance(entry, Mapping) or not all(
                isinstance(entry.get(k), str) and len(entry[k]) <= MAX_TEXT
                for k in ("server", "team", "asked_at", "by")
            ):
                log.warning("gpu-gov: a withdrawn reclaim the hub named cannot be read; skipped")
                continue
            details = {k: entry[k] for k in ("team", "asked_at", "by")}
            session = self._session(entry["server"])
            if session is not None:  # (to the microsecond: compared for equality)
                details["session"] = session.astimezone(timezone.utc).isoformat()
            rows.append(
                AuditRow(
                    at=now,
                    server_key=entry["server"],
                    user=entry["server"].partition("/")[0],
                    action=RECLAIM_WITHDRAWN,
                    reason=f"the reclaim for team {in_sentence(entry['team'])} (asked at {entry['asked_at']})"
                    " is withdrawn: the spawn it was asked for left the line and no spawn "
                    "waiting needs this GPU; its deadline is lifted, the server keeps its GPU",
                    actor="governor",
                    dry_run=self.dry_run,
                    details=details,
                )
            )
            if self.listing is not None:
                self.listing.waiting.add(entry["server"].partition("/")[0])
        if rows:
            self.store.audit(rows)
        if not self.dry_run:  # a dry run lifts nothing: no notice to give
            kept = self._withdrawn_at
            for key, withdrawn in list(kept.items()):
                if now - withdrawn.at >= RECLAIM_WITHDRAWN_NOTICE:
                    del kept[key]
            for row in rows:
                if len(kept) < MAX_WITHDRAWN:
                    kept[row.server_key] = Withdrawn(now, _session_of(row))

    def _session(self, key: str) -> datetime | None:
        """The session of server ``key`` as the governor's row has it (the Hub's ``started``)."""
        row = self.store.server(key)
        return row.session_started if row is not None else None

    def restore_withdrawn(self, now: datetime | None = None) -> None:
        """The reclaims withdrawn within ``RECLAIM_WITHDRAWN_NOTICE`` of ``now``, read back from
        their ``reclaim-withdrawn`` audit rows (written before the notice is kept): at a start,
        or a takeover from a governor that synced meanwhile, and at each pass of a standby,
        which answers reports too while the holder syncs. Held in memory alone, a restart in
        those 15 minutes lost the notice and the owner's JupyterLab never said the reclaim went.
        A dry run's rows lifted nothing: no notice."""
        now = now or clock.utcnow()
        kept: dict[str, Withdrawn] = {}
        if not self.dry_run:
            for audit in self.store.audit_since(RECLAIM_WITHDRAWN, now - RECLAIM_WITHDRAWN_NOTICE):
                key = audit.server_key
                if audit.dry_run or not key or not (key in kept or len(kept) < MAX_WITHDRAWN):
                    continue
                # oldest first: a server's latest withdrawal stays
                kept[key] = Withdrawn(audit.at, _session_of(audit))
        self._withdrawn_at = kept

    def withdrawn_at(
        self, key: str, session: datetime | None = None, now: datetime | None = None
    ) -> datetime | None:
        """When the reclaim on server ``key`` was withdrawn, within ``RECLAIM_WITHDRAWN_NOTICE``
        of ``now``, if ``session`` (the Hub's ``started`` of the server now) is the one it was
        lifted on; None: none was, longer ago, or the server started since (the new session
        was never warned). A look-up on each report's answer."""
        kept = self._withdrawn_at.get(key)
        if kept is None or (now or clock.utcnow()) - kept.at >= RECLAIM_WITHDRAWN_NOTICE:
            return None
        if session is not None:
            if kept.session is not None:
                if session != kept.session:  # both the Hub's: no clock compared with another
                    return None
            elif session - MAX_CLOCK_SKEW > kept.at:  # a session not known: the clocks' room
                return None
        return kept.at

    async def _delete_left_pods(self, entries, now: datetime) -> None:
        """The pods the Hub's stop of a server left running (the Kubernetes API failed the
        delete), which the hub found still there past their grace (``profiles/left_pods.py``):
        each audited, then the hub asked to delete them (it checks them against its records
        again). Asked again, and audited again, after ``left_pod_retry`` while it fails; in a
        dry run, on record once while the hub names it."""
        asked, rows, named = [], [], set()
        for entry in entries[:100] if isinstance(entries, list) else ():
            if not isinstance(entry, Mapping) or not all(
                isinstance(entry.get(k), str) and 0 < len(entry[k]) <= MAX_TEXT
                for k in ("server", "namespace", "name", "uid", "stopped_at")
            ):
                log.warning("gpu-gov: a left pod the hub named cannot be read; skipped")
                continue
            named.add(entry["uid"])
            last = self._left_pods.get(entry["uid"])
            # A dry run deletes nothing: the hub names the pod at every sync while it runs, and
            # it is on record once (not a row a sync, for ever).
            if last is not None and (self.dry_run or now - last < self.left_pod_retry):
                continue
            self._left_pods[entry["uid"]] = now
            pod = {k: entry[k] for k in ("namespace", "name", "uid", "stopped_at")}
            asked.append(pod)
            node = entry.get("node")
            where = f" on node {node}" if isinstance(node, str) and len(node) <= MAX_TEXT else ""
            rows.append(
                AuditRow(
                    at=now,
                    server_key=entry["server"],
                    user=entry["server"].partition("/")[0],
                    action="left-pod-delete",
                    reason=f"the Hub stopped this server at {entry['stopped_at']} but the "
                    f"Kubernetes API failed its pod's delete: pod {entry['namespace']}/"
                    f"{entry['name']}{where} still ran, holding its GPU; deleted",
                    actor="governor",
                    dry_run=self.dry_run,
                    details={**pod, "node": entry.get("node"), "tier": entry.get("tier")},
                )
            )
        for uid, at in list(self._left_pods.items()):
            # Forgotten: in a dry run once the hub names it no more; acting, once it may be
            # asked again (a pod no longer named is then gone for good).
            done = uid not in named if self.dry_run else now - at >= self.left_pod_retry
            if done:
                del self._left_pods[uid]
        if not rows:
            return
        self.store.audit(rows)  # before the hub is asked: a delete unaudited is never sent
        if self.dry_run:
            return
        try:
            await self.hub.request("POST", "gpu-gov/left-pods", {"pods": asked})
        except HubApiError as error:
            log.warning("gpu-gov: asking the hub to delete left pods: %s", error)

    def _meter(self, departure: Departure, action: str, why: str) -> None:
        """Into the histogram, and the audit trail (showback's queue columns read it)."""
        self._observe(departure)
        self.store.audit([self._row(departure, action, why)])

    @staticmethod
    def _observe(departure: Departure) -> None:
        QUEUE_WAIT.labels(
            departure.team, departure.tier, departure.task_type or "interactive", departure.outcome
        ).observe(departure.waited_s)

    def _row(self, departure: Departure, action: str, why: str, more: str = "") -> AuditRow:
        return AuditRow(
            at=clock.utcnow(),
            server_key=departure.server,
            user=departure.server.partition("/")[0],
            action=action,
            reason=f"{why} after {departure.waited_s:.0f}s{more}",
            actor="governor",
            dry_run=self.dry_run,
            details=departure.to_json(),
        )

    async def _start(self, waiting: Waiting, now: datetime) -> None:
        request = waiting.request
        waited = max(0.0, (now - request.queued_at).total_seconds())
        self.store.audit(
            [
                AuditRow(
                    at=now,
                    server_key=request.server,
                    user=stored_name(request.user),
                    action="queue-start",
                    reason=f"its turn in line for {in_sentence(request.tier)} (team {in_sentence(request.team)}) came "
                    f"after {waited:.0f}s: started on its owner's behalf",
                    actor="governor",
                    dry_run=self.dry_run,
                    details={"options": dict(request.options), "waited_s": waited},
                )
            ]
        )
        if self.dry_run:
            return
        path = f"users/{_q(request.user)}/server" + (
            f"s/{_q(request.name)}" if request.name else ""
        )
        try:
            await self.hub.request("POST", path, dict(request.options))
        except HubApiError as error:  # refused from a fresh count, or starting already
            log.warning("gpu-gov: starting %s from the line: %s", request.server, error)
            self._refused[request.server] = now
            return
        self._refused.pop(request.server, None)
        again = self._started.get(request.server, (None,))[0] == request.queued_at
        self._started[request.server] = (request.queued_at, now)
        log.info("gpu-gov: started %s from the line after %.0fs", request.server, waited)
        if again:  # its wait was metered at the start that failed
            return
        departure = Departure(
            request.server,
            request.team,
            request.tier,
            request.options.get("task_type", ""),
            STARTED,
            waited,
        )
        self._meter(departure, STARTED_ACTION, "started from the line")


def queue_buckets(
    store: Store, since: datetime | None = None, until: datetime | None = None, **owner
) -> Iterator[Bucket]:
    """Showback's queue columns, as ledger buckets from the audit trail, in day order: per UTC
    day, user, team and tier, the seconds waited by requests that started, and the starts and
    expiries (``owner``: only one user's, team's or tier's, or any of a set of them; queue time
    has no project)."""
    for row in store.queue_audit(since, until):
        details = row.details if isinstance(row.details, dict) else {}
        try:
            departure = Departure.from_json(details)
        except QueueFormatError:
            continue
        who = Owner(row.user or "", departure.team, "", departure.tier)
        if any(
            v is not None
            and (getattr(who, k) != v if isinstance(v, str) else getattr(who, k) not in v)
            for k, v in owner.items()
        ):
            continue
        started = departure.outcome == STARTED
        values = {
            ledger.QUEUE_WAIT: departure.waited_s if started else 0.0,
            ledger.QUEUE_STARTS: 1.0 if started else 0.0,
            ledger.QUEUE_EXPIRED: 1.0 if departure.outcome == EXPIRED else 0.0,
        }
        yield Bucket(row.at.astimezone(timezone.utc).date(), who, values)
