"""World "traces": training and inference jobs as profiler traces of real PyTorch show them.

Written for issue 23's second round, before the model was changed and without looking at how
the model reads a window; frozen (committed) before any model change, its first run reported as
a held-out figure.

Where the other worlds draw a cause and make a window look like it, this one builds the job —
what a notebook on a shared cluster really runs (``JOBS``), with the knobs people set (batch
size, DataLoader workers, ``pin_memory``, AMP or fp32, ``loss.item()`` every step or not, the
tokenizer in the loop, vectorised or CPU environments, ``model.generate`` at batch 1) — and
*derives* both the window and the truth from one timeline of a training or inference step.

The step (per job, per window, each quantity from datasheets and published traces):

- **GPU time** ``G``: big GEMMs at 45-75 % of the card's tensor (AMP) or fp32/TF32 peak, which
  fill the SMs (0.85-1.0) with 5-30 % DRAM activity and, with AMP or TF32, the tensor pipes
  busy; elementwise and normalisation kernels at 80-90 % of the card's DRAM bandwidth (the
  DRAM interface 70-92 % busy, no tensor pipes); GEMV of batch-1 decoding, which streams the
  weights (DRAM 60-85 %); and tiny kernels that run 3-8 µs whatever the card and fill only as
  many SMs as they have blocks.
- **Host**: the main Python thread dispatches every op (8-20 µs an op at a 1.0 core speed,
  ``L``), does the loop's own work (``h``: a tokenizer in the loop, a CPU environment, metrics
  in NumPy), and — with ``num_workers=0`` — reads and decodes the batch itself. Pageable
  (not pinned) host-to-device copies block it at ~6 GB/s.
- **Input**: ``W`` DataLoader worker processes each read a batch (bytes at the node's storage
  throughput, shared, plus a per-file latency) and decode it (CPU seconds per sample); they
  supply ``W / (read + decode)`` batches a second, at most the storage's peak. A data set that
  fits the host's RAM is read from disk in its first epoch only (the page cache).
- **The step**: with a ``loss.item()`` every step (a synchronisation), ``S = max(D, main +
  max(L, G))``; without, the host runs ahead of the GPU: ``S = max(D, main + L, G)``; ``D``
  is the loader's batch interval, ``main`` the main thread's own work per step.
- **What the CPU shows**: the main thread is busy for its work and its dispatch, and *spins*
  while it waits for the GPU (CUDA's default schedule spins when the host has more cores than
  contexts): so a healthy GPU-bound loop shows its main thread near a full core. Waiting on
  the loader's queue is a blocked wait (no CPU). Workers show their decode as CPU and their
  reads as I/O wait (block devices, delay accounting on) — not on FUSE mounts, whose reads the
  process tree does not count either.

**The truth** is the step's bottleneck resource, from the same timeline (not from what the job
was drawn to be): if the kernels run at least 75 % of the step, the GPU is the bottleneck —
``memory_bandwidth`` when memory-bound kernels (elementwise, GEMV) take 60 % of the kernel time
or more, ``small_work`` when the kernels fill under 35 % of the SMs on average, else
``healthy``. Otherwise the GPU waits, and the truth is the largest share of that wait:
``data_io`` for the input side (the loader's batch interval, reads and decoding by workers or
the main thread, pageable copies — everything the input pipeline does), ``cpu_serial`` for the
main thread's own work (``h``), ``small_work`` for dispatch beyond the kernels' own time
(``L - G``). An idle kernel (no cell running) is ``healthy`` while its owner is around and a
``zombie`` once they have been away ``AWAY_S`` with memory held; a cell that computes on the
CPU only (pandas, a plot) while the GPU holds memory is ``cpu_serial``. A window whose phase
changes inside it takes the label of the phase that covers most of it.

Over time: an evaluation pass every 15-20 windows for some jobs (forward only: a third of the
kernels, the same loader); a first epoch read from storage and later ones from the page cache
where the data set fits the host's RAM; a loop's own work on helper threads for some (a fast
tokenizer's thread pool, environments in subprocesses: many cores, no thread saturated, the
main thread waiting). Servers are unattended batch runs (the cell busy for hours, the owner
away: not a zombie), interactive notebooks (runs, pauses while the owner thinks, a CPU-only
cell now and then) or abandoned (the job ends, the kernel keeps its memory, the owner is gone).

Measurement: 60 s windows; DCGM (``sm_active``: kernel time times SMs filled, ``gr_active``,
``dram_active``, ``tensor_active``, PCIe) on six nodes of nine, NVML elsewhere (utilisation,
the share of time any kernel ran, in whole percents, as ``sm_active``; NVML's memory
utilisation, the share of time device memory was touched, which saturates, as
``dram_active``); per-window jitter of 3-6 %; per-thread CPU on six nodes; delay accounting on
seven. Idle cards read 0-2 % (a monitoring agent's probes, the persistence daemon). A MIG slice's
figures are the slice's own.
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

WINDOW_S = 60.0
AWAY_S = 1800.0
GPU_BOUND = 0.75  # kernels run at least this share of the step: the GPU is the bottleneck
MEMORY_SHARE = 0.6  # memory-bound kernels' share of kernel time that makes a job memory-bound
SMALL_FILL = 0.35  # below this mean SM fill the kernels are too small for the card


@dataclass(frozen=True)
class Card:
    name: str
    sms: int
    tc: float  # dense fp16/bf16 tensor TFLOPS
    fp32: float  # fp32 TFLOPS without tensor cores
    tf32: float | None  # TF32 tensor TFLOPS (Ampere and later), None where there is none
    bw: float  # DRAM GB/s
    mem: float  # GiB
    pcie: float  # GB/s host to device, pinned


H100 = Card("H100 SXM", 132, 989, 67, 495, 3350, 80, 50)
H100P = Card("H100 PCIe", 114, 756, 51, 378, 2000, 80, 50)
A100 = Card("A100 40GB", 108, 312, 19.5, 156, 1555, 40, 25)
A100_3G = Card("A100 3g.20gb", 42, 134, 8.4, 67, 777, 20, 25)
L4 = Card("L4", 58, 121, 30, 60, 300, 24, 25)
A10G = Card("A10G", 80, 70, 31, 35, 600, 24, 25)
T4 = Card("T4", 40, 65, 8.1, None, 320, 16, 12)
V100 = Card("V100 16GB", 80, 125, 15.7, None, 900, 16, 12)
A6000 = Card("RTX A6000", 84, 155, 38.7, 77, 768, 48, 25)


@dataclass(frozen=True)
class Storage:
    kind: str  # "block" (local disk, EBS), "nfs", "fuse" (an object store mounted)
    mb_s: float  # aggregate read throughput
    latency_s: float  # per file


@dataclass(frozen=True)
class Node:
    name: str
    card: Card
    cores: int
    speed: float  # single-thread speed against a 1.0 reference core
    ram_gb: float
    storage: Storage
    dcgm: bool
    delayacct: bool
    top_thread: bool


NODES = (
    Node("tr-h100", H100, 32, 1.1, 1024, Storage("block", 6000, 0.0002), True, True, True),
    Node("tr-a100-nfs", A100, 64, 1.0, 512, Storage("nfs", 1100, 0.001), True, False, True),
    Node("tr-a100-mig", A100_3G, 16, 1.0, 256, Storage("block", 3000, 0.0002), True, True, False),
    Node("tr-l4-gcs", L4, 16, 0.9, 128, Storage("fuse", 700, 0.04), True, True, True),
    Node("tr-a10g", A10G, 8, 0.85, 32, Storage("block", 250, 0.001), False, True, True),
    Node("tr-t4", T4, 4, 0.8, 16, Storage("block", 500, 0.0005), False, False, False),
    Node("tr-v100", V100, 40, 0.95, 384, Storage("nfs", 600, 0.002), True, True, True),
    Node("tr-a6000", A6000, 32, 1.2, 256, Storage("block", 3500, 0.0002), False, True, True),
    Node("tr-h100p", H100P, 32, 1.0, 512, Storage("nfs", 2000, 0.001), True, True, False),
)

JOBS = ("llm-finetune", "vision", "small-cnn", "llm-generate", "encoder-serve", "ppo", "stencil")


def _u(rng: random.Random, a: float, b: float) -> float:
    return rng.uniform(a, b)


def _lu(rng: random.Random, a: float, b: float) -> float:
    """Log-uniform between a and b."""
    return math.exp(rng.uniform(math.log(a), math.log(b)))


# -- the job: what one step is made of -------------------------------------------------------------


def _job(rng: random.Random, kind: str, node: Node) -> dict:
    """A job's configuration on ``node``: the step's kernels (seconds per class on this card,
    with their SM fill, DRAM and tensor activity), dispatch, host work, input pipeline, copies,
    memory held. Everything per step; the window's figures follow in ``_state``."""
    card = node.card
    amp = rng.random() < 0.7
    dense = card.tc if amp else (card.tf32 or card.fp32)
    tensor = _u(rng, 0.35, 0.7) if amp else (_u(rng, 0.12, 0.3) if card.tf32 else 0.0)
    j = {"kind": kind, "kernels": [], "ops": 300, "host_cpu": 0.0, "host_threads": 1.0,
         "workers": 0, "batch_bytes": 0.0, "files": 0, "decode_cpu": 0.0, "cached": False,
         "h2d": 0.0, "d2h": 0.0, "pinned": True, "sync": rng.random() < 0.6, "mem": 0.3,
         "op_s": _u(rng, 8e-6, 20e-6), "eval_every": 0}  # fmt: skip

    def gemm(flops):
        t = flops / (dense * 1e12 * _u(rng, 0.45, 0.75))
        j["kernels"].append((t, _u(rng, 0.85, 1.0), _u(rng, 0.05, 0.3), tensor))

    def elementwise(nbytes):
        t = nbytes / (card.bw * 1e9 * _u(rng, 0.8, 0.9))
        j["kernels"].append((t, _u(rng, 0.85, 1.0), _u(rng, 0.7, 0.92), 0.0))

    def gemv(nbytes, fill):
        t = nbytes / (card.bw * 1e9 * _u(rng, 0.7, 0.85))
        j["kernels"].append((t, fill, _u(rng, 0.6, 0.85), _u(rng, 0.0, 0.08)))

    def tiny(n, blocks):
        t = n * _u(rng, 3e-6, 8e-6)
        j["kernels"].append((t, min(1.0, blocks / card.sms), _u(rng, 0.02, 0.15), 0.0))

    if kind == "llm-finetune":  # HF Trainer: decoder LM, full or LoRA, pre-tokenised data
        params = rng.choice([0.35e9, 1.3e9, 2.7e9, 7e9])
        batch, seq = rng.choice([1, 2, 4, 8, 16]), rng.choice([128, 512, 1024, 2048])
        tokens = batch * seq
        layers = {0.35e9: 24, 1.3e9: 24, 2.7e9: 32, 7e9: 32}[params]
        gemm((4 if params >= 7e9 else 6) * params * tokens)
        elementwise(tokens * layers * 4096 * 2 * _u(rng, 10, 30))  # norms, softmax, GELU, AdamW
        tiny(layers * 10, 16)
        j["ops"] = layers * rng.choice([40, 60]) + rng.choice([30, 400])  # foreach or loop AdamW
        j["workers"] = rng.choice([0, 2, 4])
        j["batch_bytes"], j["files"], j["cached"] = tokens * 4.0, 1, True
        j["decode_cpu"] = batch * 2e-4
        j["mem"] = _u(rng, 0.45, 0.97)
        j["h2d"] = tokens * 8.0
        j["eval_every"] = rng.choice([0, 0, 20])
        mistake = rng.random()
        if mistake < 0.25:  # tokenising in the step, sometimes with the fast tokenizer's threads
            j["host_cpu"] = tokens * _lu(rng, 2e-6, 2e-5)
            j["host_threads"] = rng.choice([1.0, 1.0, 1.0, 3.0, 6.0])
        elif mistake < 0.4:  # perplexity on the host: logits copied back, softmax in NumPy
            j["d2h"] = tokens * 32000 * 2.0
            j["host_cpu"] = tokens * 32000 * _u(rng, 2e-9, 6e-9)
    elif kind == "vision":  # ResNet-50 / ViT-B / EfficientNet over ImageNet JPEGs
        net = rng.choice(["resnet50", "vit-b", "effnet-b0"])
        batch = rng.choice([64, 128, 256, 512])
        per_image = {"resnet50": 24e9, "vit-b": 52e9, "effnet-b0": 1.2e9}[net]  # train flops
        gemm(per_image * batch)
        elementwise(batch * {"resnet50": 90e6, "vit-b": 40e6, "effnet-b0": 110e6}[net])
        j["ops"] = {"resnet50": 900, "vit-b": 700, "effnet-b0": 1400}[net]
        cores = max(0, node.cores - 2)
        j["workers"] = min(cores, rng.choice([0, 2, 4, 8, 12, 16, 32]))
        j["batch_bytes"], j["files"] = batch * 110e3, batch
        j["decode_cpu"] = batch * _u(rng, 1.5e-3, 9e-3)  # PIL-SIMD .. PIL, RandomResizedCrop
        j["cached"] = node.ram_gb > 300  # 140 GB of JPEGs fit the page cache after epoch 1
        j["pinned"] = rng.random() < 0.6
        j["h2d"] = batch * 3 * 224 * 224 * rng.choice([1.0, 4.0])
        j["mem"] = _u(rng, 0.2, 0.85)
        j["eval_every"] = rng.choice([0, 15])
    elif kind == "small-cnn":  # CIFAR-10 ResNet-18 in a notebook, the data set in RAM
        batch = rng.choice([16, 32, 64, 128, 256, 512])
        gemm(batch * 1.7e9)
        elementwise(batch * 6e6)
        tiny(120, batch * 2)
        j["ops"] = rng.choice([450, 700])
        j["workers"] = rng.choice([0, 0, 2, 4])
        j["batch_bytes"], j["cached"] = batch * 3072.0, True
        j["decode_cpu"] = batch * _u(rng, 3e-5, 1.2e-4)  # crop and flip of a 32x32 image
        j["h2d"] = batch * 3072 * 4.0
        j["pinned"] = rng.random() < 0.5
        j["mem"] = _u(rng, 0.03, 0.25)
        # small layers fill a big card less: the GEMMs' fill shrinks with batch and card size
        t, fill, dram, ten = j["kernels"][0]
        j["kernels"][0] = (t, fill * min(1.0, batch * 0.9 / card.sms), dram, ten)
    elif kind == "llm-generate":  # model.generate in a notebook: decode token by token
        params = rng.choice([0.125e9, 0.35e9, 1.3e9, 7e9, 13e9])
        if params * 2 > card.mem * 2**30 * 0.85:
            params = 1.3e9
        batch = rng.choice([1, 1, 1, 4, 32])
        layers = 12 if params < 0.3e9 else (24 if params < 2e9 else 40)
        fill = min(1.0, params / 1e9 * 0.5 + 0.1)
        gemv(params * 2.0, fill * _u(rng, 0.8, 1.0))
        if batch > 8:
            gemm(2 * params * batch)
        tiny(layers * 6, 8 * batch)
        j["ops"] = layers * rng.choice([18, 25])
        j["host_cpu"] = _u(rng, 0.5e-3, 3e-3)  # logits processors, stopping criteria
        j["sync"] = True  # the stopping criterion reads the token every step
        j["mem"] = min(0.95, params * 2 / (card.mem * 2**30) + _u(rng, 0.03, 0.2))
    elif kind == "encoder-serve":  # a BERT-base classifier over a request file
        batch = rng.choice([1, 1, 2, 8, 64, 256])
        gemm(2 * 110e6 * 128 * batch)
        tiny(12 * 14, 12 * batch)
        j["ops"] = 12 * 20
        j["host_cpu"] = batch * _u(rng, 5e-5, 2e-4)  # tokenising the requests
        j["sync"] = True  # results read back per batch
        j["d2h"] = batch * 8.0
        j["mem"] = _u(rng, 0.02, 0.12)
        t, fill, dram, ten = j["kernels"][0]
        j["kernels"][0] = (t, fill * min(1.0, batch * 4 / card.sms), dram, ten)
    elif kind == "ppo":  # PPO: roll out environments, then update a small policy
        envs = rng.choice([1, 8, 64, 2048])
        vectorised_gpu = envs == 2048  # Isaac/Brax style: the environments on the GPU
        steps = 128
        if vectorised_gpu:
            gemm(envs * steps * 5e6)
            elementwise(envs * steps * 2e5)
            j["ops"] = steps * 30
        else:
            tiny(steps * 10, envs)
            j["ops"] = steps * 12
            j["host_cpu"] = envs * steps * _lu(rng, 3e-5, 4e-4)  # gym steps on the CPU
            j["host_threads"] = 1.0 if envs == 1 or rng.random() < 0.6 else min(8.0, envs)
        j["sync"] = True  # actions go back to the environments every step
        j["mem"] = _u(rng, 0.02, 0.2) if not vectorised_gpu else _u(rng, 0.3, 0.8)
    elif kind == "stencil":  # a PDE solver on the GPU: elementwise updates, or dense solves
        n = rng.choice([512, 1024, 2048]) ** 2
        if rng.random() < 0.6:  # unfused finite differences, fp32
            elementwise(n * 4 * _u(rng, 12, 40))
            j["ops"] = rng.choice([20, 40])
        else:  # dense linear algebra per step (Krylov basis, LU): compute-bound
            gemm(n * _u(rng, 2e4, 2e5))
            elementwise(n * 4 * 2)
            j["ops"] = 40
        j["sync"] = rng.random() < 0.5  # a residual checked every step or not
        j["mem"] = _u(rng, 0.1, 0.7)
    return j


# -- one window of a running job -------------------------------------------------------------------


def _state(rng: random.Random, j: dict, node: Node, first_epoch: bool, evaluating: bool):
    """The step's timeline on ``node`` this window: the window's true means and its truth."""
    speed = node.speed * _u(rng, 0.95, 1.05)
    kernels = j["kernels"]
    if evaluating:  # forward only: a third of the kernels and of the dispatch
        kernels = [(t / 3.0, f, d, te) for t, f, d, te in kernels]
    g = sum(k[0] for k in kernels) * _u(rng, 0.97, 1.03)
    dispatch = j["ops"] * j["op_s"] / speed / (3.0 if evaluating else 1.0)
    host_cpu = j["host_cpu"] / speed * _u(rng, 0.9, 1.1)  # CPU seconds of the loop's own work
    host_wall = host_cpu / j["host_threads"]
    # input: reads (from the page cache after the first epoch, if the data set fits), decode,
    # pageable copies; storage shared with the node's other jobs (network storage more so)
    storage = node.storage
    share = _lu(rng, 0.4, 1.0) if storage.kind != "block" else _u(rng, 0.8, 1.0)
    cached = j["cached"] and not first_epoch
    nbytes = 0.0 if cached else j["batch_bytes"]
    bandwidth = storage.mb_s * 1e6 * share
    read_s = 0.0 if cached else nbytes / bandwidth + j["files"] * storage.latency_s
    decode_s = j["decode_cpu"] / speed
    copy_s = 0.0 if j["pinned"] else j["h2d"] / 6e9
    d2h_s = j["d2h"] / (node.card.pcie * 1e9 * 0.5)
    workers = min(j["workers"], max(1, node.cores - 1))
    if workers:  # each worker reads and decodes whole batches; the storage caps them all
        slower = max(1.0, (workers + 1.0) / node.cores)  # more processes than cores
        loader = max((read_s + decode_s * slower) / workers, nbytes / bandwidth)
        main_input = copy_s
    else:
        loader = 0.0
        main_input = read_s + decode_s + copy_s
    main = host_wall + main_input + d2h_s  # the main thread's own work per step
    if j["sync"]:  # a loss.item() each step: the host waits for the GPU, then works
        base = main + max(dispatch, g)
        step = max(loader, base)
        wait = {
            DATA_IO: max(0.0, loader - base) + main_input,
            CPU_SERIAL: host_wall + d2h_s,
            SMALL_WORK: max(0.0, dispatch - g),
        }
        gpu_wait = max(0.0, g - dispatch)
    else:  # the host runs ahead; the GPU waits only when the host's step is longer than its own
        base = main + dispatch
        step = max(loader, base, g)
        part = max(0.0, base - g) / base if base > 0 else 0.0
        wait = {
            DATA_IO: max(0.0, loader - max(base, g)) + main_input * part,
            CPU_SERIAL: (host_wall + d2h_s) * part,
            SMALL_WORK: dispatch * part,
        }
        gpu_wait = max(0.0, g - base) if g >= loader else 0.0
    busy = g / step
    # the truth: the bottleneck
    mem_time = sum(t for t, f, d, te in kernels if d >= 0.6)
    fill = sum(t * f for t, f, d, te in kernels) / max(g, 1e-12)
    if busy >= GPU_BOUND:
        if mem_time >= MEMORY_SHARE * g:
            truth = MEMORY_BANDWIDTH
        elif fill < SMALL_FILL:
            truth = SMALL_WORK
        else:
            truth = HEALTHY
    else:
        truth = max(wait, key=wait.get)
    # what it shows, per second of window
    per_s = 1.0 / step
    spin = gpu_wait if rng.random() < 0.85 else 0.1 * gpu_wait  # else a blocking-sync build
    helpers = j["host_threads"] > 1  # the loop's work on other threads (tokenizer, env processes)
    main_busy = (0.0 if helpers else host_wall) + copy_s + d2h_s + dispatch + spin
    main_busy += 0.0 if workers else decode_s
    main_cpu = min(1.0, main_busy * per_s)
    helper_cpu = host_cpu * per_s if helpers else 0.0
    worker_cpu = decode_s * per_s if workers else 0.0
    pin_thread = 0.03 if j["pinned"] and workers else 0.0
    v = {
        "gr": busy,
        "sm": sum(t * f for t, f, d, te in kernels) / step,
        "dram": sum(t * d for t, f, d, te in kernels) / step,
        "tensor": sum(t * te for t, f, d, te in kernels) / step,
        "pcie": (j["h2d"] + j["d2h"]) * per_s / 1e6,
        "cores": main_cpu + helper_cpu + worker_cpu + pin_thread,
        "top": max(
            main_cpu,
            min(1.0, host_wall * per_s) if helpers else 0.0,
            min(1.0, worker_cpu / workers) if workers else 0.0,
        ),
        "iowait": read_s * per_s,
        "reads": nbytes * per_s / 1e6,
    }
    return v, truth


def _measure(
    rng, node: Node, server: str, t: float, v: dict | None, mem: float, running, away: float
) -> Window:
    """A window as DCGM or NVML, and the extension, report it."""

    def jit(x, rel=None):
        return x * math.exp(rng.gauss(0.0, rel if rel is not None else _u(rng, 0.03, 0.06)))

    if v is None:  # idle: a monitoring probe now and then, the Jupyter server's own CPU
        probe = _u(rng, 0.0, 0.02) if rng.random() < 0.5 else 0.0
        v = {"gr": probe, "sm": probe * 0.8, "dram": probe * 0.1, "tensor": 0.0,
             "pcie": _u(rng, 0.0, 0.5), "cores": _u(rng, 0.0, 0.04), "top": _u(rng, 0.0, 0.03),
             "iowait": 0.0, "reads": 0.0}  # fmt: skip
        if running == "cpu":  # a pandas or plotting cell: one core, the GPU idle
            v.update(cores=_u(rng, 0.9, 1.05), top=_u(rng, 0.88, 1.0),
                     reads=_u(rng, 0.0, 40.0), iowait=_u(rng, 0.0, 0.05))  # fmt: skip
    gr = min(1.0, jit(v["gr"]))
    sm = min(gr, jit(v["sm"]))
    storage_counts = node.storage.kind != "fuse"
    iowait = None
    if node.delayacct:
        iowait = min(1.0, jit(v["iowait"])) if node.storage.kind == "block" else 0.0
        if node.storage.kind == "nfs":  # NFS waits are not block I/O; a little shows
            iowait = min(1.0, 0.15 * jit(v["iowait"]))
    if node.dcgm:
        sm_col, gr_col = round(sm, 4), round(gr, 4)
        dram = round(min(1.0, jit(v["dram"])), 4)
        tensor, pcie = round(min(1.0, jit(v["tensor"])), 4), round(jit(v["pcie"]), 1)
    else:  # NVML: any kernel running, whole percents; memory touched at all, saturating
        sm_col, gr_col, tensor, pcie = round(gr, 2), None, None, None
        dram = round(min(1.0, 1.0 - math.exp(-3.0 * jit(v["dram"]))), 2)
    return Window(
        node=node.name,
        server=server,
        t=t,
        sm_active=sm_col,
        dram_active=dram,
        tensor_active=tensor,
        pcie_mb_s=pcie,
        gpu_mem_frac=round(mem, 4),
        cpu_cores=round(jit(v["cores"]) + _u(rng, 0.01, 0.05), 3),
        cpu_iowait=None if iowait is None else round(iowait, 3),
        read_mb_s=round(jit(v["reads"]), 2) if storage_counts else 0.0,
        kernel_busy=bool(running),
        user_idle_s=round(away, 1),
        gr_active=gr_col,
        cpu_top_thread=round(min(1.0, jit(v["top"], 0.03)), 3) if node.top_thread else None,
    )


# -- a notebook over time --------------------------------------------------------------------------


def _server(rng, index: int, node: Node, n: int, t0: float) -> list[tuple[Window, str]]:
    """One notebook: cells that run the job, pauses while its owner thinks, a CPU cell now and
    then; some owners leave with the memory held (then the kernel is a zombie), some run long
    jobs unattended (the kernel busy, the owner away: not a zombie)."""
    kind = rng.choice(JOBS)
    j = _job(rng, kind, node)
    server = f"tr{index:05d}/"
    style = rng.choices(["batch", "interactive", "abandoned"], [0.45, 0.4, 0.15])[0]
    away = _u(rng, 0.0, 300.0)
    rows = []
    phase, left = "run", rng.randint(4, 40)
    steps_done = 0.0
    epoch_windows = rng.randint(3, 15)  # windows per epoch
    left_early = False  # the owner went before this session was first seen
    if style == "abandoned":
        phase, left = "run", rng.randint(0, n // 3)
        left_early = rng.random() < 0.5
        away = _lu(rng, 1800.0, 30 * 3600.0) if left_early else away
    for k in range(n):
        t = t0 + (k + 1) * WINDOW_S
        if left <= 0:
            if style == "abandoned":
                phase, left = "gone", n
            elif style == "batch":
                phase, left = "run", n
            else:
                phase = rng.choices(["run", "think", "cpu"], [0.5, 0.35, 0.15])[0]
                left = {"run": rng.randint(3, 25), "think": rng.randint(1, 8),
                        "cpu": rng.randint(1, 3)}[phase]  # fmt: skip
        # a phase may end inside the window: the rest of the window is idle thinking
        covered = 1.0 if left > 1 or rng.random() < 0.7 else _u(rng, 0.2, 1.0)
        left -= 1
        if phase == "gone" or left_early or (style == "batch" and k > 2):  # nobody comes back
            away += WINDOW_S
        else:
            away = _u(rng, 0.0, 400.0) if rng.random() < 0.4 else away + WINDOW_S
        if phase == "run":
            first_epoch = steps_done < epoch_windows
            evaluating = bool(j["eval_every"]) and (k % j["eval_every"] == j["eval_every"] - 1)
            v, truth = _state(rng, j, node, first_epoch, evaluating)
            steps_done += 1
            if covered < 1.0:
                v = {key: x * covered for key, x in v.items() if key != "top"} | {"top": v["top"]}
                truth = truth if covered >= 0.5 else HEALTHY
            window = _measure(rng, node, server, t, v, j["mem"], True, away)
        elif phase == "cpu":
            window = _measure(rng, node, server, t, None, j["mem"], "cpu", away)
            truth = CPU_SERIAL
        else:
            window = _measure(rng, node, server, t, None, j["mem"], False, away)
            truth = ZOMBIE if away >= AWAY_S and j["mem"] > 0 else HEALTHY
        rows.append((window, truth if window.sm_active is not None else UNKNOWN))
    return rows


def generate(
    n_servers: int, windows_per_server: int = 60, seed: int = 0, *, first_server: int = 0
) -> list[tuple[Window, str]]:
    """``(window, truth)`` of ``n_servers`` notebooks, each on a node drawn at random running a
    job drawn from ``JOBS``; ordered by time."""
    rng = random.Random(f"traces-{seed}")
    rows = []
    for i in range(n_servers):
        node = rng.choice(NODES)
        t0 = 1_830_000_000.0 + rng.uniform(0, 4 * 3600)
        rows.extend(_server(rng, first_server + i, node, windows_per_server, t0))
    rows.sort(key=lambda pair: pair[0].t)
    return rows
