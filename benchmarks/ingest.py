"""Report ingest over HTTP on loopback: the governor service under N servers' reports.

    python -m benchmarks.ingest [--servers 2000] [--seconds 15] [--concurrency 16] [--nice 19]
        [--accept-interval 0.02] [--event-loop auto|uvloop|asyncio] [--probe | --profile]

Three processes, as in a deployment: the fake Hub (``tests/fake_hub_api.FakeHub`` with N users,
each with a running server and tokens like a server's ``$JUPYTERHUB_API_TOKEN``), the service
itself (``python -m jupyter_gpu_gov.hub``: its tornado app, handlers and ``HubOAuth``, with its
default token cache), and this process, the N servers sending reports (``ingest_load``).

The service checks each token with the Hub (``GET /hub/api/user``) the first time it sees it,
then answers from HubAuth's cache for ``cache_max_age`` (300 s); the check runs in HubAuth's
thread while the request waits for it (``get_current_user`` is synchronous). So the phases:

- **cold burst**: every server's first report, as fast as ``--concurrency`` servers at a time
  allow: a Hub round trip and a new connection each (a service restart, or the first minute of N
  new servers);
- **warm burst**: every server again, tokens cached (on its kept connection with
  ``--keep-connections``): the throughput ceiling;
- **restart minute**: ``--seconds`` at the steady rate (N reports every 60 s) with tokens the
  service has not seen and new connections, as in the minute after a restart;
- **steady**: ``--seconds`` at the steady rate, tokens cached except one report in 6: a cached
  answer lives 300 s and a server reports every 60 s, so each token is checked again every
  sixth report (a fresh token stands for the expired one: same Hub round trip, same cost);
  ``--steady-windows`` such windows back to back (default 3), the steady CPU the median
  window's, each window's shown with its spread, the service's wake-ups a report, the
  machine's own speed (a fixed piece of Python timed every 2 s) and the rest of the machine's
  CPU: one window's figure moves with the machine (docs/benchmarks-history.md, "Issue 26,
  wave 37").

Figures: reports/s in the bursts; latency p50/p99 at the steady rate (from when each report was
due, so a late sender shows; ``steady_sent_*``: from when it was sent, the load generator's own
lateness left out); the service's CPU as % of one core over each phase (utime + stime
of every thread, ``/proc/<pid>/stat``), and over 3 s idle before any report; its resident
memory when started and once N servers have reported; the Hub checks each phase caused (the
fake Hub's ``GET /user`` count). The service
reconciles once at start (its first pass over the N servers, before anything is measured) and
then not again (``--cull-every`` a day): the reconcile pass is ``benchmarks.reconcile``'s figure.
It runs on its default event loop (``auto``: uvloop where installed) unless ``--event-loop``
names one; with ``--probe`` on the standard library's, whose callbacks the probe times.
``--profile``: the steady phase's CPU by part, µs a report (``benchmarks.ingest_profile``:
sampled by CPU time, which a wall-clock sampler is not), and its user and system CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from .ingest_load import RUN_STARTED, Connections, Sent, encode, is_busy, report_for
from .ingest_probe import PROBE_ENV, SLOW_MS
from .ingest_profile import PROFILE_ENV, breakdown
from .pod_metrics import METRICS_ROUTE, metrics_handler, pod_metrics_list
from .reconcile import Planned, exposition, kubespawner_state

REPO = Path(__file__).resolve().parent.parent
SERVICE = "gpu-gov"
ACCESS_SCOPE = f"access:services!service={SERVICE}"
PREFIX = f"/services/{SERVICE}/"
NAMESPACE = "jhub"  # the servers' pods'
GPUS_PER_EXPORTER = 1000  # the fake exporter's shard: one URL for this many GPUs
REPORT_EVERY_S = 60.0  # the server extension's report_interval
TOKEN_CACHE_S = 300.0  # HubAuth.cache_max_age's default
EXPIRED_EVERY = round((TOKEN_CACHE_S + REPORT_EVERY_S) / REPORT_EVERY_S)  # 6: a report in 6
PROBE_TOKEN = "bench-probe"
# What the servers send: every report moved from the last (its times relative to now: every
# report a change, the worst case), or idle servers' reports the same as their last but for
# ``sampled_at``, busy ones' moved (``ingest_load.report_for``'s ``idle_as_of``).
MOVING, IDLE_REPEAT = "moving", "idle-repeat"
NO_PASS_S = 86400  # ``--cull-every`` by default: no pass runs while the phases are measured
IDLE_S = 3.0  # the service's own background cost, before any report
CLK_TCK = os.sysconf("SC_CLK_TCK")


def token_for(user: str, generation: int) -> str:
    return f"bench-{generation}-{user}"


def generations(seconds: float, windows: int = 1) -> int:
    """Tokens per user: the bursts' one, then at most one per minute of each steady-rate phase
    (the restart minute and ``windows`` steady windows)."""
    return 1 + (1 + windows) * math.ceil(seconds / REPORT_EVERY_S)


# -- the machine's own speed, in its own process ---------------------------------------------

CALIBRATION_EVERY_S = 2.0
CALIBRATION_RUNS = 5


def _calibration_work() -> int:
    """A fixed piece of plain Python, dicts, strings and tuples as a report's handling makes
    them, whatever the tree (no code of the service's): about a millisecond."""
    made = {}
    for i in range(2000):
        key = f"k{i}"
        made[key] = (i, key, [i, i + 1])
    total = 0
    for key, value in made.items():
        total += value[0] + len(key)
    return total


def _serve_calibration() -> None:
    """Every ``CALIBRATION_EVERY_S``, the work ``CALIBRATION_RUNS`` times back to back, timed by
    this thread's CPU: the first after the sleep (``cold``: the caches as the neighbours left
    them, as a lone report finds them) and the median of the rest (``warm``), in µs, one JSON
    line each, until stdin closes."""
    import select

    while not select.select([sys.stdin], [], [], CALIBRATION_EVERY_S)[0]:
        spent = []
        for _ in range(CALIBRATION_RUNS):
            started = time.thread_time_ns()
            _calibration_work()
            spent.append((time.thread_time_ns() - started) / 1000)
        cold, warm = spent[0], statistics.median(spent[1:])
        sys.stdout.write(json.dumps({"at": time.time(), "cold": cold, "warm": warm}) + "\n")
        sys.stdout.flush()


@contextlib.contextmanager
def calibration() -> Iterator[list[dict]]:
    """The machine's speed while the body runs (``_serve_calibration``'s samples, filled in
    when it ends): what the neighbours on the machine, and on the host under it, leave of a
    core shows as a slower fixed piece of work."""
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.ingest", "--serve-calibration"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    samples: list[dict] = []
    try:
        yield samples
    finally:
        process.stdin.close()  # it ends at its next look
        out = process.stdout.read()
        process.wait(timeout=30)
        samples.extend(json.loads(line) for line in out.splitlines() if line)


def _calibrated(samples: list[dict], phase: Phase, which: str) -> str:
    during = [
        s[which] for s in samples if phase.began_at <= s["at"] <= phase.began_at + phase.wall_s
    ]
    return f"{statistics.median(during):.0f}" if during else "-"


# -- the fake Hub, in its own process ---------------------------------------------------------


def planned(users: list[str]) -> list[Planned]:
    """The GPUs ``ingest_load.report_for``'s servers hold, under the UUIDs their reports name
    (a whole card, or a MIG server's two slices of one), busy as the reports say, as
    ``benchmarks.reconcile`` plans its fleet: one record each in the fake exporter."""
    ns, gpus = uuid.NAMESPACE_URL, []
    for index, user in enumerate(users):
        parent = f"GPU-{uuid.uuid5(ns, f'{user}/gpu')}"
        busy = is_busy(index)
        for k in range(2 if index % 2 else 1):
            mig = f"MIG-{uuid.uuid5(ns, f'{user}/mig{k}')}" if index % 2 else None
            profile = "mig-3g.40gb" if mig else "h100"
            gpus.append(
                Planned(
                    user, profile, None, parent, mig, k + 1 if mig else None, index % 8, busy, busy
                )
            )
    return gpus


async def _serve_hub(n: int, seconds: float, windows: int = 1, dcgm: bool = False) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from fake_hub_api import FakeHub
    from tornado import web
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    hub = FakeHub(service_name=SERVICE)
    users = hub.populate(n)
    # The fake of ``benchmarks.reconcile``: each server's state as KubeSpawner keeps it (its
    # pod and namespace, which metrics-server and DCGM name too), and with ``dcgm`` its
    # exporter, whose records of the GPUs the reports name carry the servers' pods and move at
    # every scrape (``reconcile.exposition``).
    gpus = planned(users)
    pods = []
    for p in gpus:
        server = hub.users[p.user].servers[""]
        if not server.state.get("kubespawner_version"):  # (a MIG server's second slice)
            server.state = kubespawner_state(p)
            pods.append((p.user, "", p.pod))
    for user in users:
        for generation in range(generations(seconds, windows)):
            hub.add_user_token(user, token_for(user, generation), extra_scopes=[ACCESS_SCOPE])
    hub.add_token(PROBE_TOKEN, {ACCESS_SCOPE})  # the benchmark's own (a service's) token
    hub.start()

    class Counters(web.RequestHandler):
        def get(self) -> None:
            self.finish(dict(hub.counters))

    def pod_metrics(namespace: str) -> bytes:
        """metrics-server's list of the namespace (``benchmarks.pod_metrics``): every pod."""
        now = datetime.now(timezone.utc)
        return pod_metrics_list(pods if namespace == NAMESPACE else [], namespace, now)

    # The GPUs in shards, an exporter URL each, as a cluster has one exporter a node: one body
    # of 15,000 GPUs (71 MB) is over the service's bound on an answer (64 MiB), every read
    # refused, nothing matched by pod.
    shards = [gpus[k : k + GPUS_PER_EXPORTER] for k in range(0, len(gpus), GPUS_PER_EXPORTER)]
    scrapes = [0] * len(shards)

    class Exporter(web.RequestHandler):
        def get(self, shard: str) -> None:
            """A scrape of one dcgm-exporter: its moving values moved."""
            k = int(shard)
            body = exposition(shards[k], k, scrape=scrapes[k]).encode()
            scrapes[k] += 1
            self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.finish(body)

    sockets = bind_sockets(0, "127.0.0.1")
    routes = [(r"/counters", Counters), (METRICS_ROUTE, metrics_handler(pod_metrics))]
    routes += [(r"/dcgm/(\d+)/metrics", Exporter)] if dcgm else []
    HTTPServer(web.Application(routes)).add_sockets(sockets)
    served = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    ready = {
        "api_url": hub.api_url,
        "token": hub.token,
        "users": users,
        "counters_url": f"{served}/counters",
        "kubernetes_api_url": served,  # its metrics-server (a service given it reads it)
        "exporter_urls": [f"{served}/dcgm/{k}/metrics" for k in range(len(shards))] if dcgm else [],
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
    hub.stop()


# -- the service's process --------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: every thread


def wakeups(pid: int) -> int:
    """The times the service's threads went to sleep and were woken, or were preempted, since
    they started (``voluntary_ctxt_switches`` + ``nonvoluntary_ctxt_switches``): a report
    handled alone costs a wake-up of its own, reports that queued meanwhile share one."""
    count = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    count += int(line.split()[1])
    return count


def machine_busy_seconds() -> float:
    """Every core's busy time since boot (``/proc/stat``: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def start_service(
    ready: dict,
    workdir: str,
    port: int,
    log: IO[str],
    command: tuple[str, ...] = ("-m", "jupyter_gpu_gov.hub"),
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    cull_every: float | None = NO_PASS_S,
) -> subprocess.Popen:
    """The service as JupyterHub starts it (``command``: the interpreter's arguments before the
    service's own, e.g. a wrapper that runs it; ``cull_every``: its passes' interval, ``None``
    its own default: 60 s here)."""
    env = {
        **os.environ,
        **(env or {}),
        "JUPYTERHUB_API_URL": ready["api_url"],
        "JUPYTERHUB_API_TOKEN": ready["token"],
        "JUPYTERHUB_SERVICE_NAME": SERVICE,
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
        "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
        "JUPYTERHUB_CLIENT_ID": f"service-{SERVICE}",
    }
    ten_years = str(10 * 365 * 86400)
    return subprocess.Popen(
        [
            sys.executable,
            *command,
            f"--db-url=sqlite:///{workdir}/gov.sqlite",
            f"--timeout={ten_years}",  # the start-up pass culls nothing
            # By default no other pass runs while we measure.
            *(() if cull_every is None else (f"--cull-every={cull_every}",)),
            *args,
        ],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


def wait_until_reconciled(service: subprocess.Popen, port: int, timeout_s: float = 300) -> None:
    """Until the service answers and its start-up pass over the N servers is done."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{PREFIX}api/", headers={"Authorization": f"token {PROBE_TOKEN}"}
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.poll() is not None:
            raise RuntimeError(f"the service exited ({service.returncode})")
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                if json.load(answer).get("last_reconcile"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the service did not finish its start-up pass")


# -- the phases -------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    sent: list[Sent]
    wall_s: float
    cpu_s: float
    hub_checks: int
    began_at: float = 0.0  # wall clock (time.time), to place the probe's lines
    # The rest of the machine meanwhile: this process (the load generator) and the fake Hub's,
    # and everything else on it (other users' work: what makes a run noisy).
    load_cpu_s: float = 0.0
    others_cpu_s: float = 0.0
    wakeups: int = 0  # the service's (``wakeups``)
    calibration: tuple[str, str] = ("-", "-")  # the machine's speed (``calibration``), µs

    @property
    def ok(self) -> int:
        return sum(1 for s in self.sent if s.status == 200 and s.verdict)

    def latency_ms(self, q: float, sent: bool = False) -> float:
        """The ``q`` quantile of the latency, from when each report was due (``sent``: from
        when it was sent, leaving out how late the load generator sent it)."""
        ordered = sorted(s.round_trip if sent else s.seconds for s in self.sent)
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    @property
    def cpu_pct(self) -> float:
        return round(100 * self.cpu_s / self.wall_s, 2)


class Load:
    """The N servers: who reports next, with which token."""

    def __init__(self, users: list[str], port: int, keep: bool = False, mix: str = MOVING):
        from jupyter_gpu_gov.core import clock

        self.users = users
        self.connections = Connections(port, keep)
        self.path = f"{PREFIX}api/reports"
        self.generation = dict.fromkeys(users, 0)
        # With IDLE_REPEAT, idle servers went quiet before the first burst and stay so.
        self.idle_as_of = clock.utcnow() if mix == IDLE_REPEAT else None

    def report(self, user: str, index: int, now) -> bytes:
        return encode(report_for(user, index, now, self.idle_as_of, RUN_STARTED))

    def fresh_token(self, user: str) -> str:
        self.generation[user] += 1
        return token_for(user, self.generation[user])

    async def burst(self, concurrency: int) -> list[Sent]:
        """Every server once, ``concurrency`` connections at a time, tokens as they are."""
        from jupyter_gpu_gov.core import clock

        now = clock.utcnow()
        bodies = [(u, self.report(u, i, now)) for i, u in enumerate(self.users)]
        queue = iter(bodies)
        sent: list[Sent] = []

        async def worker() -> None:
            for user, body in queue:
                token = token_for(user, self.generation[user])
                sent.append(await self.connections.post(user, self.path, token, body))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return sent

    async def steady(self, seconds: float, fresh_every: int) -> list[Sent]:
        """N reports every 60 s, evenly spaced, for ``seconds``; every ``fresh_every``-th
        report of the phase comes with a token the service has not seen (1: all of them)."""
        from jupyter_gpu_gov.core import clock

        interval = REPORT_EVERY_S / len(self.users)
        start = time.perf_counter() + 0.05
        tasks = []
        for k in range(int(seconds / interval)):
            index = k % len(self.users)
            user = self.users[index]
            if k % fresh_every == fresh_every - 1:
                token = self.fresh_token(user)
            else:
                token = token_for(user, self.generation[user])
            body = self.report(user, index, clock.utcnow())
            due = start + k * interval
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            post = self.connections.post(user, self.path, token, body, due)
            tasks.append(asyncio.create_task(post))
        return list(await asyncio.gather(*tasks))


def hub_checks(counters_url: str) -> int:
    with urllib.request.urlopen(counters_url, timeout=10) as answer:
        return json.load(answer).get("GET /user", 0)


async def measure(
    name: str, pid: int, counters_url: str, send, hub_pid: int | None = None
) -> Phase:
    checks, cpu, started = hub_checks(counters_url), cpu_seconds(pid), time.perf_counter()
    began_at = time.time()
    load = time.process_time() + (cpu_seconds(hub_pid) if hub_pid else 0.0)
    busy, woken = machine_busy_seconds(), wakeups(pid)
    sent = await send
    wall = time.perf_counter() - started
    used = cpu_seconds(pid) - cpu
    load = time.process_time() + (cpu_seconds(hub_pid) if hub_pid else 0.0) - load
    others = max(0.0, machine_busy_seconds() - busy - used - load)
    woken = wakeups(pid) - woken
    checked = hub_checks(counters_url) - checks
    return Phase(name, sent, wall, used, checked, began_at, load, others, woken)


async def _bench(
    ready: dict,
    service_pid: int,
    port: int,
    seconds: float,
    concurrency: int,
    keep: bool,
    mix: str = MOVING,
    profile: Path | None = None,
    windows: int = 1,
):
    load = Load(ready["users"], port, keep, mix)
    url = ready["counters_url"]
    rss_started = rss_mb(service_pid)
    idle = await measure("idle", service_pid, url, asyncio.sleep(IDLE_S, []))
    cold = await measure("cold_burst", service_pid, url, load.burst(concurrency))
    warm = await measure("warm_burst", service_pid, url, load.burst(concurrency))
    rss_reported = rss_mb(service_pid)
    load.connections.drop_all()  # a restart closes them: the servers connect anew
    restart = await measure("restart", service_pid, url, load.steady(seconds, 1))
    if profile is not None:  # the steady windows sampled (benchmarks.ingest_profile)
        os.kill(service_pid, signal.SIGUSR1)
    steady = []
    with calibration() as samples:
        for window in range(windows):  # back to back, as a server's next minute its last
            name = "steady" if window == 0 else f"steady{window + 1}"
            send = load.steady(seconds, EXPIRED_EVERY)
            steady.append(await measure(name, service_pid, url, send, ready.get("pid")))
    for phase in steady:
        phase.calibration = (
            _calibrated(samples, phase, "cold"),
            _calibrated(samples, phase, "warm"),
        )
    if profile is not None:
        os.kill(service_pid, signal.SIGUSR2)
        deadline = time.monotonic() + 60
        while not profile.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    return [idle, cold, warm, restart, *steady], rss_started, rss_reported


@contextlib.contextmanager
def fake_hub(servers: int, seconds: float, windows: int = 1, dcgm: bool = False) -> Iterator[dict]:
    """The fake Hub in its own process, with ``servers`` users (tokens for ``seconds`` of steady
    phases, ``windows`` steady windows); yields what it printed: its URL, token, users and
    counters' URL, and with ``dcgm`` its exporter's (``exporter_urls``)."""
    hub = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.ingest",
            "--serve-hub",
            f"--servers={servers}",
            f"--seconds={seconds}",
            f"--steady-windows={windows}",
            *(["--dcgm"] if dcgm else []),
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = hub.stdout.readline()
        if not line:
            raise RuntimeError("the fake Hub subprocess did not start")
        yield {**json.loads(line), "pid": hub.pid}
    finally:
        hub.stdin.close()
        try:
            hub.wait(timeout=10)
        except subprocess.TimeoutExpired:
            hub.kill()
            hub.wait()


@contextlib.contextmanager
def service(ready: dict, **start: Any) -> Iterator[tuple[subprocess.Popen, int]]:
    """The service started (``start_service``'s keywords) and its start-up pass done; yields
    it and its port. A failure inside shows the end of the service's log."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-ingest-") as workdir,
        open(os.path.join(workdir, "service.log"), "w+") as log,
    ):
        port = _free_port()
        process = start_service(ready, workdir, port, log, **start)
        try:
            wait_until_reconciled(process, port)
            yield process, port
        except Exception as error:
            log.seek(0)
            raise RuntimeError(f"{error}; the service's log:\n{log.read()[-3000:]}") from None
        finally:
            process.terminate()
            process.wait(timeout=30)


def run(
    servers: int = 2000,
    seconds: float = 15.0,
    concurrency: int = 16,
    keep: bool = False,
    probe: bool = False,
    accept_interval: float | None = None,
    nice: int = 0,
    mix: str = MOVING,
    cull_every: float = NO_PASS_S,
    event_loop: str | None = None,
    profile: bool = False,
    windows: int = 1,
) -> dict:
    """Start the fake Hub and the service, send the phases' reports, return the figures (with
    ``probe``, what held the service's event loop in each phase: ``benchmarks.ingest_probe``;
    ``accept_interval``: the service's ``GpuGovernor.accept_interval``, else its default;
    ``nice``: the load generator and the fake Hub run at that niceness, the service at its own,
    so the service's latency shows what it costs the service, not its neighbours on the CPU;
    ``mix``: ``MOVING`` or ``IDLE_REPEAT``; ``cull_every``: the service's pass interval, the
    start-up pass's end its first tick; ``event_loop``: the service's ``GpuGovernor.event_loop``,
    else its default, ``asyncio`` with ``probe``, which times the standard loop's callbacks;
    ``profile``: where the service's CPU went in the steady phase, by part, sampled by CPU time:
    ``benchmarks.ingest_profile``; ``windows``: steady windows of ``seconds`` each, back to
    back, whose median is the steady figures' CPU)."""
    if windows < 1 or windows * seconds >= TOKEN_CACHE_S:
        # Past the token cache's age the restart minute's tokens expire in a window: more Hub
        # checks than one report in six, another phase than the others.
        raise SystemExit(
            f"--steady-windows: at least 1, and windows x --seconds under {TOKEN_CACHE_S:g} s"
        )
    if probe and event_loop not in (None, "asyncio"):
        raise SystemExit("--probe times the standard loop's callbacks: use --event-loop asyncio")
    if probe and profile:
        raise SystemExit("--probe and --profile each run the service their own way: one at a time")
    with contextlib.ExitStack() as stack:
        start: dict[str, Any] = {"cull_every": cull_every}
        args = []
        if accept_interval is not None:
            args.append(f"--GpuGovernor.accept_interval={accept_interval}")
        if probe:
            event_loop = "asyncio"
        if event_loop is not None:
            args.append(f"--GpuGovernor.event_loop={event_loop}")
        start["args"] = tuple(args)
        if probe:
            lines = Path(stack.enter_context(tempfile.TemporaryDirectory()), "probe.jsonl")
            # The service's code from $PYTHONPATH when set (a baseline's tree), the probe here.
            pythonpath = [p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p]
            # By its path: ``-m`` would take a baseline's own ``benchmarks`` first.
            start["command"] = (str(REPO / "benchmarks" / "ingest_probe.py"),)
            start["env"] = {PROBE_ENV: str(lines), "PYTHONPATH": os.pathsep.join(pythonpath)}
        sampled = None
        if profile:
            sampled = Path(stack.enter_context(tempfile.TemporaryDirectory()), "profile.pickle")
            pythonpath = [p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p]
            start["command"] = (str(REPO / "benchmarks" / "ingest_profile.py"),)
            start["env"] = {PROFILE_ENV: str(sampled), "PYTHONPATH": os.pathsep.join(pythonpath)}
        ready = stack.enter_context(fake_hub(servers, seconds, windows))
        process, port = stack.enter_context(service(ready, **start))
        if nice:  # the service started at ours: only the Hub's process and this one yield
            os.setpriority(os.PRIO_PROCESS, ready["pid"], nice)
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        phases, rss_started, rss_reported = asyncio.run(
            _bench(ready, process.pid, port, seconds, concurrency, keep, mix, sampled, windows)
        )
        held = held_loop(phases, lines) if probe else {}
        result = figures(servers, seconds, concurrency, phases, rss_started, rss_reported)
        if sampled is not None:  # sampled over every steady window: their whole CPU a report
            steady = phases[4:]
            sent = sum(len(p.sent) for p in steady)
            cpu_ms = round(1000 * sum(p.cpu_s for p in steady) / sent, 3)
            held = {**held, **breakdown(sampled, sent, cpu_ms)}
    return {
        **result,
        "connections": "kept" if keep else "one per report",
        "accept_interval": "default" if accept_interval is None else accept_interval,
        "load_nice": nice,
        "mix": mix,
        "cull_every": cull_every,
        "event_loop": event_loop or "default",
        **held,
    }


def held_loop(phases: list[Phase], lines: Path) -> dict:
    """Per measured phase, the callbacks that held the service's loop ``SLOW_MS`` or more:
    how many, their total and longest, and the three that held it longest in all, by name."""
    events = [json.loads(line) for line in lines.read_text().splitlines() if line]
    out = {}
    for phase in phases[1:]:
        ended = phase.began_at + phase.wall_s
        during = [e for e in events if phase.began_at <= e["at"] <= ended]
        # The pass's steps run inside a callback already counted: shown apart, not added.
        steps = [e for e in during if e["what"].startswith("step ")]
        held = [e for e in during if e["ms"] >= SLOW_MS and not e["what"].startswith("step ")]
        by_what: dict[str, float] = {}
        for e in held:
            by_what[e["what"]] = by_what.get(e["what"], 0.0) + e["ms"]
        top = sorted(by_what.items(), key=lambda kv: -kv[1])[:3]
        out[f"held_{phase.name}"] = (
            f"{len(held)}x/{sum(e['ms'] for e in held):.0f}ms"
            f"/max{max((e['ms'] for e in held), default=0):.0f}ms"
            f"[{'; '.join(f'{w} {ms:.0f}ms' for w, ms in top)}]"
        )
        longest: dict[str, float] = {}
        for e in steps:
            name = e["what"].removeprefix("step ")
            longest[name] = max(longest.get(name, 0.0), e["ms"])
        out[f"steps_{phase.name}"] = ",".join(
            f"{w}:max{ms:.0f}ms" for w, ms in sorted(longest.items(), key=lambda kv: -kv[1])
        )
    return out


def figures(
    servers: int,
    seconds: float,
    concurrency: int,
    phases: list[Phase],
    rss_started: float,
    rss_reported: float,
) -> dict:
    idle, cold, warm, restart, *windows = phases
    # Each steady window's CPU a report, and the median window's: one window's figure moves
    # with what else the machine runs meanwhile (docs/benchmarks-history.md, "Issue 26, wave
    # 37"); latencies over every window's reports.
    per_report = [1000 * w.cpu_s / len(w.sent) for w in windows]
    median = sorted(windows, key=lambda w: w.cpu_s / len(w.sent))[(len(windows) - 1) // 2]
    steady = Phase(
        "steady",
        [s for w in windows for s in w.sent],
        sum(w.wall_s for w in windows),
        sum(w.cpu_s for w in windows),
        sum(w.hub_checks for w in windows),
    )
    fresh = [
        s for w in windows for k, s in enumerate(w.sent) if k % EXPIRED_EVERY == EXPIRED_EVERY - 1
    ]
    fresh_ms = sorted(1000 * s.seconds for s in fresh)
    return {
        "servers": servers,
        "steady_rate_rps": round(servers / REPORT_EVERY_S, 1),
        "cold_burst_rps": round(len(cold.sent) / cold.wall_s, 1),
        "warm_burst_rps": round(len(warm.sent) / warm.wall_s, 1),
        "cold_cpu_ms_per_report": round(1000 * cold.cpu_s / len(cold.sent), 3),
        "warm_cpu_ms_per_report": round(1000 * warm.cpu_s / len(warm.sent), 3),
        "restart_p50_ms": restart.latency_ms(0.5),
        "restart_p99_ms": restart.latency_ms(0.99),
        "restart_cpu_pct": restart.cpu_pct,
        "steady_p50_ms": steady.latency_ms(0.5),
        "steady_p99_ms": steady.latency_ms(0.99),
        "steady_sent_p50_ms": steady.latency_ms(0.5, sent=True),
        "steady_sent_p99_ms": steady.latency_ms(0.99, sent=True),
        "steady_checked_p50_ms": round(statistics.median(fresh_ms), 2) if fresh_ms else None,
        "steady_cpu_pct": median.cpu_pct,
        # Per report: comparable when the service falls behind on a busy machine (the phase
        # then lasts longer than ``seconds`` and its CPU share reads lower than it costs).
        # The median window's (the lower middle of an even count), then each window's, their
        # spread ((max - min) / median), and the rest of the machine's CPU in each (% of one
        # core): the load generator and the fake Hub, and everything else on the machine.
        "steady_cpu_ms_per_report": round(1000 * median.cpu_s / len(median.sent), 3),
        "steady_cpu_ms_per_report_windows": "/".join(f"{v:.3f}" for v in per_report),
        "steady_cpu_spread_pct": round(
            100 * (max(per_report) - min(per_report)) * len(median.sent) / (1000 * median.cpu_s),
            1,
        ),
        "steady_wakeups_per_report": "/".join(f"{w.wakeups / len(w.sent):.2f}" for w in windows),
        # A fixed piece of Python in a process of its own every 2 s, its CPU in µs: after a sleep
        # (as a lone report) and right after that (warm). Slower in a window: the machine (the
        # neighbours, the host) was, whatever the code.
        "steady_calibration_cold_us": "/".join(w.calibration[0] for w in windows),
        "steady_calibration_warm_us": "/".join(w.calibration[1] for w in windows),
        "steady_load_cpu_pct": "/".join(f"{100 * w.load_cpu_s / w.wall_s:.1f}" for w in windows),
        "steady_others_cpu_pct": "/".join(
            f"{100 * w.others_cpu_s / w.wall_s:.1f}" for w in windows
        ),
        "idle_cpu_pct": idle.cpu_pct,
        "rss_mb_started": round(rss_started, 1),
        "rss_mb_reported": round(rss_reported, 1),
        "reports": sum(len(p.sent) for p in phases),
        "failed": sum(len(p.sent) - p.ok for p in phases),
        "hub_checks": ",".join(f"{p.name}:{p.hub_checks}/{len(p.sent)}" for p in phases[1:]),
        "seconds": seconds,
        "concurrency": concurrency,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2000)
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="length of each steady-rate phase"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="connections in a burst")
    parser.add_argument(
        "--keep-connections",
        action="store_true",
        help="each server keeps its connection between reports (as a server that reports more"
        " often than every REPORT_CONNECTION_IDLE_S does), with the service keeping it as long",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="time the service's event-loop callbacks and collections (benchmarks.ingest_probe)",
    )
    parser.add_argument(
        "--accept-interval",
        type=float,
        default=None,
        help="the service's GpuGovernor.accept_interval in seconds (default: its own, 0.02)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the load generator and the fake Hub at this niceness (e.g. 19), the service"
        " at its own: on a machine with few cores, latency then shows the service's own",
    )
    parser.add_argument(
        "--mix",
        choices=(MOVING, IDLE_REPEAT),
        default=MOVING,
        help=f"{MOVING}: every report differs from its server's last (the worst case);"
        f" {IDLE_REPEAT}: idle servers (60 %%) repeat their last but for sampled_at, busy ones"
        " move",
    )
    parser.add_argument(
        "--cull-every",
        type=float,
        default=NO_PASS_S,
        help="the service's pass interval in seconds (default a day: no pass while measuring;"
        " 60: passes as deployed, which the latency then includes)",
    )
    parser.add_argument(
        "--event-loop",
        choices=("auto", "uvloop", "asyncio"),
        default=None,
        help="the service's GpuGovernor.event_loop (default: its own, auto)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the service's CPU by time in the steady phase and print its parts, µs a"
        " report (benchmarks.ingest_profile), with its user and system CPU a report",
    )
    parser.add_argument(
        "--steady-windows",
        type=int,
        default=3,
        help="steady windows of --seconds each, back to back: the steady CPU is the median"
        " window's, each window's shown with its spread (one window's figure moves with the"
        " machine: 0.557 and 0.752 ms on the same code, quiet, back to back)",
    )
    parser.add_argument("--serve-hub", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dcgm", action="store_true", help=argparse.SUPPRESS)  # (with it)
    parser.add_argument("--serve-calibration", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_calibration:
        _serve_calibration()
        return
    if args.serve_hub:
        asyncio.run(_serve_hub(args.servers, args.seconds, args.steady_windows, args.dcgm))
        return
    result = run(
        args.servers,
        args.seconds,
        args.concurrency,
        args.keep_connections,
        args.probe,
        args.accept_interval,
        args.nice,
        args.mix,
        args.cull_every,
        args.event_loop,
        args.profile,
        args.steady_windows,
    )
    print("ingest:", " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
