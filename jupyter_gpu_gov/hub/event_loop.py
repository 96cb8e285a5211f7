"""Which event loop the service runs on (``c.GpuGovernor.event_loop``).

uvloop (libuv's loop, in C) where it can be imported, the default (``auto``): it takes 10-20 %
less of the service's CPU a report at 10,000 servers. Wave 17 made the standard loop the
default for a while, reading uvloop's p99 with passes (98-294 ms) as waits for the
interpreter's lock. That reading did not hold: since a pass lets the loop turn four times
between two slices, uvloop's p99 with passes is 26-36 ms, the standard loop's 35-49 ms
(docs/benchmarks-history.md, "Issue 26, wave 18"). The standard loop stays one setting away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

AUTO, UVLOOP, ASYNCIO = "auto", "uvloop", "asyncio"
EVENT_LOOPS = (AUTO, UVLOOP, ASYNCIO)


class EventLoopUnavailable(RuntimeError):
    """``event_loop = "uvloop"`` where uvloop cannot be imported."""


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop ``choice`` names, for ``asyncio.Runner`` (None: the standard one)."""
    if choice == ASYNCIO:
        return None
    try:
        import uvloop
    except ImportError as error:
        if choice == UVLOOP:
            raise EventLoopUnavailable(
                f"GpuGovernor.event_loop = 'uvloop', but uvloop cannot be imported ({error}): "
                "install it (pip install uvloop) or set event_loop to 'auto' or 'asyncio'"
            ) from error
        return None
    return uvloop.new_event_loop


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop running this coroutine, for the start-up log."""
    module = type(asyncio.get_running_loop()).__module__
    return UVLOOP if module.startswith("uvloop") else ASYNCIO
