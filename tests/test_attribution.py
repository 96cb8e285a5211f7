"""Attribution of GPU processes to kernels, terminals and the rest of the server, on a workstation
(local PIDs) and in a container (host PIDs), over a fake /proc tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.models import Device, DeviceSample, GpuProcess, GpuSnapshot
from jupyter_gpu_gov.core.report import gpu_signal
from jupyter_gpu_gov.gpu import procs
from jupyter_gpu_gov.gpu.attribution import OTHER, TargetRoot, attribute, target_members
from jupyter_gpu_gov.server.sampler import Sampler, TargetInfo

SERVER = 100
KERNEL_A, KERNEL_A_WORKER, KERNEL_A_DAEMON = 200, 201, 202
KERNEL_B = 300
SHELL, SHELL_CHILD = 400, 401
SERVER_HELPER = 500
STRANGER = 900  # another user's process on a workstation

GPU0 = Device("GPU-aaaa", "NVIDIA H100 80GB HBM3", 0, 81559, minor_number=0)
GPU1 = Device("GPU-bbbb", "NVIDIA H100 80GB HBM3", 1, 81559, minor_number=1)


class FakeProc:
    """A /proc tree on disk: stat files, open device files, a PID namespace link."""

    def __init__(self, root: Path):
        self.root = root
        (root / "self" / "ns").mkdir(parents=True)
        (root / "self" / "ns" / "pid").write_text("")  # not the host namespace's inode

    def add(self, pid, ppid, sid, comm="python", devices=(), cpu=(0, 0), uid=None):
        d = self.root / str(pid)
        (d / "fd").mkdir(parents=True)
        fields = ["S", ppid, sid, sid, 0, 0, 0, 0, 0, 0, 0, cpu[0], cpu[1]] + [0] * 27 + [0]
        (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(map(str, fields)) + "\n")
        if uid is not None:  # without it, a process whose user cannot be read (a stranger)
            (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "io").write_text("rchar: 0\nread_bytes: 0\n")
        for n, dev in enumerate(("/dev/nvidiactl", "/dev/nvidia-uvm", *devices)):
            os.symlink(dev, d / "fd" / str(10 + n))
        return self


@pytest.fixture
def fake_proc(tmp_path):
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, 1, "init")
    fake.add(SERVER, 1, SERVER, "jupyter-server")
    fake.add(KERNEL_A, SERVER, KERNEL_A, devices=["/dev/nvidia0"])
    fake.add(KERNEL_A_WORKER, KERNEL_A, KERNEL_A, devices=["/dev/nvidia0"])
    # A DataLoader worker that daemonised: re-parented to init, still in the kernel's session.
    fake.add(KERNEL_A_DAEMON, 1, KERNEL_A)
    fake.add(KERNEL_B, SERVER, KERNEL_B)
    fake.add(SHELL, SERVER, SHELL, "bash")
    fake.add(SHELL_CHILD, SHELL, SHELL)
    fake.add(SERVER_HELPER, SERVER, SERVER)
    fake.add(STRANGER, 1, STRANGER)
    return fake


ROOTS = [
    TargetRoot("kernel", "a", KERNEL_A),
    TargetRoot("kernel", "b", KERNEL_B),
    TargetRoot("terminal", "1", SHELL),
]


def snapshot(*samples: DeviceSample, devices=(GPU0, GPU1)) -> GpuSnapshot:
    return GpuSnapshot("nvml", clock.utcnow(), tuple(devices), {s.uuid: s for s in samples})


def members_of(fake: FakeProc):
    return target_members(procs.scan(str(fake.root)), ROOTS, SERVER)


def test_members_follow_descendants_and_sessions(fake_proc):
    members = members_of(fake_proc)
    assert members["kernel:a"] == {KERNEL_A, KERNEL_A_WORKER, KERNEL_A_DAEMON}
    assert members["kernel:b"] == {KERNEL_B}
    assert members["terminal:1"] == {SHELL, SHELL_CHILD}
    assert members[OTHER] == {SERVER, SERVER_HELPER}


def test_local_pids_are_attributed_exactly_and_strangers_mark_the_card_shared(fake_proc):
    sample = DeviceSample(
        GPU0.uuid,
        30000,
        0.6,
        (
            GpuProcess(KERNEL_A_WORKER, 20000, 0.6),
            GpuProcess(SHELL_CHILD, 2000, 0.0),
            GpuProcess(STRANGER, 8000, 0.0),
        ),
    )
    result = attribute(snapshot(sample), members_of(fake_proc), local_pids=True)

    kernel, terminal = result.gpu["kernel:a"], result.gpu["terminal:1"]
    assert (kernel.memory_mb, kernel.sm, kernel.confidence) == (20000, 0.6, "exact")
    assert (terminal.memory_mb, terminal.sm) == (2000, 0.0)
    assert "kernel:b" not in result.gpu
    assert result.shared == {GPU0.uuid}


def test_unknown_per_process_activity_on_a_busy_shared_card_stays_unknown(fake_proc):
    sample = DeviceSample(
        GPU0.uuid, 9000, 0.9, (GpuProcess(KERNEL_A, 1000, None), GpuProcess(STRANGER, 8000, None))
    )
    result = attribute(snapshot(sample), members_of(fake_proc), local_pids=True)
    assert result.gpu["kernel:a"].sm is None
    assert result.gpu["kernel:a"].confidence == "unknown"


def test_an_idle_card_proves_its_processes_idle_even_without_per_process_data(fake_proc):
    sample = DeviceSample(GPU0.uuid, 9000, 0.0, (GpuProcess(KERNEL_A, None, None),))
    gpu = attribute(snapshot(sample), members_of(fake_proc), local_pids=True).gpu["kernel:a"]
    assert gpu.sm == 0.0 and gpu.memory_mb is None and gpu.holds_context


def test_container_never_looks_host_pids_up_locally(fake_proc):
    # NVML in a container reports the *host* PID of kernel a's worker. By coincidence that
    # number is also the local PID of the terminal's child: it must not be blamed.
    sample = DeviceSample(GPU0.uuid, 20000, 0.0, (GpuProcess(SHELL_CHILD, 20000, 0.0),))
    members = members_of(fake_proc)
    files = {
        pid: procs.nvidia_device_files(pid, str(fake_proc.root))
        for m in members.values()
        for pid in m
    }
    result = attribute(snapshot(sample), members, local_pids=False, device_files=files)

    assert "terminal:1" not in result.gpu
    kernel = result.gpu["kernel:a"]
    # kernel a's two local processes hold /dev/nvidia0; NVML lists one process: no 1:1 match.
    assert (kernel.memory_mb, kernel.sm, kernel.confidence) == (20000, 0.0, "inferred")


def test_container_with_two_holding_kernels_gives_no_split(fake_proc, tmp_path):
    fake_proc.add(301, KERNEL_B, KERNEL_B, devices=["/dev/nvidia0"])
    members = members_of(fake_proc)
    files = {
        pid: procs.nvidia_device_files(pid, str(fake_proc.root))
        for m in members.values()
        for pid in m
    }

    busy = DeviceSample(
        GPU0.uuid, 30000, 0.7, (GpuProcess(77001, 20000, 0.7), GpuProcess(77002, 10000, 0.0))
    )
    result = attribute(snapshot(busy), members, local_pids=False, device_files=files)
    for key in ("kernel:a", "kernel:b"):
        gpu = result.gpu[key]
        assert gpu.holds_context and gpu.memory_mb is None and gpu.sm is None
        assert gpu.confidence == "unknown"

    idle = DeviceSample(GPU0.uuid, 30000, 0.0, busy.processes)
    result = attribute(snapshot(idle), members, local_pids=False, device_files=files)
    assert result.gpu["kernel:a"].sm == 0.0 and result.gpu["kernel:b"].sm == 0.0


def test_time_sliced_busy_card_proves_nothing_about_us(fake_proc):
    members = members_of(fake_proc)
    files = {
        pid: procs.nvidia_device_files(pid, str(fake_proc.root))
        for m in members.values()
        for pid in m
    }
    busy = DeviceSample(GPU0.uuid, 30000, 0.9, (GpuProcess(77001, 30000, None),))
    result = attribute(
        snapshot(busy), members, local_pids=False, time_sliced=True, device_files=files
    )
    assert result.gpu["kernel:a"].sm is None and result.shared == {GPU0.uuid}


def test_sampler_in_a_container_reads_only_its_own_processes(fake_proc, monkeypatch):
    looked_up: list[int] = []
    real = procs.nvidia_device_files

    def spy(pid, proc_root="/proc"):
        looked_up.append(pid)
        return real(pid, proc_root)

    monkeypatch.setattr(procs, "nvidia_device_files", spy)
    host_pid = 4_000_123
    sample = DeviceSample(GPU0.uuid, 20000, 0.0, (GpuProcess(host_pid, 20000, 0.0),))

    class Backend:
        name = "nvml"

        def sample(self):
            return snapshot(sample, devices=(GPU0,))

        def close(self):
            pass

    sampler = Sampler(lambda: Backend(), server_pid=SERVER, proc_root=str(fake_proc.root))
    assert procs.in_host_pid_namespace(str(fake_proc.root)) is False
    targets = [TargetInfo(root, name=root.id) for root in ROOTS]
    report = sampler.measure(targets, {"user": "alice"}).report
    sampler.close()

    assert host_pid not in looked_up
    assert set(looked_up) <= {
        SERVER,
        SERVER_HELPER,
        KERNEL_A,
        KERNEL_A_WORKER,
        KERNEL_A_DAEMON,
        KERNEL_B,
        SHELL,
        SHELL_CHILD,
    }
    kernel = next(t for t in report["targets"] if t["id"] == "a")
    assert kernel["gpu"]["memory_mb"] == 20000 and kernel["gpu"]["pids"] == [host_pid]


def test_a_container_server_whose_gpus_run_nothing_reads_no_device_files(fake_proc, monkeypatch):
    looked_up: list[int] = []
    real = procs.nvidia_device_files
    monkeypatch.setattr(
        procs, "nvidia_device_files", lambda pid, root: looked_up.append(pid) or real(pid, root)
    )
    idle = DeviceSample(GPU0.uuid, 0, 0.0, ())
    # a process on a GPU of this node that the server may not use asks nothing either
    other = DeviceSample(GPU1.uuid, 9000, 0.5, (GpuProcess(4_000_124, 9000, 0.5),))

    class Backend:
        name = "nvml"

        def sample(self):
            return snapshot(idle, other, devices=(GPU0, GPU1))

        def close(self):
            pass

    sampler = Sampler(
        lambda: Backend(),
        server_pid=SERVER,
        proc_root=str(fake_proc.root),
        visible_devices=[GPU0.uuid],
    )
    targets = [TargetInfo(root, name=root.id) for root in ROOTS]
    report = sampler.measure(targets, {"user": "alice"}).report
    sampler.close()

    assert looked_up == []
    assert [d["uuid"] for d in report["devices"]] == [GPU0.uuid]
    assert not any(t["gpu"]["holds_context"] for t in report["targets"])


def test_an_orphan_of_the_owner_on_a_workstation_is_the_servers_not_a_strangers(fake_proc):
    # `nohup python train.py &` from a JupyterLab terminal, the terminal since closed: the run
    # was re-parented to init and its session has no target. It runs as the server's own Unix
    # user, on the card the allocator gave the server; another user's process still marks the
    # card shared.
    orphan, other_user, root = 4321, 4322, 4323
    fake_proc.add(orphan, 1, 4300, devices=["/dev/nvidia0"], uid=1000)
    fake_proc.add(other_user, 1, other_user, devices=["/dev/nvidia1"], uid=1001)
    fake_proc.add(root, 1, root, "Xorg", devices=["/dev/nvidia1"], uid=0)
    ours = DeviceSample(GPU0.uuid, 20000, 0.9, (GpuProcess(orphan, 20000, 0.9),))
    theirs = DeviceSample(
        GPU1.uuid, 8000, 0.9, (GpuProcess(other_user, 8000, 0.9), GpuProcess(root, 100, 0.0))
    )

    class Backend:
        name = "nvml"

        def sample(self):
            return snapshot(ours, theirs)

        def close(self):
            pass

    sampler = Sampler(
        lambda: Backend(),
        server_pid=SERVER,
        proc_root=str(fake_proc.root),
        visible_devices=[GPU0.uuid, GPU1.uuid],
        pid_namespace="host",
    )
    sampler.uid = 1000  # the server runs as alice
    targets = [TargetInfo(r, name=r.id) for r in ROOTS]
    sampler.measure(targets, {"user": "alice", "gpu_allocated": True})
    report = sampler.measure(targets, {"user": "alice", "gpu_allocated": True}).report

    sampler.uid = 0  # a server run as root: root's processes are the system's, not its owner's
    fake_proc.add(root + 1, 1, root + 1, "Xorg", devices=["/dev/nvidia0"], uid=0)
    xorg = DeviceSample(GPU0.uuid, 100, 0.0, (GpuProcess(root + 1, 100, 0.0),))
    ours, theirs = xorg, DeviceSample(GPU1.uuid, 0, 0.0, ())
    as_root = sampler.measure(targets, {"user": "alice", "gpu_allocated": True}).report
    sampler.close()
    assert [d["shared"] for d in as_root["devices"]] == [True, False]
    assert not any(t["gpu"]["holds_context"] for t in as_root["targets"])

    shared = {d["uuid"]: d["shared"] for d in report["devices"]}
    assert shared == {GPU0.uuid: False, GPU1.uuid: True}
    other = next(t for t in report["targets"] if t["kind"] == "other")
    assert other["gpu"]["devices"] == [GPU0.uuid] and other["gpu"]["pids"] == [orphan]
    assert other["gpu"]["sm"] == 0.9
    for action in ("stop-server", "shutdown-kernels"):
        signal = gpu_signal(report, idle_threshold=0.02, cull_action=action)
        assert (signal.holds_gpu, signal.active) == (True, True), action


def test_scan_sees_a_real_child_process_and_its_parent():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        table = procs.scan()
        assert table.get(child.pid).ppid == os.getpid()
        assert child.pid in table.descendants(os.getpid())
        assert procs.uid_of(child.pid) == os.getuid()
    finally:
        child.kill()
        child.wait()


def test_parse_stat_copes_with_parentheses_in_the_command_name():
    raw = (
        b"42 (my (weird) name) S 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 99 0 0"
        + b" 0" * 20
        + b" 5"
    )
    info = procs.parse_stat(raw)
    assert (info.pid, info.ppid, info.comm, info.cpu_ticks) == (42, 1, "my (weird) name", 10)


def test_repeated_scans_pick_up_new_processes_and_reused_pids(fake_proc):
    scanner = procs.ProcScanner(str(fake_proc.root))
    table = scanner.scan()
    members = target_members(table, ROOTS, SERVER)
    scanner.settle(table, set().union(*members.values()))
    assert STRANGER in scanner.foreign

    fake_proc.add(600, KERNEL_B, KERNEL_B)  # a new child of kernel b
    # The stranger exits and its PID is reused by a new child of the terminal.

    shutil.rmtree(fake_proc.root / str(STRANGER))
    assert STRANGER not in scanner.scan()
    fake_proc.add(STRANGER, SHELL, SHELL)

    members = target_members(scanner.scan(), ROOTS, SERVER)
    assert members["kernel:b"] == {KERNEL_B, 600}
    assert members["terminal:1"] == {SHELL, SHELL_CHILD, STRANGER}
