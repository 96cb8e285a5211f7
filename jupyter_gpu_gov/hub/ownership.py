"""Who a server belongs to: team, project, tier and labels, from what the Hub knows.

Sources, first found wins for each field:

1. ``gpu-gov/*`` keys in the server's ``user_options`` (the profile layer records the team,
   project, tier and borrowed flag chosen on the spawn form there, mirroring the pod labels);
2. plain ``team`` / ``project`` keys in ``user_options`` (a spawn form without our profile layer);
3. Hub groups: a group whose ``properties`` has ``"gpu-gov/team"`` (``true`` for the group's
   own name, or a string naming the team);
4. ``GpuGovernor.team_map`` (user → team).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.policy import LABEL_PREFIX


@dataclass(frozen=True)
class Ownership:
    team: str | None = None
    project: str | None = None
    tier: str | None = None
    profile: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


# The labels naming each owner field (``gpu-gov/team``, ...).
_OWNER_LABELS = {key: f"{LABEL_PREFIX}{key}" for key in ("team", "project", "tier", "user")}


def resolve(
    user: str,
    user_options: Mapping[str, Any],
    user_groups: Iterable[str],
    teams_by_group: Mapping[str, str],
    team_map: Mapping[str, str],
) -> Ownership:
    user_options = user_options or {}
    labels = {
        key: _text(value)
        for key, value in user_options.items()
        if key.startswith(LABEL_PREFIX) and value is not None
    }
    team = labels.get(_OWNER_LABELS["team"]) or _text(user_options.get("team"))
    if not team:
        team = next((teams_by_group[g] for g in user_groups if g in teams_by_group), None)
    team = team or team_map.get(user)
    project = labels.get(_OWNER_LABELS["project"]) or _text(user_options.get("project"))
    profile = _text(user_options.get("profile"))
    tier = labels.get(_OWNER_LABELS["tier"]) or profile
    for key, value in (("team", team), ("project", project), ("tier", tier), ("user", user)):
        if value:
            labels.setdefault(_OWNER_LABELS[key], value)
    return Ownership(team=team, project=project, tier=tier, profile=profile, labels=labels)


def _text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
