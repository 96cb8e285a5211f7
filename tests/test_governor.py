"""The governor's reconcile against a fake Hub API and a real HTTP endpoint serving the real
dcgm-exporter samples; its command line; its store across restarts."""

from __future__ import annotations

import copy
import socket
from datetime import timedelta
from pathlib import Path

import pytest
from fake_hub_api import FakeHub
from test_dcgm import FIXTURES
from test_report import REPORT
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.policy import Record, load_policies
from jupyter_gpu_gov.hub.app import GpuGovernor, normalise_argv
from jupyter_gpu_gov.hub.dcgm import DcgmSource
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.reconcile import Governor, Options
from jupyter_gpu_gov.hub.store import SCHEMA_VERSION, MetaRow, ServerRow, Store, set_record

H100_IDLE_GPU = "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a"  # GPU 1: GPU_UTIL 0, unattributed
T4_BUSY_GPU = "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"


def report_for(user: str, uuid: str, sm: float) -> dict:
    r = copy.deepcopy(REPORT)
    r["server"]["user"] = user
    r["sampled_at"] = clock.isoformat(clock.utcnow())
    r["devices"][0]["uuid"] = uuid
    r["targets"][0]["gpu"].update(devices=[uuid], sm=sm)
    r["window"]["gpu_active_fraction"] = 1.0 if sm >= 0.05 else 0.0
    r["window"]["gpu_idle_since"] = r["sampled_at"] if sm < 0.05 else None
    return r


class Exporter:
    """dcgm-exporter's /metrics, serving the fixture files as they are."""

    def __init__(self, *names: str):
        text = "".join((FIXTURES / n).read_text() for n in names)

        class Metrics(web.RequestHandler):
            def get(self):
                self.set_header("Content-Type", "text/plain; version=0.0.4")
                self.finish(text)

        sockets = bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/metrics"
        self.server = HTTPServer(web.Application([(r"/metrics", Metrics)]))
        self.server.add_sockets(sockets)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/metrics"


def governor(hub: FakeHub, tmp_path: Path, dcgm_url: str | None = None, **options) -> Governor:
    policies = load_policies([], {"warn_after": "1h", "cull_after": "2h"})
    dcgm = DcgmSource(exporter_urls=[dcgm_url], timeout_s=2) if dcgm_url else None
    return Governor(
        Store(f"sqlite:///{tmp_path / 'gov.sqlite'}"),
        HubApi(hub.api_url, hub.token),
        policies,
        Options(**options),
        dcgm,
    )


async def test_dcgm_idle_wins_over_a_report_saying_active(tmp_path):
    exporter = Exporter("h100-8gpu-k8s-pod-attributed.txt", "t4-default-counters-busy.txt")
    async with FakeHub() as hub:
        hub.add_server("alice")
        hub.add_server("bob")
        gov = governor(hub, tmp_path, exporter.url)
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.9))  # claims work; DCGM: idle
        gov.ingest(report_for("bob", T4_BUSY_GPU, sm=0.0))  # claims idle; DCGM: busy
        result = await gov.reconcile()
    exporter.server.stop()

    alice, bob = gov.verdict("alice/"), gov.verdict("bob/")
    assert alice["state"] == "idle"
    assert "the report says active but the trusted source says idle" in alice["reason"]
    (audit,) = [a for a in gov.store.audit_rows("alice/") if a.action == "state"]
    assert "trusted source says idle" in audit.reason  # the disagreement is on record
    assert bob["state"] == "active" and "DCGM" in bob["reason"]
    assert result.dcgm_errors == ()


async def test_unreachable_dcgm_degrades_to_reports(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path, closed_port_url())
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.9))
        result = await gov.reconcile()
    assert result.dcgm_errors and gov.verdict("alice/")["state"] == "active"


async def test_team_from_group_properties_and_user_options(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice")
        hub.add_server("bob", user_options={"gpu-gov/team": "nlp", "gpu-gov/project": "llm"})
        hub.add_group("vision-team", users=["alice"], properties={"gpu-gov/team": "vision"})
        gov = governor(hub, tmp_path)
        await gov.reconcile()
    alice, bob = gov.store.server("alice/"), gov.store.server("bob/")
    assert (alice.team, alice.labels["gpu-gov/team"]) == ("vision", "vision")
    assert (bob.team, bob.project) == ("nlp", "llm")


async def test_excluded_servers_are_not_governed(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("root", last_activity=clock.utcnow() - timedelta(days=3))
        hub.users["root"].admin = True
        hub.add_server("alice", last_activity=clock.utcnow() - timedelta(days=3))
        gov = governor(hub, tmp_path, cull_admin_users=False)
        await gov.reconcile()
        assert hub.running("root") and not hub.running("alice")
    assert gov.verdict("root/")["state"] == "exempt"
    assert "cull_admin_users=False" in gov.store.server("root/").reason


async def test_dry_run_records_the_cull_and_stops_nothing(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice", last_activity=clock.utcnow() - timedelta(days=3))
        gov = governor(hub, tmp_path, dry_run=True)
        await gov.reconcile()
        assert hub.running("alice")
    (cull,) = [a for a in gov.store.audit_rows("alice/") if a.action == "cull"]
    assert cull.dry_run and "idle-culler rule" in cull.reason


def test_idle_culler_options_in_both_forms(tmp_path):
    app = GpuGovernor()
    app.initialize(
        [
            "--timeout=900",
            "--cull-every",
            "30",
            "--cull-users",
            "--remove-named-servers=true",
            "--cull-admin-users=false",
            "--cull_default_servers=False",
            "--max-age=86400",
            "--concurrency=4",
            "--api-page-size=200",
            "--ssl-enabled=false",
            "--internal-certs-location=/srv/certs",
            "--url=http://hub:8081/hub/api",
        ]
    )
    assert (app.timeout, app.cull_every, app.max_age) == (900, 30, 86400)
    assert (app.cull_users, app.remove_named_servers) == (True, True)
    assert (app.cull_admin_users, app.cull_default_servers, app.cull_named_servers) == (
        False,
        False,
        True,
    )
    assert (app.concurrency, app.api_page_size, app.url) == (4, 200, "http://hub:8081/hub/api")
    assert app.internal_certs_location == "/srv/certs"
    default = app.policy_list[-1]
    assert default.inactive_timeout == timedelta(seconds=900) and default.max_age == timedelta(
        days=1
    )
    assert normalise_argv(["--dry-run", "--GpuGovernor.timeout=5"]) == [
        "--dry-run=true",
        "--GpuGovernor.timeout=5",
    ]


def test_bad_policy_stops_start_up_naming_entry_and_key(tmp_path):
    config = tmp_path / "gov.py"
    config.write_text('c.GpuGovernor.policies = [{"name": "short", "cull_afterr": "1h"}]\n')
    app = GpuGovernor()
    with pytest.raises(SystemExit) as info:
        app.initialize([f"--config={config}"])
    assert "policy 0 ('short'): unknown key 'cull_afterr'" in str(info.value)


def test_store_keeps_records_across_restarts_and_refuses_a_newer_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    store = Store(url)
    row = ServerRow(key="alice/", user="alice", name="")
    until = clock.utcnow() + timedelta(hours=2)
    set_record(row, Record(state="warned", extension_s=3600, extensions_used=1, exempt_until=until))
    store.save_servers([row])

    again = Store(url).server("alice/")
    assert (again.state, again.extension_s, again.extensions_used) == ("warned", 3600, 1)
    assert again.exempt_until == until  # timezone-aware UTC back out of SQLite

    with store.session() as session, session.begin():
        session.merge(MetaRow(key="schema_version", value=str(SCHEMA_VERSION + 1)))
    with pytest.raises(RuntimeError, match="newer than this jupyter-gpu-gov understands"):
        Store(url)


async def test_a_new_server_row_takes_column_defaults(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("carol")  # no report, fresh: every default column must be filled
        gov = governor(hub, tmp_path)
        await gov.reconcile()
    row = Store(f"sqlite:///{tmp_path / 'gov.sqlite'}").server("carol/")
    assert (row.reports, row.extensions_used, row.approval_pending) == (False, 0, False)


async def test_admin_exempts_then_culls_now_with_reasons_on_record(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path)
        gov.ingest(report_for("alice", H100_IDLE_GPU, sm=0.0))
        await gov.reconcile()
        assert gov.verdict("alice/")["state"] == "idle"

        until = clock.utcnow() + timedelta(days=2)
        outcome = await gov.exempt("alice/", "user:root", until, "batch standby machine")
        assert outcome["verdict"]["state"] == "exempt"
        await gov.reconcile()
        assert gov.verdict("alice/")["state"] == "exempt"

        outcome = await gov.cull_now("alice/", "user:root", "maintenance")
        assert outcome["status"] == "stopped" and not hub.running("alice")
    actions = [(a.action, a.actor, a.reason) for a in gov.store.audit_rows("alice/")][::-1]
    assert actions[-2][:2] == ("exempt", "user:root") and "batch standby machine" in actions[-2][2]
    assert actions[-1] == ("cull", "user:root", "culled by user:root: maintenance")
    assert gov.row("alice/").cull_reason == "admin"
