"""Checkpoints before a cull, as the governor sees them: a request goes out in the verdict
(``hub/outbound.py``), its result comes back in the server's next report — one channel — and
is applied to the request it answers, or timed out; and how a checkpoint reads in the audit
trail and the admin view."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from ..checkpoint_layout import MANIFEST_REPORTED_BYTES, abridged
from ..core import clock
from ..core.durations import format_duration
from ..core.policy import Policy, Record
from ..core.vocabulary import (
    CHECKPOINT_DONE,
    CHECKPOINT_FAILED,
    CHECKPOINT_REQUESTED,
    CHECKPOINT_TIMEOUT,
)
from .tables import AuditRow, ServerRow

# A report's checkpoint time is the server's clock, written to the millisecond; the governor's
# request time is its own, to the microsecond. A result this much older still answers.
CHECKPOINT_CLOCK_SLACK = timedelta(seconds=1)


@dataclass(frozen=True)
class CheckpointResult:
    """A finished checkpoint, waiting to be applied to the request it answers."""

    status: str  # done | failed
    manifest: dict | None
    requested_at: datetime | None  # when it was asked for (None: unknown)
    dry_run: bool = False

    def answers(self, record: Record) -> bool:
        """Whether this result answers the governor's current request: a checkpoint taken
        before it (the user's, or an earlier request's) does not."""
        if record.checkpoint_status != CHECKPOINT_REQUESTED:
            return False
        if record.checkpoint_requested_at is None:
            return True
        return (
            self.requested_at is not None
            and self.requested_at >= record.checkpoint_requested_at - CHECKPOINT_CLOCK_SLACK
        )


def reported_checkpoint(checkpoint) -> CheckpointResult | None:
    """The finished checkpoint a report carries (``{"requested_at", "status", "manifest"}``)."""
    if not isinstance(checkpoint, Mapping) or checkpoint.get("status") not in (
        CHECKPOINT_DONE,
        CHECKPOINT_FAILED,
    ):
        return None
    manifest = checkpoint.get("manifest")
    when = checkpoint.get("requested_at")
    if when is None and isinstance(manifest, Mapping):
        when = manifest.get("requested_at")
    try:
        requested_at = clock.parse(when) if isinstance(when, str) else None
    except ValueError:
        requested_at = None
    return CheckpointResult(checkpoint["status"], manifest, requested_at)


def checkpoint_errors(manifest: Mapping | None) -> list[str]:
    """A checkpoint's problems, one readable line each: the manifest's errors, or the error of
    the request itself (unreachable server, timeout)."""
    if not isinstance(manifest, Mapping):
        return []
    lines = []
    for error in _listed(manifest.get("errors")):
        if isinstance(error, Mapping):  # older servers: {"path", "error"}
            text = ": ".join(str(error[k]) for k in ("path", "error", "message") if error.get(k))
        else:
            text = str(error)
        if text:
            lines.append(text)
    if not lines and manifest.get("error"):
        lines.append(str(manifest["error"]))
    return lines


def result_status(manifest: Mapping | None) -> str | None:
    if not isinstance(manifest, Mapping):
        return None
    if manifest.get("status") in (CHECKPOINT_DONE, CHECKPOINT_FAILED):
        return manifest["status"]
    return "failed" if manifest.get("error") else "done" if manifest.get("dry_run") else None


def checkpoint_fields(manifest: Mapping | None) -> dict:
    """Where a checkpoint is and what went wrong, for audit details and the admin view."""
    manifest = manifest if isinstance(manifest, Mapping) else {}
    return {
        "id": _text(manifest.get("id")),
        "path": _text(manifest.get("path")),
        "errors": checkpoint_errors(manifest),
    }


# A manifest is the server's words, of any shape within a report's JSON (the report checks that
# it is an object, nothing more): each field is read only as far as it is what the manifest's
# table (docs/api.md) says. ``{"notebooks": 5}`` failed every decision of its server, so an
# answer so to each checkpoint request held its cull for good; ``{"errors": 5}`` made every
# listing of the admin's a 500.


def _listed(value) -> list | tuple:
    """A list field: as sent, one text as a list of it, anything else none."""
    if isinstance(value, list | tuple):
        return value
    return [value] if isinstance(value, str) else []


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def checkpoint_summary(status: str, manifest: Mapping | None, shown: int = 3) -> str:
    """The audit reason of a finished checkpoint: where it is, or what went wrong."""
    manifest = manifest if isinstance(manifest, Mapping) else {}
    errors = checkpoint_errors(manifest)
    if status == "done" and not errors:
        if manifest.get("dry_run"):
            return "checkpoint skipped (dry run)"
        notebooks = len(_listed(manifest.get("notebooks")))
        path = _text(manifest.get("path"))
        where = f" in {path}" if path else ""
        plural = "" if notebooks == 1 else "s"
        return f"checkpoint saved{where} ({notebooks} notebook{plural})"
    if not errors:
        return f"checkpoint {status} (no error given)"
    more = len(errors) - shown
    text = "; ".join(e[:300] for e in errors[:shown]) + (f"; and {more} more" if more > 0 else "")
    return f"checkpoint {status}: {text}"


class Checkpoints:
    """The checkpoint results of the pass (a part of ``Governor``)."""

    def _apply_checkpoint_result(
        self, key: str, record: Record, row: ServerRow, audits: list[AuditRow]
    ) -> Record:
        """The finished checkpoint that answers the current request, on the record and on
        record (``checkpoint-done`` or ``checkpoint-failed``); any other result is dropped."""
        result = self._checkpoints.pop(key, None)
        if result is None or not result.answers(record):
            return record
        # A server's words: kept (store, audit, API) within what an honest report carries.
        manifest = result.manifest
        if isinstance(manifest, Mapping):
            manifest = abridged(manifest, MANIFEST_REPORTED_BYTES)
        row.checkpoint_manifest = manifest
        audits.append(
            self._audit_row(
                row,
                f"checkpoint-{result.status}",
                checkpoint_summary(result.status, manifest),
                dry_run=result.dry_run,
                details={
                    **checkpoint_fields(manifest),
                    "status": result.status,
                    "requested_at": clock.isoformat(record.checkpoint_requested_at),
                },
            )
        )
        return replace(record, checkpoint_status=result.status)

    def _checkpoint_timeout(
        self,
        row: ServerRow,
        record: Record,
        server_policy: Policy,
        now: datetime,
        audits: list[AuditRow],
    ) -> Record:
        """No answer within the policy's checkpoint_timeout: a failed checkpoint, on record
        like one, so the admin view says so instead of showing an older checkpoint."""
        asked = record.checkpoint_requested_at
        if (
            record.checkpoint_status != CHECKPOINT_REQUESTED
            or asked is None
            or now - asked < server_policy.checkpoint_timeout
        ):
            return record
        error = f"no answer within {format_duration(server_policy.checkpoint_timeout)}"
        row.checkpoint_manifest = {"error": error}
        audits.append(
            self._audit_row(
                row,
                "checkpoint-failed",
                checkpoint_summary(CHECKPOINT_FAILED, row.checkpoint_manifest),
                details={
                    **checkpoint_fields(row.checkpoint_manifest),
                    "status": CHECKPOINT_TIMEOUT,
                    "requested_at": clock.isoformat(asked),
                },
            )
        )
        return replace(record, checkpoint_status=CHECKPOINT_TIMEOUT)
