"""Rolling windows of GPU activity: when was a target last active, and how much of the last
minute was it active. Unknown samples are kept as unknown: they never count as idle time."""

from __future__ import annotations

from collections import deque
from datetime import datetime, timedelta


class ActivityWindow:
    def __init__(self, seconds: float, threshold: float):
        self.span = timedelta(seconds=seconds)
        self.threshold = threshold
        self.samples: deque[tuple[datetime, float | None]] = deque()
        self.last_active: datetime | None = None
        self.started: datetime | None = None

    def add(self, at: datetime, sm: float | None) -> None:
        if self.started is None:
            self.started = at
        self.samples.append((at, sm))
        if sm is not None and sm >= self.threshold:
            self.last_active = at
        while self.samples and self.samples[0][0] < at - self.span:
            self.samples.popleft()

    @property
    def latest(self) -> float | None:
        return self.samples[-1][1] if self.samples else None

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
        known = [sm for _, sm in self.samples if sm is not None]
        if not known:
            return None
        return sum(1 for sm in known if sm >= self.threshold) / len(known)

    def history(self) -> list[float | None]:
        return [sm for _, sm in self.samples]
