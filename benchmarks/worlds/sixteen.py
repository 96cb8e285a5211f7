"""World "sixteen": the hidden evaluation as issue 23 describes it, written after the model was
frozen and run once.

Issue 23 scored the model on a simulator written elsewhere, not available to the project: 16
nodes of different cards, disks and core counts, the CSV format of docs/architecture.md ("Diagnosis windows") and the six labels.
This world is written from what the issue says of it — nothing else is known of it — as a
check of the frozen model on windows of that description, not a copy of that simulator:

- every node its own scales: the SM activity its healthy loops read (0.6-0.7 on a fast card,
  about 0.3 on a slow one), the scale of its DRAM counter (0.6-1.5 times another's for the same
  traffic), its disk (HDD, SATA, NVMe, NFS, a parallel file system), its cores (4-128), delay
  accounting or not;
- only the base columns: no ``gr_active``, no ``cpu_top_thread``;
- ``healthy`` loops at their node's normal with a Python driver and perhaps workers: 0.7-1.6
  cores busy; ``zombie``: no cell running, the owner away 5-37 hours, 10-85 % of the card's
  memory held, SM activity of 1-2.5 % on some nodes (a little noise, not work);
  ``small_work``: little memory held, modest SM activity, the CPU moderately busy;
  ``memory_bandwidth``: the SMs busy waiting on memory, the DRAM counter high for its node;
  ``data_io``: the GPU starved while the process waits on reads (I/O wait where accounted,
  reads near the disk's pace); ``cpu_serial``: the GPU starved while one core is saturated;
- interactive pauses (no cell running, the owner around: ``healthy``).

Each server runs one cause (the label) for its life, with AR(1) drift and per-window noise of
8-15 %, values missing in 2 % of windows, and pauses if interactive; windows of 60 s.
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
AWAY_S = 1800.0


@dataclass(frozen=True)
class Node:
    name: str
    sm: float  # what its healthy loops read
    dram: float  # its DRAM counter's scale
    disk_mb_s: float
    visible_wait: float  # share of waits on its disk that are block I/O (NFS: some, FUSE: none)
    cores: int
    delayacct: bool
    noise_floor: float  # idle SM activity (monitoring, a neighbour on the engine)


NODES = (
    Node("s-h100-1", 0.7, 1.0, 3000, 1.0, 128, True, 0.02),
    Node("s-h100-2", 0.68, 1.3, 800, 0.3, 96, True, 0.0),
    Node("s-a100-1", 0.62, 0.8, 2500, 1.0, 64, True, 0.015),
    Node("s-a100-2", 0.6, 1.1, 450, 1.0, 32, False, 0.0),
    Node("s-a100-3", 0.6, 0.6, 3000, 0.5, 64, True, 0.025),
    Node("s-l4-1", 0.45, 1.4, 450, 1.0, 16, True, 0.0),
    Node("s-l4-2", 0.45, 0.9, 140, 1.0, 8, True, 0.01),
    Node("s-t4-1", 0.3, 1.5, 140, 1.0, 4, True, 0.0),
    Node("s-t4-2", 0.32, 0.7, 450, 1.0, 8, False, 0.02),
    Node("s-t4-3", 0.28, 1.0, 800, 0.3, 8, True, 0.0),
    Node("s-a10-1", 0.5, 1.2, 2500, 1.0, 16, True, 0.0),
    Node("s-a10-2", 0.52, 0.8, 450, 1.0, 12, False, 0.015),
    Node("s-v100-1", 0.45, 1.0, 5000, 0.0, 40, True, 0.0),
    Node("s-v100-2", 0.47, 0.65, 140, 1.0, 20, True, 0.02),
    Node("s-4090", 0.55, 1.25, 3500, 1.0, 24, True, 0.0),
    Node("s-a100-mig", 0.6, 0.9, 3000, 1.0, 16, True, 0.01),
)


def _u(rng, a, b):
    return rng.uniform(a, b)


def _profile(rng: random.Random, label: str, node: Node) -> dict:
    """The cause's mean signature on this node: SM as a share of the node's normal, DRAM per
    unit of SM (before the node's scale), tensor per SM, cores, blocked share, reads, memory."""
    p = {"sm": _u(rng, 0.85, 1.1), "dram": _u(rng, 0.2, 0.45),
         "tensor": _u(rng, 0.2, 0.6) if rng.random() < 0.7 else 0.0,
         "cores": _u(rng, 0.7, 1.6), "blocked": _u(rng, 0.0, 0.04),
         "reads": _u(rng, 0.0, 40.0), "mem": _u(rng, 0.2, 0.9)}  # fmt: skip
    if label == DATA_IO:
        p.update(sm=_u(rng, 0.15, 0.55), blocked=_u(rng, 0.25, 0.8), cores=_u(rng, 0.3, 1.3),
                 reads=node.disk_mb_s * _u(rng, 0.45, 1.0), mem=_u(rng, 0.1, 0.8))  # fmt: skip
    elif label == CPU_SERIAL:
        p.update(sm=_u(rng, 0.1, 0.5), cores=_u(rng, 0.95, 1.1) + rng.choice([0, 0, 0.3]),
                 reads=_u(rng, 0.0, 10.0))  # fmt: skip
    elif label == MEMORY_BANDWIDTH:
        p.update(sm=_u(rng, 0.85, 1.05) / max(node.sm, 0.5), dram=_u(rng, 0.65, 0.95),
                 tensor=_u(rng, 0.0, 0.05), cores=_u(rng, 0.9, 1.2))  # fmt: skip
    elif label == SMALL_WORK:
        p.update(sm=_u(rng, 0.2, 0.5), dram=_u(rng, 0.03, 0.15), tensor=_u(rng, 0.0, 0.08),
                 cores=_u(rng, 0.5, 1.0), mem=_u(rng, 0.01, 0.08), reads=_u(rng, 0.0, 5.0))  # fmt: skip
    return p


def _window(rng, node: Node, server: str, t: float, p: dict, drift: float, running: bool,
            away: float) -> Window:  # fmt: skip
    def noisy(x, sigma):
        return x * math.exp(rng.gauss(0.0, sigma))

    sigma = _u(rng, 0.08, 0.15)
    if running:
        sm = min(1.0, noisy(node.sm * p["sm"] * drift, sigma))
        dram = min(1.0, noisy(sm * p["dram"] * node.dram, sigma))
        tensor = min(1.0, noisy(sm * p["tensor"], sigma))
        cores = noisy(p["cores"], sigma)
        blocked = min(1.0, noisy(p["blocked"], sigma)) * node.visible_wait
        reads = noisy(p["reads"], sigma)
        pcie = noisy(50 + reads * 0.8, sigma)
    else:
        sm = node.noise_floor * _u(rng, 0.5, 1.25) if node.noise_floor else _u(rng, 0.0, 0.004)
        dram, tensor, cores, blocked, reads, pcie = sm * 0.2, 0.0, _u(rng, 0.0, 0.05), 0, 0, 1.0
    values = {
        "sm_active": round(sm, 4),
        "dram_active": round(dram, 4),
        "tensor_active": round(tensor, 4),
        "pcie_mb_s": round(pcie, 1),
        "gpu_mem_frac": round(p["mem"], 4),
        "cpu_cores": round(cores, 3),
        "cpu_iowait": round(blocked, 3) if node.delayacct else None,
        "read_mb_s": round(reads, 2),
    }
    for column in values:
        if rng.random() < 0.02:
            values[column] = None
    return Window(node=node.name, server=server, t=t, kernel_busy=running,
                  user_idle_s=round(away, 1), **values)  # fmt: skip


def generate(
    n_servers: int, windows_per_server: int = 60, seed: int = 0, *, first_server: int = 0
) -> list[tuple[Window, str]]:
    """``(window, truth)`` of ``n_servers`` servers, the six labels in equal numbers, each on a
    node drawn at random; ordered by time."""
    rng = random.Random(f"sixteen-{seed}")
    plan = [LABELS[i % len(LABELS)] for i in range(n_servers)]
    rng.shuffle(plan)
    rows = []
    for i, label in enumerate(plan):
        node = rng.choice(NODES)
        server = f"s{first_server + i:05d}/"
        p = _profile(rng, label, node)
        t = 1_850_000_000.0 + rng.uniform(0, 3 * 3600)
        drift = 1.0
        away = _u(rng, 5 * 3600, 37 * 3600) if label == ZOMBIE else _u(rng, 0, 300)
        interactive = label != ZOMBIE and rng.random() < 0.3
        pause = 0
        for _ in range(windows_per_server):
            t += WINDOW_S
            drift = min(1.3, max(0.7, 1.0 + 0.8 * (drift - 1.0) + rng.gauss(0.0, 0.04)))
            if label == ZOMBIE:
                away += WINDOW_S
                window = _window(rng, node, server, t, p, drift, False, away)
                truth = ZOMBIE
            elif pause:
                pause -= 1
                away += WINDOW_S
                window = _window(rng, node, server, t, p, drift, False, away)
                truth = ZOMBIE if away >= AWAY_S else HEALTHY
            else:
                away = away + WINDOW_S if rng.random() < 0.8 else _u(rng, 0, 120)
                window = _window(rng, node, server, t, p, drift, True, away)
                truth = label
                if interactive and rng.random() < 0.1:
                    pause = rng.randint(1, 8)
            rows.append((window, truth if window.sm_active is not None else UNKNOWN))
    rows.sort(key=lambda pair: pair[0].t)
    return rows
