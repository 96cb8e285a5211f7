"""A small, faithful fake of the JupyterHub REST API, served over real HTTP on 127.0.0.1.

It follows JupyterHub 5/6 where the governor depends on it:

- ``GET /users?state=ready|active|inactive&sort=&offset=&limit=``: users in id order (or
  ``sort``: ``name``, ``last_activity``, ``-`` for descending, as JupyterHub 5+); with
  ``Accept: application/jupyterhub-pagination+json`` a ``{"items", "_pagination"}`` page whose
  ``next`` is ``{"offset", "limit", "url"}`` or null, without it a plain list of up to
  ``page_max`` users. Like the Hub, ``ready`` is applied *after* slicing (pages may be short)
  and ``total`` counts users with any active server.
- ``GET /users/{name}``, ``DELETE /users/{name}``, ``GET /groups``.
- ``GET /user``: who a token belongs to, as services' HubAuth asks it (any valid token may).
  A user's token (``add_user_token``) gets the user model cut to what the token may read, as
  the Hub's ``SelfAPIHandler`` does (``kind``, ``name``, ``admin``, ``groups``, and
  ``last_activity`` with ``read:users:activity``), plus ``token_id``, ``session_id`` and the
  token's expanded ``scopes``; a token without an owner is the service ``service_name``.
- ``DELETE /users/{name}/server`` and ``/users/{name}/servers/{server}`` with ``{"remove": true}``:
  204, or 202 for a server set to stop slowly (it then answers 202 and shows ``pending: "stop"``
  until it has been polled ``slow_stop`` times, then stops).
- ``stop_errors``: statuses the next DELETEs of a server answer instead (a spawner whose stop
  raises: the Hub's 500), one each, in order.
- Tokens: ``Authorization: token X`` (or ``bearer X``); anything else is a 403 with the Hub's JSON
  error body. Server models carry ``state`` only for tokens with ``admin:server_state``.

Handlers cost O(page): active and inactive users are kept in sorted id lists as servers start
and stop, so a 10,000-user hub (``populate``) lists as fast as a small one.

Usage (inside a running event loop; in tests ``tests/`` is on ``sys.path``, benchmarks add it)::

    from fake_hub_api import FakeHub

    async with FakeHub() as hub:
        hub.add_user("alice", groups=["physics"])
        hub.add_server("alice", "", last_activity=..., user_options={"profile": "a100"})
        hub.add_server("alice", "gpu", slow_stop=2)
        api = HubApi(hub.api_url, hub.token)
        ...
        assert hub.counters["stops"] == 1 and hub.max_in_flight <= 10
"""

from __future__ import annotations

import asyncio
import bisect
import json
import random
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from jupyter_gpu_gov.core import clock

PAGINATION_MEDIA_TYPE = "application/jupyterhub-pagination+json"
ADMIN_SCOPES = frozenset(
    {"admin:users", "admin:servers", "admin:server_state", "admin:groups", "access:servers"}
)
# The Hub's default ``server`` role: what a single-user server's $JUPYTERHUB_API_TOKEN holds.
SERVER_ROLE_SCOPES = ("users:activity!user={user}", "access:servers!server={user}/{server}")


@dataclass
class FakeServer:
    name: str
    started: datetime
    last_activity: datetime | None
    user_options: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)  # the spawner's get_state()
    ready: bool = True
    pending: str | None = None  # "spawn" while starting, "stop" while stopping slowly
    active: bool = True  # False: a stopped named server the Hub still remembers
    slow_stop: int = 0  # polls a DELETE takes to finish (0: stops at once, 204)
    polls_left: int = 0
    remove_when_stopped: bool = False


@dataclass
class FakeUser:
    id: int
    name: str
    admin: bool = False
    groups: list[str] = field(default_factory=list)
    created: datetime = field(default_factory=clock.utcnow)
    last_activity: datetime | None = None
    servers: dict[str, FakeServer] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return any(s.active for s in self.servers.values())


class FakeHub:
    """The fake Hub: state, counters and the HTTP server.

    Parameters
    ----------
    token: the admin token (``ADMIN_SCOPES``); ``add_token`` adds others.
    page_default, page_max: ``api_page_default_limit`` and ``api_page_max_limit``.
    paginate: False behaves like a Hub before 2.0 (always the whole plain list).
    named_servers: ``allow_named_servers``.
    latency: seconds each request waits before it is answered, so that concurrent requests
        overlap and ``max_in_flight`` means something.
    """

    def __init__(
        self,
        *,
        token: str = "fake-hub-admin-token",
        page_default: int = 50,
        page_max: int = 200,
        paginate: bool = True,
        named_servers: bool = True,
        latency: float = 0.0,
        service_name: str = "gpu-gov",
    ):
        self.token = token
        self.tokens: dict[str, frozenset[str]] = {token: ADMIN_SCOPES}
        self.token_owners: dict[str, str] = {}  # a user's token -> the user's name
        self.token_ids: dict[str, str] = {}  # token -> its api id ("a1", ...)
        self.service_name = service_name
        self.page_default = page_default
        self.page_max = page_max
        self.paginate = paginate
        self.version = "6.1.0-fake"  # what GET / says
        self.sorts = True  # honours ?sort= (JupyterHub 5+; earlier ones ignore it)
        self.named_servers = named_servers
        self.latency = latency
        self.users: dict[str, FakeUser] = {}
        self.groups: dict[str, dict[str, Any]] = {}  # name -> {"users": [...], "properties"}
        self._by_id: dict[int, FakeUser] = {}
        self._ids: list[int] = []  # sorted, like the three below
        self._active_ids: list[int] = []  # sorted
        self._inactive_ids: list[int] = []  # sorted
        self._next_id = 1
        self.counters: Counter[str] = Counter()
        self.stop_errors: list[int] = []  # what the next DELETEs of a server answer instead
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._server: HTTPServer | None = None

    # --- state -------------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hub/api"

    def add_token(self, token: str, scopes: Iterable[str] = ADMIN_SCOPES) -> None:
        self.tokens[token] = frozenset(scopes)
        self.token_ids.setdefault(token, f"a{len(self.token_ids) + 1}")

    def add_user_token(
        self, user: str, token: str, server: str = "", extra_scopes: Iterable[str] = ()
    ) -> None:
        """A token owned by ``user`` (created if needed): by default a server's
        $JUPYTERHUB_API_TOKEN (``SERVER_ROLE_SCOPES``); ``extra_scopes`` adds e.g. the
        ``access:services!service=gpu-gov`` that ``c.Spawner.server_token_scopes`` grants."""
        if user not in self.users:
            self.add_user(user)
        scopes = {s.format(user=user, server=server) for s in SERVER_ROLE_SCOPES}
        scopes |= set(extra_scopes)
        if f"users:activity!user={user}" in scopes:  # its subscope, as the Hub expands it
            scopes.add(f"read:users:activity!user={user}")
        self.add_token(token, scopes)
        self.token_owners[token] = user

    def add_user(
        self,
        name: str,
        *,
        admin: bool = False,
        groups: Iterable[str] = (),
        created: datetime | None = None,
        last_activity: datetime | None = None,
    ) -> FakeUser:
        user = FakeUser(self._next_id, name, admin, list(groups), created or clock.utcnow())
        user.last_activity = last_activity
        self._next_id += 1
        self.users[name] = self._by_id[user.id] = user
        self._ids.append(user.id)  # ids only grow: still sorted
        self._inactive_ids.append(user.id)
        for group in user.groups:
            self.groups.setdefault(group, {"users": [], "properties": {}})["users"].append(name)
        return user

    def add_server(
        self,
        user: str,
        name: str = "",
        *,
        started: datetime | None = None,
        last_activity: datetime | None = None,
        user_options: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        ready: bool = True,
        slow_stop: int = 0,
    ) -> FakeServer:
        """Start a server (creating the user if needed); not ready means pending spawn."""
        u = self.users.get(user) or self.add_user(user)
        server = FakeServer(
            name,
            started or clock.utcnow(),
            last_activity,
            dict(user_options or {}),
            dict(state or {}),
            ready=ready,
            pending=None if ready else "spawn",
            slow_stop=slow_stop,
        )
        u.servers[name] = server
        # The Hub moves the user's last_activity at a spawn and with every activity posted.
        moved = last_activity or server.started
        if u.last_activity is None or moved > u.last_activity:
            u.last_activity = moved
        self._reindex(u)
        return server

    def add_group(
        self, name: str, users: Iterable[str] = (), properties: dict[str, Any] | None = None
    ) -> None:
        group = self.groups.setdefault(name, {"users": [], "properties": {}})
        group["properties"].update(properties or {})
        for user in users:
            u = self.users.get(user) or self.add_user(user)
            if name not in u.groups:
                u.groups.append(name)
                group["users"].append(user)

    def running(self, user: str, name: str = "") -> bool:
        server = self.users[user].servers.get(name) if user in self.users else None
        return bool(server and server.active)

    def populate(
        self,
        n: int,
        *,
        prefix: str = "user",
        running: float = 1.0,
        named: int = 0,
        groups: Iterable[str] = ("team-a", "team-b", "team-c"),
        idle_max_s: float = 7 * 86400,
        seed: int = 0,
    ) -> list[str]:
        """Add ``n`` users; a ``running`` fraction has a ready default server and ``named``
        ready named servers (``gpu0``, ...), with GPU-ish user_options and last activity spread
        over ``idle_max_s``. Deterministic for a ``seed``; returns the new names."""
        rng = random.Random(seed)
        teams = list(groups)
        now = clock.utcnow()
        names = []
        width = len(str(n))
        for i in range(n):
            name = f"{prefix}{i:0{width}d}"
            team = teams[i % len(teams)] if teams else None
            self.add_user(name, groups=[team] if team else ())
            names.append(name)
            if rng.random() >= running:
                continue
            for server in ["", *(f"gpu{k}" for k in range(named))]:
                idle = timedelta(seconds=rng.uniform(0, idle_max_s))
                self.add_server(
                    name,
                    server,
                    started=now - idle - timedelta(seconds=rng.uniform(0, 3600)),
                    last_activity=now - idle,
                    user_options={"profile": rng.choice(["a100", "mig-1g.10gb", "cpu"])},
                    state={"pod_name": f"jupyter-{name}{'-' + server if server else ''}"},
                )
        return names

    def _reindex(self, user: FakeUser) -> None:
        """Keep the sorted active/inactive id lists right after a server starts or stops."""
        add, drop = (
            (self._active_ids, self._inactive_ids)
            if user.active
            else (self._inactive_ids, self._active_ids)
        )
        i = bisect.bisect_left(drop, user.id)
        if i < len(drop) and drop[i] == user.id:
            del drop[i]
        i = bisect.bisect_left(add, user.id)
        if i == len(add) or add[i] != user.id:
            add.insert(i, user.id)

    def _poll(self, user: FakeUser) -> None:
        """A slow stop advances each time the Hub is asked about the user; then it stops."""
        changed = False
        for name, server in list(user.servers.items()):
            if server.pending == "stop":
                server.polls_left -= 1
                if server.polls_left <= 0:
                    self._finish_stop(user, name)
                    changed = True
        if changed:
            self._reindex(user)

    def _finish_stop(self, user: FakeUser, name: str) -> None:
        server = user.servers[name]
        server.active = server.ready = False
        user.last_activity = clock.utcnow()  # as User.stop does
        server.pending = None
        self.counters["stopped"] += 1
        # A stopped default server needs no record (a DELETE for it answers 204 either way);
        # a stopped named server stays until removed, as in the Hub's database.
        if not name or server.remove_when_stopped:
            del user.servers[name]
            if name:
                self.counters["removed"] += 1

    # --- models ------------------------------------------------------------------------------
    def server_model(self, user: FakeUser, server: FakeServer, scopes: frozenset[str]) -> dict:
        prefix = f"/user/{user.name}/" + (f"{server.name}/" if server.name else "")
        model = {
            "name": server.name,
            "display_name": server.name,
            "full_name": f"{user.name}/{server.name}",
            "last_activity": clock.isoformat(server.last_activity),
            "started": clock.isoformat(server.started),
            "pending": server.pending,
            "ready": server.ready,
            "stopped": not server.active,
            "url": prefix,
            "user_options": server.user_options,
            "progress_url": f"/hub/api/users/{user.name}/servers/{server.name}/progress",
            "full_url": None,
            "full_progress_url": None,
        }
        if "admin:server_state" in scopes:
            model["state"] = server.state
        return model

    def identify_model(self, token: str) -> dict:
        """``GET /user`` for this (valid) token."""
        scopes = self.tokens[token]
        ids = {"token_id": self.token_ids.get(token), "session_id": None}
        owner = self.token_owners.get(token)
        if owner is None:
            return {
                "kind": "service",
                "name": self.service_name,
                "admin": False,
                "roles": [],
                **ids,
                "scopes": sorted(scopes),
            }
        user = self.users[owner]
        model = {
            "kind": "user",
            "name": user.name,
            "admin": user.admin,
            "groups": list(user.groups),  # the identify scopes read:users:name and :groups
            **ids,
            "scopes": sorted(scopes),
        }
        if f"read:users:activity!user={owner}" in scopes or "admin:users" in scopes:
            model["last_activity"] = clock.isoformat(user.last_activity)
        return model

    def user_model(self, user: FakeUser, scopes: frozenset[str]) -> dict:
        default = user.servers.get("")
        return {
            "kind": "user",
            "name": user.name,
            "admin": user.admin,
            "roles": ["admin" if user.admin else "user"],
            "groups": list(user.groups),
            "server": f"/user/{user.name}/" if default and default.active else None,
            "pending": default.pending if default else None,
            "created": clock.isoformat(user.created),
            "last_activity": clock.isoformat(user.last_activity),
            "auth_state": None,
            "servers": {
                name: self.server_model(user, s, scopes)
                for name, s in user.servers.items()
                if s.active
            },
        }

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Listen on a random port of 127.0.0.1 (call from within the event loop)."""
        sockets = bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
        self.port = sockets[0].getsockname()[1]
        app = web.Application(
            [
                (r"/hub/api/?", _RootHandler),
                (r"/hub/api/user", _SelfHandler),
                (r"/hub/api/users", _UserListHandler),
                (r"/hub/api/users/([^/]+)", _UserHandler),
                (r"/hub/api/users/([^/]+)/server", _ServerHandler),
                (r"/hub/api/users/([^/]+)/servers/([^/]*)", _ServerHandler),
                (r"/hub/api/groups", _GroupListHandler),
                (r".*", _NotFoundHandler),
            ],
            fake_hub=self,
        )
        self._server = HTTPServer(app)
        self._server.add_sockets(sockets)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def __aenter__(self) -> FakeHub:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()


class _Handler(web.RequestHandler):
    """Token check, counters, optional latency and the Hub's JSON errors."""

    hub: FakeHub
    route = ""  # the counters' name for it, e.g. counters["GET /users"]
    required_scope: str | None = "admin:users"  # None: any valid token
    scopes: frozenset[str] = frozenset()
    accepts_pagination = False
    _counted = False  # in_flight was raised for this request

    def initialize(self) -> None:
        self.hub = self.settings["fake_hub"]

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")

    async def prepare(self) -> None:
        hub = self.hub
        hub.counters["requests"] += 1
        hub.counters[f"{self.request.method} {self.route}"] += 1
        hub.in_flight += 1
        hub.max_in_flight = max(hub.max_in_flight, hub.in_flight)
        self._counted = True
        if hub.latency:
            await asyncio.sleep(hub.latency)
        kind, _, token = self.request.headers.get("Authorization", "").partition(" ")
        scopes = hub.tokens.get(token.strip()) if kind.lower() in ("token", "bearer") else None
        if scopes is None or (self.required_scope and self.required_scope not in scopes):
            hub.counters["forbidden"] += 1
            if self.required_scope is None:
                raise web.HTTPError(403)  # the Hub's SelfAPIHandler: no user, no message
            raise web.HTTPError(
                403,
                "Action is not authorized with current scopes;"
                f" requires any of [{self.required_scope}]",
            )
        self.scopes = scopes

    def on_finish(self) -> None:
        if self._counted:
            self.hub.in_flight -= 1

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.finish(json.dumps({"status": status_code, "message": message}))

    def find_user(self, name: str) -> FakeUser:
        user = self.hub.users.get(name)
        if user is None:
            raise web.HTTPError(404)
        return user

    def page_args(self) -> tuple[int, int]:
        accepts = {s.strip().lower() for s in self.request.headers.get("Accept", "").split(",")}
        self.accepts_pagination = PAGINATION_MEDIA_TYPE in accepts
        default = self.hub.page_default if self.accepts_pagination else self.hub.page_max
        try:
            offset = abs(int(self.get_argument("offset", "0")))
            limit = abs(int(self.get_argument("limit", str(default))))
        except ValueError:
            raise web.HTTPError(
                400, "Invalid argument type, offset and limit must be integers"
            ) from None
        return offset, min(max(limit, 1), self.hub.page_max)

    def write_list(self, items: list[Any], offset: int, limit: int, total: int) -> None:
        if not (self.hub.paginate and self.accepts_pagination):
            self.finish(json.dumps(items))
            return
        nxt = None
        if offset + limit < total:
            url = urlparse(self.request.full_url())
            query = parse_qs(url.query, keep_blank_values=True)
            query["offset"], query["limit"] = [str(offset + limit)], [str(limit)]
            nxt = {
                "offset": offset + limit,
                "limit": limit,
                "url": urlunparse(url._replace(query=urlencode(query, doseq=True))),
            }
        pagination = {"offset": offset, "limit": limit, "total": total, "next": nxt}
        self.finish(json.dumps({"items": items, "_pagination": pagination}))


class _RootHandler(_Handler):
    async def prepare(self) -> None:  # the version endpoint needs no token
        self.hub.counters["requests"] += 1

    def get(self) -> None:
        self.finish(json.dumps({"version": self.hub.version}))


class _NotFoundHandler(_Handler):
    async def prepare(self) -> None:
        raise web.HTTPError(404)


class _SelfHandler(_Handler):
    route = "/user"
    required_scope = None  # every token may identify itself

    def get(self) -> None:
        token = self.request.headers["Authorization"].partition(" ")[2].strip()
        self.finish(json.dumps(self.hub.identify_model(token)))


class _UserListHandler(_Handler):
    route = "/users"

    def get(self) -> None:
        hub = self.hub
        state = self.get_argument("state", None)
        offset, limit = self.page_args()
        if not hub.paginate:  # before 2.0: no pagination at all
            offset, limit = 0, len(hub.users) or 1
        if state in ("active", "ready"):
            ids = hub._active_ids
        elif state == "inactive":
            ids = hub._inactive_ids
        elif state:
            raise web.HTTPError(400, f"Unrecognized state filter: {state!r}")
        else:
            ids = hub._ids
        sort = self.get_argument("sort", "id")
        if sort.lstrip("-") not in ("id", "name", "last_activity"):
            raise web.HTTPError(400, f"sort must be 'id', 'name', or 'last_activity', not {sort!r}")
        if not hub.sorts:
            pass
        elif sort.lstrip("-") != "id":  # the Hub's order: NULLs first ascending, last descending
            field = sort.lstrip("-")
            desc = sort.startswith("-")
            values = {uid: getattr(hub._by_id[uid], field) for uid in ids}
            present = sorted((u for u in ids if values[u] is not None), key=values.__getitem__)
            absent = [u for u in ids if values[u] is None]
            ids = present[::-1] + absent if desc else absent + present
        elif sort == "-id":
            ids = ids[::-1]
        items = []
        for uid in ids[offset : offset + limit]:
            user = hub._by_id[uid]
            hub._poll(user)
            if state == "ready" and not any(s.ready for s in user.servers.values()):
                continue  # applied after slicing, as the Hub does
            items.append(hub.user_model(user, self.scopes))
        self.write_list(items, offset, limit, len(ids))


class _UserHandler(_Handler):
    route = "/users/{name}"

    def get(self, name: str) -> None:
        user = self.find_user(name)
        self.hub._poll(user)
        self.finish(json.dumps(self.hub.user_model(user, self.scopes)))

    def delete(self, name: str) -> None:
        hub = self.hub
        user = self.find_user(name)
        if any(s.pending == "stop" for s in user.servers.values()):
            raise web.HTTPError(400, f"{name}'s server is in the process of stopping, please wait.")
        del hub.users[name], hub._by_id[user.id]
        for ids in (hub._ids, hub._active_ids, hub._inactive_ids):
            i = bisect.bisect_left(ids, user.id)
            if i < len(ids) and ids[i] == user.id:
                del ids[i]
        for group in user.groups:
            hub.groups[group]["users"].remove(name)
        hub.counters["users_deleted"] += 1
        self.set_status(204)
        self.finish()


class _ServerHandler(_Handler):
    route = "/users/{name}/server(s)"
    required_scope = "admin:servers"

    def delete(self, name: str, server_name: str = "") -> None:
        hub = self.hub
        user = self.find_user(name)
        if hub.stop_errors:
            raise web.HTTPError(hub.stop_errors.pop(0), "the spawner failed to stop the server")
        body = json.loads(self.request.body or b"null") or {}
        remove = bool(body.get("remove"))
        if server_name:
            if not hub.named_servers:
                raise web.HTTPError(400, "Named servers are not enabled.")
            if server_name not in user.servers:
                raise web.HTTPError(404, f"{name} has no server named '{server_name}'")
        elif remove:
            raise web.HTTPError(400, "Cannot delete the default server")
        server = user.servers.get(server_name)
        self.set_status(204)
        if server is None or not server.active:  # a stopped server: nothing to stop
            if server is not None and remove:
                del user.servers[server_name]
                hub.counters["removed"] += 1
            self.finish()
            return
        server.remove_when_stopped |= remove
        if server.pending == "stop":
            hub._poll(user)  # asking again is a poll too
        else:
            hub.counters["stops"] += 1
            if server.slow_stop:
                server.pending, server.ready = "stop", False
                server.polls_left = server.slow_stop
                hub.counters["slow_stops"] += 1
            else:
                hub._finish_stop(user, server_name)
                hub._reindex(user)
        if server.pending == "stop":
            self.set_status(202)
        self.finish()


class _GroupListHandler(_Handler):
    route = "/groups"
    required_scope = "admin:groups"

    def get(self) -> None:
        offset, limit = self.page_args()
        names = list(self.hub.groups)
        if not self.hub.paginate:
            offset, limit = 0, len(names) or 1
        items = [
            {
                "kind": "group",
                "name": name,
                "roles": [],
                "users": list(self.hub.groups[name]["users"]),
                "properties": self.hub.groups[name]["properties"],
            }
            for name in names[offset : offset + limit]
        ]
        self.write_list(items, offset, limit, len(names))
