"""Durations as admins write them: ``90``, ``"90s"``, ``"15m"``, ``"2h"``, ``"1d"``, ``"1h30m"``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .text import quoted

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
MAX_SECONDS = 100 * 365 * 86400  # longer is a typo or an attack, and overflows date arithmetic


class DurationOutOfRange(ValueError):
    """A duration that reads as one, but is negative or longer than ``MAX_SECONDS``."""


def parse_duration(value: object, name: str = "duration") -> timedelta:
    """Seconds (int/float), a ``timedelta``, or a string of number+unit parts (s, m, h, d, w).

    Raises ``ValueError`` naming ``name`` and the value when it cannot be read, and
    ``DurationOutOfRange`` naming the range too when it is negative or past 100 years.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"{name}: expected a duration, got {value!r:.60}")
    elif isinstance(value, int | float):
        # An int too large for a float is infinitely long (and NaN stays not a duration).
        big = isinstance(value, int) and abs(value) >= 1e300
        seconds = (math.inf if value > 0 else -math.inf) if big else float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        elif text and _PART.sub("", text) == "":
            seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
        else:
            raise ValueError(
                f"{name}: {value!r:.60} is not a duration (use e.g. 90, '15m', '2h', '1h30m')"
            )
    else:
        raise ValueError(f"{name}: expected a duration, got {type(value).__name__} {value!r:.60}")
    if math.isnan(seconds):
        raise ValueError(f"{name}: {value!r:.60} is not a duration")
    if not 0 <= seconds <= MAX_SECONDS:  # infinity too; said as the settings' ranges are
        raise DurationOutOfRange(
            f"{name} must be a duration from 0 to 100 years, got {quoted(value, 40)}"
        )
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta | float | None) -> str:
    """``45s``, ``1m 30s``, ``59m 59s``, ``2h 5m``, ``1d 3h``: below an hour the seconds stay,
    above it minutes are enough. The JupyterLab extension's ``formatDuration`` reads the same."""
    if delta is None:
        return "-"
    seconds = max(0, int(delta.total_seconds() if isinstance(delta, timedelta) else delta))
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return (
            f"{minutes}m {rest}s" if minutes and rest else f"{minutes}m" if minutes else f"{rest}s"
        )
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return " ".join(parts)
