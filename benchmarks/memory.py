"""Where the governor service's memory goes at N servers (issue 26: under 300 MB at 10,000).

    python -m benchmarks.memory [--servers 10000] [--top 25 [--frames 8]]
        [--rounds 2] [--cull-every S] [--mix moving|idle-repeat] [--sample-every S]
        [--event-loop auto|uvloop|asyncio]

The fake Hub and the service as ``benchmarks.ingest`` starts them (``python -m
jupyter_gpu_gov.hub``, its start-up pass over the N servers done); then every server reports
twice (two bursts of ``ingest_load.report_for``'s reports, so every server's previous report has
been replaced once), and the service is asked for its figures: resident
memory (``VmRSS``), the objects the garbage collector tracks, and how long one full collection
takes there (``full_gc_ms``: what a full collection holds the event loop for, ``hub/heap.py``)
and what it frees (``full_gc_freed``: garbage in cycles since start-up that no young collection
freed), then its resident memory after that collection and after the C allocator gave back
what it held free (``malloc_trim``: memory freed by Python but kept by glibc's heaps).

``--rounds R --cull-every S``: every server reports R times, with the service's pass every S
seconds and a pass after each round (the benchmark waits S + 5 s after each); by default the
service's own interval (60 s here, as deployed) without waiting, ``--cull-every 86400``: no
pass after the start-up one; the resident memory after each round is printed, and the passes
done. The service reads the pods' CPU from the fake Hub's metrics-server each pass
(``benchmarks.pod_metrics``: every server's pod and the chart's), as on a cluster with one
(``--no-pod-cpu``: without it), and its dcgm-exporter, the fake of ``benchmarks.reconcile``
(each server's state as KubeSpawner keeps it, its GPUs' records labelled with its pod, their
power, clocks and PCIe bytes moving at every scrape; ``--no-dcgm``: without it; ``dcgm_pods``:
the pods the service found in its last read). After each round, on stderr as it goes and in the
figures by round: what the allocators hold (Python's arenas; glibc's malloc, used and free;
SQLite's own, ``sqlite_mb``, of it its page caches'), the service's threads, the bytes traced
with ``--top``. The diagnosis keeps a window per server per ``diagnose_sample_every`` (a minute), up to
``diagnose_max_windows`` (250,000: 25 at 10,000 servers), so two rounds are not the steady
state: ``--sample-every 1 --rounds 26`` reaches it in minutes instead of 25 of them. Also printed: what Python's small-object allocator holds in
arenas and in live objects (``obmalloc_*``); with ``BENCH_MEMORY_TYPES=1`` in the environment,
the reports the service holds and its most numerous object types.

With ``--top N`` the service runs under ``tracemalloc`` from its first import (its resident
memory is then larger by tracemalloc's own) and prints the N lines that hold the most, by
file:line, and the N files; with ``--frames K`` also the N call stacks (K frames deep, the
allocating line first) that hold the most: whose, where one line (the JSON decoder's) serves many.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import gc
import json
import os
import re
import signal
import sys
import tempfile
import time
import types
from pathlib import Path

from .ingest import IDLE_REPEAT, MOVING, NO_PASS_S, REPO, Load, fake_hub, rss_mb, service

FIGURES_ENV = "BENCH_MEMORY_FIGURES"  # where the service writes its figures when signalled


def _serve(argv: list[str]) -> None:
    """The service, as ``python -m jupyter_gpu_gov.hub`` runs it, answering SIGUSR1 with its
    figures (written to ``$BENCH_MEMORY_FIGURES``)."""
    top = int(os.environ.get("BENCH_MEMORY_TOP", "0"))
    frames = int(os.environ.get("BENCH_MEMORY_FRAMES", "1"))
    if top:
        import tracemalloc

        tracemalloc.start(frames)

    def figures(*_: object) -> None:
        out: dict = {
            "rss_mb": rss_mb(os.getpid()),
            "gc_tracked": len(gc.get_objects()),
            "gc_frozen": gc.get_freeze_count(),
        }
        if top:
            snapshot = tracemalloc.take_snapshot()
            out["traced_mb"] = tracemalloc.get_traced_memory()[0] / 1e6
            for kind in ("lineno", "filename", *(("traceback",) if frames > 1 else ())):
                out[kind] = [
                    (stat.size / 1e6, stat.count, _where(stat.traceback))
                    for stat in snapshot.statistics(kind)[:top]
                ]
        started = time.perf_counter()
        out["full_gc_freed"] = gc.collect()  # cycles no young collection could free
        out["full_gc_ms"] = 1000 * (time.perf_counter() - started)
        out["rss_mb_after_gc"] = rss_mb(os.getpid())
        if os.environ.get("BENCH_MEMORY_TYPES"):
            objects = gc.get_objects()
            out["reports_alive"] = sum(
                1 for o in objects if type(o) is dict and "targets" in o and "server" in o
            )
            out["types"] = collections.Counter(type(o).__name__ for o in objects).most_common(12)
        if os.environ.get("BENCH_MEMORY_PARTS"):
            out["parts"] = _parts()
        out.update(_python_allocator())
        try:  # what the C allocator holds free, not yet given back to the system
            ctypes.CDLL(None).malloc_trim(0)
            out["rss_mb_after_malloc_trim"] = rss_mb(os.getpid())
        except (OSError, AttributeError):
            pass
        # Last (the figures above are taken): the pods the service found in DCGM's last read,
        # its exporter's records matched by pod (the governor is among what start-up froze).
        gc.unfreeze()
        governor = next((o for o in gc.get_objects() if type(o).__name__ == "Governor"), None)
        if governor is not None:
            out["dcgm_pods"] = len(governor._context.by_pod)
            last = governor.last_cycle  # and why none, if so (a read failed, or went stale)
            out["dcgm_errors"] = list(last.dcgm_errors[:2]) if last is not None else []
        _write(Path(os.environ[FIGURES_ENV]), out)

    def heaps(*_: object) -> None:  # after each round: cheap, no collection
        from jupyter_gpu_gov.hub.metrics import REGISTRY

        passes = REGISTRY.get_sample_value("jupyter_gpu_gov_reconcile_duration_seconds_count")
        out = {**_python_allocator(), **_c_allocator(), **_sqlite(), "passes": round(passes or 0)}
        if top:
            out["traced_mb"] = tracemalloc.get_traced_memory()[0] / 1e6
        out["threads"] = len(os.listdir("/proc/self/task"))
        _write(Path(os.environ[FIGURES_ENV] + ".round"), out)

    signal.signal(signal.SIGUSR1, figures)
    signal.signal(signal.SIGUSR2, heaps)
    from jupyter_gpu_gov.hub.app import main

    sys.argv = ["jupyter_gpu_gov.hub", *argv]
    main()


# Never counted in a walk: code, classes and modules are the program, not its state.
SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)


class Reach:
    """Walks of what objects reach (``gc.get_referents``), by ``sys.getsizeof``, each object
    counted once over every walk: the first walk that reaches it has it."""

    def __init__(self, *exclude: object):
        self.seen: set[int] = {id(o) for o in (self, *exclude)}
        self.seen.add(id(self.seen))  # the walk's own

    def walk(self, *roots: object) -> tuple[collections.Counter, int]:
        """Bytes by type name, and the number of objects, reached from ``roots`` and not
        counted before."""
        seen, by_type, count = self.seen, collections.Counter(), 0
        stack = [r for r in roots if id(r) not in seen]
        while stack:
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, SKIP):
                continue
            seen.add(id(obj))
            by_type[type(obj).__name__] += sys.getsizeof(obj)
            count += 1
            stack.extend(o for o in gc.get_referents(obj) if id(o) not in seen)
        return by_type, count


def _parts() -> list[tuple[str, float, int, str]]:
    """The service's objects by what holds them: each of the governor's attributes, then
    HubAuth's token cache, the Prometheus registry, and the rest the collector tracks (each
    object counted once, in the first part that reaches it; code, classes and modules in none):
    (name, MB by ``sys.getsizeof``, objects, its three largest types), largest first."""
    gc.unfreeze()  # what ``hub/heap.py`` froze at start-up (the governor among it) is counted
    objects = gc.get_objects()
    governor = next(o for o in objects if type(o).__name__ == "Governor")
    reach = Reach(objects, governor)  # the list is this walk's own

    def size(name: str, *roots: object) -> tuple[str, float, int, str]:
        by_type, count = reach.walk(*roots)
        largest = ", ".join(f"{t} {b / 1e6:.1f}" for t, b in by_type.most_common(3))
        return name, sum(by_type.values()) / 1e6, count, largest

    parts = [size(f"governor.{name}", value) for name, value in vars(governor).items()]
    from jupyterhub.services.auth import HubAuth
    from prometheus_client import REGISTRY

    parts.append(size("HubAuth caches", *(o.cache for o in objects if isinstance(o, HubAuth))))
    parts.append(size("prometheus registry", REGISTRY))
    parts.append(size("the rest (gc-tracked)", *objects))
    return sorted(parts, key=lambda p: -p[1])


def _python_allocator() -> dict:
    """What Python's small-object allocator holds (``sys._debugmallocstats``, which writes to
    the C stderr): in arenas, and of it in live objects; the rest is free space in partly used
    arenas, which the system does not get back (fragmentation)."""
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        try:
            os.dup2(captured.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    figures = {}
    for name, pattern in (
        ("obmalloc_arenas_mb", r"arenas \* \d+ bytes/arena\s*=\s*([\d,]+)"),
        ("obmalloc_live_mb", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
    ):
        found = re.search(pattern, text)
        if found:
            figures[name] = int(found.group(1).replace(",", "")) / 1e6
    return figures


def _c_allocator() -> dict:
    """What glibc's malloc holds (``mallinfo2``): in use, and free but kept (its heaps do not
    shrink below their top chunk in use); the memory of objects over 512 bytes, which Python's
    small-object allocator hands to it (a large dict's or list's table, an ``array``)."""

    class Info(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = Info
    info = mallinfo2()
    return {
        "malloc_used_mb": (info.uordblks + info.hblkhd) / 1e6,
        "malloc_free_mb": info.fordblks / 1e6,
    }


def _sqlite() -> dict:
    """What SQLite's own allocations hold (``sqlite3_status64``), all its connections together:
    in all (``sqlite_mb``) and of it its page caches' (``sqlite_pages_mb``); memory glibc's
    malloc hands it, which ``tracemalloc`` does not see."""
    try:
        # The shared library a Debian-style Python's sqlite3 module links (the same copy, already
        # loaded); a Python built with its own SQLite inside would read another copy's zeros.
        library = ctypes.CDLL("libsqlite3.so.0")
    except OSError:
        return {}
    current, highest = ctypes.c_int64(), ctypes.c_int64()
    figures = {}
    for name, op in (("sqlite_mb", 0), ("sqlite_pages_mb", 2)):  # MEMORY_USED, PAGECACHE_OVERFLOW
        if library.sqlite3_status64(op, ctypes.byref(current), ctypes.byref(highest), 0) == 0:
            figures[name] = current.value / 1e6
    return figures


def _where(traceback) -> str:
    """A traceback's frames, where it allocated first and its callers under it."""
    return ("\n" + " " * 25).join(map(str, reversed(traceback)))


def run(
    servers: int = 10000,
    top: int = 0,
    frames: int = 1,
    rounds: int = 2,
    cull_every: float | None = None,
    mix: str = MOVING,
    sample_every: float | None = None,
    event_loop: str | None = None,
    pod_cpu: bool = True,
    dcgm: bool = True,
) -> dict:
    with fake_hub(servers, 0, dcgm=dcgm) as ready:
        figures_path = Path(REPO, f".bench-memory-{os.getpid()}.json")
        env = {
            FIGURES_ENV: str(figures_path),
            "BENCH_MEMORY_TOP": str(top),
            "BENCH_MEMORY_FRAMES": str(frames),
            # The service's code from $PYTHONPATH when set (a baseline's), this benchmark's here.
            "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])),
        }
        command = ("-m", "benchmarks.memory", "--serve")
        try:
            args = (f"--GpuGovernor.diagnose_sample_every={sample_every}",) if sample_every else ()
            if event_loop:
                args += (f"--GpuGovernor.event_loop={event_loop}",)
            if pod_cpu:  # the fake's metrics-server, read each pass (hub/pod_cpu.py)
                args += (f"--GpuGovernor.kubernetes_api_url={ready['kubernetes_api_url']}",)
            # Its dcgm-exporter (``benchmarks.reconcile``'s), read each pass: a body of tens of
            # MB, more than the default 5 s allow on a busy machine.
            args += tuple(f"--GpuGovernor.dcgm_exporter_urls={u}" for u in ready["exporter_urls"])
            args += ("--GpuGovernor.dcgm_timeout=60",) if dcgm else ()
            with service(ready, command=command, env=env, cull_every=cull_every, args=args) as (
                process,
                port,
            ):
                started_mb = rss_mb(process.pid)
                load = Load(ready["users"], port, mix=mix)
                by_round, heaps = [], []
                for i in range(rounds):
                    sent = asyncio.run(load.burst(16))
                    failed = sum(1 for s in sent if s.status != 200)
                    if failed:
                        raise RuntimeError(f"{failed} of {len(sent)} reports refused")
                    if cull_every is not None and cull_every < NO_PASS_S:  # a pass after each
                        time.sleep(cull_every + 5)
                    by_round.append(round(rss_mb(process.pid)))
                    heaps.append(_ask(process, signal.SIGUSR2, Path(f"{figures_path}.round"), 60))
                    # As it goes (a long run's curve, read before its end): on stderr.
                    now = " ".join(f"{k}={round(v, 1)}" for k, v in heaps[-1].items())
                    print(
                        f"round {i + 1}: rss_mb={by_round[-1]} {now}", file=sys.stderr, flush=True
                    )
                time.sleep(2)
                # Statistics by call stack (--frames) take minutes at 10,000 servers.
                out = _ask(process, signal.SIGUSR1, figures_path, 300 if frames <= 1 else 1800)
        finally:
            figures_path.unlink(missing_ok=True)
    by_heap = {k: [round(h.get(k, 0)) for h in heaps] for k in (heaps[0] if heaps else ())}
    return {
        "servers": servers,
        "pod_cpu": pod_cpu,
        "dcgm": dcgm,
        "rss_mb_started": started_mb,
        "rss_mb_by_round": by_round,
        **{f"{k}_by_round": v for k, v in by_heap.items()},
        **out,
    }


def _write(path: Path, figures: dict) -> None:
    """Written whole before the benchmark sees it."""
    Path(f"{path}.part").write_text(json.dumps(figures))
    os.replace(f"{path}.part", path)


def _ask(process, signum: int, path: Path, wait_s: float) -> dict:
    """Signal the service and read the figures it writes to ``path``."""
    process.send_signal(signum)
    deadline = time.monotonic() + wait_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        return json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10000)
    parser.add_argument("--top", type=int, default=0, help="tracemalloc's top N lines and files")
    parser.add_argument("--frames", type=int, default=1, help="with --top: the top call stacks")
    parser.add_argument("--rounds", type=int, default=2, help="every server reports this often")
    parser.add_argument(
        "--cull-every",
        type=float,
        help="the service's pass interval, a pass waited for after each round (default: the "
        "service's own, 60 s here, not waited for; 86400: none)",
    )
    parser.add_argument("--mix", choices=(MOVING, IDLE_REPEAT), default=MOVING)
    parser.add_argument(
        "--sample-every",
        type=float,
        help="the service's diagnose_sample_every: 1 keeps a window of every report, so that "
        "the diagnosis's history reaches its size in fewer rounds (default: the service's)",
    )
    parser.add_argument(
        "--event-loop",
        choices=("auto", "uvloop", "asyncio"),
        help="the service's GpuGovernor.event_loop (default: its own, asyncio)",
    )
    parser.add_argument(
        "--no-pod-cpu",
        action="store_true",
        help="the service reads no pods' CPU (a cluster without metrics-server; by default it "
        "reads the fake Hub's metrics-server each pass, as in a cluster with one)",
    )
    parser.add_argument(
        "--no-dcgm",
        action="store_true",
        help="no dcgm-exporter (by default the service reads the fake's, benchmarks.reconcile's: "
        "every server's GPUs labelled with its pod, their values moving at every scrape)",
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:  # the service's own arguments, --cull-every among them
        _serve(argv[1:])
        return
    args = parser.parse_args(argv)
    out = run(
        args.servers,
        args.top,
        args.frames,
        args.rounds,
        args.cull_every,
        args.mix,
        args.sample_every,
        args.event_loop,
        not args.no_pod_cpu,
        not args.no_dcgm,
    )
    print(
        "memory:",
        " ".join(
            f"{k}={round(v, 1) if isinstance(v, float) else v}"
            for k, v in out.items()
            if k not in ("lineno", "filename", "traceback", "parts")
        ),
    )
    for name, size, count, largest in out.get("parts", ()):
        if size >= 0.05:
            print(f"  {size:8.1f} MB {count:9,d}  {name} ({largest})")
    for kind in ("lineno", "filename", "traceback"):
        for size, count, where in out.get(kind, ()):
            print(f"  {size:8.1f} MB {count:9,d}  {where}")
        if kind in out:
            print()


if __name__ == "__main__":
    main()
