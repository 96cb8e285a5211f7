"""GPU observation through NVML (``nvidia-ml-py``, module ``pynvml``).

``pynvml`` is imported and NVML initialised on first use, so importing this module is cheap and
works on hosts without the package or a driver. Every call comes from one worker thread.

What each API can say, and what we report when it cannot (``None``, never a made-up zero):

- memory: ``nvmlDeviceGetMemoryInfo`` v2 (used without the driver's reserve), else v1.
- activity: utilisation rates for whole GPUs; GPM (two samples across ticks) for MIG instances
  and for whole GPUs without utilisation rates, where the GPU supports GPM; else ``None``.
- memory activity: the utilisation rates' ``memory`` (the share of the sample period in which
  device memory was read or written) for whole GPUs; ``None`` for MIG instances and where
  utilisation rates are not supported.
- processes: compute and graphics lists (v3, else v2) merged by PID, with per-process SM
  utilisation from the samples the driver took since the previous tick (one stamped more than
  a day past the host's clock is garbled: the processes are unknown that tick). MIG instances
  have no per-process utilisation: their processes only "hold a context" (``sm=None``).

- health (``core.health``), per physical GPU and shared by its MIG instances: XIDs from an
  event set registered for ``nvmlEventTypeXidCriticalError`` (kept for the life of the process:
  a GPU that needed a reset stays unhealthy until the server restarts), volatile uncorrected ECC
  errors (``nvmlDeviceGetTotalEccErrors``), retired pages pending
  (``nvmlDeviceGetRetiredPagesPendingStatus``, before Ampere), remapped rows pending or failed
  (``nvmlDeviceGetRemappedRows``, Ampere+), and clocks event reasons
  (``nvmlDeviceGetCurrentClocksEventReasons``, else the older ``...ThrottleReasons``). A query
  the GPU does not support says nothing.

What cannot change while a GPU's handle lives (its handle, uuid, name, minor number, MIG mode,
MIG slots and each MIG instance's name and GPU instance id) is asked on the tick that first sees
it and kept (``_Gpu``); a steady tick asks the device count, each MIG instance's uuid (an
instance created in another's place differs) and what moves. MIG mode changes only through a
reset of the GPU (``nvmlDeviceSetMigMode`` resets or unbinds it; while a process such as this
one holds it, the change waits as "pending"), which NVML answers with an error: what is kept
goes when NVML starts again, a lost GPU's when it is lost, and the MIG mode also when asking
for its instances fails.

``GpuIsLost`` or ``ResetRequired`` on one GPU that was seen before marks that GPU lost: its leaves
stay listed with unknown readings and an unhealthy health, and the other GPUs are sampled as
usual. ``NoPermission`` on a GPU seen before (after NVML started again) lists it the same way
with an unknown health: what runs on it is unknown, never gone; on a GPU never seen it leaves the
GPU out (another's). These errors on a GPU never seen, ``DriverNotLoaded``, ``LibraryNotFound``,
``Uninitialized``, ``Unknown`` and a failing ``nvmlInit`` make ``sample()`` report
``backend="unavailable"``; NVML is shut down and initialised again on the next call, so a
recovered driver comes back.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..core import clock, health
from ..core.models import Device, DeviceSample, GpuProcess, GpuSnapshot

_MIB = 1024 * 1024

# After these no figure from NVML can be trusted until it is initialised again.
_FATAL_ERRORS = (
    "NVMLError_GpuIsLost",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibraryNotFound",
    "NVMLError_Uninitialized",
    "NVMLError_Unknown",
    "NVMLError_ResetRequired",
)

# A lost GPU: only this one GPU is gone, the others can still be read.
_LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired")
_MAX_EVENTS_PER_TICK = 64  # XID events read per GPU per tick; the rest wait for the next
# NVML stamps a per-process sample with the host's clock (µs): one stamped later than this past
# it is garbled (``_process_sm``).
_SAMPLE_CLOCK_SLACK_S = 86_400
_MAX_XIDS_KEPT = 256  # distinct XIDs kept per GPU, but for the catalogue's (``_new_xids``)

_HINTS = {
    "NVMLError_LibraryNotFound": (
        "libnvidia-ml.so.1 not found: no NVIDIA driver on this host, "
        "or the container was started without the NVIDIA runtime"
    ),
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_GpuIsLost": "the GPU fell off the bus or needs a reset",
    "NVMLError_ResetRequired": "the GPU needs a reset",
}

# "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb" (also "1c.2g.20gb", "1g.10gb+me")
_MIG_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")


class _Unavailable(Exception):
    """NVML cannot be used right now; the message says why, for the snapshot's ``error``."""


@dataclass
class _Gpu:
    """What NVML says of a physical GPU that cannot change while its handle lives, asked on the
    tick that first sees it and kept: until NVML starts again, the GPU is lost, or (for its MIG
    instances) its MIG mode or layout changes. A steady tick asks only what moves."""

    handle: Any
    uuid: str
    name: str
    minor: int | None  # asked again while unknown
    mig: bool | None = None  # MIG mode (False too where NotSupported: before Ampere); None: ask
    mig_slots: int | None = None  # nvmlDeviceGetMaxMigDeviceCount, while MIG mode is on
    # MIG instance uuid -> its name and GPU instance id; a slot holding another uuid (the
    # layout changed) is named afresh
    migs: dict[str, tuple[str, int | None]] = field(default_factory=dict)


@dataclass
class _Leaf:
    device: Device
    handle: Any
    memory_used_mb: int | None
    parent_handle: Any = None  # MIG: the physical GPU, which GPM is asked about
    gpu_instance_id: int | None = None  # MIG: the GPU instance, for GPM
    lost: str | None = None  # its GPU is lost: why (its other fields are then unknown)
    refused: str | None = None  # its GPU, read before, now refuses us: why (all unknown)

    @property
    def gpu_handle(self) -> Any:
        """The physical GPU's handle, which health is read from."""
        return self.handle if self.parent_handle is None else self.parent_handle

    @property
    def gpu_uuid(self) -> str:
        return self.device.parent_uuid or self.device.uuid


class NvmlBackend:
    """The production GPU backend (see the module docstring)."""

    name = "nvml"

    def __init__(self) -> None:
        self._nv: ModuleType | None = None  # pynvml, once nvmlInit succeeded
        self._fatal: tuple[type[BaseException], ...] = ()
        # NVML timestamp (µs) of the newest per-process sample seen, per whole-GPU uuid
        self._last_seen: dict[str, int] = {}
        self._gpm_prev: dict[str, Any] = {}  # leaf uuid -> GPM sample taken on the previous tick
        # (leaf uuid, C function) -> the array its last answer filled, sized for the next one
        self._arrays: dict[tuple[str, str], Any] = {}
        self._gpm_support: dict[str, bool] = {}  # physical GPU uuid -> supports GPM
        # kept across re-initialisation, to name a GPU that got lost before its uuid is read
        self._uuid_by_index: dict[int, str] = {}
        self._devices_by_index: dict[int, list[Device]] = {}  # and its leaves, to list them lost
        self._gpus: dict[int, _Gpu] = {}  # by index, while NVML stays initialised
        self._event_sets: dict[str, Any] = {}  # physical GPU uuid -> its XID event set
        self._no_events: set[str] = set()  # GPUs whose XID events cannot be registered
        self._xids: dict[str, dict[int, None]] = {}  # GPU uuid -> XIDs seen (kept for good)

    # -- GpuBackend ---------------------------------------------------------------------------

    def devices(self) -> list[Device]:
        try:
            return [leaf.device for leaf in self._leaves()]
        except Exception:
            # sample() reports the reason; here the caller only needs to know there is nothing
            self._reset()
            return []

    def sample(self) -> GpuSnapshot:
        sampled_at = clock.utcnow()
        try:
            leaves = self._leaves()
            samples = {}
            for leaf in leaves:
                if leaf.lost is None and leaf.refused is None:
                    with self._losing(leaf):
                        samples[leaf.device.uuid] = self._sample_leaf(leaf)
            healths = self._health(leaves)
            for leaf in leaves:
                if leaf.lost is not None:  # lost while it was read: opened afresh when back
                    samples.pop(leaf.device.uuid, None)
                    self._gpus.pop(leaf.device.index, None)
        except _Unavailable as e:
            self._reset()
            return GpuSnapshot(backend="unavailable", sampled_at=sampled_at, error=str(e))
        except Exception as e:  # a bug or a binding surprise must not take the server down
            self._reset()
            return GpuSnapshot(
                backend="unavailable",
                sampled_at=sampled_at,
                error=f"NVML: unexpected {type(e).__name__}: {e}",
            )
        self._forget_except(leaves)
        return GpuSnapshot(
            backend="nvml",
            sampled_at=sampled_at,
            devices=tuple(leaf.device for leaf in leaves),
            samples=samples,
            health=healths,
        )

    def close(self) -> None:
        self._reset()

    # -- NVML lifecycle -----------------------------------------------------------------------

    def _init(self) -> ModuleType:
        if self._nv is not None:
            return self._nv
        try:
            import pynvml
        except ImportError as e:
            raise _Unavailable("NVML: the nvidia-ml-py package is not installed") from e
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise _Unavailable(f"NVML could not start: {_describe(e)}") from e
        self._nv = pynvml
        self._fatal = tuple(getattr(pynvml, name) for name in _FATAL_ERRORS)
        return pynvml

    def _reset(self) -> None:
        """Free what NVML allocated for us and shut it down; the next call initialises again."""
        nv = self._nv
        if nv is None:
            return
        for gpm_sample in self._gpm_prev.values():
            with suppress(nv.NVMLError):
                nv.nvmlGpmSampleFree(gpm_sample)
        for event_set in self._event_sets.values():
            with suppress(nv.NVMLError):
                nv.nvmlEventSetFree(event_set)
        self._event_sets.clear()
        self._no_events.clear()
        with suppress(nv.NVMLError):  # a lost GPU may refuse even this
            nv.nvmlShutdown()
        self._nv = None
        self._last_seen.clear()
        self._gpm_prev.clear()
        self._gpm_support.clear()
        self._arrays.clear()
        self._gpus.clear()  # handles die with NVML; after a driver reload GPUs may differ

    def _forget_except(self, present: Iterable[_Leaf]) -> None:
        """Drop per-device state of leaves that went away (e.g. the MIG layout changed)."""
        assert self._nv is not None
        leaves = list(present)
        keep = {leaf.device.uuid for leaf in leaves}
        gpus = {leaf.gpu_uuid for leaf in leaves}
        for uuid in [uuid for uuid in self._gpm_prev if uuid not in keep]:
            with suppress(self._nv.NVMLError):
                self._nv.nvmlGpmSampleFree(self._gpm_prev.pop(uuid))
        for uuid in [uuid for uuid in self._last_seen if uuid not in keep]:
            del self._last_seen[uuid]
        for key in [key for key in self._arrays if key[0] not in keep]:
            del self._arrays[key]
        for uuid in [uuid for uuid in self._event_sets if uuid not in gpus]:
            with suppress(self._nv.NVMLError):
                self._nv.nvmlEventSetFree(self._event_sets.pop(uuid))

    @contextmanager
    def _losing(self, leaf: _Leaf) -> Iterator[None]:
        """A GPU lost while it is read: mark the leaf lost (and let the rest be sampled)."""
        try:
            yield
        except _Unavailable as e:
            lost = _lost(e)
            if lost is None:
                raise
            leaf.lost = lost

    @contextmanager
    def _about(self, what: str) -> Iterator[None]:
        """Turn an NVML error that escapes a required query into "unavailable", naming ``what``."""
        assert self._nv is not None
        try:
            yield
        except self._nv.NVMLError as e:
            raise _Unavailable(f"NVML error on {what}: {_describe(e)}") from e

    def _optional(self, query: Callable[..., Any], *args: Any) -> Any:
        """``query(*args)``, or ``None`` where NVML cannot say; fatal errors still escape."""
        assert self._nv is not None
        try:
            return query(*args)
        except self._fatal:
            raise
        except self._nv.NVMLError:
            return None

    # -- devices ------------------------------------------------------------------------------

    def _leaves(self) -> list[_Leaf]:
        # Listed on every tick (MIG instances come and go without a restart), but each GPU's
        # identity is asked once (``_Gpu``): a steady tick asks only what moves.
        nv = self._init()
        leaves: list[_Leaf] = []
        with self._about("the device list"):
            count = nv.nvmlDeviceGetCount()
        for index in range(count):
            gpu = self._gpus.get(index)
            try:
                if gpu is None:
                    gpu = self._open_gpu(index)
                    if gpu is None:
                        continue  # a GPU of this host that was not given to us
                with self._about(f"GPU {index} ({gpu.uuid})"):
                    found = self._gpu_leaves(index, gpu)
            except _Unavailable as e:
                # A GPU seen before stays listed, lost or refusing us; one never seen cannot
                # even be named.
                self._gpus.pop(index, None)
                lost, refused = _lost(e), _refused(e)
                before = self._devices_by_index.get(index)
                if (lost is None and refused is None) or not before:
                    raise
                leaves.extend(
                    _Leaf(device, None, None, lost=lost, refused=refused) for device in before
                )
                continue
            self._devices_by_index[index] = [leaf.device for leaf in found]
            leaves.extend(found)
        if any(leaf.refused for leaf in leaves):  # renumbered: read at another index now
            read = {leaf.device.uuid for leaf in leaves if leaf.refused is None}
            leaves = [
                leaf for leaf in leaves if leaf.refused is None or leaf.device.uuid not in read
            ]
        return leaves

    def _open_gpu(self, index: int) -> _Gpu | None:
        """GPU ``index`` named and kept; ``None`` when it is not ours to read."""
        nv = self._nv
        assert nv is not None
        known = self._uuid_by_index.get(index)
        with self._about(f"GPU {index} ({known})" if known else f"GPU {index}"):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except nv.NVMLError_NoPermission:
                if index in self._devices_by_index:
                    # Ours until NVML started again (a reset, a driver reload): what runs on
                    # it is unknown now, never "no GPU here" (dropped, its holders read idle).
                    raise
                return None
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
        self._uuid_by_index[index] = uuid
        with self._about(f"GPU {index} ({uuid})"):
            name = _text(nv.nvmlDeviceGetName(handle))
        gpu = self._gpus[index] = _Gpu(handle, uuid, name, None)
        return gpu

    def _gpu_leaves(self, index: int, gpu: _Gpu, retried: bool = False) -> list[_Leaf]:
        nv = self._nv
        assert nv is not None
        handle = gpu.handle
        if gpu.minor is None:
            # Processes on a MIG instance open the parent's /dev/nvidia<minor>.
            gpu.minor = self._optional(nv.nvmlDeviceGetMinorNumber, handle)
        if not self._mig_enabled(gpu):
            gpu.mig_slots = None
            gpu.migs.clear()
            total, used = self._memory(handle)
            device = Device(gpu.uuid, gpu.name, index, total, minor_number=gpu.minor)
            return [_Leaf(device, handle, used)]
        try:
            if gpu.mig_slots is None:
                gpu.mig_slots = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
            migs = []
            for slot in range(gpu.mig_slots):
                try:
                    migs.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
                except (nv.NVMLError_NotFound, nv.NVMLError_NoPermission):
                    continue  # an empty slot, or an instance given to someone else
        except (nv.NVMLError_InvalidArgument, nv.NVMLError_NotSupported):
            if retried:
                raise
            gpu.mig = gpu.mig_slots = None  # MIG mode was switched off (a reset): ask again
            return self._gpu_leaves(index, gpu, retried=True)
        leaves = []
        named: dict[str, tuple[str, int | None]] = {}
        for mig in migs:
            # The uuid tells an instance from another created in its place since the last tick.
            uuid = _text(nv.nvmlDeviceGetUUID(mig))
            known = gpu.migs.get(uuid)
            if known is None:
                gpu_instance_id = self._optional(nv.nvmlDeviceGetGpuInstanceId, mig)
                known = (_text(nv.nvmlDeviceGetName(mig)), gpu_instance_id)
            named[uuid] = known
            mig_name, gpu_instance_id = known
            profile = _MIG_PROFILE.search(mig_name)
            total, used = self._memory(mig)
            device = Device(
                uuid=uuid,
                name=mig_name,
                index=index,  # the physical GPU's: MIG instances have no index of their own
                memory_total_mb=total,
                mig_profile=profile.group(1) if profile else None,
                parent_uuid=gpu.uuid,
                minor_number=gpu.minor,
            )
            leaves.append(_Leaf(device, mig, used, handle, gpu_instance_id))
        gpu.migs = named
        return leaves

    def _mig_enabled(self, gpu: _Gpu) -> bool:
        """Whether MIG mode is on, asked once per ``_Gpu``: it changes only with a reset of the
        GPU (see the module docstring), and it was one C call per GPU on every tick."""
        nv = self._nv
        assert nv is not None
        if gpu.mig is None:
            try:
                mode = nv.nvmlDeviceGetMigMode(gpu.handle)
            except nv.NVMLError_NotSupported:
                gpu.mig = False  # before Ampere: never
                return False
            except self._fatal:
                raise
            except nv.NVMLError:
                return False  # asked again on the next tick
            gpu.mig = mode[0] == nv.NVML_DEVICE_MIG_ENABLE
        return gpu.mig

    def _memory(self, handle: Any) -> tuple[int | None, int | None]:
        """(total, used) in MiB."""
        nv = self._nv
        assert nv is not None
        try:
            memory = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        except self._fatal:
            raise
        except nv.NVMLError:
            # v2 needs driver >= 510 (FunctionNotFound, ArgumentVersionMismatch, NotSupported);
            # v1 counts the driver's reserve as used, which is still the right order of magnitude
            memory = self._optional(nv.nvmlDeviceGetMemoryInfo, handle)
            if memory is None:
                return None, None
        return memory.total // _MIB, memory.used // _MIB

    # -- health -------------------------------------------------------------------------------

    def _health(self, leaves: list[_Leaf]) -> dict[str, health.Health]:
        """Each leaf's health: its physical GPU's, read once per GPU."""
        by_gpu: dict[str, health.Health] = {}
        result = {}
        for leaf in leaves:
            gpu = leaf.gpu_uuid
            if gpu not in by_gpu and leaf.refused is not None:
                by_gpu[gpu] = health.unknown(f"it cannot be read ({leaf.refused})")
            if gpu not in by_gpu:
                if leaf.lost is None:
                    with self._losing(leaf):
                        by_gpu[gpu] = health.assess(self._reading(leaf.gpu_handle, gpu))
                if leaf.lost is not None:
                    xids = tuple(self._xids.get(gpu, ()))
                    by_gpu[gpu] = health.assess(health.Reading(xids=xids, lost=leaf.lost))
            result[leaf.device.uuid] = by_gpu[gpu]
        return result

    def _reading(self, handle: Any, uuid: str) -> health.Reading:
        nv = self._nv
        assert nv is not None
        with self._about(f"the health of {uuid}"):
            ecc = self._optional(
                nv.nvmlDeviceGetTotalEccErrors,
                handle,
                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nv.NVML_VOLATILE_ECC,
            )
            retired = self._optional(nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            remap = self._optional(nv.nvmlDeviceGetRemappedRows, handle)
            try:
                events = nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
            except nv.NVMLError_FunctionNotFound:  # drivers before 535
                events = self._optional(nv.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
            except self._fatal:
                raise
            except nv.NVMLError:
                events = None
            xids = self._new_xids(handle, uuid)
        return health.Reading(
            xids=xids,
            ecc_dbe_volatile=ecc,
            retired_pages_pending=None if retired is None else bool(retired),
            remapped_rows_pending=None if remap is None else bool(remap[2]),
            remap_failure=None if remap is None else bool(remap[3]),
            clock_events=events,
        )

    def _new_xids(self, handle: Any, uuid: str) -> tuple[int, ...]:
        """Every XID this GPU reported since we registered for them (a few per tick)."""
        nv = self._nv
        assert nv is not None
        event_set = self._event_sets.get(uuid)
        if event_set is None and uuid not in self._no_events:
            try:
                event_set = nv.nvmlEventSetCreate()
            except self._fatal:
                raise
            except nv.NVMLError:
                event_set = None
            try:
                if event_set is not None:
                    nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
                    self._event_sets[uuid] = event_set
            except nv.NVMLError as e:  # NotSupported (before Kepler), NoPermission (a container)
                with suppress(nv.NVMLError):
                    nv.nvmlEventSetFree(event_set)
                if isinstance(e, self._fatal):
                    raise
                event_set = None
            if event_set is None:
                self._no_events.add(uuid)
        seen = self._xids.setdefault(uuid, {})
        if event_set is not None:
            for _ in range(_MAX_EVENTS_PER_TICK):
                try:
                    data = nv.nvmlEventSetWait_v2(event_set, 0)
                except self._fatal:
                    raise
                except nv.NVMLError:  # Timeout: nothing waiting
                    break
                xid = int(data.eventData)
                # Kept for good, so bounded: past _MAX_XIDS_KEPT, only the catalogue's (a driver
                # answering garbage sends 64 new numbers a tick; a GPU that fails is still said).
                if data.eventType & nv.nvmlEventTypeXidCriticalError and (
                    len(seen) < _MAX_XIDS_KEPT or xid in health.XIDS
                ):
                    seen[xid] = None
        return tuple(seen)

    # -- samples ------------------------------------------------------------------------------

    def _sample_leaf(self, leaf: _Leaf) -> DeviceSample:
        device = leaf.device
        what = f"GPU {device.index} ({device.uuid})"
        if device.parent_uuid is not None:
            what = f"GPU {device.index} MIG {device.mig_profile} ({device.uuid})"
        with self._about(what):
            memory = self._processes(leaf)
            memory_activity = None
            if device.parent_uuid is None:
                activity, memory_activity = self._utilisation(leaf)
                sm = self._process_sm(leaf)
            else:
                activity = self._gpm_activity(leaf)
                sm = None  # no per-process utilisation on MIG: the processes hold a context
        processes = tuple(
            # a process without samples since the last tick ran no kernel in it
            GpuProcess(pid, memory_mb, None if sm is None else sm.get(pid, 0.0))
            for pid, memory_mb in sorted(memory.items())
        )
        return DeviceSample(device.uuid, leaf.memory_used_mb, activity, processes, memory_activity)

    def _processes(self, leaf: _Leaf) -> dict[int, int | None]:
        """Compute and graphics processes: PID -> used memory in MiB (``None``: N/A)."""
        nv = self._nv
        assert nv is not None
        merged: dict[int, int | None] = {}
        for kind in ("Compute", "Graphics"):
            function = f"nvmlDeviceGet{kind}RunningProcesses"
            try:
                listed = self._running_processes(f"{function}_v3", leaf)
            except nv.NVMLError_FunctionNotFound:  # drivers before 510: the same entries
                listed = self._running_processes(f"{function}_v2", leaf)
            for pid, used in listed:  # used: None where NVML reports N/A (MIG, WDDM)
                memory_mb = None if used is None else used // _MIB
                # A process in both lists has one figure for the device in each: keep it once.
                known = merged.get(pid)
                merged[pid] = memory_mb if known is None else max(known, memory_mb or 0)
        return merged

    # The bindings ask each list twice, its size and then its entries; each is a trip through
    # the driver (the two, on an H200 under gVisor with 4 and 20 processes: 0.3-1.4 ms for the
    # compute processes, 1.6-3.2 ms for the SM samples).
    # Asked into the array the last answer filled, sized with room to spare, a steady tick
    # asks once; a list that outgrew it is asked again, as the bindings would.

    def _running_processes(self, function: str, leaf: _Leaf) -> list[tuple[int, int | None]]:
        """(PID, used bytes or ``None``) of ``nvmlDevice…RunningProcesses_v3`` (or ``_v2``,
        whose entries are laid out alike)."""
        nv = self._nv
        assert nv is not None
        call = nv._nvmlGetFunctionPointer(function)  # FunctionNotFound on old drivers
        listed = self._asked_into(
            leaf,
            function,
            _process_info_v3(nv),
            lambda array, count: call(leaf.handle, ctypes.byref(count), array),
        )
        not_available = nv.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        return [
            (info.pid, None if info.usedGpuMemory == not_available else info.usedGpuMemory)
            for info in listed
        ]

    def _process_utilization(self, leaf: _Leaf, last_seen: int) -> list[tuple[int, int, int]]:
        """(PID, timestamp µs, SM %) of the samples newer than ``last_seen``
        (``nvmlDeviceGetProcessUtilization``); ``NotFound`` when there are none."""
        nv = self._nv
        assert nv is not None
        function = "nvmlDeviceGetProcessUtilization"
        call = nv._nvmlGetFunctionPointer(function)
        since = ctypes.c_ulonglong(last_seen)
        samples = self._asked_into(
            leaf,
            function,
            nv.c_nvmlProcessUtilizationSample_t,
            lambda array, count: call(leaf.handle, array, ctypes.byref(count), since),
        )
        return [(s.pid, s.timeStamp, s.smUtil) for s in samples]

    def _asked_into(self, leaf: _Leaf, function: str, entry: type, ask: Callable) -> list:
        """The entries ``ask(array, count)`` fills, into the array of its last answer; asked
        again into a larger one when it says that is too small."""
        nv = self._nv
        assert nv is not None
        key = (leaf.device.uuid, function)
        array = self._arrays.get(key)
        count = ctypes.c_uint(0 if array is None else len(array))
        result = ask(array, count)
        if result == nv.NVML_ERROR_INSUFFICIENT_SIZE:
            count.value = count.value * 2 + 5  # room for processes starting meanwhile
            array = self._arrays[key] = (entry * count.value)()
            result = ask(array, count)
        if result != nv.NVML_SUCCESS:
            raise nv.NVMLError(result)
        if not count.value:
            return []
        if array is None:  # entries announced, none given: not "no processes"
            raise nv.NVMLError(nv.NVML_ERROR_UNKNOWN)
        return array[: min(count.value, len(array))]

    def _utilisation(self, leaf: _Leaf) -> tuple[float | None, float | None]:
        """Activity and memory activity (utilisation rates' ``gpu`` and ``memory``)."""
        nv = self._nv
        assert nv is not None
        try:
            rates = nv.nvmlDeviceGetUtilizationRates(leaf.handle)
        except self._fatal:
            raise
        except nv.NVMLError:
            # some Hopper+ setups answer through GPM only (no memory activity then)
            return self._gpm_activity(leaf), None
        return _fraction(rates.gpu), _fraction(rates.memory)

    def _process_sm(self, leaf: _Leaf) -> dict[int, float] | None:
        """PID -> SM utilisation since the previous tick; ``None`` when the driver cannot say."""
        nv = self._nv
        assert nv is not None
        uuid = leaf.device.uuid
        last_seen = self._last_seen.get(uuid, 0)
        samples = None
        # The newer API is the only one some newer drivers answer.
        for query in (self._process_utilization, self._processes_utilization_info):
            try:
                samples = query(leaf, last_seen)
                break
            except nv.NVMLError_NotFound:
                return {}  # no samples since last_seen: no process ran a kernel
            except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
                continue
            except self._fatal:
                raise
            except nv.NVMLError:
                return None
        if samples is None:
            return None
        horizon = (clock.utcnow().timestamp() + _SAMPLE_CLOCK_SLACK_S) * 1e6
        if any(at > horizon for _, at, _ in samples):
            # Stamped past any clock (a garbled timestamp): kept as the newest, every later
            # sample read as "none since" and every process as idle, for good. Unknown while
            # the driver still lists it (its ring of samples drops it in time).
            return None
        by_pid: dict[int, list[int]] = {}
        for pid, _, sm_util in samples:
            by_pid.setdefault(pid, []).append(sm_util)
        self._last_seen[uuid] = max((at for _, at, _ in samples), default=last_seen)
        # several samples per process since the last tick: their mean is its share of the tick
        return {pid: _fraction(sum(sm) / len(sm)) for pid, sm in by_pid.items()}

    def _processes_utilization_info(self, leaf: _Leaf, last_seen: int) -> list[tuple]:
        nv = self._nv
        assert nv is not None
        query = getattr(nv, "nvmlDeviceGetProcessesUtilizationInfo", None)  # newer bindings only
        if query is None:
            raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        return [(s.pid, s.timeStamp, s.smUtil) for s in query(leaf.handle, last_seen)]

    def _gpm_activity(self, leaf: _Leaf) -> float | None:
        """Activity between the GPM sample of the previous tick and one taken now."""
        nv = self._nv
        assert nv is not None
        device = leaf.device
        is_mig = device.parent_uuid is not None
        gpu = leaf.parent_handle if is_mig else leaf.handle
        if not self._gpm_supported(device.parent_uuid or device.uuid, gpu):
            return None
        if is_mig and leaf.gpu_instance_id is None:
            return None
        current = nv.nvmlGpmSampleAlloc()
        try:
            if is_mig:
                nv.nvmlGpmMigSampleGet(gpu, leaf.gpu_instance_id, current)
            else:
                nv.nvmlGpmSampleGet(gpu, current)
        except nv.NVMLError as e:
            with suppress(nv.NVMLError):
                nv.nvmlGpmSampleFree(current)
            if isinstance(e, self._fatal):
                raise
            return None
        previous = self._gpm_prev.pop(device.uuid, None)
        self._gpm_prev[device.uuid] = current
        if previous is None:
            return None  # GPM measures between two samples: the first tick cannot say
        try:
            return self._gpm_metric(previous, current)
        finally:
            nv.nvmlGpmSampleFree(previous)

    def _gpm_supported(self, gpu_uuid: str, gpu: Any) -> bool:
        assert self._nv is not None
        if gpu_uuid not in self._gpm_support:
            support = self._optional(self._nv.nvmlGpmQueryDeviceSupport, gpu)
            self._gpm_support[gpu_uuid] = bool(support is not None and support.isSupportedDevice)
        return self._gpm_support[gpu_uuid]

    def _gpm_metric(self, previous: Any, current: Any) -> float | None:
        nv = self._nv
        assert nv is not None
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.sample1 = previous
        request.sample2 = current
        # GRAPHICS_UTIL (time any kernel ran) means what utilisation rates mean for a whole GPU,
        # so activity compares across leaves; SM_UTIL (share of busy SMs) is the fallback.
        wanted = (nv.NVML_GPM_METRIC_GRAPHICS_UTIL, nv.NVML_GPM_METRIC_SM_UTIL)
        request.numMetrics = len(wanted)
        for i, metric_id in enumerate(wanted):
            request.metrics[i].metricId = metric_id
        if self._optional(nv.nvmlGpmMetricsGet, request) is None:
            return None
        for metric in request.metrics[: len(wanted)]:
            if metric.nvmlReturn == nv.NVML_SUCCESS:
                return _fraction(metric.value)
        return None


def nvml_available() -> bool:
    """Whether NVML loads and sees at least one GPU (what backend ``auto`` asks)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    except pynvml.NVMLError:
        return False
    finally:
        with suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str; the deprecated pynvml package and old releases returned bytes
    return value.decode() if isinstance(value, bytes) else value


def _process_info_v3(nv: ModuleType) -> type:
    """The entry the bindings' own ``…RunningProcesses_v3`` asks into (older bindings name it
    ``c_nvmlProcessInfo_t``): its layout is the bindings' to know."""
    return getattr(nv, "c_nvmlProcessInfo_v3_t", None) or nv.c_nvmlProcessInfo_t


def _fraction(percent: float) -> float:
    """A percentage as NVML gives it, as a share; ``core.models.bounded`` reads one no GPU
    gives (NaN from GPM's doubles, 4 billion % from a garbled integer) as unknown."""
    return percent / 100.0


def _lost(error: _Unavailable) -> str | None:
    """What NVML said, when ``error`` is a lost GPU (not the whole driver)."""
    cause = error.__cause__
    if cause is None or type(cause).__name__ not in _LOST_ERRORS:
        return None
    return f"NVML: {cause}"


def _refused(error: _Unavailable) -> str | None:
    """What NVML said, when ``error`` is a GPU refusing us (NoPermission)."""
    cause = error.__cause__
    if cause is None or type(cause).__name__ != "NVMLError_NoPermission":
        return None
    return f"NVML: {cause}"


def _describe(error: BaseException) -> str:
    hint = _HINTS.get(type(error).__name__)
    return f"{error} ({hint})" if hint else str(error)
