"""A performance measure, kept apart: the garbage collector's collections on timers instead of
CPython's own rule alone (docs/benchmarks-history.md, "Issue 26, wave 6: ingest's pauses").

Why: the service keeps some 50 objects the collector tracks per server (its last report, the
diagnosis's windows, the rows, the views), and every report replaces a few dozen of them.
CPython runs a full collection whenever the objects that reached the oldest generation since
the last one number a quarter of those already there: at 10,000 servers reporting every 60 s,
every 10-15 s, each one scanning 500,000-650,000 objects, freeing none, and holding the event
loop 0.6-1.3 s on a loaded machine, so every report arriving meanwhile waited (the p99 of
seconds; several % of a core besides).

Here the objects alive once the service has started (modules, classes, the app: never garbage)
are moved out of every scan (``gc.freeze``), and full collections run every
``FULL_COLLECTION_EVERY_S`` instead. The young generations are collected as before, so
reference cycles that die young (nearly all: a request's, an exception's) are freed at once;
only cycles that outlived two young collections wait, at most that long.

The young generations are also collected on a clock (``YOUNG_EVERY_S``, the middle one every
``MIDDLE_EVERY`` of those). CPython starts a young collection when the objects it tracks made
since the last one, less those freed (of any age), exceed 700; a report frees the server's last
report as it keeps the new one (and, when it moved, the kept decision that read the last), so
that count barely moves while the young generation fills with every report's new objects:
young collections came rarely and scanned many objects at once, a middle one a minute's worth,
holding the loop tens to hundreds of ms (docs/benchmarks-history.md, "Issue 26, wave 14"). On the
clock each scans what a tenth of a second made: the same objects scanned in all, in small slices.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import time

log = logging.getLogger("jupyter_gpu_gov.hub")

FULL_COLLECTION_EVERY_S = 600.0
YOUNG_EVERY_S = 0.1
MIDDLE_EVERY = 10  # young collections to a middle one, as CPython's own (``gc.get_threshold()[1]``)
_NEVER = 1 << 30  # the oldest generation's threshold: CPython never starts a full collection
_oldest = gc.get_threshold()[2]  # the threshold ``start`` replaced, for ``stop``


def start() -> asyncio.Task:
    """Freeze what is alive now and take full collections over; returns the timers' task
    for ``stop``. Call once the service's imports and app are set up."""
    global _oldest
    gc.collect()
    gc.freeze()
    young, middle, _oldest = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)
    return asyncio.ensure_future(_timers())


async def _timers() -> None:
    # Inside a task, not gather's own future: cancelled, that future ends with a CancelledError
    # as its exception, which asyncio logs at exit ("exception was never retrieved") unless
    # someone awaits it; the task awaits it, and itself simply ends cancelled.
    await asyncio.gather(
        _collect_every(FULL_COLLECTION_EVERY_S), _collect_young_every(YOUNG_EVERY_S)
    )


def stop(timers: asyncio.Task) -> None:
    """The oldest generation's threshold as it was before ``start`` (CPython's own rule)."""
    timers.cancel()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _oldest)
    gc.unfreeze()


async def _collect_every(seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        started = time.perf_counter()
        freed = gc.collect()
        log.debug(
            "gpu-gov: full garbage collection: %.0f ms, %d objects freed",
            1000 * (time.perf_counter() - started),
            freed,
        )


async def _collect_young_every(seconds: float) -> None:
    ticks = 0
    while True:
        await asyncio.sleep(seconds)
        if gc.isenabled():  # (a caller that turned collections off meant it)
            ticks += 1
            gc.collect(1 if ticks % MIDDLE_EVERY == 0 else 0)


def _malloc_trim():
    """glibc's ``malloc_trim``, or ``None`` (another C library: musl, macOS)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def after_pass() -> None:
    """Give the C allocator's free pages back to the system after a pass. A pass that decides
    thousands of servers makes their views, rows, history rows and SQL parameters at once; what
    is over 512 bytes comes from glibc, whose free memory stays mapped after the burst
    (docs/benchmarks-history.md, "Issue 26, wave 14": what it gives back, and what it costs)."""
    if _trim is not None:
        _trim(0)
