"""What every handler of the service shares (the REST API's and the pages'): who is asking
(the Hub's answer, asked once per request without blocking), whether they are the owner or a
governor admin, the JSON body and its bounded text fields, and errors that say what is wrong.

Every handler authenticates with the Hub (a token, or the browser's Hub login) and needs the
service's access scope; admin verbs also need ``custom:gpu-gov:admin`` (or Hub admin scopes),
which a single-user server's own token never has.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tornado import web
from tornado.log import app_log

from ..core import browser_json
from ..core.text import STORED_MARK, not_text_at
from ..core.vocabulary import server_key
from ..core.wire import ASKER_HEADER, reason_too_long
from . import fast_json
from .prepared_auth import (
    ADMIN_SCOPE,
    ASK_THE_HUB,
    ASKING,
    PreparedHubAuthenticated,
    is_governor_admin,
    out_of_reach,
    reaches,
)
from .readers import readable_teams
from .store import StoreUnavailable

if TYPE_CHECKING:
    from .reconcile import Governor
    from .tables import ServerRow

# What a request costs, in units of its caller's ``api_budget`` (docs/api.md, "API budget"): a
# status read, a page of the audit or a person's request, about 1 ms of the event loop; a
# listing of every server (an admin's, the dashboard, the health view, a user's page built
# from every server's lines), up to ~150 ms at 10,000 servers; an export or a replay (usage,
# the trace, the diagnosis's costs, a what-if, showback), seconds of a worker. Counted alike,
# a loop of exports went through a budget sized for reads at hundreds of times their cost.
COST_READ, COST_LISTING, COST_EXPORT = 1, 5, 10


def bounded_reason(text: str, key: str = "reason") -> str:
    """``text``, or a 400 where it is longer than a reason may be (``core.wire.MAX_REASON``):
    the API's, the dashboard's and the policy page's bound, in the same words."""
    if refusal := reason_too_long(text, key):
        raise web.HTTPError(400, refusal)
    return text


def error_message(reason: str, kwargs: dict) -> str:
    """What went wrong, in words: an ``HTTPError``'s message, the store's, else the reason."""
    error = kwargs.get("exc_info", (None, None, None))[1]
    if isinstance(error, web.HTTPError) and error.log_message:
        return error.log_message % error.args if error.args else error.log_message
    if isinstance(error, StoreUnavailable):
        return f"{error}. Nothing was changed; try again."
    return reason


def retry_after(handler: web.RequestHandler, kwargs: dict) -> None:
    """An error that says when to try again (``retry_after_s``: ``readers.NotReady``) sets its
    ``Retry-After`` on the answer (tornado's ``send_error`` clears the headers set before)."""
    error = kwargs.get("exc_info", (None, None, None))[1]
    seconds = getattr(error, "retry_after_s", None)
    if isinstance(seconds, int) and seconds > 0:
        handler.set_header("Retry-After", str(seconds))


def json_object(body: bytes) -> dict[str, Any]:
    """A request's body as a JSON object, or ``ValueError`` saying why it is not one."""
    try:
        data = fast_json.loads(body)
    except ValueError as error:
        raise ValueError(f"the body is not JSON: {error}") from None
    except RecursionError:
        raise ValueError("the body is not JSON we read: nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    if _may_hold_a_surrogate(body):
        try:
            where = _not_text(data, "")
        except RecursionError:
            raise ValueError("the body is not JSON we read: nested too deeply") from None
        if where is not None:
            raise ValueError(
                f"the body is not text at '{where}': a lone surrogate (\\ud800-\\udfff) or "
                "NUL (\\u0000); send Unicode text"
            )
    return data


# JSON may escape a lone surrogate (\ud800), and json.loads takes its UTF-8-like bytes too: a
# str that is no text, which nothing writes (SQLite, a UTF-8 log) — it once made the pass's
# whole write fail. NUL too: PostgreSQL refuses text holding it. A body that is ASCII without
# a backslash holds neither (JSON has no raw NUL in a string): checked at C speed.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]|\\u0000")


def _may_hold_a_surrogate(body: bytes) -> bool:
    return (b"\\" in body or not body.isascii()) and _SURROGATE.search(body) is not None


def _not_text(value: Any, where: str) -> str | None:
    """Where in decoded JSON a string or a key holds a lone surrogate or NUL (None: nowhere)."""
    if isinstance(value, str):
        return None if not_text_at(value) is None and "\0" not in value else where
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}.{key}" if where else key
            if not_text_at(key) is not None or "\0" in key:
                return ascii(name)[1:-1]
            found = _not_text(item, name)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _not_text(item, f"{where}[{i}]")
            if found is not None:
                return found
    return None


# Names a query filters by, read as sent: ``get_argument`` trims a value and makes its control
# characters spaces, another name (``?user=`` of a user whose name holds NUL found nothing).
AS_SENT = frozenset(("user", "server", "team", "project"))


class ApiHandler(PreparedHubAuthenticated, web.RequestHandler):
    cost = COST_READ  # the route's cost class, in units of ``api_budget``

    def initialize(self, governor: Governor):
        self.governor = governor

    def request_cost(self, caller: dict) -> int:
        """This request's units of ``caller``'s ``api_budget`` (the route's ``cost``)."""
        return self.cost

    def get_login_url(self):
        # An API never redirects. A token the Hub knows but without the service's access scope
        # lands here too: say which scope that is (a monitoring token given only read:metrics
        # was told to authenticate, with the token it had just sent).
        # The service's own (access:services!service=<name>), not the broader access:services
        # HubAuth also takes: what an admin grants a token for this service.
        scopes = sorted(self.hub_auth.access_scopes or ())
        access = " or ".join([s for s in scopes if "!" in s] or scopes)
        raise web.HTTPError(
            403,
            "authenticate with a JupyterHub token"
            + (f" that has the scope {access}" if access else ""),
        )

    async def prepare(self):
        # Ask the Hub who this is without blocking the event loop: tornado's current_user is
        # synchronous, and HubAuth would otherwise wait for the Hub's answer to a token it has
        # not cached (a server's first report, or one after the cache expired) with every other
        # request standing still. current_user then finds the answer cached on the handler.
        # A token the Hub is asked about takes its turn among its address's (prepared_auth).
        peer = getattr(self.request.connection, "peer", "")
        ASKING.set(peer)
        # An address whose requests keep naming no caller (no token, bogus ones: each new one
        # a Hub check) waits, as the report route's does (``refused_budget``, shared): a token
        # of the header or URL not cached is not asked about, and a request that names no
        # caller gets 429, not 403. A cached caller, and the login cookie (signed: only a
        # login sets it), are not held back; a page's GET still goes to the Hub's login.
        refused = self.settings.get("gpu_gov_refused")
        wait = refused.short(peer) if refused is not None else 0.0
        if wait and self._would_ask_the_hub():
            self._throttle(peer, wait, "requests refused from this address")
            return
        caller = await self.hub_auth.get_user(self, sync=False)
        if caller:
            self._take_from_budget(caller)
        elif wait and not self.sends_to_login():
            self._throttle(peer, wait, "requests refused from this address")

    throttled = False  # answered 429 for a budget (its log line: ``RefusalLog``)

    def sends_to_login(self) -> bool:
        """Whether a request that names no caller is sent to the Hub's login (a page's GET):
        every browser's first visit, through the proxy's one address: never held back."""
        return False

    def _would_ask_the_hub(self) -> bool:
        """Whether the request's token (header or URL) costs a Hub check: not cached."""
        token = self.hub_auth.get_token(self, in_cookie=False)
        session = self.hub_auth.get_session_id(self)
        return bool(token) and self.hub_auth.cached_user(token, session) is ASK_THE_HUB

    def on_finish(self) -> None:
        # A request refused for naming no caller counts against its address (the flood's
        # log lines: ``log_request``).
        if self.get_status() == 403 and getattr(self, "_cached_hub_user", None) is None:
            refused = self.settings.get("gpu_gov_refused")
            if refused is not None:
                refused.take(getattr(self.request.connection, "peer", ""))

    def log_exception(self, typ, value, tb) -> None:
        # A refusal of a request that names no caller is logged once, as its address's
        # (``log_request``), and one of a caller without the access scope as that caller's
        # (``check_hub_user``): not also as tornado's line for each HTTPError.
        if not (
            isinstance(value, web.HTTPError)
            and value.status_code < 500
            and (getattr(self, "_cached_hub_user", None) is None or self.refused_caller)
        ):
            super().log_exception(typ, value, tb)

    def _take_from_budget(self, caller: dict) -> None:
        """The request's cost (``request_cost``) from the caller's budget (``api_budget``), else
        429 with ``Retry-After``: one user's loop of requests, each about 1 ms of the event loop
        every report waits on (an export seconds of a worker), would slow the service for
        everyone. Keyed by who the Hub says the caller is (all
        their tokens and their login share it), never by anything the request says; admins
        too, whose listings cost the most. A flood of 429s costs the log a line a minute."""
        budget = self.settings.get("gpu_gov_budget")
        kind, name = caller.get("kind", "user"), caller.get("name", "")
        wait = (
            budget.take(f"{kind}:{name}", self.request_cost(caller)) if budget is not None else 0.0
        )
        if wait:
            # Named in its count's line: bounded, escaped.
            self._throttle(f"{kind}:{name!r:.80}", wait, f"requests from {name!r:.80}")

    def _throttle(self, key: str, wait: float, what: str) -> None:
        """Answer 429 with ``Retry-After``, before the handler runs; logged as ``key``'s first
        in a minute, then a count (``RefusalLog``)."""
        seconds = max(1, math.ceil(wait))
        error = web.HTTPError(429, f"too many {what}: send again in {seconds} s")
        self.settings["gpu_gov_refusals"].warning(
            key,
            "gpu-gov: %s %.200s refused (429): %s",
            self.request.method,
            self.request.path,
            error.log_message,
        )
        self.throttled = True
        self.set_status(429)
        self.set_header("Retry-After", str(seconds))
        self.write_error(429, exc_info=(web.HTTPError, error, None))  # finished: no handler runs

    async def stream(self, next_chunk: Callable[[], str], what: str) -> None:
        """Writes ``next_chunk()``, called in a worker, until it gives "", then finishes: an
        export sent as it is made, neither held whole nor holding the event loop. A failure
        before the first chunk is a 500; after it, the connection is cut off: tornado would
        end the chunked body as if whole, a shorter file that looks right (a finance team's
        CSV, a trace what-if reads), which the client now sees as incomplete."""
        loop = asyncio.get_running_loop()
        try:
            while chunk := await loop.run_in_executor(None, next_chunk):
                self.write(chunk)
                await self.flush()
        except Exception:
            if not self._headers_written:
                raise
            app_log.exception("gpu-gov: %s failed part-way; its transfer is cut off", what)
            self.request.connection.close()
            return
        self.finish()

    def check_xsrf_cookie(self):
        # A request the Hub authenticated by its token needs no XSRF check; every other write
        # does, whatever headers it carries: HubAuth falls back on the login cookie when a
        # token is bogus, so "has an Authorization header" proves nothing.
        if not getattr(self, "_token_authenticated", False):
            super().check_xsrf_cookie()

    @property
    def scopes(self) -> set[str]:
        """The caller's scopes the service tests (``prepared_auth.TESTED_SCOPES``, and any of its
        access scopes' base): HubAuth keeps no others."""
        return set(self.current_user.get("scopes", ()))

    @property
    def actor(self) -> str:
        model = self.current_user
        return f"{model.get('kind', 'user')}:{model['name']}"

    @property
    def is_admin(self) -> bool:
        return is_governor_admin(self.current_user)

    @property
    def showback_teams(self) -> frozenset[str] | None:
        """The teams whose usage the caller may read (None: every team; empty: only their
        own): ``hub/readers.py``."""
        return readable_teams(self.current_user, self.governor.teams_by_group)

    def query(self, *names: str) -> dict[str, str | None]:
        """The query's ``names`` (None: absent), each at most once; any other parameter a
        ``400`` naming it. A misspelt one (``sinse=``) was ignored: the answer read as if it
        were absent, a CSV of every day on record in place of a month's, and said nothing."""
        # ``token`` is HubAuth's own (a token in the URL), read before this; ``_xsrf``
        # tornado's (a form's or a script's XSRF token).
        unknown = sorted(set(self.request.query_arguments) - {*names, "token", "_xsrf"})
        if unknown:
            takes = ", ".join(names) or "none in the URL: its arguments go in the body"
            raise web.HTTPError(
                400, f"unknown parameter {', '.join(map(repr, unknown))}: this takes {takes}"
            )
        asked = {}
        for name in names:
            if name in AS_SENT:
                sent = self.request.query_arguments.get(name, [])
                values = [self.decode_argument(value, name=name) for value in sent]
            else:
                values = self.get_query_arguments(name)
            if len(values) > 1:
                raise web.HTTPError(400, f"{name!r} given {len(values)} times: give it once")
            asked[name] = values[0] if values else None
        return asked

    def yes_or_no(self, asked: dict[str, str | None], name: str) -> bool:
        """``asked[name]`` as a yes (``1``, ``true``, ``yes``) or a no (absent, ``0``,
        ``false``, ``no``), else a ``400`` naming it: ``pseudonymise=on`` read as no, a trace
        with every user's name in place of the pseudonymised one asked for."""
        value = asked[name]
        if value is None or value in ("0", "false", "no"):
            return False
        if value in ("1", "true", "yes"):
            return True
        raise web.HTTPError(
            400, f"{name!r} must be 1, true or yes (or 0, false, no); got {value!r:.40}"
        )

    def require_admin(self) -> None:
        if not self.is_admin:
            raise web.HTTPError(403, f"this needs the {ADMIN_SCOPE} scope (governor admins)")

    def own_name(self) -> str:
        """The user whose own records a caller who is no governor admin reads (their servers,
        audit trail, usage, page). A Hub service owns none: services and users are named
        apart, and a service of the admin's named ``bob`` read bob's as if it were him."""
        model = self.current_user
        if model.get("kind", "user") != "user":
            raise web.HTTPError(
                403,
                f"a Hub service owns no server: this needs the {ADMIN_SCOPE} scope "
                "(governor admins)",
            )
        return model["name"]

    def require_owner_or_admin(self, user: str, name: str | None = None) -> None:
        """The caller is a governor admin, or ``user`` with a token that reaches the server
        ``name`` (a server's own token reaches only its server: ``bound_servers``)."""
        model = self.current_user
        if self.is_admin:
            return
        if model.get("kind", "user") != "user" or model["name"] != user:
            raise web.HTTPError(403, f"only {user} or a governor admin may do this")
        unreached = out_of_reach(model, server_key(user, name or ""))
        if unreached:
            raise web.HTTPError(403, unreached)

    async def asker(self, user: str, name: str | None) -> str:
        """Who asked this Extend or Stop of the server ``user``/``name``, for the record: the
        caller (``actor``); or, where the server's own token relays someone else's ask (its
        ``ASKER_HEADER``: a guest of a shared server, an admin in its JupyterLab), the user
        whose token that is, as the Hub says, if it reaches the server. A guest's ask once
        went on record as the owner's. The server's owner can relay only a token sent to
        their server; anything else is refused, naming why, with nothing done."""
        header = self.request.headers.get(ASKER_HEADER)
        if header is None:
            return self.actor
        key = server_key(user, name or "")
        if key not in (self.current_user.get("servers") or ()):
            raise web.HTTPError(
                400, f"only the server's own token relays who asked ({ASKER_HEADER})"
            )
        match = self.hub_auth.auth_header_pat.match(header)
        if not match or len(header) > 1024:
            raise web.HTTPError(400, f"{ASKER_HEADER} must be 'token <the asker's token>'")
        # Each asker is a Hub check: one the Hub knew no one by counts against the address as
        # a request naming no caller does (``refused_budget``), past which none is asked.
        refused = self.settings.get("gpu_gov_refused")
        peer = getattr(self.request.connection, "peer", "")
        wait = refused.short(peer) if refused is not None else 0.0
        if wait:
            self._throttle(peer, wait, "asks naming no one the Hub knows")
            raise web.Finish()  # answered 429 with its Retry-After
        try:
            model = await self.hub_auth.whose(match.group(1))
        except web.HTTPError:
            raise web.HTTPError(
                503, "the Hub did not say whose the asker's token is: nothing was done"
            ) from None
        kind = model.get("kind", "user") if model else None
        if kind not in ("user", "service") or not isinstance(model.get("name"), str):
            if refused is not None:
                refused.take(peer)
            raise web.HTTPError(
                403, f"the Hub knows no one by the token in {ASKER_HEADER}: nothing was done"
            )
        if not reaches(model.get("scopes") or (), key):
            raise web.HTTPError(
                403,
                f"{model['name']!r:.80} may not use the server {key!r:.80}: nothing was done",
            )
        return f"{kind}:{model['name']}"

    def body(self) -> dict[str, Any]:
        """A write's arguments, from its JSON body. Its URL takes none (``query()``): a
        ``?dry_run=true`` or ``?reason=…`` there was dropped unsaid, and the write done
        without it (the policy applied for real, the extension on record without its why)."""
        self.query()
        if not self.request.body:
            return {}
        try:
            return json_object(self.request.body)
        except ValueError as error:
            raise web.HTTPError(400, str(error)) from None

    def text_field(self, data: dict, key: str, required: bool = False) -> str:
        value = data.get(key, "")
        if not isinstance(value, str):
            raise web.HTTPError(400, f"'{key}' must be a string")
        if required and not value.strip():
            raise web.HTTPError(400, f"'{key}' is required")
        return bounded_reason(value, key).strip()

    _worker_etag: str | None = None  # ``finish_from_worker``'s

    async def finish_from_worker(self, build: Callable[[], bytes | str]) -> None:
        """Finish with what ``build`` returns, built, encoded and hashed for its ETag
        (tornado's: the body's SHA-1) in a worker thread: on the event loop, encoding and
        hashing a 16 MB page held every report for ~30-110 ms (docs/benchmarks-history.md, "Routes
        at 10,000 servers (wave 28)")."""
        loop = asyncio.get_running_loop()
        self._worker_etag, body = await loop.run_in_executor(None, _tagged, build)
        self.finish(body)

    def compute_etag(self) -> str | None:
        return self._worker_etag or super().compute_etag()

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(browser_json.dumps(data))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, StoreUnavailable) and not self._finished:
            # All or nothing: the request changed nothing. A 503 says so (not a 500).
            app_log.error("gpu-gov: %s %s: %s", self.request.method, self.request.path, e)
            self.send_error(503, exc_info=sys.exc_info())
            return
        super()._handle_request_exception(e)

    def write_error(self, status_code: int, **kwargs):
        self.set_header("Content-Type", "application/json")
        retry_after(self, kwargs)
        message = error_message(self._reason, kwargs)
        self.finish(browser_json.dumps({"status": status_code, "message": message}))

    def known_server(self, user: str, name: str | None) -> tuple[str, ServerRow]:
        """The key and row of a server named in the URL, or a 404. The pages name a server
        whose name no store holds as it is by its kept form (``core.text.stored_name``), the
        key it is known by; any other caller by its name."""
        key = f"{user}/{name or ''}"
        row = self.governor.row(key) if STORED_MARK in key else None
        if row is None:
            key = server_key(user, name or "")
            row = self.governor.row(key)
        if row is None:
            raise web.HTTPError(404, f"the governor knows no server {key}")
        return key, row


def _tagged(build: Callable[[], bytes | str]) -> tuple[str, bytes]:
    """``build()``'s body as bytes, and its ETag as tornado computes one."""
    body = build()
    if isinstance(body, str):
        body = body.encode("utf-8")
    return f'"{hashlib.sha1(body).hexdigest()}"', body
