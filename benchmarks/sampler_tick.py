"""Sampler cost per tick: 20 kernels and 300 processes on simulated GPUs.

Starts real processes (20 "kernels" in their own sessions, each with two children, the rest
unrelated to the server), has every kernel hold simulated GPU memory, and times
``Sampler.measure`` (one GPU sample, one /proc scan, attribution, windows, the report).

    python -m benchmarks.sampler_tick [--ticks 200] [--kernels 20] [--processes 300] [--phases]
        [--threads 1] [--busy 0] [--forks]

Prints the median and p90 CPU milliseconds per tick (thread CPU time, the cost the server pays);
``--phases`` also the median CPU of each phase of a tick (the GPU sample, the ``/proc`` scan,
the targets' members, attribution, the CPU and I/O counters, the report), timed in the same run,
and what a sampler in a container adds where a GPU lists a process: the open files of the
kernels' processes read to find the GPUs' holders (``container_device_files_ms``; NVML's PIDs
are the host's there), with how many descriptors they had. ``--threads`` gives each kernel
that many threads, ``--busy`` has that many of them run a cell: a process that did not run
since the last tick has its threads and reads taken as they were, so idle kernels cost less than
busy ones. ``--forks`` starts a process between every two ticks, as on a busy host: ``/proc``
is listed only when a PID was allocated since the last tick, so this is the tick's worst case.
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
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from jupyter_gpu_gov.gpu import procs
from jupyter_gpu_gov.gpu.attribution import TargetRoot
from jupyter_gpu_gov.gpu.simulated import DEFAULT_DEVICES, SimulatedBackend
from jupyter_gpu_gov.server import sampler as sampler_module
from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

KERNEL = """
import os, subprocess, sys, threading, time
from jupyter_gpu_gov import simulate
simulate.hold(1024 + 10 * (os.getpid() % 50), device=int(sys.argv[1]))
children = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
for _ in range(int(sys.argv[2]) - 1):  # an ipykernel has a few (heartbeat, IOPub, control)
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("ready", flush=True)
while sys.argv[3] == "busy":  # a cell running: 2 ms of work every 20 ms
    until = time.perf_counter() + 0.002
    while time.perf_counter() < until:
        pass
    time.sleep(0.018)
time.sleep(600)
"""


def _timed(spent: list[float], function: Callable) -> Callable:
    def call(*args, **kwargs):
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent.append(time.thread_time() - started)

    return call


@contextmanager
def _phases_timed(sampler: Sampler, backend: SimulatedBackend) -> Iterator[dict[str, list]]:
    """Each phase of ``sampler``'s ticks timed while inside: thread CPU seconds by phase."""
    spent: dict[str, list[float]] = defaultdict(list)
    phases = [  # (owner, attribute, label); the functions are the sampler module's
        (backend, "sample", "gpu_sample"),
        (sampler._scanner, "scan", "proc_scan"),
        (sampler_module, "target_members", "members"),
        (sampler_module, "attribute", "attribute"),
        (sampler, "_cpu_io", "cpu_io"),
        (sampler, "_report", "report"),
    ]
    originals = [getattr(owner, name) for owner, name, _ in phases]
    for (owner, name, label), original in zip(phases, originals, strict=True):
        setattr(owner, name, _timed(spent[label], original))
    try:
        yield spent
    finally:
        for (owner, name, _), original in zip(phases, originals, strict=True):
            if owner is sampler_module:
                setattr(owner, name, original)
            else:
                del owner.__dict__[name]  # the class's method again


def _device_files_cost(roots: list[TargetRoot], repeat: int = 20) -> dict:
    """What a sampler in a container adds to a tick where a GPU lists a process: the open
    files of every process of the kernels read, to find the GPUs' holders (host PIDs)."""
    table = procs.scan()
    pids = set().union(*(table.descendants(root.pid) for root in roots))
    descriptors = sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids)
    spent = []
    for _ in range(repeat):
        started = time.thread_time()
        for pid in pids:
            procs.nvidia_device_files(pid)
        spent.append(time.thread_time() - started)
    return {
        "container_device_files_ms": round(statistics.median(spent) * 1000, 3),
        "descriptors": descriptors,
    }


def run(
    ticks: int,
    kernels: int,
    processes: int,
    phases: bool = False,
    threads: int = 1,
    busy: int = 0,
    forks: bool = False,
) -> dict:
    state = os.path.join(tempfile.mkdtemp(), "sim-gpus.json")
    os.environ["JUPYTER_GPU_GOV_SIM_STATE"] = state
    backend = SimulatedBackend(DEFAULT_DEVICES, state)
    spawned: list[subprocess.Popen] = []
    try:
        roots = []
        for k in range(kernels):
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    KERNEL,
                    str(k % 2),
                    str(threads),
                    "busy" if k < busy else "idle",
                ],
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
        cpu_ms, wall_ms, spent = [], [], {}
        with ExitStack() as timing:
            for tick in range(ticks):
                if phases and tick == 1:  # the first tick's own figure is printed apart
                    spent = timing.enter_context(_phases_timed(sampler, backend))
                if forks:  # a PID allocated since the last tick: /proc is listed again
                    subprocess.run(["true"], check=True)
                started = time.perf_counter()
                result = sampler.measure(targets, {"user": "bench"})
                wall_ms.append((time.perf_counter() - started) * 1000)
                cpu_ms.append(result.cpu_seconds * 1000)
        sampler.close()
        holding = sum(1 for t in result.report["targets"] if t["gpu"]["holds_context"])
        assert holding == kernels, f"only {holding} of {kernels} kernels attributed"
        quantiles = statistics.quantiles(cpu_ms, n=10)
        by_phase = {
            f"{label}_ms": round(statistics.median(seconds) * 1000, 3)
            for label, seconds in spent.items()
        }
        if phases:
            by_phase.update(_device_files_cost(roots))
        return {
            "kernels": kernels,
            "busy": busy,
            "threads": threads,
            "forks": forks,
            "processes_on_machine": len(os.listdir("/proc")),
            "ticks": ticks,
            "first_tick_cpu_ms": round(cpu_ms[0], 3),
            "cpu_ms_median": round(statistics.median(cpu_ms), 3),
            "cpu_ms_p90": round(quantiles[-1], 3),
            "wall_ms_median": round(statistics.median(wall_ms), 3),
            **by_phase,
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
    parser.add_argument("--phases", action="store_true", help="also each phase's median CPU")
    parser.add_argument("--threads", type=int, default=1, help="threads of each kernel")
    parser.add_argument(
        "--busy", type=int, default=0, help="kernels running a cell (2 ms of work every 20 ms)"
    )
    parser.add_argument(
        "--forks", action="store_true", help="a process started between every two ticks"
    )
    args = parser.parse_args(argv)
    figures = run(
        args.ticks,
        args.kernels,
        args.processes,
        args.phases,
        args.threads,
        args.busy,
        args.forks,
    )
    print("sampler tick:", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
