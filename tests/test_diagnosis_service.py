"""Root-cause diagnosis in the service: the server extension's CPU, I/O-wait and read counters
on real processes, the report field that carries them, and the governor turning reports into a
verdict's ``root_cause`` (rules until a model is trained in a worker, then the model's)."""

from __future__ import annotations

import asyncio
import copy
import gc
import html
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from fake_hub_api import FakeHub
from test_report import REPORT, report

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.models import GpuSnapshot
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.queue import BORROWING, CAPACITY, USER_CAP, QueuedRequest, Waiting
from jupyter_gpu_gov.core.report import ReportError, target_cpu, validate
from jupyter_gpu_gov.diagnose import faults
from jupyter_gpu_gov.diagnose.features import Window
from jupyter_gpu_gov.diagnose.labels import HINTS, Diagnosis
from jupyter_gpu_gov.gpu import procs
from jupyter_gpu_gov.gpu.attribution import TargetRoot
from jupyter_gpu_gov.hub.diagnosis import DiagnosisOptions, DiagnosisService
from jupyter_gpu_gov.hub.diagnosis_windows import History, unpack
from jupyter_gpu_gov.hub.hubapi import HubApi, HubApiError
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.hub.views import row_view
from jupyter_gpu_gov.server import sampler as sampler_module
from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

pytestmark = pytest.mark.timeout(180)

# -- the server extension: CPU, I/O wait and reads of a target's process tree -------------------


class NoGpus:
    """A backend on a machine without GPUs: the CPU side of a report is all that is measured."""

    name = "none"

    def sample(self):
        return GpuSnapshot("none", clock.utcnow())

    def close(self):
        pass


def cpu_of(report: dict, ident: str) -> dict | None:
    return next(t for t in report["targets"] if t["id"] == ident)["cpu"]


# Kernel ids are UUIDs (a report names no other: core.report).
BUSY_KERNEL, IDLE_KERNEL = (f"00000000-0000-4000-8000-00000000000{i}" for i in (1, 2))


def cpu_seconds(pid: int, ticks: int) -> float:
    """User + system CPU seconds of a process, read straight from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def measure_over(sampler: Sampler, targets: list[TargetInfo], seconds: float) -> dict:
    first = sampler.measure(targets, {"user": "alice"}).report
    assert all(t["cpu"] is None for t in first["targets"])  # nothing to compare with yet
    time.sleep(seconds)
    return sampler.measure(targets, {"user": "alice"}).report


@pytest.fixture
def children():
    started: list[subprocess.Popen] = []

    def start(code: str, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, start_new_session=True
        )
        started.append(proc)
        assert proc.stdout.readline().strip() == b"ready"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def measure_programs(children, programs: dict[str, str]) -> dict:
    """Start each program (it prints 'ready'), measure them as kernels over 1.5 s, stop them
    (a forked child with them: each has a session of its own); the report."""
    started = {name: children(code) for name, code in programs.items()}
    targets = [
        TargetInfo(TargetRoot("kernel", name, proc.pid), "python3")
        for name, proc in started.items()
    ]
    sampler = Sampler(NoGpus)
    try:
        report = measure_over(sampler, targets, 1.5)
    finally:
        sampler.close()
        for proc in started.values():
            os.killpg(proc.pid, signal.SIGKILL)
    return report


def test_a_busy_loop_reads_one_core_and_a_sleeper_none(children):
    busy = children("print('ready', flush=True)\nwhile True: pass\n")
    idle = children("import time; print('ready', flush=True); time.sleep(600)")
    targets = [
        TargetInfo(TargetRoot("kernel", BUSY_KERNEL, busy.pid), "python3"),
        TargetInfo(TargetRoot("kernel", IDLE_KERNEL, idle.pid), "python3"),
    ]
    sampler = Sampler(NoGpus)
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        before, started = cpu_seconds(busy.pid, ticks), time.monotonic()
        report = measure_over(sampler, targets, 1.5)
        took = time.monotonic() - started
        got = (cpu_seconds(busy.pid, ticks) - before) / took
    finally:
        sampler.close()
    busy_cpu, idle_cpu = cpu_of(report, BUSY_KERNEL), cpu_of(report, IDLE_KERNEL)
    # What the loop got of a core: all of one on a quiet machine, less on a loaded one. The
    # sampler reads what the kernel accounted, whatever the load.
    assert busy_cpu["cores"] == pytest.approx(got, abs=0.15), (busy_cpu, got)
    assert busy_cpu["cores"] <= 1.15, busy_cpu
    assert idle_cpu["cores"] <= 0.05 and idle_cpu["read_mb_s"] == 0.0, idle_cpu
    # The sampler's window: the 1.5 s between its reads, however long a loaded machine made it.
    assert 1.4 <= busy_cpu["seconds"] <= took + 0.05, (busy_cpu, took)
    validate(report)  # the report with its cpu sections is a valid report


def test_one_saturated_thread_is_told_from_work_shared_by_processes(children):
    """``top_thread``: a serial loop saturates one thread; the same cores spread over two
    processes each working half the time leave every thread half busy. (Relative figures: a
    loaded CI machine gives a busy loop less than a core.)"""
    half = (
        "import os, time\n"
        "if os.fork(): print('ready', flush=True)\n"  # two processes, each busy 5 ms in 10
        "while True:\n"
        "    end = time.perf_counter() + 0.005\n"
        "    while time.perf_counter() < end: pass\n"
        "    time.sleep(0.005)\n"
    )
    report = measure_programs(
        children, {"serial": "print('ready', flush=True)\nwhile True: pass\n", "shared": half}
    )
    one, two = cpu_of(report, "serial"), cpu_of(report, "shared")
    assert one["cores"] > 0.1 and one["top_thread"] >= 0.9 * one["cores"], one  # all one thread
    assert two["top_thread"] <= 0.7 and two["cores"] >= 1.4 * two["top_thread"], two


READER = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("ready", flush=True)
while True:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drop it from the page cache
    os.lseek(fd, 0, os.SEEK_SET)
    while os.read(fd, 1 << 20):
        pass
"""


def storage_reads_are_counted(path: Path) -> bool:
    """Whether reading ``path`` after dropping it from the page cache shows in ``read_bytes``
    (not on tmpfs, nor where ``/proc/<pid>/io`` is unreadable)."""
    before = procs.read_bytes(os.getpid())
    if before is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)
    return procs.read_bytes(os.getpid()) > before


def test_a_reader_of_a_big_file_shows_its_read_throughput(children, tmp_path):
    data = tmp_path / "shard-000.bin"
    with open(data, "wb") as file:
        for _ in range(32):
            file.write(os.urandom(1 << 20))
        file.flush()
        os.fsync(file.fileno())  # clean pages, so the reader can drop them from the cache
    if not storage_reads_are_counted(data):
        pytest.skip(f"{tmp_path} does not count storage reads (tmpfs, or /proc/<pid>/io hidden)")
    reader = children(READER, str(data))
    sampler = Sampler(NoGpus)
    try:
        report = measure_over(
            sampler, [TargetInfo(TargetRoot("kernel", "loader", reader.pid), "python3")], 1.5
        )
    finally:
        sampler.close()
    cpu = cpu_of(report, "loader")
    assert cpu["read_mb_s"] > 1.0, cpu  # 32 MB re-read from storage, again and again


def test_iowait_is_unknown_without_delay_accounting_not_zero(children, monkeypatch):
    idle = children("import time; print('ready', flush=True); time.sleep(600)")
    targets = [TargetInfo(TargetRoot("kernel", "k", idle.pid), "python3")]
    for accounting, expected in ((False, None), (True, 0.0)):
        monkeypatch.setattr(procs, "delay_accounting", lambda proc_root, on=accounting: on)
        sampler = Sampler(NoGpus)
        try:
            assert cpu_of(measure_over(sampler, targets, 0.3), "k")["iowait"] == expected
        finally:
            sampler.close()


def test_the_real_sysctl_decides_whether_iowait_is_known(tmp_path):
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    assert procs.delay_accounting(str(tmp_path)) is True  # older kernels: on unless booted off
    (tmp_path / "sys" / "kernel" / "task_delayacct").write_text("0\n")
    assert procs.delay_accounting(str(tmp_path)) is False
    (tmp_path / "sys" / "kernel" / "task_delayacct").write_text("1\n")
    assert procs.delay_accounting(str(tmp_path)) is True


class FakeProcTree:
    """One kernel process in a fake /proc whose counters the test sets."""

    PID = 4242

    def __init__(self, root: Path):
        self.root = root
        (root / "self" / "ns").mkdir(parents=True)
        (root / "self" / "ns" / "pid").write_text("")
        (root / "sys" / "kernel").mkdir(parents=True)
        (root / "sys" / "kernel" / "task_delayacct").write_text("1\n")
        (root / str(self.PID)).mkdir()
        self.set(cpu_ticks=0, iowait_ticks=0, read_bytes=0)

    def set(self, cpu_ticks: int, iowait_ticks: int, read_bytes: int, threads: int = 2) -> None:
        """The process's counters; its CPU split evenly between ``threads`` threads."""
        (self.root / str(self.PID) / "stat").write_text(
            self._stat(self.PID, cpu_ticks, iowait_ticks)
        )
        (self.root / str(self.PID) / "io").write_text(f"rchar: 0\nread_bytes: {read_bytes}\n")
        for i in range(threads):
            tid = self.PID + i
            (self.root / str(self.PID) / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
            stat = self._stat(tid, cpu_ticks // threads, iowait_ticks)
            (self.root / str(self.PID) / "task" / str(tid) / "stat").write_text(stat)

    def _stat(self, pid: int, cpu_ticks: int, iowait_ticks: int) -> str:
        # proc(5): state ppid pgrp session ... utime(14) stime(15) ... delayacct_blkio_ticks(42)
        fields = ["S", 1, self.PID, self.PID] + [0] * 7 + [cpu_ticks, 0] + [0] * 26 + [iowait_ticks]
        return f"{pid} (python) " + " ".join(map(str, fields)) + "\n"


def test_the_figures_cover_the_rolling_window(tmp_path, monkeypatch):
    tree = FakeProcTree(tmp_path / "proc")
    now = [1000.0]
    monkeypatch.setattr(sampler_module, "monotonic", lambda: now[0])
    sampler = Sampler(NoGpus, proc_root=str(tree.root), window_seconds=60, server_pid=1)
    target = [TargetInfo(TargetRoot("kernel", "k", tree.PID), "python3")]
    hz = procs.CLOCK_TICKS

    def tick(seconds: float, cores: float, iowait: float, mb_s: float) -> dict:
        info = procs.parse_stat((tree.root / str(tree.PID) / "stat").read_bytes())
        read = procs.read_bytes(tree.PID, str(tree.root))
        now[0] += seconds
        tree.set(
            info.cpu_ticks + round(cores * hz * seconds),
            info.iowait_ticks + round(iowait * hz * seconds),
            read + round(mb_s * 1e6 * seconds),
        )
        return cpu_of(sampler.measure(target, {"user": "alice"}).report, "k")

    try:
        assert cpu_of(sampler.measure(target, {"user": "alice"}).report, "k") is None
        first = tick(30, cores=1.5, iowait=0.4, mb_s=80)
        # Two threads share the 1.5 cores: the busiest reads 0.75 of one.
        assert first == {
            "cores": 1.5, "iowait": 0.4, "read_mb_s": 80.0, "seconds": 30.0, "top_thread": 0.75
        }  # fmt: skip
        # Half a window of nothing: the average over the last minute halves.
        assert tick(30, 0, 0, 0) == {
            "cores": 0.75, "iowait": 0.2, "read_mb_s": 40.0, "seconds": 60, "top_thread": 0.375
        }  # fmt: skip
        # A minute later the busy half has left the window.
        tick(30, 0, 0, 0)
        assert tick(30, 0, 0, 0) == {
            "cores": 0.0, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60, "top_thread": 0.0
        }  # fmt: skip
    finally:
        sampler.close()


# -- the report field -----------------------------------------------------------------------------


def with_cpu(cpu) -> dict:
    r = copy.deepcopy(REPORT)
    r["targets"][0]["cpu"] = cpu
    return r


def test_the_cpu_section_is_optional_and_validates():
    assert validate(report()) == REPORT  # without it
    for cpu in (
        None,
        {"cores": 1.02, "iowait": 0.31, "read_mb_s": 120.5, "seconds": 60},
        {"cores": 0.0, "iowait": None, "read_mb_s": None, "seconds": 5.0},
    ):
        assert validate(with_cpu(cpu))["targets"][0]["cpu"] == cpu
    # An older server's shape is taken, and ignored by the diagnosis.
    legacy = with_cpu({"percent": 250.0, "iowait": 12.5})
    assert target_cpu(validate(legacy)["targets"][0]) is None


@pytest.mark.parametrize(
    ("cpu", "field"),
    [
        ("busy", "targets[0].cpu"),
        ({"cores": -1}, "targets[0].cpu.cores"),
        ({"cores": "one"}, "targets[0].cpu.cores"),
        ({"cores": 1, "iowait": 1.5}, "targets[0].cpu.iowait"),
        ({"cores": 1, "iowait": True}, "targets[0].cpu.iowait"),
        ({"cores": 1, "read_mb_s": -3}, "targets[0].cpu.read_mb_s"),
        ({"cores": float("nan")}, "targets[0].cpu.cores"),
        ({"cores": 1, "read_mb_s": float("inf")}, "targets[0].cpu.read_mb_s"),
        ({"cores": 1, "seconds": -60}, "targets[0].cpu.seconds"),
    ],
)
def test_a_bad_cpu_section_names_its_field(cpu, field):
    with pytest.raises(ReportError) as info:
        validate(with_cpu(cpu))
    assert info.value.field == field


# -- the governor -----------------------------------------------------------------------------------


def governor(hub: FakeHub, tmp_path: Path, **diagnosis) -> Governor:
    policies = load_policies([], {"warn_after": "1h", "cull_after": "2h"})
    return Governor(
        Store(f"sqlite:///{tmp_path / 'gov.sqlite'}"),
        HubApi(hub.api_url, hub.token),
        policies,
        Options(diagnosis=DiagnosisOptions(**diagnosis)),
    )


def zombie_report(user: str = "alice", away: timedelta = timedelta(hours=1)) -> dict:
    """An idle kernel holding 20 GiB of an 80 GB card, nobody around for ``away``."""
    r = copy.deepcopy(REPORT)
    now = clock.utcnow()
    r["sampled_at"] = clock.isoformat(now)
    r["server"].update(user=user, last_activity=clock.isoformat(now - away))
    r["targets"][0]["cpu"] = {"cores": 0.0, "iowait": None, "read_mb_s": 0.0, "seconds": 60}
    r["window"]["gpu_idle_since"] = clock.isoformat(now - timedelta(minutes=50))
    return r


def starved_report(user: str) -> dict:
    """A training loop stuck on one CPU core: the kernel busy, the GPU mostly waiting."""
    r = zombie_report(user, away=timedelta(seconds=20))
    target = r["targets"][0]
    target.update(execution_state="busy", busy_since=r["sampled_at"])
    target["gpu"]["sm"] = 0.12
    target["cpu"] = {"cores": 1.0, "iowait": 0.01, "read_mb_s": 0.0, "seconds": 60}
    r["devices"][0]["activity"] = 0.12
    r["window"].update(gpu_active_fraction=1.0, gpu_idle_since=None)
    return r


async def test_an_idle_kernel_holding_memory_is_a_zombie_in_its_verdict(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice")
        hub.add_server("bob")
        gov = governor(hub, tmp_path)
        answered = gov.ingest(zombie_report("alice"))  # before any pass: still diagnosed
        await gov.reconcile()
        fresh = gov.ingest(starved_report("bob"))
        await gov.reconcile()
        verdict = gov.verdict("alice/")
        listed = {
            s.key: row_view(s, gov.reports[s.key], gov.root_cause(s.key))
            for s in gov.known_servers()
        }
        summary = gov.diagnosis_summary()

    for v in (answered, verdict):
        cause = v["root_cause"]
        assert cause["label"] == cause["cause"] == "zombie"
        assert cause["hint"] == HINTS["zombie"] and cause["source"] == "rules"
        assert cause["confident"] is True and cause["confidence"] >= 0.9
        assert cause["candidates"] == ["zombie", "healthy"] and cause["contributions"] == {}
    # A confident zombie is warned at once, as for an owner who is away; its notice still stands.
    assert verdict["state"] == "warned" and verdict["cull_at"] is not None
    assert listed["alice/"]["root_cause"]["label"] == "zombie"
    starved = fresh["root_cause"]
    assert starved["cause"] == "cpu_serial" and starved["source"] == "model", starved
    assert "CPU-bound" in starved["hint"]
    assert summary["labels"] == {starved["label"]: 1, "zombie": 1}
    assert summary["source"] == "model" and summary["model"]["trained_at"] is None
    assert [s["server"] for s in summary["servers"]] == ["alice/", "bob/"]
    # Neither DCGM nor the allocator knows their cards (their reports are not believed for
    # it): how much of the cards is allocated is unknown, not none.
    assert summary["fragmentation"]["devices_partly_used"] is None
    assert "no card to count" in summary["fragmentation"]["unknown"]
    assert summary["fragmentation"]["spawns_waiting"] == 0
    assert summary["fragmentation"]["flag"] is False


def on_slice(report: dict, card: str, profile: str = "3g.40gb") -> dict:
    """The report's device made a MIG slice of ``card``."""
    device = report["devices"][0]
    device.update(uuid=f"MIG-{card}-{profile}", parent_uuid=card, mig_profile=profile)
    report["targets"][0]["gpu"]["devices"] = [device["uuid"]]
    return report


def pinned_slice(card: str, profile: str = "3g.40gb") -> dict:
    """The workstation allocator's record (spawner state) of a MIG slice it pinned."""
    slice_ = {"uuid": f"MIG-{card}-{profile}", "parent_uuid": card, "mig_profile": profile}
    return {"gpu_gov_gpus": [slice_]}


async def test_gpu_spawns_waiting_while_cards_are_partly_allocated_flag_fragmentation(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice", state=pinned_slice("GPU-a"))
        hub.add_server("bob", state=pinned_slice("GPU-b"))
        asked = clock.utcnow() - timedelta(minutes=5)
        gpu = {"gpu_gov_grant": {"gpu-gov/tier": "h100"}}  # admitted to a GPU tier
        hub.add_server("carol", started=asked, ready=False, state=gpu)  # queued
        hub.add_server("dave", ready=False, state=gpu)  # asked just now: starting
        hub.add_server("erin", started=asked, ready=False)  # no GPU asked: not waiting for one
        # The allocator gave mallory one card; her report names five whole cards it made up
        # (not believed: they are not hers), which counted as five cards allocated in full.
        hub.add_server("mallory", state={"gpu_gov_devices": ["GPU-m"]})
        gov = governor(hub, tmp_path)
        gov.ingest(on_slice(zombie_report("alice"), "GPU-a"))  # 3/7 of one card
        gov.ingest(on_slice(starved_report("bob"), "GPU-b"))  # 3/7 of another
        forged = zombie_report("mallory")
        made_up = [f"GPU-made-up-{i}" for i in range(5)]
        forged["devices"] = [{**forged["devices"][0], "uuid": uuid} for uuid in made_up]
        forged["targets"][0]["gpu"]["devices"] = made_up
        gov.ingest(forged)
        await gov.reconcile()
        gov.ingest(forged)
        summary = gov.diagnosis_summary()

    found = summary["fragmentation"]
    assert found["devices"] == 3  # alice's and bob's slices, mallory's card; none of her words
    assert (found["spawns_waiting"], found["devices_partly_used"]) == (1, 2)
    assert found["demand"] == {"pending": 1, "queued": None, "refused": None}
    assert found["flag"] is True and found["label"] == "fragmentation"
    assert found["free_scattered"] == pytest.approx(8 / 7, abs=0.01)  # cards' worth, scattered
    assert "consolidate" in found["hint"], found


async def test_a_report_alone_does_not_move_the_fragmentation_figure(tmp_path):
    """Alice holds a slice the allocator pinned, spawns wait for a GPU: one partly used card,
    no fragmentation. Eve's server has no allocator record and DCGM sees none of its cards; her
    report names MIG slices on two more cards (made up, or other users' as she likes): they
    counted as partly used cards, flagging a fragmentation the cluster does not have. Only the
    allocator's records and DCGM's view count: her cards are not in the figure."""
    async with FakeHub() as hub:
        hub.add_server("alice", state=pinned_slice("GPU-a"))
        hub.add_server("eve")
        gpu = {"gpu_gov_grant": {"gpu-gov/tier": "h100"}}
        hub.add_server(
            "carol", started=clock.utcnow() - timedelta(minutes=5), ready=False, state=gpu
        )
        gov = governor(hub, tmp_path)
        gov.ingest(on_slice(zombie_report("alice"), "GPU-a"))
        gov.ingest(on_slice(starved_report("eve"), "GPU-made-up-1"))
        await gov.reconcile()
        gov.ingest(on_slice(starved_report("eve"), "GPU-made-up-2", "4g.40gb"))
        found = gov.diagnosis_summary()["fragmentation"]
    assert found["devices"] == 1 and found["devices_partly_used"] == 1, found
    assert found["spawns_waiting"] == 1 and found["flag"] is False, found


class QueueAnswer:
    """The hub's answer to the governor's spawn queue sync (``profiles/queue_pages.py``)."""

    def __init__(
        self, line: list, refused: int, cards: list | None = None, room: dict | None = None
    ):
        self.answer = {"line": [w.to_json() for w in line], "left": [], "refused": refused}
        if cards is not None:
            self.answer["cards"] = cards
        if room is not None:
            self.answer["room"] = room
        self.fails = False
        self.bodies: list = []  # what the governor sent

    async def request(self, method, path, body=None):
        self.bodies.append(body)
        if self.fails:
            raise HubApiError(502, "Bad Gateway", method=method, url=path)
        return self.answer


def in_line(user: str, limit: str, tier: str = "h100") -> Waiting:
    now = clock.utcnow()
    asked = QueuedRequest(user, "", "lab", tier, {}, now, now + timedelta(hours=1))
    return Waiting(asked, position=1, ready=False, reason="…", limit=limit)


async def test_fragmentation_with_no_source_for_the_cards_is_unknown_not_zero(
    tmp_path, monkeypatch
):
    """No DCGM, and no server with the workstation allocator's record of its GPUs (another
    spawner): nothing says which cards there are. The report, the command line and the
    dashboard said "0 of 0 cards partly allocated, 0 free" (none free while two spawns wait:
    read as a full cluster). The figures are unknown, and each says which source is missing."""
    from test_policy_admin import served

    from jupyter_gpu_gov import cli

    async with FakeHub() as hub:
        hub.add_server("alice")  # a GPU her report names: not counted (her user writes it)
        gpu = {"gpu_gov_grant": {"gpu-gov/tier": "h100"}}
        asked = clock.utcnow() - timedelta(minutes=5)
        hub.add_server("carol", started=asked, ready=False, state=gpu)
        gov = governor(hub, tmp_path)
        gov.ingest(zombie_report("alice"))
        await gov.reconcile()
        found = gov.diagnosis_summary()["fragmentation"]
    assert found["devices"] is None and found["devices_free"] is None, found
    assert found["devices_partly_used"] is None and found["free_scattered"] is None
    assert found["flag"] is False and found["spawns_waiting"] == 1
    assert "DCGM is not configured" in found["unknown"], found
    assert "workstation allocator" in found["unknown"]
    text = cli.cluster_text({"fragmentation": found})
    assert "fragmentation: unknown — no card to count: DCGM is not configured" in text, text
    assert "0 of 0" not in text and "spawns waiting: 1" in text
    (page,) = await served(gov, monkeypatch, "")
    said = re.search(r'id="fragmentation">(.*?)</p>', html.unescape(page), re.S)
    assert said and "Fragmentation unknown: no card to count" in " ".join(said[1].split())
    assert "0 of 0" not in said[1] and "Not fragmented" not in said[1]


async def test_the_fragmentation_figure_says_its_cards_are_those_known_not_the_cluster(
    tmp_path, monkeypatch
):
    """Without DCGM the figure counts the cards the allocator pinned for running servers: a demo
    with three H100s and one server said "Not fragmented. 0 of 1 cards partly allocated", read
    as a one-card cluster. It says the card counted is the one known, and which are left out."""
    from test_policy_admin import served

    from jupyter_gpu_gov import cli

    async with FakeHub() as hub:
        hub.add_server("alice", state={"gpu_gov_gpus": [{"uuid": "GPU-a"}]})
        gov = governor(hub, tmp_path)
        gov.ingest(zombie_report("alice"))
        await gov.reconcile()
        found = gov.diagnosis_summary()["fragmentation"]
    assert (found["devices"], found["devices_partly_used"], found["devices_free"]) == (1, 0, 0)
    known = (
        "1 card known (seen by DCGM, held by a running server or read by the workstation's hub;"
        " others are not counted): "
    )
    text = " ".join(cli.cluster_text({"fragmentation": found}).split())
    assert f"fragmentation: no — {known}0 partly allocated" in text, text
    (page,) = await served(gov, monkeypatch, "")
    said = re.search(r'id="fragmentation">(.*?)</p>', html.unescape(page), re.S)
    said = " ".join(said[1].split())
    assert (
        f"Not fragmented. {known}0 partly allocated (0 cards' worth free on them), 0 free" in said
    )
    assert "of 1 cards" not in said


async def test_spawns_in_line_or_refused_for_want_of_a_gpu_flag_fragmentation(tmp_path):
    """Nothing pending; the spawn queue's last sync says who waits: one request in line for a
    card flags the partly allocated slices, as does one spawn refused for want of one; requests
    waiting for a quota (a user's cap, a team's borrowing limit) do not."""
    quota_only = [in_line("ann", USER_CAP), in_line("bob", BORROWING)]
    cases = [
        (quota_only, 0, False, {"pending": 0, "queued": 0, "refused": 0}),
        ([*quota_only, in_line("cat", CAPACITY)], 0, True, {"pending": 0, "queued": 1, "refused": 0}),
        (quota_only, 1, True, {"pending": 0, "queued": 0, "refused": 1}),
    ]  # fmt: skip
    async with FakeHub() as hub:
        hub.add_server("alice", state=pinned_slice("GPU-a"))
        hub.add_server("bob", state=pinned_slice("GPU-b"))
        gov = governor(hub, tmp_path)
        assert gov.diagnosis_summary()["fragmentation"]["demand"]["queued"] is None  # no sync yet
        gov.ingest(on_slice(zombie_report("alice"), "GPU-a"))
        gov.ingest(on_slice(starved_report("bob"), "GPU-b"))
        await gov.reconcile()
        for line, refused, flagged, demand in cases:
            gov.spawn_queue.hub = QueueAnswer(line, refused)
            await gov.spawn_queue.sync()
            found = gov.diagnosis_summary()["fragmentation"]
            assert found["demand"] == demand and found["flag"] is flagged, (demand, found)
            assert found["spawns_waiting"] == sum(demand.values())


async def test_a_free_card_the_workstations_hub_reads_is_counted_without_dcgm(tmp_path):
    """No DCGM: alice's and bob's slices (3/7 each) on cards A and B, a spawn in line for a
    card, and card C free (no server pinned on it). Only the pinned cards were counted: the
    figure read "Fragmented" (8/7 of a card scattered, none free) while a whole card was free,
    where DCGM's view says not fragmented. The workstation's hub names the cards its allocator
    reads at the queue sync: C counts as free, and the flag is down; a card a server holds is
    not counted twice, and what a sync cannot read (not text, too long) is left out."""
    async with FakeHub() as hub:
        hub.add_server("alice", state=pinned_slice("GPU-a"))
        hub.add_server("bob", state=pinned_slice("GPU-b"))
        gov = governor(hub, tmp_path)
        gov.ingest(on_slice(zombie_report("alice"), "GPU-a"))
        gov.ingest(on_slice(starved_report("bob"), "GPU-b"))
        await gov.reconcile()
        waiting = [in_line("cat", CAPACITY)]
        for cards, flagged, counted, free in (
            (None, True, 2, 0),  # a cluster's hub names none: the pinned cards alone
            (["GPU-a", "GPU-b", "GPU-c", 7, "x" * 5000], False, 3, 1),
        ):
            gov.spawn_queue.hub = QueueAnswer(waiting, 0, cards)
            await gov.spawn_queue.sync()
            found = gov.diagnosis_summary()["fragmentation"]
            assert found["flag"] is flagged, (cards, found)
            assert (found["devices"], found["devices_free"]) == (counted, free), found
            assert found["devices_partly_used"] == 2


def cluster_room(free: dict, refused: dict | None = None) -> dict:
    """The room a cluster's hub sends at the sync (``profiles.cluster.room``): A100 pairs on
    three nodes, half H200s (MIG slices) on one."""
    a100 = sorted(n for n in free if n.startswith("a100"))
    return {
        "unknown": None,
        "read_age_s": 2.0,
        "nodes": free,
        "tiers": {
            "a100x2": {"resource": "nvidia.com/gpu", "count": 2, "nodes": a100},
            "h200-3g": {"resource": "nvidia.com/mig-3g.71gb", "count": 1, "nodes": ["h200-0"]},
        },
        "refused": refused or {},
    }


async def test_on_a_cluster_without_dcgm_each_waiting_spawn_says_what_blocks_it(
    tmp_path, monkeypatch
):
    """Kubernetes, no DCGM: A100 nodes with 1 + 1 + 2 cards free, one H200 slice free. Three
    pairs wait (carol's pod Pending, dan in line, one refused), and eve in line for a slice.
    The report said "fragmentation: unknown — no card to count" whatever the nodes held. From
    the cluster reading the hub sends at the sync: one pair fits (on the node with 2), one is
    blocked by fragmentation (a card free on each of two nodes), one by a shortage; the slice
    fits; fay, waiting for her cap, is not counted. A failed sync or a reading grown old says
    unknown, never "not fragmented"."""
    from test_policy_admin import served

    from jupyter_gpu_gov import cli

    async with FakeHub() as hub:
        pair = {"gpu_gov_grant": {"gpu-gov/tier": "a100x2"}}
        asked = clock.utcnow() - timedelta(minutes=5)
        hub.add_server("carol", started=asked, ready=False, state=pair)
        gov = governor(hub, tmp_path)
        await gov.reconcile()
        assert gov.diagnosis_summary()["fragmentation"]["nodes"] is None  # no sync yet
        free = {
            "a100-0": {"nvidia.com/gpu": 1},
            "a100-1": {"nvidia.com/gpu": 1},
            "a100-2": {"nvidia.com/gpu": 2},
            "h200-0": {"nvidia.com/mig-3g.71gb": 1},
        }
        line = [
            in_line("dan", CAPACITY, "a100x2"),
            in_line("eve", CAPACITY, "h200-3g"),
            in_line("fay", USER_CAP, "a100x2"),
        ]
        answer = QueueAnswer(line, 1, room=cluster_room(free, {"a100x2": 1}))
        gov.spawn_queue.hub = answer
        await gov.spawn_queue.sync()
        # The hub is asked for the room of the tiers the pass saw spawns starting on (it knows
        # those in line and refused): not every tier's nodes at every sync.
        assert answer.bodies[-1]["room_for"] == ["a100x2"], answer.bodies
        found = gov.diagnosis_summary()["fragmentation"]
        nodes = found["nodes"]
        assert found["flag"] is True and found["label"] == "fragmentation", found
        assert found["demand"] == {"pending": 1, "queued": 2, "refused": 1}
        assert (nodes["fits"], nodes["fragmentation"], nodes["shortage"]) == (2, 1, 1), nodes
        verdicts = {(r["tier"], r["state"]): r["blocked_by"] for r in nodes["requests"]}
        assert verdicts == {
            ("a100x2", "pending"): None,  # its pod is being placed on a100-2
            ("a100x2", "queued"): "fragmentation",
            ("a100x2", "refused"): "shortage",
            ("h200-3g", "queued"): None,
        }
        text = " ".join(cli.cluster_text({"fragmentation": found}).split())
        assert re.search(
            r"fragmentation: YES — on the cluster's nodes \(read \d+ s ago\): 1 bl", text
        )
        assert (
            "1 in line for a100x2 (2 x nvidia.com/gpu on one node): blocked by fragmentation: "
            "enough free in all, on no one node — 4 free on its 3 nodes, at most 2 on one"
        ) in text, text
        assert (
            "1 refused for a100x2 (2 x nvidia.com/gpu on one node): blocked by a shortage" in text
        )
        (page,) = await served(gov, monkeypatch, "")
        said = " ".join(html.unescape(page).split())
        assert "<b>Fragmented:</b>" in said and re.search(
            r"On the cluster's nodes \(read \d+ s", said
        )
        assert (
            "1 in line for a100x2 (2 x nvidia.com/gpu on one node): blocked by fragmentation"
            in said
        )

        answer.fails = True  # the hub does not answer the sync: the nodes are not known now
        await gov.spawn_queue.sync()
        found = gov.diagnosis_summary()["fragmentation"]
        assert found["flag"] is False and found["nodes"]["requests"] == []
        assert "spawn queue sync with the hub failed" in found["nodes"]["unknown"], found
        text = " ".join(cli.cluster_text({"fragmentation": found}).split())
        assert "fragmentation: unknown — the cluster's nodes: the spawn queue sync" in text, text

        answer.fails = False
        await gov.spawn_queue.sync()
        assert gov.diagnosis_summary()["fragmentation"]["flag"] is True
        gov.spawn_queue.room_at -= timedelta(seconds=200)  # no sync since: the reading aged
        found = gov.diagnosis_summary()["fragmentation"]
        assert found["flag"] is False
        assert re.search(r"last read 20\d s ago", found["nodes"]["unknown"]), found
        (page,) = await served(gov, monkeypatch, "")
        said = " ".join(html.unescape(page).split())
        assert (
            "Fragmentation unknown: the cluster's nodes: the cluster's nodes were last read" in said
        )
        assert "Not fragmented" not in said

        answer.answer["room"] = {**cluster_room(free), "nodes": ["a100-0"]}  # not readable
        await gov.spawn_queue.sync()
        found = gov.diagnosis_summary()["fragmentation"]
        assert found["flag"] is False and "room cannot be read" in found["nodes"]["unknown"]


async def test_causes_cost_gpu_hours_per_team_and_node(tmp_path):
    """Each report books the time since the server's previous one, times its GPUs, to its
    cause; ``GET api/diagnosis`` sums them per team and per node."""
    async with FakeHub() as hub:
        hub.add_server("alice", state={"gpu_gov_grant": {"gpu-gov/team": "vision"}})
        gov = governor(hub, tmp_path)
        gov.ingest(zombie_report("alice", away=timedelta(hours=3)))
        await gov.reconcile()  # the usage ledger knows the server's GPUs from then on
        try:
            for _ in range(4):
                clock.advance(300)
                gov.ingest(zombie_report("alice", away=timedelta(hours=3)))
            summary = gov.diagnosis_summary()
        finally:
            clock.reset()

    cost = summary["cost"]
    zombie = cost["causes"]["zombie"]
    assert zombie["gpu_hours"] == pytest.approx(1 / 3, abs=0.01)  # four gaps of 5 minutes
    assert zombie["recoverable_gpu_hours"] == zombie["gpu_hours"]  # a cull gives it all back
    assert zombie["utilisation"] == 0.0 and zombie["share"] == 1.0
    [node] = cost["nodes"]
    assert cost["nodes"][node]["zombie"]["gpu_hours"] == zombie["gpu_hours"]
    assert list(cost["teams"]) == ["vision"]


async def test_an_idle_kernel_with_its_owner_around_is_booked_idle_not_healthy(tmp_path):
    """A kernel running no cell whose owner was just here is no zombie and no fault (its
    diagnosis is `healthy`), but its GPU waits: its time was booked `healthy` at 0 % SM, so a
    team lead read a demo's idle hours as working loops. Now it is `idle`; a working loop's
    time stays `healthy`."""
    async with FakeHub() as hub:
        hub.add_server("alice", state={"gpu_gov_grant": {"gpu-gov/team": "vision"}})
        hub.add_server("bob", state={"gpu_gov_grant": {"gpu-gov/team": "vision"}})
        gov = governor(hub, tmp_path)

        def working(user: str) -> dict:
            r = starved_report(user)
            r["targets"][0]["gpu"]["sm"] = r["devices"][0]["activity"] = 0.95
            r["targets"][0]["cpu"]["cores"] = 0.3
            return r

        gov.ingest(zombie_report("alice", away=timedelta(minutes=2)))
        gov.ingest(working("bob"))
        await gov.reconcile()  # the usage ledger knows the servers' GPUs from then on
        try:
            for _ in range(4):
                clock.advance(300)
                gov.ingest(zombie_report("alice", away=timedelta(minutes=2)))
                gov.ingest(working("bob"))
            causes = gov.diagnosis_summary()["cost"]["causes"]
        finally:
            clock.reset()
    assert causes["idle"]["gpu_hours"] == pytest.approx(1 / 3, abs=0.01)
    assert causes["idle"]["utilisation"] == 0.0 and causes["idle"]["recoverable_gpu_hours"] == 0
    assert causes["healthy"]["gpu_hours"] == pytest.approx(1 / 3, abs=0.01)
    assert causes["healthy"]["utilisation"] > 0.9


async def test_a_healthy_or_unknown_server_has_no_root_cause(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path)
        recent = zombie_report(away=timedelta(minutes=2))  # idle, but someone was just here
        assert gov.ingest(recent)["root_cause"] is None
        unknown = zombie_report()
        unknown["targets"][0]["gpu"]["sm"] = None
        unknown["devices"][0]["activity"] = None
        assert gov.ingest(unknown)["root_cause"] is None  # unknown is never blamed
        nothing = zombie_report()
        nothing["targets"][0]["gpu"].update(holds_context=False, memory_mb=0, devices=[])
        nothing["server"]["gpu_allocated"] = False
        assert gov.ingest(nothing)["root_cause"] is None  # no GPU: nothing to diagnose


async def test_a_stale_report_loses_its_root_cause(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice")
        gov = governor(hub, tmp_path)
        gov.ingest(zombie_report())
        assert gov.verdict("alice/")["root_cause"]["label"] == "zombie"
        clock.advance(10 * 60)  # report_stale_after is 5 minutes
        try:
            assert gov.verdict("alice/")["root_cause"] is None
        finally:
            clock.reset()


async def test_a_site_zombie_time_shortens_the_rules(tmp_path):
    async with FakeHub() as hub:
        hub.add_server("alice")
        quick = governor(hub, tmp_path, zombie_idle=timedelta(seconds=60))
        assert quick.ingest(zombie_report(away=timedelta(minutes=2)))["root_cause"]["label"] == (
            "zombie"
        )
        (tmp_path / "slow").mkdir()
        slow = governor(hub, tmp_path / "slow", zombie_idle=timedelta(hours=2))
        assert slow.ingest(zombie_report(away=timedelta(hours=1)))["root_cause"] is None


def test_a_new_window_is_scored_in_its_servers_context():
    """The service reads a report's window with the server's recent running windows, as the
    model is trained (``features.with_context``); the history keeps the windows as they came."""
    service = DiagnosisService(DiagnosisOptions(sample_every=timedelta(0)))
    scored = []  # the windows the model scores
    score = service.model.score
    service.model.score = lambda window, **how: scored.append(window) or score(window, **how)
    try:
        for sm, cores in [(0.12, 1.0), (0.6, 0.2), (0.3, 0.9), (0.2, 0.8), (0.5, 0.7)]:
            clock.advance(60)
            r = starved_report("carol")
            r["targets"][0]["gpu"]["sm"] = sm
            r["targets"][0]["cpu"]["cores"] = cores
            service.observe("carol/", validate(r))
        clock.advance(60)
        idle = zombie_report("carol", away=timedelta(seconds=20))  # a pause: not smoothed
        service.observe("carol/", validate(idle))
    finally:
        clock.reset()
    scored, paused = scored[:5], scored[5]
    assert scored[0].sm_active == 0.12  # nothing earlier
    assert scored[1].sm_active == pytest.approx(0.36)  # median of two
    assert scored[2].sm_active == 0.3 and scored[2].cpu_cores == 0.9
    assert scored[3].sm_active == pytest.approx(0.25)  # median of four
    assert scored[3].cpu_cores == pytest.approx(0.85)
    assert scored[4].sm_active == pytest.approx(0.4)  # the last four: 0.12 dropped
    assert scored[4].cpu_cores == pytest.approx(0.75)
    assert paused.sm_active == 0.0 and paused.kernel_busy is False
    assert [w.sm_active for w in service.history.of("carol/")] == [
        0.12,
        0.6,
        0.3,
        0.2,
        0.5,
        0.0,
    ]
    service.forget("carol/")
    assert "carol/" not in service._servers and "carol/" not in service.results


def test_the_diagnosis_keeps_no_report_no_window_and_no_silent_diagnosis_a_server():
    """Between reports the service keeps, per server, the numbers the next window's context
    reads and the verdict's cause: not the report (the governor's), not a ``Window`` (~470
    bytes with its floats), not a healthy server's diagnosis (two dicts); 10,000 servers' were
    ~20 MB (docs/benchmarks-history.md, "Issue 26, wave 14")."""
    service = DiagnosisService(DiagnosisOptions(sample_every=timedelta(0)))
    reports = []
    try:
        for _ in range(3):
            clock.advance(60)
            for report in (starved_report("carol"), zombie_report("dave")):
                reports.append(validate(report))
                service.observe(report["server"]["user"] + "/", reports[-1])
    finally:
        clock.reset()
    assert service.root_cause("carol/") is not None  # both name a cause ...
    assert service.root_cause("dave/")["label"] == "zombie"
    healthy = validate(starved_report("erin"))
    healthy["targets"][0]["gpu"]["sm"] = 0.95
    healthy["targets"][0]["execution_state"] = "busy"
    service.observe("erin/", healthy)
    assert service.results["erin/"].label == "healthy"
    held, stack, seen = [], [service], set()
    while stack:
        obj = stack.pop()
        if id(obj) not in seen and not isinstance(obj, type | types.ModuleType):
            seen.add(id(obj))
            held.append(obj)
            stack.extend(gc.get_referents(obj))
    assert not [o for o in held if isinstance(o, Window)]
    assert not [o for o in held if any(o is r for r in (*reports, healthy))]
    causes = sorted(service.results[key].label for key in ("carol/", "dave/"))
    assert sorted(o.label for o in held if isinstance(o, Diagnosis)) == causes  # not erin's


def test_a_server_renaming_its_gpu_in_every_report_trains_one_node():
    """Without DCGM a window's node is the kind of card its report names: the server's own
    words. A new name in every report made a node reference and a task each, kept for good
    (~10 kB a report: 97 MB a week from one server). The first name a server gives is kept for
    its session; DCGM's hostname, where DCGM sees the GPU, is still the node."""
    service = DiagnosisService(DiagnosisOptions(sample_every=timedelta(0)))
    try:
        for i in range(60):
            clock.advance(60)
            report = validate(starved_report("mallory"))
            report["devices"][0]["name"] = f"NVIDIA H100 {i}"
            service.observe("mallory/", report)
        assert len(service.model.nodes) == 1 and len(service.model.tasks) == 1
        assert service.results["mallory/"].node == "NVIDIA H100 0"
        assert {w.node for w in service.history.windows()} == {"NVIDIA H100 0"}

        service.forget("mallory/")  # a new session may run on another card
        clock.advance(60)
        report = validate(starved_report("mallory"))
        report["devices"][0]["name"] = "NVIDIA L4"
        service.observe("mallory/", report)
        assert service.results["mallory/"].node == "NVIDIA L4"
    finally:
        clock.reset()


def test_the_history_is_bounded_by_count_and_age():
    history = History(timedelta(days=7), limit=5)
    window = faults.generate(1, 1, seed=3)[0][0]
    for i in range(8):
        history.add(f"u{i % 2}/", replace(window, t=float(i)), now=float(i))
    assert len(history) == 5 and [w.t for w in history.windows()] == [4.0, 6.0, 3.0, 5.0, 7.0]
    history.add("u0/", replace(window, t=8.0), now=8 + 7 * 86400.0)  # a week later
    assert len(history) == 1 and history.servers == 1 and history.of("u0/")[0].t == 8.0


def test_the_history_gives_back_the_windows_it_was_given():
    """The history packs its windows (the numbers each has in an array, a mask of which); what
    training reads back is equal to what came in, column by column, in each server's order."""
    history = History(timedelta(days=7), limit=1000)
    generated = [window for window, _label in faults.generate(4, 50, seed=5)]
    kept = []
    for i, window in enumerate(generated):
        window = replace(
            window,
            server=f"u{i % 3}/",
            node=None if i % 7 == 0 else window.node,
            kernel_busy=(True, False, None)[i % 3],
            dram_active=None if i % 2 else 0.1 * (i % 10),
            user_idle_s=float(i) if i % 5 else None,
        )
        history.add(window.server, window, now=float(i))
        kept.append(window)
    for server in ("u0/", "u1/", "u2/"):
        assert history.of(server) == [w for w in kept if w.server == server]
    assert history.windows() == sorted(kept, key=lambda w: w.server)  # server by server
    assert list(unpack(history.snapshot())) == history.windows()
    with pytest.raises(TypeError):  # not a number: refused whole
        history.add("u9/", replace(kept[0], server="u9/", sm_active="busy"), now=1000.0)
    assert len(history) == len(kept) and history.servers == 3


def test_the_history_keeps_a_label_once_for_a_run_of_windows_and_reads_each_back():
    """A server's windows almost always share their (node, server): the history keeps it once a
    run (10,000 servers' 25 windows: ~2 MB less), and every window reads back with its own, as
    runs start, end and are trimmed from the front."""
    history = History(timedelta(days=7), limit=12)
    window = faults.generate(1, 1, seed=3)[0][0]
    nodes = ["A", "A", "A", None, None, "B", "A", "A", "A", "A", "A", "A", "A", "A", "C", "C"]
    kept = []
    for i, node in enumerate(nodes):
        added = replace(window, server="u0/", node=node, t=float(i))
        history.add("u0/", added, now=float(i))
        kept.append(added)
        assert history.of("u0/") == kept[-12:]  # the oldest trimmed past 12
    assert list(unpack(history.snapshot())) == kept[-12:]
    ((_, _, labels),) = history.snapshot()
    assert labels == [(None, "u0/"), ("B", "u0/"), ("A", "u0/"), ("C", "u0/")]  # not 12
    for i in range(12):  # trimmed by age, one at a time, to nothing
        history.trim(now=float(len(nodes) - 12 + i) + 7 * 86400 + 0.5)
        assert history.of("u0/") == kept[len(nodes) - 12 + i + 1 :]
    assert history.servers == 0 and len(history) == 0


async def test_training_runs_in_a_worker_while_the_model_goes_on_learning(tmp_path):
    """The model learns and scores each report at once; a training run rebuilds it from the
    history in the worker, the loop answering meanwhile, and saves it."""
    rows = faults.generate(120, 60, seed=11)  # 7,200 windows
    async with FakeHub() as hub:
        hub.add_server("bob")
        gov = governor(
            hub,
            tmp_path,
            min_windows=5000,
            sample_every=timedelta(0),
            model_path=str(tmp_path / "model" / "diagnosis.pkl"),
        )
        service = gov.diagnosis
        first = service.model
        for i, (window, _) in enumerate(rows):
            service.history.add(window.server, window, now=clock.utcnow().timestamp() + i * 1e-6)
        assert gov.ingest(starved_report("bob"))["root_cause"]["source"] == "model"

        answered: list[dict] = []
        fitting, answered_while_fitting = threading.Event(), threading.Event()

        async def keep_answering():
            while service.training_running or not answered:
                await asyncio.sleep(0.005)
                was_fitting = fitting.is_set()
                answered.append(gov.ingest(starved_report("bob")))
                if was_fitting:
                    answered_while_fitting.set()

        # The worker's fit waits until the pass is over (a pass that waited for the training
        # would never end, bounded below), then until the loop has answered a report while the
        # fit is under way: a fit run on the loop holds it, no answer comes, and the wait gives
        # up (60 s) unanswered. Events, not the loop's gaps: a loaded machine may stall any
        # process for half a second (a 0.58 s gap failed the old 0.38 s bound under load).
        pass_over, fit = threading.Event(), service._fit

        def fit_once_the_loop_answers(windows):
            pass_over.wait(60)
            fitting.set()
            answered_while_fitting.wait(60)
            return fit(windows)

        service._fit = fit_once_the_loop_answers
        await asyncio.wait_for(gov.reconcile(), 30)  # starts the training, does not wait for it
        assert service.training_running
        pass_over.set()
        await asyncio.gather(keep_answering(), service._task)

        costs = []
        for _ in range(20):
            started = time.perf_counter()
            gov.ingest(starved_report("bob"))
            costs.append(time.perf_counter() - started)
        trained = gov.verdict("bob/")
        summary = gov.diagnosis_summary()

    assert service.training.error is None, service.training.error
    assert service.model is not first and service.training.windows >= 7200
    assert service.model.trained_on >= 5000  # learnt from the history
    assert service.training.runs == 1
    assert answered_while_fitting.is_set()  # the loop answered while the worker fitted
    assert all(v["root_cause"] is not None for v in answered)
    assert sorted(costs)[10] < 0.01, costs  # median ingest, window and all
    cause = trained["root_cause"]
    assert cause["source"] == "model" and cause["cause"] in ("cpu_serial", "small_work"), cause
    assert summary["source"] == "model" and summary["model"]["train_seconds"] > 0
    assert summary["model"]["score_ms"] is not None
    assert Path(tmp_path / "model" / "diagnosis.pkl").exists()  # kept for the next start


async def test_a_saved_model_is_loaded_at_start(tmp_path):
    rows = faults.generate(60, 40, seed=5)
    service = DiagnosisService(
        DiagnosisOptions(
            min_windows=100, sample_every=timedelta(0), model_path=str(tmp_path / "m.pkl")
        )
    )
    for window, _ in rows:
        service.history.add(window.server, window, now=clock.utcnow().timestamp())
    service._loaded = True  # nothing to load yet
    await service.maybe_train()
    assert service.model.trained_on > 1000

    again = DiagnosisService(DiagnosisOptions(model_path=str(tmp_path / "m.pkl")))
    await again.maybe_train()  # the first pass loads it
    assert again.model.trained_on == service.model.trained_on
    # Trained when the file was written: the next training waits its full period.
    assert clock.utcnow() - again.training.trained_at < timedelta(minutes=1)


def _named(report: dict, uuid: str, card: str) -> dict:
    report["devices"][0].update(uuid=uuid, name=card)
    report["targets"][0]["gpu"]["devices"] = [uuid]
    return report


async def test_a_report_cannot_choose_the_node_whose_reference_it_teaches(tmp_path):
    """Without DCGM a window's node was the card its report names: the user's words. Mallory,
    given an L4 by the allocator, named her card an H100 (her records' UUID, so believed) and
    taught the H100s' reference, which every H100 server's windows are read against; eve, on
    a spawner the Hub keeps no records of, the same. The node now comes from what the user
    cannot write: DCGM's hostname of the GPUs the Hub's records give the server, else the tier
    admission granted it, else the profile KubeSpawner runs its pod on; a server with none of
    them is scored, never learnt."""
    h100 = "NVIDIA H100 80GB HBM3"
    async with FakeHub() as hub:
        for user, card, tier in (("alice", "GPU-a", "h100"), ("mallory", "GPU-m", "l4")):
            state = {"gpu_gov_devices": [card], "gpu_gov_grant": {"gpu-gov/tier": tier}}
            hub.add_server(user, state=state)
        # KubeSpawner's pod, on the profile it enforces (no profile layer, no DCGM)
        hub.add_server("kim", state={"pod_name": "jupyter-kim"}, user_options={"profile": "a100"})
        hub.add_server("eve")
        gov = governor(hub, tmp_path)
        await gov.reconcile()
        for user, card in (
            ("alice", "GPU-a"),
            ("mallory", "GPU-m"),
            ("kim", "GPU-k"),
            ("eve", "GPU-e"),
        ):
            gov.ingest(_named(starved_report(user), card, h100))
        model = gov.diagnosis.model
        learnt = {node: ref.servers for (node, _), ref in model.nodes.items()}

    assert learnt == {
        "tier h100": {"alice/"},
        "tier l4": {"mallory/"},
        "profile a100": {"kim/"},
    }
    assert gov.diagnosis.results["mallory/"].node == "tier l4"
    assert "eve/" in gov.diagnosis.results  # scored all the same
