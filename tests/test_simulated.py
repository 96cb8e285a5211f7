"""The simulated GPU backend and the ``jupyter_gpu_gov.simulate`` API that drives it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from jupyter_gpu_gov import simulate
from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.models import GpuSnapshot
from jupyter_gpu_gov.gpu.simulated import DEFAULT_DEVICES, SimulatedBackend, leaf_devices

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
HOLDER = """
import sys
from jupyter_gpu_gov import simulate
simulate.hold({memory}, device={device!r})
simulate.load({sm}, device={device!r})
print("ready", flush=True)
sys.stdin.read()  # hold until the test closes stdin or kills us
"""


@pytest.fixture
def state(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "sim" / "state.json")
    monkeypatch.setenv("JUPYTER_GPU_GOV_SIM_STATE", path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return path


@pytest.fixture
def backend(state) -> SimulatedBackend:
    return SimulatedBackend(DEFAULT_DEVICES, state)


@pytest.fixture
def spawn() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _ready(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    assert line, f"subprocess died: {proc.stderr.read()}"
    return line


def _procs(snap: GpuSnapshot, index: int) -> dict[int, tuple[int | None, float | None]]:
    sample = snap.samples[snap.devices[index].uuid]
    return {p.pid: (p.memory_mb, p.sm) for p in sample.processes}


# --- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ("H100", "expected a dict"),
        ({"memory_mb": 1}, "'name'"),
        ({"name": " ", "memory_mb": 1}, "'name'"),
        ({"name": "X", "memory_mb": 0}, "'memory_mb'"),
        ({"name": "X", "memory_mb": True}, "'memory_mb'"),
        ({"name": "X", "memory_mb": "80GB"}, "'memory_mb'"),
        ({"name": "X", "memory_mb": 1, "memory_gb": 80}, "'memory_gb'"),
        ({**H100, "mig": "1g.10gb"}, "'mig'"),
        ({**H100, "mig": []}, "'mig'"),
        ({**H100, "mig": ["1g.10"]}, "'mig' [0]"),
        ({**H100, "mig": ["7g.80gb", "1g.10gb"]}, "compute slices"),
        ({"name": "X", "memory_mb": 40000, "mig": ["3g.40gb", "3g.40gb"]}, "'mig' needs"),
        ({**H100, "gpm": "yes"}, "'gpm'"),
        ({**H100, "minor_number": -1}, "'minor_number'"),
    ],
)
def test_config_errors_name_entry_and_key(state, entry, key):
    with pytest.raises(ValueError, match=r"simulated device 1: ") as err:
        SimulatedBackend([H100, entry], state)
    assert key in str(err.value)
    assert not os.path.exists(state)  # nothing written for a bad config


def test_default_devices():
    leaves = leaf_devices(DEFAULT_DEVICES)
    assert [leaf["index"] for leaf in leaves] == [0, 1, 2, 3, 4]
    assert leaves[0]["mig_profile"] is None and leaves[0]["memory_total_mb"] == 81559
    assert [leaf["mig_profile"] for leaf in leaves[1:]] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb",
    ]
    assert leaves[3]["memory_total_mb"] == 9984  # 9.75 GiB, as NVML reports a 1g.10gb
    assert leaves[3]["name"] == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    parents = {leaf["parent_uuid"] for leaf in leaves[1:]}
    assert len(parents) == 1 and None not in parents and leaves[0]["uuid"] not in parents


def test_uuids_are_stable_and_distinct(tmp_path):
    a = SimulatedBackend(DEFAULT_DEVICES, str(tmp_path / "a.json")).devices()
    b = SimulatedBackend(DEFAULT_DEVICES, str(tmp_path / "b.json")).devices()
    assert [d.uuid for d in a] == [d.uuid for d in b]
    assert len({d.uuid for d in a}) == 5
    # Pinned: a changed derivation would orphan every recorded UUID after an upgrade.
    assert a[0].uuid == "GPU-2860cef2-63ec-513c-a11d-7d774e3f8289"
    uuid_re = r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"
    assert re.fullmatch(f"GPU-{uuid_re}", a[0].uuid)
    assert all(re.fullmatch(f"MIG-{uuid_re}", d.uuid) for d in a[1:])
    assert all(re.fullmatch(f"GPU-{uuid_re}", d.parent_uuid) for d in a[1:])
    # Same name at another index is another card.
    two = leaf_devices([H100, H100])
    assert two[0]["uuid"] != two[1]["uuid"]


def test_minor_number_is_shared_by_mig_leaves(state):
    devices = SimulatedBackend([{**H100, "minor_number": 3, "mig": ["1g.10gb"]}], state).devices()
    assert devices[0].minor_number == 3
    assert SimulatedBackend([H100], state).devices()[0].minor_number is None


# --- hold / load / release ----------------------------------------------------------------------


def test_hold_load_release_in_this_process(backend):
    pid = os.getpid()
    assert backend.sample().samples[backend.devices()[0].uuid].processes == ()
    assert simulate.hold(1024) == 1024
    assert simulate.hold(512) == 1536
    assert simulate.load(0.25) == 0.25
    assert simulate.load(0.5) == 0.75
    snap = backend.sample()
    assert snap.backend == "simulated" and snap.available
    sample = snap.samples[snap.devices[0].uuid]
    assert sample.memory_used_mb == 1536 and sample.activity == 0.75
    assert _procs(snap, 0) == {pid: (1536, 0.75)}
    simulate.load(0.5)
    assert backend.sample().samples[snap.devices[0].uuid].activity == 1.0  # capped

    simulate.hold(100, device=3)
    simulate.release(device=0)
    snap = backend.sample()
    assert _procs(snap, 0) == {} and snap.samples[snap.devices[0].uuid].activity == 0.0
    assert _procs(snap, 3) == {pid: (100, None)}
    simulate.release()
    assert all(s.processes == () for s in backend.sample().samples.values())


def test_load_only_holds_a_context(backend):
    simulate.load(0.3, device=0)
    assert _procs(backend.sample(), 0) == {os.getpid(): (0, 0.3)}


def test_argument_errors_name_the_argument(backend):
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="memory_mb"):
            simulate.hold(bad)
    for bad in (-0.1, 1.01, float("nan"), "0.5"):
        with pytest.raises(ValueError, match="sm"):
            simulate.load(bad)
    with pytest.raises(ValueError, match="seconds"):
        simulate.load(0.5, seconds=0)
    with pytest.raises(ValueError, match="device 5 "):
        simulate.hold(1, device=5)
    with pytest.raises(ValueError, match="'GPU-nope'"):
        simulate.load(0.1, device="GPU-nope")
    with pytest.raises(ValueError, match=r"device must be .* got 1\.5"):
        simulate.release(device=1.5)
    assert all(s.processes == () for s in backend.sample().samples.values())


def test_no_devices_yet(state):
    with pytest.raises(ValueError, match="no simulated devices"):
        simulate.hold(1)
    assert simulate.devices() == []


def test_devices_lists_leaves(backend):
    leaves = simulate.devices()
    assert [leaf["uuid"] for leaf in leaves] == [d.uuid for d in backend.devices()]
    assert leaves[1]["reports_activity"] is False and leaves[0]["reports_activity"] is True


def test_load_expires_after_seconds(backend, monkeypatch):
    simulate.load(0.4, seconds=30)
    simulate.load(0.2)
    assert backend.sample().samples[backend.devices()[0].uuid].activity == pytest.approx(0.6)
    monkeypatch.setattr(clock, "_offset_s", 31.0)  # the sampler reads time via core.clock
    assert _procs(backend.sample(), 0) == {os.getpid(): (0, pytest.approx(0.2))}


def test_load_expires_in_real_time(backend):
    simulate.load(0.7, seconds=2.0)  # (the next line comes within 2 s on a loaded machine)
    assert _procs(backend.sample(), 0)[os.getpid()][1] == pytest.approx(0.7)
    deadline = time.monotonic() + 30
    while (load := _procs(backend.sample(), 0)[os.getpid()][1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert load == 0.0
    simulate.hold(1)  # any write prunes the expired load from the file
    with open(backend.state_path) as f:
        assert json.load(f)["processes"][0]["loads"] == []


def test_cuda_visible_devices_selects_default(backend, monkeypatch):
    devices = backend.devices()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    simulate.hold(10)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", devices[4].uuid)
    simulate.hold(20)
    simulate.hold(30, device=0)  # an explicit device wins over the environment
    snap = backend.sample()
    pid = os.getpid()
    assert _procs(snap, 2) == {pid: (10, None)}
    assert _procs(snap, 4) == {pid: (20, None)}
    assert _procs(snap, 0) == {pid: (30, 0.0)}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(ValueError, match="device 7 "):
        simulate.hold(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        simulate.hold(1)


def test_mig_activity_needs_gpm(state):
    backend = SimulatedBackend([H100, {**H100, "mig": ["1g.10gb"], "gpm": True}], state)
    simulate.hold(64, device=1)
    simulate.load(0.6, device=1)
    snap = backend.sample()
    assert snap.samples[snap.devices[1].uuid].activity == pytest.approx(0.6)
    assert _procs(snap, 1) == {os.getpid(): (64, pytest.approx(0.6))}

    # The same card without GPM: same UUIDs, the process keeps its memory, activity is unknown.
    backend = SimulatedBackend([H100, {**H100, "mig": ["1g.10gb"]}], state)
    snap = backend.sample()
    assert snap.samples[snap.devices[1].uuid].activity is None  # unknown, not idle
    assert snap.samples[snap.devices[1].uuid].memory_used_mb == 64
    assert _procs(snap, 1) == {os.getpid(): (64, None)}


# --- other processes ----------------------------------------------------------------------------


def test_subprocess_load_and_kill_frees_memory(backend, spawn):
    proc = spawn("-c", HOLDER.format(memory=2048, sm=0.5, device=0))
    _ready(proc)
    simulate.hold(100)
    snap = backend.sample()
    assert _procs(snap, 0) == {proc.pid: (2048, 0.5), os.getpid(): (100, 0.0)}
    assert snap.samples[snap.devices[0].uuid].memory_used_mb == 2148
    proc.kill()
    proc.wait()
    assert _procs(backend.sample(), 0) == {os.getpid(): (100, 0.0)}


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_zombie_and_reused_pid_hold_nothing(backend, spawn):
    proc = spawn("-c", HOLDER.format(memory=512, sm=0.1, device=0))
    _ready(proc)
    proc.kill()
    deadline = time.monotonic() + 10
    while _procs(backend.sample(), 0) and time.monotonic() < deadline:
        time.sleep(0.02)  # exited but not reaped yet: the driver has freed its memory
    assert _procs(backend.sample(), 0) == {}
    proc.wait()

    # An entry whose PID now belongs to another process (start time differs) is not ours.
    with open(backend.state_path) as f:
        state = json.load(f)
    state["processes"].append(
        {
            "pid": os.getpid(),
            "started": "1",
            "device": state["devices"][0]["uuid"],
            "memory_mb": 9,
            "loads": [],
        }
    )
    with open(backend.state_path, "w") as f:
        json.dump(state, f)
    assert _procs(backend.sample(), 0) == {}


def test_backend_restart_keeps_processes(backend, spawn):
    proc = spawn("-c", HOLDER.format(memory=300, sm=0.2, device=1))
    _ready(proc)
    restarted = SimulatedBackend(DEFAULT_DEVICES, backend.state_path)
    assert _procs(restarted.sample(), 1) == {proc.pid: (300, None)}


def test_concurrent_writers_lose_no_update(backend, spawn):
    n, holds = 6, 20
    code = (
        "import sys\n"
        "from jupyter_gpu_gov import simulate\n"
        f"for _ in range({holds}):\n"
        "    simulate.hold(1, device=0)\n"
        "    simulate.load(0.001, device=0)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    procs = [spawn("-c", code) for _ in range(n)]

    def hold_in_thread() -> None:
        for _ in range(holds):
            simulate.hold(1, device=1)

    threads = [threading.Thread(target=hold_in_thread) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for proc in procs:
        _ready(proc)
    snap = backend.sample()
    assert _procs(snap, 0) == {p.pid: (holds, pytest.approx(holds * 0.001)) for p in procs}
    assert snap.samples[snap.devices[0].uuid].memory_used_mb == n * holds
    assert _procs(snap, 1) == {os.getpid(): (4 * holds, None)}
    assert not [f for f in os.listdir(os.path.dirname(backend.state_path)) if f.endswith(".tmp")]


# --- failure ------------------------------------------------------------------------------------


def test_fail_and_recover(backend):
    simulate.hold(10)
    simulate.fail("GPU has fallen off the bus")
    snap = backend.sample()
    assert snap.backend == "unavailable" and not snap.available
    assert snap.error == "GPU has fallen off the bus" and snap.devices == ()
    assert backend.devices() == []
    simulate.recover()
    snap = backend.sample()
    assert snap.available and _procs(snap, 0) == {os.getpid(): (10, 0.0)}
    assert len(backend.devices()) == 5


def _health(snap: GpuSnapshot, index: int):
    return snap.health[snap.devices[index].uuid]


def test_xid_79_loses_the_gpu_until_healed(backend):
    simulate.hold(20480)  # leaf 0: the whole H100
    simulate.fail(xid=79)
    snap = backend.sample()
    assert snap.backend == "simulated" and snap.error is None
    assert len(snap.devices) == 5  # still listed, as NVML lists a lost GPU...
    assert snap.devices[0].uuid not in snap.samples  # ...with nothing read of it
    lost = _health(snap, 0)
    assert (lost.status, lost.action) == ("unhealthy", "reset")
    assert lost.reasons[0] == "XID 79: the GPU fell off the bus"
    assert all(_health(snap, i).status == "ok" for i in range(1, 5))  # the other GPU is fine
    simulate.heal()
    snap = backend.sample()
    assert _health(snap, 0).status == "ok" and _procs(snap, 0) == {os.getpid(): (20480, 0.0)}


@pytest.mark.parametrize(
    ("fault", "action", "words"),
    [
        ({"xid": 48}, "reset", "XID 48: a double-bit ECC memory error"),
        ({"xid": 63}, "drain", "XID 63: a memory row was marked for remapping"),
        ({"ecc": 1}, "reset", "1 uncorrectable ECC memory error since the last reset"),
        ({"remap": "pending"}, "drain", "memory rows wait to be remapped"),
        ({"remap": "failure"}, "reset", "memory row remapping has failed"),
        ({"retired_pages": True}, "drain", "memory pages wait to be retired"),
        ({"lost": True}, "reset", "the GPU cannot be reached (simulated)"),
    ],
)
def test_each_fault_reads_as_nvml_would_read_it(backend, fault, action, words):
    simulate.fail(**fault, device=1)
    snap = backend.sample()
    health = _health(snap, 1)
    assert (health.status, health.action) == ("unhealthy", action)
    assert health.reasons[0].startswith(words)
    # a MIG instance stands for its GPU: every instance of that H100 has the fault
    assert [_health(snap, i).action for i in range(5)] == [None, action, action, action, action]
    assert (snap.devices[1].uuid in snap.samples) == (not fault.get("lost"))
    simulate.heal(device=2)  # any leaf of the GPU heals the GPU
    assert _health(backend.sample(), 1).status == "ok"


@pytest.mark.parametrize(
    ("throttle", "words"),
    [("thermal", "thermal slowdown"), ("power", "power-brake"), ("slowdown", "hardware slowdown")],
)
def test_throttling_is_a_warning(backend, throttle, words):
    simulate.fail(throttle=throttle)
    health = _health(backend.sample(), 0)
    assert health.status == "ok" and words in health.warnings[0]


def test_an_application_xid_is_the_programs_error_not_the_gpus(backend):
    simulate.fail(xid=31)
    health = _health(backend.sample(), 0)
    assert health.status == "ok" and "a program on the GPU failed" in health.warnings[0]


def test_faults_add_up_on_the_kernels_own_gpu(backend, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", backend.devices()[3].uuid)  # a MIG instance
    simulate.fail(ecc=1)
    simulate.fail(ecc=2, throttle="thermal")
    health = _health(backend.sample(), 3)
    assert health.reasons == ("3 uncorrectable ECC memory errors since the last reset",)
    assert "thermal" in health.warnings[0] and _health(backend.sample(), 0).status == "ok"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "needs a fault"),
        ({"xid": 0}, "xid"),
        ({"xid": True}, "xid"),
        ({"xid": "79"}, "xid"),
        ({"ecc": -1}, "ecc"),
        ({"remap": "soon"}, "remap"),
        ({"throttle": "hot"}, "throttle"),
        ({"lost": "yes"}, "lost"),
        ({"error": "down", "xid": 79}, "alone"),
        ({"xid": 79, "device": 9}, "device 9"),
    ],
)
def test_bad_faults_are_refused_and_change_nothing(backend, kwargs, words):
    with open(backend.state_path) as f:
        before = f.read()
    with pytest.raises(ValueError, match=words):
        simulate.fail(**kwargs)
    with open(backend.state_path) as f:
        assert f.read() == before


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": 99}', '{"format": 1}'])
def test_corrupt_state_is_unavailable_not_an_exception(backend, content):
    with open(backend.state_path, "w") as f:
        f.write(content)
    snap = backend.sample()
    assert snap.backend == "unavailable" and backend.state_path in snap.error
    assert backend.devices() == []
    with pytest.raises(simulate.SimulatedStateError, match="state file"):
        simulate.hold(1)
    # A (re)starting backend is the authority on the devices and starts the file over.
    assert SimulatedBackend(DEFAULT_DEVICES, backend.state_path).sample().available


def test_malformed_entries_are_unavailable(backend):
    with open(backend.state_path) as f:
        state = json.load(f)
    state["processes"] = [{"pid": "x"}]
    with open(backend.state_path, "w") as f:
        json.dump(state, f)
    snap = backend.sample()
    assert snap.backend == "unavailable" and "invalid" in snap.error


def test_missing_state_is_unavailable(backend):
    os.remove(backend.state_path)
    snap = backend.sample()
    assert snap.backend == "unavailable" and "does not exist" in snap.error
    backend.close()


# --- CLI ----------------------------------------------------------------------------------------


def _entries(path: str) -> dict[int, int]:
    with open(path) as f:
        return {e["pid"]: e["memory_mb"] for e in json.load(f)["processes"]}


def test_cli_holds_until_killed(backend, spawn):
    device = backend.devices()[0].uuid
    proc = spawn("-m", "jupyter_gpu_gov.simulate", "hold", "4096", "--load", "0.8", "--device", "0")
    assert f"pid {proc.pid} holds 4096 MB and load 0.8 on {device}" in _ready(proc)
    time.sleep(0.2)
    assert proc.poll() is None
    assert _procs(backend.sample(), 0) == {proc.pid: (4096, 0.8)}
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    assert proc.pid not in _entries(backend.state_path)  # released on SIGTERM, not just dead


def test_cli_hold_for_seconds(backend, spawn):
    proc = spawn("-m", "jupyter_gpu_gov.simulate", "hold", "100", "--device", "3", "--for", "0.3")
    _ready(proc)
    assert _procs(backend.sample(), 3) == {proc.pid: (100, None)}
    assert proc.wait(timeout=10) == 0
    assert proc.pid not in _entries(backend.state_path)


def test_cli_errors_and_help(backend):
    run = [sys.executable, "-m", "jupyter_gpu_gov.simulate"]
    bad = subprocess.run(
        [*run, "hold", "1", "--device", "GPU-nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "GPU-nope" in bad.stderr
    bad = subprocess.run([*run, "hold", "1", "--load", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--load" in bad.stderr
    helped = subprocess.run([*run, "hold", "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "--for SECONDS" in helped.stdout


def test_cli_devices_fail_recover(backend):
    run = [sys.executable, "-m", "jupyter_gpu_gov.simulate"]
    listed = subprocess.run([*run, "devices"], capture_output=True, text=True, check=True)
    assert [leaf["uuid"] for leaf in json.loads(listed.stdout)] == [
        d.uuid for d in backend.devices()
    ]
    subprocess.run([*run, "fail", "Xid 79"], check=True)
    assert backend.sample().error == "Xid 79"
    subprocess.run([*run, "recover"], check=True)
    assert backend.sample().available
    subprocess.run([*run, "fail", "--xid", "79", "--device", "1"], check=True)
    snap = backend.sample()
    assert _health(snap, 1).failed and _health(snap, 0).status == "ok"
    bad = subprocess.run([*run, "fail", "--ecc", "-2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "ecc" in bad.stderr
    subprocess.run([*run, "heal"], check=True)
    assert _health(backend.sample(), 1).status == "ok"


# --- environment --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"JUPYTER_RUNTIME_DIR": "/rt"},
        {"JUPYTER_DATA_DIR": "/data"},
        {"XDG_DATA_HOME": "/xdg"},
        {"XDG_RUNTIME_DIR": "/run/user/1"},
        {"JUPYTER_PLATFORM_DIRS": "1"},
        {"JUPYTER_PLATFORM_DIRS": "1", "XDG_DATA_HOME": "/xdg"},
        {"JUPYTER_PLATFORM_DIRS": "off", "XDG_DATA_HOME": "/xdg"},
    ],
)
def test_default_state_path_mirrors_jupyter_core(monkeypatch, tmp_path, env):
    paths = pytest.importorskip("jupyter_core.paths")
    for name in ("JUPYTER_GPU_GOV_SIM_STATE", "JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name in ("XDG_DATA_HOME", "JUPYTER_PLATFORM_DIRS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    expected = os.path.join(paths.jupyter_runtime_dir(), "jupyter-gpu-gov-sim.json")
    assert simulate.state_path() == expected


def test_simulate_imports_only_the_stdlib():
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import jupyter_gpu_gov.simulate\n"
        "print(sorted(m for m in set(sys.modules) - before\n"
        "             if m.split('.')[0] not in sys.stdlib_module_names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.replace("'", '"')) == [
        "jupyter_gpu_gov",
        "jupyter_gpu_gov._version",
        "jupyter_gpu_gov.simulate",
    ]
