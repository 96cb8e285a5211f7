"""Kernel activity the extension causes itself, kept apart from a person's.

A checkpoint runs its hooks through an ``execute_request`` on each kernel holding a GPU. Jupyter
Server counts the kernel messages that answers as activity (``last_kernel_activity``) and shows
the kernel busy while the hooks run. Taken at face value, the governor's own checkpoint would
then look like the owner coming back (which holds the cull back) and like a cell running (which
holds it back for ``busy_grace``). ``OwnActivity`` remembers when the extension was the one at
work, and which requests were its own, so the report can say what people did
(``person_activity``): a cell a person starts meanwhile is theirs, and shows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta

from ..core import clock

# IOPub messages of an execution can arrive a moment after its reply.
MARGIN = timedelta(seconds=2)


class OwnActivity:
    def __init__(self) -> None:
        self._windows: deque[tuple[datetime, datetime]] = deque(maxlen=8)
        self._since: datetime | None = None  # a window is open
        self._busy_before: frozenset[str] = frozenset()
        self._requests: deque[str] = deque(maxlen=64)  # our execute requests' message ids

    def asked(self, msg_id: str) -> None:
        """The extension sent a kernel this request (a checkpoint's hooks)."""
        self._requests.append(msg_id)

    def is_own_request(self, msg_id: str | None) -> bool:
        return msg_id is not None and msg_id in self._requests

    def begin(self, busy_kernels: Iterable[str]) -> None:
        """The extension starts running code in kernels; ``busy_kernels`` were busy already."""
        self._since = clock.utcnow()
        self._busy_before = frozenset(busy_kernels)

    def end(self) -> None:
        if self._since is not None:
            self._windows.append((self._since, clock.utcnow() + MARGIN))
        self._since = None

    def ours(self, at: datetime) -> bool:
        """Whether activity at ``at`` happened while the extension was at work."""
        if self._since is not None and at >= self._since:
            return True
        return any(start <= at <= end for start, end in self._windows)

    def hides_busy(self, kernel_id: str, cell_since: datetime | None) -> bool:
        """A kernel busy only because the extension is running its hooks, or ran them a moment
        ago: Jupyter Server shows it busy until the hooks' idle status reaches it, which can be
        after their reply. Shown busy then, the governor would take the checkpoint's own work
        for a cell that changes the state it has just saved. Not a kernel busy before, nor one
        where a person started a cell (``cell_since``) since the extension began: that cell
        is theirs, and the governor must see it."""
        if kernel_id in self._busy_before:
            return False
        if self._since is not None:
            began = self._since
        elif self._windows and clock.utcnow() <= self._windows[-1][1]:
            began = self._windows[-1][0]
        else:
            return False
        return cell_since is None or cell_since < began
