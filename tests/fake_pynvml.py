"""A fake NVML for tests, faked one level below ``pynvml``: at the C library.

``install(monkeypatch, ...)`` makes the real ``pynvml`` module load a fake ``libnvidia-ml.so.1``
whose C functions are Python functions over a configurable topology. Everything of ``pynvml``
itself still runs: its wrappers with their INSUFFICIENT_SIZE two-call dance, its structs and
version constants, ``NVMLError(code)`` mapping to ``NVMLError_GpuIsLost`` and friends, the N/A
memory sentinel turning into ``None``, and ``FunctionNotFound`` for a function the library lacks.
So a test sees what the backend would see from a real driver with that topology.

    fake = install(monkeypatch, FakeGpu("GPU-a", processes=[FakeProcess(41, 1024, sm=0.5)]))
    fake.advance()          # the driver takes its per-process and GPM samples
    NvmlBackend().sample()

``fake.calls`` counts the C functions called, by name (pynvml's two-call dance counts two).
Configure before the first call, or mutate the dataclasses between calls (a GPU gets lost, a
process starts, the driver gets loaded); ``drop_function`` removes a C function at any time.
Health: ``FakeGpu``'s ECC, retired-page, remapped-row and clocks-event fields, and
``fake.xid(gpu, 79)``, which queues an XID event in the event sets registered for that GPU (as
the driver does: a set registered after the XID never sees it).
"""

from __future__ import annotations

import ctypes
import itertools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml as nv

MIB = 1024 * 1024
DRIVER_RESERVED_MB = 512  # counted as used by memory info v1, not by v2 (whole GPUs only)

SUCCESS = nv.NVML_SUCCESS


@dataclass
class FakeProcess:
    pid: int
    memory_mb: int | None = 0  # None: NVML reports N/A (MIG without privileges, WDDM)
    sm: float | None = None  # 0..1: running kernels, so the driver records samples; None: not
    compute: bool = True
    graphics: bool = False


@dataclass
class FakeMig:
    uuid: str
    profile: str  # e.g. "1g.10gb"
    gpu_instance_id: int
    memory_total_mb: int
    slot: int  # index for nvmlDeviceGetMigDeviceHandleByIndex; other slots are NotFound
    processes: list[FakeProcess] = field(default_factory=list)
    memory_used_mb: int | None = None  # None: the sum of its processes' known memory
    activity: float = 0.0  # what GPM measures while time advances
    minor_number: int | None = None  # None: NotSupported
    gpm_metric: float | None = None  # a driver answering garbage: GPM's %, whatever time did
    busy_s: float = field(default=0.0, repr=False)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_mb: int = 81920
    processes: list[FakeProcess] = field(default_factory=list)
    memory_used_mb: int | None = None  # None: the sum of its processes' known memory
    activity: float = 0.0  # utilisation rates, and GPM
    memory_activity: float = 0.0  # utilisation rates' memory (time device memory was busy)
    minor_number: int | None = 0  # None: NotSupported
    util_rates: bool = True  # False: nvmlDeviceGetUtilizationRates is NotSupported
    memory_v2: str = "ok"  # "ok" | "not_supported" | "version_mismatch"
    process_util: bool = True  # False: nvmlDeviceGetProcessUtilization is NotSupported
    processes_util_info: bool = True  # False: nvmlDeviceGetProcessesUtilizationInfo too
    gpm: bool = False  # nvmlGpmQueryDeviceSupport
    mig_capable: bool = False  # False and no ``migs``: nvmlDeviceGetMigMode is NotSupported
    migs: list[FakeMig] | None = None  # not None: the GPU is in MIG mode with these instances
    max_mig_devices: int = 7
    error: int | None = None  # every call about this GPU fails with it, e.g. NVML_ERROR_GPU_IS_LOST
    no_permission: bool = False  # the handle is refused, as for a GPU not given to a container
    # health; None: the query is NotSupported (a GeForce card has no ECC, Ampere+ no retired
    # pages, GPUs before Ampere no remapped rows)
    ecc_dbe_volatile: int | None = 0
    retired_pages_pending: bool | None = None
    remapped_rows: tuple[int, int, bool, bool] | None = (
        0,
        0,
        False,
        False,
    )  # corr, unc, pending, failed
    clock_events: int = 0  # nvmlClocksEventReason* bits
    xid_events: bool = True  # False: registering for XID events is NotSupported
    gpm_metric: float | None = None  # a driver answering garbage: GPM's %, whatever time did
    busy_s: float = field(default=0.0, repr=False)
    util_samples: list[tuple[int, int, int]] = field(default_factory=list, repr=False)


@dataclass
class _EventSet:
    gpus: list[object] = field(default_factory=list)  # the FakeGpus registered
    queue: deque = field(default_factory=deque)  # (gpu index, event type, data)


@dataclass
class _GpmSample:
    leaf: object | None = None  # the FakeGpu or FakeMig it was taken of
    at_s: float = 0.0
    busy_s: float = 0.0


class FakeNvml:
    """The driver's state; ``install`` wires it into ``pynvml``."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.library_present = True  # False: loading libnvidia-ml.so.1 fails (LibraryNotFound)
        self.init_error: int | None = None  # e.g. NVML_ERROR_DRIVER_NOT_LOADED
        self.missing: set[str] = set()  # C functions this "driver" lacks: FunctionNotFound
        self.init_count = 0  # nvmlInit minus nvmlShutdown, like NVML's own reference count
        self.now_s = 1000.0
        self.gpm_samples: dict[int, _GpmSample] = {}  # allocated and not yet freed, by address
        self.event_sets: dict[int, _EventSet] = {}  # created and not yet freed, by address
        self.calls: Counter[str] = Counter()  # C functions called, by name (clear it at will)
        self._addresses = itertools.count(0x100000, 0x10)
        self.functions = _c_functions(self)
        self.lib = _Library(self)

    def advance(self, seconds: float = 1.0) -> None:
        """Let time pass: the driver records per-process samples and GPM counters move."""
        self.now_s += seconds
        for gpu in self.gpus:
            gpu.busy_s += gpu.activity * seconds
            for mig in gpu.migs or []:
                mig.busy_s += mig.activity * seconds
            if gpu.migs is None:
                timestamp = int(self.now_s * 1e6)
                for p in gpu.processes:
                    if p.sm is not None:
                        gpu.util_samples.append((timestamp, p.pid, round(p.sm * 100)))

    def xid(self, gpu: FakeGpu, xid: int) -> None:
        """The driver reports XID ``xid`` on ``gpu`` to every event set registered for it."""
        for event_set in self.event_sets.values():
            if any(g is gpu for g in event_set.gpus):
                event_set.queue.append(
                    (self.gpus.index(gpu), nv.nvmlEventTypeXidCriticalError, xid)
                )

    def drop_function(self, name: str) -> None:
        """Make the C function ``name`` missing from now on (pynvml caches what it looked up)."""
        self.missing.add(name)
        nv._nvmlGetFunctionPointer_cache.pop(name, None)

    def dlopen(self, name: str) -> _Library:
        if not self.library_present:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return self.lib


class _Library:
    """Stands for the ``CDLL`` object: attribute lookup finds a C function or fails."""

    def __init__(self, fake: FakeNvml) -> None:
        self._fake = fake

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in self._fake.missing or name not in self._fake.functions:
            raise AttributeError(name)
        return self._fake.functions[name]


def install(
    monkeypatch: Any, *gpus: FakeGpu, missing: tuple[str, ...] = (), str_as_bytes: bool = False
) -> FakeNvml:
    """Make ``pynvml`` talk to a fake driver with ``gpus`` for the rest of the test.

    ``missing`` names C functions the driver lacks (e.g. ``nvmlDeviceGetComputeRunningProcesses_v3``).
    ``str_as_bytes`` makes UUIDs and names come back as bytes, as old bindings returned them.
    """
    fake = FakeNvml(list(gpus))
    fake.missing.update(missing)
    monkeypatch.setattr(nv, "nvmlLib", None)
    monkeypatch.setattr(nv, "_nvmlLib_refcount", 0)
    monkeypatch.setattr(nv, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(nv, "CDLL", fake.dlopen)
    # pynvml caches the message of codes it has no text for in a class-level dict
    monkeypatch.setattr(nv.NVMLError, "_errcode_to_string", dict(nv.NVMLError._errcode_to_string))
    if str_as_bytes:
        for name in ("nvmlDeviceGetUUID", "nvmlDeviceGetName"):
            monkeypatch.setattr(nv, name, _returning_bytes(getattr(nv, name)))
    return fake


def _returning_bytes(query: Callable[[Any], str]) -> Callable[[Any], bytes]:
    return lambda handle: query(handle).encode()


# -- the C functions ---------------------------------------------------------------------------


def _int(value: Any) -> int:
    return value.value if hasattr(value, "value") else value


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def _write_pointer(out: Any, address: int) -> None:
    ctypes.c_void_p.from_buffer(out._obj).value = address


def _gpu_address(index: int) -> int:
    return (index + 1) << 16


def _mig_address(index: int, slot: int) -> int:
    return _gpu_address(index) | ((slot + 1) << 4)


def _used_mb(device: FakeGpu | FakeMig) -> int:
    if device.memory_used_mb is not None:
        return device.memory_used_mb
    processes = device.processes
    if isinstance(device, FakeGpu) and device.migs is not None:
        processes = [p for mig in device.migs for p in mig.processes]
    return sum(p.memory_mb or 0 for p in processes)


def _c_functions(fake: FakeNvml) -> dict[str, Callable[..., Any]]:
    """C functions by name. Each returns an nvmlReturn_t and writes its outputs, as the real
    library does; device functions get the handle pointer pynvml passes."""

    def resolve(handle: Any) -> tuple[FakeGpu, FakeMig | None] | int:
        if fake.init_count == 0:
            return nv.NVML_ERROR_UNINITIALIZED
        address = _address(handle)
        for index, gpu in enumerate(fake.gpus):
            if address == _gpu_address(index):
                return (gpu, None) if gpu.error is None else gpu.error
            for mig in gpu.migs or []:
                if address == _mig_address(index, mig.slot):
                    return (gpu, mig) if gpu.error is None else gpu.error
        return nv.NVML_ERROR_INVALID_ARGUMENT

    def device_call(body: Callable[..., int]) -> Callable[..., int]:
        def call(handle: Any, *args: Any) -> int:
            found = resolve(handle)
            if isinstance(found, int):
                return found
            return body(*found, *args)

        return call

    def nvmlInitWithFlags(flags: int) -> int:
        if fake.init_error is not None:
            return fake.init_error
        fake.init_count += 1
        return SUCCESS

    def nvmlShutdown() -> int:
        if fake.init_count == 0:
            return nv.NVML_ERROR_UNINITIALIZED
        fake.init_count -= 1
        return SUCCESS

    def nvmlErrorString(code: int) -> bytes:
        return f"NVML error {code}".encode()

    def nvmlDeviceGetCount_v2(count: Any) -> int:
        if fake.init_count == 0:
            return nv.NVML_ERROR_UNINITIALIZED
        count._obj.value = len(fake.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(index: Any, out: Any) -> int:
        if fake.init_count == 0:
            return nv.NVML_ERROR_UNINITIALIZED
        i = _int(index)
        if i >= len(fake.gpus):
            return nv.NVML_ERROR_INVALID_ARGUMENT
        gpu = fake.gpus[i]
        if gpu.error is not None:
            return gpu.error
        if gpu.no_permission:
            return nv.NVML_ERROR_NO_PERMISSION
        _write_pointer(out, _gpu_address(i))
        return SUCCESS

    @device_call
    def nvmlDeviceGetUUID(gpu: FakeGpu, mig: FakeMig | None, buffer: Any, size: Any) -> int:
        buffer.value = (mig or gpu).uuid.encode()
        return SUCCESS

    @device_call
    def nvmlDeviceGetName(gpu: FakeGpu, mig: FakeMig | None, buffer: Any, size: Any) -> int:
        buffer.value = (f"{gpu.name} MIG {mig.profile}" if mig else gpu.name).encode()
        return SUCCESS

    @device_call
    def nvmlDeviceGetMinorNumber(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        minor = (mig or gpu).minor_number
        if minor is None:
            return nv.NVML_ERROR_NOT_SUPPORTED
        out._obj.value = minor
        return SUCCESS

    def fill_memory(memory: Any, device: FakeGpu | FakeMig, reserved_mb: int) -> None:
        used_mb = _used_mb(device)
        memory.total = device.memory_total_mb * MIB
        memory.used = (used_mb + reserved_mb) * MIB
        memory.free = (device.memory_total_mb - used_mb - reserved_mb) * MIB

    @device_call
    def nvmlDeviceGetMemoryInfo(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        fill_memory(out._obj, mig or gpu, 0 if mig else DRIVER_RESERVED_MB)
        return SUCCESS

    @device_call
    def nvmlDeviceGetMemoryInfo_v2(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        if gpu.memory_v2 == "not_supported":
            return nv.NVML_ERROR_NOT_SUPPORTED
        if gpu.memory_v2 == "version_mismatch" or out._obj.version != nv.nvmlMemory_v2:
            return nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        fill_memory(out._obj, mig or gpu, 0)
        out._obj.reserved = 0 if mig else DRIVER_RESERVED_MB * MIB
        return SUCCESS

    @device_call
    def nvmlDeviceGetUtilizationRates(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        if mig is not None or not gpu.util_rates:
            return nv.NVML_ERROR_NOT_SUPPORTED
        out._obj.gpu = round(gpu.activity * 100)
        out._obj.memory = round(gpu.memory_activity * 100)
        return SUCCESS

    def running_processes(graphics: bool) -> Callable[..., int]:
        @device_call
        def query(gpu: FakeGpu, mig: FakeMig | None, count: Any, infos: Any) -> int:
            if mig is not None:
                listed = [(p, mig.gpu_instance_id) for p in mig.processes]
            elif gpu.migs is not None:  # the physical GPU lists the processes of every instance
                listed = [(p, m.gpu_instance_id) for m in gpu.migs for p in m.processes]
            else:
                listed = [(p, 0xFFFFFFFF) for p in gpu.processes]
            listed = [(p, gi) for p, gi in listed if (p.graphics if graphics else p.compute)]
            if not listed:
                count._obj.value = 0
                return SUCCESS
            if infos is None or count._obj.value < len(listed):
                count._obj.value = len(listed)
                return nv.NVML_ERROR_INSUFFICIENT_SIZE
            # pynvml oversizes the array in case processes start in between
            for info, (p, gi) in zip(infos, listed, strict=False):
                info.pid = p.pid
                info.usedGpuMemory = (
                    nv.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                    if p.memory_mb is None
                    else p.memory_mb * MIB
                )
                info.gpuInstanceId = gi
                info.computeInstanceId = 0 if mig or gpu.migs is not None else 0xFFFFFFFF
            count._obj.value = len(listed)
            return SUCCESS

        return query

    def new_util_samples(gpu: FakeGpu, last_seen: Any) -> list[tuple[int, int, int]]:
        return [s for s in gpu.util_samples if s[0] > _int(last_seen)]

    @device_call
    def nvmlDeviceGetProcessUtilization(
        gpu: FakeGpu, mig: FakeMig | None, out: Any, count: Any, last_seen: Any
    ) -> int:
        if mig is not None or not gpu.process_util:
            return nv.NVML_ERROR_NOT_SUPPORTED
        samples = new_util_samples(gpu, last_seen)
        if not samples:
            return nv.NVML_ERROR_NOT_FOUND
        if out is None or count._obj.value < len(samples):
            count._obj.value = len(samples)
            return nv.NVML_ERROR_INSUFFICIENT_SIZE
        for entry, (timestamp, pid, sm) in zip(out, samples, strict=False):  # the first entries
            entry.pid, entry.timeStamp, entry.smUtil = pid, timestamp, sm
        count._obj.value = len(samples)
        return SUCCESS

    @device_call
    def nvmlDeviceGetProcessesUtilizationInfo(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        info = out._obj
        if mig is not None or not gpu.processes_util_info:
            return nv.NVML_ERROR_NOT_SUPPORTED
        if info.version != nv.ProcessesUtilizationInfo_v1:
            return nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        samples = new_util_samples(gpu, info.lastSeenTimeStamp)
        if not samples:
            return nv.NVML_ERROR_NOT_FOUND
        if not info.procUtilArray or info.processSamplesCount < len(samples):
            info.processSamplesCount = len(samples)
            return nv.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (timestamp, pid, sm) in enumerate(samples):
            entry = info.procUtilArray[i]
            entry.pid, entry.timeStamp, entry.smUtil = pid, timestamp, sm
        info.processSamplesCount = len(samples)
        return SUCCESS

    @device_call
    def nvmlDeviceGetMigMode(gpu: FakeGpu, mig: FakeMig | None, current: Any, pending: Any) -> int:
        if mig is not None or not (gpu.mig_capable or gpu.migs is not None):
            return nv.NVML_ERROR_NOT_SUPPORTED
        mode = nv.NVML_DEVICE_MIG_ENABLE if gpu.migs is not None else nv.NVML_DEVICE_MIG_DISABLE
        current._obj.value = pending._obj.value = mode
        return SUCCESS

    @device_call
    def nvmlDeviceGetMaxMigDeviceCount(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        if mig is not None or gpu.migs is None:
            return nv.NVML_ERROR_NOT_SUPPORTED
        out._obj.value = gpu.max_mig_devices
        return SUCCESS

    @device_call
    def nvmlDeviceGetMigDeviceHandleByIndex(
        gpu: FakeGpu, mig: FakeMig | None, index: Any, out: Any
    ) -> int:
        if mig is not None or gpu.migs is None:
            return nv.NVML_ERROR_INVALID_ARGUMENT
        slot = _int(index)
        if not any(m.slot == slot for m in gpu.migs):
            return nv.NVML_ERROR_NOT_FOUND
        _write_pointer(out, _mig_address(fake.gpus.index(gpu), slot))
        return SUCCESS

    @device_call
    def nvmlDeviceGetGpuInstanceId(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        if mig is None:
            return nv.NVML_ERROR_INVALID_ARGUMENT
        out._obj.value = mig.gpu_instance_id
        return SUCCESS

    @device_call
    def nvmlGpmQueryDeviceSupport(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        if out._obj.version != nv.NVML_GPM_SUPPORT_VERSION:
            return nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        out._obj.isSupportedDevice = int(gpu.gpm and mig is None)
        return SUCCESS

    def nvmlGpmSampleAlloc(out: Any) -> int:
        address = next(fake._addresses)
        fake.gpm_samples[address] = _GpmSample()
        _write_pointer(out, address)
        return SUCCESS

    def nvmlGpmSampleFree(sample: Any) -> int:
        if fake.gpm_samples.pop(_address(sample), None) is None:
            return nv.NVML_ERROR_INVALID_ARGUMENT
        return SUCCESS

    def record(sample: Any, leaf: FakeGpu | FakeMig) -> int:
        stored = fake.gpm_samples.get(_address(sample))
        if stored is None:
            return nv.NVML_ERROR_INVALID_ARGUMENT
        stored.leaf, stored.at_s, stored.busy_s = leaf, fake.now_s, leaf.busy_s
        return SUCCESS

    @device_call
    def nvmlGpmSampleGet(gpu: FakeGpu, mig: FakeMig | None, sample: Any) -> int:
        if mig is not None or not gpu.gpm:
            return nv.NVML_ERROR_NOT_SUPPORTED
        return record(sample, gpu)

    @device_call
    def nvmlGpmMigSampleGet(gpu: FakeGpu, mig: FakeMig | None, instance: Any, sample: Any) -> int:
        if mig is not None or not gpu.gpm:
            return nv.NVML_ERROR_NOT_SUPPORTED
        for candidate in gpu.migs or []:
            if candidate.gpu_instance_id == _int(instance):
                return record(sample, candidate)
        return nv.NVML_ERROR_NOT_FOUND

    def nvmlGpmMetricsGet(out: Any) -> int:
        request = out._obj
        if request.version != nv.NVML_GPM_METRICS_GET_VERSION:
            return nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        first = fake.gpm_samples.get(_address(request.sample1))
        second = fake.gpm_samples.get(_address(request.sample2))
        if first is None or second is None or first.leaf is None or first.leaf is not second.leaf:
            return nv.NVML_ERROR_INVALID_ARGUMENT
        elapsed = second.at_s - first.at_s
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            known = (nv.NVML_GPM_METRIC_GRAPHICS_UTIL, nv.NVML_GPM_METRIC_SM_UTIL)
            if metric.metricId not in known or elapsed <= 0:  # sample2 must be the later one
                metric.nvmlReturn = nv.NVML_ERROR_INVALID_ARGUMENT
                continue
            garbage = second.leaf.gpm_metric
            if garbage is not None:
                metric.value = garbage
            else:
                metric.value = 100.0 * (second.busy_s - first.busy_s) / elapsed
            metric.nvmlReturn = SUCCESS
        return SUCCESS

    @device_call
    def nvmlDeviceGetTotalEccErrors(
        gpu: FakeGpu, mig: FakeMig | None, error_type: Any, counter_type: Any, out: Any
    ) -> int:
        if gpu.ecc_dbe_volatile is None:
            return nv.NVML_ERROR_NOT_SUPPORTED
        uncorrected = _int(error_type) == nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile = _int(counter_type) == nv.NVML_VOLATILE_ECC
        out._obj.value = gpu.ecc_dbe_volatile if uncorrected and volatile else 0
        return SUCCESS

    @device_call
    def nvmlDeviceGetRetiredPagesPendingStatus(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        if gpu.retired_pages_pending is None:
            return nv.NVML_ERROR_NOT_SUPPORTED
        out._obj.value = int(gpu.retired_pages_pending)
        return SUCCESS

    @device_call
    def nvmlDeviceGetRemappedRows(
        gpu: FakeGpu, mig: FakeMig | None, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> int:
        if gpu.remapped_rows is None:
            return nv.NVML_ERROR_NOT_SUPPORTED
        for out, value in zip((corr, unc, pending, failure), gpu.remapped_rows, strict=True):
            out._obj.value = int(value)
        return SUCCESS

    @device_call
    def clocks_event_reasons(gpu: FakeGpu, mig: FakeMig | None, out: Any) -> int:
        out._obj.value = gpu.clock_events
        return SUCCESS

    def nvmlEventSetCreate(out: Any) -> int:
        if fake.init_count == 0:
            return nv.NVML_ERROR_UNINITIALIZED
        address = next(fake._addresses)
        fake.event_sets[address] = _EventSet()
        _write_pointer(out, address)
        return SUCCESS

    def nvmlDeviceRegisterEvents(handle: Any, types: Any, event_set: Any) -> int:
        found = resolve(handle)
        if isinstance(found, int):
            return found
        gpu, mig = found
        stored = fake.event_sets.get(_address(event_set))
        if stored is None or mig is not None:
            return nv.NVML_ERROR_INVALID_ARGUMENT
        if not gpu.xid_events:
            return nv.NVML_ERROR_NOT_SUPPORTED
        if _int(types) & nv.nvmlEventTypeXidCriticalError:
            stored.gpus.append(gpu)
        return SUCCESS

    def nvmlEventSetWait_v2(event_set: Any, out: Any, timeout_ms: Any) -> int:
        stored = fake.event_sets.get(_address(event_set))
        if stored is None:
            return nv.NVML_ERROR_INVALID_ARGUMENT
        if not stored.queue:
            return nv.NVML_ERROR_TIMEOUT  # a test never waits: as if the timeout passed
        index, event_type, data = stored.queue.popleft()
        event = out._obj
        ctypes.c_void_p.from_buffer(event, type(event).device.offset).value = _gpu_address(index)
        event.eventType, event.eventData = event_type, data
        event.gpuInstanceId = event.computeInstanceId = 0xFFFFFFFF
        return SUCCESS

    def nvmlEventSetFree(event_set: Any) -> int:
        if fake.event_sets.pop(_address(event_set), None) is None:
            return nv.NVML_ERROR_INVALID_ARGUMENT
        return SUCCESS

    functions: dict[str, Callable[..., Any]] = {
        "nvmlInitWithFlags": nvmlInitWithFlags,
        "nvmlShutdown": nvmlShutdown,
        "nvmlErrorString": nvmlErrorString,
        "nvmlDeviceGetCount_v2": nvmlDeviceGetCount_v2,
        "nvmlDeviceGetHandleByIndex_v2": nvmlDeviceGetHandleByIndex_v2,
        "nvmlDeviceGetUUID": nvmlDeviceGetUUID,
        "nvmlDeviceGetName": nvmlDeviceGetName,
        "nvmlDeviceGetMinorNumber": nvmlDeviceGetMinorNumber,
        "nvmlDeviceGetMemoryInfo": nvmlDeviceGetMemoryInfo,
        "nvmlDeviceGetMemoryInfo_v2": nvmlDeviceGetMemoryInfo_v2,
        "nvmlDeviceGetUtilizationRates": nvmlDeviceGetUtilizationRates,
        "nvmlDeviceGetProcessUtilization": nvmlDeviceGetProcessUtilization,
        "nvmlDeviceGetProcessesUtilizationInfo": nvmlDeviceGetProcessesUtilizationInfo,
        "nvmlDeviceGetMigMode": nvmlDeviceGetMigMode,
        "nvmlDeviceGetMaxMigDeviceCount": nvmlDeviceGetMaxMigDeviceCount,
        "nvmlDeviceGetMigDeviceHandleByIndex": nvmlDeviceGetMigDeviceHandleByIndex,
        "nvmlDeviceGetGpuInstanceId": nvmlDeviceGetGpuInstanceId,
        "nvmlGpmQueryDeviceSupport": nvmlGpmQueryDeviceSupport,
        "nvmlGpmSampleAlloc": nvmlGpmSampleAlloc,
        "nvmlGpmSampleFree": nvmlGpmSampleFree,
        "nvmlGpmSampleGet": nvmlGpmSampleGet,
        "nvmlGpmMigSampleGet": nvmlGpmMigSampleGet,
        "nvmlGpmMetricsGet": nvmlGpmMetricsGet,
        "nvmlDeviceGetTotalEccErrors": nvmlDeviceGetTotalEccErrors,
        "nvmlDeviceGetRetiredPagesPendingStatus": nvmlDeviceGetRetiredPagesPendingStatus,
        "nvmlDeviceGetRemappedRows": nvmlDeviceGetRemappedRows,
        "nvmlDeviceGetCurrentClocksEventReasons": clocks_event_reasons,
        "nvmlDeviceGetCurrentClocksThrottleReasons": clocks_event_reasons,
        "nvmlEventSetCreate": nvmlEventSetCreate,
        "nvmlDeviceRegisterEvents": nvmlDeviceRegisterEvents,
        "nvmlEventSetWait_v2": nvmlEventSetWait_v2,
        "nvmlEventSetFree": nvmlEventSetFree,
    }
    for version in ("v2", "v3"):
        functions[f"nvmlDeviceGetComputeRunningProcesses_{version}"] = running_processes(False)
        functions[f"nvmlDeviceGetGraphicsRunningProcesses_{version}"] = running_processes(True)
    return {name: _counted(fake, name, function) for name, function in functions.items()}


def _counted(fake: FakeNvml, name: str, function: Callable[..., int]) -> Callable[..., int]:
    def call(*args: Any) -> int:
        fake.calls[name] += 1
        return function(*args)

    return call
