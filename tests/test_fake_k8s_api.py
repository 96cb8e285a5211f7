"""The fake cluster itself, where the hub's tests lean on it behaving as Kubernetes does."""

from __future__ import annotations

import json
import time

import requests
from fake_k8s_api import FakeKubernetes, gpu_node


def sleeper(name: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "i", "command": ["sleep", "600"]}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }


def phase(k8s: FakeKubernetes, name: str) -> str | None:
    return ((k8s.get("pods", name) or {}).get("status") or {}).get("phase")


def wait(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_pod_created_again_under_its_name_is_not_ended_by_the_deleted_ones_process(tmp_path):
    """KubeSpawner retries a create it timed out on: 409, delete with no grace, create again at
    once. The deleted pod's process ends after the new pod has its name: the new pod runs on
    (the kubelet follows a pod by its uid, not its name)."""
    with FakeKubernetes([gpu_node("n", "NVIDIA-H100-80GB-HBM3", gpus=1)], workdir=tmp_path) as k8s:
        for attempt in range(5):  # the old process's end and the new create race: try a few
            first = k8s.create("pods", sleeper("p"))
            wait(lambda: phase(k8s, "p") == "Running", 30, "the first pod to run")
            r = requests.delete(f"{k8s.url}/api/v1/namespaces/default/pods/p?gracePeriodSeconds=0")
            assert r.status_code == 200, r.text
            wait(lambda: k8s.get("pods", "p") is None, 30, "the first pod to go")
            second = k8s.create("pods", sleeper("p"))
            assert second["metadata"]["uid"] != first["metadata"]["uid"]
            wait(lambda: phase(k8s, "p") == "Running", 30, "the second pod to run")
            time.sleep(0.5)  # the first pod's kubelet task sees its process ended meanwhile
            pod = k8s.get("pods", "p")
            assert pod["status"]["phase"] == "Running", (attempt, pod["status"])
            assert k8s.processes[("default", "p")].poll() is None
            requests.delete(f"{k8s.url}/api/v1/namespaces/default/pods/p?gracePeriodSeconds=0")
            wait(lambda: k8s.get("pods", "p") is None, 30, "the second pod to go")


def watched(k8s: FakeKubernetes, since: str, timeout: int) -> list[dict]:
    """A watch of the default namespace's pods from ``since`` as KubeSpawner's reflector asks
    for it, read to its end (``timeoutSeconds``)."""
    r = requests.get(
        f"{k8s.url}/api/v1/namespaces/default/pods",
        params={"watch": "true", "resourceVersion": since, "timeoutSeconds": timeout},
        timeout=timeout + 30,
    )
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines() if line]


def test_a_change_made_between_two_watches_is_sent_by_the_second(tmp_path):
    """KubeSpawner's reflector lists, watches from the list's resourceVersion until the watch's
    timeoutSeconds, and watches again from the last version it saw: what changed while no
    watch was open (the pod made, bound, Running) is sent by the next watch, in order, and each
    watch ends at its timeoutSeconds. The record names each step, and the pod's output."""
    with FakeKubernetes([gpu_node("n", "NVIDIA-H100-80GB-HBM3", gpus=1)], workdir=tmp_path) as k8s:
        listed = requests.get(f"{k8s.url}/api/v1/namespaces/default/pods", timeout=30).json()
        since = listed["metadata"]["resourceVersion"]
        started = time.monotonic()
        assert watched(k8s, since, 1) == []  # nothing changed: the watch ends, empty
        assert time.monotonic() - started < 20

        k8s.create("pods", sleeper("p"))  # no watch open meanwhile
        wait(lambda: phase(k8s, "p") == "Running", 30, "the pod to run")

        events = watched(k8s, since, 1)
        assert [(e["type"], e["object"]["status"]["phase"]) for e in events] == [
            ("ADDED", "Pending"),
            ("MODIFIED", "Pending"),  # bound to its node
            ("MODIFIED", "Running"),
        ]
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert versions == sorted(versions) and versions[0] > int(since)
        # From the last version seen: nothing again.
        assert watched(k8s, str(versions[-1]), 1) == []

        evidence = k8s.evidence("p")
        assert str(k8s.record_path) in evidence
        assert "sends MODIFIED default/p" in evidence and "phase=Running" in evidence
        assert "end (timeoutSeconds), 3 sent" in evidence
        assert f"output of default/p's process: {k8s.pod_log('default', 'p')}" in evidence
