"""A workstation server's CPU as the kernel accounts it (hub/proc_cpu.py), read from real
processes: the pid is the one the Hub's records give (LocalProcessSpawner's state), its tree's
``utime + stime`` folded through ``core.cpu_stage``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.hub import proc_cpu
from jupyter_gpu_gov.hub.proc_cpu import ProcCpu, ProcCpuOptions, same_host, spawner_pid

# A "server" that sleeps while its child computes, as a server does while its kernel runs a cell.
BUSY_TREE = (
    "import subprocess, sys, time;"
    "subprocess.Popen([sys.executable, '-c', 'while True: pass']);"
    "time.sleep(600)"
)
IDLE = "import time; time.sleep(600)"


@pytest.fixture
def spawn():
    started = []

    def spawn(code: str):
        before = clock.utcnow() - timedelta(milliseconds=10)
        process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        started.append(process)
        return process, before

    yield spawn
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def reads(cpu: ProcCpu, n: int = 3, every: float = 1.0) -> None:
    for _ in range(n):
        asyncio.run(cpu.read(clock.utcnow()))
        time.sleep(every)
    asyncio.run(cpu.read(clock.utcnow()))


def options(**changes) -> ProcCpuOptions:
    # 0.1 core: a computing child reads 0.8-1.0 on an idle machine, and still well over a
    # tenth on a loaded one; a sleeping tree reads about none.
    base = {"same_host": True, "cores": 0.1, "after": timedelta(0)}
    return ProcCpuOptions(**{**base, **changes})


def test_a_busy_process_tree_is_a_cpu_stage_an_idle_one_is_not(spawn):
    busy, busy_started = spawn(BUSY_TREE)
    idle, idle_started = spawn(IDLE)
    cpu = ProcCpu(options())
    cpu.want("ann/", {"pid": busy.pid}, busy_started)
    cpu.want("bob/", {"pid": idle.pid}, idle_started)
    reads(cpu)
    now = clock.utcnow()
    assert cpu.busy_since("ann/", now) is not None  # its child computes
    assert cpu.busy_since("bob/", now) is None
    assert cpu.changed(now) == {"ann/"}  # marked to be decided again, once
    assert cpu.changed(now) == set()


def test_a_pid_the_hub_did_not_start_is_not_read(spawn):
    """A pid used again: the process there started long after the Hub started the server (or
    before it). Not believed: the server is decided as before."""
    busy, started = spawn(BUSY_TREE)
    cpu = ProcCpu(options())
    cpu.want("ann/", {"pid": busy.pid}, started - timedelta(hours=1))  # reused since
    cpu.want("cat/", {"pid": busy.pid}, started + timedelta(minutes=5))  # started before it
    reads(cpu)
    now = clock.utcnow()
    assert cpu.busy_since("ann/", now) is None and cpu.busy_since("cat/", now) is None
    assert cpu._wanted == {}  # forgotten until the records name it again


def test_gone_off_and_not_this_host_change_nothing(spawn, caplog):
    busy, started = spawn(BUSY_TREE)
    gone, gone_started = spawn(IDLE)
    gone.kill()
    gone.wait()
    for cpu in (
        ProcCpu(options(same_host=False)),  # the governor is not on the servers' host
        ProcCpu(options(cores=0)),  # off
    ):
        cpu.want("ann/", {"pid": busy.pid}, started)
        reads(cpu, n=2, every=0.5)
        assert cpu.busy_since("ann/", clock.utcnow()) is None
    cpu = ProcCpu(options())
    cpu.want("dan/", {"pid": gone.pid}, gone_started)
    reads(cpu, n=2, every=0.2)
    assert cpu.busy_since("dan/", clock.utcnow()) is None
    assert cpu._wanted == {}

    # A tree past the bound: not known, said once.
    with caplog.at_level(logging.WARNING, "jupyter_gpu_gov.hub"):
        original = proc_cpu.MAX_TREE
        proc_cpu.MAX_TREE = 1
        try:
            cpu = ProcCpu(options())
            cpu.want("ann/", {"pid": busy.pid}, started)
            reads(cpu, n=3, every=0.3)
        finally:
            proc_cpu.MAX_TREE = original
    assert cpu.busy_since("ann/", clock.utcnow()) is None
    said = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 1, said


def test_only_the_hubs_records_name_the_process():
    """LocalProcessSpawner's ``pid``; a pod's state, or a pid that is no pid, names none."""
    assert spawner_pid({"pid": 4242}) == 4242
    for state in (
        None,
        {},
        {"pid": "4242"},
        {"pid": True},
        {"pid": 1},
        {"pid": -5},
        {"pid": 1 << 40},
        {"pid": 4242, "pod_name": "jupyter-ann"},
        ["pid", 4242],
    ):
        assert spawner_pid(state) is None, state
    assert same_host("http://127.0.0.1:8081/hub/api")
    assert same_host("http://localhost:8081/hub/api")
    assert same_host("https://[::1]:8081/hub/api")
    assert not same_host("http://hub.example.org:8081/hub/api")
    assert not same_host("http://10.0.0.3:8081/hub/api")
    assert not same_host("http://[::1:8081/hub/api")
