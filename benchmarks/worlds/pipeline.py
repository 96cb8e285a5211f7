"""World "pipeline": a training loop fed by an input pipeline of stochastic stages and a
bounded buffer, simulated every two seconds; each window's truth is *its own* bottleneck.

Physics
-------
A loop takes batches from a prefetch buffer (``workers x 2`` batches) that DataLoader workers
fill. Each batch is *fetched* from storage and *decoded* on a CPU core; the main thread then
runs host work, launches the step's kernels (``ops x c`` seconds of Python and driver, ``c``
the node's per-op cost) and waits for the GPU, which runs ``gpu_s`` seconds of kernels per
batch. Launches are asynchronous, so the main thread's step is ``host + max(gpu, launch)``, and
``fetch + decode`` more when there is no worker (the main thread then does it itself).

The stages are random: a fetch time is log-normal, narrow on local NVMe (sigma 0.1), wide on
network storage (0.6-1.0), with stalls (a storage hiccup of 5-20 s, 0.5 % of ticks locally, 2 %
on network storage); decode and host times vary 10-30 % per batch. Every two-second tick the
workers produce what their service times allow (the mean of that tick's batches, which varies
as one over the square root of their number), capped by the storage's total bandwidth, and the
main thread consumes what it can, waiting on an empty buffer. Nothing here is Gaussian noise
added to a mean: the windows vary because queues do.

The page cache: a dataset smaller than half the node's memory is served from memory after its
first epoch (a fetch then costs a copy), so a job slow to read may stop being slow; reads from
the cache are not counted in ``read_bytes``. Evaluation runs at the end of each epoch: a third
of the GPU work per batch over the same pipeline, so a loader that kept up with training may
not keep up with evaluation. A checkpoint every 20-60 minutes serialises the model on the main
thread and writes it (its own pause). Cards differ in speed (per-batch GPU time scales with a
card factor, ``CARDS``) and in size: a model fills ``min(1, occupancy x (80 / SMs) ** 0.25)``
of the SMs, less on a big card.

What is measured, per window of 60 s: ``gr_active`` the GPU's busy share; ``sm_active`` that
times the fill (DCGM), or the busy share alone in whole percents (NVML); ``dram_active`` busy
share times the job's DRAM intensity (DCGM) or NVML's memory utilisation, the time memory is
touched (``busy x min(1, 2.5 x intensity)``); ``tensor_active``; ``pcie_mb_s`` the batches
copied; ``cpu_cores`` main thread (host work, launching, decoding without workers, spinning
while it waits for the GPU in four jobs of five) plus workers (decoding) plus the kernel's
own 0.01-0.05; ``cpu_iowait`` the time the tree is blocked on fetches, summed over its
processes and capped at one, times the storage's visible share (block devices 1, NFS 0.3, a
FUSE mount 0); ``read_mb_s`` the bytes fetched past the page cache (none through FUSE).

Truth, per window, from the window's own time budget (60 s of the main thread):

- kernel idle: ``zombie`` once the owner has been away 30 minutes (memory held), else
  ``healthy`` (an interactive pause);
- kernels >= 50 % of the window in a memory-bound job (DRAM >= 0.55 while kernels run):
  ``memory_bandwidth``;
- else the largest of *waiting for data* (fetching and decoding, by workers or, with no
  worker, by the main thread: the input pipeline), *host work* (the loop's own), and
  *launch gaps* if it is >= 25 % of the window: ``data_io``, ``cpu_serial``, ``small_work``
  (docs/api.md "What each label means");
- else ``healthy``.

So a job drawn to be starved by its loader is ``healthy`` once its data sits in the page cache,
and a warm-up or a checkpoint is whatever it physically is. Jobs are drawn for each cause in
equal numbers; the windows' truths are what they are.

Nodes: eight (``NODES``): A100 40GB PCIe, H100 SXM, L4, T4, A30 MIG 2g.12gb, H100 MIG
1g.10gb, RTX A6000, L40S; NVML only on three; no delay accounting on one; storage local NVMe,
a Ceph block device, NFS or a FUSE object store; 4-128 cores; 16-1024 GB of memory.

Measurement gaps: a DCGM exporter restart loses 1.5 % of windows (the report's NVML values
stand in: time-based utilisation, memory utilisation; a MIG instance has neither); one process
of twenty hides ``/proc/<pid>/io``; one server in twelve is a terminal (no kernel state).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from jupyter_gpu_gov.diagnose.features import Window
from jupyter_gpu_gov.diagnose.labels import (
    CPU_SERIAL,
    DATA_IO,
    HEALTHY,
    LABELS,
    MEMORY_BANDWIDTH,
    SMALL_WORK,
    UNKNOWN,
    ZOMBIE,
)

TICK_S = 2.0
WINDOW_S = 60.0
TICKS = int(WINDOW_S / TICK_S)
AWAY_S = 1800.0


@dataclass(frozen=True)
class Card:
    speed: float  # per-batch GPU time divides by this (A100 = 1)
    sms: int
    memory_gb: float
    mig: bool = False


CARDS = {
    "A100-40GB": Card(1.0, 108, 40),
    "H100-SXM": Card(2.6, 132, 80),
    "L4": Card(0.45, 58, 24),
    "T4": Card(0.22, 40, 16),
    "A30 MIG 2g.12gb": Card(0.28, 28, 12, mig=True),
    "H100 MIG 1g.10gb": Card(0.36, 16, 10, mig=True),
    "RTX A6000": Card(0.8, 84, 48),
    "L40S": Card(1.1, 142, 48),
}


@dataclass(frozen=True)
class Storage:
    mb_s: float  # one stream
    total_mb_s: float
    sigma: float  # log-normal spread of a fetch
    stall: float  # chance per tick of a hiccup
    visible: float  # share of a blocked fetch that is block I/O
    counted: bool  # read_bytes sees it


STORAGE = {
    "nvme": Storage(1800, 3500, 0.1, 0.005, 1.0, True),
    "ceph-rbd": Storage(300, 1200, 0.4, 0.01, 1.0, True),
    "nfs": Storage(200, 800, 0.7, 0.02, 0.3, True),
    "fuse": Storage(80, 600, 1.0, 0.02, 0.0, False),
}


@dataclass(frozen=True)
class Node:
    name: str
    card: str
    storage: str
    cores: int
    ram_gb: float
    op_us: float  # host cost per launched op
    dcgm: bool = True
    iowait: bool = True


NODES = (
    Node("pl-a100", "A100-40GB", "ceph-rbd", 32, 256, 12.0),
    Node("pl-h100", "H100-SXM", "nvme", 128, 1024, 7.0),
    Node("pl-l4", "L4", "nfs", 16, 64, 14.0, dcgm=False),
    Node("pl-t4", "T4", "fuse", 4, 16, 25.0, dcgm=False),
    Node("pl-a30mig", "A30 MIG 2g.12gb", "nfs", 24, 128, 15.0),
    Node("pl-h100mig", "H100 MIG 1g.10gb", "ceph-rbd", 16, 128, 9.0),
    Node("pl-a6000", "RTX A6000", "nvme", 32, 128, 11.0, dcgm=False),
    Node("pl-l40s", "L40S", "nfs", 48, 384, 10.0, iowait=False),
)


@dataclass
class Job:
    kind: str  # the cause it was drawn for
    node: Node
    gpu_s: float  # kernels per batch
    launch_s: float
    host_s: float
    fetch_s: float  # one batch from storage, mean
    decode_s: float
    batch_mb: float
    workers: int
    occ: float
    dram_i: float
    tensor_i: float
    spin: bool
    dataset_gb: float
    epoch_batches: int
    mem: float
    interactive: bool
    terminal: bool
    reads_known: bool
    pinger: bool  # an idle kernel with a background thread that touches the GPU
    decode_per_mb: float = 0.0  # CPU seconds to decode a MB (JPEG about 0.001-0.006)


def _u(rng, a, b):
    return rng.uniform(a, b)


def _log(rng, a, b):
    return math.exp(rng.uniform(math.log(a), math.log(b)))


def _job(rng: random.Random, kind: str, node: Node) -> Job:
    card, storage = CARDS[node.card], STORAGE[node.storage]
    ops = rng.randint(200, 1500)
    job = Job(
        kind=kind,
        node=node,
        gpu_s=_log(rng, 0.05, 0.6) / card.speed,
        launch_s=ops * node.op_us * 1e-6,
        host_s=_log(rng, 0.001, 0.01),
        fetch_s=0.0,
        decode_s=0.0,
        batch_mb=_log(rng, 2.0, 60.0),
        workers=rng.choice([2, 4, 6, 8, 12]),
        occ=_u(rng, 0.75, 1.0),
        dram_i=_u(rng, 0.1, 0.45),
        tensor_i=_u(rng, 0.15, 0.7) if rng.random() < 0.7 else _u(rng, 0.0, 0.03),
        spin=rng.random() < 0.8,
        dataset_gb=_log(rng, 2.0, 2000.0),
        epoch_batches=rng.randint(300, 5000),
        mem=_log(rng, 0.02, 0.9),
        interactive=False,
        terminal=rng.random() < 1 / 12,
        reads_known=rng.random() < 0.95,
        pinger=rng.random() < 0.2,
        decode_per_mb=_u(rng, 0.001, 0.006),
    )
    if kind == HEALTHY:
        job.interactive = rng.random() < 0.35
    elif kind == DATA_IO:
        job.batch_mb = _log(rng, 30.0, 400.0)
        job.workers = rng.choice([0, 0, 1, 2])
        job.dataset_gb = _log(rng, 2 * node.ram_gb, 20 * node.ram_gb)
        job.decode_per_mb = _u(rng, 0.0002, 0.0008)  # raw arrays: little to decode
    elif kind == CPU_SERIAL:
        job.host_s = job.gpu_s * _log(rng, 1.2, 8.0)
    elif kind == MEMORY_BANDWIDTH:
        job.dram_i = _u(rng, 0.6, 0.95)
        job.tensor_i = _u(rng, 0.0, 0.05)
        job.occ = _u(rng, 0.7, 0.95)
    elif kind == SMALL_WORK:
        job.gpu_s = _log(rng, 0.0005, 0.004) / card.speed**0.3
        job.launch_s = job.gpu_s * _log(rng, 2.0, 10.0)
        job.occ = _u(rng, 0.05, 0.35)
        job.dram_i = _u(rng, 0.02, 0.15)
        job.tensor_i *= 0.2
        job.batch_mb = _log(rng, 0.01, 0.5)
        job.mem = _log(rng, 0.004, 0.06)
        job.host_s = _log(rng, 0.0002, 0.002)
    job.fetch_s = job.batch_mb / storage.mb_s
    job.decode_s = job.batch_mb * job.decode_per_mb
    if kind != DATA_IO:  # a loader configured for its job keeps the buffer full
        need = job.host_s + max(job.gpu_s, job.launch_s)
        job.workers = max(job.workers, math.ceil(1.5 * (job.fetch_s + job.decode_s) / need))
        job.workers = min(job.workers, node.cores - 1)
    job.mem = min(job.mem, 0.95)
    return job


class Loop:
    """The loop's state across ticks: buffer, batches into the epoch, cache warmth."""

    def __init__(self, job: Job):
        self.job = job
        self.buffer = 0.0
        self.batch = 0.0
        self.epoch = 0
        self.stall = 0.0

    def tick(self, rng: random.Random, mode: str) -> dict:
        """One tick; ``mode``: ``train``, ``eval`` or ``checkpoint``. The tick's times (s)."""
        job, node = self.job, self.job.node
        storage = STORAGE[node.storage]
        cached = job.dataset_gb < 0.5 * node.ram_gb and self.epoch >= 1
        fetch = 0.002 * job.batch_mb / 10 if cached else job.fetch_s
        n_est = max(1.0, TICK_S / max(fetch + job.decode_s, 1e-3))
        spread = storage.sigma / math.sqrt(n_est) if not cached else 0.05
        fetch *= math.exp(rng.gauss(-(spread**2) / 2, spread))
        if not cached and rng.random() < storage.stall:
            self.stall = _u(rng, 5.0, 20.0)
        blocked = min(TICK_S, self.stall)
        self.stall = max(0.0, self.stall - TICK_S)
        gpu = job.gpu_s * (1 / 3 if mode == "eval" else 1.0) * math.exp(rng.gauss(0, 0.03))
        host = job.host_s * math.exp(rng.gauss(0, 0.2 / math.sqrt(n_est)))
        decode = job.decode_s * math.exp(rng.gauss(0, 0.15 / math.sqrt(n_est)))
        launch = job.launch_s * (0.4 if mode == "eval" else 1.0)
        step = host + max(gpu, launch)
        out = {"gpu": 0.0, "gap": 0.0, "host": 0.0, "wait": 0.0, "fetch": 0.0, "decode": 0.0,
               "steps": 0.0, "spin": 0.0, "reads": 0.0}  # fmt: skip
        if mode == "checkpoint":  # serialise on the main thread, then write and sync
            write = _u(rng, 0.3, 0.8) * TICK_S
            out.update(host=TICK_S - write, wait=write, write=write)
            return out
        available = TICK_S - blocked
        out["wait"] = blocked
        if job.workers == 0:
            per = step + fetch + decode
            steps = available / per
            out.update(fetch=steps * fetch, decode=steps * decode)
            out["wait"] += steps * (fetch + decode)  # the input pipeline, on the main thread
            out["host"] = steps * host
        else:
            supply = job.workers / (fetch + decode)
            if not cached:
                supply = min(supply, storage.total_mb_s / job.batch_mb)
            produced = supply * available
            capacity = available / step
            steps = min(capacity, self.buffer + produced)
            self.buffer = min(self.buffer + produced - steps, 2.0 * job.workers)
            out["wait"] += (capacity - steps) * step
            out.update(fetch=produced * fetch, decode=produced * decode)
            out["host"] = steps * host
        out["steps"] = steps
        out["gpu"] = steps * gpu
        out["gap"] = steps * max(0.0, launch - gpu)
        out["spin"] = steps * max(0.0, gpu - launch) if job.spin else 0.0
        out["launch"] = steps * launch
        out["reads"] = 0.0 if cached else steps * job.batch_mb
        self.batch += steps
        if self.batch >= job.epoch_batches:
            self.batch = 0.0
            self.epoch += 1
            self.buffer = 0.0  # workers restart with the epoch
        return out


def _running(rng: random.Random, loop: Loop, modes: list[str]):
    job, node = loop.job, loop.job.node
    card, storage = CARDS[node.card], STORAGE[node.storage]
    total: dict[str, float] = {"launch": 0.0, "write": 0.0}
    for mode in modes:
        for k, v in loop.tick(rng, mode).items():
            total[k] = total.get(k, 0.0) + v
    busy = min(1.0, total["gpu"] / WINDOW_S)
    fill = min(1.0, job.occ * (80 / card.sms) ** 0.25)
    main = total["host"] + total["launch"] + total["spin"]
    # decoding: the workers' cores, or the main thread's where there is no worker
    cores = (main + total["decode"]) / WINDOW_S + _u(rng, 0.01, 0.05)
    values = {
        "gr": busy,
        "sm": busy * fill,
        "dram": busy * job.dram_i,
        "touch": busy * min(1.0, 2.5 * job.dram_i),
        "tensor": busy * job.tensor_i,
        "pcie": total["steps"] * job.batch_mb / WINDOW_S + _u(rng, 2.0, 20.0),
        "cores": cores,
        "iowait": min(1.0, (total["fetch"] * storage.visible + total["write"]) / WINDOW_S),
        "reads": total["reads"] / WINDOW_S if storage.counted else 0.0,
        "busy": True,
    }
    shares = {k: total[k] / WINDOW_S for k in ("gpu", "gap", "host", "wait")}
    if shares["gpu"] >= 0.5 and job.dram_i >= 0.55:
        truth = MEMORY_BANDWIDTH
    else:
        exposed = {DATA_IO: shares["wait"], CPU_SERIAL: shares["host"], SMALL_WORK: shares["gap"]}
        top = max(exposed, key=exposed.get)
        truth = top if exposed[top] >= 0.25 else HEALTHY
    return values, truth


def _idle(rng: random.Random, job: Job) -> dict:
    sm = _u(rng, 0.001, 0.02) if job.pinger else 0.0
    return {"gr": sm * 2, "sm": sm, "dram": sm * 0.3, "touch": sm * 2, "tensor": 0.0,
            "pcie": _u(rng, 0.0, 0.3), "cores": _u(rng, 0.005, 0.03), "iowait": 0.0,
            "reads": 0.0, "busy": False}  # fmt: skip


def _window(rng, job: Job, server: str, t: float, v: dict, away: float) -> Window:
    node = job.node
    mig = CARDS[node.card].mig
    lost = node.dcgm and rng.random() < 0.015
    if node.dcgm and not lost:
        sm, gr, dram = round(v["sm"], 4), round(v["gr"], 4), round(v["dram"], 4)
        tensor, pcie = round(v["tensor"], 4), round(v["pcie"], 2)
    else:
        sm = None if mig else round(v["gr"], 2)
        dram = None if mig else round(v["touch"], 2)
        gr = tensor = pcie = None
    return Window(
        node=node.name,
        server=server,
        t=t,
        sm_active=sm,
        gr_active=gr,
        dram_active=dram,
        tensor_active=tensor,
        pcie_mb_s=pcie,
        gpu_mem_frac=round(job.mem, 4),
        cpu_cores=round(v["cores"], 3),
        cpu_iowait=round(v["iowait"], 3) if node.iowait else None,
        read_mb_s=round(v["reads"], 2) if job.reads_known else None,
        kernel_busy=None if job.terminal else v["busy"],
        user_idle_s=round(away, 1),
    )


def _server(rng: random.Random, index: int, kind: str, node: Node, n: int, t0: float) -> list:
    job = _job(rng, kind, node)
    loop = Loop(job)
    server = f"pl{index:05d}/"
    away = _log(rng, 0.5, 10.0) * 3600 if kind == ZOMBIE else _u(rng, 0.0, 400.0)
    checkpoint = rng.randint(20, 60)
    leaves = rng.random() < 0.35
    cell, pause, evaluating = rng.randint(3, 20), 0, 0
    epoch = loop.epoch
    rows = []
    for i in range(n):
        t = t0 + (i + 1) * WINDOW_S
        if kind == ZOMBIE or pause > 0:
            if pause > 0:
                pause -= 1
                away = min(away + WINDOW_S, _u(rng, 0.0, 1200.0))
                if pause == 0:
                    cell = rng.randint(3, 20)
            else:
                away += WINDOW_S
            values = _idle(rng, job)
            truth = ZOMBIE if away >= AWAY_S else HEALTHY
        else:
            modes = ["train"] * TICKS
            if evaluating > 0:
                modes, evaluating = ["eval"] * TICKS, evaluating - 1
            elif i and i % checkpoint == 0:  # 6-30 s of the window
                k = rng.randint(3, 15)
                modes[:k] = ["checkpoint"] * k
            values, truth = _running(rng, loop, modes)
            if loop.epoch != epoch:
                epoch, evaluating = loop.epoch, rng.randint(1, 3)
            away = away + WINDOW_S if leaves or rng.random() > 0.12 else _u(rng, 0, WINDOW_S)
            if job.interactive:
                cell -= 1
                if cell <= 0:
                    pause = rng.randint(1, 8)
                    away = _u(rng, 0.0, 60.0)
        window = _window(rng, job, server, t, values, away)
        rows.append((window, truth if window.sm_active is not None else UNKNOWN))
    return rows


def generate(
    n_servers: int, windows_per_server: int = 60, seed: int = 0, *, first_server: int = 0
) -> list[tuple[Window, str]]:
    """``(window, truth)`` of ``n_servers`` servers, drawn for each cause in equal numbers on
    nodes in turn; ordered by time across servers."""
    rng = random.Random(f"pipeline-{seed}")
    plan = [LABELS[i % len(LABELS)] for i in range(n_servers)]
    rng.shuffle(plan)
    rows = []
    for i, kind in enumerate(plan):
        node = NODES[(i * 3 + seed) % len(NODES)]
        t0 = 1_810_000_000.0 + rng.uniform(0, 1800)
        rows.extend(_server(rng, first_server + i, kind, node, windows_per_server, t0))
    rows.sort(key=lambda pair: pair[0].t)
    return rows
