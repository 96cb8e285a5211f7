"""Wiring the governor into a ``jupyterhub_config.py`` in one call::

    from jupyter_gpu_gov.hub.hubconfig import add_governor

    add_governor(c, args=["--config=/etc/jupyterhub/gpu_gov_config.py"], admin_users=["alice"])

It registers the managed service with least-privilege roles, defines the governor's admin scope,
lets users (and their servers' tokens) talk to the service about their own servers, and tells
single-user servers where to report.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence

from traitlets.config import Config, LazyConfigValue

from ..core.queue import QUEUE_SCOPE

ADMIN_SCOPE = "custom:gpu-gov:admin"
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
) -> None:
    """Add the governor to JupyterHub config ``c`` (call it once, after setting services,
    roles and the spawners' environment and token scopes if you set those: it adds to them).
    ``tiers``: what a server of each tier gets, for right-sizing hints
    (``profiles.estimate.tier_sizes(c.GpuProfiles.tiers)``; this module does not import the
    profile layer)."""
    environment = dict(environment or {})
    if tiers:
        environment.setdefault("JUPYTER_GPU_GOV_TIERS", json.dumps(list(tiers)))
    c.JupyterHub.services.append(
        {
            "name": name,
            "url": url,
            "command": [python, "-m", "jupyter_gpu_gov.hub", *args],
            "environment": environment,
            "oauth_no_confirm": True,
            # What the dashboard's login may carry: the governor's admin scope, and admin-ui,
            # which only Hub admins hold (it grants nothing else through this token).
            "oauth_client_allowed_scopes": [ADMIN_SCOPE, "admin-ui"],
        }
    )
    c.JupyterHub.custom_scopes.update(
        {
            ADMIN_SCOPE: {
                "description": "Administer the GPU governor: list every server, extend, approve, "
                "exempt and cull, read the audit trail and metrics.",
            },
            QUEUE_SCOPE: {
                "description": "Read the GPU spawn queue and tell the hub when GPUs free up "
                "(the governor's sync).",
            },
        }
    )
    access = f"access:services!service={name}"
    service_scopes = SERVICE_SCOPES + QUEUE_SERVICE_SCOPES + (["admin:users"] if cull_users else [])
    c.JupyterHub.load_roles.extend(
        [
            {"name": f"{name}-service", "services": [name], "scopes": service_scopes},
            {
                "name": f"{name}-admins",
                "users": list(admin_users),
                "groups": list(admin_groups),
                "scopes": [ADMIN_SCOPE, access],
            },
        ]
    )
    # Every user may talk to the governor about their own servers.
    _add_user_scope(c, access)
    # A server's own token reports for it; it holds no admin scope, whoever owns it.
    _add_server_token_scopes(c, ["users:activity!user", "access:servers!server", access])
    _update_spawners(
        c, "environment", {"JUPYTER_GPU_GOV_URL": f"{url.rstrip('/')}/services/{name}/"}
    )


def _add_user_scope(c, scope: str) -> None:
    """Add ``scope`` to the ``user`` role: to the admin's own where one is configured already
    (z2jh's ``hub.loadRoles.user``; JupyterHub refuses a second role of one name), else as
    JupyterHub's default (``self``) plus ``scope``."""
    roles = c.JupyterHub.load_roles
    if isinstance(roles, LazyConfigValue):  # only .append/.extend/... so far
        configured = [*roles._prepend, *(r for _, r in roles._inserts), *roles._extend]
    else:
        configured = list(roles)
    mine = next((r for r in configured if isinstance(r, dict) and r.get("name") == "user"), None)
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
    """Add ``values`` to the dict ``trait`` wherever spawners read it, keeping the rest."""
    for name in _spawner_sections(c, trait):
        section = c[name]
        if isinstance(section.get(trait), dict):
            section[trait] = {**section[trait], **values}
        else:  # lazy (.update() so far): still merged onto the trait's value when loaded
            section[trait].update(values)


def _add_server_token_scopes(c, scopes: list[str]) -> None:
    """Add ``scopes`` to the servers' token scopes wherever spawners read them, keeping what
    the admin set: a server whose token lacks the governor's access has every GPU report
    refused."""
    for name in _spawner_sections(c, "server_token_scopes"):
        section = c[name]
        kept = section.get("server_token_scopes")
        if isinstance(kept, LazyConfigValue):  # .append/.extend so far: still merged when loaded
            kept.extend(scopes)
        else:
            kept = list(kept or [])
            section.server_token_scopes = [*kept, *(s for s in scopes if s not in kept)]
