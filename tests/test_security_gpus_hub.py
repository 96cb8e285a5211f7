"""Escaping governance on a real hub (issue 18, items 5 and 8): the profile layer's workstation
allocator hands out simulated H100s, a dcgm-exporter (served here, over HTTP, with the series
dcgm-exporter writes) reads the cards, and the governor runs as the hub's managed service.

mallory  spawns through the REST API with ``gpu-gov/exempt`` in her user_options, then reports
         for her server (she switched its reporting off) with no devices, another card's
         UUID, and an "unavailable" backend, while DCGM sees her card idle
bea      works at 95 % on her card while the exporter, which last said "idle", starts to
         trickle its answers four bytes at a time
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from fake_dcgm_exporter import FakeExporter
from governor_harness import Gov, governed_hub, kernel_with, start_all, wait
from hub_harness import HubHarness

from jupyter_gpu_gov.gpu.simulated import leaf_devices

pytestmark = pytest.mark.timeout(300)

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
DEVICES = [H100, H100, H100]
UUIDS = [leaf["uuid"] for leaf in leaf_devices(DEVICES)]
PROFILES = f"""
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = {DEVICES!r}
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
c.GpuProfiles.tiers = [{{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}}]
c.GpuProfiles.quotas = {{"vision": {{"guaranteed": {{"h100": 3}}}}}}
c.GpuProfiles.default_team = "vision"
add_gpu_profiles(c, spawner="simple")
"""
POLICIES = [
    {"name": "watched", "match": {"users": ["mallory"]}, "warn_after": "1s", "cull_after": "10m"},
    {"name": "worker", "match": {"users": ["bea"]}, "warn_after": "10m", "cull_after": "20m"},
]


class Exporter(FakeExporter):
    """dcgm-exporter's ``/metrics`` for the three cards: each card's graphics-engine activity,
    as set here; or, once ``drip`` is set, four bytes a second."""

    def __init__(self):
        self.activity = dict.fromkeys(UUIDS, 0.0)
        self.drip = threading.Event()
        super().__init__()

    def answer(self, request: BaseHTTPRequestHandler) -> None:
        request.send_response(200)
        request.send_header("Content-Type", "text/plain; version=0.0.4")
        try:
            if self.drip.is_set():
                request.send_header("Content-Length", str(4 * 120))
                request.end_headers()
                for _ in range(120):
                    request.wfile.write(b"# a\n")
                    request.wfile.flush()
                    time.sleep(1)
                return
            lines = []
            for index, uuid in enumerate(UUIDS):
                labels = (
                    f'gpu="{index}",UUID="{uuid}",device="nvidia{index}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="workstation"'
                )
                value = self.activity[uuid]
                lines.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {value}\n")
            body = "".join(lines).encode()
            request.send_header("Content-Length", str(len(body)))
            request.end_headers()
            request.wfile.write(body)
        except OSError:  # the reader gave up
            pass


@pytest.fixture(scope="module")
def exporter():
    exporter = Exporter()
    yield exporter
    exporter.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, exporter):
    harness = governed_hub(
        tmp_path_factory.mktemp("security-gpus"),
        silent_users=("mallory",),
        extra_policies=POLICIES,
        hub_config=PROFILES,
        singleuser_config=f"c.GpuGovApp.simulated_devices = {DEVICES!r}\n",
        governor_config=(
            f"c.GpuGovernor.dcgm_exporter_urls = [{exporter.url!r}]\n"
            "c.GpuGovernor.dcgm_timeout = 2\n"
            "c.GpuGovernor.dcgm_max_age = 5\n"
        ),
    )
    with harness as hub:
        hub.create_user("govadmin")
        # Through the REST API, as any user may: her choices, and a label that would exempt her.
        options = {"profile": "h100", "project": "demo", "gpu-gov/exempt": "true"}
        start_all(hub, {"mallory": options, "bea": {"profile": "h100"}})
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def card_of(hub: HubHarness, user: str) -> str:
    state = hub.api("GET", f"users/{user}").json()["servers"][""]["state"]
    (uuid,) = state["gpu_gov_devices"]
    return uuid


def forged(hub: HubHarness, user: str, **changes) -> dict:
    """The user's own server's report (its status page), changed as she likes."""
    r = hub.get(hub.user_url(user, "jupyter-gpu-gov/status"), token=hub.token(user))
    assert r.status_code == 200, r.text
    report = r.json()
    report.pop("verdict", None)
    report.update(changes)
    return report


def test_a_user_cannot_exempt_herself(hub, gov, exporter):
    """Item 5: ``gpu-gov/exempt`` from user_options is no label; a report that hides her card,
    names another's busy card, or says its backend is unavailable is not believed: DCGM's
    reading of the card the allocator gave her is."""
    mine = card_of(hub, "mallory")
    busy = next(u for u in UUIDS if u not in (mine, card_of(hub, "bea")))
    exporter.activity.update({mine: 0.0, busy: 0.97})
    listed = next(
        s for s in gov.admin("GET", "servers").json()["servers"] if s["user"] == "mallory"
    )
    assert "gpu-gov/exempt" not in listed["labels"], listed["labels"]
    assert listed["labels"]["gpu-gov/tier"] == "h100" and listed["project"] == "demo"

    # Each lie must find her warned (DCGM reads her card idle; her policy warns after 1 s):
    # only bea's spawn, after hers, gave the governor that time before.
    wait(lambda: gov.verdict("mallory")["state"] == "warned", 60, "mallory's idle card warned")
    token = hub.token("mallory")
    own = forged(hub, "mallory")
    device = {**own["devices"][0], "uuid": busy, "activity": 0.97}
    lies = {
        "no device": {"devices": [], "targets": []},
        "another card": {
            "devices": [device],
            "window": {**own["window"], "gpu_active_fraction": 1.0},
        },
        "unavailable": {"backend": "unavailable", "error": "NVML gone", "devices": []},
    }
    seen = {}
    for what, changes in lies.items():  # each for a few passes (every 0.5 s)
        states = seen[what] = set()
        for _ in range(8):
            r = gov.call("POST", "reports", token, json=forged(hub, "mallory", **changes))
            assert r.status_code == 200, r.text
            states.add(r.json()["verdict"]["state"])
            time.sleep(0.5)
    # DCGM sees her card idle: warned (her policy warns after 1 s), whatever she reports.
    assert seen == {what: {"warned"} for what in lies}, seen
    distrusted = [a["reason"] for a in gov.audit("mallory/") if a["action"] == "report-distrusted"]
    assert any("it reports no GPU" in reason for reason in distrusted), distrusted
    assert any(f"it reports GPU {busy!r}, which is not its own" in r for r in distrusted), (
        distrusted
    )


def test_stale_dcgm_is_unknown_never_idle(hub, gov, exporter):
    """Item 8: the exporter's last answer said bea's card was idle; then it trickles. Its old
    "idle" must not outweigh her report of work at 95 %: stale DCGM is unknown, and her report
    is what is known."""
    card = card_of(hub, "bea")
    exporter.activity[card] = 0.0
    tab = kernel_with(hub, "bea", "from jupyter_gpu_gov import simulate; simulate.hold(4096)")
    try:
        wait(lambda: gov.verdict("bea")["state"] == "idle", 30, "bea's idle card to be seen idle")
        exporter.drip.set()
        work = "from jupyter_gpu_gov import simulate; simulate.hold(1024); simulate.load(0.95, 120)"
        hub.execute("bea", hub.start_kernel("bea"), work)
        active = wait(
            lambda: (v := gov.verdict("bea"))["state"] == "active" and v, 30, "bea seen working"
        )
        states = set()
        for _ in range(20):  # and so she stays, however old DCGM's "idle" gets
            states.add(gov.verdict("bea")["state"])
            time.sleep(0.5)
    finally:
        exporter.drip.clear()
        tab.close()
    assert states == {"active"}, states
    assert "DCGM" not in active["reason"], active  # DCGM is unknown now: not its "idle"
