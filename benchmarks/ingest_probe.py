"""What holds the service's event loop while ``benchmarks.ingest --probe`` measures: the service
as ``python -m jupyter_gpu_gov.hub`` runs it, with every event-loop callback that runs longer
than ``SLOW_MS`` and every garbage collection timed and written, one JSON line each, to
``$BENCH_INGEST_PROBE`` (wall-clock time, milliseconds, what it was). The benchmark reads them
back per phase. A report waits for whatever callback runs when it arrives: these are the p99.
Inside those callbacks, the pass's named steps (``STEPS``: its store writes, history, gauges)
are timed too (``step ...``, ``(off-loop)`` when the store's writer thread ran them).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time

PROBE_ENV = "BENCH_INGEST_PROBE"
SLOW_MS = 20.0


def _what(handle: asyncio.Handle) -> str:
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):  # a coroutine's step: name the coroutine
        coro = task.get_coro()
        return f"task {getattr(coro, '__qualname__', coro)}"
    return getattr(callback, "__qualname__", repr(callback))[:120]


def install(path: str) -> None:
    out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    run = asyncio.events.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        started = time.perf_counter()
        run(handle)
        ms = 1000 * (time.perf_counter() - started)
        if ms >= SLOW_MS:
            out.write(json.dumps({"at": time.time(), "ms": ms, "what": _what(handle)}) + "\n")

    asyncio.events.Handle._run = timed
    collecting: dict = {}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collecting["at"] = time.perf_counter()
        elif "at" in collecting:
            ms = 1000 * (time.perf_counter() - collecting.pop("at"))
            if ms >= 1.0 or info["generation"] == 2:
                what = f"gc generation {info['generation']} collected {info['collected']}"
                out.write(json.dumps({"at": time.time(), "ms": ms, "what": what}) + "\n")

    gc.callbacks.append(on_gc)
    _time_steps(out)


# Synchronous steps of a pass, timed inside the callback that runs them (lines "step ...").
STEPS = {
    "jupyter_gpu_gov.hub.store": ("Store.save", "Store.save_usage", "Store._saving"),
    "jupyter_gpu_gov.hub.history": ("HistoryLog.append", "History._record_keyframes"),
    "jupyter_gpu_gov.hub.reconcile": ("Governor._publish_gauges", "Governor._stopped"),
    "jupyter_gpu_gov.hub.records": ("Records.save_decisions", "Records.save_outcomes"),
    "jupyter_gpu_gov.hub.usage": ("Usage._save_usage", "Usage._count"),
    "jupyter_gpu_gov.hub.incremental": ("Incremental._forget_stale_reports",),
    "jupyter_gpu_gov.hub.health": ("HealthWatch.finish_pass",),
    "jupyter_gpu_gov.hub.metrics": ("StateGauges.publish",),
    "jupyter_gpu_gov.hub.heap": ("after_pass",),
    "jupyter_gpu_gov.core.ledger": ("Ledger.drain", "Ledger.sweep"),
}


def _time_steps(out) -> None:
    import functools
    import importlib
    import inspect
    import threading

    main = threading.main_thread()

    for module_name, names in STEPS.items():
        module = importlib.import_module(module_name)
        for name in names:
            owner_name, _, method = name.rpartition(".")
            owner = getattr(module, owner_name) if owner_name else module
            original = vars(owner).get(method)
            if not inspect.isfunction(original) or inspect.iscoroutinefunction(original):
                continue  # (not in this tree; a coroutine's steps are callbacks, timed above)

            def timed(*args, _f=original, _name=name, **kwargs):
                started = time.perf_counter()
                try:
                    return _f(*args, **kwargs)
                finally:
                    ms = 1000 * (time.perf_counter() - started)
                    if ms >= 1.0:
                        where = "" if threading.current_thread() is main else "(off-loop)"
                        line = {"at": time.time(), "ms": ms, "what": f"step {_name}{where}"}
                        out.write(json.dumps(line) + "\n")

            setattr(owner, method, functools.wraps(original)(timed))


def main() -> None:
    install(os.environ[PROBE_ENV])
    from jupyter_gpu_gov.hub.app import main as service

    sys.argv = ["jupyter_gpu_gov.hub", *sys.argv[1:]]
    service()


if __name__ == "__main__":
    main()
