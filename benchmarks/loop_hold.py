"""How long work holds the event loop: a 1 ms ticker beside it, and its longest gap."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def ticked(work: Callable[[], Awaitable]) -> tuple[float, float]:
    """``work()`` awaited beside a ticker: its wall time and the longest gap between ticks
    (seconds), the ticker running before the work starts and a moment after it ends."""
    gaps, stop = [], False

    async def ticker():
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.05)
    gaps.clear()
    start = time.perf_counter()
    await work()
    took = time.perf_counter() - start
    await asyncio.sleep(0.01)
    stop = True
    await ticking
    return took, max(gaps)
