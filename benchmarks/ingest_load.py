"""The load side of ``benchmarks.ingest``: servers' reports and a small HTTP client.

Each server connects as the server extension does (``server/reporter.py``'s
``ReportConnection``): a server that reports every 60 s sends each report on a connection of
its own (``Connection: close``); with ``Connections(port, keep=True)``, as a server that reports
more often than the governor's ``REPORT_CONNECTION_IDLE_S``, it keeps one connection, opened at
its first report, reused while the service keeps it, with a one-off connection for a report sent
while the last one is still unanswered. The client is raw asyncio streams so that the load
generator's CPU stays small next to the service's on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from jupyter_gpu_gov.core import clock

SAMPLE_WINDOW_S = 60
# The load generators' servers started once, before the run: every report of a server names
# the same session (``started``), as a real server's do; one moving with ``now`` read as a
# new process at every report.
RUN_STARTED = clock.utcnow() - timedelta(hours=6)


def is_busy(index: int) -> bool:
    """40 % of servers are computing (their kernel busy, the GPU active)."""
    return index % 5 < 2


def report_for(
    user: str,
    index: int,
    now: datetime,
    idle_as_of: datetime | None = None,
    started: datetime | None = None,
) -> dict:
    """A report (docs/api.md, "The report") like a real server's: one or two devices (a whole card or two MIG
    slices), two to four kernels of which one holds the GPU, a terminal on every fourth.

    Its times are relative to ``now`` (``sampled_at``), so each report of the same server
    differs from its last: every report "moves" (the worst case for the governor). With
    ``idle_as_of``, an idle server's other times are relative to that instead (its kernels,
    its user and its GPU went quiet before then and stayed so): its reports repeat the last but
    for ``sampled_at``, as a real idle server's do; busy servers' still move. ``started``: the
    session's start (default 6 h before ``now``; the load generators give ``RUN_STARTED``)."""
    if idle_as_of is not None and not is_busy(index):
        report = report_for(user, index, idle_as_of, started=started)
        report["sampled_at"] = clock.isoformat(now)
        return report
    ns = uuid.NAMESPACE_URL
    mig = index % 2 == 1
    parent = f"GPU-{uuid.uuid5(ns, f'{user}/gpu')}"
    devices = [
        {
            "uuid": f"MIG-{uuid.uuid5(ns, f'{user}/mig{k}')}" if mig else parent,
            "name": "NVIDIA H100 80GB HBM3",
            "mig_profile": "3g.40gb" if mig else None,
            "parent_uuid": parent if mig else None,
            "memory_total_mb": 40192 if mig else 81559,
            "memory_used_mb": 20480 if k == 0 else 0,
            "activity": 0.0,
            "shared": False,
        }
        for k in range(2 if mig else 1)
    ]
    active = is_busy(index)
    idle_since = None if active else now - timedelta(minutes=40 + index % 180)
    iso = clock.isoformat
    if active:
        devices[0]["activity"] = 0.83
    targets = []
    for k in range(2 + index % 3):
        holds = k == 0
        targets.append(
            {
                "kind": "kernel",
                "id": str(uuid.uuid5(ns, f"{user}/kernel{k}")),
                "name": "python3",
                "path": f"work/notebook-{k}.ipynb",
                "execution_state": "busy" if holds and active else "idle",
                "last_activity": iso(now - timedelta(minutes=5 + 7 * k)),
                "busy_since": iso(now - timedelta(minutes=12)) if holds and active else None,
                "connections": 1,
                "gpu": _gpu(holds, active, devices[0]["uuid"], now, idle_since, 4242 + k),
                "cpu": {
                    "cores": 0.97 if holds and active else 0.01,
                    "iowait": 0.0,
                    "read_mb_s": 0.4 if holds and active else 0.0,
                    "seconds": SAMPLE_WINDOW_S,
                },
            }
        )
    if index % 4 == 0:
        targets.append(
            {
                "kind": "terminal",
                "id": "1",
                "name": "terminal 1",
                "last_activity": iso(now - timedelta(minutes=30)),
                "connections": 0,
                "gpu": _gpu(False, False, "", now, None, 0),
                "cpu": {"cores": 0.0, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60},
            }
        )
    return {
        "schema": 1,
        "sampled_at": iso(now),
        "backend": "nvml",
        "error": None,
        "server": {
            "user": user,
            "name": "",
            "started": iso(started or now - timedelta(hours=6)),
            "last_activity": iso(now - timedelta(minutes=5)),
            "pod": f"jupyter-{user}",
            "namespace": "jhub",
            "gpu_allocated": True,
        },
        "devices": devices,
        "targets": targets,
        "window": {
            "seconds": SAMPLE_WINDOW_S,
            "gpu_active_fraction": 0.9 if active else 0.0,
            "gpu_last_active": iso(now if active else idle_since),
            "gpu_idle_since": iso(idle_since),
        },
        "checkpoint": {"requested_at": None, "status": None, "manifest": None},
    }


def _gpu(
    holds: bool, active: bool, device: str, now: datetime, idle_since: datetime | None, pid: int
) -> dict:
    """A target's ``gpu`` section as the sampler writes it (a sample every 5 s, 60 s window)."""
    if not holds:
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
    sm = 0.83 if active else 0.0
    return {
        "devices": [device],
        "memory_mb": 20480,
        "sm": sm,
        "holds_context": True,
        "confidence": "exact",
        "last_active": clock.isoformat(now if active else idle_since),
        "idle_since": clock.isoformat(idle_since),
        "active_fraction": 1.0 if active else 0.0,
        "pids": [pid],
        "history": [sm] * 12,
    }


def encode(report: dict) -> bytes:
    return json.dumps(report, separators=(",", ":")).encode()


@dataclass
class Sent:
    status: int
    seconds: float  # from when it was due (steady) or sent (burst) to the whole answer
    verdict: bool  # the answer carries a verdict
    # From when it was sent (connect) to the whole answer: without the sender's own lateness,
    # which ``seconds`` counts when the load generator is starved of CPU.
    round_trip: float = 0.0


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Connections:
    """Every server's connection to the service (``keep``), or none kept."""

    def __init__(self, port: int, keep: bool = False):
        self.port = port
        self.keep = keep
        self.idle: dict[str, Stream] = {}  # server -> its connection, between two reports

    def drop_all(self) -> None:
        """What a restart of the service does to the kept connections."""
        for _, writer in self.idle.values():
            writer.close()
        self.idle.clear()

    async def post(
        self, user: str, path: str, token: str, body: bytes, due: float | None = None
    ) -> Sent:
        """One report of ``user``'s; the latency counts from ``due`` when the sender was late
        (no coordinated omission at the steady rate)."""
        sent = time.perf_counter()
        started = sent if due is None else due
        close = "" if self.keep else "Connection: close\r\n"
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: token {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{close}\r\n"
        ).encode()
        kept = self.idle.pop(user, None)  # taken while in use: another report opens its own
        answer, stream = await self._exchange(kept, head + body)
        if not answer and kept is not None:  # closed by the service meanwhile: once more
            answer, stream = await self._exchange(None, head + body)
        answered = time.perf_counter()
        if stream is not None:
            if self.keep and answer and user not in self.idle:
                self.idle[user] = stream
            else:
                stream[1].close()
        status = int(answer.split(b" ", 2)[1]) if answer else 0
        return Sent(status, answered - started, b'"verdict"' in answer, answered - sent)

    async def _exchange(self, stream: Stream | None, request: bytes) -> tuple[bytes, Stream | None]:
        try:
            if stream is None:
                stream = await asyncio.open_connection("127.0.0.1", self.port)
            reader, writer = stream
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            return head + await reader.readexactly(length), stream
        except (OSError, asyncio.IncompleteReadError):
            # Refused or reset (a listen queue that overflowed), or closed: a failed report.
            if stream is not None:
                stream[1].close()
            return b"", None
