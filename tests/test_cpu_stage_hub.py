"""A CPU stage on a workstation, on a real hub: the profile layer's allocator hands out a
simulated H100, a dcgm-exporter (served here) reads it idle, and the governor runs as the hub's
managed service, on the hub's host (it reaches the Hub on 127.0.0.1).

nia  her server sends no GPU report (no governor URL); a cell of hers computes on the CPU
     (a tokeniser, a join) while her GPU idles. The governor reads her server's process tree
     as the kernel accounts it (the pid the Hub's records give), not anything she sends.
"""

from __future__ import annotations

import html
import re

import pytest
from fake_dcgm_exporter import FakeExporter
from governor_harness import Gov, governed_hub, start_all, wait

from jupyter_gpu_gov.core.cpu_stage import CPU_STAGE_WORDS
from jupyter_gpu_gov.gpu.simulated import leaf_devices

pytestmark = pytest.mark.timeout(300)

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
(UUID,) = [leaf["uuid"] for leaf in leaf_devices([H100])]
PROFILES = f"""
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = {[H100]!r}
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
c.GpuProfiles.tiers = [{{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}}]
c.GpuProfiles.quotas = {{"vision": {{"guaranteed": {{"h100": 1}}}}}}
c.GpuProfiles.default_team = "vision"
add_gpu_profiles(c, spawner="simple")
"""
# busy_grace 25 s: a server whose cells DCGM alone cannot see is culled then, unless its CPU
# shows a stage (seen in a few seconds here: cpu_stage_after 3 s).
POLICIES = [
    {
        "name": "stage",
        "match": {"users": ["nia"]},
        "warn_after": "5m",
        "cull_after": "10m",
        "busy_grace": "25s",
        "busy_limit": "10m",
        "extension_step": "1h",
    }
]
# A thread in her kernel: a CPU stage, one core while the machine lets it.
CPU_STAGE = """
import threading

def stage():
    while True:
        pass

threading.Thread(target=stage, daemon=True).start()
"""


class Exporter(FakeExporter):
    """dcgm-exporter's ``/metrics``: the card idle."""

    def answer(self, request) -> None:
        labels = f'gpu="0",UUID="{UUID}",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"'
        body = f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} 0.0\n".encode()
        request.send_response(200)
        request.send_header("Content-Type", "text/plain; version=0.0.4")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)


@pytest.fixture(scope="module")
def exporter():
    exporter = Exporter()
    yield exporter
    exporter.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, exporter):
    harness = governed_hub(
        tmp_path_factory.mktemp("cpu-stage"),
        silent_users=("nia",),
        extra_policies=POLICIES,
        hub_config=PROFILES,
        singleuser_config=f"c.GpuGovApp.simulated_devices = {[H100]!r}\n",
        governor_config=(
            f"c.GpuGovernor.dcgm_exporter_urls = [{exporter.url!r}]\n"
            "c.GpuGovernor.dcgm_timeout = 2\n"
            "c.GpuGovernor.dcgm_max_age = 5\n"
            # A tenth of a core for 3 s: a computing thread on a loaded test machine.
            "c.GpuGovernor.cpu_stage_cores = 0.1\n"
            "c.GpuGovernor.cpu_stage_after = 3\n"
        ),
    )
    with harness as hub:
        hub.create_user("govadmin")
        start_all(hub, {"nia": {"profile": "h100"}})
        Gov(hub).wait_up()
        yield hub


def test_a_cpu_stage_is_busy_on_the_dashboard_and_extend_moves_its_limit(hub):
    """Past busy_grace nia's server is listed busy, on the admin's dashboard too, with the
    words naming the cause, not culled; her Extend (the governor's route the button calls)
    moves its limit. With ``cpu_stage_cores = 0`` it is listed idle (DCGM alone), never busy:
    this fails (checked)."""
    gov = Gov(hub)
    hub.execute("nia", hub.start_kernel("nia"), CPU_STAGE)
    try:
        busy = wait(lambda: (v := gov.verdict("nia"))["state"] == "busy" and v, 120, "the notice")
    except AssertionError:
        said = [line for line in hub.log_path.read_text().splitlines() if "gpu-gov:" in line]
        raise AssertionError((gov.verdict("nia"), gov.actions("nia/"), said[-20:])) from None
    assert CPU_STAGE_WORDS in busy["reason"] and "press Extend" in busy["reason"], busy
    actions = gov.actions("nia/")
    assert "busy-notice" in actions and "cull" not in actions, actions
    assert hub.api("GET", "users/nia").json()["servers"], "nia's server was stopped"

    page = hub.get(f"{hub.url}/services/gpu-gov/", token=hub.token("govadmin"))
    assert page.status_code == 200, page.text[:300]
    row = re.search(r'<tr data-server="nia/">.*?</tr>', page.text, re.S)
    assert row, page.text[:2000]
    state = re.search(r'<span class="state (\w+)" title="([^"]*)">', row[0])
    assert state and state[1] == "busy", row[0]
    assert CPU_STAGE_WORDS in html.unescape(state[2]), state[2]

    r = gov.call("POST", "users/nia/server/extend", hub.token("nia"), json={"reason": "a join"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "granted", r.json()
    after = r.json()["verdict"]
    assert after["cull_at"] > busy["cull_at"], (busy, after)
    assert "extend" in gov.actions("nia/")
