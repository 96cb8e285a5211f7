"""Run the benchmarks and print their figures: ``python -m benchmarks [--full]``.

The quick set (the default, ``make bench``) takes about 4 minutes on 2 cores; ``--full``
(``make bench-full``) runs the sizes docs/benchmarks.md reports, about 15 minutes.
"""

import argparse
import time
from pathlib import Path

from . import (
    admission,
    cluster_read,
    diagnose,
    gpu_faults,
    history_export,
    ingest,
    kernel_overhead,
    nvml_calls,
    queue_line,
    reconcile,
    sampler_tick,
)
from .replay import score as reclamation_replay

H200_RUNS = sorted(str(p) for p in (Path(__file__).parent / "data").glob("gpu-faults-*.csv"))
QUICK = [
    (sampler_tick, []),  # 20 kernels, 300 processes
    (nvml_calls, []),  # NVML calls a tick, on the fake driver
    (reconcile, []),  # 2,000 servers
    (admission, []),  # 10,000 started servers
    (queue_line, []),  # 100 servers holding GPUs, 200 requests in line
    # The cluster's room at the queue sync: 2,000 servers' pods on 200 GPU nodes, 100 waiting.
    (queue_line, ["--room", "--servers=2000", "--nodes=200", "--waiting=100"]),
    (diagnose, ["--quick"]),  # eight worlds of 60 servers, tuned on each, one round
    (gpu_faults, ["score", *H200_RUNS]),  # the windows measured on an H200, scored
    (reclamation_replay, []),  # 40 users, 30 days, a sample every 5 minutes
    (history_export, ["--servers=2000", "--repeat=1"]),  # the history of 2,000 servers, a day
    (ingest, []),  # 2,000 servers, 15 s at the steady rate
    # Amplified: a tick every 0.1 s (50x the default), kernel and sampler on one core.
    (kernel_overhead, ["--runs=3", "--seconds=2", "--interval=0.1", "--one-core"]),
]
FULL = [
    (sampler_tick, []),
    (nvml_calls, []),
    (reconcile, ["--servers=10000"]),
    (admission, []),
    (queue_line, ["--held=500", "--waiting=1000"]),
    (queue_line, ["--room", "--servers=10000", "--nodes=1000", "--waiting=100"]),
    (cluster_read, []),  # 1,000 nodes, 30,000 pods: the hub's reading of the cluster
    (diagnose, []),
    (gpu_faults, ["score", *H200_RUNS]),
    (reclamation_replay, ["--step=60"]),  # the governor's reconcile cadence
    (history_export, ["--repeat=1"]),  # 10,000 servers x 1 day
    (ingest, ["--servers=10000", "--seconds=60"]),
    (kernel_overhead, ["--runs=7", "--seconds=5"]),  # the default 5 s interval
    (kernel_overhead, ["--runs=7", "--seconds=5", "--interval=0.1", "--one-core"]),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full sizes (about 15 min)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    for module, module_argv in FULL if args.full else QUICK:
        module.main(module_argv)
    print(f"benchmarks: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
