"""The service's pages, server-rendered (Jinja2, autoescaped; charts are inline SVG; no CDN):

- ``/services/gpu-gov/``: the admin dashboard (Hub admins or ``custom:gpu-gov:admin``): every
  GPU-holding server, filters and sorting by query parameters, extend / exempt / cull now with a
  reason, pending extension approvals, idle cost by team, the policies;
- ``/services/gpu-gov/showback``: GPU-hours and idle costs per team, user, project or tier and
  day or week, with charts and CSV / JSON links (admins and finance every team's, a team lead
  their teams': ``hub/readers.py``);
- ``/services/gpu-gov/me``: "my GPU usage" for anyone logged in: their servers, idle hours and
  their teams' use.

Forms post to ``/services/gpu-gov/actions`` with JupyterHub's XSRF token (HubOAuth checks it
for every cookie-authenticated POST). Actions call the same Governor methods as the REST API;
"Cull now" asks first, on a page of its own (it works without JavaScript).

How a page is rendered (templates, times in the reader's clock, errors) is
``hub/page_handler.py``'s.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Collection
from datetime import datetime, timedelta, timezone
from itertools import islice
from urllib.parse import urlencode

from markupsafe import Markup
from tornado import web

from ..core import clock, ledger
from ..core.durations import format_duration, parse_duration
from ..core.text import in_sentence, kept_forms, stored_name
from ..diagnose.cluster import IDLE, IDLE_HINT
from ..diagnose.labels import HINTS
from . import listings, readers, showback
from .api_handler import COST_EXPORT, COST_LISTING, bounded_reason
from .health import not_a_uuid
from .incremental import let_reports_in
from .page_handler import STATIC, PageHandler, StaticHandler, ago
from .people import ClaimHeld, SessionChanged, parse_session
from .prepared_auth import owner_wide
from .views import policy_view

SORTS = ("user", "team", "project", "tier", "state", "idle_for", "memory", "activity", "deadline")
EXEMPT_CHOICES = ("1h", "8h", "1d", "3d", "7d")

# What an action did, shown once on the dashboard it redirects to: a cookie signed by this
# service, never a query parameter (anyone could link an admin to ``?msg=<any text>``).
FLASH_COOKIE = "gpu-gov-flash"


async def server_lines(governor, now: datetime, kept: Collection[str]) -> list[dict]:
    """The running servers of a user (``kept``: their name as the rows keep it,
    ``core.text.stored_name``) as "My GPU usage" shows them (a line of the dashboard's each),
    on the event loop: their servers', never every server's (built for every server to keep
    theirs, it held the event loop in proportion to the hub, docs/benchmarks-history.md "Routes
    at 10,000 servers (wave 27)")."""
    rows = [row for row in governor.known_servers(running_only=True) if row.user in kept]
    pending = {e.server_key for e in governor.extensions("pending")}
    return listings.server_lines(await listings.snapshot(governor, rows, now), now, pending)


def dashboard_table(
    snapshot: list[listings.Listed],
    now: datetime,
    pending: set[str],
    filters: dict[str, str],
    everything: bool,
    sort: str,
    ascending: bool,
) -> dict:
    """The dashboard's table from a snapshot of the running servers, in a worker: the lines
    shown (GPU servers, or ``everything``; filtered, sorted), their count and the filters'
    choices, GPUs held and idle now."""
    lines = listings.server_lines(snapshot, now, pending)
    user = filters["user"].lower()
    kept = stored_name(filters["user"])  # a name kept in its kept form, asked by the Hub's name
    shown = [
        line
        for line in lines
        if (everything or line["gpus"] > 0 or line["devices"])
        and (not user or user in line["user"].lower() or line["user"] == kept)
        and all(not filters[k] or line[k] == filters[k] for k in ("team", "tier", "state"))
    ]
    shown.sort(key=_sort_key(sort))
    if ascending:
        shown.reverse()
    return {
        "lines": listings.HandingOver(shown),  # rendered in a worker, the reports let in
        "total": len(lines),
        "gpus_held": sum(line["gpus"] for line in lines),
        "idle_now": sum(
            line["gpus"]
            for line in lines
            if line["ledger_state"] in (ledger.IDLE_HELD, ledger.IDLE_FREE)
        ),
        "options": {
            dim: sorted({line[dim] for line in lines} - {""}) for dim in ("team", "tier", "state")
        },
    }


def _sort_key(name: str):
    def key(line: dict):
        value = line.get(name)
        if name == "deadline":
            return (value is None, value.timestamp() if value else 0)
        if isinstance(value, str):
            return (False, value.lower())
        return (value is None, -(value or 0))  # numbers: largest first

    return key


class DashboardHandler(PageHandler):
    """``GET /services/gpu-gov/``: the admin dashboard."""

    cost = COST_LISTING

    @web.authenticated
    async def get(self):
        self.require_admin()
        gov = self.governor
        # A bad choice is a 400 naming it: a page in another order (or of other servers)
        # would pass for the one asked, as would one of every team's servers for a misspelt
        # filter (``tem=vision``). A filter matching nothing says so on the page.
        asked = self.query("user", "team", "tier", "state", "all", "sort", "desc")
        everything = self.flag(asked, "all") == "1"
        desc = self.flag(asked, "desc")
        # The user's box is typed in (its blanks trimmed); the others are the <select>s' values,
        # names as they are.
        filters = {k: asked[k] or "" for k in ("user", "team", "tier", "state")}
        filters["user"] = filters["user"].strip()
        sort = (asked["sort"] or "").strip() or "idle_for"
        if sort not in SORTS:
            raise web.HTTPError(400, "'sort' must be one of %s; got %r", ", ".join(SORTS), sort)

        # What the page shows of the servers, of one pass, each part in a turn of the event
        # loop of its own: the running servers' snapshot (references, nothing formatted), the
        # health and diagnosis views (copied: the worker reads them as the governor changes);
        # the lines are built, filtered and sorted, and the page rendered, in a worker. Built
        # on the loop, the lines held every report for ~0.85 s at 10,000 servers
        # (docs/benchmarks-history.md, "Routes at 10,000 servers (wave 28)").
        async def page_state() -> tuple:
            now = clock.utcnow()
            snapshot = await listings.snapshot(gov, gov.known_servers(running_only=True), now)
            await let_reports_in()
            pending_extensions = gov.extensions("pending")
            granted = await gov.granted_now()  # the running servers' GPUs, read in a worker
            gpu_health = copy.deepcopy(gov.health_view(granted))
            await let_reports_in()
            diagnosis = copy.deepcopy(gov.diagnosis_summary(granted=granted))
            return now, snapshot, pending_extensions, gpu_health, diagnosis

        ((now, snapshot, pending_extensions, gpu_health, diagnosis),) = await gov.of_one_pass(
            page_state
        )
        pending_keys = {e.server_key for e in pending_extensions}
        table = await asyncio.get_running_loop().run_in_executor(
            None,
            dashboard_table,
            snapshot,
            now,
            pending_keys,
            filters,
            everything,
            sort,
            desc == "0",
        )
        # The ledger as of this pass, not of its last write; the week's read in a worker, as
        # showback's (a day of 10,000 servers' usage: ~0.1-0.3 s).
        await gov.flush_usage_async()
        week = await asyncio.get_running_loop().run_in_executor(
            None, gov.usage, ["team"], "all", showback.days_back(7, now)
        )
        idle_cost = {r["team"]: r["idle_cost"] for r in week}
        idle_hours = {r["team"]: r["gpu_hours_idle"] for r in week}
        use_cost = any(v > 0 for v in idle_cost.values())
        chart = showback.hbars(
            idle_cost if use_cost else idle_hours,
            title=(
                f"Idle cost by team, last 7 days ({gov.options.currency})"
                if use_cost
                else "Idle GPU-hours by team, last 7 days"
            ),
            unit=gov.options.currency if use_cost else "GPU-h",
        )

        def sort_url(column: str) -> str:
            args = {k: v for k, v in filters.items() if v}
            if everything:
                args["all"] = "1"
            args["sort"] = column
            if column == sort and desc != "0":
                args["desc"] = "0"
            return "?" + urlencode(args)

        pending = [
            {
                "server": e.server_key,
                "requested_by": e.requested_by,
                "requested_at": e.requested_at,
                "ago": ago(e.requested_at, now),
                "reason": e.reason,
            }
            for e in pending_extensions
        ]
        # Rendered in a worker: a row a GPU server, the template held every report on the event
        # loop for seconds at 10,000 (docs/benchmarks-history.md, "Routes at 10,000 servers (wave
        # 27)").
        await self.render_page_in_worker(
            "dashboard.html",
            **table,
            week=week,
            week_idle_cost=sum(idle_cost.values()),
            week_idle_hours=sum(idle_hours.values()),
            chart=Markup(chart),
            filters=filters,
            everything=everything,
            sort=sort,
            sort_url=sort_url,
            pending=pending,
            policies=[policy_view(p) for p in gov.policies],
            exempt_choices=EXEMPT_CHOICES,
            message=self._flash(),
            last_cycle=gov.last_cycle,
            now=now,
            gpu_health=gpu_health,
            diagnosis=diagnosis,  # the root causes' section (diagnosis.html)
            hints={**HINTS, IDLE: IDLE_HINT},
        )

    def flag(self, asked: dict[str, str | None], name: str) -> str:
        """``name``'s value, 0 or 1 ("" when absent), else a 400 naming it."""
        value = (asked[name] or "").strip()
        if value not in ("", "0", "1"):
            raise web.HTTPError(400, "'%s' must be 0 or 1; got %r", name, value)
        return value

    def _flash(self) -> str:
        message = self.get_signed_cookie(FLASH_COOKIE, max_age_days=1)
        if message is None:
            return ""
        self.clear_cookie(FLASH_COOKIE, path=self.prefix)
        return message.decode("utf-8", "replace")


class ActionHandler(PageHandler):
    """``POST /services/gpu-gov/actions``: extend, exempt, lift, cull now, approve or deny,
    always with a reason; then back to the dashboard with what happened."""

    @web.authenticated
    async def post(self):
        self.require_admin()
        self.query()  # the form's fields are its body's: none in the URL (``ApiHandler.body``)
        gov = self.governor
        key = self.get_body_argument("server", "")
        action = self.get_body_argument("action", "")
        reason = bounded_reason(self.get_body_argument("reason", "")).strip()
        if action != "dismiss-gpu" and gov.row(key) is None:
            raise web.HTTPError(404, f"the governor knows no server {key}")
        if not reason:
            raise web.HTTPError(400, "say why: a reason is required for every action")
        actor = self.actor
        if action == "dismiss-gpu":  # the GPU health panel's: a card, not a server
            uuid = self.get_body_argument("gpu", "")
            if refused := not_a_uuid(uuid):
                raise web.HTTPError(400, refused)
            try:
                gov.dismiss_gpu_claim(uuid, actor, reason)
            except LookupError as error:
                raise web.HTTPError(404, str(error.args[0])) from None
            except ClaimHeld as error:
                raise web.HTTPError(409, str(error)) from None
            done = f"health claim on GPU {uuid} dismissed"
        elif action == "extend":
            _, outcome = await gov.extend(key, actor, reason)
            done = f"extension of {key}: {outcome['status']} ({outcome['message']})"
        elif action == "exempt":
            duration = self.get_body_argument("duration", "1d")
            try:
                delta = parse_duration(duration, "'duration'")
            except ValueError as error:
                raise web.HTTPError(400, str(error)) from None
            await gov.exempt(key, actor, clock.utcnow() + delta, reason)
            done = f"{key} exempt for {format_duration(delta)}"
        elif action == "unexempt":
            await gov.exempt(key, actor, None, reason)
            done = f"exemption of {key} lifted"
        elif action == "cull":
            # The session the admin saw (the dashboard's row): a restart since is not culled.
            session = self.get_body_argument("session", "")
            if self.get_body_argument("confirm", "") != "yes":
                self._confirm_cull(key, reason, session)
                return
            try:
                outcome = await gov.cull_now(key, actor, reason, session=parse_session(session))
            except ValueError as error:
                raise web.HTTPError(400, str(error)) from None
            except SessionChanged as changed:
                raise web.HTTPError(409, str(changed)) from None
            done = f"cull of {key}: {outcome['status']}"
        elif action in ("approve", "deny"):
            try:
                await gov.decide_extension(key, actor, action == "approve", None, reason)
            except LookupError as error:
                raise web.HTTPError(409, str(error.args[0])) from None
            done = f"extension of {key} {'approved' if action == 'approve' else 'denied'}"
        else:
            raise web.HTTPError(400, f"unknown action {action!r}")
        self.set_signed_cookie(
            FLASH_COOKIE,
            done,
            expires_days=None,
            path=self.prefix,
            httponly=True,
            samesite="Strict",
        )
        self.redirect(self.prefix)

    def _confirm_cull(self, key: str, reason: str, session: str) -> None:
        """Cull now takes a person's work away: say what it will do, and ask."""
        row = self.governor.row(key)
        server_policy = self.governor.policy_named(row.policy)
        self.render_page(
            "confirm_cull.html",
            server=key,
            session=session,
            reason=reason,
            state=row.state,
            policy=policy_view(server_policy),
        )


class ShowbackHandler(PageHandler):
    """``GET /services/gpu-gov/showback?group_by=team&period=day&days=14``, or
    ``…&since=2026-11-01&until=2026-11-30``: a closed period (finance's month)."""

    cost = COST_EXPORT

    @web.authenticated
    async def get(self):
        gov = self.governor
        teams = self.showback_teams  # None: every team's; a lead: theirs
        if teams is not None and not teams:
            raise web.HTTPError(403, readers.NO_SHOWBACK)
        now = clock.utcnow()
        asked = self.query("group_by", "period", "days", "since", "until")
        try:
            span = showback.parse_page(*asked.values(), now=now)
        except showback.UsageQueryError as error:  # a page of other data would pass for it
            raise web.HTTPError(400, "%s", error) from None
        since = datetime.combine(span.first, datetime.min.time(), timezone.utc)
        until = datetime.combine(span.last, datetime.min.time(), timezone.utc)
        gov.flush_usage()

        # Read, drawn and rendered in a worker, as the usage API's export: a year of a big
        # hub's ledger is seconds of each, which held every report and page on the event loop.
        rows, totals, charts = await asyncio.get_running_loop().run_in_executor(
            None, _showback, gov, span.dim, span.period, since, teams, until
        )
        # The exports of the same UTC days: the CSV's rows add up to the page's totals.
        window = {"since": span.first.isoformat(), "until": span.last.isoformat()}
        query = urlencode({"group_by": f"{span.dim},{span.period}", **window})

        def link(**asked) -> str:
            return f"{self.prefix}showback?" + urlencode(
                {"group_by": span.dim, "period": span.period, **asked}
            )

        # One click each: finance's closed month, and the rolling spans (a bookmark of them
        # stays rolling: ``days``).
        quick = [
            (name, link(since=first.isoformat(), until=last.isoformat()))
            for name, (first, last) in showback.month_spans(now.date()).items()
        ] + [(f"last {n} days", link(days=n)) for n in (7, 30)]
        await self.render_page_in_worker(
            "showback.html",
            dim=span.dim,
            dims=ledger.DIMENSIONS,
            period=span.period,
            days=span.days,
            # The first and last UTC days counted: a week begun before the first is counted
            # from it on, one ending after the last to it.
            since_day=span.first.isoformat(),
            until_day=span.last.isoformat(),
            span_days=(span.last - span.first).days + 1,
            week_last_monday=(span.last - timedelta(days=6)).isoformat(),  # later: cut short
            quick=quick,
            teams=None if teams is None else sorted(teams),
            rows=rows,
            page_rows=PAGE_ROWS,
            totals=totals,
            **charts,
            csv_url=f"{self.prefix}api/usage?{query}&format=csv",
            json_url=f"{self.prefix}api/usage?{query}",
        )


PAGE_ROWS = 5_000  # the most rows per period the showback page lists and charts


def _showback(
    gov,
    dim: str,
    period: str,
    since: datetime,
    teams: frozenset[str] | None = None,
    until: datetime | None = None,
) -> tuple[list | None, list, dict]:
    """The showback page's rows (None: more than ``PAGE_ROWS``), totals and charts of the UTC
    days ``since`` to ``until`` (None: today): of ``teams`` only (a lead's), or every team's
    (None)."""
    # A page holds, draws and renders each of its rows: a year of 10,000 users by day is
    # 3.65 M of them, gigabytes from one click (1,000 users x 100 days: 253 MB before the
    # table). Past the cap the page lists the totals, and says to narrow it or take the CSV.
    read = gov.usage_rows([dim], period, since, until, team=teams)
    rows = list(islice(read, PAGE_ROWS + 1))
    read.close()
    totals = gov.usage([dim], "all", since, until, team=teams)
    sessions = gov.usage_sessions(since=since)
    if until is not None:  # a closed period: not the sessions begun after its last day
        sessions = [s for s in sessions if s.first_at < until + timedelta(days=1)]
    if teams is not None:
        sessions = [s for s in sessions if s.owner.team in teams]
    hist = ledger.utilisation_histogram(sessions)
    if len(rows) > PAGE_ROWS:
        chart = showback.histogram(
            hist,
            title="Utilisation distribution: GPU-hours by how busy their session was",
            unit="GPU-h",
        )
        return None, totals, {"hist_chart": Markup(chart)}
    idle_series, periods = showback.series_by(rows, dim, "gpu_hours_idle")
    active_series, _ = showback.series_by(rows, dim, "gpu_hours_active")
    per = "day" if period == "day" else "week"
    charts = {
        "idle_chart": showback.stacked_bars(
            idle_series, periods, title=f"Idle GPU-hours by {dim} per {per}", unit="GPU-h"
        ),
        "active_chart": showback.stacked_bars(
            active_series, periods, title=f"Active GPU-hours by {dim} per {per}", unit="GPU-h"
        ),
        "hist_chart": showback.histogram(
            hist,
            title="Utilisation distribution: GPU-hours by how busy their session was",
            unit="GPU-h",
        ),
    }
    return rows, totals, {name: Markup(chart) for name, chart in charts.items()}


class MyUsageHandler(PageHandler):
    """``GET /services/gpu-gov/me``: the logged-in user's servers, idle hours, team use."""

    cost = COST_LISTING

    @web.authenticated
    async def get(self):
        gov = self.governor
        now = clock.utcnow()
        if refused := owner_wide(self.current_user, "its owner's page"):
            raise web.HTTPError(403, refused)
        asked = self.query("user")["user"] or ""  # ``usr=bob``: not the admin's own page
        if self.is_admin and asked:
            me = asked  # admins may look at anyone's page
            own = asked == self.current_user["name"]  # an admin on another's page: not "My ..."
            kept = kept_forms(me)  # (the Hub's name, or as the pages show it)
        else:
            me, own = self.own_name(), True
            if asked and asked not in (me, stored_name(me)):  # their own page would pass for it
                raise web.HTTPError(
                    403, "only admins may see another user's page; yours is %sme", self.prefix
                )
            kept = frozenset((stored_name(me),))  # their own name as the rows keep it, no other
        lines = await server_lines(gov, now, kept)
        for line in lines:  # a reclaim lifted after its warning: said here too, for a while
            row = gov.row(f"{line['user']}/{line['name']}")
            line["reclaim_withdrawn"] = None if row is None else gov.reclaim_withdrawn(row)
        since = showback.days_back(30, now)
        gov.flush_usage()
        sessions = gov.usage_sessions(since=since, user=kept)
        days = gov.usage([], "day", since, user=kept)
        idle_series = {"idle": {r["period"]: r["gpu_hours_idle"] for r in days}}
        idle_series["active"] = {r["period"]: r["gpu_hours_active"] for r in days}
        (mine,) = gov.usage([], "all", since, user=kept) or [None]
        teams = sorted(
            {s.owner.team for s in sessions if s.owner.team}
            | {line["team"] for line in lines if line["team"]}
        )
        held = gov.gpus_held()
        team_use = [
            {
                "team": team,
                "held": held.get(team, 0.0),
                "quota": gov.options.team_quotas.get(team),
                "week": next(
                    iter(
                        gov.usage(
                            [],
                            "all",
                            showback.days_back(7, now),
                            team=team,
                        )
                    ),
                    None,
                ),
            }
            for team in teams
        ]
        self.render_page(
            "me.html",
            user=me,
            own=own,
            lines=lines,
            sessions=[
                {
                    # The server's name, as "Running now" names it (the page is one user's;
                    # "": the default server).
                    "server": s.server.partition("/")[2],
                    "team": s.owner.team,
                    "project": s.owner.project,
                    "tier": s.owner.tier,
                    "started": s.first_at,
                    # Its hours are its whole run's (the ledger keeps a session's totals, not
                    # its days): one begun before the 30 days counts hours the cards leave out.
                    "before": s.first_at < since,
                    "ended": s.ended_at,
                    "hours": s.allocated / 3600,
                    "active": s.totals.get(ledger.ACTIVE, 0.0) / 3600,
                    "idle": (
                        s.totals.get(ledger.IDLE_HELD, 0.0) + s.totals.get(ledger.IDLE_FREE, 0.0)
                    )
                    / 3600,
                    "unknown": s.totals.get(ledger.UNKNOWN, 0.0) / 3600,
                    "cost": (
                        s.totals.get(ledger.IDLE_HELD, 0.0) + s.totals.get(ledger.IDLE_FREE, 0.0)
                    )
                    / 3600
                    * gov.options.cost_per_hour(s.owner.tier),
                }
                for s in sessions
            ],
            mine=mine,
            since=since,
            chart=Markup(
                showback.stacked_bars(
                    idle_series,
                    sorted(r["period"] for r in days),
                    title=(
                        "My GPU-hours per day, last 30 days"
                        if own
                        else f"GPU-hours of {in_sentence(me)} per day, last 30 days"
                    ),
                    unit="GPU-h",
                )
            ),
            team_use=team_use,
            now=now,
            timedelta=timedelta,
        )


def page_handlers(prefix: str, governor) -> list[tuple]:
    args = {"governor": governor}
    p = prefix.rstrip("/")
    return [
        (rf"{p}/static/(pages\.css|pages\.js)", StaticHandler, {"path": str(STATIC)}),
        (rf"{p}/?", DashboardHandler, args),
        (rf"{p}/actions", ActionHandler, args),
        (rf"{p}/showback", ShowbackHandler, args),
        (rf"{p}/me", MyUsageHandler, args),
    ]
