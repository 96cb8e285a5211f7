"""The hub's reading of a large cluster: how long it holds the Hub's event loop.

    python -m benchmarks.cluster_read [--nodes 1000] [--pods 30000] [--gpu-pods 10000] [--repeat 3]

The profile layer reads every node and every namespace's live pods (``ClusterGpus.refresh``,
awaited before a spawn's admission and at the governor's queue sync while spawns wait), then
the first sync on that reading works out each node's free devices (``ClusterGpus.room``: every
GPU pod walked once), and each admission counts the tiers (``ClusterGpus.capacity``). Here the
Kubernetes API is a fake client that answers ``list_node`` and
``list_pod_for_all_namespaces`` with bodies as an API server writes them (every field a
kubelet and the controllers set, ``managedFields`` included: about 3.5 kB a pod, 4 kB a node
with its image list): ``--nodes`` GPU nodes (``benchmarks.queue_line``'s: H100 nodes of 8
cards, H200 nodes in MIG slices), ``--gpu-pods`` pods holding a device among ``--pods``.
On an asyncio loop whose ticker notes every gap between its 1 ms ticks, the reading is taken
(``refresh``) and the first sync's ``room`` asked for two tiers, then one admission's
``capacity``. The pods come a page of ``--page`` items a request (``ClusterGpus``'s
``PAGE``; 0: the whole list in one answer, as the hub read it before it paged). Prints,
medians over ``--repeat``: the wall time of each (``read_ms``, ``first_room_ms``,
``capacity_ms``), the longest the loop was held during the read and the
first room (``held_ms``: the longest gap between ticks, whatever held it) beside the longest
gap of the ticker alone for as long (``idle_held_ms``: the machine's own stalls), the bytes
read, the requests a reading made and the load average; then, of one reading under
tracemalloc, the most memory Python held during it above what it held before (``peak_mb``:
the bodies held at once, and their parse) and what the reading keeps (``kept_mb``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import time
import tracemalloc
from types import SimpleNamespace

from jupyter_gpu_gov.core.vocabulary import pod_key
from jupyter_gpu_gov.profiles import cluster as cluster_module
from jupyter_gpu_gov.profiles.cluster import ClusterGpus, scheduling
from jupyter_gpu_gov.profiles.tiers import load_tiers

from .loop_hold import ticked
from .queue_line import ROOM_TIERS, cluster


def _managed(manager: str, fields: dict) -> dict:
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-12-06T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }


def api_pod(i: int, node: str | None, limits: dict[str, str]) -> dict:
    """A pod as ``list_pod_for_all_namespaces`` sends it (what a kubelet and the controllers
    write), holding ``limits`` of extended resources (none: a CPU pod)."""
    name, namespace = f"work-{i}", f"team-{i % 40}"
    env = [{"name": f"VAR_{k}", "value": f"value-{k}-{i}"} for k in range(8)]
    return {
        "metadata": {
            "name": name,
            "generateName": "work-",
            "namespace": namespace,
            "uid": f"9a1c2f3e-{i:08d}-4b5c-8d9e-0f1a2b3c4d5e",
            "resourceVersion": str(1000000 + i),
            "creationTimestamp": "2026-12-06T10:00:00Z",
            "labels": {"app": "work", "job-name": name, "team": namespace, "tier": "batch"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-06T10:00:00Z"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": f"0b1c2d3e-{i:08d}-4f5a-8b9c-0d1e2f3a4b5c",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                _managed(
                    "kube-controller-manager",
                    {"f:metadata": {"f:labels": {"f:app": {}, "f:job-name": {}}}, "f:spec": {}},
                ),
                _managed(
                    "kubelet",
                    {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:podIP": {}}},
                ),
            ],
        },
        "spec": {
            "volumes": [
                {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {}}]}}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.org/research/train:2026.12",
                    "command": ["python", "-m", "train", "--config", "/etc/train.yaml"],
                    "env": env,
                    "resources": {
                        "limits": {"cpu": "8", "memory": "64Gi", **limits},
                        "requests": {"cpu": "4", "memory": "32Gi", **limits},
                    },
                    "volumeMounts": [
                        {"name": "kube-api-access", "readOnly": True, "mountPath": "/var/run"}
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never",
            "nodeName": node,
            "serviceAccountName": "default",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
            ],
            "priority": 0,
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-12-06T10:00:05Z"}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "10.0.0.1",
            "podIP": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            "startTime": "2026-12-06T10:00:01Z",
            "containerStatuses": [
                {
                    "name": "main",
                    "state": {"running": {"startedAt": "2026-12-06T10:00:04Z"}},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example.org/research/train:2026.12",
                    "imageID": "registry.example.org/research/train@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + f"{i:064d}",
                    "started": True,
                }
            ],
            "qosClass": "Burstable",
        },
    }


def bodies(nodes: int, pods: int, gpu_pods: int) -> tuple[bytes, list[dict]]:
    """The API's answer to ``list_node``, and the items ``list_pod_for_all_namespaces``
    answers with (``FakeApi`` writes them as one body or in pages)."""
    node_list, gpu = cluster(gpu_pods, nodes)
    for node in node_list:  # what else a node carries: its images, addresses, capacity
        node["metadata"]["uid"] = "1f2e3d4c-" + node["metadata"]["name"]
        node["status"]["capacity"] = dict(node["status"]["allocatable"])
        node["status"]["images"] = [
            {"names": [f"registry.example.org/image-{k}@sha256:" + "cd" * 32], "sizeBytes": 10**9}
            for k in range(20)
        ]
    items = []
    for i in range(pods):
        if i < len(gpu):
            spec = gpu[i]["spec"]
            items.append(api_pod(i, spec["nodeName"], spec["containers"][0]["resources"]["limits"]))
        else:
            items.append(api_pod(i, node_list[i % len(node_list)]["metadata"]["name"], {}))
    return json.dumps({**_HEAD, "kind": "NodeList", "items": node_list}).encode(), items


_HEAD = {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1234567"}}


def _pod_list(items: list[dict], token: str | None = None) -> bytes:
    metadata = {**_HEAD["metadata"], **({"continue": token} if token else {})}
    return json.dumps({**_HEAD, "kind": "PodList", "metadata": metadata, "items": items}).encode()


class _Response:
    def __init__(self, body: bytes):
        self.status, self.reason, self._body = 200, "OK", body

    async def read(self) -> bytes:
        await asyncio.sleep(0)  # the socket's reads: the body arrives in the loop's turns
        return bytes(memoryview(self._body))  # a new body each answer, as off a socket

    def release(self) -> None:
        pass


class FakeApi:
    """The kubernetes_asyncio CoreV1Api calls ``ClusterGpus`` makes, answered from memory:
    the pods as the API server pages them (``limit`` items, ``continue`` to the next page),
    or in one body without a limit."""

    def __init__(self, nodes: bytes, pods: list[dict], page: int):
        self.nodes, self.whole = nodes, _pod_list(pods)
        self.pages = []
        if page > 0:
            for at in range(0, len(pods), page):
                more = at + page < len(pods)
                self.pages.append(_pod_list(pods[at : at + page], str(at + page) if more else None))
        self.page, self.asked = page, 0

    async def list_node(self, **_):
        return _Response(self.nodes)

    async def list_pod_for_all_namespaces(self, limit=None, _continue=None, **_):
        self.asked += 1
        if not limit:
            return _Response(self.whole)
        assert limit == self.page, (limit, self.page)
        return _Response(self.pages[int(_continue or 0) // limit])


async def one(api: FakeApi, tiers, wanted) -> dict[str, float]:
    gpus = ClusterGpus()
    log = SimpleNamespace(info=lambda *a: None, warning=lambda *a: None)
    spawner = SimpleNamespace(node_selector={}, tolerations=[], node_affinity_required=[])
    found = {}

    async def read_and_first_room():
        # As the spawner's ``gpu_refresh``: the tiers' scheduling, for their nodes.
        fits = [(t.resource, scheduling(spawner, t)) for t in tiers.values()]
        await gpus.refresh(api, "hub", log, timeout=60, fits=fits)
        mid = time.perf_counter()
        found.update(gpus.room(tiers, spawner, wanted))
        found["room_s"] = time.perf_counter() - mid

    took, held = await ticked(read_and_first_room)
    assert gpus.nodes is not None and found["unknown"] is None, (gpus.failing, found)
    # The machine's own stalls: the ticker alone, as long.
    _, idle = await ticked(lambda: asyncio.sleep(took))
    hub_pods = {pod_key("team-0", f"work-{i}"): "h100" for i in range(0, 400, 40)}
    counted = time.perf_counter()
    gpus.capacity(tiers, spawner, hub_pods)
    capacity = time.perf_counter()
    return {
        "read_ms": (took - found["room_s"]) * 1000,
        "first_room_ms": found["room_s"] * 1000,
        "held_ms": held * 1000,
        "idle_held_ms": idle * 1000,
        "capacity_ms": (capacity - counted) * 1000,
    }


async def memory(api: FakeApi, tiers) -> dict[str, float]:
    """The most memory Python held during a reading above what it held before, and what the
    reading keeps (tracemalloc: a run of its own, slower, for the timings are not its)."""
    gpus = ClusterGpus()
    log = SimpleNamespace(info=lambda *a: None, warning=lambda *a: None)
    spawner = SimpleNamespace(node_selector={}, tolerations=[], node_affinity_required=[])
    fits = [(t.resource, scheduling(spawner, t)) for t in tiers.values()]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await gpus.refresh(api, "hub", log, timeout=600, fits=fits)
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert gpus.nodes is not None, gpus.failing
    return {"peak_mb": (peak - before) / 1e6, "kept_mb": (after - before) / 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=30000, help="live pods, every namespace")
    parser.add_argument("--gpu-pods", type=int, default=10000, help="of them, holding a device")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--page",
        type=int,
        default=cluster_module.PAGE,
        help="pods asked for a request (0: the whole list in one answer, as before paging)",
    )
    args = parser.parse_args(argv)
    nodes, pods = bodies(args.nodes, args.pods, args.gpu_pods)
    api = FakeApi(nodes, pods, args.page)
    tiers = load_tiers(ROOM_TIERS)
    import jupyter_gpu_gov.profiles.kubespawner  # noqa: F401  (``scheduling``'s, at its first call)

    paged, cluster_module.PAGE = cluster_module.PAGE, args.page
    try:
        runs = []
        for _ in range(args.repeat):
            # A full collection due from building the bodies is not the reading's (one that
            # falls due during a reading holds the loop for its length, as anywhere).
            gc.collect()
            runs.append(asyncio.run(one(api, tiers, ["h100x2", "h200-3g"])))
        api.asked = 0
        memory_used = asyncio.run(memory(api, tiers))
        pages = api.asked
    finally:
        cluster_module.PAGE = paged
    print(
        f"cluster read: nodes={args.nodes} pods={args.pods} gpu_pods={args.gpu_pods} "
        f"bodies={len(nodes) / 1e6:.1f}+{len(api.whole) / 1e6:.1f} MB "
        f"page={args.page or 'whole'} requests={pages} "
        f"load={os.getloadavg()[0]:.1f} (medians of {args.repeat}, ms):"
    )
    for name in runs[0]:
        values = [r[name] for r in runs]
        print(f"  {name}: {statistics.median(values):.1f} (each {[round(v, 1) for v in values]})")
    print("  a reading's memory (tracemalloc, MB, one run):")
    for name, value in memory_used.items():
        print(f"  {name}: {value:.1f}")


if __name__ == "__main__":
    main()
