"""The sampler: every tick, one GPU sample, one /proc scan, attribution, rolling windows, and the
report (docs/api.md, "The report").

All measurement runs in one worker thread (NVML is never called from two threads, and the event
loop never waits on the driver); the event loop only hands in what Jupyter knows about its
kernels and terminals and takes back a finished, immutable report. The thread is a daemon: a
tick stuck in a hung driver never keeps the server from exiting.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime
from time import monotonic, thread_time

from ..core import clock, health
from ..core.models import GpuSnapshot, bounded
from ..core.window import ActivityWindow
from ..core.wire import MAX_TEXT
from ..gpu import procs
from ..gpu.attribution import (
    OTHER,
    Attribution,
    TargetGpu,
    TargetRoot,
    attribute,
    stray_gpu_pids,
    target_members,
)
from ..gpu.backends import select_visible
from ..gpu.base import GpuBackend

REPORT_SCHEMA = 1
# How long closing waits for the tick in progress (its /proc files and NVML are closed after it).
CLOSE_WAIT_S = 2.0


class NoSample(Exception):
    """Not one GPU sample yet (the driver hangs): nothing to show."""


@dataclass(frozen=True)
class TargetInfo:
    """What Jupyter knows about a kernel or terminal, gathered on the event loop."""

    root: TargetRoot
    name: str
    execution_state: str | None = None
    last_activity: datetime | None = None
    connections: int = 0
    path: str | None = None  # the notebook or console a kernel belongs to, when known
    busy_since: datetime | None = None  # since when the kernel has been executing


@dataclass
class TickResult:
    report: dict
    changes: list[dict] = field(default_factory=list)  # GPU state changes, one per target
    gpu_last_active: datetime | None = None
    cpu_seconds: float = 0.0  # sampler cost of this tick, CPU time of the worker thread


class UsageWindow:
    """A target's CPU, I/O wait and reads over the rolling window, one entry per tick, with
    running sums so a tick costs the same however many ticks the window holds."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._ticks: deque[tuple] = deque()
        # seconds, cpu, iowait, unknown iowait, read, unknown read, top thread x s, unknown top
        self._sums = [0.0, 0, 0, 0, 0, 0, 0.0, 0]

    def add(
        self,
        at: float,
        elapsed: float,
        cpu: int,
        iowait: int | None,
        read: int | None,
        top: float | None = None,
    ):
        tick = (at, elapsed, cpu, iowait, read, top)
        self._ticks.append(tick)
        self._count(tick, 1)
        # Keep the ticks that overlap the window (a tick covers [at - elapsed, at]); a single
        # tick longer than the window still says something.
        while len(self._ticks) > 1 and at - self._ticks[0][0] + self._ticks[0][1] > (
            self.seconds + 1e-6
        ):
            self._count(self._ticks.popleft(), -1)

    def _count(self, tick, sign: int) -> None:
        _, elapsed, cpu, iowait, read, top = tick
        sums = self._sums
        if top is None:
            sums[7] += sign
        else:
            sums[6] += sign * top * elapsed
        sums[0] += sign * elapsed
        sums[1] += sign * cpu
        if iowait is None:
            sums[3] += sign
        else:
            sums[2] += sign * iowait
        if read is None:
            sums[5] += sign
        else:
            sums[4] += sign * read

    def view(self) -> dict:
        """``{"cores", "iowait", "read_mb_s", "seconds", "top_thread"}``; ``None`` is
        unknown."""
        seconds, cpu, iowait, iowait_unknown, read, read_unknown, top, top_unknown = self._sums
        ticks = procs.CLOCK_TICKS * seconds
        return {
            # The busiest thread's share of a core, tick by tick: one saturated thread (a
            # serial loop) reads 1 where eight half-busy workers read 0.5 at four cores.
            "top_thread": None if top_unknown else round(min(1.0, top / seconds), 3),
            "cores": round(cpu / ticks, 3),
            # Summed over the tree's processes (two waiting at once count twice), so capped.
            "iowait": None if iowait_unknown else round(min(1.0, iowait / ticks), 3),
            "read_mb_s": None if read_unknown else round(read / seconds / 1e6, 3),
            "seconds": round(seconds, 3),
        }


class _Worker:
    """One daemon thread that runs calls in order. ``ThreadPoolExecutor``'s threads are joined
    at interpreter exit: a tick stuck in a hung driver (a lost GPU, GSP timeouts: minutes, or
    for ever) kept ``jupyter server`` from exiting, and from shutting down its kernels, until
    the spawner killed it."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, function: Callable, *args) -> Future:
        future: Future = Future()
        self._calls.put((future, function, args))
        return future

    def stop(self) -> None:
        """No call after those submitted so far."""
        self._calls.put(None)

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            future, function, args = call
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function(*args))
                except BaseException as error:
                    future.set_exception(error)


class Sampler:
    def __init__(
        self,
        backend_factory: Callable[[], GpuBackend],
        *,
        window_seconds: float = 60.0,
        active_threshold: float = 0.02,
        visible_devices: Sequence[str] | None = None,
        pid_namespace: str = "auto",
        time_sliced: bool = False,
        server_pid: int | None = None,
        proc_root: str = "/proc",
        open_files: int | None = None,
        log: logging.Logger | None = None,
    ):
        self._backend_factory = backend_factory
        self.backend: GpuBackend | None = None
        self.window_seconds = window_seconds
        self.active_threshold = active_threshold
        self.visible_devices = visible_devices
        # Why GPUs named by index cannot be told apart (CUDA counts them in another order than
        # NVML: ``GpuGovApp._pci_bus_order``); None: they can.
        self.index_order_unknown: str | None = None
        self.pid_namespace = pid_namespace
        self.time_sliced = time_sliced
        self.server_pid = server_pid or os.getpid()
        self.uid = os.getuid()  # the server's Unix user: the owner's, on a workstation
        self.proc_root = proc_root
        self.log = log or logging.getLogger(__name__)
        # The server's own /proc files, kept open between ticks (None: as the limit allows;
        # 0: open every file at every read, the plain path).
        keep = procs.open_files_budget() if open_files is None else open_files
        self._files = procs.ProcFiles(proc_root, keep)
        # The plain path lists /proc at every tick, as the code before the newest-PID check.
        self._scanner = procs.ProcScanner(
            proc_root, self._files, procs.newest_pid_file(proc_root) if keep else None
        )
        self._worker = _Worker("jupyter-gpu-gov-sampler")
        self._windows: dict[str, ActivityWindow] = {}
        self._server_window = ActivityWindow(window_seconds, active_threshold)
        self._holding_since: datetime | None = None  # the server holds a GPU since (see _report)
        self._states: dict[str, str] = {}
        self._last_known: dict[str, TargetGpu] = {}  # for reporting "unknown" after a failure
        self._last_devices: list[dict] = []
        self._cpu_prev: dict[int, tuple[int, int, int | None]] = {}  # pid -> cpu, iowait, read
        self._usage: dict[str, UsageWindow] = {}  # target -> its CPU and I/O over the window
        self._prev_at: float | None = None
        self._local_pids: bool | None = None
        self._first_tick = False  # the first tick after ``_learn_foreign``
        # Start-up, in the worker thread before any tick: the backend opened (the simulated one
        # publishes its devices, and a driver problem shows in the log at start-up rather than
        # at the first request), then every process on the machine read once (the first tick
        # then reads only what is new, as every later one does).
        self._started = self._worker.submit(self._start)

    def _start(self) -> None:
        self._open_backend()  # first: the simulated devices are published as soon as can be
        self._learn_foreign()

    def _learn_foreign(self) -> None:
        """Every process read once: those outside the server's tree and outside every session
        of its processes can never be a target's (``procs.ProcScanner``), and are not read
        again. Where a first tick's target is among them after all (a kernel the server did
        not start), that tick forgets this and reads everything, as without it."""
        table = self._scanner.scan()
        ours = table.descendants(self.server_pid)
        for sid in {table.procs[pid].sid for pid in ours}:
            ours |= table.in_session(sid)
        self._scanner.settle(table, ours)
        # Their kernels' and terminals' files opened now rather than at the first tick (a
        # kernel with 40 threads has 40 to open, 6-10 µs each): those in sessions of their own.
        server = table.get(self.server_pid)
        self._files.open_ahead(
            table.procs[pid] for pid in ours if server is None or table.procs[pid].sid != server.sid
        )
        self._first_tick = True

    def _open_backend(self) -> GpuBackend:
        if self.backend is None:
            try:
                self.backend = self._backend_factory()
            except Exception as error:
                self.log.error("jupyter-gpu-gov: cannot open the GPU backend: %s", error)
                raise
        return self.backend

    # -- thread plumbing ---------------------------------------------------------------------

    async def tick(self, targets: Sequence[TargetInfo], server: dict) -> TickResult:
        import asyncio

        return await asyncio.wrap_future(self._worker.submit(self.measure, list(targets), server))

    def close(self) -> None:
        """Close the backend and the /proc files in the worker, after the tick in progress,
        waiting ``CLOSE_WAIT_S`` at most: a tick stuck in the driver is left there (NVML is
        never called from another thread), and the process exits without it."""

        def _close():
            self._files.close()
            if self.backend is not None:
                self.backend.close()

        closed = self._worker.submit(_close)
        self._worker.stop()
        try:
            closed.result(timeout=CLOSE_WAIT_S)
        except FutureTimeout:
            self.log.warning(
                "jupyter-gpu-gov: the GPU driver has not answered for a sample in progress: "
                "stopping without closing NVML"
            )
        except Exception as error:
            self.log.warning("jupyter-gpu-gov: closing the GPU backend failed: %s", error)

    # -- one tick, in the worker thread ------------------------------------------------------

    def measure(self, targets: list[TargetInfo], server: dict) -> TickResult:
        wait([self._started])  # called from another thread (tests, benchmarks): start-up first
        started = thread_time()
        if self._first_tick:
            self._first_tick = False
            if any(t.root.pid in self._scanner.foreign for t in targets):
                self._scanner.forget_foreign()
        # Every figure one a GPU can give: a driver's garbage is unknown, and no field of the
        # report is one the governor refuses (the whole report with it).
        snapshot = bounded(self._open_backend().sample())
        if self.index_order_unknown and _several_gpus(snapshot):
            # Which card the kernels' index names is unknown: so is what they did, never idle.
            snapshot = GpuSnapshot(
                "unavailable", snapshot.sampled_at, error=self.index_order_unknown
            )
        now = snapshot.sampled_at
        table = self._scanner.scan(t.root.pid for t in targets)
        local_pids = self._pids_are_local()
        visible = select_visible(snapshot.devices, self.visible_devices)
        roots = [t.root for t in targets]

        members = target_members(table, roots, self.server_pid)
        self._scanner.settle(table, set().union(*members.values()))
        device_files = None
        if not local_pids and _lists_processes(snapshot, visible):
            # Host PIDs: learn holders from the open device files of our own processes only,
            # when a device of ours lists a process (a link read per descriptor, ~4 µs each,
            # of every process of the server: a GPU nobody runs on needs none of it).
            device_files = {
                pid: procs.nvidia_device_files(pid, self.proc_root)
                for pids in members.values()
                for pid in pids
            }

        own_user = ()
        if local_pids and self.uid != 0:
            # A GPU process outside the server is its owner's if it runs as the server's user
            # (root's are the system's: a display server, other containers).
            own_user = [
                pid
                for pid in stray_gpu_pids(snapshot, members, visible)
                if procs.uid_of(pid, self.proc_root) == self.uid
            ]
        attribution = attribute(
            snapshot,
            members,
            local_pids=local_pids,
            visible=visible,
            time_sliced=self.time_sliced,
            device_files=device_files,
            own_user=own_user,
        )
        usage = self._cpu_io(table, attribution, monotonic())
        report = self._report(snapshot, visible, targets, attribution, usage, server, now)
        changes = self._state_changes(report["targets"], now)
        self._files.sweep()
        last_active = self._server_window.last_active
        return TickResult(report, changes, last_active, thread_time() - started)

    def _pids_are_local(self) -> bool:
        if self.pid_namespace != "auto":
            return self.pid_namespace == "host"
        if self._local_pids is None:
            # The simulated backend registers real local PIDs, like NVML on a workstation.
            simulated = getattr(self.backend, "name", "") == "simulated"
            self._local_pids = simulated or procs.in_host_pid_namespace(self.proc_root)
        return self._local_pids

    def _cpu_io(self, table: procs.ProcessTable, attribution: Attribution, now: float) -> dict:
        """Per target, over the rolling window: ``{"cores", "iowait", "read_mb_s",
        "seconds", "top_thread"}`` (see docs/api.md). Per-process deltas between two ticks, summed per target
        and kept per tick for ``window_seconds``, so a process that exits does not make the
        numbers jump and a report every minute describes the whole minute, not its last tick."""
        elapsed = (now - self._prev_at) if self._prev_at is not None else None
        iowait_known = procs.delay_accounting(self.proc_root)
        current: dict[int, tuple[int, int, int | None, dict | None]] = {}
        usage = {}
        files, get, last = self._files, table.procs.get, self._cpu_prev.get
        read_bytes_of, thread_ticks_of = files.read_bytes, files.thread_ticks
        unchanged = table.unchanged
        for key, pids in attribution.members.items():
            cpu = iowait = read = 0
            ours = key != OTHER  # only the targets' own processes' I/O and threads are read
            read_known = ours
            top: float | None = 0.0 if ours else None
            busiest = 0  # the most CPU ticks one thread of this target took since the last tick
            for pid in pids:
                info = get(pid)
                if info is None:
                    continue
                prev = last(pid)
                if not ours:
                    read_bytes = threads = None
                elif pid in unchanged and prev is not None and None not in prev:
                    # It did not run since the last tick: its reads and threads stand still
                    # (most of a server's processes, most of the time: idle kernels).
                    read_bytes, threads = prev[2], prev[3]
                    files.keep_unread(pid, threads)
                else:
                    read_bytes = read_bytes_of(pid)
                    threads = thread_ticks_of(pid, info.num_threads)
                current[pid] = (info.cpu_ticks, info.iowait_ticks, read_bytes, threads)
                if prev is None:
                    continue  # new since the last tick: counted from the next one
                if top is not None and threads is not None and prev[3] is not None:
                    before = prev[3]
                    # the same readings where it did not run: no thread took a tick
                    for tid, ticks in threads.items() if threads is not before else ():
                        if ticks - before.get(tid, ticks) > busiest:
                            busiest = ticks - before[tid]
                elif ours:
                    top = None
                # Counters never go back for one process; a PID reused reads less: count 0.
                if info.cpu_ticks > prev[0]:
                    cpu += info.cpu_ticks - prev[0]
                if info.iowait_ticks > prev[1]:
                    iowait += info.iowait_ticks - prev[1]
                if read_bytes is None or prev[2] is None:
                    read_known = False
                elif read_bytes > prev[2]:
                    read += read_bytes - prev[2]
            if not elapsed:
                continue
            if top is not None:
                top = busiest / (procs.CLOCK_TICKS * elapsed)
            window = self._usage.get(key)
            if window is None:
                window = self._usage[key] = UsageWindow(self.window_seconds)
            window.add(
                now,
                elapsed,
                cpu,
                iowait if iowait_known else None,
                read if read_known else None,
                top,
            )
            usage[key] = {"cpu": window.view()}
        for key in set(self._usage) - usage.keys():
            del self._usage[key]  # a target that went away
        self._cpu_prev, self._prev_at = current, now
        return usage

    def _report(
        self,
        snapshot: GpuSnapshot,
        visible: set[str] | None,
        targets: list[TargetInfo],
        attribution: Attribution,
        usage: dict,
        server: dict,
        now: datetime,
    ) -> dict:
        available = snapshot.available
        # Listed but not read: a lost GPU. What its holders held is unknown, never idle.
        unreadable = {d.uuid for d in snapshot.devices if d.uuid not in snapshot.samples}
        if available:
            devices = [
                {
                    "uuid": d.uuid,
                    "name": d.name,
                    "mig_profile": d.mig_profile,
                    "parent_uuid": d.parent_uuid,
                    "memory_total_mb": d.memory_total_mb,
                    "memory_used_mb": _sample(snapshot, d.uuid, "memory_used_mb"),
                    "activity": _sample(snapshot, d.uuid, "activity"),
                    "memory_activity": _sample(snapshot, d.uuid, "memory_activity"),
                    "shared": d.uuid in attribution.shared,
                    "health": _health(snapshot, d.uuid),
                }
                for d in snapshot.devices
                if visible is None or d.uuid in visible
            ]
            self._last_devices = devices
        elif snapshot.backend == "none":
            devices = []
        else:
            # Keep naming the devices we had, with every reading unknown.
            devices = unreadable_devices(self._last_devices, snapshot.error)

        entries: list[tuple[str, dict, TargetGpu | None]] = [
            (t.root.key, _describe(t), attribution.gpu.get(t.root.key)) for t in targets
        ]
        if OTHER in attribution.gpu or self._held_unreadable(OTHER, available, unreadable):
            entries.append(
                (
                    OTHER,
                    {"kind": "other", "id": "server", "name": "other processes"},
                    attribution.gpu.get(OTHER),
                )
            )

        report_targets = []
        server_sms: list[float | None] = []
        for key, described, gpu in entries:
            readable = available and not self._held_unreadable(key, available, unreadable)
            gpu_view = self._gpu_view(key, gpu, readable, snapshot.backend, now)
            if gpu_view["holds_context"]:
                server_sms.append(gpu_view["sm"])
            report_targets.append({**described, "gpu": gpu_view, **usage.get(key, {"cpu": None})})
        for key in set(self._windows) - {key for key, _, _ in entries}:
            del self._windows[key]  # a target that went away

        if (not available and snapshot.backend != "none") or any(sm is None for sm in server_sms):
            server_sm = None
        else:
            server_sm = max(server_sms, default=0.0)
        self._server_window.add(now, server_sm)
        # Its idle stretch starts no earlier than it took a GPU (a context, or GPUs allocated to
        # it): a notebook that worked on the CPU for an hour, then moved its model to the GPU,
        # read idle for that hour until its training ran, and was warned at once.
        if server_sms or (devices and server.get("gpu_allocated")):
            self._holding_since = self._holding_since or now
        else:
            self._holding_since = None
        idle_since = self._server_window.idle_since
        if idle_since is not None and self._holding_since is not None:
            idle_since = max(idle_since, self._holding_since)

        return {
            "schema": REPORT_SCHEMA,
            "sampled_at": clock.isoformat(now),
            "backend": snapshot.backend,
            "error": snapshot.error,
            "server": server,
            "devices": devices,
            "targets": report_targets,
            "window": {
                "seconds": self.window_seconds,
                "gpu_active_fraction": self._server_window.active_fraction(),
                "gpu_last_active": clock.isoformat(self._server_window.last_active),
                "gpu_idle_since": clock.isoformat(idle_since),
            },
            "checkpoint": {"requested_at": None, "status": None, "manifest": None},
        }

    def _held_unreadable(self, key: str, available: bool, unreadable: set[str]) -> bool:
        """Whether ``key`` held a GPU that cannot be read now (all of them, when the backend
        is unavailable)."""
        last = self._last_known.get(key)
        return last is not None and (not available or bool(unreadable.intersection(last.devices)))

    def _gpu_view(
        self, key: str, gpu: TargetGpu | None, available: bool, backend: str, now: datetime
    ) -> dict:
        window = self._windows.get(key)
        if available or backend == "none":
            if gpu is not None:
                self._last_known[key] = gpu
            else:
                self._last_known.pop(key, None)
        elif key in self._last_known:
            # The backend failed: what this target held is now unknown, never idle.
            last = self._last_known[key]
            gpu = TargetGpu(last.devices, None, None, True, "unknown", last.pids)
        if gpu is None:
            if available or backend == "none":
                self._windows.pop(key, None)
                return {
                    "devices": [],
                    "memory_mb": 0,
                    "sm": 0.0,
                    "holds_context": False,
                    "confidence": "exact",
                    "last_active": None,
                    "idle_since": None,
                    "active_fraction": None,
                    "history": [],
                }
            gpu = TargetGpu([], None, None, False, "unknown")
        if window is None:
            window = self._windows[key] = ActivityWindow(self.window_seconds, self.active_threshold)
        window.add(now, gpu.sm)
        return {
            "devices": gpu.devices,
            "memory_mb": gpu.memory_mb,
            "sm": None if gpu.sm is None else round(gpu.sm, 4),
            "holds_context": gpu.holds_context,
            "confidence": gpu.confidence,
            "last_active": clock.isoformat(window.last_active),
            "idle_since": clock.isoformat(window.idle_since),
            "active_fraction": window.active_fraction(),
            "pids": gpu.pids,
            "history": window.history(),
        }

    def _state_changes(self, targets: list[dict], now: datetime) -> list[dict]:
        changes = []
        seen = set()
        for target in targets:
            key = f"{target['kind']}:{target['id']}"
            seen.add(key)
            state = gpu_state(target["gpu"], self.active_threshold)
            previous = self._states.get(key, "none")
            if state != previous:
                changes.append(
                    {
                        "target_kind": target["kind"],
                        "target_id": target["id"],
                        "target_name": target["name"],
                        "previous_state": previous,
                        "state": state,
                        "devices": target["gpu"]["devices"],
                        "memory_mb": target["gpu"]["memory_mb"],
                        "at": clock.isoformat(now),
                    }
                )
            self._states[key] = state
        for key in set(self._states) - seen:
            del self._states[key]
        return changes


def unreadable_devices(devices: list[dict], error: str | None) -> list[dict]:
    """The devices still named, with every reading unknown (a backend that fails)."""
    unknown = health.unknown(f"the GPU cannot be read: {error}").as_dict()
    readings = {"memory_used_mb": None, "activity": None, "memory_activity": None}
    return [{**d, **readings, "health": unknown} for d in devices]


def unreadable(report: dict, error: str, now: datetime) -> dict:
    """``report`` as a backend that fails is reported (``Sampler._report``): its devices named
    with every reading unknown, what each target held unknown, never idle."""
    held = {"memory_mb": None, "sm": None, "confidence": "unknown"}
    return {
        **report,
        "sampled_at": clock.isoformat(now),
        "backend": "unavailable",
        "error": error,
        "devices": unreadable_devices(report["devices"], error),
        "targets": [
            {**t, "gpu": {**t["gpu"], **held}} if t["gpu"]["holds_context"] else t
            for t in report["targets"]
        ],
        "window": {**report["window"], "gpu_active_fraction": None},
    }


def _within(text: str | None) -> str | None:
    """A name or path as the governor takes it (``MAX_TEXT``: a longer one made the whole report
    a 400): its end, where a path names the notebook."""
    if text is None or len(text) <= MAX_TEXT:
        return text
    return "…" + text[1 - MAX_TEXT :]


def gpu_state(gpu: dict, threshold: float) -> str:
    """``none`` (holds no GPU), ``active``, ``idle`` or ``unknown``: what a person would call it."""
    if not gpu["holds_context"]:
        return "none" if gpu["confidence"] != "unknown" else "unknown"
    if gpu["sm"] is None:
        return "unknown"
    return "active" if gpu["sm"] >= threshold else "idle"


def _describe(target: TargetInfo) -> dict:
    return {
        "kind": target.root.kind,
        "id": target.root.id,
        "name": _within(target.name),
        "path": _within(target.path),
        "execution_state": target.execution_state,
        "busy_since": clock.isoformat(target.busy_since),
        "last_activity": clock.isoformat(target.last_activity),
        "connections": target.connections,
    }


def _several_gpus(snapshot: GpuSnapshot) -> bool:
    """Whether NVML shows more than one physical GPU (a MIG instance counts as its GPU)."""
    return len({d.parent_uuid or d.uuid for d in snapshot.devices}) > 1


def _lists_processes(snapshot: GpuSnapshot, visible: set[str] | None) -> bool:
    """Whether a device this server may use lists a process (only those are attributed)."""
    return snapshot.available and any(
        sample.processes
        for uuid, sample in snapshot.samples.items()
        if visible is None or uuid in visible
    )


def _health(snapshot: GpuSnapshot, uuid: str) -> dict | None:
    checked = snapshot.health.get(uuid)
    return None if checked is None else checked.as_dict()


def _sample(snapshot: GpuSnapshot, uuid: str, attr: str):
    sample = snapshot.samples.get(uuid)
    return getattr(sample, attr) if sample is not None else None
