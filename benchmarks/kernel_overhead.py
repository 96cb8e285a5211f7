"""Overhead on the notebook: a CPU-bound cell with and without the sampler ticking alongside.

    python -m benchmarks.kernel_overhead [--runs 5] [--seconds 5] [--interval 5] [--one-core]

A real ipykernel (started by jupyter_client, as the server starts kernels) holds simulated GPU
memory and runs a pure-Python loop calibrated to take about ``--seconds``; the kernel times the
loop itself. This process stands for the Jupyter server: its sampler thread runs
``Sampler.measure`` every ``--interval`` seconds (the server extension's ``sample_interval``,
5 s by default; shorter amplifies the cost) on that kernel, with the same backend, /proc scan
and attribution as in a server. Runs alternate (off, on, on, off, ...) so drift hits both; the
figures are each condition's median and their ratio, and the sampler's CPU as a share of the
"on" runs' time: the most it can slow the kernel, a bound that holds however noisy the machine
(the run-to-run spread on a shared 2-core machine is far larger). ``--one-core`` pins the
kernel and the sampler to one CPU, as in a pod with a one-core limit: there the sampler's CPU
is taken from the kernel's, which is the worst case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import threading

from jupyter_client.manager import start_new_kernel

from jupyter_gpu_gov.gpu.attribution import TargetRoot
from jupyter_gpu_gov.gpu.simulated import DEFAULT_DEVICES, SimulatedBackend
from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

SETUP = """
import time
from jupyter_gpu_gov import simulate
simulate.hold(20480, device=0)

def spin(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total

def timed(n):
    started = time.perf_counter()
    spin(n)
    return time.perf_counter() - started

n = int(1_000_000 * 0.3 / timed(1_000_000))  # about 0.3 s, once warm
print(round(max(n / timed(n) for _ in range(3))))  # iterations per second, least disturbed
"""


class Kernel:
    def __init__(self, cpu: int | None):
        self.manager, self.client = start_new_kernel(
            kernel_name="python3",
            stderr=subprocess.DEVNULL,  # its start-up warnings
        )
        self.pid = self.manager.provisioner.pid
        if cpu is not None:
            os.sched_setaffinity(self.pid, {cpu})
        self.rate = float(self.run(SETUP))

    def run(self, code: str) -> str:
        out: list[str] = []

        def hook(message: dict) -> None:
            if message["msg_type"] == "stream":
                out.append(message["content"]["text"])

        reply = self.client.execute_interactive(code, output_hook=hook, timeout=600)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the kernel failed: {reply['content']}")
        return "".join(out).strip()

    def timed(self, iterations: int) -> float:
        return float(self.run(f"print(timed({iterations}))"))

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


class Ticking:
    """The server extension's sampler on its own thread, every ``interval`` seconds."""

    def __init__(self, sampler: Sampler, target: TargetInfo, interval: float):
        self.sampler, self.target, self.interval = sampler, target, interval
        self.cpu_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            result = self.sampler.measure([self.target], {"user": "bench"})
            assert result.report["targets"][0]["gpu"]["holds_context"], "kernel not attributed"
            self.cpu_s.append(result.cpu_seconds)

    def __enter__(self) -> Ticking:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(runs: int = 5, seconds: float = 5.0, interval: float = 5.0, one_core: bool = False):
    cpu = min(os.sched_getaffinity(0)) if one_core else None
    saved_affinity = os.sched_getaffinity(0)
    state = os.path.join(tempfile.mkdtemp(prefix="bench-kernel-"), "sim-gpus.json")
    saved_state = os.environ.get("JUPYTER_GPU_GOV_SIM_STATE")
    os.environ["JUPYTER_GPU_GOV_SIM_STATE"] = state  # the kernel inherits it
    kernel = None
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})  # this thread, and the sampler thread it starts
        sampler = Sampler(lambda: SimulatedBackend(DEFAULT_DEVICES, state))
        kernel = Kernel(cpu)
        target = TargetInfo(TargetRoot("kernel", "k0", kernel.pid), name="python3")
        iterations = int(kernel.rate * seconds)
        kernel.timed(iterations)  # warm-up, unmeasured
        off, on, tick_cpu = [], [], []
        for r in range(runs):
            for sampling in (False, True) if r % 2 == 0 else (True, False):
                if not sampling:
                    off.append(kernel.timed(iterations))
                    continue
                with Ticking(sampler, target, interval) as ticking:
                    on.append(kernel.timed(iterations))
                tick_cpu += ticking.cpu_s
        sampler.close()
    finally:
        if kernel is not None:
            kernel.close()
        os.sched_setaffinity(0, saved_affinity)
        if saved_state is None:
            os.environ.pop("JUPYTER_GPU_GOV_SIM_STATE", None)
        else:
            os.environ["JUPYTER_GPU_GOV_SIM_STATE"] = saved_state
        if os.path.exists(state):
            os.unlink(state)
    off_s, on_s = statistics.median(off), statistics.median(on)
    pair_ratios = [a / b for a, b in zip(on, off, strict=True)]
    return {
        "runs": runs,
        "interval_s": interval,
        "one_core": one_core,
        "off_s_median": round(off_s, 3),
        "on_s_median": round(on_s, 3),
        "ratio": round(on_s / off_s, 4),
        # Each on run against the off run next to it: drift between pairs cancels out.
        "pair_ratio_median": round(statistics.median(pair_ratios), 4),
        "off_s": ",".join(f"{s:.3f}" for s in off),
        "on_s": ",".join(f"{s:.3f}" for s in on),
        "ticks": len(tick_cpu),
        "tick_cpu_ms_median": round(1000 * statistics.median(tick_cpu), 3) if tick_cpu else None,
        # The most the sampler can slow the kernel by: all its CPU taken from the kernel's.
        "sampler_cpu_share": round(sum(tick_cpu) / sum(on), 5),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each condition")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one run")
    parser.add_argument("--interval", type=float, default=5.0, help="sampler interval, seconds")
    parser.add_argument("--one-core", action="store_true", help="kernel and sampler on one CPU")
    args = parser.parse_args(argv)
    figures = run(args.runs, args.seconds, args.interval, args.one_core)
    print("kernel overhead:", " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
