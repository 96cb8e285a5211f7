"""Sampler cost per tick: 20 kernels and 300 processes on simulated GPUs.

Starts real processes (20 "kernels" in their own sessions, each with two children, the rest
unrelated to the server), has every kernel hold simulated GPU memory, and times
``Sampler.measure`` (one GPU sample, one /proc scan, attribution, windows, the report).

    python -m benchmarks.sampler_tick [--ticks 200] [--kernels 20] [--processes 300]

Prints the median and p90 CPU milliseconds per tick (thread CPU time, the cost the server pays).
Targets (issue 26): median under 2 ms, first tick under 10 ms (the sampler reads every process
on the machine once at start-up, before it; the first tick then reads what is new).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from jupyter_gpu_gov.gpu.attribution import TargetRoot
from jupyter_gpu_gov.gpu.simulated import DEFAULT_DEVICES, SimulatedBackend
from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

KERNEL = """
import os, subprocess, sys, time
from jupyter_gpu_gov import simulate
simulate.hold(1024 + 10 * (os.getpid() % 50), device=int(sys.argv[1]))
children = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
print("ready", flush=True)
time.sleep(600)
"""


def run(ticks: int, kernels: int, processes: int) -> dict:
    state = os.path.join(tempfile.mkdtemp(), "sim-gpus.json")
    os.environ["JUPYTER_GPU_GOV_SIM_STATE"] = state
    backend = SimulatedBackend(DEFAULT_DEVICES, state)
    spawned: list[subprocess.Popen] = []
    try:
        roots = []
        for k in range(kernels):
            proc = subprocess.Popen(
                [sys.executable, "-c", KERNEL, str(k % 2)],
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            spawned.append(proc)
            roots.append(TargetRoot("kernel", f"k{k}", proc.pid))
        for proc in spawned:
            proc.stdout.readline()
        # The rest of the machine: processes that are not the server's (their launcher exits,
        # so they are re-parented to init, in a session of their own).
        others = max(0, processes - 3 * kernels)
        launcher = subprocess.Popen(
            ["sh", "-c", f"for i in $(seq {others}); do sleep 600 & done"],
            start_new_session=True,
        )
        launcher.wait()
        spawned.append(launcher)
        targets = [TargetInfo(root, name="python3", execution_state="idle") for root in roots]

        sampler = Sampler(lambda: backend)
        cpu_ms, wall_ms = [], []
        for _ in range(ticks):
            started = time.perf_counter()
            result = sampler.measure(targets, {"user": "bench"})
            wall_ms.append((time.perf_counter() - started) * 1000)
            cpu_ms.append(result.cpu_seconds * 1000)
        sampler.close()
        holding = sum(1 for t in result.report["targets"] if t["gpu"]["holds_context"])
        assert holding == kernels, f"only {holding} of {kernels} kernels attributed"
        quantiles = statistics.quantiles(cpu_ms, n=10)
        return {
            "kernels": kernels,
            "processes_on_machine": len(os.listdir("/proc")),
            "ticks": ticks,
            "first_tick_cpu_ms": round(cpu_ms[0], 3),
            "cpu_ms_median": round(statistics.median(cpu_ms), 3),
            "cpu_ms_p90": round(quantiles[-1], 3),
            "wall_ms_median": round(statistics.median(wall_ms), 3),
        }
    finally:
        for proc in spawned:
            try:
                os.killpg(proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        for proc in spawned:
            proc.wait()
        os.unlink(state)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--kernels", type=int, default=20)
    parser.add_argument("--processes", type=int, default=300)
    args = parser.parse_args(argv)
    figures = run(args.ticks, args.kernels, args.processes)
    print("sampler tick:", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
