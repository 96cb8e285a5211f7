"""A CPU stage of a server that sends no report, seen by a source its user cannot forge: its
container's CPU as the kubelet measures it (cAdvisor, read through metrics-server), or on a
workstation the server's process tree as the kernel accounts it.

DCGM sees the card, not the kernels: for a server without the extension the policy assumes a
cell may run and holds an idle cull for ``busy_grace`` (``policy.dcgm_only``), then culls it
whether or not one runs. A CPU stage (tokenising, features, a join: one to eight cores for
hours, the GPU idle and its context held) burns CPU that the container's accounting shows. A
reading busy for ``sustained`` is treated as a reported running cell (``GpuSignal``'s
``cpu_busy_since``): a notice past ``busy_grace``, then the busy limit's warning and cull.

Why 0.5 of a core: an idle server and kernel read 0.001-0.01 of a core (heartbeats, ZMQ
polling, the server's own timers; ``policy.QUIET_CORES`` is 0.02), a tab open polling the API
a few hundredths; a Python thread that computes reads 0.8-1.0, and a stage that fans out
more. Half a core is 25 times the noise and half the least a computing stage reads. A stage
that waits on a download or a disk (a few hundredths to half a core) stays under it, and is
decided as today. Why 10 minutes: a person's burst (an import, a save, a small cell) lasts
seconds to a minute or two; the stages that were killed last 1-5 hours. A reading the
governor cannot take, or one gone stale, changes nothing: the server is decided on DCGM alone,
as before (unknown is never busy, nor idle).

What a user can buy by burning CPU: what an extension's "executing" buys, a hold to
``busy_limit`` from the GPU's idle start, then the warning and the cull (docs/security.md).

Pure: readings and times in, ``CpuRun`` out; the hub (hub/pod_cpu.py) and the replay
(replay/engine.py) both fold their readings through ``fold`` and ask ``busy_since``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

# A container at or above this many cores is computing (see above).
CPU_STAGE_CORES = 0.5
# ... for at least this long, reading after reading, before it counts as a stage.
CPU_STAGE_AFTER = timedelta(minutes=10)
# What the owner and the dashboard read of such a server.
CPU_STAGE_WORDS = "the server's CPU is busy while its GPU idles (a CPU stage?)"


@dataclass(frozen=True, slots=True)
class CpuRun:
    """A server's trusted CPU readings, folded: when its latest run of busy readings began
    (None: the last reading was not busy) and when the last reading was taken."""

    since: datetime | None
    last: datetime


def fold(
    run: CpuRun | None,
    at: datetime,
    cores: float | None,
    *,
    threshold: float = CPU_STAGE_CORES,
    gap: timedelta | None = None,
) -> CpuRun | None:
    """``run`` with one more reading, of ``cores`` at ``at``. An unknown reading (None) ends
    what is known (None); readings more than ``gap`` apart (None: the caller's readings are
    consecutive) do not make one run: what happened between them is not known."""
    if cores is None:
        return None
    if run is not None and at < run.last:
        return run  # an older reading than one already folded (a source that went back)
    if cores < threshold:
        return CpuRun(None, at)
    if run is None or run.since is None or (gap is not None and at - run.last > gap):
        return CpuRun(at, at)
    return CpuRun(run.since, at)


def busy_since(
    run: CpuRun | None,
    now: datetime,
    *,
    after: timedelta = CPU_STAGE_AFTER,
    max_age: timedelta | None = None,
) -> datetime | None:
    """Since when the server's CPU has been busy, once it has been for ``after`` and its last
    reading is no older than ``max_age`` (None: not checked); else None (not known to be)."""
    if run is None or run.since is None:
        return None
    if max_age is not None and now - run.last > max_age:
        return None
    if run.last - run.since < after:
        return None
    return run.since
