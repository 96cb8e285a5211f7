"""GPU capacity as the cluster has it: what the nodes each tier selects can hold, less what other
pods hold there (the hub's own servers on the tier excepted: admission counts those).

``capacity(tiers, nodes, pods, scheduling, tier_of)`` is pure: nodes and pods are the API
server's JSON (``list_node``, ``list_pod_for_all_namespaces``). A tier counts the allocatable amount of
its extended resource (``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``,
``nvidia.com/gpu.shared``) on every schedulable, ready node that its pods could land on (node
selector, required node affinity, taints against tolerations: the tier's joined with what
KubeSpawner is configured with), minus what the GPU pods bound there ask for, except the hub's
own servers on that tier: admission counts those.

``ClusterGpus`` reads nodes and every namespace's pods every ``refresh_every`` seconds (one read
at a time, awaited before the spawn form and admission; admission itself then awaits nothing;
the pods ``PAGE`` a request, each body parsed in a thread of its own (``_reader``), off the
Hub's event loop, and the reading applied whole once its last page is in), and keeps of the
pods that hold an extended resource their node and requests, and the devices held per node (a
count then costs O(nodes x tiers), not O(pods)). On a shared cluster other teams'
jobs hold GPUs from their own namespaces (and KubeSpawner's ``enable_user_namespaces`` puts each
user's server in one): read from the hub's namespace alone, their cards counted free and the hub
admitted servers that stayed Pending. Where RBAC allows only the hub's namespace's pods, those
are read, and the log says once what it leaves out. When the API refuses the read of nodes for
want of permission (401, 403: no RBAC for nodes) it says so once in the log and ``capacity``
answers ``None``: the spawner falls back to ``GpuProfiles.capacity``. When the API fails (a 5xx,
a conflict, no answer within the request timeout, a dropped connection) the last reading stands
while it is fresh; past ``FRESH_FOR_S`` the cluster is unknown, as a workstation's
(``unknown``), and no GPU is counted free: the spawn is refused with the API's failure named,
never admitted on the configured numbers the cluster may not have. The read is tried again
``RETRY_AFTER_S`` after a failure.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from traitlets import Bool
from traitlets.config import SingletonConfigurable

from ..core.queue import FRESH_FOR_S
from ..core.text import escaped
from ..core.traits import FiniteFloat
from ..core.vocabulary import pod_key
from .tiers import PRODUCT_LABEL, Tier

_DONE = ("Succeeded", "Failed")
_LIVE = ",".join(f"status.phase!={phase}" for phase in _DONE)  # the pods that may hold a card
PAGE = 500  # pods asked for per request: the Hub holds one page's body at a time, not all
RETRY_AFTER_S = 5.0  # after a failed read: spawns meanwhile do not each wait on a failing API
_REFUSED = (401, 403)  # the hub's service account may not read: it will not, so configured
_HARD_TAINTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class PoolShape:
    """A node pool an autoscaler grows by whole nodes: at most ``nodes`` nodes of ``per_node``
    devices of a tier's resource each (``GpuProfiles.node_pool_max``'s ``{"nodes": 2,
    "devices_per_node": 8}``). A server takes its devices on one node: a node of 8 holds two
    servers of 3 cards, not 8/3, and none of 16."""

    nodes: int
    per_node: int

    def adds(self, tier: Tier, existing_nodes: int) -> int:
        """The devices the nodes it may still add hold for whole servers of ``tier``."""
        per = self.per_node if tier.kind == "shared" else self.per_node // tier.count * tier.count
        return max(0, self.nodes - existing_nodes) * per

    @property
    def devices(self) -> int:
        return self.nodes * self.per_node


def _grows(more: int | PoolShape, tier: Tier, fits: list[tuple[str, int]]) -> int:
    """The devices ``tier``'s pool may still add for it (``more``: ``node_pool_max``'s entry:
    devices in all, or the pool's shape) beside the nodes it has (``fits``)."""
    if isinstance(more, PoolShape):
        return more.adds(tier, len(fits))
    return max(0, more - sum(n for _, n in fits))


def capacity(
    tiers: Mapping[str, Tier],
    nodes: Iterable[Mapping],
    pods: Iterable[Mapping],
    scheduling: Callable[[Tier], Mapping[str, Any]],
    tier_of: Callable[[Mapping], str | None],
    grow: Mapping[str, int | PoolShape] | None = None,
) -> dict[str, int]:
    """Devices per tier that exist and the hub may use. ``scheduling(tier)`` gives the pod's
    ``node_selector``, ``tolerations`` and required ``node_affinity`` terms (lists of match
    expressions, ORed) for that tier; ``tier_of(pod)`` is the tier of a server's pod the hub
    started on one, None for any other pod. A tier's count leaves out only its own
    servers' pods, which admission counts: the hub's servers on another tier sharing the cards
    (a pair, any 80 GB card, a tier since removed) hold them as any other pod does. ``grow``:
    per tier, what its nodes can hold once an autoscaler has added all it may
    (``GpuProfiles.node_pool_max``): its pool's node shape (``PoolShape``), whose nodes yet to
    come count as free for whole servers each, or devices, what its nodes lack of which today
    counts as free."""
    held: dict[str, dict[str, int]] = {}  # node -> resource -> amount held
    own: dict[str, dict[str, dict[str, int]]] = {}  # the same, of the tier's own servers
    for node, pod, resource, amount in _bound_requests(pods):
        _add(held, node, resource, amount)
        tier = tier_of(pod)
        if tier is not None:
            _add(own.setdefault(tier, {}), node, resource, amount)
    nodes = list(nodes)

    def fitting(tier: Tier) -> list[tuple[str, int]]:
        return _fitting(nodes, tier.resource, scheduling(tier))

    return _capacity(tiers, fitting, held, own, grow)


def _capacity(
    tiers: Mapping[str, Tier],
    fitting: Callable[[Tier], list[tuple[str, int]]],
    held: Mapping[str, Mapping[str, int]],
    own: Mapping[str, Mapping[str, Mapping[str, int]]],
    grow: Mapping[str, int | PoolShape] | None,
) -> dict[str, int]:
    """``capacity`` from the nodes each tier's pods could land on (``fitting``: ``_fitting``'s)
    and what the pods bound to each node hold (``held``) and, per tier, what its own servers'
    pods hold there (``own``): O(those nodes), however many pods."""
    result = {}
    for name, tier in tiers.items():
        mine = own.get(name, {})
        free = 0
        fits = fitting(tier)
        for node, allocatable in fits:
            taken = (held.get(node) or {}).get(tier.resource, 0) - (mine.get(node) or {}).get(
                tier.resource, 0
            )
            free += max(0, allocatable - taken)
        # A pool scaled to zero has no node to read: the nodes an autoscaler would add for a
        # Pending pod count too, or no spawn ever makes it add one.
        free += _grows((grow or {}).get(name, 0), tier, fits)
        if tier.kind != "shared":
            free -= free % tier.count  # whole servers only (a pair needs two cards of one node)
        result[name] = free
    return result


def _fitting(nodes: Iterable[Mapping], resource: str, wanted: Mapping) -> list[tuple[str, int]]:
    """(name, devices of ``resource`` it can allocate) of each schedulable, ready node that a
    pod of scheduling ``wanted`` (``scheduling``) could land on."""
    return [
        (
            node["metadata"]["name"],
            _quantity((node["status"].get("allocatable") or {}).get(resource)),
        )
        for node in nodes
        if _usable(node) and _fits(node, wanted)
    ]


def _fit_key(resource: str, wanted: Mapping) -> str:
    """One key per resource and scheduling: tiers alike draw on the same nodes (a pool)."""
    return json.dumps([resource, wanted], sort_keys=True, default=str)


def _add(held: dict[str, dict[str, int]], node: str, resource: str, amount: int) -> None:
    on_node = held.setdefault(node, {})
    on_node[resource] = on_node.get(resource, 0) + amount


def _bound_requests(pods: Iterable[Mapping]) -> Iterator[tuple[str, Mapping, str, int]]:
    """Of each live pod bound to a node: (its node, the pod, a resource it asks for, how much)."""
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName")
        if node and status.get("phase") not in _DONE:
            for resource, amount in _extended_requests(spec).items():
                yield node, pod, resource, amount


def _cards(tiers, fitting, grow) -> dict[str, int]:
    """Devices per tier on the nodes ``capacity`` counts, whoever holds them (with ``grow``: as
    many as an autoscaler may add up to): the spawn form's "N of M free", where M is not what a
    pair or another pod leaves a single card."""
    cards = {}
    for name, tier in tiers.items():
        most = (grow or {}).get(name, 0)
        most = most.devices if isinstance(most, PoolShape) else most
        cards[name] = max(sum(n for _, n in fitting(tier)), most)
    return cards


def free_on_nodes(
    nodes: Iterable[Mapping],
    pods: Iterable[Mapping],
    resources: Iterable[str],
    held: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, dict[str, int]]:
    """Per schedulable, ready node that has any of ``resources``, the devices free of each:
    what it can allocate less what every live pod bound there asks for (the hub's own
    servers' too: where a pod fits, not what admission counts). ``held``: that, per node,
    worked out already (``held_on_nodes``; ``ClusterGpus`` has it with the reading, off the
    event loop): ``pods`` are then not read, and this is O(nodes). Worked out once per reading
    of the cluster (``ClusterGpus.room``), never per sync."""
    resources = sorted(set(resources))
    if held is None:
        held = held_on_nodes(pods)
    free: dict[str, dict[str, int]] = {}
    for node in nodes:
        if not _usable(node):
            continue
        name = node["metadata"]["name"]
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        taken = held.get(name, {})
        counts = {
            r: max(0, n - taken.get(r, 0))
            for r in resources
            if (n := _quantity(allocatable.get(r))) > 0
        }
        if counts:
            free[name] = counts
    return free


def held_on_nodes(pods: Iterable[Mapping]) -> dict[str, dict[str, int]]:
    """Per node, the devices of each extended resource the live pods bound there ask for."""
    held: dict[str, dict[str, int]] = {}
    for node, _pod, resource, amount in _bound_requests(pods):
        _add(held, node, resource, amount)
    return held


def _reach(tier: Tier, fitting: list[tuple[str, int]], free) -> tuple[list[str], int]:
    """The nodes (of ``free_on_nodes``) a tier's pods could land on (of its ``_fitting``), and
    the devices of its resource they can allocate in all."""
    on = [(name, n) for name, n in fitting if tier.resource in free.get(name, {})]
    return sorted(name for name, _ in on), sum(n for _, n in on)


def room(
    tiers: Mapping[str, Tier],
    free: Mapping[str, Mapping[str, int]],
    reaches: Mapping[str, tuple[list[str], int, str]],
    grow: Mapping[str, int | PoolShape] | None = None,
) -> dict[str, dict]:
    """Where a spawn waiting for each tier of ``reaches`` could go now, for the cluster
    report's fragmentation (``diagnose.cluster.placement``). ``free``: ``free_on_nodes``;
    ``reaches``: per tier, ``_reach``'s nodes and devices, and its pool (tiers asking for the
    same resource with the same scheduling draw on the same nodes). Says ``nodes``: per node
    with a device free that one of those tiers asks for, what is free of each such resource;
    ``tiers``: per tier, its ``resource``, the ``count`` one server asks for (a pair's two
    cards must be on one node; a MIG slice or a time-share is one device of its own resource,
    never a whole card's), the ``nodes`` its pods could land on that have one free and
    ``nodes_total`` (all it could land on), and its ``pool``; ``pools``: per pool that an
    autoscaler can grow (``grow``: ``GpuProfiles.node_pool_max``), the devices it may still
    add (of a ``PoolShape``: the nodes it may still add times their devices); ``node_devices``:
    per pool given by its node shape, the devices of one node, so that ``placement`` puts
    whole servers on each node to come (two 3-card servers on a new 8-card node, not 8/3). A
    full node or tier takes no room in the answer: it grows with the free devices the waiting
    tiers could use, not with the cluster."""
    grow = grow or {}
    nodes: dict[str, dict[str, int]] = {}
    placed, pools, per_node = {}, {}, {}
    for name in sorted(reaches):
        tier, (on, existing, pool) = tiers[name], reaches[name]
        resource = tier.resource
        with_free = [n for n in on if free[n][resource] > 0]
        for node in with_free:
            nodes.setdefault(node, {})[resource] = free[node][resource]
        if name in grow:  # the most its pool holds less what it holds now (its tiers alike)
            more = grow[name]
            adds = (
                max(0, more.nodes - len(on)) * more.per_node
                if isinstance(more, PoolShape)
                else max(0, more - existing)
            )
            if pool not in pools or adds > pools[pool]:  # (its tiers' shapes alike, or the most)
                pools[pool] = adds
                per_node.pop(pool, None)
                if isinstance(more, PoolShape):
                    per_node[pool] = more.per_node
        placed[name] = {
            "resource": resource,
            "count": tier.count,
            "nodes": with_free,
            "nodes_total": len(on),
            "pool": pool if name in grow else None,
        }
    return {"nodes": nodes, "tiers": placed, "pools": pools, "node_devices": per_node}


def _usable(node: Mapping) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = [c for c in conditions if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") == "True"


def _fits(node: Mapping, wanted: Mapping[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (wanted.get("node_selector") or {}).items()):
        return False
    terms = wanted.get("node_affinity") or []
    if terms and not any(all(_matches(labels, e) for e in term) for term in terms):
        return False
    tolerations = wanted.get("tolerations") or []
    taints = (node.get("spec") or {}).get("taints") or []
    return all(
        any(_tolerates(t, taint) for t in tolerations)
        for taint in taints
        if taint.get("effect") in _HARD_TAINTS
    )


def _matches(labels: Mapping[str, str], expression: Mapping) -> bool:
    key, operator = expression.get("key"), expression.get("operator")
    values = expression.get("values") or []
    value = labels.get(key)
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            number, bound = int(value), int(values[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def _tolerates(toleration: Mapping, taint: Mapping) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (
        taint.get("value") or ""
    )


def _extended_requests(spec: Mapping) -> dict[str, int]:
    """What a pod's containers ask for of extended resources (their limits: for extended
    resources Kubernetes requires the request to equal the limit)."""
    asked: dict[str, int] = {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, value in amounts.items():
            if "/" in name:
                asked[name] = asked.get(name, 0) + _quantity(value)
    return asked


def _reading(nodes: Iterable[Mapping], pods: Iterable[Mapping]) -> tuple[list, dict, dict]:
    """What a reading keeps of the API's nodes and live pods: the nodes as ``capacity`` reads
    them (``_node``); per live pod bound to a node that asks for an extended resource, its
    ``pod_key`` -> (its node, its requests), for the hub's own servers' pods that admission
    counts; the devices held per node (``held_on_nodes``). Nothing else of a pod is kept (a
    spec's environment may carry its secrets), and no dict a pod (10,000 pods are 10,000
    tuples the garbage collector stops tracking, not 70,000 dicts it walks)."""
    node_list = [_node(node) for node in nodes]
    bound: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
    held: dict[str, dict[str, int]] = {}
    for pod in pods:
        _keep(pod, bound, held)
    return node_list, bound, held


def _keep(pod: Mapping, bound: dict, held: dict) -> None:
    """Into ``_reading``'s ``bound`` and ``held``: what they keep of one pod, if anything."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    node = spec.get("nodeName")
    if not node or status.get("phase") in _DONE:
        return
    asked = _extended_requests(spec)
    if not asked:
        return
    metadata = pod.get("metadata") or {}
    bound[pod_key(metadata.get("namespace"), metadata.get("name"))] = (
        node,
        tuple(sorted(asked.items())),
    )
    for resource, amount in asked.items():
        _add(held, node, resource, amount)


def _quantity(value: Any) -> int:
    """A device count as the API writes it ("8", 8); anything else counts none."""
    try:
        return max(0, int(str(value)))
    except (TypeError, ValueError):
        return 0


class ClusterGpus(SingletonConfigurable):
    """The hub's reading of the cluster's nodes and GPU pods (one per process)."""

    refresh_every = FiniteFloat(
        30,
        min=0,
        max=86_400,
        unit="seconds",
        help="""Seconds between two reads of the nodes and the pods for capacity.
        The scheduler has the last word: a count a little old can only leave a pod Pending,
        with the reason shown on the spawn page. At most 120 s are used: a reading older is
        unknown (the queue's places say so, not an estimate).""",
    ).tag(config=True)

    left_pod_sweep = Bool(
        True,
        help="""Delete the pod of a server the Hub stopped while the Kubernetes API failed
        its delete (past KubeSpawner's k8s_api_request_retry_timeout): JupyterHub records the
        server stopped with its pod running, holding its GPU. Only a pod the hub made (the uid
        it recorded, KubeSpawner's annotations naming the server) is deleted, audited by the
        governor first (``profiles/left_pods.py``); until then its card counts as in use.""",
    ).tag(config=True)

    left_pod_grace = FiniteFloat(
        120,
        min=0,
        max=86_400,
        unit="seconds",
        help="""Seconds after the failed stop before such a pod is deleted: longer than a
        pod's own termination (its grace period) takes, so a delete the API carried out
        late is not asked for again.""",
    ).tag(config=True)

    nodes: list[dict] | None = None
    # pod_key -> (node, requests) of the live pods holding an extended resource (``_reading``)
    bound: dict = {}
    read_at: float = float("-inf")
    error: str | None = None  # the API refuses the read (RBAC): configured capacity
    failing: str | None = None  # the API failed the last read: why (the reading may be old)
    failed_at: float = float("-inf")
    namespace_only: str | None = None  # why only the hub's namespace's pods could be read
    _lock: asyncio.Lock | None = None
    left_pod_sweeper: Any = None  # the sweep's caller of the API and back-off (``left_pods``)
    held: dict = {}  # node -> resource -> devices the live pods bound there ask for
    # _fit_key(resource, scheduling) -> _fitting's nodes, for this reading (those asked for
    # at the read worked out with it, in its thread; others at their first use)
    fits: dict = {}
    # ``room``'s work on the reading of ``_room_of`` (its read_at): free devices per node, per
    # set of the tiers' resources; each tier's nodes, per its scheduling.
    _room_of: float = float("nan")
    _room_free: dict = {}
    _room_reach: dict = {}

    async def refresh(
        self,
        api,
        namespace: str,
        log,
        timeout: float | None = None,
        fits: Iterable[tuple[str, Mapping]] = (),
    ) -> None:
        """Read nodes and pods if the last read is older than ``refresh_every`` (or than
        ``FRESH_FOR_S``, past which a reading is unknown: a step that counts never does so on
        one), each request (the nodes, each page of pods) within ``timeout`` seconds; not again
        within ``RETRY_AFTER_S`` of a failed read. The bodies come in on the event loop, the
        pods ``PAGE`` at a time (``_pages``); each is parsed in a thread (``_parse``,
        ``_take_page``: at 30,000 pods the loop was held for the whole parse, seconds;
        docs/benchmarks.md), with each node's devices held and the nodes each of ``fits`` (a
        resource and a ``scheduling``: the tiers') could land on, and the reading is applied
        at once, whole, after its last page: nothing counts on half of one, and a read that
        fails part way leaves the last reading. One read at a time."""
        every = min(self.refresh_every, FRESH_FOR_S)
        if self.age() < every or time.monotonic() - self.failed_at < RETRY_AFTER_S:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.age() < every or time.monotonic() - self.failed_at < RETRY_AFTER_S:
                return  # another spawn read them (or found the API failing) meanwhile
            try:
                loop = asyncio.get_running_loop()
                nodes = await _body(api.list_node(_preload_content=False), timeout)
                node_list, found = await loop.run_in_executor(_reader(), _parse, nodes, list(fits))
                del nodes  # the pods' pages are read without it
                bound, held = await self._gpu_pods(api, namespace, log, timeout)
            except Exception as error:
                self._failed(error, timeout, log)
            else:
                if self.error or self.failing:
                    log.info("gpu-gov: reading the cluster's GPU capacity again")
                self.error, self.failing = None, None
                self.nodes, self.bound, self.held, self.fits = node_list, bound, held, found
                self.read_at = time.monotonic()

    def _failed(self, error: Exception, timeout: float | None, log) -> None:
        if isinstance(error, asyncio.TimeoutError):
            message = f"no answer within {timeout:g} s"
        elif isinstance(error, ApiFailed):  # "<status>: <the API's Status message>"
            message = str(error).splitlines()[0][:300]
        else:
            message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        if getattr(error, "status", None) in _REFUSED:  # RBAC: the configured capacity
            if message != self.error:
                log.warning(
                    "gpu-gov: cannot read the cluster's nodes and pods (%s); capacity comes "
                    "from c.GpuProfiles.capacity until it can (see docs/kubernetes.md: RBAC)",
                    escaped(message),
                )
            self.error, self.failing, self.nodes = message, None, None
            self.read_at = time.monotonic()
            return
        if message != self.failing:
            log.warning(
                "gpu-gov: the Kubernetes API failed the read of the cluster's nodes and pods "
                "(%s); the last reading counts for %d s after it was taken, then no GPU is "
                "counted free until the API answers",
                escaped(message),
                FRESH_FOR_S,
            )
        self.failing, self.failed_at = message, time.monotonic()

    async def _gpu_pods(self, api, namespace: str, log, timeout: float | None) -> tuple:
        """``_reading``'s ``bound`` and ``held`` of the live pods of every namespace, read a
        page at a time (``_pages``); of ``namespace`` alone where RBAC allows no more (said
        once in the log)."""
        try:
            found = await _pages(
                lambda **page: api.list_pod_for_all_namespaces(
                    field_selector=_LIVE, _preload_content=False, **page
                ),
                timeout,
            )
        except ApiFailed as error:
            if error.status not in _REFUSED:
                raise
            if error.why != self.namespace_only:
                log.warning(
                    "gpu-gov: cannot read pods in every namespace (%s): the cards that pods "
                    "of other namespaces hold are counted free; grant `list` on pods at the "
                    "cluster scope (hub_config/kubernetes/rbac-nodes.yaml)",
                    escaped(error.why),
                )
            self.namespace_only = error.why
            found = await _pages(
                lambda **page: api.list_namespaced_pod(
                    namespace, field_selector=_LIVE, _preload_content=False, **page
                ),
                timeout,
            )
        else:
            self.namespace_only = None
        return found

    def read_again(self) -> None:
        """The next step that counts reads the cluster first: a pod appeared or went that the
        hub's records do not account for (a stop left its server's pod running; a left pod
        went; a stopped server's pod went, counted as another's once the server stopped). The
        reading may be up to ``FRESH_FOR_S`` old, taken before that pod was made: counted on
        it, the left pod's card was free and admission handed it out again."""
        self.read_at = float("-inf")

    def age(self) -> float:
        """Seconds since the last read came back (infinite: never read)."""
        return time.monotonic() - self.read_at

    def unknown(self) -> str | None:
        """Why the cluster's GPUs cannot be counted now: its last reading is older than
        ``FRESH_FOR_S`` (or there is none), as a workstation's (``LocalGpus.unknown``). A read
        that failed is not unknown: capacity then comes from ``c.GpuProfiles.capacity``."""
        age = self.age()
        if age <= FRESH_FOR_S:
            return None
        if self.failing:
            return (
                "GPU state unknown: the Kubernetes API did not answer the hub's count of the "
                f"cluster's GPUs ({self.failing}), so no GPU is counted free until it does. "
                "Try again in a few minutes."
            )
        when = "have not been read" if age == float("inf") else f"were last read {age:.0f} s ago"
        return (
            f"GPU state unknown: the cluster's nodes and pods {when}, so no GPU is counted "
            "free until they are read again. Try again in a few minutes."
        )

    def capacity(
        self,
        tiers: Mapping[str, Tier],
        spawner,
        hub_pods: Mapping[str, str],
        grow: Mapping[str, int | PoolShape] | None = None,
    ):
        """Devices per tier from the last read, for ``spawner``'s configured scheduling (with
        ``grow``: the most an autoscaler may add up to); None when nodes could not be read.
        ``hub_pods``: the pod (``pod_key``) of each of the hub's started servers holding a
        tier -> that tier, from the hub's records: a pod's labels are anyone's who may create
        pods in the namespace, and one copying a server's would have its cards left out of the
        count; so would one of the same name in another namespace."""
        if self.nodes is None:
            return None
        own: dict[str, dict[str, dict[str, int]]] = {}
        for key, tier in hub_pods.items():
            if (found := self.bound.get(key)) is not None:
                node, asked = found
                for resource, amount in asked:
                    _add(own.setdefault(tier, {}), node, resource, amount)
        return _capacity(tiers, lambda t: self._fitting(t, spawner), self.held, own, grow)

    def products(self, pods: Mapping[str, str]) -> dict[str, str]:
        """Of ``pods`` (key -> ``pod_key``), the GPU product (``nvidia.com/gpu.product``) of
        the node each is bound to on the last read, where known."""
        if not pods or self.nodes is None:
            return {}
        labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in self.nodes}
        found = {}
        for key, pod in pods.items():
            node = (self.bound.get(pod) or (None,))[0]
            product = (labels.get(node) or {}).get(PRODUCT_LABEL)
            if isinstance(product, str):
                found[key] = product
        return found

    def _fitting(self, tier: Tier, spawner, wanted: Mapping | None = None) -> list:
        """``_fitting``'s nodes for ``tier`` on this reading, worked out once a reading."""
        wanted = scheduling(spawner, tier) if wanted is None else wanted
        key = _fit_key(tier.resource, wanted)
        if key not in self.fits:
            self.fits[key] = _fitting(self.nodes, tier.resource, wanted)
        return self.fits[key]

    def take(self, nodes: Iterable[Mapping], pods: Iterable[Mapping]) -> None:
        """A reading of ``nodes`` and live ``pods`` as the API writes them, applied whole and
        taken now (tests, benchmarks; ``refresh`` reads its own)."""
        self.nodes, self.bound, self.held = _reading(nodes, pods)
        self.fits = {}
        self.error, self.failing, self.read_at = None, None, time.monotonic()

    def cards(
        self, tiers: Mapping[str, Tier], spawner, grow: Mapping[str, int | PoolShape] | None = None
    ) -> dict[str, int] | None:
        """``cards`` from the last read, as ``capacity``; None when nodes could not be read."""
        if self.nodes is None:
            return None
        return _cards(tiers, lambda t: self._fitting(t, spawner), grow)

    def room(
        self,
        tiers: Mapping[str, Tier],
        spawner,
        wanted: Iterable[str] | None = None,
        grow: Mapping[str, int | PoolShape] | None = None,
    ) -> dict:
        """``room`` from the last read, as the governor's sync carries it
        (``core.queue.room_from_json``), for the tiers ``wanted`` (those spawns wait for;
        None: every tier), with ``spawner``'s configured scheduling and ``grow``
        (``GpuProfiles.node_pool_max``). Without a fresh reading it is ``unknown``, saying why
        (older than ``FRESH_FOR_S``, the API failing, nodes not readable for want of RBAC):
        free cards not seen are not none; with none of ``wanted`` a tier (nothing waits) it is
        empty and known, whatever the reading. What a reading gives (each node's free devices,
        each tier's nodes) is worked out once per reading, when a spawn first waits: a sync
        with none waiting pays nothing, one on the same reading pays for the nodes it sends."""
        names = sorted(tiers) if wanted is None else sorted(set(wanted) & set(tiers))
        why = self.unknown()
        if why is None and self.error:
            why = f"the hub may not read the cluster's nodes ({self.error})"
        elif why is None and self.nodes is None:
            why = "the hub has not read the cluster's nodes yet"
        if wanted is not None and not names:  # nothing waits: no room to say, known or not
            age = None if why is not None else round(self.age(), 3)
            return {
                "unknown": None,
                "read_age_s": age,
                "nodes": {},
                "tiers": {},
                "pools": {},
                "node_devices": {},
            }
        if why is not None:
            return {"unknown": why, "read_age_s": None, "nodes": {}, "tiers": {}}
        if self._room_of != self.read_at:  # a new reading: what was worked out is of the last
            self._room_of, self._room_free, self._room_reach = self.read_at, {}, {}
        resources = frozenset(tier.resource for tier in tiers.values())
        if names and resources not in self._room_free:
            self._room_free[resources] = free_on_nodes(self.nodes, (), resources, self.held)
        free = self._room_free.get(resources, {})
        reaches = {}
        for name in names:
            tier = tiers[name]
            wants = scheduling(spawner, tier)
            pool = _fit_key(tier.resource, wants)
            key = (resources, name, pool)
            if key not in self._room_reach:
                self._room_reach[key] = _reach(tier, self._fitting(tier, spawner, wants), free)
            on, existing = self._room_reach[key]
            reaches[name] = (on, existing, pool)
        found = room(tiers, free, reaches, grow)
        # A pool's name in the answer: the first of its tiers (its key is the scheduling).
        short = {}
        for name in sorted(reaches):
            short.setdefault(reaches[name][2], name)
        for tier in found["tiers"].values():
            tier["pool"] = short.get(tier["pool"]) if tier["pool"] else None
        found["pools"] = {short[k]: n for k, n in found["pools"].items()}
        found["node_devices"] = {short[k]: n for k, n in found["node_devices"].items()}
        return {"unknown": None, "read_age_s": round(self.age(), 3), **found}


class _Serializer:
    """The kubernetes client's serializer without an ApiClient (which opens an HTTP session)."""

    def __init__(self):
        from kubernetes_asyncio.client import ApiClient

        self.PRIMITIVE_TYPES = ApiClient.PRIMITIVE_TYPES
        self.sanitize_for_serialization = ApiClient.sanitize_for_serialization.__get__(self)


def api_json(obj: Any) -> Any:
    """Kubernetes client models (and lists and dicts of them) as the API's JSON."""
    return _Serializer().sanitize_for_serialization(obj)


def scheduling(spawner, tier: Tier) -> dict[str, Any]:
    """A tier's pod scheduling joined with what ``spawner`` is configured with, as plain data."""
    from .kubespawner import _with_expressions, _with_tolerations

    plain = api_json
    configured = getattr(spawner, "_gpu_configured", None) or {}

    def base(key):
        return configured[key] if key in configured else getattr(spawner, key)

    tolerations = _with_tolerations(base("tolerations"), [dict(t) for t in tier.tolerations])
    terms = base("node_affinity_required")
    if tier.node_affinity:
        terms = _with_expressions(terms, [dict(e) for e in tier.node_affinity])
    terms = terms.values() if isinstance(terms, dict) else terms
    expressions = []
    for term in plain(list(terms)):
        expressions.append(term.get("matchExpressions") or term.get("match_expressions") or [])
    tolerations = tolerations.values() if isinstance(tolerations, dict) else tolerations
    return {
        "node_selector": {**base("node_selector"), **tier.node_selector},
        "tolerations": plain(list(tolerations)),
        "node_affinity": expressions,
    }


class ApiFailed(RuntimeError):
    """The API answered a read with an error status (``status``; ``why``: its Status's
    message, its first line, bounded)."""

    def __init__(self, status: int, why: str):
        why = (str(why).splitlines() or [""])[0][:300]
        super().__init__(f"{status}: {why}")
        self.status, self.why = status, why


async def _body(call, timeout: float | None = None) -> bytes:
    """The body of a list call, answered within ``timeout`` seconds (headers and body)."""
    return await asyncio.wait_for(_read_body(call), timeout)


async def _read_body(call) -> bytes:
    response = await call
    try:
        body = await response.read()
        if response.status != 200:
            try:  # the API server's Status says why (e.g. which RBAC rule is missing)
                why = json.loads(body)["message"]
            except (ValueError, KeyError, TypeError):
                why = response.reason
            raise ApiFailed(response.status, why)
        return body
    finally:
        response.release()


_READER: ThreadPoolExecutor | None = None


def _reader() -> ThreadPoolExecutor:
    """The reading's own worker thread (one read at a time: one thread), not the event loop's
    default executor, which the Hub shares: tornado resolves the host of every request the Hub
    makes (to the proxy's API, to a starting server) there, and anything else may queue work
    on it. A parse never waits behind those, and they never wait behind a parse."""
    global _READER
    if _READER is None:
        _READER = ThreadPoolExecutor(1, thread_name_prefix="gpu-gov-cluster-read")
    return _READER


def _parse(nodes: bytes, fits: list[tuple[str, Mapping]]) -> tuple[list, dict]:
    """``_reading``'s nodes of the API's body, in a worker thread, and the nodes each of
    ``fits`` could land on (``_fitting``). Items are decoded one at a time, so the thread lets
    go of the interpreter between them: one ``json.loads`` of 100 MB held it, and the Hub's
    event loop, for the whole parse."""
    node_list = [_node(node) for node in _list_items(nodes)]
    return node_list, {_fit_key(r, wanted): _fitting(node_list, r, wanted) for r, wanted in fits}


async def _pages(call, timeout: float | None) -> tuple[dict, dict]:
    """``_reading``'s ``bound`` and ``held`` of a pod list read ``PAGE`` items a request
    (``call(limit=, _continue=)``: the API's ``limit`` and ``continue``), each page within
    ``timeout`` seconds and parsed in a worker thread (``_take_page``) before the next is
    asked for: at 30,000 pods the whole list was 94 MB in the Hub at once. The pages are of
    one snapshot of the cluster (the API server's continue token); one that expired (410
    Gone: the API keeps a snapshot a few minutes) reads the list again from its start, once;
    a second is a failed read. A page that fails fails the read: nothing of it is kept."""
    loop = asyncio.get_running_loop()
    for again in (False, True):
        bound: dict = {}
        held: dict = {}
        token = None
        try:
            while True:
                page = {"limit": PAGE, **({"_continue": token} if token else {})}
                body = await _body(call(**page), timeout)
                sent = token
                token = await loop.run_in_executor(_reader(), _take_page, body, bound, held)
                del body  # one page's body held at a time
                if not token:
                    return bound, held
                if token == sent:  # a server going round: a failed read, not a hung one
                    raise ValueError("the API answered a page with its own continue token")
        except ApiFailed as error:
            if error.status != 410 or token is None or again:
                raise
    raise AssertionError("unreachable")


def _take_page(body: bytes, bound: dict, held: dict) -> str | None:
    """A page of a pod list into ``bound`` and ``held`` (``_keep``), in a worker thread (the
    event loop does not read them until the last page is in); its continue token, if more
    pages follow."""
    metadata: dict = {}
    for pod in _list_items(body, metadata):
        _keep(pod, bound, held)
    token = metadata.get("continue")
    return token if isinstance(token, str) and token else None


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_CHUNK = 1 << 20  # bytes of the body decoded to text at a time


class _Text:
    """A body's text, decoded a chunk at a time as the parse reaches it (decoding 100 MB at
    once held the interpreter, and so the event loop, 0.2 s on a loaded machine)."""

    def __init__(self, body: bytes):
        self.body, self.at = memoryview(body), 0
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text, self.pos = "", 0

    def more(self) -> bool:
        """More of the body's text after ``pos`` (at least as much again as is left, so a
        value longer than a chunk is decoded again a few times, not once a chunk); False at
        its end."""
        if self.at >= len(self.body):
            return False
        size = max(_CHUNK, 2 * (len(self.text) - self.pos))
        chunk = self.body[self.at : self.at + size]
        self.at += len(chunk)
        final = self.at >= len(self.body)
        self.text = self.text[self.pos :] + self.decoder.decode(chunk, final)
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not white space ('' at the end)."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text) or not self.more():
                return self.text[self.pos : self.pos + 1]

    def take(self, expected: str) -> None:
        if self.peek() != expected:
            raise ValueError(f"{expected!r} expected in the list's JSON")
        self.pos += 1
        if expected == "," and self.peek() in ("]", "}"):
            raise ValueError("a value expected after ',' in the list's JSON")

    def value(self) -> Any:
        """The JSON value at ``pos``, decoded (and ``pos`` past it)."""
        self.peek()
        while True:
            try:
                found, end = _DECODER.raw_decode(self.text, self.pos)
            except ValueError:
                if self.more():
                    continue  # cut by the chunk's end
                raise
            if end < len(self.text) or not self.more():  # (a number may go on)
                self.pos = end
                return found


def _list_items(body: bytes, metadata: dict | None = None) -> Iterator[dict]:
    """The ``items`` of a Kubernetes list's JSON, decoded one by one (the list's other keys
    decoded and dropped; its own ``metadata`` put in ``metadata``, once all is read). Anything
    but a JSON object with an ``items`` array is a ``ValueError``, as
    ``json.loads(body)["items"]`` was."""
    text, found = _Text(body), False
    text.take("{")
    while text.peek() != "}":
        key = text.value()
        text.take(":")
        if key == "items" and text.peek() == "[":
            found = True
            text.take("[")
            while text.peek() != "]":
                item = text.value()
                if isinstance(item, dict):
                    yield item
                if text.peek() != "]":
                    text.take(",")
            text.take("]")
        elif key == "metadata" and metadata is not None:
            value = text.value()
            metadata.update(value if isinstance(value, dict) else {})
        else:
            text.value()
        if text.peek() != "}":
            text.take(",")
    if not found:
        raise ValueError("the list has no items")


def _node(node: Mapping) -> dict:
    """What ``capacity``, ``cards`` and ``room`` read of a node: its name and labels, whether
    it is schedulable, its taints, what it can allocate and whether it is ready (its image
    list, a large part of a node's JSON, is not kept)."""
    metadata, spec, status = (
        node.get("metadata") or {},
        node.get("spec") or {},
        node.get("status") or {},
    )
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"][:1]
    return {
        "metadata": {"name": metadata.get("name"), "labels": metadata.get("labels") or {}},
        "spec": {"unschedulable": spec.get("unschedulable"), "taints": spec.get("taints") or []},
        "status": {
            "allocatable": status.get("allocatable") or {},
            "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
        },
    }
