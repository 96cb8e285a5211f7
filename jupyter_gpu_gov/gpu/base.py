"""The backend protocol every GPU source implements."""

from __future__ import annotations

from typing import Protocol

from ..core.models import Device, GpuSnapshot


class GpuBackend(Protocol):
    """A source of GPU samples.

    Implementations are called from one worker thread only (NVML is not used concurrently), and
    ``sample()`` never raises: a failure yields a snapshot with ``backend="unavailable"`` and an
    ``error``, so a lost GPU degrades the report instead of crashing the server.
    """

    name: str

    def devices(self) -> list[Device]:
        """Leaf devices (whole GPUs, or each MIG instance), keyed by UUID."""
        ...

    def sample(self) -> GpuSnapshot: ...

    def close(self) -> None: ...
