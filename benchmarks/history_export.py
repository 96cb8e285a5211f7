"""History: what 10,000 servers cost to keep, and their export as a replay trace.

    python -m benchmarks.history_export [--servers 10000] [--days 1] [--pass-every 60] [--step 300]

A synthetic day of the governor's passes (one every ``--pass-every`` seconds) over
``--servers`` running servers: each alternates working stretches (SM activity moving from pass
to pass, a cell running, the owner at the notebook now and then) of 10-90 minutes with idle
stretches (memory held, nothing moving) of 10 minutes to 6 hours: about a fifth of the time is
work, as on the clusters the mission starts from (15-40 % utilisation). Every pass goes
through ``worth_recording`` (the governor's filter) for the first ``--check`` servers; for the
rest the kept rows are built directly (the same rule: a row every pass while working, at each
change and every ``KEYFRAME_S`` while idle), as the filter is not what is timed here.

The servers' rows are merged in time order, as the passes write them. It then stores them as
the governor does (``hub.history.HistoryLog.append``: SQLite, ``STORAGE_COLUMNS``, one index on
(t); ``append_us_per_row`` is its cost per kept row), reads them back as ``export-trace`` does
(``read_history``) and times ``export_trace`` at ``--step`` seconds, lines written to a null
sink. Prints the rows kept per server-day, the bytes per kept row and
per server-pass in SQLite (the database file's size over its rows), the estimate for 10,000
servers x 14 days, and the export's wall time, reading the store in time order included (the
median of ``--repeat`` runs). Rows stream from the generator to the store and from the store to
the export: memory stays flat whatever ``--servers``.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta

from sqlalchemy import create_engine

from jupyter_gpu_gov.hub.history import HistoryLog, HistoryOptions, read_history
from jupyter_gpu_gov.replay.engine import EPOCH
from jupyter_gpu_gov.replay.history import (
    KEYFRAME_S,
    HistoryRow,
    export_trace,
    worth_recording,
)

TEAMS = ("vision", "nlp", "speech", "rl", "bio")
PROFILES = ("a100-80g", "h100-80g", "mig-3g.40gb", "mig-1g.10gb")


def _server_passes(rng: random.Random, index: int, start: float, end: float, every: float):
    """(t, sm, busy, user_last, hub_last) at each pass of one server, and its fixed part."""
    user = f"u{index:05d}"
    fixed = {
        "server": f"{user}/",
        "started": start,
        "profile": PROFILES[index % len(PROFILES)],
        "team": TEAMS[index % len(TEAMS)],
        "labels": {"gpu-gov/project": f"p{index % 97}", "gpu-gov/tier": PROFILES[index % 4]},
    }
    t, user_last = start, start
    working = rng.random() < 0.35
    while t < end:
        stretch = rng.uniform(600, 5400) if working else rng.uniform(600, 6 * 3600)
        stop = min(end, t + stretch)
        while t < stop:
            if working:
                sm = rng.uniform(0.3, 0.95)
                if rng.random() < 0.1:
                    user_last = t
                yield fixed, t, sm, True, user_last
            else:
                yield fixed, t, 0.0, False, user_last
            t += every
        working = not working


def _row(fixed: dict, t: float, sm: float, busy: bool, user_last: float) -> HistoryRow:
    return HistoryRow(
        t=t,
        gpu_sm=sm,
        dcgm_sm=sm,
        gpu_mem_mb=20480.0,
        holds_context=True,
        kernel_busy=busy,
        connections=1,
        user_last=user_last,
        hub_last=user_last,
        state="active" if busy else "idle",
        **fixed,
    )


def kept_rows(servers: int, days: float, every: float, check: int, seed: int, count: list):
    """The rows the governor keeps in ``days``, in time order, as its passes write them;
    ``count`` gets the passes."""
    start = EPOCH.timestamp()
    end = start + days * 86400

    def server(index: int) -> Iterator[HistoryRow]:
        rng = random.Random(seed * 1_000_003 + index)
        last: HistoryRow | None = None
        last_idle_t: float | None = None
        offset = rng.uniform(0, every)
        for fixed, t, sm, busy, user_last in _server_passes(rng, index, start + offset, end, every):
            count[0] += 1
            if index < check:  # the governor's filter, every pass
                row = _row(fixed, t, sm, busy, user_last)
                if worth_recording(last, row):
                    yield row
                    last = row
                continue
            # The same rule, without building the rows it drops.
            if busy:
                last_idle_t = None
            elif last_idle_t is not None and t - last_idle_t < KEYFRAME_S:
                continue
            else:
                last_idle_t = t
            yield _row(fixed, t, sm, busy, user_last)

    return heapq.merge(*(server(i) for i in range(servers)), key=lambda row: row.t)


def store(rows: Iterable[HistoryRow], path: str) -> tuple[int, int, float]:
    """Write ``rows`` as the governor does (``hub.history.HistoryLog.append``, a batch at a
    time): (rows, the file's size in bytes, seconds spent appending)."""
    engine = create_engine(f"sqlite:///{path}")
    # Rows from the replay clock (2026-01-01): no retention deletes them here.
    history = HistoryLog(engine, HistoryOptions(retention=timedelta(days=3650)))
    written, spent, batch = 0, 0.0, []
    for row in rows:
        batch.append(row)
        if len(batch) >= 50_000:
            started = time.perf_counter()
            written += history.append(batch)
            spent += time.perf_counter() - started
            batch.clear()
    started = time.perf_counter()
    written += history.append(batch)
    spent += time.perf_counter() - started
    with engine.connect() as db:
        db.exec_driver_sql("VACUUM")
    engine.dispose()
    return written, os.path.getsize(path), spent


def read(path: str) -> Iterator[HistoryRow]:
    return read_history(create_engine(f"sqlite:///{path}"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--pass-every", type=float, default=60.0)
    parser.add_argument("--step", type=float, default=300.0)
    parser.add_argument("--check", type=int, default=200, help="servers run through the filter")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    count = [0]
    rows = kept_rows(args.servers, args.days, args.pass_every, args.check, args.seed, count)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "history.sqlite")
        kept, size, append_s = store(rows, path)
        passes = count[0]
        times, lines, chars = [], 0, 0
        for _ in range(args.repeat):  # read back in time order, export, write to nowhere
            started = time.perf_counter()
            lines = chars = 0
            for line in export_trace(read(path), step=args.step):
                lines += 1
                chars += len(line) + 1
            times.append(time.perf_counter() - started)
    per_row = size / kept
    per_pass = size / passes
    server_days = args.servers * args.days
    fortnight = per_row * kept / server_days * 10_000 * 14
    figures = {
        "servers": args.servers,
        "days": args.days,
        "passes": passes,
        "rows_kept": kept,
        "kept_per_server_day": round(kept / server_days),
        "bytes_per_row": round(per_row, 1),
        "bytes_per_server_pass": round(per_pass, 1),
        "append_us_per_row": round(append_s / kept * 1e6, 1),
        "sqlite_mb": round(size / 1e6, 1),
        "estimate_10000x14d_gb": round(fortnight / 1e9, 2),
        "export_s": round(statistics.median(times), 2),
        "lines": lines,
        "trace_mb": round(chars / 1e6, 1),
        "lines_per_s": round(lines / statistics.median(times)),
    }
    print("history export:", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
