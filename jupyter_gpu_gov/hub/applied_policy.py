"""Applied policies, kept where the service reads its policies at start-up: the governor's store
(docs/api.md, "Policy admin", says why the store and not a file).

Each apply, revert to the config file, and supersession by the config file is a row of
``applied_policies``; the newest says what governs after a restart. A row is written in the
same transaction as its audit row: there is never an applied policy the audit does not show,
nor an audit row of an apply that was not kept.

An apply carries the fingerprint of the config file's policies it was applied over. At start-up,
if the config file's policies are no longer those, the config file wins: a ``superseded`` row
says so and when, so the stale apply never comes back, even if the config file is later put
back as it was.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import JSON, Column, Integer, MetaData, String, Table, Text, insert, select
from sqlalchemy.exc import DBAPIError

from ..core import clock
from .store import StoreUnavailable
from .tables import AuditRow, UtcDateTime

APPLIED, REVERTED, SUPERSEDED = "applied", "reverted", "superseded"

metadata = MetaData()
APPLIED_POLICIES = Table(
    "applied_policies",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UtcDateTime(), nullable=False),
    Column("kind", String(16), nullable=False),  # applied | reverted | superseded
    Column("actor", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    Column("candidate", JSON),  # an apply's {"policies": [...], "policy_defaults": {...}}
    Column("config_fingerprint", String(64), nullable=False),
    Column("of_id", Integer),  # a supersession's apply
    Column("audit_id", Integer),
)


def fingerprint(config: Mapping, timeout_s: float, max_age_s: float | None) -> str:
    """The config file's policies, hashed: ``policies`` and ``policy_defaults`` and the timeout
    and max_age they are built over (a change to any of them changes what the file asks for)."""
    material = {**config, "timeout_s": timeout_s, "max_age_s": max_age_s}
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    kind: str
    at: datetime
    actor: str
    reason: str
    config_fingerprint: str
    candidate: dict | None = None
    of: Entry | None = None  # a supersession's apply
    id: int | None = None

    def summary(self) -> dict:
        return {"by": self.actor, "at": clock.isoformat(self.at), "reason": self.reason}


def record(store, audit: AuditRow, entry: Entry) -> None:
    """The audit row, then the entry, in one transaction: both on record, or neither and
    ``StoreUnavailable`` says why."""
    metadata.create_all(store.engine)
    try:
        with store.session() as session, session.begin():
            session.add(audit)
            session.flush()  # the audit row's id
            session.execute(
                insert(APPLIED_POLICIES).values(
                    at=entry.at,
                    kind=entry.kind,
                    actor=entry.actor,
                    reason=entry.reason,
                    candidate=entry.candidate,
                    config_fingerprint=entry.config_fingerprint,
                    of_id=entry.of.id if entry.of else None,
                    audit_id=audit.id,
                )
            )
    except DBAPIError as error:
        raise StoreUnavailable(store.url, error) from error


def newest(engine) -> Entry | None:
    """The last apply, revert or supersession (None: nothing was ever applied here)."""
    metadata.create_all(engine)
    with engine.connect() as db:
        row = db.execute(
            select(APPLIED_POLICIES).order_by(APPLIED_POLICIES.c.id.desc()).limit(1)
        ).first()
        of = None
        if row is not None and row.of_id is not None:
            of = db.execute(
                select(APPLIED_POLICIES).where(APPLIED_POLICIES.c.id == row.of_id)
            ).first()
    return _entry(row, _entry(of)) if row is not None else None


def _entry(row, of: Entry | None = None) -> Entry | None:
    if row is None:
        return None
    return Entry(
        kind=row.kind,
        at=row.at,
        actor=row.actor,
        reason=row.reason,
        config_fingerprint=row.config_fingerprint,
        candidate=row.candidate,
        of=of,
        id=row.id,
    )
