"""The governor's tables (SQLAlchemy ORM): a server's row and the policy ``Record`` it holds,
extension requests, the audit trail, the usage ledger's buckets and sessions, the lease, and
``meta``.
``hub/store.py`` reads and writes them, and migrates the schema."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import datetime, timezone
from operator import attrgetter, itemgetter
from types import MappingProxyType

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    inspect,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from ..core import slotted
from ..core.policy import MAX_NAME, Decision, Record, evolve
from ..core.vocabulary import KEY_LENGTH, NAME_LENGTH


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


def _time(name: str) -> Column:
    return Column(name, UtcDateTime())


def _string(name: str, size: int) -> Column:
    return Column(name, String(size))


# A server's row. Read and written with Core statements (``hub/store.py``), held in memory as
# a ``ServerRow``: not an ORM class, whose bookkeeping cost ~3 kB a server more
# (docs/benchmarks-history.md, "Issue 26, wave 8").
SERVERS_UPDATED_AT = "ix_servers_updated_at"
SERVERS = Table(
    "servers",
    Base.metadata,
    Column("key", String(KEY_LENGTH), primary_key=True),  # "user/name"
    Column("user", String(NAME_LENGTH), nullable=False, index=True),
    Column("name", String(NAME_LENGTH), nullable=False, default=""),
    _time("session_started"),
    _string("team", 255),
    _string("project", 255),
    _string("tier", 255),
    _string("profile", 255),
    Column("labels", JSON, nullable=False, default=dict),
    _string("policy", MAX_NAME),
    Column("running", Boolean, nullable=False, default=True),
    # The policy Record, one column per field (see _RECORD_FIELDS).
    Column("state", String(32), nullable=False, default="active"),
    _time("idle_since"),
    _time("warned_at"),
    # Schema 10: a tab was open when the warning went out (an unread warning's rule).
    Column("warned_beside_tab", Boolean, nullable=False, default=False),
    Column("extension_s", Float, nullable=False, default=0.0),
    Column("extensions_used", Integer, nullable=False, default=0),
    Column("approval_pending", Boolean, nullable=False, default=False),
    _time("postponed_until"),
    _string("checkpoint_status", 32),
    _time("checkpoint_requested_at"),
    _time("max_age_warned_at"),
    _time("paused_at"),
    _time("exempt_until"),
    _time("culled_at"),
    Column("reason", Text, nullable=False, default=""),
    # Schema 2: bounded checkpoint retries, running cells, expected durations, culls asked for.
    Column("checkpoint_failures", Integer, nullable=False, default=0),
    _time("busy_noticed_at"),
    _time("interrupted_at"),
    _time("overrun_noticed_at"),
    _time("cull_requested_at"),
    _string("cull_request_reason", 32),
    Column("cull_request_why", Text, nullable=False, default=""),
    # Schema 3: since when a running cell's kernel has done nothing (quiet_cell_limit).
    _time("quiet_since"),
    # Schema 4: the server's failed checkpoints in a row, across sessions (checkpoint_broken_after).
    Column("hook_failures", Integer, nullable=False, default=0),
    # Decision outputs, so verdicts and listings need no recomputation.
    _time("warn_at"),
    _time("cull_at"),
    _string("cull_reason", 32),
    # Schema 5: what comes at cull_at when it is not a cull (the verdict's at_deadline).
    _string("at_deadline", 32),
    # Schema 7: how a policy that set its deadline came in (the verdict's policy_change).
    _string("policy_change", 32),
    Column("checkpoint_manifest", JSON),
    # It has sent GPU reports this session: until the next one arrives (after a service
    # restart) its GPU is unknown rather than "no extension".
    Column("reports", Boolean, nullable=False, default=False),
    _time("updated_at"),
    # Schema 8: a standby reads the rows written since its last read (``Store.servers``).
    Index(SERVERS_UPDATED_AT, "updated_at"),
)
SERVER_COLUMNS = tuple(c.key for c in SERVERS.columns)


# The columns a row holds in its policy ``Record`` (as the record has them), and the others.
_RECORD_FIELDS = tuple(f.name for f in fields(Record))
_OWN_COLUMNS = tuple(c for c in SERVER_COLUMNS if c not in _RECORD_FIELDS)
_build_record = slotted.builder(Record)


def _record_column(name: str) -> property:
    def set_column(row: ServerRow, value) -> None:
        row._record = evolve(row._record, **{name: value})

    # Read by attrgetter, in C: the store reads every column of each row it writes.
    return property(attrgetter(f"_record.{name}"), set_column, doc=f"``Record.{name}``")


class ServerRow:
    """What the governor remembers of a server (a row of ``servers``): a slot per column,
    unset columns ``None`` until stored (then their defaults), as an ORM instance's were. The
    columns of the policy ``Record`` are the row's record's (``record_of``), not a slot each
    beside it: one copy of them (a row 392 -> 200 bytes, ~1.9 MB at 10,000 servers: issue 26);
    setting one makes the row a new record."""

    __slots__ = (*_OWN_COLUMNS, "_record", "_answer")
    __table__ = SERVERS

    def __init__(self, **columns) -> None:
        unknown = columns.keys() - _COLUMN_SET
        if unknown:
            raise TypeError(f"ServerRow has no column {sorted(unknown)}")
        for name in _OWN_COLUMNS:
            setattr(self, name, columns.get(name))
        self._record: Record = _build_record([columns.get(name) for name in _RECORD_FIELDS])
        self._answer: tuple | None = None  # Views.answer's last, and what it was made of

    @classmethod
    def of_columns(cls, columns: Sequence) -> ServerRow:
        """A row with these values, one a column in ``SERVER_COLUMNS``' order."""
        row = cls.__new__(cls)
        for name, value in zip(_OWN_COLUMNS, _own_of(columns), strict=True):
            setattr(row, name, value)
        row._record = _build_record(_record_of(columns))
        row._answer = None
        return row

    def __repr__(self) -> str:
        return f"<ServerRow {self.key!r}>"


for _name in _RECORD_FIELDS:
    setattr(ServerRow, _name, _record_column(_name))
_COLUMN_SET = frozenset(SERVER_COLUMNS)
_own_values = attrgetter(*_OWN_COLUMNS)
_record_values = attrgetter(*_RECORD_FIELDS)
_own_of = itemgetter(*(SERVER_COLUMNS.index(name) for name in _OWN_COLUMNS))
_record_of = itemgetter(*(SERVER_COLUMNS.index(name) for name in _RECORD_FIELDS))


class Rows(dict):
    """The governor's server rows by key, and the keys of each user's: a user's stopped rows
    are trimmed as their servers stop (``Governor._forget_stopped``, a standby's read-back),
    read through that user's rows, not every row (100,000 rows: a walk of milliseconds at each
    pass where a server stopped). Every change goes through the methods below. A user's one
    key is kept as itself, more in a list: the index is the size of a dict by user (about
    0.4 MB at 10,000 users), not a collection a user."""

    __slots__ = ("_by_user",)

    def __init__(self, rows: Mapping[str, ServerRow] = MappingProxyType({})):
        super().__init__(rows)
        self._by_user: dict[str, str | list[str]] = {}
        for key, row in self.items():
            self._index(key, row.user)

    def of_user(self, user: str) -> list[ServerRow]:
        """The rows of ``user``'s servers, running or stopped, in no order."""
        keys = self._by_user.get(user, ())
        return [self[keys]] if type(keys) is str else [self[key] for key in keys]

    def __setitem__(self, key: str, row: ServerRow) -> None:
        old = self.get(key)
        if old is None or old.user != row.user:
            if old is not None:
                self._unindex(key, old.user)
            self._index(key, row.user)
        super().__setitem__(key, row)

    def __delitem__(self, key: str) -> None:
        row = self[key]
        super().__delitem__(key)
        self._unindex(key, row.user)

    def pop(self, key: str, *default):
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        row = super().pop(key)
        self._unindex(key, row.user)
        return row

    def setdefault(self, key: str, row: ServerRow) -> ServerRow:
        if key not in self:
            self[key] = row
        return self[key]

    def update(self, *args, **kwargs) -> None:
        for key, row in dict(*args, **kwargs).items():
            self[key] = row

    def popitem(self):
        key, row = super().popitem()
        self._unindex(key, row.user)
        return key, row

    def clear(self) -> None:
        super().clear()
        self._by_user.clear()

    def __ior__(self, other):
        self.update(other)
        return self

    def _index(self, key: str, user: str) -> None:
        keys = self._by_user.get(user)
        if keys is None:
            self._by_user[user] = key
        elif type(keys) is str:
            self._by_user[user] = [keys, key]
        else:
            keys.append(key)

    def _unindex(self, key: str, user: str) -> None:
        keys = self._by_user.get(user)
        if keys is None:
            return
        if type(keys) is str:
            if keys == key:
                del self._by_user[user]
            return
        if key in keys:
            keys.remove(key)  # (a user's few: at most the bound and their running servers)
        if len(keys) == 1:
            self._by_user[user] = keys[0]


class ExtensionRow(Base):
    __tablename__ = "extensions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    server_key: Mapped[str] = mapped_column(String(KEY_LENGTH), index=True)
    requested_by: Mapped[str] = mapped_column(String(KEY_LENGTH))  # an actor
    requested_at: Mapped[datetime] = mapped_column(UtcDateTime())
    seconds: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(
        String(16)
    )  # granted | pending | approved | denied | refused
    decided_by: Mapped[str | None] = mapped_column(String(KEY_LENGTH))
    decided_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    decision_reason: Mapped[str | None] = mapped_column(Text)


class AuditRow(Base):
    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    server_key: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)
    user: Mapped[str | None] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(32))  # warn, checkpoint, cull, extend, exempt, ...
    reason: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(KEY_LENGTH), default="governor")  # "user:name"
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    details: Mapped[dict | None] = mapped_column(JSON)

    @classmethod
    def made(cls, **values) -> AuditRow:
        """``AuditRow(**values)``, the values put in the new row's ``__dict__``, not set one by
        one through the ORM's constructor (its init event, an attribute event a value): 5 µs a
        row, not 35, for a pass's rows (about 1,100 at 10,000 servers). A new row is inserted
        from what it holds, by the store's insert and by the ORM's flush alike: it is stored
        column for column as a constructed one (tests/test_store_audit.py; docs/benchmarks-history.md,
        "Issue 26, wave 44: a pass's audit rows made without the ORM's constructor")."""
        if not values.keys() <= _AUDIT_VALUES:
            raise TypeError(f"not an audit row's: {sorted(values.keys() - _AUDIT_VALUES)}")
        row = _AUDIT_CLASS.new_instance()
        row.__dict__.update(values)
        return row


_AUDIT_CLASS = inspect(AuditRow).class_manager  # makes an instance with its ORM state, no event
_AUDIT_VALUES = frozenset(c.key for c in AuditRow.__table__.columns)


class DismissalRow(Base):
    """An admin's dismissal of a GPU's health claim (``POST api/health/<uuid>/dismiss``): the
    evidence dismissed (``core.health.evidence``, sorted), by physical GPU uuid. Kept while the
    card's claim rests on no more than that (``core.health.still_dismissed``); deleted when new
    evidence or the claim's end ends it. Schema 9."""

    __tablename__ = "health_dismissals"

    uuid: Mapped[str] = mapped_column(String(255), primary_key=True)
    evidence: Mapped[list] = mapped_column(JSON)
    at: Mapped[datetime] = mapped_column(UtcDateTime())
    actor: Mapped[str] = mapped_column(String(KEY_LENGTH))


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

    server: Mapped[str] = mapped_column(String(KEY_LENGTH), primary_key=True)  # "user/name"
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


# The lease (hub/lease.py): one row naming the governor that acts on this store.
LEASE = Table(
    "lease",
    Base.metadata,
    Column("name", String(32), primary_key=True),
    Column("holder", String(32), nullable=False),  # a process's random id; "": released
    Column("beat", Integer, nullable=False),  # one more at each renewal
    Column("duration", Float, nullable=False),  # the holder's lease_duration: its expiry
    Column("host", String(255)),  # for the admin
    Column("pid", Integer),
    Column("place", String(80)),  # where its pid means what ours do (boot, pid namespace)
    Column("since", String(40)),  # when it took the lease, on its clock (for people)
)


class MetaRow(Base):
    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))


def values_of(row: ServerRow) -> dict:
    """A row's columns by name (as the store writes them): its own and its record's, each
    read in C (not a property a record column)."""
    values = dict(zip(_OWN_COLUMNS, _own_values(row), strict=True))
    values.update(zip(_RECORD_FIELDS, _record_values(row._record), strict=True))
    return values


def record_of(row: ServerRow) -> Record:
    """The policy Record a row holds (its record columns: it changes only as a whole, by
    ``set_record`` or by setting a column)."""
    return row._record


def changes_row(row: ServerRow, before: Record, decision: Decision, policy_name: str) -> bool:
    """Whether ``decision``, taken on ``before`` (the row's record), is one to apply: a new
    record, an action, or deadlines, a policy or a cull reason the row does not hold. Most
    decisions of a pass are not: the row (and the database) is left alone."""
    return bool(
        decision.record != before
        or decision.actions
        or (decision.cull_reason and decision.cull_reason != row.cull_reason)
        or (
            decision.warn_at,
            decision.cull_at,
            decision.at_deadline,
            decision.policy_change,
            policy_name,
        )
        != (row.warn_at, row.cull_at, row.at_deadline, row.policy_change, row.policy)
    )


def apply_decision(row: ServerRow, decision: Decision, policy_name: str) -> None:
    set_record(row, decision.record)
    row.warn_at = decision.warn_at
    row.cull_at = decision.cull_at
    row.at_deadline = decision.at_deadline
    row.policy_change = decision.policy_change
    row.cull_reason = decision.cull_reason or row.cull_reason
    row.policy = policy_name


def set_record(row: ServerRow, record: Record) -> None:
    row._record = record
