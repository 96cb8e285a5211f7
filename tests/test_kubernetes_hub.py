"""jupyter-gpu-gov on Kubernetes, end to end: the documented z2jh values loaded through the
chart's own jupyterhub_config.py by a real JupyterHub, the real KubeSpawner creating pods through
the HTTP API of tests/fake_k8s_api.py (schemas checked, pods scheduled on its nodes and run as
local processes: real single-user servers with the server extension), and the governor as the
chart's hub pod runs it.

The cluster: a CPU node, an HGX node of the "h100-singles" pool with 2 H100s (so the h100 tier
has 2 cards) and a node of the pairs pool without free cards. The governor loads the documented
file with test timers (seconds, not hours). One test-only team, "interns", borrows H100s.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import requests
import z2jh_harness as z2jh
from fake_k8s_api import FakeKubernetes, cpu_node, gpu_node
from governor_harness import SINGLEUSER_CONFIG, Gov, free_port, kernel_with, server_running, wait
from hub_harness import MARKER_ENV, HubHarness

EXAMPLE = Path(__file__).resolve().parent.parent / "hub_config" / "kubernetes"
NAMESPACE = "jhub"
POOL = "node.example.org/gpu-pool"
NODES = [
    cpu_node("cpu-0"),
    gpu_node("hgx-0", "NVIDIA-H100-80GB-HBM3", gpus=2, labels={POOL: "h100-singles"}),
    gpu_node("hgx-pairs", "NVIDIA-H100-80GB-HBM3", gpus=0, labels={POOL: "h100-pairs"}),
]

# The labels (and annotations) of alice's h100 pod for her team vision's project detection:
# hers, the tier's (3 days at most; its first and only task type) and the grant's.
ALICE_H100_LABELS = {
    "gpu-gov/user": "alice",
    "gpu-gov/team": "vision",
    "gpu-gov/project": "detection",
    "gpu-gov/tier": "h100",
    "gpu-gov/borrowed": "false",
    "gpu-gov/weight": "1",
    "gpu-gov/max-age": str(3 * 86400),
    "gpu-gov/task-type": "interactive",
}
GOVERNOR_TIMERS = """
exec(compile(open({example!r}).read(), "gpu-gov.py", "exec"))  # the documented file, as it is
c.GpuGovernor.cull_every = 0.5
c.GpuGovernor.report_stale_after = 60
c.GpuGovernor.proxy_url = {proxy!r}
# The pods' CPU from the fake's metrics-server (a CPU stage: 2 s at half a core or more).
c.GpuGovernor.kubernetes_api_url = {api!r}
c.GpuGovernor.cpu_stage_after = 2
c.GpuGovernor.policy_defaults = {{
    "warn_after": "3s", "cull_after": "6s", "user_activity_grace": "1s", "busy_grace": "4s",
    "away_after": "1s", "extension_step": "60s", "max_extensions": 1, "checkpoint": False,
    "reclaim_grace": "3s",
}}
# The reclaim test's servers are not idle-culled meanwhile: only a reclaim stops them.
c.GpuGovernor.policies = [
    {{"name": "patient", "match": {{"users": ["ivan", "vera", "vic"]}},
      "warn_after": "1h", "cull_after": "2h", "away_after": "1h"}},
    # cora's CPU stage: noticed at busy_grace, warned at busy_limit, culled 5 s later.
    {{"name": "cpu-stage", "match": {{"users": ["cora"]}}, "warn_after": "10s",
      "cull_after": "15s", "busy_grace": "20s", "busy_limit": "45s"}},
]
"""
TEST_CONFIG = """
c.KubeSpawner.k8s_api_host = {api!r}
# A server's start on a loaded 2-core machine has taken over 60 s (the fake kubelet starts a
# real server): no test here is about the start's timeout.
c.KubeSpawner.start_timeout = 120
c.KubeSpawner.http_timeout = 120
c.ClusterGpus.refresh_every = 3600  # one reading of the cluster: the Pending test needs it stale
c.GpuProfiles.quotas["interns"] = {{"borrowing_limit": {{"h100": 1}}, "tiers": ["h100"]}}
c.GpuProfiles.team_map = {{"ivan": "interns"}}
c.GpuProfiles.require_project = False

def _no_reports_for_dave(spawner):
    if spawner.user.name in ("dave", "cora"):  # a server without the extension's reports
        spawner.environment["JUPYTER_GPU_GOV_URL"] = ""

c.KubeSpawner.pre_spawn_hook = _no_reports_for_dave
"""


@pytest.fixture(scope="module")
def k8s(tmp_path_factory):
    with FakeKubernetes(NODES, workdir=tmp_path_factory.mktemp("k8s")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def hub(k8s, tmp_path_factory):
    with z2jh_hub(k8s, tmp_path_factory) as harness:
        yield harness


@contextlib.contextmanager
def z2jh_hub(
    k8s: FakeKubernetes, tmp_path_factory, extra_config: str = "", governor_config: str = ""
):
    """The chart's hub on ``k8s``, the documented values with the test's (``extra_config``:
    more of the hub's configuration; ``governor_config``: more of the governor's), its admin and
    team vision set up."""
    work = tmp_path_factory.mktemp("hub")
    root = work / "z2jh"
    governor_port = free_port()
    wrapper = work / "gpu-gov-test.py"
    kubeconfig = k8s.kubeconfig(work / "kubeconfig", NAMESPACE)
    singleuser = work / "singleuser-config"  # the image's jupyter_server_config.py: test timers
    singleuser.mkdir()
    (singleuser / "jupyter_server_config.py").write_text(SINGLEUSER_CONFIG)
    harness: HubHarness | None = None

    def launch(harness_config: str) -> Path:
        wrapper.write_text(
            GOVERNOR_TIMERS.format(
                example=str(root / "jupyterhub_config.d" / "gpu-gov.py"),
                proxy=harness.url,
                api=k8s.url,
            )
            + governor_config
        )
        test_values = {
            "hub": {
                "extraEnv": {
                    "GPU_GOV_CONFIG_FILE": str(wrapper),
                    "GPU_GOV_URL": f"http://127.0.0.1:{governor_port}",
                    "GPU_GOV_DB_URL": f"sqlite:///{work / 'gpu-gov.sqlite'}",
                    "GPU_GOV_PROMETHEUS_URL": f"{k8s.url}/prometheus",
                    "KUBECONFIG": str(kubeconfig),
                },
                "extraConfig": {
                    "zz-test-harness": z2jh.as_extra_config(harness_config),
                    "zz-test-k8s": TEST_CONFIG.format(api=k8s.url) + extra_config,
                },
            },
            # The kubelet here runs as root: the server must be told it may.
            "singleuser": {
                "cmd": ["jupyterhub-singleuser", "--allow-root"],
                "extraEnv": {
                    "JUPYTER_GPU_GOV_BACKEND": "simulated",
                    "JUPYTER_GPU_GOV_SIM_STATE": str(work / "sim-gpus.json"),
                    "JUPYTER_CONFIG_PATH": str(singleuser),
                    MARKER_ENV: harness.marker,
                },
            },
        }
        values = z2jh.load_values(EXAMPLE / "values.yaml", test_values)
        z2jh.set_file(values, "hub.extraFiles.gpu-gov.stringData", EXAMPLE / "jupyterhub_config.py")
        env = z2jh.hub_env(values, root, NAMESPACE, ports={"hub": 8081, "proxy-api": 8001})
        harness.hub_env.update(env)
        return z2jh.render(root, values, NAMESPACE)

    harness = HubHarness(
        workdir=work, spawner_config=False, launch=launch, users=["govadmin"], timeout=120
    )
    # A spawn that fails quotes the fake API's record of the user's pod, and the pod's output.
    harness.evidence_from.append(lambda user, _server: k8s.evidence(f"jupyter-{user}"))
    with harness:
        # The documented file makes the Hub group gpu-admins the governor's admins.
        harness.api("POST", "groups/gpu-admins/users", json={"users": ["govadmin"]})
        add_team_vision(harness)
        Gov(harness).wait_up(90)
        yield harness


def add_team_vision(hub: HubHarness) -> None:
    """The team every test's users belong to (ivan, an intern, excepted): set up with the Hub,
    so that each test holds when it runs alone."""
    for user in ("alice", "bob", "cora", "dave", "ivan", "vera", "vic"):
        hub.create_user(user)
    hub.api("POST", "groups/vision", json={})
    hub.api("PUT", "groups/vision/properties", json={"gpu-gov/team": True})
    r = hub.api(
        "POST",
        "groups/vision/users",
        json={"users": ["alice", "bob", "cora", "dave", "vera", "vic"]},
    )
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def pod_of(k8s: FakeKubernetes, user: str) -> dict | None:
    return k8s.get("pods", f"jupyter-{user}", NAMESPACE)


def spawn(hub: HubHarness, user: str, options: dict) -> requests.Response:
    hub.create_user(user)
    return hub.api("POST", f"users/{user}/server", json=options)


def audit_actions(gov: Gov, key: str) -> list[str]:
    return gov.actions(key)


def progress(hub: HubHarness, user: str, until: str) -> list[str]:
    """The spawn page's progress messages for ``user``'s server (the Hub's event stream),
    read until one contains ``until`` or the spawn ends."""
    seen = []
    with hub.session.get(
        f"{hub.hub_api_url}/users/{user}/server/progress",
        headers={"Authorization": f"token {hub.token(user)}"},
        stream=True,
        timeout=60,
    ) as stream:
        for line in stream.iter_lines(decode_unicode=True):
            if line.startswith("data:"):
                event = json.loads(line[5:])
                seen.append(event.get("message") or "")
                if until in seen[-1] or event.get("failed") or event.get("ready"):
                    break
    return seen


def test_a_tier_spawns_a_pod_that_is_governed_and_culled(hub, gov, k8s):
    hub.start_server("alice", options={"profile": "h100", "project": "detection"})

    pod = pod_of(k8s, "alice")
    spec, labels = pod["spec"], pod["metadata"]["labels"]
    (notebook,) = spec["containers"]
    assert notebook["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        POOL: "h100-singles",
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["nodeName"] == "hgx-0" and pod["status"]["phase"] == "Running"
    assert {k: v for k, v in labels.items() if k.startswith("gpu-gov/")} == ALICE_H100_LABELS
    assert labels["hub.jupyter.org/network-access-hub"] == "true"  # the chart's, kept
    assert len(k8s.pod_devices(NAMESPACE, "jupyter-alice")) == 1
    # Everything KubeSpawner sent passed the API server's checks (schemas, names, labels).
    assert k8s.rejected == []
    sent = {plural for verb, plural, _ in k8s.received if verb == "create"}
    assert {"pods", "persistentvolumeclaims"} <= sent

    # Governed: the server's reports reach the governor, which knows the tier and team...
    tab = kernel_with(hub, "alice", "from jupyter_gpu_gov import simulate; simulate.hold(4096)")
    try:
        # DCGM may see the pod idle before its first report arrives: wait for the report.
        server = wait(
            lambda: (s := gov.admin("GET", "users/alice/server").json())["gpu"] and s,
            60,
            "the pod's first report",
        )
        assert (server["tier"], server["team"], server["project"]) == (
            "h100",
            "vision",
            "detection",
        )
        assert server["gpu"]["backend"] == "simulated"  # the pod's own reports
        # ... and culls the idle GPU: KubeSpawner deletes the pod, its GPU is free again.
        wait(lambda: pod_of(k8s, "alice") is None, 90, "the pod to be deleted")
    finally:
        tab.close()
    actions = audit_actions(gov, "alice/")
    assert actions.index("warn") < actions.index("cull")
    assert k8s.pod_devices(NAMESPACE, "jupyter-alice") == []
    reasons = [e["reason"] for e in k8s.events_for("jupyter-alice", NAMESPACE)]
    assert reasons[:2] == ["Scheduled", "Started"]


def test_a_pod_stays_pending_when_no_node_has_room_and_the_user_sees_why(hub, k8s):
    """A batch job of the namespace takes both H100s after the hub last read the cluster: the
    hub admits, the scheduler cannot place the pod, and the spawn page says why."""
    batch = {
        "metadata": {"name": "batch-train", "labels": {"app": "trainer"}},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "trainer",
                    "command": ["sleep", "600"],
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }
            ],
            "nodeSelector": {POOL: "h100-singles"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }
    # A stop still under way (the cull of the test before) makes the next look read the
    # cluster again, wherever it comes: after the batch job, bob would be refused, not Pending.
    wait(lambda: not any(server_running(hub, u) for u in ("alice", "dave")), 120, "stops to end")
    # bob opens the spawn page first: the hub reads the cluster (both H100s free) and keeps it.
    page = hub.login("bob").get(hub.spawn_page_url("bob"), timeout=60)
    assert page.status_code == 200 and "H100 80 GB" in page.text, page.text[:500]
    k8s.create("pods", batch, NAMESPACE)
    try:
        wait(
            lambda: k8s.get("pods", "batch-train", NAMESPACE)["status"]["phase"] == "Running",
            30,
            "the batch job to run",
        )
        assert spawn(hub, "bob", {"profile": "h100", "project": "x"}).status_code == 202
        seen = progress(hub, "bob", "Insufficient nvidia.com/gpu")
        assert "0/3 nodes are available" in seen[-1] and "1 Insufficient nvidia.com/gpu" in seen[-1]
        assert pod_of(k8s, "bob")["status"]["phase"] == "Pending"
        hub.stop_server("bob", timeout=60)
        wait(lambda: pod_of(k8s, "bob") is None, 30, "the pending pod to go")
    finally:
        k8s.call(k8s._delete, "pods", NAMESPACE, "batch-train", 0)
    wait(lambda: k8s.get("pods", "batch-train", NAMESPACE) is None, 30, "the batch job to go")


def test_dcgm_only_governance_finds_the_pod(hub, gov, k8s):
    """dave's server sends no report: the governor finds its pod through KubeSpawner's state,
    and DCGM's series for the pod (Prometheus, pod labels kept) say its GPU is idle."""
    hub.start_server("dave", options={"profile": "h100", "project": "y"})
    assert len(k8s.pod_devices(NAMESPACE, "jupyter-dave")) == 1
    verdict = wait(lambda: "DCGM" in (gov.verdict("dave").get("reason") or "") and gov.verdict("dave"), 60, "DCGM's verdict")  # fmt: skip
    assert verdict["state"] in ("idle", "warned")
    wait(lambda: pod_of(k8s, "dave") is None, 90, "dave's pod to be deleted")
    assert "cull" in audit_actions(gov, "dave/")


def test_a_cpu_stage_without_the_extension_is_noticed_not_culled_then_held_to_its_limit(
    hub, gov, k8s
):
    """cora's server sends no report (no extension) and DCGM reads its GPU idle, while its
    container burns 3 cores, as metrics-server reads it (a CPU stage). Without that reading it
    is culled at busy_grace (20 s, as dave's is at his); with it, it is listed busy with a
    notice naming the cause past busy_grace, warned at busy_limit (45 s) and culled after the
    notice (5 s)."""
    k8s.set_pod_cpu(NAMESPACE, "jupyter-cora", 3.0)
    hub.start_server("cora", options={"profile": "h100", "project": "y"})
    assert len(k8s.pod_devices(NAMESPACE, "jupyter-cora")) == 1
    busy = wait(lambda: (v := gov.verdict("cora"))["state"] == "busy" and v, 90, "the notice")
    assert "the server's CPU is busy while its GPU idles (a CPU stage?)" in busy["reason"]
    assert "press Extend" in busy["reason"]
    assert pod_of(k8s, "cora") is not None  # past busy_grace: not culled
    actions = audit_actions(gov, "cora/")
    assert "busy-notice" in actions and "cull" not in actions
    wait(lambda: pod_of(k8s, "cora") is None, 120, "cora's pod to be deleted at busy_limit")
    actions = audit_actions(gov, "cora/")
    assert actions.index("busy-notice") < actions.index("warn") < actions.index("cull")
    culled = gov.verdict("cora")
    assert "past the busy limit of 45s" in (culled.get("reason") or ""), culled
    wait(lambda: not hub.api("GET", "users/cora").json()["servers"], 60, "cora's stop to end")


def test_a_borrowed_server_is_reclaimed(hub, gov, k8s):
    """An intern borrows an H100 (no guarantee of their own); vision, within its guarantee,
    needs both cards: the borrowed server is asked back, warned and stopped, its pod deleted."""
    hub.start_server("ivan", options={"profile": "h100"})
    assert pod_of(k8s, "ivan")["metadata"]["labels"]["gpu-gov/borrowed"] == "true"
    hub.start_server("vera", options={"profile": "h100", "project": "detection"})
    assert spawn(hub, "vic", {"profile": "h100", "project": "x"}).status_code == 202
    refused = progress(hub, "vic", "being taken back")[-1]
    assert "Team vision is within its guarantee" in refused and "being taken back" in refused
    wait(lambda: pod_of(k8s, "ivan") is None, 90, "the borrowed pod to be deleted")
    # The Hub's stop ends once KubeSpawner's watch sees the pod gone: ivan's grant goes then.
    wait(lambda: not hub.api("GET", "users/ivan").json()["servers"], 60, "ivan's stop to end")
    actions = audit_actions(gov, "ivan/")
    assert "reclaim-warn" in actions and "cull" in actions
    assert pod_of(k8s, "vera")["status"]["phase"] == "Running"  # within the guarantee: kept
    hub.start_server("vic", options={"profile": "h100", "project": "x"})
    assert pod_of(k8s, "vic")["spec"]["nodeName"] == "hgx-0"
    for user in ("vera", "vic"):
        hub.stop_server(user, timeout=60)
        wait(lambda user=user: pod_of(k8s, user) is None, 30, f"{user}'s pod to go")


def test_prometheus_reads_the_governors_metrics_with_the_token_the_values_ask_for(hub):
    """docs/kubernetes.md, step 4: the ServiceMonitor scrapes /services/gpu-gov/metrics through
    the proxy with the token the chart made for values.yaml's hub.services.gpu-gov-metrics
    (its Secret "hub"). The documented token had read:metrics alone, which the governor refused
    (no access scope: "authenticate with a JupyterHub token")."""
    secret = hub.workdir / "z2jh" / "secret" / "hub.services.gpu-gov-metrics.apiToken"
    token = secret.read_text()

    r = requests.get(
        f"{hub.url}/services/gpu-gov/metrics",
        headers={"Authorization": f"token {token}"},
        timeout=30,
        allow_redirects=False,
    )

    assert r.status_code == 200, r.text[:300]
    assert "jupyter_gpu_gov_reconcile_duration_seconds" in r.text


def test_the_values_lead_and_finance_read_showback(hub, gov):
    """values.yaml's lead (carol, vision's: the governor's scope filtered to the group vision)
    and finance roles load in the chart's hub: carol reads vision's usage and is refused
    another team's, naming the scope; a member of the group finance reads every team's."""
    hub.create_user("fran")
    r = hub.api("POST", "groups/finance/users", json={"users": ["fran"]})  # the role made it
    assert r.status_code == 200, r.text
    # (a 503 until the governor's first pass has read the Hub's groups)
    lead = wait(
        lambda: (
            (r := gov.call("GET", "usage?team=vision", hub.token("carol"))).status_code != 503 and r
        ),
        60,
        "the governor to read the Hub's groups",
    )
    assert lead.status_code == 200, lead.text[:300]
    other = gov.call("GET", "usage?team=nlp", hub.token("carol"))
    assert other.status_code == 403 and "custom:gpu-gov:showback!group=nlp" in other.text
    assert gov.call("GET", "usage?team=nlp", hub.token("fran")).status_code == 200


def test_the_cluster_report_tells_a_pair_on_cards_split_across_nodes(tmp_path_factory, capsys):
    """The pairs pool: three nodes with 1, 1 and 2 H100s, another namespace's job holding the
    two on the third (1 + 1 free). fay's pair is admitted (the tier counts 2 free cards) and
    its pod stays Pending: no node has two; gus's pair is refused (fay's holds the tier). The
    cluster report said "no" (DCGM sees a free card: "not fragmentation") or, without DCGM,
    "unknown"; from the nodes the hub's admission reads it says the pair is blocked by
    fragmentation (2 free in all, at most 1 on a node): GET api/diagnosis and
    ``jupyter-gpu-gov diagnose --cluster``."""
    from jupyter_gpu_gov import cli

    pairs = {POOL: "h100-pairs"}
    nodes = [
        cpu_node("cpu-0"),
        *(gpu_node(f"pairs-{i}", "NVIDIA-H100-80GB-HBM3", gpus=n, labels=pairs) for i, n in enumerate((1, 1, 2))),
    ]  # fmt: skip
    job = {
        "metadata": {"name": "pair-job", "labels": {"app": "trainer"}},
        "spec": {
            "containers": [
                {"name": "train", "image": "t", "command": ["sleep", "600"],
                 "resources": {"limits": {"nvidia.com/gpu": "2"}}}
            ],
            "nodeSelector": {"kubernetes.io/hostname": "pairs-2"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }  # fmt: skip
    with FakeKubernetes(nodes, workdir=tmp_path_factory.mktemp("k8s-pairs")) as k8s:
        k8s.create("pods", job, "ml-team")
        wait(
            lambda: k8s.get("pods", "pair-job", "ml-team")["status"]["phase"] == "Running",
            30,
            "the job",
        )
        with z2jh_hub(k8s, tmp_path_factory) as hub:
            gov = Gov(hub)
            for user in ("fay", "gus"):
                hub.create_user(user)
            r = hub.api("POST", "groups/vision/users", json={"users": ["fay", "gus"]})
            assert r.status_code == 200, r.text
            assert spawn(hub, "fay", {"profile": "h100x2"}).status_code == 202
            seen = progress(hub, "fay", "Insufficient nvidia.com/gpu")
            assert "Insufficient nvidia.com/gpu" in seen[-1], seen
            assert spawn(hub, "gus", {"profile": "h100x2"}).status_code == 202
            refused = progress(hub, "gus", "in use")[-1]
            assert "in use" in refused, refused

            def blocked():
                found = gov.admin("GET", "diagnosis").json()["fragmentation"]
                return (found["nodes"] or {}).get("requests") and found

            found = wait(blocked, 60, "the governor's report of the waiting pair")
            nodes_said = found["nodes"]
            assert found["flag"] is True and nodes_said["unknown"] is None, found
            assert nodes_said["fragmentation"] == 1, nodes_said
            pair = next(r for r in nodes_said["requests"] if r["blocked_by"] == "fragmentation")
            assert (pair["tier"], pair["needs"], pair["free"], pair["most_on_a_node"]) == (
                "h100x2", 2, 2, 1
            )  # fmt: skip
            assert cli.main(
                ["diagnose", "--cluster", "--url", f"{hub.url}/services/gpu-gov/",
                 "--token", hub.token("govadmin")]
            ) == 0  # fmt: skip
            text = " ".join(capsys.readouterr().out.split())
            assert "fragmentation: YES — on the cluster's nodes" in text, text
            assert "for h100x2 (2 x nvidia.com/gpu on one node): blocked by fragmentation" in text
            assert "2 free on its 3 nodes, at most 1 on one" in text
            hub.stop_server("fay", timeout=60)
