"""What the service's Hub token may do: the scopes the governor needs, the optional ones and
what each gives, checked once at the first pass; and the Hub groups that name teams."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from .hubapi import HubApiError

log = logging.getLogger("jupyter_gpu_gov.hub")


# What each optional scope of the service (hub/hubconfig.py) gives; without it the governor
# still works as jupyterhub-idle-culler does with list:users, read:users:activity, read:servers
# and delete:servers (REQUIRED_SCOPES).
OPTIONAL_SCOPES = {
    "list:groups": "teams are not read from Hub groups (only from grants and team_map)",
    "read:users": "admin flags and group membership are unknown",
    "admin:server_state": "servers without the extension cannot be matched to DCGM's pods",
}


REQUIRED_SCOPES = ("list:users", "read:servers", "delete:servers")


# Scopes that include others (JupyterHub expands them in GET /user; a token may list either).
_SCOPE_PARENTS = {
    "list:users": ("users", "admin:users"),
    "read:users": ("users", "admin:users"),
    "read:users:activity": ("read:users", "users", "admin:users"),
    "read:servers": ("servers", "admin:servers"),
    "delete:servers": ("servers", "admin:servers"),
    "admin:server_state": ("admin:servers",),
    "list:groups": ("groups", "admin:groups"),
    "read:groups": ("groups", "admin:groups"),
}


def _holds(scopes: Sequence[str], scope: str) -> bool:
    """Whether ``scopes`` grant ``scope`` unfiltered (``access:servers!server=…`` does not)."""
    return scope in scopes or any(p in scopes for p in _SCOPE_PARENTS.get(scope, ()))


class HubAccess:
    """The service's access to the Hub (a part of ``Governor``)."""

    async def _groups(self) -> list[dict] | None:
        """The Hub's groups; None where the Hub failed to answer this pass (the last pass's
        teams then stand: a Hub's hiccup is no reason to read every group-made team as gone)."""
        if "list:groups" in (self.missing_scopes or ()):
            return []  # said once, at start-up
        try:
            return await self.hub.get_groups()
        except HubApiError as error:
            if error.status == 403:
                # The scope is missing: said once (_check_scopes), not asked again.
                self.missing_scopes = (self.missing_scopes or frozenset()) | {"list:groups"}
                return []
            log.warning("gpu-gov: cannot list groups (%s); the last pass's teams stand", error)
            return None

    async def _check_scopes(self) -> frozenset[str]:
        """Which optional scopes the service's token lacks, each logged once with what it
        disables (a hub may give the governor only jupyterhub-idle-culler's four scopes)."""
        try:
            model = await self.hub.request("GET", "/user")
        except HubApiError as error:
            log.warning("gpu-gov: cannot read this service's scopes (%s); assuming all", error)
            return frozenset()
        held = model.get("scopes") if isinstance(model, Mapping) else None
        if not isinstance(held, list):
            return frozenset()
        missing = frozenset(s for s in OPTIONAL_SCOPES if not _holds(held, s))
        for scope in sorted(missing):
            log.warning("gpu-gov: the service's token lacks %s: %s", scope, OPTIONAL_SCOPES[scope])
        for scope in REQUIRED_SCOPES:
            if not _holds(held, scope):
                log.error("gpu-gov: the service's token lacks %s: it cannot govern", scope)
        return missing
