"""World "contention": shared nodes as ``/proc`` and dcgm-exporter see them, over time.

Written for issue 23's third round before any model change and without reading how the model
reads a window (only the column contract of ``diagnose.features`` and the labels); committed
before the model changed, its first run reported as the held-out figure.

What sets it apart from the other worlds is *time*: a job's window is not a draw from a fixed
signature but a slice of a timeline on a node that other tenants share, measured by two
clocks that disagree.

**A step is a race of four clocks** (milliseconds per batch, prefetching overlaps them): the
GPU's kernels (``t_gpu``), the main thread (dispatching ``k`` ops at 8-30 us each (eager PyTorch) plus the
loop's own Python, ``t_main``), the storage (bytes per batch over the rate the node's share of
the storage gives now, ``t_read``) and the loader's CPU (decode per batch over the cores the
workers get now, ``t_decode``). The step takes the longest; the GPU is busy ``t_gpu / step``
of it. With ``num_workers=0`` the main thread reads and decodes too, in series. A main thread
that waits on the GPU spins in ``cudaStreamSynchronize`` on half the jobs (CUDA's default
when there are more cores than contexts) and reads a busy core while the GPU is fed — what a
healthy PyTorch loop looks like in ``/proc``; one that waits on the loader's queue blocks on a
futex and reads idle.

**The node is shared, and it changes.** Neighbours' CPU load is an AR(1) process: a thread
gets ``1 / (1 + oversubscription)`` of a core, a VM loses steal time, a cgroup quota of 1-8
cores caps the whole tree (CFS throttling): a loop that was fed at night is host-bound by day.
Network storage (NFS, Lustre) gives each client a share of its bandwidth that moves with the
other nodes' load. The page cache warms: a dataset that fits in memory is read from storage in
its first epoch only, after which a storage-bound job is fed (or decode-bound).

**Truth is lost GPU time, by who lost it.** Over the window's own span (the ``/proc`` clock),
each phase's shortfall of GPU busy time is booked to its limiter: the storage (``data_io``);
the host's CPU — the loop's own Python, a checkpoint's serialisation, a contended core
(``cpu_serial``); the dispatch of kernels shorter than their launch (``small_work``). If the
GPU is busy at least 80 % of the window, the label is the kernels' own: ``memory_bandwidth``
(the memory interface near its peak), ``small_work`` (kernels that fill under 40 % of the
SMs), else ``healthy``; otherwise the limiter that lost the most time.

Round four relabelled two limiters to the definitions written in docs/api.md ("What each label
means"), which this world had read otherwise: a decode-bound loader (workers, or the main
thread with ``num_workers=0``) is ``data_io`` — the input pipeline, whose fix (workers, DALI,
decoded data) is the loader's — where it was ``cpu_serial``; a launch-bound loop is
``small_work`` whatever SMs its kernels fill, where it was ``cpu_serial`` above ``TINY``. The
decode job kinds moved from the ``cpu_serial`` draw to the ``data_io`` one, so each label keeps
its share of jobs.

**Timelines**: epochs of 3-30 minutes, each ending in a DataLoader restart (workers forked
again, their first batches read: 5-40 s of an idle GPU) and every 10-40 minutes a checkpoint
(the main thread pickling and writing: 5-60 s, one core busy, nothing read); notebooks pause
between cells (the owner around: ``healthy``; gone past ``AWAY_S`` with memory held:
``zombie``); training left running overnight with the owner away for hours (running:
never a zombie); a fifth of jobs run from a terminal (``kernel_busy`` missing).

**What ``/proc`` shows** (the server extension's view of the process tree):

- ``cpu_cores``: utime + stime over the window, in clock ticks (10 ms: a 10 s window reads in
  steps of 0.001 cores), plus the kernel's own threads (heartbeat, progress bars, a
  TensorBoard writer: 0.02-0.15 cores);
- ``cpu_top_thread``: the busiest thread's share of a core, on the nodes that report it;
- ``read_mb_s``: ``read_bytes``, counted at ``submit_bio``: all of a local disk's reads, a
  node-specific part of NFS and Lustre reads (their buffered reads skip the block layer on
  some kernels), none of a FUSE mount's (gcsfuse, s3fs) or of an object store streamed over
  HTTP (socket reads are not storage reads);
- ``cpu_iowait``: block-I/O delay (``delayacct_blkio_ticks``) of the tree over the window,
  capped at 1. Waits in ``io_schedule`` count (local disks, NFS page waits), waits on a FUSE
  daemon or a socket do not. Since Linux 5.14 ``kernel.task_delayacct`` is off by default:
  on those nodes the field exists and reads **0**, not missing; on others the sampler knows
  and leaves it out.

**What DCGM shows**: dcgm-exporter averages each profiling field over its collection interval
(1, 10 or 30 s) and the hub reads the latest value, so a window's GPU columns cover the last
``max(window, interval)`` seconds, ending up to an interval *before* the window ends: the GPU
and ``/proc`` columns of a window that starts or ends a pause disagree. Nodes: DCGM with the
profiling fields (SM, DRAM, tensor, PCIe, engine), an old DCGM without tensor and engine, MIG
instances (their own SMs and memory), and NVML-only nodes (utilisation is the share of *time*
any kernel ran — tiny kernels back to back read near 100 % — and memory utilisation the share
of time memory was touched). The exporter restarts now and then: the GPU columns are missing
for a few windows in a row. Counters carry per-node multiplicative noise of 5-20 % with heavy
tails (a Student-t of 3 degrees of freedom) and per-card DRAM scales (GDDR cards read higher
for the same traffic). Idle cards read a per-node floor of 0-3 % (a co-tenant on a
time-sliced card, a monitoring probe).

Windows are 10, 30, 60, 120 or 300 s, per node (the hub's report interval).
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

AWAY_S = 1800.0
FED = 0.8  # GPU busy share at or above which the window is the kernels' own label
TINY = 0.4  # kernels filling fewer SMs than this are small


@dataclass(frozen=True)
class Node:
    name: str
    gpu: str  # "dcgm", "dcgm-old" (no tensor, no engine), "mig", "nvml"
    fill: float  # how much of the SMs a well-sized kernel fills on this card
    dram_scale: float  # the DRAM counter for the same traffic (GDDR higher)
    mem_gb: float  # card (or slice) memory
    interval_s: float  # dcgm-exporter's collection interval
    window_s: float  # the hub's report interval
    cores: int
    quota: float | None  # cgroup CPU quota per server (cores), None: none
    steal: float  # VM: share of CPU time lost to the hypervisor under load
    crowd: float  # neighbours' mean oversubscription of the cores (0: none)
    storage: str  # nvme, sata, hdd, nfs, lustre, fuse, http
    storage_mb_s: float  # what the storage gives one client at most
    shared_storage: bool  # its share moves with other nodes' load
    read_visible: float  # share of reads ``read_bytes`` counts
    wait_visible: float  # share of read waits that are block-I/O delay
    delayacct: str  # "on", "zero" (off: reads 0), "missing"
    top_thread: bool  # cpu_top_thread reported
    idle_floor: float  # SM activity of an idle card
    noise: float  # counters' noise (log scale)
    page_cache_gb: float


NODES = (
    Node("c-h100-a", "dcgm", 0.9, 0.8, 80, 1, 30, 64, None, 0.0, 0.1, "nvme", 3000, False, 1.0, 1.0, "on", True, 0.0, 0.06, 400),
    Node("c-h100-b", "dcgm", 0.88, 0.85, 80, 30, 10, 96, 8.0, 0.0, 0.4, "lustre", 2500, True, 0.6, 0.8, "zero", True, 0.01, 0.1, 600),
    Node("c-a100-a", "dcgm", 0.85, 1.0, 40, 10, 60, 32, 4.0, 0.0, 0.25, "nfs", 900, True, 0.5, 0.9, "on", False, 0.0, 0.08, 120),
    Node("c-a100-mig", "mig", 0.8, 1.0, 20, 10, 30, 32, 2.0, 0.0, 0.2, "nvme", 2500, False, 1.0, 1.0, "on", True, 0.02, 0.12, 60),
    Node("c-l4-vm", "dcgm", 0.75, 1.5, 24, 30, 120, 8, None, 0.15, 0.3, "http", 600, True, 0.0, 0.0, "zero", True, 0.0, 0.15, 24),
    Node("c-t4-vm", "nvml", 0.7, 1.4, 16, 1, 60, 4, None, 0.2, 0.6, "fuse", 300, True, 0.0, 0.0, "missing", False, 0.03, 0.2, 12),
    Node("c-a10-a", "dcgm-old", 0.78, 1.3, 24, 10, 300, 16, 3.0, 0.0, 0.15, "sata", 450, False, 1.0, 1.0, "on", False, 0.0, 0.1, 48),
    Node("c-v100-a", "dcgm-old", 0.82, 1.1, 32, 30, 30, 40, None, 0.0, 0.5, "hdd", 160, False, 1.0, 1.0, "zero", True, 0.015, 0.12, 180),
    Node("c-4090", "nvml", 0.8, 1.3, 24, 1, 10, 24, None, 0.0, 0.1, "nvme", 3500, False, 1.0, 1.0, "on", True, 0.0, 0.05, 60),
    Node("c-a100-b", "dcgm", 0.86, 0.95, 80, 1, 120, 128, 6.0, 0.0, 0.8, "nfs", 1200, True, 0.3, 0.5, "on", True, 0.0, 0.08, 900),
    Node("c-h200", "dcgm", 0.9, 0.75, 141, 10, 60, 64, None, 0.0, 0.1, "lustre", 5000, True, 1.0, 1.0, "zero", False, 0.01, 0.07, 1000),
    Node("c-l40s", "nvml", 0.8, 1.2, 48, 1, 300, 32, 2.0, 0.0, 0.35, "fuse", 800, True, 0.0, 0.0, "on", True, 0.025, 0.12, 128),
)  # fmt: skip


def _u(rng, a, b):
    return rng.uniform(a, b)


def _lu(rng, a, b):
    return math.exp(rng.uniform(math.log(a), math.log(b)))


@dataclass
class Job:
    label: str  # the cause it was set up with (the truth is computed, window by window)
    t_gpu: float  # ms of kernels per batch
    fill: float  # share of SMs the kernels fill while they run
    dram: float  # memory interface busy while kernels run (0..1, before the card's scale)
    tensor: float  # tensor pipes busy while kernels run
    kernels: int  # launched per batch
    launch_us: float
    python_ms: float  # the loop's own host work per batch (at a full core)
    workers: int
    decode_ms: float  # CPU per batch to decode / augment
    batch_mb: float  # read per batch from storage when not cached
    files: int  # files opened per batch (metadata latency on network storage)
    dataset_gb: float
    spin: bool
    mem: float  # memory held
    epoch_s: float
    restart_s: float
    ckpt_every_s: float
    ckpt_s: float


def _job(rng: random.Random, label: str, node: Node) -> Job:
    t_gpu = _lu(rng, 40, 400)
    j = Job(
        label, t_gpu, node.fill * _u(rng, 0.75, 1.0), _u(rng, 0.1, 0.45),
        _u(rng, 0.25, 0.7) if rng.random() < 0.7 else 0.0, rng.randint(300, 4000),
        _u(rng, 8, 30), _lu(rng, 1, 15), rng.choice([2, 4, 6, 8, 12, 16]), _lu(rng, 10, 120),
        _lu(rng, 2, 60), rng.randint(1, 64), _lu(rng, 1, 2000), rng.random() < 0.5,
        _u(rng, 0.2, 0.95), _u(rng, 180, 1800), _u(rng, 5, 40), _u(rng, 600, 2400),
        _u(rng, 5, 60),
    )  # fmt: skip
    j.decode_ms = min(j.decode_ms, 0.5 * t_gpu * j.workers)
    if label in (HEALTHY, MEMORY_BANDWIDTH):  # eager PyTorch: 8-30 us of dispatch an op
        j.kernels = min(j.kernels, int(0.6 * t_gpu * 1000 / j.launch_us))
    if label == HEALTHY:
        j.python_ms = min(j.python_ms, 0.3 * t_gpu)
    elif label == MEMORY_BANDWIDTH:
        j.dram, j.tensor = _u(rng, 0.7, 0.95), _u(rng, 0.0, 0.05)
        j.fill = min(0.97, node.fill * _u(rng, 0.85, 1.05))  # warps stalled on memory are active
        j.python_ms = min(j.python_ms, 0.3 * t_gpu)
    elif label == SMALL_WORK:
        j.fill, j.dram, j.tensor = _u(rng, 0.05, 0.35), _u(rng, 0.03, 0.2), _u(rng, 0.0, 0.08)
        j.kernels = rng.randint(300, 3000)
        # kernels of microseconds: the GPU time is about what launching them takes
        j.t_gpu = j.kernels * j.launch_us / 1000 * _u(rng, 0.5, 1.3)
        j.python_ms = min(j.python_ms, 0.2 * j.t_gpu)
        j.mem = _u(rng, 0.01, 0.2)
        j.decode_ms, j.batch_mb = min(j.decode_ms, 0.3 * j.t_gpu * j.workers), j.batch_mb / 10
    elif label == DATA_IO:
        kind = rng.choice(["bandwidth", "bandwidth", "files", "main", "decode", "main-decode"])
        j.dataset_gb = node.page_cache_gb * _u(rng, 1.5, 6)  # never all cached
        if kind == "bandwidth":  # big samples, storage slower than the GPU eats them
            j.batch_mb = node.storage_mb_s * t_gpu / 1000 * _u(rng, 1.5, 5)
            j.files = rng.randint(1, 16)
        elif kind == "files":  # many small files on a network mount: opens, not bytes
            j.files = rng.randint(256, 1024)
            j.workers = rng.choice([1, 2, 4])
        elif kind == "main":  # num_workers=0: the main thread reads between steps
            j.workers = 0
            j.batch_mb = node.storage_mb_s * t_gpu / 1000 * _u(rng, 1.0, 4)
            j.decode_ms = _u(rng, 0.05, 0.3) * t_gpu
        elif kind == "decode":  # heavy augmentation on too few workers (or a quota)
            j.workers = rng.choice([1, 2, 3])
            j.decode_ms = t_gpu * j.workers * _u(rng, 1.5, 5)
            j.dataset_gb = node.page_cache_gb * _u(rng, 0.1, 0.5)  # cached: nothing read
        else:  # num_workers=0 decoding from the page cache
            j.workers = 0
            j.decode_ms = t_gpu * _u(rng, 1.4, 5)
            j.dataset_gb = node.page_cache_gb * _u(rng, 0.1, 0.5)
    elif label == CPU_SERIAL:  # per-step Python: tokenising, a metric in a loop, .item()
        j.python_ms = t_gpu * _u(rng, 1.4, 6)
    else:  # healthy-ish loader for the GPU-side labels: cached or fast enough
        pass
    if label in (HEALTHY, MEMORY_BANDWIDTH, SMALL_WORK):
        rate = node.storage_mb_s * 0.5
        j.batch_mb = min(j.batch_mb, rate * j.t_gpu / 1000 * 0.5)
        j.files = min(j.files, 16)
    j.mem = min(1.0, j.mem)
    return j


@dataclass
class Env:
    """The node now: what a thread gets of a core, the tree's cap, the storage's share."""

    thread: float
    cap: float
    storage: float


def _step(job: Job, node: Node, env: Env, cached: bool) -> dict:
    """One batch's clocks under ``env``: the GPU busy share, the CPU the tree uses, the reads,
    the block-I/O delay, and which limiter lost the GPU time."""
    launch = job.kernels * job.launch_us / 1000
    main_cpu = (launch + job.python_ms) / env.thread  # ms of wall time at the share it gets
    rate = node.storage_mb_s * env.storage
    latency = 0.0 if cached or node.storage in ("nvme", "sata") else job.files * (
        0.3 if node.storage in ("nfs", "lustre") else 2.0 if node.storage in ("fuse", "http") else 0.0
    )  # fmt: skip
    if node.storage == "hdd" and not cached:
        latency = job.files * 8.0  # a seek per file
    read = 0.0 if cached else job.batch_mb / rate * 1000 + latency
    if job.workers == 0:  # the main thread reads and decodes between steps, in series
        t_main = main_cpu + read + job.decode_ms / env.thread
        t_loader = 0.0
    else:
        cores = max(0.2, min(job.workers * env.thread, env.cap - 1.0))
        t_decode = max(job.decode_ms / cores, job.decode_ms / env.thread / job.workers)
        t_read = 0.0 if cached else max(read / job.workers, job.batch_mb / rate * 1000)
        t_loader = max(t_decode, t_read, (job.decode_ms / env.thread + read) / job.workers)
        t_main = main_cpu
    step = max(job.t_gpu, t_main, t_loader)
    # a cap (cgroup quota) throttles the whole tree: the step stretches until it fits
    demand = (main_cpu * env.thread + job.decode_ms) / step
    if demand > env.cap:
        step *= demand / env.cap
    busy = job.t_gpu / step
    # who lost the GPU time (it matters only where the GPU is starved)
    # (docs/api.md "What each label means": reading and decoding the input is the input
    # pipeline's, whoever runs it; dispatching kernels that each take less than their launch
    # is too little work per kernel, whatever SMs they fill; the loop's own Python is the host's)
    if job.workers == 0:
        parts = {
            CPU_SERIAL: job.python_ms / env.thread,
            DATA_IO: read + job.decode_ms / env.thread,
            SMALL_WORK: launch / env.thread,
        }
        limiter = max(parts, key=parts.get)
    elif t_loader >= max(t_main, job.t_gpu):
        limiter = DATA_IO
    elif t_main >= job.t_gpu:
        limiter = SMALL_WORK if launch >= job.python_ms else CPU_SERIAL
    else:  # GPU-bound but throttled by the quota
        limiter = CPU_SERIAL
    # a main thread waiting on the GPU spins in the sync (on half the jobs); one waiting on the
    # loader's queue blocks
    spin_ms = max(0.0, step - t_main) if job.spin and job.t_gpu >= max(t_main, t_loader) else 0.0
    own = launch + job.python_ms + (job.decode_ms if job.workers == 0 else 0.0)
    main_busy = min(1.0, (own + spin_ms * env.thread) / step)
    # TLS and copies of an object store streamed in-process (a FUSE daemon is another tree)
    net_ms = 2.0 * job.batch_mb if node.storage == "http" and not cached else 0.0
    loader_cores = (job.decode_ms + net_ms) / step if job.workers else net_ms / step
    per_worker = loader_cores / job.workers if job.workers else 0.0
    mb_s = 0.0 if cached else job.batch_mb / step * 1000
    blocked = 0.0 if cached else read / step  # one batch read per step, whoever reads it
    return {
        "busy": busy, "limiter": limiter, "main": main_busy, "cores": main_busy + loader_cores,
        "top": max(main_busy, per_worker), "mb_s": mb_s, "blocked": min(1.0, blocked),
        "pcie": job.batch_mb / step * 1000 * 1.1 + 20,
    }  # fmt: skip


def _gpu(job: Job, node: Node, busy: float) -> dict:
    """The GPU columns' true values for a phase of GPU busy share ``busy``."""
    if node.gpu == "nvml":
        sm = min(1.0, busy * 1.02)  # a kernel ran: the whole time counts
        dram = min(1.0, busy * (0.25 + 1.1 * job.dram))
        return {"sm": sm, "dram": dram, "tensor": None, "gr": None}
    return {"sm": busy * job.fill, "dram": min(1.0, busy * job.dram * node.dram_scale),
            "tensor": busy * job.tensor, "gr": busy}  # fmt: skip


def _noisy(rng, x, sigma):
    if x is None:
        return None
    t = rng.gauss(0, 1) / math.sqrt(max(1e-9, sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3))
    return x * math.exp(sigma * max(-4.0, min(4.0, t)))


def _overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def generate(
    n_servers: int, windows_per_server: int = 60, seed: int = 0, *, first_server: int = 0
) -> list[tuple[Window, str]]:
    """``(window, truth)`` of ``n_servers`` servers, the six labels set up in equal numbers,
    each on a node drawn at random; the truth computed window by window; ordered by time."""
    rng = random.Random(f"contention-{seed}")
    plan = [LABELS[i % len(LABELS)] for i in range(n_servers)]
    rng.shuffle(plan)
    rows = []
    for i, label in enumerate(plan):
        node = rng.choice(NODES)
        server = f"c{first_server + i:05d}/"
        rows.extend(_server(rng, node, server, label, windows_per_server))
    rows.sort(key=lambda pair: pair[0].t)
    return rows


def _server(rng, node: Node, server: str, label: str, n: int) -> list:
    job = _job(rng, label, node)
    w = node.window_s
    terminal = rng.random() < 0.2
    interactive = not terminal and label != ZOMBIE and rng.random() < 0.35
    t = 1_900_000_000.0 + rng.uniform(0, 6 * 3600)
    start = t
    if label == ZOMBIE:
        away = _u(rng, 0.6, 40) * 3600
    else:
        away = _u(rng, 0, 600) if rng.random() < 0.5 else _u(rng, 1, 12) * 3600
    crowd, share = node.crowd, 1.0
    read_gb = 0.0
    pause = 0.0
    ckpt_phase = rng.uniform(0, job.ckpt_every_s)
    outage = 0
    history: list[tuple[float, float, dict]] = []  # (t0, t1, true GPU values) per window
    rows = []
    for _ in range(n):
        t0, t = t, t + w
        crowd = max(0.0, 0.85 * crowd + 0.15 * node.crowd * _u(rng, 0.0, 2.5))
        if node.shared_storage:
            share = min(1.0, max(0.15, 0.8 * share + 0.2 * _u(rng, 0.15, 1.0)))
        env = Env(thread=(1.0 / (1.0 + crowd)) * (1.0 - node.steal * min(1.0, crowd)),
                  cap=node.quota or float(node.cores), storage=share)  # fmt: skip
        running = label != ZOMBIE
        if running and interactive:
            if pause <= 0 and rng.random() < 0.12 * w / 60:
                pause = _lu(rng, 60, 5400)
            if pause > 0:
                running = False
                pause -= w
                away += w
            else:
                away = _u(rng, 0, 120)
        else:
            away += w
        if not running:
            gpu = {"sm": 0.0, "dram": 0.0, "tensor": 0.0, "gr": 0.0}
            cpu = {"cores": _u(rng, 0.0, 0.03), "top": _u(rng, 0.0, 0.02), "mb_s": 0.0,
                   "blocked": 0.0, "pcie": 1.0}  # fmt: skip
            truth = ZOMBIE if away >= AWAY_S else HEALTHY
        else:
            cached = job.dataset_gb < 0.8 * node.page_cache_gb and read_gb >= job.dataset_gb
            s = _step(job, node, env, cached)
            read_gb += s["mb_s"] * w / 1000
            # events in this window: the DataLoader restarting at an epoch's end, a checkpoint
            age = t - start
            restart = _overlap(t0, t, *_last_event(start, age, job.epoch_s, job.restart_s))
            ckpt = _overlap(t0, t, *_last_event(start + ckpt_phase, t - start - ckpt_phase,
                                                job.ckpt_every_s, job.ckpt_s))  # fmt: skip
            f_restart, f_ckpt = restart / w, ckpt / w
            f_main = max(0.0, 1.0 - f_restart - f_ckpt)
            busy = f_main * s["busy"]
            lost = {s["limiter"]: f_main * (1.0 - s["busy"])}
            lost[DATA_IO] = lost.get(DATA_IO, 0.0) + f_restart  # the loader's first batches
            lost[CPU_SERIAL] = lost.get(CPU_SERIAL, 0.0) + f_ckpt
            if busy >= FED:
                if job.fill < TINY:
                    truth = SMALL_WORK
                elif job.dram >= 0.6:
                    truth = MEMORY_BANDWIDTH
                else:
                    truth = HEALTHY
            else:
                truth = max(lost, key=lost.get)
            gpu = _gpu(job, node, busy)
            startup_cores = min(env.cap, max(1, job.workers) * env.thread) * 0.7
            cpu = {
                "cores": f_main * s["cores"] + f_restart * startup_cores + f_ckpt * env.thread,
                "top": f_main * s["top"] + f_restart * 0.7 * env.thread + f_ckpt * env.thread,
                "mb_s": f_main * s["mb_s"] + (0 if cached else f_restart * node.storage_mb_s * share * 0.5),
                "blocked": f_main * s["blocked"] + (0 if cached else f_restart * 0.5),
                "pcie": f_main * s["pcie"] + 1.0,
            }  # fmt: skip
        history.append((t0, t, gpu))
        rows.append(_window(rng, node, server, t, w, job, cpu, history, running, terminal,
                            away, truth, outage))  # fmt: skip
        outage = max(0, outage - 1)
        if node.gpu != "nvml" and rng.random() < 0.01:
            outage = rng.randint(1, 5)
    return rows


def _last_event(origin: float, age: float, every: float, length: float) -> tuple[float, float]:
    """The latest event of ``length`` s recurring ``every`` s after ``origin``."""
    if age < every:
        return (0.0, 0.0)
    k = math.floor(age / every)
    begin = origin + k * every
    return (begin, begin + length)


def _window(rng, node, server, t, w, job, cpu, history, running, terminal, away, truth, outage):
    # the GPU columns: dcgm-exporter's last value, an average over its interval, read late
    span = max(w, node.interval_s)
    lag = rng.uniform(0, node.interval_s) if node.interval_s > 1 else 0.0
    g0, g1 = t - lag - span, t - lag
    acc, total = {"sm": 0.0, "dram": 0.0, "tensor": 0.0, "gr": 0.0}, 0.0
    for a, b, values in reversed(history):
        o = _overlap(a, b, g0, g1)
        if o > 0:
            total += o
            for k in acc:
                acc[k] += o * (values[k] or 0.0)
        if a < g0:
            break
    if total <= 0:
        total, acc = 1.0, dict(history[-1][2])
    g = {k: v / total for k, v in acc.items()}
    if not running or g["sm"] < 0.005:
        g["sm"] = max(g["sm"], node.idle_floor * _u(rng, 0.4, 1.4))
    sigma = node.noise
    sm = min(1.0, _noisy(rng, g["sm"], sigma))
    dram = min(1.0, _noisy(rng, g["dram"], sigma))
    tensor = min(1.0, _noisy(rng, g["tensor"], sigma)) if node.gpu in ("dcgm", "mig") else None
    gr = min(1.0, _noisy(rng, max(g["gr"], sm), sigma)) if node.gpu in ("dcgm", "mig") else None
    if gr is not None:
        gr = max(gr, sm)
    pcie = _noisy(rng, cpu["pcie"], sigma) if node.gpu != "nvml" else None
    if node.gpu == "nvml":
        sm = round(sm, 2)  # NVML reads whole percent
        dram = round(dram, 2)
    if outage:
        sm = dram = tensor = gr = pcie = None
    tick = 0.01 / w
    cores = round(
        _noisy(rng, cpu["cores"], 0.05) + _u(rng, 0.02, 0.15) * (1 if running else 0.2), 4
    )
    cores = round(cores / tick) * tick
    top = min(1.0, _noisy(rng, cpu["top"], 0.05)) if node.top_thread else None
    visible_mb = cpu["mb_s"] * node.read_visible
    read = round(_noisy(rng, visible_mb, 0.1), 2) if visible_mb > 0 else 0.0
    blocked = min(1.0, cpu["blocked"] * node.wait_visible)
    iowait = {"on": round(min(1.0, _noisy(rng, blocked, 0.1)), 3) if blocked > 0 else 0.0,
              "zero": 0.0, "missing": None}[node.delayacct]  # fmt: skip
    window = Window(
        node=node.name, server=server, t=t,
        sm_active=None if sm is None else round(sm, 4),
        dram_active=None if dram is None else round(dram, 4),
        tensor_active=None if tensor is None else round(tensor, 4),
        pcie_mb_s=None if pcie is None else round(pcie, 1),
        gpu_mem_frac=round(job.mem, 4), cpu_cores=round(cores, 4), cpu_iowait=iowait,
        read_mb_s=read, kernel_busy=None if terminal else running,
        user_idle_s=round(away, 1), gr_active=None if gr is None else round(gr, 4),
        cpu_top_thread=None if top is None else round(top, 3),
    )  # fmt: skip
    return window, truth if window.sm_active is not None else UNKNOWN
