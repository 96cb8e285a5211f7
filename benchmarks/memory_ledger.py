"""What the store keeps of the usage ledger's rows, day after day (issue 26: a service that runs
for months at 10,000 servers).

    python -m benchmarks.memory_ledger [--servers 10000] [--days 4] [--writes 2]

In-process, a ``Store`` on a temporary SQLite file and a ``core.ledger.Ledger``: every server is
started each morning (a new session), seen ``--writes`` times, stopped in the evening, and the
ledger drained into ``Store.save_usage`` at each; after each day, the bytes of what the store
keeps to tell an update from an insert (its bucket keys and its sessions, by ``sys.getsizeof``,
each object once) and the seconds the day's writes took. A store that kept every day's keys and
every session it wrote grows by the day; one bounded by the newest days and the open sessions
does not (``hub/store.py``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime, timedelta, timezone

from jupyter_gpu_gov.core import ledger
from jupyter_gpu_gov.hub.store import Store

from .memory import Reach

START = datetime(2026, 12, 2, 8, 0, tzinfo=timezone.utc)


def run(servers: int = 10000, days: int = 4, writes: int = 2) -> list[dict]:
    owners = {
        f"user{i}": ledger.Owner(f"user{i}", "team", "project", "h100") for i in range(servers)
    }
    by_day = []
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as workdir:
        store = Store(f"sqlite:///{workdir}/gov.sqlite")
        book = ledger.Ledger(timedelta(minutes=10))
        for day in range(days):
            morning = START + timedelta(days=day)
            spent = 0.0
            for write in range(writes):
                at = morning + timedelta(minutes=5 * write)
                for user, owner in owners.items():
                    seen = ledger.Observation(
                        f"{user}/", morning.isoformat(), at, owner, 1.0, ledger.ACTIVE, morning
                    )
                    book.observe(seen)
                if write == writes - 1:  # the evening: every server stopped
                    for user in owners:
                        book.close(f"{user}/", at + timedelta(minutes=1))
                deltas, sessions = book.drain()
                started = time.perf_counter()
                store.save_usage(deltas, sessions)
                spent += time.perf_counter() - started
            kept = {name: getattr(store, name) for name in vars(store) if name.startswith("_usage")}
            by_type, _ = Reach(owners, book).walk(*kept.values())
            by_day.append(
                {"day": day + 1, "kept_mb": sum(by_type.values()) / 1e6, "write_s": spent}
            )
    return by_day


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10000)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--writes", type=int, default=2, help="the ledger's writes a day")
    args = parser.parse_args(argv)
    for figures in run(args.servers, args.days, args.writes):
        print(
            f"day {figures['day']}: kept {figures['kept_mb']:.2f} MB, "
            f"the day's writes {figures['write_s']:.3f} s"
        )


if __name__ == "__main__":
    main()
