"""World "fleet": telemetry as an operator sees it on a shared cluster's dashboards.

This world does not build a step from kernels. It describes what each kind of server *looks
like* in the counters of a fleet of mixed nodes, from what operators report and what the
counters are documented to mean, and then adds what real telemetry adds: per-card calibration,
autocorrelated noise, bursts, outages, and the server's own processes in the CPU figures.

Nodes
-----
Ten nodes (``NODES``). Each has a *typical level*: the SM activity a well-fed job on it reads.
It is not the same on every card: a big card is hard to fill (an H100 running a notebook-sized
model reads 0.45-0.7), a small one is easy (an L4 or an A10 0.8-0.9), and on a T4 whose DCGM
counts warps conservatively a job that keeps it busy reads about 0.3. Each has a DRAM
*calibration*: for the same traffic DCGM's ``DRAM_ACTIVE`` reads 0.6-1.4 times as much from card
to card (memory clocks and bus widths differ, and the counter is a share of the interface's
peak), and NVML's memory utilisation (the nodes without DCGM) reads 1.3-2.2 times DCGM's, capped
at 1, in whole percents. CPU figures are the pod's cgroup: the Jupyter server, language server
and the kernel's own threads add 0.02-0.3 cores whatever the job does. Storage is per node:
local NVMe, SATA, a disk array, NFS, or an object store through FUSE (reads not counted in the
process's ``read_bytes``, waits not block I/O).

Servers
-------
The job of a server has an intrinsic kernel-time share ``g0`` (0.8-0.98 when nothing holds it
back), an occupancy ``o`` (0.7-1: how much of the card its kernels fill, relative to the node's
typical job), a DRAM intensity while kernels run, a tensor-pipe share (mixed precision, two
jobs in three), DataLoader workers, and memory held. A fault multiplies ``g0`` by a slowdown
``s`` and leaves its own marks:

``healthy``
    ``s = 1``; the driver thread spins while it waits for the GPU (0.5-1 core) and workers
    decode (0-3 cores); reads at the pace the GPU consumes.
``data_io``
    ``s`` 0.1-0.55: the storage is saturated, so the process reads at 50-100 % of what the
    storage gives (unless it is FUSE), and its workers (or its main thread) are blocked on it;
    the blocked share shows as I/O wait on local storage (50-100 % of it), little of it on NFS
    (0-40 %), none on FUSE. Workers decoding keep a few cores busy.
``cpu_serial``
    ``s`` 0.1-0.55: Python work between steps saturates one thread (the pod reads 0.95-1.05
    cores on top of the background), or, for a third, multi-threaded NumPy/pandas work (2-8
    cores); no I/O wait; reads slow down with the steps.
``memory_bandwidth``
    the kernels run most of the time (``g0`` 0.7-0.98) but move data: DRAM 0.6-0.95 of the
    interface while they run (before calibration), tensor pipes nearly idle.
``small_work``
    tiny batches: the engine runs 15-60 % of the time, the kernels fill 5-40 % of the SMs,
    light DRAM traffic, little memory held (0.5-8 % of the card), the launching thread busy
    (0.7-1.1 cores).
``zombie``
    an idle kernel holding 3-95 % of the card's memory, its owner away 30 minutes to three days.
    The SM counter does not read exactly zero everywhere: each node has an idle floor of 0-2 %
    (monitoring agents, a neighbour on the same GR engine) and the noise around it.

Phases: every 8-40 windows an epoch ends, with an evaluation of 1-4 windows (the GPU at 40-80 %
of its pace) and a data-loader restart (one window, reads and waits up); the first 1-2 windows
load the model. Healthy servers are interactive two times in five: cells of 1-15 windows and
pauses of 1-10 (kernel idle, owner active within the last 15 minutes). An owner may leave a
long run; the label stays the job's cause.

Noise: each counter of each server follows an AR(1) process in log space (coefficient 0.5-0.9,
innovations 4-12 %), so neighbouring windows are alike and a server drifts; one window in fifty
is a spike (a garbage collection, a preemption: the GPU at half pace). DCGM values are kept to
three decimals, NVML's to whole percents. Scrapes fail in bursts of 1-4 windows (1 % of windows
start one); CPU counters are missing 1 % of the time; a fifth of the servers cannot read
``/proc/<pid>/io``; three nodes have no delay accounting; one server in ten runs from a
terminal (no kernel state). Windows are 30 s.

Labels: the injected cause, for every window of the server (zombie: once the owner has been
away 30 minutes; before that the idle kernel is an interactive pause, ``healthy``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

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

WINDOW_S = 30.0
AWAY_S = 1800.0


@dataclass(frozen=True)
class Node:
    name: str
    card: str
    typical: tuple[float, float]  # SM activity of a well-fed job here
    dram_cal: float  # DCGM DRAM reading per unit of traffic
    nvml_mem: float  # NVML memory utilisation per unit of DCGM DRAM (NVML-only nodes)
    storage: str
    cores: int
    dcgm: bool = True
    iowait: bool = True
    tensor: bool = True
    idle_floor: float = 0.0


NODES = (
    Node("fl-h100-1", "H100 SXM", (0.5, 0.7), 0.8, 0.0, "nfs", 96, idle_floor=0.012),
    Node("fl-h100-2", "H100 SXM", (0.55, 0.75), 0.8, 1.6, "nvme", 48, dcgm=False),
    Node("fl-a100-1", "A100 80GB", (0.65, 0.8), 1.2, 0.0, "nvme", 64, idle_floor=0.004),
    Node("fl-a100-mig", "A100 MIG 2g.20gb", (0.75, 0.9), 1.4, 0.0, "nfs", 16, tensor=False),
    Node("fl-l4", "L4", (0.8, 0.9), 0.0, 2.2, "fuse", 8, dcgm=False),
    Node("fl-t4", "T4", (0.25, 0.35), 0.6, 0.0, "hdd", 4, iowait=False, idle_floor=0.02),
    Node("fl-a10", "A10", (0.75, 0.88), 0.0, 1.3, "sata", 30, dcgm=False, iowait=False),
    Node("fl-v100", "V100", (0.6, 0.75), 1.0, 0.0, "nfs", 40, iowait=False, idle_floor=0.008),
    Node("fl-h200", "H200 (GPM)", (0.55, 0.72), 0.7, 0.0, "nvme", 64),
    Node("fl-rtx", "RTX A6000", (0.85, 0.95), 0.0, 1.8, "sata", 24, dcgm=False),
)

STORAGE_MB_S = {"nvme": (1500, 3000), "sata": (350, 550), "hdd": (100, 200), "nfs": (150, 1200),
                "fuse": (50, 500)}  # fmt: skip
VISIBLE_WAIT = {"nvme": (0.5, 1.0), "sata": (0.5, 1.0), "hdd": (0.5, 1.0), "nfs": (0.0, 0.4),
                "fuse": (0.0, 0.0)}  # fmt: skip


@dataclass
class Ar:
    """A multiplicative AR(1) noise in log space."""

    phi: float
    sigma: float
    x: float = 0.0

    def __call__(self, rng: random.Random) -> float:
        self.x = self.phi * self.x + rng.gauss(0.0, self.sigma) * math.sqrt(1 - self.phi**2)
        return math.exp(self.x)


@dataclass
class Job:
    label: str
    node: Node
    g0: float
    occ: float
    level: float  # the node's typical SM for this job's kind of card use
    slow: float = 1.0
    dram_i: float = 0.3
    tensor_i: float = 0.0
    workers: int = 0
    worker_cores: float = 0.0
    spin: float = 0.8
    main_cores: float = 0.0  # cores of host work while the loop runs
    storage_mb_s: float = 0.0
    read_share: float = 0.0  # share of the storage the job reads at
    visible: float = 1.0
    waits: float = 0.0  # blocked share of the window
    mem: float = 0.1
    background: float = 0.05
    interactive: bool = False
    terminal: bool = False
    reads_known: bool = True
    noise: dict = field(default_factory=dict)


def _u(rng, a, b):
    return rng.uniform(a, b)


def _log(rng, a, b):
    return math.exp(rng.uniform(math.log(a), math.log(b)))


def _job(rng: random.Random, label: str, node: Node) -> Job:
    lo, hi = node.typical
    job = Job(
        label=label,
        node=node,
        g0=_u(rng, 0.8, 0.98),
        occ=_u(rng, 0.85, 1.0),
        level=rng.uniform(lo, hi),
        dram_i=_u(rng, 0.15, 0.5),
        tensor_i=_u(rng, 0.2, 0.6) if rng.random() < 2 / 3 else _u(rng, 0.0, 0.05),
        workers=rng.choice([0, 2, 4, 6, 8]),
        spin=_u(rng, 0.5, 1.0) if rng.random() < 0.8 else _u(rng, 0.02, 0.1),
        storage_mb_s=_u(rng, *STORAGE_MB_S[node.storage]),
        visible=_u(rng, *VISIBLE_WAIT[node.storage]),
        mem=_log(rng, 0.02, 0.95),
        background=_u(rng, 0.02, 0.3),
        terminal=rng.random() < 0.1,
        reads_known=rng.random() < 0.8,
    )
    job.worker_cores = job.workers * _u(rng, 0.1, 0.5)
    job.read_share = _u(rng, 0.0, 0.2) if rng.random() < 0.7 else 0.0
    if label == HEALTHY:
        job.interactive = rng.random() < 0.4
    elif label == DATA_IO:
        job.slow = _u(rng, 0.1, 0.55)
        job.workers = rng.choice([0, 0, 1, 2])
        decoding = job.workers * _u(rng, 0.2, 0.8) if job.workers else _u(rng, 0.1, 0.5)
        job.worker_cores = decoding  # no worker: the main thread decodes between reads
        job.read_share = _u(rng, 0.5, 1.0)
        job.waits = (1 - job.slow) * max(1, job.workers) * _u(rng, 0.6, 1.0)
    elif label == CPU_SERIAL:
        job.slow = _u(rng, 0.1, 0.55)
        job.main_cores = _u(rng, 0.95, 1.05) if rng.random() < 2 / 3 else _u(rng, 2.0, 8.0)
        job.main_cores = min(job.main_cores, node.cores - 0.5)
    elif label == MEMORY_BANDWIDTH:
        job.g0 = _u(rng, 0.7, 0.98)
        job.dram_i = _u(rng, 0.6, 0.95)
        job.tensor_i = _u(rng, 0.0, 0.05)
    elif label == SMALL_WORK:
        job.g0 = _u(rng, 0.15, 0.6)
        job.occ = _u(rng, 0.05, 0.4) / max(0.3, job.level)
        job.occ = min(job.occ, 0.45)
        job.dram_i = _u(rng, 0.02, 0.12)
        job.tensor_i *= _u(rng, 0.0, 0.3)
        job.mem = _log(rng, 0.005, 0.08)
        job.main_cores = _u(rng, 0.7, 1.1)
        job.spin = 0.0
    elif label == ZOMBIE:
        job.mem = _log(rng, 0.03, 0.95)
    job.noise = {k: Ar(_u(rng, 0.5, 0.9), _u(rng, 0.04, 0.12)) for k in
                 ("gpu", "occ", "dram", "tensor", "cpu", "io", "reads", "idle")}  # fmt: skip
    return job


def _clip(x, lo=0.0, hi=1.0):
    return min(hi, max(lo, x))


def _running(rng: random.Random, job: Job, pace: float, phase: str) -> dict:
    n = job.noise
    node = job.node
    spike = 0.5 if rng.random() < 0.02 else 1.0
    gr = _clip(job.g0 * job.slow * pace * spike * n["gpu"](rng), 0.0, 0.995)
    occ = _clip(job.occ * n["occ"](rng), 0.02, 1.0)
    # SM activity: the node's typical reading scales what "filled" means on this card.
    sm = gr * occ * job.level / 0.9
    dram = gr * job.dram_i * n["dram"](rng)
    tensor = gr * job.tensor_i * n["tensor"](rng)
    reads_rate = job.storage_mb_s * job.read_share * n["reads"](rng)
    if job.label != DATA_IO:
        reads_rate *= gr / max(job.g0, 1e-3)  # the pace of the steps
    waits = job.waits * n["io"](rng)
    extra_cpu = 0.0
    if phase == "restart":  # the loader starts again: reads and waits while the GPU idles
        reads_rate = max(reads_rate, job.storage_mb_s * _u(rng, 0.3, 0.9))
        waits += _u(rng, 0.2, 0.8)
        extra_cpu += _u(rng, 0.3, 1.0)
    elif phase == "load":
        reads_rate = job.storage_mb_s * _u(rng, 0.5, 1.0)
        waits += _u(rng, 0.2, 0.9)
        extra_cpu += _u(rng, 0.5, 1.0)
    if job.label == CPU_SERIAL and job.main_cores < 1.5:
        main = job.main_cores  # one thread: host work while the GPU waits, spinning otherwise
    elif job.label == CPU_SERIAL:
        main = job.main_cores * (1 - gr) + job.spin * gr
    elif job.label == SMALL_WORK:
        main = job.main_cores  # the thread that launches the kernels
    else:
        main = job.spin * gr
    fed = 1.0 if job.label == DATA_IO else min(1.0, 1.2 * gr / job.g0)
    cores = (job.background + main + job.worker_cores * fed + extra_cpu) * n["cpu"](rng)
    return {
        "sm": sm,
        "gr": gr,
        "dram": dram,
        "tensor": tensor,
        "pcie": reads_rate * _u(rng, 0.8, 2.5) + gr * _u(rng, 20, 120),
        "cores": cores,
        "iowait": _clip(waits * job.visible),
        "reads": reads_rate if node.storage != "fuse" else 0.0,
        "busy": True,
    }


def _idle(rng: random.Random, job: Job) -> dict:
    floor = job.node.idle_floor
    sm = _clip(floor + abs(rng.gauss(0.0, 0.004 + floor / 3)))
    return {
        "sm": sm,
        "gr": _clip(sm * 1.2),
        "dram": _clip(sm * 0.2),
        "tensor": 0.0,
        "pcie": _u(rng, 0.0, 1.0),
        "cores": job.background * _u(rng, 0.1, 0.5),
        "iowait": 0.0,
        "reads": 0.0,
        "busy": False,
    }


def _window(rng, job: Job, server: str, t: float, v: dict, away: float, outage: bool) -> Window:
    node = job.node
    if node.dcgm and not outage:
        sm, gr = round(v["sm"], 3), round(v["gr"], 3)
        dram = round(_clip(v["dram"] * node.dram_cal), 3)
        tensor = round(v["tensor"], 3) if node.tensor else None
        pcie = round(v["pcie"], 1)
    else:  # NVML: time-based utilisation, whole percents; no engine, tensor or PCIe counters
        sm, gr, tensor, pcie = round(_clip(v["gr"]), 2), None, None, None
        scale = node.nvml_mem or 1.5
        dram = round(_clip(v["dram"] * scale * 1.3 + (0.02 if v["busy"] else 0.0)), 2)
        if "MIG" in node.card:
            sm = dram = None  # a MIG instance has no NVML utilisation
    cpu_missing = rng.random() < 0.01
    return Window(
        node=node.name,
        server=server,
        t=t,
        sm_active=sm,
        gr_active=gr,
        dram_active=dram,
        tensor_active=tensor,
        pcie_mb_s=pcie,
        gpu_mem_frac=round(_clip(job.mem * (1 + rng.gauss(0, 0.003))), 4),
        cpu_cores=None if cpu_missing else round(max(0.0, v["cores"]), 3),
        cpu_iowait=None if cpu_missing or not node.iowait else round(v["iowait"], 3),
        read_mb_s=None if cpu_missing or not job.reads_known else round(v["reads"], 2),
        kernel_busy=None if job.terminal else v["busy"],
        user_idle_s=round(away, 1),
    )


def _server(rng: random.Random, index: int, label: str, node: Node, n: int, t0: float) -> list:
    job = _job(rng, label, node)
    server = f"fl{index:05d}/" if rng.random() < 0.5 else f"fl{index:05d}/gpu"
    away = _log(rng, 0.5, 72.0) * 3600 - _u(rng, 0, 1800) if label == ZOMBIE else _u(rng, 0, 600)
    away = max(away, 0.0)
    leaves = label != ZOMBIE and rng.random() < 0.3
    epoch = rng.randint(8, 40)
    evaluation = rng.randint(1, 4)
    loading = rng.randint(1, 2)
    cell, pause = rng.randint(1, 15), 0
    outage = 0
    rows = []
    for i in range(n):
        t = t0 + (i + 1) * WINDOW_S
        if outage == 0 and rng.random() < 0.01:
            outage = rng.randint(1, 4)
        lost = outage > 0
        outage = max(0, outage - 1)
        if label == ZOMBIE or pause > 0:
            if pause > 0:
                pause -= 1
                away = min(away + WINDOW_S, _u(rng, 0.0, 900.0))
                if pause == 0:
                    cell = rng.randint(1, 15)
            else:
                away += WINDOW_S
            values = _idle(rng, job)
            truth = ZOMBIE if away >= AWAY_S else HEALTHY
        else:
            into = i % epoch
            phase, pace = "steady", 1.0
            if i < loading:
                phase, pace = "load", _u(rng, 0.05, 0.5)
            elif 0 < epoch - into <= evaluation:
                phase, pace = "eval", _u(rng, 0.4, 0.8)
            elif into == 0:
                phase, pace = "restart", _u(rng, 0.2, 0.7)
            values = _running(rng, job, pace, phase)
            truth = label
            if leaves or rng.random() > 0.1:
                away += WINDOW_S
            else:
                away = _u(rng, 0.0, WINDOW_S)
            if job.interactive:
                cell -= 1
                if cell <= 0:
                    pause = rng.randint(1, 10)
                    away = _u(rng, 0.0, 60.0)
        window = _window(rng, job, server, t, values, away, lost)
        rows.append((window, truth if window.sm_active is not None else UNKNOWN))
    return rows


def generate(
    n_servers: int, windows_per_server: int = 60, seed: int = 0, *, first_server: int = 0
) -> list[tuple[Window, str]]:
    """``(window, truth)`` of ``n_servers`` servers (labels in equal numbers, nodes drawn at
    random), ordered by server, then time."""
    rng = random.Random(f"fleet-{seed}")
    plan = [LABELS[i % len(LABELS)] for i in range(n_servers)]
    rng.shuffle(plan)
    rows = []
    for i, label in enumerate(plan):
        node = rng.choice(NODES)
        t0 = 1_800_000_000.0 + rng.uniform(0, 7200)
        rows.extend(_server(rng, first_server + i, label, node, windows_per_server, t0))
    return rows
