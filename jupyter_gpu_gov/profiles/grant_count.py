"""The hub's count of what its started servers hold, kept between spawns.

Admission, the spawn form and the line count every started server's grant (in its spawner's
*state*: ``core.grant``). Read afresh that was one query and a JSON decode of every started
server's state: about half a second of the hub's event loop per spawn and per form view at
10,000 servers. The grants change only where a spawner row changes, so the count is kept here,
one per database (engine) in the hub process, and kept true thus:

- **built from the database** at its first use in the process (a hub restart rebuilds it; it
  is never read from a file);
- **every row the hub writes** — a start, admission's record, a stop (by the user, an admin,
  the culler or the governor: all through ``User.stop``), a start that fails, the poll at the
  hub's startup, a named server renamed or deleted, a reclaim request — is seen by SQLAlchemy's
  ``after_flush`` (the spawner's ``state``, ``started``, ``name`` or owner changed; a user
  renamed or deleted marks all their rows) and that row alone is read again from the database
  before the next count is used, in the same synchronous step as the admission that reads it,
  so two spawns interleaved on the event loop each count the other's grant; a transaction
  rolled back marks again what it flushed;
- **what the events cannot see** — a bulk ORM statement on spawners or users, another process
  or an admin writing the database by hand — is caught by a **fingerprint** read at each use
  (one aggregate query over the started rows, nothing decoded: how many, the sums of their ids,
  owners' ids and of the lengths of their state, name and owner's name), compared with what the
  kept rows add up to: any difference, and more than ``MAX_REREAD`` rows changed at once, is a
  full recount ("unknown is a recount", never a guess);
- **every** ``GpuProfiles.recount_every`` seconds (at the next use) every started row is read
  again from the database and compared, which also catches an edit the fingerprint cannot see
  (one that keeps every length). A recount that finds the kept count wrong logs a warning
  naming what differed (``gpu-gov: the kept GPU count had drifted``) and adds the servers that
  differed to the Prometheus counter ``gpu_gov_grant_count_drift_total`` (the Hub's
  ``/hub/metrics``); what the database holds replaces what was kept. That read (a state
  decoded per started server: 0.3-0.5 s at 10,000) runs in a thread of its own, on a
  connection of its own, a chunk of rows per short transaction (``_Check``), never on the
  Hub's event loop; the next use after it ends compares, leaving out the rows this hub wrote
  since the read began (marked, and read again by then: the kept row is the newer). A
  database one connection serves (SQLite in memory) and ``recount_every = 0`` recount in the
  use itself, as does every recount the count needs before it can be used (first use,
  fingerprint, bulk statement, many changes).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jupyterhub import orm
from prometheus_client import Counter
from sqlalchemy import Text, event, func, or_, select, type_coerce
from sqlalchemy import inspect as inspected
from sqlalchemy.orm import Session
from sqlalchemy.pool import SingletonThreadPool, StaticPool

from ..core.grant import DEVICES_STATE, GPUS_STATE, GRANT_STATE
from ..core.grant import labels as granted
from ..core.text import escaped
from ..core.vocabulary import (
    BORROWED_LABEL,
    TEAM_LABEL,
    TIER_LABEL,
    WEIGHT_LABEL,
    pod_key,
    server_key,
)
from .quota import Counted, Grant, Held

# The execution options of a query that selects JupyterHub's JSONDict columns (a spawner's
# state): that type sets no ``cache_ok``, so SQLAlchemy cannot cache such a statement, and said
# so in the Hub's log at every start. Not cached, on purpose: nothing to warn of.
NOT_CACHED = {"compiled_cache": None}
# More rows changed than this since the last use: one full recount rather than a long IN (...).
MAX_REREAD = 500
# The periodic recount's thread reads this many rows per transaction (SQLite: a writer on the
# event loop waits for a reader's lock at most that long, a few ms, not for the whole read),
# and keeps none unless it differs: 500 decoded rows alive together were promoted and set off
# full garbage collections in the thread (1.3-2.0 s under load, the GIL held, the loop waiting).
CHECK_CHUNK = 100
# ... and lets the GIL go every so many rows: a thread that holds it makes the loop wait up
# to the switch interval (5 ms) after each of its own database calls (60 ms a use, measured).
YIELD_EVERY = 32

DRIFT = Counter(
    "gpu_gov_grant_count_drift",
    "Started servers whose grant the hub's kept GPU count had wrong, found by a recount from "
    "the database (and corrected)",
)
RECOUNTS = Counter(
    "gpu_gov_grant_recounts",
    "Full recounts of the started servers' grants from the database, by why",
    ["reason"],
)
log = logging.getLogger("jupyter_gpu_gov.profiles")

_S, _U = orm.Spawner, orm.User
# What the fingerprint sums, per row; lengths as the database measures them (never Python's).
_TERMS = (
    _S.id,
    _S.user_id,
    func.coalesce(func.length(_S.state), -1),
    func.coalesce(func.length(_S.name), -1),
    func.coalesce(func.length(_U.name), -1),
)
_FINGERPRINT = (
    select(func.count(_S.id), *(func.coalesce(func.sum(term), 0) for term in _TERMS))
    .join(_U, _S.user_id == _U.id)
    .where(_S.started.isnot(None))
)
_ROWS = (
    select(_S.id, _S.user_id, _S.name, _U.name, _S.state, _S.started, *_TERMS[2:])
    .join(_U, _S.user_id == _U.id)
    .where(_S.started.isnot(None))
)


FIRST_USE = "first use"


def release_left_by_a_dead_hub(db: Session, said: logging.Logger) -> list[str]:
    """Free the workstation devices recorded for a spawn or stop a hub died in. Admission
    records a server's devices (and JupyterHub its start) before the server runs, and
    JupyterHub's stop clears them last: a hub killed in between leaves a row started, with
    devices, and no server, which JupyterHub's startup neither polls nor stops (it checks the
    rows with a server). Its card stayed held, and its team's quota used, until its owner
    started that server again. Run once per hub process, before it admits anything: no row
    this process started can be among them. Returns the servers freed."""
    rows = (
        db.query(orm.Spawner)
        .filter(
            orm.Spawner.started.isnot(None),
            orm.Spawner.server_id.is_(None),
            type_coerce(orm.Spawner.state, Text).like(f'%"{DEVICES_STATE}"%'),
        )
        .execution_options(**NOT_CACHED)
    )
    freed = []
    for row in rows:
        state = dict(row.state or {})
        devices = state.get(DEVICES_STATE)
        server = server_key(row.user.name, row.name or "")
        # Said before it is done (an orphaned server process may still run on the card: the
        # allocator hands out a card no process runs on first).
        said.warning(
            "gpu-gov: %s was started by a hub that stopped before its server came up (or "
            "before its stop ended): it has no server, and its devices %s are free again",
            escaped(server),
            escaped(", ".join(str(d) for d in devices) if isinstance(devices, list) else ""),
        )
        for key in (GRANT_STATE, DEVICES_STATE, GPUS_STATE):
            state.pop(key, None)
        row.state, row.started = state, None  # as JupyterHub's stop leaves it
        freed.append(server)
    if freed:
        db.commit()
    return freed


@dataclass(frozen=True)
class Row:
    """What the count reads of one started server's row."""

    user_id: int
    user: str
    name: str
    started: datetime | None
    tier: str | None  # the grant's, as recorded
    team: str | None
    borrowed: str | None
    weight: str | None
    pod: str | None  # KubeSpawner's pod, ``pod_key(namespace, pod_name)`` from its state
    devices: tuple[str, ...]  # the workstation's device UUIDs it holds (``profiles/local.py``)
    terms: tuple[int, ...]  # the fingerprint's terms: 1, id, user id, lengths

    @classmethod
    def read(cls, row_id, user_id, name, user, state, started, *lengths) -> Row:
        options = granted(state)
        pod = devices = None
        if isinstance(state, Mapping):
            namespace, pod_name = state.get("namespace"), state.get("pod_name")
            if isinstance(namespace, str) and isinstance(pod_name, str):
                pod = pod_key(namespace, pod_name)
            devices = state.get(DEVICES_STATE)
        return cls(
            user_id=user_id,
            user=user,
            name=name or "",
            started=started,
            tier=options.get(TIER_LABEL),
            team=options.get(TEAM_LABEL),
            borrowed=options.get(BORROWED_LABEL),
            weight=options.get(WEIGHT_LABEL),
            pod=pod,
            devices=tuple(d for d in devices if isinstance(d, str))
            if isinstance(devices, list)
            else (),
            terms=(1, row_id, user_id, *lengths),
        )


def weight_of(recorded: str | None) -> float:
    """A grant's recorded GPU-equivalents (0 when unreadable; at most a node's worth)."""
    try:
        weight = float(recorded or 0)
    except ValueError:
        return 0.0
    return min(weight, 64.0) if weight > 0 else 0.0  # nan and negatives: 0


def grant_of(row: Row, conf) -> tuple[Grant | None, str | None, str | None]:
    """The grant ``row`` holds as admission counts it, with the tier it names that is no longer
    configured (or None) and the tier its pod holds (or None)."""
    tiers, renamed = conf.tier_map, conf.tier_renamed
    tier = tiers.get(renamed.get(row.tier, row.tier))
    server = server_key(row.user, row.name)
    if tier is None:
        # A tier an admin removed while the server runs: it holds nothing any tier counts,
        # but its grant's weight still counts against its owner's cap.
        weight = weight_of(row.weight)
        if row.tier and weight:
            return Grant(server, row.user, row.team or "", row.tier, 0, weight), row.tier, None
        return None, row.tier or None, None
    quota = conf.quota_map.get(row.team)
    grant = Grant(
        server=server,
        user=row.user,
        team=row.team or "",
        tier=tier.name,
        devices=tier.count,
        weight=tier.weight,
        borrowed=row.borrowed == "true",
        priority=quota.priority if quota is not None else 0,
        started=row.started,
    )
    return grant, None, tier.name if row.pod is not None else None


class KeptCount:
    """The grants of one database's started servers (``count``), kept true as the module says."""

    def __init__(self) -> None:
        self.rows: dict[int, Row] = {}
        self.counted = Counted()
        self.gone: dict[int, str] = {}  # row -> a tier no longer configured
        self.pods: dict[int, tuple[str, str]] = {}  # row -> (pod, tier)
        self.devices: dict[int, tuple[str, ...]] = {}  # row -> device UUIDs (a workstation's)
        self.sums: tuple[int, ...] = (0,) * 6
        self.config: tuple = ()  # what the grants were derived with
        self.dirty: set[int] = set()  # spawner rows to read again
        self.dirty_users: set[int] = set()  # users whose rows to read again
        self.unknown = FIRST_USE  # why the next use recounts ("": it need not)
        self.checked = 0.0  # time.monotonic() of the last full recount (or check begun)
        self.said = log  # where drift is said
        self.checking: _Check | None = None  # the periodic check reading in its thread
        self.recounts = 0  # full recounts so far: a check begun before one is dropped

    # -- what the events say --------------------------------------------------------------

    def mark(self, rows=(), users=()) -> None:
        self.dirty.update(rows)
        self.dirty_users.update(users)
        if self.checking is not None:  # written since its read began: the kept row is newer
            self.checking.rows.update(rows)
            self.checking.users.update(users)

    # -- the count ------------------------------------------------------------------------

    def sync(self, db: Session, conf, every: float, said: logging.Logger | None = None) -> None:
        """Bring the count to what the database holds (no await: admission's step); drift is
        said on ``said`` (the Hub's log, where the spawner logs)."""
        self.said = said or log
        config = (conf.tier_map, conf.quota_map, conf.tier_renamed)
        if len(config) != len(self.config) or any(
            a is not b for a, b in zip(config, self.config, strict=True)
        ):
            self.config = config
            for row_id in list(self.rows):
                self._derive(row_id, conf)
        if self.unknown == FIRST_USE:  # before this process admitted anything
            release_left_by_a_dead_hub(db, self.said)
        fingerprint = tuple(db.execute(_FINGERPRINT, execution_options=NOT_CACHED).one())
        # (that query flushed what was pending first: its rows are marked by now)
        if self.unknown:
            self.recount(db, conf, self.unknown)
            return
        rows, users = self.dirty, self.dirty_users
        self.dirty, self.dirty_users = set(), set()
        if len(rows) + len(users) > MAX_REREAD:
            self.recount(db, conf, "many changes")
            return
        if rows or users:
            self._reread(db, conf, rows, users)
        # What the events said is in; anything else is drift.
        if self.sums != fingerprint:
            self.recount(db, conf, "fingerprint")
        elif every <= 0 or not _own_connections(db.get_bind()):
            if every <= 0 or time.monotonic() - self.checked >= every:
                self.recount(db, conf, "periodic")
        elif self.checking is not None and self.checking.done.is_set():
            check, self.checking = self.checking, None
            self._checked(check, db, conf)
        elif self.checking is None and time.monotonic() - self.checked >= every:
            self.checked = time.monotonic()
            self.checking = _Check(self, db)

    def usage(self, own: int | None) -> Held:
        """The count without row ``own`` (the asking server's own: admission leaves it out)."""
        return self.counted.without(own)

    def pods_of(self, own: int | None) -> dict[str, str]:
        pods = {}
        for row_id in sorted(self.pods):
            if row_id != own:
                pod, tier = self.pods[row_id]
                pods[pod] = tier
        return pods

    def pods_of_servers(self, servers: set[str]) -> dict[str, str]:
        """Server key -> its pod (``pod_key``), for the started ``servers`` that have one."""
        found = {}
        for row_id, (pod, _tier) in self.pods.items():
            row = self.rows[row_id]
            if (server := server_key(row.user, row.name)) in servers:
                found[server] = pod
        return found

    def devices_of_servers(self, servers: set[str]) -> dict[str, tuple[str, ...]]:
        """Server key -> the device UUIDs it holds, for the started ``servers`` that hold any
        (a workstation's)."""
        found = {}
        for row_id, devices in self.devices.items():
            row = self.rows[row_id]
            if (server := server_key(row.user, row.name)) in servers:
                found[server] = devices
        return found

    def devices_of(self, own: int | None) -> dict[str, list[str]]:
        """Device UUID -> the recorded tiers of the started servers holding it (row ``own``
        left out): the workstation's held devices, without decoding a state."""
        held: dict[str, list[str]] = {}
        for row_id, devices in self.devices.items():
            if row_id != own:
                tier = self.rows[row_id].tier or ""
                for uuid in devices:
                    held.setdefault(uuid, []).append(tier)
        return held

    def gone_of(self, own: int | None) -> dict[str, int]:
        gone: dict[str, int] = {}
        for row_id, name in self.gone.items():
            if row_id != own:
                gone[name] = gone.get(name, 0) + 1
        return gone

    def recount(self, db: Session, conf, reason: str) -> None:
        """Rebuild from the database; a difference from the kept count, where none was
        expected, is drift: logged, counted, corrected."""
        RECOUNTS.labels(reason).inc()
        self.said.debug("gpu-gov: recounting the started servers' grants (%s)", reason)
        self.recounts += 1
        kept = None
        if reason in ("periodic", "fingerprint"):
            kept = (dict(self.counted._by_key), dict(self.pods), dict(self.devices))
        self.dirty, self.dirty_users = set(), set()
        self.rows, self.counted, self.gone, self.pods = {}, Counted(), {}, {}
        self.devices = {}
        sums = [0] * 6
        for found in db.execute(_ROWS, execution_options=NOT_CACHED):
            row = self.rows[found[0]] = Row.read(*found)
            for i, term in enumerate(row.terms):
                sums[i] += term
            self._derive(found[0], conf)
        self.sums = tuple(sums)
        self.unknown, self.checked = "", time.monotonic()
        if kept is not None:
            found = (self.counted._by_key, self.pods, self.devices)
            self._say_drift(reason, kept, set().union(*kept, *found))

    def _checked(self, check: _Check, db: Session, conf) -> None:
        """The periodic check's rows, read in its thread, against the kept ones (brought up to
        date in this use): those that differ, but for the rows this hub wrote since the read
        began, are drift, corrected from the database."""
        if check.recounts != self.recounts:
            return  # a full recount since: it compared
        if check.failed is not None:
            self.said.warning(
                "gpu-gov: the periodic recount of the started servers' grants could not read "
                "the database in its thread (%s); recounting here",
                check.failed,
            )
            self.recount(db, conf, "periodic")
            return
        RECOUNTS.labels("periodic").inc()
        written = check.rows | {r for r, row in self.rows.items() if row.user_id in check.users}
        differ = {
            row_id: row
            for row_id, row in check.differ.items()
            if row_id not in written
            and (row is None or row.user_id not in check.users)
            and self.rows.get(row_id) != row
        }
        if not differ:
            return
        kept = tuple(
            {r: source[r] for r in differ if r in source}
            for source in (self.counted._by_key, self.pods, self.devices)
        )
        for row_id, row in differ.items():
            self._set(row_id, row, conf)
        self._say_drift("periodic", kept, differ)

    def _reread(self, db: Session, conf, rows: set[int], users: set[int]) -> None:
        where = []
        if rows:
            where.append(_S.id.in_(sorted(rows)))
        if users:
            where.append(_S.user_id.in_(sorted(users)))
        seen = set()
        for found in db.execute(_ROWS.where(or_(*where)), execution_options=NOT_CACHED):
            seen.add(found[0])
            self._set(found[0], Row.read(*found), conf)
        gone = {r for r in rows if r not in seen}
        if users:
            gone |= {r for r, row in self.rows.items() if row.user_id in users and r not in seen}
        for row_id in gone:  # stopped, deleted, or its owner deleted
            self._set(row_id, None, conf)

    def _set(self, row_id: int, row: Row | None, conf) -> None:
        old = self.rows.pop(row_id, None)
        sums = self.sums
        if old is not None:
            sums = tuple(a - b for a, b in zip(sums, old.terms, strict=True))
        if row is not None:
            self.rows[row_id] = row
            sums = tuple(a + b for a, b in zip(sums, row.terms, strict=True))
        self.sums = sums
        self._derive(row_id, conf)

    def _derive(self, row_id: int, conf) -> None:
        row = self.rows.get(row_id)
        grant, gone, pod_tier = grant_of(row, conf) if row is not None else (None, None, None)
        self.counted.put(row_id, grant)
        if gone:
            self.gone[row_id] = gone
        else:
            self.gone.pop(row_id, None)
        if pod_tier:
            self.pods[row_id] = (row.pod, pod_tier)
        else:
            self.pods.pop(row_id, None)
        if row is not None and row.devices:
            self.devices[row_id] = row.devices
        else:
            self.devices.pop(row_id, None)

    def _say_drift(self, reason: str, kept: tuple[dict, dict, dict], rows) -> None:
        """Say and count the ``rows`` whose grant, pod or devices ``kept`` (as they were) had
        otherwise than the count now has them."""
        grants, now = kept[0], self.counted._by_key
        found = (now, self.pods, self.devices)
        differ = sorted(
            r for r in rows if any(k.get(r) != f.get(r) for k, f in zip(kept, found, strict=True))
        )
        if not differ:
            return
        DRIFT.inc(len(differ))
        totals: dict[tuple[str, str], list[int]] = {}
        for index, source in ((0, grants), (1, now)):
            for row_id in differ:
                grant = source.get(row_id)
                if grant is not None:
                    entry = totals.setdefault((grant.tier, grant.team), [0, 0])
                    entry[index] += grant.devices
        said = [
            f"{tier}/{team or '-'}: kept {kept}, database {found}"
            for (tier, team), (kept, found) in sorted(totals.items())
            if kept != found
        ]
        self.said.warning(
            "gpu-gov: the kept GPU count had drifted from the database (found by a %s recount): "
            "%d started server(s) differed (%s); corrected from the database. Something wrote "
            "spawners' state where this hub's events do not see it (another process, an edit "
            "of the database by hand).",
            reason,
            len(differ),
            escaped("; ".join(said[:10]))  # a team's name may come from outside (auth state)
            + (f" and {len(said) - 10} more" if len(said) > 10 else "")
            or "the same devices per tier and team, on other servers or labelled otherwise",
        )


class _Check:
    """The periodic recount's read, in a thread of its own on a connection of its own: every
    started row, a chunk of ``CHECK_CHUNK`` rows per short transaction, each compared there
    with the kept row (``differ``: the rows that differ, None for a kept row not started in
    the database). ``rows`` and ``users``: what this hub wrote since it began (``mark``),
    which the comparison leaves out."""

    def __init__(self, kept: KeptCount, db: Session):
        self.kept, self.engine = kept, db.get_bind()
        self.recounts = kept.recounts
        # Written and not yet read again, or flushed and not committed: the database this
        # read sees may not hold them yet.
        flushed = db.info.get(_FLUSHED) or (set(), set())
        self.rows: set[int] = set(kept.dirty) | flushed[0]
        self.users: set[int] = set(kept.dirty_users) | flushed[1]
        self.differ: dict[int, Row | None] = {}
        self.failed: str | None = None
        self.done = threading.Event()
        threading.Thread(target=self._read, name="gpu-gov-recount", daemon=True).start()

    def _read(self) -> None:
        kept, seen, last = self.kept, set(), 0
        try:
            with self.engine.connect() as connection:
                while True:
                    query = _ROWS.where(_S.id > last).order_by(_S.id).limit(CHECK_CHUNK)
                    chunk = connection.execute(query, execution_options=NOT_CACHED).all()
                    connection.rollback()  # (a read: the transaction ends, its locks go)
                    for count, found in enumerate(chunk, 1):
                        if count % YIELD_EVERY == 0:
                            time.sleep(0)  # the GIL to the event loop, if it waits for it
                        row = Row.read(*found)
                        seen.add(found[0])
                        if kept.rows.get(found[0]) != row:
                            self.differ[found[0]] = row
                    if len(chunk) < CHECK_CHUNK:
                        break
                    last = chunk[-1][0]
                    del chunk  # (none kept unless it differs: see CHECK_CHUNK)
            for row_id in list(kept.rows):
                if row_id not in seen:
                    self.differ[row_id] = None
        except Exception as error:  # said, and recounted on the loop, at the next use
            self.failed = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        finally:
            self.done.set()


def _own_connections(engine) -> bool:
    """Whether a thread can read ``engine``'s database on a connection of its own: not a
    database in memory (one connection holds it)."""
    url = engine.url
    if isinstance(engine.pool, StaticPool | SingletonThreadPool):
        return False
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        return database not in ("", ":memory:") and "mode=memory" not in str(url)
    return True


_KEPT: weakref.WeakKeyDictionary[Any, KeptCount] = weakref.WeakKeyDictionary()
_FLUSHED = "gpu_gov_flushed"  # session.info: rows flushed in the open transaction


def kept_count(db: Session) -> KeptCount:
    """The kept count of ``db``'s database (made, unbuilt, on first use)."""
    engine = db.get_bind()
    kept = _KEPT.get(engine)
    if kept is None:
        kept = _KEPT[engine] = KeptCount()
    return kept


def forget(db: Session) -> None:
    """Drop the kept count of ``db``'s database (its next use rebuilds it, as in a new hub)."""
    _KEPT.pop(db.get_bind(), None)


def _kept_of(session: Session) -> KeptCount | None:
    try:
        return _KEPT.get(session.get_bind())
    except Exception:  # a session bound to nothing counts nothing here
        return None


_SPAWNER_COLUMNS = ("state", "started", "name", "user_id", "user")


def _changed(obj, names) -> bool:
    attrs = inspected(obj).attrs
    return any(attrs[name].history.has_changes() for name in names)


@event.listens_for(Session, "after_flush")
def _flushed(session: Session, _context) -> None:
    kept = _kept_of(session)
    if kept is None:
        return
    rows, users = set(), set()
    for obj in session.new:
        if isinstance(obj, _S):
            rows.add(obj.id)
    for obj in session.dirty:
        if isinstance(obj, _S) and _changed(obj, _SPAWNER_COLUMNS):
            rows.add(obj.id)
        elif isinstance(obj, _U) and _changed(obj, ("name",)):
            users.add(obj.id)
    for obj in session.deleted:
        if isinstance(obj, _S):
            rows.add(obj.id)
        elif isinstance(obj, _U):
            users.add(obj.id)
    rows.discard(None)
    users.discard(None)
    if rows or users:
        kept.mark(rows, users)
        flushed = session.info.setdefault(_FLUSHED, (set(), set()))
        flushed[0].update(rows)
        flushed[1].update(users)


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    session.info.pop(_FLUSHED, None)


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    # What a use read between the flush and the rollback is gone from the database again.
    flushed = session.info.pop(_FLUSHED, None)
    kept = _kept_of(session)
    if flushed and kept is not None:
        kept.mark(*flushed)


@event.listens_for(Session, "do_orm_execute")
def _bulk(state) -> None:
    if not (state.is_update or state.is_delete or state.is_insert):
        return
    if any(m.class_ in (_S, _U) for m in state.all_mappers):
        kept = _kept_of(state.session)
        if kept is not None:  # rows changed that no flush names
            kept.unknown = "bulk statement"
