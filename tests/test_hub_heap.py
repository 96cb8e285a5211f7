"""The service's full garbage collections run on its timer (``hub/heap.py``), not at random
between two reports: the heap it started with is never scanned again, automatic full
collections stop, and the timer still frees reference cycles that outlived the young
generations."""

from __future__ import annotations

import asyncio
import gc
import weakref

from jupyter_gpu_gov.hub import heap


class Cycle:
    def __init__(self):
        self.me = self


def test_full_collections_run_on_the_timer_only(monkeypatch):
    monkeypatch.setattr(heap, "FULL_COLLECTION_EVERY_S", 0.3)
    threshold = gc.get_threshold()

    async def scenario() -> tuple[int, bool, bool]:
        timer = heap.start()
        try:
            frozen = gc.get_freeze_count()
            old = Cycle()
            gone = weakref.ref(old)
            gc.collect(1)
            gc.collect(1)  # now in the oldest generation, where only a full collection looks
            del old
            # Half as many new objects as the heap held, kept (reports replacing reports): by
            # CPython's own rule, their young collections would end in a full one.
            kept = [Cycle() for _ in range((len(gc.get_objects()) + frozen) // 2)]
            before_timer = gone() is None
            del kept
            await asyncio.sleep(0.6)
            return frozen, before_timer, gone() is None
        finally:
            heap.stop(timer)

    frozen, freed_before_timer, freed_by_timer = asyncio.run(scenario())
    assert frozen > 1000  # the heap at start-up: modules, classes, this test's process
    assert not freed_before_timer
    assert freed_by_timer
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0  # as before


def test_young_collections_run_on_the_clock_while_new_objects_replace_old(monkeypatch):
    """Each report replaces its server's last (made objects less freed ones barely move, the
    count CPython starts a young collection on): a young reference cycle is still freed within
    a few ticks of the clock, not when that count happens to reach 700."""
    monkeypatch.setattr(heap, "YOUNG_EVERY_S", 0.01)

    async def scenario() -> int | None:
        timers = heap.start()
        try:
            state = [[] for _ in range(2000)]  # long-lived: one object a server
            gc.collect(1)
            gc.collect(1)
            young = Cycle()
            gone = weakref.ref(young)
            del young
            for turn in range(len(state)):
                state[turn] = []  # a new one made, the old one freed
                if gone() is None:
                    return turn
                await asyncio.sleep(0.001)
            return None
        finally:
            heap.stop(timers)

    freed_after = asyncio.run(scenario())
    assert freed_after is not None  # (on CPython's count alone: not in 2,000 turns)
