"""Wiring the governor into a ``jupyterhub_config.py`` in one call::

    from jupyter_gpu_gov.hub.hubconfig import add_governor

    add_governor(c, args=["--config=/etc/jupyterhub/gpu_gov_config.py"], admin_users=["alice"])

It registers the managed service with least-privilege roles, defines the governor's admin scope
and its showback scope (a role the admin writes gives it to team leads and finance),
lets users (and their servers' tokens) talk to the service about their own servers, tells
single-user servers where to report, and refuses a spawn whose ``user_options`` are too large
to keep (cut where the Hub saves them, before any hook of the spawn; refused by a
``pre_spawn_hook`` that runs the admin's own after it). What it adds holds whatever the file
sets after the call: the Hub's whole configuration gets it again once read.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

from tornado import web
from traitlets.config import Config, LazyConfigValue

from ..core.config_order import listed, updated
from ..core.grant import oversized
from ..core.queue import QUEUE_SCOPE
from ..core.text import escaped
from ..hub_process import again_on_the_whole_config, bound_where_stored, cut_where_stored

ADMIN_SCOPE = "custom:gpu-gov:admin"
# Reading showback (the usage API, its CSV and JSON, the showback page) without being an admin:
# a Hub admin gives it to a role, unfiltered for finance, ``!group=<team's group>`` for a lead.
SHOWBACK_SCOPE = "custom:gpu-gov:showback"
# The Hub's activity interval, in seconds, as ``add_governor`` passes it to the service.
ACTIVITY_INTERVAL_ENV = "JUPYTER_GPU_GOV_HUB_ACTIVITY_INTERVAL"
# The profile layer's guarantees, as ``add_governor(team_quotas=...)`` passes them (JSON).
TEAM_QUOTAS_ENV = "JUPYTER_GPU_GOV_TEAM_QUOTAS"
SERVICE_SCOPES = [
    "list:users",
    "read:users",  # names, admin flag, groups, last activity
    "read:servers",  # server URLs, start times, user_options
    "delete:servers",  # culls
    # No access:servers: the governor never calls a user's server (hub/outbound.py); what it
    # asks of one (a checkpoint, a kernel shutdown) rides back on the server's own report.
    "list:groups",
    "read:groups",  # team properties of groups
    # KubeSpawner's state names a server's pod: DCGM then governs servers without the
    # extension (the Hub's REST API only reads state; it has no call that writes it).
    "admin:server_state",
]
# The spawn queue (with the profile layer): the governor reads the line and starts a waiting
# server when admission lets it in, on its owner's behalf, through the Hub. (Its custom scope
# exists once ``add_governor`` defines it.)
QUEUE_SERVICE_SCOPES = [QUEUE_SCOPE, "servers"]


def add_governor(
    c,
    *,
    name: str = "gpu-gov",
    url: str = "http://127.0.0.1:10101",
    args: Iterable[str] = (),
    environment: Mapping[str, str] | None = None,
    admin_users: Iterable[str] = (),
    admin_groups: Iterable[str] = (),
    cull_users: bool = False,
    python: str = sys.executable,
    tiers: Sequence[Mapping] = (),
    team_quotas: Mapping[str, float] | None = None,
) -> None:
    """Add the governor to JupyterHub config ``c``, anywhere in ``jupyterhub_config.py``: it
    adds to the services, roles, the spawners' environment, token scopes and ``pre_spawn_hook``
    (its guard of ``user_options`` runs first, then the admin's hook; the oversized ones are
    cut already, where the Hub saved them: ``hub_process.bound_where_stored``) and
    passes the Hub's activity interval on, as ``c`` has them now and again once the Hub has
    read the whole file (a line after the call that sets one of them replaced what it added,
    before).
    ``tiers``: what a server of each tier gets, for right-sizing hints
    (``profiles.estimate.tier_sizes(c.GpuProfiles.tiers)``; this module does not import the
    profile layer). ``team_quotas``: GPU-equivalents each team is guaranteed, for My GPU usage
    (``profiles.hubconfig.team_guarantees(c)``: the profile layer's quotas)."""
    environment = dict(environment or {})
    if tiers:
        environment.setdefault("JUPYTER_GPU_GOV_TIERS", json.dumps(list(tiers)))
    if team_quotas:
        environment.setdefault(TEAM_QUOTAS_ENV, json.dumps(dict(team_quotas)))
    service = {
        "name": name,
        "url": url,
        "command": [python, "-m", "jupyter_gpu_gov.hub", *args],
        "environment": environment,
        "oauth_no_confirm": True,
        # What the dashboard's login may carry: the governor's admin scope, and admin-ui,
        # which only Hub admins hold (it grants nothing else through this token); the
        # showback scope, with the filters the user holds it with (the Hub intersects).
        "oauth_client_allowed_scopes": [ADMIN_SCOPE, "admin-ui", SHOWBACK_SCOPE],
    }
    access = f"access:services!service={name}"
    service_scopes = SERVICE_SCOPES + QUEUE_SERVICE_SCOPES + (["admin:users"] if cull_users else [])
    roles = [
        {"name": f"{name}-service", "services": [name], "scopes": service_scopes},
        {
            "name": f"{name}-admins",
            "users": list(admin_users),
            "groups": list(admin_groups),
            "scopes": [ADMIN_SCOPE, access],
        },
    ]

    def add(config) -> None:
        # Idempotent: run on ``c`` now, and again on the Hub's whole configuration.
        _add_service(config, service, own_interval=ACTIVITY_INTERVAL_ENV in environment)
        config.JupyterHub.custom_scopes.update(
            {
                ADMIN_SCOPE: {
                    "description": "Administer the GPU governor: list every server, extend, "
                    "approve, exempt and cull, read the audit trail and metrics.",
                },
                SHOWBACK_SCOPE: {
                    "description": "Read the GPU governor's showback (usage, its CSV and JSON, "
                    "the showback page): filtered !group=<group>, that group's team only.",
                },
                QUEUE_SCOPE: {
                    "description": "Read the GPU spawn queue and tell the hub when GPUs free up "
                    "(the governor's sync).",
                },
            }
        )
        _add_roles(config, roles)
        # Every user may talk to the governor about their own servers.
        _add_user_scope(config, access)
        # A server's own token reports for it; it holds no admin scope, whoever owns it.
        _add_server_token_scopes(config, ["users:activity!user", "access:servers!server", access])
        _update_spawners(
            config, "environment", {"JUPYTER_GPU_GOV_URL": f"{url.rstrip('/')}/services/{name}/"}
        )
        for section in _spawner_sections(config, "pre_spawn_hook"):
            hook = config[section].get("pre_spawn_hook")
            config[section].pre_spawn_hook = bounded_user_options(hook)

    bound_where_stored()

    add(c)
    again_on_the_whole_config(add)


def _add_service(c, service: dict, own_interval: bool) -> None:
    """The governor's entry in ``c.JupyterHub.services`` (once, by name), passing the Hub's
    activity interval as ``c`` configures it now (not when ``environment`` names one)."""
    services = c.JupyterHub.services
    mine = next(
        (s for s in listed(services) if isinstance(s, dict) and s.get("name") == service["name"]),
        None,
    )
    if mine is None:
        mine = dict(service, environment=dict(service["environment"]))
        services.append(mine)
    if not own_interval:
        interval = activity_interval(c)
        environment = mine.setdefault("environment", {})
        if interval is not None:
            environment[ACTIVITY_INTERVAL_ENV] = f"{interval:g}"
        else:  # not known: no warning is judged unread for want of it
            environment.pop(ACTIVITY_INTERVAL_ENV, None)


def _add_roles(c, roles: list[dict]) -> None:
    """Add ``roles`` to ``c.JupyterHub.load_roles``, those not there by name already."""
    kept = c.JupyterHub.load_roles
    names = {r.get("name") for r in listed(kept) if isinstance(r, dict)}
    kept.extend([r for r in roles if r["name"] not in names])


def activity_interval(c) -> float | None:
    """The longest interval, in seconds, at which the Hub's activity of a server is brought up
    to date as ``c`` configures it: the proxy's, gathered every ``last_activity_interval``,
    and the servers' posts, every ``JUPYTERHUB_ACTIVITY_INTERVAL`` of the spawners'
    environment (JupyterHub's default, 300 s, each), or ``activity_resolution`` when longer
    (30 s: the Hub ignores an activity less than that newer than the one it has; the lag, twice
    the longest, covers both). None when one cannot be read (a callable environment value, a
    number that is not one): the governor then takes it as not known."""
    found = [
        c.JupyterHub.get("last_activity_interval", 300),
        c.JupyterHub.get("activity_resolution", 30),
    ]
    for section in _spawner_sections(c, "environment"):
        env = c[section].get("environment")
        if isinstance(env, dict) and "JUPYTERHUB_ACTIVITY_INTERVAL" in env:
            found.append(env["JUPYTERHUB_ACTIVITY_INTERVAL"])
    try:
        seconds = max(float(value) for value in found)
    except (TypeError, ValueError):
        return None
    return seconds if 0 < seconds < 86_400 * 365 else None


class ChoicesRefused(web.HTTPError):
    """A spawn whose ``user_options`` are too large to keep; JupyterHub shows
    ``jupyterhub_message`` on its spawn page, the API answers the 400 with it."""

    def __init__(self, message: str) -> None:
        # The Hub logs the error's own message: it quotes a user's choice.
        super().__init__(400, "gpu-gov: %s", escaped(message))
        self.jupyterhub_message = message


def bounded_user_options(hook):
    """A ``pre_spawn_hook`` that refuses a spawn whose ``user_options`` the profile layer would
    not keep (``core.grant.oversized``: the Hub lists them to the governor at every pass, and
    without the profile layer it kept any JSON the REST API was sent), keeping none of the
    oversized ones, then runs ``hook`` (the admin's own, if any). A spawner that bounds them
    itself (``bounds_user_options``: the profile layer, at admission) is left to it."""
    if getattr(hook, "bounds_user_options", False):
        return hook  # add_governor called twice

    def guarded(spawner):
        _refuse_oversized(spawner)
        return hook(spawner) if hook is not None else None

    guarded.bounds_user_options = True
    return guarded


def _refuse_oversized(spawner) -> None:
    if getattr(spawner, "bounds_user_options", False):
        return
    kept, why = oversized(dict(spawner.user_options or {}))
    # Cut where the Hub saved them, before any hook (hub_process.bound_where_stored).
    why = why or cut_where_stored(spawner.orm_spawner)
    if why:
        # The next spawn without options (the Hub's default: the last ones) must not find
        # them either.
        spawner.user_options = kept
        if spawner.orm_spawner is not None:
            spawner.orm_spawner.user_options = kept
            spawner.user.db.commit()
        raise ChoicesRefused(why)


def _add_user_scope(c, scope: str) -> None:
    """Add ``scope`` to the ``user`` role: to the admin's own where one is configured already
    (z2jh's ``hub.loadRoles.user``; JupyterHub refuses a second role of one name), else as
    JupyterHub's default (``self``) plus ``scope``."""
    roles = c.JupyterHub.load_roles
    mine = next((r for r in listed(roles) if isinstance(r, dict) and r.get("name") == "user"), None)
    if mine is None:
        roles.append({"name": "user", "scopes": ["self", scope]})
        return
    # A role without scopes only assigns JupyterHub's default ones (``self``): keep them.
    scopes = list(mine.get("scopes", ["self"]))
    if scope not in scopes:
        mine["scopes"] = [*scopes, scope]


def _spawner_sections(c, trait: str) -> list[str]:
    """``Spawner`` and every spawner class whose own section sets ``trait``: an admin's
    ``c.KubeSpawner.environment`` (z2jh's ``singleuser.extraEnv``) or ``server_token_scopes``
    (z2jh's ``hub.config``) wins over ``c.Spawner``'s, and would hide what is added there."""
    own = [
        name
        for name, section in c.items()
        if name != "Spawner"
        and name.endswith("Spawner")
        and isinstance(section, Config)
        and trait in section
    ]
    return ["Spawner", *own]


def _update_spawners(c, trait: str, values: dict) -> None:
    """Add ``values`` to the dict ``trait`` wherever spawners read it, keeping the rest and any
    of these keys already set: an admin's own value, set before the call or after it (then
    seen when the Hub's whole configuration gets these again), wins over the governor's."""
    for name in _spawner_sections(c, trait):
        section = c[name]
        if isinstance(section.get(trait), dict):
            section[trait] = {**values, **section[trait]}
        else:  # lazy (.update() so far): still merged onto the trait's value when loaded
            lazy = section[trait]
            kept = updated(lazy)
            lazy.update({k: v for k, v in values.items() if k not in kept})


def _adding_scopes(own: Callable, scopes: list[str]) -> Callable:
    """An admin's ``server_token_scopes`` callable with ``scopes`` added to what it returns:
    ``list()`` of the function was a ``TypeError`` that stopped the Hub's start."""

    async def server_token_scopes(spawner) -> list[str]:
        kept = own(spawner)
        kept = list((await kept if inspect.isawaitable(kept) else kept) or [])
        return [*kept, *(s for s in scopes if s not in kept)]

    server_token_scopes.adds_scopes = scopes
    return server_token_scopes


def _add_server_token_scopes(c, scopes: list[str]) -> None:
    """Add ``scopes`` to the servers' token scopes wherever spawners read them, keeping what
    the admin set: a server whose token lacks the governor's access has every GPU report
    refused."""
    for name in _spawner_sections(c, "server_token_scopes"):
        section = c[name]
        kept = section.get("server_token_scopes")
        if isinstance(kept, LazyConfigValue):  # .append/.extend so far: still merged when loaded
            kept.extend([s for s in scopes if s not in listed(kept)])
        elif callable(kept):  # JupyterHub calls it per spawn (and awaits what it returns)
            if getattr(kept, "adds_scopes", None) != scopes:  # once, though ``add`` runs twice
                section.server_token_scopes = _adding_scopes(kept, scopes)
        else:
            kept = list(kept or [])
            section.server_token_scopes = [*kept, *(s for s in scopes if s not in kept)]
