"""The lease: exactly one governor acts on a store (docs/api.md, "One governor acts: the lease").

Two governors on one store (a rolling update, a second replica, a pod restarted before the old
one went, two hubs on one PostgreSQL) each warned, culled and billed the same servers. The store
holds one row, ``lease``, naming its holder: a random id per process (with its host and pid for
the admin) and a ``beat`` the holder adds one to at every renewal. Only the holder acts; the
others take reports in and wait.

No decision rests on two machines' clocks agreeing. Each side measures on its own monotonic
clock (the boot clock, which a suspended machine's also counts): the holder acts until
``ACTING_SHARE`` of the lease after a renewal it *began*; a contender takes the lease only once
it has seen the same ``(holder, beat)`` for a whole lease (the holder's, as the row records
it, or its own if longer), counted from when it *read* it, which is after that renewal began.
The quarter between covers the clocks' rates (a few parts in a million) and the time from a
check to the request it lets through. A holder that cannot renew in time (a paused process, a
slow database) has stopped acting before anyone can take over. A released lease is taken at
once, and so is one whose holder's process is gone where the contender can tell (the same boot
and pid namespace: JupyterHub starting a crashed service again). Every statement is one conditional ``UPDATE`` (or an ``INSERT`` the primary key makes
unique): the database decides who holds it, on SQLite and PostgreSQL alike.

What the holder writes is fenced too (``Store.fence``): each write transaction first checks,
in the same transaction, that it still holds the lease (and on PostgreSQL locks its row, so
a takeover waits for that transaction); a governor that lost it writes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from ..core import clock
from .store import NotHolder
from .tables import LEASE

log = logging.getLogger("jupyter_gpu_gov.hub")

NAME = "governor"
# The holder acts until this share of the lease after a renewal began, and renews every
# RENEW_SHARE of it: one renewal may fail (a locked store) without a pause in governing.
ACTING_SHARE = 0.75
RENEW_SHARE = 0.25


def now_s() -> float:
    """The boot clock: monotonic, and it counts while the machine is suspended."""
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


def _place() -> str:
    """Where process ids mean the same: this boot of this machine and this pid namespace (""
    where it cannot be told)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"[:80]
    except OSError:
        return ""


def _gone(pid: int) -> bool:
    """Whether no process has this id (here: ``place``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's: it runs
        return False
    return False


@dataclass(frozen=True)
class Holder:
    """Who holds the lease, as the store says (for the admin: ``api/`` and the log)."""

    id: str
    host: str
    pid: int
    since: str  # ISO 8601, the holder's own clock: for people, never compared


class Lease:
    """This process's side of the lease on ``store``: ``step()`` takes, renews or watches it
    (call it every ``RENEW_SHARE * duration``); ``held()`` says whether to act now."""

    def __init__(self, engine, duration: float) -> None:
        self.engine = engine
        self.duration = float(duration)
        self.id = uuid.uuid4().hex
        self.host = socket.gethostname()[:255]
        self.pid = os.getpid()
        self.place = _place()
        self._until = 0.0  # boot clock: acts until then
        self._beat: int | None = None  # the beat of our last renewal, while we hold it
        self._seen: tuple[str, int, float] | None = None  # another's (id, beat, read at)
        self.holder: Holder | None = None  # as last read
        self.lost = False  # held it, and then found another holding it
        # Just taken: not held until the governor has read the store again (``take_over``).
        self.taking = False
        self.why = ""  # how it was taken last

    @property
    def ours(self) -> bool:
        """Taken and not lost (``held`` may have lapsed meanwhile: a renewal is late)."""
        return self._beat is not None

    def held(self) -> bool:
        return self._beat is not None and not self.taking and now_s() < self._until

    def why_not_held(self) -> str:
        """Why this governor does not act now, as its answers and its passes say it. A lease
        of its own that lapsed (the store refused or delayed its renewals: locked, slow) is
        not another governor acting: said so, it was read as a second governor by the admin."""
        if self.taking:
            return "this governor has just taken the store's lease and reads the store first"
        if self._beat is not None:
            return (
                "this governor's lease on the store has lapsed (the store did not take its "
                "renewal in time: locked or slow); it acts again once it renews it"
            )
        return "this governor does not hold the store's lease (another one acts)"

    def step(self) -> bool:
        """Renew the lease if ours, else take it if free or expired; True while ours. A store
        that fails says nothing: ``held()`` lapses on its own when renewals stop."""
        began = now_s()
        try:
            if self._beat is not None:
                if self._renew():
                    self._until = began + ACTING_SHARE * self.duration
                    return True
                self._beat, self._until, self.lost = None, 0.0, True
                log.error("gpu-gov: another governor took the lease: acting on nothing")
                return False  # (the service stops: started again, it waits on standby)
            return self._contend(began)
        except SQLAlchemyError as error:  # (a pool with no connection to spare, too)
            cause = getattr(error, "orig", None) or error
            log.warning("gpu-gov: the lease could not be read or renewed: %s", cause)
            return self.held()

    def _renew(self) -> bool:
        with self.engine.begin() as db:
            _wait_briefly(db)
            renewed = db.execute(
                update(LEASE)
                .where(LEASE.c.name == NAME, LEASE.c.holder == self.id)
                .values(beat=LEASE.c.beat + 1)
            )
        if renewed.rowcount != 1:
            return False
        self._beat += 1  # only the holder moves the beat
        return True

    def _contend(self, began: float) -> bool:
        with self.engine.connect() as db:
            row = db.execute(select(LEASE).where(LEASE.c.name == NAME)).first()
        if row is None:
            try:
                with self.engine.begin() as db:
                    db.execute(insert(LEASE).values(self._mine(beat=1)))
            except IntegrityError:  # another took it first
                return False
            return self._took(1, began, "the first")
        self.holder = Holder(row.holder, row.host or "", row.pid or 0, row.since or "")
        read = now_s()  # after the read: the renewal it shows began before (the holder's clock)
        seen = self._seen
        if seen is None or seen[:2] != (row.holder, row.beat):
            seen = self._seen = (row.holder, row.beat, read)
        # A holder whose process is gone where its pid means what ours do (JupyterHub starting
        # a crashed service again): taken at once, as a release would be.
        gone = bool(row.holder and self.place and row.place == self.place and row.pid)
        gone = gone and _gone(row.pid)
        # Released (a clean stop), or not renewed for a whole lease as this process counts: the
        # holder's (a rolling update may change lease_duration; the old pod acts by its own).
        waited = max(row.duration or 0, self.duration)
        if row.holder and not gone and read - seen[2] < waited:
            return False
        with self.engine.begin() as db:  # only if it is still as read
            _wait_briefly(db)
            taken = db.execute(
                update(LEASE)
                .where(LEASE.c.name == NAME, LEASE.c.holder == row.holder, LEASE.c.beat == row.beat)
                .values(self._mine(beat=row.beat + 1))
            )
        if gone:
            why = f"{row.host} pid {row.pid} is gone"
        elif row.holder:
            why = f"{row.host} pid {row.pid} did not renew it for {waited:g} s"
        else:
            why = "released"
        return taken.rowcount == 1 and self._took(row.beat + 1, began, why)

    def _mine(self, beat: int) -> dict:
        since = clock.isoformat(clock.utcnow())
        return {
            "name": NAME,
            "holder": self.id,
            "host": self.host,
            "pid": self.pid,
            "place": self.place,
            "since": since,
            "beat": beat,
            "duration": self.duration,
        }

    def _took(self, beat: int, began: float, why: str) -> bool:
        self._beat, self._seen, self.taking = beat, None, True
        self._until = began + ACTING_SHARE * self.duration
        self.holder = Holder(self.id, self.host, self.pid, clock.isoformat(clock.utcnow()))
        self.why = why  # for the service's log line
        return True

    def release(self) -> None:
        """At a clean stop, after the last write: the next governor takes over at once."""
        if self._beat is None:
            return
        self._beat, self._until = None, 0.0
        try:
            with self.engine.begin() as db:
                db.execute(
                    update(LEASE)
                    .where(LEASE.c.name == NAME, LEASE.c.holder == self.id)
                    .values(holder="", beat=LEASE.c.beat + 1)
                )
        except DBAPIError as error:  # the next one takes it once it expires
            log.warning("gpu-gov: the lease was not released: %s", error.orig or error)

    def fence(self, db) -> None:
        """In a write transaction, first: raise ``NotHolder`` unless this process holds the
        lease, on its clock and in the store (whose row this locks until the commit)."""
        if not self.held():
            raise NotHolder(self.why_not_held())
        if db.dialect.name == "postgresql":
            # A holder paused inside this transaction (SIGSTOP, a frozen VM) would keep the
            # row locked, and the takeover waiting, for as long as the pause: PostgreSQL ends
            # the transaction (nothing of it lands) once idle for the lease's duration.
            ms = min(int(self.duration * 1000), 2**31 - 1)  # (PostgreSQL's range)
            db.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {ms}")
        still = db.execute(
            update(LEASE)
            .where(LEASE.c.name == NAME, LEASE.c.holder == self.id)
            .values(holder=LEASE.c.holder)
        )
        if still.rowcount != 1:
            raise NotHolder("this governor no longer holds the lease (another one acts)")


def _wait_briefly(db) -> None:
    """A lease statement waits for a row lock a second at most, as SQLite's busy timeout
    (``Store``): then it fails and is tried at the next step, not blocked for a pause's length."""
    if db.dialect.name == "postgresql":
        db.exec_driver_sql("SET LOCAL lock_timeout = 1000")


__all__ = ["ACTING_SHARE", "RENEW_SHARE", "Holder", "Lease", "NotHolder"]
