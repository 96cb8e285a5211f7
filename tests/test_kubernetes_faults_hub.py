"""The hub on Kubernetes while its API fails: the chart's hub and governor of
tests/test_kubernetes_hub.py, the real KubeSpawner, and the faults tests/fake_k8s_api.py injects
on chosen paths (an error status, a slow answer).

- A spawn whose GPUs cannot be counted (the nodes cannot be read, and there is no fresh reading)
  is refused with the API's failure named, never admitted on numbers the cluster may not have;
  once the API answers, the same spawn starts, though the hub's first list of its pods failed
  too (KubeSpawner kept that watch of the pods, which never watched: the start waited for its
  pod until start_timeout).
- A pod create answered too late is retried by KubeSpawner (its first create was carried out:
  409, then a delete and a create): the server is counted once, and the other card stays free.
- A start from the line whose pod the API will not create keeps its place, and starts from the
  line once the API is back.
- An admin's cull whose pod delete the API fails goes on being tried while the governor culls
  another server, and deletes the pod once the API answers (KubeSpawner gave up at the first 5xx,
  and JupyterHub recorded the server stopped with its pod running).

A stop whose pod delete the API fails past those retries (the pod left running, and swept) is
tests/test_kubernetes_left_pods_hub.py's: there the retries run out sooner, and the two files
share CI's workers.

The cluster: 2 H100s. Only vera, vic and ivan are spared the test timers' idle culls.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from fake_k8s_api import FakeKubernetes
from governor_harness import Gov, join, queue_line, wait
from test_kubernetes_hub import NAMESPACE, NODES, pod_of, progress, spawn, z2jh_hub

from jupyter_gpu_gov.core.clock import parse

pytestmark = pytest.mark.timeout(600)

NODES_PATH = r"^/api/v1/nodes$"
PODS_PATH = rf"^/api/v1/namespaces/{NAMESPACE}/pods$"
H100 = {"profile": "h100", "project": "detection"}
# A start from the line that failed is tried again after this (the governor's
# queue_retry_after; a minute by default): the line's test waits it out.
QUEUE_RETRY_S = 10


@pytest.fixture(scope="module")
def k8s(tmp_path_factory):
    with FakeKubernetes(NODES, workdir=tmp_path_factory.mktemp("k8s")) as cluster:
        # From the start: the hub has never read the nodes (KubeSpawner itself never does).
        cluster.fail("GET", NODES_PATH, code=500)
        yield cluster


@pytest.fixture(scope="module")
def hub(k8s, tmp_path_factory):
    # KubeSpawner's retries outlast the cull test's outage (vic's delete tried while vera is
    # culled); the left pods' file, whose stops wait them out, has them shorter.
    extra = (
        "c.GpuProfiles.queue = True\nc.KubeSpawner.k8s_api_request_retry_timeout = 60\n"
        "c.ClusterGpus.left_pod_grace = 1\n"
    )
    governor = f"c.GpuGovernor.queue_retry_after = {QUEUE_RETRY_S}\n"
    with z2jh_hub(k8s, tmp_path_factory, extra, governor) as harness:
        yield harness


@pytest.fixture(autouse=True)
def api_back(k8s):
    yield
    k8s.clear_faults()


def said(hub, user: str, what: str) -> str:
    """The spawn page's last message for ``user`` once it holds ``what`` (the stream of a spawn
    that already failed may be read before the Hub has its outcome)."""
    return wait(
        lambda: (seen := progress(hub, user, what)) and what in seen[-1] and seen[-1],
        60,
        f"{user}'s spawn page to say {what!r}",
    )


def running(hub, user: str) -> bool:
    return bool(hub.api("GET", f"users/{user}").json().get("servers", {}).get("", {}).get("ready"))


def test_a_spawn_the_cluster_cannot_be_counted_for_is_refused_until_the_api_answers(hub, k8s):
    # The hub's first list of its pods (the refused spawn's cleanup polls) fails as well.
    first_list = k8s.fail("GET", PODS_PATH, code=500, times=1)
    assert spawn(hub, "vera", H100).status_code == 202  # the spawn page's stream says how
    message = said(hub, "vera", "GPU state unknown")
    assert (
        "GPU state unknown: the Kubernetes API did not answer the hub's count of the cluster's "
        'GPUs (500: an error on the server ("injected") has prevented the request)'
    ) in message
    assert "Traceback" not in message and pod_of(k8s, "vera") is None
    wait(lambda: not hub.api("GET", "users/vera").json()["servers"], 60, "the spawn to end")

    k8s.clear_faults()  # the API answers again: read within 5 s, and the same spawn starts
    form = hub.login("vera")
    wait(
        lambda: "GPU state unknown" not in form.get(hub.spawn_page_url("vera"), timeout=60).text,
        60,
        "the hub to count the cluster's GPUs again",
    )
    hub.start_server("vera", options=H100)
    assert pod_of(k8s, "vera")["status"]["phase"] == "Running" and first_list.hits == 1


def test_a_create_retried_after_a_slow_answer_is_counted_once(hub, k8s):
    """vic's create is carried out but answered after KubeSpawner's request timeout (3 s):
    KubeSpawner retries, meets its own pod (409), deletes it and creates it again. vic holds one
    card, not two: once vera stops, ivan gets the other."""
    if not running(hub, "vera"):
        hub.start_server("vera", options=H100)
    slow = k8s.fail("POST", PODS_PATH, "slow", seconds=6, times=1)
    hub.start_server("vic", options=H100)
    creates = [
        body
        for verb, plural, body in k8s.received
        if (verb, plural) == ("create", "pods") and body["metadata"]["name"] == "jupyter-vic"
    ]
    assert slow.hits == 1 and len(creates) >= 2  # the create was retried
    assert pod_of(k8s, "vic")["status"]["phase"] == "Running"
    assert [p["metadata"]["name"] for p in k8s.list("pods", NAMESPACE)].count("jupyter-vic") == 1

    assert spawn(hub, "ivan", {"profile": "h100"}).status_code == 202
    refused = said(hub, "ivan", "in use")  # both cards held: vera's and vic's
    assert "H100 80 GB" in refused and "in use" in refused, refused
    wait(lambda: not hub.api("GET", "users/ivan").json()["servers"], 60, "ivan's spawn to end")
    hub.stop_server("vera", timeout=60)
    wait(lambda: pod_of(k8s, "vera") is None, 60, "vera's pod to go")
    hub.start_server("ivan", options={"profile": "h100"})  # vic is counted once: one card free
    assert pod_of(k8s, "ivan")["status"]["phase"] == "Running"


def test_a_start_from_the_line_the_api_fails_keeps_its_place(hub, k8s):
    """Both cards held (vic, ivan); vera waits in line. When ivan stops, the governor starts
    vera, and the API fails to create her pod: she keeps her place (she lost it), is not started
    again at every pass while the API fails (the Hub took the start, so the governor did so),
    and the line starts her once the API is back, queue_retry_after later; her wait is metered
    once."""
    if hub.api("GET", "users/vera").json()["servers"]:  # the test before may have left her
        hub.stop_server("vera", timeout=60)
        wait(lambda: pod_of(k8s, "vera") is None, 60, "vera's pod to go")
    for user, options in (("vic", H100), ("ivan", {"profile": "h100"})):
        if not running(hub, user):
            hub.start_server(user, options=options)
    gov = Gov(hub)
    joined = join(hub, "vera", {"profile": "h100", "project": "detection"})
    assert joined.status_code in (302, 303), joined.text[:500]
    queued_at = wait(lambda: queue_line(hub)["vera"]["queued_at"], 60, "vera in line")

    failing = k8s.fail("POST", PODS_PATH, code=500)
    hub.stop_server("ivan", timeout=60)
    wait(lambda: failing.hits >= 1, 120, "the governor to start vera from the line")
    back = wait(
        lambda: not running(hub, "vera") and queue_line(hub).get("vera"), 60, "the start to fail"
    )
    assert back["queued_at"] == queued_at  # her place, not the end of the line
    assert pod_of(k8s, "vera") is None

    k8s.clear_faults()
    wait(
        lambda: running(hub, "vera"),
        180,
        "vera to start from the line once the API is back",
        explain=lambda: hub.spawn_evidence("vera"),
    )
    assert pod_of(k8s, "vera")["status"]["phase"] == "Running" and "vera" not in queue_line(hub)
    audit = gov.audit("vera/")
    # Not started again at every pass (two a second) while the API failed: each start from
    # the line queue_retry_after after the one before, however long the failure took to show.
    starts = [parse(a["at"]) for a in audit if a["action"] == "queue-start"]
    assert len(starts) >= 2 and failing.hits >= 1, (starts, failing.hits)
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert min(gaps) >= timedelta(seconds=QUEUE_RETRY_S), gaps
    assert [a["action"] for a in audit].count("queue-started") == 1  # her wait metered once


def test_a_cull_the_api_fails_for_a_while_holds_nothing_up_and_deletes_the_pod_after(hub, k8s):
    for user in ("vic", "vera"):
        if not running(hub, user):
            hub.start_server(user, options=H100)
    gov = Gov(hub)
    failing = k8s.fail("DELETE", r"/pods/jupyter-vic$", code=503)
    cull = {"reason": "node maintenance", "immediately": True}
    assert gov.admin("POST", "users/vic/server/cull", json=cull).status_code == 200
    wait(lambda: failing.hits >= 2, 60, "the Hub's stop of vic to try the delete again")

    # Meanwhile the governor goes on: vera's cull is carried out, her pod deleted.
    assert gov.admin("POST", "users/vera/server/cull", json=cull).status_code == 200
    wait(lambda: pod_of(k8s, "vera") is None, 60, "vera's pod to go while vic's delete fails")
    assert pod_of(k8s, "vic") is not None

    k8s.clear_faults()  # the API answers: vic's pod goes, and the Hub has vic stopped
    wait(lambda: pod_of(k8s, "vic") is None, 90, "vic's pod to go once the API answers")
    wait(lambda: not running(hub, "vic"), 60, "the Hub to have vic stopped")
    assert "cull" in gov.actions("vic/") and "cull" in gov.actions("vera/")
