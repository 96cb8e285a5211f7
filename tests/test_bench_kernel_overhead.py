"""Smoke test of ``benchmarks/kernel_overhead.py``: a real kernel runs the loop in both
conditions and the sampler attributes it while it does. No timing assertions."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's benchmarks/

from benchmarks import kernel_overhead


def test_kernel_overhead_benchmark_runs_both_conditions():
    figures = kernel_overhead.run(runs=2, seconds=0.3, interval=0.05)
    assert len(figures["off_s"].split(",")) == len(figures["on_s"].split(",")) == 2
    assert figures["off_s_median"] > 0 and figures["on_s_median"] > 0
    assert figures["ticks"] > 0 and figures["tick_cpu_ms_median"] > 0  # it ticked, attributed
