"""World "archetypes": the workloads a research cluster actually runs, each with the mistake
people actually make in it. Written after the model was frozen, and run once: a check on a
world nobody tuned anything on.

Where the other worlds draw a cause and then a workload, this one draws a *workload* — what a
notebook on a shared cluster does — and then whether it was set up well or with the mistake
typical of it. The truth is the mistake's cause; a well set-up job is ``healthy``.

Archetypes (``ARCHETYPES``), what they do when well set up, and their typical mistake:

- ``llm-finetune``: bf16 transformer, tensor cores busy, 40-95 % of the card's memory, tokens
  pre-tokenised; *tokenising in the training loop* on one core (``cpu_serial``).
- ``vision-train``: a ResNet/ViT over JPEGs, 4-12 loader workers decoding; *``num_workers=0``*:
  the main thread reads and decodes every batch (``data_io``: the loader is the bottleneck,
  whatever share of it is decoding).
- ``vision-remote``: the same over an object store through FUSE; *too few workers for the
  latency* (``data_io``; no block I/O, no counted reads).
- ``recsys``: embedding tables and elementwise feature crosses, DRAM-bound by nature
  (``memory_bandwidth`` — this one has no well set-up form: it is memory-bound, and the hint is
  what to do about it).
- ``cupy-etl``: dataframe work on the GPU, long chains of elementwise kernels over big columns
  (``memory_bandwidth``), well set up when it is fused (then ``healthy``).
- ``inference-b1``: serving a model one request at a time from a notebook: kernels of
  microseconds, the launching thread busy (``small_work``); with batching, ``healthy``.
- ``rl-cpu-env``: a policy on the GPU, the environment simulated on the CPU between steps
  (``cpu_serial``); with vectorised GPU environments, ``healthy``.
- ``abandoned``: any of the above, finished or stuck, its owner gone for hours (``zombie``).

Measurement: DCGM on six nodes of eight (the others NVML only), sampled every 10 s and averaged
per 60 s window, so a window is the mean of six samples, each with its own jitter (8 %
log-normal) — not a smooth curve. SM activity per card: how many SMs a job's kernels fill
depends on the card (an LLM fills an H100, a tiny model fills a T4 more than an H100). DRAM
activity is a share of the card's bandwidth (recsys 0.55-0.9). CPU figures include the
Jupyter server's own 0.02-0.1 cores. I/O wait is measured where delay accounting is on (five
nodes of eight). Memory held follows the workload (model and batch), not the cause. Idle
kernels read 0-1.5 % SM (monitoring). Owners of long runs leave; interactive sessions pause.
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
SAMPLES = 6
AWAY_S = 1800.0


@dataclass(frozen=True)
class Node:
    name: str
    card: str
    fill: float  # how fully a large model's kernels fill this card's SMs
    dram: float  # DRAM activity per unit of memory traffic (bandwidth class)
    dcgm: bool
    iowait: bool
    cores: int


NODES = (
    Node("ar-h100a", "H100 SXM", 0.8, 0.9, True, True, 64),
    Node("ar-h100b", "H100 PCIe", 0.78, 1.0, True, False, 32),
    Node("ar-a100a", "A100 80GB", 0.88, 1.05, True, True, 48),
    Node("ar-a100mig", "A100 MIG 2g.20gb", 0.95, 1.1, True, True, 12),
    Node("ar-l40s", "L40S", 0.85, 1.2, True, False, 32),
    Node("ar-a10", "A10", 0.92, 1.25, True, True, 16),
    Node("ar-t4", "T4", 0.97, 1.3, False, True, 8),
    Node("ar-4090", "RTX 4090", 0.9, 1.15, False, False, 24),
)

# archetype -> (truth when set up well, truth with its typical mistake)
ARCHETYPES = {
    "llm-finetune": (HEALTHY, CPU_SERIAL),
    "vision-train": (HEALTHY, DATA_IO),
    "vision-remote": (HEALTHY, DATA_IO),
    "recsys": (MEMORY_BANDWIDTH, MEMORY_BANDWIDTH),
    "cupy-etl": (HEALTHY, MEMORY_BANDWIDTH),
    "inference-b1": (HEALTHY, SMALL_WORK),
    "rl-cpu-env": (HEALTHY, CPU_SERIAL),
}


def _u(rng, a, b):
    return rng.uniform(a, b)


def _profile(rng: random.Random, kind: str, mistake: bool, node: Node) -> dict:
    """The job's mean behaviour while it runs: kernel share, fill, DRAM and tensor use (per
    unit of kernel time), cores, I/O wait share, reads (MB/s), memory held."""
    p = {"busy": _u(rng, 0.85, 0.97), "fill": node.fill * _u(rng, 0.9, 1.05),
         "dram": _u(rng, 0.15, 0.4), "tensor": _u(rng, 0.3, 0.65), "cores": _u(rng, 0.8, 1.1),
         "iowait": _u(rng, 0.0, 0.05), "reads": _u(rng, 0.0, 20.0),
         "mem": _u(rng, 0.2, 0.9)}  # fmt: skip
    if kind == "llm-finetune":
        p["mem"] = _u(rng, 0.4, 0.95)
        if mistake:  # tokenising each batch in the loop, one core
            p.update(busy=_u(rng, 0.15, 0.5), cores=_u(rng, 0.97, 1.08))
    elif kind == "vision-train":
        workers = rng.randint(4, 12)
        p.update(tensor=_u(rng, 0.15, 0.45), reads=_u(rng, 50, 400), mem=_u(rng, 0.1, 0.6))
        p["cores"] += workers * _u(rng, 0.3, 0.7)
        p["iowait"] = workers * _u(rng, 0.0, 0.03)
        if mistake:  # num_workers=0: read then decode each batch on the main thread
            slow = _u(rng, 0.15, 0.5)
            p.update(busy=slow, reads=p["reads"] * slow / 0.9, iowait=_u(rng, 0.1, 0.4),
                     cores=_u(rng, 0.7, 1.0))  # fmt: skip
    elif kind == "vision-remote":
        workers = rng.randint(2, 8)
        p.update(tensor=_u(rng, 0.15, 0.45), reads=0.0, iowait=0.0, mem=_u(rng, 0.1, 0.6))
        p["cores"] += workers * _u(rng, 0.2, 0.5)
        if mistake:  # too few workers for the store's latency: they wait on the network
            slow = _u(rng, 0.1, 0.45)
            p.update(busy=slow, cores=_u(rng, 0.2, 0.5) + workers * _u(rng, 0.05, 0.15))
    elif kind == "recsys":
        p.update(dram=_u(rng, 0.6, 0.9), tensor=_u(rng, 0.0, 0.1), busy=_u(rng, 0.75, 0.95),
                 fill=p["fill"] * _u(rng, 0.8, 0.95), mem=_u(rng, 0.5, 0.95))  # fmt: skip
    elif kind == "cupy-etl":
        p.update(tensor=0.0, cores=_u(rng, 0.9, 1.2), mem=_u(rng, 0.3, 0.9))
        if mistake:  # unfused elementwise chains over big columns
            p.update(dram=_u(rng, 0.6, 0.95), busy=_u(rng, 0.7, 0.95))
        else:
            p.update(dram=_u(rng, 0.2, 0.45))
    elif kind == "inference-b1":
        p.update(mem=_u(rng, 0.02, 0.3), reads=0.0, tensor=_u(rng, 0.05, 0.3))
        if mistake:  # one request at a time: tiny kernels, the launching thread busy
            p.update(busy=_u(rng, 0.15, 0.5), fill=_u(rng, 0.05, 0.3), dram=_u(rng, 0.02, 0.1),
                     tensor=_u(rng, 0.0, 0.05), cores=_u(rng, 0.85, 1.05))  # fmt: skip
    elif kind == "rl-cpu-env":
        p.update(mem=_u(rng, 0.03, 0.3), tensor=_u(rng, 0.0, 0.3), reads=0.0)
        if mistake:  # environment stepped on the CPU, sometimes several processes
            envs = rng.choice([1, 1, 2, 4])
            p.update(busy=_u(rng, 0.08, 0.45), cores=envs * _u(rng, 0.9, 1.0) + 0.1)
    return p


def _window(rng, node: Node, server: str, t: float, p: dict, running: bool, away, terminal):
    """The mean of SAMPLES samples (each jittered), as DCGM and the extension report it."""
    if not running:  # idle kernel, still holding its memory
        sm = _u(rng, 0.0, 0.015)
        values = {"sm": sm, "gr": sm * 1.3, "dram": sm * 0.2, "tensor": 0.0, "pcie": 0.3,
                  "cores": _u(rng, 0.02, 0.1), "iowait": 0.0, "reads": 0.0}  # fmt: skip
    else:
        acc = {k: 0.0 for k in ("sm", "gr", "dram", "tensor", "pcie", "cores", "iowait", "reads")}
        for _ in range(SAMPLES):
            j = lambda: math.exp(rng.gauss(0.0, 0.08))  # noqa: E731
            gr = min(1.0, p["busy"] * j())
            acc["gr"] += gr
            acc["sm"] += gr * min(1.0, p["fill"] * j())
            acc["dram"] += min(1.0, gr * p["dram"] * node.dram * j())
            acc["tensor"] += gr * p["tensor"] * j()
            acc["pcie"] += gr * _u(rng, 20, 200)
            acc["cores"] += p["cores"] * j() + _u(rng, 0.02, 0.1)
            acc["iowait"] += min(1.0, p["iowait"] * j())
            acc["reads"] += p["reads"] * j()
        values = {k: v / SAMPLES for k, v in acc.items()}
    if node.dcgm:
        sm, gr = round(values["sm"], 4), round(values["gr"], 4)
        dram, tensor = round(values["dram"], 4), round(values["tensor"], 4)
        pcie = round(values["pcie"], 1)
    else:  # NVML: time share in whole percents; memory utilisation saturates early
        sm, gr, tensor, pcie = round(values["gr"], 2), None, None, None
        dram = round(min(1.0, values["dram"] * 2.0), 2)
    return Window(
        node=node.name,
        server=server,
        t=t,
        sm_active=sm,
        gr_active=gr,
        dram_active=dram,
        tensor_active=tensor,
        pcie_mb_s=pcie,
        gpu_mem_frac=round(p["mem"], 4),
        cpu_cores=round(values["cores"], 3),
        cpu_iowait=round(values["iowait"], 3) if node.iowait else None,
        read_mb_s=round(values["reads"], 2),
        kernel_busy=None if terminal else running,
        user_idle_s=round(away, 1),
    )


def generate(
    n_servers: int, windows_per_server: int = 60, seed: int = 0, *, first_server: int = 0
) -> list[tuple[Window, str]]:
    """``(window, truth)`` of ``n_servers`` servers: archetypes in turn, three in five set up
    with their typical mistake, one in seven abandoned; ordered by time."""
    rng = random.Random(f"archetypes-{seed}")
    kinds = list(ARCHETYPES)
    rows = []
    for i in range(n_servers):
        node = rng.choice(NODES)
        kind = kinds[i % len(kinds)]
        abandoned = rng.random() < 1 / 7
        mistake = rng.random() < 0.6
        truth = ARCHETYPES[kind][1 if mistake else 0]
        profile = _profile(rng, kind, mistake, node)
        server = f"ar{first_server + i:05d}/"
        terminal = rng.random() < 0.05
        interactive = not abandoned and truth == HEALTHY and rng.random() < 0.3
        away = math.exp(_u(rng, math.log(2 * 3600), math.log(48 * 3600))) if abandoned else 0.0
        t0 = 1_820_000_000.0 + rng.uniform(0, 3 * 3600)
        cell, pause = rng.randint(3, 12), 0
        for k in range(windows_per_server):
            t = t0 + (k + 1) * WINDOW_S
            if abandoned or pause:
                if pause:
                    pause -= 1
                    away = _u(rng, 0, 600)
                    cell = rng.randint(3, 12) if not pause else cell
                else:
                    away += WINDOW_S
                window = _window(rng, node, server, t, profile, False, away, terminal)
                label = ZOMBIE if away >= AWAY_S else HEALTHY
            else:
                away = away + WINDOW_S if rng.random() > 0.1 else _u(rng, 0, WINDOW_S)
                window = _window(rng, node, server, t, profile, True, away, terminal)
                label = truth
                if interactive:
                    cell -= 1
                    if cell <= 0:
                        pause = rng.randint(1, 6)
            rows.append((window, label if window.sm_active is not None else UNKNOWN))
    rows.sort(key=lambda pair: pair[0].t)
    return rows
