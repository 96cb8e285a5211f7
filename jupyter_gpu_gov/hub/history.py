"""The governor's own history (``replay.history``'s format), recorded as it runs.

At each pass the governor records, per running server, what it decided on and what it did, in
three tables of its store (``gpu_gov_history``, with the ``gpu_gov_history_runs`` and
``gpu_gov_history_contexts`` dictionaries): ``replay.history.STORAGE_COLUMNS``, about 52 bytes a
kept row. Cheap per pass: a server the pass did not look at (its kept view, ``hub/unchanged.py``,
and report did not move) costs nothing until its keyframe is due (a heap of due times), and only
rows
``worth_recording`` keeps are written, in one bulk insert a pass (what changed, not a copy of
the world). Bounded: rows older than ``history_retention`` and beyond ``history_max_rows`` are
deleted, at most once every ``PRUNE_EVERY``, and the runs and contexts no kept row names, at
most once every ``SWEEP_EVERY``; ``history_retention = 0`` records nothing. That upkeep runs
after a pass's write, in steps of about ``STEP_S`` (each its own transaction in the store's
writer, other writes between them), at most ``PASS_UPKEEP_S`` of them a pass: the whole sweep
in one transaction held the writer 6.5-7.7 s at 10,000 servers (``docs/benchmarks-history.md``).

``read_history`` reads rows back in time order for ``export-trace`` and the admin API
(``replay.history.export_trace`` turns them into a replay trace), with the runs and contexts of
the rows it read only.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta

from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from ..core import clock, slotted
from ..core.policy import ServerView
from ..core.vocabulary import (
    ADMIN_WARN,
    BUSY_NOTICE,
    CHECKPOINT,
    CULL,
    INTERRUPT,
    MAX_AGE_WARN,
    OVERRUN_NOTICE,
    RECLAIM_WARN,
    WARN,
)
from ..replay.history import (
    CHECKPOINT_OUTCOMES,
    CONTENT_FIELDS,
    KEYFRAME_S,
    STORAGE_COLUMNS,
    HistoryRow,
    content,
    content_of,
    content_values,
    context_of,
    pack,
    parse_context,
    unpack,
)
from .bulk_sql import Executemany
from .deadlines import NextTimes
from .hubapi import HubServer
from .store import StoreUnavailable

log = logging.getLogger("jupyter_gpu_gov.hub")

PRUNE_EVERY = 3600.0  # seconds (monotonic) between two prunes
SWEEP_EVERY = 86400.0  # seconds (monotonic) between two sweeps of the runs and contexts
STEP_S = 0.05  # about how long one step of the prune or sweep holds the store
PASS_UPKEEP_S = 1.0  # the steps a pass runs after its history's write, at most (seconds)
# The audit's actions that are the policy's (what replay and what-if count).
POLICY_ACTIONS = frozenset(
    {WARN, CHECKPOINT, CULL, INTERRUPT, MAX_AGE_WARN, RECLAIM_WARN, ADMIN_WARN}
    | {BUSY_NOTICE, OVERRUN_NOTICE}
)

_TYPES = {"INTEGER": Integer, "TEXT": Text}
metadata = MetaData()
HISTORY = Table(
    "gpu_gov_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    *(
        Column(name, _TYPES[kind.split()[0]], nullable="NOT NULL" not in kind)
        for name, kind in STORAGE_COLUMNS
    ),
    Index("gpu_gov_history_t", "t"),
)
RUNS = Table(
    "gpu_gov_history_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("server", String(512), nullable=False),
    Column("started", Float, nullable=False),
)
CONTEXTS = Table(
    "gpu_gov_history_contexts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("json", Text, nullable=False, unique=True),
)
# Where the sweep stands, kept in the store so that a restart (or another governor taking the
# lease) resumes from it: the highest run and context ids the history rows deleted since the
# last sweep began name (one row; none: not known, the next sweep checks every id).
SWEEP_FROM = Table(
    "gpu_gov_history_sweep",
    metadata,
    Column("id", Integer, primary_key=True),  # 1
    Column("runs", Integer, nullable=False),
    Column("contexts", Integer, nullable=False),
)
_ROW_NAMES = [name for name, _ in STORAGE_COLUMNS]


@dataclass(frozen=True)
class HistoryOptions:
    """How much history the governor keeps (``GpuGovernor.history_*``)."""

    retention: timedelta = timedelta(days=14)  # zero: none is recorded
    max_rows: int = 60_000_000  # about 3 GB in SQLite; the oldest go first

    @property
    def enabled(self) -> bool:
        return self.retention > timedelta(0) and self.max_rows > 0


class HistoryLog:
    """The history tables of one store: appends, prunes, reads."""

    def __init__(self, engine: Engine, options: HistoryOptions, fence=None):
        self.engine = engine
        self.fence = fence or (lambda db: None)  # Store.fence: only the lease's holder writes
        self.options = options
        metadata.create_all(engine)
        self._runs: dict[tuple[str, float], int] = {}  # (server, started) -> id
        # server -> (the context values of its last row, their id): a server's context seldom
        # changes, and is found by its values without writing its JSON (one entry a server,
        # not one a context it ever had). Labels are never changed in place.
        self._contexts: dict[str, tuple[tuple, int]] = {}
        self._insert = Executemany(
            insert(HISTORY).values({name: bindparam(name) for name in _ROW_NAMES}),
            engine.dialect,
            _ROW_NAMES,
        )
        self._pruned_at = -PRUNE_EVERY  # monotonic: prune at the first write
        self._swept_at = -SWEEP_EVERY
        self._upkeep: _Upkeep | None = None  # the prune under way, between its steps

    def deleted_named(self) -> tuple[int, int] | None:
        """The highest run and context ids the rows deleted since the last sweep began named
        (``SWEEP_FROM``): only those up to them can have lost their last row. None: not known
        (a store swept by no version that kept it, one without ``RETURNING``): the next sweep
        checks them all."""
        with self.engine.connect() as db:
            return _deleted_named(db)

    def append(self, rows: Iterable[HistoryRow]) -> int:
        """Write kept rows (one transaction, one ``executemany``, the ids of new runs and
        contexts found or made in bulk); how many. Raises ``DBAPIError``."""
        rows = list(rows)
        if not rows:
            return 0
        with self.engine.begin() as db:
            self.fence(db)
            runs, contexts = self._resolve(db, rows)
            values = [pack(r, runs[r.session], c[1]) for r, c in zip(rows, contexts, strict=True)]
            self._insert.run(db, values)
        # Cached once committed: an id made in a transaction rolled back names nothing (and
        # SQLite gives it again to the next insert).
        self._runs.update(runs)
        self._contexts.update((r.server, c) for r, c in zip(rows, contexts, strict=True))
        if self._upkeep is not None:  # a sweep under way: these rows name their ids
            self._upkeep.named(runs.values(), (c[1] for c in contexts))
        return len(rows)

    def _resolve(self, db, rows: list[HistoryRow]) -> tuple[dict, list[tuple[tuple, int]]]:
        """The ids of the rows' runs by session, and each row's (context values, id)."""
        for cache in (self._runs, self._contexts):
            if len(cache) > 100_000:  # an id is a query away: the caches stay bounded
                cache.clear()
        runs = {row.session: self._runs.get(row.session) for row in rows}
        new = {session for session, id_ in runs.items() if id_ is None}
        if new:
            runs.update(_ids(db, RUNS, new))
        # A row's context is its server's last one (the same values), or its JSON's id.
        contexts, texts = [], {}  # each row's (values, id); the JSON of those not known
        for i, row in enumerate(rows):
            values = (row.profile, row.team, row.labels, row.policy, row.state, row.cause)
            last = self._contexts.get(row.server)
            if last is not None and last[0] == values:
                contexts.append(last)
            else:
                contexts.append((values, None))
                texts[i] = context_of(row)
        if texts:
            ids = _ids(db, CONTEXTS, set(texts.values()))
            for i, text in texts.items():
                contexts[i] = (contexts[i][0], ids[text])
        return runs, contexts

    def upkeep_due(self) -> bool:
        """Whether a prune is under way or due (``PRUNE_EVERY`` since the last began)."""
        return self._upkeep is not None or time.monotonic() - self._pruned_at >= PRUNE_EVERY

    def upkeep_step(self) -> bool:
        """One step of the prune and sweep (beginning one if due): one transaction of about
        ``STEP_S``, work a bounded batch at a time; whether more is left. A failure (raised:
        ``DBAPIError``, ``NotHolder``) drops the prune under way, as the one that failed in
        the pass's write did: the next is an hour on."""
        if self._upkeep is None:
            if time.monotonic() - self._pruned_at < PRUNE_EVERY:
                return False
            self._pruned_at = time.monotonic()
            self._upkeep = _Upkeep(self)
        upkeep, self._upkeep = self._upkeep, None  # (dropped unless it ends well)
        try:
            with self.engine.begin() as db:
                self.fence(db)
                more = upkeep.step(db, time.perf_counter() + STEP_S)
        except BaseException:  # (what its deleted rows named stays in the store, rolled back
            raise  # with them: the next sweep checks it)
        if more:
            self._upkeep = upkeep
        return more

    def prune(self) -> None:
        """A prune now (and the sweep, if a day is past), to its end, a step at a time."""
        self._pruned_at = -PRUNE_EVERY
        while self.upkeep_step():
            pass

    def _forget(self, runs: set[int], contexts: set[int]) -> None:
        """Ids the sweep deleted, out of the caches: the next row of their server asks."""
        if runs:
            self._runs = {k: id_ for k, id_ in self._runs.items() if id_ not in runs}
        if contexts:
            self._contexts = {k: c for k, c in self._contexts.items() if c[1] not in contexts}


class _Batch:
    """How many rows one batch of a kind takes: doubled or halved after each, so that a batch
    lasts a tenth to a third of a step whatever the machine, its load and the store's size."""

    def __init__(self, size: int = 1000):
        self.size = size

    def took(self, seconds: float) -> None:
        if seconds < STEP_S / 10:
            self.size = min(self.size * 2, 1_000_000)
        elif seconds > STEP_S / 3:
            self.size = max(self.size // 2, 100)


class _Upkeep:
    """A prune under way, and the sweep after it: rows past the retention, then beyond
    ``max_rows`` (ids grow with time: the oldest); if it deleted any and ``SWEEP_EVERY`` has
    passed, the runs and contexts no row names. A step does batches until its time is up;
    where it stands is kept between steps (``_work``, a generator yielding each batch's
    ``_Batch`` once it is done, to time it)."""

    def __init__(self, log: HistoryLog):
        self.log = log
        self.db = None  # the connection of the step running
        self.deletes, self.scans, self.lists = _Batch(), _Batch(), _Batch()
        self.sweeping = False
        self.deleted = False  # history rows deleted (since the sweep began, once it has)
        self.runs: set[int] = set()  # ids some row names (the sweep's scan; appends meanwhile)
        self.contexts: set[int] = set()
        self.work = self._work()

    def named(self, runs: Iterable[int], contexts: Iterable[int]) -> None:
        if self.sweeping:
            self.runs.update(runs)
            self.contexts.update(contexts)

    def step(self, db, until: float) -> bool:
        self.db = db
        try:
            started = time.perf_counter()
            while True:  # a batch at least
                batch = next(self.work, None)
                if batch is None:
                    return False
                ended = time.perf_counter()
                batch.took(ended - started)
                if ended >= until:
                    return True
                started = ended
        finally:
            self.db = None

    def _ids(self, table: Table) -> tuple[int | None, int | None]:
        """The table's lowest and highest ids: two statements (SQLite reads ``min`` and
        ``max`` off the key alone, not together: that is a scan)."""
        first = self.db.execute(select(func.min(table.c.id))).scalar()
        return first, self.db.execute(select(func.max(table.c.id))).scalar()

    def _delete(self, query) -> int:
        """Delete history rows; how many. Notes the highest run and context ids they named in
        the store (``SWEEP_FROM``, in the same transaction), where the store can say
        (``RETURNING``)."""
        db = self.db
        self.deleted = True
        known = _deleted_named(db)
        if known is None or not db.dialect.delete_returning:
            if known is not None:
                _note_named(db, None)  # (the next sweep checks them all)
            return db.execute(query).rowcount
        named = db.execute(query.returning(HISTORY.c.run, HISTORY.c.context)).all()
        if named:
            runs = max(known[0], max(run for run, _ in named))
            contexts = max(known[1], max(c for _, c in named))
            if (runs, contexts) != known:
                _note_named(db, (runs, contexts))
        return len(named)

    def _work(self) -> Iterator[_Batch]:
        log = self.log
        cutoff = int(clock.utcnow().timestamp() - log.options.retention.total_seconds())
        deleted = 0
        while True:  # past the retention, by t (its index), a batch at a time
            size = self.deletes.size
            oldest = select(HISTORY.c.id).where(HISTORY.c.t < cutoff).limit(size)
            done = self._delete(delete(HISTORY).where(HISTORY.c.id.in_(oldest)))
            deleted += done
            yield self.deletes
            if done < size:
                break
        first, last = self._ids(HISTORY)
        if last is not None and last > log.options.max_rows:
            bound = last - log.options.max_rows  # ids up to it go
            while first <= bound:
                upto = min(bound, first + self.deletes.size - 1)
                query = delete(HISTORY).where(HISTORY.c.id >= first, HISTORY.c.id <= upto)
                deleted += self._delete(query)
                first = upto + 1
                yield self.deletes
        if deleted and time.monotonic() - log._swept_at >= SWEEP_EVERY:
            yield from self._sweep()

    def _sweep(self) -> Iterator[_Batch]:
        """The runs and contexts no row names: else they grow for ever (a run a session,
        3.65 M a year at 10,000 servers), and so did what every export read. The history is
        scanned by ranges of ids (its key) for the ids its rows name, rows written meanwhile
        adding theirs (``named``); then the runs and contexts made before the scan that none
        names are deleted. Only ids up to the highest the rows deleted since the last sweep
        named (``SWEEP_FROM``, kept in the store: a restart resumes from it) are checked, all
        of them when that is not known. An index on each column would make it cheap, at 12 bytes a row and a
        scattered write a row (``docs/benchmarks-history.md``)."""
        log, db = self.log, lambda: self.db
        log._swept_at = time.monotonic()
        self.sweeping, self.deleted = True, False
        first, last = self._ids(HISTORY)
        tops = {table: self._ids(table)[1] or 0 for table in (RUNS, CONTEXTS)}
        named_before = _deleted_named(self.db)
        if named_before is not None:
            # Only the ids the deleted rows named, and those below, can have lost their last
            # row (the rest were swept before, or are named): a range returns those still
            # named, not every id it names again (what cost the writer most). Kept in the
            # store: the first sweep after a restart is bounded too.
            for table, most in zip((RUNS, CONTEXTS), named_before, strict=True):
                tops[table] = min(tops[table], most)
        lo = (first or 1) - 1
        while last is not None and lo < last:
            hi = min(last, lo + self.scans.size)
            span = (HISTORY.c.id > lo, HISTORY.c.id <= hi)
            for column, named, table in (
                (HISTORY.c.run, self.runs, RUNS),
                (HISTORY.c.context, self.contexts, CONTEXTS),
            ):
                query = select(column).where(*span, column <= tops[table]).distinct()
                named.update(db().scalars(query))
            lo = hi
            yield self.scans
        for table, named in ((RUNS, self.runs), (CONTEXTS, self.contexts)):
            lo = 0
            while lo < tops[table]:  # made before the scan began: those made since are named
                query = select(table.c.id).where(table.c.id > lo, table.c.id <= tops[table])
                ids = list(db().scalars(query.order_by(table.c.id).limit(self.lists.size)))
                if not ids:
                    break
                lo = ids[-1]
                unnamed = [id_ for id_ in ids if id_ not in named]
                for start in range(0, len(unnamed), 500):
                    chunk = unnamed[start : start + 500]
                    db().execute(delete(table).where(table.c.id.in_(chunk)))
                if unnamed:
                    gone = set(unnamed)
                    log._forget(*((gone, set()) if table is RUNS else (set(), gone)))
                yield self.lists
        # Every id up to the tops is checked: the next sweep starts from what rows deleted
        # from now on name (unless rows were deleted meanwhile: then from what they noted).
        # Written in the sweep's last transaction: one that fails leaves what was noted.
        if not self.deleted:
            _note_named(self.db, (0, 0))


def _deleted_named(db) -> tuple[int, int] | None:
    """``SWEEP_FROM``'s ids, as ``db``'s transaction reads them (None: not known)."""
    query = select(SWEEP_FROM.c.runs, SWEEP_FROM.c.contexts).where(SWEEP_FROM.c.id == 1)
    found = db.execute(query).first()
    return (found[0], found[1]) if found is not None else None


def _note_named(db, named: tuple[int, int] | None) -> None:
    db.execute(delete(SWEEP_FROM).where(SWEEP_FROM.c.id == 1))
    if named is not None:
        db.execute(insert(SWEEP_FROM).values(id=1, runs=named[0], contexts=named[1]))


def _ids(db, table: Table, keys: set) -> dict:
    """The ids of ``keys`` (runs: (server, started); contexts: their JSON), inserting those
    the table lacks: a few statements for any number of keys."""

    def select_ids(chunk: list) -> dict:
        if table is RUNS:
            servers = {server for server, _ in chunk}
            query = select(RUNS.c.id, RUNS.c.server, RUNS.c.started)
            found = db.execute(query.where(RUNS.c.server.in_(servers)))
            return {(s, st): i for i, s, st in found if (s, st) in keys}
        query = select(CONTEXTS.c.id, CONTEXTS.c.json).where(CONTEXTS.c.json.in_(chunk))
        return {text: i for i, text in db.execute(query)}

    def select_all(wanted: list) -> dict:
        found = {}
        for start in range(0, len(wanted), 500):
            found.update(select_ids(wanted[start : start + 500]))
        return found

    found = select_all(list(keys))
    new = [key for key in keys if key not in found]
    if new:
        if table is RUNS:
            values = [{"server": server, "started": started} for server, started in new]
        else:
            values = [{"json": text} for text in new]
        db.execute(insert(table), values)
        found.update(select_all(new))
    return found


def read_history(
    engine: Engine, since: float | None = None, until: float | None = None
) -> Iterator[HistoryRow]:
    """Kept rows in time order from ``since - KEYFRAME_S`` (so that every run's state at
    ``since`` is known) to ``until`` (Unix seconds), streamed, with the runs and contexts they
    name (an hour's export of a store that has seen a million runs reads an hour's, not a
    million).

    Read ``CHUNK`` rows at a time after the last one read (by ``t``, then ``id``), each chunk
    and the runs and contexts it names in a short transaction of its own, none open while the
    rows are written out: one read open for a whole export (minutes, at the client's pace)
    kept SQLite's WAL from being checkpointed, the file growing while the governor wrote,
    and held back PostgreSQL's vacuum. A row whose run or context a sweep took between its
    chunk's statements (its rows pruned meanwhile: SQLite reads each statement as of its own
    start) is left out, as a row pruned before its chunk was read is."""
    metadata.create_all(engine)
    query = select(*(HISTORY.c[name] for name in _ROW_NAMES), HISTORY.c.id)
    if since is not None:
        query = query.where(HISTORY.c.t >= int(since - KEYFRAME_S))
    if until is not None:
        query = query.where(HISTORY.c.t <= int(until))
    query = query.order_by(HISTORY.c.t, HISTORY.c.id)
    runs: dict[int, tuple[str, float]] = {}
    contexts: dict[int, tuple] = {}
    after = None  # (t, id) of the last row read
    while True:
        page = query.limit(CHUNK)
        if after is not None:  # on the index of t: ties in t taken on by id
            t, id_ = after
            page = page.where(HISTORY.c.t >= t, or_(HISTORY.c.t > t, HISTORY.c.id > id_))
        with engine.connect() as db:
            if engine.dialect.name == "postgresql":
                # The chunk's rows and the runs and contexts they name in one snapshot.
                db = db.execution_options(isolation_level="REPEATABLE READ")
            with db.begin():
                chunk = db.execute(page).all()
                runs.update(_named(db, RUNS, {v[1] for v in chunk} - runs.keys()))
                contexts.update(_named(db, CONTEXTS, {v[2] for v in chunk} - contexts.keys()))
        for *values, _ in chunk:
            run, context = runs.get(values[1]), contexts.get(values[2])
            if run is not None and context is not None:
                yield unpack(tuple(values), run, context)
        if len(chunk) < CHUNK:
            return
        after = (chunk[-1][0], chunk[-1][-1])


CHUNK = 10_000  # rows an export reads at a time


def _named(db, table: Table, ids: set[int]) -> dict:
    """The runs ((server, started)) or parsed contexts of ``ids``, by id."""
    found = {}
    wanted = sorted(ids)
    for start in range(0, len(wanted), 500):
        query = select(table).where(table.c.id.in_(wanted[start : start + 500]))
        for id_, *values in db.execute(query):
            found[id_] = tuple(values) if table is RUNS else parse_context(values[0])
    return found


class _Last:
    """A server's last kept row, and (weakly: once no pass keeps it, it cannot come again) the
    view its last look was on, to skip building the next look's row from the same view."""

    __slots__ = ("row", "view")

    def __init__(self, row: HistoryRow, view: ServerView):
        self.row, self.view = row, weakref.ref(view)


class History:
    """The governor's recording of its passes (a part of ``Governor``)."""

    def _history_log(self) -> HistoryLog | None:
        log_ = getattr(self, "_history", None)
        if log_ is None and self.options.history.enabled:
            log_ = self._history = HistoryLog(
                self.store.engine, self.options.history, self.store.fence
            )
            self._history_last: dict[str, _Last] = {}
            self._history_pending: dict[str, HistoryRow] = {}
            self._keyframes = NextTimes()  # when each server's next keyframe is due
            self._history_retry: set[str] = set()  # a look failed: again at the next pass
        return log_

    def _record(self, server: HubServer, view: ServerView, now: datetime) -> None:
        """This pass's look at a running server. A failure is logged (once a pass) and
        dropped: the history never fails a server's decision nor stops the pass."""
        try:
            self._look(server, view, now)
        except Exception:
            if getattr(self, "_history", None) is not None:
                self._history_retry.add(view.key)  # tried again at the next pass
            if not self._history_failed:
                self._history_failed = True
                log.exception("gpu-gov: a server's history row not recorded")

    _history_failed = False  # this pass already logged a failure

    def _look(self, server: HubServer, view: ServerView, now: datetime) -> None:
        """Its row, kept if ``worth_recording`` (the same rule: this look's ``content_of``
        against the last kept row's ``content``, worked out again rather than held)."""
        if self._history_log() is None:
            return
        key = view.key
        last = self._history_last.get(key)
        t = now.timestamp()
        due = last is None or t - last.row.t >= KEYFRAME_S
        if not due and last.view() is view:
            # The kept view (hub/unchanged.py): nothing it reads moved, the report's GPU
            # figures, DCGM's and the record included (``same_report``).
            return
        values = self._history_values(server, view, self.reports.get(key), now)
        started = server.started.timestamp() if server.started else 0.0
        if due or last.row.started != started or _moved(values, last.row):
            row = _looked_row(t, key, started, values)
            self._history_pending[key] = row
            self._history_last[key] = _Last(row, view)
            self._keyframes.at(key, t + KEYFRAME_S)
        else:
            last.view = weakref.ref(view)

    def _record_keyframes(self, kept: Mapping, now: datetime) -> None:
        """After the pass decided: the servers it did not look at whose keyframe is due, on
        their kept views (``kept``: ``hub/unchanged.Kept`` by key; a server the pass looked at
        has its next keyframe set already). A running server's keyframe is never dropped: one
        taken and not recorded is due again from its last kept row."""
        if self._history_log() is None:
            return
        t = now.timestamp()
        keyframes = self._keyframes
        for key in keyframes.take(t):
            server, held = self._servers.get(key), kept.get(key)
            if server is None:
                continue  # stopped: its keyframes end
            if held is not None:
                self._record(server, held.view, now)
            last = self._history_last.get(key)
            if key not in keyframes and last is not None:
                # Not recorded: its last kept row is later than this keyframe was set from
                # (a row of a policy action alone), or no kept view. Due again from that row.
                keyframes.at(key, last.row.t + KEYFRAME_S)
        for key in self._history_retry:
            keyframes.at(key, t)
        self._history_retry.clear()

    def _history_values(self, server: HubServer, view: ServerView, received, now) -> tuple:
        """What the pass saw of a server, as ``CONTENT_FIELDS``."""
        fresh = received is not None and now - received.at <= self.options.report_stale_after
        report = received.report if fresh else None
        evidence = (
            self._report_evidence(report, server)
            if report is not None
            else self._granted_evidence(server)
        )
        dcgm = [e.activity for e in evidence if e.activity is not None]
        gpu_sm, memory, holds, busy, connections = _reported(report)
        if not memory:
            memory = sum(e.memory_used_mb or 0.0 for e in evidence)
        row = self.rows.get(view.key)
        return (
            view.profile,
            view.team,
            view.labels,
            bool(row and row.reports) or received is not None,
            gpu_sm,
            max(dcgm) if dcgm else None,
            memory,
            holds,
            busy,
            connections,
            _seconds(view.user_last_activity),
            _seconds(view.hub_last_activity),
            (row.state if row is not None else None) or "active",
            (row.policy if row is not None else None) or "default",
            view.cause,
        )

    async def _record_pass(self, audits: Iterable, stopped: Iterable[str], now: datetime) -> None:
        """After the pass acted: its policy actions on their servers' rows, a last row for each
        server that stopped, and the kept rows written (in the store's writer thread, the loop
        running meanwhile). A failed write is logged and dropped: the history never stops a
        pass."""
        try:
            await self._write_pass(audits, stopped, now)
        except Exception:  # as _record: logged, dropped
            log.exception("gpu-gov: this pass's history not recorded")
        self._history_failed = False

    async def _write_pass(self, audits: Iterable, stopped: Iterable[str], now: datetime) -> None:
        if self._history_log() is None:
            return
        running = self._servers
        pending = self._history_pending
        t = now.timestamp()
        for audit in audits:
            key = audit.server_key
            details = audit.details or {}
            outcome = details.get("status") if audit.action.startswith("checkpoint-") else None
            acted = audit.action in POLICY_ACTIONS
            if audit.dry_run or key not in running or not (acted or outcome in CHECKPOINT_OUTCOMES):
                continue
            row = pending.get(key)
            if row is None:  # nothing else moved: the last kept row again, at this pass
                last = self._history_last.get(key)
                if last is None:
                    continue
                row = replace(last.row, t=t, actions=(), cull_reason=None, checkpoint=None)
            if acted:
                reason = details.get("cull_reason") or self.rows[key].cull_reason
                cull_reason = reason if audit.action == CULL else row.cull_reason
                row = replace(row, actions=(*row.actions, audit.action), cull_reason=cull_reason)
            else:
                row = replace(row, checkpoint=outcome)
            pending[key] = self._history_last[key].row = row
        for key in stopped:
            self._keyframes.forget(key)
            if key not in self._history_last:
                continue
            last = self._history_last.pop(key).row  # its last values, as the export holds them
            stop = replace(last, t=t, stopped=True, actions=(), cull_reason=None, checkpoint=None)
            pending[key] = stop
        self._history_pending = {}
        if pending:
            rows = sorted(pending.values(), key=lambda r: r.server)  # (HistoryRow: immutable)
            try:
                await self.store.write_async(lambda: self._history.append(rows))
            except (DBAPIError, StoreUnavailable) as error:
                log.error("gpu-gov: %d history rows not recorded: %s", len(pending), error)
        await self._history_upkeep()

    async def _history_upkeep(self) -> None:
        """The prune and sweep, when due, a step at a time (``HistoryLog.upkeep_step``): each
        its own job in the store's writer, so a request's write or the next pass's waits for
        one step at most; ``PASS_UPKEEP_S`` of them a pass, the rest at the next."""
        history = self._history
        if not history.upkeep_due():
            return
        until = time.monotonic() + PASS_UPKEEP_S
        try:
            while await self.store.write_async(history.upkeep_step):
                if time.monotonic() >= until:
                    break
        except (DBAPIError, StoreUnavailable) as error:
            log.error("gpu-gov: the history's prune stopped, again in an hour: %s", error)


_build_row = slotted.builder(HistoryRow)
# A look's row is HistoryRow's fields in this order: the look's values (``CONTENT_FIELDS``)
# and the defaults of what a look does not set (``_write_pass`` sets them).
_LOOKED = ("t", "server", "started", *CONTENT_FIELDS[:12], "checkpoint", *CONTENT_FIELDS[12:14])
_LOOKED += ("actions", "cull_reason", CONTENT_FIELDS[14], "stopped")
if tuple(f.name for f in fields(HistoryRow)) != _LOOKED:  # (read here, not at each row)
    raise TypeError("HistoryRow's fields moved: hub.history._looked_row builds them in order")


def _looked_row(t: float, key: str, started: float, values: tuple) -> HistoryRow:
    """``HistoryRow(t, key, started, **dict(zip(CONTENT_FIELDS, values)))`` made without the
    frozen dataclass's ``__init__`` (a call a field): a pass makes one for each server looked at
    that moved and each keyframe due, ~3,000 at 10,000 servers; 6-19 -> 0.5-5 us a row (load
    11)."""
    if len(values) != len(CONTENT_FIELDS):  # (as the keywords' strict zip)
        raise ValueError(f"{len(values)} values for {len(CONTENT_FIELDS)} fields")
    return _build_row(
        (t, key, started, *values[:12], None, *values[12:14], (), None, values[14], False)
    )


def _moved(values: tuple, row: HistoryRow) -> bool:
    """Whether ``values`` (``CONTENT_FIELDS``) differ from ``row``'s as kept rows must differ:
    equal values have the same ``content``, and are the most looks of a server that holds."""
    return values != content_values(row) and content_of(values) != content(row)


def _seconds(when: datetime | None) -> float | None:
    return None if when is None else when.timestamp()


def _reported(report: Mapping | None) -> tuple:
    """(SM activity, memory MiB, holds a context, a kernel runs a cell, connections) of a
    fresh report; unknown activity without one."""
    if report is None:
        return None, 0.0, False, False, 0
    holders = [t for t in report["targets"] if t["gpu"]["holds_context"]]
    sms = [t["gpu"]["sm"] for t in holders if t["gpu"].get("sm") is not None]
    fraction = report["window"].get("gpu_active_fraction") or 0.0
    if report["backend"] == "unavailable" or (holders and not sms and not fraction):
        sm = None
    else:  # the instant's SM activity; else the window's (a burst between samples)
        sm = max(sms, default=0.0) or fraction
    memory = float(sum(t["gpu"].get("memory_mb") or 0 for t in holders))
    busy = any(t["kind"] == "kernel" and t.get("execution_state") == "busy" for t in holders)
    connections = sum(t.get("connections") or 0 for t in report["targets"] if t["kind"] == "kernel")
    return sm, memory, bool(holders), busy, int(connections)


__all__ = ["History", "HistoryLog", "HistoryOptions", "read_history"]
