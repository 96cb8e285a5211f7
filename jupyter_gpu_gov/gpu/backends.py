"""Choosing a GPU backend by name: ``auto | nvml | simulated | none``.

The simulated backend is only ever chosen explicitly, never as a silent fallback: a production
server without a working driver reports ``none`` (no GPUs), not made-up ones. But a server that
has GPU device files (``/dev/nvidia0``: a GPU pod, a workstation) and cannot load NVML (no
nvidia-ml-py, the driver's library not mounted) is not a server without GPUs: ``auto`` then
logs a loud warning and keeps the NVML backend, whose failure reads ``unavailable`` (unknown,
never idle), not ``none``.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence

from ..core import clock
from ..core.models import Device, GpuSnapshot
from .base import GpuBackend

CHOICES = ("auto", "nvml", "simulated", "none")
ENV_VAR = "JUPYTER_GPU_GOV_BACKEND"
DEVICE_FILES = "/dev/nvidia[0-9]*"


class NoGpuBackend:
    """A server without GPUs (a CPU-only profile, or no driver under ``auto``)."""

    name = "none"

    def devices(self) -> list[Device]:
        return []

    def sample(self) -> GpuSnapshot:
        return GpuSnapshot(backend="none", sampled_at=clock.utcnow())

    def close(self) -> None:
        pass


def resolve_choice(configured: str) -> str:
    """The backend name to use: ``$JUPYTER_GPU_GOV_BACKEND`` wins over configuration, so a
    spawner or a test can choose per server."""
    choice = (os.environ.get(ENV_VAR) or configured).strip().lower()
    if choice not in CHOICES:
        source = f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "GpuGovApp.backend"
        raise ValueError(f"{source}={choice!r} is not one of {', '.join(CHOICES)}")
    return choice


def make_backend(
    choice: str,
    *,
    simulated_devices: Sequence[dict] | None = None,
    sim_state_path: str | None = None,
    log: logging.Logger | None = None,
    device_files: str = DEVICE_FILES,
) -> GpuBackend:
    """Build the backend. Call it from the thread that will sample (NVML stays on one thread)."""
    if choice == "simulated":
        from .. import simulate
        from .simulated import DEFAULT_DEVICES, SimulatedBackend

        return SimulatedBackend(
            list(simulated_devices or DEFAULT_DEVICES), sim_state_path or simulate.state_path()
        )
    if choice in ("nvml", "auto"):
        from .nvml import NvmlBackend, nvml_available

        # "nvml" keeps an NvmlBackend even when it fails, so the failure shows as "unavailable".
        if choice == "nvml" or nvml_available():
            return NvmlBackend()
        found = sorted(glob.glob(device_files))
        if found:
            (log or logging.getLogger("jupyter_gpu_gov")).warning(
                "jupyter-gpu-gov: THIS SERVER HAS GPUS (%s) BUT NVML CANNOT BE LOADED: its GPU use "
                "reads 'unavailable' until it can. Install nvidia-ml-py (it comes with "
                "jupyter-gpu-gov) and make the driver's libnvidia-ml.so.1 visible (on Kubernetes, "
                "the NVIDIA container runtime with NVIDIA_DRIVER_CAPABILITIES including "
                "'utility'). Set JUPYTER_GPU_GOV_BACKEND=none if these GPUs are not yours.",
                ", ".join(found[:4]) + (", ..." if len(found) > 4 else ""),
            )
            return NvmlBackend()
    return NoGpuBackend()


def parse_visible_devices(spec: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` entries (indices, GPU-/MIG- UUIDs or their prefixes); ``None``
    (unset) means every device, and an empty value none, as CUDA reads it."""
    if spec is None or spec.strip() == "all":
        return None
    return [part.strip() for part in spec.split(",") if part.strip()]


def select_visible(devices: Sequence[Device], entries: Sequence[str] | None) -> set[str] | None:
    """UUIDs of the leaf devices named by ``entries``, as CUDA enumerates them; ``None`` means
    all of them.

    An integer is a physical GPU's index (``Device.index``: a MIG instance carries its GPU's),
    not a position among the leaves: a GPU in MIG mode is one index however many instances it
    has, and CUDA takes its first instance (NVIDIA's MIG user guide, "CUDA Device
    Enumeration"). A negative index, or one past the last GPU, ends the list (CUDA stops at
    the first invalid index). Anything else is a UUID (``GPU-``, ``MIG-``) or a unique prefix
    of one; a GPU in MIG mode named so is its first instance. CUDA enumerates at most one MIG
    instance, and no whole GPU once it enumerates one (the same section): where the entries
    name a MIG instance, the first one named is the only device. Counting instances as
    indices watched another card than the kernels used: their work read as nobody's, and
    their own card as idle.
    """
    if entries is None:
        return None
    by_index: dict[int, Device] = {}
    for device in devices:
        by_index.setdefault(device.index, device)  # a MIG GPU's first instance (NVML's order)
    last_index = max(by_index, default=-1)
    named: list[Device] = []
    for entry in entries:
        if entry.isascii() and entry.lstrip("-").isdigit():
            index = int(entry)
            if index < 0 or index > last_index:
                break
            if index in by_index:  # (none: a GPU in MIG mode without instances)
                named.append(by_index[index])
            continue
        matches = [d for d in devices if d.uuid.startswith(entry)]
        if not matches:  # a GPU in MIG mode named by its UUID: as by its index
            parents = {d.parent_uuid for d in devices if (d.parent_uuid or "").startswith(entry)}
            if len(parents) == 1:
                matches = [d for d in devices if d.parent_uuid in parents][:1]
        if len(matches) == 1:
            named.append(matches[0])
    first_mig = next((d for d in named if d.parent_uuid is not None), None)
    if first_mig is not None:
        return {first_mig.uuid}
    return {d.uuid for d in named}
