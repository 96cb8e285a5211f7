"""Which servers a pass between two full passes looks at (issue 26; docs/benchmarks-history.md,
"Scale"): those marked since the last pass, and those whose next time has come.

A server is marked when an input its kept decision read changed: its decision was not kept
(``hub/unchanged.py``: something waits on it, or it changed), its report was removed. A server
whose report arrived is compared with what its kept decision read once, as it arrives
(``Governor.ingest`` calls ``Incremental._note_report``: ``same_report``, the diagnosis's cause),
and marked only if it differs — most reports say again what the last one did, and the pass never
compares them again (a write other than ingest's, noted by ``Reports``, is compared at the next
pass). Its next time is the earlier of ``policy.holds_until`` and when its report or diagnosis
goes stale, kept in a heap: a pass pops what fell due instead of comparing every server's
inputs.

What reaches every server at once is not marked server by server: a new diagnosis model, or
DCGM's GPUs coming or going, has the pass check every kept server (``Unchanged.view``); a DCGM
read that moved some GPUs' records marks the kept servers that look those GPUs or pods up
(``dcgm.moved_gpus``, ``trusted.dcgm_keys``); a change of the policies or team map, a step of
the wall clock, and every ``full_pass_every``-th pass decide every server.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from datetime import datetime


class NextTimes:
    """A heap of each key's next time: a pass pops what fell due instead of comparing every
    key's time (the governor's kept decisions, the history's keyframes)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._next: dict[str, float] = {}  # key -> its live entry's time (others are stale)

    def at(self, key: str, when: float | None) -> None:
        """``key`` is due at ``when`` (Unix seconds; ``None``: not by time)."""
        if when is None:
            self._next.pop(key, None)
            return
        if self._next.get(key) != when:
            self._next[key] = when
            heapq.heappush(self._heap, (when, key))
        # Stale entries: rebuilt once more than the live ones (+1,024): four times as many held
        # ~2 MB more at 10,000 servers. ``take`` gives the same: entries pop in (time, key)
        # order, the stale ones skipped.
        if len(self._heap) > 2 * len(self._next) + 1024:
            self._heap = [(t, k) for k, t in self._next.items()]
            heapq.heapify(self._heap)

    def forget(self, key: str) -> None:
        self._next.pop(key, None)

    def __contains__(self, key: str) -> bool:
        """Whether ``key`` has a next time."""
        return key in self._next

    def take(self, now: float) -> set[str]:
        """The keys whose time came, each taken off the heap (until set again)."""
        taken = set()
        heap, live = self._heap, self._next
        while heap and heap[0][0] <= now:
            when, key = heapq.heappop(heap)
            if live.get(key) == when:
                del live[key]
                taken.add(key)
        return taken

    def clear(self) -> None:
        self._heap.clear()
        self._next.clear()


class Due:
    """The marked servers and a heap of each kept server's next time."""

    def __init__(self) -> None:
        self.marked: set[str] = set()
        self.written: set[str] = set()  # a report arrived, not yet compared (``_note_report``)
        self._times = NextTimes()

    def mark(self, key: str) -> None:
        self.marked.add(key)

    def wrote(self, key: str) -> None:
        self.written.add(key)

    def take_written(self) -> set[str]:
        taken, self.written = self.written, set()
        return taken

    def at(self, key: str, when: datetime | None) -> None:
        """Look at ``key`` again at ``when`` (``None``: only once marked)."""
        self._times.at(key, None if when is None else when.timestamp())

    def forget(self, key: str) -> None:
        self._times.forget(key)
        self.marked.discard(key)

    def take(self, now: datetime) -> set[str]:
        """The servers to look at now: every one marked, and every one whose time came (each
        taken off the heap: looking at it sets its next time again)."""
        taken, self.marked = self.marked, set()
        taken |= self._times.take(now.timestamp())
        return taken

    def clear(self) -> None:
        self.marked.clear()
        self.written.clear()
        self._times.clear()


class Reports(dict):
    """The governor's latest report by server key; every write is noted (``Due.wrote``), every
    removal marks the server (its kept decision read the report removed)."""

    __slots__ = ("_mark", "_wrote")

    def __init__(self, items: Iterable = (), due: Due | None = None):
        super().__init__(items)
        self._mark = due.mark if due is not None else _nothing
        self._wrote = due.wrote if due is not None else _nothing

    def __setitem__(self, key: str, value) -> None:
        super().__setitem__(key, value)
        self._wrote(key)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._mark(key)

    def pop(self, key: str, *default):
        if key in self:
            self._mark(key)
        return super().pop(key, *default)


def _nothing(key: str) -> None:
    pass
