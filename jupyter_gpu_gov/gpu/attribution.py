"""Which kernel, terminal or other process of this server holds which GPU.

Pure given its inputs (a GPU snapshot, one process table, the server's kernels and terminals):
the sampler gathers those, this module only reasons about them.

Two worlds (docs/architecture.md, "From a GPU sample to a cull"):

- *local PIDs* (a workstation, or the simulated backend): NVML's PIDs are ours, so each GPU
  process is looked up in the process table and the split is ``exact``.
- *host PIDs* (a container): NVML's PIDs mean nothing here and are never looked up. Which local
  process holds a GPU is learnt from its open ``/dev/nvidia*`` files; with an exclusive GPU the
  device's numbers are exact and belong to the holders, so a single holding target gets them
  (``exact`` when the process counts agree, else ``inferred``), several holders get
  ``holds_context`` without a split (``unknown``).

Time-sliced GPUs: device idle proves idle, device busy proves nothing about us.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..core.models import Device, DeviceSample, GpuProcess, GpuSnapshot
from .procs import ProcessTable

OTHER = "other:server"  # GPU processes of the server that are neither a kernel nor a terminal


@dataclass(frozen=True)
class TargetRoot:
    kind: str  # "kernel" | "terminal"
    id: str
    pid: int | None  # the kernel's provisioner PID, or the terminal's shell PID

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"


@dataclass
class TargetGpu:
    devices: list[str]
    memory_mb: int | None
    sm: float | None  # 0..1 of one device (the busiest of the target's devices); None = unknown
    holds_context: bool
    confidence: str  # "exact" | "inferred" | "unknown"
    pids: list[int] = field(default_factory=list)  # GPU process PIDs as the backend reported them


@dataclass
class Attribution:
    gpu: dict[str, TargetGpu]  # by target key, only targets that hold a GPU (and OTHER)
    members: dict[str, set[int]]  # every local PID of each target (and OTHER), for CPU and I/O
    shared: set[str]  # devices on which processes that are not ours run (or time-sliced)


def target_members(
    table: ProcessTable, roots: Iterable[TargetRoot], server_pid: int
) -> dict[str, set[int]]:
    """Local PIDs per target: the root's descendants plus its session (kernels and terminals
    start new sessions, so a daemonised DataLoader worker re-parented to init stays theirs).
    The rest of the server's tree is ``OTHER``. A PID belongs to the first target that claims it.
    """
    server = table.get(server_pid)
    claimed: set[int] = set()
    members: dict[str, set[int]] = {}
    for root in roots:
        pids: set[int] = set()
        info = table.get(root.pid) if root.pid else None
        if info is not None:
            pids = table.descendants(info.pid)
            if server is None or info.sid != server.sid:
                pids |= table.in_session(info.sid)
        members[root.key] = pids - claimed
        claimed |= pids
    members[OTHER] = table.descendants(server_pid) - claimed
    return members


def attribute(
    snapshot: GpuSnapshot,
    members: dict[str, set[int]],
    *,
    local_pids: bool,
    visible: set[str] | None = None,
    time_sliced: bool = False,
    device_files: Mapping[int, set[int] | None] | None = None,
    own_user: Iterable[int] = (),
) -> Attribution:
    """Attribute every GPU process on the server's devices to a target.

    ``members``: local PIDs per target, from ``target_members``.
    ``visible``: the devices this server may use (``None``: every device the backend sees).
    ``device_files``: for host-PID mode, local PID → open GPU device minors (see
    ``procs.nvidia_device_files``); ignored with local PIDs.
    ``own_user``: with local PIDs, GPU processes outside the server that run as its own Unix
    user (``stray_gpu_pids``): ``OTHER``'s, never a stranger's.
    """
    devices = [d for d in snapshot.devices if visible is None or d.uuid in visible]
    if local_pids:
        return _attribute_local(snapshot, devices, members, time_sliced, set(own_user))
    return _attribute_host(snapshot, devices, members, time_sliced, device_files or {})


def stray_gpu_pids(
    snapshot: GpuSnapshot, members: dict[str, set[int]], visible: set[str] | None
) -> set[int]:
    """GPU processes on the server's devices that are in none of its targets (local PIDs)."""
    return {
        p.pid
        for uuid, sample in snapshot.samples.items()
        if visible is None or uuid in visible
        for p in sample.processes
        if not any(p.pid in pids for pids in members.values())
    }


def _attribute_local(
    snapshot: GpuSnapshot,
    devices: list[Device],
    members: dict[str, set[int]],
    time_sliced: bool,
    own_user: set[int],
) -> Attribution:
    # The owner's process outside the server's tree (a `nohup` run whose terminal closed,
    # re-parented to init) is theirs: as another user's, it made their own card read shared
    # and the server idle while it trained (and, once culled, the card handed out in use).
    owner = {pid: OTHER for pid in own_user}
    owner.update((pid, key) for key, pids in members.items() for pid in pids)
    found: dict[str, dict[str, list[GpuProcess]]] = {}
    shared: set[str] = set()
    for device in devices:
        sample = snapshot.samples.get(device.uuid)
        if sample is None:
            continue
        if time_sliced:
            shared.add(device.uuid)
        for proc in sample.processes:
            key = owner.get(proc.pid)
            if key is None:
                shared.add(device.uuid)  # another user's process on this card
                continue
            found.setdefault(key, {}).setdefault(device.uuid, []).append(proc)

    gpu = {}
    for key, by_device in found.items():
        usages = []
        for uuid, procs in by_device.items():
            sample = snapshot.samples[uuid]
            sole_user = uuid not in shared and all(
                owner.get(p.pid) == key for p in sample.processes
            )
            usages.append(_usage(uuid, procs, sample, sole_user=sole_user, confidence="exact"))
        gpu[key] = _merge(usages)
    return Attribution(gpu, members, shared)


def _attribute_host(
    snapshot: GpuSnapshot,
    devices: list[Device],
    members: dict[str, set[int]],
    time_sliced: bool,
    device_files: Mapping[int, set[int] | None],
) -> Attribution:
    found: dict[str, list[TargetGpu]] = {}
    shared: set[str] = set()
    for device in devices:
        sample = snapshot.samples.get(device.uuid)
        if sample is None or not sample.processes:
            continue
        if time_sliced:
            shared.add(device.uuid)
        wanted = device.minor_number if device.minor_number is not None else -1
        holders = {
            key: [pid for pid in pids if wanted in (device_files.get(pid) or ())]
            for key, pids in members.items()
        }
        holders = {key: pids for key, pids in holders.items() if pids}
        procs = list(sample.processes)
        if len(holders) == 1 and not time_sliced:
            # An exclusive GPU and one holder: every process on it is that target's.
            ((key, local),) = holders.items()
            confidence = "exact" if len(local) == len(procs) else "inferred"
            found.setdefault(key, []).append(
                _usage(device.uuid, procs, sample, sole_user=True, confidence=confidence)
            )
        elif not holders and not time_sliced:
            # Ours (the GPU is exclusive) but no readable holder: the server's, split unknown.
            usage = _usage(device.uuid, procs, sample, sole_user=True, confidence="unknown")
            found.setdefault(OTHER, []).append(usage)
        else:
            # Several holders, or time-slicing: no split, only what the device proves.
            for key in holders or {OTHER: []}:
                found.setdefault(key, []).append(
                    _usage(device.uuid, [], sample, sole_user=False, confidence="unknown")
                )
    return Attribution({key: _merge(usages) for key, usages in found.items()}, members, shared)


def _usage(
    uuid: str, procs: list[GpuProcess], sample: DeviceSample, *, sole_user: bool, confidence: str
) -> TargetGpu:
    """One target's use of one device. With no ``procs`` (no split possible) the memory is
    unknown and only an idle device says anything about activity."""
    memory = (
        None
        if not procs or any(p.memory_mb is None for p in procs)
        else sum(p.memory_mb or 0 for p in procs)
    )
    if procs and all(p.sm is not None for p in procs):
        sm = min(1.0, sum(p.sm or 0.0 for p in procs))
    elif sample.activity == 0:
        sm = 0.0  # an idle device proves each of its processes idle
    elif sole_user and sample.activity is not None:
        sm = sample.activity  # all the device's work is this target's
        confidence = "inferred" if confidence == "exact" else confidence
    else:
        sm, confidence = None, "unknown"
    return TargetGpu(
        devices=[uuid],
        memory_mb=memory,
        sm=sm,
        holds_context=True,
        confidence=confidence,
        pids=sorted(p.pid for p in procs),
    )


_RANK = {"exact": 0, "inferred": 1, "unknown": 2}


def _merge(usages: list[TargetGpu]) -> TargetGpu:
    """One target's use across devices: unknown anywhere stays unknown."""
    if len(usages) == 1:
        return usages[0]
    return TargetGpu(
        devices=[d for u in usages for d in u.devices],
        memory_mb=None
        if any(u.memory_mb is None for u in usages)
        else sum(u.memory_mb or 0 for u in usages),
        sm=None if any(u.sm is None for u in usages) else max(u.sm or 0.0 for u in usages),
        holds_context=True,
        confidence=max((u.confidence for u in usages), key=_RANK.__getitem__),
        pids=sorted({pid for u in usages for pid in u.pids}),
    )
