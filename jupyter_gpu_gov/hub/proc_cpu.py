"""The CPU of a workstation's servers as the kernel accounts it: ``utime + stime`` of the server's
process and its descendants (``/proc/<pid>/stat``), read once a pass. A server that sends no
report and whose process tree stays busy while DCGM reads its GPU idle is in a CPU stage
(``core.cpu_stage``), as a pod is on Kubernetes (hub/pod_cpu.py).

Which process is a server's comes from the Hub's records alone: the ``pid`` LocalProcessSpawner
keeps in its state (``get_state()``, read with ``admin:server_state``), the process it started;
never from a report. A pid the kernel gave again to another process is caught by its start
time: the server's process starts after the Hub's ``started`` of the server (the Hub sets it
before ``spawner.start``), within ``SPAWN_WINDOW``, and keeps the start time it was first seen
with. The tree walk is bounded (``MAX_TREE`` processes); a tree past it, a pid gone or reused,
an unreadable ``/proc``: not known, the server decided on DCGM alone as before (logged once).

Read only where the servers' processes are this host's: the governor reaches the Hub on a
loopback address (``same_host``, decided in hub/app.py), as a Hub-managed service on a
workstation does, and the server's state names a pid and no pod (LocalProcessSpawner's).
What a process tree burns while a child that exited is not counted is less, never more: an
undercount leaves a server decided as before.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

from ..core import cpu_stage
from ..gpu import procs

log = logging.getLogger("jupyter_gpu_gov.hub")

MAX_TREE = 4096  # processes of one server's tree, at most
MAX_SERVERS = 1024  # servers read a pass, at most
SPAWN_WINDOW = timedelta(minutes=15)  # the server's process starts this soon after ``started``
CLOCK_SLACK = timedelta(seconds=2)  # the boot time's second, the Hub's clock
_reader = ThreadPoolExecutor(1, thread_name_prefix="gpu-gov-proc-cpu")  # not the loop's default


@dataclass(frozen=True)
class ProcCpuOptions:
    """What ``ProcCpu`` reads, and what a CPU stage is (``core.cpu_stage``)."""

    same_host: bool = True  # the servers' processes are this host's (the default Hub URL is)
    cores: float = cpu_stage.CPU_STAGE_CORES  # 0: off
    after: timedelta = cpu_stage.CPU_STAGE_AFTER
    max_age: timedelta = timedelta(minutes=3)  # a reading older is stale; further apart, no run
    proc_root: str = "/proc"


@dataclass(frozen=True)
class _Seen:
    pid: int
    start: datetime  # the process's start time when first seen
    at: datetime
    ticks: int  # utime + stime of the tree


def same_host(hub_api_url: str) -> bool:
    """Whether the governor reaches the Hub on a loopback address: it runs on the Hub's host,
    where LocalProcessSpawner starts every server (a Hub-managed service on a workstation)."""
    try:
        host = urlsplit(hub_api_url).hostname or ""
    except ValueError:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def spawner_pid(state: Mapping[str, Any] | None) -> int | None:
    """LocalProcessSpawner's ``pid`` in the Hub's records; None for a pod or anything else."""
    if not isinstance(state, Mapping) or "pod_name" in state:
        return None
    pid = state.get("pid")
    return pid if type(pid) is int and 1 < pid < 1 << 22 else None


def boot_time(proc_root: str = "/proc") -> datetime | None:
    try:
        with open(f"{proc_root}/stat", "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return datetime.fromtimestamp(int(line.split()[1]), timezone.utc)
    except (OSError, ValueError, IndexError):
        return None
    return None


def start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """Field 22 of ``/proc/<pid>/stat``: when the process started, in ticks after boot."""
    raw = procs._read(f"{proc_root}/{pid}/stat")
    fields = raw.rpartition(b")")[2].split() if raw else []
    try:
        return int(fields[19])
    except (ValueError, IndexError):
        return None


class ProcCpu:
    """Each workstation server's folded CPU readings (``core.cpu_stage.CpuRun``), by key."""

    def __init__(self, options: ProcCpuOptions):
        self.options = options
        self.enabled = options.same_host and options.cores > 0
        self._wanted: dict[str, tuple[int, datetime]] = {}  # key -> (pid, Hub's started)
        self._seen: dict[str, _Seen] = {}
        self._runs: dict[str, cpu_stage.CpuRun] = {}
        self._stages: dict[str, datetime] = {}  # as of the last ``changed``
        self._said = False

    def want(self, key: str, state: Mapping[str, Any] | None, started: datetime | None) -> None:
        """A server the Hub's records give a process (its pid, its ``started``): read from the
        next pass."""
        pid = spawner_pid(state) if self.enabled else None
        if pid is not None and started is not None and len(self._wanted) < MAX_SERVERS:
            self._wanted[key] = (pid, started)

    def busy_since(self, key: str, now: datetime) -> datetime | None:
        if not self.enabled:
            return None
        return cpu_stage.busy_since(
            self._runs.get(key), now, after=self.options.after, max_age=self.options.max_age
        )

    def changed(self, now: datetime) -> set[str]:
        """The servers whose CPU stage began, ended or moved since the last call."""
        stages = {k: s for k in self._runs if (s := self.busy_since(k, now)) is not None}
        last, self._stages = self._stages, stages
        return {k for k in stages.keys() | last.keys() if stages.get(k) != last.get(k)}

    async def read(self, now: datetime) -> None:
        """One scan of ``/proc`` (in a thread), each wanted server's tree folded into its run;
        a server whose process is gone or not the Hub's is forgotten until wanted again."""
        if not self.enabled or not self._wanted:
            self._runs.clear()
            return
        wanted = dict(self._wanted)
        try:
            cores = await asyncio.get_running_loop().run_in_executor(
                _reader, self._read, wanted, now
            )
        except Exception as error:  # unreadable: every server decided on DCGM alone
            cores = dict.fromkeys(wanted)
            self._say(f"{type(error).__name__}: {error}")
        for key, reading in cores.items():
            self._runs[key] = cpu_stage.fold(
                self._runs.get(key),
                now,
                reading,
                threshold=self.options.cores,
                gap=self.options.max_age,
            )
            if self._runs[key] is None:
                del self._runs[key]
            if key not in self._seen and self._wanted.get(key) == wanted[key]:
                del self._wanted[key]  # gone, or not the Hub's: until the records say again
        for key in [k for k in self._runs if k not in wanted]:
            del self._runs[key]

    def _read(self, wanted: dict[str, tuple[int, datetime]], now: datetime) -> dict:
        root = self.options.proc_root
        booted = boot_time(root)
        if booted is None:
            raise OSError(f"{root}/stat has no btime")
        table = procs.scan(root)
        found: dict[str, float | None] = {}
        for key, (pid, started) in wanted.items():
            found[key] = self._cores(key, pid, started, booted, table, now)
        for key in [k for k in self._seen if k not in wanted]:
            del self._seen[key]
        return found

    def _cores(self, key, pid, started, booted, table, now) -> float | None:
        ticks = start_ticks(pid, self.options.proc_root)
        if ticks is None or pid not in table:
            self._seen.pop(key, None)
            return None  # gone
        start = booted + timedelta(seconds=ticks / procs.CLOCK_TICKS)
        if not started - CLOCK_SLACK <= start <= started + SPAWN_WINDOW:
            self._seen.pop(key, None)
            return None  # not the process the Hub started (a pid used again)
        tree = table.descendants(pid)
        if len(tree) > MAX_TREE:
            self._seen.pop(key, None)
            self._say(f"{key}'s process tree is over {MAX_TREE} processes")
            return None
        total = sum(table.procs[p].cpu_ticks for p in tree)
        last = self._seen.get(key)
        self._seen[key] = _Seen(pid, start, now, total)
        if last is None or last.pid != pid or abs(last.start - start) > CLOCK_SLACK:
            return None  # a first reading (or a new process): no rate yet
        seconds = (now - last.at).total_seconds()
        if seconds <= 0:
            return None
        # A child that exited takes its ticks with it: a drop reads as none, never negative.
        return max(total - last.ticks, 0) / procs.CLOCK_TICKS / seconds

    def _say(self, why: str) -> None:
        if not self._said:  # once: a workstation that cannot be read says so, then is quiet
            self._said = True
            log.warning(
                "gpu-gov: the servers' CPU (/proc) cannot be read (%s): CPU stages of servers "
                "without the extension are not seen where this happens; they are decided on "
                "DCGM alone (a cull waits busy_grace)",
                why[:200],
            )
