"""What holds the event loop while reports arrive and a pass runs, in one process, on this
thread's CPU (``time.thread_time``: other work on a loaded machine does not count).

    python -m benchmarks.ingest_pass [--servers 10000] [--minutes 2] [--mix idle-repeat]
        [--tree PATH] [--young-sizes]

The service as ``benchmarks.ingest_steps`` builds it (``GpuGovernor.make_governor`` against
the fake Hub in this process, its start-up pass done, then ``heap.start()`` as the service
calls it), in real time: N servers' reports every 60 s, evenly spaced, each in a callback of
its own through what the report route (``routes.report_route``) runs (``json.loads``,
``validate``, ``Governor.ingest``, ``json.dumps``; the HTTP side of a request is not here:
``benchmarks.ingest`` measures it), and a pass every 60 s (``Governor.reconcile`` on
``clock.every``, as the service's timer, mid-minute). The first minute (every server's first report) is
not measured; then ``--minutes``. Printed:

- ``late_*``: how late each report's callback ran after it was due (wall clock): what the loop
  made it wait, p50 / p99 / max;
- ``report_cpu_ms``: CPU a report, the collections it set off included;
- ``held_*``: the loop's callbacks of ``HELD_MS`` of CPU or more, by what they were: a report,
  the pass by where each of its steps stopped (the ``await`` it ended at: a slice of deciding
  ends at its ``sleep(0)``, a write at ``write_async``), and of that CPU the collections';
- ``gc<g>_<phase>``: the garbage collections of each generation while a pass runs and between
  passes: per minute, their CPU per minute, the longest (with ``--young-sizes``, the objects
  the generations it scanned held at its start: ``gc.get_objects``, which slows them);
- ``steps_max``: the pass's named synchronous steps (``ingest_probe.STEPS``), the longest of
  each (wall clock; ``(off-loop)``: in the store's writer thread);
- ``objects_gen*``: the objects each generation tracks at the end.

``--tree``: the governor's code from that tree (a baseline's ``git worktree``), this
benchmark's from here.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MINUTE_S = 60.0
HELD_MS = 5.0
GENERATIONS = (0, 1, 2)


class Collections:
    """Every collection: the phase, generation, CPU ms (and, with ``sizes``, the objects the
    generations it scanned held at its start)."""

    def __init__(self, sizes: bool = False) -> None:
        self.phase = "unmeasured"
        self.events: list[tuple[str, int, float, int]] = []
        self.sizes = sizes
        self._started = 0.0
        self._scanned = 0
        self.in_callback = 0.0  # CPU ms of collections since the loop's callback began

    def __call__(self, stage: str, info: dict) -> None:
        if stage == "start":
            if self.sizes:
                gen = info["generation"]
                self._scanned = sum(len(gc.get_objects(g)) for g in range(gen + 1))
            self._started = time.thread_time()
        else:
            ms = 1000 * (time.thread_time() - self._started)
            self.in_callback += ms
            self.events.append((self.phase, info["generation"], ms, self._scanned))


def _where(handle: asyncio.Handle) -> str:
    """What a callback was: a task's step by where it stopped (the innermost of our coroutines
    it awaits now, its function and line), else the callback's name."""
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if not isinstance(task, asyncio.Task):
        return getattr(callback, "__qualname__", repr(callback))[:80]
    coro, where = task.get_coro(), None
    if task.done():
        return f"{getattr(coro, '__qualname__', type(coro).__name__)} (ended)"
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None and f"{os.sep}asyncio{os.sep}" not in frame.f_code.co_filename:
            where = f"{frame.f_code.co_qualname}:{frame.f_lineno}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return where or "?"


class Holds:
    """Every loop callback's CPU while measuring: what it was, CPU ms, of it collections."""

    def __init__(self, collections: Collections) -> None:
        self.on = False
        self.ms: list[tuple[str, float, float]] = []
        self._collections = collections
        self._run = asyncio.events.Handle._run

    def install(self) -> None:
        run, holds = self._run, self

        def timed(handle: asyncio.Handle) -> None:
            holds._collections.in_callback = 0.0
            started = time.thread_time()
            run(handle)
            if holds.on:
                ms = 1000 * (time.thread_time() - started)
                if ms >= HELD_MS:
                    holds.ms.append((_where(handle), ms, holds._collections.in_callback))

        asyncio.events.Handle._run = timed

    def uninstall(self) -> None:
        asyncio.events.Handle._run = self._run


async def _governor(workdir: str, servers: int):
    sys.path.insert(0, str(REPO / "tests"))
    from fake_hub_api import FakeHub

    from jupyter_gpu_gov.hub.app import GpuGovernor

    hub = FakeHub(service_name="gpu-gov")
    users = hub.populate(servers)
    hub.start()
    os.environ.update(
        JUPYTERHUB_API_URL=hub.api_url,
        JUPYTERHUB_API_TOKEN=hub.token,
        JUPYTERHUB_SERVICE_NAME="gpu-gov",
        JUPYTERHUB_SERVICE_PREFIX="/services/gpu-gov/",
    )
    app = GpuGovernor()
    ten_years = str(10 * 365 * 86400)
    app.initialize([f"--db-url=sqlite:///{workdir}/gov.sqlite", f"--timeout={ten_years}"])
    gov = app.make_governor()
    await gov.reconcile()  # the service's start-up pass
    return app, hub, gov, users


async def _run(servers: int, minutes: int, idle_repeat: bool, sizes: bool, trim: bool) -> dict:
    from jupyter_gpu_gov.core import clock
    from jupyter_gpu_gov.core.report import validate
    from jupyter_gpu_gov.hub import heap

    from .ingest_load import RUN_STARTED, encode, report_for
    from .ingest_probe import _time_steps

    collections = Collections(sizes)
    holds = Holds(collections)
    late: list[float] = []
    report_cpu: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-ingest-pass-") as workdir:
        app, hub, gov, users = await _governor(workdir, servers)
        idle_as_of = clock.utcnow() if idle_repeat else None
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.1
        interval = MINUTE_S / servers

        async def a_pass() -> None:
            collections.phase = "pass"
            await app._reconcile()
            collections.phase = "reports" if holds.on else "unmeasured"

        trims: list[tuple[float, float, float]] = []  # CPU ms, resident MB before, after
        if hasattr(heap, "after_pass"):
            after_pass = heap.after_pass

            def timed_after_pass() -> None:
                rss, began = _rss_mb(), time.thread_time()
                if trim:
                    after_pass()
                trims.append((1000 * (time.thread_time() - began), rss, _rss_mb()))

            heap.after_pass = timed_after_pass
        steps = _Steps(holds)
        _time_steps(steps)
        gc.callbacks.append(collections)
        timers = [heap.start()]
        app.governor = gov
        app.queue = _NoQueue()

        async def passes() -> None:  # mid-minute, every minute
            await asyncio.sleep(start + MINUTE_S / 2 - loop.time())
            await clock.every(MINUTE_S, a_pass)

        timers.append(asyncio.ensure_future(passes()))
        holds.install()
        try:
            for k in range((minutes + 1) * servers):
                if k == servers:  # the first minute's reports done: measure from here
                    holds.on = True
                    if collections.phase == "unmeasured":
                        collections.phase = "reports"
                index = k % servers
                body = encode(
                    report_for(users[index], index, clock.utcnow(), idle_as_of, RUN_STARTED)
                )
                delay = start + k * interval - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)  # a callback of its own, as a request's
                began = time.thread_time()
                json.dumps({"verdict": gov.ingest(validate(json.loads(body)))})
                if holds.on:
                    report_cpu.append(1000 * (time.thread_time() - began))
                    late.append(1000 * (loop.time() - (start + k * interval)))
        finally:
            holds.on = False
            holds.uninstall()
            gc.callbacks.remove(collections)
            for timer in timers[1:]:
                timer.cancel()
            heap.stop(timers[0])
            if hasattr(heap, "after_pass"):
                heap.after_pass = after_pass
            await gov.close()
            hub.stop()
    out = _figures(servers, minutes, late, report_cpu, holds, collections, sizes)
    out["steps_max"] = steps.summary()
    out["rss_mb_after_passes"] = ",".join(f"{t[1]:.0f}>{t[2]:.0f}" for t in trims) or None
    out["after_pass_ms"] = ",".join(f"{t[0]:.1f}" for t in trims) or None
    out["rss_mb_end"] = round(_rss_mb(), 1)
    return out


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Steps:
    """The pass's named steps (``ingest_probe.STEPS``, timed in wall-clock ms by the probe's
    wrappers) while measuring: the longest of each."""

    def __init__(self, holds: Holds) -> None:
        self._holds = holds
        self.longest: dict[str, float] = {}

    def write(self, line: str) -> None:
        if self._holds.on:
            step = json.loads(line)
            name = step["what"].removeprefix("step ")
            self.longest[name] = max(self.longest.get(name, 0.0), step["ms"])

    def summary(self) -> str:
        ordered = sorted(self.longest.items(), key=lambda kv: -kv[1])
        return ",".join(f"{name}:max{ms:.0f}ms" for name, ms in ordered)


class _NoQueue:
    async def sync(self) -> None:  # (no spawn queue in this benchmark)
        return None


def _figures(servers, minutes, late, report_cpu, holds, collections, sizes) -> dict:
    out: dict[str, Any] = {"servers": servers, "minutes": minutes}
    late.sort()
    for q in (0.5, 0.99):
        out[f"late_p{round(100 * q)}_ms"] = round(late[min(len(late) - 1, int(q * len(late)))], 1)
    out["late_max_ms"] = round(late[-1], 1)
    out["report_cpu_ms"] = round(statistics.mean(report_cpu), 4)
    by_what: dict[str, list[float]] = defaultdict(list)
    gc_ms = 0.0
    for what, ms, in_gc in holds.ms:
        by_what[what].append(ms)
        gc_ms += in_gc
    out[f"held_{HELD_MS:.0f}ms"] = (
        f"{len(holds.ms) / minutes:.0f}/min,{sum(m[1] for m in holds.ms) / minutes:.0f}ms/min,"
        f"of_it_gc{gc_ms / minutes:.0f}ms/min"
    )
    for threshold in (20, 50):
        out[f"held_over_{threshold}ms_per_min"] = round(
            sum(1 for m in holds.ms if m[1] >= threshold) / minutes, 1
        )
    top = sorted(by_what.items(), key=lambda kv: -sum(kv[1]))[:5]
    out["held_by_what"] = "; ".join(f"{w}:{len(v)}x,{sum(v):.0f}ms,max{max(v):.0f}" for w, v in top)
    for phase in ("reports", "pass"):
        for gen in GENERATIONS:
            events = [e for e in collections.events if e[0] == phase and e[1] == gen]
            if not events:
                continue
            ms = [e[2] for e in events]
            out[f"gc{gen}_{phase}"] = (
                f"{len(ms) / minutes:.0f}/min,{sum(ms) / minutes:.0f}ms/min,max{max(ms):.1f}ms"
            )
            if sizes:
                scanned = sorted(e[3] for e in events)
                out[f"gc{gen}_{phase}_objects"] = (
                    f"median{scanned[len(scanned) // 2]},max{scanned[-1]}"
                )
    gc.collect(1)
    for gen in GENERATIONS:
        out[f"objects_gen{gen}"] = len(gc.get_objects(gen))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10000)
    parser.add_argument("--minutes", type=int, default=2, help="measured, after a first one")
    parser.add_argument("--mix", choices=("moving", "idle-repeat"), default="idle-repeat")
    parser.add_argument("--tree", default=None, help="the governor's code from this tree")
    parser.add_argument("--young-sizes", action="store_true")
    parser.add_argument("--no-trim", action="store_true", help="``heap.after_pass`` not called")
    args = parser.parse_args(argv)
    if args.tree:
        sys.path.insert(0, os.path.abspath(args.tree))
    import jupyter_gpu_gov

    result = asyncio.run(
        _run(
            args.servers,
            args.minutes,
            args.mix == "idle-repeat",
            args.young_sizes,
            not args.no_trim,
        )
    )
    code = Path(jupyter_gpu_gov.__file__).parent.parent
    print("ingest_pass:", f"code={code}", " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
