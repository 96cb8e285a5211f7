"""The one place the project reads wall-clock time.

Everything that reasons about time (windows, policies, deadlines) calls ``utcnow()`` so that tests
and replays can move time by patching this module instead of sleeping. What must not follow the
wall clock when it steps (an NTP correction, a VM resumed, ``date -s``) uses the monotonic clock:
``every`` runs periodic work on it, and ``StepWatch`` says by how much the wall clock stepped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import fields, replace
from datetime import datetime, timedelta, timezone
from typing import TypeVar

log = logging.getLogger(__name__)

_offset_s = 0.0


def utcnow() -> datetime:
    """Timezone-aware UTC now, shifted by any offset a test has set."""
    now = datetime.now(timezone.utc)
    if _offset_s:
        from datetime import timedelta

        now += timedelta(seconds=_offset_s)
    return now


def advance(seconds: float) -> None:
    """Move this process's clock forward (tests and demos only)."""
    global _offset_s
    _offset_s += seconds


def reset() -> None:
    global _offset_s
    _offset_s = 0.0


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


class StepWatch:
    """By how much the wall clock stepped since the last look: how far it moved beyond what the
    monotonic clock measured. A test's ``advance`` is time passing, not a step: it reads the
    system clocks themselves.

    ``tolerance``: seconds of difference that are not a step (the two clocks drift apart by a
    few milliseconds a minute under NTP, and a look may be late).
    """

    def __init__(self, tolerance: float = 2.0):
        self.tolerance = tolerance
        self._last: tuple[float, float] | None = None

    def step(self) -> float:
        wall, mono = time.time(), time.monotonic()
        last, self._last = self._last, (wall, mono)
        if last is None:
            return 0.0
        jump = (wall - last[0]) - (mono - last[1])
        return jump if abs(jump) > self.tolerance else 0.0


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


async def every(interval: float, work: Callable[[], Awaitable[None]]) -> None:
    """Run ``work`` every ``interval`` seconds on the monotonic clock, one run at a time, until
    cancelled. (tornado's ``PeriodicCallback`` schedules on the wall clock: after it stepped
    back an hour, its next run was an hour away.) A run that fails is logged; the next comes."""
    loop = asyncio.get_running_loop()
    due = loop.time()
    while True:
        try:
            await work()
        except Exception:
            log.exception("periodic work failed; running it again in %ss", interval)
        due = max(due + interval, loop.time())  # a late run does not make the next ones early
        await asyncio.sleep(due - loop.time())
