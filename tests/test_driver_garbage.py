"""A driver answering garbage (a NaN or infinite activity, 4 billion %, memory past any card's, a
PID no process has, XID after XID): each such figure is read as unknown, never as idle, and the
report still reaches the governor. Before, one such field got the whole report refused (a 400
naming it: the server's kernels went unreported), or a garbled figure read as a number (a
negative GPM activity as idle, 4 billion % as busy).

The sampler over the fake NVML driver (tests/fake_pynvml.py) and a fake /proc; the report sent
as the server's reporter sends it and read as the governor reads it."""

from __future__ import annotations

import json

import pynvml
import pytest
from fake_pynvml import FakeProcess
from test_sampler_fast_path import ROOTS, SERVER, WORKER, A, make_world

from jupyter_gpu_gov.core import health
from jupyter_gpu_gov.core.report import validate
from jupyter_gpu_gov.gpu.nvml import NvmlBackend
from jupyter_gpu_gov.hub import fast_json
from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo, gpu_state

NAN, INF = float("nan"), float("inf")


def as_the_governor_reads(report: dict) -> dict:
    """The report as ``Reporter`` sends it and the governor's ingest takes it (or refuses it,
    raising ``ReportError`` naming the field)."""
    return validate(fast_json.loads(json.dumps(report).encode()))


def gpm_only(gpu, percent):
    """GPU-0 measured by GPM alone (no utilisation rates, no per-process samples, as some
    Hopper setups answer): kernel a's activity is the card's."""
    gpu.util_rates = gpu.process_util = gpu.processes_util_info = False
    gpu.gpm, gpu.gpm_metric = True, percent


def rates(gpu, percent):
    """Utilisation rates alone (no per-process samples): kernel a's activity is the card's."""
    gpu.process_util = gpu.processes_util_info = False
    gpu.activity = gpu.memory_activity = percent / 100  # the fake sends round(percent)


CASES = {
    # name: (change to GPU-0, pid namespace, where the garbage shows in the report)
    "GPM NaN": (lambda gpu: gpm_only(gpu, NAN), "host", "activity"),
    "GPM infinite": (lambda gpu: gpm_only(gpu, INF), "host", "activity"),
    "GPM 1e300 %": (lambda gpu: gpm_only(gpu, 1e300), "host", "activity"),
    "GPM negative": (lambda gpu: gpm_only(gpu, -50.0), "host", "activity"),
    "4 billion % (a garbled unsigned int)": (lambda gpu: rates(gpu, 2**32 - 1), "host", "activity"),
    "memory used past any card": (
        lambda gpu: setattr(gpu, "memory_used_mb", 2**40),
        "host",
        "memory_used_mb",
    ),
    "memory total past any card": (
        lambda gpu: setattr(gpu, "memory_total_mb", 2**40),
        "host",
        "memory_total_mb",
    ),
    "a process's memory past any card": (
        lambda gpu: setattr(gpu, "processes", [FakeProcess(WORKER, 2**40, sm=0.6)]),
        "host",
        "target memory",
    ),
    "a PID no process has (host PIDs, a container)": (
        lambda gpu: gpu.processes.append(FakeProcess(2**32 - 2, 1000, sm=0.0)),
        "container",
        "target",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_driver_answering_garbage_is_unknown_never_idle_and_the_report_is_taken(
    tmp_path, monkeypatch, case
):
    change, pid_namespace, where = CASES[case]
    fake, gpus, advance = make_world(tmp_path, monkeypatch)
    sampler = Sampler(
        NvmlBackend, proc_root=str(fake.root), pid_namespace=pid_namespace, server_pid=SERVER
    )
    targets = [TargetInfo(root, name=root.id, execution_state="idle") for root in ROOTS]
    try:
        as_the_governor_reads(sampler.measure(targets, {"user": "alice"}).report)
        change(gpus[0])  # the driver starts answering garbage
        for _ in range(2):  # GPM measures between two ticks' samples
            advance()
            result = sampler.measure(targets, {"user": "alice"})
            taken = as_the_governor_reads(result.report)  # refused before: ReportError
    finally:
        sampler.close()

    device = next(d for d in taken["devices"] if d["uuid"] == "GPU-0")
    kernel = next(t for t in taken["targets"] if t["id"] == A)
    if where in ("activity", "memory_used_mb", "memory_total_mb"):
        assert device[where] is None, device  # unknown, never a made-up figure
    if where == "activity":
        assert device["memory_activity"] is None or "GPM" in case
    if where == "target memory":
        assert kernel["gpu"]["memory_mb"] is None
    if where in ("activity", "target"):
        # What kernel a did on the card is unknown: never idle (nor busy on a garbled figure).
        assert kernel["gpu"]["holds_context"] and kernel["gpu"]["sm"] is None, kernel["gpu"]
        assert gpu_state(kernel["gpu"], sampler.active_threshold) == "unknown"
        assert kernel["gpu"]["idle_since"] is None
        assert WORKER in kernel["gpu"]["pids"] or where == "target"


def test_xid_after_xid_is_said_in_the_reports_bound_and_the_report_is_taken(tmp_path, monkeypatch):
    """NVML's XIDs are kept for the server's life: a seventeenth distinct one (a driver answering
    garbage, a program failing in many ways) made every later report one the governor refused
    ("warnings must be a list of at most 16 strings"). A failing GPU is still said first."""
    fake, gpus, advance = make_world(tmp_path, monkeypatch)
    sampler = Sampler(
        NvmlBackend, proc_root=str(fake.root), pid_namespace="host", server_pid=SERVER
    )
    targets = [TargetInfo(root, name=root.id, execution_state="idle") for root in ROOTS]
    driver = pynvml.CDLL.__self__  # the FakeNvml that make_world installed
    try:
        sampler.measure(targets, {"user": "alice"})  # registers for GPU-0's XID events
        for xid in [10_000 + n for n in range(300)] + [79]:  # garbage, then the card falls off
            driver.xid(gpus[0], xid)
        for _ in range(6):  # 64 events are read a tick
            advance()
            taken = as_the_governor_reads(sampler.measure(targets, {"user": "alice"}).report)
    finally:
        sampler.close()
    said = next(d for d in taken["devices"] if d["uuid"] == "GPU-0")["health"]
    assert said["status"] == health.UNHEALTHY and said["action"] == health.RESET
    assert said["reasons"][0].startswith("XID 79: ")
    assert len(said["warnings"]) == health.MAX_REASONS
    assert said["warnings"][-1].startswith("and ") and said["warnings"][-1].endswith(" more")


def test_bounded_keeps_a_sound_snapshot_and_reads_only_garbage_as_unknown():
    """The same snapshot where every figure is in range (every tick on a sound driver); the
    driver's rounding (GPM's 100.4 %) is 1, further out unknown; processes that together hold
    more than any card are each unknown."""
    from datetime import datetime, timezone

    from jupyter_gpu_gov.core.models import (
        MAX_GPU_MEMORY_MB,
        Device,
        DeviceSample,
        GpuProcess,
        GpuSnapshot,
        bounded,
    )

    def snapshot(activity=0.5, sm=0.25, memory=(2000, 1000), total=81920):
        processes = tuple(GpuProcess(100 + i, mb, sm) for i, mb in enumerate(memory))
        sample = DeviceSample("GPU-a", 3000, activity, processes, 0.1)
        device = Device("GPU-a", "NVIDIA H100", 0, total)
        return GpuSnapshot("nvml", datetime.now(timezone.utc), (device,), {"GPU-a": sample})

    sound = snapshot()
    assert bounded(sound) is sound
    for edge in (0.0, 1.0, None):
        edged = snapshot(activity=edge, sm=edge)
        assert bounded(edged) is edged
    assert bounded(snapshot(activity=1.004, sm=-0.004)).samples["GPU-a"].activity == 1.0
    assert bounded(snapshot(activity=1.004, sm=-0.004)).samples["GPU-a"].processes[0].sm == 0.0
    assert bounded(snapshot(activity=1.02)).samples["GPU-a"].activity is None
    half = MAX_GPU_MEMORY_MB // 2 + 1
    together = bounded(snapshot(memory=(half, half))).samples["GPU-a"].processes
    assert [p.memory_mb for p in together] == [None, None]
    assert bounded(snapshot(total=MAX_GPU_MEMORY_MB + 1)).devices[0].memory_total_mb is None
