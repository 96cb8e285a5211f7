"""The spawn form: render the tiers a user may pick (with what each team has left, and the offer
to wait in line for a tier taken now), and read the choice back into ``user_options``
(``profile``, ``team``, ``project`` as KubeSpawner names them; ``task_type`` and
``expected_duration``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from ..core.durations import DurationOutOfRange, format_duration, parse_duration
from ..core.policy import TASK_TYPES
from ..core.text import in_sentence, path_segment
from .quota import TierUse
from .tiers import Tier

# What each task type means, on the form.
TASK_TYPE_WORDS = {
    "interactive": "Interactive work at the notebook",
    "batch": "A training run (batch) in a notebook",
    "inference": "Serving or evaluating a model (inference)",
}
_CHOICES = ("profile", "team", "project", "task_type", "expected_duration")

_PROJECT = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")  # a label value
_env = Environment(
    loader=PackageLoader("jupyter_gpu_gov.profiles", "templates"),
    autoescape=select_autoescape(["html"]),
)
# A name in an attribute or an <option> (no markup there): its own isolate where it needs one.
_env.filters["isolate"] = in_sentence


class FormError(ValueError):
    """A form value that cannot be used; the message says which and why."""


def parse(formdata: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """``{"profile", "team", "project", "task_type", "expected_duration"}`` from the posted form
    (absent keys left out). Raises ``FormError`` for a project name that cannot be a label or a
    duration that cannot be read; the tier's limits are checked at admission."""

    def value(key: str) -> str | None:
        values = formdata.get(key) or [""]
        return values[0].strip()[:200] or None

    options = {k: v for k in _CHOICES if (v := value(k)) is not None}
    if "project" in options:
        check_project(options["project"])
    if "expected_duration" in options:
        with contextlib.suppress(_OutOfRange):  # admission names the tier's limit
            _duration(options["expected_duration"])
    return options


def check_task_type(task_type: Any, tier: Tier) -> None:
    """Raise ``FormError`` unless ``task_type`` (None: the tier's default) is one the tier
    allows."""
    if task_type is not None and task_type not in tier.task_types:
        allowed = ", ".join(tier.task_types)
        raise FormError(
            f"A {in_sentence(tier.display_name)} server may be for: {allowed}; {task_type!r:.60} is not one of "
            f"them (task types: {', '.join(TASK_TYPES)})."
        )


def check_expected_duration(value: Any, tier: Tier, bound: timedelta) -> timedelta | None:
    """The owner's expected duration (None when not given), at least a minute and at most the
    tier's maximum age and ``bound``; raises ``FormError`` naming the limit."""
    if value is None or value == "":
        return None
    limit, what = bound, "the hub's limit"
    if tier.max_age is not None and tier.max_age < limit:
        limit, what = tier.max_age, f"{in_sentence(tier.display_name)}'s maximum age"
    try:
        expected = _duration(value)
    except _OutOfRange:  # negative, or beyond any limit: said as the limit
        expected = None
    if expected is None or expected < timedelta(minutes=1) or expected > limit:
        raise FormError(
            f"Expected duration {value!r:.60}: give 1m to {format_duration(limit)} ({what}), or "
            "leave it empty."
        )
    return expected


class _OutOfRange(FormError):
    """A duration that reads as one but is negative or longer than 100 years."""


def _duration(value: Any) -> timedelta:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise FormError(f"Expected duration {value!r:.60} is not a duration: use e.g. 90m, 6h, 2d.")
    try:
        return parse_duration(value, "Expected duration")
    except DurationOutOfRange:
        raise _OutOfRange(
            f"Expected duration {value!r:.60} is out of range: use e.g. 90m, 6h, 2d."
        ) from None
    except ValueError:
        raise FormError(
            f"Expected duration {value!r:.60} is not a duration: use e.g. 90m, 6h, 2d."
        ) from None


def server_path(user: str, name: str | None) -> str:
    """``alice`` or ``alice/gpu``, each part escaped for a URL path (``..`` too)."""
    path = path_segment(user)
    return f"{path}/{path_segment(name)}" if name else path


def check_project(project: Any) -> None:
    """Raise ``FormError`` unless ``project`` can be a label value (and a showback key)."""
    if not isinstance(project, str) or not _PROJECT.fullmatch(project):
        raise FormError(
            f"Project {project!r:.60} cannot be used: use letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit, at most 63 characters."
        )


def line(use: TierUse, team: str) -> tuple[str, str]:
    """(css class, sentence) describing a tier for one team (its name an isolate in it)."""
    admission, team = use.admission, in_sentence(team)
    free = ""
    if use.capacity is not None:
        # Of the cards the machine has, not of what other tiers' servers (a pair) leave this one.
        total = max(use.capacity, use.cards or 0)
        free = f" · {max(0, use.capacity - use.in_use)} of {total} free"
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
    offers: Mapping[tuple[str, str], str] | None = None,
    waiting: str | None = None,
    queue_url: str = "",
    queue_page: str = "",
) -> str:
    """The form. ``offers``: (team, tier) → the offer to wait in line for a tier refused now
    (such a tier can be picked, with a "Wait in line" button); ``waiting``: the tier this server
    waits for already."""
    offers = offers or {}
    offered: dict[str, list[tuple[str, str, str]]] = {}  # tier → [(team, css, sentence)]
    for team in teams:
        for use in lines.get(team, ()):
            css, sentence = line(use, team)
            if css == "refused" and (team, use.tier) in offers:
                css, sentence = "queue", f"{sentence} {offers[team, use.tier]}"
            offered.setdefault(use.tier, []).append((team, css, sentence))
    for team_lines in offered.values():  # say so where one of the user's teams lacks it
        has = {team for team, _, _ in team_lines}
        team_lines += [
            (t, "refused", f"{in_sentence(t)}: not offered to this team")
            for t in teams
            if t not in has
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
        # A tier that starts now; waiting in line is a choice to make, not a default.
        now = [r["tier"].name for r in rows if any(c in ("ok", "borrow") for _, c, _ in r["teams"])]
        chosen = now[0] if now else no_gpu if allow_no_gpu or not usable else usable[0]
    return _env.get_template("spawn_form.html").render(
        task_types=TASK_TYPE_WORDS,
        task_type=previous.get("task_type", ""),
        expected_duration=previous.get("expected_duration", ""),
        waiting=waiting,
        queue_url=queue_url,
        queue_page=queue_page,
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
