"""Replay traces (docs/architecture.md, "Replay traces"): JSON Lines, one sample per server per step, ordered by ``t``.

``read_trace`` streams a file as validated ``Sample`` objects and keeps nothing but the last ``t``
of each server, so a month-long trace of a few hundred servers can be read twice (replay, then
scoring) without holding it in memory. A bad line raises ``TraceError`` naming the line number
and the field.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..core.text import LineTooLong, bounded_lines, not_text_at, not_utf8

_KNOWN = {
    "t",
    "server",
    "profile",
    "team",
    "gpu_sm",
    "gpu_mem_mb",
    "holds_context",
    "kernel_busy",
    "user_active",
    "connections",
    "reports",
    "labels",
    "checkpoint_fails",
    "started",
    "cpu_cores",
    "iowait",
    "read_mb_s",
}
_NOTHING: Mapping[str, Any] = MappingProxyType({})
# The replay clock counts from 2026 (``engine.EPOCH``): +-6e10 s is the years 125 to 3927, where
# a datetime holds any time a policy reckons from it (durations are at most 100 years). 1e11
# let -1e11 through, which no datetime holds: a traceback, not the line's error.
_T_LIMIT = 6e10
_FLOAT_MAX = int(sys.float_info.max)


class TraceError(ValueError):
    """A trace line that cannot be read; the message names the line and the field."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One server in one step. ``gpu_sm`` is ``None`` when the GPU signal is unknown."""

    t: float
    server: str  # "user/" or "user/servername"
    profile: str | None = None
    team: str | None = None
    gpu_sm: float | None = None
    gpu_mem_mb: float = 0.0
    holds_context: bool = False
    kernel_busy: bool = False
    user_active: bool = False  # the user interacted with the server in this step
    connections: int = 0
    reports: bool = True  # False: the server sends no GPU report (no extension)
    labels: Mapping[str, str] = field(default_factory=dict)
    checkpoint_fails: bool = False
    # When this run of the server started (seconds, the trace's clock): a hub reuses a server's
    # name from one start to the next, and each start is a session of its own. None: the
    # server's rows are one session, started at its first row.
    started: float | None = None
    # What the server's GPU-holding kernels' process trees did over the sampler's window, as
    # the report's ``targets[].cpu`` says (summed over those kernels): CPU in cores, the share
    # of it waiting on I/O, disk reads in MB/s. None: not known (a trace without them).
    cpu_cores: float | None = None
    iowait: float | None = None
    read_mb_s: float | None = None
    extra: Mapping[str, Any] = field(
        default_factory=dict
    )  # keys the format does not define, e.g. "truth"
    line: int = 0

    @property
    def user(self) -> str:
        return self.server.partition("/")[0]

    @property
    def name(self) -> str:
        return self.server.partition("/")[2]

    @property
    def session(self) -> tuple[str, float | None]:
        """One run of the server: what a replay keeps a record of, and scoring scores."""
        return self.server, self.started

    @property
    def holds_gpu_memory(self) -> bool:
        """It holds a GPU context or memory: what scoring counts as "held"."""
        return self.holds_context or self.gpu_mem_mb > 0


def read_trace(path: str) -> Iterator[Sample]:
    """Stream the samples of a trace file; raise ``TraceError`` at the first bad line."""
    # A byte that is not UTF-8 reaches parse_lines as a surrogate: it names the line.
    with open(path, encoding="utf-8", errors="surrogateescape") as file:
        yield from parse_lines(lines_of(file, path), source=path)


def lines_of(file, source: str) -> Iterator[str]:
    """The lines of a trace file, each bounded (``core.text.MAX_LINE``): a longer one is a
    ``TraceError`` naming it, read no further than the bound."""
    try:
        yield from bounded_lines(file)
    except LineTooLong as error:
        raise TraceError(f"{source}: {error}") from None


def parse_lines(lines: Iterable[str], source: str = "<trace>") -> Iterator[Sample]:
    """Validate JSON Lines into samples. Blank lines are skipped. Each run's ``t`` (a
    server's, or a ``(server, started)``'s) must increase; runs may interleave in any way."""
    last_t: dict[tuple[str, float | None], float] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        at = not_text_at(text)  # JSON would take such a byte as part of a server's name
        if at is not None:
            raise TraceError(
                f"{source}: line {number}, character {at + 1}: {not_utf8(text, at)}: save the "
                "trace as UTF-8"
            )
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise TraceError(f"{source}: line {number}: not valid JSON ({error.msg})") from None
        except RecursionError:
            raise TraceError(f"{source}: line {number}: not valid JSON (nested too deep)") from None
        except ValueError:  # an integer longer than Python converts (4,300 digits)
            raise TraceError(
                f"{source}: line {number}: not valid JSON (a number too long to read)"
            ) from None
        if not isinstance(row, dict):
            raise TraceError(f"{source}: line {number}: expected a JSON object")
        try:
            sample = _sample(row, number)
        except ValueError as error:
            raise TraceError(f"{source}: line {number}: {error}") from None
        # Per run: a server culled and started again within a step has two runs at that step
        # (the old one's last line, with its cull, and the new one's first), as exported.
        previous = last_t.get(sample.session)
        if previous is not None and sample.t <= previous:
            raise TraceError(
                f"{source}: line {number}: field 't': {sample.t!r} does not come after "
                f"{previous!r}, the previous sample of {sample.server!r} (one sample per "
                "server per step, in time order)"
            )
        last_t[sample.session] = sample.t
        yield sample


def _sample(row: dict, line: int) -> Sample:
    if "t" not in row:
        raise ValueError("field 't' is required")
    if "server" not in row:
        raise ValueError("field 'server' is required")
    t = _number(row, "t")
    if not abs(t) < _T_LIMIT:
        raise ValueError(f"field 't': {row['t']!r} is out of range (seconds)")
    server = row["server"]
    user, slash, name = server.partition("/") if isinstance(server, str) else ("", "", "")
    if not user or not slash or "/" in name:
        raise ValueError(f"field 'server': expected 'user/' or 'user/servername', got {server!r}")
    gpu_sm = None if row.get("gpu_sm") is None else _number(row, "gpu_sm")
    if gpu_sm is not None and not 0 <= gpu_sm <= 1:
        raise ValueError(f"field 'gpu_sm': expected a fraction in [0, 1], got {row['gpu_sm']!r}")
    gpu_mem_mb = 0.0 if row.get("gpu_mem_mb") is None else _number(row, "gpu_mem_mb")
    if gpu_mem_mb < 0:
        raise ValueError(f"field 'gpu_mem_mb': expected >= 0, got {row['gpu_mem_mb']!r}")
    started = None if row.get("started") is None else _number(row, "started")
    if started is not None and not started <= t:
        raise ValueError(f"field 'started': {row['started']!r} is after 't' (seconds)")
    if started is not None and not abs(started) < _T_LIMIT:
        raise ValueError(f"field 'started': {row['started']!r} is out of range (seconds)")
    connections = row.get("connections", 0)
    if isinstance(connections, bool) or not isinstance(connections, int) or connections < 0:
        raise ValueError(f"field 'connections': expected a whole number >= 0, got {connections!r}")
    usage = {}
    for key, high in (("cpu_cores", None), ("iowait", 1), ("read_mb_s", None)):
        value = None if row.get(key) is None else _number(row, key)
        if value is not None and not (value >= 0 and (high is None or value <= high)):
            bound = f"in [0, {high}]" if high else ">= 0"
            raise ValueError(f"field {key!r}: expected a number {bound}, got {row[key]!r}")
        usage[key] = value
    extra = {k: v for k, v in row.items() if k not in _KNOWN}
    return Sample(
        t=t,
        server=server,
        profile=_text(row, "profile"),
        team=_text(row, "team"),
        gpu_sm=gpu_sm,
        gpu_mem_mb=gpu_mem_mb,
        # A trace that leaves the context out still says so through the memory it holds.
        holds_context=_flag(row, "holds_context", gpu_mem_mb > 0),
        kernel_busy=_flag(row, "kernel_busy", False),
        user_active=_flag(row, "user_active", False),
        connections=connections,
        reports=_flag(row, "reports", True),
        labels=_labels(row),
        checkpoint_fails=_flag(row, "checkpoint_fails", False),
        started=started,
        **usage,
        extra=extra or _NOTHING,
        line=line,
    )


def _number(row: dict, key: str) -> float:
    value = row[key]
    if type(value) is int and abs(value) > _FLOAT_MAX:  # JSON's numbers have no bound
        raise ValueError(f"field {key!r}: expected a number, got an integer past 1e308")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"field {key!r}: expected a number, got {value!r}")
    return value


def _flag(row: dict, key: str, default: bool) -> bool:
    value = row.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"field {key!r}: expected true or false, got {value!r}")
    return value


def _text(row: dict, key: str) -> str | None:
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"field {key!r}: expected a string, got {value!r}")
    return value


def _labels(row: dict) -> Mapping[str, str]:
    labels = row.get("labels")
    if labels is None:
        return _NOTHING
    if not isinstance(labels, dict):
        raise ValueError(f"field 'labels': expected an object of label: value, got {labels!r}")
    out = {}
    for key, value in labels.items():
        if isinstance(value, bool):
            value = "true" if value else "false"  # as Kubernetes label values are written
        elif isinstance(value, int | float):
            value = str(value)
        elif not isinstance(value, str):
            raise ValueError(f"field 'labels.{key}': expected a string, got {value!r}")
        out[key] = value
    return out
