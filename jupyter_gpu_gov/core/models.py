"""What a GPU backend observes, in plain dataclasses.

A *leaf* device is what a process can run on: a whole GPU, or one MIG instance of a GPU in MIG
mode (then ``parent_uuid`` and ``mig_profile`` are set). ``None`` always means "the API could not
say", never zero: unknown is never idle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from .health import Health


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
