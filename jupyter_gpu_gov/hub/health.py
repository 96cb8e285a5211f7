"""GPU health on the governor's side (docs/health.md).

Per server, in each pass (``Governor._govern``, a few steps per device it holds): the health of
its GPUs from DCGM (trusted) and its report (the owner's word, believed only where DCGM does not
read the GPU). A server on a GPU that *failed* (``core.health``, ``action="reset"``):

- its GPU activity is unknown: it is never warned or culled as idle, nor as inactive;
- a checkpoint is asked for, once, when its policy checkpoints;
- its state is ``gpu-failed`` and its verdict tells the owner what happened and what to do.

A GPU that needs a reset once its work is done (``drain``) only adds a note to the verdict; a
hard deadline (max age, a reclaim) or an admin's cull still applies to a server on a failed GPU.

Per pass: the cluster's unhealthy GPUs (DCGM's with node and GPU index, the reports' for GPUs
DCGM does not see) and the GPUs DCGM stopped reporting while their node still answers, for the
dashboard, ``GET api/health`` and the metrics the shipped alert rules read; servers whose GPU
state has been unknown longer than ``unknown_alert_after`` are flagged (audited once, counted
in a metric), never culled for it. With ``node_action`` set, the Kubernetes node of a GPU DCGM
finds unhealthy is labelled (or cordoned) through the Kubernetes API, audited first.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ..core import clock, grant, health, policy
from ..core.health import Health
from ..core.policy import Decision, Policy, Record, ServerView, evolve
from ..core.vocabulary import (
    CHECKPOINT,
    CHECKPOINT_DONE,
    CHECKPOINT_FAILED,
    CHECKPOINT_REQUESTED,
    CHECKPOINT_TIMEOUT,
    CULL,
    CULLED,
    DNS_SUBDOMAIN,
    GPU_FAILED,
    NODE_UNHEALTHY_ANNOTATION,
    NODE_UNHEALTHY_LABEL,
    UNKNOWN,
)
from . import metrics
from .dcgm import DcgmSnapshot, GpuEvidence

log = logging.getLogger("jupyter_gpu_gov.hub")

NODE_ACTIONS = ("none", "label", "cordon")
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def bearer(token_file: str) -> dict[str, str]:
    """The ``Authorization`` header of the service account's token, read each time (the
    kubelet rotates bound tokens); none without the file. Raises ``OSError`` naming the file
    when it cannot be read as text (a projected token of mode 0600 for a governor not running
    as its owner): the caller fails that request, never its pass."""
    path = Path(token_file)
    try:
        if not token_file or not path.is_file():
            return {}
        return {"Authorization": f"Bearer {path.read_text(encoding='ascii').strip()}"}
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else "not text"
        raise OSError(f"cannot read the token file {token_file}: {why}") from None


# A GPU DCGM has not reported for this long is forgotten (its node was removed for good).
FORGET_AFTER = timedelta(days=1)
# A GPU's UUID as NVML and DCGM write it (GPU-<hex and dashes>; MIG-… for an instance).
_GPU_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]{1,100}")


@dataclass(frozen=True)
class HealthOptions:
    unknown_alert_after: timedelta = timedelta(minutes=30)
    node_action: str = "none"  # none | label | cordon
    kubernetes_api_url: str = ""
    kubernetes_token_file: str = f"{SERVICE_ACCOUNT}/token"
    kubernetes_ca_file: str = f"{SERVICE_ACCOUNT}/ca.crt"


@dataclass
class GpuProblem:
    """A GPU that is not healthy (or warns: throttling), as admins see it."""

    uuid: str
    health: Health
    source: str  # dcgm (trusted) | report (the owner's server says so)
    since: datetime
    node: str | None = None
    index: int | None = None
    model: str | None = None
    mig_profile: str | None = None
    pod: tuple[str | None, str] | None = None  # (namespace, pod) DCGM sees on it
    server: str | None = None  # the server holding it, where known
    allocated: bool = False  # a report's, on a GPU the Hub's records gave its server

    def view(self, now: datetime) -> dict:
        return {
            "uuid": self.uuid,
            "node": self.node,
            "gpu": self.index,
            "model": self.model,
            "mig_profile": self.mig_profile,
            **self.health.as_dict(),
            "source": self.source,
            "since": clock.isoformat(self.since),
            "for_s": int((now - self.since).total_seconds()),
            "pod": None if self.pod is None else {"namespace": self.pod[0], "name": self.pod[1]},
            "server": self.server,
        }


@dataclass
class _Seen:
    node: str | None
    index: int | None
    model: str | None


@dataclass
class HealthWatch:
    options: HealthOptions = field(default_factory=HealthOptions)
    # the last DCGM snapshot's unhealthy GPUs, and those it stopped reporting, by physical uuid
    dcgm: dict[str, GpuProblem] = field(default_factory=dict)
    # the reports' GPUs that are not healthy, by server key and uuid, as of its last pass
    reported: dict[str, dict[str, GpuProblem]] = field(default_factory=dict)
    flagged: dict[str, datetime] = field(default_factory=dict)  # server key -> unknown since
    # What a stopped server reported of a GPU the Hub's records gave it, by uuid: where the
    # failure is real, the workstation allocator (which reads the cards itself, never a
    # report) withholds the card, so an admin must still see why. It is its owner's word
    # alone: kept only until the Hub's records give the card to a server (the allocator hands
    # out no card it reads failed), a report lists it, or DCGM reads it.
    left: dict[str, GpuProblem] = field(default_factory=dict)
    # The claims an admin dismissed (``POST api/health/<uuid>/dismiss``), by physical uuid: the
    # evidence dismissed. A dismissal lasts while the card's claim rests on no more than that
    # (``core.health.still_dismissed``) and ends when the card has no claim any more. Kept in
    # the store too (``health_dismissals``): a restart of the service reads them back
    # (``restore``), and those that ended are deleted there after the pass (``ended``).
    dismissals: dict[str, frozenset[str]] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)  # dismissals ended, not yet deleted in store
    # Read back at a start and not yet met again: until its claim is read (or DCGM reads the
    # card without one), a dismissal's missing claim is not known to have ended.
    _restored: set[str] = field(default_factory=set)
    _dismissed_once: set[str] = field(default_factory=set)  # to say "no claim", not "unknown"
    _snapshot: DcgmSnapshot | None = None
    # The DCGM records (by uuid) last read for problems, and the problems they showed.
    _indexed: Mapping | None = None
    _read: dict[str, GpuProblem] = field(default_factory=dict)
    _seen: dict[str, _Seen] = field(default_factory=dict)  # every GPU DCGM reported
    _gone: dict[str, datetime] = field(default_factory=dict)  # since when DCGM misses it
    _since: dict[str, datetime] = field(default_factory=dict)  # uuid -> unhealthy since
    _nodes: dict[str, str] = field(default_factory=dict)  # node -> what we did to it
    _patching: dict[str, str] = field(default_factory=dict)  # node -> a patch under way
    _http: AsyncHTTPClient | None = None

    # -- one server ---------------------------------------------------------------------------

    def of_server(
        self,
        key: str,
        report: Mapping | None,
        evidence: Sequence[GpuEvidence],
        now: datetime,
        records: Mapping | None = None,
    ) -> Health | None:
        """The health of the GPUs a server holds when one is unhealthy, else ``None``.

        DCGM's word wins where it reads the GPU: a report saying a GPU failed that DCGM reads
        as healthy and working is not believed (it would keep the server from idle culls).
        ``records``: the server's spawner state (which GPUs the Hub's records give it)."""
        noted = {}
        if self.left:  # the allocator handed such a card out again: it reads it healthy itself
            for granted in grant.devices(records):
                self.left.pop(granted.parent_uuid or granted.uuid, None)
        # A report ends a stopped server's claim on a card only where the Hub's records stand
        # behind it: one with none names any card, and hid another's failure from the panel.
        placed = grant.devices(records) or grant.pod(records)
        for device in report["devices"] if report is not None else ():
            if self.left and placed:  # a card a stopped server left failed, reported on again
                self.left.pop(device.get("parent_uuid") or device["uuid"], None)
            sent = device.get("health")
            if sent is None or sent["status"] == health.OK:  # most devices: nothing to do
                continue
            uuid = device.get("parent_uuid") or device["uuid"]
            if not _GPU_UUID.fullmatch(uuid):
                # No GPU is named so (NVML's, DCGM's: GPU-…, MIG-…): the claim is on no GPU,
                # and no admin could name it to dismiss it (its 1 kB name went to /metrics).
                continue
            noted[uuid] = GpuProblem(
                uuid=uuid,
                health=health.from_dict(sent),
                source="report",
                since=self._since.get(uuid, now),
                mig_profile=device.get("mig_profile"),
                model=device.get("name"),
                server=key,
            )
        trusted = [e.health for e in evidence if e.health is not None and not self._cleared(e)]
        readable = evidence and all(e.activity is not None for e in evidence)
        # DCGM reads its GPUs healthy: the report's claims are neither believed nor shown (an
        # admin would take a healthy GPU out of service on the owner's word).
        dismissed = trusted and readable and all(h.status == health.OK for h in trusted)
        if noted and not dismissed:
            allocated = {d.parent_uuid or d.uuid for d in grant.devices(records)}
            for uuid, problem in noted.items():
                problem.allocated = uuid in allocated
            self.reported[key] = noted
        elif self.reported:
            self.reported.pop(key, None)
        claimed = [p.health for p in noted.values() if p.health.status == health.UNHEALTHY]
        failing = [h for h in trusted if h.status == health.UNHEALTHY]
        if failing:
            return health.combine(failing + claimed)
        if not claimed or dismissed:
            return None
        return health.combine(claimed)

    def prepare(
        self, view: ServerView, record: Record, failure: Health | None
    ) -> tuple[ServerView, Record]:
        """Before the policy decides: a failed GPU makes the server's activity unknown (never
        idle, never inactive); a server whose GPU is back starts a fresh idle stretch."""
        if failure is not None and failure.failed:
            detail = f"its GPU failed: {failure.reasons[0]}"
            sees_cells = view.gpu.sees_cells if view.gpu is not None else True
            gpu = policy.GpuSignal(
                holds_gpu=True, active=None, sees_cells=sees_cells, detail=detail
            )
            return evolve(view, gpu=gpu), record
        if record.state == GPU_FAILED:
            return view, record.new_idle_stretch()
        return view, record

    def review(
        self,
        decision: Decision,
        failure: Health | None,
        server_policy: Policy,
        now: datetime,
        checkpointable: bool = True,
    ) -> Decision:
        """After the policy decided: the owner of a server on a failed GPU gets the truth and a
        checkpoint (when its server can be asked: a fresh report brings its verdict back);
        nothing the policy decided for another reason (a hard deadline, a cull under way, an
        exemption) is undone."""
        if failure is None:
            return decision
        record = decision.record
        if not failure.failed or decision.state != UNKNOWN or CULL in decision.actions:
            note = drain_note(failure) if not failure.failed else owner_notice(failure, None)
            if note in record.reason or decision.state == CULLED:
                return decision
            return evolve(decision, record=evolve(record, reason=f"{record.reason}; {note}"))
        actions = decision.actions
        if server_policy.checkpoint and checkpointable and record.checkpoint_status is None:
            record = evolve(
                record, checkpoint_status=CHECKPOINT_REQUESTED, checkpoint_requested_at=now
            )
            actions = (*actions, CHECKPOINT)
        notice = owner_notice(failure, record.checkpoint_status)
        failed = Decision(evolve(record, state=GPU_FAILED, reason=notice), actions)
        return policy.keep_hard_deadline(failed, decision)  # a hard deadline still holds

    def flag(self, key: str, record: Record, now: datetime) -> str | None:
        """Whether the server's GPU state has been unknown too long: the reason to audit when
        it is newly so (``None`` otherwise). Flagged servers are listed for admins, never
        culled for it."""
        since = record.paused_at
        if record.state not in (UNKNOWN, GPU_FAILED) or since is None:
            self.flagged.pop(key, None)
            return None
        if now - since < self.options.unknown_alert_after or key in self.flagged:
            return None
        self.flagged[key] = since
        return (
            f"GPU state unknown since {since:%Y-%m-%d %H:%M} UTC ({record.reason}): "
            "an admin should look; the governor does not cull it for that"
        )

    # -- the pass -----------------------------------------------------------------------------

    def observe_dcgm(
        self,
        snapshot: DcgmSnapshot | None,
        by_uuid: Mapping[str, Sequence[GpuEvidence]],
        now: datetime,
    ) -> None:
        """The cluster's GPUs as a new DCGM snapshot has them (``by_uuid``: its records by
        physical GPU; a pass reusing the last snapshot changes nothing): the unhealthy ones and
        those that warn, and those it stopped reporting while their node still answers. The
        records are read again only when the pass indexed new ones (``by_uuid`` is kept while
        the exporters say the same): most snapshots cost set operations, about 1 ms for 10,000
        GPUs, not a look at each GPU's health (80 ms)."""
        if snapshot is None or snapshot is self._snapshot:
            return
        self._snapshot = snapshot
        if by_uuid is not self._indexed:
            self._indexed = by_uuid
            self._read = self._problems_of(snapshot.evidence, by_uuid, now)
        problems = dict(self._read)
        for uuid in by_uuid.keys() - self._seen.keys():  # new GPUs (every GPU, the first time)
            first = by_uuid[uuid][0]
            self._seen[uuid] = _Seen(first.hostname, first.gpu_index, first.model)
        gone = self._seen.keys() - by_uuid.keys()
        for uuid in self._gone.keys() - gone:  # back
            del self._gone[uuid]
        for uuid in self.left.keys() & by_uuid.keys():  # DCGM reads it: its word
            del self.left[uuid]
        nodes = {records[0].hostname for records in by_uuid.values()} if gone else set()
        for uuid in gone:
            seen, since = self._seen[uuid], self._gone.setdefault(uuid, now)
            if now - since > FORGET_AFTER:  # its node went away for good
                del self._seen[uuid], self._gone[uuid]
            elif seen.node in nodes:  # the node answers, this GPU does not: off the bus?
                why = (
                    f"DCGM has not reported this GPU since {since:%Y-%m-%d %H:%M} UTC while its "
                    "node still reports its other GPUs (fallen off the bus?)"
                )
                problems[uuid] = GpuProblem(
                    uuid, health.unknown(why), "dcgm", since, seen.node, seen.index, seen.model
                )
        self.dcgm = problems

    @staticmethod
    def _problems_of(
        evidence: Sequence[GpuEvidence], by_uuid: Mapping[str, Sequence[GpuEvidence]], now
    ) -> dict[str, GpuProblem]:
        """The GPUs whose DCGM records, combined, are unhealthy or warn."""
        problems = {}
        for e in evidence:
            checked = e.health
            if checked is None or checked is health.HEALTHY or e.uuid in problems:
                continue
            records = by_uuid.get(e.uuid, (e,))
            combined = health.combine(r.health for r in records if r.health is not None)
            if combined.status == health.OK and not combined.warnings:
                continue
            owner = next((r.owner for r in records if r.owner), None)
            problems[e.uuid] = GpuProblem(
                e.uuid, combined, "dcgm", now, e.hostname, e.gpu_index, e.model, pod=owner
            )
        return problems

    def _claims(self) -> dict[str, GpuProblem]:
        """Every GPU that is not healthy by uuid, dismissed or not: DCGM's word first, then the
        reports' of GPUs DCGM does not know."""
        found = dict(self.left)
        found.update((u, p) for noted in self.reported.values() for u, p in noted.items())
        found.update(self.dcgm)
        return found

    def _cleared(self, e: GpuEvidence) -> bool:
        """DCGM's reading of a GPU whose claim an admin dismissed, with nothing new since."""
        dismissed = self.dismissals.get(e.uuid) if self.dismissals else None
        return dismissed is not None and health.still_dismissed(dismissed, e.health)

    def problems(self, now: datetime) -> list[GpuProblem]:
        """Every GPU that is not healthy, but those whose claim an admin dismissed with nothing
        new since, each with the time it was first seen so (kept while it stays so)."""
        found = self._claims()
        for uuid, dismissed in list(self.dismissals.items()):
            claim = found.get(uuid)
            if claim is not None and health.still_dismissed(dismissed, claim.health):
                del found[uuid]
                self._restored.discard(uuid)
            elif claim is None and uuid in self._restored and uuid not in (self._indexed or {}):
                continue  # not read since the restart: not known to be gone
            else:  # the claim went, or new evidence came: the next claim is listed
                del self.dismissals[uuid]
                self._restored.discard(uuid)
                self.ended.add(uuid)
        for uuid in list(self._since):
            if uuid not in found:
                del self._since[uuid]
        for uuid, problem in found.items():
            problem.since = self._since.setdefault(uuid, problem.since)
        return sorted(found.values(), key=lambda p: (p.node or "", p.index or 0, p.uuid))

    def finish_pass(self, stopped: Iterable[str], now: datetime) -> list[GpuProblem]:
        """After every server was governed: forget what the servers that stopped reported,
        publish the metrics; returns the GPUs that are not healthy."""
        for key in stopped:
            self.flagged.pop(key, None)
            for uuid, problem in self.reported.pop(key, {}).items():
                if problem.allocated and problem.health.status != health.OK:
                    self.left[uuid] = problem
        found = self.problems(now)
        metrics.observe_gpu_health(
            [
                (p.node or "", "" if p.index is None else str(p.index), p.uuid, p.health, p.source)
                for p in found
                if p.health.status != health.OK  # a warning alone is shown, not alerted on
            ],
            len(self.flagged),
        )
        return found

    def admin_view(self, now: datetime, rows: Mapping) -> dict:
        """``GET api/health``: unhealthy GPUs, and the servers flagged as unknown too long
        (``rows``: the governor's rows by key, for the flagged ones' state and reason)."""
        flagged = []
        for key, since in sorted(self.flagged.items()):
            row = rows.get(key)
            flagged.append(
                {
                    "server": key,
                    "unknown_since": clock.isoformat(since),
                    "for_s": int((now - since).total_seconds()),
                    "state": getattr(row, "state", None),
                    "reason": getattr(row, "reason", None),
                }
            )
        return {
            "gpus": [p.view(now) for p in self.problems(now)],
            "flagged": flagged,
            "unknown_alert_after_s": int(self.options.unknown_alert_after.total_seconds()),
            "node_action": self.options.node_action,
        }

    # -- an admin's dismissal ---------------------------------------------------------------------

    def claim(self, uuid: str) -> GpuProblem | None:
        """The claim listed for the GPU ``uuid`` now (``None``: none, or it is dismissed)."""
        found = self._claims().get(uuid)
        dismissed = self.dismissals.get(uuid)
        if found is None or (dismissed and health.still_dismissed(dismissed, found.health)):
            return None
        return found

    def known(self, uuid: str) -> bool:
        """Whether DCGM or a running server's report has named the GPU ``uuid``, or an admin
        dismissed a claim on it."""
        return (
            uuid in self._seen
            or uuid in self._dismissed_once
            or any(uuid in noted for noted in self.reported.values())
        )

    def reporter(self, uuid: str) -> str | None:
        """The running server whose own report claims the GPU ``uuid`` is unhealthy."""
        return next((key for key, noted in self.reported.items() if uuid in noted), None)

    def dismiss(self, claim: GpuProblem) -> None:
        """An admin checked the card and found nothing wrong (audited by the caller first):
        its claim is no longer listed, alerted on or held against its node, until new evidence
        (``core.health.still_dismissed``) or a claim after it went."""
        self.dismissals[claim.uuid] = health.evidence(claim.health)
        self.ended.discard(claim.uuid)
        self._restored.discard(claim.uuid)
        self._dismissed_once.add(claim.uuid)  # a card of the cluster's: a few thousand at most
        self.left.pop(claim.uuid, None)  # a stopped server's word: nothing will renew it

    def restore(self, dismissals: Mapping[str, frozenset[str]]) -> None:
        """The dismissals the store kept (a start, a takeover): in force again until new
        evidence, or the claim's end once the card is read again, ends each."""
        self.dismissals = dict(dismissals)
        self._restored = set(dismissals)
        self._dismissed_once.update(dismissals)
        self.ended.clear()

    def take_ended(self) -> list[str]:
        """The dismissals that ended since the last call (to delete from the store)."""
        ended, self.ended = sorted(self.ended), set()
        return ended

    # -- Kubernetes nodes ---------------------------------------------------------------------

    def node_changes(self) -> list[tuple[str, dict, str, str]]:
        """What to do to each node now: ``(node, merge patch, action, reason)``. Only DCGM's
        word (never a report's) touches a node; a node is marked once per unhealthy stretch,
        and unmarked (our label and annotation removed, never uncordoned) once healthy."""
        mode = self.options.node_action
        if mode == "none":
            return []
        bad: dict[str, list[GpuProblem]] = {}
        for problem in self.dcgm.values():
            if problem.uuid in self.dismissals:  # (``problems`` ended those with new evidence)
                continue
            if problem.health.status == health.UNHEALTHY and problem.node:
                bad.setdefault(problem.node, []).append(problem)
        changes = []
        for node, problems in sorted(bad.items()):
            cordon = mode == "cordon" and any(p.health.failed for p in problems)
            action = "node-cordon" if cordon else "node-label"
            if action in (self._nodes.get(node), self._patching.get(node)):
                continue  # done, or under way: a patch still in flight is not sent again
            if not DNS_SUBDOMAIN.fullmatch(node):
                continue
            reasons = "; ".join(
                f"GPU {p.index} ({p.uuid}): {', '.join(p.health.reasons)}" for p in problems
            )
            patch: dict = {
                "metadata": {
                    "labels": {NODE_UNHEALTHY_LABEL: "true"},
                    "annotations": {NODE_UNHEALTHY_ANNOTATION: reasons[:4000]},
                }
            }
            if cordon:
                patch["spec"] = {"unschedulable": True}
            changes.append((node, patch, action, f"unhealthy GPU on node {node}: {reasons}"))
        for node in [n for n in self._nodes if n not in bad and n not in self._patching]:
            patch = {
                "metadata": {
                    "labels": {NODE_UNHEALTHY_LABEL: None},
                    "annotations": {NODE_UNHEALTHY_ANNOTATION: None},
                }
            }
            why = f"every GPU of node {node} is healthy again (a cordon stays: uncordon by hand)"
            changes.append((node, patch, "node-unlabel", why))
        return changes

    async def patch_node(self, node: str, patch: dict, action: str) -> None:
        """Send one merge patch to the Kubernetes API (the service account needs ``patch`` on
        ``nodes``); remembered only once it succeeded, so a failure is retried next pass, and
        while it is in flight the next pass does not ask for it again."""
        self._patching[node] = action
        try:
            await self._patch_node(node, patch, action)
        finally:
            self._patching.pop(node, None)

    async def _patch_node(self, node: str, patch: dict, action: str) -> None:
        url = self.options.kubernetes_api_url.rstrip("/")
        headers = {"Content-Type": "application/merge-patch+json"}
        ca = self.options.kubernetes_ca_file
        if self._http is None:
            self._http = AsyncHTTPClient()
        try:
            headers.update(bearer(self.options.kubernetes_token_file))
            request = HTTPRequest(
                f"{url}/api/v1/nodes/{quote(node, safe='')}",
                method="PATCH",
                headers=headers,
                body=json.dumps(patch),
                ca_certs=ca if url.startswith("https:") and Path(ca).is_file() else None,
                request_timeout=10,
                follow_redirects=False,
            )
            await self._http.fetch(request)
        except Exception as error:  # retried next pass; the audit says it was asked for
            log.error("gpu-gov: %s of node %s failed: %s", action, node, error)
            return
        if action == "node-unlabel":
            self._nodes.pop(node, None)
        else:
            self._nodes[node] = action


def not_a_uuid(uuid: str) -> str | None:
    """What is wrong with ``uuid`` as a GPU's UUID an admin names (``None``: nothing)."""
    if _GPU_UUID.fullmatch(uuid):
        return None
    return f"{uuid[:80]!r} is not a GPU UUID (as GET api/health lists them: GPU-…)"


def owner_notice(failure: Health, checkpoint_status: str | None) -> str:
    """What the owner of a server on a failed GPU reads (the verdict's reason)."""
    parts = [f"Your GPU failed ({failure.reasons[0]})"]
    if checkpoint_status == CHECKPOINT_REQUESTED:
        parts.append("a checkpoint of your work is being saved")
    elif checkpoint_status == CHECKPOINT_DONE:
        parts.append("your work was checkpointed")
    elif checkpoint_status in (CHECKPOINT_FAILED, CHECKPOINT_TIMEOUT):
        parts.append("the checkpoint of your work failed: save what you can")
    parts.append("restart your server to get another GPU")
    return "; ".join(parts)


def drain_note(failure: Health) -> str:
    return (
        f"your GPU needs maintenance ({failure.reasons[0]}): "
        "restart your server when convenient to move to another GPU"
    )
