"""The governor's REST API under ``/services/gpu-gov/api/`` (docs/api.md, "Governor service").

Who may call what, and how bodies and errors look, is ``hub/api_handler.py``'s; the handlers
here read and change the governor through its views and requests, never its store.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections.abc import Awaitable, Iterator
from functools import partial
from itertools import islice
from operator import attrgetter

from prometheus_client import CONTENT_TYPE_LATEST
from tornado import web

from ..checkpoint_layout import SOURCE_USER, SOURCES
from ..core import browser_json, clock, ledger
from ..core.durations import parse_duration
from ..core.report import ReportError, validate
from ..core.text import kept_forms, stored_name
from ..core.vocabulary import kept_keys, server_key
from . import listings, metrics, readers, showback
from .api_handler import COST_EXPORT, COST_LISTING, COST_READ, ApiHandler, json_object
from .budget import UNIT_BYTES, Budget, RefusalLog
from .health import not_a_uuid
from .people import ClaimHeld, SessionChanged, parse_session
from .prepared_auth import (
    ASK_THE_HUB,
    ASKING,
    METRICS_SCOPE,
    PreparedHubOAuth,
    asked_token_caller,
    is_governor_admin,
    out_of_reach,
    token_caller,
)
from .protocol_server import DirectRequest, DirectRoute
from .reconcile import Governor
from .views import policy_view

# A real report is a few kB (about 600 bytes a GPU process): this bounds what one report, and
# so one server, can make the governor hold.
MAX_REPORT_BYTES = 256 * 1024
MAX_BODY_BYTES = 1024 * 1024  # any request; a larger one is refused before it is read
MAX_PAGE_ROWS = 5000  # the most rows of a page of api/audit or api/extensions
# How long a report waits for the Hub to say who its token is (JupyterHub's client waits up
# to 5 minutes; the server gives up on its report after 20 s and sends the next one).
HUB_CHECK_TIMEOUT_S = 10.0
EXTENSION_STATUSES = ("granted", "pending", "approved", "denied", "refused")
Answer = tuple[int, bytes] | tuple[int, bytes, bytes]  # status, JSON body, header lines
REPORT_RESULTS = ("accepted", "invalid", "forbidden", "throttled")  # metrics.REPORTS's label
REFUSAL_LINES_EVERY_S = 60.0  # an address's refusals: its first line, then a count this often

log = logging.getLogger("jupyter_gpu_gov.hub")


def report_route(
    governor: Governor,
    hub_auth: PreparedHubOAuth,
    budget: Budget | None = None,
    refusals: Budget | None = None,
) -> DirectRoute:
    """``POST api/reports``: a server's report in, its verdict out. A direct route of the
    service's server (``hub/protocol_server.py``): a report is nearly every request the service
    gets, and tornado's request machinery cost more than the report's own work
    (docs/benchmarks-history.md, "Issue 26, wave 17"). Who sent it is asked as every handler asks
    (``token_caller``: the Hub's answer for the token, HubAuth's cache, the access scopes); a
    server's token is the only credential that reports, so no cookie is read. It answers at once
    when HubAuth has the token's answer cached and the last pass saw the server, as for nearly every
    report; else it waits for the Hub.

    ``budget``: what one caller (a Hub user or service, whichever of its tokens) may send, in
    units of a report (``hub/budget.py``); ``refusals``: how many requests an address may have
    refused for want of a caller before the next one from it that names no known caller is
    answered 429 without asking the Hub. Either over: 429 and ``Retry-After``, the report not
    taken, the server's verdict as it was."""
    # The counter's children, found once (``labels`` looks one up under a lock each call).
    accepted, invalid, forbidden, throttled = (metrics.REPORTS.labels(r) for r in REPORT_RESULTS)
    budget = budget or Budget(0, 0)
    refusals = refusals or Budget(0, 0)
    refused_log = RefusalLog(log, REFUSAL_LINES_EVERY_S)

    def receive(request: DirectRequest) -> Answer | Awaitable[Answer]:
        authorization = request.head.fields.get("authorization", "")
        caller = token_caller(hub_auth, authorization)
        if type(caller) is dict:
            return _report(caller, request)
        # Nobody known yet: an address whose requests keep being refused waits its turn before
        # any more of them costs a Hub check or a log line.
        wait = refusals.short(request.peer)
        if wait:
            return _throttled(request.peer, wait, "requests refused from this address")
        if caller is ASK_THE_HUB:
            return _asked(request, asked_token_caller(hub_auth, authorization))
        return _report(caller, request)

    async def _asked(request: DirectRequest, caller: Awaitable[dict | None]) -> Answer:
        ASKING.set(request.peer)  # its turn among its address's checks (prepared_auth)
        try:
            who = await asyncio.wait_for(caller, HUB_CHECK_TIMEOUT_S)
        except asyncio.TimeoutError:
            return _refused(
                request.peer,
                503,
                f"the Hub did not say who this token is within {HUB_CHECK_TIMEOUT_S:g} s",
            )
        except web.HTTPError as error:  # HubAuth's for a Hub it could not ask (500, 502)
            return _refused(
                request.peer, error.status_code, error.log_message or "the token was not checked"
            )
        answer = _report(who, request)
        return answer if type(answer) is tuple else await answer

    def _report(caller: dict | None, request: DirectRequest) -> Answer | Awaitable[Answer]:
        if caller is None:
            refusals.take(request.peer)
            return _refused(request.peer, 403, "authenticate with a JupyterHub token")
        # Before the body is parsed: its parse is most of what a large report costs (one over
        # the limit is not parsed: it costs what the largest one does, not the whole burst).
        size = min(len(request.body), MAX_REPORT_BYTES)
        wait = budget.take(f"{caller['kind']}:{caller['name']}", 1 + size // UNIT_BYTES)
        if wait:
            return _throttled(request.peer, wait, f"reports from {caller['name']!r:.80}")
        if len(request.body) > MAX_REPORT_BYTES:
            invalid.inc()
            return _refused(request.peer, 413, f"a report may be at most {MAX_REPORT_BYTES} bytes")
        try:
            report = validate(json_object(request.body) if request.body else {})
        except ReportError as error:
            invalid.inc()
            return _refused(request.peer, 400, f"invalid report: {error}")
        except ValueError as error:  # not JSON, not an object
            invalid.inc()
            return _refused(request.peer, 400, str(error))
        owner = report["server"]["user"]
        if caller["kind"] != "user" or caller["name"] != owner:
            forbidden.inc()
            actor = f"{caller['kind']}:{caller['name']}"
            return _refused(
                request.peer, 403, f"{actor} may not report on a server of {owner!r:.80}"
            )
        name = report["server"].get("name", "")
        key = server_key(owner, name)
        unreached = out_of_reach(caller, key)
        if unreached:
            forbidden.inc()
            return _refused(request.peer, 403, unreached)
        if governor.hub_ran(key):
            return _accepted(report)
        return _if_the_hub_runs(request.peer, key, (owner, name), report)

    async def _if_the_hub_runs(peer: str, key: str, names: tuple[str, str], report: dict) -> Answer:
        if not await governor.hub_runs(key, names):
            forbidden.inc()
            return _refused(
                peer, 404, f"the Hub runs no server {key!r:.80}: reports are for servers it runs"
            )
        return _accepted(report)

    def _accepted(report: dict) -> Answer:
        accepted.inc()
        return 200, governor.ingest_answer(report)

    def _throttled(peer: str, wait: float, what: str) -> Answer:
        throttled.inc()
        seconds = max(1, math.ceil(wait))
        code, body = _refused(peer, 429, f"too many {what}: send again in {seconds} s")
        return code, body, b"Retry-After: %d\r\n" % seconds

    def _refused(peer: str, code: int, message: str) -> tuple[int, bytes]:
        """A refused report's answer, as every handler's error (``ApiHandler.write_error``),
        and its log line: an address's first in a minute, then how many more (``RefusalLog``)."""
        refused_log.warning(peer, "gpu-gov: POST api/reports refused (%d): %s", code, message)
        return code, browser_json.dumps({"status": code, "message": message}).encode()

    return receive


class ServersHandler(ApiHandler):
    """``GET api/servers[?all=1&after=<key>&limit=<n>]``: every governed server (admins) or the
    caller's own, in key order; ``after``/``limit``: a page of them."""

    def request_cost(self, caller: dict) -> int:
        return COST_LISTING if is_governor_admin(caller) else COST_READ

    @web.authenticated
    async def get(self):
        asked = self.query("all", "after", "limit")
        user = None if self.is_admin else self.own_name()
        running_only = not self.yes_or_no(asked, "all")
        after, limit = self._page()
        # On the loop, between two passes, a snapshot: the rows wanted and what their
        # listings read, by reference (docs/benchmarks-history.md, "Routes at 10,000 servers (wave
        # 28)").
        ((more, snapshot),) = await self.governor.of_one_pass(
            lambda: self._wanted(user, running_only, after, limit)
        )
        # Built and encoded in a worker, a server at a time.
        self.set_header("Content-Type", "application/json")
        await self.finish_from_worker(partial(listings.encoded_servers, snapshot, more))

    async def _wanted(
        self, user: str | None, running_only: bool, after: str | None, limit: int | None
    ) -> tuple[dict | None, list[listings.Listed]]:
        """The snapshot of the servers asked for and, for a page, ``{"next": …}``."""
        kept = None if user is None else stored_name(user)  # (the form the rows keep)
        rows = [
            row
            for row in self.governor.known_servers(running_only)
            if (kept is None or (row.user == kept and not out_of_reach(self.current_user, row.key)))
            and (after is None or row.key > after)
        ]
        more = None
        if limit is not None:
            page = heapq.nsmallest(limit, rows, key=attrgetter("key"))
            more = {"next": page[-1].key if len(rows) > limit else None}
            rows = page
        return more, await listings.snapshot(self.governor, rows, clock.utcnow())

    def _page(self) -> tuple[str | None, int | None]:
        """``after`` (a server's key: the servers after it) and ``limit`` (how many), or 400."""
        # As sent: ``get_argument`` trims it and makes control characters spaces, another key
        # (a server named "lab " was listed again after itself, for ever).
        sent = self.request.query_arguments.get("after")
        after = self.decode_argument(sent[-1], name="after") if sent else None
        if after is not None and not 0 < len(after) <= listings.MAX_CURSOR_CHARS:
            raise web.HTTPError(
                400,
                f"'after' must be a server's key (user/name) of 1 to "
                f"{listings.MAX_CURSOR_CHARS} characters: the last one of the page before",
            )
        text = self.get_argument("limit", None)
        if text is None:
            return after, None
        if not 1 <= whole_number(text) <= listings.MAX_PAGE:
            raise web.HTTPError(
                400, f"'limit' must be a whole number from 1 to {listings.MAX_PAGE}"
            )
        return after, int(text)


class ServerHandler(ApiHandler):
    """``GET api/users/<user>/server`` or ``.../servers/<name>``: one server and its verdict."""

    @web.authenticated
    def get(self, user: str, name: str | None = None):
        self.require_owner_or_admin(user, name)
        key, row = self.known_server(user, name)
        self.write_json({**self.governor.listing(row), "verdict": self.governor.verdict(key)})


class ExtendHandler(ApiHandler):
    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_owner_or_admin(user, name)
        key, _ = self.known_server(user, name)
        reason = self.text_field(self.body(), "reason")
        status, outcome = await self.governor.extend(key, await self.asker(user, name), reason)
        self.write_json(outcome, status)


class DecideExtensionHandler(ApiHandler):
    def initialize(self, governor: Governor, approve: bool):
        super().initialize(governor)
        self.approve = approve

    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_admin()
        key, _ = self.known_server(user, name)
        data = self.body()
        reason = self.text_field(data, "reason", required=True)
        seconds = None
        if self.approve and data.get("duration") is not None:
            try:
                seconds = parse_duration(data["duration"], "'duration'").total_seconds()
            except ValueError as error:
                raise web.HTTPError(400, str(error)) from None
            # Approving 0 s granted no time, yet told the owner "approved" (then warned them
            # again): giving no more time is a denial, which says so.
            if seconds <= 0:
                raise web.HTTPError(
                    400,
                    "'duration' must be more than 0 seconds (e.g. \"1h\"); to give no more "
                    "time, deny the extension",
                )
        try:
            outcome = await self.governor.decide_extension(
                key, self.actor, self.approve, seconds, reason
            )
        except LookupError as error:
            raise web.HTTPError(409, str(error.args[0])) from None
        self.write_json(outcome)


class ExemptHandler(ApiHandler):
    """``POST .../exempt`` ``{"duration": "3d", "reason": …}``; ``DELETE`` lifts it."""

    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_admin()
        key, _ = self.known_server(user, name)
        data = self.body()
        reason = self.text_field(data, "reason", required=True)
        try:
            duration = parse_duration(data.get("duration"), "'duration'")
        except ValueError as error:
            raise web.HTTPError(400, str(error)) from None
        self.write_json(
            await self.governor.exempt(key, self.actor, clock.utcnow() + duration, reason)
        )

    @web.authenticated
    async def delete(self, user: str, name: str | None = None):
        self.require_admin()
        key, _ = self.known_server(user, name)
        reason = self.text_field(self.body(), "reason") or "lifted"
        self.write_json(await self.governor.exempt(key, self.actor, None, reason))


class CullHandler(ApiHandler):
    """``POST .../cull`` ``{"reason": …, "immediately": false, "session": …}``: an admin culls
    now, after the owner's notice and a (bounded) checkpoint; ``immediately``: without them.
    ``session`` (the server's ``session`` as listed): only that session, else 409."""

    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_admin()
        key, _ = self.known_server(user, name)
        data = self.body()
        reason = self.text_field(data, "reason", required=True)
        immediately = data.get("immediately", False)
        if not isinstance(immediately, bool):
            raise web.HTTPError(400, "'immediately' must be true or false")
        try:
            session = parse_session(data.get("session"))
        except ValueError as error:
            raise web.HTTPError(400, str(error)) from None
        try:
            outcome = await self.governor.cull_now(
                key, self.actor, reason, immediately=immediately, session=session
            )
        except SessionChanged as changed:
            raise web.HTTPError(409, str(changed)) from None
        self.write_json(outcome)


class StopHandler(ApiHandler):
    """``POST .../stop`` ``{"reason": …}``: the owner stops the server now."""

    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_owner_or_admin(user, name)
        key, _ = self.known_server(user, name)
        reason = self.text_field(self.body(), "reason")
        asker = await self.asker(user, name)
        self.write_json(await self.governor.stop_by_owner(key, asker, reason))


class CheckpointAskedHandler(ApiHandler):
    """``POST .../checkpoint`` ``{"reason"?, "source"?}``: the server's own token tells the
    governor that a person asked it for a checkpoint (its Checkpoint button), before the server
    takes it: on record by who asked (``asker``: a guest of a shared server by name). The
    governor takes nothing itself (it calls no server); only the server says it takes one."""

    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        key = server_key(user, name or "")
        if key not in (self.current_user.get("servers") or ()):
            raise web.HTTPError(403, "only the server's own token tells of its checkpoints")
        self.require_owner_or_admin(user, name)
        key, _ = self.known_server(user, name)
        data = self.body()
        reason = self.text_field(data, "reason")
        source = data.get("source", SOURCE_USER)
        if source not in SOURCES:
            raise web.HTTPError(400, f"'source' must be one of {', '.join(SOURCES)}")
        asker = await self.asker(user, name)
        self.write_json(self.governor.checkpoint_asked(key, asker, reason, source))


def newest_first_page(handler: ApiHandler, row: str) -> tuple[int, int | None]:
    """A newest-first listing's page (``api/audit``, ``api/extensions``): ``limit`` rows
    (1 to ``MAX_PAGE_ROWS``, default 200) older than ``before`` (the last ``id`` read), or 400
    naming the bad one."""
    limit = whole_number(handler.get_argument("limit", "200"))
    if not 1 <= limit <= MAX_PAGE_ROWS:
        raise web.HTTPError(400, f"'limit' must be a whole number from 1 to {MAX_PAGE_ROWS}")
    before = handler.get_argument("before", None)
    if before is None:
        return limit, None
    if whole_number(before, digits=18) <= 0:
        raise web.HTTPError(400, f"'before' must be {row} (a whole number)")
    return limit, int(before)


def whole_number(text: str, digits: int = 6) -> int:
    """``text`` as a whole number of at most ``digits`` ASCII digits, else -1 (which no page
    size or row id is). int() takes "٣", " 7 " and "1_0", refuses "²" that isdigit() takes, and
    raises past 4,300 digits: a limit of 5,000 nines was a 500."""
    if text.isascii() and text.isdigit() and len(text) <= digits:
        return int(text)
    return -1


class ExtensionsHandler(ApiHandler):
    """``GET api/extensions?status=pending[&limit=n&before=id]``: extension requests (admins),
    newest first, a page at a time as the audit trail is."""

    cost = COST_LISTING

    @web.authenticated
    def get(self):
        self.require_admin()
        status = self.query("status", "limit", "before")["status"]
        if status is not None and status not in EXTENSION_STATUSES:
            raise web.HTTPError(400, f"'status' must be one of {', '.join(EXTENSION_STATUSES)}")
        limit, before = newest_first_page(self, "an extension request's id")
        rows = self.governor.extensions(status, limit=limit, before=before)
        self.write_json(
            {
                "extensions": [
                    {
                        "id": row.id,
                        "server": row.server_key,
                        "requested_by": row.requested_by,
                        "requested_at": clock.isoformat(row.requested_at),
                        "seconds": row.seconds,
                        "reason": row.reason,
                        "status": row.status,
                        "decided_by": row.decided_by,
                        "decided_at": clock.isoformat(row.decided_at),
                        "decision_reason": row.decision_reason,
                    }
                    for row in rows
                ]
            }
        )


class AuditHandler(ApiHandler):
    """``GET api/audit?server=user/name[&before=id]``: decisions and actions with their
    reasons, newest first, a page at a time."""

    @web.authenticated
    def get(self):
        asked = self.query("server", "user", "limit", "before")
        for name in ("server", "user"):  # empty (an unset variable's): every server's trail
            if asked[name] == "":
                raise web.HTTPError(400, f"{name!r} is empty: leave it out for every {name}'s")
        server, user = asked["server"], asked["user"]
        # The names as the Hub gives them or as the trail shows them (``kept_forms``).
        servers = [None] if server is None else sorted(kept_keys(server))
        users = None if user is None else kept_forms(user)
        if not self.is_admin:
            own = stored_name(readers.only_own(user, self.own_name(), "'user'"))
            users = frozenset((own,))  # their own kept form, no other
            if server is not None:
                servers = [key for key in servers if key.startswith(f"{own}/")]
                if not servers:
                    raise web.HTTPError(
                        403, f"only {server.split('/')[0]!r:.80} or a governor admin may read this"
                    )
                # A server's own token (whoever the server is shared with can read it) reads
                # that server's trail, not its owner's other servers'.
                reached = [key for key in servers if not out_of_reach(self.current_user, key)]
                if not reached:
                    raise web.HTTPError(403, out_of_reach(self.current_user, servers[0]))
                servers = reached
            else:
                servers = self.current_user.get("servers", [None])
        limit, before = newest_first_page(self, "an audit row's id")
        rows = [
            row for key in servers for row in self.governor.audit_trail(key, users, limit, before)
        ]
        if len(servers) > 1:  # newest first, as one trail
            rows = sorted(rows, key=lambda row: row.id, reverse=True)[:limit]
        self.write_json(
            {
                "audit": [
                    {
                        "id": row.id,
                        "at": clock.isoformat(row.at),
                        "server": row.server_key,
                        "action": row.action,
                        "reason": row.reason,
                        "actor": row.actor,
                        "dry_run": row.dry_run,
                        "details": row.details,
                    }
                    for row in rows
                ]
            }
        )


class DiagnosisHandler(ApiHandler):
    """``GET api/diagnosis[?days=7]``: root causes across the cluster with their confidence,
    what each cause cost per team and per node over the last ``days`` (1-366), the model,
    fragmentation (admins)."""

    cost = COST_EXPORT

    @web.authenticated
    async def get(self):
        self.require_admin()
        try:
            days = int(self.query("days")["days"] or "7")  # empty: a 400 below, as before
        except ValueError:
            raise web.HTTPError(400, "'days' must be a whole number of days") from None
        if not 1 <= days <= 366:
            raise web.HTTPError(400, "'days' must be between 1 and 366")
        granted = await self.governor.granted_now()  # 10,000 spawner states: read in a worker
        self.write_json(self.governor.diagnosis_summary(days, granted=granted))


class HealthHandler(ApiHandler):
    """``GET api/health``: GPUs that are not healthy (node, GPU, why, since when, who holds
    them) and servers whose GPU state has been unknown too long (admins)."""

    cost = COST_LISTING

    @web.authenticated
    async def get(self):
        self.require_admin()
        granted = await self.governor.granted_now()  # 10,000 spawner states: read in a worker
        self.write_json(self.governor.health_view(granted))


class DismissGpuClaimHandler(ApiHandler):
    """``POST api/health/<uuid>/dismiss`` ``{"reason": …}``: an admin checked a GPU listed as
    unhealthy and found nothing wrong; its claim goes until new evidence (docs/health.md)."""

    @web.authenticated
    def post(self, uuid: str):
        self.require_admin()
        if refused := not_a_uuid(uuid):
            raise web.HTTPError(400, refused)
        reason = self.text_field(self.body(), "reason", required=True)
        try:
            self.write_json(self.governor.dismiss_gpu_claim(uuid, self.actor, reason))
        except LookupError as error:
            raise web.HTTPError(404, str(error.args[0])) from None
        except ClaimHeld as error:
            raise web.HTTPError(409, str(error)) from None


class PoliciesHandler(ApiHandler):
    """``GET api/policies``: the policies as the service understands them (admins)."""

    @web.authenticated
    def get(self):
        self.require_admin()
        self.write_json(
            {
                "policies": [policy_view(p) for p in self.governor.policies],
                "dry_run": self.governor.options.dry_run,
            }
        )


class MetricsHandler(ApiHandler):
    """``GET metrics``: Prometheus, for governor admins or tokens with ``read:metrics``."""

    @web.authenticated
    async def get(self):
        if not (self.is_admin or METRICS_SCOPE in self.scopes):
            raise web.HTTPError(403, f"this needs the {METRICS_SCOPE} scope")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        # Written in a worker: with a series per server, writing it held every report on the
        # event loop for a time in proportion to the hub (docs/benchmarks-history.md, "Routes at
        # 10,000 servers (wave 27)"). The registry's metrics take their own locks; ``exposition``
        # waits out a rebuild.
        loop = asyncio.get_running_loop()
        self.finish(await loop.run_in_executor(None, metrics.exposition))


class InfoHandler(ApiHandler):
    @web.authenticated
    def get(self):
        from .. import __version__

        cycle = self.governor.last_cycle
        self.write_json(
            {
                "version": __version__,
                "dry_run": self.governor.options.dry_run,
                "lease": self.governor.lease_view(holder=self.is_admin),
                "last_reconcile": None
                if cycle is None
                else {
                    "servers": cycle.servers,
                    "actions": cycle.actions,
                    "duration_s": round(cycle.duration_s, 4),
                },
            }
        )


class UsageHandler(ApiHandler):
    """``GET api/usage?group_by=team,day&since=7d&until=…&format=csv|json``: showback from the
    usage ledger. Admins and finance see everyone (``user=``, ``team=``, ``project=``, ``tier=``
    filter), a team lead their teams', anyone else only their own usage (``hub/readers.py``)."""

    cost = COST_EXPORT

    @web.authenticated
    async def get(self):
        query = self.query("group_by", "since", "until", "format", *ledger.DIMENSIONS)
        for bound in ("since", "until"):  # empty (an unset variable's) is not absent: no bound
            if query[bound] == "":
                raise web.HTTPError(400, f"{bound!r} is empty: leave it out for no bound")
        try:
            group_by, period = showback.parse_group_by(query["group_by"] or "team")
            since, until = showback.parse_span(query["since"], query["until"])
        except showback.UsageQueryError as error:
            raise web.HTTPError(400, str(error)) from None
        fmt = "json" if query["format"] is None else query["format"]
        if fmt not in ("csv", "json"):
            raise web.HTTPError(400, f"'format' must be csv or json, got {fmt!r}")
        asked = {k: query[k] for k in ledger.DIMENSIONS}
        # Which teams' rows the caller may read: readers.py decides, from the Hub's answer.
        owner = readers.usage_filters(self.current_user, asked, self.governor.teams_by_group)
        self.governor.flush_usage()  # the ledger as of the last pass, not of its last write

        rows = self.governor.usage_rows(group_by, period, since, until, **owner)
        if fmt == "csv":
            parts = showback.csv_lines(rows, group_by)
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", 'attachment; filename="gpu-usage.csv"')
        else:
            teams = owner.get("team")  # a lead's set, or the one team= names
            head = {
                "group_by": group_by,
                "period": period,
                "since": clock.isoformat(since),
                "until": clock.isoformat(until),
                "teams": [teams] if isinstance(teams, str) else teams and sorted(teams),
                "currency": self.governor.options.currency,
            }
            parts = showback.json_parts(head, rows)
            self.set_header("Content-Type", "application/json")
        # Read, summed and written a chunk at a time in a worker, as the trace's export: a year
        # of a big hub's ledger by user and day (millions of rows, seconds of reading) streams
        # out without being held, nor holding the event loop.
        await self.stream(lambda: _joined(parts), "a usage export")


def _joined(parts: Iterator[str], size: int = 5000) -> str:
    """The next ``size`` parts ("" at the end)."""
    return "".join(islice(parts, size))


_SERVER = r"users/(?P<user>[^/]+)/(?:server|servers/(?P<name>[^/]+))"


def handlers(prefix: str, governor: Governor) -> list[tuple]:
    """Routes under the service prefix (e.g. ``/services/gpu-gov/``)."""
    args = {"governor": governor}
    p = prefix.rstrip("/")
    return [
        (rf"{p}/api/?", InfoHandler, args),
        (rf"{p}/api/servers", ServersHandler, args),
        (rf"{p}/api/{_SERVER}", ServerHandler, args),
        (rf"{p}/api/{_SERVER}/extend", ExtendHandler, args),
        (rf"{p}/api/{_SERVER}/approve", DecideExtensionHandler, {**args, "approve": True}),
        (rf"{p}/api/{_SERVER}/deny", DecideExtensionHandler, {**args, "approve": False}),
        (rf"{p}/api/{_SERVER}/exempt", ExemptHandler, args),
        (rf"{p}/api/{_SERVER}/cull", CullHandler, args),
        (rf"{p}/api/{_SERVER}/stop", StopHandler, args),
        (rf"{p}/api/{_SERVER}/checkpoint", CheckpointAskedHandler, args),
        (rf"{p}/api/extensions", ExtensionsHandler, args),
        (rf"{p}/api/audit", AuditHandler, args),
        (rf"{p}/api/policies", PoliciesHandler, args),
        (rf"{p}/api/diagnosis", DiagnosisHandler, args),
        (rf"{p}/api/health", HealthHandler, args),
        (rf"{p}/api/health/(?P<uuid>[^/]+)/dismiss", DismissGpuClaimHandler, args),
        (rf"{p}/api/usage", UsageHandler, args),
        (rf"{p}/metrics", MetricsHandler, args),
    ]
