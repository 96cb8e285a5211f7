"""What reading kept reports costs: the reads a pass makes of a decided server's report, the
comparison ingest makes with the kept decision's, and the diagnosis's window, in one process.

    python -m benchmarks.report_reads [--reports 2000] [--repeats 7]

``--reports`` of ``benchmarks.ingest_load``'s reports, validated and kept as the governor keeps
them (``hub.ingest.compact_report``); each step's CPU (``time.thread_time_ns``: this thread's
only) per report, the median of ``--repeats`` (and the least). The pass's reads: ``gpu_signal``,
``user_last_activity``, ``_evidence`` three times (as ``_with_gpu``, ``_inputs`` twice), the
history's ``_reported``, the usage state, the gauges' pod, ``kernels_on_gpu``, the devices'
health (docs/benchmarks-history.md, "Issue 26, wave 14").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone

from jupyter_gpu_gov.core.report import gpu_signal, user_last_activity, validate
from jupyter_gpu_gov.diagnose.features import windows_from_report
from jupyter_gpu_gov.hub import history, outbound
from jupyter_gpu_gov.hub.evidence import Evidence, Received
from jupyter_gpu_gov.hub.ingest import compact_report
from jupyter_gpu_gov.hub.unchanged import same_report

from .ingest_load import encode, report_for

NOW = datetime(2026, 12, 3, tzinfo=timezone.utc)


def _pass_reads(report: Mapping) -> None:
    gpu_signal(report, idle_threshold=0.05, cull_action="stop-server")
    user_last_activity(report)
    for _ in range(3):
        Evidence._evidence(report, {}, {})
    history._reported(report)
    any(t["gpu"]["holds_context"] for t in report["targets"])
    server = report["server"]
    (server.get("namespace") or "", server.get("pod") or "")
    outbound.kernels_on_gpu(report)
    for device in report["devices"]:
        device.get("health"), device.get("parent_uuid") or device["uuid"]


def _kept(n: int) -> list:
    return [
        compact_report(validate(json.loads(encode(report_for(f"user{i}", i, NOW))), NOW))
        for i in range(n)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    reports, again = _kept(args.reports), _kept(args.reports)
    pairs = [(Received(a, NOW), Received(b, NOW)) for a, b in zip(reports, again, strict=True)]

    def timed(name: str, step: Callable[[], object]) -> str:
        runs = []
        for _ in range(args.repeats):
            started = time.thread_time_ns()
            step()
            runs.append((time.thread_time_ns() - started) / len(reports) / 1000)
        return f"{name}_us={statistics.median(runs):.1f} {name}_us_min={min(runs):.1f}"

    print(
        "report_reads:",
        f"reports={len(reports)}",
        timed("pass_reads", lambda: [_pass_reads(r) for r in reports]),
        timed("same_report", lambda: [same_report(a, b) for a, b in pairs]),
        timed("windows_from_report", lambda: [windows_from_report(r) for r in reports]),
    )


if __name__ == "__main__":
    main()
