"""How far showback's costs, counted in whole cents a bucket (docs/api.md, ``api/usage``), are
from the exact sums on the lab world's ledger: figures for the documented bound, not a target.

    python -m benchmarks.showback_cents [--users 40] [--days 30] [--step 60]

The lab world (``benchmarks.replay.lab``) is fed to the usage ledger as the governor observes
it (a look every ``--step`` seconds, a session billed from its start to its stop) and drained
into buckets (a UTC day of one user, team, project, tier). Printed, for whole GPUs and a
1/7 slice at two prices: the month's cost and idle cost as showback counts them against the
exact sums, the worst user's month, and the buckets under half a cent (each of them rounds to 0).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from datetime import datetime, timedelta, timezone

from jupyter_gpu_gov.core import ledger

from .replay import lab

START = datetime(2026, 11, 1, tzinfo=timezone.utc)


def buckets(users: int, days: int, step: int) -> list[ledger.Bucket]:
    """The lab world's ledger, each server a whole GPU."""
    book = ledger.Ledger(max_gap=timedelta(seconds=5 * step))
    last: dict[str, tuple[int, datetime]] = {}
    for row in lab.generate(users, days, 1, step):
        server, at = row["server"], START + timedelta(seconds=row["t"])
        before = last.get(server)
        if before is not None and before[0] != row["started"]:
            book.close(server, before[1] + timedelta(seconds=step))
        last[server] = (row["started"], at)
        if "gpu_sm" not in row:
            state = ledger.UNKNOWN
        elif row["gpu_sm"] > 0.01:
            state = ledger.ACTIVE
        else:
            state = ledger.IDLE_HELD if row["holds_context"] else ledger.IDLE_FREE
        user = server.split("/")[0]
        owner = ledger.Owner(user, row["team"], row["labels"]["gpu-gov/project"], row["profile"])
        started = START + timedelta(seconds=row["started"])
        book.observe(
            ledger.Observation(server, str(row["started"]), at, owner, 1.0, state, started)
        )
    for server, (_, at) in last.items():
        book.close(server, at + timedelta(seconds=step))
    deltas, _ = book.drain()
    return [ledger.Bucket(day, owner, values) for (day, owner), values in deltas.items()]


def compare(book: list[ledger.Bucket], weight: float, price: float) -> str:
    """Showback's cents against the exact cents, at ``weight`` GPU-equivalents a server."""
    cents = defaultdict(lambda: [0, 0.0, 0, 0.0])  # per user: idle, exact idle, cost, exact cost
    tiny = 0
    for b in book:
        idle = (b.values.get(ledger.IDLE_HELD, 0.0) + b.values.get(ledger.IDLE_FREE, 0.0)) * weight
        allocated = sum(b.values.get(s, 0.0) for s in ledger.STATES) * weight
        user = cents[b.owner.user]
        for i, seconds in ((0, idle), (2, allocated)):
            exact = seconds / 36 * price  # seconds / 3600 * price * 100
            user[i] += round(exact)  # as ledger.summarize counts a bucket
            user[i + 1] += exact
            tiny += 0 < exact < 0.5
    total = [sum(u[i] for u in cents.values()) / 100 for i in range(4)]
    worst = max(max(abs(u[0] - u[1]), abs(u[2] - u[3])) for u in cents.values()) / 100
    return (
        f"weight {weight:.3f}, {price}/h: cost {total[2]:.2f} (exact {total[3]:.4f}, "
        f"{total[2] - total[3]:+.2f}), idle {total[0]:.2f} ({total[0] - total[1]:+.2f}); "
        f"worst user's month {worst:.2f}; buckets under half a cent {tiny}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--step", type=int, default=60, help="seconds between looks")
    args = parser.parse_args(argv)
    book = buckets(args.users, args.days, args.step)
    users = len({b.owner.user for b in book})
    print(f"showback_cents: {len(book)} buckets, {users} users, {args.days} days")
    for weight in (1.0, 1 / 7):
        for price in (2.5, 0.5):
            print(f"showback_cents: {compare(book, weight, price)}")


if __name__ == "__main__":
    main()
