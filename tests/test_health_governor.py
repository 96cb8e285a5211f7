"""GPU health in the governor: a fake Hub API, DCGM over HTTP serving the fault fixtures (written
by us under the real field names, tests/data/dcgm/SOURCES.md), a fake Kubernetes API at the HTTP
level for the node actions."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta
from pathlib import Path

import pytest
from fake_hub_api import FakeHub
from test_dcgm import FAULTS_TEXT, FIXTURES, H100_TEXT, L4
from test_governor import report_for
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from jupyter_gpu_gov.core import clock, grant, health
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.vocabulary import NODE_UNHEALTHY_ANNOTATION, NODE_UNHEALTHY_LABEL
from jupyter_gpu_gov.core.vocabulary import WEIGHT_LABEL as WEIGHT
from jupyter_gpu_gov.hub import metrics
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.dcgm_source import DcgmSource
from jupyter_gpu_gov.hub.health import HealthOptions
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.people import ClaimHeld
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store

pytestmark = pytest.mark.usefixtures("restore_clock")  # every test moves the clock

LOST_GPU = "GPU-3f6d2a41-8c0e-4b7a-9d21-5e8f0c7b1a90"  # GPU 0 of gpu-node-7: XID 79
ALICE_POD = {"pod_name": "jupyter-alice", "namespace": "jhub"}
L4_GPU = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"  # a real scrape: idle, XID 0, no remap failure
LOST = health.assess(health.Reading(xids=(79,), lost="simulated")).as_dict()
DRAIN = health.assess(health.Reading(xids=(63,))).as_dict()


class Http:
    """A tiny HTTP server: dcgm-exporter's /metrics (``text``, changeable) and the Kubernetes
    API's node PATCH (recorded, answered as the API server does)."""

    def __init__(self, text: str = ""):
        self.text = text
        self.patches: list[tuple[str, str, dict]] = []
        outer = self

        class Metrics(web.RequestHandler):
            def get(self):
                self.set_header("Content-Type", "text/plain; version=0.0.4")
                self.finish(outer.text)

        class Node(web.RequestHandler):
            async def patch(self, name):
                await asyncio.sleep(0.2)  # an API server that takes its time: nothing waits on it
                assert self.request.headers["Content-Type"] == "application/merge-patch+json"
                auth = self.request.headers.get("Authorization")
                outer.patches.append((name, auth, json.loads(self.request.body)))
                self.finish({"kind": "Node", "metadata": {"name": name}})

        sockets = bind_sockets(0, "127.0.0.1")
        self.base = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        app = web.Application([(r"/metrics", Metrics), (r"/api/v1/nodes/([^/]+)", Node)])
        self.server = HTTPServer(app)
        self.server.add_sockets(sockets)


@pytest.fixture
def http():
    server = Http((FIXTURES / FAULTS_TEXT).read_text())
    yield server
    server.server.stop()


def governor(hub: FakeHub, tmp_path: Path, dcgm_url: str | None = None, **health_options):
    policies = load_policies([], {"warn_after": "1h", "cull_after": "2h"})
    dcgm = DcgmSource(exporter_urls=[dcgm_url], timeout_s=5) if dcgm_url else None
    dry_run = health_options.pop("dry_run", False)
    options = Options(dry_run=dry_run, health=HealthOptions(**health_options))
    store = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}")
    return Governor(store, HubApi(hub.api_url, hub.token), policies, options, dcgm)


@contextlib.asynccontextmanager
async def governed(*args, **kwargs):
    gov = governor(*args, **kwargs)
    try:
        yield gov
    finally:
        await gov.close()  # its DCGM read and checkpoint requests still under way


async def fresh_pass(gov: Governor) -> None:
    """A pass on a DCGM read taken after everything before it (not the one already running)."""
    await gov.background_done()
    await gov.reconcile()
    await gov.background_done()
    await gov.reconcile()


def failed_report(user: str, uuid: str, device_health: dict | None = LOST) -> dict:
    """The report of a server whose GPU was lost: listed, nothing read, its kernel unknown."""
    r = report_for(user, uuid, sm=0.0)
    r["devices"][0].update(memory_used_mb=None, activity=None, health=device_health)
    r["targets"][0]["gpu"].update(sm=None, memory_mb=None, confidence="unknown")
    r["window"].update(gpu_active_fraction=None, gpu_idle_since=None)
    return r


async def test_a_gpu_dcgm_sees_fail_is_never_culled_and_its_owner_is_told(tmp_path, http):
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("alice", last_activity=clock.utcnow(), state=ALICE_POD)  # no extension
        gov = await stack.enter_async_context(governed(hub, tmp_path, f"{http.base}/metrics"))
        await gov.reconcile()
        row = gov.row("alice/")
        assert row.state == "gpu-failed"
        # No extension: no verdict reaches the server, so it is not asked for a checkpoint.
        assert row.checkpoint_status is None
        assert gov.verdict("alice/")["reason"] == (
            "Your GPU failed (XID 79: the GPU fell off the bus); "
            "restart your server to get another GPU"
        )
        for hours in (3, 30):  # far past warn_after, cull_after and inactive_timeout
            clock.advance(hours * 3600)
            await gov.reconcile()
            assert hub.running("alice") and gov.row("alice/").state == "gpu-failed"
        actions = [a.action for a in gov.store.audit_rows("alice/")][::-1]
    assert "checkpoint" not in actions and "cull" not in actions
    # unknown (failed) for longer than unknown_alert_after: flagged once, for an admin
    assert actions.count("gpu-unknown") == 1
    view = gov.health_view()
    assert [f["server"] for f in view["flagged"]] == ["alice/"]
    assert metrics.SERVERS_GPU_UNKNOWN._value.get() == 1


def unavailable_report(user: str) -> dict:
    """What every server reports while the whole driver is down (NVML cannot start)."""
    r = report_for(user, L4_GPU, sm=0.0)
    r.update(backend="unavailable", error="NVML: driver not loaded", devices=[], targets=[])
    return r


@pytest.mark.parametrize(
    ("state", "cpu_only"),
    [
        ({"gpu_gov_grant": {}}, True),  # the profile layer admitted it with no GPU
        (None, False),  # no record: another spawner, or no admin:server_state
        ({"pod_name": "jupyter-carol"}, False),  # KubeSpawner alone: nothing said of GPUs
        ({"gpu_gov_grant": {"gpu-gov/tier": "h100"}}, False),
        ({"gpu_gov_grant": {}, "gpu_gov_devices": [L4_GPU]}, False),  # a device: it holds it
        ({"gpu_gov_grant": "none"}, False),
    ],
)
def test_only_the_profile_layers_empty_grant_says_no_gpu(state, cpu_only):
    assert grant.no_gpu(state) is cpu_only


async def test_a_server_the_hubs_records_give_no_gpu_is_never_a_gpu_alert(tmp_path):
    """The whole driver fails: every report says the GPU backend is unavailable. carol's server,
    which the profile layer admitted with no GPU (an empty grant in its spawner state, which she
    cannot write), is a CPU server still: not flagged unknown, and culled by the idle-culler rule
    once the Hub has seen nothing of her for inactive_timeout. dave's (no record: another spawner)
    and erin's (the allocator pinned her a GPU) stay unknown: never culled, flagged for an admin."""
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        now = clock.utcnow()
        hub.add_server("carol", last_activity=now, state={"gpu_gov_grant": {}})
        hub.add_server("dave", last_activity=now)
        hub.add_server("erin", last_activity=now, state={"gpu_gov_devices": [L4_GPU]})
        gov = await stack.enter_async_context(governed(hub, tmp_path))
        users = ("carol", "dave", "erin")
        for minutes in (0, 40, 25):  # past unknown_alert_after (30 min), inactive_timeout (1 h)
            clock.advance(minutes * 60)
            for user in users:
                gov.ingest(unavailable_report(user))
            await gov.reconcile()
            if minutes == 40:
                flagged = [f["server"] for f in gov.health_view()["flagged"]]
                assert flagged == ["dave/", "erin/"]
                carol = gov.verdict("carol/")
                assert carol["state"] == "active" and "holds no GPU" in carol["reason"], carol
        assert not hub.running("carol")
        assert hub.running("dave") and hub.running("erin")
        states = {u: gov.row(f"{u}/").state for u in users}
        assert states == {"carol": "culled", "dave": "unknown", "erin": "unknown"}, states
        audits = {u: [a.action for a in gov.store.audit_rows(f"{u}/")] for u in users}
    assert "gpu-unknown" not in audits["carol"] and "cull" in audits["carol"]
    assert audits["dave"].count("gpu-unknown") == audits["erin"].count("gpu-unknown") == 1
    assert "cull" not in audits["dave"] + audits["erin"]


async def test_the_admin_sees_node_gpu_and_reasons(tmp_path, http):
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("alice", state=ALICE_POD)
        gov = await stack.enter_async_context(governed(hub, tmp_path, f"{http.base}/metrics"))
        await gov.reconcile()
    gpus = {g["gpu"]: g for g in gov.health_view()["gpus"]}
    assert set(gpus) == {0, 1, 2}  # 3 is healthy; 2 only throttles (a warning, listed)
    lost = gpus[0]
    assert (lost["node"], lost["uuid"], lost["model"]) == (
        "gpu-node-7",
        LOST_GPU,
        "NVIDIA H100 80GB HBM3",
    )
    assert (lost["status"], lost["action"], lost["source"]) == ("unhealthy", "reset", "dcgm")
    assert lost["server"] == "alice/" and lost["pod"] == {
        "namespace": "jhub",
        "name": "jupyter-alice",
    }
    assert gpus[1]["action"] == "reset" and "2 uncorrectable ECC" in gpus[1]["reasons"][1]
    assert gpus[2]["status"] == "ok" and "thermal slowdown" in gpus[2]["warnings"][0]
    series = {
        (s.labels["node"], s.labels["gpu"], s.labels["action"])
        for s in metrics.GPU_UNHEALTHY.collect()[0].samples
    }
    assert series == {("gpu-node-7", "0", "reset"), ("gpu-node-7", "1", "reset")}


async def test_a_gpu_dcgm_stops_reporting_while_its_node_answers_is_unknown(tmp_path, http):
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        gov = await stack.enter_async_context(governed(hub, tmp_path, f"{http.base}/metrics"))
        await gov.reconcile()
        http.text = "\n".join(line for line in http.text.splitlines() if 'gpu="3"' not in line)
        await fresh_pass(gov)
    (gone,) = [g for g in gov.health_view()["gpus"] if g["gpu"] == 3]
    assert (
        gone["status"] == "unknown" and "DCGM has not reported this GPU since" in gone["reasons"][0]
    )


async def test_a_reported_failure_without_dcgm_is_believed_then_recovers(tmp_path):
    uuid = "GPU-0000-lost"
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("bob")
        gov = await stack.enter_async_context(governed(hub, tmp_path))
        gov.ingest(report_for("bob", uuid, sm=0.0))
        await gov.reconcile()
        assert gov.row("bob/").state == "idle"
        gov.ingest(failed_report("bob", uuid))
        await gov.reconcile()
        verdict = gov.verdict("bob/")
        assert verdict["state"] == "gpu-failed"
        assert verdict["reason"].startswith("Your GPU failed (XID 79: the GPU fell off the bus)")
        assert verdict["cull_at"] is None and verdict["warn_at"] is None
        (gpu,) = gov.health_view()["gpus"]
        assert (gpu["uuid"], gpu["source"], gpu["server"]) == (uuid, "report", "bob/")
        clock.advance(60)
        reset_at = clock.utcnow()
        gov.ingest(report_for("bob", uuid, sm=0.0))  # the GPU was reset
        await gov.reconcile()
        row = gov.row("bob/")
        assert row.state == "idle" and row.checkpoint_status is None  # a fresh idle stretch
        # From the reset on, not the stretch before it (60 s earlier), however long the pass.
        assert row.idle_since >= reset_at - timedelta(seconds=1)
        assert gov.health_view()["gpus"] == []


async def test_a_failed_card_of_the_allocator_stays_listed_once_its_server_stops(tmp_path):
    """A workstation without DCGM: bob's server reports its allocated card failed, then stops.
    Where it really failed the allocator withholds the card from new servers, so the admin
    must still see why; a failure claimed on a GPU the records do not give the server goes
    with its server."""
    uuid, other = "GPU-0000-lost", "GPU-0000-claimed"
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("bob", state={"gpu_gov_devices": [uuid]})
        hub.add_server("dave")  # no records (another spawner)
        gov = await stack.enter_async_context(governed(hub, tmp_path))
        gov.ingest(failed_report("bob", uuid))
        gov.ingest(failed_report("dave", other))
        await gov.reconcile()
        listed = {g["uuid"]: g["server"] for g in gov.health_view()["gpus"]}
        assert listed == {uuid: "bob/", other: "dave/"}
        since = gov.health_view()["gpus"][0]["since"]
        for user in ("bob", "dave"):
            hub._finish_stop(hub.users[user], "")
            hub._reindex(hub.users[user])
        clock.advance(60)
        await gov.reconcile()
        assert gov.row("bob/").running is False
        (gpu,) = gov.health_view()["gpus"]
        assert (gpu["uuid"], gpu["source"], gpu["server"]) == (uuid, "report", "bob/")
        assert gpu["status"] == "unhealthy" and gpu["since"] == since
        assert [s.labels["uuid"] for s in metrics.GPU_UNHEALTHY.collect()[0].samples] == [uuid]
        # reset by an admin and handed out again: the next server's report says it is healthy
        hub.add_server("carol", state={"gpu_gov_devices": [uuid]})
        gov.ingest(report_for("carol", uuid, sm=0.0))
        await gov.reconcile()
        assert gov.health_view()["gpus"] == []


async def test_a_report_no_record_stands_behind_hides_no_stopped_servers_claim(tmp_path):
    """A workstation without DCGM: bob's allocated card failed, and his server stopped; the
    claim stays on the panel so the admin sees why the allocator withholds the card. eve's
    server, on a spawner the Hub keeps no records of, named that card healthy in her report:
    the claim left the panel, a fault hidden by her word."""
    uuid = "GPU-0000-lost"
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("bob", state={"gpu_gov_devices": [uuid]})
        hub.add_server("eve")  # no records (another spawner)
        gov = await stack.enter_async_context(governed(hub, tmp_path))
        gov.ingest(failed_report("bob", uuid))
        await gov.reconcile()
        hub._finish_stop(hub.users["bob"], "")
        hub._reindex(hub.users["bob"])
        await gov.reconcile()
        gov.ingest(report_for("eve", uuid, sm=0.0))  # "that card is mine, and fine"
        clock.advance(60)
        await gov.reconcile()
        (gpu,) = gov.health_view()["gpus"]
        assert (gpu["uuid"], gpu["source"], gpu["server"]) == (uuid, "report", "bob/")


async def test_a_stopped_servers_failure_claim_goes_once_the_allocator_hands_the_card_out(
    tmp_path,
):
    """A workstation without DCGM: mallory's server says its allocated card fell off the bus,
    then stops. The allocator reads the cards itself and hands that one to carol (it never
    hands out a card it reads failed): the Hub's records now contradict mallory's word, so the
    card is no longer listed as failed nor alerted on (it named her stopped server, for good,
    as long as no new server's report listed the card: until the service restarted)."""
    uuid = "GPU-0000-said-lost"
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("mallory", state={"gpu_gov_devices": [uuid]})
        gov = await stack.enter_async_context(governed(hub, tmp_path))
        gov.ingest(failed_report("mallory", uuid))  # "my card failed"
        await gov.reconcile()
        hub._finish_stop(hub.users["mallory"], "")
        hub._reindex(hub.users["mallory"])
        await gov.reconcile()
        assert [g["server"] for g in gov.health_view()["gpus"]] == ["mallory/"]
        # carol's server starts on the card; its first report is not in yet
        hub.add_server("carol", state={"gpu_gov_devices": [uuid]})
        clock.advance(60)
        await gov.reconcile()
        assert gov.health_view()["gpus"] == []
        assert metrics.GPU_UNHEALTHY.collect()[0].samples == []
        assert gov.row("carol/").state != "gpu-failed"


async def test_a_reported_failure_dcgm_reads_as_healthy_is_not_believed(tmp_path):
    http = Http((FIXTURES / L4).read_text())
    try:
        async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
            hub.add_server("mallory")
            gov = await stack.enter_async_context(governed(hub, tmp_path, f"{http.base}/metrics"))
            gov.ingest(failed_report("mallory", L4_GPU))  # "my GPU failed: never cull me"
            await gov.reconcile()
    finally:
        http.server.stop()
    # DCGM reads its health fields and activity: healthy, idle (and the report says so)
    assert gov.row("mallory/").state == "idle"
    # Nor is the claim shown or alerted on: an admin would drain or reset a healthy GPU (on
    # which, on a shared card, other users' servers run) on mallory's word.
    assert gov.health_view()["gpus"] == []
    assert metrics.GPU_UNHEALTHY.collect()[0].samples == []


async def test_a_report_not_believed_files_its_time_under_no_node_its_card_names(tmp_path):
    """mallory's server has a card of the allocator's (no tier recorded, one DCGM does not
    read); her report names another card, which DCGM reads on its node: not believed. The
    diagnosis's cost ledger filed her GPU time under that card's node, which her word chose;
    it goes under "(unplaced)"."""
    http = Http((FIXTURES / L4).read_text())
    try:
        async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
            # the profile layer's grant: its weight, no tier (an admin's profile without one)
            state = {"gpu_gov_devices": ["GPU-0000-hers"], "gpu_gov_grant": {WEIGHT: "1"}}
            hub.add_server("mallory", state=state)
            gov = await stack.enter_async_context(governed(hub, tmp_path, f"{http.base}/metrics"))
            gov.ingest(report_for("mallory", L4_GPU, sm=0.0))
            await fresh_pass(gov)  # DCGM read, her report not believed, her GPUs billed
            for _ in range(3):
                clock.advance(60)
                gov.ingest(report_for("mallory", L4_GPU, sm=0.0))
            assert "mallory/" in gov._distrusted
            nodes = gov.diagnosis_summary()["cost"]["nodes"]
    finally:
        http.server.stop()
    assert list(nodes) == ["(unplaced)"], nodes


async def test_a_gpu_that_needs_draining_is_said_and_governed_as_usual(tmp_path):
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("carol")
        gov = await stack.enter_async_context(governed(hub, tmp_path))
        report = report_for("carol", "GPU-drain", sm=0.0)
        report["devices"][0]["health"] = DRAIN
        gov.ingest(report)
        await gov.reconcile()
    row = gov.row("carol/")
    assert row.state == "idle"  # its readings are good: idle is idle
    assert row.reason.endswith(
        "your GPU needs maintenance (XID 63: a memory row was marked for remapping (a GPU reset "
        "activates it)): restart your server when convenient to move to another GPU"
    )


@pytest.mark.parametrize("mode", ["label", "cordon"])
async def test_the_node_is_labelled_or_cordoned_only_when_asked(tmp_path, http, mode):
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        gov = await stack.enter_async_context(
            governed(
                hub,
                tmp_path,
                f"{http.base}/metrics",
                node_action=mode,
                kubernetes_api_url=http.base,
                kubernetes_token_file=str(token),
            )
        )
        await gov.reconcile()
        await gov.reconcile()  # marked once per unhealthy stretch
        audit = [a for a in gov.store.audit_rows() if a.action.startswith("node-")]
        assert [a.action for a in audit] == [f"node-{mode}"]
        assert "GPU 0 (GPU-3f6d2a41" in audit[0].reason and "XID 79" in audit[0].reason
        await gov.background_done()
        (node, auth, patch), *_ = http.patches
        assert (node, auth, len(http.patches)) == ("gpu-node-7", "Bearer sa-token", 1)
        assert patch["metadata"]["labels"] == {NODE_UNHEALTHY_LABEL: "true"}
        assert "XID 79" in patch["metadata"]["annotations"][NODE_UNHEALTHY_ANNOTATION]
        assert patch.get("spec") == ({"unschedulable": True} if mode == "cordon" else None)

        http.text = (FIXTURES / H100_TEXT).read_text()  # repaired (another node's scrape)
        await fresh_pass(gov)
        await gov.background_done()
        await gov.reconcile()
    node, _, unlabel = http.patches[-1]
    assert node == "gpu-node-7" and "spec" not in unlabel  # a cordon is undone by hand only
    assert unlabel["metadata"] == {
        "labels": {NODE_UNHEALTHY_LABEL: None},
        "annotations": {NODE_UNHEALTHY_ANNOTATION: None},
    }
    assert len(http.patches) == 2


async def test_no_node_is_touched_by_default_or_in_a_dry_run(tmp_path, http):
    (tmp_path / "dry").mkdir()
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        default = await stack.enter_async_context(governed(hub, tmp_path, f"{http.base}/metrics"))
        await default.reconcile()
        assert not [a for a in default.store.audit_rows() if a.action.startswith("node-")]
        dry = await stack.enter_async_context(
            governed(
                hub,
                tmp_path / "dry",  # a store of its own
                f"{http.base}/metrics",
                node_action="cordon",
                kubernetes_api_url=http.base,
                dry_run=True,
            )
        )
        await dry.reconcile()
        (audit,) = [a for a in dry.store.audit_rows() if a.action.startswith("node-")]
    assert audit.action == "node-cordon" and audit.dry_run
    assert http.patches == []


def test_the_options_are_checked_at_start(monkeypatch, capsys):
    app = GpuGovernor()
    with pytest.raises(SystemExit):  # a message naming the setting, not a traceback
        app.initialize(["--GpuGovernor.unhealthy_node_action=drain"])
    said = capsys.readouterr().err
    assert "unhealthy_node_action must be one of none, label, cordon" in said
    assert "Traceback" not in said
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    app = GpuGovernor()
    app.initialize(["--GpuGovernor.unhealthy_node_action=cordon"])
    with pytest.raises(SystemExit, match="needs the Kubernetes API"):
        app.make_governor()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert GpuGovernor().kubernetes_api_url == "https://10.0.0.1:443"


async def test_a_failed_gpu_keeps_its_hard_deadline_in_the_verdict(tmp_path):
    """A server on a failed GPU is never culled as idle, but its maximum age still holds: its
    verdict says when (the spawn queue counts on ``cull_at``), the owner reads why once it is
    announced, and the cull comes at the deadline."""
    uuid = "GPU-0000-lost"
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        started = clock.utcnow().replace(microsecond=0)
        hub.add_server("bob", started=started)
        gov = await stack.enter_async_context(governed(hub, tmp_path))
        gov.policies = load_policies([], {"max_age": "2d"})
        gov.ingest(failed_report("bob", uuid))
        await gov.reconcile()
        verdict = gov.verdict("bob/")
        deadline = started + timedelta(days=2)
        assert verdict["state"] == "gpu-failed"
        assert abs(clock.parse(verdict["cull_at"]) - deadline) < timedelta(seconds=1)
        assert "maximum age" not in verdict["reason"]  # not announced yet
        clock.advance(2 * 86400 - 1800)  # within max_age_warning (1 h) of the deadline
        gov.ingest(failed_report("bob", uuid))
        await gov.reconcile()
        verdict = gov.verdict("bob/")
        assert verdict["state"] == "gpu-failed"
        assert abs(clock.parse(verdict["cull_at"]) - deadline) < timedelta(seconds=1)
        assert verdict["reason"].startswith("Your GPU failed")
        assert "will reach the maximum age of 2d for this profile at" in verdict["reason"]
        clock.advance(1800)
        gov.ingest(failed_report("bob", uuid))
        await gov.reconcile()
        assert gov.row("bob/").cull_reason == "max-age"


async def test_a_failure_claimed_on_a_gpu_not_its_own_keeps_nothing(tmp_path):
    """Mallory's records give her one L4 that DCGM reads healthy and idle. Her report says
    another GPU, which DCGM does not know, fell off the bus: the report contradicts the records
    (distrusted), so its failure must not keep her idle GPU from the cull."""
    http = Http((FIXTURES / L4).read_text())
    try:
        async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
            hub.add_server("mallory", state={"gpu_gov_devices": [L4_GPU]})
            gov = await stack.enter_async_context(governed(hub, tmp_path, f"{http.base}/metrics"))
            gov.ingest(failed_report("mallory", "GPU-made-up-and-lost"))
            await gov.reconcile()
            row = gov.row("mallory/")
            actions = [a.action for a in gov.store.audit_rows("mallory/")]
    finally:
        http.server.stop()
    assert "report-distrusted" in actions
    assert row.state == "idle" and row.cull_at is not None
    assert gov.health_view()["gpus"] == []  # nor is a GPU it does not hold shown as failed


async def test_a_report_naming_a_failed_pod_takes_on_nothing_without_records(tmp_path, http):
    """Mallory's server has no record behind it (another spawner, or a service without
    ``admin:server_state``). Her report names alice's pod, whose GPU DCGM sees fall off the
    bus: her server took on that failure (``gpu-failed``: never culled as idle). DCGM is read
    for her by the GPUs her report names, which it does not know: her GPU is idle as it says."""
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("mallory", last_activity=clock.utcnow())
        gov = await stack.enter_async_context(governed(hub, tmp_path, f"{http.base}/metrics"))
        report = report_for("mallory", "GPU-not-one-dcgm-reads", sm=0.0)
        report["server"].update(pod=ALICE_POD["pod_name"], namespace=ALICE_POD["namespace"])
        gov.ingest(report)
        await fresh_pass(gov)
        row = gov.row("mallory/")
    assert row.state == "idle" and row.cull_at is not None, (row.state, row.reason)
    assert all(gpu["server"] != "mallory/" for gpu in gov.health_view()["gpus"])


async def test_a_node_is_cordoned_only_once_its_audit_is_on_record(tmp_path, http, monkeypatch):
    """Every action is audited before it is taken: a pass whose write the store refused (a
    full disk) cordoned the node all the same, with nothing on record. Now the cordon waits
    for its audit row; the next pass, whose write the store takes, records it and cordons."""
    from jupyter_gpu_gov.hub import records
    from jupyter_gpu_gov.hub.store import StoreUnavailable

    monkeypatch.setattr(records, "STORE_RETRY_AFTER", 0.0)
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        gov = await stack.enter_async_context(
            governed(
                hub,
                tmp_path,
                f"{http.base}/metrics",
                node_action="cordon",
                kubernetes_api_url=http.base,
            )
        )
        save = gov.store.save_async

        async def full_disk(*args, **kwargs):
            monkeypatch.setattr(gov.store, "save_async", save)  # refused once
            raise StoreUnavailable(gov.store.url, OSError("database or disk is full"))

        monkeypatch.setattr(gov.store, "save_async", full_disk)
        result = await gov.reconcile()
        await gov.background_done()
        assert result.errors and http.patches == []
        assert not [a for a in gov.store.audit_rows() if a.action.startswith("node-")]
        await gov.reconcile()
        await gov.background_done()
        (audit,) = [a for a in gov.store.audit_rows() if a.action.startswith("node-")]
        assert audit.action == "node-cordon" and len(http.patches) == 1


ECC_GPU = "GPU-7a1c9e52-2d4b-4f8e-a613-0b9c4d2e8f71"  # GPU 1 of gpu-node-7: XID 48, 2 DBE errors
HEALTHY_GPU = "GPU-e92f5b08-1a7c-4d63-b0e4-38d6c1a7f925"  # GPU 3 of gpu-node-7


async def test_an_admin_dismisses_a_false_claim_until_new_evidence(tmp_path, http):
    """An admin who checked the cards dismisses DCGM's claims: they leave the listing, the alert
    metric and the node's label, and stay gone while DCGM says the same; a new XID brings the
    claim back. A card a running server is on, one without a claim, an unknown one: refused,
    nothing changed."""
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        gov = await stack.enter_async_context(
            governed(
                hub,
                tmp_path,
                f"{http.base}/metrics",
                node_action="label",
                kubernetes_api_url=http.base,
                kubernetes_token_file=str(token),
            )
        )
        hub.add_server("alice", state=ALICE_POD)  # on GPU 0
        await gov.reconcile()
        with pytest.raises(ClaimHeld, match="held by the running server alice/"):
            gov.dismiss_gpu_claim(LOST_GPU, "user:govadmin", "checked")
        with pytest.raises(LookupError, match="no health claim to dismiss"):
            gov.dismiss_gpu_claim(HEALTHY_GPU, "user:govadmin", "checked")
        with pytest.raises(LookupError, match="no GPU GPU-nope is known"):
            gov.dismiss_gpu_claim("GPU-nope", "user:govadmin", "checked")
        assert not [a for a in gov.store.audit_rows() if a.action == "gpu-dismiss"]

        alice = hub.users["alice"]
        alice.servers.pop("")  # alice's server stops: nobody is on the card now
        hub._reindex(alice)
        await gov.reconcile()
        for uuid in (LOST_GPU, ECC_GPU):
            answer = gov.dismiss_gpu_claim(uuid, "user:govadmin", "reseated, passes dcgmi diag")
            assert answer["status"] == "dismissed" and answer["gpu"]["uuid"] == uuid
        audit = [a for a in gov.store.audit_rows() if a.action == "gpu-dismiss"][::-1]
        assert [a.details["uuid"] for a in audit] == [LOST_GPU, ECC_GPU]
        assert audit[0].actor == "user:govadmin" and "XID 79" in audit[0].reason
        assert "reason: reseated, passes dcgmi diag" in audit[0].reason
        await fresh_pass(gov)  # DCGM still says the same: still dismissed
        await gov.background_done()
        listed = {g["uuid"] for g in gov.health_view()["gpus"]}
        assert LOST_GPU not in listed and ECC_GPU not in listed
        alerted = {s.labels["uuid"] for s in metrics.GPU_UNHEALTHY.collect()[0].samples}
        assert alerted == set()
        assert http.patches[-1][2]["metadata"]["labels"] == {NODE_UNHEALTHY_LABEL: None}

        http.text = http.text.replace('pod_uid=""} 79', 'pod_uid=""} 95')  # a new XID on GPU 0
        await fresh_pass(gov)
        (back,) = [g for g in gov.health_view()["gpus"] if g["uuid"] == LOST_GPU]
        assert back["reasons"][0] == "XID 95: an uncontained ECC memory error"
        assert ECC_GPU not in {g["uuid"] for g in gov.health_view()["gpus"]}


async def test_a_dismissal_outlives_a_restart_and_ends_at_new_evidence(tmp_path, http):
    """Dismissals are kept in the governor's store: after a restart of the service (a new
    governor on the same store) the cards an admin dismissed are neither listed nor alerted on
    while DCGM says what they dismissed (they once all came back at every restart). A new
    failure of one (another XID) lists it again, and ends its dismissal in the store as well:
    a later restart lists it, and still not the other."""
    url = f"{http.base}/metrics"
    async with FakeHub() as hub:
        async with governed(hub, tmp_path, url) as gov:
            await gov.reconcile()
            for uuid in (LOST_GPU, ECC_GPU):
                gov.dismiss_gpu_claim(uuid, "user:govadmin", "reseated, passes dcgmi diag")
            await fresh_pass(gov)
            assert not {LOST_GPU, ECC_GPU} & {g["uuid"] for g in gov.health_view()["gpus"]}

        async with governed(hub, tmp_path, url) as gov:  # the service restarted
            await fresh_pass(gov)
            assert not {LOST_GPU, ECC_GPU} & {g["uuid"] for g in gov.health_view()["gpus"]}
            alerted = {s.labels["uuid"] for s in metrics.GPU_UNHEALTHY.collect()[0].samples}
            assert not {LOST_GPU, ECC_GPU} & alerted
            with pytest.raises(LookupError, match="no health claim to dismiss"):
                gov.dismiss_gpu_claim(LOST_GPU, "user:govadmin", "again")  # known, dismissed

            http.text = http.text.replace('pod_uid=""} 79', 'pod_uid=""} 95')  # a new XID
            await fresh_pass(gov)
            (back,) = [g for g in gov.health_view()["gpus"] if g["uuid"] == LOST_GPU]
            assert back["reasons"][0] == "XID 95: an uncontained ECC memory error"
            assert ECC_GPU not in {g["uuid"] for g in gov.health_view()["gpus"]}

        async with governed(hub, tmp_path, url) as gov:  # and again
            await fresh_pass(gov)
            listed = {g["uuid"] for g in gov.health_view()["gpus"]}
            assert LOST_GPU in listed and ECC_GPU not in listed
            assert set(gov.store.dismissals()) == {ECC_GPU}


async def test_a_failure_claimed_on_a_device_no_gpu_is_named_is_not_listed_nor_a_series(tmp_path):
    """A report's device may be named anything up to 1,024 characters: a failure claimed on 64
    devices named no GPU's way (1,000 characters each) was listed on the health page, put on
    /metrics as 64 series with 1 kB labels, and held the server's culls as "gpu-failed"; no
    admin could dismiss such a claim (an admin names a GPU by its UUID). A GPU's name is
    ``GPU-…``/``MIG-…`` (NVML's, DCGM's, the simulator's): such a claim is no GPU's, ignored."""
    async with FakeHub() as hub, contextlib.AsyncExitStack() as stack:
        hub.add_server("bob")
        gov = await stack.enter_async_context(governed(hub, tmp_path))
        named = [f"{n:02d}" + "x" * 998 for n in range(64)]
        report = failed_report("bob", named[0])
        report["devices"] = [{**report["devices"][0], "uuid": uuid} for uuid in named]
        report["targets"][0]["gpu"]["devices"] = named
        gov.ingest(report)
        await gov.reconcile()
        assert gov.health_view()["gpus"] == []
        assert [s for s in metrics.GPU_UNHEALTHY.collect()[0].samples] == []
        assert gov.verdict("bob/")["state"] != "gpu-failed"
        gov.ingest(failed_report("bob", "GPU-0000-lost"))  # a GPU's name: believed, as ever
        await gov.reconcile()
        assert gov.verdict("bob/")["state"] == "gpu-failed"
        (gpu,) = gov.health_view()["gpus"]
        assert gpu["uuid"] == "GPU-0000-lost"
