"""The one place the project reads wall-clock time.

Everything that reasons about time (windows, policies, deadlines) calls ``utcnow()`` so that tests
and replays can move time by patching this module instead of sleeping.
"""

from __future__ import annotations

from datetime import datetime, timezone

_offset_s = 0.0


def utcnow() -> datetime:
    """Timezone-aware UTC now, shifted by any offset a test has set."""
    now = datetime.now(timezone.utc)
    if _offset_s:
        from datetime import timedelta

        now += timedelta(seconds=_offset_s)
    return now


def advance(seconds: float) -> None:
    """Move this process's clock forward (tests and demos only)."""
    global _offset_s
    _offset_s += seconds


def reset() -> None:
    global _offset_s
    _offset_s = 0.0


def isoformat(dt: datetime | None) -> str | None:
    """RFC 3339 with a ``Z`` suffix, as JupyterHub writes timestamps."""
    if dt is None:
        return None
    return dt.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(value: str | None) -> datetime | None:
    if value is None:
        return None
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
