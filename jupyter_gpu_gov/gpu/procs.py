"""One scan of ``/proc`` per sampler tick.

Reading ``/proc/<pid>/stat`` for every process is the only way to learn parents, process groups
and sessions, which attribution needs; it is done once per tick with raw ``os.read`` calls (no
psutil, no text wrappers) because it runs every few seconds inside the user's server. The
server's own processes, read every tick, are read through descriptors kept open between ticks
(``ProcFiles``): one ``pread`` instead of an open, a read and a close.
"""

from __future__ import annotations

import os
import re
import resource
import time
from collections.abc import Iterable
from functools import cached_property
from typing import NamedTuple

# Inode of the initial PID namespace (PROC_PID_INIT_INO in the Linux kernel).
HOST_PID_NAMESPACE_INODE = 0xEFFFFFFC
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_NVIDIA_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")


class ProcInfo(NamedTuple):  # a tuple: made for every process of the first scan
    pid: int
    ppid: int
    pgid: int
    sid: int
    comm: str
    cpu_ticks: int  # utime + stime
    iowait_ticks: int  # delayacct_blkio_ticks: time blocked on block I/O
    num_threads: int = 0


class ProcessTable:
    """Every process visible in this PID namespace at one instant."""

    def __init__(
        self,
        procs: dict[int, ProcInfo],
        proc_root: str = "/proc",
        unchanged: frozenset[int] = frozenset(),
    ):
        self.procs = procs
        self.proc_root = proc_root
        # Processes whose ``stat`` line is the last tick's, byte for byte: they did not run
        # (same CPU ticks, faults, state and last CPU), so their other counters did not move.
        self.unchanged = unchanged

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
            num_threads=int(fields[17]),
        )
    except (ValueError, IndexError):
        return None


def _cpu_ticks(raw: bytes) -> int | None:
    """utime + stime of a ``stat`` line (a thread's: only its CPU time is needed)."""
    fields = raw.rpartition(b")")[2].split(None, 13)
    try:
        return int(fields[11]) + int(fields[12])
    except (ValueError, IndexError):
        return None


MAX_THREADS = 512  # threads of one process read for their CPU, at most (bounds a tick's cost)


# Kept descriptors, at most: a busy PyTorch kernel has 40-80 threads (its intra-op pool, CUDA's
# and the loader's), each a file read every tick; 20 of them need about 1,600. A kept file is
# read in one pread (1 us for a thread's schedstat) where a fresh one costs an open and a close
# besides (8-10 us).
MAX_KEPT_FILES = 4096


def open_files_budget() -> int:
    """Descriptors a sampler may keep open: a quarter of the soft limit, at most
    ``MAX_KEPT_FILES``."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return MAX_KEPT_FILES
    return max(0, min(MAX_KEPT_FILES, soft // 4))


def _list(task: str, kind: str) -> tuple[list[int], list[str]] | None:
    """A process's threads: their ids, and their files' paths."""
    try:
        names = [name for name in os.listdir(task) if name.isdigit()][:MAX_THREADS]
    except OSError:
        return None
    return [int(name) for name in names], [f"{task}/{name}/{kind}" for name in names]


def process_cpu_ns(pid: int) -> int:
    """A process's CPU time in ns: every thread's, the ended ones' included, from the counters
    each thread's ``schedstat`` shows (its CPU clock, ``(~pid << 3) | CPUCLOCK_SCHED``, which
    ``clock_gettime`` reads for any process; a thread's own clock only within its process).
    ``OSError`` once the process is gone."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)


def reads_own_pids(proc_root: str) -> bool:
    """Whether ``proc_root`` shows this process's PID namespace (so a PID there names the
    process a CPU clock of that PID reads)."""
    try:
        return os.readlink(f"{proc_root}/self") == str(os.getpid())
    except OSError:
        return False


def _ns(raw: bytes) -> int:
    """A ``schedstat`` line's time on a CPU, in ns (``ValueError``, ``IndexError`` if none)."""
    return int(raw.split(None, 1)[0])


def _run_ticks(raw: bytes) -> float | None:
    """A ``schedstat`` line's time on a CPU (nanoseconds), in clock ticks."""
    head = raw.split(None, 1)
    try:
        return int(head[0]) * CLOCK_TICKS / 1e9
    except (ValueError, IndexError):
        return None


class ProcFiles:
    """Reads of ``/proc`` files, up to ``keep`` of them through descriptors kept open.

    A ``/proc/<pid>/…`` file is generated anew at every read from offset 0, and its descriptor
    stays bound to the process it was opened for: once that process is gone (even if its PID is
    reused) a read fails (``ESRCH``) or reads nothing, and the file is opened again by its path,
    so a kept descriptor never reads another process's numbers. A descriptor not read during a
    tick is closed at its end (``sweep``). Descriptors are close-on-exec (Python's default), so
    kernels and terminals started by the server never inherit them.

    A running process's threads that did not run since the last tick are known by its CPU
    clock rather than read (``_only_those_that_ran``).

    ``keep=0`` is the plain path: every read opens and closes its file, and every process's
    threads are listed and read; the tests compare the two.
    """

    def __init__(self, proc_root: str = "/proc", keep: int = 0):
        self.proc_root = proc_root
        self.keep = keep
        self._fds: dict[str, int] = {}
        self._read_now: set[str] = set()
        # A thread's CPU time: "schedstat" (one number, a third of stat's cost to read) where
        # the kernel fills it in, else "stat"; chosen at the first read and kept, so a thread's
        # two ends of a tick come from the same file.
        self._thread_file: str | None = None
        # each process's threads, as last listed: their ids and their files' paths
        self._tids: dict[int, tuple[list[int], list[str]]] = {}
        self._tids_now: set[int] = set()  # the processes whose threads this tick used
        # Where threads' times are schedstat's: each process's CPU clock before its threads'
        # last reads, the lines read, the times, and which threads ran (``_only_those_that_ran``)
        self._runs: dict[int, tuple[int, list[bytes], dict[int, float], list[int]]] = {}
        self.cpu_clock = process_cpu_ns if keep and reads_own_pids(proc_root) else None
        self.no_new_threads = False  # no PID (a thread's id is one) allocated since the last tick

    def read(self, path: str, size: int = 4096) -> bytes | None:
        fd = self._fds.get(path)
        if fd is not None:
            try:
                raw = os.pread(fd, size, 0)
            except OSError:
                raw = b""
            if raw:
                self._read_now.add(path)
                return raw
            del self._fds[path]  # its process is gone: the path may name another one now
            os.close(fd)
        if len(self._fds) >= self.keep:
            return _read(path, size)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            raw = os.pread(fd, size, 0)
        except OSError:
            raw = None
        if raw:
            self._fds[path] = fd
            self._read_now.add(path)
        else:
            os.close(fd)
        return raw

    def read_bytes(self, pid: int) -> int | None:
        """Bytes this process caused to be read from storage (``/proc/<pid>/io``), if
        readable."""
        raw = self.read(f"{self.proc_root}/{pid}/io")
        if not raw:
            return None
        start = 0 if raw.startswith(b"read_bytes:") else raw.find(b"\nread_bytes:") + 1
        if not start and not raw.startswith(b"read_bytes:"):
            return None
        end = raw.find(b"\n", start)
        return int(raw[start : end if end >= 0 else None].split()[1])

    def thread_ticks(self, pid: int, num_threads: int = 0) -> dict[int, float] | None:
        """CPU time, in clock ticks, of each of a process's threads (at most ``MAX_THREADS``),
        from ``/proc/<pid>/task/<tid>/schedstat`` or ``stat``; ``None`` when unreadable.
        ``num_threads``: from the process's ``stat``. A single thread is the process's own
        task, read without listing ``task/``; so are threads as many as last listed, all
        still there (a set of that size holding every one listed is the same set)."""
        task = f"{self.proc_root}/{pid}/task"
        if self._thread_file is None:
            self._thread_file = self._choose_thread_file(task, pid)
        kind = self._thread_file
        parse, size = (_run_ticks, 128) if kind == "schedstat" else (_cpu_ticks, 4096)
        if num_threads == 1 and self.keep:
            raw = self.read(f"{task}/{pid}/{kind}", size)
            cpu = parse(raw) if raw else None
            return None if cpu is None else {pid: cpu}
        kept = self._tids.get(pid) if self.keep else None
        same = kept is not None and len(kept[0]) == num_threads
        clock = self.cpu_clock if kind == "schedstat" else None
        if same and clock is not None and pid in self._runs:
            found = self._only_those_that_ran(pid, *kept)
            if found is not None:
                self._tids_now.add(pid)
                return found
        try:
            before = clock(pid) if clock is not None else None  # before any thread is read
        except OSError:
            before = None
        listed = kept if same else _list(task, kind)
        if listed is None:
            return None
        found, raws = self._read_threads(*listed, parse, size)
        if len(found) < len(listed[0]) and listed is kept:
            # One ended since the last listing (and another may have started): list again,
            # as the plain path would have.
            listed = _list(task, kind)
            if listed is None:
                return None
            tids, paths = listed
            left = [i for i, tid in enumerate(tids) if tid not in found]
            more, _ = self._read_threads(
                [tids[i] for i in left], [paths[i] for i in left], parse, size
            )
            found.update(more)
            raws = None  # not one listing's lines: the next tick reads every thread
        if self.keep:
            last = self._runs.pop(pid, None)  # of the last listing: only its lines compare
            if before is not None and raws is not None:
                old = last[1] if last is not None and listed is kept else None
                ran = [i for i, raw in enumerate(raws) if old is None or raw != old[i]]
                self._runs[pid] = (before, raws, found, ran)
            self._tids[pid] = listed
            self._tids_now.add(pid)
        return found

    def _only_those_that_ran(self, pid: int, tids: list[int], paths: list[str]) -> dict | None:
        """The threads that ran at the last read read again, and the others' times as they
        were where the process's CPU clock proves that none of them ran since: the clock
        (every thread's time summed, ended ones' included), read before the last read and
        after this one, moved by exactly what those threads' files did, and no PID (a thread's
        id is one) was allocated since the last tick. Every thread's time only grows, so each
        of the others moved by 0. Where the clock moved by more, the others are read too.
        ``None`` (the caller reads them all) where a file is not kept, a thread has ended or
        no PID may have been allocated."""
        if not self.no_new_threads:
            return None
        clock, (last, raws, found, ran) = self.cpu_clock, self._runs[pid]
        fds, pread = self._fds, os.pread
        lines = list(raws)
        try:
            before = clock(pid)  # the next tick's start: before this tick's reads
            for i in ran:
                lines[i] = pread(fds[paths[i]], 128, 0)
            moved = sum(map(_ns, (lines[i] for i in ran))) - sum(map(_ns, (raws[i] for i in ran)))
            if clock(pid) - last == moved:
                found = dict(found)
                found.update((tids[i], _run_ticks(lines[i])) for i in ran)
            else:  # another ran too: read the others (those that ran were, after ``before``)
                for i in set(range(len(tids))).difference(ran):
                    lines[i] = pread(fds[paths[i]], 128, 0)
                cpus = list(map(_run_ticks, lines))
                if None in cpus:
                    return None
                found = dict(zip(tids, cpus, strict=True))
        except (KeyError, OSError, ValueError, IndexError):
            return None  # a file not kept, a thread gone (reads nothing), the process gone
        self._runs[pid] = (
            before,
            lines,
            found,
            [i for i, raw in enumerate(lines) if raw != raws[i]],
        )
        self._read_now.update(paths)
        return found

    def _read_threads(
        self, tids: list[int], paths: list[str], parse, size: int
    ) -> tuple[dict, list[bytes] | None]:
        """Each thread's time, through its kept descriptor or else by its path; and the lines
        read where every file was kept."""
        fds, pread = self._fds, os.pread
        try:
            # The usual tick: every file kept open and every thread still there, one pread
            # each and nothing else (a thread that ended fails here, or reads nothing).
            raws = [pread(fds[path], size, 0) for path in paths]
        except (KeyError, OSError):
            raws = None
        if raws and all(raws):
            cpus = list(map(parse, raws))
            if None not in cpus:
                self._read_now.update(paths)
                return dict(zip(tids, cpus, strict=True)), raws
        found = {}
        read = self.read
        for tid, path in zip(tids, paths, strict=True):
            raw = read(path, size)
            cpu = parse(raw) if raw else None  # the thread may have exited meanwhile
            if cpu is not None:
                found[tid] = cpu
        return found, None

    def _choose_thread_file(self, task: str, pid: int) -> str:
        # "0 0 0" where the kernel keeps no scheduler statistics (older kernels with delay
        # accounting off): a thread that has run has run for more than 0 ns.
        raw = _read(f"{task}/{pid}/schedstat", 128)
        return "schedstat" if raw and (_run_ticks(raw) or 0) > 0 else "stat"

    def open_ahead(self, procs: Iterable[ProcInfo]) -> None:
        """Open and keep now the files a tick reads of these processes (``stat``, ``io``, each
        thread's), so that the first tick to read them only reads them: start-up does this for
        the server's kernels and terminals, whose threads are most of the files."""
        if not self.keep:
            return
        for info in procs:
            self.read(f"{self.proc_root}/{info.pid}/stat")
            self.read_bytes(info.pid)
            self.thread_ticks(info.pid, info.num_threads)
        self.sweep()  # the files the next tick does not read are closed at its end

    def keep_unread(self, pid: int, tids: Iterable[int]) -> None:
        """Keep open, unread this tick, the I/O and thread files of a process that did not run
        since the last one (their numbers are the last ones read)."""
        base = f"{self.proc_root}/{pid}"
        self._read_now.add(f"{base}/io")
        kept = self._tids.get(pid)
        if kept is not None:
            self._read_now.update(kept[1])
        else:
            self._read_now.update(f"{base}/task/{tid}/{self._thread_file}" for tid in tids)
        self._tids_now.add(pid)

    def sweep(self) -> None:
        """Close the descriptors no read used since the last sweep (processes that went)."""
        for path in self._fds.keys() - self._read_now:
            os.close(self._fds.pop(path))
        self._read_now = set()
        for pid in self._tids.keys() - self._tids_now:
            del self._tids[pid]
            self._runs.pop(pid, None)
        self._tids_now = set()

    def forget(self, pids: set[int]) -> None:
        """Close now the descriptors of processes no longer read, so that until the next sweep
        they do not take the places of the files this tick does read."""
        if not pids:
            return
        start = len(self.proc_root) + 1
        for path in [p for p in self._fds if int(p[start : p.index("/", start)]) in pids]:
            os.close(self._fds.pop(path))
        for pid in pids:
            self._tids.pop(pid, None)
            self._runs.pop(pid, None)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._read_now = set()
        self._tids.clear()
        self._runs.clear()


def thread_ticks(pid: int, proc_root: str = "/proc") -> dict[int, int] | None:
    """``ProcFiles.thread_ticks``, reading each file once."""
    return ProcFiles(proc_root).thread_ticks(pid)


def read_bytes(pid: int, proc_root: str = "/proc") -> int | None:
    """``ProcFiles.read_bytes``, reading the file once."""
    return ProcFiles(proc_root).read_bytes(pid)


def _pids(proc_root: str) -> set[int]:
    try:
        return set(map(int, filter(str.isdigit, os.listdir(proc_root))))
    except OSError:
        return set()


def scan(proc_root: str = "/proc") -> ProcessTable:
    """Every process, once."""
    return ProcScanner(proc_root).scan()


def newest_pid_file(proc_root: str = "/proc") -> str | None:
    """``<proc_root>/loadavg``, whose last field is the PID most recently allocated in the
    reader's PID namespace, where it is the kernel's own file: not where another filesystem
    (LXCFS, a FUSE mount) is mounted over it, nor where it is missing."""
    path = f"{proc_root}/loadavg"
    try:
        return path if os.stat(path).st_dev == os.stat(proc_root).st_dev else None
    except OSError:
        return None


class ProcScanner:
    """Repeated scans that skip processes already known not to be ours.

    A process outside the server's tree never joins it: re-parenting only ever moves a process
    to init (or a subreaper), and ``setsid()`` only starts a new session. So once a PID is seen
    to be foreign, its ``stat`` is not read again while the PID exists; only the server's own
    processes (whose CPU time we need) and new PIDs are read each tick, ours through ``files``.

    Nor is ``proc_root`` listed again while no PID was allocated since its last listing (the
    newest PID, ``newest_pid_file``, is the same): a process can only join the server's tree
    by being forked from one of its processes, which allocates a PID in the server's
    namespace. That listing is most of a quiet tick's cost (every PID on the machine). It is
    still listed every ``LIST_EVERY`` scans, when a PID the caller expects is not among ours,
    and always once a listing shows a PID that appeared while the newest did not change (a
    file that does not say what the kernel's says).
    """

    LIST_EVERY = 12  # a minute at the sampler's default 5 s

    def __init__(
        self,
        proc_root: str = "/proc",
        files: ProcFiles | None = None,
        newest_pid: str | None = None,
    ):
        self.proc_root = proc_root
        self.files = files or ProcFiles(proc_root)
        self.foreign: set[int] = set()
        self._ours: dict[int, tuple[bytes, ProcInfo]] = {}  # our processes' last stat, parsed
        self.newest_pid = newest_pid  # the file that names the newest PID; None: list always
        self._listed: set[int] = set()  # the PIDs of the last listing
        self._listed_newest: bytes | None = None  # and the newest PID then
        self._unlisted = 0  # scans since that listing

    def forget_foreign(self) -> None:
        """Read every process again at the next scan."""
        self.foreign.clear()
        self._listed_newest = None

    def _newest(self) -> bytes | None:
        raw = _read(self.newest_pid) if self.newest_pid else None
        return raw.rsplit(None, 1)[-1] if raw else None

    def _candidates(self, expect: Iterable[int]) -> Iterable[int]:
        """The PIDs that may be ours: ours, and any new since the last listing."""
        newest = self._newest()
        # The newest PID as at the last tick: no process, and no thread, started since.
        self.files.no_new_threads = newest is not None and newest == self._listed_newest
        if (
            newest is not None
            and newest == self._listed_newest
            and self._unlisted < self.LIST_EVERY
            and all(pid in self._ours for pid in expect)
        ):
            self._unlisted += 1
            return list(self._ours)  # no PID was allocated since the listing: none is new
        pids = _pids(self.proc_root)
        if newest is not None and newest == self._listed_newest and pids - self._listed:
            self.newest_pid = None  # it said no PID was allocated, and one was: list always
        self._listed, self._listed_newest, self._unlisted = pids, newest, 0
        self.foreign &= pids  # a PID that went away may come back as someone else
        return pids - self.foreign

    def scan(self, expect: Iterable[int] = ()) -> ProcessTable:
        """Our processes and any new ones; ``expect``: PIDs the caller knows (a target's root),
        listed if not among ours."""
        procs: dict[int, ProcInfo] = {}
        unchanged: set[int] = set()
        ours, read, fast = self._ours, self.files.read, self.files.keep > 0
        for pid in self._candidates(expect):
            path = f"{self.proc_root}/{pid}/stat"
            last = ours.get(pid)
            raw = read(path) if last is not None else _read(path)
            if not raw:
                continue  # the process exited meanwhile
            # A process that did not run since the last tick reads the same line.
            same = fast and last is not None and last[0] == raw
            if same:
                unchanged.add(pid)
            info = last[1] if same else parse_stat(raw)
            if info is not None:
                procs[info.pid] = info
                if last is not None:
                    ours[pid] = (raw, info)
        return ProcessTable(procs, self.proc_root, frozenset(unchanged))

    def settle(self, table: ProcessTable, ours: set[int]) -> None:
        """Remember which processes of this scan are not ours (and which are)."""
        self.foreign |= table.procs.keys() - ours
        known = self._ours
        self._ours = {
            pid: known.get(pid) or (b"", info) for pid, info in table.procs.items() if pid in ours
        }
        # Start-up counts the whole session of the server as its own (a process there may yet
        # join a kernel); the first tick reads those files and then no longer needs them.
        self.files.forget(known.keys() - self._ours.keys())


def uid_of(pid: int, proc_root: str = "/proc") -> int | None:
    """The real user ID a process runs as (``Uid:`` in ``/proc/<pid>/status``); ``None`` when it
    cannot be read (the process is gone, or hidden by ``hidepid``)."""
    raw = _read(f"{proc_root}/{pid}/status")
    for line in (raw or b"").splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
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
