"""What typing the report costs: ``core.report.validate`` (the dict the governor keeps) against
``core.wire.Report.from_json`` (validation, then frozen dataclasses) and ``to_json``, per report.

    python -m benchmarks.wire [--reports 2000] [--repeat 5]

Reports are ``benchmarks.ingest_load.report_for``'s (one or two devices, two to four kernels, a
terminal on every fourth), the mix the ingest benchmark sends; figures are the median of
``--repeat`` runs over all of them, in microseconds per report (docs/benchmarks-history.md, "The
typed report on the hot path").
"""

from __future__ import annotations

import argparse
import statistics
import time

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.report import validate
from jupyter_gpu_gov.core.wire import Report

from .ingest_load import report_for


def per_report(step, reports: list, repeat: int) -> float:
    """Median over ``repeat`` runs of ``step`` over every report, in µs per report."""
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        for report in reports:
            step(report)
        runs.append((time.perf_counter() - started) / len(reports) * 1e6)
    return statistics.median(runs)


def run(reports: int = 2000, repeat: int = 5) -> dict[str, float]:
    now = clock.utcnow()
    dicts = [report_for(f"user{k}", k, now) for k in range(reports)]
    typed = [Report.from_json(d, now) for d in dicts]
    assert all(t.to_json() == Report.from_json(t.to_json(), now).to_json() for t in typed[:50])
    return {
        "validate (dict), µs": per_report(lambda d: validate(d, now), dicts, repeat),
        "Report.from_json (typed), µs": per_report(
            lambda d: Report.from_json(d, now), dicts, repeat
        ),
        "Report.to_json, µs": per_report(lambda t: t.to_json(), typed, repeat),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    figures = run(args.reports, args.repeat)
    print(f"typed report, {args.reports} reports, median of {args.repeat}:")
    for name, value in figures.items():
        print(f"  {name:<32} {value:8.1f}")


if __name__ == "__main__":
    main()
