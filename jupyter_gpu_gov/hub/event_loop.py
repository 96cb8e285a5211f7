"""Which event loop the service runs on (``c.GpuGovernor.event_loop``).

uvloop (libuv's loop, in C) runs tornado unchanged and takes 4-7 % less of the
service's CPU a report at 10,000 servers (docs/benchmarks.md, "Issue 26, wave 16"); the standard
library's loop stays one setting away, and is what runs where uvloop is not installed.
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
