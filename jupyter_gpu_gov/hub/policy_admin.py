"""Policies changed at run time, by governor admins (docs/api.md, "Policy admin"):

- validate a candidate (the JSON form of ``c.GpuGovernor.policies`` and ``policy_defaults``),
  with the errors the service gives at start-up;
- what-if: replay the last N days of the governor's own history (``hub/history.py``) through
  the live policies and the candidate, side by side (``replay.whatif``);
- apply: audited first (who, why, the diff), then kept in the governor's store
  (``hub/applied_policy.py``) and governing from the next pass, without a restart; or a dry run
  beside the live policy: the candidate's decisions on the history recorded since it began,
  next to what the live policy did, acting on nothing;
- at start-up, the config file's policies, then the applied one, unless the config file's
  policies changed since it was applied: then the config file wins, and says so;
- revert to the config file's policies (audited).
"""

from __future__ import annotations

import asyncio
import difflib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import islice
from pprint import pformat
from typing import Any

from tornado import web

from ..core import clock
from ..core.policy import Policy, PolicyError, load_policies
from ..replay import parse_lines, replay
from ..replay.history import DEFAULT_STEP_S, Pseudonyms, export_trace, parse_since
from ..replay.trace import Sample
from ..replay.whatif import Outcome, Setup, compare, figure_rows, recorded_actions, report
from . import applied_policy as kept
from .api_handler import MAX_TEXT, ApiHandler
from .history import read_history
from .store import StoreUnavailable
from .tables import AuditRow

MAX_DAYS = 31  # what-if over at most this many days of history
MAX_ACTIONS_SHOWN = 500  # a dry run's actions, each side
APPLY, DRY_RUN, DRY_RUN_STOP = "policy-apply", "policy-dry-run", "policy-dry-run-stop"
REVERT, SUPERSEDED = "policy-revert", "policy-superseded"
KEPT = (
    "kept: it governs after a restart too, unless the config file's policies change "
    "(then the config file wins, and says so)"
)


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


def validate(candidate: Mapping, options) -> list[Policy]:
    """The candidate's policies, as the service would build them at start-up over its own
    timeout and max_age (``hub/app.py``: ``build_policies``); ``CandidateError`` with its
    start-up error."""
    policies, defaults = candidate["policies"], candidate["policy_defaults"]
    if not isinstance(policies, list):
        raise CandidateError(
            f"bad policy configuration: 'policies' must be a list, got {policies!r}"
        )
    if not isinstance(defaults, dict):
        raise CandidateError(
            f"bad policy configuration: 'policy_defaults' must be an object, got {defaults!r}"
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


def compared(governor, candidate: list[Policy], since: float, until: float) -> list[Outcome]:
    """What the governor did over the history (recorded), what the live policies and the
    candidate would have done: ``replay.whatif.compare``."""
    samples = history_samples(governor.store.engine, since, until)
    setups = [
        Setup("current", _run(governor.policies), policies=_names(governor.policies)),
        Setup("candidate", _run(candidate), policies=_names(candidate)),
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


def _names(policies: Sequence[Policy]) -> tuple[str, ...]:
    return tuple(p.name for p in policies)


def _action(action) -> dict:
    from ..replay.engine import at

    return {
        "at": clock.isoformat(at(action.t)),
        "server": action.server,
        "action": action.action,
        "cull_reason": action.cull_reason,
    }


# -- apply ---------------------------------------------------------------------------------------


def apply(governor, candidate: dict, actor: str, reason: str, dry_run: bool) -> dict:
    """Audit the change (who, why, the diff), then make it: the candidate is kept in the store
    (in the audit's transaction) and governs from the next pass, or runs as a dry run beside
    the live policy. ``StoreUnavailable`` when either cannot be written: then nothing changed."""
    policies = validate(candidate, governor.options)
    admin = policy_admin(governor)
    config_of(governor)
    changes = diff(admin.source, candidate)
    now = clock.utcnow()
    row = AuditRow(
        at=now,
        action=DRY_RUN if dry_run else APPLY,
        reason=reason,
        actor=actor,
        dry_run=dry_run,
        details={"diff": changes, "candidate": candidate, "policies": _names(policies)},
    )
    if dry_run:
        governor.store.audit([row])  # on record before it runs
        admin.dry_run = DryRun(candidate, policies, now, actor, reason)
        return {"dry_run": True, "since": clock.isoformat(now), "diff": changes}
    entry = kept.Entry(kept.APPLIED, now, actor, reason, admin.fingerprint, candidate)
    kept.record(governor.store, row, entry)  # on record and kept before it governs
    governor.policies = policies
    admin.source = candidate
    admin.applied = entry.summary()
    admin.superseded = None
    return {
        "applied": True,
        "policies": _names(policies),
        "diff": changes,
        "persists": True,
        "note": KEPT,
        "config": config_lines(candidate),
    }


def revert(governor, actor: str, reason: str) -> dict:
    """Back to the config file's policies, audited and kept; ``CandidateError`` when they
    already govern."""
    admin = policy_admin(governor)
    config = config_of(governor)
    if admin.applied is None:
        raise CandidateError("the config file's policies already govern: nothing to revert")
    changes = diff(admin.source, config)
    now = clock.utcnow()
    row = AuditRow(at=now, action=REVERT, reason=reason, actor=actor, details={"diff": changes})
    kept.record(
        governor.store, row, kept.Entry(kept.REVERTED, now, actor, reason, admin.fingerprint)
    )
    governor.policies = list(admin.config_policies)
    admin.source, admin.applied = config, None
    return {"reverted": True, "policies": _names(governor.policies), "diff": changes}


def config_of(governor) -> dict:
    """The config file's policies' source (``start`` sets it; a governor built without the
    service, as in tests, has its start-up policies)."""
    admin = policy_admin(governor)
    if admin.config is None:
        admin.config, admin.config_policies = admin.source, list(governor.policies)
        admin.fingerprint = _fingerprint(admin.config, governor.options)
    return admin.config


def _fingerprint(config: Mapping, options) -> str:
    max_age = options.max_age.total_seconds() if options.max_age else None
    return kept.fingerprint(config, options.timeout.total_seconds(), max_age)


def start(governor, config: dict, log) -> None:
    """At start-up: the config file's policies, then the applied one, if it was applied over
    these same config policies; else the config file wins, and a ``superseded`` row and audit
    row say so (once: the stale apply does not come back)."""
    admin = policy_admin(governor)
    admin.source, admin.config = config, None
    config_of(governor)
    entry = kept.newest(governor.store.engine)
    if entry is None or entry.kind == kept.REVERTED:
        log.info("policies: the config file's (%s)", ", ".join(_names(governor.policies)))
        return
    if entry.kind == kept.SUPERSEDED:
        admin.superseded = _superseded(entry.of, entry.at, entry.reason)
        log.warning(_superseded_line(admin.superseded))
        return
    why = "the config file's policies changed since it was applied"
    if entry.config_fingerprint == admin.fingerprint:
        try:
            policies = validate(entry.candidate, governor.options)
        except CandidateError as error:
            why = f"it is no longer valid ({error})"
        else:
            governor.policies, admin.source, admin.applied = (
                policies,
                entry.candidate,
                entry.summary(),
            )
            log.info(
                "policies: applied by %s at %s (%s) in force over the config file's: %s",
                entry.actor,
                admin.applied["at"],
                entry.reason,
                ", ".join(_names(policies)),
            )
            return
    now = clock.utcnow()
    admin.superseded = _superseded(entry, now, why)
    log.warning(_superseded_line(admin.superseded))
    row = AuditRow(at=now, action=SUPERSEDED, reason=why, details=admin.superseded)
    try:
        kept.record(
            governor.store,
            row,
            kept.Entry(kept.SUPERSEDED, now, "governor", why, admin.fingerprint, of=entry),
        )
    except StoreUnavailable as error:  # the config file governs anyway; said again next start
        log.error("policies: the supersession is not on record: %s", error)


def policy_view(governor) -> dict:
    """The live policies' source, where they come from (``origin``: config or applied), the
    apply in force or the one the config file superseded, and a dry run under way."""
    admin = policy_admin(governor)
    dry = admin.dry_run
    return {
        "source": admin.source,
        "policies": _names(governor.policies),
        "origin": admin.origin,
        "applied": admin.applied,
        "superseded": admin.superseded,
        "dry_run": None
        if dry is None
        else {"since": clock.isoformat(dry.since), "by": dry.actor, "candidate": dry.source},
    }


def _superseded(applied: kept.Entry, since: datetime, why: str) -> dict:
    return {**applied.summary(), "since": clock.isoformat(since), "why": why}


def _superseded_line(superseded: dict) -> str:
    return (
        f"policies: the config file's govern; the policy applied by {superseded['by']} at "
        f"{superseded['at']} ({superseded['reason']}) was superseded by the config file at "
        f"{superseded['since']}: {superseded['why']}"
    )


def stop_dry_run(governor, actor: str, reason: str) -> bool:
    admin = policy_admin(governor)
    if admin.dry_run is None:
        return False
    governor.store.audit(
        [AuditRow(at=clock.utcnow(), action=DRY_RUN_STOP, reason=reason, actor=actor, dry_run=True)]
    )
    admin.dry_run = None
    return True


def days_of(text: Any) -> float:
    """``days`` of a what-if: a number from 0 (exclusive) to ``MAX_DAYS``."""
    try:
        days = float(text)
    except (TypeError, ValueError):
        raise CandidateError(f"days must be a number of days, got {text!r}") from None
    if not 0 < days <= MAX_DAYS:
        raise CandidateError(f"days must be more than 0 and at most {MAX_DAYS}, got {text!r}")
    return days


def reason_of(text: Any, what: str = "apply a policy") -> str:
    if not isinstance(text, str) or not text.strip():
        raise CandidateError(f"say why: a reason is required to {what}")
    return text.strip()[:MAX_TEXT]


async def in_worker(function, *args):
    """A replay is CPU work: off the event loop, so passes and reports go on meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)


# -- the API -------------------------------------------------------------------------------------


class _PolicyApi(ApiHandler):
    def candidate(self, body: Mapping) -> tuple[dict, list[Policy]]:
        try:
            candidate = candidate_of(body.get("candidate"))
            return candidate, validate(candidate, self.governor.options)
        except CandidateError as error:
            raise web.HTTPError(400, str(error)) from None


class PolicyHandler(_PolicyApi):
    """``GET api/policy``: ``policy_view``."""

    @web.authenticated
    def get(self):
        self.require_admin()
        self.write_json(policy_view(self.governor))


class ValidateHandler(_PolicyApi):
    """``POST api/policy/validate`` ``{"candidate": ...}``: 200 with the policies, or 400."""

    @web.authenticated
    def post(self):
        self.require_admin()
        _, policies = self.candidate(self.body())
        self.write_json({"valid": True, "policies": _names(policies)})


class WhatIfHandler(_PolicyApi):
    """``POST api/policy/what-if`` ``{"candidate": ..., "days": 7}``."""

    @web.authenticated
    async def post(self):
        self.require_admin()
        body = self.body()
        _, policies = self.candidate(body)
        try:
            days = days_of(body.get("days", 7))
        except CandidateError as error:
            raise web.HTTPError(400, str(error)) from None
        until = clock.utcnow().timestamp()
        result = await in_worker(what_if, self.governor, policies, until - days * 86400, until)
        self.write_json(result)


class ApplyHandler(_PolicyApi):
    """``POST api/policy/apply`` ``{"candidate": ..., "reason": "...", "dry_run": false}``."""

    @web.authenticated
    def post(self):
        self.require_admin()
        body = self.body()
        candidate, _ = self.candidate(body)
        try:
            reason = reason_of(body.get("reason"))
        except CandidateError as error:
            raise web.HTTPError(400, str(error)) from None
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise web.HTTPError(400, f"dry_run must be true or false, got {dry_run!r}")
        self.write_json(apply(self.governor, candidate, self.actor, reason, dry_run))


class RevertHandler(_PolicyApi):
    """``POST api/policy/revert`` ``{"reason": "..."}``: back to the config file's policies;
    409 when they already govern."""

    @web.authenticated
    def post(self):
        self.require_admin()
        try:
            reason = reason_of(self.body().get("reason"), "revert")
            self.write_json(revert(self.governor, self.actor, reason))
        except CandidateError as error:
            raise web.HTTPError(409 if "already" in str(error) else 400, str(error)) from None


class DryRunHandler(_PolicyApi):
    """``GET api/policy/dry-run``: the dry run so far; ``DELETE`` (``?reason=``) ends it."""

    @web.authenticated
    async def get(self):
        self.require_admin()
        dry = policy_admin(self.governor).dry_run
        if dry is None:
            raise web.HTTPError(404, "no dry run is under way")
        until = clock.utcnow().timestamp()
        self.write_json(await in_worker(dry_run_view, self.governor, dry, until))

    @web.authenticated
    def delete(self):
        self.require_admin()
        reason = self.get_argument("reason", "").strip() or "dry run ended"
        if not stop_dry_run(self.governor, self.actor, reason[:MAX_TEXT]):
            raise web.HTTPError(404, "no dry run is under way")
        self.write_json({"stopped": True})


class TraceHandler(ApiHandler):
    """``GET api/history/trace?since=1h[&until=][&step=5m][&pseudonymise=1]``: the governor's
    history as a replay trace (JSON Lines), as ``jupyter-gpu-gov export-trace`` writes it."""

    @web.authenticated
    async def get(self):
        self.require_admin()
        now = clock.utcnow().timestamp()
        try:
            since = parse_since(self.get_argument("since", "1h"), now, "since")
            until_text = self.get_argument("until", "")
            until = parse_since(until_text, now, "until") if until_text else now
            step = _step(self.get_argument("step", "5m"))
        except ValueError as error:
            raise web.HTTPError(400, str(error)) from None
        if until < since:
            raise web.HTTPError(400, "until is before since")
        pseudonyms = None
        if self.get_argument("pseudonymise", "") in ("1", "true", "yes"):
            import os

            pseudonyms = Pseudonyms(os.urandom(32))
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Content-Disposition", 'attachment; filename="gpu-gov-trace.jsonl"')
        rows = read_history(self.governor.store.engine, since, until)
        lines = export_trace(rows, step=step, since=since, until=until, pseudonyms=pseudonyms)
        # Read and written a chunk at a time in the worker: a fortnight of a big hub streams
        # out without holding it, or the event loop.
        while chunk := await in_worker(_chunk, lines):
            self.write(chunk)
            await self.flush()
        self.finish()


def _chunk(lines: Iterator[str], size: int = 5000) -> str:
    """The next ``size`` lines, newline-terminated ("" at the end)."""
    return "".join(line + "\n" for line in islice(lines, size))


def _step(text: str) -> float:
    from ..core.durations import parse_duration

    step = parse_duration(text, "step").total_seconds()
    if not step >= 60:
        raise ValueError(f"step must be at least 60 seconds, got {text!r}")
    return step


def policy_handlers(prefix: str, governor) -> list[tuple]:
    """The policy admin's routes under the service prefix."""
    args = {"governor": governor}
    p = prefix.rstrip("/")
    return [
        (rf"{p}/api/policy", PolicyHandler, args),
        (rf"{p}/api/policy/validate", ValidateHandler, args),
        (rf"{p}/api/policy/what-if", WhatIfHandler, args),
        (rf"{p}/api/policy/apply", ApplyHandler, args),
        (rf"{p}/api/policy/revert", RevertHandler, args),
        (rf"{p}/api/policy/dry-run", DryRunHandler, args),
        (rf"{p}/api/history/trace", TraceHandler, args),
    ]


__all__ = ["figure_rows", "policy_admin", "policy_handlers"]
