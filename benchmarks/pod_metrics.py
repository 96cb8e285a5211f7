"""A fake metrics-server for the benchmarks: the PodMetricsList of a namespace as the
aggregated API answers ``GET /apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods``, and what
reading it costs the governor (``hub/pod_cpu.py``) at N servers.

    python -m benchmarks.pod_metrics [--servers 1000,10000,50000] [--passes 10]

An item is shaped as metrics-server (v0.6-0.7) writes one for a zero-to-jupyterhub user pod:
the pod's name, namespace and labels (KubeSpawner's and the chart's), ``creationTimestamp``,
``timestamp``, ``window`` and one container, ``notebook``, with its CPU in nanocores and its
memory in KiB; compact JSON, as Go's encoder writes it (about 480 bytes an item). The namespace
also holds the chart's own pods (hub, proxy, user-scheduler, placeholders, image pullers), which
no Hub record names. A server's CPU is drawn once from its name: most idle (a few thousandths of
a core), a third computing (about a core), some in a CPU stage (two to four).

The benchmark starts the fake in a subprocess (as the API server is another process), asks the
governor's ``PodCpu`` to want every GPU server's pod (85 %, as ``benchmarks.reconcile``'s plan
has them), and runs ``--passes`` reads, each as a pass does (``read`` then ``changed``), with
nothing else on the loop. Per pass, medians: the loop thread's CPU (``time.thread_time`` on it:
the HTTP read, the join, the fold, ``changed``), the parse thread's CPU (JSON and the items'
checks, ``_parse`` timed in its thread), the wall time, the bytes of the answer; then, with
``tracemalloc``, the memory ``PodCpu`` holds between passes (its runs and keys) and the most a
read held at once (the answer's bytes, the parsed document, the readings). The service's own
resident memory with it is ``benchmarks.memory``'s (its fake serves this route too).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
METRICS_ROUTE = r"/apis/metrics\.k8s\.io/v1beta1/namespaces/([^/]+)/pods/?"
CHART = "jupyterhub-4.1.0"
RELEASE = "jhub"
# The chart's own pods in the namespace: no Hub record names them.
CHART_PODS = (
    ("hub-7d9c8b6f5-x2k4q", "hub", "hub"),
    ("proxy-6c8f7d9b4-p8m2n", "proxy", "proxy"),
    ("user-scheduler-5b8d7c6f9-4kq7z", "user-scheduler", "kube-scheduler"),
    ("user-scheduler-5b8d7c6f9-r2m8t", "user-scheduler", "kube-scheduler"),
    *((f"user-placeholder-{i}", "user-placeholder", "pause") for i in range(4)),
    *((f"continuous-image-puller-{i:05x}", "continuous-image-puller", "pause") for i in range(8)),
)


def cores_of(pod: str) -> float:
    """A pod's CPU, drawn once from its name (stable from pass to pass)."""
    draw = zlib.crc32(pod.encode()) % 1000
    if draw < 600:
        return 0.001 + draw / 100_000  # idle: 0.001-0.007
    if draw < 930:
        return 0.8 + (draw - 600) / 1000  # computing: 0.8-1.13
    return 2.0 + (draw - 930) / 35  # a CPU stage: 2-4


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_metrics_list(
    users: Iterable[tuple[str, str, str]],
    namespace: str,
    now: datetime,
    cores: Callable[[str], float] = cores_of,
) -> bytes:
    """The PodMetricsList body: ``users`` are (user, server name, pod); the chart's pods too."""
    stamp = _stamp(now)
    items = []

    def item(pod: str, labels: dict, container: str, cpu: float, memory_kib: int) -> dict:
        return {
            "metadata": {
                "name": pod,
                "namespace": namespace,
                "creationTimestamp": stamp,
                "labels": labels,
            },
            "timestamp": stamp,
            "window": "10.143s",
            "containers": [
                {
                    "name": container,
                    "usage": {"cpu": f"{round(cpu * 1e9)}n", "memory": f"{memory_kib}Ki"},
                }
            ],
        }

    for pod, component, container in CHART_PODS:
        labels = {"app": "jupyterhub", "component": component, "release": RELEASE}
        items.append(item(pod, labels, container, 0.004, 65_536))
    for user, server, pod in users:
        labels = {
            "app": "jupyterhub",
            "chart": CHART,
            "component": "singleuser-server",
            "heritage": "jupyterhub",
            "hub.jupyter.org/network-access-hub": "true",
            "hub.jupyter.org/servername": server,
            "hub.jupyter.org/username": user,
            "release": RELEASE,
        }
        items.append(item(pod, labels, "notebook", cores(pod), 187_432 + len(pod) * 512))
    document = {
        "kind": "PodMetricsList",
        "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {},
        "items": items,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def metrics_handler(body_of: Callable[[str], bytes | None]) -> Any:
    """A tornado handler for ``METRICS_ROUTE``: ``body_of(namespace)``'s list, 404 for None
    (no such namespace is answered as an empty list by the real API; None: no metrics-server)."""
    from tornado import web

    class PodMetrics(web.RequestHandler):
        def get(self, namespace: str) -> None:
            body = body_of(namespace)
            if body is None:
                raise web.HTTPError(404)
            self.set_header("Content-Type", "application/json")
            self.finish(body)

    return PodMetrics


def users_of(n: int) -> list[tuple[str, str, str]]:
    """``FakeHub.populate(n)``'s users, each with a default server and KubeSpawner's pod name."""
    width = len(str(n))
    return [(f"user{i:0{width}d}", "", f"jupyter-user{i:0{width}d}") for i in range(n)]


# -- the benchmark ----------------------------------------------------------------------------


async def _serve(n: int, namespace: str) -> None:
    from tornado import web
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    users = users_of(n)

    def body_of(ns: str) -> bytes:
        # Built for each request, as metrics-server does (the time moves).
        return pod_metrics_list(users if ns == namespace else [], ns, datetime.now(timezone.utc))

    sockets = bind_sockets(0, "127.0.0.1")
    HTTPServer(web.Application([(METRICS_ROUTE, metrics_handler(body_of))])).add_sockets(sockets)
    sys.stdout.write(json.dumps({"url": f"http://127.0.0.1:{sockets[0].getsockname()[1]}"}))
    sys.stdout.write("\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed


def wanted(n: int) -> list[str]:
    """The GPU servers' pods (85 %: ``benchmarks.reconcile.PROFILES`` has 15 % CPU-only)."""
    return [pod for i, (_, _, pod) in enumerate(users_of(n)) if i % 20 >= 3]


async def _measure(url: str, n: int, passes: int, namespace: str) -> dict:
    from jupyter_gpu_gov.hub import pod_cpu

    parse_cpu: list[float] = []
    sizes: list[int] = []
    # What the parser's thread runs: ``_fold`` (the answer read and folded), ``_parse`` before
    # wave 37 (the answer read; folded on the loop), so that either tree can be measured.
    threaded = "_fold" if hasattr(pod_cpu, "_fold") else "_parse"
    parse = getattr(pod_cpu, threaded)

    def timed_parse(body: bytes, *args: Any) -> Any:
        sizes.append(len(body))
        started = time.thread_time()
        try:
            return parse(body, *args)
        finally:
            parse_cpu.append(time.thread_time() - started)

    setattr(pod_cpu, threaded, timed_parse)
    try:
        reader = pod_cpu.PodCpu(
            pod_cpu.PodCpuOptions(kubernetes_api_url=url, kubernetes_token_file="")
        )
        for pod in wanted(n):
            reader.want((namespace, pod), f"{pod[len('jupyter-') :]}/")

        async def one_pass() -> tuple[float, float]:
            gc.collect()
            wall, cpu = time.perf_counter(), time.thread_time()
            now = datetime.now(timezone.utc)
            await reader.read(now)
            reader.changed(now)
            return time.perf_counter() - wall, time.thread_time() - cpu

        await one_pass()  # the first: every run new
        parse_cpu.clear()
        timed = [await one_pass() for _ in range(passes)]
        loop_cpu = [cpu for _, cpu in timed]
        # Memory: what PodCpu holds between passes, and the most a read holds at once.
        gc.collect()
        tracemalloc.start()
        reader2 = pod_cpu.PodCpu(reader.options)
        for pod in wanted(n):
            reader2.want((namespace, pod), f"{pod[len('jupyter-') :]}/")
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(2):
            now = datetime.now(timezone.utc)
            await reader2.read(now)
            reader2.changed(now)
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        runs = len(reader2._runs)
    finally:
        setattr(pod_cpu, threaded, parse)
    return {
        "servers": n,
        "items": n + len(CHART_PODS),
        "wanted": len(wanted(n)),
        "answer_mb": round(statistics.median(sizes) / 1e6, 2),
        "loop_cpu_ms": round(1000 * statistics.median(loop_cpu), 1),
        "parse_cpu_ms": round(1000 * statistics.median(parse_cpu), 1),
        "wall_ms": round(1000 * statistics.median(w for w, _ in timed), 1),
        "held_mb": round((held - before) / 1e6, 2),
        "read_peak_mb": round((peak - before) / 1e6, 1),
        "runs_kept": runs,
        "passes": passes,
    }


def run(n: int, passes: int = 10, namespace: str = RELEASE) -> dict:
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve", f"--servers={n}"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("the fake metrics-server did not start")
        return asyncio.run(_measure(json.loads(line)["url"], n, passes, namespace))
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--servers",
        type=lambda s: [int(p) for p in s.split(",") if p.strip()],
        default=[1000, 10_000, 50_000],
    )
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.servers[0], RELEASE))
        return
    for n in args.servers:
        figures = run(n, args.passes)
        print("pod_metrics:", " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
