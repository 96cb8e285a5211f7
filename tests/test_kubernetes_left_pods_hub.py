"""Pods a stop left running, on a hub on Kubernetes whose API fails: the chart's hub and
governor of tests/test_kubernetes_hub.py, the real KubeSpawner, and the faults
tests/fake_k8s_api.py injects (tests/test_kubernetes_faults_hub.py has the others: a hub of its
own, whose create and cull tests need KubeSpawner's retries to outlast a minute's outage).

- A stop whose pod delete the API fails longer than the stop's retries (JupyterHub records the
  server stopped, its pod running): the pod's card stays held, the governor audits the hub's
  sweep while the API fails, and once it answers the pod is deleted and the card is free. A pod
  of another namespace, or one copying the pod's labels, is never touched.
- The same, and then an admin deletes the user: the hub's record of the pod stays, and the pod
  is swept all the same; a running server's pod beside it is never touched.

KubeSpawner's retries run out here after 15 s (``k8s_api_request_retry_timeout``): each stop
waits that out before JupyterHub records it, and no test here is about how long they last.
The cluster: 2 H100s. Only vera, vic and ivan are spared the test timers' idle culls.
"""

from __future__ import annotations

import pytest
from fake_k8s_api import FakeKubernetes
from governor_harness import Gov, wait
from test_kubernetes_faults_hub import H100, running, said
from test_kubernetes_hub import NAMESPACE, NODES, pod_of, spawn, z2jh_hub

pytestmark = pytest.mark.timeout(600)

RETRY_TIMEOUT = 15  # seconds: a stop's delete is given up this long after the API failed it
LEFT_POD_RETRY = 3  # seconds: the governor's ask of the hub to delete a left pod, again


@pytest.fixture(scope="module")
def k8s(tmp_path_factory):
    with FakeKubernetes(NODES, workdir=tmp_path_factory.mktemp("k8s")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def hub(k8s, tmp_path_factory):
    extra = (
        f"c.KubeSpawner.k8s_api_request_retry_timeout = {RETRY_TIMEOUT}\n"
        "c.ClusterGpus.left_pod_grace = 1\n"
    )
    # A failed delete asked again every 3 s, not the default 15: the tests wait for a retry.
    governor = f"c.GpuGovernor.left_pod_retry = {LEFT_POD_RETRY}\n"
    with z2jh_hub(k8s, tmp_path_factory, extra, governor) as harness:
        yield harness


@pytest.fixture(autouse=True)
def api_back(k8s):
    yield
    k8s.clear_faults()


def lookalike(of: dict, name: str) -> dict:
    """A pod with ``of``'s labels and annotations (what a user who may create pods could copy),
    under ``name``, running a sleep."""
    return {
        "metadata": {
            "name": name,
            "labels": dict(of["metadata"]["labels"]),
            "annotations": dict(of["metadata"]["annotations"]),
        },
        "spec": {
            "containers": [{"name": "notebook", "image": "busybox", "args": ["sleep", "600"]}]
        },
    }


def vic_afresh(hub, k8s, stopped: tuple[str, ...]) -> None:
    """The API answering again, the ``stopped`` users' servers stopped and their pods gone, and
    vic (made where he is not) shown a form that counts the cluster's GPUs."""
    k8s.clear_faults()  # (a test before may have left the API failing)
    for user in stopped:
        if hub.api("GET", f"users/{user}").json()["servers"]:
            hub.stop_server(user, timeout=60)
            wait(lambda u=user: pod_of(k8s, u) is None, 60, f"{user}'s pod to go")
    hub.create_user("vic")
    form = hub.login("vic")
    wait(
        lambda: "GPU state unknown" not in form.get(hub.spawn_page_url("vic"), timeout=60).text,
        60,
        "the hub to count the cluster's GPUs",
    )


def test_a_pod_a_stop_left_running_holds_its_card_until_the_sweep_deletes_it(hub, k8s):
    """vic's stop: the API fails the pod's delete past KubeSpawner's retries (15 s here), and
    JupyterHub records vic stopped with the pod running. Its card stays held (ivan is refused);
    the hub's sweep is audited and tried while the API fails; once it answers, the pod is
    deleted, the card is free for ivan, and the pods that only look like it are left alone."""
    vic_afresh(hub, k8s, stopped=("vic", "vera", "ivan"))
    for user in ("vic", "vera"):
        hub.start_server(user, options=H100)
    gov = Gov(hub)
    made = pod_of(k8s, "vic")
    k8s.create("pods", lookalike(made, "jupyter-vic"), namespace="other")
    k8s.create("pods", lookalike(made, "jupyter-vic-copy"), namespace=NAMESPACE)
    failing = k8s.fail("DELETE", r"/pods/jupyter-vic$", code=503)

    assert hub.api("DELETE", "users/vic/server").status_code in (202, 204)
    wait(lambda: not hub.api("GET", "users/vic").json()["servers"], 300, "the Hub to stop vic")
    assert pod_of(k8s, "vic")["metadata"]["uid"] == made["metadata"]["uid"]  # left running
    wait(lambda: "left-pod-delete" in gov.actions("vic/"), 120, "the sweep to be audited")
    hits = failing.hits
    wait(lambda: failing.hits > hits, 60, "the sweep to try the delete")
    assert pod_of(k8s, "vic") is not None

    assert spawn(hub, "ivan", {"profile": "h100"}).status_code == 202
    refused = said(hub, "ivan", "in use")  # vera's card, and the one vic's pod still holds
    assert "H100 80 GB" in refused, refused
    wait(lambda: not hub.api("GET", "users/ivan").json()["servers"], 60, "ivan's spawn to end")

    k8s.clear_faults()
    wait(lambda: pod_of(k8s, "vic") is None, 120, "the sweep to delete vic's pod")
    form = hub.login("ivan")
    wait(
        lambda: "would borrow" in form.get(hub.spawn_page_url("ivan"), timeout=60).text,
        120,
        "the hub to count vic's card free",
    )
    hub.start_server("ivan", options={"profile": "h100"})
    assert pod_of(k8s, "ivan")["status"]["phase"] == "Running"

    [audited, *_] = [a for a in gov.audit("vic/") if a["action"] == "left-pod-delete"]
    assert audited["details"]["uid"] == made["metadata"]["uid"], audited
    assert "jupyter-vic" in audited["reason"] and "holding its GPU" in audited["reason"]
    assert k8s.get("pods", "jupyter-vic", "other") is not None
    assert k8s.get("pods", "jupyter-vic-copy", NAMESPACE) is not None
    assert not hub.api("GET", "users/vic").json()["servers"]


def test_a_pod_left_running_by_a_deleted_users_stop_is_swept_and_a_running_one_never(hub, k8s):
    """vic's stop leaves his pod running (the API fails its delete past the retries), then an
    admin deletes vic: his spawner and its state go with him, the hub's record of the pod does
    not. Once the API answers the sweep, audited first, deletes that pod after the grace; vera's
    running server beside it, on the other card, is never touched."""
    vic_afresh(hub, k8s, stopped=("vic", "ivan"))
    for user in ("vic", "vera"):
        if not running(hub, user):
            hub.start_server(user, options=H100)
    gov = Gov(hub)
    made, veras = pod_of(k8s, "vic"), pod_of(k8s, "vera")
    failing = k8s.fail("DELETE", r"/pods/jupyter-vic$", code=503)

    assert hub.api("DELETE", "users/vic/server").status_code in (202, 204)
    wait(lambda: not hub.api("GET", "users/vic").json()["servers"], 300, "the Hub to stop vic")
    assert hub.api("DELETE", "users/vic").status_code == 204  # the admin deletes vic
    assert hub.api("GET", "users/vic").status_code == 404
    assert pod_of(k8s, "vic")["metadata"]["uid"] == made["metadata"]["uid"]  # left running
    hits = failing.hits
    wait(lambda: failing.hits > hits, 120, "the sweep to try the delete of the deleted user's")

    k8s.clear_faults()
    wait(lambda: pod_of(k8s, "vic") is None, 120, "the sweep to delete vic's pod")
    audited = [a for a in gov.audit("vic/") if a["action"] == "left-pod-delete"]
    assert any(a["details"]["uid"] == made["metadata"]["uid"] for a in audited), audited
    still = pod_of(k8s, "vera")
    assert still["metadata"]["uid"] == veras["metadata"]["uid"] and running(hub, "vera")
    assert still["status"]["phase"] == "Running" and "deletionTimestamp" not in still["metadata"]
    hub.create_user("vic")  # (as the module's other tests have him)
