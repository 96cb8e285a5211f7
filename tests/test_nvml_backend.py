"""NvmlBackend against a fake NVML driver (tests/fake_pynvml.py): every fallback, MIG, failures."""

from __future__ import annotations

import subprocess
import sys

import pynvml
import pytest
from fake_pynvml import DRIVER_RESERVED_MB, FakeGpu, FakeMig, FakeProcess, install

from jupyter_gpu_gov.gpu.backends import select_visible
from jupyter_gpu_gov.gpu.nvml import NvmlBackend, nvml_available


@pytest.fixture
def backend():
    b = NvmlBackend()
    yield b
    b.close()


def by_pid(sample):
    return {p.pid: p for p in sample.processes}


def mig_gpu(*, gpm: bool = False, **kwargs) -> FakeGpu:
    """An H100 in MIG mode: two 1g.10gb instances in slots 0 and 3, the other slots empty."""
    return FakeGpu(
        "GPU-h100",
        name="NVIDIA H100 80GB HBM3",
        gpm=gpm,
        migs=[
            FakeMig(
                "MIG-aaaa",
                "1g.10gb",
                gpu_instance_id=9,
                memory_total_mb=9984,
                slot=0,
                processes=[FakeProcess(301, memory_mb=None)],
                activity=0.25,
            ),
            FakeMig(
                "MIG-bbbb",
                "3g.40gb",
                gpu_instance_id=2,
                memory_total_mb=40192,
                slot=3,
                processes=[FakeProcess(302, memory_mb=4096)],
                activity=0.0,
            ),
        ],
        **kwargs,
    )


# -- lifecycle ---------------------------------------------------------------------------------


def test_importing_the_module_loads_no_nvml():
    code = "import sys, jupyter_gpu_gov.gpu.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_nvml_starts_on_first_use_and_close_shuts_it_down(monkeypatch):
    fake = install(monkeypatch, FakeGpu("GPU-a"))
    b = NvmlBackend()
    assert fake.init_count == 0
    assert b.sample().available
    assert fake.init_count == 1
    b.sample()
    assert fake.init_count == 1  # initialised once, not per sample
    b.close()
    assert fake.init_count == 0


def test_nvml_available(monkeypatch):
    fake = install(monkeypatch, FakeGpu("GPU-a"))
    assert nvml_available()
    assert fake.init_count == 0  # it does not keep NVML open
    fake.gpus.clear()
    assert not nvml_available()  # loads, but no GPU: "auto" should choose none


@pytest.mark.parametrize("broken", ["library", "driver"])
def test_nvml_not_available(monkeypatch, broken):
    fake = install(monkeypatch, FakeGpu("GPU-a"))
    fake.library_present = broken != "library"
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED if broken == "driver" else None
    assert not nvml_available()


def test_without_nvidia_ml_py_the_backend_is_unavailable(monkeypatch, backend):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    snap = backend.sample()
    assert snap.backend == "unavailable" and "nvidia-ml-py" in snap.error
    assert backend.devices() == []
    assert not nvml_available()


# -- whole GPUs --------------------------------------------------------------------------------


def test_whole_gpus_are_listed_with_uuid_memory_and_minor(monkeypatch, backend):
    install(
        monkeypatch,
        FakeGpu("GPU-a", name="NVIDIA A100-SXM4-80GB", minor_number=0),
        FakeGpu("GPU-b", name="Tesla T4", memory_total_mb=15360, minor_number=None),
    )
    a, b = backend.devices()
    assert (a.uuid, a.name, a.index, a.memory_total_mb) == (
        "GPU-a",
        "NVIDIA A100-SXM4-80GB",
        0,
        81920,
    )
    assert a.minor_number == 0 and a.mig_profile is None and a.parent_uuid is None
    assert (b.uuid, b.index, b.memory_total_mb, b.minor_number) == ("GPU-b", 1, 15360, None)


def test_bytes_from_old_bindings_become_str(monkeypatch, backend):
    install(monkeypatch, FakeGpu("GPU-a", name="Tesla V100"), str_as_bytes=True)
    (device,) = backend.devices()
    assert (device.uuid, device.name) == ("GPU-a", "Tesla V100")
    assert set(backend.sample().samples) == {"GPU-a"}


def test_a_gpu_we_may_not_open_is_not_listed(monkeypatch, backend):
    install(monkeypatch, FakeGpu("GPU-other", no_permission=True), FakeGpu("GPU-ours"))
    assert [d.uuid for d in backend.devices()] == ["GPU-ours"]
    assert backend.sample().available


def test_sample_reports_memory_activity_and_processes(monkeypatch, backend):
    install(
        monkeypatch,
        FakeGpu(
            "GPU-a",
            activity=0.37,
            processes=[FakeProcess(101, memory_mb=20480), FakeProcess(102, memory_mb=1024)],
        ),
    )
    snap = backend.sample()
    assert snap.backend == "nvml" and snap.error is None
    assert [d.uuid for d in snap.devices] == ["GPU-a"]
    s = snap.samples["GPU-a"]
    assert s.memory_used_mb == 21504  # v2: without the driver's reserve
    assert s.activity == pytest.approx(0.37)
    assert s.memory_activity == 0.0
    assert [(p.pid, p.memory_mb) for p in s.processes] == [(101, 20480), (102, 1024)]


def test_memory_activity_from_utilisation_rates(monkeypatch, backend):
    """nvmlDeviceGetUtilizationRates' ``memory``: the share of the sample period in which
    device memory was read or written (nvidia-smi's Memory-Util)."""
    install(monkeypatch, FakeGpu("GPU-a", activity=0.9, memory_activity=0.63))
    s = backend.sample().samples["GPU-a"]
    assert (s.activity, s.memory_activity) == (pytest.approx(0.9), pytest.approx(0.63))


def test_without_utilisation_rates_memory_activity_is_unknown(monkeypatch, backend):
    install(monkeypatch, FakeGpu("GPU-a", util_rates=False, gpm=True, memory_activity=0.5))
    backend.sample()
    assert backend.sample().samples["GPU-a"].memory_activity is None  # GPM: activity only


def test_compute_and_graphics_processes_are_merged_by_pid(monkeypatch, backend):
    install(
        monkeypatch,
        FakeGpu(
            "GPU-a",
            processes=[
                FakeProcess(10, memory_mb=500, graphics=True),  # both lists
                FakeProcess(11, memory_mb=300, compute=False, graphics=True),
                FakeProcess(12, memory_mb=200),
            ],
        ),
    )
    s = backend.sample().samples["GPU-a"]
    assert [(p.pid, p.memory_mb) for p in s.processes] == [(10, 500), (11, 300), (12, 200)]


def test_unknown_process_memory_stays_unknown(monkeypatch, backend):
    install(monkeypatch, FakeGpu("GPU-a", processes=[FakeProcess(7, memory_mb=None)]))
    (p,) = backend.sample().samples["GPU-a"].processes
    assert p.pid == 7 and p.memory_mb is None


def test_process_lists_fall_back_to_v2_on_old_drivers(monkeypatch, backend):
    install(
        monkeypatch,
        FakeGpu("GPU-a", processes=[FakeProcess(5, memory_mb=64), FakeProcess(6, graphics=True)]),
        missing=(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
        ),
    )
    s = backend.sample().samples["GPU-a"]
    assert [(p.pid, p.memory_mb) for p in s.processes] == [(5, 64), (6, 0)]


@pytest.mark.parametrize("v2", ["not_supported", "version_mismatch", "missing"])
def test_memory_falls_back_to_v1(monkeypatch, backend, v2):
    gpu = FakeGpu("GPU-a", memory_v2="ok" if v2 == "missing" else v2, memory_used_mb=1000)
    install(monkeypatch, gpu, missing=("nvmlDeviceGetMemoryInfo_v2",) if v2 == "missing" else ())
    (device,) = backend.devices()
    assert device.memory_total_mb == 81920
    # v1 counts the driver's reserve as used
    assert backend.sample().samples["GPU-a"].memory_used_mb == 1000 + DRIVER_RESERVED_MB


def test_memory_the_driver_cannot_report_is_unknown_not_zero(monkeypatch, backend):
    missing = ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo")
    install(
        monkeypatch, FakeGpu("GPU-a", processes=[FakeProcess(1, memory_mb=10)]), missing=missing
    )
    (device,) = backend.devices()
    assert device.memory_total_mb is None
    s = backend.sample().samples["GPU-a"]
    assert s.memory_used_mb is None
    assert [(p.pid, p.memory_mb) for p in s.processes] == [(1, 10)]


# -- per-process utilisation -------------------------------------------------------------------


def test_per_process_sm_comes_from_the_driver_samples(monkeypatch, backend):
    fake = install(
        monkeypatch,
        FakeGpu("GPU-a", processes=[FakeProcess(1, sm=0.8), FakeProcess(2, sm=None)]),
    )
    fake.advance()
    procs = by_pid(backend.sample().samples["GPU-a"])
    assert procs[1].sm == pytest.approx(0.8)
    assert procs[2].sm == 0.0  # no samples of its own: it ran no kernel


def test_per_process_sm_covers_only_the_time_since_the_last_sample(monkeypatch, backend):
    busy = FakeProcess(1, sm=0.9)
    fake = install(monkeypatch, FakeGpu("GPU-a", processes=[busy]))
    fake.advance()
    assert by_pid(backend.sample().samples["GPU-a"])[1].sm == pytest.approx(0.9)
    busy.sm = 0.3
    fake.advance()
    busy.sm = 0.5
    fake.advance()
    assert by_pid(backend.sample().samples["GPU-a"])[1].sm == pytest.approx(0.4)  # mean of two
    busy.sm = None  # stopped launching kernels
    fake.advance()
    assert by_pid(backend.sample().samples["GPU-a"])[1].sm == 0.0  # not the stale 0.5


def test_a_sample_stamped_past_any_clock_is_unknown_never_idle_for_good(monkeypatch, backend):
    """A garbled timestamp (2^63 µs) was taken as the newest sample: the driver then had no
    sample "since" it, and every process read 0.0, idle, for as long as the server ran. While
    the driver lists it the processes read unknown; once its ring of samples drops it, known."""
    busy = FakeProcess(1, sm=0.7)
    fake = install(monkeypatch, FakeGpu("GPU-a", processes=[busy]))
    fake.advance()
    assert by_pid(backend.sample().samples["GPU-a"])[1].sm == pytest.approx(0.7)
    fake.advance()
    fake.gpus[0].util_samples.append((2**63, 1, 50))
    assert by_pid(backend.sample().samples["GPU-a"])[1].sm is None
    fake.gpus[0].util_samples.pop()  # overwritten in the driver's ring of samples
    for _ in range(3):
        fake.advance()
        assert by_pid(backend.sample().samples["GPU-a"])[1].sm == pytest.approx(0.7)


def test_no_samples_since_last_time_means_zero_for_every_process(monkeypatch, backend):
    install(monkeypatch, FakeGpu("GPU-a", processes=[FakeProcess(1), FakeProcess(2)]))
    s = backend.sample().samples["GPU-a"]  # the driver answers NotFound
    assert [p.sm for p in s.processes] == [0.0, 0.0]


@pytest.mark.skipif(
    not hasattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo"),
    reason="these bindings (nvidia-ml-py 12.535) predate nvmlDeviceGetProcessesUtilizationInfo",
)
def test_not_supported_falls_back_to_processes_utilization_info(monkeypatch, backend):
    fake = install(
        monkeypatch,
        FakeGpu("GPU-a", process_util=False, processes=[FakeProcess(1, sm=0.6), FakeProcess(2)]),
    )
    fake.advance()
    procs = by_pid(backend.sample().samples["GPU-a"])
    assert procs[1].sm == pytest.approx(0.6) and procs[2].sm == 0.0
    fake.gpus[0].processes[0].sm = None
    fake.advance()  # no new samples: the newer API answers NotFound too
    assert by_pid(backend.sample().samples["GPU-a"])[1].sm == 0.0


@pytest.mark.parametrize("newer", ["not_supported", "missing"])
def test_without_any_per_process_utilisation_sm_is_unknown(monkeypatch, backend, newer):
    gpu = FakeGpu(
        "GPU-a",
        process_util=False,
        processes_util_info=newer != "not_supported",
        processes=[FakeProcess(1, sm=0.6)],
    )
    missing = ("nvmlDeviceGetProcessesUtilizationInfo",) if newer == "missing" else ()
    fake = install(monkeypatch, gpu, missing=missing)
    fake.advance()
    s = backend.sample().samples["GPU-a"]
    assert [p.sm for p in s.processes] == [None]
    assert s.activity == 0.0  # the device figure is still known


# -- activity through GPM ----------------------------------------------------------------------


def test_without_utilisation_rates_or_gpm_activity_is_unknown(monkeypatch, backend):
    fake = install(monkeypatch, FakeGpu("GPU-a", util_rates=False, activity=0.5))
    for _ in range(3):
        fake.advance()
        assert backend.sample().samples["GPU-a"].activity is None


def test_whole_gpu_without_utilisation_rates_uses_gpm(monkeypatch, backend):
    fake = install(monkeypatch, FakeGpu("GPU-a", util_rates=False, gpm=True, activity=0.5))
    assert backend.sample().samples["GPU-a"].activity is None  # GPM needs two samples
    fake.advance()
    assert backend.sample().samples["GPU-a"].activity == pytest.approx(0.5)


# -- MIG ---------------------------------------------------------------------------------------


def test_mig_instances_are_the_leaves(monkeypatch, backend):
    install(monkeypatch, FakeGpu("GPU-a100"), mig_gpu())
    whole, small, large = backend.devices()
    assert whole.uuid == "GPU-a100" and whole.parent_uuid is None
    assert (small.uuid, small.parent_uuid, small.mig_profile, small.memory_total_mb) == (
        "MIG-aaaa",
        "GPU-h100",
        "1g.10gb",
        9984,
    )
    assert small.name == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert small.index == large.index == 1  # the physical GPU's index
    # Processes on an instance open the parent GPU's device file, so that is its minor.
    assert small.minor_number == large.minor_number == 0
    assert (large.uuid, large.mig_profile, large.memory_total_mb) == ("MIG-bbbb", "3g.40gb", 40192)


def test_mig_capable_gpu_with_mig_disabled_is_one_leaf(monkeypatch, backend):
    install(monkeypatch, FakeGpu("GPU-a", mig_capable=True))
    assert [(d.uuid, d.mig_profile) for d in backend.devices()] == [("GPU-a", None)]


def test_mig_samples_hold_context_only_without_gpm(monkeypatch, backend):
    fake = install(monkeypatch, mig_gpu())
    fake.advance()
    snap = backend.sample()
    assert set(snap.samples) == {"MIG-aaaa", "MIG-bbbb"}  # not the physical GPU
    small, large = snap.samples["MIG-aaaa"], snap.samples["MIG-bbbb"]
    assert small.activity is None and large.activity is None
    assert [(p.pid, p.memory_mb, p.sm) for p in small.processes] == [(301, None, None)]
    assert [(p.pid, p.memory_mb, p.sm) for p in large.processes] == [(302, 4096, None)]
    assert large.memory_used_mb == 4096


def test_mig_activity_from_gpm_across_ticks(monkeypatch, backend):
    fake = install(monkeypatch, mig_gpu(gpm=True))
    first = backend.sample()
    assert first.samples["MIG-aaaa"].activity is None  # GPM needs two samples
    fake.advance()
    second = backend.sample()
    assert second.samples["MIG-aaaa"].activity == pytest.approx(0.25)
    assert second.samples["MIG-bbbb"].activity == 0.0
    assert second.samples["MIG-aaaa"].memory_activity is None  # no utilisation rates on MIG
    fake.gpus[0].migs[1].activity = 1.0
    fake.advance(2.0)
    third = backend.sample()
    assert third.samples["MIG-bbbb"].activity == pytest.approx(1.0)
    assert [p.sm for p in third.samples["MIG-aaaa"].processes] == [None]
    assert len(fake.gpm_samples) == 2  # one kept per instance, the older ones freed
    backend.close()
    assert fake.gpm_samples == {}


def test_mig_layout_change_is_followed(monkeypatch, backend):
    fake = install(monkeypatch, mig_gpu(gpm=True))
    backend.sample()
    fake.gpus[0].migs.pop(0)
    snap = backend.sample()
    assert snap.available and set(snap.samples) == {"MIG-bbbb"}
    assert len(fake.gpm_samples) == 1  # the vanished instance's sample was freed


def test_an_instance_created_in_the_place_of_another_is_seen_on_the_next_tick(monkeypatch, backend):
    fake = install(monkeypatch, mig_gpu(gpm=True))
    backend.sample()
    gpu = fake.gpus[0]
    # slot 0 destroyed and a larger instance created there; a new one in an empty slot
    gpu.migs[0] = FakeMig("MIG-cccc", "2g.20gb", 5, 19968, slot=0, activity=0.5)
    gpu.migs.append(FakeMig("MIG-dddd", "1g.10gb", 13, 9984, slot=6))
    snap = backend.sample()
    assert [(d.uuid, d.mig_profile, d.memory_total_mb) for d in snap.devices] == [
        ("MIG-cccc", "2g.20gb", 19968),
        ("MIG-bbbb", "3g.40gb", 40192),
        ("MIG-dddd", "1g.10gb", 9984),
    ]
    fake.advance()
    # GPM asked about the new instance's own GPU instance, not the one it replaced
    assert backend.sample().samples["MIG-cccc"].activity == pytest.approx(0.5)


def test_mig_mode_switched_is_seen_once_the_gpu_answers_after_its_reset(monkeypatch, backend):
    """MIG mode changes only through a reset of the GPU, which NVML answers with an error: the
    GPU is named afresh, its MIG mode with it. Switched off, asking for its instances fails:
    the mode is asked again in the same tick."""
    fake = install(monkeypatch, FakeGpu("GPU-h100", mig_capable=True))
    assert [d.uuid for d in backend.sample().devices] == ["GPU-h100"]
    fake.gpus[0].error = pynvml.NVML_ERROR_GPU_IS_LOST  # the reset that switches MIG mode on
    assert backend.sample().samples == {}
    fake.gpus[0].error, fake.gpus[0].migs = None, mig_gpu().migs
    assert [d.uuid for d in backend.sample().devices] == ["MIG-aaaa", "MIG-bbbb"]
    fake.gpus[0].migs = None
    snap = backend.sample()
    assert [d.uuid for d in snap.devices] == ["GPU-h100"] and set(snap.samples) == {"GPU-h100"}


def test_mig_mode_is_asked_once_per_gpu_until_nvml_starts_again(monkeypatch, backend):
    """One ``nvmlDeviceGetMigMode`` per GPU on every tick was a C call each for nothing: MIG
    mode only changes with a reset of the GPU."""
    fake = install(monkeypatch, mig_gpu(), FakeGpu("GPU-a", mig_capable=True), FakeGpu("GPU-v"))
    first = backend.sample()
    assert fake.calls["nvmlDeviceGetMigMode"] == 3
    fake.calls.clear()
    for _ in range(5):
        fake.advance()
        snap = backend.sample()
    assert fake.calls["nvmlDeviceGetMigMode"] == 0
    assert snap.devices == first.devices
    fake.gpus[1].error = pynvml.NVML_ERROR_UNKNOWN  # NVML starts again on the next tick
    assert backend.sample().backend == "unavailable"
    fake.gpus[1].error = None
    fake.calls.clear()
    assert backend.sample().devices == first.devices
    assert fake.calls["nvmlDeviceGetMigMode"] == 3


def test_a_steady_tick_asks_each_process_list_once(monkeypatch, backend):
    """The bindings ask a process list (and the per-process samples) twice, its size and then
    its entries; the backend asks once into the array the last answer filled, and again only
    when the list outgrew it, so every process is still listed."""
    gpu = FakeGpu("GPU-a", processes=[FakeProcess(pid, 1024, sm=0.4) for pid in (41, 42)])
    fake = install(monkeypatch, gpu)
    for _ in range(2):  # the first ticks size the arrays (the first has no samples yet)
        backend.sample()
        fake.advance()
    fake.calls.clear()
    snap = backend.sample()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 1
    assert [p.pid for p in snap.samples["GPU-a"].processes] == [41, 42]

    gpu.processes += [FakeProcess(pid, 512, sm=0.1) for pid in range(100, 120)]  # 22 now
    fake.advance()
    fake.calls.clear()
    snap = backend.sample()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # outgrown: asked again
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 2
    processes = snap.samples["GPU-a"].processes
    assert [p.pid for p in processes] == [41, 42, *range(100, 120)]
    assert {p.pid: p.sm for p in processes}[119] == pytest.approx(0.1)
    assert {p.pid: p.memory_mb for p in processes}[119] == 512

    gpu.processes = gpu.processes[:1]  # fewer: the larger array serves, in one call each
    fake.advance()
    fake.calls.clear()
    snap = backend.sample()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert [p.pid for p in snap.samples["GPU-a"].processes] == [41]


def test_a_steady_tick_asks_the_driver_only_what_moves(monkeypatch, backend):
    fake = install(
        monkeypatch,
        FakeGpu("GPU-a", mig_capable=True, processes=[FakeProcess(41, 1024, sm=0.5)]),
        mig_gpu(gpm=True),
        FakeGpu("GPU-v100", name="Tesla V100", minor_number=None),  # no MIG, no minor
    )
    backend.sample()
    fake.advance()
    fake.calls.clear()
    snap = backend.sample()
    # Each GPU's handle, uuid, name, minor and MIG slots are kept from the first tick; only
    # MIG instances are asked their uuid again (one created in another's place differs).
    asked = {name for name, count in fake.calls.items() if count}
    assert not asked & {
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetName",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetMaxMigDeviceCount",
    }
    assert fake.calls["nvmlDeviceGetUUID"] == 2  # the two instances
    assert fake.calls["nvmlDeviceGetMinorNumber"] == 1  # the V100, whose minor is unknown
    assert fake.calls["nvmlDeviceGetMigMode"] == 0  # asked on the first tick, once per GPU
    # and it says what a backend reading everything afresh says
    fresh = NvmlBackend()
    assert snap.devices == tuple(fresh.devices())
    fresh.close()
    assert snap.samples["GPU-a"].processes[0].sm == pytest.approx(0.5)


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
        (pynvml.NVML_ERROR_RESET_REQUIRED, "GPU requires restart"),
    ],
)
def test_a_gpu_lost_mid_run_is_unhealthy_and_the_others_are_still_read(
    monkeypatch, backend, code, words
):
    fake = install(
        monkeypatch,
        FakeGpu("GPU-a", activity=0.25),
        FakeGpu("GPU-b", activity=0.5, processes=[FakeProcess(7, 1024)]),
    )
    assert backend.sample().health["GPU-b"].status == "ok"
    fake.gpus[1].error = code
    snap = backend.sample()
    assert snap.backend == "nvml" and snap.error is None
    assert [d.uuid for d in snap.devices] == ["GPU-a", "GPU-b"]  # still listed...
    assert "GPU-b" not in snap.samples  # ...with nothing known of it
    lost = snap.health["GPU-b"]
    assert (lost.status, lost.action) == ("unhealthy", "reset") and lost.failed
    assert "cannot be reached (NVML: " in lost.reasons[0] and words in lost.reasons[0]
    assert snap.samples["GPU-a"].activity == pytest.approx(0.25)
    assert snap.health["GPU-a"].status == "ok"
    assert [d.uuid for d in backend.devices()] == ["GPU-a", "GPU-b"]
    fake.gpus[1].error = None  # the GPU was reset
    fake.calls.clear()
    snap = backend.sample()
    assert snap.samples["GPU-b"].activity == pytest.approx(0.5)
    assert fake.calls["nvmlDeviceGetHandleByIndex_v2"] == 1  # opened afresh, the other kept
    assert snap.health["GPU-b"].status == "ok"
    backend.close()
    assert fake.init_count == 0 and fake.event_sets == {}  # nothing leaked


def test_a_gpu_of_ours_that_refuses_us_after_a_reset_is_unknown_not_gone(monkeypatch, backend):
    # A GPU this server read answers NoPermission once NVML started again (a driver being
    # reloaded, a reset): its holders' work is unknown, never "no GPU here". A GPU never read
    # that answers so is another's, left out as before.
    fake = install(
        monkeypatch,
        FakeGpu("GPU-a", activity=0.9, processes=[FakeProcess(1, sm=0.9)]),
        FakeGpu("GPU-b", activity=0.5),
    )
    fake.advance()
    assert [d.uuid for d in backend.sample().devices] == ["GPU-a", "GPU-b"]
    fake.gpus[0].error = pynvml.NVML_ERROR_UNKNOWN
    fake.advance()
    assert backend.sample().backend == "unavailable"  # NVML is started again at the next tick
    fake.gpus[0].error = pynvml.NVML_ERROR_NO_PERMISSION
    fake.advance()
    snap = backend.sample()
    assert snap.backend == "nvml" and snap.error is None
    assert [d.uuid for d in snap.devices] == ["GPU-a", "GPU-b"]  # still listed...
    assert "GPU-a" not in snap.samples  # ...with nothing known of it
    refused = snap.health["GPU-a"]
    assert refused.status == "unknown" and not refused.failed
    assert "Insufficient Permissions" in refused.reasons[0]
    assert snap.samples["GPU-b"].activity == pytest.approx(0.5)
    fake.gpus[0].error = None
    fake.advance()
    snap = backend.sample()
    assert snap.samples["GPU-a"].activity == pytest.approx(0.9)
    assert snap.health["GPU-a"].status == "ok"

    fake.gpus.append(FakeGpu("GPU-c"))
    fake.gpus[2].error = pynvml.NVML_ERROR_NO_PERMISSION  # never ours
    assert [d.uuid for d in backend.sample().devices] == ["GPU-a", "GPU-b"]
    # renumbered by a driver reload: GPU-a is read at index 2, index 0 now refuses us
    fake.gpus[0].error = pynvml.NVML_ERROR_UNKNOWN
    assert backend.sample().backend == "unavailable"
    fake.gpus[:] = [fake.gpus[2], fake.gpus[1], fake.gpus[0]]
    fake.gpus[2].error = None
    snap = backend.sample()
    assert sorted(d.uuid for d in snap.devices) == ["GPU-a", "GPU-b"]
    assert snap.samples["GPU-a"].activity == pytest.approx(0.9)
    backend.close()
    assert fake.init_count == 0


def test_a_gpu_lost_before_it_was_ever_read_makes_the_backend_unavailable(monkeypatch, backend):
    fake = install(monkeypatch, FakeGpu("GPU-a"), FakeGpu("GPU-b"))
    fake.gpus[1].error = pynvml.NVML_ERROR_GPU_IS_LOST
    snap = backend.sample()  # it cannot be named, so nothing can be said of anyone's GPU
    assert snap.backend == "unavailable" and "GPU is lost" in snap.error and "GPU 1" in snap.error
    fake.gpus[1].error = None
    assert backend.sample().backend == "nvml"
    backend.close()
    assert fake.init_count == 0


def test_gpu_lost_under_mig_instances_marks_every_instance(monkeypatch, backend):
    fake = install(monkeypatch, mig_gpu(gpm=True))
    backend.sample()
    fake.drop_function("nvmlGpmMigSampleGet")  # make the next GPM call fail non-fatally...
    assert backend.sample().available  # ...which only costs the activity figure
    fake.gpus[0].error = pynvml.NVML_ERROR_GPU_IS_LOST
    snap = backend.sample()
    assert snap.available and snap.samples == {}
    assert {u: h.status for u, h in snap.health.items()} == {
        "MIG-aaaa": "unhealthy",
        "MIG-bbbb": "unhealthy",
    }


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "version mismatch"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    ],
)
def test_failing_init_makes_the_backend_unavailable_then_it_recovers(
    monkeypatch, backend, code, words
):
    fake = install(monkeypatch, FakeGpu("GPU-a"))
    fake.init_error = code
    snap = backend.sample()
    assert snap.backend == "unavailable"
    assert snap.error.startswith("NVML could not start") and words in snap.error
    assert backend.devices() == []
    fake.init_error = None  # the driver got loaded
    assert backend.sample().backend == "nvml"
    assert [d.uuid for d in backend.devices()] == ["GPU-a"]


def test_missing_library_makes_the_backend_unavailable_then_it_recovers(monkeypatch, backend):
    fake = install(monkeypatch, FakeGpu("GPU-a"))
    fake.library_present = False
    snap = backend.sample()
    assert snap.backend == "unavailable" and "libnvidia-ml.so.1" in snap.error
    fake.library_present = True
    assert backend.sample().backend == "nvml"


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    ],
)
def test_fatal_errors_mid_run_make_the_backend_unavailable(monkeypatch, backend, code):
    fake = install(monkeypatch, FakeGpu("GPU-a"))
    assert backend.sample().available
    fake.gpus[0].error = code
    snap = backend.sample()
    assert snap.backend == "unavailable" and "GPU 0 (GPU-a)" in snap.error


def test_nvml_shut_down_behind_our_back_is_recovered(monkeypatch, backend):
    fake = install(monkeypatch, FakeGpu("GPU-a"))
    assert backend.sample().available
    fake.init_count = 0  # e.g. another component called nvmlShutdown once too often
    assert backend.sample().backend == "unavailable"
    assert backend.sample().backend == "nvml"


def test_after_a_driver_reload_the_gpus_are_named_afresh(monkeypatch, backend):
    fake = install(monkeypatch, FakeGpu("GPU-a"), FakeGpu("GPU-b", name="Tesla T4"))
    assert backend.sample().available
    fake.gpus[0].error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED  # the driver is being reloaded
    assert backend.sample().backend == "unavailable"
    # it came back with another card first (a node rebuilt under a long-running server)
    fake.gpus[:] = [FakeGpu("GPU-b", name="Tesla T4"), FakeGpu("GPU-z", name="NVIDIA H200")]
    snap = backend.sample()
    assert [(d.uuid, d.name, d.index) for d in snap.devices] == [
        ("GPU-b", "Tesla T4", 0),
        ("GPU-z", "NVIDIA H200", 1),
    ]


@pytest.mark.parametrize("code", sorted(pynvml.NVMLError._valClassMapping))
@pytest.mark.parametrize("mig", [False, True])
def test_no_error_escapes_sample(monkeypatch, backend, code, mig):
    fake = install(
        monkeypatch,
        mig_gpu(gpm=True) if mig else FakeGpu("GPU-a", processes=[FakeProcess(1, sm=0.5)]),
    )
    fake.advance()
    backend.sample()
    fake.gpus[0].error = code
    fake.advance()
    snap = backend.sample()  # must not raise, whatever the driver says
    # NoPermission on the handle leaves the GPU out (not ours), a lost GPU is listed lost;
    # anything else is unavailable
    assert snap.backend in ("nvml", "unavailable") and bool(snap.error) == (not snap.available)
    if code in (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED):
        assert snap.available and all(h.failed for h in snap.health.values())
    fake.gpus[0].error = None
    fake.advance()
    assert backend.sample().backend == "nvml"


def test_a_binding_surprise_does_not_escape_sample(monkeypatch, backend):
    install(monkeypatch, FakeGpu("GPU-a"))

    def broken(handle):
        raise pynvml.NVMLLibraryMismatchError("pyNVML and NVML lib versions differ")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", broken)
    snap = backend.sample()
    assert snap.backend == "unavailable" and "NVMLLibraryMismatchError" in snap.error
    assert backend.devices() != []  # listing does not need the broken call


# -- health ------------------------------------------------------------------------------------


def test_a_healthy_gpu_is_ok_and_unsupported_queries_say_nothing(monkeypatch, backend):
    install(
        monkeypatch,
        FakeGpu("GPU-a"),
        # a GeForce card: no ECC, no retired pages, no remapped rows, no XID events
        FakeGpu(
            "GPU-g",
            name="NVIDIA GeForce RTX 4090",
            ecc_dbe_volatile=None,
            remapped_rows=None,
            xid_events=False,
        ),
    )
    snap = backend.sample()
    assert snap.health["GPU-a"].as_dict() == {
        "status": "ok",
        "reasons": [],
        "action": None,
        "warnings": [],
    }
    assert snap.health["GPU-g"].status == "ok"


@pytest.mark.parametrize(
    ("xid", "status", "action", "words"),
    [
        (79, "unhealthy", "reset", "XID 79: the GPU fell off the bus"),
        (48, "unhealthy", "reset", "XID 48: a double-bit ECC memory error"),
        (94, "unhealthy", "drain", "XID 94: a contained ECC memory error"),
        (13, "ok", None, "XID 13: a program on the GPU failed"),
    ],
)
def test_xid_events_are_read_and_kept(monkeypatch, backend, xid, status, action, words):
    fake = install(monkeypatch, FakeGpu("GPU-a"), FakeGpu("GPU-b"))
    fake.xid(fake.gpus[0], 79)  # before we registered: the driver never tells us
    assert backend.sample().health["GPU-a"].status == "ok"
    fake.xid(fake.gpus[0], xid)
    for _ in range(2):  # the XID is read once, and kept: the GPU needs a reset either way
        snap = backend.sample()
        health = snap.health["GPU-a"]
        assert (health.status, health.action) == (status, action)
        assert words in (health.reasons + health.warnings)[0]
    assert snap.health["GPU-b"].status == "ok"


def test_an_xid_on_a_mig_gpu_marks_its_instances(monkeypatch, backend):
    fake = install(monkeypatch, mig_gpu())
    backend.sample()
    fake.xid(fake.gpus[0], 95)
    snap = backend.sample()
    assert {h.action for h in snap.health.values()} == {"reset"}
    assert set(snap.health) == {"MIG-aaaa", "MIG-bbbb"}


@pytest.mark.parametrize(
    ("gpu", "action", "words"),
    [
        ({"ecc_dbe_volatile": 2}, "reset", "2 uncorrectable ECC memory errors"),
        ({"remapped_rows": (0, 1, True, False)}, "drain", "rows wait to be remapped"),
        ({"remapped_rows": (0, 9, False, True)}, "reset", "memory row remapping has failed"),
        (
            {"retired_pages_pending": True, "remapped_rows": None},
            "drain",
            "pages wait to be retired",
        ),
    ],
)
def test_memory_errors_make_the_gpu_unhealthy(monkeypatch, backend, gpu, action, words):
    install(monkeypatch, FakeGpu("GPU-a", **gpu))
    health = backend.sample().health["GPU-a"]
    assert (health.status, health.action) == ("unhealthy", action)
    assert words in health.reasons[0]


def test_throttling_is_a_warning_not_a_fault(monkeypatch, backend):
    fake = install(
        monkeypatch, FakeGpu("GPU-a", clock_events=pynvml.nvmlClocksEventReasonSwPowerCap)
    )
    assert backend.sample().health["GPU-a"].warnings == ()  # at its power limit: normal
    fake.gpus[0].clock_events = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    health = backend.sample().health["GPU-a"]
    assert health.status == "ok" and "thermal slowdown" in health.warnings[0]


def test_older_drivers_give_throttle_reasons(monkeypatch, backend):
    install(
        monkeypatch,
        FakeGpu("GPU-a", clock_events=pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown),
        missing=("nvmlDeviceGetCurrentClocksEventReasons",),
    )
    assert "power-brake" in backend.sample().health["GPU-a"].warnings[0]


def test_gpus_named_by_index_are_the_gpus_cuda_counts_with_mig_on(monkeypatch, backend):
    """``CUDA_VISIBLE_DEVICES`` indices count physical GPUs, as CUDA does: a GPU in MIG mode is
    one index, whose first instance CUDA takes, and once CUDA enumerates a MIG instance it
    enumerates nothing else (NVIDIA's MIG user guide, "CUDA Device Enumeration"). Counted as
    leaves, index 2 was the H100's second instance, not the third card the kernels ran on:
    their work read as nobody's, and a stranger's instance watched as theirs."""
    install(monkeypatch, FakeGpu("GPU-a100"), mig_gpu(), FakeGpu("GPU-l4"))
    devices = backend.devices()
    assert [d.uuid for d in devices] == ["GPU-a100", "MIG-aaaa", "MIG-bbbb", "GPU-l4"]
    assert select_visible(devices, ["2"]) == {"GPU-l4"}
    assert select_visible(devices, ["0", "2"]) == {"GPU-a100", "GPU-l4"}
    assert select_visible(devices, ["1"]) == {"MIG-aaaa"}  # the instance CUDA takes
    assert select_visible(devices, ["GPU-h100"]) == {"MIG-aaaa"}  # its GPU's UUID: the same
    assert select_visible(devices, ["0", "1"]) == {"MIG-aaaa"}  # one MIG device, nothing else
    assert select_visible(devices, ["MIG-bbbb", "1"]) == {"MIG-bbbb"}
    assert select_visible(devices, ["2", "3", "0"]) == {"GPU-l4"}  # 3: no such GPU, CUDA stops
    assert select_visible(devices, ["0", "-1", "2"]) == {"GPU-a100"}
