"""A standby governor's read of the rows the holder wrote since its last read.

    python -m benchmarks.standby_reads [--servers 10000] [--changed 20] [--repeat 50]

A store (SQLite, a file, as the service keeps it) with ``--servers`` rows; ``--changed`` of
them written again (a pass's few decisions). Times ``Store.servers(changed_since=...)``, what
a standby runs after each of the holder's passes (``Views._read_back``), and prints SQLite's
query plan for it: ``SCAN servers`` reads every row to find the few; ``SEARCH servers USING
INDEX ix_servers_updated_at`` reads those. Prints the median in milliseconds, what writing
every row again costs the holder (``write_all_ms``, median of 3: the index's price), and the
load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta

from sqlalchemy import event

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.hub.tables import ServerRow


def run(servers: int, changed: int, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        store = Store(f"sqlite:///{os.path.join(folder, 'gov.sqlite')}")
        rows = [ServerRow(key=f"u{i:05d}/", user=f"u{i:05d}", name="") for i in range(servers)]
        store.save_servers(rows)
        since = clock.utcnow() + timedelta(milliseconds=1)
        time.sleep(0.01)
        store.save_servers(rows[:: max(1, servers // changed)][:changed])
        asked = []
        event.listen(
            store.engine,
            "before_cursor_execute",
            lambda conn, cursor, statement, parameters, *_: asked.append((statement, parameters)),
        )
        found = store.servers(changed_since=since)
        statement, parameters = asked[0]
        with store.engine.connect() as db:
            plan = db.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            store.servers(changed_since=since)
            times.append(time.perf_counter() - started)
        writes = []  # what the index costs the holder: every row written again
        for _ in range(3):
            started = time.perf_counter()
            store.save_servers(rows)
            writes.append(time.perf_counter() - started)
        store.engine.dispose()
    return {
        "servers": servers,
        "read": len(found),
        "read_ms": round(statistics.median(times) * 1000, 3),
        "write_all_ms": round(statistics.median(writes) * 1000, 1),
        "plan": " / ".join(row[-1] for row in plan),
        "load": round(os.getloadavg()[0], 1),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--changed", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args(argv)
    figures = run(args.servers, args.changed, args.repeat)
    print("standby reads:", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
