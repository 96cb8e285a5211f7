"""``/services/gpu-gov/policy``: the policy page (governor admins), server-rendered like the
other pages: the live policies, an editor for a candidate, validate, what-if over the
governor's own history beside the live policy, apply (audited first) and a dry run beside the
live policy. Each button posts the form (XSRF-protected, no script needed); the work is
``hub/policy_admin.py``'s and ``hub/applied_policy.py``'s, as the API's."""

from __future__ import annotations

import json

from sqlalchemy import select
from tornado import web

from ..core import clock
from ..core.durations import format_duration, parse_duration
from ..replay.whatif import figure_rows, notes
from . import applied_policy as kept
from . import policy_admin as admin_
from .api_handler import COST_EXPORT, bounded_reason
from .page_handler import PageHandler
from .pages import FLASH_COOKIE, DashboardHandler
from .tables import AuditRow

SPANS = ("1h", "6h", "1d", "7d", "14d")  # what-if over the last ...
POLICY_AUDIT = (
    admin_.APPLY,
    admin_.DRY_RUN,
    admin_.DRY_RUN_STOP,
    admin_.REVERT,
    admin_.SUPERSEDE,
)


def policy_audit(store, limit: int = 20) -> list[AuditRow]:
    """The latest policy changes and dry runs from the audit trail."""
    with store.session() as session:
        query = select(AuditRow).where(AuditRow.action.in_(POLICY_AUDIT))
        return list(session.scalars(query.order_by(AuditRow.id.desc()).limit(limit)))


class PolicyPageHandler(PageHandler):
    """``GET`` the page; ``POST`` its form (``action``: validate, predict, apply, dry-run,
    stop-dry-run, revert)."""

    _flash = DashboardHandler._flash  # what the last apply did, once

    def request_cost(self, caller: dict) -> int:
        if self.request.method == "POST" and self.get_body_argument("action", "") == "predict":
            return COST_EXPORT  # a what-if: the span replayed through two policies
        return self.cost

    @web.authenticated
    async def get(self):
        self.require_admin()
        admin = admin_.policy_admin(self.governor)
        await self.show(_pretty(admin.source), span="1d", message=self._flash())

    @web.authenticated
    async def post(self):
        self.require_admin()
        self.query()  # the form's fields are its body's: none in the URL (``ApiHandler.body``)
        gov = self.governor
        action = self.get_body_argument("action", "")
        text = self.get_body_argument("candidate", "")
        span = self.get_body_argument("span", "1d")
        reason = bounded_reason(self.get_body_argument("reason", "")).strip()
        over = self.get_body_argument("over", None)  # the live policies the page showed
        if action == "stop-dry-run":
            admin_.stop_dry_run(gov, self.actor, reason or "dry run ended")
            self._flash_then_back("dry run ended")
            return
        if action == "revert":
            try:
                done = kept.revert(gov, self.actor, admin_.reason_of(reason, "revert"), over)
            except admin_.CandidateError as error:
                await self.show(
                    _pretty(admin_.policy_admin(gov).source),
                    span=span,
                    error=str(error),
                    status=409 if isinstance(error, kept.StalePolicies) else 400,
                )
                return
            self._flash_then_back(f"reverted to the config file: {', '.join(done['policies'])}")
            return
        try:
            candidate = admin_.candidate_of(text)
            policies = admin_.validate(candidate, gov.options)
        except admin_.CandidateError as error:
            await self.show(text, span=span, error=str(error), status=400)
            return
        if action == "validate":
            names = ", ".join(p.name for p in policies)
            said = "".join(f"; {w}" for w in admin_.match_warnings(gov, policies))
            await self.show(
                text, span=span, valid=f"valid: {len(policies)} policies ({names}){said}"
            )
        elif action == "predict":
            if span not in SPANS:
                raise web.HTTPError(400, f"span must be one of {', '.join(SPANS)}, got {span!r}")
            try:  # "current" would be other policies than those the page showed
                kept.check_over(gov, over)
            except kept.StalePolicies as error:  # the candidate stays, beside the new live
                await self.show(text, span=span, error=str(error), status=409)
                return
            until = clock.utcnow().timestamp()
            since = until - parse_duration(span).total_seconds()
            outcomes = await admin_.in_worker(admin_.compared, gov, policies, since, until)
            await self.show(text, span=span, outcomes=outcomes)
        elif action in ("apply", "dry-run"):
            if not reason:
                await self.show(text, span=span, error="say why: a reason is required", status=400)
                return
            try:
                done = kept.apply(gov, candidate, self.actor, reason, action == "dry-run", over)
            except kept.StalePolicies as error:  # the candidate stays, beside the new live
                await self.show(text, span=span, error=str(error), status=409)
                return
            if action == "dry-run":
                self._flash_then_back("dry run started beside the live policy: nothing is acted on")
            else:
                said = "".join(f"; {w}" for w in done["warnings"][:3])  # (a cookie's size)
                if len(done["warnings"]) > 3:
                    said += f"; {len(done['warnings']) - 3} more such warnings"
                self._flash_then_back(
                    f"applied: {', '.join(done['policies'])}; {done['note']}{said}"
                )
        else:
            raise web.HTTPError(400, f"unknown action {action!r}")

    def _flash_then_back(self, message: str) -> None:
        self.set_signed_cookie(
            FLASH_COOKIE,
            message,
            expires_days=None,
            path=self.prefix,
            httponly=True,
            samesite="Strict",
        )
        self.redirect(f"{self.prefix}policy")

    async def show(self, text: str, *, span: str, status: int = 200, outcomes=None, **extra):
        gov = self.governor
        admin = admin_.policy_admin(gov)
        dry = None
        if admin.dry_run is not None:
            until = clock.utcnow().timestamp()
            dry = await admin_.in_worker(admin_.dry_run_view, gov, admin.dry_run, until)
        self.render_page(
            "policy.html",
            status=status,
            candidate=text,
            span=span,
            spans=SPANS,
            live=_pretty(admin.source),
            version=kept.version(admin.source),
            live_names=[p.name for p in gov.policies],
            applied=admin.applied,
            superseded=admin.superseded,
            figures=figure_rows(outcomes) if outcomes else None,
            notes=notes(outcomes, width=None) if outcomes else [],
            trace=outcomes and outcomes[0],
            dry=dry,
            audit=[_audit_line(row) for row in policy_audit(gov.store)],
            retention=format_duration(int(gov.options.history.retention.total_seconds())),
            **{"error": "", "valid": "", "message": "", **extra},
        )


def _audit_line(row: AuditRow) -> dict:
    details = row.details or {}
    return {
        "at": row.at,
        "action": row.action,
        "actor": row.actor,
        "reason": row.reason,
        "diff": "\n".join(details.get("diff") or ()),
    }


def _pretty(source) -> str:
    return json.dumps(source, indent=2, default=str)


def policy_page_handlers(prefix: str, governor) -> list[tuple]:
    return [(rf"{prefix.rstrip('/')}/policy", PolicyPageHandler, {"governor": governor})]
