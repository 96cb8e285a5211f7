"""The clock when the wall clock steps (issue 18, item 7): periodic work keeps to the monotonic
clock, and a process that keeps deadlines sees a step only when it adopts it."""

from __future__ import annotations

import asyncio
import contextlib
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


async def test_a_run_past_its_bound_is_logged_with_the_await_it_waits_on(caplog):
    """Runs are one at a time: one that never ends stops the work for good, silently, unless
    the log says so, and where (the governor's passes: which await of a pass never came)."""
    release = asyncio.Event()
    runs = []

    async def waiting_on_the_store():
        await release.wait()

    async def work():
        runs.append(time.monotonic())
        if len(runs) == 1:
            await waiting_on_the_store()

    caplog.set_level("WARNING", logger=clock.log.name)
    task = asyncio.ensure_future(clock.every(0.01, work, overdue_after=0.2, name="a test pass"))
    try:
        deadline = time.monotonic() + 30  # a loaded machine's stalls, far short of it
        while "still waiting" not in caplog.text and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        line = next(r.getMessage() for r in caplog.records if "still waiting" in r.getMessage())
        assert line.startswith("a test pass has run "), line
        assert "work (test_clock.py:" in line and "waiting_on_the_store (test_clock.py:" in line
        assert "awaiting <Future pending" in line, line
        assert len(runs) == 1  # no second run beside the stuck one
        release.set()
        while len(runs) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(runs) >= 3  # the next runs come once it ends
        assert any("a test pass ended after" in r.getMessage() for r in caplog.records)
    finally:
        task.cancel()


async def test_stopping_periodic_work_stops_a_watched_run_where_it_was():
    """Cancelled, the loop ends only once its run has stopped (the service closes its store
    after its passes: a pass still writing then would write to a closed store)."""
    stopped = []

    async def work():
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.05)  # (a pass's own ending awaits: a write under way)
            stopped.append(True)

    task = asyncio.ensure_future(clock.every(1.0, work, overdue_after=60.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert stopped == [True]
