"""The policy admin's API (docs/api.md, "Policy admin"): the live policies, validate, what-if,
apply, revert, a dry run, and the governor's history as a replay trace; governor admins only.
The work is ``hub/policy_admin.py``'s and ``hub/applied_policy.py``'s, as the page's."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from itertools import islice

from tornado import web

from ..core import clock
from ..core.policy import Policy
from ..replay.history import Pseudonyms, export_span, export_trace
from .api_handler import COST_EXPORT, COST_READ, ApiHandler, bounded_reason
from .applied_policy import StalePolicies, apply, check_over, policy_view, revert
from .history import read_history
from .policy_admin import (
    CandidateError,
    candidate_of,
    days_of,
    dry_run_view,
    in_worker,
    match_warnings,
    policy_admin,
    policy_names,
    reason_of,
    stop_dry_run,
    validate,
    what_if,
)


class _PolicyApi(ApiHandler):
    def candidate(self, body: Mapping) -> tuple[dict, list[Policy]]:
        try:
            candidate = candidate_of(body.get("candidate"))
            return candidate, validate(candidate, self.governor.options)
        except CandidateError as error:
            raise web.HTTPError(400, str(error)) from None


def over_of(body: Mapping) -> str | None:
    """The ``version`` of the live policies a change was made over (``GET api/policy``)."""
    over = body.get("over")
    if over is not None and not isinstance(over, str):
        raise web.HTTPError(400, f"over must be the version GET api/policy gave, got {over!r:.60}")
    return over


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
        warnings = match_warnings(self.governor, policies)
        self.write_json({"valid": True, "policies": policy_names(policies), "warnings": warnings})


class WhatIfHandler(_PolicyApi):
    """``POST api/policy/what-if`` ``{"candidate": ..., "days": 7, "over": "<version>"}``:
    409 when ``over`` is not the live policies' version, as an apply and a dry run (its
    ``current`` would be other policies than those the candidate was edited from)."""

    cost = COST_EXPORT

    @web.authenticated
    async def post(self):
        self.require_admin()
        body = self.body()
        _, policies = self.candidate(body)
        try:
            days = days_of(body.get("days", 7))
        except CandidateError as error:
            raise web.HTTPError(400, str(error)) from None
        try:
            check_over(self.governor, over_of(body))
        except StalePolicies as error:
            raise web.HTTPError(409, str(error)) from None
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
            raise web.HTTPError(400, f"dry_run must be true or false, got {dry_run!r:.60}")
        over = over_of(body)
        try:
            self.write_json(apply(self.governor, candidate, self.actor, reason, dry_run, over))
        except StalePolicies as error:
            raise web.HTTPError(409, str(error)) from None


class RevertHandler(_PolicyApi):
    """``POST api/policy/revert`` ``{"reason": "..."}``: back to the config file's policies;
    409 when they already govern."""

    @web.authenticated
    def post(self):
        self.require_admin()
        body = self.body()
        try:
            reason = reason_of(body.get("reason"), "revert")
            self.write_json(revert(self.governor, self.actor, reason, over_of(body)))
        except CandidateError as error:
            conflict = "already" in str(error) or isinstance(error, StalePolicies)
            raise web.HTTPError(409 if conflict else 400, str(error)) from None


class DryRunHandler(_PolicyApi):
    """``GET api/policy/dry-run``: the dry run so far; ``DELETE`` (``?reason=``) ends it."""

    def request_cost(self, caller: dict) -> int:
        return COST_EXPORT if self.request.method == "GET" else COST_READ  # a replay's view

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
        reason = bounded_reason(self.query("reason")["reason"] or "").strip()
        if not stop_dry_run(self.governor, self.actor, reason or "dry run ended"):
            raise web.HTTPError(404, "no dry run is under way")
        self.write_json({"stopped": True})


class TraceHandler(ApiHandler):
    """``GET api/history/trace?since=1h[&until=][&step=5m][&pseudonymise=1]``: the governor's
    history as a replay trace (JSON Lines), as ``jupyter-gpu-gov export-trace`` writes it."""

    cost = COST_EXPORT

    @web.authenticated
    async def get(self):
        self.require_admin()
        asked = self.query("since", "until", "step", "pseudonymise")
        try:
            since, until, step = export_span(
                "1h" if asked["since"] is None else asked["since"],
                asked["until"] or "",
                "5m" if asked["step"] is None else asked["step"],
                clock.utcnow().timestamp(),
                flag="",
            )
        except ValueError as error:
            raise web.HTTPError(400, str(error)) from None
        pseudonyms = None
        if self.yes_or_no(asked, "pseudonymise"):
            pseudonyms = Pseudonyms(os.urandom(32))
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Content-Disposition", 'attachment; filename="gpu-gov-trace.jsonl"')
        rows = read_history(self.governor.store.engine, since, until)
        lines = export_trace(rows, step=step, since=since, until=until, pseudonyms=pseudonyms)
        # Read and written a chunk at a time in the worker: a fortnight of a big hub streams
        # out without holding it, or the event loop.
        await self.stream(lambda: _chunk(lines), "a history export")


def _chunk(lines: Iterator[str], size: int = 5000) -> str:
    """The next ``size`` lines, newline-terminated ("" at the end)."""
    return "".join(line + "\n" for line in islice(lines, size))


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
