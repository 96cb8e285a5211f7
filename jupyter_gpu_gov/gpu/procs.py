"""One scan of ``/proc`` per sampler tick.

Reading ``/proc/<pid>/stat`` for every process is the only way to learn parents, process groups
and sessions, which attribution needs; it is done once per tick with raw ``os.read`` calls (no
psutil, no text wrappers) because it runs every few seconds inside the user's server.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property

# Inode of the initial PID namespace (PROC_PID_INIT_INO in the Linux kernel).
HOST_PID_NAMESPACE_INODE = 0xEFFFFFFC
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_NVIDIA_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    comm: str
    cpu_ticks: int  # utime + stime
    iowait_ticks: int  # delayacct_blkio_ticks: time blocked on block I/O


class ProcessTable:
    """Every process visible in this PID namespace at one instant."""

    def __init__(self, procs: dict[int, ProcInfo], proc_root: str = "/proc"):
        self.procs = procs
        self.proc_root = proc_root

    def __contains__(self, pid: int) -> bool:
        return pid in self.procs

    def __len__(self) -> int:
        return len(self.procs)

    def get(self, pid: int) -> ProcInfo | None:
        return self.procs.get(pid)

    @cached_property
    def _children(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {}
        for info in self.procs.values():
            children.setdefault(info.ppid, []).append(info.pid)
        return children

    def descendants(self, pid: int) -> set[int]:
        """``pid`` and every process below it (empty if ``pid`` is gone)."""
        if pid not in self.procs:
            return set()
        found, stack = {pid}, [pid]
        while stack:
            for child in self._children.get(stack.pop(), ()):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        return found

    @cached_property
    def _sessions(self) -> dict[int, set[int]]:
        sessions: dict[int, set[int]] = {}
        for info in self.procs.values():
            sessions.setdefault(info.sid, set()).add(info.pid)
        return sessions

    def in_session(self, sid: int) -> set[int]:
        """Processes of a session: catches daemonised helpers re-parented to init."""
        return self._sessions.get(sid, set())


def _read(path: str, size: int = 4096) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_stat(raw: bytes) -> ProcInfo | None:
    """Parse ``/proc/<pid>/stat``; ``comm`` may contain spaces and parentheses."""
    head, sep, tail = raw.rpartition(b")")
    if not sep:
        return None
    pid_text, _, comm = head.partition(b" (")
    fields = tail.split()
    # fields[0] is field 3 (state) of proc(5); field N is fields[N - 3].
    try:
        return ProcInfo(
            pid=int(pid_text),
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            sid=int(fields[3]),
            comm=comm.decode(errors="replace"),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            iowait_ticks=int(fields[39]) if len(fields) > 39 else 0,
        )
    except (ValueError, IndexError):
        return None


MAX_THREADS = 512  # threads of one process read for their CPU, at most (bounds a tick's cost)


def thread_ticks(pid: int, proc_root: str = "/proc") -> dict[int, int] | None:
    """CPU ticks (utime + stime) of each of a process's threads, from
    ``/proc/<pid>/task/<tid>/stat`` (at most ``MAX_THREADS``); ``None`` when unreadable."""
    try:
        names = os.listdir(f"{proc_root}/{pid}/task")
    except OSError:
        return None
    ticks = {}
    for name in names[:MAX_THREADS]:
        if not name.isdigit():
            continue
        raw = _read(f"{proc_root}/{pid}/task/{name}/stat")
        info = parse_stat(raw) if raw else None  # the thread may have exited meanwhile
        if info is not None:
            ticks[info.pid] = info.cpu_ticks
    return ticks


def _pids(proc_root: str) -> set[int]:
    try:
        return {int(name) for name in os.listdir(proc_root) if name.isdigit()}
    except OSError:
        return set()


def _read_stats(proc_root: str, pids: set[int]) -> dict[int, ProcInfo]:
    procs: dict[int, ProcInfo] = {}
    for pid in pids:
        raw = _read(f"{proc_root}/{pid}/stat")
        info = parse_stat(raw) if raw else None  # the process may have exited meanwhile
        if info is not None:
            procs[info.pid] = info
    return procs


def scan(proc_root: str = "/proc") -> ProcessTable:
    """Every process, once."""
    return ProcessTable(_read_stats(proc_root, _pids(proc_root)), proc_root)


class ProcScanner:
    """Repeated scans that skip processes already known not to be ours.

    A process outside the server's tree never joins it: re-parenting only ever moves a process
    to init (or a subreaper), and ``setsid()`` only starts a new session. So once a PID is seen
    to be foreign, its ``stat`` is not read again while the PID exists; only the server's own
    processes (whose CPU time we need) and new PIDs are read each tick.
    """

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root
        self.foreign: set[int] = set()

    def scan(self) -> ProcessTable:
        pids = _pids(self.proc_root)
        self.foreign &= pids  # a PID that went away may come back as someone else
        return ProcessTable(_read_stats(self.proc_root, pids - self.foreign), self.proc_root)

    def settle(self, table: ProcessTable, ours: set[int]) -> None:
        """Remember which processes of this scan are not ours."""
        self.foreign |= table.procs.keys() - ours


def read_bytes(pid: int, proc_root: str = "/proc") -> int | None:
    """Bytes this process caused to be read from storage (``/proc/<pid>/io``), if readable."""
    raw = _read(f"{proc_root}/{pid}/io")
    if not raw:
        return None
    for line in raw.split(b"\n"):
        if line.startswith(b"read_bytes:"):
            return int(line.split()[1])
    return None


def delay_accounting(proc_root: str = "/proc") -> bool:
    """Whether the kernel accounts I/O delay per task, so ``delayacct_blkio_ticks`` (field 42 of
    ``/proc/<pid>/stat``) means something. Since Linux 5.14 it is off by default
    (``kernel.task_delayacct = 0``) and the field reads 0: unknown, not "never waited". Without
    the sysctl (older kernels) it is on unless the kernel was booted with ``nodelayacct``."""
    raw = _read(f"{proc_root}/sys/kernel/task_delayacct", 16)
    return raw is None or raw.strip() != b"0"


def nvidia_device_files(pid: int, proc_root: str = "/proc") -> set[int] | None:
    """GPU device files a process has open: minor numbers of ``/dev/nvidia<N>``, plus ``-1`` for
    the control/UVM nodes every CUDA context opens. ``None`` when the fds cannot be read.

    Used only where NVML's PIDs are host PIDs (in a container): which *local* process holds a GPU
    is then learnt from its open files, never by looking a host PID up locally.
    """
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    found: set[int] = set()
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if not target.startswith("/dev/nvidia"):
            continue
        match = _NVIDIA_DEVICE.match(target)
        found.add(int(match.group(1)) if match else -1)
    return found


def in_host_pid_namespace(proc_root: str = "/proc") -> bool:
    """True when our PIDs are the host's, so NVML's PIDs can be looked up locally.

    Anything we cannot read counts as "not host": looking a host PID up in a container would
    attribute some unrelated local process.
    """
    try:
        return os.stat(f"{proc_root}/self/ns/pid").st_ino == HOST_PID_NAMESPACE_INODE
    except OSError:
        return False
