"""The governor's store: what it remembers of each server, extension requests, and the audit
trail. SQLAlchemy, SQLite by default, any SQLAlchemy URL (PostgreSQL) by configuration.

The schema is created on start and migrated forward from the version recorded in ``meta``, so a
service restart loses no warning, deadline, extension or audit row. Latest reports are kept in
memory by the service, not here: they are re-sent every minute and need no durability.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, time, timedelta, timezone
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    and_,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    inspect,
    null,
    select,
    text,
    update,
)
from sqlalchemy.engine import Row, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from ..core import clock
from ..core.ledger import FIELDS, Bucket, Owner
from ..core.ledger import Session as LedgerSession
from ..core.text import STORED_MARK, kept_as_it_was, stored_name
from ..core.vocabulary import KEY_LENGTH
from .bulk_sql import Executemany
from .tables import (
    SERVER_COLUMNS,
    SERVERS,
    SERVERS_UPDATED_AT,
    AuditRow,
    Base,
    DismissalRow,
    ExtensionRow,
    MetaRow,
    ServerRow,
    UsageRow,
    UsageSessionRow,
    values_of,
)

SCHEMA_VERSION = 11

T = TypeVar("T")


class StoreUnavailable(RuntimeError):
    """The store could not be written (locked, full, unreachable): nothing of that write is on
    record, and the governor acts on nothing it could not record."""

    def __init__(self, url: str, error: Exception):
        cause = getattr(error, "orig", None) or error
        super().__init__(f"the governor's database ({safe_url(url)}) is unavailable: {cause}")


class NotHolder(StoreUnavailable):
    """A write of a governor that does not hold the lease (``hub/lease.py``): refused, like a
    store that is down, so that nothing it would have recorded is done."""

    def __init__(self, message: str):
        RuntimeError.__init__(self, message)


class StoreTooNew(RuntimeError):
    """A newer jupyter-gpu-gov migrated the store: this one leaves it as it is."""


def safe_url(url: str) -> str:
    """A database URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<the configured db_url>"


# A bucket's key, and the statement that adds a pass's amounts to existing buckets (one
# executemany; the key and the amounts are bound as k_* and d_*).
_USAGE_KEY_NAMES = ("day", "user", "team", "project", "tier")
_USAGE_KEY = [UsageRow.__table__.c[name] for name in _USAGE_KEY_NAMES]
_ADD_TO_USAGE = (
    update(UsageRow.__table__)
    .where(and_(*(column == bindparam(f"k_{column.name}") for column in _USAGE_KEY)))
    .values({f: UsageRow.__table__.c[f] + bindparam(f"d_{f}") for f in FIELDS})
)


_SESSION_KEY = ("server", "session")
_UPDATE_SESSION = (
    update(UsageSessionRow.__table__)
    .where(and_(*(UsageSessionRow.__table__.c[k] == bindparam(f"k_{k}") for k in _SESSION_KEY)))
    .values(
        {
            c.name: bindparam(f"v_{c.name}")
            for c in UsageSessionRow.__table__.c
            if c.name not in _SESSION_KEY
        }
    )
)


# A steady session's update: what a pass moves (the cursor, the GPUs, the state, the totals),
# where its row already holds the owner and first_at given and no end. Setting the owner's user
# and ended_at to what they were rewrote their index entries: 0.20 s of SQLite a ledger write at
# 10,000 sessions, 0.07 s without (docs/benchmarks-history.md, "Issue 26, wave 43: the ledger's
# write").
_STEADY_VALUES = ("at", "gpus", "state")
_UPDATE_STEADY_SESSION = (
    update(UsageSessionRow.__table__)
    .where(and_(*(UsageSessionRow.__table__.c[k] == bindparam(f"k_{k}") for k in _SESSION_KEY)))
    .values({c: bindparam(f"v_{c}") for c in (*_STEADY_VALUES, *FIELDS)})
)

_ZEROS = (0.0,) * len(FIELDS)  # a field's amount where a bucket or session has none

_SESSION_VALUES = ("user", "team", "project", "tier", "first_at", "at", "ended_at", "gpus", "state")
# The bind parameters of the two, in the order save_usage gives them.
_SESSION_ROW_COLUMNS = (*_SESSION_VALUES, *FIELDS, *_SESSION_KEY)
_ADD_TO_USAGE_PARAMS = (*(f"d_{f}" for f in FIELDS), *(f"k_{k}" for k in _USAGE_KEY_NAMES))
_UPDATE_SESSION_PARAMS = (
    *(f"v_{c}" for c in (*_SESSION_VALUES, *FIELDS)),
    *(f"k_{k}" for k in _SESSION_KEY),
)
_UPDATE_STEADY_SESSION_PARAMS = (
    *(f"v_{c}" for c in (*_STEADY_VALUES, *FIELDS)),
    *(f"k_{k}" for k in _SESSION_KEY),
)


_DEFAULTED = {c.key for c in SERVERS.columns if c.default is not None}
# Plain values of those defaults, set on a new row in memory too: its later updates then
# write them back, not None.
_SCALAR_DEFAULTS = {
    c.key: c.default.arg for c in SERVERS.columns if c.default is not None and c.default.is_scalar
}
# A stored row's update, by its key (bound as k_key; the columns as v_*, in this order).
_UPDATED_COLUMNS = tuple(c for c in SERVER_COLUMNS if c != "key")
_UPDATE_SERVER = (
    update(SERVERS)
    .where(SERVERS.c.key == bindparam("k_key"))
    .values({c: bindparam(f"v_{c}") for c in _UPDATED_COLUMNS})
)
_UPDATE_SERVER_PARAMS = (*(f"v_{c}" for c in _UPDATED_COLUMNS), "k_key")
# An audit row's outcome (a cull's, once carried out), by its id.
_AUDIT = AuditRow.__table__
_UPDATE_AUDIT = (
    update(_AUDIT)
    .where(_AUDIT.c.id == bindparam("k_id"))
    .values(reason=bindparam("v_reason"), details=bindparam("v_details"))
)
# New audit rows: one Core INSERT run over all a write's rows (SQLite: one row a statement, as
# the ORM's flush did), their ids back in the rows' order. The ORM's unit of work cost about
# twice as much, in the writer thread but under the interpreter lock the event loop needs
# (docs/benchmarks-history.md, "Issue 26, wave 42: a pass's audit rows inserted by Core"). What is stored
# is what the ORM stored: a column left unset, or None, where it has a default holds the
# default; ``details`` left unset is SQL NULL, None the JSON null; any other column left
# unset, NULL (tests/test_store_audit.py).
_INSERT_AUDIT = insert(_AUDIT).returning(_AUDIT.c.id, sort_by_parameter_order=True)
_AUDIT_COLUMNS = tuple(c.key for c in _AUDIT.columns if not c.primary_key)
_AUDIT_DEFAULTS = {c.key: c.default.arg for c in _AUDIT.columns if c.default is not None}
_AUDIT_UNSET = {
    c.key: _AUDIT_DEFAULTS.get(c.key, null() if isinstance(c.type, JSON) else None)
    for c in _AUDIT.columns
    if not c.primary_key
}
_UNSET = object()


def _audit_values(row: AuditRow) -> dict:
    """A new audit row's values as inserted; the defaults put on the row (as a flush did)."""
    given = row.__dict__  # what was set on it, read without the ORM's attribute machinery
    values = {}
    for column in _AUDIT_COLUMNS:
        value = given.get(column, _UNSET)
        if value is _UNSET or (value is None and column in _AUDIT_DEFAULTS):
            value = _AUDIT_UNSET[column]
            if column in _AUDIT_DEFAULTS:
                setattr(row, column, value)
        values[column] = value
    return values


# Forward migrations: version -> statements bringing the previous version up to it.
_TIME = "TIMESTAMP WITH TIME ZONE"
MIGRATIONS: dict[int, list[str]] = {
    2: [
        "ALTER TABLE servers ADD COLUMN checkpoint_failures INTEGER DEFAULT 0",
        *(
            f"ALTER TABLE servers ADD COLUMN {c} {_TIME}"
            for c in (
                "busy_noticed_at",
                "interrupted_at",
                "overrun_noticed_at",
                "cull_requested_at",
            )
        ),
        "ALTER TABLE servers ADD COLUMN cull_request_reason VARCHAR(32)",
        "ALTER TABLE servers ADD COLUMN cull_request_why TEXT DEFAULT ''",
        "ALTER TABLE usage ADD COLUMN right_size_freed FLOAT DEFAULT 0",
        "ALTER TABLE usage_sessions ADD COLUMN right_size_freed FLOAT DEFAULT 0",
    ],
    3: [f"ALTER TABLE servers ADD COLUMN quiet_since {_TIME}"],
    4: ["ALTER TABLE servers ADD COLUMN hook_failures INTEGER DEFAULT 0"],
    5: ["ALTER TABLE servers ADD COLUMN at_deadline VARCHAR(32)"],
    6: [],  # RETYPED's only
    7: ["ALTER TABLE servers ADD COLUMN policy_change VARCHAR(32)"],
    # The standby's read of the rows written since its last (``Views._read_back``): by the
    # index, not a scan of every row at each pass.
    8: [f"CREATE INDEX IF NOT EXISTS {SERVERS_UPDATED_AT} ON servers (updated_at)"],
    9: [],  # health_dismissals: a new table, made by create_all
    10: ["ALTER TABLE servers ADD COLUMN warned_beside_tab BOOLEAN DEFAULT FALSE"],
    11: [],  # MOVED's only
}
# Migrations that change a column's type: where the database enforces it (SQLite neither
# enforces a VARCHAR's length nor alters a column). Schema 6: a server's key holds JupyterHub's
# longest, a user's and a server's name of 255 characters each; so does an actor ("user:name").
RETYPED: dict[int, list[str]] = {
    6: [
        f"ALTER TABLE {table} ALTER COLUMN {column} TYPE VARCHAR({KEY_LENGTH})"
        for table, column in (
            ("servers", "key"),
            ("extensions", "server_key"),
            ("extensions", "requested_by"),
            ("extensions", "decided_by"),
            ("audit", "server_key"),
            ("audit", "actor"),
            ("usage_sessions", "server"),
        )
    ]
}


def _kept(name: str) -> str:
    return stored_name(name) if kept_as_it_was(name) else name


def _kept_key(key: str) -> str:
    user, _, name = key.partition("/")
    return f"{_kept(user)}/{_kept(name)}"


def _to_kept_forms(session: Session) -> None:
    """Schema 11: what an earlier release kept under a name holding U+FFFD as it is
    (``bob/a\\ufffdb``), moved to the name's kept form (``core.text.stored_name``), which this
    release keys it by: else the first pass made a second row for the server (its record, its
    warning, its open ledger session left under the old key, closed as gone) and its history
    was split, the old half found by no filter. A row the kept form has already (a release of
    schema 10 wrote one) keeps it: the old server row is dropped, the usage summed."""
    usage = UsageRow.__table__
    moves = [
        (SERVERS, SERVERS.c.key, _kept_key),
        (SERVERS, SERVERS.c.user, _kept),
        (SERVERS, SERVERS.c.name, _kept),
        (ExtensionRow.__table__, ExtensionRow.__table__.c.server_key, _kept_key),
        (_AUDIT, _AUDIT.c.server_key, _kept_key),
        (_AUDIT, _AUDIT.c.user, _kept),
        (UsageSessionRow.__table__, UsageSessionRow.__table__.c.server, _kept_key),
        (UsageSessionRow.__table__, UsageSessionRow.__table__.c.user, _kept),
    ]
    for table, column, kept in moves:
        found = select(column).distinct().where(column.contains(STORED_MARK, autoescape=True))
        for old in list(session.execute(found).scalars()):
            new = kept(old)
            if new == old:
                continue
            if (
                column is SERVERS.c.key
                and session.execute(select(SERVERS.c.key).where(SERVERS.c.key == new)).first()
            ):
                session.execute(SERVERS.delete().where(SERVERS.c.key == old))
                continue
            session.execute(update(table).where(column == old).values({column.key: new}))
    found = select(usage).where(usage.c.user.contains(STORED_MARK, autoescape=True))
    for row in list(session.execute(found).mappings()):
        new = _kept(row["user"])
        if new == row["user"]:
            continue
        key = {k: row[k] for k in _USAGE_KEY_NAMES}
        where = and_(*(usage.c[k] == v for k, v in key.items()))
        there = and_(*(usage.c[k] == v for k, v in {**key, "user": new}.items()))
        if session.execute(select(usage.c.user).where(there)).first():
            added = {f: usage.c[f] + (row[f] or 0.0) for f in FIELDS}
            session.execute(update(usage).where(there).values(added))
            session.execute(usage.delete().where(where))
        else:
            session.execute(update(usage).where(where).values(user=new))


# Migrations done in Python, after the version's statements.
MOVED: dict[int, Callable[[Session], None]] = {11: _to_kept_forms}


class Store:
    def __init__(self, url: str = "sqlite:///jupyter_gpu_gov.sqlite", echo: bool = False):
        self.url = url
        kwargs: dict[str, Any] = {"echo": echo, "future": True}
        if url.startswith("sqlite"):
            # The governor is its only writer: a lock held elsewhere (a backup, an admin's
            # sqlite3) is waited for a second, not five (a request waits so on the event
            # loop); then the write fails and nothing is acted on.
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 1.0}
        self.engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        # The lease (hub/lease.py) the service holds to write: None, every write is let through
        # (a governor built alone, as in tests and benchmarks).
        self.lease = None
        self._stored: set[str] = set()  # keys known to have a row: update, not insert
        # The same for the usage ledger: a day whose bucket keys are loaded -> those keys, for
        # the newest days only (a day's keys are every user's: kept for every day, they grew by
        # 10,000 keys a day at 10,000 users, for as long as the service ran).
        self._usage_keys: dict[str, set[tuple[str, ...]]] = {}
        # Sessions known to have a row and not ended -> (owner, first_at) as stored there. An
        # ended one is forgotten (its server's next session is another key: kept, they grew by
        # every session ever); any other is asked for when it comes.
        self._usage_sessions: dict[tuple[str, str], tuple] = {}
        dialect = self.engine.dialect
        self._add_to_usage = Executemany(_ADD_TO_USAGE, dialect, _ADD_TO_USAGE_PARAMS)
        self._update_session = Executemany(_UPDATE_SESSION, dialect, _UPDATE_SESSION_PARAMS)
        self._update_steady_session = Executemany(
            _UPDATE_STEADY_SESSION, dialect, _UPDATE_STEADY_SESSION_PARAMS
        )
        self._update_server = Executemany(_UPDATE_SERVER, dialect, _UPDATE_SERVER_PARAMS)
        self._update_audit = Executemany(_UPDATE_AUDIT, dialect, ("v_reason", "v_details", "k_id"))
        # Every write runs in one thread, in the order asked: a pass awaits its writes while the
        # event loop answers reports; a request's write waits for those asked before it, as
        # when the pass wrote on the loop. (SQLite in WAL lets the loop read meanwhile.) A
        # database in memory is one connection per thread: written where asked.
        self.in_memory = _in_memory(url)  # (one process's alone: it needs no lease)
        self._writer = None if self.in_memory else ThreadPoolExecutor(1, "gpu-gov-store")
        self.migrate()

    def migrate(self) -> None:
        """Create missing tables, then apply migrations newer than the recorded version.
        ``StoreTooNew`` before anything is written when a newer release migrated it (a
        rollback): its tables are that release's, and one this release would create here is
        one it dropped or renamed."""
        existed = inspect(self.engine).has_table("meta")
        if existed:
            with self.engine.connect() as db:
                kept = db.execute(
                    text("SELECT value FROM meta WHERE key = 'schema_version'")
                ).scalar()
            if kept is not None and int(kept) > SCHEMA_VERSION:
                raise StoreTooNew(
                    f"it has schema version {kept}, newer than this jupyter-gpu-gov "
                    f"understands ({SCHEMA_VERSION}): a newer release migrated it, and it is "
                    f"left as it was. Upgrade the service again to that release (or a later "
                    f"one), or, to run this one, restore the database from a backup taken "
                    f"before that upgrade (docs/api.md, 'Upgrades and rollbacks')"
                )
        Base.metadata.create_all(self.engine)
        with self._session.begin() as session:
            row = session.get(MetaRow, "schema_version")
            version = int(row.value) if row else (SCHEMA_VERSION if not existed else 1)
            retyped = RETYPED if self.engine.dialect.name != "sqlite" else {}
            for target in sorted(v for v in MIGRATIONS if v > version):
                for statement in (*MIGRATIONS[target], *retyped.get(target, ())):
                    session.execute(text(statement))
                if target in MOVED:
                    MOVED[target](session)
                version = target
            session.merge(MetaRow(key="schema_version", value=str(version)))

    def session(self) -> Session:
        return self._session()

    def fence(self, db) -> None:
        """First in a write transaction (``db``, its connection): ``NotHolder`` unless this
        governor holds the lease."""
        if self.lease is not None:
            self.lease.fence(db)

    def forget_known(self) -> None:
        """Forget which rows are known to exist: another governor wrote meanwhile (a takeover)."""
        self._stored.clear()
        self._usage_keys.clear()
        self._usage_sessions.clear()

    def write(self, fn: Callable[[], T]) -> T:
        """``fn()``, a write, in the writer thread after the writes asked before it; waits."""
        if self._writer is None:
            return fn()
        return self._writer.submit(fn).result()

    async def write_async(self, fn: Callable[[], T]) -> T:
        """``fn()``, a write, in the writer thread after the writes asked before it; the event
        loop runs meanwhile. ``fn`` must not read what the loop may change while it runs."""
        if self._writer is None:
            return fn()
        # Made even if the awaiting pass is cancelled (the service stopping), as on the loop.
        return await asyncio.shield(asyncio.wrap_future(self._writer.submit(fn)))

    # -- servers --------------------------------------------------------------------------------

    def servers(
        self, running_only: bool = False, changed_since: datetime | None = None
    ) -> dict[str, ServerRow]:
        """The server rows (``changed_since``: those written since, by their ``updated_at``)."""
        query = select(SERVERS)
        if running_only:
            query = query.where(SERVERS.c.running.is_(True))
        if changed_since is not None:
            query = query.where(SERVERS.c.updated_at >= changed_since)
        with self.engine.connect() as connection:
            rows = {row.key: ServerRow(**row) for row in connection.execute(query).mappings()}
        self._stored |= rows.keys()
        return rows

    def server_keys(self, users: Iterable[str]) -> set[str]:
        """The keys of the rows of ``users``' servers (a standby's check of what its holder
        forgot: ``Views._read_back``)."""
        users = sorted(set(users))
        keys: set[str] = set()
        with self.engine.connect() as connection:
            for i in range(0, len(users), 500):  # within every database's parameters
                query = select(SERVERS.c.key).where(SERVERS.c.user.in_(users[i : i + 500]))
                keys.update(connection.execute(query).scalars())
        return keys

    def newest_server_write(self) -> datetime | None:
        """When a server row was last written (None: none was)."""
        with self.engine.connect() as connection:
            return connection.execute(select(func.max(SERVERS.c.updated_at))).scalar()

    def server(self, key: str) -> ServerRow | None:
        with self.engine.connect() as connection:
            row = connection.execute(select(SERVERS).where(SERVERS.c.key == key)).mappings()
            found = row.first()
        return ServerRow(**found) if found is not None else None

    def save(
        self,
        rows: Iterable[ServerRow] = (),
        audits: Iterable[AuditRow] = (),
        extensions: Iterable[ExtensionRow] = (),
        updated_audits: Iterable[AuditRow] = (),
        updated_extensions: Iterable[ExtensionRow] = (),
        dismissed: Iterable[DismissalRow] = (),
        undismissed: Iterable[str] = (),
    ) -> None:
        """Server rows, new audit rows and extension requests, and audit rows and requests
        that changed since, health dismissals made and ended (by uuid), in one transaction:
        all of it is on record, or none of it and ``StoreUnavailable`` says why."""
        write = self._saving(
            rows,
            audits,
            extensions,
            updated_audits,
            updated_extensions,
            dismissed,
            undismissed,
        )
        if write is not None:
            self.write(write)

    async def save_async(
        self,
        rows: Iterable[ServerRow] = (),
        audits: Iterable[AuditRow] = (),
        updated_audits: Iterable[AuditRow] = (),
        undismissed: Iterable[str] = (),
    ) -> None:
        """``save``, the event loop running while it is written (a pass's decisions, their
        outcomes)."""
        write = self._saving(rows, audits, updated_audits=updated_audits, undismissed=undismissed)
        if write is not None:
            await self.write_async(write)

    def _saving(
        self,
        rows,
        audits,
        extensions=(),
        updated_audits=(),
        updated_extensions=(),
        dismissed=(),
        undismissed=(),
    ) -> Callable[[], None] | None:
        """``save``'s transaction, its server rows' values and audits' outcomes taken now (the
        loop may change the rows while the writer writes them)."""
        values = self._server_values(rows)
        audits, extensions = list(audits), list(extensions)
        updated_extensions = list(updated_extensions)
        completed = [(row.reason, row.details, row.id) for row in updated_audits]
        dismissed, undismissed = list(dismissed), sorted(set(undismissed))
        if (
            not (values or audits or extensions or completed or updated_extensions or dismissed)
            and not undismissed
        ):
            return None

        def write() -> None:
            try:
                with self._session.begin() as session:
                    self.fence(session.connection())
                    saved = self._save_servers(session, values)
                    if audits:
                        self._insert_audits(session, audits)
                    session.add_all(extensions)
                    for extension in updated_extensions:
                        session.merge(extension)
                    if undismissed:
                        session.execute(
                            DismissalRow.__table__.delete().where(
                                DismissalRow.uuid.in_(undismissed)
                            )
                        )
                    for dismissal in dismissed:  # (one uuid, dismissed again: the newer)
                        session.merge(dismissal)
                    if completed:  # a pass's culls' outcomes: one statement
                        self._update_audit.run(session.connection(), completed)
            except DBAPIError as error:
                raise StoreUnavailable(self.url, error) from error
            self._stored |= saved

        return write

    def _insert_audits(self, session: Session, audits: list[AuditRow]) -> None:
        """New audit rows in their order (their ids rising in it), each given its id."""
        if not self.engine.dialect.insert_executemany_returning_sort_by_parameter_order:
            session.add_all(audits)  # a database that cannot say which id is whose
            session.flush()
            return
        ids = session.execute(_INSERT_AUDIT, [_audit_values(row) for row in audits])
        for row, (id_,) in zip(audits, ids, strict=True):
            row.id = id_

    def save_servers(self, rows: Iterable[ServerRow]) -> None:
        """Insert or update rows in bulk: one statement each, not one round trip per row."""
        self.save(rows)

    @staticmethod
    def _server_values(rows: Iterable[ServerRow]) -> dict[str, dict]:
        """Each row's columns by its key, stamped ``updated_at`` now (a new row's unset
        columns take their defaults, in memory too: its later updates write them back)."""
        unique = {row.key: row for row in rows}
        now = clock.utcnow()
        values = {}
        for key, row in unique.items():
            row.updated_at = now
            for column, default in _SCALAR_DEFAULTS.items():
                if getattr(row, column) is None:
                    setattr(row, column, default)
            values[key] = values_of(row)
        return values

    def _save_servers(self, session: Session, values: dict[str, dict]) -> set[str]:
        if not values:
            return set()
        unknown = [k for k in values if k not in self._stored]
        stored = set(self._stored)
        if unknown:  # rows of an earlier run, or loaded elsewhere: ask once
            query = select(SERVERS.c.key).where(SERVERS.c.key.in_(unknown))
            stored |= set(session.scalars(query))
        # An unset column (None) of a new row takes its column default; one statement for the
        # rows that leave the same columns unset.
        new: dict[frozenset, list[dict]] = {}
        for key, row in values.items():
            if key not in stored:
                row = {c: v for c, v in row.items() if v is not None or c not in _DEFAULTED}
                new.setdefault(frozenset(row), []).append(row)
        old = [
            (*map(row.__getitem__, _UPDATED_COLUMNS), key)  # as _UPDATE_SERVER_PARAMS
            for key, row in values.items()
            if key in stored
        ]
        for rows in new.values():
            session.execute(insert(SERVERS), rows)
        if old:
            self._update_server.run(session.connection(), old)
        return values.keys() | (stored - self._stored)

    async def forget_servers_async(self, keys: Iterable[str]) -> None:
        """Delete the rows of ``keys`` (stopped servers past what is kept of a user's), in the
        writer; raises ``StoreUnavailable`` (``NotHolder``: not this governor's to write)."""
        keys = sorted(set(keys))
        if not keys:
            return

        def write() -> None:
            try:
                with self._session.begin() as session:
                    self.fence(session.connection())
                    for i in range(0, len(keys), 500):  # within every database's parameters
                        chunk = keys[i : i + 500]
                        session.execute(SERVERS.delete().where(SERVERS.c.key.in_(chunk)))
            except DBAPIError as error:
                raise StoreUnavailable(self.url, error) from error
            self._stored.difference_update(keys)

        await self.write_async(write)

    # -- health dismissals -----------------------------------------------------------------------

    def dismissals(self) -> dict[str, frozenset[str]]:
        """Every GPU claim an admin dismissed that has not ended: uuid -> the evidence."""
        with self.session() as session:
            rows = session.scalars(select(DismissalRow)).all()
        return {
            row.uuid: frozenset(str(e) for e in row.evidence)
            for row in rows
            if isinstance(row.evidence, list)
        }

    # -- audit and extensions -------------------------------------------------------------------

    def audit(self, rows: Iterable[AuditRow]) -> None:
        self.save(audits=rows)

    def audit_rows(
        self,
        server_key: str | None = None,
        user: str | Collection[str] | None = None,
        limit: int = 200,
        before: int | None = None,
    ) -> list[AuditRow]:
        """Newest first, at most ``limit``; ``before``: only rows older than that id (a page);
        ``user``: one user's, or any of a set's."""
        with self.session() as session:
            query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
            if before is not None:
                query = query.where(AuditRow.id < before)
            if server_key is not None:
                query = query.where(AuditRow.server_key == server_key)
            if isinstance(user, str):
                query = query.where(AuditRow.user == user)
            elif user is not None:
                query = query.where(AuditRow.user.in_(sorted(user)))
            return list(session.scalars(query))

    def audit_since(self, action: str, since: datetime) -> list[AuditRow]:
        """The audit rows of one action from ``since`` on, oldest first."""
        with self.session() as session:
            query = select(AuditRow).where(AuditRow.action == action, AuditRow.at >= since)
            return list(session.scalars(query.order_by(AuditRow.id)))

    def queue_audit(
        self, since: datetime | None = None, until: datetime | None = None
    ) -> Iterator[Row]:
        """The spawn queue's departures (started, expired, cancelled) from the audit trail,
        from ``since`` to the end of ``until``'s UTC day (``hub.queue.queue_buckets``): their
        ``user``, ``at`` and ``details``, in time order, streamed as ``usage`` (ORM rows, all
        held: 200,000 departures took 620 MB).
        """
        audit = AuditRow.__table__
        query = select(audit.c.user, audit.c.at, audit.c.details).where(
            audit.c.action.in_(("queue-started", "queue-left"))
        )
        if since is not None:
            query = query.where(audit.c.at >= since)
        if until is not None:
            end = until.astimezone(timezone.utc).date() + timedelta(days=1)
            query = query.where(audit.c.at < datetime.combine(end, time(), timezone.utc))
        query = query.order_by(audit.c.at, audit.c.id)
        with self.engine.connect() as db:
            yield from db.execute(query.execution_options(stream_results=True, yield_per=5000))

    def add_extension(self, row: ExtensionRow) -> ExtensionRow:
        self.save(extensions=[row])
        return row

    def extensions(
        self,
        status: str | None = None,
        server_key: str | None = None,
        limit: int | None = None,
        before: int | None = None,
    ) -> list[ExtensionRow]:
        """Newest first; ``limit`` and ``before`` as ``audit_rows``' (a page)."""
        with self.session() as session:
            query = select(ExtensionRow).order_by(ExtensionRow.id.desc()).limit(limit)
            if before is not None:
                query = query.where(ExtensionRow.id < before)
            if status is not None:
                query = query.where(ExtensionRow.status == status)
            if server_key is not None:
                query = query.where(ExtensionRow.server_key == server_key)
            return list(session.scalars(query))

    def update_extension(self, row: ExtensionRow) -> None:
        self.save(updated_extensions=[row])

    # -- the usage ledger ------------------------------------------------------------------------

    def save_usage(self, deltas: dict, sessions: Iterable[LedgerSession]) -> None:
        """Add the ledger's bucket deltas to their rows and write the changed sessions, in one
        transaction and a few bulk statements (the governor is the only writer: rows it has
        seen or written are known to exist)."""
        write = self._usage_write(deltas, sessions)
        if write is not None:
            self.write(write)

    async def save_usage_async(self, deltas: dict, sessions: Iterable[LedgerSession]) -> None:
        """``save_usage``, the event loop running while it is written (``deltas`` and
        ``sessions`` are the ledger's drained copies: nothing changes them meanwhile)."""
        write = self._usage_write(deltas, sessions)
        if write is not None:
            await self.write_async(write)

    def _usage_write(self, deltas: dict, sessions: Iterable[LedgerSession]):
        sessions = list(sessions)
        if not deltas and not sessions:
            return None

        def write() -> None:
            try:
                self._save_usage(deltas, sessions)
            except DBAPIError as error:
                raise StoreUnavailable(self.url, error) from error

        return write

    def _save_usage(self, deltas: dict, sessions: list[LedgerSession]) -> None:
        day_names = {day: day.isoformat() for day in {day for day, _ in deltas}}
        with self._session.begin() as db:
            self.fence(db.connection())
            day_keys = self._usage_keys
            days = [name for name in set(day_names.values()) if name not in day_keys]
            if days:  # a day not seen yet (or written by an earlier run): its keys, once
                query = select(*_USAGE_KEY).where(UsageRow.day.in_(days))
                loaded: dict[str, set] = {name: set() for name in days}
                for k in db.execute(query):
                    loaded[k[0]].add(tuple(k))
                day_keys.update(loaded)
            new, old = [], []
            keys = []
            for (day, owner), values in deltas.items():
                key = (day_names[day], owner.user, owner.team, owner.project, owner.tier)
                keys.append(key)
                amounts = tuple(map(float, map(values.get, FIELDS, _ZEROS)))
                if key in day_keys[key[0]]:
                    old.append((*amounts, *key))  # as _ADD_TO_USAGE_PARAMS
                else:
                    new.append(
                        dict(zip((*_USAGE_KEY_NAMES, *FIELDS), (*key, *amounts), strict=True))
                    )
            connection = db.connection()
            if new:
                connection.execute(insert(UsageRow), new)
            if old:
                self._add_to_usage.run(connection, old)
            latest = {(s.server, s.session): s for s in sessions}  # (the last of a key's)
            stored = self._usage_sessions
            unknown = [k for k in latest if k not in stored]
            rows: dict = {}  # of those, the sessions with a row (None: written whole)
            if unknown:  # new sessions, an earlier run's, ended ones: asked for, this write's
                servers = {server for server, _ in unknown}
                query = select(UsageSessionRow.server, UsageSessionRow.session).where(
                    UsageSessionRow.server.in_(servers)
                )
                rows = dict.fromkeys(tuple(k) for k in db.execute(query))
            fresh, known, steady = [], [], []
            written = {}  # (server, session) -> as _usage_sessions keeps it once this commits
            for key, s in latest.items():
                totals = map(float, map(s.totals.get, FIELDS, _ZEROS))
                was = stored.get(key, False)
                if was is False:
                    was = rows.get(key, False)  # False: no row
                if (
                    was  # (owner, first_at) as stored, not ended
                    and s.ended_at is None
                    and was[0] == s.owner
                    and was[1] == s.first_at
                ):
                    # as _UPDATE_STEADY_SESSION_PARAMS
                    steady.append((s.at, float(s.gpus), s.state, *totals, *key))
                    continue
                owner = s.owner
                written[key] = (owner, s.first_at) if s.ended_at is None else None
                row = (  # as _UPDATE_SESSION_PARAMS
                    owner.user,
                    owner.team,
                    owner.project,
                    owner.tier,
                    s.first_at,
                    s.at,
                    s.ended_at,
                    float(s.gpus),
                    s.state,
                    *totals,
                    *key,
                )
                if was is False:
                    fresh.append(dict(zip(_SESSION_ROW_COLUMNS, row, strict=True)))
                else:
                    known.append(row)
            if fresh:
                connection.execute(insert(UsageSessionRow.__table__), fresh)
            if known:
                self._update_session.run(connection, known)
            if steady:
                self._update_steady_session.run(connection, steady)
        for key in keys:
            if (found := day_keys.get(key[0])) is not None:  # (None: forgotten meanwhile)
                found.add(key)
        for day in sorted(day_keys)[:-2]:  # a pass's deltas are today's, yesterday's at midnight
            del day_keys[day]  # (an older day's written again: its keys asked for again)
        for key, was in written.items():
            if was is None:
                stored.pop(key, None)  # ended
            else:
                stored[key] = was

    def usage(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        **owner: str | frozenset[str] | None,
    ) -> Iterator[Bucket]:
        """Ledger buckets of the days from ``since`` to ``until`` (inclusive, UTC days) in day
        order, optionally only one user's, team's, project's or tier's (a set: any of them,
        a lead's teams). Streamed, Core rows a
        chunk at a time: ORM rows were all held in the session (a year of 1,000 users' buckets
        by day took 994 MB with what was made of them)."""
        usage = UsageRow.__table__
        query = select(*(usage.c[name] for name in (*_USAGE_KEY_NAMES, *FIELDS)))
        if since is not None:
            query = query.where(usage.c.day >= since.astimezone(timezone.utc).date().isoformat())
        if until is not None:
            query = query.where(usage.c.day <= until.astimezone(timezone.utc).date().isoformat())
        for name, value in owner.items():
            if isinstance(value, str):
                query = query.where(usage.c[name] == value)
            elif value is not None:
                query = query.where(usage.c[name].in_(sorted(value)))
        query = query.order_by(usage.c.day).execution_options(stream_results=True, yield_per=5000)
        with self.engine.connect() as db:
            for day, user, team, project, tier, *values in db.execute(query):
                yield Bucket(
                    datetime.fromisoformat(day).date(),
                    Owner(user, team, project, tier),
                    {f: value or 0.0 for f, value in zip(FIELDS, values, strict=True)},
                )

    def usage_sessions(
        self,
        since: datetime | None = None,
        user: str | Collection[str] | None = None,
        open_only: bool = False,
    ) -> list[LedgerSession]:
        """Ledger sessions still open or ended after ``since``, newest first; ``user``: one
        user's, or any of a set's."""
        with self.session() as db:
            query = select(UsageSessionRow).order_by(UsageSessionRow.first_at.desc())
            if open_only:
                query = query.where(UsageSessionRow.ended_at.is_(None))
            elif since is not None:
                query = query.where(
                    UsageSessionRow.ended_at.is_(None) | (UsageSessionRow.ended_at >= since)
                )
            if isinstance(user, str):
                query = query.where(UsageSessionRow.user == user)
            elif user is not None:
                query = query.where(UsageSessionRow.user.in_(sorted(user)))
            return [
                LedgerSession(
                    r.server,
                    r.session,
                    Owner(r.user, r.team, r.project, r.tier),
                    r.first_at,
                    r.at,
                    r.gpus,
                    r.state,
                    {f: getattr(r, f) or 0.0 for f in FIELDS},
                    r.ended_at,
                )
                for r in db.scalars(query)
            ]


def _in_memory(url: str) -> bool:
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the reconcile's writes
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


# -- Record <-> row ----------------------------------------------------------------------------


__all__ = ["NotHolder", "Store", "StoreTooNew", "StoreUnavailable", "safe_url"]
