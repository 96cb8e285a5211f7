"""World "degraded": a heterogeneous cluster measured badly, jobs as queueing networks.

Written for issue 23's second round, before the model was changed and without looking at how
the model reads a window; frozen (committed) before any model change, its first run reported as
a held-out figure.

Two assumptions set it apart from the other worlds.

**Jobs are closed queueing networks, drawn from demands, not from causes.** A job's batch
visits stations — the storage (one queue), the DataLoader's CPU (``W`` workers: a multi-server
station, in Seidmann's approximation a queue of ``D/W`` and a delay of ``D(W-1)/W``), the main
Python thread (one server) and the GPU (one server) — and ``prefetch`` batches circulate (two
per worker, plus the one in the step). Each job draws its *service demands* independently, on
wide log-uniform ranges: GPU compute and memory time (a card's throughput scales them), the
kernels' SM fill, ops launched per batch and their dispatch cost, the loop's own host work,
bytes and files read per batch, decode CPU per batch, workers, whether the loop synchronises
every step. Exact mean value analysis gives the throughput ``X``; every station's utilisation
is ``X * D`` (the utilisation law). With a synchronising loop (``loss.item()`` every step)
the main thread and the GPU are one station of demand ``host + max(launch, GPU)``; without,
they pipeline. With ``num_workers=0`` reading and decoding are the main thread's. On a host
with fewer cores than threads, the workers and the main thread share the cores.

**The truth is the bottleneck** — the station of largest per-server demand — named by what it
is: storage or the loader's CPU (``data_io``); the main thread, when its own host work is the
largest part of it (``cpu_serial``), or its dispatch (``small_work``); the GPU, when the
kernels take at least 75 % of the main-and-GPU station's demand: ``memory_bandwidth`` if
memory time exceeds compute time, ``small_work`` if the kernels fill under 30 % of the SMs,
else ``healthy``. Near-ties are genuinely ambiguous (two stations both near saturation): the
truth still names the larger.

**The measurement is poor**, as on real heterogeneous clusters:

- a 1-vCPU VM (``cpu_cores`` never above 1, steal time), 2-core cgroup limits, 128-core hosts;
- MIG slices (1g.10gb, 3g.40gb): DCGM's figures are the slice's own; one slice node without
  DCGM, where NVML has no utilisation for a MIG device (``sm_active`` missing: ``unknown``);
- NVML-only nodes (utilisation as ``sm_active``, no ``gr_active``, tensor or PCIe), one of them
  without memory utilisation either; an old DCGM without the tensor field;
- windows of 15, 30 or 60 s, sampled every 1-10 s: a loop whose step is seconds long is busy in
  some samples and idle in others, so a window's utilisation is a mean of few, binary-ish
  samples (aliasing noise, the larger the longer the step against the sample);
- per-node calibration: DRAM counters 0.5-1.6 times (GDDR against HBM, NVML's saturating
  utilisation), plus log-normal noise of 8-25 % on every counter;
- scrape failures: each column missing in 2-8 % of windows; on DCGM nodes 3 % of windows lose
  DCGM and fall back to NVML's utilisation for ``sm_active``;
- delay accounting off on five nodes of twelve, ``read_bytes`` unreadable on two (containers),
  per-thread CPU reported on half; Lustre reads counted but its waits not block I/O;
- spikes: a checkpoint load or a ``pip install`` in the same tree reads hundreds of MB/s for a
  window now and then;
- a sixth of servers are scripts run from a terminal (``kernel_busy`` missing) and a tenth
  have no ``user_idle_s`` (driven through the API).

Idle and zombie: an idle kernel holds its memory; its card reads a per-node floor of 0-3 %
(an MPS daemon, a monitoring probe) with noise; the owner is around (``healthy``) or gone for
more than ``AWAY_S`` (``zombie``). A terminal whose process tree does nothing, with memory
held and its owner gone, is a zombie too.
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
    MEMORY_BANDWIDTH,
    SMALL_WORK,
    UNKNOWN,
    ZOMBIE,
)

AWAY_S = 1800.0
RUNNING = (HEALTHY, DATA_IO, CPU_SERIAL, MEMORY_BANDWIDTH, SMALL_WORK)
GPU_BOUND = 0.75
SMALL_FILL = 0.3
COLUMNS = ("dram_active", "tensor_active", "pcie_mb_s", "gpu_mem_frac", "cpu_cores",
           "cpu_iowait", "read_mb_s", "user_idle_s", "gr_active", "cpu_top_thread")  # fmt: skip


@dataclass(frozen=True)
class Node:
    name: str
    speed: float  # GPU throughput against an A100
    bandwidth: float  # DRAM bandwidth against an A100
    cores: float  # CPU the server may use (a cgroup limit, or the whole VM)
    cpu_speed: float
    storage_mb_s: float
    latency_s: float
    dcgm: bool
    missing: frozenset  # columns this node never reports
    window_s: float
    sample_s: float
    dram_scale: float  # the DRAM counter's calibration against the true interface activity
    noise: float  # log-normal sigma of its counters
    idle_floor: float  # SM activity its idle card reads
    steal: float  # share of a core lost to neighbours (VMs)
    mem_gib: float


def _m(*names: str) -> frozenset:
    return frozenset(names)


NVML = _m("gr_active", "tensor_active", "pcie_mb_s")
NODES = (
    Node("dg-t4-1vcpu", 0.25, 0.2, 1.0, 0.8, 120, 0.003, False,
         NVML | _m("cpu_iowait", "cpu_top_thread"), 60, 1, 1.4, 0.25, 0.01, 0.15, 16),
    Node("dg-a100-128c", 1.0, 1.0, 128, 1.0, 12000, 0.0002, True, _m(), 30, 1, 1.0, 0.08,
         0.0, 0.0, 80),
    Node("dg-a100-1g", 1 / 7, 1 / 8, 4, 1.0, 3000, 0.0002, True, _m("cpu_top_thread"), 30, 5,
         1.1, 0.12, 0.02, 0.0, 10),
    Node("dg-h100-3g", 3 / 7 * 3.2, 0.5 * 2.1, 24, 1.1, 5000, 0.0002, True, _m(), 60, 10, 0.8,
         0.15, 0.0, 0.0, 40),
    Node("dg-a30-1g-nvml", 1 / 4 * 0.5, 1 / 4 * 0.6, 8, 1.0, 2000, 0.0003, False,
         NVML | _m("cpu_top_thread"), 60, 1, 1.0, 0.15, 0.0, 0.0, 6),
    Node("dg-l40s-nvml", 1.2, 0.55, 32, 1.1, 3000, 0.0002, False,
         NVML | _m("dram_active", "read_mb_s"), 15, 1, 1.0, 0.2, 0.0, 0.0, 48),
    Node("dg-3090-ws", 0.9, 0.6, 24, 1.25, 3500, 0.0002, False, NVML | _m("cpu_iowait"), 60, 1,
         1.6, 0.12, 0.02, 0.0, 24),
    Node("dg-v100-lustre", 0.4, 0.58, 40, 0.9, 4000, 0.002, True, _m("tensor_active"), 60, 10,
         0.7, 0.1, 0.0, 0.0, 32),
    Node("dg-a10-ceph", 0.4, 0.4, 6, 0.85, 150, 0.005, False, NVML | _m("cpu_top_thread"), 30,
         2, 1.3, 0.2, 0.03, 0.08, 24),
    Node("dg-h100-nvl", 3.0, 2.5, 96, 1.1, 8000, 0.0002, True, _m("read_mb_s"), 60, 5, 0.5,
         0.1, 0.0, 0.0, 94),
    Node("dg-p100-hdd", 0.2, 0.47, 28, 0.75, 150, 0.008, False,
         NVML | _m("cpu_iowait", "cpu_top_thread"), 60, 1, 1.2, 0.25, 0.0, 0.0, 16),
    Node("dg-a40-2c", 0.5, 0.45, 2, 1.0, 2500, 0.0003, True, _m("cpu_iowait"), 30, 1, 1.2,
         0.15, 0.01, 0.0, 48),
)  # fmt: skip
LUSTRE = "dg-v100-lustre"


def _u(rng, a, b):
    return rng.uniform(a, b)


def _lu(rng, a, b):
    return math.exp(rng.uniform(math.log(a), math.log(b)))


# -- a job: demands per batch ----------------------------------------------------------------------


def _job(rng: random.Random) -> dict:
    """Service demands per batch on a reference node (an A100, a 1.0 core), drawn independently:
    the truth follows from them, not the other way round."""
    fill = _u(rng, 0.7, 1.0) if rng.random() < 0.75 else _u(rng, 0.05, 0.45)
    # kernels that fill few SMs are small ones: little work per batch
    compute = _lu(rng, 0.002, 2.0) if fill >= 0.7 else _lu(rng, 0.0005, 0.05)
    return {
        "compute": compute,
        "memory": compute * _lu(rng, 0.05, 6.0),
        "fill": fill,
        "tensor": _u(rng, 0.3, 0.7) if rng.random() < 0.6 else 0.0,
        "ops": int(_lu(rng, 80, 6000)),
        "op_s": _u(rng, 5e-6, 25e-6),
        "host": 0.0 if rng.random() < 0.5 else _lu(rng, 0.001, 3.0),
        "bytes": 0.0 if rng.random() < 0.5 else _lu(rng, 1e5, 5e8),
        "files": rng.choice([1, 1, 16, 64, 256]),
        "decode": 0.0 if rng.random() < 0.45 else _lu(rng, 0.005, 5.0),
        "workers": rng.choice([0, 0, 1, 2, 4, 8, 16, 32, 64]),
        "sync": rng.random() < 0.6,
        "mem": _u(rng, 0.02, 0.95),
        "pcie_mb": _lu(rng, 0.1, 200.0),  # per batch, to the card
    }


def _mva(queues: list[float], delay: float, n: int) -> float:
    """Throughput of a closed network of single-server queues of demands ``queues`` and a delay
    ``delay``, with ``n`` customers (exact MVA)."""
    lengths = [0.0] * len(queues)
    x = 0.0
    for k in range(1, n + 1):
        residence = [d * (1 + q) for d, q in zip(queues, lengths, strict=True)]
        x = k / (delay + sum(residence))
        lengths = [x * r for r in residence]
    return x


def _state(rng: random.Random, j: dict, node: Node, drift: float) -> tuple[dict, str, float]:
    """One window's true means of a running job, its truth and its step time."""
    gpu_compute = j["compute"] / node.speed * drift
    gpu_memory = j["memory"] / node.bandwidth * drift
    gpu = max(gpu_compute, gpu_memory) + 0.3 * min(gpu_compute, gpu_memory)
    cpu = node.cpu_speed * (1.0 - node.steal)
    launch = j["ops"] * j["op_s"] / cpu
    host = j["host"] / cpu * _u(rng, 0.9, 1.1)
    share = _u(rng, 0.6, 1.0)  # storage shared with neighbours
    read = j["bytes"] / (node.storage_mb_s * 1e6 * share) + (
        j["files"] * node.latency_s if j["bytes"] else 0.0
    )
    decode = j["decode"] / cpu
    workers = min(j["workers"], 64)
    threads = workers + 1
    contention = max(1.0, threads / node.cores)  # more threads than cores: each runs slower
    stations: dict[str, float] = {}
    delay = 0.0
    if workers:
        parallel = min(workers, max(1.0, node.cores - 1.0))
        stations["storage"] = read
        stations["loader"] = decode * contention / parallel
        delay += decode * contention * (parallel - 1) / parallel
        main_input = 0.0
    else:
        main_input = read + decode
    main_own = host * contention + main_input
    if j["sync"]:
        stations["step"] = main_own + max(launch * contention, gpu)
    else:
        stations["main"] = main_own + launch * contention
        stations["gpu"] = gpu
    customers = 2 * workers + 1 if workers else 1
    x = _mva(list(stations.values()), delay, min(customers, 17))
    busy = min(1.0, x * gpu)
    # the truth: the bottleneck station, named by what it is
    bottleneck = max(stations, key=stations.get)
    if bottleneck in ("storage", "loader"):
        truth = DATA_IO
    else:
        main_parts = {DATA_IO: main_input, CPU_SERIAL: host * contention,
                      SMALL_WORK: launch * contention}  # fmt: skip
        gpu_bound = bottleneck == "gpu" or (
            bottleneck == "step" and gpu >= GPU_BOUND * stations["step"]
        )
        if gpu_bound:
            if gpu_memory > gpu_compute:
                truth = MEMORY_BANDWIDTH
            elif j["fill"] < SMALL_FILL:
                truth = SMALL_WORK
            else:
                truth = HEALTHY
        else:
            if bottleneck == "step":
                main_parts[SMALL_WORK] = max(0.0, launch * contention - gpu)
            truth = max(main_parts, key=main_parts.get)
    # what the process tree and the card show
    main_util = min(1.0, x * (main_own + launch * contention))
    waits_gpu = bottleneck in ("gpu", "step") and truth in (HEALTHY, MEMORY_BANDWIDTH, SMALL_WORK)
    spin = (1.0 - main_util) * (0.9 if waits_gpu else 0.05) if rng.random() < 0.8 else 0.0
    main_cpu = min(1.0, main_util - x * read * (not workers) + spin)
    loader_cpu = x * decode if workers else 0.0
    cores = min(node.cores, main_cpu + loader_cpu + 0.03) * (1.0 - node.steal)
    per_worker = loader_cpu / min(workers, node.cores) if workers else 0.0
    memory_share = gpu_memory / (gpu_memory + gpu_compute)
    v = {
        "gr": busy,
        "sm": busy * j["fill"],
        "dram": busy * min(1.0, 0.1 + 0.85 * memory_share),
        "tensor": busy * j["tensor"] * (1.0 - memory_share),
        "pcie": x * j["pcie_mb"],
        "cores": cores,
        "top": min(1.0, max(main_cpu, per_worker)) * (1.0 - node.steal),
        "iowait": min(1.0, x * read),
        "reads": x * j["bytes"] / 1e6,
    }
    return v, truth, 1.0 / max(x, 1e-9)


# -- measuring a window ----------------------------------------------------------------------------


def _measure(rng, node: Node, server: str, t: float, v: dict, step: float, mem: float,
             busy_flag, away, terminal: bool, no_idle: bool) -> Window:  # fmt: skip
    def noisy(x: float) -> float:
        return x * math.exp(rng.gauss(0.0, node.noise))

    # aliasing: each sample sees the GPU busy or not, the more so the longer the step
    samples = max(1, int(node.window_s / node.sample_s))
    spread = math.sqrt(max(0.0, v["gr"] * (1 - v["gr"]))) * min(1.0, step / node.sample_s)
    gr = sum(min(1.0, max(0.0, rng.gauss(v["gr"], spread))) for _ in range(samples)) / samples
    scale = gr / v["gr"] if v["gr"] > 0 else 0.0
    gr = min(1.0, noisy(gr) + node.idle_floor * _u(rng, 0.3, 1.7))
    sm = min(gr, noisy(v["sm"] * scale) + node.idle_floor * _u(rng, 0.2, 1.5))
    dram = min(1.0, noisy(v["dram"] * scale) * node.dram_scale)
    dcgm = node.dcgm and rng.random() >= 0.03
    values = {
        "sm_active": round(sm, 4) if dcgm else round(gr, 2),
        "gr_active": round(gr, 4) if dcgm else None,
        "dram_active": round(dram, 4) if dcgm else round(1 - math.exp(-2.5 * dram), 2),
        "tensor_active": round(min(1.0, noisy(v["tensor"] * scale)), 4) if dcgm else None,
        "pcie_mb_s": round(noisy(v["pcie"]), 1) if dcgm else None,
        "gpu_mem_frac": round(mem, 4),
        "cpu_cores": round(noisy(v["cores"]), 2),
        "cpu_iowait": round(min(1.0, noisy(v["iowait"])), 3) if node.name != LUSTRE else 0.0,
        "read_mb_s": round(noisy(v["reads"]), 1),
        "user_idle_s": None if no_idle else round(away, 0),
        "cpu_top_thread": round(min(1.0, noisy(v["top"])), 2),
    }
    if node.cores <= 1.0:
        values["cpu_cores"] = min(1.0, values["cpu_cores"])
    if rng.random() < 0.02:  # a checkpoint load or pip install in the same process tree
        values["read_mb_s"] = round(values["read_mb_s"] + _lu(rng, 50, 800), 1)
    if node.name.startswith("dg-a30-1g"):  # NVML has no utilisation for a MIG device
        values["sm_active"] = None
    for column in COLUMNS:
        if column in node.missing or rng.random() < _u(rng, 0.02, 0.08):
            values[column] = None
    return Window(
        node=node.name,
        server=server,
        t=t,
        kernel_busy=None if terminal else busy_flag,
        **values,
    )


def _idle() -> dict:
    return {"gr": 0.0, "sm": 0.0, "dram": 0.0, "tensor": 0.0, "pcie": 0.2, "cores": 0.02,
            "top": 0.01, "iowait": 0.0, "reads": 0.0}  # fmt: skip


def _server(rng, index: int, node: Node, n: int, t0: float) -> list[tuple[Window, str]]:
    """One server: runs of the job, pauses while its owner is around, and for some, the owner
    gone with the memory held."""
    # labels come out of the physics in uneven numbers (random demands rarely make a loop
    # launch-bound); a job is redrawn until its nominal bottleneck is the one this server was
    # given, so every label has servers enough to be measured. The truth stays the physics'.
    wanted = RUNNING[index % len(RUNNING)]
    for _ in range(400):
        j = _job(rng)
        if _state(random.Random(0), j, node, 1.0)[1] == wanted:
            break
    server = f"dg{index:05d}/"
    terminal = rng.random() < 1 / 6
    no_idle = rng.random() < 0.1
    # a quarter of owners leave with the memory held: some while the job still ran (their
    # last touch was up to 25 minutes before it ended), some sessions found already abandoned
    gone_at = rng.randint(0, n // 2) if rng.random() < 0.25 else n + 1
    away = _u(rng, 0.0, 600.0)
    running, left = True, rng.randint(3, 30)
    rows = []
    t = t0
    for k in range(n):
        t += node.window_s * _u(rng, 0.95, 1.05)
        if k >= gone_at:
            if running:
                away = _u(rng, 0.0, 1500.0) if k else _lu(rng, 1800.0, 40 * 3600.0)
            running = False
            away += node.window_s
        else:
            if left <= 0:
                running = not running or rng.random() < 0.3
                left = rng.randint(3, 30) if running else rng.randint(1, 10)
            left -= 1
            away = away + node.window_s if rng.random() < 0.7 else _u(rng, 0.0, 120.0)
        if running:
            v, truth, step = _state(rng, j, node, _lu(rng, 0.85, 1.15))
        else:
            v, truth, step = _idle(), (ZOMBIE if away >= AWAY_S else HEALTHY), 1.0
            v["gr"] = 0.0
        window = _measure(rng, node, server, t, v, step, j["mem"], running, away, terminal,
                          no_idle)  # fmt: skip
        if not running and no_idle and truth == ZOMBIE:
            truth = UNKNOWN  # the owner is gone, but nothing measured says so: not decidable
        rows.append((window, truth if window.sm_active is not None else UNKNOWN))
    return rows


def generate(
    n_servers: int, windows_per_server: int = 60, seed: int = 0, *, first_server: int = 0
) -> list[tuple[Window, str]]:
    """``(window, truth)`` of ``n_servers`` servers on nodes drawn at random; ordered by time."""
    rng = random.Random(f"degraded-{seed}")
    rows = []
    for i in range(n_servers):
        node = rng.choice(NODES)
        t0 = 1_840_000_000.0 + rng.uniform(0, 4 * 3600)
        rows.extend(_server(rng, first_server + i, node, windows_per_server, t0))
    rows.sort(key=lambda pair: pair[0].t)
    return rows
