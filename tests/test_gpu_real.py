"""NvmlBackend against a real NVIDIA driver; skipped where there is none.

The PyTorch checks run a child process (its own CUDA context, as a kernel would have) and look
for it in what NVML reports. Run them alone on a GPU host: ``pytest -m gpu``.
"""

from __future__ import annotations

import importlib.util
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from jupyter_gpu_gov.core.models import GpuProcess, GpuSnapshot
from jupyter_gpu_gov.gpu.nvml import NvmlBackend, nvml_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not nvml_available(), reason="no NVIDIA GPU here: NVML did not load or sees no device"
    ),
]

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="PyTorch is not installed"
)

HOLD_1GIB = """
import sys, time, torch
if not torch.cuda.is_available():
    print("NO-CUDA", flush=True)
    sys.exit(0)
x = torch.empty(256 * 1024 * 1024, dtype=torch.float32, device="cuda")  # 1 GiB
torch.cuda.synchronize()
print("READY", flush=True)
time.sleep(120)
"""

BUSY = """
import sys, time, torch
if not torch.cuda.is_available():
    print("NO-CUDA", flush=True)
    sys.exit(0)
a = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
print("READY", flush=True)
end = time.monotonic() + 120
while time.monotonic() < end:
    for _ in range(50):
        b = a @ a
    torch.cuda.synchronize()
"""


@pytest.fixture
def backend() -> Iterator[NvmlBackend]:
    b = NvmlBackend()
    yield b
    b.close()


def start(script: str) -> subprocess.Popen[str]:
    """A child that set up CUDA and said READY; skips the test where CUDA is unavailable."""
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 180)  # first CUDA init can be slow
    line = child.stdout.readline().strip() if ready else ""
    if line == "READY":
        return child
    child.kill()
    _, err = child.communicate()
    if line == "NO-CUDA":
        pytest.skip("PyTorch sees no CUDA device")
    pytest.fail(f"the CUDA child did not start (said {line!r}): {err[-2000:]}")


def stop(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait(timeout=30)


def processes(snap: GpuSnapshot) -> dict[int, GpuProcess]:
    return {p.pid: p for s in snap.samples.values() for p in s.processes}


def test_lists_devices_with_uuid_and_memory(backend):
    devices = backend.devices()
    assert devices
    for d in devices:
        assert d.uuid.startswith(("GPU-", "MIG-")), d.uuid
        assert d.memory_total_mb and d.memory_total_mb > 0
    snap = backend.sample()
    assert snap.backend == "nvml", snap.error
    assert set(snap.samples) == {d.uuid for d in devices}


def test_a_steady_tick_names_the_devices_as_the_driver_does(backend):
    backend.sample()
    steady = backend.sample()  # each GPU's identity kept from the first tick
    fresh = NvmlBackend()  # asks the driver for everything
    try:
        assert steady.devices == tuple(fresh.devices())
    finally:
        fresh.close()


@needs_torch
def test_a_process_holding_memory_is_listed_with_pid_and_memory(backend):
    before = set(processes(backend.sample()))
    child = start(HOLD_1GIB)
    try:
        deadline = time.monotonic() + 30
        while True:
            snap = backend.sample()
            assert snap.backend == "nvml", snap.error
            new = {pid: p for pid, p in processes(snap).items() if pid not in before}
            if new or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert new, "the CUDA child never appeared in NVML's process list"
        if child.pid not in new:
            pytest.skip(
                f"NVML lists PIDs {sorted(new)}, not our {child.pid}: in a PID namespace NVML "
                "reports host PIDs (docs/architecture.md, 'From a GPU sample to a cull')"
            )
        p = new[child.pid]
        assert p.memory_mb is None or p.memory_mb >= 1024  # the tensor plus the CUDA context
        (leaf,) = [d for d in snap.devices if p in snap.samples[d.uuid].processes]
        if leaf.parent_uuid is None:
            assert p.memory_mb is not None  # whole GPUs on Linux report per-process memory
    finally:
        stop(child)


@needs_torch
def test_a_busy_process_shows_activity(backend):
    child = start(BUSY)
    try:
        activity, sm = 0.0, None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (activity > 0 and (sm is None or sm > 0)):
            time.sleep(1.0)  # GPM leaves need two ticks; utilisation rates a sample period
            snap = backend.sample()
            assert snap.backend == "nvml", snap.error
            activity = max(activity, *((s.activity or 0.0) for s in snap.samples.values()))
            mine = processes(snap).get(child.pid)
            if mine is not None and mine.sm is not None:
                sm = max(sm or 0.0, mine.sm)
        if activity == 0.0 and all(s.activity is None for s in snap.samples.values()):
            pytest.skip("no leaf reports activity here (MIG without GPM)")
        assert activity > 0.0
        assert sm is None or sm > 0.0  # where per-process samples exist, they show it busy
    finally:
        stop(child)


@needs_torch
def test_injected_faults_become_diagnosis_windows(tmp_path):
    """A busy PyTorch loop and an abandoned kernel holding 20 GiB, measured by the extension's
    sampler over NVML (``benchmarks.gpu_faults``): the windows say which is which."""
    from jupyter_gpu_gov.diagnose import read_windows, rules

    subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_faults", "collect", "--out", str(tmp_path),
         "--data", str(tmp_path / "data"), "--scenarios", "healthy", "zombie",
         "--windows", "3", "--window", "2"],
        check=True, timeout=240,
    )  # fmt: skip
    windows = read_windows(tmp_path / "gpu-faults.csv")
    nvml = {w.server: w for w in windows if w.node.endswith("-nvml")}  # the last of each
    assert set(nvml) == {"healthy/", "zombie/"}, windows
    assert nvml["healthy/"].sm_active >= 0.5, nvml["healthy/"]
    assert nvml["healthy/"].kernel_busy is True
    zombie = nvml["zombie/"]
    assert zombie.sm_active is not None and zombie.sm_active <= 0.02, zombie
    assert zombie.gpu_mem_frac >= 20 * 1024 / 150_000, zombie  # 20 GiB of at most ~150 GB
    assert rules.is_zombie(zombie)
