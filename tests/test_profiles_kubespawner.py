"""GpuKubeSpawner against an HTTP Kubernetes API: real KubeSpawner pods, a real JupyterHub
database.

Users, groups and servers are rows of an in-memory JupyterHub database, wrapped in
``jupyterhub.user.User`` as the hub does; spawners are the real ``GpuKubeSpawner``, and
``start()`` is KubeSpawner's own: it creates the pod through the API of ``tests/fake_k8s_api.py``
(which validates it against the Kubernetes schemas, schedules it on its nodes and runs its
container, here ``sleep``) and waits until it runs. Manifests built without a spawn are checked
against the same schemas.

The catalogue: whole H100s (one or a pair), half an H200 (MIG 3g.71gb), a quarter of a
time-shared L4 and a capability class (any card with 80 GB). Teams: vision (2 H100 guaranteed,
may borrow 1 more, 2 GPU-equivalents per user), nlp (half H200s and L4 shares, any tier,
priority 10) and robotics (L4 shares only). The cluster: one node of 8 H100s, one of 8 H200s
cut into 3g.71gb slices (4 of them), one with 2 L4s time-shared 4 ways, and a CPU node.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
import time
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import z2jh_harness as z2jh
from fake_k8s_api import FakeKubernetes, _schema_errors, cpu_node, gpu_node
from jupyterhub import orm
from jupyterhub.app import JupyterHub
from jupyterhub.objects import Hub
from jupyterhub.user import User
from kubernetes_asyncio.client import ApiClient, V1Pod
from kubernetes_asyncio.client.rest import ApiException
from kubernetes_asyncio.config import kube_config
from kubespawner import KubeSpawner
from kubespawner import clients as kubespawner_clients
from sqlalchemy import delete as sql_delete
from sqlalchemy import event, select
from test_kubernetes_hub import ALICE_H100_LABELS
from traitlets import TraitError
from traitlets.config import Config, PyFileConfigLoader

import jupyter_gpu_gov
from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.grant import GRANT_STATE
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.queue import FRESH_FOR_S, Release
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.hubconfig import TEAM_QUOTAS_ENV, add_governor
from jupyter_gpu_gov.profiles import cluster as cluster_module
from jupyter_gpu_gov.profiles import left_pods
from jupyter_gpu_gov.profiles.cluster import ClusterGpus, api_json
from jupyter_gpu_gov.profiles.config import GpuProfiles
from jupyter_gpu_gov.profiles.hubconfig import TEMPLATES as QUEUE_TEMPLATES
from jupyter_gpu_gov.profiles.kubespawner import GpuKubeSpawner, GpuStartFailed, gpu_profile_list
from jupyter_gpu_gov.profiles.queue import FORECAST
from jupyter_gpu_gov.profiles.queue_pages import places
from jupyter_gpu_gov.profiles.spawner import GpuRefused, waiting_requests

EXAMPLE = Path(__file__).resolve().parent.parent / "hub_config" / "kubernetes"
PACKAGE = Path(jupyter_gpu_gov.__file__).resolve().parent
UNICODE_USER = "Ünïcode.User@example.org"
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# A label value: at most 63 characters, alphanumerics with '-', '_', '.' inside (Kubernetes docs).
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
OWNERSHIP = ("user", "team", "project", "tier", "borrowed", "max-age", "weight", "task-type")
H100_PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"]

TIERS = [
    {
        "name": "h100",
        "display_name": "H100 80 GB",
        "gpu": "H100-80GB",
        "interconnect": "nvlink",
        "max_age": "3d",
    },
    {"name": "h100x2", "display_name": "2 x H100", "gpu": "H100-80GB", "count": 2},
    {"name": "h200-3g", "display_name": "Half an H200", "gpu": "H200-141GB", "mig": "3g.71gb"},
    {"name": "l4-shared", "display_name": "Shared L4", "gpu": "L4-24GB", "replicas": 4},
    {"name": "big-memory", "display_name": "Any 80 GB card", "min_memory_gb": 80},
]
QUOTAS = {
    "vision": {
        "guaranteed": {"h100": 2, "h100x2": 2},  # cards: one pair
        "borrowing_limit": {"h100": 1},
        "tiers": ["h100", "h100x2", "h200-3g", "big-memory"],
        "user_cap": 2,
    },
    "nlp": {"guaranteed": {"h200-3g": 2, "l4-shared": 4}, "tiers": "*", "priority": 10},
    "robotics": {"guaranteed": {"l4-shared": 2}},
}
CAPACITY = {"h100": 8, "h100x2": 4, "h200-3g": 4, "l4-shared": 8}
USER_NODE = {"hub.jupyter.org/node-purpose": "user"}  # z2jh's label for user nodes
NODES = [
    cpu_node("cpu-0", labels=USER_NODE),
    gpu_node("h100-0", "NVIDIA-H100-80GB-HBM3", gpus=8, labels=USER_NODE),
    gpu_node(
        "h200-0", "NVIDIA-H200", gpus=8, memory_mib=143771, mig={"3g.71gb": 4}, labels=USER_NODE
    ),
    gpu_node(
        "l4-0",
        "NVIDIA-L4",
        gpus=0,
        memory_mib=23034,
        labels=USER_NODE,
        allocatable={"nvidia.com/gpu.shared": "8"},  # 2 cards, time-sliced 4 ways
    ),
]


def profiles_config(**changes) -> Config:
    config = Config()
    config.GpuProfiles.tiers = TIERS
    config.GpuProfiles.quotas = QUOTAS
    config.GpuProfiles.capacity = CAPACITY
    for key, value in changes.items():
        setattr(config.GpuProfiles, key, value)
    return config


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fresh_profiles():
    """GpuProfiles is a process-wide singleton: each test reads its own config."""
    GpuProfiles.clear_instance()
    yield
    GpuProfiles.clear_instance()


@pytest.fixture(autouse=True)
def cluster(tmp_path, monkeypatch, jp_asyncio_loop):
    """The test's Kubernetes API server with its nodes, and a kubeconfig for it. Afterwards,
    stop the reflectors and clients KubeSpawner opened on the test's loop."""
    with FakeKubernetes(NODES, workdir=tmp_path / "k8s") as k8s:
        kubeconfig = k8s.kubeconfig(tmp_path / "kubeconfig")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        # read when kubernetes_asyncio is imported; KubeSpawner loads it once per API host
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.delenv("JUPYTERHUB_SERVICE_NAME", raising=False)
        ClusterGpus.clear_instance()
        yield k8s
        # A task cancelled here may start another as it ends (KubeSpawner's shared client
        # opens its closing task when first asked for): cancel until none is left, and forget
        # the clients, which are cached per loop and not per API host, and the loaded configs:
        # ``load_config`` is cached per host and sets the API host only when first called for
        # it, so a later test whose server got a port an earlier one had would keep talking to
        # the test just before it (a CI run: "Connect call failed", every start refused).
        for _ in range(10):
            pending = [t for t in asyncio.all_tasks(jp_asyncio_loop) if not t.done()]
            if not pending:
                break
            for task in pending:
                task.cancel()
            jp_asyncio_loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        kubespawner_clients._client_cache.clear()
        kubespawner_clients.load_config.cache_clear()
        KubeSpawner.reflectors.clear()
        ClusterGpus.clear_instance()


class FakeHub:
    """An in-memory JupyterHub database with users in groups, wrapped as the hub wraps them."""

    def __init__(self, config: Config, k8s: FakeKubernetes):
        config.KubeSpawner.k8s_api_host = k8s.url  # KubeSpawner loads its config per host
        config.KubeSpawner.cmd = ["sleep", "600"]  # the container: nothing to talk to here
        config.KubeSpawner.http_timeout = 5
        # Deadlines for the fake API's answers and the pod's start, not waits: on a loaded
        # machine a create answered after KubeSpawner's 3 s was sent again (409: the pod
        # exists), deleted and made anew, and the pod did not start in 20 s.
        config.KubeSpawner.k8s_api_request_timeout = 30
        config.KubeSpawner.start_timeout = 120
        self.config = config
        self.db = orm.new_session_factory("sqlite://")()
        self.settings = {
            "spawner_class": GpuKubeSpawner,
            "config": config,
            "hub": Hub(base_url="/hub/"),
            "allow_named_servers": True,
        }
        self.users: dict[str, User] = {}

    def group(self, name: str, team: bool = True) -> orm.Group:
        group = orm.Group.find(self.db, name)
        if group is None:
            group = orm.Group(name=name, properties={"gpu-gov/team": True} if team else {})
            self.db.add(group)
            self.db.commit()
        return group

    def user(self, name: str, *groups: str) -> User:
        row = orm.User(name=name)
        self.db.add(row)
        for group in groups:
            row.groups.append(self.group(group))
        self.db.commit()
        self.users[name] = User(row, self.settings)
        return self.users[name]

    def spawner(self, user: str | User, server: str = "") -> GpuKubeSpawner:
        """The user's spawner, as JupyterHub creates it (call inside the event loop)."""
        user = self.users[user] if isinstance(user, str) else user
        if hasattr(user, "get_or_create_spawner"):  # JupyterHub >= 5
            return user.get_or_create_spawner(server, server)
        return user.spawners[server]  # JupyterHub 4 makes it on first access

    def started(self, spawner: GpuKubeSpawner, options: dict) -> GpuKubeSpawner:
        """What User.spawn does before it calls Spawner.start."""
        spawner.orm_spawner.user_options = options
        spawner.user_options = options
        spawner.orm_spawner.started = datetime.now(timezone.utc).replace(tzinfo=None)
        self.db.commit()
        return spawner


@pytest.fixture
def make_hub(cluster):
    hubs = []

    def make(config: Config | None = None) -> FakeHub:
        hubs.append(FakeHub(config or profiles_config(), cluster))
        return hubs[-1]

    yield make
    for hub in hubs:
        hub.db.close()


@pytest.fixture
def hub(make_hub):
    return make_hub()


class Pods:
    """The pods the API server holds, by the server's log name ("alice", "alice:pair")."""

    def __init__(self, k8s: FakeKubernetes, client: ApiClient):
        self.k8s, self.client = k8s, client

    def _all(self) -> dict[str, V1Pod]:
        pods = {}
        for body in self.k8s.list("pods"):
            notes = body["metadata"].get("annotations") or {}
            user, server = (
                notes["hub.jupyter.org/username"],
                notes.get("hub.jupyter.org/servername"),
            )
            key = f"{user}:{server}" if server else user
            pods[key] = self.client.deserialize(SimpleNamespace(data=json.dumps(body)), "V1Pod")
        return pods

    def __getitem__(self, name: str) -> V1Pod:
        return self._all()[name]

    def __contains__(self, name: str) -> bool:
        return name in self._all()

    def __len__(self) -> int:
        return len(self._all())


@pytest.fixture
def pod_api(cluster, jp_asyncio_loop):
    async def client():
        return ApiClient()

    api = jp_asyncio_loop.run_until_complete(client())
    yield Pods(cluster, api)
    jp_asyncio_loop.run_until_complete(api.close())


# -- helpers -----------------------------------------------------------------------------------


async def admitted_pod(spawner: GpuKubeSpawner, options: dict) -> V1Pod:
    """Admit ``options`` as start() does, then build the pod KubeSpawner would create."""
    spawner.user_options = dict(options)
    teams = await spawner.gpu_teams()
    await spawner.gpu_refresh()
    spawner._gpu_admit(teams)
    await spawner.load_user_options()
    return await spawner.get_pod_manifest()


def container(pod: V1Pod):
    return pod.spec.containers[0]


def required_terms(pod: V1Pod) -> list[list[dict]]:
    """The pod's required node affinity, as lists of match expressions (ORed terms)."""
    affinity = pod.spec.affinity
    if affinity is None or affinity.node_affinity is None:
        return []
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    return [
        [
            {"key": e["key"], "operator": e["operator"], "values": e["values"]}
            for e in api_json(term)["matchExpressions"]
        ]
        for term in required.node_selector_terms
    ]


def tolerations(pod: V1Pod) -> list[dict]:
    return api_json(pod.spec.tolerations or [])


def ownership(pod: V1Pod) -> tuple[dict, dict]:
    labels = {k: v for k, v in pod.metadata.labels.items() if k.startswith("gpu-gov/")}
    annotations = {k: v for k, v in pod.metadata.annotations.items() if k.startswith("gpu-gov/")}
    return labels, annotations


async def round_trip(pod: V1Pod) -> V1Pod:
    """Serialize the pod as KubeSpawner sends it, check it against the Kubernetes schemas as the
    API server would, read it back as the client reads the API's answers (with client-side
    validation), and check nothing was lost."""
    async with ApiClient() as api:
        body = api.sanitize_for_serialization(pod)
        assert _schema_errors({"apiVersion": "v1", "kind": "Pod", **body}) == []
        back = api.deserialize(SimpleNamespace(data=json.dumps(body)), "V1Pod")
        # KubeSpawner sends CPU and memory as JSON numbers; the client reads quantities as strings.
        expected = json.loads(json.dumps(body))
        for each in expected["spec"]["containers"]:
            for amounts in (each.get("resources") or {}).values():
                amounts.update({name: str(value) for name, value in (amounts or {}).items()})
        assert api.sanitize_for_serialization(back) == expected
    assert isinstance(back, V1Pod)
    assert back.local_vars_configuration.client_side_validation
    return back


# -- pod manifests -----------------------------------------------------------------------------


async def test_whole_card_pods_ask_for_h100s_on_h100_nodes(hub):
    hub.user("alice", "vision")
    alice = hub.spawner("alice")

    pod = await admitted_pod(alice, {"profile": "h100", "project": "detection"})
    assert container(pod).resources.limits == {"nvidia.com/gpu": "1"}
    assert required_terms(pod) == [
        [{"key": "nvidia.com/gpu.product", "operator": "In", "values": H100_PRODUCTS}]
    ]
    assert GPU_TAINT in tolerations(pod)
    labels, annotations = ownership(pod)
    assert labels == ALICE_H100_LABELS
    assert annotations == labels
    await round_trip(pod)

    pair = await admitted_pod(hub.spawner("alice", "pair"), {"profile": "h100x2"})
    assert container(pair).resources.limits == {"nvidia.com/gpu": "2"}
    assert ownership(pair)[0]["gpu-gov/tier"] == "h100x2"
    assert ownership(pair)[0]["gpu-gov/borrowed"] == "false"  # the team's guaranteed pair
    assert "gpu-gov/max-age" not in ownership(pair)[0]  # the tier has no hard cap
    await round_trip(pair)


async def test_mig_pod_asks_for_the_slice_on_mixed_strategy_h200_nodes(hub):
    hub.user("nadia", "nlp")
    pod = await admitted_pod(hub.spawner("nadia"), {"profile": "h200-3g"})

    limits = container(pod).resources.limits
    assert limits == {"nvidia.com/mig-3g.71gb": "1"}  # a slice, never a whole card
    assert pod.spec.node_selector == {"nvidia.com/mig.strategy": "mixed"}
    assert required_terms(pod) == [
        [
            {
                "key": "nvidia.com/gpu.product",
                "operator": "In",
                "values": ["NVIDIA-H200", "NVIDIA-H200-NVL"],
            }
        ]
    ]
    assert GPU_TAINT in tolerations(pod)
    assert ownership(pod)[0]["gpu-gov/tier"] == "h200-3g"
    back = await round_trip(pod)
    assert back.spec.containers[0].resources.limits == limits


async def test_time_shared_pod_asks_for_a_share_of_an_l4(hub):
    hub.user("rob", "robotics")
    pod = await admitted_pod(hub.spawner("rob"), {"profile": "l4-shared"})

    assert container(pod).resources.limits == {"nvidia.com/gpu.shared": "1"}
    assert pod.spec.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert required_terms(pod) == []
    assert ownership(pod)[0]["gpu-gov/team"] == "robotics"
    await round_trip(pod)


@pytest.mark.parametrize("project", ["vision\n", "vision\r\n", ["vision"]])
async def test_a_project_with_a_newline_or_not_text_is_refused_naming_it(hub, project):
    """The REST API takes any JSON for ``project``: ``"vision\\n"`` passed the label-value
    check (``$`` matches before a final newline) and went on the pod as its ``gpu-gov/project``
    label (which Kubernetes refuses: the spawn failed with its 422) and in the grant the
    usage ledger bills, a project apart from ``vision``."""
    hub.user("alice", "vision")
    spawner = hub.spawner("alice")
    with pytest.raises(GpuRefused) as refused:
        await admitted_pod(spawner, {"profile": "h100", "project": project})
    assert "cannot be used" in refused.value.jupyterhub_message
    assert "gpu-gov/tier" not in spawner.user_options


async def test_capability_class_pod_selects_nodes_by_gpu_memory(hub):
    hub.user("alice", "vision")
    pod = await admitted_pod(hub.spawner("alice"), {"profile": "big-memory"})

    assert container(pod).resources.limits == {"nvidia.com/gpu": "1"}
    # GPU feature discovery reports MiB; an "80 GB" card shows a little less than 80 GiB.
    (term,) = required_terms(pod)
    (expression,) = term
    assert expression["key"] == "nvidia.com/gpu.memory"
    assert expression["operator"] == "Gt"
    floor = int(expression["values"][0]) + 1
    assert 76_000 < floor <= 81_559  # an H100 reports 81559 MiB
    assert not pod.spec.node_selector
    await round_trip(pod)


async def test_labels_are_valid_label_values_and_annotations_keep_what_the_user_typed(hub):
    hub.user(UNICODE_USER, "vision")
    # A project must be a label value already (the form and the REST API both check it), so the
    # label and what the governor reads from user_options agree for showback.
    spawner = hub.spawner(UNICODE_USER)
    typed = "Straßen-Szenen / 2025 (night runs)"
    with pytest.raises(GpuRefused) as refused:
        await admitted_pod(spawner, {"profile": "h100", "project": typed})
    assert "cannot be used" in refused.value.jupyterhub_message
    assert "gpu-gov/tier" not in spawner.user_options
    project = "Strassen-Szenen_2025.night-runs"
    pod = await admitted_pod(spawner, {"profile": "h100", "project": project})

    labels, annotations = ownership(pod)
    assert sorted(labels) == sorted(f"gpu-gov/{key}" for key in OWNERSHIP)
    for key, value in labels.items():
        assert len(value) <= 63 and LABEL_VALUE.match(value), (key, value)
    assert annotations["gpu-gov/user"] == UNICODE_USER
    assert annotations["gpu-gov/project"] == project
    # Distinct names stay distinct once made label-safe, and match KubeSpawner's username label.
    assert labels["gpu-gov/user"] == pod.metadata.labels["hub.jupyter.org/username"]
    assert labels["gpu-gov/user"] != "unicode-user-example-org"
    back = await round_trip(pod)
    assert back.metadata.annotations["gpu-gov/user"] == UNICODE_USER


async def test_kubernetes_models_reject_an_invalid_pod():
    """The round trip has teeth: client-side validation refuses a container without a name."""
    body = {"metadata": {"name": "p"}, "spec": {"containers": [{"image": "x"}]}}
    async with ApiClient() as api:
        with pytest.raises(ValueError, match="name"):
            api.deserialize(SimpleNamespace(data=json.dumps(body)), "V1Pod")


async def test_a_restarted_server_asks_only_for_its_new_tier(hub):
    """JupyterHub keeps a server's Spawner across stop and start: a server that ran on an H200
    slice and restarts on an H100, then without a GPU, must not keep asking for the old ones."""
    hub.user("carol", "vision", "nlp")
    carol = hub.spawner("carol")

    mig = await admitted_pod(carol, {"profile": "h200-3g", "team": "nlp"})
    assert container(mig).resources.limits == {"nvidia.com/mig-3g.71gb": "1"}

    card = await admitted_pod(carol, {"profile": "h100", "team": "vision"})
    assert container(card).resources.limits == {"nvidia.com/gpu": "1"}
    assert not card.spec.node_selector  # no mig.strategy: mixed left over
    assert required_terms(card) == [
        [{"key": "nvidia.com/gpu.product", "operator": "In", "values": H100_PRODUCTS}]
    ]

    cpu = await admitted_pod(carol, {"profile": "no-gpu"})
    assert not container(cpu).resources.limits
    assert not cpu.spec.node_selector and required_terms(cpu) == []
    assert GPU_TAINT not in tolerations(cpu)
    assert ownership(cpu) == ({}, {})


async def test_what_a_hook_sets_per_spawn_stays_and_the_last_tiers_part_goes(hub):
    """A ``pre_spawn_hook`` that picks the tolerations (or node selector) at each spawn: the
    restart put back the values of the server's first spawn, so from the second spawn on the
    hook's choice was replaced by its first one. What the hook assigns or adds in place is the
    pod's; what the previous tier added is not."""
    hub.user("carol", "vision", "nlp")
    carol = hub.spawner("carol")

    def keys(pod: V1Pod) -> set[str]:
        return {t["key"] for t in tolerations(pod)}

    carol.tolerations = [{"key": "pool-a", "operator": "Exists"}]  # the hook, first spawn
    mig = await admitted_pod(carol, {"profile": "h200-3g", "team": "nlp"})
    assert keys(mig) == {"pool-a", "nvidia.com/gpu"}
    assert mig.spec.node_selector == {"nvidia.com/mig.strategy": "mixed"}

    carol.tolerations = [{"key": "pool-b", "operator": "Exists"}]  # the hook assigns anew
    card = await admitted_pod(carol, {"profile": "h100", "team": "vision"})
    assert keys(card) == {"pool-b", "nvidia.com/gpu"}
    assert not card.spec.node_selector  # the slice's mig.strategy is gone

    carol.tolerations.append({"key": "pool-c", "operator": "Exists"})  # the hook adds in place
    cpu = await admitted_pod(carol, {"profile": "no-gpu"})
    assert keys(cpu) == {"pool-b", "pool-c"}  # no GPU toleration left over
    assert not container(cpu).resources.limits and not cpu.spec.node_selector


def env_of(pod: V1Pod) -> dict[str, str]:
    return {e.name: e.value for e in container(pod).env or []}


async def test_a_server_without_a_gpu_is_shown_no_card_by_the_nvidia_runtime(make_hub):
    """A pod that asks for no GPU gets no device from the device plugin, but where the NVIDIA
    runtime is the node's default (the GPU operator's setting) a CUDA image's
    ``NVIDIA_VISIBLE_DEVICES=all`` (or an admin's ``singleuser.extraEnv``) showed it every card
    of the node: a "No GPU" server used GPUs no quota counted and another server held. Its pod
    says ``void`` (the runtime then does what runc does); a GPU pod keeps the admin's value
    (the device plugin's replaces it), and what a hook sets per spawn in the spawner's
    environment (an auth_state_hook's token) is the pod's, spawn after spawn."""
    config = profiles_config()
    config.KubeSpawner.environment = {"NVIDIA_VISIBLE_DEVICES": "all", "SITE": "x"}
    hub = make_hub(config)
    hub.user("carol", "vision", "nlp")
    carol = hub.spawner("carol")
    spawns = [({"profile": "no-gpu"}, "void"), ({"profile": "h100"}, "all"), ({}, "void")]

    for token, (options, visible) in enumerate(spawns):  # the form's choice; the API's default
        carol.environment["TOKEN"] = str(token)  # as an auth_state_hook sets it, before start
        pod = await admitted_pod(carol, {**options, "team": "vision"})
        assert env_of(pod)["NVIDIA_VISIBLE_DEVICES"] == visible, options
        assert env_of(pod)["SITE"] == "x" and env_of(pod)["TOKEN"] == str(token)
        assert bool(container(pod).resources.limits) == (visible == "all")
        await round_trip(pod)


async def test_a_no_gpu_server_gets_no_gpu_the_spawners_own_config_asks_for(make_hub):
    """An admin's KubeSpawner-wide extended resources (z2jh's singleuser.extraResource.limits:
    nvidia.com/gpu) were kept by the "No GPU" choice, whose override is empty: a server the
    Hub's records give no GPU (an empty grant, governed as a CPU server) held a card no quota
    counted. Its pod asks for no GPU resource; other extended resources stay. (And a tier's
    override, merged into them by KubeSpawner, gave a MIG slice's server a whole card too.)"""
    config = profiles_config()
    config.KubeSpawner.extra_resource_limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/mig-1g.18gb": "1",
        "example.com/fpga": "1",
    }
    hub = make_hub(config)
    hub.user("carol", "vision", "nlp")
    carol = hub.spawner("carol")
    for options in ({"profile": "no-gpu"}, {}):  # the form's choice; the API's default
        pod = await admitted_pod(carol, {**options, "team": "vision"})
        assert container(pod).resources.limits == {"example.com/fpga": "1"}, options
        await round_trip(pod)
    # A tier's server asks for its own devices only: a slice, not also the configured card.
    pod = await admitted_pod(carol, {"profile": "h200-3g", "team": "nlp"})
    assert container(pod).resources.limits == {
        "nvidia.com/mig-3g.71gb": "1",
        "example.com/fpga": "1",
    }
    await round_trip(pod)


@pytest.mark.parametrize("keyed", [False, True], ids=["lists", "keyed-dicts"])
async def test_tier_scheduling_adds_to_the_configured_tolerations_and_affinity(make_hub, keyed):
    """What the admin (or the z2jh chart) configured stays: its dedicated-node toleration and
    node-purpose affinity, with the tier's expressions joined into every required term."""
    dedicated = {
        "key": "hub.jupyter.org/dedicated",
        "operator": "Equal",
        "value": "user",
        "effect": "NoSchedule",
    }
    purpose = {"matchExpressions": [{"key": "hub.jupyter.org/node-purpose", "operator": "In", "values": ["user"]}]}  # fmt: skip
    config = profiles_config()
    config.KubeSpawner.tolerations = {"00-dedicated": dedicated} if keyed else [dedicated]
    config.KubeSpawner.node_affinity_required = {"00-purpose": purpose} if keyed else [purpose]
    hub = make_hub(config)
    hub.user("alice", "vision")
    alice = hub.spawner("alice")

    for _ in range(2):  # and again on the same spawner: nothing doubles up
        pod = await admitted_pod(alice, {"profile": "h100"})
        assert tolerations(pod) == [dedicated, GPU_TAINT]
        assert required_terms(pod) == [
            [
                purpose["matchExpressions"][0],
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": H100_PRODUCTS},
            ]
        ]
        await round_trip(pod)

    cpu = await admitted_pod(alice, {})
    assert tolerations(cpu) == [dedicated]
    assert required_terms(cpu) == [purpose["matchExpressions"]]


# -- the profile list --------------------------------------------------------------------------


def by_slug(profiles: list[dict]) -> dict[str, dict]:
    return {p["slug"]: p for p in profiles}


async def test_profile_list_offers_the_teams_tiers_with_what_is_left(hub, pod_api):
    hub.user("alice", "vision")
    hub.user("rob", "robotics")
    hub.user("carol", "vision", "nlp")
    for name in ("v1", "v2"):
        hub.user(name, "vision")

    profiles = by_slug(await gpu_profile_list(hub.spawner("alice")))
    assert list(profiles) == ["h100", "h100x2", "h200-3g", "big-memory", "no-gpu"]
    assert profiles["no-gpu"]["default"] is True
    assert not any(p.get("default") for s, p in profiles.items() if s != "no-gpu")
    assert "vision: 2 of 2 guaranteed left" in profiles["h100"]["description"]
    assert "vision: would borrow" in profiles["h200-3g"]["description"]  # no vision guarantee
    assert profiles["h100"]["description"].startswith("1 x H100-80GB, nvlink · 80 GB")
    # Each tier carries its scheduling as the override KubeSpawner applies.
    limits = profiles["h100"]["kubespawner_override"]["extra_resource_limits"]
    assert limits(hub.spawner("alice")) == {"nvidia.com/gpu": "1"}

    # Two vision servers hold the guarantee: the next H100 would be borrowed...
    for name in ("v1", "v2"):
        await hub.started(hub.spawner(name), {"profile": "h100"}).start()
    h100 = by_slug(await gpu_profile_list(hub.spawner("alice")))["h100"]
    assert "vision: would borrow" in h100["description"]
    # ... and once the borrowing limit is used too, not now.
    await hub.started(hub.spawner("carol"), {"profile": "h100", "team": "vision"}).start()
    h100 = by_slug(await gpu_profile_list(hub.spawner("alice")))["h100"]
    assert "vision: not now" in h100["description"]

    # Robotics is offered its shared L4s only; carol sees both her teams' lines.
    assert list(by_slug(await gpu_profile_list(hub.spawner("rob")))) == ["l4-shared", "no-gpu"]
    carols = by_slug(await gpu_profile_list(hub.spawner("carol", "second")))
    assert set(carols) == {"h100", "h100x2", "h200-3g", "l4-shared", "big-memory", "no-gpu"}
    assert "vision: " in carols["h200-3g"]["description"]
    assert "nlp: 2 of 2 guaranteed left" in carols["h200-3g"]["description"]


async def test_profile_list_without_a_cpu_only_choice(make_hub):
    hub = make_hub(profiles_config(allow_no_gpu=False))
    hub.user("rob", "robotics")
    profiles = await gpu_profile_list(hub.spawner("rob"))
    assert [p["slug"] for p in profiles] == ["l4-shared"]
    # KubeSpawner makes the first profile the default; admission still wants an explicit tier.
    with pytest.raises(GpuRefused, match="Choose a GPU tier"):
        await hub.started(hub.spawner("rob"), {}).start()


# -- capacity from the cluster ----------------------------------------------------------------


def batch_pod(name: str, resource: str, amount: int, node_selector: dict) -> dict:
    """A GPU pod of the namespace that the hub did not start (a training job)."""
    limits = {resource: str(amount)}
    return {
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {
            "containers": [
                {"name": "train", "image": "t", "command": ["sleep", "600"],
                 "resources": {"limits": limits}}
            ],
            "nodeSelector": node_selector,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }  # fmt: skip


async def read_again(spawner) -> None:
    ClusterGpus.instance().read_at = float("-inf")
    await spawner.gpu_cluster.refresh(spawner.api, spawner.namespace, spawner.log)


async def test_capacity_is_what_the_nodes_hold_less_gpu_pods_the_hub_did_not_start(
    make_hub, cluster
):
    hub = make_hub(profiles_config(capacity={"h200-3g": 2}))  # this hub may use 2 of 4 slices
    hub.user("alice", "vision")
    alice = hub.spawner("alice")
    await read_again(alice)
    assert alice.gpu_capacity([]) == {
        "h100": 8,
        "h100x2": 8,
        "h200-3g": 2,  # the configured cap
        "l4-shared": 8,
        "big-memory": 8,  # 80 GB or more: the H100s (the H200 node offers slices only)
    }

    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cluster.create("pods", batch_pod("train-a", "nvidia.com/gpu", 3, h100))
    cluster.create("pods", batch_pod("train-b", "nvidia.com/gpu.shared", 3, {}))
    wait_for(lambda: cluster.get("pods", "train-a")["status"]["phase"] == "Running")
    await read_again(alice)
    capacity = alice.gpu_capacity([])
    assert (capacity["h100"], capacity["h100x2"]) == (5, 4)  # pairs: whole pairs only
    assert capacity["l4-shared"] == 5

    # The hub's own pods are not subtracted: admission counts them as its servers.
    await hub.started(alice, {"profile": "h100", "project": "p"}).start()
    await read_again(alice)
    assert alice.gpu_capacity([])["h100"] == 5
    refused = await gpu_profile_list(hub.spawner(hub.user("vic", "vision")))
    assert "vision: 1 of 2 guaranteed left" in by_slug(refused)["h100"]["description"]


async def test_a_card_the_hubs_server_holds_on_another_tier_is_not_free(make_hub, cluster):
    """Tiers that share cards (one H100, a pair, any 80 GB card) are counted per tier by
    admission: the cards of the hub's pair are not free for a single H100, or 8 single H100s
    were admitted beside it on 8 cards and 2 stayed Pending. Nor are the cards of a server
    whose tier an admin removed (its grant counts on no tier)."""
    hub = make_hub(profiles_config(capacity={}))
    hub.user("alice", "vision")
    alice = hub.spawner("alice", "pair")
    await hub.started(alice, {"profile": "h100x2"}).start()
    wait_for(lambda: (cluster.get("pods", alice.pod_name) or {}).get("spec", {}).get("nodeName"))
    await read_again(alice)
    capacity = alice.gpu_capacity([])
    assert (capacity["h100"], capacity["big-memory"]) == (6, 6)
    assert capacity["h100x2"] == 8  # its own tier's servers: admission counts them
    # The form says the 6 free of the cluster's 8 H100s: "6 of 6 free" read as if it had 6.
    form = await hub.spawner(hub.user("vic", "vision")).get_options_form()
    assert "vision: 2 of 2 guaranteed left · 6 of 8 free" in html.unescape(form), form

    # The hub restarts without the pair tier; alice's pair runs on.
    GpuProfiles.clear_instance()
    tiers = [t for t in TIERS if t["name"] != "h100x2"]
    vision = {**QUOTAS["vision"], "guaranteed": {"h100": 2}}
    vision["tiers"] = [t for t in vision["tiers"] if t != "h100x2"]
    later = make_hub(profiles_config(tiers=tiers, quotas={**QUOTAS, "vision": vision}, capacity={}))
    bob = later.spawner(later.user("bob", "vision"))
    await read_again(bob)
    assert bob.gpu_capacity(bob.gpu_usage())["h100"] == 6


async def test_a_pod_that_copies_the_hubs_labels_is_not_taken_for_its_server(make_hub, cluster):
    """Where users may create pods in the hub's namespace (a Dask or Spark cluster started from
    a notebook), a pod can carry the labels of the hub's servers and a tier's. Its cards were
    left out of the tier's count as if admission counted it, so with all 8 H100s held the hub
    admitted 8 more servers that stayed Pending. The hub's servers are known by their pods'
    names, recorded in the hub's database; labels are anyone's."""
    hub = make_hub(profiles_config(capacity={}))
    alice = hub.spawner(hub.user("alice", "vision"), "pair")
    await hub.started(alice, {"profile": "h100x2"}).start()
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    forged = batch_pod("dask-worker", "nvidia.com/gpu", 6, h100)
    labels = cluster.get("pods", alice.pod_name)["metadata"]["labels"]
    forged["metadata"]["labels"] = {**labels, "gpu-gov/tier": "h100"}
    cluster.create("pods", forged)
    wait_for(lambda: cluster.get("pods", "dask-worker")["status"]["phase"] == "Running")

    bob = hub.spawner(hub.user("bob", "vision"))
    await read_again(bob)
    capacity = bob.gpu_capacity(bob.gpu_usage())
    assert capacity["h100"] == 0  # 8 cards: alice's pair and the worker's 6
    assert capacity["h100x2"] == 2  # the pair's own tier: admission counts alice's
    # The refusal names the pair's cards; the worker's 6 are in use by no tier of the hub's.
    with pytest.raises(GpuRefused, match=r"All H100 80 GB cards are in use \(2 by 2 x H100 serv"):
        await hub.started(bob, {"profile": "h100"}).start()


async def test_gpu_pods_of_other_namespaces_hold_their_cards(make_hub, cluster):
    """On a shared cluster another team's training job runs in its own namespace. The hub
    read only its own namespace's pods, so the job's 6 H100s counted free: 8 servers were
    admitted on 2 free cards and 6 stayed Pending. A pod named as the hub's server but in
    another namespace is not the server either."""
    hub = make_hub(profiles_config(capacity={}))
    alice = hub.spawner(hub.user("alice", "vision"))
    await hub.started(alice, {"profile": "h100"}).start()
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cluster.create("pods", batch_pod("train", "nvidia.com/gpu", 5, h100), namespace="ml-team")
    cluster.create("pods", batch_pod(alice.pod_name, "nvidia.com/gpu", 1, h100), namespace="x")
    for namespace, name in (("ml-team", "train"), ("x", alice.pod_name)):
        wait_for(
            lambda n=name, ns=namespace: cluster.get("pods", n, ns)["status"]["phase"] == "Running"
        )

    bob = hub.spawner(hub.user("bob", "vision"))
    await read_again(bob)
    assert bob.gpu_capacity(bob.gpu_usage())["h100"] == 2  # 8, less the 6 the others hold
    assert ClusterGpus.instance().namespace_only is None


async def test_without_rbac_for_every_namespaces_pods_the_hubs_are_read_and_it_says_so(
    make_hub, cluster
):
    cluster.forbidden_cluster_wide.add("pods")
    hub = make_hub(profiles_config(capacity={}))
    bob = hub.spawner(hub.user("bob", "vision"))
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    bob.log.addHandler(handler)
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cluster.create("pods", batch_pod("mine", "nvidia.com/gpu", 3, h100))
    cluster.create("pods", batch_pod("theirs", "nvidia.com/gpu", 4, h100), namespace="ml-team")
    for namespace, name in (("default", "mine"), ("ml-team", "theirs")):
        wait_for(
            lambda n=name, ns=namespace: cluster.get("pods", n, ns)["status"]["phase"] == "Running"
        )
    for _ in range(2):
        await read_again(bob)
    assert bob.gpu_capacity(bob.gpu_usage())["h100"] == 5  # its own namespace's job only
    bob.log.removeHandler(handler)
    said = [line for line in lines if "every namespace" in line]
    assert len(said) == 1 and 'cannot list resource "pods"' in said[0], lines
    assert "rbac-nodes.yaml" in said[0]


async def test_a_server_on_a_removed_tier_still_counts_against_its_owners_cap(make_hub, pod_api):
    """An admin removes a tier while alice holds a server on it: it runs on, and still counts
    against her per-user cap (its grant's weight), or she could start a second one beyond it."""
    hub = make_hub(profiles_config(capacity={}))
    hub.user("alice", "vision")
    await hub.started(hub.spawner("alice", "pair"), {"profile": "h100x2"}).start()

    GpuProfiles.clear_instance()  # the hub restarts without the pair tier
    hub.config.GpuProfiles.tiers = [t for t in TIERS if t["name"] != "h100x2"]
    vision = {**QUOTAS["vision"], "guaranteed": {"h100": 2}}
    vision["tiers"] = [t for t in vision["tiers"] if t != "h100x2"]
    hub.config.GpuProfiles.quotas = {**QUOTAS, "vision": vision}
    more = hub.started(hub.spawner("alice", "more"), {"profile": "h100"})
    with pytest.raises(GpuRefused) as refused:
        await more.start()
    message = refused.value.jupyterhub_message
    assert "you hold 2 (server 'pair' on h100x2)" in message, message
    assert more._log_name not in pod_api


async def test_servers_on_a_renamed_tier_count_against_the_guarantee_on_its_new_name(
    make_hub, cluster, pod_api
):
    """An admin renames the tier ``h100`` to ``h100-sxm`` (the quotas with it) while vision's
    two servers run on it. Those servers hold vision's guarantee of 2 and its cards: the
    tier's ``formerly`` says so, or vision would get its guarantee, and its borrowing, again
    on the new name (5 cards held against 3 allowed). Without it, the hub says which tier its
    servers hold that is no longer configured."""
    hub = make_hub(profiles_config(capacity={}))
    for name in ("v1", "v2"):
        await hub.started(hub.spawner(hub.user(name, "vision")), {"profile": "h100"}).start()

    def renamed(**more) -> Config:
        tiers = [{**t, "name": "h100-sxm", **more} if t["name"] == "h100" else t for t in TIERS]
        vision = {**QUOTAS["vision"], "guaranteed": {"h100-sxm": 2, "h100x2": 2}}
        vision["borrowing_limit"] = {"h100-sxm": 1}
        vision["tiers"] = ["h100-sxm", "h100x2", "h200-3g", "big-memory"]
        return profiles_config(tiers=tiers, quotas={**QUOTAS, "vision": vision}, capacity={})

    GpuProfiles.clear_instance()  # the hub restarts with the tier renamed, and forgets nothing
    hub.config.merge(renamed())
    look = hub.spawner(hub.user("look", "vision"))
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    look.log.addHandler(handler)  # the hub's log (a spawn before has set up its handlers)
    try:
        look.gpu_usage()
        look.gpu_usage()  # said once
    finally:
        look.log.removeHandler(handler)
    said = [r.getMessage() for r in records if "no longer configured" in r.getMessage()]
    assert len(said) == 1 and "2 running server(s) hold tier 'h100'" in said[0], said
    assert "'formerly'" in said[0]

    GpuProfiles.clear_instance()
    hub.config.merge(renamed(formerly=["h100"]))
    carol = hub.started(hub.spawner(hub.user("carol", "vision")), {"profile": "h100-sxm"})
    await carol.start()
    assert carol.gpu_grant["gpu-gov/borrowed"] == "true"  # the guarantee is v1's and v2's
    dave = hub.started(hub.spawner(hub.user("dave", "vision")), {"profile": "h100-sxm"})
    with pytest.raises(GpuRefused, match="may borrow at most 1 "):
        await dave.start()
    assert dave._log_name not in pod_api
    # Their pods (labelled h100) are this tier's servers, counted by admission: not subtracted.
    await read_again(carol)
    assert carol.gpu_capacity([])["h100-sxm"] == 8

    # A quota naming the old name is a start-up error naming it.
    GpuProfiles.clear_instance()
    config = renamed(formerly=["h100"])
    config.GpuProfiles.quotas = {
        **config.GpuProfiles.quotas,
        "robotics": {"guaranteed": {"h100": 1}},
    }
    with pytest.raises(TraitError, match="'guaranteed' names tier 'h100', which is not defined"):
        GpuProfiles(config=config).check()


async def test_without_rbac_for_nodes_the_configured_capacity_stands(make_hub, cluster):
    cluster.forbidden.add("nodes")
    hub = make_hub()
    hub.user("alice", "vision")
    alice = hub.spawner("alice")
    await read_again(alice)
    assert alice.gpu_capacity([]) == CAPACITY
    error = ClusterGpus.instance().error  # what the hub's log says, once
    assert "403" in error and 'cannot list resource "nodes"' in error


async def test_a_waiting_servers_place_never_reads_a_stale_cluster_reading_as_the_cards_now(
    make_hub, cluster, monkeypatch
):
    """The Hub's pages show a waiting server's place from the last reading of the cluster,
    without reading it again (``queue_pages.places``). A workstation's reading older than
    ``FRESH_FOR_S`` was unknown there; the cluster's was used however old (the hub's reading
    is refreshed only by the steps that count): ben's page said "starting now" from nodes and
    pods read an hour before. Both readings now follow one rule, and a step that counts reads
    again first, whatever ``refresh_every`` says."""
    monkeypatch.setattr(FORECAST, "at", clock.utcnow())  # the governor was heard: a line
    hub = make_hub(profiles_config(capacity={**CAPACITY, "h100": 1}, queue=True))
    hub.user("alice", "vision")
    ben_user = hub.user("ben", "vision")
    alice, ben = hub.spawner("alice"), hub.spawner("ben")
    assert ben.gpu_unknown().startswith("GPU state unknown: the cluster's nodes and pods have")
    await hub.started(alice, {"profile": "h100", "project": "p"}).start()
    admission = await ben.gpu_enqueue({"profile": "h100", "project": "p"})
    assert not admission.allowed and waiting_requests(hub.db)
    assert places(ben_user)["ben/"]["estimate"] != UNKNOWN_NOW

    ClusterGpus.instance().read_at -= FRESH_FOR_S + 1  # nobody counted for two minutes
    assert places(ben_user)["ben/"]["estimate"] == UNKNOWN_NOW
    assert "were last read 12" in ben.gpu_unknown()

    ClusterGpus.instance().refresh_every = 3600
    await ben.gpu_refresh()  # a step that counts: read again, however long refresh_every is
    assert ben.gpu_unknown() is None
    assert places(ben_user)["ben/"]["estimate"] != UNKNOWN_NOW


async def test_a_class_guarantee_takes_back_a_borrowed_h100_and_the_line_counts_on_it(
    make_hub, cluster, monkeypatch
):
    """The H100 node's 8 cards: 7 held by another namespace's job, the last by nina's H100
    server, borrowed (nlp has no guarantee on H100s). lab is guaranteed one card of "Any 80 GB
    card", a class the H100s are in. lee's spawn on it was refused ("There is no Any 80 GB card
    card here") and nothing was asked back: the guarantee was never met while nina's server
    ran. Now nina's server is asked back for lab, as a borrowed H100 pair's would be for an
    H100. lee waits in line; the governor then expects nina's server to stop in 15 minutes
    (the reclaim's grace). lee's page said "any moment now", the class's own servers (none)
    being all the estimate read: it now counts on the reclaim."""
    monkeypatch.setattr(FORECAST, "at", clock.utcnow())  # the governor was heard: a line
    lab = {"guaranteed": {"big-memory": 1}, "tiers": ["big-memory"]}
    hub = make_hub(profiles_config(quotas={**QUOTAS, "lab": lab}, capacity={}, queue=True))
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cluster.create("pods", batch_pod("train", "nvidia.com/gpu", 7, h100), "ml-team")
    wait_for(lambda: cluster.get("pods", "train", "ml-team")["status"]["phase"] == "Running")
    hub.user("nina", "nlp")
    lee_user = hub.user("lee", "lab")
    nina, lee = hub.spawner("nina"), hub.spawner("lee")
    await hub.started(nina, {"profile": "h100", "project": "p"}).start()
    assert nina.gpu_grant["gpu-gov/borrowed"] == "true"
    await read_again(lee)
    assert lee.gpu_capacity([])["big-memory"] == 0  # nina's card: another tier's pod

    with pytest.raises(GpuRefused, match="so 1 is being taken back from them") as refused:
        await hub.started(lee, {"profile": "big-memory", "project": "p"}).start()
    assert "1 by H100 80 GB servers" in str(refused.value), refused.value
    hub.db.refresh(nina.orm_spawner)  # asked back where the governor reads it: the Hub's
    asked = nina.orm_spawner.state[GRANT_STATE]
    assert asked.get("gpu-gov/reclaim-for") == "lab", asked
    lee.clear_state()  # the Hub's stop after the refused start
    lee.orm_spawner.started = None
    lee.orm_spawner.state = lee.get_state()
    hub.db.commit()

    admission = await lee.gpu_enqueue({"profile": "big-memory", "project": "p"})
    assert not admission.allowed and waiting_requests(hub.db)
    due = clock.utcnow() + timedelta(minutes=15)
    why = f"a server holding it is due to stop by {due:%H:%M} UTC"
    monkeypatch.setattr(FORECAST, "releases", {"nina/": Release(due, why)})
    estimate = places(lee_user)["lee/"]["estimate"]
    assert re.fullmatch(rf"about 1[45]m( \d+s)? \({why}\)", estimate), estimate


async def test_an_h100_guarantee_takes_back_a_borrowed_class_server_on_an_h100(make_hub, cluster):
    """The H100 node's 8 cards: 7 held by another namespace's job, the last by nina's server on
    "Any 80 GB card", borrowed. vision is guaranteed two H100s and holds none: alice's spawn
    was refused ("There is no H100 80 GB card here") and nothing was asked back, the class's
    tier not counted as holding H100s (its servers may hold another model). The pod's node
    says which card nina's server holds: an H100, asked back for vision's guarantee."""
    hub = make_hub(profiles_config(capacity={}))
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cluster.create("pods", batch_pod("train", "nvidia.com/gpu", 7, h100), "ml-team")
    wait_for(lambda: cluster.get("pods", "train", "ml-team")["status"]["phase"] == "Running")
    hub.user("nina", "nlp")
    hub.user("alice", "vision")
    nina, alice = hub.spawner("nina"), hub.spawner("alice")
    await hub.started(nina, {"profile": "big-memory", "project": "p"}).start()
    assert nina.gpu_grant["gpu-gov/borrowed"] == "true"
    assert cluster.get("pods", nina.pod_name)["spec"]["nodeName"] == "h100-0"
    await read_again(alice)
    assert alice.gpu_capacity([])["h100"] == 0
    with pytest.raises(GpuRefused, match="so 1 is being taken back from them"):
        await hub.started(alice, {"profile": "h100", "project": "p"}).start()
    hub.db.refresh(nina.orm_spawner)
    assert nina.orm_spawner.state[GRANT_STATE].get("gpu-gov/reclaim-for") == "vision"


async def test_an_h100_requests_wait_counts_on_a_class_server_known_to_hold_an_h100(
    make_hub, cluster, monkeypatch
):
    """The H100 node's 8 cards: 7 held by another namespace's job, the last by lee's server on
    "Any 80 GB card", within lab's guarantee (not to be asked back). alice's H100 spawn is
    refused for want of a card; the governor expects lee's server to stop in 15 minutes. The
    estimate read the H100 tiers' servers alone (none): the spawn page offered to wait "any
    moment now", and alice's place in line said the same. The pod's node says lee's server
    holds an H100: both now say about 15 minutes, and why."""
    monkeypatch.setattr(FORECAST, "at", clock.utcnow())  # the governor was heard: a line
    lab = {"guaranteed": {"big-memory": 1}, "tiers": ["big-memory"]}
    hub = make_hub(profiles_config(quotas={**QUOTAS, "lab": lab}, capacity={}, queue=True))
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cluster.create("pods", batch_pod("train", "nvidia.com/gpu", 7, h100), "ml-team")
    wait_for(lambda: cluster.get("pods", "train", "ml-team")["status"]["phase"] == "Running")
    hub.user("lee", "lab")
    alice_user = hub.user("alice", "vision")
    lee, alice = hub.spawner("lee"), hub.spawner("alice")
    await hub.started(lee, {"profile": "big-memory", "project": "p"}).start()
    assert lee.gpu_grant["gpu-gov/borrowed"] == "false"
    assert cluster.get("pods", lee.pod_name)["spec"]["nodeName"] == "h100-0"
    await read_again(alice)
    due = clock.utcnow() + timedelta(minutes=15)
    why = f"a server holding it is due to stop by {due:%H:%M} UTC"
    monkeypatch.setattr(FORECAST, "releases", {"lee/": Release(due, why)})
    about = rf"about 1[45]m( \d+s)? \({why}\)"

    form = html.unescape(await alice.get_options_form())
    offered = re.search(r"Or wait in line: 1st for H100 80 GB, ([^.]*\))\.", form)
    assert offered and re.fullmatch(about, offered[1]), offered and offered[0]
    # A pair: lee's card and none of the job's, which no deadline frees (it said "any moment").
    assert "1st for 2 x H100, no estimate: the GPUs it waits for are in use, with no " in form
    admission = await alice.gpu_enqueue({"profile": "h100", "project": "p"})
    assert not admission.allowed and waiting_requests(hub.db)
    assert "There is no H100 80 GB card here" in admission.reason, admission.reason
    estimate = places(alice_user)["alice/"]["estimate"]
    assert re.fullmatch(about, estimate), estimate


async def test_cards_kept_for_an_unused_pair_guarantee_are_not_lent_as_single_cards(
    make_hub, cluster, monkeypatch
):
    """The H100 node's 8 cards: 6 held by another namespace's job, 2 free. vision is
    guaranteed an H100 pair and lends none of it (``lending_limit``). nina's single H100 (nlp,
    no guarantee on H100s) borrowed one of the two: the cards kept were counted for the pair
    tier alone, and vision's pair then did not fit. Now nina is refused, the spawn page
    saying why; its offer to wait said "any moment now" (no server of the hub holds the cards,
    so none was counted: no stop frees them), now "no estimate". alice's pair starts."""
    monkeypatch.setattr(FORECAST, "at", clock.utcnow())  # the governor was heard: a line
    vision = {**QUOTAS["vision"], "lending_limit": {"h100x2": 0}}
    hub = make_hub(profiles_config(quotas={**QUOTAS, "vision": vision}, capacity={}, queue=True))
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cluster.create("pods", batch_pod("train", "nvidia.com/gpu", 6, h100), "ml-team")
    wait_for(lambda: cluster.get("pods", "train", "ml-team")["status"]["phase"] == "Running")
    hub.user("nina", "nlp")
    hub.user("alice", "vision")
    nina, alice = hub.spawner("nina"), hub.spawner("alice")
    await read_again(nina)
    form = html.unescape(await nina.get_options_form())
    said = "none is free to borrow: the others are in use or kept for other teams' guarantees"
    assert said in form, form
    offered = re.search(r"Or wait in line: 1st for H100 80 GB, ([^.]*)\.", form)
    assert offered and offered[1].startswith("no estimate"), offered and offered[0]
    with pytest.raises(GpuRefused, match=said):
        await hub.started(nina, {"profile": "h100", "project": "p"}).start()
    assert not cluster.get("pods", nina.pod_name)
    await hub.started(alice, {"profile": "h100x2", "project": "p"}).start()
    assert cluster.get("pods", alice.pod_name)["spec"]["nodeName"] == "h100-0"


UNKNOWN_NOW = "GPU state unknown now (the cards have not been read lately)"
A100_POOL_TIER = {"name": "a100", "display_name": "A100 80 GB", "gpu": "A100-80GB"}


def a100_pool_config(**changes) -> Config:
    """The catalogue plus an A100 tier whose node pool the autoscaler has scaled to zero: no
    A100 node exists. Vision is guaranteed one A100 and may borrow none."""
    vision = {**QUOTAS["vision"], "tiers": [*QUOTAS["vision"]["tiers"], "a100"]}
    vision["guaranteed"] = {**vision["guaranteed"], "a100": 1}
    vision["borrowing_limit"] = {**vision["borrowing_limit"], "a100": 0}
    return profiles_config(
        tiers=[*TIERS, A100_POOL_TIER], quotas={**QUOTAS, "vision": vision}, **changes
    )


async def test_a_pool_scaled_to_zero_admits_a_spawn_that_waits_for_its_node(
    make_hub, cluster, pod_api
):
    """A GPU node pool the cluster autoscaler scaled to zero has no node to count: without
    ``node_pool_max`` every spawn on it is refused for want of a card, so no pod is ever
    Pending and the autoscaler never adds the node. With it, the spawn is admitted against the
    team's quota, its pod waits Pending, and runs once the autoscaler's node joins."""
    hub = make_hub(a100_pool_config())
    alice = hub.spawner(hub.user("alice", "vision"))
    await read_again(alice)
    assert alice.gpu_capacity([])["a100"] == 0
    with pytest.raises(GpuRefused, match="There is no A100 80 GB card here"):
        await hub.started(alice, {"profile": "a100"}).start()

    GpuProfiles.clear_instance()
    hub = make_hub(a100_pool_config(node_pool_max={"a100": 8}))
    alice = hub.spawner(hub.user("alice2", "vision"))
    await read_again(alice)
    assert alice.gpu_capacity([])["a100"] == 8
    offered = by_slug(await gpu_profile_list(alice))["a100"]["description"]
    assert "vision: 1 of 1 guaranteed left" in offered, offered
    starting = asyncio.ensure_future(hub.started(alice, {"profile": "a100"}).start())
    pod = lambda: cluster.get("pods", alice.pod_name) or {}  # noqa: E731
    deadline = time.monotonic() + 20  # the spawn runs on this loop: wait without blocking it
    while "Unschedulable" not in json.dumps(pod().get("status")):
        assert time.monotonic() < deadline and not starting.done(), "no Pending pod"
        await asyncio.sleep(0.1)

    # The team's quota still holds: its one A100 is taken by the Pending server.
    bob = hub.started(hub.spawner(hub.user("bob", "vision")), {"profile": "a100"})
    with pytest.raises(GpuRefused, match="may not borrow"):
        await bob.start()
    assert bob._log_name not in pod_api

    # The autoscaler adds an A100 node (its count joins at the next read): the pod runs.
    cluster.add_node(gpu_node("a100-0", "NVIDIA-A100-SXM4-80GB", gpus=8, labels=USER_NODE))
    await asyncio.wait_for(starting, 30)
    assert pod_api[alice._log_name].spec.node_name == "a100-0"
    await read_again(alice)
    assert alice.gpu_capacity([])["a100"] == 8  # the node's 8, the pool's most


A100_TIERS = [
    {"name": "a100", "display_name": "A100 80 GB", "gpu": "A100-80GB"},
    {"name": "a100x2", "display_name": "2 x A100", "gpu": "A100-80GB", "count": 2},
]
A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


class SyncHandler:
    """What the hub's queue sync handler offers ``_room``: its settings, database and users."""

    def __init__(self, hub: FakeHub):
        self.db, self.settings = hub.db, hub.settings
        self.users = {row: hub.users[row.name] for row in hub.db.query(orm.User)}

    def find_user(self, name: str):
        row = orm.User.find(self.db, name)
        return None if row is None else self.users[row]


async def test_the_sync_says_which_waiting_spawns_fragmentation_blocks_on_the_nodes(
    make_hub, cluster
):
    """Three A100 nodes of 2 cards; another namespace's jobs hold one card on each of the
    first two: 1 + 1 + 2 free. Without DCGM the governor's cluster report saw no card at all
    ("fragmentation: unknown — no card to count"), however many spawns waited. The queue
    sync now carries the reading admission counts on (``room``): a pair fits on the third
    node; once bob's pair runs there, carol's pair is admitted (2 cards free in all) and its
    pod stays Pending: fragmentation (one card free on each of two nodes); dave's pair,
    refused, is a shortage (the two free cards are carol's once consolidated). A single card
    is never fragmented. A reading the API cannot renew is unknown, never "not fragmented"."""
    from jupyter_gpu_gov import cli
    from jupyter_gpu_gov.core.queue import room_from_json
    from jupyter_gpu_gov.diagnose.cluster import Demand, fragmentation_report, placement
    from jupyter_gpu_gov.profiles.queue_pages import _room

    for i in range(3):
        cluster.add_node(gpu_node(f"a100-{i}", A100["nvidia.com/gpu.product"], gpus=2))
    for i in (0, 1):
        on = {**A100, "kubernetes.io/hostname": f"a100-{i}"}
        cluster.create("pods", batch_pod(f"train-{i}", "nvidia.com/gpu", 1, on), "ml-team")
        wait_for(
            lambda i=i: cluster.get("pods", f"train-{i}", "ml-team")["status"]["phase"] == "Running"
        )
    lab = {"guaranteed": {"a100": 8, "a100x2": 8}, "tiers": ["a100", "a100x2"], "user_cap": 4}
    hub = make_hub(
        profiles_config(tiers=[*TIERS, *A100_TIERS], quotas={**QUOTAS, "lab": lab}, capacity={})
    )
    for name in ("bob", "carol", "dave"):
        hub.user(name, "lab")
    bob, carol, dave = (hub.spawner(name, "pair") for name in ("bob", "carol", "dave"))

    async def room() -> dict:  # as the governor reads the sync's answer
        answer = await _room(SyncHandler(hub), clock.utcnow())
        return room_from_json(json.loads(json.dumps(answer)))

    def said(nodes: dict, demand: Demand) -> str:
        report = fragmentation_report([], demand, "no card to count", nodes)
        return " ".join(cli.cluster_text({"fragmentation": report}).split())

    found = await room()
    assert found["unknown"] is None and found["read_age_s"] < FRESH_FOR_S
    a100_free = {n: found["nodes"][n]["nvidia.com/gpu"] for n in ("a100-0", "a100-1", "a100-2")}
    assert a100_free == {"a100-0": 1, "a100-1": 1, "a100-2": 2}
    assert found["tiers"]["a100x2"] == {
        "resource": "nvidia.com/gpu",
        "count": 2,
        "nodes": ["a100-0", "a100-1", "a100-2"],
        "nodes_total": 3,
        "pool": None,
    }
    assert found["tiers"]["h200-3g"]["resource"] == "nvidia.com/mig-3g.71gb"
    one_pair = placement([("a100x2", "queued")], found)
    assert (one_pair["fits"], one_pair["fragmentation"], one_pair["shortage"]) == (1, 0, 0)
    text = said(one_pair, Demand(0, 1, 0))
    assert "fragmentation: no — on the cluster's nodes" in text, text
    assert "1 in line for a100x2 (2 x nvidia.com/gpu on one node): room on a node now" in text
    assert "4 free on its 3 nodes, at most 2 on one" in text

    await hub.started(bob, {"profile": "a100x2"}).start()
    assert cluster.get("pods", bob.pod_name)["spec"]["nodeName"] == "a100-2"
    await read_again(bob)
    starting = asyncio.ensure_future(hub.started(carol, {"profile": "a100x2"}).start())
    deadline = time.monotonic() + 20  # the spawn runs on this loop: wait without blocking it
    while "Unschedulable" not in json.dumps(
        (cluster.get("pods", carol.pod_name) or {}).get("status")
    ):
        assert time.monotonic() < deadline and not starting.done(), "no Pending pod"
        await asyncio.sleep(0.1)
    with pytest.raises(GpuRefused):
        await hub.started(dave, {"profile": "a100x2"}).start()
    found = await room()
    assert found["refused"].get("a100x2") == 1  # dave's
    assert {n: found["nodes"].get(n, {}).get("nvidia.com/gpu", 0) for n in a100_free} == {
        "a100-0": 1, "a100-1": 1, "a100-2": 0
    }  # fmt: skip
    assert "a100-2" not in found["nodes"]  # a full node is not sent
    asked = [("a100x2", "pending"), ("a100x2", "refused")]
    blocked = placement(asked, found)
    assert (blocked["fragmentation"], blocked["shortage"], blocked["fits"]) == (1, 1, 0)
    by_state = {r["state"]: r["blocked_by"] for r in blocked["requests"]}
    assert by_state == {"pending": "fragmentation", "refused": "shortage"}, blocked
    assert fragmentation_report([], Demand(1, 0, 1), "", blocked)["flag"] is True
    text = said(blocked, Demand(1, 0, 1))
    assert "fragmentation: YES — on the cluster's nodes" in text, text
    assert "1 blocked by fragmentation, 1 by a shortage, 0 with room now" in text
    assert (
        "1 starting for a100x2 (2 x nvidia.com/gpu on one node): blocked by fragmentation" in text
    )
    # Single cards are whole cards: with one free on each of two nodes, two fit, a third is
    # short; never fragmented.
    singles = placement([("a100", "queued")] * 3, found)
    assert (singles["fits"], singles["shortage"], singles["fragmentation"]) == (2, 1, 0)

    # The API fails and the reading ages past FRESH_FOR_S: unknown, and why.
    cluster.fail("GET", r"^/api/v1/nodes$", code=503)
    ClusterGpus.instance().read_at -= FRESH_FOR_S + 1
    found = await room()
    assert "the Kubernetes API did not answer" in found["unknown"], found
    stale = placement(asked, found)
    assert stale["requests"] == [] and stale["unknown"] == found["unknown"]
    report = fragmentation_report([], Demand(1, 0, 1), "no card to count", stale)
    assert report["flag"] is False
    text = said(stale, Demand(1, 0, 1))
    assert "fragmentation: unknown — the cluster's nodes: GPU state unknown" in text, text
    assert "fragmentation: no" not in text
    starting.cancel()


async def test_a_pair_a_new_node_would_take_waits_for_a_node_not_on_fragmentation(
    make_hub, cluster, monkeypatch
):
    """An A100 pool the autoscaler may grow to three 2-card nodes (``node_pool_max``) has two:
    another namespace's jobs hold one card on each, 1 + 1 free. carol's and dave's pairs are
    admitted (the pool's third node counts as free) and their pods wait Pending. Read as
    before, one was blocked by fragmentation and the other by a shortage: but the autoscaler
    adds a node for one of them, which neither is. Now one waits for a node; the other,
    which the new node has no room for once the first is on it, is blocked by fragmentation
    (the two single cards would take it, together on one node).
    And the hub says the room of the tiers spawns wait for alone: none waiting, none."""
    from jupyter_gpu_gov import cli
    from jupyter_gpu_gov.core.queue import room_from_json
    from jupyter_gpu_gov.diagnose.cluster import Demand, fragmentation_report, placement
    from jupyter_gpu_gov.profiles.queue import REFUSED
    from jupyter_gpu_gov.profiles.queue_pages import _room

    monkeypatch.setattr(REFUSED, "_at", {})  # (the hub's refusals: other tests' are not these)
    monkeypatch.setattr(REFUSED, "_of", {})
    for i in range(2):
        cluster.add_node(gpu_node(f"a100-{i}", A100["nvidia.com/gpu.product"], gpus=2))
        on = {**A100, "kubernetes.io/hostname": f"a100-{i}"}
        cluster.create("pods", batch_pod(f"train-{i}", "nvidia.com/gpu", 1, on), "ml-team")
        wait_for(
            lambda i=i: cluster.get("pods", f"train-{i}", "ml-team")["status"]["phase"] == "Running"
        )
    lab = {"guaranteed": {"a100": 8, "a100x2": 8}, "tiers": ["a100", "a100x2"], "user_cap": 4}
    config = profiles_config(
        tiers=[*TIERS, *A100_TIERS],
        quotas={**QUOTAS, "lab": lab},
        capacity={},
        node_pool_max={"a100": 6, "a100x2": 6},
    )
    hub = make_hub(config)
    for name in ("carol", "dave"):
        hub.user(name, "lab")
    carol, dave = (hub.spawner(name, "pair") for name in ("carol", "dave"))

    async def room(pending: list[str] | None) -> dict:  # as the governor reads the sync's answer
        answer = await _room(SyncHandler(hub), clock.utcnow(), pending)
        return room_from_json(json.loads(json.dumps(answer)))

    ClusterGpus.instance().read_at = float("-inf")  # a read is due
    nothing = await room([])  # no spawn waits: no node, no tier is sent, and nothing is read
    assert nothing["unknown"] is None and nothing["nodes"] == nothing["tiers"] == {}, nothing
    assert ClusterGpus.instance().read_at == float("-inf")  # (every node and pod, each 30 s)
    await read_again(carol)
    idle = placement([], nothing)
    assert (idle["unknown"], idle["fragmentation"], idle["shortage"]) == (None, 0, 0)
    said = cli.cluster_text({"fragmentation": fragmentation_report([], Demand(0, 0, 0), "", idle)})
    assert "fragmentation: no — on the cluster's nodes: 0 bl" in said  # none read, none waits

    starting = []
    for spawner in (carol, dave):
        starting.append(asyncio.ensure_future(hub.started(spawner, {"profile": "a100x2"}).start()))
        deadline = time.monotonic() + 20  # the spawn runs on this loop: wait without blocking
        while "Unschedulable" not in json.dumps(
            (cluster.get("pods", spawner.pod_name) or {}).get("status")
        ):
            assert time.monotonic() < deadline and not starting[-1].done(), "no Pending pod"
            await asyncio.sleep(0.1)
        await read_again(spawner)

    found = await room(["a100x2"])  # the governor's pass saw two a100x2 spawns starting
    assert set(found["tiers"]) == {"a100x2"}, found  # the waiting tier's alone
    assert found["tiers"]["a100x2"]["pool"] == "a100x2"
    assert found["pools"] == {"a100x2": 2}  # a third node of 2 cards, 4 on the two there
    assert found["nodes"] == {"a100-0": {"nvidia.com/gpu": 1}, "a100-1": {"nvidia.com/gpu": 1}}
    asked = [("a100x2", "pending")] * 2
    blocked = placement(asked, found)
    assert (blocked["new_node"], blocked["fragmentation"], blocked["shortage"]) == (1, 1, 0)
    says = [r["says"] for r in blocked["requests"]]
    assert any(
        "1 starting for a100x2 (2 x nvidia.com/gpu on one node): waiting for a node: none has "
        "room, and the autoscaler may add one"
        in line
        and "its pool may add 2 more" in line
        for line in says
    ), says
    text = " ".join(
        cli.cluster_text(
            {"fragmentation": fragmentation_report([], Demand(2, 0, 0), "none", blocked)}
        ).split()
    )
    assert "1 blocked by fragmentation, 0 by a shortage, 0 with room now, 1 waiting for a node" in (
        text
    ), text

    # Read as it was (no pool said): one blocked by fragmentation, one by a shortage.
    without = placement(asked, {**found, "pools": {}})
    assert (without["new_node"], without["fragmentation"], without["shortage"]) == (0, 1, 1)
    for each in starting:
        each.cancel()


A100X3_TIER = {"name": "a100x3", "display_name": "3 x A100", "gpu": "A100-80GB", "count": 3}


async def test_a_pool_given_by_its_node_shape_holds_whole_servers_per_node(make_hub, cluster):
    """A pool of up to two 8-card A100 nodes. ``node_pool_max`` counted devices: a 3-card tier
    had to be given a multiple of 3, and no number was right. 15 counted five servers where two
    nodes hold four (2 each: a server's cards are on one node), the fifth admitted to stay
    Pending; 12 counted four with the pool scaled to zero, but once one node had come, holding
    another namespace's one-card job, 7 free on it and the 4 it "lacked" of 12 made 11: three
    servers, where its 7 and a second node hold four. Given the node shape, the pool's nodes
    yet to come hold whole servers each."""
    vision = {**QUOTAS["vision"], "tiers": [*QUOTAS["vision"]["tiers"], "a100", "a100x3"]}
    vision["guaranteed"] = {**vision["guaranteed"], "a100x3": 12}
    shape = {"nodes": 2, "devices_per_node": 8}
    config = profiles_config(
        tiers=[*TIERS, A100_POOL_TIER, A100X3_TIER],
        quotas={**QUOTAS, "vision": vision},
        node_pool_max={"a100": shape, "a100x3": shape},
    )
    hub = make_hub(config)
    alice = hub.spawner(hub.user("alice", "vision"))
    await read_again(alice)
    capacity = alice.gpu_capacity([])
    assert (capacity["a100"], capacity["a100x3"]) == (16, 12)  # 16 cards, 4 servers of 3
    assert alice.gpu_cards()["a100x3"] == 16  # the form's "of 16": the pool at its most

    # One node came; another namespace's job holds one of its cards.
    cluster.add_node(gpu_node("a100-0", "NVIDIA-A100-SXM4-80GB", gpus=8, labels=USER_NODE))
    on = {**A100, "kubernetes.io/hostname": "a100-0"}
    cluster.create("pods", batch_pod("train", "nvidia.com/gpu", 1, on), "ml-team")
    wait_for(lambda: cluster.get("pods", "train", "ml-team")["status"]["phase"] == "Running")
    await read_again(alice)
    capacity = alice.gpu_capacity([])
    assert (capacity["a100"], capacity["a100x3"]) == (15, 12)  # 7 + 8; 2 + 2 servers


async def test_the_cluster_report_puts_whole_servers_on_each_node_a_shaped_pool_may_add(
    make_hub, cluster, monkeypatch
):
    """A pool of up to two 8-card A100 nodes, scaled to zero, and five 3-card spawns waiting
    (four admitted, their pods Pending; the fifth refused for want of a card). The sync's room
    said only the 16 devices the pool may add, and the cluster report spent them as 16 // 3:
    all five "waiting for a node", where two nodes hold four (a server's cards are on one
    node). The room now says the node's size: four wait for a node, one is short."""
    from jupyter_gpu_gov import cli
    from jupyter_gpu_gov.core.queue import room_from_json
    from jupyter_gpu_gov.diagnose.cluster import Demand, fragmentation_report, placement
    from jupyter_gpu_gov.profiles.queue import REFUSED
    from jupyter_gpu_gov.profiles.queue_pages import _room

    monkeypatch.setattr(REFUSED, "_at", {})
    monkeypatch.setattr(REFUSED, "_of", {})
    vision = {**QUOTAS["vision"], "tiers": [*QUOTAS["vision"]["tiers"], "a100", "a100x3"]}
    vision["guaranteed"] = {**vision["guaranteed"], "a100x3": 12}
    shape = {"nodes": 2, "devices_per_node": 8}
    config = profiles_config(
        tiers=[*TIERS, A100_POOL_TIER, A100X3_TIER],
        quotas={**QUOTAS, "vision": vision},
        node_pool_max={"a100": shape, "a100x3": shape},
    )
    hub = make_hub(config)
    alice = hub.spawner(hub.user("alice", "vision"))
    await read_again(alice)
    assert alice.gpu_capacity([])["a100x3"] == 12  # admission: four servers

    answer = await _room(SyncHandler(hub), clock.utcnow(), ["a100x3"])
    found = room_from_json(json.loads(json.dumps(answer)))  # as the governor reads the sync
    asked = [("a100x3", "pending")] * 4 + [("a100x3", "refused")]
    placed = placement(asked, found)
    assert (placed["new_node"], placed["shortage"], placed["fragmentation"]) == (4, 1, 0), placed
    assert found["pools"] == {"a100x3": 16} and found["node_devices"] == {"a100x3": 8}, found
    verdicts = {(r["state"], r["blocked_by"]): r["count"] for r in placed["requests"]}
    assert verdicts == {("pending", "new_node"): 4, ("refused", "shortage"): 1}, verdicts
    says = " | ".join(r["says"] for r in placed["requests"])
    assert "its pool may add 16 more (2 nodes of 8)" in says, says
    text = " ".join(
        cli.cluster_text(
            {"fragmentation": fragmentation_report([], Demand(4, 0, 1), "none", placed)}
        ).split()
    )
    assert "0 blocked by fragmentation, 1 by a shortage, 0 with room now, 4 waiting for a node" in (
        text
    ), text


def test_node_pool_max_gives_devices_or_a_node_shape_a_server_fits_on():
    for value, words in (
        ({"a10": 8}, "GpuProfiles.node_pool_max: 'a10' is not a tier"),
        ({"h100x2": 3}, "GpuProfiles.node_pool_max: 'h100x2' counts devices"),
        (
            {"h100x2": {"nodes": 4, "devices_per_node": 1}},
            "'h100x2': a node of its pool holds 1 devices and a server takes 2",
        ),
    ):
        GpuProfiles.clear_instance()
        with pytest.raises(TraitError, match=re.escape(words)):
            GpuProfiles(config=profiles_config(node_pool_max=value)).check()
    for bad in (
        {"nodes": 2},
        {"nodes": -1, "devices_per_node": 8},
        {"nodes": 2, "devices_per_node": True},
    ):
        GpuProfiles.clear_instance()
        with pytest.raises(TraitError, match=re.escape("GpuProfiles.node_pool_max['h100']")):
            GpuProfiles(config=profiles_config(node_pool_max={"h100": bad}))
    GpuProfiles.clear_instance()
    with pytest.raises(TraitError, match=re.escape("node_pool_max['h100'] must be a whole number")):
        GpuProfiles(config=profiles_config(node_pool_max={"h100": -8}))
    GpuProfiles.clear_instance()
    shaped = GpuProfiles(
        config=profiles_config(node_pool_max={"h100x2": {"nodes": 2, "devices_per_node": 8}})
    )
    shaped.check()
    assert shaped.node_pools == {"h100x2": cluster_module.PoolShape(2, 8)}


def wait_for(check, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


# -- admission at start() ----------------------------------------------------------------------


async def test_start_within_quota_records_the_grant_and_labels_the_pod(hub, pod_api):
    hub.user("alice", "vision")
    alice = hub.started(hub.spawner("alice"), {"profile": "h100", "project": "detection"})

    url = await alice.start()

    pod = pod_api[alice._log_name]
    assert pod.status.phase == "Running" and pod.spec.node_name == "h100-0"
    assert url == f"http://{pod.status.pod_ip}:8888"  # the pod, scheduled and running
    grant = {
        "gpu-gov/tier": "h100",
        "gpu-gov/team": "vision",
        "gpu-gov/project": "detection",
        "gpu-gov/borrowed": "false",
        "gpu-gov/weight": "1",
        "gpu-gov/max-age": "259200",
        "gpu-gov/task-type": "interactive",
    }
    assert alice.user_options == {"profile": "h100", "project": "detection", **grant}
    # Recorded in the hub's database, where the governor and the next admission read it.
    hub.db.expire_all()
    row = hub.db.query(orm.Spawner).filter_by(id=alice.orm_spawner.id).one()
    assert {k: v for k, v in row.user_options.items() if k.startswith("gpu-gov/")} == grant
    assert ownership(pod)[0] == {"gpu-gov/user": "alice", **grant}
    assert container(pod).resources.limits == {"nvidia.com/gpu": "1"}


async def test_a_hub_whose_first_list_of_its_pods_failed_starts_the_next_server(hub, cluster):
    """The API fails the hub's first list of its pods (at a poll, or the cleanup of a refused
    spawn: a CI run's first spawn, the machine loaded): KubeSpawner keeps that reflector, which
    never watches, and hands it to every later start and poll of the namespace. The next start
    waited for its pod there until start_timeout ("failed to start in 120 seconds") and a poll
    found no pod. The next start replaces it: the server starts and a poll finds it running."""
    hub.user("alice", "vision")
    alice = hub.started(hub.spawner("alice"), {"profile": "h100", "project": "detection"})
    alice.start_timeout = 20  # a deadline: a start here takes a few seconds
    failing = cluster.fail("GET", rf"^/api/v1/namespaces/{alice.namespace}/pods$", times=1)
    with pytest.raises(ApiException):
        await alice.poll()
    assert failing.hits == 1

    url = await alice.start()

    pod = cluster.get("pods", alice.pod_name, alice.namespace)
    assert pod["status"]["phase"] == "Running" and url == f"http://{pod['status']['podIP']}:8888"
    assert await alice.poll() is None


async def test_a_start_whose_pods_list_failed_while_its_events_loaded_starts_the_next(hub, cluster):
    """A start's first list of its pods fails while its first list of events is under way:
    KubeSpawner cancels the events' start, and keeps that reflector, which never loads. Every
    later start waited for its first load until start_timeout (tests/test_kubernetes_faults_hub:
    "failed to start in 120 seconds"). The next start replaces it and the server starts."""
    hub.user("alice", "vision")
    alice = hub.started(hub.spawner("alice"), {"profile": "h100", "project": "detection"})
    ns = alice.namespace
    cluster.fail("GET", rf"^/api/v1/namespaces/{ns}/events$", "slow", seconds=3, times=1)
    failing = cluster.fail("GET", rf"^/api/v1/namespaces/{ns}/pods$", times=1)
    with pytest.raises(GpuStartFailed, match="answered 500"):
        await alice.start()
    assert failing.hits == 1

    url = await asyncio.wait_for(alice.start(), 60)  # (the Hub's start_timeout, as the Hub has it)

    pod = cluster.get("pods", alice.pod_name, alice.namespace)
    assert pod["status"]["phase"] == "Running" and url == f"http://{pod['status']['podIP']}:8888"


async def test_start_beyond_the_guarantee_is_borrowed_and_labelled(hub, pod_api):
    for name in ("v1", "v2", "v3"):
        hub.user(name, "vision")
    for name in ("v1", "v2"):
        await hub.started(hub.spawner(name), {"profile": "h100"}).start()

    third = hub.started(hub.spawner("v3"), {"profile": "h100"})
    await third.start()

    assert third.user_options["gpu-gov/borrowed"] == "true"
    assert ownership(pod_api[third._log_name])[0]["gpu-gov/borrowed"] == "true"


async def test_reading_the_hubs_servers_warns_of_nothing(hub, pod_api):
    """Admission reads every started server's state, the queue every spawner's: both select
    JupyterHub's JSONDict column, whose type sets no ``cache_ok``. SQLAlchemy warned of it in
    the Hub's log at every start (``make demo``'s one warning) unless the query says it is not
    cached (``NOT_CACHED``)."""
    hub.user("v1", "vision")
    hub.user("v2", "vision")
    await hub.started(hub.spawner("v1"), {"profile": "h100"}).start()

    with warnings.catch_warnings(record=True) as seen:  # under the test run's own filters
        held = hub.spawner("v2").gpu_usage()
        waiting = waiting_requests(hub.db)

    assert [grant.tier for grant in held] == ["h100"] and waiting == []
    assert [f"{w.category.__name__}: {w.message}" for w in seen] == []


async def test_start_over_quota_is_refused_with_what_to_do(hub, pod_api):
    for name in ("v1", "v2", "v3", "alice"):
        hub.user(name, "vision")
    for name in ("v1", "v2", "v3"):  # 2 guaranteed + 1 borrowed: the team's limit
        await hub.started(hub.spawner(name), {"profile": "h100"}).start()

    alice = hub.started(hub.spawner("alice"), {"profile": "h100"})
    with pytest.raises(GpuRefused) as refused:
        await alice.start()

    assert refused.value.status_code == 403
    message = refused.value.jupyterhub_message
    assert "Team vision" in message
    assert "may borrow at most 1 " in message
    assert "Stop one of the team's servers" in message and "pick another tier" in message
    assert not any(k.startswith("gpu-gov/") for k in alice.user_options)
    assert not any(k.startswith("gpu-gov/") for k in alice.orm_spawner.user_options or {})
    assert alice._log_name not in pod_api  # no pod was asked for


async def test_start_over_the_per_user_cap_names_what_the_user_holds(hub, pod_api):
    hub.user("alice", "vision")
    await hub.started(hub.spawner("alice", "pair"), {"profile": "h100x2"}).start()

    second = hub.started(hub.spawner("alice", "more"), {"profile": "h100"})
    with pytest.raises(GpuRefused) as refused:
        await second.start()

    message = refused.value.jupyterhub_message
    assert "You may hold 2 GPU-equivalents" in message and "vision" in message
    assert "server 'pair' on 2 x H100" in message  # what to stop
    assert "Stop one of your servers" in message


async def test_a_spawn_not_yet_admitted_counts_as_nothing_whatever_its_options_say(hub, pod_api):
    """JupyterHub records a spawn's ``user_options`` as the user sent them, and marks the
    server started, before ``Spawner.start`` admits it (``FakeHub.started``). Until admission
    rewrites them they are the user's words: grant keys forged there must neither use up
    a team's quota nor break the admission of anyone else."""
    for name in ("v1", "v2", "mallory", "alice"):
        hub.user(name, "vision")
    for name in ("v1", "v2"):  # the team's guarantee; one more may be borrowed
        await hub.started(hub.spawner(name), {"profile": "h100"}).start()
    forged = {"profile": "h100", "gpu-gov/tier": "h100", "gpu-gov/team": "vision"}
    hub.started(hub.spawner("mallory"), {**forged, "gpu-gov/borrowed": "true"})
    hub.started(hub.spawner("mallory", "odd"), {**forged, "gpu-gov/tier": ["h100"]})

    alice = hub.started(hub.spawner("alice"), {"profile": "h100"})
    await alice.start()

    assert alice.user_options["gpu-gov/borrowed"] == "true"  # the one borrowed card is hers
    assert alice._log_name in pod_api


HUGE = "x" * 100_000


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"profile": ["h100"]}, "There is no GPU tier ['h100']. Choose one of: h100,"),
        ({"profile": {"slug": "h100"}}, "There is no GPU tier {'slug': 'h100'}. Choose one of"),
        ({"profile": 0}, "There is no GPU tier 0. Choose one of: h100,"),
        ({"profile": False}, "There is no GPU tier False. Choose one of: h100,"),
        ({"profile": []}, "There is no GPU tier []. Choose one of: h100,"),
        ({"profile": HUGE}, "There is no GPU tier 'xxxxx"),
        ({"profile": "h100", "team": HUGE}, "You are not in team 'xxxxx"),
        ({"profile": "h100", "project": HUGE}, "Project 'xxxxx"),
        ({"profile": "h100", "task_type": HUGE}, "A H100 80 GB server may be for: interactive;"),
        ({"profile": "h100", "expected_duration": HUGE}, "Expected duration 'xxxxx"),
        (
            {"profile": "h100", "expected_duration": 1e300},
            "Expected duration 1e+300: give 1m to 3d",
        ),
        ({"profile": "h100", "expected_duration": -300}, "Expected duration -300: give 1m to 3d"),
        (
            {"profile": "h100", "expected_duration": "9" * 40 + "d"},
            f"Expected duration '{'9' * 40}d': give 1m",
        ),
        ({"profile": "h100", "expected_duration": float("nan")}, "Expected duration nan is not a"),
    ],
    ids=[
        "list",
        "object",
        "zero",
        "false",
        "empty-list",
        "huge-profile",
        "team",
        "project",
        "task-type",
        "duration",
        "duration-huge",
        "duration-negative",
        "duration-years",
        "duration-nan",
    ],
)
async def test_a_choice_that_cannot_be_granted_is_refused_naming_it_briefly(
    hub, pod_api, options, words
):
    """The REST API takes any JSON as ``user_options``: a profile that is a list or an object
    is no tier (nor, without a GPU, is 0, false or []: they once started a server without
    one, KubeSpawner's default profile, as if the user had chosen it), and a choice of 100,000 characters is named in a few dozen (the refusal shows
    on the spawn page, in the API's answer and in the Hub's log). Nothing starts."""
    hub.user("alice", "vision")
    alice = hub.started(hub.spawner("alice"), options)

    with pytest.raises(GpuRefused) as refused:
        await alice.start()

    message = refused.value.jupyterhub_message
    assert message.startswith(words), message[:300]
    assert len(message) < 400, len(message)
    assert alice._log_name not in pod_api


async def test_keys_a_user_may_not_set_are_dropped_and_named_in_one_short_line(
    hub, pod_api, caplog
):
    """Keys a user may not set (a grant's, or any other) are dropped at admission and named
    in the Hub's log; 10,000 of them, each 1,000 characters long, once made a 10 MB line."""
    hub.user("alice", "vision")
    junk = {f"k{i:05d}" + "x" * 1000: 1 for i in range(10_000)}
    alice = hub.started(hub.spawner("alice"), {"profile": "h100", "gpu-gov/exempt": "true", **junk})

    with caplog.at_level("WARNING"):
        await alice.start()

    assert "gpu-gov/exempt" not in alice.user_options
    assert not any(k.startswith("k0") for k in alice.user_options)
    [line] = [r.getMessage() for r in caplog.records if "may not set" in r.getMessage()]
    assert line.startswith(
        "gpu-gov: alice: ignored user_options a user may not set: gpu-gov/exempt, k00000"
    )
    assert line.count("k0000") == 9 and line.endswith(" and 9991 more") and len(line) < 1000


async def test_a_key_a_user_may_not_set_is_named_on_one_log_line(hub, pod_api, caplog):
    """The keys are the user's words: a newline in one forged a line of the Hub's log."""
    hub.user("alice", "vision")
    forged = "x\n[W 2026-01-01 JupyterHub] forged"
    alice = hub.started(hub.spawner("alice"), {"profile": "h100", forged: 1})

    with caplog.at_level("WARNING"):
        await alice.start()

    [line] = [r.getMessage() for r in caplog.records if "may not set" in r.getMessage()]
    assert line.endswith("may not set: x\\n[W 2026-01-01 JupyterHub] forged"), line


FORGED = "\n\x1b[31m[I 2026-01-01 00:00:00.000 JupyterHub] gpu-gov: admitted mallory on h100"


def forged_lines(caplog) -> list[str]:
    """What the Hub's log would show of the profile layer's records that is not on their own
    line: a newline, a terminal's escape (colours, cursor moves) or a line separator. Only the
    records this package logs: JupyterHub's own debug lines quote a server's name as it is, and
    reach the capture when an earlier test left the Hub's logger at DEBUG."""
    return [
        r.getMessage()
        for r in caplog.records
        if Path(r.pathname).resolve().is_relative_to(PACKAGE)
        and "gpu-gov" in r.getMessage()
        and any(c in r.getMessage() for c in "\n\r\x1b\u2028")
    ]


async def test_what_a_user_chose_or_named_cannot_forge_a_line_of_the_hubs_log(hub, pod_api, caplog):
    """A user's name is as their identity provider wrote it (JupyterHub accepts a newline in
    one), and their choices (``user_options``) are theirs: the profile layer's lines quote them
    (admitted, refused, waits in line), and the Hub logs a refusal's message as it is. A newline
    and an ANSI escape in them once began a line of the Hub's log of their own ("gpu-gov:
    admitted mallory on h100", in red); they are written as escapes."""
    user = "alice" + FORGED
    hub.user(user, "vision")
    with caplog.at_level("INFO"):
        lab = hub.started(hub.spawner(user, "lab"), {"profile": "h100"})
        await lab.start()  # admitted
        for options in (
            {"profile": "h100", "team": "vision" + FORGED},
            {"profile": "h100", "project": "detection" + FORGED},
            {"profile": "h100", "expected_duration": "1h" + FORGED},
            {"profile": "h100" + FORGED},
        ):
            refused = hub.started(hub.spawner(user, "odd"), options)
            with pytest.raises(GpuRefused) as error:
                await refused.start()
            # JupyterHub logs the error as it is ("Error starting alice's server: HTTP 403 ...")
            assert not any(c in str(error.value) for c in "\n\x1b"), str(error.value)
        # Over the per-user cap (2 GPU-equivalents, one held): refused at admission, logged.
        pair = hub.started(hub.spawner(user, "pair"), {"profile": "h100x2"})
        with pytest.raises(GpuRefused):
            await pair.start()

    said = [r.getMessage() for r in caplog.records if "gpu-gov:" in r.getMessage()]
    assert any(m.startswith("gpu-gov: admitted alice\\n\\x1b[31m[I ") for m in said), said
    assert any(m.startswith("gpu-gov: refused alice\\n\\x1b[31m[I ") for m in said), said
    assert forged_lines(caplog) == []


async def test_user_in_no_team_is_refused_a_gpu_but_may_start_without_one(hub, pod_api):
    hub.user("eve")
    hub.group("staff", team=False)
    eve = hub.started(hub.spawner("eve"), {"profile": "h100"})

    with pytest.raises(GpuRefused) as refused:
        await eve.start()
    assert "no team with GPU access" in refused.value.jupyterhub_message
    assert "Ask your hub admin" in refused.value.jupyterhub_message

    # Through the REST API without options: no GPU, nothing counted, no labels.
    eve = hub.started(hub.spawner("eve", "cpu"), {})
    await eve.start()
    pod = pod_api[eve._log_name]
    assert not container(pod).resources.limits
    assert ownership(pod) == ({}, {})


@pytest.mark.parametrize(
    ("capacity", "admitted", "borrowed"),
    [(8, 3, 1), (2, 2, 0)],
    ids=["quota-bound", "capacity-bound"],
)
async def test_concurrent_starts_never_overshoot(make_hub, pod_api, capacity, admitted, borrowed):
    """Eight vision members start H100 servers at once: the hub's event loop interleaves them
    while KubeSpawner talks to the API, and no more than the quota (2 guaranteed + 1 borrowed)
    or the cluster's cards are granted."""
    hub = make_hub(profiles_config(capacity={**CAPACITY, "h100": capacity}))
    names = [f"user{i}" for i in range(8)]
    for name in names:
        hub.user(name, "vision")
    spawners = [hub.started(hub.spawner(name), {"profile": "h100"}) for name in names]

    results = await asyncio.gather(*(s.start() for s in spawners), return_exceptions=True)

    refusals = [r for r in results if isinstance(r, GpuRefused)]
    urls = [r for r in results if isinstance(r, str)]
    assert len(urls) == admitted and len(refusals) == len(names) - admitted
    assert all("vision" in r.jupyterhub_message for r in refusals)
    grants = [s.user_options for s in spawners if "gpu-gov/tier" in s.user_options]
    assert len(grants) == len(pod_api) == admitted
    assert sum(g["gpu-gov/borrowed"] == "true" for g in grants) == borrowed
    # What the next admission counts agrees with what was granted.
    late = hub.spawner(hub.user("late", "vision"))
    assert len(late.gpu_usage()) == admitted


# -- the example cluster config ----------------------------------------------------------------


# The cluster the example describes: 3 HGX H100 nodes serving single cards, 1 serving NVLink
# pairs (labelled by the admin), one H200 node as all-3g.71gb, one as all-1g.18gb.
EXAMPLE_NODES = [
    *(
        gpu_node(f"hgx-{i}", "NVIDIA-H100-80GB-HBM3",
                 labels={"node.example.org/gpu-pool": "h100-singles" if i < 3 else "h100-pairs"})
        for i in range(4)
    ),
    gpu_node("h200-half", "NVIDIA-H200", memory_mib=143771, mig={"3g.71gb": 16}),
    gpu_node("h200-small", "NVIDIA-H200", memory_mib=143771, mig={"1g.18gb": 56}),
]  # fmt: skip


def example_cluster(k8s: FakeKubernetes) -> None:
    for node in EXAMPLE_NODES:
        k8s.add_node(node)


def load_example() -> Config:
    return PyFileConfigLoader("jupyterhub_config.py", path=str(EXAMPLE)).load_config()


async def test_example_config_loads_and_builds_h200_mig_and_h100_pods(make_hub, cluster):
    example_cluster(cluster)
    config = load_example()
    assert config.JupyterHub.spawner_class.endswith("GpuKubeSpawner")
    services = config.JupyterHub.services.get_value([])
    (service,) = [s for s in services if s["name"] == "gpu-gov"]
    assert any(arg.startswith("--config=") for arg in service["command"])
    # My GPU usage's guarantees are the quotas', in GPU-equivalents: nlp's 10 H100s, two pairs
    # (4 cards) and ten half H200s (0.5 each).
    guaranteed = json.loads(service["environment"][TEAM_QUOTAS_ENV])
    assert (set(guaranteed), guaranteed["nlp"]) == ({"vision", "nlp", "robotics"}, 19.0)
    GpuProfiles.clear_instance()  # add_gpu_profiles checked the settings with one

    hub = make_hub(config)
    hub.user("nadia", "nlp")
    hub.user("rob", "robotics")
    nadia, rob = hub.spawner("nadia"), hub.spawner("rob")
    profile_names = {p["slug"] for p in await gpu_profile_list(rob)}
    assert profile_names == {"h100", "h200-3g", "h200-1g", "no-gpu"}

    slice_pod = await admitted_pod(rob, {"profile": "h200-1g", "project": "sim2real"})
    assert container(slice_pod).resources.limits["nvidia.com/mig-1g.18gb"] == "1"
    assert "nvidia.com/gpu" not in container(slice_pod).resources.limits
    assert slice_pod.spec.node_selector == {"nvidia.com/mig.strategy": "mixed"}
    assert ownership(slice_pod)[0]["gpu-gov/max-age"] == "86400"
    await round_trip(slice_pod)

    half = await admitted_pod(nadia, {"profile": "h200-3g", "project": "retrieval"})
    assert container(half).resources.limits["nvidia.com/mig-3g.71gb"] == "1"
    await round_trip(half)

    card = await admitted_pod(nadia, {"profile": "h100x2", "project": "fine-tuning"})
    assert container(card).resources.limits["nvidia.com/gpu"] == "2"
    assert "nvidia.com/mig-3g.71gb" not in container(card).resources.limits
    assert card.spec.node_selector == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "node.example.org/gpu-pool": "h100-pairs",
    }
    assert GPU_TAINT in tolerations(card)
    assert container(card).resources.requests["memory"] == 400 * 2**30  # the tier's 400G
    env = {e.name: e.value for e in container(card).env}
    assert env["JUPYTER_GPU_GOV_URL"] == "http://hub:10101/services/gpu-gov/"
    assert ownership(card)[0]["gpu-gov/team"] == "nlp"
    await round_trip(card)

    with pytest.raises(GpuRefused, match="Name the project"):
        await admitted_pod(hub.spawner("rob", "unnamed"), {"profile": "h200-1g"})


def chart_config(tmp_path, *overlays) -> Config:
    """The documented values (with ``overlays``) loaded through the chart's own
    jupyterhub_config.py, in the chart's order (tests/z2jh_harness.py)."""
    values = z2jh.load_values(EXAMPLE / "values.yaml", *overlays)
    z2jh.set_file(values, "hub.extraFiles.gpu-gov.stringData", EXAMPLE / "jupyterhub_config.py")
    root = tmp_path / "z2jh"
    env = z2jh.hub_env(values, root, ports={"hub": 8081, "proxy-api": 8001})
    return z2jh.load(root, values, env)


def test_the_charts_own_templates_and_template_vars_are_kept(tmp_path):
    """hub.templatePaths and hub.templateVars (the chart sets them before hub.extraConfig): an
    admin's own pages still win, and the queue's home and "not running" pages come after them."""
    custom = "/usr/local/share/jupyterhub/custom_templates"
    config = chart_config(
        tmp_path, {"hub": {"templatePaths": [custom], "templateVars": {"org": {"name": "Ex"}}}}
    )
    GpuProfiles.clear_instance()
    assert list(config.JupyterHub.template_paths) == [custom, str(QUEUE_TEMPLATES)]
    assert config.JupyterHub.template_vars["org"] == {"name": "Ex"}
    assert config.JupyterHub.template_vars["gpu_gov_waiting"](None) == {}


async def test_documented_values_load_in_the_charts_order_and_spawn_a_tier(
    make_hub, cluster, tmp_path
):
    """The chart sets c.KubeSpawner.profile_list from singleuser.profileList ([]) before it runs
    jupyterhub_config.d and hub.extraConfig: the tiers must still be offered, and a tier's pod
    keeps what the chart configured (its dedicated-node toleration, singleuser.extraEnv)."""
    example_cluster(cluster)
    config = chart_config(tmp_path, {"singleuser": {"extraEnv": {"FROM_EXTRA_ENV": "1"}}})
    assert config.KubeSpawner.profile_list == []  # what the chart set
    assert config.JupyterHub.spawner_class.endswith("GpuKubeSpawner")
    services = {s["name"]: s for s in config.JupyterHub.services}
    assert "gpu-gov" in services
    GpuProfiles.clear_instance()

    hub = make_hub(config)
    hub.user("vic", "vision")
    vic = hub.spawner("vic")
    assert vic.profile_list is gpu_profile_list
    assert {p["slug"] for p in await gpu_profile_list(vic)} >= {"h100", "h100x2", "h200-1g"}
    pod = await admitted_pod(vic, {"profile": "h100", "project": "detection"})
    dedicated = {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"}  # fmt: skip
    assert dedicated in tolerations(pod) and GPU_TAINT in tolerations(pod)
    assert container(pod).resources.limits["nvidia.com/gpu"] == "1"
    env = {e.name: e.value for e in container(pod).env}
    assert env["FROM_EXTRA_ENV"] == "1"
    assert env["JUPYTER_GPU_GOV_URL"] == "http://hub:10101/services/gpu-gov/"
    assert ownership(pod)[0]["gpu-gov/tier"] == "h100"
    assert pod.metadata.labels["release"] == "jhub"  # the chart's common labels
    await round_trip(pod)


@pytest.mark.parametrize(
    ("role", "scopes"),
    [
        ({"scopes": ["self", "read:users:name"]}, {"self", "read:users:name"}),
        ({"groups": ["staff"]}, {"self"}),  # JupyterHub's default scopes, assigned to a group
    ],
    ids=["own-scopes", "assignment-only"],
)
async def test_a_user_role_of_the_admins_own_is_kept_and_given_the_governor(tmp_path, role, scopes):
    """A hub with its own ``user`` role (z2jh's ``hub.loadRoles.user``, which the chart loads
    before the config file): the governor's was a second role of that name, and JupyterHub
    refused to start ("Role user multiply defined"). The admin's role stays, with the
    governor's access added; the roles load as the Hub loads them."""
    config = chart_config(tmp_path, {"hub": {"loadRoles": {"user": role}}})
    GpuProfiles.clear_instance()
    hub = JupyterHub(config=config, db_url="sqlite://")
    hub.init_db()
    await hub.init_role_creation()

    user = orm.Role.find(hub.db, "user")
    assert set(user.scopes) == {*scopes, "access:services!service=gpu-gov"}
    assert "custom:gpu-gov:queue" in orm.Role.find(hub.db, "gpu-gov-service").scopes
    hub.db.close()


@pytest.mark.parametrize("section", ["Spawner", "KubeSpawner"])
async def test_server_token_scopes_of_the_admins_own_keep_the_governors(
    make_hub, tmp_path, section
):
    """An admin's own ``server_token_scopes`` (z2jh's ``hub.config``, loaded before the config
    file): add_governor's assignment replaced them (c.Spawner), or was hidden by them
    (c.KubeSpawner): servers then lacked ``access:services!service=gpu-gov`` and every GPU
    report was refused (their GPUs unknown, never idle, never culled). Both are kept."""
    own = ["access:servers!server", "users:activity!user", "read:users:name!user"]
    config = chart_config(tmp_path, {"hub": {"config": {section: {"server_token_scopes": own}}}})
    GpuProfiles.clear_instance()
    hub = make_hub(config)
    hub.user("vic", "vision")
    scopes = hub.spawner("vic").server_token_scopes
    assert set(scopes) == {*own, "access:services!service=gpu-gov"}, scopes


@pytest.mark.parametrize("coroutine", [False, True])
async def test_server_token_scopes_an_admins_function_gives_keep_the_governors(make_hub, coroutine):
    """``server_token_scopes`` may be a function of the spawner (JupyterHub calls it, and
    awaits what it returns): add_governor took ``list()`` of it, a TypeError that stopped the
    Hub's start. What it returns is kept, with the governor's scopes added."""
    own = ["access:servers!server", "users:activity!user", "read:users:name!user"]

    def scopes(spawner):
        return [*own, f"read:users!user={spawner.user.name}"]

    async def scopes_later(spawner):
        return scopes(spawner)

    config = profiles_config()
    config.Spawner.server_token_scopes = scopes_later if coroutine else scopes
    add_governor(config, url="http://hub:10101")
    hub = make_hub(config)
    hub.user("vic", "vision")
    given = hub.spawner("vic").server_token_scopes(hub.spawner("vic"))
    given = await given if asyncio.iscoroutine(given) else given
    assert given == [*own, "read:users!user=vic", "access:services!service=gpu-gov"]


async def test_an_admins_own_spawner_environment_still_tells_servers_where_to_report(make_hub):
    """A config that sets ``c.KubeSpawner.environment`` before add_governor (as z2jh does from
    ``singleuser.extraEnv``): it hid add_governor's ``c.Spawner.environment``, and servers,
    told no governor URL, sent no GPU report at all."""
    config = profiles_config()
    config.KubeSpawner.environment = {"SITE": "x"}
    add_governor(config, url="http://hub:10101")
    hub = make_hub(config)
    hub.user("vic", "vision")

    pod = await admitted_pod(hub.spawner("vic"), {"profile": "h100"})

    assert env_of(pod)["JUPYTER_GPU_GOV_URL"] == "http://hub:10101/services/gpu-gov/"
    assert env_of(pod)["SITE"] == "x"


def test_an_admins_own_profile_list_is_refused_with_what_to_do(tmp_path):
    profiles = [{"display_name": "Data science", "slug": "datascience", "kubespawner_override": {}}]
    with pytest.raises(ValueError) as refused:
        chart_config(tmp_path, {"singleuser": {"profileList": profiles}})
    message = str(refused.value)
    assert "singleuser.profileList" in message and "'datascience'" in message
    assert "leave singleuser.profileList empty" in message
    assert "kubespawner_override" in message


def test_example_config_gives_the_governor_its_policies(monkeypatch):
    """Loaded by the governor (a managed service of that name), the file sets c.GpuGovernor and
    leaves the hub's wiring alone; borrowed servers get the shortest idle limits."""
    monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "gpu-gov")
    config = load_example()
    assert "services" not in config.JupyterHub
    assert "spawner_class" not in config.JupyterHub

    governor = GpuGovernor(config=config)
    assert governor.ip == "0.0.0.0"
    policies = {p.name: p for p in governor.build_policies()}
    assert next(iter(policies)) == "borrowed"
    assert policies["borrowed"].match.labels == {"gpu-gov/borrowed": "true"}
    assert policies["borrowed"].cull_after < policies["default"].cull_after
    assert policies["borrowed"].cull_after == min(p.cull_after for p in policies.values())
    assert all(p.cull_action == "stop-server" for p in policies.values())
    # The same list as the module would validate it.
    assert len(load_policies(config.GpuGovernor.policies)) == len(policies)


# -- a failing Kubernetes API ------------------------------------------------------------------

API_FAULTS = {  # how the hub's read of the nodes fails, and what the refusal then names
    "500": ({"kind": "error", "code": 500}, '(500: an error on the server ("injected")'),
    "dropped": ({"kind": "drop"}, "(ServerDisconnectedError: Server disconnected)"),
    "slow": ({"kind": "slow", "seconds": 3}, "(no answer within 1 s)"),
}


@pytest.mark.parametrize("fault", API_FAULTS)
async def test_a_spawn_the_cluster_cannot_be_counted_for_is_refused_naming_why(
    hub, cluster, pod_api, monkeypatch, fault
):
    """The Kubernetes API fails the hub's read of the cluster's nodes (not RBAC: an error, a
    dropped connection, an answer later than KubeSpawner's request timeout) and there is no
    fresh reading: no GPU is counted free, and the user reads why. Any failure used to fall back
    to c.GpuProfiles.capacity, admitting on numbers the cluster may not have; a slow answer
    held the spawn for as long as it took."""
    monkeypatch.setattr(cluster_module, "RETRY_AFTER_S", 0.0)  # read again at the next spawn
    how, said = API_FAULTS[fault]
    cluster.fail("GET", r"^/api/v1/nodes$", **how)
    hub.user("alice", "vision")
    alice = hub.started(hub.spawner("alice"), {"profile": "h100"})
    alice.k8s_api_request_timeout = 1

    with pytest.raises(GpuRefused) as refused:
        await alice.start()

    message = refused.value.jupyterhub_message
    assert message.startswith("GPU state unknown: the Kubernetes API did not answer the hub's")
    assert said in message and message.endswith("Try again in a few minutes.")
    assert alice._log_name not in pod_api
    assert not any(k.startswith("gpu-gov/") for k in alice.orm_spawner.user_options or {})

    cluster.clear_faults()  # the API is back: the next spawn counts, and starts
    await hub.started(alice, {"profile": "h100"}).start()
    assert pod_api[alice._log_name].status.phase == "Running"


async def test_a_pod_the_api_will_not_create_fails_the_start_saying_so(hub, cluster, pod_api):
    """KubeSpawner lets the client's ApiException through: the user read its HTTP headers."""
    cluster.fail("POST", r"/pods$", code=500)
    hub.user("alice", "vision")
    alice = hub.started(hub.spawner("alice"), {"profile": "h100"})

    with pytest.raises(GpuStartFailed) as failed:
        await alice.start()

    message = failed.value.jupyterhub_message
    assert message.startswith(
        "Your server could not be started: the Kubernetes API answered 500 (an error on the "
        'server ("injected") has prevented the request) when asked for its pod.'
    )
    assert "HTTP response" not in message and "\n" not in message
    assert alice._log_name not in pod_api


async def test_a_start_from_the_line_that_fails_keeps_its_place(
    make_hub, cluster, pod_api, monkeypatch
):
    """Ben waits in line; when his turn comes the API fails to create his pod. Admission had
    taken him out of the line, and the failed start lost his request: he had to queue again, at
    the end. His place is now kept for the line's next start."""
    monkeypatch.setattr(FORECAST, "at", clock.utcnow())  # the governor was heard: a line
    hub = make_hub(profiles_config(capacity={**CAPACITY, "h100": 1}, queue=True))
    hub.user("alice", "vision")
    hub.user("ben", "vision")
    alice, ben = hub.spawner("alice"), hub.spawner("ben")
    await hub.started(alice, {"profile": "h100", "project": "p"}).start()
    assert not (await ben.gpu_enqueue({"profile": "h100", "project": "p"})).allowed
    (queued,) = waiting_requests(hub.db)
    await alice.stop()  # the card frees, as the Hub stops a server
    alice.clear_state()
    alice.orm_spawner.started = None
    hub.db.commit()

    cluster.fail("POST", r"/pods$", code=500)
    ben.clear_state()  # the line starts ben as the Hub does: state cleared, then start()
    with pytest.raises(GpuStartFailed):
        await hub.started(ben, dict(queued.options)).start()
    ben.clear_state()  # the Hub's stop after the failed start
    ben.orm_spawner.started = None
    ben.orm_spawner.state = ben.get_state()
    hub.db.commit()

    (still,) = waiting_requests(hub.db)
    assert (still.server, still.queued_at) == (queued.server, queued.queued_at)
    cluster.clear_faults()
    ben.clear_state()
    await hub.started(ben, dict(queued.options)).start()  # its next turn starts it
    assert pod_api[ben._log_name].status.phase == "Running" and waiting_requests(hub.db) == []


async def test_a_stop_the_api_fails_for_a_while_still_deletes_the_pod(hub, cluster, pod_api):
    """KubeSpawner raised at the first 5xx of a pod delete; JupyterHub then records the server
    stopped (``User.stop``) and the pod, with its GPU, runs on for nobody to delete. The delete
    is tried again, as KubeSpawner tries a request that timed out."""
    hub.user("alice", "vision")
    alice = hub.started(hub.spawner("alice"), {"profile": "h100"})
    await alice.start()
    failing = cluster.fail("DELETE", r"/pods/jupyter-alice$", code=503, times=2)

    await alice.stop(now=True)

    assert failing.hits == 2 and alice._log_name not in pod_api


# -- pods a stop left running ------------------------------------------------------------------


async def left_running(hub: FakeHub, cluster: FakeKubernetes, user: str) -> GpuKubeSpawner:
    """``user``'s GPU server, started, then stopped as JupyterHub's ``User.stop`` does while the
    API fails the pod's delete past the retries: recorded stopped, the pod left running."""
    hub.user(user, "vision")
    spawner = hub.started(hub.spawner(user), {"profile": "h100"})
    await spawner.start()
    spawner.k8s_api_request_retry_timeout = 1
    fault = cluster.fail("DELETE", rf"/pods/{spawner.pod_name}$", code=503)
    with pytest.raises(TimeoutError):
        await spawner.stop()
    fault.times = 0  # (this pod's delete answers again)
    spawner.orm_spawner.started = None
    spawner.clear_state()
    spawner.orm_spawner.state = spawner.get_state()
    hub.db.commit()
    return spawner


async def test_the_card_of_a_pod_a_stop_left_running_is_never_counted_free(make_hub, cluster):
    """A count uses the cluster's last reading while it is fresh (up to ``FRESH_FOR_S``):
    alice's admission read the nodes and pods before her pod was made. Her stop then left the
    pod running (the API failed its delete past the retries), and it is no longer her server's
    for admission to count: counted on that reading, which does not have it, its card was free
    and bob was admitted onto it (his pod Pending; the chart's hub under load). The stop that
    leaves a pod has the next count read the cluster first."""
    config = profiles_config(capacity={})
    config.ClusterGpus.refresh_every = 3600  # no reading ages out within the test
    hub = make_hub(config)
    alice = await left_running(hub, cluster, "alice")
    assert cluster.get("pods", alice.pod_name, alice.namespace)["spec"]["nodeName"] == "h100-0"
    bob = hub.spawner(hub.user("bob", "vision"))
    await bob.gpu_refresh()
    assert bob.gpu_capacity(bob.gpu_usage())["h100"] == 7  # of 8: alice's pod holds one


async def test_a_card_a_stop_gave_back_is_free_for_the_next_spawn(make_hub, cluster):
    """A reading taken while alice's server ran has her pod; once she stopped it is no longer
    the hub's server's, so counted on that reading (fresh for up to ``FRESH_FOR_S``) her card
    was another's and bob, spawning right after, was refused "in use" though it was free. A
    stop has the next count read the cluster again, as a stop that failed does."""
    config = profiles_config(capacity={})
    config.ClusterGpus.refresh_every = 3600  # no reading ages out within the test
    hub = make_hub(config)
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cluster.create("pods", batch_pod("train-a", "nvidia.com/gpu", 7, h100))  # 7 of the 8
    wait_for(lambda: cluster.get("pods", "train-a")["status"]["phase"] == "Running")
    hub.user("alice", "vision")
    alice = hub.started(hub.spawner("alice"), {"profile": "h100", "project": "p"})
    await alice.start()
    await read_again(alice)  # (another spawn's count, say) while her server runs
    await alice.stop()
    alice.orm_spawner.started = None  # as User.stop records it
    hub.db.commit()

    bob = hub.started(hub.spawner(hub.user("bob", "vision")), {"profile": "h100", "project": "p"})
    await bob.start()

    assert cluster.get("pods", bob.pod_name, bob.namespace)["spec"]["nodeName"] == "h100-0"
    assert cluster.get("pods", alice.pod_name, alice.namespace) is None


async def swept_at_once(make_hub, cluster: FakeKubernetes, *users: str):
    """A hub whose sweep takes a left pod at once (``left_pod_grace`` 0), and each of ``users``'
    server whose stop left its pod running (``left_running``): ``(hub, [spawner, ...])``."""
    config = profiles_config()
    config.ClusterGpus.left_pod_grace = 0
    hub = make_hub(config)
    return hub, [await left_running(hub, cluster, user) for user in users]


async def test_the_sweep_deletes_only_the_pod_the_hub_made_and_its_stop_left(make_hub, cluster):
    """The sweep reads the pods the hub's records say a stop left running: alice's, as the hub
    made it, is named and deleted. bob's pod was deleted and another made under its name by
    someone else (copying its labels and annotations): not the one the hub made, never named,
    never deleted. A pod of another namespace under alice's pod's name, with her pod's labels
    and annotations, is not touched either, even when asked for by name."""
    hub, (alice, bob) = await swept_at_once(make_hub, cluster, "alice", "bob")
    made = cluster.get("pods", alice.pod_name, alice.namespace)
    assert recorded(hub)[alice.pod_name] == made["metadata"]["uid"]

    bobs = cluster.get("pods", bob.pod_name, bob.namespace)
    cluster.call(cluster._delete, "pods", bob.namespace, bob.pod_name, 0)
    wait_for(lambda: cluster.get("pods", bob.pod_name, bob.namespace) is None)
    copied = batch_pod(bob.pod_name, "nvidia.com/gpu", 1, {})
    copied["metadata"].update(
        labels=bobs["metadata"]["labels"], annotations=bobs["metadata"]["annotations"]
    )
    cluster.create("pods", copied, namespace=bob.namespace)
    other = batch_pod(alice.pod_name, "nvidia.com/gpu", 1, {})
    other["metadata"].update(
        labels=made["metadata"]["labels"], annotations=made["metadata"]["annotations"]
    )
    other = cluster.create("pods", other, namespace="other")

    handler = SimpleNamespace(db=hub.db, settings=hub.settings)
    found = await left_pods.due(handler, clock.utcnow())
    assert [(f["server"], f["namespace"], f["name"], f["uid"]) for f in found] == [
        ("alice/", alice.namespace, alice.pod_name, made["metadata"]["uid"])
    ]
    assert bob.pod_name not in recorded(hub)  # forgotten: the name holds another pod
    # A delete asked for bob's pod by its uid (a sweep that read it before) spares the new one.
    assert await bob.gpu_delete_pod(bob.namespace, bob.pod_name, bobs["metadata"]["uid"])

    asked = [*found, {**found[0], "namespace": "other", "uid": other["metadata"]["uid"]}]
    answer = await left_pods.delete(handler, asked)
    assert answer["deleted"] == [f"{alice.namespace}/{alice.pod_name}"]
    assert answer["refused"] == [f"other/{alice.pod_name}"]
    wait_for(lambda: cluster.get("pods", alice.pod_name, alice.namespace) is None)
    assert await left_pods.due(handler, clock.utcnow()) == []
    assert recorded(hub) == {}
    assert cluster.get("pods", alice.pod_name, "other") is not None
    assert cluster.get("pods", bob.pod_name, bob.namespace) is not None


def recorded(hub: FakeHub) -> dict[str, str]:
    """The pods the hub's records say a stop left running: name -> uid."""
    return {r.name: r.uid for r in hub.db.execute(select(left_pods.LEFT_PODS))}


async def test_a_left_pod_whose_user_is_deleted_is_swept_and_a_running_servers_never(
    make_hub, cluster
):
    """carol's stop left her pod running; an admin deletes carol (her spawner and its state go
    with her): the pod is still named by the sweep and deleted. dave's pod, left the same way,
    then dave deleted, made again, and started (KubeSpawner meets the old pod, deletes it and
    makes his own under its name): his running server's pod is never named nor deleted."""
    hub, (carol, dave) = await swept_at_once(make_hub, cluster, "carol", "dave")
    carols = cluster.get("pods", carol.pod_name, carol.namespace)
    for name in ("carol", "dave"):
        hub.db.delete(hub.users.pop(name).orm_user)
        hub.db.commit()
    assert hub.db.query(orm.Spawner).count() == 0 and set(recorded(hub)) == {
        carol.pod_name,
        dave.pod_name,
    }
    hub.user("dave", "vision")
    again = hub.started(hub.spawner("dave"), {"profile": "h100"})
    await again.start()
    running = cluster.get("pods", again.pod_name, again.namespace)
    assert again.pod_name == dave.pod_name and running["status"]["phase"] == "Running"

    handler = SimpleNamespace(db=hub.db, settings=hub.settings)
    found = await left_pods.due(handler, clock.utcnow())
    assert [(f["server"], f["name"], f["uid"]) for f in found] == [
        ("carol/", carol.pod_name, carols["metadata"]["uid"])
    ]
    assert recorded(hub) == {carol.pod_name: carols["metadata"]["uid"]}  # dave's forgotten
    asked = [*found, {**found[0], "name": dave.pod_name, "uid": running["metadata"]["uid"]}]
    answer = await left_pods.delete(handler, asked)
    assert answer["deleted"] == [f"{carol.namespace}/{carol.pod_name}"]
    assert answer["refused"] == [f"{dave.namespace}/{dave.pod_name}"]
    wait_for(lambda: cluster.get("pods", carol.pod_name, carol.namespace) is None)
    assert await left_pods.due(handler, clock.utcnow()) == [] and recorded(hub) == {}
    still = cluster.get("pods", again.pod_name, again.namespace)
    assert still["metadata"]["uid"] == running["metadata"]["uid"]
    assert still["status"]["phase"] == "Running" and "deletionTimestamp" not in still["metadata"]


def race_to_make_the_left_pods_table(url: str) -> None:
    """Two hubs on one database (a rolling update's two pods, or a hub and its restart) each
    record a pod a stop left running, the table not made yet; the other makes it between this
    one's look (``checkfirst``) and its CREATE. Both records are kept and neither fails."""
    ours, theirs = (orm.new_session_factory(url)() for _ in range(2))
    raced = []

    def theirs_first(conn, cursor, statement, *args) -> None:
        if statement.strip().startswith(f"CREATE TABLE {left_pods.LEFT_PODS.name}") and not raced:
            raced.append(statement)
            pod = left_pods.left_pod("default", "jupyter-bob", "uid-b", clock.utcnow(), None)
            left_pods.record(theirs, pod, "bob", "")

    event.listen(ours.get_bind(), "before_cursor_execute", theirs_first)
    try:
        pod = left_pods.left_pod("default", "jupyter-alice", "uid-a", clock.utcnow(), "h100")
        left_pods.record(ours, pod, "alice", "")
        assert raced, "the other hub never made the table in between"
        kept = {(r.user, r.name, r.uid) for r in ours.execute(select(left_pods.LEFT_PODS))}
        assert kept == {("alice", "jupyter-alice", "uid-a"), ("bob", "jupyter-bob", "uid-b")}
    finally:
        event.remove(ours.get_bind(), "before_cursor_execute", theirs_first)
        for session in (ours, theirs):
            session.close()
            session.get_bind().dispose()


def test_two_hubs_making_the_left_pods_table_at_once_both_go_on(tmp_path):
    """The second CREATE failed ("table gpu_gov_left_pods already exists"), and with it the
    stop's record of its pod (or the sync's sweep). PostgreSQL's: tests/test_store_postgresql.py."""
    race_to_make_the_left_pods_table(f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}")


async def test_refused_reads_are_said_again_a_day_on_and_forgotten_with_their_pods(
    make_hub, cluster, monkeypatch
):
    """The sweep kept every pod whose read the API refused (RBAC), for the life of the hub,
    pods long gone included, and never warned of one twice. Now a refused pod is warned of
    again a day on while its read is refused; its entry goes once the read is answered (a
    refusal after is warned of at once) or its record goes (the pod gone)."""
    config = profiles_config()
    config.ClusterGpus.left_pod_grace = 0
    hub = make_hub(config)
    alice = await left_running(hub, cluster, "alice")
    for n in range(20):  # pods deleted by hand since their stops: the sweep cannot tell
        pod = left_pods.left_pod(alice.namespace, f"gone-{n}", f"uid-{n}", clock.utcnow(), "h100")
        left_pods.record(hub.db, pod, f"user{n}", "")
    handler = SimpleNamespace(db=hub.db, settings=hub.settings)
    now = [1000.0]
    monkeypatch.setattr(left_pods, "_monotonic", lambda: now[0])
    said: list[str] = []
    seen = logging.Handler(logging.WARNING)
    seen.emit = lambda record: said.append(record.getMessage())
    monkeypatch.setattr(left_pods.log, "handlers", [*left_pods.log.handlers, seen])

    def refusals() -> list[str]:
        return [line for line in said if "is not swept while the Kubernetes API refuses" in line]

    refused = cluster.fail("GET", r"/pods/(jupyter-alice|gone-\d+)$", code=403)
    for _ in range(3):
        assert await left_pods.due(handler, clock.utcnow()) == []
    assert refused.hits == 3 * 21 and len(refusals()) == 21  # once a pod
    now[0] += left_pods.REFUSED_SAID_AGAIN_S
    assert await left_pods.due(handler, clock.utcnow()) == []
    assert len(refusals()) == 2 * 21  # a day on, again
    # Records another hub's sweep (or an admin) removed: their refusals are not kept either.
    hub.db.execute(
        sql_delete(left_pods.LEFT_PODS).where(left_pods.LEFT_PODS.c.name.like("gone-1%"))
    )
    hub.db.commit()
    assert await left_pods.due(handler, clock.utcnow()) == []
    assert len(left_pods._sweeper(handler).refused) == 21 - 11

    refused.times = 0  # granted: the reads are answered, the gone pods' records go
    [found] = await left_pods.due(handler, clock.utcnow())
    assert found["name"] == alice.pod_name and set(recorded(hub)) == {alice.pod_name}
    sweep = left_pods._sweeper(handler)
    assert sweep.refused == {}  # nothing kept of pods gone, nor of reads answered
    cluster.fail("GET", rf"/pods/{alice.pod_name}$", code=403)  # revoked: said at once
    assert await left_pods.due(handler, clock.utcnow()) == []
    assert len(refusals()) == 2 * 21 + 1 and list(sweep.refused) == [
        (alice.namespace, alice.pod_name)
    ]


async def test_the_sweep_backs_off_while_the_api_fails_and_says_so_once(
    make_hub, cluster, monkeypatch
):
    """While the API fails the sweep's reads, a sync reads no pod but at 10 s, 20 s, 40 s...
    after the last failure, at most 160 s apart, not at every sync; the Hub's log warns once an
    outage. Once a read is answered, the next sync reads again, and the pod is named."""
    config = profiles_config()
    config.ClusterGpus.left_pod_grace = 0
    hub = make_hub(config)
    alice = await left_running(hub, cluster, "alice")
    handler = SimpleNamespace(db=hub.db, settings=hub.settings)
    now = [1000.0]
    monkeypatch.setattr(left_pods, "_monotonic", lambda: now[0])
    said: list[logging.LogRecord] = []
    seen = logging.Handler(logging.INFO)
    seen.emit = said.append
    monkeypatch.setattr(left_pods.log, "handlers", [*left_pods.log.handlers, seen])
    monkeypatch.setattr(left_pods.log, "level", logging.INFO)

    def warned() -> list[str]:
        return [r.getMessage() for r in said if r.levelno >= logging.WARNING]

    failing = cluster.fail("GET", rf"/pods/{alice.pod_name}$", code=503)
    reads = []
    for pause in (10, 20, 40, 80, 160, 160, 160):
        for _ in range(5):  # syncs meanwhile: none reads
            assert await left_pods.due(handler, clock.utcnow()) == []
        reads.append(failing.hits)
        now[0] += pause - 0.5
        assert await left_pods.due(handler, clock.utcnow()) == []
        assert failing.hits == reads[-1]  # not yet
        now[0] += 0.5
    assert reads == [1, 2, 3, 4, 5, 6, 7]
    [warning] = warned()
    assert "failed the read of the pod" in warning and "in 10 s" in warning
    assert '503: an error on the server ("injected")' in warning, warning

    failing.times = 0  # the API answers again
    [found] = await left_pods.due(handler, clock.utcnow())
    assert found["name"] == alice.pod_name
    assert any("answers the sweep of pods stops left running again" in r.getMessage() for r in said)
    again = cluster.fail("GET", rf"/pods/{alice.pod_name}$", code=503)
    assert await left_pods.due(handler, clock.utcnow()) == [] and again.hits == 1  # no pause
    assert len(warned()) == 2  # a new outage, said once more

    # A read refused (RBAC: a 403) is not an outage: no back-off, and the admin told once.
    again.times = 0
    now[0] += left_pods.BACKOFF_MOST_S
    refused = cluster.fail("GET", rf"/pods/{alice.pod_name}$", code=403)
    for _ in range(3):
        assert await left_pods.due(handler, clock.utcnow()) == []
    assert refused.hits == 3  # read at every sync
    assert len(warned()) == 3 and "is not swept while the Kubernetes API refuses" in warned()[-1]


async def test_a_name_holding_nul_is_refused_before_admission_and_holds_nothing(hub, pod_api):
    """A server named ``a\\0b`` (JupyterHub 4.1-5.x took it; JupyterHub 6 starts what it kept)
    or a user whose name holds NUL (a Hub on SQLite keeps one): the name goes into the pod's
    environment, which no container can be given, so the pod never started; it was admitted
    and counted all the same, and held its GPU until KubeSpawner's start timed out ("did not
    start in 120 seconds"), a timeout the user read with no reason. Refused at once now, saying
    why, before admission: no pod, nothing counted; the next spawn is admitted as ever. A name
    holding another control character starts, its labels valid, its annotation as it is."""
    hub.user("alice", "vision")
    hub.user("c\0arol", "vision")
    for user, name in (("alice", "a\0b"), ("alice", "esc\x1b[31m\n"), ("alice", "gpu")):
        hub.db.add(orm.Spawner(user=hub.users[user].orm_user, name=name))  # as JupyterHub 5 kept
    hub.db.commit()
    for user, name, whose in (("alice", "a\0b", "server"), ("c\0arol", "", "user")):
        spawner = hub.started(hub.users[user].get_spawner(name), {"profile": "h100"})
        with pytest.raises(GpuRefused) as refused:
            await asyncio.wait_for(spawner.start(), 30)  # at once, not after start_timeout
        said = refused.value.jupyterhub_message
        assert f"This {whose}'s name" in said and "NUL" in said and "can never start" in said
        assert "\0" not in said and "\\x00" in said
        assert "gpu-gov/tier" not in spawner.user_options and len(pod_api) == 0
    odd = hub.started(hub.users["alice"].get_spawner("esc\x1b[31m\n"), {"profile": "h100"})
    await odd.start()
    pod = pod_api["alice:esc\x1b[31m\n"]
    assert all(LABEL_VALUE.match(value) for value in pod.metadata.labels.values())
    assert pod.metadata.annotations["hub.jupyter.org/servername"] == "esc\x1b[31m\n"
    assert ownership(pod)[1]["gpu-gov/user"] == "alice"
    gpu = hub.started(hub.users["alice"].get_spawner("gpu"), {"profile": "h100"})
    await gpu.start()  # the refused ones held nothing: alice's second card is hers
    assert pod_api["alice:gpu"].status.phase == "Running"


async def test_a_pod_read_out_of_a_pods_shape_is_left_alone_and_the_others_are_swept(
    make_hub, cluster
):
    """The API's answer for one recorded pod out of a pod's shape (a list, a null metadata,
    annotations that are a list, JSON that does not parse: a broken API server or a proxy)
    raised out of the sweep: no left pod was named, alice's included, at every sync while it
    lasted. Such a pod is left alone (recorded still, read again at the next sync) and the
    others are read; a node name no node could have (10 MB) is left out of what the governor
    is told, and audits."""
    hub, spawners = await swept_at_once(make_hub, cluster, "alice", "bob", "carol", "dan", "eve")
    alice, bob, carol, dan, eve = spawners
    eves = cluster.get("pods", eve.pod_name, eve.namespace)
    dans = cluster.get("pods", dan.pod_name, dan.namespace)
    odd = {
        bob: "[]",
        carol: json.dumps({"metadata": None, "spec": {}}),
        dan: json.dumps({**dans, "metadata": {**dans["metadata"], "annotations": []}}),
        eve: json.dumps({**eves, "spec": {**eves["spec"], "nodeName": "n" * 10_000_000}}),
    }
    for spawner, body in odd.items():
        cluster.fail("GET", rf"/pods/{spawner.pod_name}$", "answer", code=200, body=body)
    cluster.fail("GET", rf"/pods/{alice.pod_name}$", "answer", code=200, body="[" * 100_000)
    handler = SimpleNamespace(db=hub.db, settings=hub.settings)
    found = await left_pods.due(handler, clock.utcnow())
    assert {(f["name"], f["node"]) for f in found} == {(eve.pod_name, None)}
    cluster.clear_faults()
    found = await left_pods.due(handler, clock.utcnow())
    assert {f["name"] for f in found} == {s.pod_name for s in spawners}
    assert {f["node"] for f in found if f["name"] == eve.pod_name} == {eves["spec"]["nodeName"]}
