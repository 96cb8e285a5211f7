"""World "roofline": a training step built from kernels on a card's roofline and a host that
launches them, on nine nodes of different cards, disks and CPUs.

Physics
-------
*Cards* (``CARDS``) are described by their datasheets: SM count, dense tensor throughput (bf16,
or fp16 on a T4), plain fp32 throughput, HBM bandwidth, memory. A MIG slice has its profile's
share of SMs (1/7 per compute slice) and of bandwidth (1/8 per memory slice).

*A step* is a transformer-like loop of ``layers`` layers over ``m`` tokens of width ``h``: six
GEMMs per layer forward (``24 m h^2`` FLOPs) and a few elementwise kernels (norms, activations,
residuals, dropout), each reading and writing the activation (``3 m h`` elements); the backward
pass costs twice the forward. A kernel runs for ``max(FLOPs / (peak * e_c), bytes / (bw * e_m))``
plus a floor of a few microseconds (launch into the SMs, the tail of the grid); it keeps
``blocks / (SMs * waves)`` of the SMs busy (a GEMM tile is 128 x 128 outputs, an elementwise
block 1024 elements). So a big GEMM fills the card, a GEMM of a tiny batch does not.

*The host*: eager PyTorch spends ``c`` microseconds of Python, dispatcher and driver per kernel
(8-25 us: the CPU's single-thread speed). Launches are asynchronous, so the GPU's part of a
step is ``max(G, L)`` with ``G`` the kernels' time and ``L = kernels * c``: when ``L > G`` the
loop is launch-bound and the GPU idles between kernels. The step synchronises once (a logged
loss), so host work ``H`` between steps (augmentation, metrics in NumPy, a Python loop over
the batch) is exposed in full. While the host waits for the GPU it spins (CUDA's default when
there are more cores than GPUs), except in jobs that ask for blocking synchronisation.

*Data*: a step needs ``D`` MB from storage and ``D * decode`` CPU seconds to decode it. With no
DataLoader worker the main thread reads and decodes in series with the step; with ``W`` workers
the batches come at most every ``(read + decode) / W`` seconds and at most at the disk's total
bandwidth, and the step waits when they come slower than it consumes them. Disks (``DISKS``)
have a bandwidth per stream, a total bandwidth and a latency per file; reads from local disks
and NFS are counted in ``/proc/<pid>/io`` ``read_bytes``, a FUSE mount's are not (its daemon
reads, outside the process tree); waiting on a local disk is block I/O (``cpu_iowait``), on NFS
about half of it is (page-lock waits), on FUSE none (the tree waits on a pipe).

*Memory held*: weights, gradients and Adam's state (16 bytes per parameter in mixed precision,
``12 l h^2`` parameters) plus the activations kept for backward (about 34 bytes per token per
width per layer), plus the caching allocator's slack; a job that would not fit is redrawn.

*What DCGM reports* over a window: ``gr_active`` the share of time a kernel ran, ``sm_active``
that times the share of SMs the kernels fill, ``dram_active`` the share of time the memory
interface is busy (bytes over bandwidth), ``tensor_active`` the share of time the tensor pipes
work at their peak rate, ``pcie_mb_s`` the batches copied to the card. A node without DCGM
reports NVML: ``sm_active`` is the share of time a kernel ran (blind to how many SMs it fills)
in whole percents, ``dram_active`` NVML's memory utilisation, the share of time memory is read
or written at all: a kernel touches memory during ``min(1, 4 x its DRAM share)`` of its run.

Labels are decided by the physics, not by intent: a job is drawn for a cause, its steady step
is computed, and it is kept only if that cause is what the step is made of:

- ``healthy``: kernels run >= 80 % of the step, and memory-bound kernels < half of them;
- ``data_io``: waiting for batches is >= 40 % of the step, the largest part (reading and
  decoding them, by workers or, with no worker, by the main thread: the input pipeline's time,
  docs/api.md "What each label means");
- ``cpu_serial``: host work is >= 40 % of the step, the largest part;
- ``small_work``: launch gaps are >= 40 % of the step, the largest part;
- ``memory_bandwidth``: kernels run >= 50 % of the step, >= 60 % of their time memory-bound,
  nothing else >= 30 %;
- ``zombie``: an idle kernel holding memory whose owner has been away >= 30 minutes (the
  project's definition of "a while"); the same kernel before that is an interactive pause,
  ``healthy``.

Phases: a model-loading window at start (weights read at disk speed, cuDNN autotuning), an
evaluation pass at the end of each epoch (forward only, its own data) and a checkpoint every
15-60 minutes (serialised on the main thread, written to disk). A third of the healthy servers
are interactive: cells of 2-12 windows with pauses of 1-8 in between (the owner there). Owners
of long runs may leave while they run (a busy kernel is never a zombie). Truth stays the job's
cause through its phases.

Noise: step times jitter 3 % per window (clocks, thermals); DCGM values are kept to four
decimals, NVML's to whole percents. A DCGM scrape is lost 2 % of the time, CPU counters 1 %
(a process exited); a tenth of the servers cannot read ``/proc/<pid>/io``; one node has no
delay accounting (no ``cpu_iowait``).

Limits: one GPU per job; no NCCL; no CUDA graphs; kernels of one kind share one size.
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

WINDOW_S = 60.0
AWAY_S = 1800.0  # "nobody for a while"


@dataclass(frozen=True)
class Card:
    sms: int
    tensor_tflops: float  # dense bf16 (fp16 on a T4)
    fp32_tflops: float
    bw_gbs: float
    memory_gb: float


CARDS = {
    "A100-80GB": Card(108, 312.0, 19.5, 2039.0, 80.0),
    "H100-SXM": Card(132, 989.0, 67.0, 3350.0, 80.0),
    "H100-PCIe": Card(114, 756.0, 51.0, 2000.0, 80.0),
    "L4": Card(58, 121.0, 30.3, 300.0, 24.0),
    "T4": Card(40, 65.0, 8.1, 320.0, 16.0),
    "A10G": Card(80, 70.0, 31.2, 600.0, 24.0),
    "A100 MIG 1g.10gb": Card(14, 312.0 / 7, 19.5 / 7, 2039.0 / 8, 10.0),
    "H100 MIG 3g.40gb": Card(60, 989.0 * 3 / 7, 67.0 * 3 / 7, 3350.0 / 2, 40.0),
}


@dataclass(frozen=True)
class Disk:
    stream_mb_s: float  # one reader
    total_mb_s: float  # all readers together
    latency_s: float  # per file
    visible_wait: float  # share of the wait that is block I/O
    counted: bool  # read_bytes sees the reads


DISKS = {
    "nvme": Disk(1500.0, 3000.0, 0.0001, 1.0, True),
    "sata-ssd": Disk(450.0, 520.0, 0.0003, 1.0, True),
    "hdd": Disk(140.0, 160.0, 0.008, 1.0, True),
    "nfs": Disk(250.0, 900.0, 0.002, 0.5, True),
    "s3-fuse": Disk(90.0, 400.0, 0.02, 0.0, False),
}


@dataclass(frozen=True)
class Node:
    name: str
    card: str
    disk: str
    cores: int
    launch_us: float  # host cost per kernel launch (single-thread speed)
    dcgm: bool = True
    iowait: bool = True


NODES = (
    Node("rf-a100", "A100-80GB", "nvme", 64, 14.0),
    Node("rf-h100", "H100-SXM", "nfs", 112, 8.0),
    Node("rf-h100pcie", "H100-PCIe", "nvme", 32, 10.0, iowait=False),
    Node("rf-l4", "L4", "sata-ssd", 16, 12.0, dcgm=False),
    Node("rf-t4", "T4", "hdd", 8, 22.0, dcgm=False),
    Node("rf-a10g", "A10G", "s3-fuse", 8, 16.0, dcgm=False),
    Node("rf-mig1g", "A100 MIG 1g.10gb", "nfs", 64, 14.0),
    Node("rf-mig3g", "H100 MIG 3g.40gb", "s3-fuse", 96, 9.0),
    Node("rf-a100b", "A100-80GB", "hdd", 24, 18.0),
)

KERNEL_FLOOR_S = 4e-6
E_COMPUTE = 0.7  # GEMMs reach this share of the peak
E_MEMORY = 0.85  # streaming kernels reach this share of the bandwidth


@dataclass
class Step:
    """One steady step, in seconds, and what its kernels did."""

    gpu: float  # kernels' time G
    launch: float  # host launch time L
    sm_time: float  # kernel time x SM share
    dram_time: float  # memory interface busy
    touch_time: float  # memory touched at all (NVML's measure)
    tensor_time: float
    memory_bound: float  # kernel time in memory-bound kernels
    host: float  # exposed host work H
    read: float  # reading one batch (one stream)
    decode: float  # decoding one batch (CPU)
    data_mb: float
    h2d_mb: float


@dataclass
class Job:
    label: str
    node: Node
    step: Step
    workers: int
    spin: bool
    mem_frac: float
    params: float
    interactive: bool = False
    terminal: bool = False
    reads_known: bool = True


def _kernels(card: Card, n: int, flops: float, nbytes: float, blocks: float, tensor: bool):
    """Time, SM-time, DRAM time, touch time, tensor time, memory-bound time of ``n`` kernels."""
    peak = (card.tensor_tflops if tensor else card.fp32_tflops) * 1e12 * E_COMPUTE
    compute = flops / peak
    memory = nbytes / (card.bw_gbs * 1e9 * E_MEMORY)
    duration = max(compute, memory) + KERNEL_FLOOR_S
    waves = max(1, math.ceil(blocks / card.sms))
    occupancy = min(1.0, blocks / (waves * card.sms))
    dram = nbytes / (card.bw_gbs * 1e9)
    touch = duration * min(1.0, 4.0 * dram / duration)
    tensor_time = flops / (card.tensor_tflops * 1e12) if tensor else 0.0
    bound = duration if memory > compute else 0.0
    return n * duration, n * duration * occupancy, n * dram, n * touch, n * tensor_time, n * bound


def _step(card: Card, node: Node, model: dict) -> Step:
    m, h, layers = model["tokens"], model["width"], model["layers"]
    size = 2 if model["tensor"] else 4
    gemm_flops = 4 * m * h * h  # one of six: (m x h) . (h x 4h / 6 on average)
    gemm_bytes = size * (m * h + h * h + m * h)
    gemm_blocks = math.ceil(m / 128) * math.ceil(h / 128)
    elem_bytes = size * 3 * m * h
    elem_blocks = m * h / 1024
    optimizer = model["optimizer_kernels"]
    totals = [0.0] * 6
    for n, flops, nbytes, blocks, tensor in (
        (6 * 3 * layers, gemm_flops, gemm_bytes, gemm_blocks, model["tensor"]),
        (model["elementwise"] * 3 * layers, m * h * 4, elem_bytes, elem_blocks, False),
        (optimizer, 0.0, 16.0 * 12 * layers * h * h / optimizer, 1e6, False),
    ):
        for i, v in enumerate(_kernels(card, n, flops, nbytes, blocks, tensor)):
            totals[i] += v
    kernels = (6 + model["elementwise"]) * 3 * layers + model["optimizer_kernels"]
    return Step(
        gpu=totals[0],
        launch=kernels * node.launch_us * 1e-6 * model["launch_factor"],
        sm_time=totals[1],
        dram_time=totals[2],
        touch_time=totals[3],
        tensor_time=totals[4],
        memory_bound=totals[5],
        host=model["host_s"],
        read=0.0,
        decode=0.0,
        data_mb=model["data_mb"],
        h2d_mb=model["data_mb"] * model["h2d_factor"],
    )


def _u(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)


def _log(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _model(rng: random.Random, label: str) -> dict:
    """A workload drawn for ``label`` (before the physics decides whether it is one)."""
    model = {
        "tokens": int(_log(rng, 4096, 65536)),
        "width": int(rng.choice([1024, 1536, 2048, 3072, 4096])),
        "layers": rng.randint(4, 24),
        "elementwise": rng.randint(6, 14),
        "tensor": rng.random() < 0.8,
        "optimizer_kernels": rng.choice([4, 8, 400]),  # fused, foreach, per-tensor
        "launch_factor": _u(rng, 0.8, 1.3),
        "host_s": _u(rng, 0.0, 0.004),
        "data_mb": _log(rng, 0.5, 40.0),
        "decode_s_per_mb": _u(rng, 0.0005, 0.004),
        "h2d_factor": _u(rng, 1.0, 3.0),
    }
    if label == SMALL_WORK:  # a tiny batch of a small model: kernels of a few microseconds
        model.update(
            tokens=int(_log(rng, 8, 512)),
            width=int(rng.choice([128, 256, 384, 512, 768])),
            layers=rng.randint(2, 12),
            data_mb=_log(rng, 0.01, 1.0),
        )
    elif label == MEMORY_BANDWIDTH:  # an unfused elementwise-heavy mix over big activations
        model.update(
            tokens=int(_log(rng, 16384, 262144)),
            width=int(rng.choice([512, 768, 1024, 2048])),
            elementwise=rng.randint(40, 120),
            tensor=rng.random() < 0.5,
        )
    elif label == CPU_SERIAL:  # Python work on the batch between steps
        model["host_s"] = _log(rng, 0.05, 2.0)
    elif label == DATA_IO:  # big samples from slow storage
        model["data_mb"] = _log(rng, 20.0, 400.0)
        model["decode_s_per_mb"] = _u(rng, 0.0002, 0.001)
    return model


def _draw_job(rng: random.Random, label: str, node: Node) -> Job | None:
    card = CARDS[node.card]
    model = _model(rng, label)
    step = _step(card, node, model)
    disk = DISKS[node.disk if rng.random() < 0.7 or label == DATA_IO else "nvme"]
    files = max(1, round(step.data_mb / _log(rng, 0.1, 8.0)))
    step.read = step.data_mb / disk.stream_mb_s + files * disk.latency_s
    step.decode = step.data_mb * model["decode_s_per_mb"]
    if label == DATA_IO:
        workers = 0 if rng.random() < 0.5 else rng.randint(1, 3)
    else:
        workers = rng.randint(2, min(12, node.cores - 2)) if rng.random() < 0.8 else 0
        if label == HEALTHY and workers == 0:
            step.read, step.decode = step.read * 0.02, step.decode * 0.02  # data on the GPU
    params = 12 * model["layers"] * model["width"] ** 2
    activations = 34 * model["tokens"] * model["width"] * model["layers"]
    held = (16 * params + activations) * _u(rng, 1.05, 1.4) + 4e8  # + context and cache slack
    mem_frac = held / (card.memory_gb * 1e9)
    if mem_frac > 0.95:
        return None
    job = Job(label, node, step, workers, rng.random() < 0.85, mem_frac, params)
    job.reads_known = rng.random() < 0.9
    job.terminal = rng.random() < 0.08
    job._disk = disk  # type: ignore[attr-defined]
    return job if _is(job, label) else None


def _parts(job: Job, slow: float = 1.0) -> dict:
    """The steady step's parts, in seconds: gpu, gaps (launch), host, wait (for data), total."""
    s, disk = job.step, job._disk  # type: ignore[attr-defined]
    gpu = s.gpu * slow
    busy = max(gpu, s.launch)
    gaps = busy - gpu
    if job.workers == 0:  # the main thread reads and decodes: its input, not its own work
        main = s.host + s.read + s.decode + busy
        return {"gpu": gpu, "gaps": gaps, "host": s.host, "wait": s.read + s.decode, "total": main}
    supply = max((s.read + s.decode) / job.workers, s.data_mb / disk.total_mb_s)
    main = s.host + busy
    total = max(main, supply)
    return {"gpu": gpu, "gaps": gaps, "host": s.host, "wait": total - main, "total": total}


def _is(job: Job, label: str) -> bool:
    p = _parts(job)
    share = {k: p[k] / p["total"] for k in ("gpu", "gaps", "host", "wait")}
    exposed = {DATA_IO: share["wait"], CPU_SERIAL: share["host"], SMALL_WORK: share["gaps"]}
    bound = job.step.memory_bound / max(job.step.gpu, 1e-12)
    if label == HEALTHY:
        return share["gpu"] >= 0.8 and bound < 0.5
    if label == MEMORY_BANDWIDTH:
        return share["gpu"] >= 0.5 and bound >= 0.6 and max(exposed.values()) < 0.3
    if label in exposed:
        top = max(exposed, key=exposed.get)
        return top == label and exposed[label] >= 0.4
    return False


def _job(rng: random.Random, label: str, node: Node) -> Job:
    target = HEALTHY if label == ZOMBIE else label
    for _ in range(400):
        job = _draw_job(rng, target, node)
        if job is not None:
            job.label = label
            return job
    raise RuntimeError(f"roofline: no {label} job fits on {node.name}")  # pragma: no cover


def _running(rng: random.Random, job: Job, phase: str) -> dict:
    """A running window's values."""
    s = job.step
    slow = math.exp(rng.gauss(0.0, 0.03))
    p = _parts(job, slow)
    total, extra_wait, extra_host, extra_reads = p["total"], 0.0, 0.0, 0.0
    gpu_share = 1.0
    if phase == "load":  # weights read at disk speed, cuDNN autotuning: the GPU mostly waits
        gpu_share = _u(rng, 0.05, 0.4)
        extra_wait = _u(rng, 0.3, 0.7)
        extra_reads = min(job._disk.stream_mb_s, job.params * 2 / 1e6 / 20.0)  # type: ignore[attr-defined]
        extra_host = _u(rng, 0.2, 0.6)
    elif phase == "eval":  # forward only (a third of the kernels) over its own data
        gpu_share = _u(rng, 0.5, 0.9)
    elif phase == "checkpoint":  # serialise on the main thread and write
        gpu_share = _u(rng, 0.1, 0.6)
        extra_host = (1 - gpu_share) * _u(rng, 0.6, 1.0)
        extra_wait = (1 - gpu_share) * _u(rng, 0.05, 0.3)
    steps = WINDOW_S / total * gpu_share
    f = steps / WINDOW_S  # per second of the window
    fp = p["gpu"] / s.gpu if s.gpu else 1.0
    gr = s.gpu * fp * f
    values = {
        "gr_active": gr,
        "sm_active": s.sm_time * fp * f,
        "dram_active": s.dram_time * f,
        "touch": s.touch_time * fp * f,
        "tensor_active": s.tensor_time * f,
        "pcie_mb_s": s.h2d_mb * f + _u(rng, 5.0, 40.0),
    }
    main = s.host + p["gaps"] + (s.launch if s.launch < p["gpu"] else p["gpu"])
    if job.spin:
        main += max(0.0, p["gpu"] - s.launch) * 0.95
    if job.workers == 0:
        main += s.decode
    main_share = min(1.0, main * f + extra_host)
    workers = s.decode * f if job.workers else 0.0
    background = _u(rng, 0.01, 0.06)  # the kernel's own threads, the server
    disk = job._disk  # type: ignore[attr-defined]
    wait = s.read * f * disk.visible_wait + extra_wait
    reads = (s.data_mb * f + extra_reads) if disk.counted else extra_reads
    values.update(
        cpu_cores=main_share + workers + background,
        cpu_iowait=min(1.0, wait),
        read_mb_s=reads,
        kernel_busy=None if job.terminal else True,
        gpu_mem_frac=job.mem_frac,
    )
    return values


def _idle(rng: random.Random, job: Job, tick: bool) -> dict:
    sm = _u(rng, 0.001, 0.008) if tick else 0.0  # a widget polling the GPU every few seconds
    return {
        "gr_active": sm * 1.5,
        "sm_active": sm,
        "dram_active": sm * 0.3,
        "touch": sm,
        "tensor_active": 0.0,
        "pcie_mb_s": _u(rng, 0.0, 0.5),
        "cpu_cores": _u(rng, 0.005, 0.04),
        "cpu_iowait": 0.0,
        "read_mb_s": 0.0,
        "kernel_busy": False,
        "gpu_mem_frac": job.mem_frac,
    }


def _observe(rng, job: Job, server: str, t: float, values: dict, away: float, truth: str):
    node = job.node
    v = dict(values)
    touch = v.pop("touch")
    if node.dcgm and rng.random() < 0.02:  # the scrape is lost: the report's NVML readings
        mig = "MIG" in node.card  # MIG instances have no NVML utilisation
        v["sm_active"] = None if mig else round(min(1.0, v["gr_active"]), 2)
        v["dram_active"] = None if mig else round(min(1.0, touch), 2)
        for k in ("gr_active", "tensor_active", "pcie_mb_s"):
            v[k] = None
    elif not node.dcgm:
        v["sm_active"] = round(min(1.0, v["gr_active"]), 2)
        v["dram_active"] = round(min(1.0, touch), 2)
        for k in ("gr_active", "tensor_active", "pcie_mb_s"):
            v[k] = None
    if not node.iowait:
        v["cpu_iowait"] = None
    if not job.reads_known:
        v["read_mb_s"] = None
    if rng.random() < 0.01:
        v["cpu_cores"] = v["cpu_iowait"] = v["read_mb_s"] = None
    for k, x in v.items():
        if isinstance(x, float):
            rates = k in ("pcie_mb_s", "cpu_cores", "read_mb_s")
            v[k] = round(x, 3) if rates else round(min(x, 1.0), 4)
    window = Window(node=node.name, server=server, t=t, user_idle_s=round(away, 1), **v)
    return window, (truth if window.sm_active is not None else UNKNOWN)


def _server(rng: random.Random, index: int, label: str, node: Node, n: int, t0: float) -> list:
    job = _job(rng, label, node)
    server = f"rf{index:05d}/" if rng.random() < 0.6 else f"rf{index:05d}/nb{index % 5}"
    rows = []
    away = _log(rng, 1.0, 40.0) * 3600 if label == ZOMBIE else _u(rng, 0.0, 300.0)
    tick = rng.random() < 0.3
    job.interactive = label == HEALTHY and rng.random() < 1 / 3
    leaves = label != ZOMBIE and not job.interactive and rng.random() < 0.4
    epoch = rng.randint(5, 40)
    checkpoint = rng.randint(15, 60)
    cell, pause = rng.randint(2, 12), 0
    for i in range(n):
        t = t0 + (i + 1) * WINDOW_S
        if label == ZOMBIE:
            away += WINDOW_S
            values, truth = _idle(rng, job, tick), ZOMBIE
        elif pause > 0:
            pause -= 1
            away = min(away + WINDOW_S, _u(rng, 0.0, 900.0))
            values, truth = _idle(rng, job, False), HEALTHY
            if pause == 0:
                cell = rng.randint(2, 12)
        else:
            phase = "steady"
            if i == 0:
                phase = "load"
            elif i % epoch == 0:
                phase = "eval"
            elif i % checkpoint == 0:
                phase = "checkpoint"
            values, truth = _running(rng, job, phase), label
            if leaves or rng.random() > 0.15:
                away += WINDOW_S
            else:
                away = _u(rng, 0.0, WINDOW_S)
            if job.interactive:
                cell -= 1
                if cell <= 0:
                    pause = rng.randint(1, 8)
                    away = _u(rng, 0.0, 60.0)
        if truth == HEALTHY and values["kernel_busy"] is False and away >= AWAY_S:
            truth = ZOMBIE  # an interactive pause that outlived its owner's presence
        rows.append(_observe(rng, job, server, t, values, away, truth))
    return rows


def generate(
    n_servers: int, windows_per_server: int = 60, seed: int = 0, *, first_server: int = 0
) -> list[tuple[Window, str]]:
    """``(window, truth)`` of ``n_servers`` servers, labels in equal numbers, nodes in turn;
    ordered by time across servers (as a service receives them)."""
    rng = random.Random(f"roofline-{seed}")
    plan = [LABELS[i % len(LABELS)] for i in range(n_servers)]
    rng.shuffle(plan)
    rows = []
    for i, label in enumerate(plan):
        node = NODES[i % len(NODES)]
        t0 = 1_790_000_000.0 + rng.uniform(0, 3600)
        rows.extend(_server(rng, first_server + i, label, node, windows_per_server, t0))
    rows.sort(key=lambda pair: pair[0].t)
    return rows
