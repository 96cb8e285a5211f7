"""Which teams a user belongs to, from what the Hub knows. One place for the rules, used by the
governor (who owns this server?) and the profile layer (which teams may this user spawn for?).

Sources, in this order:

1. Hub groups whose ``properties`` has ``"gpu-gov/team"``: ``true`` for the group's own name, or a
   string naming the team;
2. the authenticator's ``auth_state`` under a configured key (a string or a list of strings, e.g.
   from an OAuth ``groups`` claim);
3. a configured mapping user → team (or list of teams).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .vocabulary import TEAM_PROPERTY


def group_teams(groups: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Group name → team name, for groups that declare a team in their properties."""
    teams = {}
    for group in groups:
        value = (group.get("properties") or {}).get(TEAM_PROPERTY)
        if value is True:
            teams[group["name"]] = group["name"]
        elif isinstance(value, str) and value:
            teams[group["name"]] = value
    return teams


def user_teams(
    user: str,
    user_groups: Iterable[str],
    teams_by_group: Mapping[str, str],
    auth_state: Mapping[str, Any] | None = None,
    auth_state_key: str | None = None,
    team_map: Mapping[str, str | Iterable[str]] | None = None,
) -> list[str]:
    """Every team of ``user``, first source first, without repeats."""
    found = [teams_by_group[g] for g in user_groups if g in teams_by_group]
    if auth_state and auth_state_key:
        found += _names(auth_state.get(auth_state_key))
    found += _names((team_map or {}).get(user))
    return list(dict.fromkeys(found))


def _names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, Iterable):
        return [v for v in value if isinstance(v, str) and v]
    return []
