"""Where the service's CPU goes while ``benchmarks.ingest --profile`` measures its steady phase:
the service as ``python -m jupyter_gpu_gov.hub`` runs it, sampled by CPU time, not wall time.

SIGUSR1 starts the sampling, SIGUSR2 stops it and writes the samples to ``$BENCH_INGEST_PROFILE``
(a pickle: the process's user and system CPU seconds over the sampling, and each Python stack
with how often it was sampled). The kernel's ``ITIMER_PROF`` signals every ``EVERY_S`` of the
process's CPU (at most once a tick: 4 ms at ``HZ=250``); the handler runs in the main thread at
its next bytecode, so a sample is what the event loop's thread was doing when that CPU was
spent. A sampler that counts wall time (py-spy's default) also counts a thread waiting for a
core, or blocked in a system call that woke another process: on two shared cores it read
uvloop and the kernel as two thirds of a report (docs/benchmarks-history.md, "Issue 26, wave
28"); by CPU they are about a quarter ("Issue 26, wave 35").

What a sample cannot see: C code has no Python frame, so time in uvloop's loop and in the
kernel before a callback (an ``accept``, an ``epoll_wait``'s return, a ``read``) lands on that
callback's first frame (the protocol's factory, ``data_received``); a system call made from
Python (the answer's ``write``, the ``close``) lands on its caller. ``PARTS`` names each part
by the frames that mark it; a sample goes to the first part, in that order, with a marking
frame anywhere in its stack.
"""

from __future__ import annotations

import collections
import os
import pickle
import signal
import sys
from pathlib import Path

PROFILE_ENV = "BENCH_INGEST_PROFILE"
EVERY_S = 0.0005

# (part, the frames that mark it: "<folder>/<file>:<function>", or "<folder>/<file>:" for any
# function of that file), first match wins, in this order.
PARTS = (
    (
        "hub_check",  # the Hub asked who a token is: HubAuth, JupyterHub's client, aiohttp
        (
            "hub/prepared_auth.py:asked_token_caller",
            "services/auth.py:",
            "jupyterhub/httpclient.py:",
            "aiohttp/",
        ),
    ),
    ("gc_clock", ("hub/heap.py:",)),  # the collector on the service's clock
    ("diagnosis", ("hub/diagnosis.py:observe",)),
    ("compact_report", ("hub/ingest.py:compact_report",)),
    ("answer", ("hub/views.py:answer",)),  # the verdict's bytes (kept, or made anew)
    ("validate", ("core/report.py:validate",)),
    ("decode", ("hub/api_handler.py:json_object",)),
    ("token_cached", ("hub/prepared_auth.py:token_caller",)),
    ("ingest_rest", ("hub/ingest.py:",)),  # Governor.ingest but the parts above
    ("route_rest", ("hub/routes.py:",)),  # the budget, the owner, the counters
    # the connection, its head, the answer's write and the close, with uvloop's and the
    # kernel's time before each callback
    ("http", ("hub/protocol_server.py:",)),
    ("loop", ("",)),  # the rest: uvloop's transports (a WeakValueDictionary), asyncio's futures
)


def install(path: str) -> None:
    samples: collections.Counter = collections.Counter()
    started: list[os.times_result] = []

    def sample(signum: int, frame) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append((code.co_filename, code.co_name))
            frame = frame.f_back
        samples[tuple(stack)] += 1

    def start(*_: object) -> None:
        samples.clear()
        started[:] = [os.times()]
        signal.signal(signal.SIGPROF, sample)
        signal.setitimer(signal.ITIMER_PROF, EVERY_S, EVERY_S)

    def stop(*_: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        ended = os.times()
        user = ended.user - started[0].user if started else 0.0
        system = ended.system - started[0].system if started else 0.0
        written = Path(f"{path}.part")
        written.write_bytes(pickle.dumps({"user_s": user, "system_s": system, "samples": samples}))
        written.replace(path)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


def _where(filename: str, function: str) -> str:
    folder, _, name = filename.replace(os.sep, "/").rpartition("/")
    return f"{folder.rpartition('/')[2]}/{name}:{function}"


def part_of(stack: tuple[tuple[str, str], ...]) -> str:
    where = [_where(*frame) for frame in stack]
    for part, marks in PARTS:
        if any(w.startswith(m) for w in where for m in marks):
            return part
    return PARTS[-1][0]


def breakdown(path: Path, reports: int, cpu_ms_per_report: float) -> dict:
    """The sampled phase's user and system CPU a report, and each part's share of the samples
    as µs a report (of ``cpu_ms_per_report``, the benchmark's own figure)."""
    profile = pickle.loads(path.read_bytes())
    by_part: collections.Counter = collections.Counter()
    for stack, count in profile["samples"].items():
        by_part[part_of(stack)] += count
    total = sum(by_part.values())
    out = {
        "profile_samples": total,
        "profile_user_ms_per_report": round(1000 * profile["user_s"] / reports, 3),
        "profile_system_ms_per_report": round(1000 * profile["system_s"] / reports, 3),
    }
    for part, _ in PARTS:
        share = by_part[part] / total if total else 0.0
        out[f"profile_{part}_us"] = round(1000 * cpu_ms_per_report * share, 1)
    return out


def main() -> None:
    install(os.environ[PROFILE_ENV])
    from jupyter_gpu_gov.hub.app import main as service

    sys.argv = ["jupyter_gpu_gov.hub", *sys.argv[1:]]
    service()


if __name__ == "__main__":
    main()
