"""What people ask of the governor: an owner's extension or Stop, an admin's approval or
denial, exemption and Cull now. Each is all or nothing in the store (``_commit``), on record
with who and why, and re-decides the server so the answer carries the new verdict."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import datetime

from ..core import clock, health, policy
from ..core.durations import format_duration
from ..core.policy import evolve
from ..core.text import in_sentence
from ..core.vocabulary import ADMIN, CULLED, EXEMPT, OWNER_STOP, STOP_SERVER
from . import metrics
from .hubapi import HubApiError, HubServer, NotSent
from .tables import DismissalRow, ExtensionRow, ServerRow, record_of, set_record

log = logging.getLogger("jupyter_gpu_gov.hub")
# Seconds between the governor's "stopping" and the Hub's stop of a server its owner stopped.
OWNER_STOP_DELAY_S = 1.0


class SessionChanged(Exception):
    """A person's action named a session of the server that no longer runs (answered 409)."""


class ClaimHeld(Exception):
    """An admin asked to dismiss the health claim on a GPU a running server is on (409)."""


def parse_session(value) -> datetime | None:
    """A cull's ``session`` as a request names it (the server's ``session`` as listed: the
    Hub's ``started``); None when not given. ``ValueError`` naming it when it is not a time."""
    if value is None or value == "":
        return None
    try:
        if not isinstance(value, str) or len(value) > 64:
            raise ValueError
        return clock.parse(value)
    except ValueError:
        raise ValueError(
            "'session' must be the server's session as listed (an ISO 8601 time)"
        ) from None


def _as_is(row: ServerRow) -> tuple:
    """What a repeated request's answer rests on: the session, whether it runs, its record."""
    return row.session_started, row.running, record_of(row)


def _session_text(started: datetime | None) -> str:
    return clock.isoformat(started) if started else "none"


class PeoplesRequests:
    """People's requests (a part of ``Governor``)."""

    async def extend(self, key: str, actor: str, reason: str) -> tuple[int, dict]:
        row = self._known_row(key)
        server_policy = self.policy_named(row.policy)
        before = record_of(row)
        outcome = policy.extend(before, server_policy, reason)
        code = {"granted": 200, "pending": 202, "refused": 409}[outcome.status]
        # Asking again while one waits for an admin changes nothing, as a refusal does.
        again = before.approval_pending and outcome.status == "pending"
        answer = ("extend", actor, outcome.status, outcome.message)  # each asker's on record
        if (again or outcome.status == "refused") and self._answered_before(row, answer):
            # On record once, not a row for each of a script's loop (each with its
            # 2,000-character reason).
            return code, {
                "status": outcome.status,
                "message": outcome.message,
                "verdict": self.verdict(key),
            }
        seconds = server_policy.extension_step.total_seconds() if outcome.status == "granted" else 0
        request = ExtensionRow(
            server_key=key,
            requested_by=actor,
            requested_at=clock.utcnow(),
            seconds=seconds,
            reason=reason or "",
            status=outcome.status,
        )
        why = f"{outcome.status}: {outcome.message}; reason: {reason or '-'}"
        audit = self._audit_row(row, "extend", why, actor=actor)
        # A refused request changes nothing but is on record; a granted or pending one, all of
        # it or none (a store failure must not use an extension up without granting it). Asking
        # again while one waits for an admin is audited, not a second request in their list.
        self._commit(row, outcome.record, [audit], extensions=[] if again else [request])
        if not again:  # the requests on record, as the admins' list has them
            metrics.EXTENSIONS.labels(outcome.status).inc()
        await self.redecide(key)
        if again or outcome.status == "refused":
            self._answered(row, answer)
        else:
            self._asked.pop(key, None)
        return code, {
            "status": outcome.status,
            "message": outcome.message,
            "verdict": self.verdict(key),
        }

    def dismiss_gpu_claim(self, uuid: str, actor: str, reason: str) -> dict:
        """An admin checked a GPU listed as unhealthy and found it fine: its claim leaves the
        health listing, the alert metric and its node's label, until new evidence
        (``HealthWatch.dismiss``). Audited before anything changes. ``LookupError``: no such
        claim; ``ClaimHeld``: a running server is on the card (its owner's state rests on the
        reading: stop the server first)."""
        claim = self.health.claim(uuid)
        if claim is None:
            if self.health.known(uuid):
                raise LookupError(
                    f"GPU {uuid} has no health claim to dismiss: it is not listed as unhealthy"
                )
            raise LookupError(
                f"no GPU {uuid} is known to the governor: GET api/health lists the GPUs with "
                "a health claim"
            )
        holder = self.health.reporter(uuid)
        if holder is None and claim.pod is not None:
            holder = self._servers_by_pod().get(claim.pod)
        if holder is not None:
            raise ClaimHeld(
                f"GPU {uuid} is held by the running server {holder}, whose state rests on this "
                "claim: stop that server first, then dismiss the claim"
            )
        said = "; ".join(claim.health.reasons or claim.health.warnings)
        who = (
            "DCGM"
            if claim.source == "dcgm"
            else f"the report of {in_sentence(claim.server or 'a server')}"
        )
        where = f" (node {claim.node}, GPU {claim.index})" if claim.node else ""
        audit = self._audit_row(
            None,
            "gpu-dismiss",
            f"health claim on GPU {uuid}{where} dismissed: {who} said {said}; reason: {reason}",
            actor=actor,
            details={
                "uuid": uuid,
                "node": claim.node,
                "gpu": claim.index,
                "source": claim.source,
                "server": claim.server,
                "status": claim.health.status,
                "action": claim.health.action,
                "dismissed": sorted(health.evidence(claim.health)),
            },
        )
        dismissal = DismissalRow(
            uuid=uuid,
            evidence=sorted(health.evidence(claim.health)),
            at=clock.utcnow(),
            actor=actor,
        )
        # On record first, with the audit: a store that cannot take them changes nothing.
        self.store.save(audits=[audit], dismissed=[dismissal])
        self.health.dismiss(claim)
        return {"status": "dismissed", "gpu": claim.view(clock.utcnow())}

    async def decide_extension(
        self, key: str, actor: str, approve: bool, seconds: float | None, reason: str
    ) -> dict:
        row = self._known_row(key)
        pending = [e for e in self.store.extensions("pending", key)]
        if not row.approval_pending or not pending:
            raise LookupError(f"no extension of {key} is waiting for approval")
        server_policy = self.policy_named(row.policy)
        seconds = seconds if seconds is not None else server_policy.extension_step.total_seconds()
        record = (
            policy.approve(record_of(row), seconds, server_policy)
            if approve
            else policy.deny(record_of(row))
        )
        for extension in pending:
            extension.status = "approved" if approve else "denied"
            extension.decided_by, extension.decided_at = actor, clock.utcnow()
            extension.decision_reason = reason
            extension.seconds = seconds if approve else 0
        what = f"approved {format_duration(seconds)}" if approve else "denied"
        audit = self._audit_row(
            row,
            "approve" if approve else "deny",
            f"extension {what}; reason: {reason}",
            actor=actor,
        )
        self._commit(row, record, [audit], updated_extensions=pending)
        await self.redecide(key)
        return {"status": "approved" if approve else "denied", "verdict": self.verdict(key)}

    async def exempt(self, key: str, actor: str, until: datetime | None, reason: str) -> dict:
        row = self._known_row(key)
        record = replace(record_of(row), exempt_until=until)
        if until is not None:  # the extensions the owner used stay on record
            record = replace(record.exempted(), exempt_until=until, state=EXEMPT)
        what = f"exempt until {clock.isoformat(until)}" if until else "exemption lifted"
        self._commit(
            row, record, [self._audit_row(row, "exempt", f"{what}; reason: {reason}", actor=actor)]
        )
        await self.redecide(key)
        return {"status": "exempt" if until else "governed", "verdict": self.verdict(key)}

    async def cull_now(
        self,
        key: str,
        actor: str,
        reason: str,
        *,
        immediately: bool = False,
        session: datetime | None = None,
    ) -> dict:
        """An admin takes the GPU back. As a hard deadline: the owner is told and a checkpoint
        taken first (bounded: ``checkpoint_timeout``, one retry), then the cull; a server
        without the extension is culled at once. ``immediately`` skips the checkpoint (a
        server that must go now), on record as such.

        ``session``: the Hub's ``started`` of the session the admin saw (the dashboard's, or
        the API's ``session``). Another session running now, or none, raises ``SessionChanged``
        with nothing done: its owner restarted since, and the new session is not the one the
        admin meant to stop. ``None``: whatever session runs now."""
        row = self._known_row(key)
        user, name = self._hub_names(key)
        if session is not None:  # (then as the Hub writes it, to check again at the DELETE)
            session = await self._same_session(row, user, name, session)
        server_policy = self.policy_named(row.policy)
        why = f"culled by {in_sentence(actor)}: {reason}"
        if self.options.dry_run:
            self.save_audits([self._audit_row(row, "cull", why, actor=actor, dry_run=True)])
            return {"status": "dry-run", "verdict": self.verdict(key)}
        if not immediately:
            record = evolve(
                record_of(row),
                cull_requested_at=clock.utcnow(),
                cull_request_reason=ADMIN,
                cull_request_why=why,
            )
            self._commit(row, record, [self._audit_row(row, "cull-request", why, actor=actor)])
            await self.redecide(key)
            status = "culled" if row.state == CULLED else "requested"
            return {"status": status, "verdict": self.verdict(key)}
        if row.state == CULLED and self._stops.get(key, row) == row.session_started:
            # The Hub took its stop already (perhaps still stopping): asking again would put
            # a second cull on record and send a second DELETE.
            return {"status": "culled", "verdict": self.verdict(key)}
        server = self._servers.get(key) or HubServer(user=user, name=name)
        why += " (immediately, no checkpoint)"
        # On record before it is done (then its outcome), like the pass's culls.
        before = record_of(row)
        culled = replace(before, state=CULLED, culled_at=clock.utcnow(), reason=why)
        audit = self._audit_row(row, "cull", why, actor=actor, details={})
        self._commit(row, culled, [audit], cull_reason=ADMIN)
        try:
            # The admin's session, checked again once the DELETE holds its slot to the Hub.
            outcome = await self._cull(server, row, server_policy, None, session)
        except NotSent as withdrawn:  # it restarted or stopped during the cull: nothing sent
            if record_of(row) is culled:
                set_record(row, before)
            skipped = self._audit_row(
                row, "cull-skipped", f"{why}; not culled: {withdrawn}", actor=actor
            )
            self.save_outcomes([row], [skipped], [])
            raise SessionChanged(f"{key} was not culled: {withdrawn}") from None
        except Exception as error:
            if record_of(row) is culled:  # (not a person's record made during the DELETE)
                set_record(row, before)
            failed = self._audit_row(row, "cull-failed", f"{why}; {error}", actor=actor)
            self.save_outcomes([row], [failed], [])
            raise
        if server_policy.cull_action == STOP_SERVER:  # shutdown-kernels already started it afresh
            set_record(row, culled)
        audit.details = self._cull_outcome(row, server_policy, outcome)
        self.save_outcomes([row], [], [audit])
        metrics.CULLS.labels(ADMIN, server_policy.cull_action).inc()
        return {"status": outcome, "verdict": self.verdict(key)}

    async def _same_session(self, row: ServerRow, user: str, name: str, seen: datetime) -> datetime:
        """The Hub's ``started`` of the session ``seen``; ``SessionChanged`` unless it is the
        one the governor governs and the Hub runs now (asked: the governor's record is as of
        its last pass)."""
        # As listed: to the millisecond (``clock.isoformat``); the Hub keeps microseconds.
        now = row.session_started
        if _session_text(now) == _session_text(seen):
            hub_server, _ = await self.hub.get_server(user, name)
            now = hub_server.started if hub_server is not None else None
        if _session_text(now) != _session_text(seen):
            change = "it stopped" if now is None else "it restarted"
            raise SessionChanged(
                f"the server {row.key} is not the session you asked about: {change} since "
                f"(that session started {_session_text(seen)}; the running one "
                f"{_session_text(now)}). Nothing was done: look again before culling"
            )
        return now

    async def stop_by_owner(self, key: str, actor: str, reason: str) -> dict:
        """The owner gives the GPU back now (the Stop button). Answers at once: the request
        comes from the very server being stopped, which must not wait for its own end."""
        row = self._known_row(key)
        if self._answered_before(row, ("stop", actor)):
            # Its stop is on record and sent: asked again, the Hub is sent no second stop with
            # the governor's token, nor the record a second row. (A stop the Hub failed is
            # carried out again by the pass: ``cull-retry``.)
            return {"status": "stopping", "verdict": self.verdict(key)}
        user, name = self._hub_names(key)
        why = f"stopped by {in_sentence(actor)}" + (f": {reason}" if reason else "")
        stopped = replace(record_of(row), state=CULLED, culled_at=clock.utcnow(), reason=why)
        self._commit(
            row, stopped, [self._audit_row(row, "stop", why, actor=actor)], cull_reason=OWNER_STOP
        )
        self._answered(row, ("stop", actor))
        self._in_background(self._stop_quietly(key, user, name))
        return {"status": "stopping", "verdict": self.verdict(key)}

    def checkpoint_asked(self, key: str, actor: str, reason: str, source: str) -> dict:
        """A person asked the server for a checkpoint (the server tells, before it takes it):
        on record by who asked (a guest's was in no audit trail), nothing else changed. The
        same asker's ask again on the server's record as it is now writes no second row, as
        a repeated Extend does: a script's loop would write one each."""
        row = self._known_row(key)
        answer = ("checkpoint", actor, source)
        if not self._answered_before(row, answer):
            why = f"checkpoint asked by {in_sentence(actor)}" + (f": {reason}" if reason else "")
            details = {"source": source}
            audit = self._audit_row(row, "checkpoint-asked", why, actor=actor, details=details)
            self.store.save(audits=[audit])
            self._answered(row, answer)
        return {"status": "recorded"}

    def _hub_names(self, key: str) -> tuple[str, str]:
        """The user's and the server's name of ``key`` as the Hub knows them (its last listing's:
        a key holds a name the store could not hold as it is only in its kept form)."""
        server = self._servers.get(key)
        if server is not None:
            return server.user, server.name
        user, _, name = key.partition("/")
        return user, name

    async def _stop_quietly(self, key: str, user: str, name: str) -> None:
        # The answer goes back through the server being stopped: let it get home before the
        # Hub stops that server (on record as stopped already, so a restart carries it out).
        await asyncio.sleep(OWNER_STOP_DELAY_S)
        try:
            await self.hub.stop_server(user, name)
        except HubApiError as error:
            log.error("gpu-gov: stopping %s for its owner failed: %s", key, error)

    def _answered_before(self, row: ServerRow, answer: tuple) -> bool:
        """Whether ``answer`` (an owner's request that changed nothing, or a Stop) was given
        already on the server's record as it is now: given again, it is not recorded again."""
        asked = self._asked.get(row.key)
        return asked is not None and asked[0] == _as_is(row) and answer in asked[1]

    def _answered(self, row: ServerRow, answer: tuple) -> None:
        """``answer`` was given (and recorded) on the server's record as it is now. Each answer
        is kept apart: alternating two refusals (no reason given, then one while a request
        waits for an admin) recorded each of them every time."""
        asked = self._asked.get(row.key)
        if asked is None or asked[0] != _as_is(row):
            asked = self._asked[row.key] = (_as_is(row), set())
        asked[1].add(answer)

    def _known_row(self, key: str) -> ServerRow:
        row = self.row(key)
        if row is None:
            raise KeyError(key)
        return row
