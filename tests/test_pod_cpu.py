"""The governor reads its servers' container CPU from metrics-server (hub/pod_cpu.py): a server
without the extension whose pod burns CPU while DCGM reads its GPU idle is in a CPU stage,
noticed and not culled at busy_grace, then warned and culled at busy_limit. The Kubernetes API,
metrics-server and dcgm-exporter are tests/fake_k8s_api.py's, over HTTP; the Hub's API is
tests/fake_hub_api.py's; the governor's clock is moved, metrics-server's with it."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from fake_hub_api import FakeHub
from fake_k8s_api import FakeKubernetes, gpu_node

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.hub.dcgm_source import DcgmSource
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.pod_cpu import PodCpuOptions, parse_cpu, pod_readings
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store

NAMESPACE = "jhub"
NODE = "hgx-0"
# Warned at 30 min of GPU idleness and culled at busy_grace (60) without a CPU stage; with one,
# noticed at 60, warned at busy_limit (120) and culled after the notice (150).
POLICY = {
    "warn_after": "30m",
    "cull_after": "1h",
    "busy_grace": "1h",
    "busy_limit": "2h",
    "checkpoint": False,
}


def gpu_pod(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"app": "jupyterhub", "component": "singleuser"}},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "singleuser",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    }


@pytest.fixture
def k8s(tmp_path, restore_clock):
    with FakeKubernetes([gpu_node(NODE, "NVIDIA-H100-80GB-HBM3", gpus=2)], workdir=tmp_path) as c:
        c.metrics_now = clock.utcnow  # metrics-server's timestamps on the governor's clock
        yield c


def running(k8s: FakeKubernetes, name: str) -> None:
    k8s.create("pods", gpu_pod(name), NAMESPACE)
    deadline = time.monotonic() + 60
    while (k8s.get("pods", name, NAMESPACE) or {}).get("status", {}).get("phase") != "Running":
        assert time.monotonic() < deadline, f"pod {name} did not start"
        time.sleep(0.1)


def governor(hub: FakeHub, k8s: FakeKubernetes, tmp_path, **pod_cpu) -> Governor:
    options = PodCpuOptions(kubernetes_api_url=k8s.url, max_age=timedelta(minutes=15), **pod_cpu)
    return Governor(
        Store(f"sqlite:///{tmp_path / 'gov.sqlite'}"),
        HubApi(hub.api_url, hub.token),
        load_policies([], POLICY),
        Options(pod_cpu=options),
        DcgmSource(exporter_urls=[k8s.dcgm_url(NODE)], timeout_s=10),
    )


async def passes(
    gov: Governor, minutes: int, start: int = 0, last: dict | None = None, every: int = 5
) -> list[tuple[int, str, str]]:
    """A pass every ``every`` minutes of the governor's clock, from ``start`` (a pass there
    without moving it) to ``minutes``; what each server's state became when it changed (from
    ``last``): (minute, server, state)."""
    seen, last = [], {} if last is None else last
    for minute in range(start, minutes + 1, every):
        if minute > start:
            clock.advance(60 * every)
        await gov.reconcile()
        for row in gov.rows.values():
            if last.get(row.key) != row.state:
                last[row.key] = row.state
                seen.append((minute, row.key, row.state))
    return seen


def test_a_cpu_quantity_is_parsed_or_refused():
    assert parse_cpu("1250m") == 1.25 and parse_cpu("2") == 2.0
    assert parse_cpu("1234567n") == pytest.approx(0.001234567)
    for garbage in ("-1", "1e3", "1Ki", "", " 1", "1.5.5", "0x10", "NaN", "inf", 5, None):
        assert parse_cpu(garbage) is None, garbage
    assert parse_cpu("4096") is None  # more cores than a node has: garbage, not busy
    assert parse_cpu("1024") == 1024.0


def test_a_bad_item_is_left_out_never_the_list():
    good = {
        "metadata": {"name": "jupyter-alice", "namespace": NAMESPACE},
        "timestamp": "2026-01-05T09:00:00Z",
        "containers": [{"name": "notebook", "usage": {"cpu": "2500m"}}],
    }
    bad = [
        {**good, "metadata": {"name": "x", "namespace": "other"}},  # another namespace's
        {**good, "metadata": {"name": "UPPER", "namespace": NAMESPACE}},  # not a pod name
        {**good, "metadata": {"name": "y"}, "timestamp": "yesterday"},
        {**good, "metadata": {"name": "v"}, "timestamp": None},  # (stopped the pass before)
        {**good, "metadata": {"name": "z"}, "containers": [{"usage": {"cpu": "lots"}}]},
        {**good, "metadata": {"name": "w"}, "containers": [{"name": "a"}] * 100},
        "not an object",
    ]
    found = pod_readings({"items": [*bad, good]}, NAMESPACE)
    assert list(found) == [(NAMESPACE, "jupyter-alice")]
    assert found[(NAMESPACE, "jupyter-alice")][1] == 2.5
    with pytest.raises(ValueError):
        pod_readings({"kind": "Status"}, NAMESPACE)


async def test_a_cpu_stage_without_the_extension_is_noticed_then_held_to_busy_limit(k8s, tmp_path):
    """alice's and bob's pods send no report and DCGM reads both GPUs idle; alice's container
    burns 3 cores (a CPU stage), bob's 0.002. bob is culled at busy_grace as before; alice is
    noticed busy_grace after her stage began, naming the cause, warned at busy_limit and culled
    after the notice."""
    running(k8s, "jupyter-alice")
    running(k8s, "jupyter-bob")
    k8s.set_pod_cpu(NAMESPACE, "jupyter-alice", 3.0)
    async with FakeHub() as hub:
        hub.add_server("alice", state={"pod_name": "jupyter-alice", "namespace": NAMESPACE})
        hub.add_server("bob", state={"pod_name": "jupyter-bob", "namespace": NAMESPACE})
        gov = governor(hub, k8s, tmp_path)
        # (the first pass learns the pods' namespace; the stage is read from the next, at 5)
        last: dict = {}
        seen = await passes(gov, 65, last=last)
        assert (60, "bob/", "culled") in seen and not hub.running("bob")
        alice = gov.verdict("alice/")
        assert alice["state"] == "busy", seen
        assert "the server's CPU is busy while its GPU idles (a CPU stage?)" in alice["reason"]
        assert "press Extend" in alice["reason"]
        assert "busy-notice" in [a.action for a in gov.store.audit_rows("alice/")]
        seen += await passes(gov, 155, start=65, last=last)
        assert not hub.running("alice")
    states = [(m, s) for m, key, s in seen if key == "alice/"]
    assert states == [(0, "idle"), (65, "busy"), (120, "warned"), (150, "culled")]
    cull = [a for a in gov.store.audit_rows("alice/") if a.action == "cull"]
    assert cull and "past the busy limit of 2h" in cull[0].reason


async def test_without_metrics_server_the_server_is_decided_as_before_and_said_once(
    k8s, tmp_path, caplog
):
    """No metrics-server (404) or no RBAC for it (403): logged once, saying what it disables;
    a busy container then changes nothing (culled at busy_grace, as today)."""
    running(k8s, "jupyter-alice")
    k8s.set_pod_cpu(NAMESPACE, "jupyter-alice", 3.0)
    for absent in ("no metrics-server", "no RBAC"):
        if absent == "no metrics-server":
            k8s.metrics_server = False
        else:
            k8s.metrics_server = True
            k8s.forbidden.add("pods.metrics.k8s.io")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jupyter_gpu_gov.hub"):
            async with FakeHub() as hub:
                hub.add_server("alice", state={"pod_name": "jupyter-alice", "namespace": NAMESPACE})
                (tmp_path / absent.replace(" ", "-")).mkdir()
                gov = governor(hub, k8s, tmp_path / absent.replace(" ", "-"))
                seen = await passes(gov, 60)
                assert not hub.running("alice"), seen
        said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
        assert len(said) == 1, said
        assert "decided on DCGM alone" in said[0] and ("403" in said[0] or "404" in said[0])
        assert [s for _, k, s in seen if k == "alice/"] == ["idle", "warned", "culled"]
        clock.reset()  # (each round a new governor and Hub on real time; the pod stays)


async def test_a_metrics_server_that_comes_back_is_read_again_without_a_restart(
    k8s, tmp_path, caplog
):
    """metrics-server is missing (404) when the governor starts and installed 10 minutes later:
    the governor asks again after its back-off and alice's CPU stage, read from then on, holds
    her past busy_grace (culled at 60 without it). Each change is said once."""
    running(k8s, "jupyter-alice")
    k8s.set_pod_cpu(NAMESPACE, "jupyter-alice", 3.0)
    k8s.metrics_server = False
    with caplog.at_level(logging.WARNING, logger="jupyter_gpu_gov.hub"):
        async with FakeHub() as hub:
            hub.add_server("alice", state={"pod_name": "jupyter-alice", "namespace": NAMESPACE})
            gov = governor(hub, k8s, tmp_path)
            last: dict = {}
            seen = await passes(gov, 10, last=last)  # (404 at 5: asked again at 15)
            k8s.metrics_server = True
            seen += await passes(gov, 80, start=10, last=last)
            assert hub.running("alice"), seen
            alice = gov.verdict("alice/")
    said = [r.getMessage() for r in caplog.records if "PodMetrics" in r.getMessage()]
    assert len(said) == 2, said
    assert "cannot be read (404" in said[0] and "asked again every 10 minutes" in said[0]
    assert "is read again" in said[1]
    assert alice["state"] == "busy", seen
    assert "a CPU stage?" in alice["reason"]
    # The stage is read from 15 (the first answer), so it is busy_grace on from there.
    assert [(m, s) for m, k, s in seen if k == "alice/"] == [(0, "idle"), (75, "busy")]


def test_the_answer_read_item_by_item_reads_what_the_whole_document_does():
    """The parser's thread reads the list item by item (``_items``): the same pods, times and
    cores as the whole document parsed at once, whatever the members' order and spacing; what
    is not a PodMetricsList, or not JSON, fails whole, as ``json.loads`` would."""
    import json
    from datetime import datetime, timezone

    from jupyter_gpu_gov.hub import pod_cpu

    def item(name: str, cpu: object, stamp: object = "2026-01-05T09:00:00Z") -> dict:
        return {
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"a": "b"}},
            "timestamp": stamp,
            "window": "10s",
            "containers": [{"name": "notebook", "usage": {"cpu": cpu, "memory": "1Ki"}}],
        }

    items = [
        item("jupyter-a", "2500m"),
        item("jupyter-b", "1234567n"),
        item("jupyter-c", "lots"),  # left out
        item("jupyter-d", "1", stamp=None),  # left out (no time)
        item("jupyter-a", "3"),  # the later of two wins, as a dict's would
        "not an object",
    ]
    now = datetime(2026, 1, 5, 10, tzinfo=timezone.utc)
    options = pod_cpu.PodCpuOptions(kubernetes_api_url="http://k8s")
    for text in (
        json.dumps({"kind": "PodMetricsList", "metadata": {}, "items": items}),
        json.dumps({"items": items, "apiVersion": "metrics.k8s.io/v1beta1"}, indent=2),
        '\n { "items" :[ ' + ",\n".join(json.dumps(i) for i in items) + " ] }\n",
    ):
        whole = pod_cpu.pod_readings(json.loads(text), NAMESPACE)
        folded = pod_cpu._fold(bytearray(text.encode()), NAMESPACE, {}, now, options)
        assert set(folded) == set(whole) == {(NAMESPACE, "jupyter-a"), (NAMESPACE, "jupyter-b")}
        assert whole[(NAMESPACE, "jupyter-a")][1] == 3.0
        for pod, (at, cores) in whole.items():
            assert folded[pod] == pod_cpu.cpu_stage.fold(None, at, cores, gap=options.max_age)
    assert pod_cpu._fold(bytearray(b'{"items": []}'), NAMESPACE, {}, now, options) == {}
    for bad in (
        b'{"kind": "Status"}',
        b"[]",
        b'{"items": [] } x',
        b'{"items": [{"metadata": {}} ',
        b'{"items": [], "items": []}',
        b'{"items": [1 2]}',
        b"",
        b"\xff",
    ):
        with pytest.raises(ValueError):
            pod_cpu._fold(bytearray(bad), NAMESPACE, {}, now, options)


async def test_a_token_file_that_cannot_be_read_fails_the_read_never_the_pass(tmp_path, caplog):
    """The service account's token file not text (or not readable: a projected token of mode
    0600 for a governor not running as its owner) raised out of ``PodCpu.read``, which the
    governor's pass awaits with its other reads: every pass failed, for every server. It is
    now a failed read of the namespace, said once, naming the file."""
    from datetime import datetime, timezone

    from jupyter_gpu_gov.hub.pod_cpu import PodCpu

    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe not a token")
    reader = PodCpu(
        PodCpuOptions(kubernetes_api_url="http://127.0.0.1:9", kubernetes_token_file=str(token))
    )
    reader.want((NAMESPACE, "jupyter-alice"), "alice/")
    now = datetime(2026, 1, 5, 10, tzinfo=timezone.utc)
    with caplog.at_level(logging.WARNING, logger="jupyter_gpu_gov.hub"):
        await reader.read(now)  # (raised UnicodeDecodeError)
        await reader.read(now)
    said = [r.getMessage() for r in caplog.records if "pods' CPU" in r.getMessage()]
    assert len(said) == 1 and str(token) in said[0], said
    assert reader.busy_since((NAMESPACE, "jupyter-alice"), now) is None  # not known
