"""The spawn queue's line with many requests waiting: what the hub pays to compute it.

``profiles.queue.line()`` runs on the hub's event loop for the governor's sync after each pass,
for every Hub page a waiting user opens (the line's notice), on the queue page, and once per
tier offered on the spawn form (``offer``). Times the three with ``--held`` servers holding
GPUs and ``--waiting`` requests in line (10 teams, 4 tiers):

    python -m benchmarks.queue_line [--held 100] [--waiting 200] [--repeat 3]

Prints medians in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from jupyter_gpu_gov.core.queue import CAPACITY, QueuedRequest
from jupyter_gpu_gov.core.vocabulary import server_key
from jupyter_gpu_gov.profiles import queue
from jupyter_gpu_gov.profiles.quota import Admission, Grant, Request, load_quotas
from jupyter_gpu_gov.profiles.tiers import load_tiers

TIERS = [
    {"name": "h100", "gpu": "H100-80GB"},
    {"name": "h100x2", "gpu": "H100-80GB", "count": 2},
    {"name": "h200-3g", "gpu": "H200-141GB", "mig": "3g.71gb"},
    {"name": "h200-1g", "gpu": "H200-141GB", "mig": "1g.18gb"},
]
CAPACITY_OF = {"h100": 100, "h100x2": 16, "h200-3g": 32, "h200-1g": 200}


def _median_s(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 4)


def measure(held: int, waiting: int, repeat: int = 3) -> dict[str, float]:
    tiers = load_tiers(TIERS)
    teams = [f"team{i}" for i in range(10)]
    per_team = {"guaranteed": {"h100": 10, "h200-1g": 20}, "tiers": "*", "user_cap": 2}
    quotas = load_quotas({team: per_team for team in teams}, tiers)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    usage = [
        Grant(server_key(f"u{i}"), f"u{i}", teams[i % 10], "h100", 1, 1.0, started=now)
        for i in range(held)
    ]
    line = [
        QueuedRequest(
            f"w{i}",
            "",
            teams[i % 10],
            "h100",
            {},
            now - timedelta(seconds=i),
            now + timedelta(hours=8),
        )
        for i in range(waiting)
    ]

    def line_for(shown: Callable[[QueuedRequest], bool]) -> list:
        return queue.line(line, usage, CAPACITY_OF, quotas, tiers, {}, now, sooner_for=shown)

    request = Request(server_key("x"), "x", "team1", "h100")
    refused = Admission(False, "no H100 is free", limit=CAPACITY)
    return {
        "sync_s": _median_s(lambda: line_for(lambda r: False), repeat),
        "waiting_users_page_s": _median_s(lambda: line_for(lambda r: r.user == "w7"), repeat),
        "spawn_form_offer_s": _median_s(
            lambda: queue.offer(request, refused, usage, CAPACITY_OF, quotas, tiers, line, {}, now),
            repeat,
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=100, help="servers holding GPUs")
    parser.add_argument("--waiting", type=int, default=200, help="requests in line")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    figures = measure(args.held, args.waiting, args.repeat)
    print(f"held={args.held} waiting={args.waiting} (medians of {args.repeat}):")
    for name, value in figures.items():
        print(f"  {name}: {value}")


if __name__ == "__main__":
    main()
