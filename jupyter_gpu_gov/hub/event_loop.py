"""Which event loop the service runs on (``c.GpuGovernor.event_loop``).

The standard library's loop is the default. uvloop (libuv's loop, in C) takes 10-20 % less of
the service's CPU a report at 10,000 servers, but with a pass running the reports' p99 rose
from 60 ms to 98-294 ms (docs/benchmarks.md, "Issue 26, wave 17": read there as uvloop taking
the interpreter's lock once per socket event while the pass's worker threads hold it). It
stays one setting away.
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
