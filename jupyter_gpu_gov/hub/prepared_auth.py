"""Speed-ups of JupyterHub's ``HubOAuth`` for the service's handlers, kept apart from them:
the answer to "who sent this request", once ``prepare`` has asked the Hub, without a second
trip through HubAuth's thread, and the scope check answered at once when the caller holds a
required scope as it is written (the savings: docs/benchmarks-history.md, "Report ingest over HTTP"
and "Issue 26, wave 7"); and, per token HubAuth keeps for ``cache_max_age``, only what is read of
the Hub's answer (issue 26, wave 15). The plain path is ``HubOAuth`` and ``HubOAuthenticated``
themselves; tests/test_governor_hub.py and tests/test_prepared_auth.py check both answer alike."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from functools import partial

from ..core.text import stored_name
from ..core.vocabulary import server_key
from . import metrics
from .hub_auth import HubOAuth, HubOAuthenticated, UserNotAllowed, hub_auth_module

# The scopes the service's handlers test by name (``api_handler.py``, ``routes.py``; HubAuth
# keeps no others, but for the access scopes'): its admins, who may read its Prometheus metrics.
# Hub-wide admin scopes also grant the governor's admin verbs: a Hub admin is a governor admin.
ADMIN_SCOPE = "custom:gpu-gov:admin"
HUB_ADMIN_SCOPES = frozenset({"admin:servers", "admin:users"})
# What a Hub admin's login to the dashboard carries (its OAuth client allows nothing stronger):
# JupyterHub's "access the admin page; permission to take actions granted separately", which an
# admin may give anyone to look (a help desk's role). Held alone it makes a governor admin only
# where the Hub also says the caller is an admin (``is_governor_admin``): a help desk holding it
# once exempted and culled anyone's server and applied policies.
ADMIN_PAGE_SCOPE = "admin-ui"
METRICS_SCOPE = "read:metrics"
# Reading showback without being an admin (``hub/readers.py``): unfiltered, every team's (finance);
# ``!group=<group>``, that group's team's (a team lead). Kept with any filter the Hub gives it.
SHOWBACK_SCOPE = "custom:gpu-gov:showback"
TESTED_SCOPES = frozenset({ADMIN_SCOPE, *HUB_ADMIN_SCOPES, ADMIN_PAGE_SCOPE, METRICS_SCOPE})
FILTERED_SCOPES = frozenset({SHOWBACK_SCOPE})  # tested with their filters: every form kept
# Any of them: perhaps a governor admin, whose Hub answer is kept ADMIN_KEPT_S (below).
MAYBE_ADMIN_SCOPES = frozenset({ADMIN_SCOPE, *HUB_ADMIN_SCOPES, ADMIN_PAGE_SCOPE})
ADMIN_BY_ITSELF_SCOPES = frozenset({ADMIN_SCOPE, *HUB_ADMIN_SCOPES})  # any one: a governor admin


def is_governor_admin(model: dict) -> bool:
    """Whether the Hub's answer for a caller (as kept) makes them a governor admin: the
    governor's admin scope, a Hub admin scope over users or servers, or the admin page's scope
    held by a Hub admin (``admin`` in the Hub's model, which JupyterHub keeps true for the
    members of its admin role)."""
    scopes = model.get("scopes") or ()
    if not ADMIN_BY_ITSELF_SCOPES.isdisjoint(scopes):
        return True
    return ADMIN_PAGE_SCOPE in scopes and model.get("admin") is True


# What anything reads of the Hub's user model: the handlers (name, kind, and of the scopes
# those above) and HubAuthenticated's ``check_hub_user`` (name, kind, admin for its
# ``allow_admin``, and of the scopes those of the access scopes' base, which its check compares
# filter by filter; its ``hub_groups``, the one reader of groups, is never set here). The rest
# (groups, servers with their user_options, activity, ids, other scopes) is ~1 kB a token.
KEPT_FIELDS = ("kind", "name", "admin", "scopes")
KINDS = {kind: kind for kind in ("user", "service")}
# Kept scopes made of those strings alone, one tuple for each set of them: a server's token
# keeps its access scope and nothing else (at most as many as the sets of a few scopes).
SHARED_SCOPES: dict[frozenset[str], tuple[str, ...]] = {}


ASK_THE_HUB = object()  # ``cached_user``: not cached

# How long the Hub's word that a token is an admin's is kept (HubAuth keeps every answer for
# ``cache_max_age``, 300 s): admin rights taken away at the Hub (a revoked token, a group or
# role left) ended here five minutes later, while they could cull any server. Admins' requests
# are few: a check each ADMIN_KEPT_S costs nothing. So are showback readers' (a lead who left
# the team read its usage five minutes more).
ADMIN_KEPT_S = 30.0

# The address (its socket's) of the request that asks the Hub about a token or a login's code,
# where the request says so (the report route, every handler's ``prepare``, the OAuth
# callback): at most MAX_CHECKS_PER_ADDRESS of its checks are asked at a time, the others wait
# their turn. Each token no one sent before costs
# one; a process sending a flood of them (aiohttp asks at most 100 at a time) held up the
# first check of every other server's token behind the whole flood (its report 503 after
# 10 s: its GPU data unknown, the governor blind). Nothing is cached that the Hub did not say.
# (``hub_checks_per_address``: behind a mesh's sidecar or SNAT every server is one address).
ASKING: ContextVar[str | None] = ContextVar("gpu_gov_asking", default=None)
MAX_CHECKS_PER_ADDRESS = 8


def _digest(cache_key: str) -> bytes:
    # A 32-byte digest of HubAuth's key (71 characters and more): as distinct, half the size.
    return hashlib.sha256(cache_key.encode("utf8", "replace")).digest()


class PreparedHubOAuth(HubOAuth):
    """``HubOAuth`` whose synchronous ``get_user`` answers from the handler once ``prepare``
    has asked: HubAuth's synchronous path hops to its own thread and back on every request,
    even for the answer already kept on the handler (``_cached_hub_user``, where
    ``HubAuth._get_user`` keeps it and looks first). Anything else takes HubOAuth's path.

    Its ``cache`` keeps a token's answer small (``kept``), under the SHA-256 of HubAuth's key
    (``token:<session id>:<token's SHA-256 in hex>``). The Hub is asked about tokens in turn
    by address (``ASKING``)."""

    checks_per_address = MAX_CHECKS_PER_ADDRESS  # the service's ``hub_checks_per_address``

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._turns: dict[str, _Turns] = {}
        self._admin_asked: dict[bytes, float] = {}  # an admin's token (its key): when asked
        if self.certfile and self.keyfile:
            _keep_ssl_contexts()

    def get_user(self, handler, *, sync=True):
        if sync and hasattr(handler, "_cached_hub_user"):
            return handler._cached_hub_user
        return super().get_user(handler, sync=sync)

    async def _check_hub_authorization(self, url, api_token, cache_key=None, use_cache=True):
        # HubAuth's, caching (expiry, purge, a refusal as None) the kept model instead.
        if not use_cache:
            return self.kept(await super()._check_hub_authorization(url, api_token, None, False))
        if cache_key is None:
            raise ValueError("cache_key is required when using cache")
        key = _digest(cache_key)
        try:
            model = self.cache[key]
        except KeyError:
            pass
        else:
            asked = self._admin_asked.get(key)
            if asked is None or time.monotonic() - asked < ADMIN_KEPT_S:
                return model
        self._admin_asked.pop(key, None)
        model = self.kept(
            await self._in_turn(
                partial(super()._check_hub_authorization, url, api_token, None, False)
            )
        )
        self.cache[key] = model
        if model and _maybe_admin_or_reader(model.get("scopes") or ()):
            now = self._admin_asked[key] = time.monotonic()
            if len(self._admin_asked) > 1000 and self.cache_max_age > 0:
                # Months of admins' logins: those the cache has forgotten too.
                self._admin_asked = {
                    k: t for k, t in self._admin_asked.items() if now - t <= self.cache_max_age
                }
        return model

    async def _token_for_code(self, code, code_verifier=None):
        # A login's code (the OAuth callback: one state cookie replays for weeks) is checked
        # with the Hub as a token is: in turn.
        return await self._in_turn(partial(super()._token_for_code, code, code_verifier))

    async def _in_turn(self, ask: Callable[[], Awaitable]):
        """``ask()`` (a request to the Hub) in its turn among ``ASKING``'s."""
        address = ASKING.get()
        if address is None:  # no request's address (HubAuth's own thread): asked at once
            return await ask()
        turns = self._turns.get(address)
        if turns is None:
            turns = self._turns[address] = _Turns(self.checks_per_address)
        turns.asking += 1
        try:
            async with turns.semaphore:
                return await ask()
        finally:
            turns.asking -= 1
            if not turns.asking:
                del self._turns[address]

    async def whose(self, token: str) -> dict | None:
        """The Hub's answer for ``token`` (None: a refusal), with every scope it holds, in its
        turn among its address's checks and kept nowhere: the person who asked an Extend or
        Stop through a server (``ASKER_HEADER``), a few a day, and the scopes that say
        whether it reaches that server are those ``kept`` drops."""
        url = f"{self.api_url.rstrip('/')}/user"
        return await self._in_turn(
            partial(HubOAuth._check_hub_authorization, self, url, token, None, False)
        )

    def cached_user(self, token: str, session_id: str = "") -> dict | object | None:
        """``user_for_token``'s answer where HubAuth has it cached, without asking the Hub: the
        model, None for a refusal, or ``ASK_THE_HUB``."""
        token_hash = hashlib.sha256(token.encode("utf8", "replace")).hexdigest()
        try:
            return self.cache[_digest(f"token:{session_id}:{token_hash}")]  # user_for_token's key
        except KeyError:
            return ASK_THE_HUB

    def kept(self, model: dict | None) -> dict | None:
        """What is kept of the Hub's answer for a token (None: a refusal): the fields in
        ``KEPT_FIELDS``, of the scopes those the service tests (``TESTED_SCOPES``; any with a
        base in ``FILTERED_SCOPES``) or compares with its access scopes (any with their base),
        a tuple of the service's own strings
        where it holds them (every server's token holds the access scope)."""
        if model is None:
            return None
        kept = {field: model[field] for field in KEPT_FIELDS if field in model}
        servers = bound_servers(model.get("scopes") or ())
        if servers is not None:
            kept["servers"] = servers
        if "kind" in kept:
            kept["kind"] = KINDS.get(kept["kind"], kept["kind"])
        if "scopes" in kept:
            shared = {scope: scope for scope in (*self.access_scopes, *TESTED_SCOPES)}
            bases = {scope.partition("!")[0] for scope in self.access_scopes} | FILTERED_SCOPES
            scopes = tuple(
                shared.get(scope, scope)
                for scope in kept["scopes"]
                if scope in shared or scope.partition("!")[0] in bases
            )
            if all(scope in shared for scope in scopes):
                scopes = SHARED_SCOPES.setdefault(frozenset(scopes), scopes)
            kept["scopes"] = scopes
        return kept


def _maybe_admin_or_reader(scopes) -> bool:
    """Whether the Hub's answer is kept ``ADMIN_KEPT_S`` only: a governor admin's, or a
    showback reader's (a lead who left the team is no longer one at the Hub: 30 s, not 300 s,
    of reading its usage after)."""
    return not MAYBE_ADMIN_SCOPES.isdisjoint(scopes) or any(
        str(scope).partition("!")[0] in FILTERED_SCOPES for scope in scopes
    )


def _keep_ssl_contexts() -> None:
    """Under the Hub's ``internal_ssl`` HubAuth (JupyterHub 5 and later) makes an SSL context
    for every request to the Hub (``make_ssl_context``): the key, the certificate and the CA
    read and parsed again, ~28 ms of the event loop for each token check, every server's every
    5 minutes. The context made first serves them all, until one of its files changes on disk
    (a renewed certificate). JupyterHub 4's HubAuth makes none here (tornado's client does)."""
    make = getattr(hub_auth_module, "make_ssl_context", None)
    if make is None or getattr(make, "kept", None) is not None:
        return
    kept: dict[tuple, object] = {}

    def made_once(keyfile, certfile, cafile=None, **kwargs):
        files = (keyfile, certfile, cafile)
        key = (*files, *(os.stat(f).st_mtime_ns for f in files if f), tuple(sorted(kwargs.items())))
        if key not in kept:
            kept.clear()  # one set of files at a time: a renewed one replaces the last
            kept[key] = make(keyfile, certfile, cafile=cafile, **kwargs)
        return kept[key]

    made_once.kept = kept
    hub_auth_module.make_ssl_context = made_once


class _Turns:
    """An address's checks: how many are asked or wait, and the turns they take."""

    __slots__ = ("asking", "semaphore")

    def __init__(self, at_once: int) -> None:
        self.asking = 0
        self.semaphore = asyncio.Semaphore(at_once)


def bound_servers(scopes) -> tuple[str, ...] | None:
    """The servers (``user/name`` keys) a token may act for when the Hub lets it reach only
    those: its every ``access:servers`` scope filtered to a server. A server's own
    ``$JUPYTERHUB_API_TOKEN`` is (``access:servers!server=alice/``): whoever that server is
    shared with can read it, and it must not stop, extend or report for its owner's other
    servers. None: not bound (no such scope, or one to a user or to all)."""
    servers = []
    for scope in scopes:
        base, _, which = str(scope).partition("!")
        if base == "access:servers":
            if not which.startswith("server="):
                return None
            servers.append(_key_of(which.removeprefix("server=")))
    return tuple(sorted(servers)) or None


def _key_of(server: str) -> str:
    """The key of a server a scope names (``alice/gpu``, the Hub's names as they are): a name
    the store cannot hold as it is has its kept form in the key (``core.text.stored_name``)."""
    user, _, name = server.partition("/")
    return server_key(user, name)


def reaches(scopes, key: str) -> bool:
    """Whether these scopes (as the Hub lists them) let their holder use the server ``key``
    (``user/name``): ``access:servers`` whole, to its user, or to that server (a share's). A
    group's filter is not expanded here: it does not reach (fails closed)."""
    user = key.partition("/")[0]
    for scope in scopes:
        base, _, which = str(scope).partition("!")
        if base != "access:servers":
            continue
        kind, _, named = which.partition("=")
        if (
            not which
            or (kind == "user" and stored_name(named) == user)
            or (kind == "server" and _key_of(named) == key)
        ):
            return True
    return False


def out_of_reach(model: dict, key: str) -> str | None:
    """Why the caller's token does not reach the server ``key`` (``bound_servers``), in the
    words of its refusal; None: it does."""
    servers = model.get("servers")
    if servers is None or key in servers:
        return None
    return f"a token of server {', '.join(servers)!r:.80} may not act for {key!r:.80}"


def owner_wide(model: dict, what: str) -> str | None:
    """Why the caller's token may not read ``what``, a record of its owner's every server (their
    usage, their page): a server's own token reads its own server's records only. None: it
    may."""
    servers = model.get("servers")
    if servers is None:
        return None
    return f"a token of server {', '.join(servers)!r:.80} may not read {what}: only its own records"


def has_access(hub_auth: HubOAuth, model: dict) -> bool:
    """Whether an identified caller may use the service: what ``HubOAuthenticated``'s
    ``check_hub_user`` allows with the service's access scopes as ``hub_scopes`` (none set:
    any identified caller). A caller holding one exactly as written is allowed at once, which
    is what ``check_scopes`` answers for it, without expanding every scope's filters and
    formatting its debug lines anew for each request (a server's token is checked on every
    report); any other takes HubAuth's full check."""
    required = hub_auth.access_scopes
    if not required or not required.isdisjoint(model.get("scopes") or ()):
        return True
    return bool(hub_auth.check_scopes(required, model))


def token_caller(hub_auth: PreparedHubOAuth, authorization: str) -> dict | object | None:
    """Who a request's ``Authorization`` header (``token <t>`` or ``bearer <t>``) names, if they
    may use the service, as a handler's ``prepare`` and ``current_user`` find it for a token
    and no session cookie: HubAuth's answer (``user_for_token``), then ``has_access``. None
    for no token, one the Hub refuses, or a caller without access; ``ASK_THE_HUB`` where the
    answer is not cached (then ``asked_token_caller``)."""
    match = hub_auth.auth_header_pat.match(authorization)
    if not match:
        return None
    model = hub_auth.cached_user(match.group(1))
    return model if model is ASK_THE_HUB else _allowed(hub_auth, model)


async def asked_token_caller(hub_auth: PreparedHubOAuth, authorization: str) -> dict | None:
    """``token_caller``, asking the Hub where HubAuth has no answer cached (and caching it)."""
    match = hub_auth.auth_header_pat.match(authorization)
    if not match:
        return None
    return _allowed(hub_auth, await hub_auth.user_for_token(match.group(1), sync=False))


def _allowed(hub_auth: HubOAuth, model: dict | None) -> dict | None:
    if not model or not has_access(hub_auth, model):
        return None
    model.setdefault("kind", "user")
    return model


class PreparedHubAuthenticated(HubOAuthenticated):
    """``HubOAuthenticated`` with ``PreparedHubOAuth``, whose scope check is ``has_access``
    (HubOAuthenticated's own check, refusals included, for every caller it does not allow)."""

    hub_auth_class = PreparedHubOAuth
    refused_caller: str | None = None  # who was refused for want of the access scope

    def check_hub_user(self, model):
        if not self.hub_scopes:
            return super().check_hub_user(model)  # the pre-2.0 checks, with their own lines
        kind = model.setdefault("kind", "user")
        if has_access(self.hub_auth, model) or self.hub_auth.check_scopes(self.hub_scopes, model):
            return model  # (the second: where a handler's hub_scopes are not the access scopes)
        # A caller the Hub knows without the access scope: HubAuth wrote a WARNING for each of
        # its requests, a loop of them a line each (its token cached, its budget 10 a second).
        # One line per caller a minute, then a count (``RefusalLog``), and a counter.
        self.refused_caller = f"{kind}:{model.get('name', '')!r:.80}"
        metrics.CALLERS_REFUSED.inc()
        refusals = getattr(self, "settings", {}).get("gpu_gov_refusals")  # (a handler's)
        if refusals is not None:
            refusals.warning(
                self.refused_caller,
                "gpu-gov: Hub %s %.80r refused (403): without the service's access scope (%s)",
                kind,
                model.get("name", ""),
                ", ".join(sorted(self.hub_scopes))[:200],
            )
        raise UserNotAllowed(model)
