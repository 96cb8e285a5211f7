"""NVML calls per tick: what ``NvmlBackend.sample()`` asks the driver, on the fake driver.

    python -m benchmarks.nvml_calls [--ticks 20] [--by-function]

No GPU needed: the backend runs against ``tests/fake_pynvml.py`` (the real ``pynvml`` over a
fake ``libnvidia-ml.so.1``), which counts the C functions called, pynvml's two-call dance as two.
For three hosts (an H200 with MIG off and four processes running kernels, as measured in
``benchmarks.nvml_latency``; eight such GPUs; an H100 in MIG mode with seven instances) it
prints the calls of the first tick (which names every device) and of a steady tick (the
median of ``--ticks``), and the thread CPU of a steady ``sample()``: the Python around the
calls, pynvml's and the backend's, plus the fake's own (a real driver's C side is not in it).
On a GPU host ``benchmarks.nvml_latency`` counts the same calls against the real driver.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def hosts() -> dict[str, list]:
    from fake_pynvml import FakeGpu, FakeMig, FakeProcess

    def h200(i: int = 0, processes: int = 4) -> FakeGpu:
        return FakeGpu(
            f"GPU-h200-{i}",
            name="NVIDIA H200",
            memory_total_mb=143771,
            mig_capable=True,  # MIG off, as on the GPU benchmarks.nvml_latency ran on
            retired_pages_pending=None,  # Hopper: remapped rows instead
            minor_number=i,
            processes=[FakeProcess(1000 * (i + 1) + p, 1024, sm=0.3) for p in range(processes)],
            activity=0.6,
        )

    mig = FakeGpu(
        "GPU-h100-mig",
        name="NVIDIA H100 80GB HBM3",
        mig_capable=True,
        gpm=True,
        retired_pages_pending=None,
        migs=[
            FakeMig(
                f"MIG-{slot}",
                "1g.10gb",
                gpu_instance_id=7 + slot,
                memory_total_mb=9984,
                slot=slot,
                processes=[FakeProcess(500 + slot, memory_mb=None)],
                activity=0.25,
            )
            for slot in range(7)
        ],
    )
    return {
        "1 H200, 4 processes": [h200()],
        "8 H200, 4 processes each": [h200(i) for i in range(8)],
        "1 H100, 7 MIG instances": [mig],
    }


def run(ticks: int, by_function: bool) -> list[dict]:
    import pytest

    sys.path.insert(0, str(REPO / "tests"))
    from fake_pynvml import install

    from jupyter_gpu_gov.gpu.nvml import NvmlBackend

    rows = []
    for name, gpus in hosts().items():  # after the path: hosts() imports the fake too
        with pytest.MonkeyPatch.context() as monkeypatch:
            fake = install(monkeypatch, *gpus)
            backend = NvmlBackend()
            fake.advance()
            backend.sample()
            first = fake.calls.total()
            counts, cpus, steady = [], [], None
            for _ in range(ticks):
                fake.advance()
                fake.calls.clear()
                cpu = time.thread_time()
                snapshot = backend.sample()
                cpus.append(time.thread_time() - cpu)
                counts.append(fake.calls.total())
                steady = dict(fake.calls)
            assert snapshot.available and snapshot.samples, snapshot.error
            backend.close()
        row = {
            "host": name,
            "first_tick_calls": first,
            "steady_tick_calls": statistics.median_low(counts),
            "steady_sample_cpu_ms": round(statistics.median(cpus) * 1000, 3),
        }
        if by_function:
            row["steady_by_function"] = dict(sorted(steady.items()))
        rows.append(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--by-function", action="store_true")
    args = parser.parse_args(argv)
    for row in run(args.ticks, args.by_function):
        by_function = row.pop("steady_by_function", None)
        print(
            "nvml calls:",
            " ".join(f"{k}={v!r}" if k == "host" else f"{k}={v}" for k, v in row.items()),
        )
        for function, count in (by_function or {}).items():
            print(f"    {function:<48} {count}")


if __name__ == "__main__":
    main()
