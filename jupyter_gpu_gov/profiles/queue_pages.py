"""The spawn queue in the hub: joining and leaving the line, the owner's page, and the
governor's sync. Served by the hub process (``add_gpu_profiles`` adds the routes), where
admission and the waiting requests (spawner state) live.

- ``POST /hub/gpu-gov/queue/join/<user>[/<server>]`` (the spawn form's "Wait in line", the owner's
  session): the form's choices join the line; a request admission lets in now goes back to the
  spawn page instead.
- ``GET /hub/gpu-gov/queue``: the owner's waiting servers with their place, estimated wait and
  what would start them sooner, and a Cancel button (an admin sees everyone's, with the wait so
  far); ``POST /hub/gpu-gov/queue/cancel/<user>[/<server>]`` leaves the line.
- ``GET /hub/api/gpu-gov/queue`` (``admin:server_state``: Hub admins, the governor): the line
  as JSON.
- ``POST /hub/api/gpu-gov/queue`` (the governor's sync, with ``custom:gpu-gov:queue``): it sends
  when it expects the servers holding GPUs to release them (``core.queue.releases_to_json``);
  the hub gives back expired requests and those that can no longer
  start (``_give_back_unstartable``), and answers the line (ready ones first to start, each
  with what holds it back: ``limit``), the requests that left it since the last sync, and how
  many servers it refused for want of a free GPU within ``core.queue.REFUSED_WITHIN`` that did
  not join the line or start since (``refused``: ``queue.Refusals``), and the reclaims it
  lifted (``reclaims_withdrawn``: asked for a spawn that left the line, needed by none still
  waiting: ``_withdraw_reclaims``); on a cluster's hub, where waiting spawns could go now
  (``room``: ``_room``). The governor then starts
  the ready ones through the Hub's REST API, with the choices recorded; the spawner decides
  again from a fresh count.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers import BaseHandler
from jupyterhub.utils import maybe_future
from tornado import web

from ..core import browser_json, clock
from ..core.durations import format_duration
from ..core.queue import (
    CANCELLED,
    EXPIRED,
    QUEUE_SCOPE,
    QueueFormatError,
    ordinal,
    releases_from_json,
    room_for_from_json,
)
from ..core.text import escaped
from . import form
from .config import GpuProfiles
from .left_pods import due
from .local import LocalGpuMixin, LocalGpus
from .queue import FORECAST, REFUSED, starts_when
from .spawner import (
    GOVERNOR_HEARD_WITHIN,
    GpuRefused,
    reclaim_askers,
    waiting_requests,
    withdraw_reclaims,
)

MAX_SYNC_BODY = 8 * 1024 * 1024
log = logging.getLogger("jupyter_gpu_gov.profiles")


def _spawner(handler: BaseHandler, request):
    """The spawner of a waiting request (None: its user is gone)."""
    owner = handler.find_user(request.user)
    return None if owner is None else owner.get_spawner(request.name)


async def _line(handler: BaseHandler, now, sooner_for=None) -> list:
    """The line now, as admission sees it (through a waiting server's spawner: the count and
    the waiting requests are the hub's, the devices read as admission reads them: bounded,
    off the event loop); ``sooner_for``: ``gpu_line``'s."""
    queued = waiting_requests(handler.db)
    spawner = next(filter(None, (_spawner(handler, q) for q in queued)), None)
    if spawner is None:
        return []
    await spawner.gpu_refresh()
    queued = waiting_requests(handler.db)  # as it is after the wait
    return spawner.gpu_line(queued, now, sooner_for)


def places(user) -> dict[str, dict[str, str]]:
    """The viewer's own servers waiting in line (server key ``user/name`` → their place in
    words), for JupyterHub's pages: ``c.JupyterHub.template_vars["gpu_gov_waiting"]``, called
    with the viewer at each page (one query when none of theirs waits). Keyed by owner too: an
    admin's page about another user's server must not show the admin's own place."""
    if user is None:
        return {}
    try:
        return _places(user)
    except Exception:  # a notice never breaks a Hub page
        log.exception("gpu-gov: the places in line of %s", escaped(user.name))
        return {}


def _places(user) -> dict[str, dict[str, str]]:
    queued = waiting_requests(user.db)
    mine = [q for q in queued if q.user == user.name]
    if not mine:
        return {}
    now = clock.utcnow()
    spawner = user.spawners[mine[0].name]
    tiers = spawner.gpu_profiles.tier_map
    # The last reading of the cards, not read again here (a page must not wait on the driver):
    # while it is unknown or stale nothing is free, and the page says so, not an estimate.
    unknown = spawner.gpu_unknown() is not None
    found = {}
    for waiting in spawner.gpu_line(queued, now, lambda q: q.user == user.name):
        request = waiting.request
        if request.user != user.name:
            continue
        tier = tiers.get(request.tier)
        if unknown:
            estimate = "GPU state unknown now (the cards have not been read lately)"
        else:
            estimate = "starting now" if waiting.ready else waiting.estimate
        found[request.server] = {
            "name": request.name,
            "tier": tier.display_name if tier else request.tier,
            "position": ordinal(waiting.position),
            "estimate": estimate,
            "sooner": waiting.sooner[0] if waiting.sooner and not unknown else "",
            "starts": starts_when(waiting.limit),
            "cancel": "gpu-gov/queue/cancel/" + form.server_path(request.user, request.name),
        }
    return found


def _give_back_expired(handler: BaseHandler, now) -> None:
    """Take expired requests out of their spawners' state, counted as expired."""
    for request in waiting_requests(handler.db):
        if request.live(now):
            continue
        spawner = _spawner(handler, request)
        if spawner is not None and spawner.gpu_cancel(EXPIRED):
            FORECAST.left.append(request.left(EXPIRED, now))


async def _give_back_unstartable(handler: BaseHandler, now) -> None:
    """Take out of the line the requests that can no longer start (their owner left the team,
    the tier was removed, the quota lowered below them: ``gpu_unstartable``), counted as
    cancelled: admission would let such a request in and its start be refused, each pass,
    while everyone behind it on the tier waited until it expired."""
    for request in waiting_requests(handler.db):
        spawner = _spawner(handler, request)
        if spawner is None or not request.live(now):
            continue
        waiting = spawner.gpu_queued
        try:
            why = await spawner.gpu_unstartable()
        except Exception:  # one user's teams unreadable (auth state) never stops the sync
            log.exception("gpu-gov: whether %s can still start", escaped(request.server))
            continue
        # Unless it changed meanwhile (started, cancelled, asked again).
        if why is not None and spawner.gpu_queued is waiting and spawner.gpu_cancel(CANCELLED):
            log.warning(
                "gpu-gov: %s left the line: it can no longer start: %s",
                escaped(request.server),
                escaped(why),
            )
            FORECAST.left.append(request.left(CANCELLED, now, f"it can no longer start: {why}"))


async def _cards(handler: BaseHandler) -> list[str]:
    """The physical cards a workstation hub hands out (``LocalGpus``' read, bounded; faulty
    cards left out): the governor counts one no running server is pinned on as free in its
    fragmentation figure, where no DCGM sees it. Empty on a cluster's hub (no per-card record
    there: its capacity is counted per tier) and while the cards cannot be read."""
    spawner_class = handler.settings.get("spawner_class")
    if not (isinstance(spawner_class, type) and issubclass(spawner_class, LocalGpuMixin)):
        return []
    gpus = LocalGpus.instance(config=handler.settings.get("config"))
    await gpus.read()
    devices = gpus.devices() or []
    return sorted({d.parent_uuid or d.uuid for d in devices})


async def _room(handler: BaseHandler, now, pending: list[str] | None = None) -> dict | None:
    """Where a spawn waiting for a GPU could go now, on a cluster's hub: the reading of nodes
    and pods admission counts on (``ClusterGpus.room``, read again when due while a spawn
    waits, through one of the hub's spawners), with the tiers the spawns counted in ``refused`` asked for. The governor's
    fragmentation figure tells spawns blocked by free cards split across nodes from those
    blocked by a shortage, where no DCGM sees the cards, and those a node the autoscaler may
    add would take (``GpuProfiles.node_pool_max``). Only the tiers spawns wait for are said:
    those waiting in line, refused, and ``pending`` (the tiers of the spawns the governor saw
    the Hub starting: the sync's ``room_for``; None, from a governor that does not send it:
    every tier). None on a workstation's hub (its cards are named in ``cards``)."""
    spawner_class = handler.settings.get("spawner_class")
    if not (isinstance(spawner_class, type) and hasattr(spawner_class, "gpu_cluster")):
        return None
    refused = REFUSED.tiers(now)
    spawner = _a_spawner(handler)
    if spawner is None:  # no spawner made since the hub started: none to read through
        found = {"unknown": "the hub has not read the cluster's nodes yet", "nodes": {}}
    else:
        conf, wanted = spawner.gpu_profiles, None
        if pending is not None:
            queued = (q.tier for q in waiting_requests(handler.db) if q.live(now))
            wanted = {*pending, *queued, *refused} & set(conf.tier_map)
        # Read (when due) only for spawns that wait: with none, the room is empty and known,
        # and a sync must not list every node and pod of the cluster on the hub's loop each
        # 30 s (admission reads for itself, when it counts).
        if wanted is None or wanted:
            await spawner.gpu_refresh()
        found = spawner.gpu_cluster.room(conf.tier_map, spawner, wanted, conf.node_pools)
    return {**found, "refused": refused}


def _a_spawner(handler: BaseHandler):
    """A spawner of the hub's to read the cluster through (its API client, namespace and
    configured scheduling are the hub's): a waiting request's, else any one made already."""
    for request in waiting_requests(handler.db):
        spawner = _spawner(handler, request)
        if spawner is not None:
            return spawner
    for user in list((getattr(handler, "users", None) or {}).values()):
        for spawner in list(user.spawners.values()):
            if hasattr(spawner, "gpu_cluster"):
                return spawner
    return None


async def _withdraw_reclaims(handler: BaseHandler, now) -> list[dict[str, str]]:
    """Lift the reclaims asked for spawns that left the line (``withdraw_reclaims``), unless
    a spawn still waiting needs the card: the servers each waiting request's admission asks
    back now (one count read for all: ``_line``'s), and the waiting servers themselves. The
    admissions are worked out only when a reclaim's asker has left the line (most syncs: none
    to lift, and a long line costs an admission per request)."""
    queued = [q for q in waiting_requests(handler.db) if q.live(now)]
    needed = {q.server for q in queued}
    if reclaim_askers(handler.db) <= needed:
        return []
    read = False
    for request in queued:
        spawner = _spawner(handler, request)
        tier = spawner and spawner.gpu_profiles.tier_map.get(request.tier)
        if tier is None:
            continue
        if not read:
            await spawner.gpu_refresh()
            read = True
        needed.update(g.server for g in spawner._gpu_admission(tier, request.team).reclaim)
    lifted = withdraw_reclaims(handler.db, handler.users, needed)
    for each in lifted:
        log.info(
            "gpu-gov: the reclaim of %s for team %s is withdrawn: %s left the line",
            escaped(each["server"]),
            escaped(each["team"]),
            escaped(each["by"]),
        )
    return lifted


async def _owner_spawner(handler: BaseHandler, user_name: str, server_name: str, new: bool):
    """The spawner of ``user_name``'s server, for its owner or an admin. ``new``: joining the
    line may name a server that does not exist yet, under JupyterHub's own rules for a new
    named server (its name, ``named_server_limit_per_user``), as its spawn page and REST API
    apply them: every name asked for makes a spawner row that stays (JupyterHub 6's
    ``get_spawner`` makes none: a new name failed with a 500)."""
    user = handler.find_user(user_name)
    me = handler.current_user
    if user is None or (user.name != me.name and not me.admin):
        raise web.HTTPError(404, f"No server {user_name}/{server_name} of yours")
    if server_name and not handler.allow_named_servers:
        raise web.HTTPError(404, "Named servers are not enabled on this hub")
    if server_name and server_name not in user.orm_spawners:
        if not new:
            raise web.HTTPError(404, f"No server {user_name}/{server_name} of yours")
        check = getattr(handler, "_check_named_server_request", None)  # newer JupyterHubs
        if check is not None:
            await check(user, server_name, server_name)  # its display name, as JupyterHub's
        else:
            limit = handler.named_server_limit_per_user
            limit = await maybe_future(limit(handler)) if callable(limit) else limit
            if limit and len(set(user.orm_spawners) - {""}) >= limit:
                raise web.HTTPError(400, f"You already have the maximum of {limit} named servers")
        create = getattr(user, "get_or_create_spawner", None)  # JupyterHub 6
        if create is not None:
            return user, create(server_name, server_name, replace_failed=True)
    return user, user.get_spawner(server_name, replace_failed=True)


class QueueJoinHandler(BaseHandler):
    @web.authenticated
    async def post(self, user_name: str, server_name: str = ""):
        user, spawner = await _owner_spawner(self, user_name, server_name or "", new=True)
        if spawner.active:
            raise web.HTTPError(409, "This server is running or starting already")
        data = {k: self.get_body_arguments(k) for k in self.request.body_arguments}
        try:
            admission = await spawner.gpu_enqueue(form.parse(data))
        except (form.FormError, GpuRefused) as error:
            message = getattr(error, "jupyterhub_message", None) or str(error)
            self.set_status(403)
            self.finish(_page("Cannot wait in line", f"<p class='refused'>{_e(message)}</p>", self))
            return
        if admission.allowed:  # freed meanwhile: start it from the spawn page
            self.redirect(self.hub.base_url + "spawn/" + form.server_path(user.name, server_name))
            return
        self.redirect(self.hub.base_url + "gpu-gov/queue")


class QueueCancelHandler(BaseHandler):
    @web.authenticated
    async def post(self, user_name: str, server_name: str = ""):
        _, spawner = await _owner_spawner(self, user_name, server_name or "", new=False)
        request = spawner.gpu_queued
        now = clock.utcnow()
        if request is not None and spawner.gpu_cancel(CANCELLED):
            FORECAST.left.append(request.left(CANCELLED, now))
        # Back to the Hub page it was cancelled from (the home page), never off the Hub; nor to
        # one holding a line break or a tab (the form's field is the user's to edit): tornado
        # refuses it in a Location header, and the cancel, done, answered a 500.
        back = self.get_body_argument("next", "")
        if not (
            back.startswith(self.hub.base_url)
            and "//" not in back
            and "\\" not in back
            and back.isprintable()
        ):
            back = self.hub.base_url + "gpu-gov/queue"
        self.redirect(back)


class QueuePageHandler(BaseHandler):
    @web.authenticated
    async def get(self):
        now = clock.utcnow()
        me = self.current_user

        def shown(request) -> bool:  # the viewer's own; an admin sees everyone's
            return me.admin or request.user == me.name

        order = [w for w in await _line(self, now, shown) if shown(w.request)]
        if not order:
            body = "<p class='empty'>No server of yours waits in line.</p>"
        else:
            rows = "".join(_row(self, w, now, me.admin) for w in order)
            who = "<th>Who</th><th>Team</th>" if me.admin else ""
            body = (
                f"<table class='table'><tr>{who}<th>Server</th><th>GPU</th><th>Place</th>"
                "<th>Estimated wait</th><th>Waiting for</th><th>Sooner</th><th></th></tr>"
                f"{rows}</table>"
            )
        if not FORECAST.heard_since(now - GOVERNOR_HEARD_WITHIN):
            body += (
                "<p class='alert alert-warning'>The GPU governor, which starts waiting servers, "
                "has not been heard from lately: waiting servers start when it is back.</p>"
            )
        self.finish(_page("Waiting in line for a GPU", body, self))


def _row(handler: BaseHandler, waiting, now, admin: bool) -> str:
    request = waiting.request
    tier = GpuProfiles.instance(config=handler.config).tier_map.get(request.tier)
    path = form.server_path(request.user, request.name)
    cancel = (
        f"<form method='post' action='{handler.hub.base_url}gpu-gov/queue/cancel/{path}"
        f"?_xsrf={_e(handler.xsrf_token.decode())}'><button class='btn btn-secondary btn-sm' "
        "type='submit'>Cancel</button></form>"
    )
    # Names from outside (a user's, a team's, an admin's tier names) each a bidi isolate.
    who = f"<td>{_bdi(request.user)}</td><td>{_bdi(request.team)}</td>" if admin else ""
    return (
        f"<tr class='waiting' data-server='{_e(request.server)}'>{who}"
        f"<td>{_bdi(request.name) if request.name else 'default'}</td>"
        f"<td>{_bdi(tier.display_name if tier else request.tier)}</td>"
        f"<td class='position'>{waiting.position}</td>"
        f"<td class='estimate'>{_e('starting now' if waiting.ready else waiting.estimate)}</td>"
        f"<td>{_e(format_duration(now - request.queued_at))}</td>"
        f"<td>{', '.join(map(_bdi, waiting.sooner))}</td><td>{cancel}</td></tr>"
    )


def _page(title: str, body: str, handler: BaseHandler) -> str:
    home = handler.hub.base_url + "home"
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><link rel='stylesheet' href="
        f"'{handler.hub.base_url}static/css/style.min.css'></head><body><div class='container'>"
        f"<h1>{_e(title)}</h1>{body}<p><a href='{home}'>Home</a></p></div></body></html>"
    )


def _e(text: Any) -> str:
    return web.escape.xhtml_escape(str(text))


def _bdi(name: Any) -> str:
    """A name from outside, escaped, as its own bidi isolate: a bidi control in it (U+202E)
    reorders it alone, never the cells and words around it."""
    return f"<bdi>{_e(name)}</bdi>"


class QueueApiHandler(APIHandler):
    """The line as JSON, for admins and the governor (GET), and the governor's sync (POST)."""

    def _check(self) -> None:
        # The line is kept in spawner state: who may read every server's state may read it.
        if not {QUEUE_SCOPE, "admin:server_state"} & set(self.expanded_scopes):
            raise web.HTTPError(403, f"Needs the {QUEUE_SCOPE} or admin:server_state scope")

    @web.authenticated
    async def get(self):
        self._check()
        now = clock.utcnow()
        self.finish(browser_json.dumps({"line": [w.to_json() for w in await _line(self, now)]}))

    @web.authenticated
    async def post(self):
        self._check()
        if len(self.request.body) > MAX_SYNC_BODY:
            raise web.HTTPError(413, "The sync body is too large")
        try:
            body = json.loads(self.request.body or b"{}")
            releases = releases_from_json(body.get("releases", {}) if isinstance(body, dict) else 0)
            pending = room_for_from_json(body.get("room_for"))
        except (ValueError, QueueFormatError) as error:
            raise web.HTTPError(
                400, f"A sync needs {{'releases': {{server: ...}}}}: {error}"
            ) from None
        except RecursionError:  # json's parser recurses: deep nesting is no sync, not a 500
            raise web.HTTPError(
                400, "A sync needs {'releases': {server: ...}}: the body is nested too deeply"
            ) from None
        now = clock.utcnow()
        FORECAST.releases, FORECAST.at = releases, now
        _give_back_expired(self, now)
        await _give_back_unstartable(self, now)
        withdrawn = await _withdraw_reclaims(self, now)
        left, FORECAST.left[:] = list(FORECAST.left), []
        # The governor reads no "sooner" (it is for the owner's pages): not worked out here.
        line = [w.to_json() for w in await _line(self, now, lambda q: False)]
        refused = REFUSED.count(now)
        try:  # pods stopped servers left running: the governor audits, then asks to delete
            left_pods = await due(self, now)
        except Exception:  # never the line's sync
            log.exception("gpu-gov: finding the pods stopped servers left running")
            left_pods = []
        try:
            room = await _room(self, now, pending)
        except Exception:  # never the line's sync: the governor says the cluster is unknown
            log.exception("gpu-gov: reading where waiting spawns could go")
            room = {"unknown": "the hub failed to read the cluster (see its log)", "nodes": {}}
        answer = {
            "room": room,
            "cards": await _cards(self),
            "line": line,
            "left": left,
            "refused": refused,
            "left_pods": left_pods,
            "reclaims_withdrawn": withdrawn,
        }
        self.finish(browser_json.dumps(answer))
