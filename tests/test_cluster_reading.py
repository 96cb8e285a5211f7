"""The profile layer's reading of the cluster (``profiles/cluster.py``): the API's bodies parsed
item by item in a thread, the pods read a page at a time (against the fake API server's paging,
with the real client), the reading applied whole, and the counts admission and the queue
sync make from it the counts of its pods (the end-to-end path, over HTTP with the real
KubeSpawner: tests/test_profiles_kubespawner.py, tests/test_kubernetes*_hub.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from fake_k8s_api import FakeKubernetes, gpu_node
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from jupyter_gpu_gov.core.vocabulary import pod_key
from jupyter_gpu_gov.profiles import cluster
from jupyter_gpu_gov.profiles.cluster import ClusterGpus, capacity, scheduling
from jupyter_gpu_gov.profiles.tiers import load_tiers

TIERS = load_tiers(
    [
        {"name": "h100", "gpu": "H100-80GB"},
        {"name": "h100x2", "gpu": "H100-80GB", "count": 2},
        {"name": "a100", "gpu": "A100-80GB"},
    ]
)
SPAWNER = SimpleNamespace(node_selector={}, tolerations=[], node_affinity_required=[])
LOG = logging.getLogger("test_cluster_reading")


def _pod(name: str, namespace: str, node: str | None, limits: dict, phase="Running") -> dict:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "x"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "env": [{"name": "TOKEN", "value": "s3cret"}],
                    "resources": {"limits": {"cpu": "2", **limits}},
                }
            ],
        },
        "status": {"phase": phase},
    }


def _cluster(seed: int = 1) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    nodes = [gpu_node(f"h100-{i}", "NVIDIA-H100-80GB-HBM3", gpus=8) for i in range(6)]
    nodes += [gpu_node(f"a100-{i}", "NVIDIA-A100-SXM4-80GB", gpus=4) for i in range(3)]
    nodes[1]["spec"]["unschedulable"] = True
    nodes[2]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    names = [n["metadata"]["name"] for n in nodes]
    pods = []
    for i in range(80):
        node = rng.choice(names)
        resource = "nvidia.com/gpu" if rng.random() < 0.8 else "nvidia.com/gpu.shared"
        limits = {resource: str(rng.randint(1, 2))} if rng.random() < 0.7 else {}
        phase = rng.choice(["Running"] * 6 + ["Pending", "Succeeded", "Failed"])
        pods.append(
            _pod(f"p{i}", rng.choice(["hub", "ml"]), rng.choice([node, node, None]), limits, phase)
        )
    return nodes, pods


class _Api:
    """list_node and list_pod_for_all_namespaces answered with bodies; the pods' answer can be
    held until ``release`` is set."""

    def __init__(self, nodes: bytes, pods: bytes):
        self.nodes, self.pods, self.release = nodes, pods, None

    async def list_node(self, **_):
        return _Answer(self.nodes)

    async def list_pod_for_all_namespaces(self, **_):
        if self.release is not None:
            await self.release.wait()
        return _Answer(self.pods)


class _Answer:
    status, reason = 200, "OK"

    def __init__(self, body: bytes):
        self.body = body

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass


def _body(items: list, **also) -> bytes:
    return json.dumps(
        {"kind": "List", "metadata": {"resourceVersion": "7"}, "items": items, **also}
    ).encode()


@pytest.mark.parametrize("chunk", [1, 3, 64, 1 << 20])
def test_a_list_is_read_item_by_item_as_json_would_read_it(monkeypatch, chunk):
    # Decoded a chunk at a time: values cut at every place a chunk can end, multi-byte
    # characters among them, read as json.loads reads the whole body.
    monkeypatch.setattr(cluster, "_CHUNK", chunk)
    items = [
        {"n": 12345678901234, "name": "é€😀" * i, "f": -1.5e-7, "l": [True, None]}
        for i in range(20)
    ]
    for body in (
        _body(items, tail=98765),
        json.dumps({"items": items}, indent=2, ensure_ascii=False).encode(),
        b' { "items" : [ ] } ',
    ):
        assert list(cluster._list_items(body)) == json.loads(body)["items"]
    for bad in (
        b"[]",
        b"",
        b'{"items": [{"a": 1}',
        b'{"items": [{"a": 1},]}',
        b'{"kind": 1}',
        b'{"items": [1 2]}',
        b'{"items": ["\xff"]}',
    ):
        with pytest.raises(ValueError):
            list(cluster._list_items(bad))


def test_the_counts_of_a_reading_are_the_counts_of_its_pods():
    # What admission counts (capacity, cards) and where a waiting spawn could go (room),
    # from the reading's per-node sums and pods by name, as from walking every pod.
    nodes, pods = _cluster()
    gpus = ClusterGpus()
    gpus.take(nodes, pods)
    rng = random.Random(2)
    for _ in range(10):
        hub_pods = {
            pod_key(p["metadata"]["namespace"], p["metadata"]["name"]): rng.choice(list(TIERS))
            for p in rng.sample(pods, 30)
        }
        grow = rng.choice([None, {"h100": 60}, {"h100x2": cluster.PoolShape(6, 8)}])

        def tier_of(pod, hub_pods=hub_pods):
            return hub_pods.get(pod_key(pod["metadata"]["namespace"], pod["metadata"]["name"]))

        walked = capacity(TIERS, nodes, pods, lambda t: scheduling(SPAWNER, t), tier_of, grow)
        assert gpus.capacity(TIERS, SPAWNER, hub_pods, grow) == walked
    assert gpus.capacity(TIERS, SPAWNER, {})["a100"] < 12  # other pods hold A100s
    assert gpus.cards(TIERS, SPAWNER) == {"h100": 32, "h100x2": 32, "a100": 12}
    free = cluster.free_on_nodes(gpus.nodes, pods, ["nvidia.com/gpu"])
    assert gpus.room(TIERS, SPAWNER)["nodes"] == {
        n: f for n, f in free.items() if f["nvidia.com/gpu"] > 0
    }
    # Nothing of a pod is kept but its node and requests: not its environment.
    assert "s3cret" not in repr(vars(gpus))


async def test_a_reading_is_applied_whole_and_one_at_a_time():
    nodes, pods = _cluster()
    api = _Api(_body(nodes), _body(pods))
    api.release = asyncio.Event()
    gpus = ClusterGpus()
    fits = [(t.resource, scheduling(SPAWNER, t)) for t in TIERS.values()]
    first = asyncio.ensure_future(gpus.refresh(api, "hub", LOG, 10, fits))
    second = asyncio.ensure_future(gpus.refresh(api, "hub", LOG, 10, fits))
    await asyncio.sleep(0.05)
    # Nodes read, pods not yet: nothing of the reading is there to count on.
    assert gpus.nodes is None and gpus.unknown() is not None
    api.release.set()
    await asyncio.gather(first, second)
    assert gpus.unknown() is None and len(gpus.fits) == 2  # the H100 tiers share their nodes
    taken = ClusterGpus()
    taken.take(nodes, pods)
    assert gpus.capacity(TIERS, SPAWNER, {}) == taken.capacity(TIERS, SPAWNER, {})


def test_a_reading_does_not_wait_for_the_loops_default_executor():
    # The Hub's loop shares its default executor (tornado resolves there the host of every
    # request the Hub makes: the proxy's API, a starting server's): with its threads busy, a
    # read parsed there waited with them, holding the read's lock, and every spawn's count
    # waited on the lock. The reading has a thread of its own.
    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        busy = threading.Event()
        taken = loop.run_in_executor(None, busy.wait)  # its one thread, until the test ends
        try:
            nodes, pods = _cluster()
            gpus = ClusterGpus()
            await asyncio.wait_for(
                gpus.refresh(_Api(_body(nodes), _body(pods)), "hub", LOG, 10), 30
            )
            assert gpus.unknown() is None and gpus.nodes
        finally:
            busy.set()
            await taken

    asyncio.run(main())


class _Pages(_Api):
    """The pods a page at a time (``PAGE`` 2), the page ``failing`` answered 500."""

    def __init__(self, nodes: list, pods: list, failing: int | None):
        super().__init__(_body(nodes), b"")
        self.pods, self.failing, self.asked = pods, failing, 0

    async def list_pod_for_all_namespaces(self, limit=None, _continue=None, **_):
        at = int(_continue or 0)
        self.asked += 1
        if at == self.failing:
            return _Failed()
        more = {"continue": str(at + limit)} if at + limit < len(self.pods) else {}
        page = self.pods[at : at + limit]
        return _Answer(_body(page, metadata={"resourceVersion": "7", **more}))


class _Failed(_Answer):
    status, reason = 500, "Internal Server Error"

    def __init__(self):
        super().__init__(b'{"message": "injected"}')


async def test_a_read_that_fails_part_way_leaves_no_read_pending(monkeypatch):
    # A page answered 500 after others were parsed: the read fails, the last reading stands,
    # the lock is free, the spawns waiting on it go on at once, and the next read (past
    # RETRY_AFTER_S) is applied whole.
    monkeypatch.setattr(cluster, "PAGE", 2)
    nodes, pods = _cluster()
    gpus = ClusterGpus()
    gpus.take(nodes, pods[:10])
    before = gpus.capacity(TIERS, SPAWNER, {})
    gpus.read_again()
    api = _Pages(nodes, pods, failing=6)
    reads = [gpus.refresh(api, "hub", LOG, 10) for _ in range(5)]  # one reads, four wait
    await asyncio.wait_for(asyncio.gather(*reads), 30)
    assert gpus.failing == "500: injected" and api.asked == 4
    assert not gpus._lock.locked() and gpus.capacity(TIERS, SPAWNER, {}) == before
    api.failing, gpus.failed_at = None, float("-inf")
    await asyncio.wait_for(gpus.refresh(api, "hub", LOG, 10), 30)
    taken = ClusterGpus()
    taken.take(nodes, pods)
    assert gpus.failing is None and gpus.unknown() is None
    assert gpus.capacity(TIERS, SPAWNER, {}) == taken.capacity(TIERS, SPAWNER, {})


async def test_a_parse_that_raises_in_its_thread_is_a_failed_read(monkeypatch):
    nodes, pods = _cluster()
    gpus = ClusterGpus()

    def broken(*_):
        raise MemoryError("in the thread")

    monkeypatch.setattr(cluster, "_take_page", broken)
    api = _Api(_body(nodes), _body(pods))
    await asyncio.wait_for(
        asyncio.gather(*(gpus.refresh(api, "hub", LOG, 10) for _ in range(3))), 30
    )
    assert gpus.failing == "MemoryError: in the thread" and not gpus._lock.locked()
    monkeypatch.undo()
    gpus.failed_at = float("-inf")
    await asyncio.wait_for(gpus.refresh(api, "hub", LOG, 10), 30)
    assert gpus.failing is None and gpus.unknown() is None


async def test_a_body_that_is_no_list_is_a_failed_read():
    gpus = ClusterGpus()
    await gpus.refresh(_Api(_body([]), b'{"items": [{"a": 1},'), "hub", LOG, 10)
    assert gpus.failing and gpus.nodes is None
    # A page that names itself as the next: a failed read, not one that never ends.
    looping = _Api(_body([]), _body([], metadata={"resourceVersion": "7", "continue": "x"}))
    gpus.failed_at = float("-inf")
    await asyncio.wait_for(gpus.refresh(looping, "hub", LOG, 10), 10)
    assert "its own continue token" in gpus.failing and gpus.nodes is None


def _client(k8s: FakeKubernetes) -> ApiClient:
    return ApiClient(Configuration(host=k8s.url))


async def test_the_fake_api_pages_a_list_as_the_api_server_does():
    # limit and continue as kubectl and every paging client meet them: the pages of one
    # snapshot (an object made between two pages is not in them), the count left where no
    # selector filters, no token on the last page, and 410 Expired once the snapshot is gone.
    with FakeKubernetes() as k8s:
        for i in range(7):
            k8s.create("configmaps", {"metadata": {"name": f"c{i}"}}, ["default", "ml"][i % 2])
        async with _client(k8s) as client:
            api = CoreV1Api(client)
            whole = await api.list_config_map_for_all_namespaces()
            first = await api.list_config_map_for_all_namespaces(limit=3)
            assert len(first.items) == 3 and first.metadata.remaining_item_count == 4
            k8s.create("configmaps", {"metadata": {"name": "late"}})
            names, page = [], first
            while True:
                names += [(c.metadata.namespace, c.metadata.name) for c in page.items]
                if not page.metadata._continue:
                    break
                page = await api.list_config_map_for_all_namespaces(
                    limit=3, _continue=page.metadata._continue
                )
                assert page.metadata.resource_version == first.metadata.resource_version
            assert names == [(c.metadata.namespace, c.metadata.name) for c in whole.items]
            assert len(names) == 7 and page.metadata.remaining_item_count is None

            chosen = await api.list_namespaced_config_map("default", limit=2, field_selector="")
            assert [c.metadata.name for c in chosen.items] == ["c0", "c2"]
            selected = await api.list_config_map_for_all_namespaces(
                limit=2, field_selector="metadata.namespace=ml"
            )
            assert len(selected.items) == 2 and selected.metadata._continue
            assert selected.metadata.remaining_item_count is None  # filtered: not counted
            k8s.expire_lists()
            with pytest.raises(ApiException) as expired:
                await api.list_config_map_for_all_namespaces(
                    limit=2,
                    field_selector="metadata.namespace=ml",
                    _continue=selected.metadata._continue,
                )
            assert expired.value.status == 410
            assert json.loads(expired.value.body)["reason"] == "Expired"


class _Compacting:
    """The real client, with the API server's snapshots dropped before the next page is asked
    for (``times`` times): a read that outlived the few minutes the API server keeps one."""

    def __init__(self, api: CoreV1Api, k8s: FakeKubernetes, times: int):
        self.api, self.k8s, self.times = api, k8s, times

    def __getattr__(self, name):
        return getattr(self.api, name)

    def list_pod_for_all_namespaces(self, **kwargs):
        if kwargs.get("_continue") and self.times > 0:
            self.times -= 1
            self.k8s.expire_lists()
        return self.api.list_pod_for_all_namespaces(**kwargs)


async def test_pods_are_read_a_page_at_a_time_and_applied_whole(monkeypatch):
    monkeypatch.setattr(cluster, "PAGE", 2)
    node = gpu_node("h100-0", "NVIDIA-H100-80GB-HBM3", gpus=8)
    with FakeKubernetes([node]) as k8s:
        for i in range(5):
            k8s.create("pods", _pod(f"job{i}", "ml", "h100-0", {"nvidia.com/gpu": "1"}), "ml")
        async with _client(k8s) as client:
            api = CoreV1Api(client)
            gpus = ClusterGpus()
            await gpus.refresh(api, "hub", LOG, 10)
            asked = [entry for entry in k8s.lists if entry[0] == "pods"]
            assert [(limit, bool(token)) for _, _, limit, token in asked] == [
                (2, False),
                (2, True),
                (2, True),
            ]
            assert gpus.failing is None and gpus.capacity(TIERS, SPAWNER, {})["h100"] == 3

            # The snapshot expired between two pages: the read starts over, once.
            k8s.lists.clear()
            k8s.create("pods", _pod("job5", "ml", "h100-0", {"nvidia.com/gpu": "2"}), "ml")
            gpus.read_again()
            await gpus.refresh(_Compacting(api, k8s, 1), "hub", LOG, 10)
            tokens = [bool(token) for plural, _, _, token in k8s.lists if plural == "pods"]
            assert tokens == [False, True, False, True, True], tokens  # a 410, then all again
            assert gpus.failing is None and gpus.capacity(TIERS, SPAWNER, {})["h100"] == 1

            # Again on the read that starts over: a failed read, and the last reading stands.
            k8s.create("pods", _pod("job6", "ml", "h100-0", {"nvidia.com/gpu": "1"}), "ml")
            gpus.read_again()
            await gpus.refresh(_Compacting(api, k8s, 2), "hub", LOG, 10)
            assert gpus.failing.startswith("410: The provided continue parameter is too old")
            assert gpus.capacity(TIERS, SPAWNER, {})["h100"] == 1
            assert "ml/job6" not in repr(gpus.bound)
