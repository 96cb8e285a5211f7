"""The governor's tables (SQLAlchemy ORM): a server's row and the policy ``Record`` it holds,
extension requests, the audit trail, the usage ledger's buckets and sessions, and ``meta``.
``hub/store.py`` reads and writes them, and migrates the schema."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from ..core.policy import Decision, Record


class Base(DeclarativeBase):
    pass


class UtcDateTime(TypeDecorator):
    """Timezone-aware UTC in and out, whatever the database does with time zones (SQLite
    drops them)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return value.astimezone(timezone.utc) if value is not None else None

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class ServerRow(Base):
    __tablename__ = "servers"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)  # "user/name"
    user: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    session_started: Mapped[datetime | None] = mapped_column(UtcDateTime())
    team: Mapped[str | None] = mapped_column(String(255))
    project: Mapped[str | None] = mapped_column(String(255))
    tier: Mapped[str | None] = mapped_column(String(255))
    profile: Mapped[str | None] = mapped_column(String(255))
    labels: Mapped[dict] = mapped_column(JSON, default=dict)
    policy: Mapped[str | None] = mapped_column(String(255))
    running: Mapped[bool] = mapped_column(Boolean, default=True)
    # The policy Record, one column per field (see _RECORD_FIELDS).
    state: Mapped[str] = mapped_column(String(32), default="active")
    idle_since: Mapped[datetime | None] = mapped_column(UtcDateTime())
    warned_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    extension_s: Mapped[float] = mapped_column(Float, default=0.0)
    extensions_used: Mapped[int] = mapped_column(Integer, default=0)
    approval_pending: Mapped[bool] = mapped_column(Boolean, default=False)
    postponed_until: Mapped[datetime | None] = mapped_column(UtcDateTime())
    checkpoint_status: Mapped[str | None] = mapped_column(String(32))
    checkpoint_requested_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    max_age_warned_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    paused_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    exempt_until: Mapped[datetime | None] = mapped_column(UtcDateTime())
    culled_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    reason: Mapped[str] = mapped_column(Text, default="")
    # Schema 2: bounded checkpoint retries, running cells, expected durations, culls asked for.
    checkpoint_failures: Mapped[int] = mapped_column(Integer, default=0)
    busy_noticed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    interrupted_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    overrun_noticed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    cull_requested_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    cull_request_reason: Mapped[str | None] = mapped_column(String(32))
    cull_request_why: Mapped[str] = mapped_column(Text, default="")
    # Schema 3: since when a running cell's kernel has done nothing (quiet_cell_limit).
    quiet_since: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # Schema 4: the server's failed checkpoints in a row, across sessions (checkpoint_broken_after).
    hook_failures: Mapped[int] = mapped_column(Integer, default=0)
    # Decision outputs, so verdicts and listings need no recomputation.
    warn_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    cull_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    cull_reason: Mapped[str | None] = mapped_column(String(32))
    # Schema 5: what comes at cull_at when it is not a cull (the verdict's at_deadline).
    at_deadline: Mapped[str | None] = mapped_column(String(32))
    checkpoint_manifest: Mapped[dict | None] = mapped_column(JSON)
    # It has sent GPU reports this session: until the next one arrives (after a service
    # restart) its GPU is unknown rather than "no extension".
    reports: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class ExtensionRow(Base):
    __tablename__ = "extensions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    server_key: Mapped[str] = mapped_column(String(255), index=True)
    requested_by: Mapped[str] = mapped_column(String(255))
    requested_at: Mapped[datetime] = mapped_column(UtcDateTime())
    seconds: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(
        String(16)
    )  # granted | pending | approved | denied | refused
    decided_by: Mapped[str | None] = mapped_column(String(255))
    decided_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    decision_reason: Mapped[str | None] = mapped_column(Text)


class AuditRow(Base):
    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    server_key: Mapped[str | None] = mapped_column(String(255), index=True)
    user: Mapped[str | None] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(32))  # warn, checkpoint, cull, extend, exempt, ...
    reason: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(255), default="governor")
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    details: Mapped[dict | None] = mapped_column(JSON)


class UsageRow(Base):
    """The usage ledger's buckets: GPU-equivalent seconds per UTC day and owner, by state
    (``core.ledger``), and the day's culls and extensions. "" where an owner field is unknown."""

    __tablename__ = "usage"

    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # YYYY-MM-DD (UTC)
    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    team: Mapped[str] = mapped_column(String(255), primary_key=True)
    project: Mapped[str] = mapped_column(String(255), primary_key=True)
    tier: Mapped[str] = mapped_column(String(255), primary_key=True)
    active: Mapped[float] = mapped_column(Float, default=0.0)
    idle_held: Mapped[float] = mapped_column(Float, default=0.0)
    idle_free: Mapped[float] = mapped_column(Float, default=0.0)
    unknown: Mapped[float] = mapped_column(Float, default=0.0)
    unobserved: Mapped[float] = mapped_column(Float, default=0.0)
    culls: Mapped[float] = mapped_column(Float, default=0.0)
    extensions: Mapped[float] = mapped_column(Float, default=0.0)
    right_size_freed: Mapped[float] = mapped_column(Float, default=0.0)  # schema 2


class UsageSessionRow(Base):
    """One server session in the ledger: its totals (GPU-equivalent seconds by state) and the
    cursor (the last observation), so a restarted service bills on from where it stopped."""

    __tablename__ = "usage_sessions"

    server: Mapped[str] = mapped_column(String(255), primary_key=True)  # "user/name"
    session: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    team: Mapped[str] = mapped_column(String(255), default="")
    project: Mapped[str] = mapped_column(String(255), default="")
    tier: Mapped[str] = mapped_column(String(255), default="")
    first_at: Mapped[datetime] = mapped_column(UtcDateTime())
    at: Mapped[datetime] = mapped_column(UtcDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), index=True)
    gpus: Mapped[float] = mapped_column(Float, default=0.0)
    state: Mapped[str] = mapped_column(String(32), default="unknown")
    active: Mapped[float] = mapped_column(Float, default=0.0)
    idle_held: Mapped[float] = mapped_column(Float, default=0.0)
    idle_free: Mapped[float] = mapped_column(Float, default=0.0)
    unknown: Mapped[float] = mapped_column(Float, default=0.0)
    unobserved: Mapped[float] = mapped_column(Float, default=0.0)
    culls: Mapped[float] = mapped_column(Float, default=0.0)
    extensions: Mapped[float] = mapped_column(Float, default=0.0)
    right_size_freed: Mapped[float] = mapped_column(Float, default=0.0)  # schema 2


class MetaRow(Base):
    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))


_RECORD_FIELDS = [f.name for f in fields(Record)]


def record_of(row: ServerRow) -> Record:
    """The policy Record a row holds (cached on the row: the row's record columns change only
    through ``set_record``)."""
    cached = row.__dict__.get("_record")
    if cached is None:
        cached = Record(**{name: getattr(row, name) for name in _RECORD_FIELDS})
        row.__dict__["_record"] = cached
    return cached


def apply_decision(row: ServerRow, decision: Decision, policy_name: str) -> None:
    set_record(row, decision.record)
    row.warn_at = decision.warn_at
    row.cull_at = decision.cull_at
    row.at_deadline = decision.at_deadline
    row.cull_reason = decision.cull_reason or row.cull_reason
    row.policy = policy_name


def set_record(row: ServerRow, record: Record) -> None:
    for name in _RECORD_FIELDS:
        setattr(row, name, getattr(record, name))
    row.__dict__["_record"] = record
