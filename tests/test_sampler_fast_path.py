"""The sampler's fast path (``/proc`` files kept open between ticks, single threads read without
listing, unchanged ``stat`` lines not parsed again) reports exactly what the plain path reports
(every file opened at every read), tick by tick, while processes start, exit, reuse PIDs, gain
and lose threads and read from storage: over a fake ``/proc`` with the fake NVML driver, and
over the real ``/proc`` with real processes on simulated GPUs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import wait
from datetime import timedelta
from pathlib import Path

import pytest
from fake_pynvml import FakeGpu, FakeProcess, install

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.wire import Report
from jupyter_gpu_gov.gpu import procs
from jupyter_gpu_gov.gpu.attribution import TargetRoot
from jupyter_gpu_gov.gpu.nvml import NvmlBackend
from jupyter_gpu_gov.gpu.simulated import SimulatedBackend
from jupyter_gpu_gov.server import sampler as sampler_module
from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

CLK = procs.CLOCK_TICKS
SERVER, HELPER = 100, 101
KERNEL_A, WORKER, DAEMON = 200, 201, 202
KERNEL_B = 300
SHELL, SHELL_CHILD = 400, 401
STRANGER = 900


class FakeProc:
    """A /proc tree on disk with threads, I/O counters and device files.

    As in the kernel, a descriptor opened on a process that is gone reads nothing: ``remove``
    empties the files before unlinking them (the kernel answers ESRCH), so a PID reused by
    ``add`` is only seen through its new files."""

    def __init__(self, root: Path, schedstat: str | None = None):
        self.root = root
        # Threads' schedstat files: None, none (an older kernel's stat alone); "real": each
        # thread's run time in ns, at a finer grain than stat's ticks; "zeros": "0 0 0", what
        # a kernel keeping no scheduler statistics writes.
        self.schedstat = schedstat
        (root / "self" / "ns").mkdir(parents=True)
        (root / "self" / "ns" / "pid").write_text("")  # not the host namespace's inode
        (root / "sys" / "kernel").mkdir(parents=True)
        (root / "sys" / "kernel" / "task_delayacct").write_text("1\n")
        self.procs: dict[int, dict] = {}
        self.allocated = 0  # PIDs allocated: the last field of loadavg moves with each
        self._write_loadavg()

    def _write_loadavg(self):
        (self.root / "loadavg").write_text(f"0.50 0.40 0.30 1/{len(self.procs)} {self.allocated}\n")

    def add(self, pid, ppid, sid, comm="python", devices=(), threads=1, cpu=0, read=0, iowait=0):
        self.procs[pid] = {
            "ppid": ppid,
            "sid": sid,
            "comm": comm,
            "devices": devices,
            "threads": threads,
            "tids": None,  # the threads' ids (None: pid, pid + 1, …)
            "thread_ns": None,  # each thread's schedstat time, where not its share of cpu
            "written_ns": {},  # each thread's schedstat time as last written
            "ended_ns": 0,  # the time of the threads that ended, as the kernel keeps it
            "cpu": cpu,
            "read": read,
            "iowait": iowait,
        }
        self.allocated += 1
        self._write_loadavg()
        d = self.root / str(pid)
        (d / "fd").mkdir(parents=True)
        for n, dev in enumerate(("/dev/nvidiactl", *devices)):
            os.symlink(dev, d / "fd" / str(10 + n))
        self.write(pid)

    def update(self, pid, **changes):
        self.procs[pid].update(changes)
        self.write(pid)

    def write(self, pid):
        p, d = self.procs[pid], self.root / str(pid)
        # The last thread takes the larger share: the busiest thread is not the main one.
        small = p["cpu"] // (2 * p["threads"])
        shares = [small] * (p["threads"] - 1) + [p["cpu"] - (p["threads"] - 1) * small]
        (d / "stat").write_text(self._stat(pid, p, p["cpu"], p["threads"]))
        if p["read"] is None:  # unreadable: a kept descriptor reads nothing (EACCES)
            if (d / "io").exists():
                self._empty(d / "io")
                (d / "io").unlink()
        else:
            (d / "io").write_text(f"rchar: 1\nsyscr: 2\nread_bytes: {p['read']}\nwrite_bytes: 0\n")
        task = d / "task"
        tids = p["tids"] or [pid + k for k in range(p["threads"])]
        assert len(tids) == p["threads"] and tids[0] == pid
        started = set(tids) - {pid} - {int(t.name) for t in task.glob("*")} if task.exists() else ()
        if started:  # a thread's id is a PID: allocated as a process's
            self.allocated += len(started)
            self._write_loadavg()
        for old in task.glob("*") if task.exists() else ():
            if int(old.name) not in tids:
                p["ended_ns"] += p["written_ns"].pop(int(old.name), 0)
                for path in old.iterdir():
                    self._empty(path)
                    path.unlink()
                old.rmdir()
        for tid, share in zip(tids, shares, strict=True):
            (task / str(tid)).mkdir(parents=True, exist_ok=True)
            (task / str(tid) / "stat").write_text(self._stat(tid, p, share, p["threads"]))
            if self.schedstat:
                # a tenth more than stat says, so a report shows which file it was read from
                ns = 0 if self.schedstat == "zeros" else share * (10**9 // CLK) * 11 // 10
                if p["thread_ns"] is not None:
                    ns = p["thread_ns"][tid]
                p["written_ns"][tid] = ns
                (task / str(tid) / "schedstat").write_text(f"{ns} 0 {min(ns, 1)}\n")

    def cpu_ns(self, pid) -> int:
        """The process's CPU clock: its threads' schedstat times summed, ended ones' too."""
        if pid not in self.procs:
            raise OSError(22, "no such process")
        p = self.procs[pid]
        return sum(p["written_ns"].values()) + p["ended_ns"]

    def remove(self, pid):
        d = self.root / str(pid)
        for path in sorted(d.rglob("*"), key=lambda p: -len(p.parts)):
            if path.is_symlink() or path.is_file():
                self._empty(path)
                path.unlink()
            else:
                path.rmdir()
        d.rmdir()
        del self.procs[pid]

    @staticmethod
    def _empty(path: Path) -> None:
        if not path.is_symlink():
            path.write_bytes(b"")

    @staticmethod
    def _stat(pid, p, cpu, threads) -> str:
        # proc(5): state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        # utime stime cutime cstime priority nice num_threads ... delayacct_blkio_ticks (42)
        fields = ["S", p["ppid"], p["sid"], p["sid"], 0, -1, 0, 0, 0, 0, 0]
        fields += [cpu - cpu // 3, cpu // 3, 0, 0, 20, 0, threads] + [0] * 21 + [p["iowait"]]
        return f"{pid} ({p['comm']}) " + " ".join(map(str, fields)) + "\n"


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A server with two kernels and a terminal in a fake /proc, GPUs from the fake driver, and
    a clock both samplers share."""
    return make_world(tmp_path, monkeypatch)


def make_world(tmp_path, monkeypatch, schedstat=None):
    fake = FakeProc(tmp_path / "proc", schedstat)
    fake.add(1, 0, 1, "init", threads=1)
    fake.add(SERVER, 1, SERVER, "jupyter-server", threads=4, cpu=500)
    fake.add(HELPER, SERVER, SERVER, threads=1)
    fake.add(KERNEL_A, SERVER, KERNEL_A, devices=["/dev/nvidia0"], threads=3, cpu=90, read=10)
    fake.add(WORKER, KERNEL_A, KERNEL_A, devices=["/dev/nvidia0"], cpu=30, read=4096)
    fake.add(DAEMON, 1, KERNEL_A, cpu=5)  # a DataLoader worker re-parented to init
    fake.add(KERNEL_B, SERVER, KERNEL_B, devices=["/dev/nvidia1"], cpu=7)
    fake.add(SHELL, SERVER, SHELL, "bash")
    fake.add(SHELL_CHILD, SHELL, SHELL, cpu=2)
    fake.add(STRANGER, 1, STRANGER, cpu=1000)
    gpus = [
        FakeGpu("GPU-0", minor_number=0, processes=[FakeProcess(WORKER, 20000, sm=0.6)]),
        FakeGpu("GPU-1", minor_number=1, processes=[FakeProcess(KERNEL_B, 3000, sm=0.0)]),
    ]
    driver = install(monkeypatch, *gpus)
    now = [clock.utcnow()]
    mono = [1000.0]
    monkeypatch.setattr(clock, "utcnow", lambda: now[0])
    monkeypatch.setattr(sampler_module, "monotonic", lambda: mono[0])

    def advance(seconds: float = 5.0) -> None:
        now[0] += timedelta(seconds=seconds)
        mono[0] += seconds
        driver.advance(seconds)

    return fake, gpus, advance


A, B = "0a0a0a0a-0000-4000-8000-00000000000a", "0b0b0b0b-0000-4000-8000-00000000000b"
ROOTS = [
    TargetRoot("kernel", A, KERNEL_A),
    TargetRoot("kernel", B, KERNEL_B),
    TargetRoot("terminal", "1", SHELL),
]


def side_by_side(proc_root: str, backend, pid_namespace: str, server_pid: int):
    """The plain sampler and the fast one, over the same world."""
    common = {"proc_root": proc_root, "pid_namespace": pid_namespace, "server_pid": server_pid}
    plain = Sampler(backend, open_files=0, **common)
    fast = Sampler(backend, open_files=64, **common)
    return plain, fast


def tick(plain: Sampler, fast: Sampler, targets, opened: list[int]):
    a = plain.measure(targets, {"user": "alice"})
    b = fast.measure(targets, {"user": "alice"})
    assert b.report == a.report
    assert (b.changes, b.gpu_last_active) == (a.changes, a.gpu_last_active)
    assert plain._files._fds == {}
    opened.append(len(fast._files._fds))
    # Kept descriptors are never inherited by the kernels and terminals the server starts.
    assert not any(os.get_inheritable(fd) for fd in fast._files._fds.values())
    # What the sampler sends is the report of core/wire.py (the governor validates the dict by it).
    assert Report.from_json(b.report).to_json() == Report.from_json(a.report).to_json()
    return b.report


@pytest.mark.parametrize("pid_namespace", ["host", "container"])
def test_the_fast_path_reports_what_the_plain_path_reports(world, pid_namespace):
    fake, gpus, advance = world
    plain, fast = side_by_side(str(fake.root), NvmlBackend, pid_namespace, SERVER)
    targets = [TargetInfo(root, name=root.id, execution_state="idle") for root in ROOTS]
    opened: list[int] = []

    def busy(pid, cpu=0, read=0, **changes):
        p = fake.procs[pid]
        fake.update(pid, cpu=p["cpu"] + cpu, read=(p["read"] or 0) + read, **changes)

    try:
        tick(plain, fast, targets, opened)
        for step in range(12):
            advance()
            busy(KERNEL_A, cpu=40 + step, read=1 << 20)
            busy(WORKER, cpu=250, read=step * 8192)
            busy(SERVER, cpu=3)
            if step == 1:  # a new child of kernel b, on its GPU; kernel b gains threads
                fake.add(301, KERNEL_B, KERNEL_B, devices=["/dev/nvidia1"], cpu=1, threads=2)
                gpus[1].processes.append(FakeProcess(301, 1000, sm=0.4))
                busy(KERNEL_B, cpu=11, threads=5)
            if step == 3:  # kernel b is back to one thread; the daemon reads from storage
                busy(KERNEL_B, cpu=2, threads=1)
                busy(DAEMON, cpu=9, read=5 << 20, iowait=4)
            if step == 4:  # the worker exits and a stranger takes its PID, in one tick
                fake.remove(WORKER)
                gpus[0].processes = [FakeProcess(KERNEL_A, 500, sm=0.0)]
                fake.add(WORKER, 1, WORKER, cpu=77, read=123)
            if step == 5:  # the terminal's child's I/O becomes unreadable
                fake.update(SHELL_CHILD, cpu=9, read=None)
            if step == 6:  # the stranger exits and a new child of the terminal takes its PID
                fake.remove(WORKER)
                fake.add(WORKER, SHELL, SHELL, cpu=3, read=0, threads=2)
            if step == 8:  # kernel b exits; its PID comes back as a helper of the server
                fake.remove(KERNEL_B)
                fake.remove(301)
                gpus[1].processes = []
                fake.add(KERNEL_B, SERVER, SERVER, cpu=900, read=1 << 30)
            if step == 10:  # a card of the server's own, held by no target
                gpus[1].processes = [FakeProcess(HELPER, 700, sm=0.9)]
            report = tick(plain, fast, targets, opened)
    finally:
        plain.close()
        fast.close()
    assert fast._files._fds == {}  # closed with the sampler

    by_id = {t["id"]: t for t in report["targets"]}
    # The ticks above said something: kernel a's CPU and reads, a GPU held by the server.
    assert by_id[A]["cpu"]["cores"] > 0 and by_id[A]["cpu"]["read_mb_s"] > 0
    assert by_id["server"]["gpu"]["holds_context"]
    # The fast path kept its files open between ticks, and closed those of processes that went.
    assert min(opened[1:]) > 0 and opened[-1] < max(opened)


def reads_of(files: procs.ProcFiles, monkeypatch) -> list[str]:
    """The paths of the files ``files`` reads from now on: through ``read``, and the threads'
    files it keeps open, read by descriptor (one ``pread`` each, not through ``read``)."""
    paths: list[str] = []
    read, pread = files.read, os.pread

    def counted_read(path, size=4096):
        paths.append(path)
        return read(path, size)

    def counted_pread(fd, *args):
        paths.extend(path for path, kept in files._fds.items() if kept == fd)
        return pread(fd, *args)

    monkeypatch.setattr(files, "read", counted_read)
    monkeypatch.setattr(os, "pread", counted_pread)
    return paths


def test_processes_that_did_not_run_are_not_read_again(world, monkeypatch):
    """Most of a server's processes, most of the time, are idle kernels: a process whose
    ``stat`` line is the last tick's did not run, so its I/O and threads are taken as they were
    (their files kept open, unread) and the report is still the plain path's."""
    fake, _, advance = world
    plain, fast = side_by_side(str(fake.root), NvmlBackend, "host", SERVER)
    targets = [TargetInfo(root, name=root.id, execution_state="idle") for root in ROOTS]
    opened: list[int] = []
    read_paths = reads_of(fast._files, monkeypatch)
    try:
        for _ in range(2):
            advance()
            tick(plain, fast, targets, opened)
        read_paths.clear()
        advance()  # nothing ran
        tick(plain, fast, targets, opened)
        idle_reads = [p for p in read_paths if not re.fullmatch(r".*/proc/\d+/stat", p)]
        read_paths.clear()
        advance()  # kernel a's worker runs and reads from storage
        fake.update(
            WORKER, cpu=fake.procs[WORKER]["cpu"] + 300, read=fake.procs[WORKER]["read"] + (8 << 20)
        )
        report = tick(plain, fast, targets, opened)
    finally:
        plain.close()
        fast.close()
    assert idle_reads == []  # only the scan's stat lines
    assert opened[-2] == opened[-3]  # the idle processes' files stayed open
    worker_files = {p.split(f"/{WORKER}/", 1)[1] for p in read_paths if f"/{WORKER}/" in p}
    assert worker_files == {"stat", "io", f"task/{WORKER}/stat"}
    a = next(t for t in report["targets"] if t["id"] == A)
    assert a["cpu"]["cores"] > 0 and a["cpu"]["read_mb_s"] > 0


@pytest.mark.parametrize(
    "schedstat, thread_file, busiest",
    [(None, "stat", 0.16), ("real", "schedstat", 0.176), ("zeros", "stat", 0.16)],
)
def test_threads_are_timed_from_schedstat_where_the_kernel_keeps_it(
    tmp_path, monkeypatch, schedstat, thread_file, busiest
):
    """A thread's CPU time comes from ``schedstat`` (a third of ``stat``'s cost to read, in ns)
    where the kernel writes it; from ``stat`` where the file is missing or all zeros (a kernel
    keeping no scheduler statistics), never a busy thread read as idle."""
    fake, _, advance = make_world(tmp_path, monkeypatch, schedstat)
    plain, fast = side_by_side(str(fake.root), NvmlBackend, "host", SERVER)
    targets = [TargetInfo(root, name=root.id, execution_state="busy") for root in ROOTS]
    read_paths = reads_of(fast._files, monkeypatch)
    try:
        tick(plain, fast, targets, [])
        for _ in range(4):
            advance()  # 5 s: kernel a's three threads take 120 ticks, 80 of them its last one's
            fake.update(KERNEL_A, cpu=fake.procs[KERNEL_A]["cpu"] + 120)
            report = tick(plain, fast, targets, [])
    finally:
        plain.close()
        fast.close()
    assert {path.rsplit("/", 1)[1] for path in read_paths if "/task/" in path} == {thread_file}
    a = next(t for t in report["targets"] if t["id"] == A)
    assert a["cpu"]["top_thread"] == pytest.approx(busiest * 100 / CLK, abs=0.001)


def test_a_thread_that_ends_as_another_starts_is_read_in_the_same_tick(world):
    """Threads as many as last listed are read without listing ``task/`` again; when one of
    them has ended, another may have started in its place: the threads are listed again at
    once, so the newcomer's time counts from this tick, as on the plain path."""
    fake, _, advance = world
    plain, fast = side_by_side(str(fake.root), NvmlBackend, "host", SERVER)
    targets = [TargetInfo(root, name=root.id, execution_state="busy") for root in ROOTS]
    listed: list[str] = []
    real_listdir = os.listdir

    def listdir(path):
        listed.append(str(path))
        return real_listdir(path)

    tops = []
    try:
        tick(plain, fast, targets, [])
        for step in range(5):
            advance()
            if step == 2:  # thread 2 ends; thread 9 starts, and takes the larger share
                fake.procs[KERNEL_A]["tids"] = [KERNEL_A, KERNEL_A + 1, KERNEL_A + 9]
            listed.clear()
            procs.os.listdir = listdir
            try:
                fake.update(KERNEL_A, cpu=fake.procs[KERNEL_A]["cpu"] + 120)
                report = tick(plain, fast, targets, [])
            finally:
                procs.os.listdir = real_listdir
            task_lists = [path for path in listed if path.endswith(f"/{KERNEL_A}/task")]
            # the plain path lists every tick; the fast one only on the change
            assert len(task_lists) == (2 if step == 2 else 1), (step, task_lists)
            tops.append(
                (next(t for t in report["targets"] if t["id"] == A)["cpu"] or {}).get("top_thread")
            )
    finally:
        plain.close()
        fast.close()
    assert tops[-1] > 0


def test_new_processes_are_seen_though_the_newest_pid_lies(tmp_path):
    """``/proc`` is not listed again while no PID was allocated since its last listing; a file
    that never moves (not the kernel's ``loadavg``) costs at most ``LIST_EVERY`` ticks, once:
    the listing that finds a process the file did not announce stops trusting it. A target's
    root that is not among ours is listed for at once."""
    fake = FakeProc(tmp_path / "proc")
    fake.add(SERVER, 1, SERVER, threads=4)
    loadavg = fake.root / "loadavg"
    files = procs.ProcFiles(str(fake.root), keep=16)
    scanner = procs.ProcScanner(str(fake.root), files, procs.newest_pid_file(str(fake.root)))
    assert scanner.newest_pid == str(loadavg)

    def tick(expect=()) -> set[int]:
        table = scanner.scan(expect)
        scanner.settle(table, set(table.procs))  # every process is the server's here
        return set(table.procs)

    tick()
    fake.add(KERNEL_A, SERVER, KERNEL_A)  # the kernel's file moves: seen at once
    assert KERNEL_A in tick()
    frozen = loadavg.read_text()
    fake.add(KERNEL_B, SERVER, KERNEL_B)
    loadavg.write_text(frozen)  # a file that does not move
    seen = [KERNEL_B in tick() for _ in range(procs.ProcScanner.LIST_EVERY + 1)]
    assert seen == [False] * procs.ProcScanner.LIST_EVERY + [True]
    assert scanner.newest_pid is None  # found out: listed at every scan from now on
    fake.add(SHELL, SERVER, SHELL)
    loadavg.write_text(frozen)
    assert SHELL in tick()

    scanner = procs.ProcScanner(str(fake.root), files, procs.newest_pid_file(str(fake.root)))
    tick()
    fake.add(SHELL_CHILD, SHELL, SHELL)
    loadavg.write_text(frozen)
    assert SHELL_CHILD in tick(expect=[SHELL_CHILD])  # a target's root is looked for at once
    files.close()


def test_the_servers_session_does_not_take_the_kept_files_from_its_kernels(world):
    """Start-up counts the server's whole session as its own (the shell that started it and
    that shell's other jobs may yet join a kernel); once the first tick finds them outside
    every target, their files must not hold the places the kernels' files need (a CI run with
    many jobs in the test's session once kept no file open on the second tick)."""
    fake, _, advance = world
    for pid in range(500, 580):  # more jobs in the server's session than files may be kept
        fake.add(pid, 1, SERVER, "bash")
    plain, fast = side_by_side(str(fake.root), NvmlBackend, "host", SERVER)
    fast._files.keep = 32
    targets = [TargetInfo(root, name=root.id, execution_state="idle") for root in ROOTS]
    opened: list[int] = []
    try:
        for _ in range(4):
            advance()
            tick(plain, fast, targets, opened)
        kept = {int(path.split("/")[-2]) for path in fast._files._fds if path.endswith("/stat")}
    finally:
        plain.close()
        fast.close()
    assert min(opened) > 0
    assert kept and kept.isdisjoint(range(500, 580))


def simulated_clocks(tmp_path, monkeypatch):
    """Simulated GPUs whose state file the test's processes inherit, and the wall and
    monotonic clocks the samplers read, moved by hand: (state, backend, now, mono)."""
    state = str(tmp_path / "sim-gpus.json")
    monkeypatch.setenv("JUPYTER_GPU_GOV_SIM_STATE", state)
    backend = SimulatedBackend(state_path=state)
    now, mono = [clock.utcnow()], [1000.0]
    monkeypatch.setattr(clock, "utcnow", lambda: now[0])
    monkeypatch.setattr(sampler_module, "monotonic", lambda: mono[0])
    return state, backend, now, mono


def test_kept_files_follow_real_processes_that_exit(tmp_path, monkeypatch):
    """The real /proc: kernels with threads and children on simulated GPUs; children exit
    between ticks. Every process sleeps, so both samplers read the same counters."""
    state, backend, now, mono = simulated_clocks(tmp_path, monkeypatch)
    kernel = (
        "import subprocess, sys, threading, time\n"
        "from jupyter_gpu_gov import simulate\n"
        "simulate.hold(2048, device=0)\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        "children = [subprocess.Popen(['sleep', '600']) for _ in range(2)]\n"
        "time.sleep(600)\n"
    )
    # The "server": a sleeping process whose children are the kernels (the test process's
    # own CPU would move between the two samplers' reads).
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            # The kernels' own output not into the server's: under load a kernel printed its
            # children before the server printed the kernels, and was read as the kernels.
            f"ks = [subprocess.Popen([sys.executable, '-c', {kernel!r}], start_new_session=True,"
            " stdout=subprocess.DEVNULL) for _ in range(3)]\n"
            "print(' '.join(str(k.pid) for k in ks), flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    kernels = [int(pid) for pid in server.stdout.readline().split()]
    plain, fast = side_by_side("/proc", lambda: backend, "host", server.pid)
    targets = [
        TargetInfo(
            TargetRoot("kernel", f"0000000{i}-0000-4000-8000-000000000000", pid), name=f"k{i}"
        )
        for i, pid in enumerate(kernels)
    ]
    opened: list[int] = []
    try:
        # Until every kernel holds its GPU memory and has started its children: a deadline in
        # wall-clock time, not a count of scans, since a scan of a loaded machine's /proc is slow.
        deadline = time.monotonic() + 120
        while True:
            table = procs.scan()
            started = {pid for pid in kernels if len(table.descendants(pid)) == 3}
            held = {p["pid"] for p in simulated_processes(state)} & set(kernels)
            if started == held == set(kernels):
                break
            if time.monotonic() > deadline:
                gone = [pid for pid in kernels if pid not in table.procs]
                pytest.fail(
                    f"the kernels did not start in 120 s: {sorted(started)} of {kernels} have "
                    f"their children, {sorted(held)} hold GPU memory, {gone} are gone"
                )
            time.sleep(0.05)
        table = procs.scan()
        for _ in range(6):
            mono[0] += 5
            now[0] += timedelta(seconds=5)
            report = tick(plain, fast, targets, opened)
            children = sorted(table.descendants(kernels[0]) - {kernels[0]})
            if children:  # one of the first kernel's children exits between ticks
                os.kill(children[0], 9)
                table = wait_gone(children[0])
    finally:
        plain.close()
        fast.close()
        for pid in kernels:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, 9)
        server.kill()
        server.wait()
    assert all(t["gpu"]["holds_context"] for t in report["targets"])
    assert min(opened) > 0


def simulated_processes(state: str) -> list[dict]:
    try:
        return json.loads(Path(state).read_text())["processes"]
    except (OSError, ValueError):
        return []


def wait_gone(pid: int) -> procs.ProcessTable:
    """The scan once ``pid`` is reaped or a zombie (its parent, a kernel, sleeps)."""
    for _ in range(200):
        table = procs.scan()
        raw = procs._read(f"/proc/{pid}/stat")
        if pid not in table or (raw and raw.rpartition(b")")[2].split()[0] == b"Z"):
            return table
        time.sleep(0.05)
    pytest.fail(f"process {pid} did not exit")


@pytest.mark.parametrize("outside", [False, True])
def test_the_first_tick_reads_only_what_start_up_did_not(world, monkeypatch, outside):
    """Start-up reads every process once, so the first tick reads only the server's own (issue
    26: first tick < 10 ms) and reports what a first tick reading everything reports; a
    kernel outside the server's tree (here the stranger, with a daemon in its session) is
    still found: that tick reads everything again."""
    fake, _, _ = world
    roots = [*ROOTS]
    if outside:
        fake.add(903, 1, STRANGER, cpu=4)  # the stranger's daemonised child
        roots.append(TargetRoot("kernel", "0c0c0c0c-0000-4000-8000-00000000000c", STRANGER))
    targets = [TargetInfo(root, name=root.id, execution_state="idle") for root in roots]
    common = {"proc_root": str(fake.root), "pid_namespace": "host", "server_pid": SERVER}
    started = Sampler(NvmlBackend, **common)
    everything = Sampler(NvmlBackend, **common)
    read: list[str] = []
    real_read = procs._read
    monkeypatch.setattr(procs, "_read", lambda path, *a: read.append(path) or real_read(path, *a))
    try:
        wait([started._started, everything._started])
        everything._scanner.forget_foreign()  # as before: the first tick reads every process
        read.clear()
        first = started.measure(targets, {"user": "alice"})
        strangers_read = any(f"/{STRANGER}/stat" in path for path in read)
        assert first.report == everything.measure(targets, {"user": "alice"}).report
    finally:
        started.close()
        everything.close()
    assert strangers_read == outside
    by_id = {t["id"]: t for t in first.report["targets"]}
    assert by_id[A]["gpu"]["holds_context"]  # kernel a's worker holds GPU-0


def test_start_up_opens_the_files_of_kernels_and_terminals_for_the_first_tick(world, monkeypatch):
    """Start-up opens, and keeps, the files a tick reads of the server's kernels and terminals
    (the processes in sessions of their own: their ``stat``, ``io`` and each thread's), so the
    first tick opens none of them (issue 26: 20 running kernels of 40 threads took 12-15 ms a
    first tick, most of it opening their threads' files) and reports what the plain path does.
    The server's own session is left to the tick that reads it."""
    fake, _, advance = world
    fake.update(KERNEL_B, threads=5)
    plain, fast = side_by_side(str(fake.root), NvmlBackend, "host", SERVER)
    targets = [TargetInfo(root, name=root.id, execution_state="idle") for root in ROOTS]
    theirs = [KERNEL_A, WORKER, DAEMON, KERNEL_B, SHELL, SHELL_CHILD]
    opened: list[str] = []
    real_open = os.open
    try:
        wait([plain._started, fast._started])
        kept = {path.split("/proc/", 1)[1] for path in fast._files._fds}
        monkeypatch.setattr(
            os, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k)
        )
        first = plain.measure(targets, {"user": "alice"})
        opened.clear()  # the plain path opens every file at every tick
        assert fast.measure(targets, {"user": "alice"}).report == first.report
        fast_opened = list(opened)
        for _ in range(2):
            advance()
            fake.update(KERNEL_B, cpu=fake.procs[KERNEL_B]["cpu"] + 40)
            tick(plain, fast, targets, [])
    finally:
        plain.close()
        fast.close()
    threads_b = {f"{KERNEL_B}/task/{KERNEL_B + k}/stat" for k in range(5)}
    assert {f"{KERNEL_A}/stat", f"{KERNEL_A}/io", f"{SHELL}/io"} | threads_b <= kept
    assert not any(path.startswith((f"{SERVER}/", f"{HELPER}/")) for path in kept)
    assert not [path for path in fast_opened for pid in theirs if f"/proc/{pid}/" in path]


WORKERS = """
import sys, threading, time
go = [threading.Event() for _ in range(6)]
done = threading.Event()
def work(event):
    while True:
        event.wait()
        event.clear()
        until = time.thread_time() + 0.03  # clock ticks: the process's stat line moves
        while time.thread_time() < until:
            pass
        done.set()
for event in go:
    threading.Thread(target=work, args=(event,), daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    go[int(line)].set()
    done.wait()
    done.clear()
    print("ok", flush=True)
"""


def test_threads_that_did_not_run_are_known_by_the_process_cpu_clock(tmp_path, monkeypatch):
    """The real /proc: a kernel of seven threads (six workers, each run on request, and the
    main one that takes the requests). A tick reads again only the threads that ran at the last
    one where the process's CPU clock moved by exactly what they did (so no other thread ran),
    and every thread where it did not; the report is the plain path's, tick by tick. Every
    thread is blocked while the two samplers read, so both read the same counters."""
    _, backend, now, mono = simulated_clocks(tmp_path, monkeypatch)
    # No thread starts in the kernel once it is ready: the machine's other processes may
    # start some, which would only have the fast path read every thread, as the plain one.
    monkeypatch.setattr(procs.ProcScanner, "_newest", lambda self: b"1")
    server = subprocess.Popen(  # a sleeping server whose child the kernel is
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"k = subprocess.Popen([sys.executable, '-c', {WORKERS!r}], start_new_session=True)\n"
            "print(k.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    # The server's line (its kernel's PID) and the kernel's "ready" come down one pipe: under
    # load the kernel's came first, and was read as the PID.
    lines = [server.stdout.readline(), server.stdout.readline()]
    kernel = int(next(line for line in lines if line.strip().isdigit()))
    assert "ready\n" in lines
    quiet(kernel)
    plain, fast = side_by_side("/proc", lambda: backend, "host", server.pid)
    assert fast._files.cpu_clock is procs.process_cpu_ns and plain._files.cpu_clock is None
    targets = [TargetInfo(TargetRoot("kernel", A, kernel), name="k")]
    read_paths = reads_of(fast._files, monkeypatch)
    threads_read, tops = [], []
    try:
        tick(plain, fast, targets, [])
        for worker in (0, 0, 0, 1, 1, 0, 5):
            server.stdin.write(f"{worker}\n")
            server.stdin.flush()
            assert server.stdout.readline() == "ok\n"
            quiet(kernel)
            mono[0] += 5
            now[0] += timedelta(seconds=5)
            read_paths.clear()
            report = tick(plain, fast, targets, [])
            threads_read.append(sum(f"/proc/{kernel}/task/" in path for path in read_paths))
            tops.append(report["targets"][0]["cpu"]["top_thread"])
    finally:
        plain.close()
        fast.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(kernel, 9)
        server.kill()
        server.wait()
    # A worker that runs again after running at the last tick: it and the main thread only;
    # one that did not run at the last tick: those two, then every other (the clock moved by
    # more than they did).
    assert threads_read == [7, 2, 2, 7, 2, 7, 7]
    assert all(top and top > 0 for top in tops)


def quiet(pid: int) -> None:
    """Once no thread of ``pid`` runs (a worker that is done still returns to its wait)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        before = procs.process_cpu_ns(pid)
        time.sleep(0.02)
        if procs.process_cpu_ns(pid) == before:
            return
    pytest.fail(f"process {pid} did not go quiet")


def test_a_thread_started_in_an_ended_ones_place_is_listed_though_the_clock_holds(
    tmp_path, monkeypatch
):
    """The process's CPU clock cannot show a thread that has not run yet: where a thread that
    never ran takes an idle one's place (as many threads, the clock moved by exactly what the
    threads that ran did), the PID allocated for it has every thread read and ``task/``
    listed, so its first run counts from the tick it started, as on the plain path."""
    fake, _, advance = make_world(tmp_path, monkeypatch, "real")
    a = [KERNEL_A, 210, 211, 212]
    fake.procs[KERNEL_A]["tids"] = a
    fake.update(KERNEL_A, threads=4, thread_ns={a[0]: 5 * 10**8, a[1]: 0, a[2]: 0, a[3]: 0})
    plain, fast = side_by_side(str(fake.root), NvmlBackend, "host", SERVER)
    fast._files.cpu_clock = fake.cpu_ns
    targets = [TargetInfo(root, name=root.id, execution_state="busy") for root in ROOTS]
    read_paths = reads_of(fast._files, monkeypatch)

    def run(**ns):  # threads of kernel a run for these ns
        p = fake.procs[KERNEL_A]
        for tid, more in ns.items():
            p["thread_ns"][int(tid[1:])] = p["thread_ns"].get(int(tid[1:]), 0) + more
        fake.update(KERNEL_A, cpu=p["cpu"] + 1)  # and its stat line moves

    steps = [
        {"t211": 2 * 10**8},  # every thread read (the first tick saw none run)
        {"t211": 2 * 10**8},  # 211 again: it alone read
        {"t211": 10**8, "t212": 10**8},  # 212 too: the clock moved by more, all read
        "swap",  # 210 (never ran) ends, 213 starts and has not run yet; 211 and 212 run
        {"t213": 4 * 10**8},  # 213's first run: the busiest thread of this tick
    ]
    reads, tops = [], []
    try:
        tick(plain, fast, targets, [])
        for step in steps:
            advance()
            if step == "swap":
                p = fake.procs[KERNEL_A]
                p["tids"] = [KERNEL_A, 211, 212, 213]
                del p["thread_ns"][210]
                p["thread_ns"][213] = 0
                step = {"t211": 10**8, "t212": 10**8}
            read_paths.clear()
            run(**step)
            report = tick(plain, fast, targets, [])
            reads.append(sum(f"/{KERNEL_A}/task/" in path for path in read_paths))
            tops.append(next(t for t in report["targets"] if t["id"] == A)["cpu"]["top_thread"])
    finally:
        plain.close()
        fast.close()
    assert reads[1] == 1 and reads[2] == 4  # only 211; then 211, and the three others
    assert reads[3] >= 4  # the PID allocated for 213: every thread read, not the clock's
    assert tops[-1] > tops[-2]  # 213's 0.4 s counted (as the plain path counts it)
