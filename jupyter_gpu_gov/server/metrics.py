"""Per-target Prometheus gauges on the server's ``/metrics``.

Registered once per process in the default registry (which jupyter_server serves); each tick
replaces the label sets, so a kernel that went away stops being reported.
"""

from __future__ import annotations

from prometheus_client import Gauge, Summary

TARGET_LABELS = ("kind", "id", "name")
DEVICE_LABELS = ("uuid", "name", "mig_profile")

TARGET_MEMORY = Gauge(
    "jupyter_gpu_gov_target_memory_bytes",
    "GPU memory held by a kernel, terminal or the server's other processes",
    TARGET_LABELS,
)
TARGET_SM = Gauge(
    "jupyter_gpu_gov_target_sm_ratio",
    "SM activity (0..1) of a kernel, terminal or the server's other processes",
    TARGET_LABELS,
)
TARGET_IDLE = Gauge(
    "jupyter_gpu_gov_target_gpu_idle_seconds",
    "Seconds a GPU-holding target has been idle on the GPU (0 while active or unknown)",
    TARGET_LABELS,
)
DEVICE_MEMORY = Gauge(
    "jupyter_gpu_gov_device_memory_used_bytes",
    "GPU memory in use on a device visible to this server",
    DEVICE_LABELS,
)
DEVICE_ACTIVITY = Gauge(
    "jupyter_gpu_gov_device_activity_ratio",
    "Activity (0..1) of a device visible to this server",
    DEVICE_LABELS,
)
BACKEND_UP = Gauge(
    "jupyter_gpu_gov_backend_up",
    "1 when a GPU backend read the GPUs at the last sample; 0 when it could not (unavailable) "
    "or there is none to read (backend none: a server without GPUs)",
    ("backend",),
)
SAMPLER_CPU = Summary(
    "jupyter_gpu_gov_sampler_cpu_seconds",
    "CPU time the sampler spent per tick (GPU sample, /proc scan, attribution)",
)

MIB = 1024 * 1024


def update(report: dict, now_ts: float, cpu_seconds: float | None) -> None:
    """The gauges from a report; ``cpu_seconds`` None: no tick was measured (a stuck one)."""
    from ..core import clock

    if cpu_seconds is not None:
        SAMPLER_CPU.observe(cpu_seconds)
    BACKEND_UP.clear()
    BACKEND_UP.labels(report["backend"]).set(
        0 if report["backend"] in ("unavailable", "none") else 1
    )

    for gauge in (TARGET_MEMORY, TARGET_SM, TARGET_IDLE, DEVICE_MEMORY, DEVICE_ACTIVITY):
        gauge.clear()
    for device in report["devices"]:
        labels = (device["uuid"], device["name"], device["mig_profile"] or "")
        if device["memory_used_mb"] is not None:
            DEVICE_MEMORY.labels(*labels).set(device["memory_used_mb"] * MIB)
        if device["activity"] is not None:
            DEVICE_ACTIVITY.labels(*labels).set(device["activity"])
    for target in report["targets"]:
        gpu = target["gpu"]
        if not gpu["holds_context"]:
            continue
        labels = (target["kind"], target["id"], target["name"] or "")
        if gpu["memory_mb"] is not None:
            TARGET_MEMORY.labels(*labels).set(gpu["memory_mb"] * MIB)
        if gpu["sm"] is not None:
            TARGET_SM.labels(*labels).set(gpu["sm"])
        idle_since = clock.parse(gpu["idle_since"])
        TARGET_IDLE.labels(*labels).set(
            max(0.0, now_ts - idle_since.timestamp()) if idle_since else 0.0
        )
