"""A performance measure, kept apart: the garbage collector's full collections on a timer
instead of CPython's own rule (docs/benchmarks.md, "Ingest: the event loop's pauses").

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
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger("jupyter_gpu_gov.hub")

FULL_COLLECTION_EVERY_S = 600.0
_NEVER = 1 << 30  # the oldest generation's threshold: CPython never starts a full collection
_oldest = gc.get_threshold()[2]  # the threshold ``start`` replaced, for ``stop``


def start() -> asyncio.Future:
    """Freeze what is alive now and take full collections over; returns the timer's task
    for ``stop``. Call once the service's imports and app are set up."""
    global _oldest
    gc.collect()
    gc.freeze()
    young, middle, _oldest = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)
    return asyncio.ensure_future(_collect_every(FULL_COLLECTION_EVERY_S))


def stop(timer: asyncio.Future) -> None:
    """The oldest generation's threshold as it was before ``start`` (CPython's own rule)."""
    timer.cancel()
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
