"""A GPU backend that samples simulated devices, for laptops, demos and tests.

Processes put memory and load on the devices through ``jupyter_gpu_gov.simulate``; this backend
reads the shared state file once per ``sample()``. PIDs are local PIDs, as NVML reports them on a
workstation, and a process that exits frees its memory, as on a real GPU. Faults injected with
``simulate.fail`` read as NVML reads them (``core.health``): a lost GPU stays listed without
readings, as ``NvmlBackend`` lists it.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import datetime
from typing import Any

from ..core import clock, health
from ..core.models import Device, DeviceSample, GpuProcess, GpuSnapshot
from ..simulate import (
    SimulatedStateError,
    _active_loads,
    _alive,
    _edit_state,
    _read_state,
)
from ..simulate import state_path as default_state_path

log = logging.getLogger(__name__)

DEFAULT_DEVICES: list[dict[str, Any]] = [
    {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559},
    {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mb": 81559,
        "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    },
]

# Fixed so that UUIDs agree across restarts and machines.
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated.jupyter-gpu-gov")
_MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb(\+me)?$")
_MIG_COMPUTE_SLICES = 7  # A100 / H100 / H200
_KEYS = {"name", "memory_mb", "mig", "gpm", "minor_number"}
# simulate.fail(throttle=…) -> NVML's clocks event reasons
_THROTTLE_BITS = {
    "thermal": health.HW_THERMAL,
    "power": health.HW_POWER_BRAKE,
    "slowdown": health.HW_SLOWDOWN,
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mig_memory_mb(gb: int) -> int:
    # NVML reports a little less than the profile says: 1g.10gb is 9.75 GiB.
    return int(gb * 1024 * 0.975)


def leaf_devices(config: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validate a device config and expand it into leaf dicts (the state file's ``devices``).

    Raises ValueError naming the entry index and key of the first bad entry.
    """
    if not isinstance(config, list):
        raise ValueError(f"simulated devices must be a list of dicts, got {config!r}")
    leaves: list[dict[str, Any]] = []
    for i, entry in enumerate(config):

        def bad(key: str, why: str, i: int = i) -> ValueError:
            return ValueError(f"simulated device {i}: {key!r} {why}")

        if not isinstance(entry, dict):
            raise ValueError(f"simulated device {i}: expected a dict, got {entry!r}")
        for key in entry:
            if key not in _KEYS:
                raise bad(key, f"is not a known key (known: {', '.join(sorted(_KEYS))})")
        name, memory_mb = entry.get("name"), entry.get("memory_mb")
        if not isinstance(name, str) or not name.strip():
            raise bad("name", f"must be a non-empty string, got {name!r}")
        if not _is_int(memory_mb) or memory_mb <= 0:
            raise bad("memory_mb", f"must be a positive integer (MB), got {memory_mb!r}")
        gpm = entry.get("gpm", False)
        if not isinstance(gpm, bool):
            raise bad("gpm", f"must be true or false, got {gpm!r}")
        minor = entry.get("minor_number")
        if minor is not None and (not _is_int(minor) or minor < 0):
            raise bad("minor_number", f"must be an integer >= 0, got {minor!r}")

        gpu_uuid = f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{name}/{i}')}"
        mig = entry.get("mig")
        if mig is None:
            leaves.append(_leaf(gpu_uuid, name, memory_mb, None, None, minor, True))
            continue
        if not isinstance(mig, list) or not mig:
            raise bad("mig", f"must be a non-empty list of MIG profiles, got {mig!r}")
        slices = used_mb = 0
        for j, profile in enumerate(mig):
            match = _MIG_PROFILE.match(profile) if isinstance(profile, str) else None
            if match is None:
                raise bad("mig", f"[{j}] is not a MIG profile like '1g.10gb', got {profile!r}")
            slices += int(match[1])
            mig_mb = _mig_memory_mb(int(match[2]))
            used_mb += mig_mb
            # The profile is part of the identity: repartitioning a real GPU makes new UUIDs.
            mig_uuid = f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{gpu_uuid}/{j}/{profile}')}"
            # Only Hopper GPM measures a MIG instance's activity; its processes open the
            # parent's /dev/nvidia<minor>.
            leaves.append(
                _leaf(mig_uuid, f"{name} MIG {profile}", mig_mb, profile, gpu_uuid, minor, gpm)
            )
        if slices > _MIG_COMPUTE_SLICES:
            raise bad("mig", f"uses {slices} compute slices; a GPU has {_MIG_COMPUTE_SLICES}")
        if used_mb > memory_mb:
            raise bad("mig", f"needs {used_mb} MB; the GPU has memory_mb={memory_mb}")
    return [{"index": index, **leaf} for index, leaf in enumerate(leaves)]


def _leaf(
    uid: str,
    name: str,
    memory_total_mb: int,
    mig_profile: str | None,
    parent_uuid: str | None,
    minor_number: int | None,
    reports_activity: bool,
) -> dict[str, Any]:
    return {
        "uuid": uid,
        "name": name,
        "memory_total_mb": memory_total_mb,
        "mig_profile": mig_profile,
        "parent_uuid": parent_uuid,
        "minor_number": minor_number,
        "reports_activity": reports_activity,
    }


def _device(leaf: dict[str, Any]) -> Device:
    return Device(
        uuid=leaf["uuid"],
        name=leaf["name"],
        index=leaf["index"],
        memory_total_mb=leaf["memory_total_mb"],
        mig_profile=leaf["mig_profile"],
        parent_uuid=leaf["parent_uuid"],
        minor_number=leaf["minor_number"],
    )


class SimulatedBackend:
    """Simulated devices from a config; processes register load via ``jupyter_gpu_gov.simulate``.

    ``devices`` defaults to ``DEFAULT_DEVICES``, ``state_path`` to ``simulate.state_path()``.
    """

    name = "simulated"

    def __init__(
        self, devices: list[dict[str, Any]] | None = None, state_path: str | None = None
    ) -> None:
        leaves = leaf_devices(DEFAULT_DEVICES if devices is None else devices)
        self.state_path = state_path or default_state_path()
        try:
            with _edit_state(self.state_path) as state:
                state["devices"] = leaves
        except SimulatedStateError as e:
            # This backend is the authority on the devices, so it may start the file over.
            log.warning("%s; starting it over", e)
            with _edit_state(self.state_path, reset=True) as state:
                state["devices"] = leaves

    def devices(self) -> list[Device]:
        try:
            state = _read_state(self.state_path)
            return [] if state["error"] else [_device(leaf) for leaf in state["devices"]]
        except Exception as e:
            log.debug("simulated devices unavailable: %s", e)
            return []

    def sample(self) -> GpuSnapshot:
        now = clock.utcnow()
        try:
            state = _read_state(self.state_path)
            if state["error"]:
                return GpuSnapshot(backend="unavailable", sampled_at=now, error=state["error"])
            return self._snapshot(state, now)
        except SimulatedStateError as e:
            return GpuSnapshot(backend="unavailable", sampled_at=now, error=str(e))
        except Exception as e:  # never raise: a broken state reads as a lost GPU
            error = f"simulated GPU state file {self.state_path} is invalid: {e!r}"
            return GpuSnapshot(backend="unavailable", sampled_at=now, error=error)

    def _snapshot(self, state: dict[str, Any], now: datetime) -> GpuSnapshot:
        healths, lost = _healths(state)
        # A lost GPU's leaves stay listed, with nothing read of them (as NVML lists them).
        leaves = {leaf["uuid"]: leaf for leaf in state["devices"] if leaf["uuid"] not in lost}
        procs: dict[str, list[GpuProcess]] = {u: [] for u in leaves}
        t = now.timestamp()  # via core.clock, so tests can expire loads without sleeping
        for entry in sorted(state["processes"], key=lambda e: e["pid"]):
            leaf = leaves.get(entry["device"])
            if leaf is None or not _alive(entry):
                continue
            sm = min(1.0, sum(x["sm"] for x in _active_loads(entry, t)))
            procs[leaf["uuid"]].append(
                GpuProcess(
                    pid=entry["pid"],
                    memory_mb=entry["memory_mb"],
                    sm=sm if leaf["reports_activity"] else None,
                )
            )
        samples = {
            u: DeviceSample(
                uuid=u,
                memory_used_mb=sum(p.memory_mb or 0 for p in ps),
                activity=(
                    min(1.0, sum(p.sm or 0.0 for p in ps))
                    if leaves[u]["reports_activity"]
                    else None
                ),
                processes=tuple(ps),
            )
            for u, ps in procs.items()
        }
        return GpuSnapshot(
            backend="simulated",
            sampled_at=now,
            devices=tuple(_device(leaf) for leaf in state["devices"]),
            samples=samples,
            health=healths,
        )

    def close(self) -> None:
        """Nothing to release: the state file outlives the backend, like a real GPU."""


def _healths(state: dict[str, Any]) -> tuple[dict[str, health.Health], set[str]]:
    """Each leaf's health, from the faults ``simulate.fail`` injected into its GPU, and the
    leaves whose GPU is lost."""
    faults = state.get("faults") or {}
    result, lost = {}, set()
    for leaf in state["devices"]:
        fault = faults.get(leaf["parent_uuid"] or leaf["uuid"])
        if not fault:
            result[leaf["uuid"]] = health.HEALTHY
            continue
        if fault.get("lost"):
            lost.add(leaf["uuid"])
        remap = fault.get("remap")
        result[leaf["uuid"]] = health.assess(
            health.Reading(
                xids=tuple(fault.get("xids") or ()),
                ecc_dbe_volatile=fault.get("ecc") or 0,
                retired_pages_pending=bool(fault.get("retired_pages")),
                remapped_rows_pending=remap == "pending",
                remap_failure=remap == "failure",
                clock_events=_THROTTLE_BITS.get(fault.get("throttle"), 0),
                lost="simulated" if fault.get("lost") else None,
            )
        )
    return result, lost
