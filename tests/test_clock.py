"""The clock when the wall clock steps (issue 18, item 7): periodic work keeps to the monotonic
clock, and a process that keeps deadlines sees a step only when it adopts it."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from jupyter_gpu_gov.core import clock


def test_a_step_is_seen_only_once_adopted(monkeypatch):
    monkeypatch.setattr(clock, "_frame", None)
    jump = [0.0]
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + jump[0])
    clock.watch_steps()
    before = clock.utcnow()
    jump[0] = 3600.0  # an NTP correction, a resumed VM, `date -s`
    during = clock.utcnow()
    assert timedelta(0) <= during - before < timedelta(seconds=1)  # not followed yet
    assert abs(clock.adopt_step() - 3600) < 1
    assert abs((clock.utcnow() - before).total_seconds() - 3600) < 1  # followed now
    assert clock.adopt_step() == 0.0  # once
    jump[0] += 1.0  # within the tolerance: drift, followed at once
    assert abs((clock.utcnow() - before).total_seconds() - 3601) < 1
    assert clock.adopt_step() == 0.0


async def test_periodic_work_keeps_to_the_monotonic_clock(monkeypatch):
    runs = []

    async def work():
        runs.append(time.monotonic())
        if len(runs) == 2:  # the wall clock steps back an hour meanwhile
            real = time.time
            monkeypatch.setattr(time, "time", lambda: real() - 3600)

    task = asyncio.ensure_future(clock.every(0.05, work))
    # Three runs after the step, not an hour away (on the wall clock the third run was due
    # an hour later). The deadline is a loaded machine's stalls, far short of the hour.
    deadline = time.monotonic() + 30
    while len(runs) < 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    task.cancel()
    assert len(runs) >= 5, runs
