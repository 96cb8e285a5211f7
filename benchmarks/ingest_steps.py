"""Where a report's CPU goes in the governor's own code, step by step, in one process.

    python -m benchmarks.ingest_steps [--servers 2000] [--rounds 5] [--repeats 3] [--mix idle-repeat]

The service as ``python -m jupyter_gpu_gov.hub`` builds it (``GpuGovernor.make_governor``, the
same arguments as ``benchmarks.ingest``), against the fake Hub in this process, its start-up
pass done; then ``--rounds`` rounds, each after a pass (untimed, as the service runs one a
minute), in which every server sends ``benchmarks.ingest_load``'s
report, a minute after the last on the governor's clock, through what the report route
(``hub/routes.py``, ``report_route``) runs: the body decoded (``json_object``: orjson where
installed, else ``json.loads``, and the scan for lone surrogates), ``validate``,
``Governor.ingest`` and the answer encoded (``json.dumps``). Each step's CPU
(``time.thread_time``: this thread's only, so other work on the machine does not count) per report, the median over the rounds after the first
(which fills the diagnosis's context); ``--repeats`` times, each a fresh governor. A second
set of rounds times the parts of ``Governor.ingest`` (each wrapped; the wrappers' own cost
counts in ``ingest`` there, not in the first set's). The HTTP server's side of a request (the
connection, the head, the answer) is not here: ``benchmarks.ingest`` measures the
whole over HTTP.

``--mix``: what the servers send, as ``benchmarks.ingest``'s (``moving``: every report moved
from the last; ``idle-repeat``: idle servers repeat theirs but for ``sampled_at``). The passes
between rounds are timed too (``pass_*``: this thread's CPU a pass, the servers it decided
anew, and the pass per report, a pass a minute), from the third on (the first two see the
servers' first reports); the collector runs as the service runs it (``hub.heap.start``: no
full collection in a pass; a round's objects collected at its end, in its ``gc``, as the
service's clock collects them between passes). The store's writer thread is not counted.
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
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .ingest import IDLE_REPEAT, MOVING
from .ingest_load import RUN_STARTED, encode, report_for

REPO = Path(__file__).resolve().parent.parent
ROUND_S = 60.0  # a server reports every minute
TOTALS = ("json_object", "validate", "ingest", "json.dumps", "gc")
# Parts of ``Governor.ingest`` (the governor's attribute, or the ingest module's name).
PARTS = (
    ("compact_report", "module"),
    ("_Use.add", "class"),
    ("_evidence", "governor"),
    ("observe", "diagnosis"),
    ("reported_checkpoint", "module"),
    ("_note_report", "governor"),
    ("verdict", "governor"),
)


class Clock:
    """CPU nanoseconds per step name, per round; ``gc``: the garbage collections within them
    (counted in the step that set them off, too) and the round's own at its end."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self._gc_started = 0

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.thread_time_ns()
        else:
            self.ns["gc"] += time.thread_time_ns() - self._gc_started

    def wrap(self, name: str, fn: Callable) -> Callable:
        ns, now = self.ns, time.thread_time_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = now()
            try:
                return fn(*args, **kwargs)
            finally:
                ns[name] += now() - started

        return timed


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
    return hub, gov, users


def _round(gov, bodies: list[bytes], clock: Clock) -> Counter:
    """Every body through the handler's steps; the verdicts' states."""
    from jupyter_gpu_gov.core.report import validate
    from jupyter_gpu_gov.hub.api_handler import json_object

    loads = clock.wrap("json_object", json_object)
    check = clock.wrap("validate", validate)
    ingest = clock.wrap("ingest", gov.ingest)
    dumps = clock.wrap("json.dumps", json.dumps)
    states: Counter = Counter()
    gc.callbacks.append(clock.on_gc)
    try:
        for body in bodies:
            verdict = ingest(check(loads(body)))
            dumps({"verdict": verdict})
            states[verdict["state"]] += 1
        # What the service's collections on the clock (``hub.heap``) scan over the minute, each
        # object once young, once middle-aged: a report frees about what it makes, so CPython's
        # own count seldom starts one here and the next pass's first collections scanned the
        # whole round (~300 ms of a 10,000-server idle-repeat pass; docs/benchmarks-history.md,
        # "Issue 26, wave 23").
        gc.collect(0)
        gc.collect(1)
    finally:
        gc.callbacks.remove(clock.on_gc)
    return states


def _wrap_parts(gov, clock: Clock) -> Callable[[], None]:
    """Time ``Governor.ingest``'s parts; returns what undoes it."""
    from jupyter_gpu_gov.hub import ingest as module
    from jupyter_gpu_gov.hub import usage

    undo = []
    for name, where in PARTS:
        if where == "module":
            fn = getattr(module, name)
            setattr(module, name, clock.wrap(name, fn))
            undo.append(lambda n=name, f=fn: setattr(module, n, f))
        elif where == "class":
            fn = usage._Use.add
            usage._Use.add = clock.wrap(name, fn)
            undo.append(lambda f=fn: setattr(usage._Use, "add", f))
        else:
            owner = gov.diagnosis if where == "diagnosis" else gov
            setattr(owner, name, clock.wrap(name, getattr(owner, name)))
            undo.append(lambda o=owner, n=name: delattr(o, n))
    return lambda: [u() for u in undo]


async def _pass(gov, passes: dict[str, list[float]], timed: bool) -> None:
    """A pass, as the service runs one a minute; timed: its CPU and the servers it decided."""
    govern, decided = gov._govern, 0

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal decided
        decided += 1
        return govern(*args, **kwargs)

    gov._govern = counted
    started = time.thread_time()
    try:
        await gov.reconcile()
    finally:
        del gov._govern
    if timed:
        passes["pass_ms"].append((time.thread_time() - started) * 1000)
        passes["pass_decided"].append(decided)


async def _repeat(
    servers: int, rounds: int, mix: str = MOVING
) -> tuple[dict[str, float], dict[str, float], Counter, dict[str, float]]:
    from jupyter_gpu_gov.core import clock as gov_clock
    from jupyter_gpu_gov.hub import heap

    with tempfile.TemporaryDirectory(prefix="bench-ingest-steps-") as workdir:
        hub, gov, users = await _governor(workdir, servers)
        collections = heap.start()
        idle_as_of = gov_clock.utcnow() if mix == IDLE_REPEAT else None
        try:
            totals: dict[str, list[float]] = defaultdict(list)
            parts: dict[str, list[float]] = defaultdict(list)
            passes: dict[str, list[float]] = defaultdict(list)
            states: Counter = Counter()
            for phase in ("totals", "parts"):
                undo = None
                for k in range(rounds):
                    await _pass(gov, passes, timed=k >= 2)  # a pass a minute, as deployed
                    gov_clock.advance(ROUND_S)
                    now = gov_clock.utcnow()
                    bodies = [
                        encode(report_for(u, i, now, idle_as_of, RUN_STARTED))
                        for i, u in enumerate(users)
                    ]
                    clock = Clock()
                    if phase == "parts":
                        if undo is not None:
                            undo()
                        undo = _wrap_parts(gov, clock)
                    said = _round(gov, bodies, clock)
                    if k == 0:
                        continue  # the diagnosis's context fills
                    states.update(said)
                    out = totals if phase == "totals" else parts
                    for name, ns in clock.ns.items():
                        out[name].append(ns / 1000 / len(bodies))
                if undo is not None:
                    undo()
        finally:
            heap.stop(collections)
            await gov.close()
            hub.stop()
    return (
        {k: statistics.median(v) for k, v in totals.items()},
        {k: statistics.median(v) for k, v in parts.items()},
        states,
        {k: statistics.median(v) for k, v in passes.items()},
    )


def run(servers: int = 2000, rounds: int = 5, repeats: int = 3, mix: str = MOVING) -> dict:
    """Median CPU µs per report of each step, over ``repeats`` fresh governors, the measured
    reports' verdicts by state, and the passes' CPU (from the third pass, with ``rounds`` of 3
    or more)."""
    runs = []
    for _ in range(repeats):
        runs.append(asyncio.run(_repeat(servers, rounds, mix)))
    out: dict[str, Any] = {"servers": servers, "rounds": rounds, "repeats": repeats, "mix": mix}
    for name in TOTALS:
        values = [r[0].get(name, 0.0) for r in runs]
        out[f"{name}_us"] = round(statistics.median(values), 1)
        out[f"{name}_us_runs"] = "/".join(f"{v:.0f}" for v in values)
    out["total_us"] = round(sum(out[f"{n}_us"] for n in TOTALS if n != "gc"), 1)
    for name in ("ingest", "gc", *(name for name, _ in PARTS)):
        out[f"ingest.{name}_us"] = round(statistics.median(r[1].get(name, 0.0) for r in runs), 1)
    states = sum((r[2] for r in runs), Counter())
    out["verdicts"] = ",".join(f"{k}:{v}" for k, v in sorted(states.items()))
    if all(r[3] for r in runs):
        pass_ms = [r[3]["pass_ms"] for r in runs]
        out["pass_ms"] = round(statistics.median(pass_ms), 1)
        out["pass_ms_runs"] = "/".join(f"{v:.0f}" for v in pass_ms)
        out["pass_decided"] = round(statistics.median(r[3]["pass_decided"] for r in runs))
        # A pass a minute, a report a server a minute: the pass's CPU per report.
        out["pass_us_per_report"] = round(out["pass_ms"] * 1000 / servers, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2000)
    parser.add_argument(
        "--rounds", type=int, default=5, help="reports per server (the 1st unmeasured)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="fresh governors")
    parser.add_argument("--mix", default=MOVING, choices=(MOVING, IDLE_REPEAT))
    args = parser.parse_args(argv)
    result = run(args.servers, args.rounds, args.repeats, args.mix)
    print("ingest_steps:", " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
