"""History: the prune that sweeps, and how long it holds the store at a time.

    python -m benchmarks.history_sweep [--rows 20000000] [--servers 10000] [--days 14] [--repeat 3]
        [--later] [--restarted]

A store as ``HistoryLog`` keeps it (SQLite, ``STORAGE_COLUMNS``, the index on ``t``) holding
``--rows`` rows over ``--days`` days of ``--servers`` servers (a run a server a day, a few
hundred contexts), written straight with ``sqlite3`` (``HistoryLog.append`` would take an hour
at 20 M rows), plus an hour of rows past the retention whose runs no other row names (servers
that stopped): what the daily sweep meets at the hourly prune that runs it.

Each repeat copies the store and runs one prune on the copy, the sweep due, as the governor
does: ``HistoryLog.upkeep_step`` until it says it is done, each step timed on its own (each is
a transaction in the store's writer: what a pass's write or a request's waits for at most).
On a tree from before the steps (no ``upkeep_step``) it times ``HistoryLog.prune()``, then one
transaction. Prints the longest single store operation, the steps, their total, and the rows,
runs and contexts left (the same on both trees: the same end state). ``--later``: a later
day's sweep, the service having swept once since it started (its first sweep checks every run
and context; later ones only those up to what the deleted rows named). ``--restarted``: the
first sweep after a restart of a service that had swept before (a tree that keeps where the
sweep stands in the store resumes from it; one that kept it in memory checks every id).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from datetime import timedelta

from sqlalchemy import create_engine

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.hub import history
from jupyter_gpu_gov.hub.history import HistoryLog, HistoryOptions

PROFILES = ("a100-80g", "h100-80g", "mig-3g.40gb", "mig-1g.10gb")
TEAMS = ("vision", "nlp", "speech", "rl", "bio")


def build(path: str, rows: int, servers: int, days: int, now: int) -> None:
    """The store: ``rows`` within the retention, then an hour's worth past it (their own
    runs), in id order as the passes wrote them (oldest first)."""
    engine = create_engine(f"sqlite:///{path}")
    HistoryLog(engine, HistoryOptions())  # the tables, as the governor makes them
    engine.dispose()
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    contexts = [
        (i + 1, f'["{PROFILES[i % 4]}","{TEAMS[i % 5]}",{{"p":"p{i}"}},"default","idle",null]')
        for i in range(400)
    ]
    db.executemany("INSERT INTO gpu_gov_history_contexts (id, json) VALUES (?, ?)", contexts)
    span = days * 86400
    hour_rows = max(1, rows // (days * 24))
    start = now - span - 3600  # the first hour: past the retention
    runs = []
    for server in range(servers):  # the stale hour's runs first (the oldest ids)
        runs.append((len(runs) + 1, f"gone{server:05d}/", float(start)))
    stale_runs = len(runs)
    for day in range(days):
        for server in range(servers):
            runs.append((len(runs) + 1, f"u{server:05d}/", float(now - span + day * 86400)))
    db.executemany("INSERT INTO gpu_gov_history_runs (id, server, started) VALUES (?, ?, ?)", runs)

    def values():
        for i in range(hour_rows):
            t = start + i * 3600 // hour_rows
            yield t, 1 + i % stale_runs, 1 + i % 400, None, 0, 20480, 5, 1, 60, 60
        for i in range(rows):
            t = now - span + int(i * span / rows)
            day = (t - (now - span)) // 86400
            run = stale_runs + 1 + min(day, days - 1) * servers + i % servers
            yield t, run, 1 + (i * 7) % 400, 500, 480, 20480, 7, 1, 0, 0

    db.executemany(
        "INSERT INTO gpu_gov_history (t, run, context, sm, dcgm_sm, memory_mb, flags, "
        "connections, user_idle_s, hub_idle_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        values(),
    )
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def prune(path: str, days: int, later: bool = False, restarted: bool = False) -> dict:
    engine = create_engine(f"sqlite:///{path}")
    log = HistoryLog(engine, HistoryOptions(retention=timedelta(days=days)))
    if later and hasattr(log, "_deleted_named"):  # as after its first sweep, nothing since
        log._deleted_named = (0, 0)  # (a tree that kept it in memory)
    if (later or restarted) and hasattr(history, "SWEEP_FROM"):  # swept before, in the store
        with engine.begin() as db:
            db.execute(history.SWEEP_FROM.insert().values(id=1, runs=0, contexts=0))
    stalls = []
    if hasattr(log, "upkeep_step"):
        more = True
        while more:
            started = time.perf_counter()
            more = log.upkeep_step()
            stalls.append(time.perf_counter() - started)
    else:  # the tree before: one transaction
        started = time.perf_counter()
        log.prune()
        stalls.append(time.perf_counter() - started)
    db = sqlite3.connect(path)
    left = {
        table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("gpu_gov_history", "gpu_gov_history_runs", "gpu_gov_history_contexts")
    }
    db.close()
    engine.dispose()
    return {"longest_s": max(stalls), "steps": len(stalls), "total_s": sum(stalls), **left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="where to build the store (default: a temporary folder)")
    parser.add_argument(
        "--later",
        action="store_true",
        help="a later day's sweep: the service swept once since it started (the first "
        "sweep after a start checks every run and context)",
    )
    parser.add_argument(
        "--restarted",
        action="store_true",
        help="the first sweep after a restart of a service that had swept before",
    )
    args = parser.parse_args()
    now = int(clock.utcnow().timestamp())
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        template = os.path.join(folder, "template.sqlite")
        started = time.perf_counter()
        build(template, args.rows, args.servers, args.days, now)
        size = os.path.getsize(template)
        print(
            f"built {args.rows:,} rows in {time.perf_counter() - started:.0f} s, {size / 1e6:.0f} MB"
        )
        results = []
        for _ in range(args.repeat):
            copy = os.path.join(folder, "copy.sqlite")
            shutil.copyfile(template, copy)
            results.append(prune(copy, args.days, args.later, args.restarted))
            os.remove(copy)
            print(results[-1], flush=True)
    longest = statistics.median(r["longest_s"] for r in results)
    total = statistics.median(r["total_s"] for r in results)
    print(
        f"the prune that sweeps: longest single store operation {longest * 1000:.0f} ms "
        f"(median of {len(results)}), {results[0]['steps']} steps, {total:.1f} s in all; "
        f"left: {results[0]['gpu_gov_history']:,} rows, {results[0]['gpu_gov_history_runs']:,} "
        f"runs, {results[0]['gpu_gov_history_contexts']:,} contexts; "
        f"load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
