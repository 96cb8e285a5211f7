"""A GPU driver that hangs, under a real single-user server: ``jupyter server`` with this
extension reads a fake H100 through the real ``pynvml`` over the fake NVML library
(tests/fake_pynvml.py), whose every call blocks for as long as the file ``hang`` exists, as a
GPU lost from the bus or GSP timeouts make NVML calls wait for minutes (or for ever).

The sampler ran its ticks in a ``ThreadPoolExecutor``, and the extension's stop waited for it:
a server asked to stop (the Hub's stop, SIGTERM, the shutdown API) never exited while a tick
waited in the driver, and its kernels were never shut down, until the spawner's SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.timeout(240)

TESTS = Path(__file__).parent
LAUNCHER = """
import os, sys, time

import pytest

sys.path.insert(0, {tests!r})
from fake_pynvml import FakeGpu, install

_fake = install(
    pytest.MonkeyPatch(), FakeGpu("GPU-a", name="NVIDIA H100 80GB HBM3", memory_total_mb=81559)
)
_hang, _stuck = {hang!r}, {stuck!r}


def _blocking(function):
    def call(*args):
        if os.path.exists(_hang):
            open(_stuck, "w").close()
            while os.path.exists(_hang):  # the test never ends it: the driver never answers
                time.sleep(0.05)
        return function(*args)

    return call


_fake.functions = {{name: _blocking(f) for name, f in _fake.functions.items()}}

from jupyter_server.serverapp import main

sys.exit(main())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def hung_server(tmp_path):
    """A running server whose sampler's tick is stuck in the driver: (process, url, token)."""
    hang, stuck = tmp_path / "hang", tmp_path / "stuck"
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER.format(tests=str(TESTS), hang=str(hang), stuck=str(stuck)))
    config = tmp_path / "jupyter_server_config.json"
    config.write_text(
        json.dumps(
            {
                "ServerApp": {"jpserver_extensions": {"jupyter_gpu_gov": True}},
                "GpuGovApp": {"backend": "nvml", "sample_interval": 0.5, "governor_url": ""},
            }
        )
    )
    port, token = _free_port(), "hung-driver-test"
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp_path),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_GPU_GOV_BACKEND": "nvml",
        "CUDA_VISIBLE_DEVICES": "GPU-a",
    }
    env.pop("JUPYTERHUB_API_TOKEN", None)
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(launcher),
            "--allow-root",
            "--no-browser",
            f"--port={port}",
            "--ip=127.0.0.1",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path}",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"token {token}"}

    def sampled() -> bool:
        try:
            r = requests.get(f"{url}/jupyter-gpu-gov/status", headers=headers, timeout=20)
        except requests.ConnectionError:
            return False
        return r.status_code == 200 and r.json()["backend"] == "nvml"

    try:
        wait(sampled, "the server's first GPU sample", timeout=120)
        hang.touch()
        wait(stuck.exists, "a tick to block in the driver")
        yield proc, url, headers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        hang.unlink(missing_ok=True)
        log.close()
        print((tmp_path / "server.log").read_text()[-4000:])


def _exits(proc, how: str, timeout: float = 30) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit within {timeout:g} s of {how} while its driver hung")


def test_a_server_whose_driver_hangs_stops_on_sigterm(hung_server):
    proc, _, _ = hung_server
    proc.send_signal(signal.SIGTERM)
    _exits(proc, "SIGTERM")


def test_a_server_whose_driver_hangs_stops_through_its_shutdown_api(hung_server):
    proc, url, headers = hung_server
    r = requests.post(f"{url}/api/shutdown", headers=headers, timeout=20)
    assert r.status_code == 200, r.text
    _exits(proc, "its shutdown API")
