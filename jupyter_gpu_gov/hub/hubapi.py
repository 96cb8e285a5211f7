"""Async client for the JupyterHub REST API, as the governor uses it.

The governor replaces jupyterhub-idle-culler for GPU servers, so this client keeps that culler's
robustness: paginated listing (``Accept: application/jupyterhub-pagination+json``) with the
``state=ready`` filter, a bound on requests in flight, 202 "slow stop" answers, removal of named
servers, and JupyterHub's internal TLS certificates. It adds what a long-running service needs:
errors that carry the Hub's status and message, and one frozen :class:`HubServer` per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse
from tornado.httputil import url_concat

try:  # libcurl keeps connections to the Hub open between requests; tornado's own client does not
    import pycurl
    from tornado.curl_httpclient import CurlAsyncHTTPClient
    from tornado.ioloop import PeriodicCallback

    class _Client(CurlAsyncHTTPClient):
        """tornado's libcurl client, kept driven and able to give a request up.

        libcurl does not always report a socket or a timer it needs; tornado's client drove
        every transfer once a second for years against that (``socket_all``), and 6.6 no longer
        does. A transfer so lost is never driven again, not even to its own timeout: a pass
        waited for ever on a request the Hub never received.
        """

        def initialize(self, *args: Any, **kwargs: Any) -> None:
            super().initialize(*args, **kwargs)
            self._drive_each_second = PeriodicCallback(self._drive, 1000)
            self._drive_each_second.start()

        def _drive(self) -> None:
            """libcurl's timers that are due, run whether or not it asked for them: a transfer
            that lost its own is driven to its end, or to its timeout."""
            if len(self._free_list) == len(self._curls):  # no transfer in flight
                return
            while True:  # as tornado's _handle_timeout, leaving its scheduled timer as it is
                try:
                    ret, _ = self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
                except pycurl.error as e:
                    ret = e.args[0]
                if ret != pycurl.E_CALL_MULTI_PERFORM:
                    break
            self._finish_pending_requests()

        def abandon(self, request: HTTPRequest) -> bool:
            """Drop ``request``'s transfer, which its caller no longer waits for, and free its
            slot for the next request."""
            for curl in self._curls:
                info = getattr(curl, "info", None)
                # (tornado hands its transfers the request inside a proxy of its defaults)
                if info is not None and getattr(info["request"], "request", None) is request:
                    with contextlib.suppress(pycurl.error):  # libcurl may have lost it as well
                        self._multi.remove_handle(curl)
                    curl.info = None
                    curl.reset()
                    self._free_list.append(curl)
                    self._process_queue()
                    return True
            return False

        def close(self) -> None:
            self._drive_each_second.stop()
            super().close()
            # libcurl, closing a request still in flight (the service stopping mid-pass), asks
            # for one more timer after tornado removed the last: it would fire on the closed
            # client, a traceback as the service exits.
            if self._timeout is not None:
                self.io_loop.remove_timeout(self._timeout)
                self._timeout = None

except ImportError:  # pycurl not installed: a new connection (and DNS lookup) per request
    from tornado.simple_httpclient import SimpleAsyncHTTPClient as _Client

from ..core import clock
from ..core.grant import DEVICES_STATE, GPUS_STATE, GRANT_STATE
from ..core.text import path_segment
from ..core.vocabulary import server_key

log = logging.getLogger(__name__)

PAGINATION_MEDIA_TYPE = "application/jupyterhub-pagination+json"
# What a connection failure or timeout reports as its status (tornado's convention).
NO_RESPONSE = 599
# Seconds past a request's own timeout after which it is given up as lost (HubApi._fetch).
ABANDON_AFTER_TIMEOUT = 5.0

StopResult = Literal["stopped", "stopping", "gone"]


class HubApiError(Exception):
    """The Hub refused a request, or never answered it (status 599).

    ``status`` is the HTTP status and ``message`` the Hub's own explanation (its JSON error body).
    """

    def __init__(self, status: int, message: str, *, method: str = "", url: str = ""):
        self.status = status
        self.message = message
        self.method = method
        self.url = url
        where = f"{method} {url}: " if method else ""
        super().__init__(f"{where}{status} {message}".rstrip())


class NotSent(Exception):
    """A request its caller withdrew at the last moment (``_send``'s ``last_check``)."""


# What the governor reads of a server's model beyond its names and times, kept per server
# for as long as it runs (10,000 at once): the rest of the Hub's decoded JSON is not.
# The spawner's state: the profile layer's grant and devices (core/grant.py), KubeSpawner's pod
# (grant.pod), LocalProcessSpawner's pid (hub/proc_cpu.py): not KubeSpawner's dns_name, version...
STATE_READ = (GRANT_STATE, DEVICES_STATE, GPUS_STATE, "pod_name", "namespace", "pid")
# The user's choices the ownership of a server reads (hub/ownership.py).
OPTIONS_READ = ("profile", "project")
# Options, and a grant's labels, kept as one shared, read-only mapping for every server that
# has the same (most choose among a few profiles, most grants are a team's and a tier's).
# SHARED_OPTIONS_MAX bounds each of the two caches, the options' and the grants'; each key and
# choice at most SHARED_CHOICE_MAX long, a grant of at most SHARED_GRANT_KEYS labels. A full
# cache stops adding (past it a server keeps its own), where the answers' (views.
# _shared_answer) starts again: a site's profiles, projects and grants change slowly, so those
# seen first stay the ones servers share, and a user sending ever new choices (user_options
# are theirs) cannot push out everyone else's; answers go stale within minutes.
SHARED_OPTIONS_MAX, SHARED_CHOICE_MAX, SHARED_GRANT_KEYS = 1024, 255, 16
_shared_options: dict[tuple, Mapping[str, Any]] = {}
_shared_grants: dict[tuple, Mapping[str, Any]] = {}
_NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})


def kept_state(state: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A spawner's state as a server keeps it: only ``STATE_READ`` (None stays None: the token
    lacks admin:server_state); its namespace as a shared string, the grant's labels as one
    read-only mapping shared by the servers granted the same (every reader takes a Mapping)."""
    if state is None:
        return None
    kept = {key: state[key] for key in STATE_READ if key in state}
    namespace = kept.get("namespace")
    if type(namespace) is str:
        kept["namespace"] = sys.intern(namespace)
    labels = kept.get(GRANT_STATE)
    if type(labels) is dict and all(type(v) is str for v in labels.values()):
        if len(labels) <= SHARED_GRANT_KEYS:
            kept[GRANT_STATE] = _shared(labels, _shared_grants)
        else:  # its own: a grant too large (or odd) to share
            kept[GRANT_STATE] = {k: sys.intern(v) for k, v in labels.items()}
    return kept


def kept_options(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """A server's ``user_options`` as it keeps them: only ``OPTIONS_READ``, one read-only
    mapping shared by the servers that chose the same."""
    kept = {key: options[key] for key in OPTIONS_READ if key in options}
    if not kept:
        return _NO_OPTIONS
    return _shared(kept, _shared_options)


def _shared(kept: dict[str, Any], cache: dict[tuple, Mapping[str, Any]]) -> Mapping[str, Any]:
    """``kept`` read-only, the one mapping of ``cache`` with the same items where its keys and
    values are texts short enough to share (else its own)."""
    if not all(
        type(k) is str and type(v) is str and len(k) <= SHARED_CHOICE_MAX >= len(v)
        for k, v in kept.items()
    ):
        return MappingProxyType(kept)  # its own: a choice too long (or odd) to share
    items = tuple(kept.items())
    shared = cache.get(items)
    if shared is None:
        shared = MappingProxyType({k: sys.intern(v) for k, v in items})
        if len(cache) < SHARED_OPTIONS_MAX:
            cache[items] = shared
    return shared


@dataclass(frozen=True, slots=True)  # one per running server: no __dict__ each
class HubServer:
    """One running (or pending) server of a user, flattened from the Hub's user model."""

    user: str
    name: str  # "" for the default server
    admin: bool = False
    groups: tuple[str, ...] = ()
    url: str = ""
    started: datetime | None = None
    last_activity: datetime | None = None
    user_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    pending: str | None = None  # "spawn", "stop", ... while the Hub is busy with it
    ready: bool = False
    # The spawner's get_state(); None when the token lacks admin:server_state.
    spawner_state: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def key(self) -> str:
        """The server's key (``core.vocabulary.server_key``): ``user/`` or ``user/name``."""
        return server_key(self.user, self.name)

    @classmethod
    def from_models(
        cls, user: Mapping[str, Any], name: str, server: Mapping[str, Any]
    ) -> HubServer:
        """The server ``name`` of a user model; ``ValueError`` naming the field that is not
        what JupyterHub sends (the listing leaves that server out, not the pass)."""
        where = f"the Hub's model of server {name!r:.80} of user {user.get('name')!r:.80}"
        if not isinstance(user.get("name"), str) or not user["name"] or not isinstance(name, str):
            raise ValueError(f"{where}: no user or server name")
        if not isinstance(server, Mapping):
            raise ValueError(f"{where}: not an object")
        groups = user.get("groups") or ()
        if not isinstance(groups, list | tuple) or not all(isinstance(g, str) for g in groups):
            raise ValueError(f"{where}: 'groups' is not a list of names")
        for key, kind in (("url", str), ("pending", str), ("user_options", Mapping)):
            if server.get(key) is not None and not isinstance(server[key], kind):
                raise ValueError(f"{where}: {key!r} is a {type(server[key]).__name__}")
        if not isinstance(server.get("state"), Mapping | None):
            raise ValueError(f"{where}: 'state' is a {type(server['state']).__name__}")
        pending = server.get("pending")
        return cls(
            user=user["name"],
            name=name,
            admin=bool(user.get("admin")),
            groups=tuple(map(sys.intern, groups)),  # a group's name, once for its members
            url=server.get("url") or "",
            started=_time(server, "started", where),
            last_activity=_time(server, "last_activity", where),
            user_options=kept_options(server.get("user_options") or {}),
            pending=sys.intern(pending) if pending is not None else None,
            # Hubs before 0.9 had no 'ready': a URL meant the server was up.
            ready=bool(server.get("ready", bool(server.get("url")))),
            spawner_state=kept_state(server.get("state")),
        )


def _time(model: Mapping[str, Any], key: str, where: str) -> datetime | None:
    """An ISO 8601 time of the Hub's (UTC where it names no offset), or None."""
    try:
        return clock.parse(model.get(key))
    except (TypeError, ValueError, AttributeError):
        raise ValueError(f"{where}: {key!r} is not an ISO 8601 time: {model[key]!r:.60}") from None


def is_user_model(user: Any) -> bool:
    """Whether a listed item is a user model with a name (else logged: the listing skips it)."""
    if isinstance(user, Mapping) and isinstance(user.get("name"), str) and user["name"]:
        return True
    log.warning("gpu-gov: the Hub listed a user without a name, left out: %.120r", user)
    return False


def servers_of(user: Mapping[str, Any]) -> list[HubServer]:
    """The servers of a user model the Hub listed. One that cannot be read is logged and left
    out: one odd model must not stop the pass for every other server (a server left out is
    not decided this pass: nothing is done to it)."""
    models = user.get("servers") or {}
    if not isinstance(models, Mapping):
        log.warning(
            "gpu-gov: the Hub's model of user %.80r: 'servers' is not an object", user["name"]
        )
        return []
    servers = []
    for name, model in models.items():
        try:
            servers.append(HubServer.from_models(user, name, model))
        except ValueError as error:
            log.warning("gpu-gov: %s: left out of this pass", error)
    return servers


class _Reply(NamedTuple):
    status: int
    data: Any  # decoded JSON, text for a non-JSON body, None for an empty one
    reason: str
    url: str


class HubApi:
    """Async client for ``$JUPYTERHUB_API_URL`` with the service's token.

    Parameters
    ----------
    api_url: e.g. ``http://127.0.0.1:8081/hub/api`` (default ``$JUPYTERHUB_API_URL``).
    token: API token (default ``$JUPYTERHUB_API_TOKEN``).
    concurrency: most requests in flight at once (a whole cull cycle shares it).
    page_size: ``limit`` asked of paginated lists; 0 leaves it to the Hub
        (``api_page_default_limit``, capped by ``api_page_max_limit``).
    request_timeout, connect_timeout: seconds. Listing thousands of users is slow, hence a
        longer default than tornado's 20 s.
    ssl_enabled: the Hub runs with ``internal_ssl``; certificates come from
        ``internal_certs_location`` (JupyterHub's layout: ``hub-ca/hub-ca.crt``,
        ``hub-internal/hub-internal.{crt,key}``) or, without it, from the
        ``$JUPYTERHUB_SSL_CLIENT_CA``/``_CERTFILE``/``_KEYFILE`` the Hub gives managed services.
    ca_certs, client_cert, client_key: explicit files; each wins over the above.
    validate_cert: verify the Hub's certificate.
    """

    def __init__(
        self,
        api_url: str | None = None,
        token: str | None = None,
        *,
        concurrency: int = 10,
        page_size: int = 0,
        request_timeout: float = 60.0,
        connect_timeout: float = 20.0,
        ssl_enabled: bool = False,
        internal_certs_location: str | os.PathLike[str] | None = None,
        ca_certs: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        validate_cert: bool = True,
    ):
        api_url = api_url or os.environ.get("JUPYTERHUB_API_URL")
        token = token or os.environ.get("JUPYTERHUB_API_TOKEN")
        if not api_url:
            raise ValueError("HubApi: api_url is not given and $JUPYTERHUB_API_URL is not set")
        if not token:
            raise ValueError("HubApi: token is not given and $JUPYTERHUB_API_TOKEN is not set")
        if concurrency < 1:
            raise ValueError(f"HubApi: concurrency must be at least 1, not {concurrency}")
        if page_size < 0:
            raise ValueError(f"HubApi: page_size must be 0 (Hub default) or more, not {page_size}")
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.concurrency = concurrency
        self.page_size = page_size
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.validate_cert = validate_cert
        self.ca_certs, self.client_cert, self.client_key = ca_certs, client_cert, client_key
        if ssl_enabled:
            if internal_certs_location:
                loc = os.fspath(internal_certs_location)
                found = (
                    os.path.join(loc, "hub-ca", "hub-ca.crt"),
                    os.path.join(loc, "hub-internal", "hub-internal.crt"),
                    os.path.join(loc, "hub-internal", "hub-internal.key"),
                )
            else:
                found = tuple(
                    os.environ.get(f"JUPYTERHUB_SSL_{k}")
                    for k in ("CLIENT_CA", "CERTFILE", "KEYFILE")
                )
            self.ca_certs = ca_certs or found[0]
            self.client_cert = client_cert or found[1]
            self.client_key = client_key or found[2]
            if not (self.ca_certs and self.client_cert and self.client_key):
                raise ValueError(
                    "HubApi: ssl_enabled needs internal_certs_location, $JUPYTERHUB_SSL_* or"
                    " explicit ca_certs, client_cert and client_key"
                )
        self.request_count = 0  # requests sent, for metrics and tests
        # Whether it may change anything (the service: while it holds the lease, hub/lease.py);
        # checked once a request holds its slot, just before it is sent.
        self.may_act: Callable[[], bool] = lambda: True
        self.why_not_acting: Callable[[], str] = lambda: "this governor does not act now"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: AsyncHTTPClient | None = None
        self._semaphore: asyncio.Semaphore | None = None

    # --- plumbing ----------------------------------------------------------------------------
    @property
    def ssl_kwargs(self) -> dict[str, Any]:
        """TLS arguments for every ``HTTPRequest`` (only the files that are set)."""
        files = {"ca_certs": self.ca_certs, "client_cert": self.client_cert}
        files["client_key"] = self.client_key
        return {"validate_cert": self.validate_cert} | {k: v for k, v in files.items() if v}

    def _bind(self) -> tuple[AsyncHTTPClient, asyncio.Semaphore]:
        # Tornado clients and asyncio semaphores belong to one event loop; tests and tools may
        # run the same HubApi on several loops in turn.
        loop = asyncio.get_running_loop()
        if self._client is None or self._semaphore is None or self._loop is not loop:
            if self._client is not None:
                self._client.close()
            # Our own instance (not tornado's per-loop shared one) with room for every permitted
            # request, so none waits in tornado's queue, where waiting counts against its timeout.
            # With pycurl (as jupyterhub-idle-culler and z2jh's hub use it), its connections are
            # kept between requests and passes, at most a few per request slot; a connection the
            # Hub closed (a restart) is noticed by libcurl, which opens a new one.
            self._client = _Client(force_instance=True, max_clients=self.concurrency)
            self._semaphore = asyncio.Semaphore(self.concurrency)
            self._loop = loop
        return self._client, self._semaphore

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = self._semaphore = self._loop = None

    async def __aenter__(self) -> HubApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _url(self, path: str, params: Mapping[str, Any] | None = None) -> str:
        url = (
            path
            if path.startswith(("http://", "https://"))
            else f"{self.api_url}/{path.lstrip('/')}"
        )
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        return url_concat(url, query) if query else url

    async def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        last_check: Callable[[], Awaitable[str | None]] | None = None,
        held: bool = False,
    ) -> _Reply:
        """One request; any HTTP status comes back, only a missing answer raises.
        ``last_check``: awaited once the request holds its slot, just before it is sent (a
        burst waits for slots, minutes against a slow Hub); a reason it returns withdraws
        the request (``NotSent``). ``held``: sent in a slot its caller holds (the check's)."""
        url = self._url(path, params)
        hdrs = {"Authorization": f"token {self.token}", "Accept": "application/json"}
        hdrs.update(headers or {})
        payload = None
        if body is not None:
            payload = json.dumps(body)
            hdrs["Content-Type"] = "application/json"
        req = HTTPRequest(
            url,
            method=method,
            headers=hdrs,
            body=payload,
            allow_nonstandard_methods=True,  # DELETE with {"remove": true}, POST without body
            request_timeout=self.request_timeout,
            connect_timeout=self.connect_timeout,
            follow_redirects=False,
            prepare_curl_callback=_path_as_is,  # (tornado's own client sends it so)
            **self.ssl_kwargs,
        )
        client, semaphore = self._bind()
        async with contextlib.nullcontext() if held else semaphore:
            why = await last_check() if last_check is not None else None
            if why is None and method != "GET" and not self.may_act():
                why = self.why_not_acting()
            if why is not None:
                raise NotSent(why)
            self.request_count += 1
            try:
                resp = await self._fetch(client, req)
            except HTTPClientError as e:  # timeouts
                raise HubApiError(e.code, str(e), method=method, url=url) from e
            except OSError as e:  # refused, unreachable, TLS failures
                raise HubApiError(NO_RESPONSE, str(e), method=method, url=url) from e
        text = (resp.body or b"").decode("utf8", "replace")
        data: Any = None
        if text:
            try:
                data = json.loads(text)
            except ValueError:
                data = text
        return _Reply(resp.code, data, resp.reason or "", url)

    async def _fetch(self, client: AsyncHTTPClient, req: HTTPRequest) -> HTTPResponse:
        """The client's answer, or its timeout; and, should the client not end the request by
        its own timeout (a transfer libcurl lost), a 599 soon after: a pass never waits for
        ever on one request, and the request's slot is freed for the next."""
        fetch = client.fetch(req, raise_error=False)
        try:
            return await asyncio.wait_for(fetch, self.request_timeout + ABANDON_AFTER_TIMEOUT)
        except asyncio.TimeoutError:
            abandon = getattr(client, "abandon", None)
            if abandon is not None:
                abandon(req)
            message = (
                f"no answer {self.request_timeout + ABANDON_AFTER_TIMEOUT:g} s after it was sent"
                f" (its timeout is {self.request_timeout:g} s): the HTTP client had lost it"
            )
            log.warning("%s %s: %s; given up", req.method, req.url, message)
            raise HTTPClientError(NO_RESPONSE, message) from None

    @staticmethod
    def _error(method: str, reply: _Reply) -> HubApiError:
        """An error status, or an answer that is not JSON (a proxy's own page, even with 200:
        the Hub's API answers JSON or nothing)."""
        data = reply.data
        if isinstance(data, dict) and data.get("message"):
            message = str(data["message"])  # JupyterHub's {"status": …, "message": …}
        elif isinstance(data, str) and data.strip():
            message = data.strip()[:500]
            message = f"not JSON: {message}" if reply.status < 400 else message
        else:
            message = reply.reason
        return HubApiError(reply.status, message, method=method, url=reply.url)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Call ``path`` (relative to ``api_url``, or a full URL); return the decoded JSON body.

        ``body`` is sent as JSON. Raises :class:`HubApiError` for any status from 400 on.
        """
        reply = await self._send(method, path, body, params=params, headers=headers)
        if reply.status >= 400 or isinstance(reply.data, str):
            raise self._error(method, reply)
        return reply.data

    # --- listing -----------------------------------------------------------------------------
    async def paginate(
        self, path: str, params: Mapping[str, Any] | None = None
    ) -> AsyncIterator[Any]:
        """Yield every item of a list endpoint (``/users``, ``/groups``), page by page.

        The next page is requested while the caller works through this one. A page may be
        short, even empty, before the last: the Hub applies ``state=ready`` after slicing.
        """
        query = dict(params or {})
        if self.page_size:
            query["limit"] = self.page_size
        accept = {"Accept": PAGINATION_MEDIA_TYPE}

        def fetch(p: str, q: Mapping[str, Any]) -> asyncio.Task[Any]:
            task = asyncio.ensure_future(self.request("GET", p, params=q, headers=accept))
            # If the caller stops early, an unawaited failure must not be reported at exit.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            return task

        pending: asyncio.Task[Any] | None = fetch(path, query)
        pages = 0
        try:
            while pending is not None:
                page = await pending
                pending = None
                pages += 1
                if isinstance(page, list):  # Hubs before 2.0: the whole list, unpaginated
                    items = page
                else:
                    items = page.get("items") or []
                    info = page.get("_pagination") or {}
                    nxt = info.get("next")
                    if nxt and "offset" in nxt:
                        if int(nxt["offset"]) <= int(info.get("offset", -1)):
                            log.warning("Hub pagination of %s did not advance: %s", path, info)
                        else:
                            # Our own URL rather than next.url: the Hub builds that from the
                            # Host and scheme it saw, which behind a proxy we may not reach.
                            q = query | {"offset": nxt["offset"], "limit": nxt.get("limit")}
                            pending = fetch(path, q)
                    elif nxt:
                        pending = fetch(nxt["url"], {})
                for item in items:
                    yield item
        finally:
            if pending is not None:
                pending.cancel()
        log.debug("Listed %s in %d page(s)", path, pages)

    async def iter_users(self, state: str | None = "ready") -> AsyncIterator[dict[str, Any]]:
        """Yield user models with their ``servers`` (``state``: ready, active, inactive, None).

        Server models carry ``state`` (the spawner's) when the token has admin:server_state.
        """
        seen: set[str] = set()
        async for user in self.paginate("/users", {"state": state}):
            # Offset pages shift when users come and go between two requests: skip repeats.
            if is_user_model(user) and user["name"] not in seen:
                seen.add(user["name"])
                yield user

    async def list_servers(self, state: str | None = "ready") -> list[HubServer]:
        """Every server in the listed user models, one :class:`HubServer` each.

        With ``state="ready"`` only ready servers: the Hub selects users with *any* ready
        server, and their other servers may still be starting or stopping.
        """
        return [server async for server in self.iter_servers(state)]

    async def iter_servers(self, state: str | None = "ready") -> AsyncIterator[HubServer]:
        """Like ``list_servers``, page by page: a caller can work on one page while the next
        is fetched."""
        async for user in self.iter_users(state):
            for server in servers_of(user):
                if state != "ready" or server.ready:
                    yield server

    async def get_user(self, user: str, held: bool = False) -> dict[str, Any] | None:
        """The user model, or None when the Hub has no such user (``held``: ``_send``'s)."""
        reply = await self._send("GET", f"/users/{_q(user)}", held=held)
        if reply.status == 404:
            return None
        if reply.status >= 400 or isinstance(reply.data, str):
            raise self._error("GET", reply)
        return reply.data

    async def get_server(
        self, user: str, name: str = "", held: bool = False
    ) -> tuple[HubServer | None, dict | None]:
        """One server's model read now (``GET /users/{name}``), and its user's model: ``None``
        for the server when the Hub no longer runs it (the user, or the server, is gone)."""
        model = await self.get_user(user, held)
        servers = (model or {}).get("servers") or {}
        if name not in servers:
            return None, model
        return HubServer.from_models(model, name, servers[name]), model

    async def get_groups(self) -> list[dict[str, Any]]:
        """All group models (``name``, ``users``, ``properties``)."""
        return [group async for group in self.paginate("/groups")]

    # --- actions -----------------------------------------------------------------------------
    async def stop_server(
        self,
        user: str,
        name: str = "",
        remove: bool = False,
        last_check: Callable[[], str | None] | None = None,
        session: datetime | None = None,
    ) -> StopResult:
        """Ask the Hub to stop a server; ``remove`` also deletes a named server's record;
        ``last_check`` as ``_send``'s, then, with ``session`` (the ``started`` of the session
        to stop), the server's model read in the DELETE's slot: another session or none is
        not stopped (``NotSent``). The Hub's DELETE has no session condition: without this,
        a server its owner stopped and started again since was stopped for the old session.

        Returns "stopped" (204), "stopping" (202: the Hub is still stopping it; check again
        later, as a repeated DELETE answers 202 until it is done) or "gone" (404, or 400 from a
        Hub that says it is not running or has no named servers). A 400 for a server being
        renamed also reads "gone"; the next listing shows it again if it still runs.
        """
        body = None
        if name:
            path = f"/users/{_q(user)}/servers/{_q(name)}"
            if remove:
                body = {"remove": True}
        else:
            # The Hub refuses to remove a default server: it is stopped only.
            path = f"/users/{_q(user)}/server"

        async def check() -> str | None:
            why = last_check() if last_check is not None else None
            if why is None and session is not None:
                now, _ = await self.get_server(user, name, held=True)
                if now is None or now.started != session:
                    why = f"the server {'restarted' if now else 'stopped'} since it was decided"
            return why

        reply = await self._send("DELETE", path, body, last_check=check)
        if reply.status == 202:
            return "stopping"
        if reply.status in (200, 204):
            return "stopped"
        if reply.status in (400, 404):
            return "gone"
        raise self._error("DELETE", reply)

    async def delete_user(self, user: str) -> bool:
        """Delete a user (``--cull-users``); False when already gone.

        The Hub answers 400 while one of the user's servers is stopping: that raises, so the
        caller tries again on a later cycle.
        """
        reply = await self._send("DELETE", f"/users/{_q(user)}")
        if reply.status == 404:
            return False
        if reply.status >= 400:
            raise self._error("DELETE", reply)
        return True


def _path_as_is(curl) -> None:
    """libcurl takes dot segments out of a path, ``%2E%2E`` as well as ``..``: a server of that
    name (JupyterHub 4.1 to 5.x take any) was another URL, its owner's ``/users/alice/``."""
    curl.setopt(pycurl.PATH_AS_IS, 1)


def _q(name: str) -> str:
    """Quote a user or server name as one path segment (``.`` and ``..`` too)."""
    return path_segment(name)
