"""Policies changed at run time, by governor admins (docs/api.md, "Policy admin"):

- validate a candidate (the JSON form of ``c.GpuGovernor.policies`` and ``policy_defaults``),
  with the errors the service gives at start-up;
- what-if: replay the last N days of the governor's own history (``hub/history.py``) through
  the live policies and the candidate, side by side (``replay.whatif``);
- a dry run beside the live policy: the candidate's decisions on the history recorded since it
  began, next to what the live policy did, acting on nothing.

Apply, revert and what governs after a restart are ``hub/applied_policy.py``'s; the API's
routes are ``hub/policy_api.py``'s.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import reprlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pprint import pformat
from typing import Any

from ..core import clock
from ..core.policy import Policy, PolicyError, load_policies
from ..core.wire import reason_too_long
from ..replay import parse_lines, replay
from ..replay.history import DEFAULT_STEP_S, export_trace
from ..replay.trace import Sample
from ..replay.whatif import Outcome, Setup, Tiers, compare, recorded_actions, report
from .history import read_history
from .tables import AuditRow

MAX_DAYS = 31  # what-if over at most this many days of history
MAX_ACTIONS_SHOWN = 500  # a dry run's actions, each side
APPLY, DRY_RUN, DRY_RUN_STOP = "policy-apply", "policy-dry-run", "policy-dry-run-stop"
REVERT, SUPERSEDE = "policy-revert", "policy-superseded"  # audit actions


class CandidateError(ValueError):
    """A candidate the service would refuse at start-up (the message says what and where)."""


@dataclass
class DryRun:
    source: dict
    policies: list[Policy]
    since: datetime
    actor: str
    reason: str


@dataclass
class PolicyAdmin:
    """What the governor knows of its policies' source, and a dry run under way."""

    source: dict = field(default_factory=lambda: {"policies": [], "policy_defaults": {}})
    applied: dict | None = None  # the apply in force: by, at, reason (None: the config file's)
    superseded: dict | None = None  # the apply the config file superseded, and since when
    dry_run: DryRun | None = None
    config: dict | None = None  # the config file's source and policies (``start``)
    config_policies: list[Policy] = field(default_factory=list)
    fingerprint: str = ""

    @property
    def origin(self) -> str:
        return "applied" if self.applied else "config"


def policy_admin(governor) -> PolicyAdmin:
    """The governor's policy admin (made at first use; ``hub/app.py`` sets its source)."""
    admin = getattr(governor, "policy_admin", None)
    if admin is None:
        admin = governor.policy_admin = PolicyAdmin()
    return admin


# -- validate ------------------------------------------------------------------------------------


def candidate_of(data: Any) -> dict:
    """The candidate in a request: ``{"policies": [...], "policy_defaults": {...}}`` (a JSON
    text of it, or the object); ``CandidateError`` naming what is wrong."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as error:
            raise CandidateError(f"the candidate is not JSON: {error}") from None
        except RecursionError:
            raise CandidateError("the candidate is not JSON we read: nested too deeply") from None
    if not isinstance(data, dict):
        raise CandidateError(
            'the candidate must be a JSON object: {"policies": [...], "policy_defaults": {...}}'
        )
    unknown = sorted(set(data) - {"policies", "policy_defaults"})
    if unknown:
        raise CandidateError(
            f"the candidate has unknown keys {', '.join(map(repr, unknown))}: "
            "only 'policies' (c.GpuGovernor.policies) and 'policy_defaults'"
        )
    return {
        "policies": data.get("policies", []),
        "policy_defaults": data.get("policy_defaults", {}),
    }


def match_warnings(governor, policies: list[Policy]) -> list[str]:
    """A policy's ``match.tiers`` or ``match.teams`` naming one the governor knows of nowhere
    (the tiers it sizes, the teams of Hub groups and ``team_map``, those of the servers it has
    governed): an admin's typo, which makes the policy match no server of it, said. Not an
    error: a team's first server, or a new tier, may yet come."""
    options, rows = governor.options, governor.rows.values()
    known = {
        "tiers": (
            {n for size in options.tier_sizes.values() for n in (size.name, *size.formerly)}
            | {r.tier for r in rows if r.tier},
            "a tier",
            "on",
        ),
        "teams": (
            set(governor._context.teams_by_group.values())
            | set(options.team_map.values())
            | {r.team for r in rows if r.team},
            "a team",
            "of",
        ),
    }
    said = []
    for policy in policies:
        for key, (names, what, prep) in known.items():
            for name in getattr(policy.match, key):
                if name not in names:
                    listed = ", ".join(sorted(names)[:20])[:300] or "none yet"  # bounded
                    said.append(
                        f"policy {policy.name!r:.80}: match.{key} names {name!r:.80}, {what} the "
                        f"governor does not know (known: {listed}): it matches no server {prep} it"
                    )
    return said


def validate(candidate: Mapping, options) -> list[Policy]:
    """The candidate's policies, as the service would build them at start-up over its own
    timeout and max_age (``hub/app.py``: ``build_policies``); ``CandidateError`` with its
    start-up error."""
    policies, defaults = candidate["policies"], candidate["policy_defaults"]
    if not isinstance(policies, list):
        raise CandidateError(
            f"bad policy configuration: 'policies' must be a list, got {policies!r:.60}"
        )
    if not isinstance(defaults, dict):
        raise CandidateError(
            f"bad policy configuration: 'policy_defaults' must be an object, got {defaults!r:.60}"
        )
    base: dict[str, Any] = {"inactive_timeout": options.timeout.total_seconds()}
    if options.max_age:
        base["max_age"] = options.max_age.total_seconds()
    try:
        return load_policies(policies, {**base, **defaults})
    except PolicyError as error:
        raise CandidateError(f"bad policy configuration: {error}") from None


def config_lines(candidate: Mapping) -> str:
    """The candidate as lines of the service's config file."""
    return (
        f"c.GpuGovernor.policies = {pformat(candidate['policies'], sort_dicts=False)}\n"
        f"c.GpuGovernor.policy_defaults = {pformat(candidate['policy_defaults'])}\n"
    )


def diff(before: Mapping, after: Mapping) -> list[str]:
    """What the candidate changes, as a unified diff of the two sources' JSON."""

    def text(source: Mapping) -> list[str]:
        return json.dumps(source, indent=2, sort_keys=True, default=str).splitlines()

    return list(difflib.unified_diff(text(before), text(after), "live", "candidate", lineterm=""))


# -- what-if -------------------------------------------------------------------------------------


def history_samples(engine, since: float, until: float) -> Callable[[], Iterator[Sample]]:
    """The governor's history from ``since`` to ``until`` as a replay reads it (read afresh
    at each call: the comparison streams, whatever the span): a sample a minute over six hours
    or less (the last hour's minutes matter), else every five."""
    step = 60.0 if until - since <= 6 * 3600 else DEFAULT_STEP_S

    def samples() -> Iterator[Sample]:
        rows = read_history(engine, since, until)
        lines = export_trace(rows, step=step, since=since, until=until)
        return parse_lines(lines, "the governor's history")

    return samples


def governor_tiers(options) -> Tiers:
    """The tiers as the governor sees them: its right-sizing catalogue and the usage ledger's
    tier weights. A tier's maximum age is not here: the governor reads it from each server's
    grant (``gpu-gov/max-age``), which its history keeps, and the profile layer's capacities
    are not the governor's to know (no queue model)."""
    return Tiers(
        sizes=options.tier_sizes,
        right_size_after=options.right_size_after,
        weights=options.tier_weights,
    )


def compared(governor, candidate: list[Policy], since: float, until: float) -> list[Outcome]:
    """What the governor did over the history (recorded), what the live policies and the
    candidate would have done, on the governor's tiers: ``replay.whatif.compare``."""
    samples = history_samples(governor.store.engine, since, until)
    tiers = governor_tiers(governor.options)
    setups = [
        Setup("current", _run(governor.policies), tiers, policy_names(governor.policies)),
        Setup("candidate", _run(candidate), tiers, policy_names(candidate)),
    ]
    return compare(samples, setups)


def what_if(governor, candidate: list[Policy], since: float, until: float) -> dict:
    """``compared``, as ``replay.whatif.report``'s JSON."""
    outcomes = compared(governor, candidate, since, until)
    recorded = outcomes[0]
    trace = {
        "source": "history",
        "since": clock.isoformat(datetime.fromtimestamp(since, timezone.utc)),
        "until": clock.isoformat(datetime.fromtimestamp(until, timezone.utc)),
        "rows": recorded.rows,
        "servers": recorded.total.servers,
    }
    return report(outcomes, trace)


def dry_run_view(governor, dry: DryRun, until: float) -> dict:
    """A dry run so far: the candidate's decisions on what the governor saw since it began,
    next to what the live policy did (recorded), and the what-if of that span."""
    since = dry.since.timestamp()
    samples = history_samples(governor.store.engine, since, until)
    would = [_action(a) for a in replay(samples(), dry.policies)]
    did = [_action(a) for a in recorded_actions(samples())]
    return {
        "since": clock.isoformat(dry.since),
        "by": dry.actor,
        "reason": dry.reason,
        "candidate": dry.source,
        "would": would[-MAX_ACTIONS_SHOWN:],
        "did": did[-MAX_ACTIONS_SHOWN:],
        "what_if": what_if(governor, dry.policies, since, until),
    }


def _run(policies: Sequence[Policy]):
    return lambda samples: replay(samples, policies)


def policy_names(policies: Sequence[Policy]) -> tuple[str, ...]:
    return tuple(p.name for p in policies)


def _action(action) -> dict:
    from ..replay.engine import at

    return {
        "at": clock.isoformat(at(action.t)),
        "server": action.server,
        "action": action.action,
        "cull_reason": action.cull_reason,
    }


def start_dry_run(governor, candidate: dict, actor: str, reason: str) -> dict:
    """Audit the dry run (who, why, the diff), then run the candidate beside the live policy."""
    policies = validate(candidate, governor.options)
    admin = policy_admin(governor)
    changes = diff(admin.source, candidate)
    now = clock.utcnow()
    details = {"diff": changes, "candidate": candidate, "policies": policy_names(policies)}
    governor.store.audit(
        [
            AuditRow(
                at=now, action=DRY_RUN, reason=reason, actor=actor, dry_run=True, details=details
            )
        ]
    )
    admin.dry_run = DryRun(candidate, policies, now, actor, reason)
    return {"dry_run": True, "since": clock.isoformat(now), "diff": changes}


def stop_dry_run(governor, actor: str, reason: str) -> bool:
    admin = policy_admin(governor)
    if admin.dry_run is None:
        return False
    governor.store.audit(
        [AuditRow(at=clock.utcnow(), action=DRY_RUN_STOP, reason=reason, actor=actor, dry_run=True)]
    )
    admin.dry_run = None
    return True


def days_of(value: Any) -> float:
    """``days`` of a what-if: a number from 0 (exclusive) to ``MAX_DAYS``."""
    shown = reprlib.repr(value)  # bounded: a 300-digit number is not echoed whole
    try:
        if isinstance(value, bool):
            raise TypeError(value)
        days = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
        raise CandidateError(f"days must be a number of days, got {shown}") from None
    if not 0 < days <= MAX_DAYS:
        raise CandidateError(f"days must be more than 0 and at most {MAX_DAYS}, got {shown}")
    return days


def reason_of(text: Any, what: str = "apply a policy") -> str:
    if not isinstance(text, str) or not text.strip():
        raise CandidateError(f"say why: a reason is required to {what}")
    if refusal := reason_too_long(text):
        raise CandidateError(refusal)
    return text.strip()


async def in_worker(function, *args):
    """A replay is CPU work: off the event loop, so passes and reports go on meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)
