"""The spawn queue's line with many requests waiting: what the hub pays to compute it.

``profiles.queue.line()`` runs on the hub's event loop for the governor's sync after each pass,
for every Hub page a waiting user opens (the line's notice), on the queue page, and once per
tier offered on the spawn form (``offer``). Times the three with ``--held`` servers holding
GPUs and ``--waiting`` requests in line (10 teams, 4 tiers):

    python -m benchmarks.queue_line [--held 100] [--waiting 200] [--repeat 3]

Prints medians in seconds.

``--room``: what the cluster's ``room`` costs at each sync instead (Kubernetes: where the
spawns waiting for a GPU could go, ``profiles.cluster.ClusterGpus.room``): ``--servers`` pods
holding devices on ``--nodes`` GPU nodes (H100 nodes of 8 cards; H200 nodes cut into MIG
slices), ``--waiting`` spawns waiting for a GPU (pending, in line, refused; on two tiers of
the four). The hub's CPU per sync (the first on a new reading of the cluster, another on the
same reading, one with nothing waiting, and every tier's, as before the room was said for
the waiting tiers alone; beside what a reading itself pays at the least) and the bytes it
answers, then the governor's ``room_from_json``
(with its ``json.loads``) and ``placement``:

    python -m benchmarks.queue_line --room [--servers 10000] [--nodes 1000] [--waiting 100]

Prints medians in milliseconds, and bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from jupyter_gpu_gov.core.queue import CAPACITY, QueuedRequest
from jupyter_gpu_gov.core.vocabulary import server_key
from jupyter_gpu_gov.profiles import queue
from jupyter_gpu_gov.profiles.quota import Admission, Grant, Request, load_quotas
from jupyter_gpu_gov.profiles.tiers import load_tiers

TIERS = [
    {"name": "h100", "gpu": "H100-80GB"},
    {"name": "h100x2", "gpu": "H100-80GB", "count": 2},
    {"name": "h200-3g", "gpu": "H200-141GB", "mig": "3g.71gb"},
    {"name": "h200-1g", "gpu": "H200-141GB", "mig": "1g.18gb"},
]
CAPACITY_OF = {"h100": 100, "h100x2": 16, "h200-3g": 32, "h200-1g": 200}


def _median_s(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 4)


def measure(held: int, waiting: int, repeat: int = 3) -> dict[str, float]:
    tiers = load_tiers(TIERS)
    teams = [f"team{i}" for i in range(10)]
    per_team = {"guaranteed": {"h100": 10, "h200-1g": 20}, "tiers": "*", "user_cap": 2}
    quotas = load_quotas({team: per_team for team in teams}, tiers)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    usage = [
        Grant(server_key(f"u{i}"), f"u{i}", teams[i % 10], "h100", 1, 1.0, started=now)
        for i in range(held)
    ]
    line = [
        QueuedRequest(
            f"w{i}",
            "",
            teams[i % 10],
            "h100",
            {},
            now - timedelta(seconds=i),
            now + timedelta(hours=8),
        )
        for i in range(waiting)
    ]

    def line_for(shown: Callable[[QueuedRequest], bool]) -> list:
        return queue.line(line, usage, CAPACITY_OF, quotas, tiers, {}, now, sooner_for=shown)

    request = Request(server_key("x"), "x", "team1", "h100")
    refused = Admission(False, "no H100 is free", limit=CAPACITY)
    return {
        "sync_s": _median_s(lambda: line_for(lambda r: False), repeat),
        "waiting_users_page_s": _median_s(lambda: line_for(lambda r: r.user == "w7"), repeat),
        "spawn_form_offer_s": _median_s(
            lambda: queue.offer(request, refused, usage, CAPACITY_OF, quotas, tiers, line, {}, now),
            repeat,
        ),
    }


ROOM_TIERS = [
    {"name": "h100", "gpu": "H100-80GB"},
    {"name": "h100x2", "gpu": "H100-80GB", "count": 2},
    {"name": "h200-3g", "gpu": "H200-141GB", "mig": "3g.71gb"},
    {"name": "h200-1g", "gpu": "H200-141GB", "mig": "1g.18gb"},
]
# An H200 node: four cards in two 3g.71gb slices each, one in seven 1g.18gb.
H200_SLICES = {"nvidia.com/mig-3g.71gb": 8, "nvidia.com/mig-1g.18gb": 7}


def cluster(servers: int, nodes: int) -> tuple[list[dict], list[dict]]:
    """``nodes`` GPU nodes (three in five H100 nodes of 8 cards, the rest H200 nodes in MIG
    slices: 10,800 devices on 1,000) and ``servers`` pods bound to them at random, as
    ``ClusterGpus`` keeps them (10,000 leave 800 devices free, scattered: spawns wait)."""
    h100 = nodes * 3 // 5
    node_list, slots = [], []
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        if i < h100:
            labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
            allocatable = {"nvidia.com/gpu": "8"}
        else:
            labels = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/mig.strategy": "mixed"}
            allocatable = {"nvidia.com/gpu": "0", **{r: str(n) for r, n in H200_SLICES.items()}}
        node_list.append(
            {
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
                "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
                "status": {
                    "allocatable": {"cpu": "112", **allocatable},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
        for resource, n in allocatable.items():
            slots += [(name, resource)] * int(n)
    random.Random(1).shuffle(slots)
    pods = [
        {
            "metadata": {"name": f"jupyter-u{i}", "namespace": "hub"},
            "spec": {
                "nodeName": node,
                "containers": [{"resources": {"limits": {resource: "1"}}}],
            },
            "status": {"phase": "Running"},
        }
        for i, (node, resource) in enumerate(slots[:servers])
    ]
    return node_list, pods


def measure_room(servers: int, nodes: int, waiting: int, repeat: int = 5) -> dict:
    """What the room costs: the hub per sync (on a new reading of the cluster, on the same
    one, with none waiting; and every tier's, as each sync paid before the room was said for
    the waiting tiers alone), the answer's bytes, the governor per sync."""
    from types import SimpleNamespace

    from jupyter_gpu_gov.core.queue import room_from_json
    from jupyter_gpu_gov.diagnose.cluster import placement
    from jupyter_gpu_gov.profiles.cluster import ClusterGpus

    tiers = load_tiers(ROOM_TIERS)
    gpus = ClusterGpus()
    node_list, pods = cluster(servers, nodes)
    gpus.take(node_list, pods)
    spawner = SimpleNamespace(node_selector={}, tolerations=[], node_affinity_required=[])
    states = ("pending", "queued", "refused")
    asked = [("h100x2" if i % 2 else "h200-3g", states[i % 3]) for i in range(waiting)]
    wanted = sorted({tier for tier, _ in asked})

    def read() -> None:  # a new reading of the cluster (what the hub works out anew)
        gpus.read_at = time.monotonic()

    def ms(work) -> float:
        return round(_median_s(work, repeat) * 1000, 2)

    read()
    gpus.room(tiers, spawner)  # (imports)
    from jupyter_gpu_gov.profiles.cluster import _reading

    sent = json.dumps({"items": pods}).encode()  # (the API's pods carry far more)
    figures = {
        # What every reading of the cluster pays already, at the least: the pods' JSON
        # parsed and each pod's devices kept (``cluster._reading``; in a thread since
        # adapt34: ``benchmarks.cluster_read``).
        "hub_reading_at_least_ms": ms(lambda: _reading((), json.loads(sent)["items"])),
        "hub_new_reading_ms": ms(lambda: (read(), gpus.room(tiers, spawner, wanted))),
        "hub_same_reading_ms": ms(lambda: gpus.room(tiers, spawner, wanted)),
        "hub_none_waiting_ms": ms(lambda: (read(), gpus.room(tiers, spawner, []))),
        "hub_every_tier_ms": ms(lambda: (read(), gpus.room(tiers, spawner))),
    }
    found = gpus.room(tiers, spawner, wanted)
    body = json.dumps(found)
    figures["hub_json_ms"] = ms(lambda: json.dumps(found))
    figures["answer_bytes"] = len(body.encode())
    figures["answer_bytes_every_tier"] = len(json.dumps(gpus.room(tiers, spawner)).encode())
    figures["governor_room_from_json_ms"] = ms(lambda: room_from_json(json.loads(body)))
    said = room_from_json(json.loads(body))
    figures["governor_placement_ms"] = ms(lambda: placement(asked, said))
    verdicts = placement(asked, said)
    figures["verdicts"] = {k: verdicts[k] for k in ("fits", "fragmentation", "shortage")}
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=100, help="servers holding GPUs")
    parser.add_argument(
        "--waiting", type=int, default=None, help="requests in line (200; --room: 100)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--room", action="store_true", help="the cluster's room at a sync")
    parser.add_argument("--servers", type=int, default=10000, help="--room: pods on GPUs")
    parser.add_argument("--nodes", type=int, default=1000, help="--room: GPU nodes")
    args = parser.parse_args(argv)
    if args.room:
        waiting = 100 if args.waiting is None else args.waiting
        figures = measure_room(args.servers, args.nodes, waiting, max(args.repeat, 5))
        print(
            f"room: servers={args.servers} nodes={args.nodes} waiting={waiting} "
            f"(medians of {max(args.repeat, 5)}):"
        )
        for name, value in figures.items():
            print(f"  {name}: {value}")
        return
    args.waiting = 200 if args.waiting is None else args.waiting
    figures = measure(args.held, args.waiting, args.repeat)
    print(f"held={args.held} waiting={args.waiting} (medians of {args.repeat}):")
    for name, value in figures.items():
        print(f"  {name}: {value}")


if __name__ == "__main__":
    main()
