"""The governor's bytes a server, by the line that allocated them (tracemalloc), in one process.

    python -m benchmarks.memory_sites [--servers 2000,10000] [--rounds 5] [--top 30]

For each size, a fresh process builds the governor as ``benchmarks.ingest_steps`` does (the
service's ``make_governor`` against the fake Hub in that process, its start-up pass done),
starts ``tracemalloc`` once the fake Hub holds its users (so their models are not counted),
then runs ``--rounds`` rounds of a pass and every server's report a minute later on the
governor's clock (``ingest_load.report_for``, through the report route's steps), a full
collection, and a snapshot (the fake Hub's own lines left out). Printed: the traced total at
each size, and the ``--top`` lines
whose bytes grow the most with the servers, as bytes a server between the two sizes (the
slope: what a server costs, the fixed cost left out), with their objects a server. What
tracemalloc sees does not depend on the machine's load, unlike resident memory
(``benchmarks.memory``); it misses what C libraries allocate without Python's allocator.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import tracemalloc

from .ingest_load import RUN_STARTED, encode, report_for
from .ingest_steps import REPO, ROUND_S, Clock, _governor, _pass, _round


async def _sites(servers: int, rounds: int) -> dict:
    from jupyter_gpu_gov.core import clock as gov_clock
    from jupyter_gpu_gov.hub import heap

    with tempfile.TemporaryDirectory(prefix="bench-memory-sites-") as workdir:
        tracemalloc.start()
        hub, gov, users = await _governor(workdir, servers)
        collections = heap.start()
        try:
            for _ in range(rounds):
                await _pass(gov, {}, timed=False)
                gov_clock.advance(ROUND_S)
                now = gov_clock.utcnow()
                bodies = [
                    encode(report_for(u, i, now, None, RUN_STARTED)) for i, u in enumerate(users)
                ]
                _round(gov, bodies, Clock())
                del bodies
            await _pass(gov, {}, timed=False)
            gc.collect()
            snapshot = tracemalloc.take_snapshot()
        finally:
            heap.stop(collections)
            await gov.close()
            hub.stop()
    # The fake Hub's users live in this process: its lines are not the governor's.
    snapshot = snapshot.filter_traces([tracemalloc.Filter(False, str(REPO / "tests" / "*"))])
    by_line = {
        str(stat.traceback[0]): (stat.size, stat.count) for stat in snapshot.statistics("lineno")
    }
    traced = sum(size for size, _ in by_line.values())
    return {"servers": servers, "traced": traced, "by_line": by_line}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="2000,10000", help="two sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a size, in this process
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(asyncio.run(_sites(args.one, args.rounds))))
        return
    small, large = (int(n) for n in args.servers.split(","))
    runs = []
    for n in (small, large):
        command = [sys.executable, "-m", "benchmarks.memory_sites", f"--one={n}"]
        command.append(f"--rounds={args.rounds}")
        out = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout.splitlines()[-1]))
    a, b = runs
    span = large - small
    print(
        f"memory_sites: servers={small},{large} rounds={args.rounds} "
        f"traced_mb={a['traced'] / 1e6:.1f},{b['traced'] / 1e6:.1f} "
        f"bytes_a_server={(b['traced'] - a['traced']) / span:.0f}"
    )
    slopes = []
    for line in a["by_line"].keys() | b["by_line"].keys():
        size_a, count_a = a["by_line"].get(line, (0, 0))
        size_b, count_b = b["by_line"].get(line, (0, 0))
        slopes.append(((size_b - size_a) / span, (count_b - count_a) / span, line))
    for per_server, objects, line in sorted(slopes, reverse=True)[: args.top]:
        print(f"  {per_server:8.1f} B {objects:6.2f}  {line}")


if __name__ == "__main__":
    main()
