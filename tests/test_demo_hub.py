"""The demo set-up end to end: a real JupyterHub, a real single-user server, simulated GPUs.

The single-user servers use the demo's own settings (hub_config/singleuser), so this also checks
that the demo configuration loads.
"""

import contextlib
import os
import signal
import time

from hub_harness import REPO, HubHarness, hub_fixture

hub = hub_fixture(
    servers=["alice"],
    singleuser_env={"JUPYTER_CONFIG_PATH": str(REPO / "hub_config" / "singleuser")},
)

STATUS = "jupyter-gpu-gov/status"


def test_user_server_answers_through_proxy(hub):
    r = hub.get(hub.user_url("alice", "api/status"), token=hub.token("alice"))
    assert r.status_code == 200, r.text
    assert "started" in r.json()


def test_gpu_status_with_token(hub):
    url = hub.user_url("alice", STATUS)
    deadline = time.monotonic() + 15  # the first sample may take a sample_interval
    while True:
        r = hub.get(url, token=hub.token("alice"))
        ok = r.status_code == 200 and r.json().get("devices")
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status_code == 200, f"{r.status_code} {r.text[:500]}\n{hub.log_tail(3000)}"
    body = r.json()
    assert {"schema", "backend", "devices", "targets"} <= body.keys()
    assert body["backend"] == "simulated"
    assert body["devices"]
    assert isinstance(body["targets"], list)


def test_kernel_holding_gpu_memory_shows_as_target(hub):
    """The README's demo: a notebook kernel calls simulate.hold(), the status shows it."""
    kernel_id = hub.start_kernel("alice")
    hub.execute("alice", kernel_id, "from jupyter_gpu_gov import simulate\nsimulate.hold(20480)")
    url = hub.user_url("alice", STATUS)
    deadline = time.monotonic() + 20  # a sample or two
    while True:
        body = hub.get(url, token=hub.token("alice")).json()
        kernels = [t for t in body["targets"] if t["kind"] == "kernel" and t["id"] == kernel_id]
        if (kernels and kernels[0]["gpu"]["memory_mb"]) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert kernels, body["targets"]
    assert kernels[0]["gpu"]["memory_mb"] == 20480
    assert sum(d["memory_used_mb"] for d in body["devices"]) >= 20480
    hub.execute("alice", kernel_id, "simulate.release()")


def test_gpu_status_without_token_is_refused(hub):
    r = hub.get(hub.user_url("alice", STATUS))
    assert r.status_code != 200
    assert r.status_code in (401, 403) or 300 <= r.status_code < 400, r.status_code
    if 300 <= r.status_code < 400:
        location = r.headers.get("Location", "")
        assert "login" in location or "oauth" in location, location


def test_harness_leaves_no_processes():
    with HubHarness(servers=["bob"], timeout=60) as h:
        pids = h.pids()
        workdir = h.workdir
        # hub, proxy and bob's server at least
        assert len(pids) >= 3, pids
    alive = [pid for pid in pids if _alive(pid)]
    assert not alive, f"left running: {alive}"
    assert not h.pids()
    assert not workdir.exists()


# A managed service that writes its pid and waits, as jupyterhub-idle-culler waits between its
# passes. The Hub starts it in a session of its own with only its entry's environment.
SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"


def test_harness_ends_managed_services_when_the_hub_died_first(tmp_path):
    """A hub killed before it stopped its managed services (teardown's sweep kills a hub still
    stopping after a second: under load, the full run left two jupyterhub-idle-cullers behind
    that way) leaves them to the sweep, which must find them."""
    pid_file = tmp_path / "service.pid"
    extra = f"""
        c.JupyterHub.services.append(
            {{"name": "sleeper", "command": [sys.executable, "-c", {SLEEPER!r}, {str(pid_file)!r}]}}
        )
    """
    service = None
    try:
        with HubHarness(workdir=tmp_path / "hub", extra_config=extra, timeout=60) as h:
            deadline = time.monotonic() + 60
            while not (pid_file.exists() and pid_file.read_text()):
                assert time.monotonic() < deadline, h.log_tail()
                time.sleep(0.2)
            service = int(pid_file.read_text())
            h.proc.kill()  # the hub dies without stopping its services
            h.proc.wait()
        deadline = time.monotonic() + 5  # SIGKILLed by then, but reaped by its reaper
        while _alive(service) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(service), "the hub's managed service outlived the harness"
    finally:
        if service is not None and _alive(service):
            with contextlib.suppress(ProcessLookupError):
                os.kill(service, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
