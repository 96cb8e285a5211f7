"""The governor's REST API under ``/services/gpu-gov/api/`` (docs/api.md, "Governor service").

Every handler authenticates with the Hub (a token, or the browser's Hub login) and needs the
service's access scope; admin verbs also need ``custom:gpu-gov:admin`` (or Hub admin scopes),
which a single-user server's own token never has.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from jupyterhub.services.auth import HubOAuth, HubOAuthenticated
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web
from tornado.log import app_log

from ..core import clock, policy
from ..core.durations import parse_duration
from ..core.report import ReportError, validate
from ..core.vocabulary import server_key
from . import metrics, showback
from .reconcile import Governor
from .store import StoreUnavailable

ADMIN_SCOPE = "custom:gpu-gov:admin"
# Hub-wide admin scopes also grant the governor's admin verbs: a Hub admin is a governor admin.
# (admin-ui: what a Hub admin's login to the dashboard carries; only Hub admins hold it.)
HUB_ADMIN_SCOPES = {"admin:servers", "admin:users", "admin-ui"}
# A real report is a few kB (about 600 bytes a GPU process): this bounds what one report, and
# so one server, can make the governor hold.
MAX_REPORT_BYTES = 256 * 1024
MAX_BODY_BYTES = 1024 * 1024  # any request; a larger one is refused before it is read
MAX_TEXT = 2000  # characters of a reason
MAX_AUDIT_ROWS = 5000
EXTENSION_STATUSES = ("granted", "pending", "approved", "denied", "refused")


def error_message(reason: str, kwargs: dict) -> str:
    """What went wrong, in words: an ``HTTPError``'s message, the store's, else the reason."""
    error = kwargs.get("exc_info", (None, None, None))[1]
    if isinstance(error, web.HTTPError) and error.log_message:
        return error.log_message % error.args if error.args else error.log_message
    if isinstance(error, StoreUnavailable):
        return f"{error}. Nothing was changed; try again."
    return reason


class PreparedHubOAuth(HubOAuth):
    """``HubOAuth`` whose synchronous ``get_user`` answers from the handler once ``prepare``
    has asked: HubAuth's synchronous path hops to its own thread and back on every request,
    even for the answer already kept on the handler (``_cached_hub_user``, where
    ``HubAuth._get_user`` keeps it and looks first) — 7 % of the service's CPU under reports."""

    def get_user(self, handler, *, sync=True):
        if sync and hasattr(handler, "_cached_hub_user"):
            return handler._cached_hub_user
        return super().get_user(handler, sync=sync)


class ApiHandler(HubOAuthenticated, web.RequestHandler):
    hub_auth_class = PreparedHubOAuth

    def initialize(self, governor: Governor):
        self.governor = governor

    def get_login_url(self):
        raise web.HTTPError(403, "authenticate with a JupyterHub token")  # an API never redirects

    async def prepare(self):
        # Ask the Hub who this is without blocking the event loop: tornado's current_user is
        # synchronous, and HubAuth would otherwise wait for the Hub's answer to a token it has
        # not cached (a server's first report, or one after the cache expired) with every other
        # request standing still. current_user then finds the answer cached on the handler.
        await self.hub_auth.get_user(self, sync=False)

    def check_xsrf_cookie(self):
        # A request the Hub authenticated by its token needs no XSRF check; every other write
        # does, whatever headers it carries: HubAuth falls back on the login cookie when a
        # token is bogus, so "has an Authorization header" proves nothing.
        if not getattr(self, "_token_authenticated", False):
            super().check_xsrf_cookie()

    @property
    def scopes(self) -> set[str]:
        return set(self.current_user.get("scopes", ()))

    @property
    def actor(self) -> str:
        model = self.current_user
        return f"{model.get('kind', 'user')}:{model['name']}"

    @property
    def is_admin(self) -> bool:
        return bool(self.scopes & ({ADMIN_SCOPE} | HUB_ADMIN_SCOPES))

    def require_admin(self) -> None:
        if not self.is_admin:
            raise web.HTTPError(403, f"this needs the {ADMIN_SCOPE} scope (governor admins)")

    def require_owner_or_admin(self, user: str) -> None:
        model = self.current_user
        if self.is_admin or (model.get("kind", "user") == "user" and model["name"] == user):
            return
        raise web.HTTPError(403, f"only {user} or a governor admin may do this")

    def body(self) -> dict[str, Any]:
        if not self.request.body:
            return {}
        try:
            data = json.loads(self.request.body)
        except ValueError as error:
            raise web.HTTPError(400, f"the body is not JSON: {error}") from None
        except RecursionError:
            raise web.HTTPError(400, "the body is not JSON we read: nested too deeply") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "the body must be a JSON object")
        return data

    def text_field(self, data: dict, key: str, required: bool = False) -> str:
        value = data.get(key, "")
        if not isinstance(value, str):
            raise web.HTTPError(400, f"'{key}' must be a string")
        if required and not value.strip():
            raise web.HTTPError(400, f"'{key}' is required")
        if len(value) > MAX_TEXT:
            raise web.HTTPError(400, f"'{key}' may be at most {MAX_TEXT} characters")
        return value.strip()

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, StoreUnavailable) and not self._finished:
            # All or nothing: the request changed nothing. A 503 says so (not a 500).
            app_log.error("gpu-gov: %s %s: %s", self.request.method, self.request.path, e)
            self.send_error(503, exc_info=sys.exc_info())
            return
        super()._handle_request_exception(e)

    def write_error(self, status_code: int, **kwargs):
        self.set_header("Content-Type", "application/json")
        message = error_message(self._reason, kwargs)
        self.finish(json.dumps({"status": status_code, "message": message}))

    def server_row(self, user: str, name: str):
        key = server_key(user, name or "")
        row = self.governor.row(key)
        if row is None:
            raise web.HTTPError(404, f"the governor knows no server {key}")
        return key, row


class ReportsHandler(ApiHandler):
    """``POST api/reports``: a server's report in, its verdict out."""

    @web.authenticated
    async def post(self):
        if len(self.request.body) > MAX_REPORT_BYTES:
            metrics.REPORTS.labels("invalid").inc()
            raise web.HTTPError(413, f"a report may be at most {MAX_REPORT_BYTES} bytes")
        try:
            report = validate(self.body())
        except ReportError as error:
            metrics.REPORTS.labels("invalid").inc()
            raise web.HTTPError(400, f"invalid report: {error}") from None
        owner = report["server"]["user"]
        model = self.current_user
        if model.get("kind", "user") != "user" or model["name"] != owner:
            metrics.REPORTS.labels("forbidden").inc()
            raise web.HTTPError(403, f"{self.actor} may not report on a server of {owner}")
        key = server_key(owner, report["server"].get("name", ""))
        if not await self.governor.hub_runs(key):
            metrics.REPORTS.labels("forbidden").inc()
            raise web.HTTPError(
                404, f"the Hub runs no server {key}: reports are for servers it runs"
            )
        metrics.REPORTS.labels("accepted").inc()
        self.write_json({"verdict": self.governor.ingest(report)})


class ServersHandler(ApiHandler):
    """``GET api/servers``: every governed server (admins) or the caller's own."""

    @web.authenticated
    def get(self):
        user = None if self.is_admin else self.current_user["name"]
        running_only = self.get_argument("all", "0") not in ("1", "true")
        rows = self.governor.server_rows(running_only)
        items = [
            self.governor.listing(row)
            for row in sorted(rows, key=lambda r: r.key)
            if user is None or row.user == user
        ]
        self.write_json({"servers": items})


class ServerHandler(ApiHandler):
    """``GET api/users/<user>/server`` or ``.../servers/<name>``: one server and its verdict."""

    @web.authenticated
    def get(self, user: str, name: str | None = None):
        self.require_owner_or_admin(user)
        key, row = self.server_row(user, name)
        self.write_json({**self.governor.listing(row), "verdict": self.governor.verdict(key)})


class ExtendHandler(ApiHandler):
    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_owner_or_admin(user)
        key, _ = self.server_row(user, name)
        reason = self.text_field(self.body(), "reason")
        status, outcome = await self.governor.extend(key, self.actor, reason)
        self.write_json(outcome, status)


class DecideExtensionHandler(ApiHandler):
    def initialize(self, governor: Governor, approve: bool):
        super().initialize(governor)
        self.approve = approve

    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_admin()
        key, _ = self.server_row(user, name)
        data = self.body()
        reason = self.text_field(data, "reason", required=True)
        seconds = None
        if self.approve and data.get("duration") is not None:
            try:
                seconds = parse_duration(data["duration"], "'duration'").total_seconds()
            except ValueError as error:
                raise web.HTTPError(400, str(error)) from None
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
        key, _ = self.server_row(user, name)
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
        key, _ = self.server_row(user, name)
        reason = self.text_field(self.body(), "reason") or "lifted"
        self.write_json(await self.governor.exempt(key, self.actor, None, reason))


class CullHandler(ApiHandler):
    """``POST .../cull`` ``{"reason": …, "immediately": false}``: an admin culls now, after
    the owner's notice and a (bounded) checkpoint; ``immediately``: without them."""

    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_admin()
        key, _ = self.server_row(user, name)
        data = self.body()
        reason = self.text_field(data, "reason", required=True)
        immediately = data.get("immediately", False)
        if not isinstance(immediately, bool):
            raise web.HTTPError(400, "'immediately' must be true or false")
        self.write_json(
            await self.governor.cull_now(key, self.actor, reason, immediately=immediately)
        )


class StopHandler(ApiHandler):
    """``POST .../stop`` ``{"reason": …}``: the owner stops the server now."""

    @web.authenticated
    async def post(self, user: str, name: str | None = None):
        self.require_owner_or_admin(user)
        key, _ = self.server_row(user, name)
        reason = self.text_field(self.body(), "reason")
        self.write_json(await self.governor.stop_by_owner(key, self.actor, reason))


class ExtensionsHandler(ApiHandler):
    """``GET api/extensions?status=pending``: extension requests (admins)."""

    @web.authenticated
    def get(self):
        self.require_admin()
        status = self.get_argument("status", None)
        if status is not None and status not in EXTENSION_STATUSES:
            raise web.HTTPError(400, f"'status' must be one of {', '.join(EXTENSION_STATUSES)}")
        rows = self.governor.extensions(status)
        self.write_json(
            {
                "extensions": [
                    {
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
    """``GET api/audit?server=user/name``: decisions and actions with their reasons."""

    @web.authenticated
    def get(self):
        server = self.get_argument("server", None)
        user = self.get_argument("user", None)
        if not self.is_admin:
            user = self.current_user["name"]
            if server is not None and not server.startswith(f"{user}/"):
                raise web.HTTPError(
                    403, f"only {server.split('/')[0]} or a governor admin may read this"
                )
        text = self.get_argument("limit", "200")
        if not text.isdigit() or not 1 <= int(text) <= MAX_AUDIT_ROWS:
            raise web.HTTPError(400, f"'limit' must be a whole number from 1 to {MAX_AUDIT_ROWS}")
        limit = int(text)
        rows = self.governor.audit_trail(server, user, limit)
        self.write_json(
            {
                "audit": [
                    {
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

    @web.authenticated
    def get(self):
        self.require_admin()
        try:
            days = int(self.get_argument("days", "7"))
        except ValueError:
            raise web.HTTPError(400, "'days' must be a whole number of days") from None
        if not 1 <= days <= 366:
            raise web.HTTPError(400, "'days' must be between 1 and 366")
        self.write_json(self.governor.diagnosis_summary(days))


class HealthHandler(ApiHandler):
    """``GET api/health``: GPUs that are not healthy (node, GPU, why, since when, who holds
    them) and servers whose GPU state has been unknown too long (admins)."""

    @web.authenticated
    def get(self):
        self.require_admin()
        self.write_json(self.governor.health_view())


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
    def get(self):
        if not (self.is_admin or "read:metrics" in self.scopes):
            raise web.HTTPError(403, "this needs the read:metrics scope")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(metrics.REGISTRY))


class InfoHandler(ApiHandler):
    @web.authenticated
    def get(self):
        from .. import __version__

        cycle = self.governor.last_cycle
        self.write_json(
            {
                "version": __version__,
                "dry_run": self.governor.options.dry_run,
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
    usage ledger. Admins see everyone (``user=``, ``team=``, ``project=``, ``tier=`` filter);
    anyone else only their own usage."""

    @web.authenticated
    def get(self):
        try:
            group_by, period = showback.parse_group_by(self.get_argument("group_by", "team"))
            since = showback.parse_when(self.get_argument("since", None), "since")
            until = showback.parse_when(self.get_argument("until", None), "until")
        except showback.UsageQueryError as error:
            raise web.HTTPError(400, str(error)) from None
        owner = {k: self.get_argument(k, None) for k in ("user", "team", "project", "tier")}
        if not self.is_admin:
            owner["user"] = self.current_user["name"]
        self.governor.flush_usage()  # the ledger as of the last pass, not of its last write
        rows = self.governor.usage(group_by, period, since, until, **owner)
        fmt = self.get_argument("format", "json")
        if fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", 'attachment; filename="gpu-usage.csv"')
            self.finish(showback.to_csv(rows, group_by))
        elif fmt == "json":
            self.write_json(
                {
                    "group_by": group_by,
                    "period": period,
                    "since": clock.isoformat(since),
                    "until": clock.isoformat(until),
                    "currency": self.governor.options.currency,
                    "usage": rows,
                }
            )
        else:
            raise web.HTTPError(400, f"'format' must be csv or json, got {fmt!r}")


def policy_view(p: policy.Policy) -> dict:
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
        "away_after_s": seconds(p.away_after),
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
        "cull_action": p.cull_action,
        "exempt": p.exempt,
        "inactive_timeout_s": seconds(p.inactive_timeout),
        "expected_duration_notice": p.expected_duration_notice,
    }


_SERVER = r"users/(?P<user>[^/]+)/(?:server|servers/(?P<name>[^/]+))"


def handlers(prefix: str, governor: Governor) -> list[tuple]:
    """Routes under the service prefix (e.g. ``/services/gpu-gov/``)."""
    args = {"governor": governor}
    p = prefix.rstrip("/")
    return [
        (rf"{p}/api/?", InfoHandler, args),
        (rf"{p}/api/reports", ReportsHandler, args),
        (rf"{p}/api/servers", ServersHandler, args),
        (rf"{p}/api/{_SERVER}", ServerHandler, args),
        (rf"{p}/api/{_SERVER}/extend", ExtendHandler, args),
        (rf"{p}/api/{_SERVER}/approve", DecideExtensionHandler, {**args, "approve": True}),
        (rf"{p}/api/{_SERVER}/deny", DecideExtensionHandler, {**args, "approve": False}),
        (rf"{p}/api/{_SERVER}/exempt", ExemptHandler, args),
        (rf"{p}/api/{_SERVER}/cull", CullHandler, args),
        (rf"{p}/api/{_SERVER}/stop", StopHandler, args),
        (rf"{p}/api/extensions", ExtensionsHandler, args),
        (rf"{p}/api/audit", AuditHandler, args),
        (rf"{p}/api/policies", PoliciesHandler, args),
        (rf"{p}/api/diagnosis", DiagnosisHandler, args),
        (rf"{p}/api/health", HealthHandler, args),
        (rf"{p}/api/usage", UsageHandler, args),
        (rf"{p}/metrics", MetricsHandler, args),
    ]
