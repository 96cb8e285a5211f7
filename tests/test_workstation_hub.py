"""The workstation spawner, ``GpuLocalProcessSpawner``, on real parts: a real JupyterHub with it
(``add_gpu_profiles(c, spawner="local")``), real single-user servers started as the users' own
Unix accounts (JupyterHub's ``LocalProcessSpawner``: their uid, ``HOME`` and ``USER``), and the
hub's allocator reading two H100s through the real ``pynvml`` over the fake NVML library
(tests/fake_pynvml.py). What docs/profiles.md ("Workstations") promises: each server gets its
own card by UUID in ``CUDA_VISIBLE_DEVICES``, a spawn beyond the team's quota or the user's cap
is refused saying why, the card comes back when its server stops, and which server holds which
card survives a hub restart (``cleanup_servers = False``).

The Unix accounts are made for the test (``useradd``, removed after it) with uid 0: the
servers' Python lives where only root may read it (CI's and this machine's), and what is
tested is the allocator under LocalProcessSpawner, not the kernel's privilege drop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hub_harness import HubHarness

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("useradd"),
        reason="makes Unix accounts for the servers: needs root and useradd (CI has both)",
    ),
]

TESTS = Path(__file__).parent
USERS = ("gpuws-ann", "gpuws-ben", "gpuws-cyd")  # Unix accounts the test makes
ANN, BEN, CYD = USERS
DEVICES_STATE = "gpu_gov_devices"
CONFIG = f"""
import sys

import pytest

sys.path.insert(0, {str(TESTS)!r})
from fake_pynvml import FakeGpu, install

from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

_H100 = dict(name="NVIDIA H100 80GB HBM3", memory_total_mb=81559)
install(pytest.MonkeyPatch(), FakeGpu("GPU-a", **_H100), FakeGpu("GPU-b", **_H100))
c.JupyterHub.allow_named_servers = True
c.JupyterHub.cleanup_servers = False
c.LocalGpus.backend = "nvml"
c.GpuProfiles.tiers = [{{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}}]
c.GpuProfiles.quotas = {{"lab": {{"guaranteed": {{"h100": 2}}, "user_cap": 1}}}}
c.GpuProfiles.default_team = "lab"
c.GpuProfiles.require_project = False
add_gpu_profiles(c, spawner="local")
"""


@pytest.fixture(scope="module")
def accounts(tmp_path_factory):
    home = tmp_path_factory.mktemp("homes")
    made = []
    try:
        for name in USERS:
            if subprocess.run(["id", name], capture_output=True).returncode == 0:
                pytest.fail(f"a Unix account {name} exists already: remove it (userdel {name})")
            (home / name).mkdir()
            account = ["-o", "-u", "0", "-g", "0", "-M", "-s", "/usr/sbin/nologin"]
            subprocess.run(
                ["useradd", *account, "-d", str(home / name), name], check=True, capture_output=True
            )
            made.append(name)
        yield home
    finally:
        for name in made:  # -f: uid 0 "is used by" every root process
            subprocess.run(["userdel", "-f", name], check=True, capture_output=True)


@pytest.fixture(scope="module")
def hub(accounts, tmp_path_factory):
    with HubHarness(workdir=tmp_path_factory.mktemp("ws"), extra_config=CONFIG) as hub:
        yield hub


def spawn(hub: HubHarness, user: str, server: str = ""):
    path = f"users/{user}/servers/{server}" if server else f"users/{user}/server"
    hub.create_user(user)
    return hub.api("POST", path, json={"profile": "h100"}, timeout=120)


def started(hub: HubHarness, user: str, server: str = "") -> None:
    r = spawn(hub, user, server)
    assert r.status_code in (201, 202), f"{user}: {r.status_code} {r.text}"
    hub.started[(user, server)] = hub.wait_for_server(user, server)


def seen(hub: HubHarness, user: str) -> list[str]:
    """What a kernel of ``user``'s server sees: its Unix user, home, cards."""
    kernel = hub.start_kernel(user)
    code = (
        "import os; print(os.environ['USER'], os.getcwd(), os.environ['CUDA_VISIBLE_DEVICES'],"
        " os.environ['CUDA_DEVICE_ORDER'])"
    )
    return hub.execute(user, kernel, code).split()


def held(hub: HubHarness) -> dict[str, list[str]]:
    """Cards per running server, from the spawner state in the Hub's database."""
    return {
        f"{u['name']}/{name}": (s.get("state") or {}).get(DEVICES_STATE, [])
        for u in hub.api("GET", "users").json()
        for name, s in (u.get("servers") or {}).items()
    }


def test_each_server_gets_its_own_card_and_gives_it_back(hub, accounts):
    started(hub, ANN)
    started(hub, BEN)
    ann, ben = seen(hub, ANN), seen(hub, BEN)
    # Run as their own accounts (LocalProcessSpawner), in their homes, each on one card.
    assert ann[:2] == [ANN, str(accounts / ANN)], ann
    assert ben[:2] == [BEN, str(accounts / BEN)], ben
    assert {ann[2], ben[2]} == {"GPU-a", "GPU-b"}, (ann, ben)
    assert ann[3] == ben[3] == "PCI_BUS_ID"
    assert held(hub) == {f"{ANN}/": [ann[2]], f"{BEN}/": [ben[2]]}
    # The choices are the profile layer's to apply (at admission): JupyterHub (5.3+) logged
    # "Received unhandled user_options for ...: profile" at every GPU spawn, as if ignored.
    assert "unhandled user_options" not in hub.log_path.read_text(errors="replace")

    # Beyond the user's cap: a second server of hers is refused, saying why.
    r = spawn(hub, ANN, "second")
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert "You may hold 1 GPU" in message and "Stop one of your servers" in message, message
    # Beyond the team's quota (both cards held): refused, saying why, nothing started.
    r = spawn(hub, CYD)
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert message.startswith(
        "Team lab's guarantee of 2 H100 80 GB cards is in use, and there is no other H100 80 GB"
        " to borrow."
    ), message
    assert not hub.api("GET", f"users/{CYD}").json()["servers"]

    # A hub restart keeps the servers and which card each holds: still refused, still held.
    hub.restart()
    assert held(hub) == {f"{ANN}/": [ann[2]], f"{BEN}/": [ben[2]]}
    assert seen(hub, ANN)[2] == ann[2]  # the server lived through it
    r = spawn(hub, CYD)
    assert r.status_code == 403, r.text

    # Ann stops: her card comes back, and goes to the next server.
    hub.stop_server(ANN)
    started(hub, CYD)
    assert seen(hub, CYD)[:3] == [CYD, str(accounts / CYD), ann[2]]
    assert held(hub) == {f"{BEN}/": [ben[2]], f"{CYD}/": [ann[2]]}


SHARED_CARDS = f"""
import sys

import pytest

sys.path.insert(0, {str(TESTS)!r})
from fake_pynvml import FakeGpu, install

from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

_H100 = dict(name="NVIDIA H100 80GB HBM3", memory_total_mb=81559)
install(pytest.MonkeyPatch(), *(FakeGpu(f"GPU-{{i}}", **_H100) for i in "abc"))
c.JupyterHub.allow_named_servers = True
c.LocalGpus.backend = "nvml"
c.GpuProfiles.tiers = [
    {{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}},
    {{"name": "h100x2", "display_name": "Two H100s", "gpu": "H100-80GB", "count": 2}},
]
c.GpuProfiles.quotas = {{
    "vision": {{"guaranteed": {{"h100": 1}}, "tiers": "*"}},
    "nlp": {{"guaranteed": {{"h100": 2}}}},
}}
c.GpuProfiles.team_map = {{{ANN!r}: "vision", {BEN!r}: "nlp"}}
c.GpuProfiles.require_project = False
add_gpu_profiles(c, spawner="local")
"""


def test_a_borrowed_pair_is_asked_back_for_a_guarantee_on_one_card(accounts, tmp_path):
    """Three cards, two tiers on them (one card, a pair). Ann's pair is borrowed (vision has no
    guarantee on it); Ben holds one of nlp's two guaranteed cards. His second is refused while
    the pair holds the cards, and the pair is asked back. Before, only borrowed servers of the
    card's own tier were: "The only H100 80 GB card is in use. Try again later", nlp's
    guarantee never met while the pair ran."""
    with HubHarness(workdir=tmp_path, extra_config=SHARED_CARDS) as hub:
        hub.create_user(ANN)
        r = hub.api("POST", f"users/{ANN}/server", json={"profile": "h100x2"}, timeout=120)
        assert r.status_code in (201, 202), r.text
        hub.wait_for_server(ANN)
        started(hub, BEN)
        r = spawn(hub, BEN, "second")
        assert r.status_code == 403, r.text
        message = r.json()["message"]
        assert message.startswith(
            "All H100 80 GB cards are in use (2 by Two H100s servers), some borrowed by other"
            " teams beyond their guarantee. Team nlp is within its guarantee, so 2 are being"
            " taken back"
        ), message
        pair = hub.api("GET", f"users/{ANN}").json()["servers"][""]["state"]["gpu_gov_grant"]
        assert pair["gpu-gov/reclaim-for"] == "nlp", pair
