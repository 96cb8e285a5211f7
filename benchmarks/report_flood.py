"""One caller flooding the report route with the largest valid reports (docs/benchmarks-history.md,
"Report budget"): the service's CPU for the flood, what it took and refused, and how long
another user's reports waited meanwhile, without a budget (as before) and with the default.

    .venv/bin/python -m benchmarks.report_flood [--reports 200] [--targets 1000]

The real service in this process (its ``make_server``: the report route, HubOAuth against the
tests' fake Hub over HTTP, a SQLite store); the client's CPU is in the figure too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _big_report(report_of, user: str, targets: int) -> bytes:
    report = json.loads(report_of(user))
    target = report["targets"][0]
    report["targets"] = [dict(target, id=f"{target['id'][:-4]}{n:04d}") for n in range(targets)]
    return json.dumps(report).encode()


async def _flood(settings: dict, label: str, reports: int, targets: int) -> None:
    import pytest
    from test_report_budget import ALICE, BOB, post, report_of, service

    patch = pytest.MonkeyPatch()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with service(Path(tmp), patch, **settings) as (url, _, _):
                body = _big_report(report_of, "alice", targets)
                codes: list[int] = []
                waits: list[float] = []

                async def flood() -> None:
                    for _ in range(reports):
                        codes.append((await post(url, ALICE, body)).code)

                async def other() -> None:
                    for _ in range(20):
                        sent = time.perf_counter()
                        assert (await post(url, BOB, report_of("bob"))).code == 200
                        waits.append((time.perf_counter() - sent) * 1000)
                        await asyncio.sleep(0.05)

                cpu, start = time.process_time(), time.perf_counter()
                await asyncio.gather(flood(), other())
                wall, used = time.perf_counter() - start, time.process_time() - cpu
    finally:
        patch.undo()
    counted = {code: codes.count(code) for code in sorted(set(codes))}
    print(
        f"{label}: {reports} reports of {len(body):,} B, answers {counted}, "
        f"process CPU {used * 1000:,.0f} ms in {wall:.2f} s; "
        f"another user's report p50 {statistics.median(waits):.1f} ms, max {max(waits):.1f} ms"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=200, help="reports in the flood")
    parser.add_argument("--targets", type=int, default=1000, help="targets in each report")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))

    async def both() -> None:
        await _flood({"report_budget": 0}, "no budget", args.reports, args.targets)
        await _flood({}, "default budget", args.reports, args.targets)

    asyncio.run(both())


if __name__ == "__main__":
    main()
