"""The service's pages, server-rendered (Jinja2, autoescaped; charts are inline SVG; no CDN):

- ``/services/gpu-gov/``: the admin dashboard (Hub admins or ``custom:gpu-gov:admin``): every
  GPU-holding server, filters and sorting by query parameters, extend / exempt / cull now with a
  reason, pending extension approvals, idle cost by team, the policies;
- ``/services/gpu-gov/showback``: GPU-hours and idle costs per team, user, project or tier and
  day or week, with charts and CSV / JSON links (admins);
- ``/services/gpu-gov/me``: "my GPU usage" for anyone logged in: their servers, idle hours and
  their teams' use.

Forms post to ``/services/gpu-gov/actions`` with JupyterHub's XSRF token (HubOAuth checks it
for every cookie-authenticated POST). Actions call the same Governor methods as the REST API;
"Cull now" asks first, on a page of its own (it works without JavaScript).

Times are written as ``<time datetime="…Z">2026-01-05 09:14 UTC</time>``; ``static/pages.js``
shows them in the reader's clock, like JupyterLab does. Only the API and CSV stay in UTC.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthenticated
from markupsafe import Markup
from tornado import web

from ..core import clock, ledger
from ..core.durations import format_duration, parse_duration
from ..diagnose.labels import HINTS
from . import showback
from .routes import ADMIN_SCOPE, HUB_ADMIN_SCOPES, ApiHandler, error_message, policy_view

_env = Environment(
    loader=PackageLoader("jupyter_gpu_gov.hub", "templates"),
    autoescape=select_autoescape(["html"], default=True),
)
_env.filters["dur"] = lambda s: "—" if s is None else format_duration(int(s))
# What an action did, shown once on the dashboard it redirects to: a cookie signed by this
# service, never a query parameter (anyone could link an admin to ``?msg=<any text>``).
FLASH_COOKIE = "gpu-gov-flash"

STATIC = Path(__file__).parent / "static"
# What the governor writes into reasons: "2026-01-05 09:14 UTC", or "09:14 UTC" (about now).
_UTC_IN_TEXT = re.compile(r"\b(?:(\d{4}-\d{2}-\d{2})[ T])?(\d{2}):(\d{2})(?::(\d{2}))? UTC\b")


def time_tag(when: datetime | None) -> Markup:
    """A moment for people: the page's script shows it in their clock; UTC without it."""
    if when is None:
        return Markup("")
    when = when.astimezone(timezone.utc)
    return Markup('<time datetime="{}">{} UTC</time>').format(
        when.strftime("%Y-%m-%dT%H:%M:%SZ"), when.strftime("%Y-%m-%d %H:%M")
    )


def times_in_text(text: str | None, now: datetime | None = None) -> Markup:
    """``text`` escaped, each UTC time in it a :func:`time_tag` (a time without a day is the
    one nearest ``now``)."""
    now = (now or clock.utcnow()).astimezone(timezone.utc)
    out, last = [], 0
    for match in _UTC_IN_TEXT.finditer(text or ""):
        day, hour, minute, second = match.groups()
        try:
            if day:
                at = datetime.fromisoformat(f"{day}T{hour}:{minute}:{second or '00'}+00:00")
            else:
                base = now.replace(hour=int(hour), minute=int(minute), second=0, microsecond=0)
                at = min((base + timedelta(days=d) for d in (-1, 0, 1)), key=lambda t: abs(t - now))
        except ValueError:  # 25:99 UTC: left as written
            continue
        out += [Markup.escape(text[last : match.start()]), time_tag(at)]
        last = match.end()
    out.append(Markup.escape((text or "")[last:]))
    return Markup("").join(out)


_env.filters["time"] = time_tag
_env.filters["times"] = times_in_text
SORTS = ("user", "team", "project", "tier", "state", "idle_for", "memory", "activity", "deadline")
EXEMPT_CHOICES = ("1h", "8h", "1d", "3d", "7d")


class PageHandler(ApiHandler):
    """HTML pages: a browser that is not logged in is sent to the Hub's login (GET); errors
    are pages, not JSON."""

    def get_login_url(self):
        if self.request.method in ("GET", "HEAD"):
            return HubOAuthenticated.get_login_url(self)  # the Hub's OAuth, with its state
        raise web.HTTPError(403, "log in again: this form has expired (XSRF)")

    @property
    def prefix(self) -> str:
        return self.settings["gpu_gov_prefix"]

    def render_page(self, template: str, status: int = 200, **context) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'self'")  # no inline code
        self.set_header("X-Content-Type-Options", "nosniff")
        user = self.current_user or {}
        self.finish(
            _env.get_template(template).render(
                prefix=self.prefix,
                me=user.get("name", ""),
                is_admin=bool(user) and self.is_admin,
                xsrf=Markup(self.xsrf_form_html()),
                dry_run=self.governor.options.dry_run,
                currency=self.governor.options.currency,
                **context,
            )
        )

    def write_error(self, status_code: int, **kwargs):
        message = error_message(self._reason, kwargs)
        user = getattr(self, "_hub_auth_user_cache", None) or {}
        scopes = set(user.get("scopes", ()))
        self.set_status(status_code)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'self'")
        self.finish(
            _env.get_template("error.html").render(
                prefix=self.prefix,
                status=status_code,
                message=message,
                me=user.get("name", ""),
                is_admin=bool(scopes & ({ADMIN_SCOPE} | HUB_ADMIN_SCOPES)),
                dry_run=self.governor.options.dry_run,
            )
        )

    def require_admin(self) -> None:
        if not self.is_admin:
            raise web.HTTPError(
                403,
                "the GPU dashboard is for Hub admins and governor admins "
                "(scope custom:gpu-gov:admin); your own usage is on “My GPU usage”",
            )


def _ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return ""
    return format_duration(max(0, int((now - when).total_seconds())))


def _until(when: datetime | None, now: datetime) -> str:
    if when is None:
        return ""
    seconds = int((when - now).total_seconds())
    return f"in {format_duration(seconds)}" if seconds > 0 else "due"


def server_lines(governor, now: datetime) -> list[dict]:
    """The running servers as the dashboard shows them (GPU-holding ones flagged)."""
    lines = []
    pending_ext = {e.server_key for e in governor.extensions("pending")}
    for row in governor.server_rows(running_only=True):
        view = governor.listing(row)
        gpu = view["gpu"] or {}
        session = governor.open_session(row.key)
        devices = [
            d.get("mig_profile") or d.get("name") or d.get("uuid") for d in gpu.get("devices", ())
        ]
        activity = gpu.get("active_fraction")
        idle_for = (now - row.idle_since).total_seconds() if row.idle_since else None
        lines.append(
            {
                "key": row.key,
                "user": row.user,
                "name": row.name,
                "team": row.team or "",
                "project": row.project or "",
                "tier": row.tier or "",
                "gpus": session.gpus if session else 0.0,
                "devices": ", ".join(str(d) for d in devices),
                "state": row.state,
                "reason": row.reason,
                "idle_for": idle_for,
                "idle_for_text": _ago(row.idle_since, now),
                "memory": (gpu.get("memory_mb") or 0) / 1024 if gpu else None,
                "activity": activity,
                "root_cause": (view["root_cause"] or {}).get("label", ""),
                "root_cause_hint": (view["root_cause"] or {}).get("hint", ""),
                "right_size": view["right_size"],
                "deadline": row.cull_at,
                "deadline_text": _until(row.cull_at, now),
                "warn_text": _until(row.warn_at, now),
                "extensions_used": row.extensions_used,
                "approval_pending": row.approval_pending or row.key in pending_ext,
                "exempt_until": row.exempt_until,
                "policy": row.policy or "",
                "ledger_state": session.state if session else "",
            }
        )
    return lines


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

    @web.authenticated
    def get(self):
        self.require_admin()
        gov = self.governor
        now = clock.utcnow()
        lines = server_lines(gov, now)
        everything = self.get_argument("all", "") == "1"
        options = {
            dim: sorted({line[dim] for line in lines} - {""}) for dim in ("team", "tier", "state")
        }
        filters = {k: self.get_argument(k, "") for k in ("user", "team", "tier", "state")}
        shown = [
            line
            for line in lines
            if (everything or line["gpus"] > 0 or line["devices"])
            and (not filters["user"] or filters["user"].lower() in line["user"].lower())
            and all(not filters[k] or line[k] == filters[k] for k in ("team", "tier", "state"))
        ]
        sort = self.get_argument("sort", "idle_for")
        sort = sort if sort in SORTS else "idle_for"
        shown.sort(key=_sort_key(sort))
        if self.get_argument("desc", "") == "0":
            shown.reverse()
        gov.flush_usage()  # the ledger as of this pass, not of its last write
        week = gov.usage(["team"], "all", showback.days_back(7, now))
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
            if column == sort and self.get_argument("desc", "") != "0":
                args["desc"] = "0"
            return "?" + urlencode(args)

        pending = [
            {
                "server": e.server_key,
                "requested_by": e.requested_by,
                "requested_at": e.requested_at,
                "ago": _ago(e.requested_at, now),
                "reason": e.reason,
            }
            for e in gov.extensions("pending")
        ]
        self.render_page(
            "dashboard.html",
            lines=shown,
            total=len(lines),
            gpus_held=sum(line["gpus"] for line in lines),
            idle_now=sum(
                line["gpus"]
                for line in lines
                if line["ledger_state"] in (ledger.IDLE_HELD, ledger.IDLE_FREE)
            ),
            week=week,
            week_idle_cost=sum(idle_cost.values()),
            week_idle_hours=sum(idle_hours.values()),
            chart=Markup(chart),
            filters=filters,
            everything=everything,
            options=options,
            sort=sort,
            sort_url=sort_url,
            pending=pending,
            policies=[policy_view(p) for p in gov.policies],
            exempt_choices=EXEMPT_CHOICES,
            message=self._flash(),
            last_cycle=gov.last_cycle,
            now=now,
            gpu_health=gov.health_view(),
            diagnosis=gov.diagnosis_summary(),  # the root causes' section (diagnosis.html)
            hints=HINTS,
        )

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
        gov = self.governor
        key = self.get_body_argument("server", "")
        action = self.get_body_argument("action", "")
        reason = self.get_body_argument("reason", "").strip()
        if gov.row(key) is None:
            raise web.HTTPError(404, f"the governor knows no server {key}")
        if not reason:
            raise web.HTTPError(400, "say why: a reason is required for every action")
        actor = self.actor
        if action == "extend":
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
            if self.get_body_argument("confirm", "") != "yes":
                self._confirm_cull(key, reason)
                return
            outcome = await gov.cull_now(key, actor, reason)
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

    def _confirm_cull(self, key: str, reason: str) -> None:
        """Cull now takes a person's work away: say what it will do, and ask."""
        row = self.governor.row(key)
        chosen = self.governor.policy_named(row.policy)
        self.render_page(
            "confirm_cull.html",
            server=key,
            reason=reason,
            state=row.state,
            policy=policy_view(chosen),
        )


class ShowbackHandler(PageHandler):
    """``GET /services/gpu-gov/showback?group_by=team&period=day&days=14``."""

    @web.authenticated
    def get(self):
        self.require_admin()
        gov = self.governor
        now = clock.utcnow()
        dim = self.get_argument("group_by", "team")
        dim = dim if dim in ledger.DIMENSIONS else "team"
        period = "week" if self.get_argument("period", "day") == "week" else "day"
        try:
            days = max(1, min(int(self.get_argument("days", "14")), 366))
        except ValueError:
            days = 14
        since = showback.days_back(days, now)
        gov.flush_usage()
        rows = gov.usage([dim], period, since)
        totals = gov.usage([dim], "all", since)
        idle_series, periods = showback.series_by(rows, dim, "gpu_hours_idle")
        active_series, _ = showback.series_by(rows, dim, "gpu_hours_active")
        sessions = gov.usage_sessions(since=since)
        hist = ledger.utilisation_histogram(sessions)
        per = "day" if period == "day" else "week"
        query = urlencode({"group_by": f"{dim},{period}", "since": since.date().isoformat()})
        self.render_page(
            "showback.html",
            dim=dim,
            dims=ledger.DIMENSIONS,
            period=period,
            days=days,
            rows=rows,
            totals=totals,
            idle_chart=Markup(
                showback.stacked_bars(
                    idle_series, periods, title=f"Idle GPU-hours by {dim} per {per}", unit="GPU-h"
                )
            ),
            active_chart=Markup(
                showback.stacked_bars(
                    active_series,
                    periods,
                    title=f"Active GPU-hours by {dim} per {per}",
                    unit="GPU-h",
                )
            ),
            hist_chart=Markup(
                showback.histogram(
                    hist,
                    title="Utilisation distribution: GPU-hours by how busy their session was",
                    unit="GPU-h",
                )
            ),
            csv_url=f"{self.prefix}api/usage?{query}&format=csv",
            json_url=f"{self.prefix}api/usage?{query}",
        )


class MyUsageHandler(PageHandler):
    """``GET /services/gpu-gov/me``: the logged-in user's servers, idle hours, team use."""

    @web.authenticated
    def get(self):
        gov = self.governor
        now = clock.utcnow()
        me = self.current_user["name"]
        if self.is_admin and self.get_argument("user", ""):
            me = self.get_argument("user")  # admins may look at anyone's page
        lines = [line for line in server_lines(gov, now) if line["user"] == me]
        since = showback.days_back(30, now)
        gov.flush_usage()
        sessions = gov.usage_sessions(since=since, user=me)
        days = gov.usage([], "day", since, user=me)
        idle_series = {"idle": {r["period"]: r["gpu_hours_idle"] for r in days}}
        idle_series["active"] = {r["period"]: r["gpu_hours_active"] for r in days}
        (mine,) = gov.usage([], "all", since, user=me) or [None]
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
            lines=lines,
            sessions=[
                {
                    "server": s.server,
                    "team": s.owner.team,
                    "project": s.owner.project,
                    "tier": s.owner.tier,
                    "started": s.first_at,
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
            chart=Markup(
                showback.stacked_bars(
                    idle_series,
                    sorted(r["period"] for r in days),
                    title="My GPU-hours per day, last 30 days",
                    unit="GPU-h",
                )
            ),
            team_use=team_use,
            now=now,
            timedelta=timedelta,
        )


class StaticHandler(web.StaticFileHandler):
    """The pages' stylesheet and script (no CDN): public, like any page's assets."""

    def set_extra_headers(self, path):
        self.set_header("X-Content-Type-Options", "nosniff")


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
