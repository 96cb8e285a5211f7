"""Who a server belongs to: team, project, tier and labels, from what the Hub knows.

Only sources a user cannot write may set what governs a server (its team, its ``gpu-gov/*``
labels: tier, borrowed, exempt, max-age, reclaim): a user writes their server's
``user_options`` through the REST API at will, so nothing in it is a grant. Sources, first
found wins for each field:

1. the profile layer's grant, from the spawner's *state* (``core.grant``; the governor reads it
   with ``admin:server_state``): every ``gpu-gov/*`` label, the team, project and tier;
2. Hub groups: a group whose ``properties`` has ``"gpu-gov/team"`` (``true`` for the group's
   own name, or a string naming the team);
3. ``GpuGovernor.team_map`` (user → team).

From ``user_options`` only the user's own choices are taken, as choices: ``profile`` (the
KubeSpawner profile, which KubeSpawner enforces) and, without a grant, ``project`` (for
showback; it sets no label). ``gpu-gov/*`` keys and ``team`` there are never believed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core import grant
from ..core.policy import HUB_ACTIVITY_LAG, ServerView
from ..core.vocabulary import PROJECT_LABEL, TEAM_LABEL, TIER_LABEL, USER_LABEL

if TYPE_CHECKING:
    from .hubapi import HubServer


@dataclass(frozen=True)
class Ownership:
    team: str | None = None
    project: str | None = None
    tier: str | None = None
    profile: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    tier_formerly: tuple[str, ...] = ()  # names the tier had (a renamed tier's ``formerly``)


def resolve(
    user: str,
    user_options: Mapping[str, Any],
    spawner_state: Mapping[str, Any] | None,
    user_groups: Iterable[str],
    teams_by_group: Mapping[str, str],
    team_map: Mapping[str, str],
    tier_names: Callable[[str], tuple[str, ...]] = lambda tier: (tier,),
) -> Ownership:
    """``tier_names``: a tier's names, its name now first (``Options.tier_names``): a server
    granted under a renamed tier's former name is that tier's, as the profile layer counts it."""
    user_options = user_options or {}
    labels = grant.labels(spawner_state)
    team = labels.get(TEAM_LABEL)
    if not team:
        team = next((teams_by_group[g] for g in user_groups if g in teams_by_group), None)
    team = team or team_map.get(user)
    project = labels.get(PROJECT_LABEL) or choice_text(user_options.get("project"))
    profile = choice_text(user_options.get("profile"))
    tier = labels.get(TIER_LABEL) or profile
    for label, value in ((TEAM_LABEL, team), (TIER_LABEL, tier), (USER_LABEL, user)):
        if value:
            labels.setdefault(label, value)
    formerly: tuple[str, ...] = ()
    if tier:
        tier, *others = tier_names(tier)
        formerly = tuple(others)
    return Ownership(team, project, tier, profile, labels, formerly)


# A choice's characters kept: the store's columns (team, project, tier, profile) hold 255.
MAX_CHOICE = 255


def choice_text(value: Any) -> str | None:
    """A user's choice as text the store and /metrics can take: at most ``MAX_CHOICE``
    characters, a lone surrogate (JSON can escape one: no text) and NUL (PostgreSQL refuses
    text holding it: one user's project stopped every pass) as U+FFFD."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)[:MAX_CHOICE].replace("\0", "\ufffd")
    if text.isascii():
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def base_view(
    server: HubServer,
    ownership: Ownership,
    lag=HUB_ACTIVITY_LAG,
    labels: Mapping[str, str] | None = None,
) -> ServerView:
    """Who the server is, and what the Hub knows of it; ``lag``: how late the Hub's activity
    may be (``Options.hub_activity_lag``); ``labels``: ``ownership.labels``' equal to share
    (the row's: the view is kept per server, a copy each was ~2 MB at 10,000 servers)."""
    return ServerView(
        user=server.user,
        name=server.name,
        profile=ownership.profile,
        tier=ownership.tier,
        tier_formerly=ownership.tier_formerly,
        team=ownership.team,
        project=ownership.project,
        labels=ownership.labels if labels is None else labels,
        started=server.started,
        hub_last_activity=server.last_activity,
        hub_activity_lag=lag,
    )
