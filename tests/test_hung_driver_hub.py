"""A GPU driver that hangs, on a real workstation hub: the hub's allocator (``LocalGpus``) reads
two H100s through the real ``pynvml`` over the fake NVML library (tests/fake_pynvml.py), whose
every call blocks while the file ``hang`` exists in the hub's directory, as a GPU lost from the
bus or GSP timeouts make NVML calls wait for minutes.

The allocator read NVML in the Hub's event loop (the spawn form, admission, the line): while
the driver hung, the Hub served nothing, no login, no REST API (the governor's passes failed),
no other spawn. Now a read runs in one worker thread, awaited for ``READ_WAIT_S`` at most.
"""

from __future__ import annotations

import html
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from hub_harness import hub_fixture

from jupyter_gpu_gov.profiles import local

pytestmark = pytest.mark.timeout(300)

TESTS = Path(__file__).parent
CONFIG = f"""
import os, sys, threading, time

import pytest

sys.path.insert(0, {str(TESTS)!r})
from fake_pynvml import FakeGpu, install

from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

_H100 = dict(name="NVIDIA H100 80GB HBM3", memory_total_mb=81559)
_fake = install(pytest.MonkeyPatch(), FakeGpu("GPU-a", **_H100), FakeGpu("GPU-b", **_H100))
_hang = os.path.join(HARNESS_DIR, "hang")
_stuck = set()  # the threads a call blocked, counted in the file "stuck" at each block


def _blocking(function):
    def call(*args):
        if os.path.exists(_hang):
            _stuck.add(threading.get_ident())
            with open(os.path.join(HARNESS_DIR, "stuck"), "w") as f:
                f.write(str(len(_stuck)))
            while os.path.exists(_hang):
                time.sleep(0.05)
        return function(*args)

    return call


_fake.functions = {{name: _blocking(f) for name, f in _fake.functions.items()}}
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 120}}  # the REST API answers the outcome
c.LocalGpus.backend = "nvml"
c.GpuProfiles.tiers = [{{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}}]
c.GpuProfiles.quotas = {{"lab": {{"guaranteed": {{"h100": 2}}}}}}
c.GpuProfiles.default_team = "lab"
c.GpuProfiles.require_project = False
add_gpu_profiles(c, spawner="simple")
"""

hub = hub_fixture(users=["alice", "bob"], extra_config=CONFIG)


def h100_line(hub, user: str) -> tuple[str, str]:
    """The spawn form's line for the H100 tier (css class, sentence)."""
    r = hub.login(user).get(hub.spawn_page_url(user), allow_redirects=False, timeout=60)
    assert r.status_code == 200, r.text[:2000]
    found = re.search(r'<li class="(\w+)" data-team="lab">(.*?)</li>', r.content.decode(), re.S)
    assert found, r.text[:3000]
    return found[1], html.unescape(found[2])


def page_ms(hub, user: str) -> float:
    """How long the Hub took for the last answer of ``user``'s spawn page, by its own log
    (JupyterHub logs each request with its time): not a login's nor a loaded client's."""
    times = re.findall(
        rf"200 GET /hub/spawn/{user} \({user}@[^)]*\) ([\d.]+)ms", hub.log_tail(10**6)
    )
    assert times, hub.log_tail(3000)
    return float(times[-1])


def wait(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_hung_driver_neither_freezes_the_hub_nor_hands_out_a_card(hub):
    hang, stuck = hub.workdir / "hang", hub.workdir / "stuck"
    assert h100_line(hub, "alice")[0] == "ok"  # the driver answers: both cards are free

    hang.touch()
    spawned: dict = {}

    def spawn():
        started = time.monotonic()
        spawned["response"] = requests.post(  # its own connection: the harness's is for this
            f"{hub.hub_api_url}/users/bob/server",
            json={"profile": "h100"},
            headers={"Authorization": f"token {hub.api_token}"},
            timeout=120,
        )
        spawned["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=spawn, daemon=True)
    thread.start()
    try:
        wait(stuck.exists, "the spawn's read of the cards to block in the driver")
        # Meanwhile the Hub answers: its REST API (what the governor reads) and its pages (the
        # driver still hangs: the old code answered neither until it came back).
        r = hub.api("GET", "users", timeout=30)
        assert r.status_code == 200, r.text
        r = hub.get(f"{hub.url}/hub/login", timeout=30)
        assert r.status_code == 200, r.text[:500]

        thread.join(timeout=120)
        assert not thread.is_alive(), "the spawn never answered"
        r = spawned["response"]
        assert r.status_code == 403, r.text
        message = r.json()["message"]
        assert message.startswith("GPU state unknown: the GPUs of this machine have not"), message
        assert "none is handed out until they answer" in message, message
        assert spawned["seconds"] >= local.READ_WAIT_S - 1, (
            spawned
        )  # it waited for the driver first
        assert not hub.api("GET", "users/bob").json()["servers"]

        # Once hung past the bound, the form answers at once, each tier saying why (a form
        # that waited on the driver again would take READ_WAIT_S).
        css, sentence = h100_line(hub, "alice")
        assert page_ms(hub, "alice") < local.READ_WAIT_S * 1000
        assert css == "refused" and "GPU state unknown" in sentence, (css, sentence)
        r = hub.api("POST", "users/alice/server", json={"profile": "h100"}, timeout=60)
        assert r.status_code == 403 and "GPU state unknown" in r.json()["message"], r.text
        # A read still running is not started again: one thread waits in the driver.
        assert stuck.read_text() == "1"
    finally:
        hang.unlink()

    # The driver answers again: the cards are handed out, without restarting anything.
    wait(lambda: h100_line(hub, "alice")[0] == "ok", "the form to show the cards again")
    r = hub.api("POST", "users/bob/server", json={"profile": "h100"}, timeout=120)
    assert r.status_code in (201, 202), r.text
    server = hub.wait_for_server("bob")
    assert server is not None
    state = hub.api("GET", "users/bob").json()["servers"][""]["state"]
    assert state["gpu_gov_devices"] in (["GPU-a"], ["GPU-b"]), state


def test_a_hub_whose_driver_hangs_still_stops(hub):
    """The read waiting in the driver ran in an executor's thread, which Python joins at exit:
    the Hub, stopped or restarted (an admin's first move with a GPU in a bad state), never
    exited while the driver hung (systemd kills it after its stop timeout)."""
    hang, stuck = hub.workdir / "hang", hub.workdir / "stuck"
    stuck.unlink(missing_ok=True)
    hang.touch()
    try:
        assert h100_line(hub, "alice")[0] == "refused"  # a read now waits in the driver
        assert stuck.exists()
        hub.proc.send_signal(signal.SIGTERM)
        try:
            hub.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the hub did not exit while its GPU driver hung")
    finally:
        hang.unlink()
    hub.restart()  # the module's hub, for whatever comes after
