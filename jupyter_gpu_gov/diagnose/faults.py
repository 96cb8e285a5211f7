"""Fault-injection simulator: diagnosis windows (docs/architecture.md, "Diagnosis windows")
with a known root cause.

    python -m jupyter_gpu_gov.diagnose.faults --servers 300 --seed 1 > windows.jsonl

Each simulated server runs one workload on one node for ``windows_per_server`` windows of 60 s.
Its rows carry ``truth``: the workload's *primary* cause (one of ``labels.LABELS``), or
``unknown`` for a window whose ``sm_active`` is missing (the only right answer there). The
scenarios are one per label, drawn in equal numbers.

How a window is made
--------------------
A running workload is a loop of steps. Per step the GPU computes for one time unit and the
step also spends, where the GPU has nothing to do,

- ``io``:     exposed input time (the loop waits for the next batch),
- ``cpu``:    exposed CPU work in the loop (Python preprocessing, host-side metrics, ...),
- ``launch``: gaps between kernels (launch latency and synchronisation of small kernels),

so the GPU is busy ``b = 1 / (1 + io + cpu + launch)`` of the time. While its kernels run the SMs
are occupied ``occ`` (grid size, tails), DRAM is busy ``dram_i`` and the tensor pipes
``tensor_i``. What a window reports is a time average, times the node's card scale, plus noise:

- ``sm_active = node.sm * occ * b`` on nodes with DCGM (``node.sm``: what a well-fed job reads
  on that card, 0.70-0.95: SM activity rarely saturates); on nodes with NVML only it is NVML's
  utilisation, the share of time *any* kernel runs, which cannot see occupancy:
  ``node.sm * b``;
- ``gr_active = b``: DCGM's ``GR_ENGINE_ACTIVE`` (the share of time the graphics/compute engine
  runs a kernel), on nodes with DCGM only;
- ``dram_active = node.dram * dram_i * b``, ``tensor_active = node.tensor * tensor_i * b``,
  ``pcie_mb_s = node.pcie * pcie_full * b``: DCGM counters, proportional to throughput;
- on nodes without DCGM, ``dram_active`` is NVML's memory utilisation instead (what the
  service then reads, from the report's ``devices[].memory_activity``): the share of *time*
  device memory was read or written, ``b * (1 - exp(-dram_i / NVML_MEMORY_SATURATION))``.
  Any traffic in a sample period counts, so it rises steeply with a little traffic and
  saturates long before the memory interface does (0.2 of the interface reads about 0.43, 0.9
  about 0.92). The curve is a plausible model of a time-based measure, not a measured one:
  NVML documents what it means, not how it relates to bandwidth; it knows no card scale;
- ``read_mb_s = demand * uncached * b``: the data the loop consumes, minus the page cache;
- ``cpu_cores``: the main thread (busy during ``cpu`` and ``launch``, part of the load time
  when it decodes its own batches, and — with CUDA's default spin-wait — much of the GPU
  time) plus DataLoader workers (each busy in proportion to throughput);
- ``cpu_iowait``: the share of the window the process *tree* waits on block I/O, summed over
  its processes and capped at 1, as the server extension measures it. It includes the waits of
  prefetching workers that the GPU never sees, and only part of the waits on network file
  systems (NFS and FUSE reads are not block I/O);
- ``gpu_mem_frac``: the workload's memory, held for the whole session by the allocator cache:
  1-90 % of the card, log-uniform, whatever the cause (the model's size decides it more than
  the batch: on an H200 a healthy bf16 training loop held 1.4 %, a tiny-batch one 0.6 %).

The scenarios (``_job``), with the ranges drawn per server:

``healthy``
    small overheads (each 0-0.06 of the GPU time), ``occ`` 0.85-1; 0-8 DataLoader workers;
    ``tensor_i`` 0.3-0.8 when the model uses tensor cores (three in four), else below 0.08
    (fp32 without TF32); a third are interactive sessions that alternate runs of 4-15 windows
    with 1-6 windows of thinking (kernel idle, user active in the last ten minutes).
``zombie``
    a session whose owner left: memory held (sometimes only a CUDA context, 0.5-2 %), no GPU
    work, kernel idle, ``user_idle_s`` from 0.8x to 6x ``rules.ZOMBIE_IDLE_S`` and growing.
``data_io``
    ``io`` 0.8-4 (a DataLoader with no or too few workers over slow reads): seven in ten have
    no worker, and the main thread decodes 10-40 % of the load time itself; the others have one
    or two workers stuck on reads. Half the servers read a network file system, where only
    20-60 % of the wait is visible as block I/O.
``cpu_serial``
    ``cpu`` 0.8-4 (a Python loop between GPU steps); a quarter run multi-threaded NumPy/pandas
    (1.2-3 cores instead of one).
``memory_bandwidth``
    an unfused elementwise mix: ``dram_i`` 0.6-0.95, ``tensor_i`` below 0.15, ``occ`` 0.7-0.9,
    and the many short kernels leave ``launch`` gaps of 0.15-0.6.
``small_work``
    tiny batches: ``launch`` 1-5, ``occ`` 0.3-0.65, ``dram_i`` 0.05-0.3, tensor use a fifth to a
    half of a big batch's.

While a workload runs, its owner touches the server in 2-30 % of the windows (a per-server
chance); ``user_idle_s`` grows in between.

Mixed causes: half the non-healthy servers (and a third of the healthy ones, mildly) also have
a *secondary* cause drawn from the other four, weaker than the primary (an overhead 15-50 % of
the primary's, or a moderately memory-bound mix) — the truth stays the primary.

Phases: a warm-up of 0-3 windows (model load and compile: reads and I/O wait, a busy core, the
GPU ramping up) and, every 10-30 windows, an evaluation or checkpoint pause (the GPU drops to
20-80 % for a window; evaluation loads more data, a checkpoint serialises on one core and
writes). The truth of those windows is still the primary cause: they are part of what a
per-window diagnosis gets wrong.

Nodes (``NODES``; ``HELD_OUT_NODE`` is a configuration apart, ``--held-out`` on the command line)
differ in card scale for SM, DRAM, tensor and PCIe readings, CPU cores, and in what they can
measure: nodes without DCGM have no ``gr_active``, ``dram_active``, ``tensor_active`` or ``pcie_mb_s``; a MIG
node has no tensor counter; nodes whose kernel runs without delay accounting have no
``cpu_iowait``. Per window, each CPU column is missing 2 % of the time (a process exited
mid-window), ``user_idle_s`` 1 %, ``gpu_mem_frac`` and ``sm_active`` 0.5 %, a DCGM scrape 3 %;
a tenth of the servers never have ``read_mb_s`` (``/proc/<pid>/io`` unreadable) and a tenth
run from a terminal (``kernel_busy`` missing).

Version 3 changed only what nodes without DCGM measure: NVML's memory utilisation, which every
whole GPU reports without DCGM (``nvmlDeviceGetUtilizationRates(...).memory``, nvidia-smi's
Memory-Util), as their ``dram_active``; its extra random draw shifts every later draw, so the
same seed gives other servers than in version 2. MIG instances have no utilisation rates: the
MIG node has DCGM here, so it is not affected.

Version 4 changed only the memory a workload holds: it was 25-95 % of the card, and 3-45 % for
tiny batches, so memory alone told ``small_work`` apart (86 % balanced accuracy); measured on an
H200 (``benchmarks/gpu_faults.py``) a healthy loop held 1.4 %, so memory is now drawn the same
way whatever the cause. Same seeds, other servers than in version 3.

Limits, stated so a reader can judge: one cause per server, constant for its life; no
multi-GPU jobs, no time-shared GPUs, no network (NCCL) waits, no host memory pressure; the
noise is independent per window (real counters are autocorrelated); the card scales are
plausible, not measured. The scenario ranges were written from the mechanisms above before the
model was evaluated on them, and have not been tuned to its results. Version 2 changed only what
nodes measure (``gr_active`` where there is DCGM; NVML's time-based utilisation as ``sm_active``
where there is not), to match what dcgm-exporter and NVML report.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .features import COLUMNS, Window
from .labels import (
    CPU_SERIAL,
    DATA_IO,
    HEALTHY,
    LABELS,
    MEMORY_BANDWIDTH,
    SMALL_WORK,
    UNKNOWN,
    ZOMBIE,
)
from .rules import ZOMBIE_IDLE_S

WINDOW_S = 60.0


@dataclass(frozen=True)
class Node:
    name: str
    card: str  # what it stands for, for readers
    sm: float  # SM activity a well-fed job reads on this card and metric source
    dram: float = 1.0  # scale of DRAM activity for the same work
    tensor: float = 1.0
    pcie: float = 1.0
    dcgm: bool = True  # dram_active, tensor_active, pcie_mb_s measured
    tensor_metric: bool = True
    iowait: bool = True  # delay accounting on: cpu_iowait measured
    cores: int = 16


NODES: tuple[Node, ...] = (
    Node("h100-sxm", "H100 SXM5, DCGM", sm=0.95, dram=1.0, tensor=1.0, pcie=1.0, cores=32),
    Node("h100-pcie", "H100 PCIe, DCGM", sm=0.92, dram=0.9, tensor=0.95, pcie=0.6, cores=16),
    Node(
        "a100-sxm",
        "A100 80GB, DCGM, kernel without delay accounting",
        sm=0.88,
        dram=1.15,
        tensor=0.85,
        pcie=0.8,
        iowait=False,
        cores=32,
    ),
    Node(
        "a100-mig",
        "A100 MIG 3g.40gb, DCGM without the tensor pipe counter",
        sm=0.72,
        dram=1.1,
        pcie=0.5,
        tensor_metric=False,
        cores=8,
    ),
    Node("l40s", "L40S, NVML only (no DCGM)", sm=0.85, dcgm=False, cores=16),
    Node(
        "rtx-ws",
        "RTX 6000 Ada workstation, NVML only, no delay accounting",
        sm=0.78,
        dcgm=False,
        iowait=False,
        cores=8,
    ),
    Node("v100", "V100 32GB, DCGM", sm=0.82, dram=1.3, tensor=0.7, pcie=0.45, cores=8),
)

HELD_OUT_NODE = Node(
    "gh200",
    "GH200, DCGM, no delay accounting (not in NODES: an unseen configuration)",
    sm=0.9,
    dram=0.8,
    tensor=1.15,
    pcie=1.6,
    iowait=False,
    cores=64,
)

OVERHEAD_LABELS = (DATA_IO, CPU_SERIAL, SMALL_WORK)
CAUSES = (DATA_IO, CPU_SERIAL, MEMORY_BANDWIDTH, SMALL_WORK)

P_MISSING_CPU = 0.02
P_MISSING_IDLE = 0.01
P_MISSING_SM = 0.005
P_MISSING_MEM = 0.005
P_MISSING_SCRAPE = 0.03

# NVML's memory utilisation (nodes without DCGM): the share of time device memory was read or
# written, ``b * (1 - exp(-dram_i / NVML_MEMORY_SATURATION))``.
NVML_MEMORY_SATURATION = 0.35


@dataclass
class _Job:
    label: str
    node: Node
    occ: float
    dram_i: float
    tensor_i: float
    pcie_full: float  # MB/s at full speed
    demand: float  # MB/s of input at full speed
    uncached: float
    mem: float
    workers: int
    worker_util: float
    worker_wait: float  # each worker's share of time in block I/O
    spin: float  # share of the GPU time the main thread spins in synchronisation
    io: float = 0.0
    cpu: float = 0.0
    launch: float = 0.0
    decode: float = 0.0  # share of io the main thread spends decoding (CPU)
    visible: float = 1.0  # share of the main thread's read wait that is block I/O
    extra_threads: float = 0.0  # cores of multi-threaded CPU work besides the main thread
    interactive: bool = False
    terminal: bool = False  # no kernel: kernel_busy missing
    reads_known: bool = True


def _u(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)


def _job(rng: random.Random, label: str, node: Node) -> _Job:
    uses_tensor = rng.random() < 0.75
    has_data = rng.random() < 0.7
    job = _Job(
        label=label,
        node=node,
        occ=_u(rng, 0.85, 1.0),
        dram_i=_u(rng, 0.2, 0.5),
        tensor_i=_u(rng, 0.3, 0.8) if uses_tensor else _u(rng, 0.0, 0.08),
        pcie_full=0.0,
        demand=math.exp(_u(rng, math.log(10), math.log(400))) if has_data else 0.0,
        uncached=_u(rng, 0.3, 1.0),
        mem=math.exp(_u(rng, math.log(0.01), math.log(0.9))),
        workers=rng.randint(2, 8) if rng.random() < 0.7 else 0,
        worker_util=_u(rng, 0.3, 0.9),
        worker_wait=_u(rng, 0.0, 0.08),
        spin=_u(rng, 0.6, 0.95) if rng.random() < 0.6 else _u(rng, 0.05, 0.3),
        io=_u(rng, 0.0, 0.06),
        cpu=_u(rng, 0.0, 0.06),
        launch=_u(rng, 0.0, 0.06),
        decode=_u(rng, 0.1, 0.4),
        terminal=rng.random() < 0.1,
        reads_known=rng.random() < 0.9,
    )
    job.workers = min(job.workers, node.cores - 1)
    job.pcie_full = job.demand * _u(rng, 1.0, 6.0) + _u(rng, 20.0, 300.0)

    primary = 0.0  # the primary cause's overhead, to keep the secondary weaker
    if label == HEALTHY:
        job.interactive = rng.random() < 1 / 3
        job.terminal = job.terminal and not job.interactive
    elif label == DATA_IO:
        job.io = primary = _u(rng, 0.8, 4.0)
        job.workers = 0 if rng.random() < 0.7 else rng.randint(1, 2)
        job.demand = max(job.demand, math.exp(_u(rng, math.log(20), math.log(400))))
        job.uncached = _u(rng, 0.7, 1.0)
        if rng.random() < 0.5:  # a network file system: little of the wait is block I/O
            job.visible = _u(rng, 0.2, 0.6)
            job.worker_wait = _u(rng, 0.1, 0.35)
        else:
            job.worker_wait = _u(rng, 0.5, 0.9)  # too few workers, each stuck on reads
    elif label == CPU_SERIAL:
        job.cpu = primary = _u(rng, 0.8, 4.0)
        job.workers = 0 if rng.random() < 0.6 else rng.randint(1, 4)
        if rng.random() < 0.25:
            job.extra_threads = _u(rng, 0.2, 2.0)
    elif label == MEMORY_BANDWIDTH:
        job.dram_i = _u(rng, 0.6, 0.95)
        job.tensor_i = _u(rng, 0.0, 0.15)
        job.occ = _u(rng, 0.7, 0.9)
        job.launch = primary = _u(rng, 0.15, 0.6)
    elif label == SMALL_WORK:
        job.launch = primary = _u(rng, 1.0, 5.0)
        job.occ = _u(rng, 0.3, 0.65)
        job.dram_i = _u(rng, 0.05, 0.3)
        job.tensor_i *= _u(rng, 0.2, 0.5)
        job.demand *= _u(rng, 0.05, 0.3)
        job.workers = 0 if rng.random() < 0.6 else rng.randint(1, 4)

    # A weaker secondary cause: half of the faulty servers, a third of the healthy ones (mild).
    if label == HEALTHY:
        second = rng.choice(CAUSES) if rng.random() < 1 / 3 else None
        strength = _u(rng, 0.05, 0.15)
    else:
        second = rng.choice([c for c in CAUSES if c != label]) if rng.random() < 0.5 else None
        strength = (primary or 0.35) * _u(rng, 0.15, 0.5)
    if second == DATA_IO:
        job.io += strength
    elif second == CPU_SERIAL:
        job.cpu += strength
    elif second == SMALL_WORK:
        job.launch += strength
        job.occ *= _u(rng, 0.8, 0.95)
    elif second == MEMORY_BANDWIDTH:
        job.dram_i = max(job.dram_i, _u(rng, 0.45, 0.6) if label != HEALTHY else _u(rng, 0.4, 0.5))
        job.launch += strength * 0.5
    return job


def _noisy(rng: random.Random, value: float, rel: float, absolute: float) -> float:
    return value * (1.0 + rng.gauss(0.0, rel)) + rng.gauss(0.0, absolute)


def _clip(value: float, low: float = 0.0, high: float = 1.0) -> float:
    return min(high, max(low, value))


def _running(rng: random.Random, job: _Job, gpu_factor: float, extra: dict) -> dict:
    """One running window's true values (before missing values)."""
    jitter = lambda x: x * math.exp(rng.gauss(0.0, 0.25))  # noqa: E731
    io, cpu, launch = jitter(job.io), jitter(job.cpu), jitter(job.launch)
    io += extra.get("io", 0.0)
    step = 1.0 + io + cpu + launch
    b = gpu_factor / step
    node = job.node
    sm = node.sm * job.occ * b
    main = min(
        1.0,
        job.spin * b
        + (cpu + launch) / step * gpu_factor
        + (io * job.decode / step if job.workers == 0 else 0.0)
        + extra.get("main", 0.0),
    )
    workers = job.workers * job.worker_util * min(1.0, b * 1.3)
    cores = main + workers + job.extra_threads * min(1.0, cpu / step * 2.0)
    wait_main = io * (1.0 - job.decode) / step * job.visible if job.workers == 0 else 0.0
    iowait = wait_main + job.workers * job.worker_wait + extra.get("iowait", 0.0)
    reads = job.demand * job.uncached * b + extra.get("reads", 0.0)
    if not node.dcgm:
        sm = node.sm * b  # NVML utilisation: time-based, blind to occupancy
    # NVML's memory utilisation: time-based too, and any traffic in a sample period counts, so
    # it saturates well before the memory interface does.
    memory = b * (1.0 - math.exp(-job.dram_i / NVML_MEMORY_SATURATION))
    return {
        "sm_active": _clip(_noisy(rng, sm, 0.03, 0.01)),
        "gr_active": _clip(_noisy(rng, b, 0.03, 0.01)),
        "dram_active": _clip(_noisy(rng, node.dram * job.dram_i * b, 0.05, 0.01)),
        "memory_activity": _clip(_noisy(rng, memory, 0.05, 0.01)),
        "tensor_active": _clip(_noisy(rng, node.tensor * job.tensor_i * b, 0.05, 0.01)),
        "pcie_mb_s": max(0.0, _noisy(rng, node.pcie * job.pcie_full * b, 0.1, 2.0)),
        "gpu_mem_frac": _clip(_noisy(rng, job.mem, 0.0, 0.005)),
        "cpu_cores": max(0.0, _noisy(rng, cores, 0.05, 0.02)),
        "cpu_iowait": _clip(_noisy(rng, iowait, 0.1, 0.01)),
        "read_mb_s": max(0.0, _noisy(rng, reads, 0.1, 0.5)),
        "kernel_busy": None if job.terminal else True,
    }


def _idle(rng: random.Random, job: _Job) -> dict:
    """A window in which nothing runs on the GPU (a thinking pause, an abandoned kernel)."""
    return {
        "sm_active": _clip(rng.gauss(0.0, 0.003)),
        "gr_active": _clip(rng.gauss(0.0, 0.003)),
        "dram_active": _clip(rng.gauss(0.0, 0.002)),
        "memory_activity": _clip(rng.gauss(0.0, 0.002)),
        "tensor_active": 0.0,
        "pcie_mb_s": max(0.0, rng.gauss(0.2, 0.2)),
        "gpu_mem_frac": _clip(_noisy(rng, job.mem, 0.0, 0.002)),
        "cpu_cores": max(0.0, rng.gauss(0.01, 0.01)),
        "cpu_iowait": _clip(rng.gauss(0.0, 0.003)),
        "read_mb_s": max(0.0, rng.gauss(0.0, 0.05)),
        "kernel_busy": False,
    }


def _server(
    rng: random.Random, index: int, label: str, node: Node, windows: int, t0: float
) -> list[tuple[Window, str]]:
    job = _job(rng, label, node)
    server = f"user{index:04d}/" if rng.random() < 0.7 else f"user{index:04d}/run{index % 7}"
    rows = []
    if label == ZOMBIE:
        job.mem = _u(rng, 0.005, 0.02) if rng.random() < 0.15 else _u(rng, 0.05, 0.9)
        user_idle = _u(rng, 0.8, 6.0) * ZOMBIE_IDLE_S
    else:
        user_idle = _u(rng, 0.0, 3600.0)
    touch = _u(rng, 0.02, 0.3)  # chance per window that the user interacts
    warmup = rng.randint(0, 3) if label != ZOMBIE else 0
    period = rng.randint(10, 30)
    offset = rng.randint(0, period - 1)
    thinking = 0
    running_left = rng.randint(4, 15)
    for i in range(windows):
        t = t0 + (i + 1) * WINDOW_S
        if label == ZOMBIE:
            values = _idle(rng, job)
            user_idle += WINDOW_S
        elif job.interactive and thinking > 0:
            values = _idle(rng, job)
            thinking -= 1
            user_idle = min(user_idle + WINDOW_S, 600.0) if i else _u(rng, 0, 600)
            if thinking == 0:
                running_left = rng.randint(4, 15)
        else:
            factor, extra = 1.0, {}
            if i < warmup:
                factor = (i + 1) / (warmup + 1) * _u(rng, 0.5, 1.0)
                extra = {
                    "reads": _u(rng, 100.0, 1500.0) * (1 - factor),
                    "iowait": _u(rng, 0.05, 0.4) * (1 - factor),
                    "main": _u(rng, 0.6, 1.0),
                }
            elif i % period == offset:
                if rng.random() < 0.5:  # evaluation: more data per GPU second
                    factor = _u(rng, 0.4, 0.8)
                    extra = {"io": job.io + _u(rng, 0.1, 0.5)}
                else:  # checkpoint: serialise on one core, write
                    factor = _u(rng, 0.2, 0.7)
                    extra = {"main": _u(rng, 0.6, 1.0), "iowait": _u(rng, 0.05, 0.3)}
            values = _running(rng, job, factor, extra)
            if rng.random() < touch:
                user_idle = _u(rng, 0.0, WINDOW_S)
            else:
                user_idle += WINDOW_S
            if job.interactive:
                running_left -= 1
                if running_left <= 0:
                    thinking = rng.randint(1, 6)
                    user_idle = _u(rng, 0.0, 120.0)
        values["user_idle_s"] = user_idle
        rows.append(_observe(rng, job, server, t, values))
    return rows


def _observe(rng: random.Random, job: _Job, server: str, t: float, values: dict):
    """What the service sees: the node's blind spots and random gaps."""
    node = job.node
    values = dict(values)
    scrape_lost = rng.random() < P_MISSING_SCRAPE
    memory_activity = values.pop("memory_activity")
    if not node.dcgm or scrape_lost:
        for column in ("gr_active", "dram_active", "tensor_active", "pcie_mb_s"):
            values[column] = None
    if not node.dcgm:
        values["dram_active"] = memory_activity  # NVML's memory utilisation instead
    if not node.tensor_metric:
        values["tensor_active"] = None
    if not node.iowait:
        values["cpu_iowait"] = None
    if not job.reads_known:
        values["read_mb_s"] = None
    for column in ("cpu_cores", "cpu_iowait", "read_mb_s"):
        if rng.random() < P_MISSING_CPU:
            values[column] = None
    if rng.random() < P_MISSING_IDLE:
        values["user_idle_s"] = None
    if rng.random() < P_MISSING_MEM:
        values["gpu_mem_frac"] = None
    if rng.random() < P_MISSING_SM:
        values["sm_active"] = None
    for key, value in values.items():
        if isinstance(value, float):
            values[key] = round(value, 4)
    window = Window(node=node.name, server=server, t=t, **values)
    truth = job.label if window.sm_active is not None else UNKNOWN
    return window, truth


def generate(
    n_servers: int,
    windows_per_server: int = 60,
    seed: int = 0,
    nodes: Sequence[Node] = NODES,
    *,
    labels: Sequence[str] = LABELS,
    first_server: int = 0,
) -> list[tuple[Window, str]]:
    """Windows of ``n_servers`` simulated servers, each on a node of ``nodes`` (in turn) with a
    scenario of ``labels`` (in turn, shuffled), ``windows_per_server`` windows each; a list of
    ``(window, truth)`` ordered by server, then time. The same arguments give the same rows."""
    if n_servers < 0 or windows_per_server < 0:
        raise ValueError("n_servers and windows_per_server must be >= 0")
    if not nodes:
        raise ValueError("no nodes")
    rng = random.Random(seed)
    plan = [labels[i % len(labels)] for i in range(n_servers)]
    rng.shuffle(plan)
    rows: list[tuple[Window, str]] = []
    for i, label in enumerate(plan):
        node = nodes[i % len(nodes)]
        t0 = 1_767_225_600.0 + rng.uniform(0, 86_400)  # 2026-01-01 + up to a day
        rows.extend(_server(rng, first_server + i, label, node, windows_per_server, t0))
    return rows


# -- command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_gpu_gov.diagnose.faults",
        description="Write simulated diagnosis windows (docs/architecture.md) with a 'truth' column.",
    )
    parser.add_argument("--servers", type=int, default=300)
    parser.add_argument("--windows", type=int, default=60, help="windows per server (60 s each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--held-out", action="store_true", help="use only the held-out node configuration"
    )
    parser.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    args = parser.parse_args(argv)
    if args.servers < 0 or args.windows < 0:
        parser.error("--servers and --windows must be >= 0")
    nodes = (HELD_OUT_NODE,) if args.held_out else NODES
    rows = generate(args.servers, args.windows, args.seed, nodes)
    out = sys.stdout
    if args.format == "jsonl":
        for window, truth in rows:
            out.write(json.dumps({**window.as_dict(), "truth": truth}) + "\n")
    else:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*COLUMNS, "truth"])
        for window, truth in rows:
            row = window.as_dict()
            writer.writerow([_cell(row[c]) for c in COLUMNS] + [truth])
    return 0


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
