"""The fake cluster itself, where the hub's tests lean on it behaving as Kubernetes does."""

from __future__ import annotations

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
