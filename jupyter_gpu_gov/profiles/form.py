"""The spawn form: render the tiers a user may pick (with what each team has left), and read the
choice back into ``user_options`` (``profile``, ``team``, ``project``, as KubeSpawner names them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from .quota import TierUse
from .tiers import Tier

_PROJECT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")  # a label value
_env = Environment(
    loader=PackageLoader("jupyter_gpu_gov.profiles", "templates"),
    autoescape=select_autoescape(["html"]),
)


class FormError(ValueError):
    """A form value that cannot be used; the message says which and why."""


def parse(formdata: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """``{"profile": ..., "team": ..., "project": ...}`` from the posted form (absent keys left
    out). Raises ``FormError`` for a project name that cannot be a label."""

    def value(key: str) -> str | None:
        values = formdata.get(key) or [""]
        return values[0].strip() or None

    options = {k: v for k in ("profile", "team", "project") if (v := value(k)) is not None}
    if "project" in options:
        check_project(options["project"])
    return options


def check_project(project: Any) -> None:
    """Raise ``FormError`` unless ``project`` can be a label value (and a showback key)."""
    if not isinstance(project, str) or not _PROJECT.match(project):
        raise FormError(
            f"Project {project!r} cannot be used: use letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit, at most 63 characters."
        )


def line(use: TierUse, team: str) -> tuple[str, str]:
    """(css class, sentence) describing a tier for one team."""
    admission = use.admission
    free = ""
    if use.capacity is not None:
        free = f" · {max(0, use.capacity - use.in_use)} of {use.capacity} free"
    if not admission.allowed:
        return "refused", f"{team}: not now. {admission.reason}"
    if admission.borrowed:
        why = (
            f"its guarantee of {use.guaranteed} is in use"
            if use.guaranteed
            else "no guarantee here"
        )
        return (
            "borrow",
            f"{team}: would borrow ({why}; borrowed servers are given back first){free}",
        )
    return "ok", f"{team}: {use.guaranteed_left} of {use.guaranteed} guaranteed left{free}"


def render(
    *,
    tiers: Mapping[str, Tier],
    teams: Sequence[str],
    lines: Mapping[str, Sequence[TierUse]],
    projects: Sequence[str],
    previous: Mapping[str, Any],
    allow_no_gpu: bool,
    require_project: bool,
    no_gpu: str,
    estimate_url: str,
) -> str:
    offered: dict[str, list[tuple[str, str, str]]] = {}  # tier → [(team, css, sentence)]
    for team in teams:
        for use in lines.get(team, ()):
            offered.setdefault(use.tier, []).append((team, *line(use, team)))
    for team_lines in offered.values():  # say so where one of the user's teams lacks it
        has = {team for team, _, _ in team_lines}
        team_lines += [
            (t, "refused", f"{t}: not offered to this team") for t in teams if t not in has
        ]
    rows = [
        {
            "tier": tiers[name],
            "teams": offered[name],
            "usable": any(css != "refused" for _, css, _ in offered[name]),
        }
        for name in tiers
        if name in offered
    ]
    chosen = previous.get("profile")
    usable = [r["tier"].name for r in rows if r["usable"]]
    if chosen not in usable and chosen != no_gpu:
        chosen = usable[0] if usable else no_gpu
    return _env.get_template("spawn_form.html").render(
        rows=rows,
        teams=teams,
        team=previous.get("team") if previous.get("team") in teams else (teams[0] if teams else ""),
        projects=projects,
        project=previous.get("project", ""),
        chosen=chosen,
        allow_no_gpu=allow_no_gpu,
        require_project=require_project,
        no_gpu=no_gpu,
        estimate_url=estimate_url,
    )
