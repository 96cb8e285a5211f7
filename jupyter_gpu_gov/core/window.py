"""Rolling windows of GPU activity: when was a target last active, and how much of the last
minute was it active. Unknown samples are kept as unknown: they never count as idle time."""

from __future__ import annotations

from collections import deque
from datetime import datetime, timedelta


class ActivityWindow:
    def __init__(self, seconds: float, threshold: float):
        self.span = timedelta(seconds=seconds)
        self.threshold = threshold
        # the samples in the window, as two deques kept in step: history() copies the second
        self._times: deque[datetime] = deque()
        self._sms: deque[float | None] = deque()
        self.last_active: datetime | None = None
        self.started: datetime | None = None
        self._known = self._active = 0  # samples in the window: known, at or above threshold

    def add(self, at: datetime, sm: float | None) -> None:
        if self.started is None:
            self.started = at
        self._times.append(at)
        self._sms.append(sm)
        self._count(sm, 1)
        if sm is not None and sm >= self.threshold:
            self.last_active = at
        oldest = at - self.span
        times = self._times
        while times and times[0] < oldest:
            times.popleft()
            self._count(self._sms.popleft(), -1)

    def _count(self, sm: float | None, sign: int) -> None:
        if sm is not None:
            self._known += sign
            if sm >= self.threshold:
                self._active += sign

    @property
    def latest(self) -> float | None:
        return self._sms[-1] if self._sms else None

    @property
    def state(self) -> str:
        """``active``, ``idle`` or ``unknown``, from the latest sample."""
        sm = self.latest
        if sm is None:
            return "unknown"
        return "active" if sm >= self.threshold else "idle"

    @property
    def idle_since(self) -> datetime | None:
        """When the current idle stretch began (None unless idle now)."""
        if self.state != "idle":
            return None
        return self.last_active or self.started

    def active_fraction(self) -> float | None:
        """Share of the known samples in the window at or above the threshold (None: none known)."""
        if not self._known:
            return None
        return self._active / self._known

    def history(self) -> list[float | None]:
        return list(self._sms)
