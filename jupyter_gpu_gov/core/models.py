"""What a GPU backend observes, in plain dataclasses.

A *leaf* device is what a process can run on: a whole GPU, or one MIG instance of a GPU in MIG
mode (then ``parent_uuid`` and ``mig_profile`` are set). ``None`` always means "the API could not
say", never zero: unknown is never idle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from math import isfinite

from .health import Health
from .wire import MAX_COUNT, MAX_DEVICES, MAX_MEMORY_MB

# What one GPU can hold, in MiB: 16 TiB, eighty times the largest card's; a figure past it is
# no reading. A server's 64 devices (``MAX_DEVICES``) then hold at most the report's bound.
MAX_GPU_MEMORY_MB = MAX_MEMORY_MB // MAX_DEVICES
# A share (activity) over 1 or under 0 by at most this is the driver's rounding (GPM's
# arithmetic in doubles), taken as 1 or 0; further out it is no reading.
SHARE_ROUNDING = 0.01


@dataclass(frozen=True)
class Device:
    uuid: str
    name: str
    index: int
    memory_total_mb: int | None
    mig_profile: str | None = None  # e.g. "1g.18gb"; None for a whole GPU
    parent_uuid: str | None = None  # the physical GPU of a MIG instance
    # /dev/nvidia<minor> its processes open (a MIG instance's: its parent's), to find holders
    minor_number: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    pid: int  # as NVML reports it: a *host* PID when we run in a container
    memory_mb: int | None  # None: NVML could not say (e.g. MIG, some Windows modes)
    sm: float | None = None  # 0..1; None: no per-process utilisation available


@dataclass(frozen=True)
class DeviceSample:
    uuid: str
    memory_used_mb: int | None
    activity: float | None  # 0..1 over the driver's last sample period; None when unknown
    processes: tuple[GpuProcess, ...] = ()
    # 0..1, the share of the driver's last sample period in which device memory was read or
    # written (NVML's memory utilisation, nvidia-smi's "Memory-Util"); None when unknown (MIG)
    memory_activity: float | None = None


@dataclass(frozen=True)
class GpuSnapshot:
    """One sample of every leaf device, or the reason there is none."""

    backend: str  # "nvml" | "simulated" | "unavailable" | "none"
    sampled_at: datetime
    devices: tuple[Device, ...] = ()
    samples: dict[str, DeviceSample] = field(default_factory=dict)  # by device uuid
    error: str | None = None  # why the backend is unavailable
    # by leaf uuid (a MIG instance has its GPU's); a leaf missing here was not checked
    health: dict[str, Health] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return self.backend not in ("unavailable", "none")


def share(value: float | None) -> float | None:
    """An activity as a reading: 0 to 1, or ``None`` (unknown) for a figure no GPU gives
    (not a number, infinite, or outside 0 to 1 by more than ``SHARE_ROUNDING``)."""
    if value is None:
        return None
    if not isfinite(value) or not -SHARE_ROUNDING <= value <= 1 + SHARE_ROUNDING:
        return None
    return min(max(value, 0.0), 1.0)


def memory_mb(value: int | None) -> int | None:
    """A memory figure as a reading: 0 to ``MAX_GPU_MEMORY_MB`` MiB, else ``None`` (unknown)."""
    return value if value is None or 0 <= value <= MAX_GPU_MEMORY_MB else None


def bounded(snapshot: GpuSnapshot) -> GpuSnapshot:
    """``snapshot`` with every figure one a GPU can give (a driver answering garbage: a NaN or
    infinite activity, memory past any card's, a PID no process has). A figure out of range is
    unknown (``None``), never clamped to a number: unknown is never idle, and the governor
    refused a whole report over one such field. A device whose process list names a PID out of
    range is listed but not read (its holders' use unknown, as for a lost GPU). The snapshot
    itself where every figure is in range (every tick, on a sound driver)."""
    if _in_range(snapshot):
        return snapshot
    devices = tuple(_bounded_device(d) for d in snapshot.devices)
    samples = {}
    for uuid, sample in snapshot.samples.items():
        if any(not 0 <= p.pid <= MAX_COUNT for p in sample.processes):
            continue
        samples[uuid] = _bounded_sample(sample)
    return replace(snapshot, devices=devices, samples=samples)


def _in_range(snapshot: GpuSnapshot) -> bool:
    """Whether every figure of ``snapshot`` is in range as it is (NaN fails each comparison):
    plain loops, no call a figure, since every tick asks (8 GPUs of 4 processes: 18 µs at
    load 13)."""
    most = MAX_GPU_MEMORY_MB
    for device in snapshot.devices:
        total = device.memory_total_mb
        if total is not None and not 0 <= total <= most:
            return False
    for sample in snapshot.samples.values():
        used, activity, memory = sample.memory_used_mb, sample.activity, sample.memory_activity
        if used is not None and not 0 <= used <= most:
            return False
        if activity is not None and not 0.0 <= activity <= 1.0:
            return False
        if memory is not None and not 0.0 <= memory <= 1.0:
            return False
        held = 0
        for process in sample.processes:
            mb, sm = process.memory_mb, process.sm
            if not 0 <= process.pid <= MAX_COUNT or (sm is not None and not 0.0 <= sm <= 1.0):
                return False
            if mb is not None:
                if not 0 <= mb <= most:
                    return False
                held += mb
        if held > most:
            return False
    return True


def _bounded_device(device: Device) -> Device:
    total = memory_mb(device.memory_total_mb)
    return device if total == device.memory_total_mb else replace(device, memory_total_mb=total)


def _bounded_sample(sample: DeviceSample) -> DeviceSample:
    processes = tuple(
        p
        if memory_mb(p.memory_mb) == p.memory_mb and share(p.sm) == p.sm
        else replace(p, memory_mb=memory_mb(p.memory_mb), sm=share(p.sm))
        for p in sample.processes
    )
    if sum(p.memory_mb or 0 for p in processes) > MAX_GPU_MEMORY_MB:
        # each in range, together more than any card holds: none of them is a reading
        processes = tuple(replace(p, memory_mb=None) for p in processes)
    used, activity = memory_mb(sample.memory_used_mb), share(sample.activity)
    memory_activity = share(sample.memory_activity)
    if (
        used == sample.memory_used_mb
        and activity == sample.activity
        and memory_activity == sample.memory_activity
        and all(a is b for a, b in zip(processes, sample.processes, strict=True))
    ):
        return sample
    return replace(
        sample,
        memory_used_mb=used,
        activity=activity,
        memory_activity=memory_activity,
        processes=processes,
    )
