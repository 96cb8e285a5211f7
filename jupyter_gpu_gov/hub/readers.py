"""Who may read which teams' usage (the usage API, its CSV and JSON, the showback page): the one
place that decides it, from the Hub's answer for the caller, which no user can write.

- a governor admin (``is_governor_admin``): every team;
- a holder of ``custom:gpu-gov:showback`` (``SHOWBACK_SCOPE``), which a Hub admin gives a role
  (``add_governor`` defines it): unfiltered, every team (finance); filtered ``!group=<group>``,
  the team that Hub group names (its ``gpu-gov/team`` property, as ``core/teams.py`` reads
  groups; a group that names none: the team of the group's own name), one filter per team (a
  team lead). JupyterHub lists a custom scope's filters as they were granted; any other
  filter (``!user=``, ``!server=``, ``!service=``) names no team and reads none;
- anyone else: their own usage only, as before.

Reading usage is all the scope gives: no server, verdict, action, audit row or page besides
showback, which stay the owner's and the admins'.
"""

from __future__ import annotations

from collections.abc import Mapping

from tornado import web

from ..core.text import kept_forms, stored_name
from .ownership import choice_text
from .prepared_auth import ADMIN_SCOPE, SHOWBACK_SCOPE, is_governor_admin, owner_wide

FILTERS = ("team", "project", "tier")  # the usage API's filters besides ``user``


# Why a lead is answered 503: the Hub's groups, which say which team a lead's group is, are
# read by the governor's pass, and before the first (or on a standby that made none) the group's
# own name would be a guess (a team may be named like another team's group).
NOT_READY = (
    "the governor has not read the Hub's groups yet (they say which team a lead's "
    "!group=<group> is): not ready, try again shortly"
)
# How soon to try again, as its ``Retry-After`` says (a client or a browser that reads none
# cannot tell "shortly" from "never"): the first pass reads the groups within seconds of a start.
NOT_READY_RETRY_S = 10


class NotReady(web.HTTPError):
    """A 503 that says when to come back: ``retry_after_s`` (``api_handler.retry_after``)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(503, message)
        self.retry_after_s = retry_after_s


def readable_teams(model: dict, teams_by_group: Mapping[str, str] | None) -> frozenset[str] | None:
    """The teams whose usage the caller may read (None: every team; empty: none but their
    own usage). ``teams_by_group``: the Hub's groups that name a team (the last pass's; None:
    not read yet, a 503 for a lead)."""
    if is_governor_admin(model):
        return None
    teams = set()
    for scope in model.get("scopes") or ():
        base, _, which = str(scope).partition("!")
        if base != SHOWBACK_SCOPE:
            continue
        if not which:
            return None
        kind, _, group = which.partition("=")
        if kind == "group" and group:
            if teams_by_group is None:
                raise NotReady(NOT_READY, NOT_READY_RETRY_S)
            teams.add(teams_by_group.get(group, group))
    return frozenset(teams)


def reads_showback(model: dict) -> bool:
    """Whether the caller reads some team's usage (the navigation's Showback link): which
    teams does not matter, so it needs no groups read."""
    return readable_teams(model, {}) != frozenset()


def scope_for(team: str, teams_by_group: Mapping[str, str] | None) -> str:
    """The scope that would let a lead read ``team``, as a refusal names it (bounded: ``team``
    is what was asked)."""
    groups = sorted(g for g, t in (teams_by_group or {}).items() if t == team)
    group = team if team in groups or not groups else groups[0]  # the team's own name first
    return f"{SHOWBACK_SCOPE}!group={group:.80}"


def usage_filters(
    model: dict, asked: Mapping[str, str | None], teams_by_group: Mapping[str, str] | None
) -> dict[str, str | frozenset[str] | None]:
    """The owner filters (``user``, ``team``, ``project``, ``tier``) a usage read runs with for
    the caller, from those ``asked``; a 403 naming what is missing where it may not read them.
    A team's filter may be a set of teams (a lead's, not narrowed to one)."""
    teams = readable_teams(model, teams_by_group)
    if teams is None:
        return as_kept(asked)
    own = model.get("name") if model.get("kind", "user") == "user" else None
    user = asked.get("user")
    if teams and (user is None or user != own):
        # A lead: their teams' rows, narrowed by whatever else was asked (a user among them).
        team = asked.get("team")
        if team is None:
            return {**as_kept(asked), "team": teams}
        if team in teams:
            return as_kept(asked)
        raise web.HTTPError(
            403,
            f"'team': reading the usage of team {team!r:.80} needs the scope "
            f"{scope_for(team, teams_by_group)} (or {ADMIN_SCOPE}); yours covers "
            f"{', '.join(sorted(teams))!r:.200}"
            + (f"; for your own in it, add user={own}" if own else ""),
        )
    # One's own usage, as any user reads it.
    if refused := owner_wide(model, "its owner's usage"):
        raise web.HTTPError(403, refused)
    if own is None:
        raise web.HTTPError(
            403,
            f"a Hub service owns no server: this needs the {SHOWBACK_SCOPE} or {ADMIN_SCOPE} scope",
        )
    only_own(user, own, "'user'")
    # A team lead's team=vision was answered with their own rows in vision, read as the team's:
    # a filter other than one's own name is said to be theirs, or refused.
    if user is None and (named := next((k for k in FILTERS if asked.get(k)), None)):
        team = asked.get("team")
        needs = (
            f"the usage of team {team!r:.80} needs the scope {scope_for(team, teams_by_group)}"
            if named == "team"
            else f"a {named}'s usage needs the scope {SHOWBACK_SCOPE} for its teams"
        )
        raise web.HTTPError(
            403,
            f"'{named}': reading {needs} (a team lead's or finance's, given by a Hub admin) or "
            f"{ADMIN_SCOPE}; for your own in it, add user={own}",
        )
    return {**as_kept(asked), "user": stored_name(own)}  # their own kept form, no other


def as_kept(asked: Mapping[str, str | None]) -> dict[str, str | frozenset[str] | None]:
    """The filters ``asked`` as the ledger keeps names: a user's name (``core.text.kept_forms``:
    the Hub's name or its kept form, as the pages show it) and a project (as
    ``ownership.choice_text`` keeps a user's choice: bounded, NUL as U+FFFD)."""
    kept = dict(asked)
    if (user := asked.get("user")) is not None:
        kept["user"] = kept_forms(user)
    if (project := asked.get("project")) is not None:
        kept["project"] = frozenset((project, choice_text(project) or project))
    return kept


# Why a caller who may read no team's usage may not open the showback page.
NO_SHOWBACK = (
    f"showback is for governor admins ({ADMIN_SCOPE}) and readers of teams' usage "
    f"({SHOWBACK_SCOPE}; a team lead's is filtered !group=<the team's group>); your own usage "
    "is on “My GPU usage”. Given that scope since you logged in? Log out of the Hub and in "
    "again: a login keeps the scopes it was made with"
)


def only_own(asked: str | None, own: str, name: str) -> str:
    """The caller's own name, where a caller who is no admin names a user (``name``): someone
    else's is a 403 saying so, not their own records answered as if they were asked for."""
    if asked is not None and asked not in (own, stored_name(own)):  # (or as the pages show it)
        raise web.HTTPError(403, f"{name}: only {asked!r:.80} or a governor admin may read this")
    return own
