"""What one caller may make the report route do: a token bucket per caller, and one line in
the log per address and minute for what it refuses (docs/security.md, "Report budget"). The
API and the pages have a ``Budget`` per caller too (``ApiHandler.prepare``, ``api_budget``), and
their requests that name no caller count in the report route's per address (``refused_budget``).

A report costs the governor's event loop about 0.1 ms, the largest one it takes about 15 ms,
and every other report waits meanwhile: so one caller sending fast, even well-formed reports,
would slow the service for everyone. The check costs a dictionary lookup and some arithmetic,
before the body is parsed.
"""

from __future__ import annotations

import asyncio
import logging
import time

# A report's cost in units: one, and one more per this many bytes (a usual report is a few kB,
# the largest taken 256 KiB: 17 units, as its parse costs about what 17 usual reports' do).
UNIT_BYTES = 16 * 1024
MAX_KEYS = 10_000  # buckets kept before the full ones are forgotten (addresses are unbounded)


class Budget:
    """Token buckets, one per key: ``rate`` units a second, at most ``burst`` saved up. A key
    not seen (or not seen for ``burst / rate`` s) has a full bucket. ``rate`` 0: no budget."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (units, as of when)

    def take(self, key: str, cost: float = 1.0) -> float:
        """Take ``cost`` units from ``key``'s bucket: 0.0 where it had them, else the seconds
        until it will have them (nothing taken)."""
        if not self.rate:
            return 0.0
        now = time.monotonic()
        cost = min(cost, self.burst)  # else a large report would never be taken
        kept = self._buckets.get(key)
        units = (
            self.burst if kept is None else min(self.burst, kept[0] + (now - kept[1]) * self.rate)
        )
        if units < cost:
            return (cost - units) / self.rate
        if kept is None and len(self._buckets) >= MAX_KEYS:
            self._forget_full(now)
        self._buckets[key] = (units - cost, now)
        return 0.0

    def short(self, key: str) -> float:
        """The seconds until ``key`` has a unit (0.0: it has one), taking nothing."""
        kept = self._buckets.get(key) if self.rate else None
        if kept is None:
            return 0.0
        units = kept[0] + (time.monotonic() - kept[1]) * self.rate
        return 0.0 if units >= 1.0 else (1.0 - units) / self.rate

    def _forget_full(self, now: float) -> None:
        """A bucket that has filled up again is as good as none. Where most are still being
        drawn on (many addresses at once), all are forgotten: memory stays bounded."""
        burst, rate = self.burst, self.rate
        self._buckets = {
            k: v for k, v in self._buckets.items() if v[0] + (now - v[1]) * rate < burst
        }
        if len(self._buckets) >= MAX_KEYS // 2:
            self._buckets.clear()


class RefusalLog:
    """A WARNING for an address's first refusal in a minute, then, a minute on, one line with
    how many more it had: a flood of refused requests does not rotate the log's other lines
    away, and no address's first refusal is hidden. ``every_s`` 0: every line is written."""

    def __init__(self, log: logging.Logger, every_s: float = 60.0) -> None:
        self.log, self.every_s = log, every_s
        self._more: dict[str, int] = {}  # address -> refusals since its line, this minute
        self._summing = False

    def warning(self, peer: str, message: str, *args) -> None:
        if self.every_s <= 0:  # every line written
            self.log.warning(message, *args)
            return
        more = self._more.get(peer)
        if more is not None:
            self._more[peer] = more + 1
            return
        self._more[peer] = 0
        self.log.warning(message, *args)
        if not self._summing:
            try:
                asyncio.get_running_loop().call_later(self.every_s, self._sum_up)
            except RuntimeError:  # no loop (a direct call): nothing is held back
                self._more.clear()
                return
            self._summing = True

    def _sum_up(self) -> None:
        more, self._more, self._summing = self._more, {}, False
        for peer, n in more.items():
            if n:
                self.log.warning(
                    "gpu-gov: %d more refused from %s in the last minute", n, peer or "?"
                )
