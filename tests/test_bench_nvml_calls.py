"""``benchmarks/nvml_calls.py`` still runs and counts what docs/benchmarks.md says it counts: the
NVML C calls of a first and of a steady ``NvmlBackend.sample()`` on the fake driver."""

from __future__ import annotations

from benchmarks import nvml_calls


def test_the_benchmark_counts_a_first_and_a_steady_tick():
    rows = nvml_calls.run(ticks=3, by_function=True)
    assert [row["host"] for row in rows] == list(nvml_calls.hosts())
    for row in rows:
        steady = row["steady_by_function"]
        assert sum(steady.values()) == row["steady_tick_calls"] > 0
        assert "nvmlDeviceGetName" not in steady  # named on the first tick only
    whole, eight, _ = rows
    assert eight["steady_tick_calls"] == 1 + 8 * (whole["steady_tick_calls"] - 1)  # one count
