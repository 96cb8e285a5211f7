"""Diagnosis windows (docs/architecture.md, "Diagnosis windows"): one row per server per window, read from CSV or JSON Lines or
made from a server's report.

Columns (every value may be missing, ``None``):

=============== ============================================================================
``node``        the machine (or card) the server runs on; models are per node
``server``      ``user/`` or ``user/name``
``t``           seconds, the window's end (since 1970, or on the trace's own clock; an ISO
                8601 time; milliseconds to nanoseconds since 1970, as pandas writes times
                in JSON, are told by their size)
``sm_active``   0..1, SM activity of the server's GPU work (DCGM ``SM_ACTIVE`` where there is
                one, else the report's per-target ``sm``)
``dram_active`` 0..1, DCGM ``DRAM_ACTIVE`` (the share of cycles the device memory interface
                is busy); where there is no DCGM, NVML's memory utilisation (the report's
                ``devices[].memory_activity``: the share of *time* device memory was read or
                written at all, a coarser measure that saturates well before the interface
                does; models are per node, so a node reads one or the other)
``tensor_active`` 0..1, DCGM ``PIPE_TENSOR_ACTIVE``
``pcie_mb_s``   MB/s over PCIe, both directions (DCGM)
``gpu_mem_frac`` 0..1, GPU memory held / total
``cpu_cores``   cores busy in the kernel's process tree (1.0 = one core all the window)
``cpu_iowait``  0..1, share of the window the process tree waited on block I/O
``read_mb_s``   MB/s the process tree read (``/proc/<pid>/io`` ``read_bytes``)
``kernel_busy`` a cell was executing (``true``/``false``; CSV also ``1``/``0``)
``user_idle_s`` seconds since the person last interacted with the server
``gr_active``   0..1, DCGM ``GR_ENGINE_ACTIVE`` (share of the window a kernel ran, whatever its
                size); with ``sm_active`` from DCGM too, ``sm_active / gr_active`` is how much
                of the GPU the kernels fill (optional, beyond the base columns)
``cpu_top_thread`` 0..1, the busiest thread of the process tree's share of a core: one
                saturated thread (a serial loop) reads 1, workers sharing the load less
                (optional: servers that report it)
=============== ============================================================================

CSV has a header row; an empty cell is missing. JSON Lines has one object per line; ``null`` is
missing. Unknown columns are ignored (evaluators add e.g. ``truth``). A bad value raises
``ValueError`` naming the line and the column.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import IO, Any

from ..core.clock import parse as parse_time
from ..core.text import MAX_LINE, LineTooLong, bounded_lines, not_text_at, not_utf8

COLUMNS = (
    "node",
    "server",
    "t",
    "sm_active",
    "dram_active",
    "tensor_active",
    "pcie_mb_s",
    "gpu_mem_frac",
    "cpu_cores",
    "cpu_iowait",
    "read_mb_s",
    "kernel_busy",
    "user_idle_s",
    "gr_active",  # beyond the base columns: optional, after its columns
    "cpu_top_thread",  # optional, after those
)

# The model's inputs, in order: every numeric column but sm_active (its target); kernel_busy as
# 1.0/0.0.
FEATURES = tuple(c for c in COLUMNS if c not in ("node", "server", "t", "sm_active"))

_TEXT = frozenset({"node", "server"})
_FRACTIONS = frozenset(
    {
        "sm_active",
        "gr_active",
        "dram_active",
        "tensor_active",
        "gpu_mem_frac",
        "cpu_iowait",
        "cpu_top_thread",
    }
)
_NON_NEGATIVE = frozenset({"pcie_mb_s", "cpu_cores", "read_mb_s", "user_idle_s"})
_BOOLEANS = frozenset({"kernel_busy"})
# As other tools write a flag: pandas (1.0 where a column with gaps became numbers), SQL
# exports (t/f), and the kernel's own state.
_TRUE = frozenset({"true", "1", "1.0", "yes", "y", "t", "busy"})
_FALSE = frozenset({"false", "0", "0.0", "no", "n", "f", "idle"})
# Cells that say "no value", as spreadsheets, pandas and Python's own str(float("nan")) write it.
_MISSING = frozenset({"", "nan", "na", "n/a", "null", "none"})


@dataclass(frozen=True)
class Window:
    node: str | None = None
    server: str | None = None
    t: float | None = None
    sm_active: float | None = None
    dram_active: float | None = None
    tensor_active: float | None = None
    pcie_mb_s: float | None = None
    gpu_mem_frac: float | None = None
    cpu_cores: float | None = None
    cpu_iowait: float | None = None
    read_mb_s: float | None = None
    kernel_busy: bool | None = None
    user_idle_s: float | None = None
    gr_active: float | None = None
    cpu_top_thread: float | None = None

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


assert tuple(f.name for f in fields(Window)) == COLUMNS


def to_vector(window: Window) -> list[float]:
    """The window's ``FEATURES`` as floats, ``nan`` where missing."""
    out = []
    for name in FEATURES:
        value = getattr(window, name)
        out.append(math.nan if value is None else float(value))
    return out


# -- server context ------------------------------------------------------------------------------

# A running window is read with its server's recent running windows: the median of the last
# CONTEXT_K (this one included) within CONTEXT_HORIZON_S of it.
CONTEXT_K = 4
CONTEXT_HORIZON_S = 600.0
# The columns the context smooths: what the GPU and the process tree did over the window.
# ``kernel_busy`` and ``user_idle_s`` say what is true *now* and stay the window's own.
CONTEXT_COLUMNS = (
    "sm_active",
    "gr_active",
    "dram_active",
    "tensor_active",
    "pcie_mb_s",
    "gpu_mem_frac",
    "cpu_cores",
    "cpu_iowait",
    "read_mb_s",
    "cpu_top_thread",
)


def is_running(window: Window) -> bool:
    """Code runs in the window: ``sm_active`` known and the kernel not idle (``kernel_busy``
    true, or unknown: a terminal). A zombie's kernel is idle, so it is never running."""
    return window.sm_active is not None and window.kernel_busy is not False


def context_key(window: Window) -> tuple[str | None, str | None]:
    return (window.node, window.server)


def with_context(
    window: Window,
    earlier: Sequence[Window],
    k: int = CONTEXT_K,
    horizon_s: float = CONTEXT_HORIZON_S,
) -> Window:
    """``window`` read in its server's context: when it is running (``is_running``), each of
    ``CONTEXT_COLUMNS`` becomes its median over this window and the running windows of
    ``earlier`` (the same server's, oldest first) among the last ``k`` running ones whose ``t``
    is at most ``horizon_s`` before this one's and not after it (missing values left out;
    all missing: missing). Windows that are not running, and windows without ``t`` or
    ``server`` (whose earlier windows they are is not known), are returned as they are.
    Causal: only earlier windows count, so a window in a file and the same window scored
    online read the same.

    Why: a single window is blurred by what the workload does in it (a warm-up, an evaluation
    or a checkpoint pause, per-window noise); a few minutes of the same server say what it
    usually does. Idle windows are not smoothed: a pause is what it is."""
    if k <= 1 or not is_running(window) or window.t is None or window.server is None:
        return window
    recent = [window]
    for w in reversed(earlier):
        if len(recent) >= k:
            break
        if w is window or not is_running(w) or w.t is None:
            continue
        if w.t > window.t or window.t - w.t > horizon_s:
            continue
        recent.append(w)
    if len(recent) == 1:
        return window
    values = vars(window).copy()  # every column is an init field: a copy, as ``replace`` makes
    columns = [vars(w) for w in recent]
    for column in CONTEXT_COLUMNS:
        values[column] = _median([v for c in columns if (v := c[column]) is not None])
    return _window_of(window, values)


def _median(known: list[float]) -> float | None:
    """The median of ``known`` (sorted in place); None where nothing is known."""
    if not known:
        return None
    known.sort()
    middle = len(known) // 2
    return known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2


def _window_of(window: Window, values: dict) -> Window:
    """What ``type(window)(**values)`` makes, without the frozen dataclass's setattrs: every
    running report of the service is read so (docs/benchmarks-history.md, "Issue 26, wave 24")."""
    read = object.__new__(type(window))
    object.__setattr__(read, "__dict__", values)
    return read


# What the context reads of an earlier running window (it runs: it was kept for that), as
# numbers: the service keeps a server's last few so, packed (``hub/diagnosis.py``).
CONTEXT_ROW = ("t", *CONTEXT_COLUMNS)


def with_packed_context(
    window: Window,
    earlier: Sequence[float],
    k: int = CONTEXT_K,
    horizon_s: float = CONTEXT_HORIZON_S,
) -> Window:
    """``with_context(window, runs)``, where ``earlier`` holds the running windows ``runs``
    as their ``CONTEXT_ROW`` numbers, row after row, oldest first (``nan``: missing): the
    same window, read without making the earlier ones (every running report of the service
    is read so: docs/benchmarks-history.md, "Issue 26, wave 36")."""
    if k <= 1 or not is_running(window) or window.t is None or window.server is None:
        return window
    n = len(CONTEXT_ROW)
    t = window.t
    rows = []  # where each earlier row read starts, newest first, as with_context picks them
    for i in range(len(earlier) - n, -1, -n):
        if len(rows) + 1 >= k:
            break
        at = earlier[i]
        if at != at or earlier[i + 1] != earlier[i + 1]:  # no t, or no sm_active: not running
            continue
        if at > t or t - at > horizon_s:
            continue
        rows.append(i)
    if not rows:
        return window
    values = vars(window).copy()  # as with_context copies it
    # column by column: this window's value, then the earlier rows', newest first
    picked = [earlier[i + 1 : i + n] for i in rows]
    for column, *theirs in zip(CONTEXT_COLUMNS, *picked, strict=True):
        v = values[column]
        known = [] if v is None else [v]
        for v in theirs:
            if v == v:  # nan: missing
                known.append(v)
        values[column] = _median(known)
    return _window_of(window, values)


def in_context(
    windows: Iterable[Window], k: int = CONTEXT_K, horizon_s: float = CONTEXT_HORIZON_S
) -> list[Window]:
    """Every window read in its server's context (``with_context``), in the order given: a
    window's context is the windows of the same ``(node, server)`` before it in time, so a file
    in any row order (by server, newest first) reads as one in time order; a window without
    ``server`` has none. ``k <= 1``: the windows as they are."""
    windows = list(windows)
    # Windows without ``t`` get no context and give none: where they sort does not matter.
    order = sorted(range(len(windows)), key=lambda i: time_key(windows[i]))
    read: list[Window] = windows.copy()
    timed = iter_in_context([windows[i] for i in order], k, horizon_s)
    for i, window in zip(order, timed, strict=True):
        read[i] = window
    return read


def time_key(window: Window) -> float:
    """Sorts windows by time; those without ``t`` first."""
    return -math.inf if window.t is None else window.t


def iter_in_context(
    windows: Iterable[Window], k: int = CONTEXT_K, horizon_s: float = CONTEXT_HORIZON_S
) -> Iterator[Window]:
    """``in_context``, one window at a time (training reads a history of 250,000 without
    holding a second copy of it)."""
    if k <= 1:
        yield from windows
        return
    recent: dict[tuple, deque[Window]] = {}
    for w in windows:
        key = context_key(w)
        earlier = recent.setdefault(key, deque(maxlen=k))
        yield with_context(w, earlier, k, horizon_s)
        if is_running(w) and w.t is not None:
            earlier.append(w)


# -- reading files -------------------------------------------------------------------------------


# What a file loses when a column has no value in any of its windows (``unmeasured``): the
# model still answers, but these readings cannot be made.
WITHOUT = {
    "node": "every window is read against one reference for all nodes (name each window's "
    "machine or card to read it against its own)",
    "server": "no window is read with its server's earlier windows or its task's best ones",
    "t": "no window is read with its server's earlier windows (they are found by time)",
    "sm_active": "no window is diagnosed: every cause is read from SM activity",
    "kernel_busy": "every window counts as code running (as a terminal's does): none is a zombie",
    "gpu_mem_frac": "a quiet kernel is at best uncertain between zombie and healthy: memory held "
    "defines a zombie, and only a sure zombie is culled",
    "user_idle_s": "a quiet kernel is at best uncertain between zombie and healthy: nobody there "
    "defines a zombie, and only a sure zombie is culled",
    "read_mb_s+cpu_iowait": "a starved loop is uncertain between data_io and cpu_serial (what its "
    "input waits on is not measured)",
}


class ColumnsSeen:
    """Which columns (of ``WITHOUT``) no window has had a value in yet, read a window at a
    time (a file streamed holds no window): ``unmeasured`` once every window was seen."""

    def __init__(self) -> None:
        self.windows = 0
        self._missing = {key: key.split("+") for key in WITHOUT}

    def see(self, window: Window) -> None:
        self.windows += 1
        for key, columns in list(self._missing.items()):
            if any(getattr(window, column) is not None for column in columns):
                del self._missing[key]

    def unmeasured(self) -> dict[str, str]:
        """The columns no window had, and what that costs: said once for a file, where a
        missing cell only makes its window uncertain."""
        return {key: WITHOUT[key] for key in self._missing} if self.windows else {}


def unmeasured(windows: Iterable[Window]) -> dict[str, str]:
    """``ColumnsSeen.unmeasured`` over ``windows``."""
    seen = ColumnsSeen()
    for window in windows:
        seen.see(window)
    return seen.unmeasured()


def read_windows(source: str | os.PathLike | IO[str], *, name: str | None = None) -> list[Window]:
    """Every row of a CSV or JSON Lines file (a path, ``"-"`` for stdin, or an open text file),
    in order. The format is told by the extension (``.csv``; ``.jsonl``, ``.ndjson``, ``.json``)
    or else by the first character (``{``: JSON Lines)."""
    import sys

    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if path == "-":
            sys.stdin.reconfigure(errors="surrogateescape")  # as a file: see below
            return read_windows(sys.stdin, name="<stdin>")
        return list(iter_windows(path))
    text = source.read()
    name = name or getattr(source, "name", "<input>")
    _check_text([text.removeprefix("\ufeff")], name)
    return list(_windows(io.StringIO(text), name))


def iter_windows(path: str | os.PathLike, *, name: str | None = None) -> Iterator[Window]:
    """``read_windows`` of a file, a window at a time, holding a line: the file is read twice,
    once to name a byte that is not UTF-8 wherever it is (as before any row is read), then
    for its rows. ``name``: what errors call the file, and what tells its format (its path:
    ``copy_stdin``'s copy is called ``<stdin>``)."""
    path = os.fspath(path)
    name = path if name is None else name
    _check_text(_pieces(path), name)
    # newline="\n": lines end at \n alone, as the text's own (a CR is the CSV reader's).
    with _open(path) as file:
        yield from _windows(bounded_lines(file), name)


STDIN = "<stdin>"


def copy_stdin(path: str | os.PathLike) -> None:
    """Standard input's text, as ``read_windows("-")`` reads it (its lines' ends as Python
    reads them, a byte that is not UTF-8 kept), written to ``path`` for ``iter_windows(path,
    name=STDIN)`` to read as it reads a file: a line at a time, so that a pipe of any size is
    read in bounded memory (and can be read again); a line too long is a ``ValueError``."""
    import sys

    sys.stdin.reconfigure(errors="surrogateescape")  # as read_windows
    with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as copy:
        try:  # a bounded line at a time: an endless line (``< /dev/zero``) filled the disk
            copy.writelines(bounded_lines(sys.stdin))
        except LineTooLong as error:
            raise ValueError(f"{STDIN}: {error}") from None


# Windows ``sorted_on_disk`` holds at once (~0.5 kB each) where its input is out of order.
SORT_RUN = 32_768
_BATCH = 256  # windows pickled together: what a run holds in memory while it is read back
# Runs merged at once (a file open each): more (past 4 M windows out of order) are merged in
# groups first.
SORT_FAN_IN = 128


def sorted_on_disk(
    windows: Iterable[Window], key, directory: str | os.PathLike
) -> Callable[[], Iterator[Window]]:
    """``sorted(windows, key=key)``, as often as it is called, read back from ``directory``:
    the windows up to the first out of order are one run, written as they come; the rest go in
    runs of ``SORT_RUN``, each sorted in memory; the runs are merged (``heapq.merge``: stable,
    as ``sorted`` is) holding a few hundred windows of each. Windows in order (a file in time
    order) are held a few hundred at a time. Windows that ``with_context`` made come back as
    plain ``Window`` of the same values."""
    import heapq
    import pickle
    from operator import attrgetter

    values = attrgetter(*COLUMNS)
    runs = [os.path.join(directory, "run0.pickle")]

    def write(file, batch: list[Window]) -> None:
        for i in range(0, len(batch), _BATCH):
            pickle.dump([values(w) for w in batch[i : i + _BATCH]], file, protocol=5)

    def spill(held: list[Window]) -> None:
        held.sort(key=key)
        runs.append(os.path.join(directory, f"run{len(runs)}.pickle"))
        with open(runs[-1], "wb") as file:
            write(file, held)
        held.clear()

    ordered, held, last = True, [], None
    batch: list[Window] = []
    with open(runs[0], "wb") as first:
        for window in windows:
            if ordered:
                k = key(window)
                if last is None or not k < last:
                    last = k
                    batch.append(window)
                    if len(batch) >= _BATCH:
                        write(first, batch)
                        batch.clear()
                    continue
                ordered = False
            held.append(window)
            if len(held) >= SORT_RUN:
                spill(held)
        write(first, batch)
    if held:
        spill(held)

    def read(path: str) -> Iterator[Window]:
        with open(path, "rb") as file:
            while True:
                try:
                    rows = pickle.load(file)
                except EOFError:
                    return
                for row in rows:
                    yield Window(*row)

    def merged(paths: list[str]) -> Iterator[Window]:
        return heapq.merge(*(read(path) for path in paths), key=key)

    made = len(runs)
    while len(runs) > SORT_FAN_IN:  # consecutive runs merged: still stable
        fewer = []
        for i in range(0, len(runs), SORT_FAN_IN):
            group = runs[i : i + SORT_FAN_IN]
            fewer.append(os.path.join(directory, f"run{made}.pickle"))
            made += 1
            with open(fewer[-1], "wb") as file:
                piece: list[Window] = []
                for window in merged(group):
                    piece.append(window)
                    if len(piece) >= _BATCH:
                        write(file, piece)
                        piece.clear()
                write(file, piece)
            for path in group:
                os.remove(path)
        runs = fewer
    return lambda: merged(runs)


def _open(path: str) -> IO[str]:
    # A byte that is not UTF-8 is read as a surrogate, so its line can be named.
    return open(path, encoding="utf-8", errors="surrogateescape", newline="\n")


def _pieces(path: str) -> Iterator[str]:
    with _open(path) as file:
        yield file.read(1 << 16).removeprefix("\ufeff")  # a byte-order mark (Excel's)
        while piece := file.read(1 << 16):
            yield piece


def _check_text(pieces: Iterable[str], name: str) -> None:
    """A ``ValueError`` naming the line and character of the first byte that is not UTF-8."""
    line, column = 1, 0  # the line a piece begins in, the characters of it before the piece
    for piece in pieces:
        at = not_text_at(piece)
        if at is not None:
            before = piece.count("\n", 0, at)
            start = piece.rfind("\n", 0, at) + 1
            character = at - start + 1 + (column if before == 0 else 0)
            raise ValueError(
                f"{name}: line {line + before}, character {character}: "
                f"{not_utf8(piece, at)}: save the file as UTF-8"
            )
        breaks = piece.count("\n")
        line += breaks
        column = (column if breaks == 0 else 0) + len(piece) - (piece.rfind("\n") + 1)
        if column > MAX_LINE:  # (a piece is shorter: only a line across pieces can be)
            raise ValueError(f"{name}: line {line}: longer than {MAX_LINE:,} characters")


def _windows(lines: IO[str], name: str) -> Iterator[Window]:
    """The windows of a text (its UTF-8 checked) read a line at a time."""
    first, blank = "", []  # the format is told by the first character that is not a space
    try:
        for line in lines:
            first = line.removeprefix("\ufeff") if not blank else line  # a byte-order mark
            if first.strip():
                break
            blank.append(first)
        else:
            first = ""
    except LineTooLong as error:
        raise ValueError(f"{name}: {error}") from None
    lower = str(name).lower()
    if lower.endswith(".csv"):
        kind = "csv"
    elif lower.endswith((".jsonl", ".ndjson", ".json")):
        kind = "jsonl"
    else:
        kind = "jsonl" if first.lstrip().startswith("{") else "csv"
    text = itertools.chain(blank, [first] if first else [], lines)
    rows = _csv_rows(text) if kind == "csv" else _jsonl_rows(text)
    while True:
        try:
            line, row = next(rows)
        except StopIteration:
            return
        except ValueError as error:  # the header's, a line's: said of this input, as a value's
            raise ValueError(f"{name}: {error}") from None
        yield _window(row, line, name)


def _csv_rows(lines: Iterable[str]) -> Iterator[tuple[int, dict]]:
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as error:
        raise ValueError(f"line {reader.line_num}: not CSV ({error})") from None
    header = [h.strip().lower() for h in header]
    if not set(header) & set(COLUMNS):
        raise ValueError(
            f"line 1: no diagnosis columns in the header (expected {', '.join(COLUMNS)})"
        )
    for row in _named(reader):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) > len(header):
            raise ValueError(
                f"line {reader.line_num}: {len(row)} cells, the header has {len(header)}"
            )
        yield reader.line_num, dict(zip(header, row, strict=False))


def _named(reader) -> Iterator[list[str]]:
    """The rows of a csv ``reader``; its errors (a cell over its 128 KiB limit) as a
    ``ValueError`` naming the line, as a bad value's."""
    try:
        yield from reader
    except csv.Error as error:
        raise ValueError(f"line {reader.line_num}: not CSV ({error})") from None


def _jsonl_rows(lines: Iterable[str]) -> Iterator[tuple[int, dict]]:
    # A line ends at \n alone, as JSON Lines defines it (the lines given are split so): a
    # JSON string may hold U+2028, U+2029 or NEL raw, and splitlines() cut such a row in two.
    # A CR before the \n is JSON's whitespace. Numbered as _check_text numbers them.
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"line {number}: not JSON ({error.msg})") from None
        except ValueError:  # an integer longer than Python converts (4,300 digits)
            raise ValueError(f"line {number}: not JSON (a number too long to read)") from None
        except RecursionError:
            raise ValueError(f"line {number}: not JSON (nested too deep)") from None
        if not isinstance(row, dict):
            raise ValueError(f"line {number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def _window(row: Mapping[str, Any], line: int, name: str) -> Window:
    values = {}
    for column in COLUMNS:
        raw = row.get(column)
        try:
            values[column] = parse_value(column, raw)
        except ValueError as error:
            raise ValueError(f"{name}: line {line}, column {column}: {error}") from None
    return Window(**values)


def parse_value(column: str, raw: Any) -> Any:
    """One cell (a CSV string or a JSON value) as the column's type; ``None``, an empty cell,
    ``nan``, ``NA``, ``null`` and the like are missing (a NaN number too: JSON's ``NaN``)."""
    if column in _TEXT:
        if isinstance(raw, str):
            return raw.strip() or None
        if isinstance(raw, int) and not isinstance(raw, bool):
            return str(raw)  # a node numbered in JSON
        if raw is None:
            return None
        raise ValueError(f"expected a string, got {raw!r}")
    if isinstance(raw, str):
        raw = raw.strip()
        if raw.lower() in _MISSING:
            return None
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return None
    if column in _BOOLEANS:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int | float) and raw in (0, 1):
            return bool(raw)
        if isinstance(raw, str) and raw.lower() in _TRUE | _FALSE:
            return raw.lower() in _TRUE
        raise ValueError(f"expected true or false, got {raw!r}")
    if isinstance(raw, bool):
        raise ValueError(f"expected a number, got {raw!r}")
    if isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            if column == "t":
                return _timestamp(raw)
            raise ValueError(f"expected a number, got {raw!r}") from None
    elif isinstance(raw, int | float):
        try:
            value = float(raw)
        except OverflowError:  # an integer past any float (JSON's numbers have no bound)
            raise ValueError("expected a finite number, got an integer past 1e308") from None
    else:
        raise ValueError(f"expected a number, got {raw!r}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {raw!r}")
    if column in _FRACTIONS and not 0.0 <= value <= 1.0:
        raise ValueError(f"must be in [0, 1], got {raw!r}")
    if column in _NON_NEGATIVE and value < 0:
        raise ValueError(f"must be >= 0, got {raw!r}")
    if column == "t":
        return _seconds(value)
    return value


# A time since 1970 in seconds stays under 1e11 until the year 5138, and one in milliseconds has
# been over it since 1973: a time's size tells its unit (pandas writes times in JSON as
# milliseconds; ``date_unit`` may make them micro- or nanoseconds).
_TIME_UNITS = ((1e17, 1e-9), (1e14, 1e-6), (1e11, 1e-3))


def _seconds(t: float) -> float:
    for above, scale in _TIME_UNITS:
        if abs(t) >= above:
            return t * scale
    return t


def _timestamp(text: str) -> float:
    """An ISO 8601 time (``2026-12-04T10:00:00Z``; without a zone, UTC) as seconds since 1970."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected seconds since 1970 or an ISO 8601 time, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


# -- from a server's report ----------------------------------------------------------------------


def windows_from_report(
    report: Mapping,
    previous: Mapping | None = None,
    now: datetime | float | None = None,
    *,
    node: str | None = None,
    dcgm: Mapping[str, float | None] | None = None,
) -> list[Window]:
    """The diagnosis window of a validated server report (docs/api.md, "The report"): one per server, or none
    when the server holds no GPU (no target holds a context, no device is allocated) or the
    report is the same one as ``previous`` (a re-sent report is not a new window).

    - ``sm_active``: the busiest GPU-holding target's ``gpu.sm`` (``None`` when a holder's is
      unknown and no known one is busy: unknown is never idle; ``None`` with the backend
      ``unavailable``); with no holder, the busiest unshared device's activity;
    - ``gpu_mem_frac``: memory the targets hold / the memory of the devices they use;
    - ``cpu_cores``, ``cpu_iowait``, ``read_mb_s``, ``cpu_top_thread``: the GPU holders'
      ``targets[].cpu`` (all kernels' when none holds a context): cores and reads summed,
      iowait and the busiest thread the largest;
    - ``kernel_busy``: a kernel target's ``execution_state`` is ``busy`` (``None`` with no kernel);
    - ``user_idle_s``: ``now`` minus ``server.last_activity``;
    - ``gr_active``, ``dram_active``, ``tensor_active``, ``pcie_mb_s``, ``node``: from
      ``dcgm``/``node`` when given (the governor fills them from its DCGM snapshot), else
      missing; a known ``dcgm["sm_active"]`` (DCGM's SM activity, which sees how many SMs the
      kernels fill) replaces the report's ``sm`` (NVML's, the share of time a kernel ran);
    - ``dram_active`` without DCGM's: the busiest ``memory_activity`` (NVML's memory
      utilisation) of the unshared devices the holders use (with no holder, of the unshared
      devices); missing on MIG instances and shared devices (others' traffic).

    ``now``: a datetime or epoch seconds (default: the report's ``sampled_at``); it is ``t``.
    """
    # Every report is scored (issue 26): one walk over each section, loops rather than a
    # comprehension per figure (each is a function call of its own), and DCGM's columns read
    # only where there is a snapshot; each figure as the definitions above make it
    # (docs/benchmarks-history.md, "Issue 26, wave 36").
    parse = parse_time
    get = report.get
    sampled_at = get("sampled_at")
    if previous is not None and previous.get("sampled_at") == sampled_at:
        return []
    backend = get("backend")
    if backend == "none":
        return []
    sampled = parse(sampled_at)
    if now is None:
        t = sampled.timestamp() if sampled else None
    elif isinstance(now, datetime):
        t = now.timestamp()
    else:
        t = float(now)

    server = get("server") or {}
    key = f"{server.get('user', '')}/{server.get('name') or ''}"
    # In the report's order: objects only; a section that is missing or null reads as empty.
    holders = []
    kernels = []
    for target in get("targets") or ():
        if type(target) is dict or isinstance(target, Mapping):  # JSON's first: no ABC check
            if (target.get("gpu") or _EMPTY).get("holds_context"):
                holders.append(target)
            if target.get("kind") == "kernel":
                kernels.append(target)
    devices = {}
    for d in get("devices") or ():
        if type(d) is dict or isinstance(d, Mapping):
            devices[d.get("uuid")] = d
    if not holders and not (devices and server.get("gpu_allocated")):
        return []

    sms = []
    held = []
    used = set()
    busy_from = []  # the holders that are kernels, else every kernel
    for h in holders:
        g = h.get("gpu") or _EMPTY
        sms.append(g.get("sm"))
        held.append(g.get("memory_mb"))
        used.update(g.get("devices") or ())
        if h.get("kind") == "kernel":
            busy_from.append(h)
    if backend == "unavailable":
        sm = None
    elif holders:
        known = [s for s in sms if isinstance(s, _NUMBER)]
        sm = max(known) if known and (len(known) == len(sms) or max(known) > 0) else None
    else:
        activity = [
            d.get("activity")
            for d in devices.values()
            if not d.get("shared") and isinstance(d.get("activity"), _NUMBER)
        ]
        sm = max(activity) if activity else None

    # The devices the holders use, in ``used``'s order (with no holder: every device).
    mine = [devices[u] for u in used if u in devices] if holders else list(devices.values())
    mem_frac = None
    if holders:
        totals = [d.get("memory_total_mb") for d in mine]
        if totals and _numbers(totals) and sum(totals) > 0 and held and _numbers(held):
            mem_frac = min(1.0, sum(held) / sum(totals))
    elif devices:
        pairs = [
            (d.get("memory_used_mb"), d.get("memory_total_mb"))
            for d in devices.values()
            if not d.get("shared")
        ]
        if pairs and all(isinstance(u, _NUMBER) and isinstance(m, _NUMBER) for u, m in pairs):
            total = sum(m for _, m in pairs)
            mem_frac = min(1.0, sum(u for u, _ in pairs) / total) if total > 0 else None

    activities = []
    for d in mine:
        if not d.get("shared"):
            activities.append(d.get("memory_activity"))
    memory_activity = _max(activities)

    cores = iowait = reads = top_thread = None
    cpus = []
    for t_ in holders or kernels:
        cpu = t_.get("cpu")
        if (type(cpu) is dict or isinstance(cpu, Mapping)) and "cores" in cpu:
            cpus.append(cpu)
    if cpus:
        cores, iowait, reads, top_thread = [], [], [], []
        for c in cpus:
            cores.append(c.get("cores"))
            iowait.append(c.get("iowait"))
            reads.append(c.get("read_mb_s"))
            top_thread.append(c.get("top_thread"))
        cores, iowait = _sum(cores), _max(iowait)
        reads, top_thread = _sum(reads), _max(top_thread)

    busy_from = busy_from or kernels
    kernel_busy = None
    if busy_from:
        kernel_busy = False
        for t_ in busy_from:
            if t_.get("execution_state") == "busy":
                kernel_busy = True
                break

    last = parse(server.get("last_activity"))
    user_idle = None
    if last is not None and t is not None:
        user_idle = max(0.0, t - last.timestamp())

    if dcgm:
        dcgm_sm, dram = dcgm.get("sm_active"), dcgm.get("dram_active")
        node = node or dcgm.get("node")
        tensor = _fraction(dcgm.get("tensor_active"))
        pcie = _positive(dcgm.get("pcie_mb_s"))
        gr = _fraction(dcgm.get("gr_active"))
    else:  # most reports: no DCGM, its columns missing
        dcgm_sm = dram = tensor = pcie = gr = None
        node = node or None
    # The window is made as ``Window(...)`` makes it (its columns in their order), without the
    # frozen dataclass's 15 setattrs (docs/benchmarks-history.md, "Issue 26, wave 24").
    window = object.__new__(Window)
    object.__setattr__(
        window,
        "__dict__",
        {
            "node": node,
            "server": key,
            "t": t,
            "sm_active": _fraction(sm if dcgm_sm is None else dcgm_sm),
            "dram_active": _fraction(memory_activity if dram is None else dram),
            "tensor_active": tensor,
            "pcie_mb_s": pcie,
            "gpu_mem_frac": _fraction(mem_frac),
            "cpu_cores": _positive(cores),
            "cpu_iowait": _fraction(iowait),
            "read_mb_s": _positive(reads),
            "kernel_busy": kernel_busy,
            "user_idle_s": user_idle,
            "gr_active": gr,
            "cpu_top_thread": _fraction(top_thread),
        },
    )
    return [window]


_EMPTY: Mapping = {}
# ``isinstance`` against a tuple: against ``int | float`` it took 2.7x as long (issue 26)
_NUMBER = (int, float)


def _numbers(values: list[Any]) -> bool:
    """Every value an ``int`` or a ``float`` (a bool too, as ``isinstance`` reads it)."""
    for v in values:  # noqa: SIM110 (all() of a generator: a call and a frame each report)
        if not isinstance(v, _NUMBER):
            return False
    return True


def _known(values: list[Any]) -> list[float]:
    for v in values:
        if type(v) is not float:
            return [
                float(v)
                for v in values
                if v is not None and ((type(v) is float or type(v) is int) or _number(v))
            ]
    return values  # floats only (most): each its own float(), read, never changed


def _number(v: Any) -> bool:
    """A number other than a bool (``int`` and ``float`` subclasses included)."""
    return isinstance(v, _NUMBER) and not isinstance(v, bool)


def _sum(values: list[Any]) -> float | None:
    known = _known(values)
    return sum(known) if known and len(known) == len(values) else None


def _max(values: list[Any]) -> float | None:
    known = _known(values)
    return max(known) if known else None


def _fraction(value: Any) -> float | None:
    if type(value) is float:  # most values: what the rest gives them
        if 0.0 < value < 1.0:
            return value
        if value == 0.0 or value == 1.0:  # -0.0 too, as min(1.0, max(0.0, -0.0)) reads it
            return abs(value)
    if value is None:
        return None
    if not _number(value) or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, float(value)))


def _positive(value: Any) -> float | None:
    if type(value) is float:  # most values: what the rest gives them
        if 0.0 < value < math.inf:
            return value
        if value == 0.0:  # -0.0 too, as max(0.0, -0.0) reads it
            return 0.0
    if value is None:
        return None
    if not _number(value) or not math.isfinite(value):
        return None
    return max(0.0, float(value))
