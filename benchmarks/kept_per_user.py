"""What one user's names cost the service (docs/security.md, "What one user's names make the
service keep"): figures for the bounds, not a speed target.

    python -m benchmarks.kept_per_user [--names 3600] [--rows 100000]

Printed: the hub's refused demand after one user is refused under ``--names`` server names (a
name a second for an hour) beside another user's one refusal; and the governor's memory a
stopped server's row takes, with the time a read through every row takes (what every owner's
page, the admin's listing and the diagnosis summary do) at ``--rows`` rows, against the rows one
user may leave by default (``c.GpuGovernor.stopped_kept_per_user``); and the time the governor's
trim of a stopping user's rows (``Governor._forget_stopped``, at each pass where a server
stopped) takes among ``--rows`` rows, 100 a user.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import tracemalloc
from datetime import datetime, timedelta, timezone


def refused(names: int) -> tuple[int, int]:
    """The refused demand counted (without the per-user bound, with it)."""
    from jupyter_gpu_gov.profiles.config import GpuProfiles
    from jupyter_gpu_gov.profiles.queue import Refusals

    per_user = GpuProfiles().queue_per_user
    now = datetime(2026, 12, 6, 12, tzinfo=timezone.utc)
    counted = []
    for bound in (0, per_user):
        refusals = Refusals()
        refusals.refused("carol/", now, "h100", "carol", bound)
        for i in range(names):
            at = now + timedelta(seconds=i * 3600 / names)
            refusals.refused(f"mallory/x{i}", at, "h100", "mallory", bound)
        counted.append(refusals.count(now + timedelta(minutes=59)))
    return counted[0], counted[1]


def rows(n: int) -> tuple[float, float]:
    """Bytes a stopped row holds in memory, and ms a read through ``n`` rows takes."""
    from jupyter_gpu_gov.hub.tables import ServerRow

    now = datetime(2026, 12, 6, 12, tzinfo=timezone.utc)
    tracemalloc.start()
    kept = {}
    for i in range(n):
        key = f"mallory/x{i}"
        kept[key] = ServerRow(
            key=key, user="mallory", name=f"x{i}", session_started=now, running=False
        )
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    started = time.perf_counter()
    for _ in range(10):
        [r for r in kept.values() if r.running]  # known_servers(running_only=True)
    return size / n, (time.perf_counter() - started) / 10 * 1000


def trim(n: int, repeat: int = 200) -> float:
    """ms the governor's trim takes when one user's server stops, among ``n`` stopped rows
    (100 a user, the default bound: nothing to forget, the pass's usual case)."""
    from types import SimpleNamespace

    from jupyter_gpu_gov.hub.options import Options
    from jupyter_gpu_gov.hub.reconcile import Governor
    from jupyter_gpu_gov.hub.tables import Rows, ServerRow

    now = datetime(2026, 12, 6, 12, tzinfo=timezone.utc)
    rows = Rows(
        {
            f"u{i // 100}/x{i}": ServerRow(
                key=f"u{i // 100}/x{i}",
                user=f"u{i // 100}",
                name=f"x{i}",
                session_started=now,
                running=False,
                updated_at=now + timedelta(seconds=i),
            )
            for i in range(n)
        }
    )
    governor = SimpleNamespace(options=Options(), store=None)  # (nothing to forget: unused)

    async def passes() -> float:
        started = time.perf_counter()
        for _ in range(repeat):
            await Governor._forget_stopped(governor, rows, ["u0/x99"])
        return (time.perf_counter() - started) / repeat * 1000

    return asyncio.run(passes())


def main(argv: list[str] | None = None) -> None:
    from jupyter_gpu_gov.hub.options import Options

    kept = Options().stopped_kept_per_user

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=3600, help="server names refused (an hour)")
    parser.add_argument("--rows", type=int, default=100_000, help="stopped servers' rows")
    args = parser.parse_args(argv)
    unbounded, bounded = refused(args.names)
    print(
        f"kept_per_user: refused demand after {args.names} names of one user and 1 of "
        f"another's: {unbounded} counted per name, {bounded} per user"
    )
    size, read_ms = rows(args.rows)
    print(
        f"kept_per_user: a stopped server's row {size:.0f} B in memory; a read through "
        f"{args.rows} rows {read_ms:.1f} ms; rows one user may leave: {kept} "
        f"({kept * size / 1024:.0f} kB)"
    )
    print(
        f"kept_per_user: the trim of a stopping user's rows among {args.rows} rows: "
        f"{trim(args.rows):.3f} ms"
    )


if __name__ == "__main__":
    main()
