"""The one place the project reads wall-clock time.

Everything that reasons about time (windows, policies, deadlines) calls ``utcnow()`` so that tests
and replays can move time by patching this module instead of sleeping. What must not follow the
wall clock when it steps (an NTP correction, a VM resumed, ``date -s``) uses the monotonic clock:
``every`` runs periodic work on it. A process that keeps deadlines (the governor) calls
``watch_steps()``: from then on ``utcnow()`` follows the wall clock as it drifts but not when it
steps, until ``adopt_step()`` says by how much it stepped and moves to the new time, at a moment
when everything kept can be moved by as much.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import fields, replace
from datetime import datetime, timedelta, timezone
from typing import TypeVar

log = logging.getLogger(__name__)

_offset_s = 0.0
STEP_TOLERANCE = 2.0  # seconds the wall clock may run off the monotonic one before it "stepped"


class _Frame:
    """The wall clock, followed except across a step until the step is adopted."""

    def __init__(self) -> None:
        self.wall, self.mono = time.time(), time.monotonic()

    def now(self) -> float:
        wall, mono = time.time(), time.monotonic()
        steady = self.wall + (mono - self.mono)
        if abs(wall - steady) > STEP_TOLERANCE:
            return steady  # stepped: keep to the time everything kept was written in
        self.wall, self.mono = wall, mono
        return wall

    def adopt(self) -> float:
        wall, mono = time.time(), time.monotonic()
        step = wall - (self.wall + (mono - self.mono))
        self.wall, self.mono = wall, mono
        return step if abs(step) > STEP_TOLERANCE else 0.0


_frame: _Frame | None = None


def watch_steps() -> None:
    """From now on, ``utcnow()`` does not follow a step of the wall clock until it is adopted."""
    global _frame
    if _frame is None:
        _frame = _Frame()


def adopt_step() -> float:
    """Seconds the wall clock stepped since the last call (0: it did not), and ``utcnow()``
    follows it from now on. The caller moves what it keeps by as much."""
    return _frame.adopt() if _frame is not None else 0.0


def defer_step(seconds: float) -> None:
    """Put back a step ``adopt_step()`` said, that what is kept could not be moved by:
    ``utcnow()`` keeps to the old time, and the next ``adopt_step()`` says it again."""
    if _frame is not None:
        _frame.wall -= seconds


def utcnow() -> datetime:
    """Timezone-aware UTC now, shifted by any offset a test has set."""
    if _frame is None:
        now = datetime.now(timezone.utc)
    else:
        now = datetime.fromtimestamp(_frame.now(), timezone.utc)
    if _offset_s:
        now += timedelta(seconds=_offset_s)
    return now


def advance(seconds: float) -> None:
    """Move this process's clock forward (tests and demos only)."""
    global _offset_s
    _offset_s += seconds


def reset() -> None:
    """Back to the wall clock (tests and benchmarks): no offset, no step waiting."""
    global _offset_s, _frame
    _offset_s = 0.0
    _frame = None  # the next governor watches steps afresh


def isoformat(dt: datetime | None) -> str | None:
    """RFC 3339 with a ``Z`` suffix, as JupyterHub writes timestamps."""
    if dt is None:
        return None
    return dt.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(value: str | None) -> datetime | None:
    if value is None:
        return None
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def not_after(at: datetime | None, now: datetime) -> datetime | None:
    """A time kept from an earlier run (the store), read at a start: never later than ``now``.
    What was written after a wall clock that has since stepped back (NTP, a VM resumed, while
    the service was down) lies ahead of the new time, and a deadline or notice counted from it
    would wait that long; the earliest true reading of it is now."""
    return at if at is None or at <= now else now


_T = TypeVar("_T")


def shifted(obj: _T, delta: timedelta) -> _T:
    """A (frozen) dataclass with each of its times moved by ``delta``: the intervals between
    them, and to now, stay as they were observed when the wall clock stepped by ``delta``."""
    times = {
        f.name: value + delta
        for f in fields(obj)
        if isinstance(value := getattr(obj, f.name), datetime)
    }
    return replace(obj, **times) if times else obj


async def every(
    interval: float,
    work: Callable[[], Awaitable[None]],
    *,
    overdue_after: float | None = None,
    name: str = "periodic work",
) -> None:
    """Run ``work`` every ``interval`` seconds on the monotonic clock, one run at a time, until
    cancelled. (tornado's ``PeriodicCallback`` schedules on the wall clock: after it stepped
    back an hour, its next run was an hour away.) A run that fails is logged; the next comes.
    A run still going ``overdue_after`` seconds after it began is logged once, with where it
    waits, and again when it ends: one run at a time, a run that never ends stops the work for
    good, and the line says which await it is."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    while True:
        try:
            if overdue_after is None:
                await work()
            else:
                await _watched(work(), overdue_after, name)
        except Exception:
            log.exception("%s failed; running it again in %ss", name, interval)
        due = max(due + interval, loop.time())  # a late run does not make the next ones early
        await asyncio.sleep(due - loop.time())


async def _watched(run: Awaitable[None], overdue_after: float, name: str) -> None:
    """``await run``, saying so when it is still going after ``overdue_after`` seconds."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    task = asyncio.ensure_future(run)
    try:
        done, _ = await asyncio.wait((task,), timeout=overdue_after)
        if not done:
            log.warning(
                "%s has run %.0f s and is still waiting, at %s",
                name,
                loop.time() - began,
                waits_at(task),
            )
            await asyncio.wait((task,))
            log.warning("%s ended after %.0f s", name, loop.time() - began)
    except asyncio.CancelledError:
        task.cancel()  # stopped where it was, as an awaited run would be, before this returns
        await asyncio.wait((task,))
        raise
    task.result()  # its failure, as ``await run`` would raise it


def waits_at(task: asyncio.Task) -> str:
    """Where a suspended task waits: each coroutine of its chain of awaits, outermost first,
    then what the innermost awaits (the task's own account of it: a future, another task)."""
    places = []
    awaited = task.get_coro()
    while awaited is not None and len(places) < 64:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:  # a future's iterator: what it is, the task says below
            break
        code = frame.f_code
        places.append(f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    waiting = re.search(r"wait_for=(<.*>)>$", repr(task))
    on = f"; awaiting {waiting[1][:300]}" if waiting else ""
    return " -> ".join(places) + on
