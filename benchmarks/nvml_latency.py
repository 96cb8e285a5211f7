"""One GPU sample through NVML against ``nvidia-smi``, and the sampler's tick on a real driver.

    python -m benchmarks.nvml_latency [--samples 50] [--smi 10] [--holders 4] [--ticks 30]

Needs an NVIDIA driver (and PyTorch for the holders). Starts ``--holders`` processes that each
hold 1 GiB and run matrix products now and then, as kernels on a shared card would, so the
process lists and per-process utilisation have something to report. Then times

- ``NvmlBackend.sample()``: what the server extension asks the driver every tick (devices,
  memory, utilisation, processes and their SM samples), wall time and thread CPU; then, in as
  many more samples, the NVML C calls each makes and the time spent in each C function (the
  calls ``benchmarks.nvml_calls`` counts on the fake driver), to show which of them cost;
- ``nvidia-smi`` asked for the same (``--query-gpu`` and ``--query-compute-apps``), as a tool
  that shells out to it would;
- ``Sampler.measure`` with the holders as kernels: the whole tick (GPU sample, ``/proc`` scan,
  attribution, CPU and I/O counters, report), thread CPU as ``benchmarks.sampler_tick``
  measures it on simulated GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

HOLDER = """
import time, torch
x = torch.empty(256 * 1024 * 1024, device="cuda")  # 1 GiB
a = torch.randn(2048, 2048, device="cuda")
torch.cuda.synchronize()
print("READY", flush=True)
while True:
    for _ in range(20):
        a = (a @ a).tanh_()
    torch.cuda.synchronize()
    time.sleep(0.05)
"""


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def _p90_ms(values: list[float]) -> float:
    return round(statistics.quantiles(values, n=10)[-1] * 1000, 3)


@contextmanager
def c_calls() -> Iterator[dict[str, list]]:
    """Every NVML C function called inside, by name: ``[calls, seconds]`` (pynvml's two-call
    dance counts two)."""
    import pynvml

    seen: dict[str, list] = {}
    lookup = pynvml._nvmlGetFunctionPointer

    def timed(name: str):
        function = lookup(name)
        if name == "nvmlErrorString":
            return function  # pynvml sets its restype, which a wrapper would not pass on

        def call(*args):
            started = time.perf_counter()
            try:
                return function(*args)
            finally:
                entry = seen.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - started

        return call

    pynvml._nvmlGetFunctionPointer = timed
    try:
        yield seen
    finally:
        pynvml._nvmlGetFunctionPointer = lookup


def run(samples: int, smi: int, holders: int, ticks: int) -> dict:
    from jupyter_gpu_gov.gpu.attribution import TargetRoot
    from jupyter_gpu_gov.gpu.nvml import NvmlBackend
    from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

    children = [
        subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
        for _ in range(holders)
    ]
    try:
        for child in children:
            if child.stdout.readline().strip() != "READY":
                raise SystemExit("a holder did not start (no CUDA?)")
        backend = NvmlBackend()
        snapshot = backend.sample()  # opens NVML, learns the devices
        if snapshot.backend != "nvml":
            raise SystemExit(f"NVML is not available here: {snapshot.error}")
        walls, cpus = [], []
        for _ in range(samples):
            wall, cpu = time.perf_counter(), time.thread_time()
            snapshot = backend.sample()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.thread_time() - cpu)
            time.sleep(0.05)
        processes = sum(len(s.processes) for s in snapshot.samples.values())
        with c_calls() as calls:
            for _ in range(samples):
                backend.sample()
                time.sleep(0.05)
        backend.close()
        # the costliest C functions, microseconds a sample (and calls a sample)
        costliest = sorted(calls.items(), key=lambda item: -item[1][1])[:8]
        per_function = {
            name: f"{seconds / samples * 1e6:.0f} us ({count / samples:g})"
            for name, (count, seconds) in costliest
        }

        query = [
            "nvidia-smi",
            "--query-gpu=uuid,name,memory.total,memory.used,utilization.gpu,utilization.memory",
            "--format=csv,noheader,nounits",
        ]
        apps = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"]
        smi_walls = []
        for _ in range(smi):
            wall = time.perf_counter()
            subprocess.run(query, check=True, capture_output=True)
            subprocess.run(apps, check=True, capture_output=True)
            smi_walls.append(time.perf_counter() - wall)

        sampler = Sampler(NvmlBackend, window_seconds=60.0)
        targets = [
            TargetInfo(TargetRoot("kernel", str(i), child.pid), f"holder {i}", "busy")
            for i, child in enumerate(children)
        ]
        server = {"user": "bench", "name": "", "last_activity": None, "gpu_allocated": True}

        async def tick_cpu_seconds() -> list[float]:
            spent = []
            for _ in range(ticks + 1):
                spent.append((await sampler.tick(targets, server)).cpu_seconds)
                await asyncio.sleep(0.1)
            return spent

        tick_cpu = asyncio.run(tick_cpu_seconds())
        sampler.close()
        return {
            "gpu": snapshot.devices[0].name if snapshot.devices else None,
            "processes_listed": processes,
            "nvml_sample_wall_ms": _median_ms(walls),
            "nvml_sample_wall_p90_ms": _p90_ms(walls),
            "nvml_sample_cpu_ms": _median_ms(cpus),
            "nvml_calls_per_sample": sum(count for count, _ in calls.values()) / samples,
            "nvml_c_time_per_sample_ms": round(
                sum(seconds for _, seconds in calls.values()) / samples * 1000, 3
            ),
            **{f"  {name}": cost for name, cost in per_function.items()},
            "nvidia_smi_wall_ms": _median_ms(smi_walls) if smi_walls else None,
            "ratio_smi_over_nvml": (
                round(statistics.median(smi_walls) / statistics.median(walls))
                if smi_walls
                else None
            ),
            "sampler_tick_cpu_ms": _median_ms(tick_cpu[1:]),  # the first tick reads every process
            "sampler_tick_cpu_p90_ms": _p90_ms(tick_cpu[1:]),
        }
    finally:
        for child in children:
            child.kill()
            child.wait()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--smi", type=int, default=10)
    parser.add_argument("--holders", type=int, default=4)
    parser.add_argument("--ticks", type=int, default=30)
    args = parser.parse_args(argv)
    for key, value in run(args.samples, args.smi, args.holders, args.ticks).items():
        print(f"{key:<42} {value}")


if __name__ == "__main__":
    main()
