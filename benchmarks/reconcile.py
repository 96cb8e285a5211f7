"""Reconcile pass over N running servers: the governor against jupyterhub-idle-culler.

    python -m benchmarks.reconcile [--servers 10000] [--passes 5] [--changed 0.1]
                                   [--page-size 200] [--concurrency 10]
                                   [--gpus-per-exporter 0] [--stagger 6] [--profile N]

``--servers 1000,10000,50000`` runs each size apart and ``--changed 0.01,0.1,1`` each share of
servers changed between passes (``passes`` passes each); with more than one row the run ends
with a Markdown table of the curve (``curve``): what a pass costs per server that exists and per
server that changed.

Both list the same fake Hub (``tests/fake_hub_api.FakeHub``, ``populate(n)``: every user has one
ready default server, last activity spread over a week), each server's spawner state as a
zero-to-jupyterhub Hub keeps it (``kubespawner_state``: KubeSpawner's pod name and namespace,
and the profile layer's grant where one names a team). The governor's pass (``Governor.
reconcile``) also reads a dcgm-exporter text exposition with one GPU per GPU server (labelled
with the server's pod and namespace, so the governor finds each server's GPU by its pod, as in a
deployment), decides every server against fresh in-memory reports (docs/api.md, "The report": one
device, one kernel, mixed idle/active, some MIG, CPU-only servers send none) and writes its
SQLite store. The culler's pass (``cull_idle``) lists the same users and applies its rule. Both
run with long timers, so they decide everything; the culler culls nothing, but the governor
treats a confident zombie diagnosis (memory held, no GPU work, an owner long gone: many of
these idle kernels) as an owner away, warns at once and asks for a checkpoint before the cull
(docs/benchmarks-history.md, "Scale: 10,000 servers").

Fairness:

- The fake Hub and the DCGM exporter run in a *subprocess*, as the Hub and the exporters do in a
  deployment. In-process, serving the pages (JSON for 10,000 user models) would cost both clients
  the same CPU on the same loop and push the ratio towards 1; apart, each pass pays for its own
  work plus the Hub's real latency, and the Hub serves the next page while the client decodes
  this one (both prefetch one page ahead).
- Same page size (``limit``) and the same bound on requests in flight for both.
- Passes are interleaved (governor, culler, governor, culler, ...) after one unmeasured warm-up
  of each, with a garbage collection before each. ``ratio`` is of the mean passes: the governor
  writes its usage ledger one pass in five (``usage_write_every``, 5 min, at a 60 s cycle), which
  a median would leave out; medians are reported too. Keep ``--passes`` a multiple of 5.
- Between governor passes the governor's clock moves one ``--cycle`` on and every GPU server
  re-sends its report, as they do every minute: reasons such as "GPU idle for 3h 2m" then change
  and those rows are written again, which is the real steady state (a pass seconds after the
  previous one would write almost nothing). Ingesting the reports is timed apart (``ingest_us``).
- Before each pass a ``--changed`` share of the GPU servers changes state (active <-> idle, in
  turn through the fleet): their reports say so from then on, and DCGM from its next scrape
  (the exporter's series follow the change; the read a pass takes was made after the pass
  before, as a deployment's is a cycle old; the 5 % whose reports claim work DCGM does not see
  stay idle to DCGM). The others report what they did (an idle one from the same
  ``idle_since``). ``changed_servers`` is how many; a pass that decides only what changed would
  cost in proportion to it (``governor_ms_per_changed``). ``mix`` is what a pass decided
  (running servers by state after it, medians) and ``mix_audited`` what it audited (warnings,
  checkpoints asked, culls, state changes).
- Staggered starts (``--stagger N``, default 6): each GPU server's first report arrives at one
  of the first N passes, and N more settle them, all unmeasured, so the zombies' checkpoint
  requests and timeouts do not fall in one pass as one wave (docs/benchmarks-history.md, "Wave 4,
  round two"). ``decided`` is how many servers a pass decided (the rest kept their decision).
- The fake servers answer checkpoint requests as the extension does (``answer_checkpoint``:
  the result, with the request's ``requested_at``, in the next report and every later one; one
  in ten fails), and a server the governor culled reports no more: a zombie is checkpointed once
  and culled, and the fleet both passes list shrinks as the zombies go.
- The fake Hub's clock moves with the governor's (``advance``): a stop stamps its user's
  activity in the governor's time, as one clock would in a deployment, so the incremental
  listing finds the servers it culled gone.
- The subprocess also answers as metrics-server does (``benchmarks.pod_metrics``: the running
  servers' pods and the chart's, as the aggregated API lists a namespace's PodMetrics), and the
  governor reads it each pass as on a cluster with metrics-server (``hub/pod_cpu.py``; the pods
  the servers' states name). ``pod_cpu_s`` is that read's wall
  time in a pass (beside the Hub's groups and DCGM), ``pod_cpu_thread_cpu_s`` its parser
  thread's CPU; ``--no-pod-cpu``: a cluster without it.
- The governor's first pass, which inserts every row, is reported on its own (``first_pass_s``;
  with a stagger, only the first pass's share of the servers report by then).

The breakdown of the governor's pass wraps methods of *this* benchmark's objects (DCGM fetch,
store reads, the decide loop, store writes); ``reconcile.py`` is untouched. The Hub listing
overlaps the decisions (a page is decided while the next is fetched), so it is timed alone after
the passes (``hub_list_alone_s``, median of 3). The DCGM
read (HTTP and parsing) runs in the service's worker process, started as a pass ends for the
next one; the benchmark lets it finish before anything else runs, as the minute between two
passes does in a deployment. ``dcgm_s`` is its wall time as the service awaits it and
``dcgm_worker_cpu_s`` the worker's CPU for it. ``governor_rss_mb`` is this process after the
governor's first pass, before the culler ever ran; ``rss_mb`` after all passes (governor and
culler; the Hub is elsewhere); ``db_mb`` is the SQLite file with its WAL after them. Then the
clock moves a day on and two more passes run: ``ledger_rows_per_day`` and ``ledger_mb_per_day``
are what a day of usage ledger adds (one bucket per owner and day: the ledger's tables and
indexes, in SQLite pages used), ``store_mb_per_day`` what the whole file grew by (with the
audit rows of the state changes and of the day's jump: the DCGM read the first of those passes
finds is a day old, so its GPUs read unknown).

Two things outside the governor need care: the fake Hub's version ``6.1.0-fake`` is not PEP 440,
which the culler's ``Version()`` refuses, so the subprocess answers ``6.1.0+fake``; and
``cull_idle`` reconfigures tornado's ``AsyncHTTPClient`` for the whole process, which ``run``
puts back afterwards (as it does the governor's clock).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import gc
import inspect
import io
import json
import logging
import math
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from .pod_metrics import METRICS_ROUTE, metrics_handler, pod_metrics_list

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CHANGED = 0.1  # the share of GPU servers that change state between two passes
# Passes over which the GPU servers' first reports are spread (staggered starts): more than the
# default checkpoint timeout (5 min) at a 60 s cycle, so the zombies' checkpoint requests and
# timeouts spread over as many passes as a real fleet's would.
DEFAULT_STAGGER = 6
NAMESPACE = "jhub"
PROFILES = (("a100", 0.6), ("mig-1g.10gb", 0.25), ("cpu", 0.15))  # cpu: no GPU, no report
TEAMS = ("team-a", "team-b", "team-c")  # populate()'s groups
# A pass's mix (``mix``, ``mix_audited``): the states counted, and the audit actions.
MIX_STATES = ("active", "busy", "idle", "warned", "checkpointing", "culled", "unknown")
MIX_ACTIONS = ("warn", "checkpoint", "cull", "state")
# dcgm-exporter's default counters: the governor reads 10 of them (9 signals and the last XID),
# the rest are parsed and dropped.
DCGM_METRICS = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus."),
)


# -- the fleet: one plan, computed the same way in both processes ---------------------------------


@dataclass(frozen=True)
class Planned:
    user: str
    profile: str
    team_label: str | None  # the grant's gpu-gov/team (spawner state), else from a group
    gpu_uuid: str | None  # the physical GPU; None for a CPU-only server
    mig_uuid: str | None  # the MIG device the report names, for a MIG profile ("mig-<profile>")
    gi_id: int | None
    gpu_index: int
    report_active: bool
    dcgm_active: bool

    @property
    def pod(self) -> str:
        return f"jupyter-{self.user}"  # KubeSpawner's default pod name


def plan(n: int, seed: int = 0) -> list[Planned]:
    """Deterministic for ``(n, seed)``; user names are ``FakeHub.populate``'s."""
    rng = random.Random(seed + 1)
    width = len(str(n))
    fleet = []
    for i in range(n):
        profile = rng.choices([p for p, _ in PROFILES], [w for _, w in PROFILES])[0]
        gpu = profile != "cpu"
        mig = profile.startswith("mig-")
        report_active = rng.random() < 0.4
        # DCGM mostly agrees; 5% report "active" while the GPU is idle (DCGM wins, docs/security.md).
        dcgm_active = report_active and rng.random() >= 0.05 / 0.4
        fleet.append(
            Planned(
                user=f"user{i:0{width}d}",
                profile=profile,
                team_label=TEAMS[(i // 3) % len(TEAMS)] if i % 3 == 0 else None,
                gpu_uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}" if gpu else None,
                mig_uuid=f"MIG-{uuid.UUID(int=rng.getrandbits(128), version=4)}" if mig else None,
                gi_id=rng.randrange(1, 8) if mig else None,
                gpu_index=i % 8,
                report_active=report_active,
                dcgm_active=dcgm_active,
            )
        )
    return fleet


def exposition(
    fleet: list[Planned], node: int, busy: Mapping[str, bool] | None = None, scrape: int = 0
) -> str:
    """One dcgm-exporter ``/metrics`` body for these GPUs (``node`` names its Hostname).
    ``busy``: whether each user's GPU works now (default: the plan's ``dcgm_active``).
    ``scrape``: which scrape of this exporter it is. A real exporter's records move at every
    scrape though no GPU's work changed: power, memory used, PCIe bytes, clocks, temperature,
    energy, GPU_UTIL (``_jittered``). The governor must not take those moves for a change of
    what it decides on (hub/dcgm.py, ``decision_read``); a fake whose values stood still
    hid that cost. Seeded by ``(node, scrape)``: the same scrape gives the same body."""
    gpus = [p for p in fleet if p.gpu_uuid]
    rng = random.Random(f"dcgm-{node}-{scrape}")
    values = [_jittered(p.dcgm_active if busy is None else busy[p.user], scrape, rng) for p in gpus]
    labels = []
    for p in gpus:
        mig = f',GPU_I_PROFILE="{p.profile[4:]}",GPU_I_ID="{p.gi_id}"' if p.mig_uuid else ""
        labels.append(
            f'gpu="{p.gpu_index}",UUID="{p.gpu_uuid}",pci_bus_id="00000000:{p.gpu_index + 7:02X}:00.0",'
            f'device="nvidia{p.gpu_index}",modelName="NVIDIA A100-SXM4-80GB",'
            f'Hostname="gpu-node-{node}",DCGM_FI_DRIVER_VERSION="550.54.15"{mig},'
            f'container="notebook",namespace="{NAMESPACE}",pod="{p.pod}"'
        )
    lines = []
    for metric, help_text in DCGM_METRICS:
        lines.append(f"# HELP {metric} {help_text}")
        lines.append(f"# TYPE {metric} {'counter' if 'ENERGY' in metric else 'gauge'}")
        lines.extend(
            f"{metric}{{{label}}} {value[metric]}"
            for label, value in zip(labels, values, strict=True)
        )
    return "\n".join(lines) + "\n"


def service_dcgm_max_bytes() -> int:
    """The most one DCGM answer may hold in a deployment with the defaults (``dcgm_max_bytes``,
    docs/security.md): a larger one fails the read, and every GPU it names reads unknown."""
    from jupyter_gpu_gov.hub.settings import GovernorSettings

    return GovernorSettings.class_traits()["dcgm_max_bytes"].default_value


def exporter_share(gpus: list[Planned], max_bytes: int) -> int:
    """GPUs an exporter serves when ``--gpus-per-exporter`` is not given: all of them while
    their answer stays within three quarters of ``max_bytes`` (the jitter moves a body's
    length by a few bytes a line), else the fewest equal shards that do, as a fleet that large
    has many exporters. At 50,000 servers one answer is ~193 MB, past the service's 64 MiB:
    the benchmark measured a read a deployment's defaults refuse."""
    if not gpus:
        return 1
    sample = gpus[:256]
    per_gpu = len(exposition(sample, 0).encode()) / len(sample)
    shards = max(1, math.ceil(per_gpu * len(gpus) / (max_bytes * 3 // 4)))
    return math.ceil(len(gpus) / shards)


def _jittered(busy: bool, scrape: int, rng: random.Random) -> dict[str, float | int]:
    """One GPU's values at one scrape. What the governor's decisions and history read stands
    still while the GPU's work does (the activity, GR_ENGINE_ACTIVE, and the diagnosis's
    tensor and DRAM activity, which move the history's 1 % steps when they move); the rest
    moves every scrape as on a real exporter: power, clocks, temperature, energy, PCIe bytes
    (an idle GPU's driver chatter stays under the governor's 1 MB/s floor), GPU_UTIL (read only
    where GR_ENGINE_ACTIVE is missing), and memory used (a busy GPU's by the allocator's 2 MiB
    pages, within the history's 64 MiB quantum: a move past it is read)."""
    power = rng.uniform(250.0, 400.0) if busy else rng.uniform(55.0, 70.0)
    used = 20480 + (2 * rng.randrange(32) if busy else 0)
    return {
        "DCGM_FI_DEV_SM_CLOCK": rng.randrange(1275, 1411, 15)
        if busy
        else rng.randrange(210, 346, 15),
        "DCGM_FI_DEV_MEM_CLOCK": 1593,
        "DCGM_FI_DEV_GPU_TEMP": rng.randrange(55, 71) if busy else rng.randrange(28, 35),
        "DCGM_FI_DEV_POWER_USAGE": round(power, 3),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (scrape + 1) * 60_000 * round(power),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_GPU_UTIL": rng.randrange(80, 96) if busy else 0,
        "DCGM_FI_DEV_MEM_COPY_UTIL": rng.randrange(25, 46) if busy else 0,
        "DCGM_FI_DEV_XID_ERRORS": 0,  # the last XID: none on a healthy fleet
        "DCGM_FI_DEV_FB_FREE": 81920 - used,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.83 if busy else 0.0,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.41 if busy else 0.0,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.35 if busy else 0.0,
        # Bytes/s: a busy GPU's copies; an idle one's driver chatter only.
        "DCGM_FI_PROF_PCIE_TX_BYTES": round(
            rng.uniform(1.5e8, 3.5e8) if busy else rng.uniform(6e4, 1.4e5)
        ),
        "DCGM_FI_PROF_PCIE_RX_BYTES": round(
            rng.uniform(2.5e8, 5.5e8) if busy else rng.uniform(3e4, 8e4)
        ),
    }


def report_of(
    p: Planned,
    started: datetime,
    last_activity: datetime,
    now: datetime,
    active: bool | None = None,
    idle_since: datetime | None = None,
    checkpoint: dict | None = None,
) -> dict:
    """A valid report: one device, one kernel holding it. ``active``: the GPU's state
    now (default: the plan's), idle since ``idle_since`` (default: three hours ago), or since
    the server started if that is later. ``checkpoint``: the server's last checkpoint (none
    taken: ``None``), which every later report carries, as the extension's do."""

    def iso(dt: datetime | None) -> str | None:
        return None if dt is None else dt.isoformat().replace("+00:00", "Z")

    device_uuid = p.mig_uuid or p.gpu_uuid
    active = p.report_active if active is None else active
    if active:
        idle_since = None
    else:  # never before the server started: the governor refuses such a report
        idle_since = max(started, now - timedelta(hours=3) if idle_since is None else idle_since)
    return {
        "schema": 1,
        "sampled_at": iso(now),
        "backend": "nvml",
        "server": {
            "user": p.user,
            "name": "",
            "started": iso(started),
            "last_activity": iso(last_activity),
            "pod": p.pod,
            "namespace": NAMESPACE,
            "gpu_allocated": True,
        },
        "devices": [
            {
                "uuid": device_uuid,
                "parent_uuid": p.gpu_uuid if p.mig_uuid else None,
                "name": "NVIDIA A100-SXM4-80GB",
                "mig_profile": "1g.10gb" if p.mig_uuid else None,
                "memory_total_mb": 9984 if p.mig_uuid else 81920,
                "memory_used_mb": 4096,
                "activity": 0.8 if active else 0.0,
                "shared": False,
            }
        ],
        "targets": [
            {
                "kind": "kernel",
                "id": str(uuid.uuid5(uuid.NAMESPACE_URL, p.user)),
                "name": "python3",
                "execution_state": "idle",
                "last_activity": iso(last_activity),
                "connections": 1,
                "gpu": {
                    "devices": [device_uuid],
                    "memory_mb": 4096,
                    "sm": 0.8 if active else 0.0,
                    "holds_context": True,
                    "confidence": "exact",
                    "last_active": iso(now if active else idle_since),
                },
                "cpu": {"cores": 0.02, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60},
            }
        ],
        "window": {
            "seconds": 60,
            "gpu_active_fraction": 0.8 if active else 0.0,
            "gpu_idle_since": iso(idle_since),
        },
        "checkpoint": checkpoint or {"requested_at": None, "status": None, "manifest": None},
    }


# One fake server in this many fails its checkpoint (a hook that raised), as some real ones do.
CHECKPOINT_FAILS_ONE_IN = 10


def answer_checkpoint(p: Planned, verdict: dict) -> dict | None:
    """What a server's extension does with a checkpoint request in its verdict
    (``server/app.py``, ``_take_up_requests``): it checkpoints and reports the result, with the
    request's ``requested_at``, from its next report on. ``None``: nothing asked."""
    asked = (verdict.get("requests") or {}).get("checkpoint")
    if not isinstance(asked, dict) or not isinstance(asked.get("requested_at"), str):
        return None
    fails = int(uuid.uuid5(uuid.NAMESPACE_URL, p.user)) % CHECKPOINT_FAILS_ONE_IN == 0
    status = "failed" if fails else "done"
    manifest = {
        "id": f"{p.user}-ckpt",
        "path": f"/home/{p.user}/.gpu-gov/checkpoints/{p.user}-ckpt",
        "status": status,
        "requested_at": asked["requested_at"],
        "notebooks": [] if fails else ["train.ipynb"],
        "errors": ["hook save_model: CUDA error: out of memory"] if fails else [],
    }
    return {"requested_at": asked["requested_at"], "status": status, "manifest": manifest}


# -- the subprocess: fake Hub and DCGM exporter ---------------------------------------------------


def kubespawner_state(p: Planned) -> dict[str, Any]:
    """The spawner state a zero-to-jupyterhub Hub keeps for the server (KubeSpawner's
    ``get_state``): its pod and namespace, which DCGM's ``pod``/``namespace`` labels and
    metrics-server name too, so the governor finds the server's GPUs by its pod (``hub/
    trusted.py``), as in a deployment, and not only through what its report names."""
    return {
        "kubespawner_version": "7.1.0",
        "pod_name": p.pod,
        "namespace": NAMESPACE,
        "dns_name": f"{p.pod}.{NAMESPACE}.svc.cluster.local",
    }


async def _serve(n: int, seed: int, page_size: int, gpus_per_exporter: int) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    import fake_hub_api
    from tornado import web
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    from jupyter_gpu_gov.core import clock

    # The fake says "6.1.0-fake", which is not PEP 440: the culler's Version() refuses it. A real
    # Hub's version always parses; "+fake" keeps the hint and is a valid local version.
    def version(handler: web.RequestHandler) -> None:
        handler.finish(json.dumps({"version": "6.1.0+fake"}))

    fake_hub_api._RootHandler.get = version

    hub = fake_hub_api.FakeHub(page_default=page_size, page_max=max(200, page_size))
    hub.populate(n, seed=seed, groups=TEAMS)
    hub.groups[TEAMS[1]]["properties"]["gpu-gov/team"] = True  # one team by group properties
    fleet = plan(n, seed)
    servers = {}
    for p in fleet:
        server = hub.users[p.user].servers[""]
        server.user_options = {"profile": p.profile}
        server.state = kubespawner_state(p)
        if p.team_label:  # the profile layer's grant, in the spawner's state beside KubeSpawner's
            server.state["gpu_gov_grant"] = {"gpu-gov/team": p.team_label}
        servers[p.user] = [clock.isoformat(server.started), clock.isoformat(server.last_activity)]
    hub.start()

    gpus = [p for p in fleet if p.gpu_uuid]
    size = gpus_per_exporter or exporter_share(gpus, service_dcgm_max_bytes())
    # Each GPU's work as DCGM sees it. The reports' "active" that DCGM finds idle (``plan``'s
    # 5 %) stay so: such a server's GPU idles whatever its report says.
    busy = {p.user: p.dcgm_active for p in gpus}
    claims = {p.user for p in gpus if p.report_active and not p.dcgm_active}
    exporters = max(1, -(-len(gpus) // size))
    scrapes = [0] * exporters  # each exporter's scrapes so far: its values move at each

    def shard(k: int) -> bytes:
        return exposition(gpus[k * size : (k + 1) * size], k, busy, scrapes[k]).encode()

    class Metrics(web.RequestHandler):
        def get(self, node: str) -> None:
            """A scrape: every record's moving values (power, clocks, PCIe bytes...) moved
            since the last (``exposition``), as a real exporter's do."""
            k = int(node)
            body = shard(k)
            scrapes[k] += 1
            self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.finish(body)

    class GpuState(web.RequestHandler):
        def put(self) -> None:
            """The GPUs whose work changed (user -> active, as their reports say from now on):
            the exporters' next scrape shows it, as DCGM would."""
            changed = json.loads(self.request.body)
            for user, active in changed.items():
                busy[user] = bool(active) and user not in claims

    # metrics-server's list, as it holds its last scrape: built when the clock moves (between
    # passes), so a pass's read pays for its own work and the transfer, not for this fake's
    # Python serialising ten thousand items (metrics-server answers from memory, in Go).
    listed: dict[str, bytes] = {}

    def pod_metrics(namespace: str) -> bytes:
        """The PodMetrics of the servers still running, on the shared clock."""
        if namespace not in listed:
            running = [(p.user, "", p.pod) for p in fleet if hub.running(p.user)]
            users = running if namespace == NAMESPACE else []
            listed[namespace] = pod_metrics_list(users, namespace, clock.utcnow())
        return listed[namespace]

    class Clock(web.RequestHandler):
        def put(self, seconds: str) -> None:
            clock.advance(float(seconds))  # the benchmark moved the governor's clock this much
            listed.clear()
            pod_metrics(NAMESPACE)

    sockets = bind_sockets(0, "127.0.0.1")
    routes = [
        (r"/metrics/(\d+)", Metrics),
        (r"/clock/([-0-9.e]+)", Clock),
        (r"/gpu-state", GpuState),
        (METRICS_ROUTE, metrics_handler(pod_metrics)),
    ]
    HTTPServer(web.Application(routes)).add_sockets(sockets)
    served = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    dcgm = f"{served}/metrics"
    ready = {
        "api_url": hub.api_url,
        "token": hub.token,
        "exporter_urls": [f"{dcgm}/{i}" for i in range(exporters)],
        "clock_url": f"{served}/clock",
        "gpu_state_url": f"{served}/gpu-state",
        "kubernetes_api_url": served,  # metrics-server's PodMetrics (benchmarks.pod_metrics)
        "servers": servers,  # user -> [started, last_activity], for the reports
        "dcgm_bytes": sum(len(shard(k)) for k in range(exporters)),
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    # Serve until the benchmark closes our stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    hub.stop()


# -- timing ---------------------------------------------------------------------------------------


class Timers:
    """Seconds spent in wrapped callables, summed per name; reset before each pass. ``calls``
    keeps every call's seconds for the whole run: a background DCGM scrape may finish after the
    pass that started it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.calls: dict[str, list[float]] = defaultdict(list)
        self._originals: list[tuple[Any, str, Any]] = []

    def reset(self) -> None:
        self.seconds.clear()
        self.counts.clear()

    def wrap(self, obj: Any, attr: str, name: str, count: Callable[..., int] | None = None) -> None:
        """Replace ``obj.attr`` (a method or function) by a timed one, on that object only."""
        fn = getattr(obj, attr)
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self._add(name, time.perf_counter() - started)
                    if count is not None:
                        self.counts[name] += count(*args, **kwargs)

        else:

            @functools.wraps(fn)
            def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self._add(name, time.perf_counter() - started)
                    if count is not None:
                        self.counts[name] += count(*args, **kwargs)

        self._originals.append((obj, attr, obj.__dict__.get(attr)))
        setattr(obj, attr, timed)

    def _add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.calls[name].append(seconds)

    def restore(self) -> None:
        """Undo every wrap (a module's function must not stay wrapped after the run)."""
        for obj, attr, original in reversed(self._originals):
            if original is None:
                delattr(obj, attr)  # it was the class's method
            else:
                setattr(obj, attr, original)
        self._originals.clear()


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _bench(
    ready: dict,
    n: int,
    seed: int,
    passes: int,
    page_size: int,
    concurrency: int,
    cycle_s: float,
    workdir: str,
    profile_top: int,
    timers: Timers,
    changed: list[float],
    full_every: int = 1,
    stagger: int = 1,
    pod_cpu: bool = True,
) -> dict:
    from jupyterhub_idle_culler import cull_idle, default_cull_arbiter
    from tornado.httpclient import AsyncHTTPClient

    from jupyter_gpu_gov.core import clock
    from jupyter_gpu_gov.core.policy import load_policies
    from jupyter_gpu_gov.core.report import validate
    from jupyter_gpu_gov.core.vocabulary import CULLED
    from jupyter_gpu_gov.hub import pod_cpu as pod_cpu_module
    from jupyter_gpu_gov.hub.dcgm_source import DcgmSource
    from jupyter_gpu_gov.hub.diagnosis import DiagnosisOptions
    from jupyter_gpu_gov.hub.hubapi import HubApi
    from jupyter_gpu_gov.hub.options import Options
    from jupyter_gpu_gov.hub.pod_cpu import PodCpuOptions
    from jupyter_gpu_gov.hub.reconcile import Governor
    from jupyter_gpu_gov.hub.store import Store

    db = os.path.join(workdir, "gov.sqlite")
    store = Store(f"sqlite:///{db}")
    hub = HubApi(ready["api_url"], ready["token"], concurrency=concurrency, page_size=page_size)
    # A 10,000-GPU exposition is tens of MB: more than the default 5 s would allow on a busy box.
    # The answer's bound is the service's default (the source's own is larger).
    dcgm = DcgmSource(
        exporter_urls=ready["exporter_urls"], timeout_s=60, max_bytes=service_dcgm_max_bytes()
    )
    never = "3650d"  # decide everything; timers alone warn and cull nothing
    policies = load_policies(
        [],
        defaults={
            "warn_after": never,
            "cull_after": "3651d",
            "inactive_timeout": never,
            "away_after": None,
        },
    )
    # Reports are diagnosed as they arrive (in ``ingest_us``); the model's training, a worker
    # thread's job every few hours, is kept out of the passes measured here.
    no_training = DiagnosisOptions(min_windows=10**9)
    # The pods' CPU from the fake's metrics-server, as a cluster with one reads it each pass
    # (hub/pod_cpu.py; ``--no-pod-cpu``: a cluster without it).
    metrics = PodCpuOptions(
        kubernetes_api_url=ready["kubernetes_api_url"], kubernetes_token_file=""
    )
    options = Options(
        diagnosis=no_training,
        full_pass_every=full_every,
        **({"pod_cpu": metrics} if pod_cpu else {}),
    )
    # The pods' CPU is read for the pods the fake Hub's states name (``kubespawner_state``),
    # as the governor finds them in a deployment: nothing is named to the reader here.
    gov = Governor(store, hub, policies, options, dcgm)

    # The governor decides page by page while listing, so listing time is inside "decide"'s
    # wall time; DCGM is scraped in the background and parsed in a worker thread.
    timers.wrap(dcgm, "fetch", "dcgm")
    worker_cpu: list[float] = []  # what each read cost the DCGM worker process
    fetch = dcgm.fetch

    async def fetch_noting_cpu() -> Any:
        snapshot = await fetch()
        worker_cpu.append(snapshot.cpu_s)
        return snapshot

    dcgm.fetch = fetch_noting_cpu
    timers.wrap(store, "servers", "store_read")
    timers.wrap(gov, "_govern", "decide", count=lambda *_, **__: 1)
    # A pass's rows and audit rows go in one transaction (decisions on record before acting).
    # A pass's writes run in the store's writer thread (``save_async``, ``save_usage_async``),
    # a person's on the loop: both counted, the pass's as the wall time it awaits.
    for write in ("save", "save_async"):
        timers.wrap(store, write, "store_write", count=lambda rows=(), *_, **__: len(rows))
    timers.wrap(store, "audit", "store_audit")
    for write in ("save_usage", "save_usage_async"):
        timers.wrap(store, write, "ledger_write")
    timers.wrap(gov, "_publish_gauges", "metrics")
    # The pods' CPU: the read's wall time in a pass (beside the Hub's groups and DCGM), and
    # its parser thread's CPU (the answer read and folded, off the loop but under the GIL).
    timers.wrap(gov.pod_cpu, "read", "pod_cpu")
    threaded = "_fold" if hasattr(pod_cpu_module, "_fold") else "_parse"  # (before wave 37)
    parse = getattr(pod_cpu_module, threaded)

    def timed_parse(*args: Any) -> Any:
        started = time.thread_time()
        try:
            return parse(*args)
        finally:
            timers.calls["pod_cpu_thread"].append(time.thread_time() - started)

    timers._originals.append((pod_cpu_module, threaded, parse))
    setattr(pod_cpu_module, threaded, timed_parse)

    fleet = [p for p in plan(n, seed) if p.gpu_uuid]
    times = {user: [clock.parse(s), clock.parse(a)] for user, (s, a) in ready["servers"].items()}
    # Each GPU server's state as its reports say: active, or idle since when.
    start = clock.utcnow()
    gpu_state = {p.user: (p.report_active, start - timedelta(hours=3)) for p in fleet}
    next_flip = 0

    async def change(share: float) -> int:
        """A ``share`` of the GPU servers change state (active <-> idle) before the next
        reports, taken in turn through the fleet; the others report what they did. DCGM sees
        the change from its next scrape on: the read this pass takes was made after the last
        pass, so it shows the change one pass after the reports (a deployment's DCGM read is a
        cycle old too)."""
        nonlocal next_flip
        count = min(len(fleet), round(share * len(fleet)))
        now = clock.utcnow()
        flipped = {}
        for k in range(count):
            user = fleet[(next_flip + k) % len(fleet)].user
            active, _ = gpu_state[user]
            gpu_state[user] = (not active, now)
            flipped[user] = not active
        next_flip = (next_flip + count) % max(1, len(fleet))
        if flipped:
            body = json.dumps(flipped).encode()
            await AsyncHTTPClient().fetch(ready["gpu_state_url"], method="PUT", body=body)
        return count

    # Staggered starts: a fleet's servers start, and first report, at different times. Each GPU
    # server's reports begin at one of the first ``stagger`` passes (unmeasured), so their
    # diagnoses, checkpoint requests and checkpoint timeouts do not all fall in one pass.
    stagger_rng = random.Random(seed + 2)
    joins = {p.user: stagger_rng.randrange(max(1, stagger)) for p in fleet}

    async def advance(seconds: float) -> None:
        """The governor's clock moves on, and the fake Hub's with it: the Hub stamps a stop as
        its user's activity, which the incremental listing reads in the governor's time."""
        clock.advance(seconds)
        await AsyncHTTPClient().fetch(f"{ready['clock_url']}/{seconds}", method="PUT", body=b"")

    # Each fake server's last checkpoint, taken when a verdict asked for one (``answer_
    # checkpoint``); servers the governor stopped (culled) report no more.
    checkpoints: dict[str, dict] = {}

    def running(p: Planned) -> bool:
        row = gov.rows.get(f"{p.user}/")
        return row is None or (row.running and row.state != CULLED)

    def ingest_all(joined: int = stagger) -> float:
        """Every GPU server that joined by pass ``joined`` of the stagger, and still runs,
        re-sends its report (outside the timed pass) and takes up what its verdict asks, as
        the extension does; seconds per report."""
        now = clock.utcnow()
        sending = [p for p in fleet if joins[p.user] <= joined and running(p)]
        reports = [
            report_of(p, *times[p.user], now, *gpu_state[p.user], checkpoints.get(p.user))
            for p in sending
        ]
        verdicts = []
        started = time.perf_counter()
        for report in reports:
            verdicts.append(gov.ingest(validate(report)))  # as the report route does
        elapsed = time.perf_counter() - started
        for p, verdict in zip(sending, verdicts, strict=True):
            answer = answer_checkpoint(p, verdict)
            if (
                answer is not None
                and checkpoints.get(p.user, {}).get("requested_at") != (answer["requested_at"])
            ):
                checkpoints[p.user] = answer  # in its next report, a minute later
        return elapsed / max(1, len(reports))

    culler_seen = 0

    def arbiter(**kwargs: Any) -> bool:
        nonlocal culler_seen
        culler_seen += 1  # one call per server it judged
        return default_cull_arbiter(**kwargs)

    # The culler logs at INFO in a deployment: keep its records, drop the output.
    culler_log = logging.getLogger("benchmarks.reconcile.culler")
    culler_log.setLevel(logging.INFO)
    culler_log.propagate = False
    culler_log.handlers[:] = [logging.NullHandler()]

    async def governor_pass() -> tuple[float, int, dict[str, float], dict[str, int]]:
        gc.collect()
        timers.reset()
        started = time.perf_counter()
        result = await gov.reconcile()
        elapsed = time.perf_counter() - started
        # The DCGM read the pass started for the next one runs between passes (a deployment has
        # a cycle for it): not alongside the culler's pass or the next reports.
        await gov.background_done()
        if result.dcgm_errors:
            raise RuntimeError(f"DCGM: {result.dcgm_errors[:3]}")
        return elapsed, result.servers, dict(timers.seconds), dict(timers.counts)

    async def culler_pass() -> tuple[float, int]:
        nonlocal culler_seen
        gc.collect()
        culler_seen = 0
        started = time.perf_counter()
        await cull_idle(
            ready["api_url"],
            ready["token"],
            inactive_limit=10 * 365 * 86400,  # cull nothing
            logger=culler_log,
            cull_users=False,
            concurrency=concurrency,
            api_page_size=page_size,
            cull_arbiter=arbiter,
        )
        return time.perf_counter() - started, culler_seen

    audited = 0  # the last audit row a pass's mix counted

    def note_mix(parts: dict[str, list[float]]) -> None:
        """After a measured pass, outside its time: the running servers by state, and what the
        pass audited by action (a warning, a checkpoint asked, a cull, a state change)."""
        nonlocal audited
        states: dict[str, int] = defaultdict(int)
        for row in gov.rows.values():
            if row.running:
                states[row.state] += 1
        for state in MIX_STATES:
            parts[f"state:{state}"].append(states.get(state, 0))
        with store.engine.connect() as connection:
            actions = connection.exec_driver_sql(
                "SELECT action, COUNT(*), MAX(id) FROM audit WHERE id > ? GROUP BY action",
                (audited,),
            ).all()
        counted = {action: count for action, count, _ in actions}
        audited = max([audited, *(last for _, _, last in actions)])
        for action in MIX_ACTIONS:
            parts[f"audit:{action}"].append(counted.get(action, 0))

    ingest_s = [ingest_all(0)]
    first_s, first_seen, first_parts, first_counts = await governor_pass()
    # Unmeasured: the servers join, then as many passes again settle them (the last to join
    # have their diagnoses, checkpoint requests and timeouts in these).
    for joined in range(1, 2 * stagger if stagger > 1 else 1):
        await advance(cycle_s)
        ingest_all(joined)
        await governor_pass()
    gc.collect()
    governor_rss = _rss_mb()  # the governor alone: its first pass done, the culler not yet run
    culler_first_s, _ = await culler_pass()
    gov_seen = cul_seen = 0
    by_share = []  # per share of servers changed between passes: its passes' figures
    for share in changed:
        gov_s, cul_s, parts, written = [], [], defaultdict(list), []
        changed_n = 0
        for _ in range(passes):
            await advance(cycle_s)
            changed_n = await change(share)
            ingest_s.append(ingest_all())
            elapsed, gov_seen, pass_parts, counts = await governor_pass()
            gov_s.append(elapsed)
            for name, seconds in pass_parts.items():
                parts[name].append(seconds)
            # Whether this pass wrote the usage ledger (one pass in five): it moves the mean.
            parts["ledger_pass"].append(float("ledger_write" in pass_parts))
            written.append(counts.get("store_write", 0))
            parts["decided"].append(counts.get("decide", 0))
            parts["listed_whole"].append(float(gov.hub_listing.full))
            note_mix(parts)
            elapsed, cul_seen = await culler_pass()
            cul_s.append(elapsed)
        by_share.append((share, changed_n, gov_s, cul_s, parts, written))

    profile = ""
    if profile_top:  # one more steady pass, as the measured ones
        await advance(cycle_s)
        ingest_all()
        gc.collect()
        profiler = cProfile.Profile()
        profiler.enable()
        await gov.reconcile()
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs()
        stats.sort_stats("tottime").print_stats(profile_top)
        stats.sort_stats("cumulative").print_stats(profile_top)
        profile = out.getvalue()

    # The store a day later: the same fleet's passes open one ledger bucket per owner and day
    # (the whole file also grows by the audit rows of the zombies' warnings and culls).
    def usage_rows() -> int:
        with store.engine.connect() as connection:
            return connection.exec_driver_sql("SELECT COUNT(*) FROM usage").scalar()

    def db_bytes() -> int:
        with store.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))

    def ledger_bytes() -> int:
        """The ledger's tables (buckets and sessions) with their indexes, in pages used."""
        with store.engine.connect() as connection:
            return connection.exec_driver_sql(
                "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN (SELECT name FROM"
                " sqlite_master WHERE tbl_name IN ('usage', 'usage_sessions'))"
            ).scalar()

    rows_before, bytes_before, ledger_before = usage_rows(), db_bytes(), ledger_bytes()
    await advance(86_400)
    for _ in range(2):
        ingest_all()
        await governor_pass()
        await advance(cycle_s)
    day_rows, day_bytes = usage_rows() - rows_before, db_bytes() - bytes_before
    day_ledger_bytes = ledger_bytes() - ledger_before

    async def list_alone() -> float:
        """The governor's Hub listing alone (in a pass it overlaps the decisions)."""
        gc.collect()
        started = time.perf_counter()
        async for _ in hub.iter_servers():
            pass
        return time.perf_counter() - started

    hub_list_s = statistics.median([await list_alone() for _ in range(3)])

    # What was decided, so a run shows the mix it measured (and a test that nothing is unknown).
    states: dict[str, int] = defaultdict(int)
    for row in store.servers(running_only=True).values():
        states[row.state] += 1
    with store.engine.connect() as connection:  # the whole run's culls, and those not made
        said = dict(
            connection.exec_driver_sql(
                "SELECT action, COUNT(*) FROM audit WHERE action LIKE 'cull%' GROUP BY action"
            ).all()
        )
    hub.close()
    store.engine.dispose()

    def per_call(name: str) -> float:
        calls = timers.calls[name]
        return float(f"{statistics.median(calls):.3g}") if calls else 0.0

    shares = [_share_figures(n, *figures) for figures in by_share]
    figures: dict[str, Any] = {
        "servers": n,
        **shares[0],
        "first_pass_s": round(first_s, 3),
        "idle_culler_first_s": round(culler_first_s, 3),
        "rss_mb": round(_rss_mb(), 1),
        "governor_rss_mb": round(governor_rss, 1),
        "hub_list_alone_s": round(hub_list_s, 3),
        "maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "db_mb": round(bytes_before / 2**20, 2),  # after the timed passes
        "ledger_rows_per_day": day_rows,
        "store_mb_per_day": round(day_bytes / 2**20, 2),
        "ledger_mb_per_day": round(day_ledger_bytes / 2**20, 2),
        # Per scrape, over the run (scrapes run in the background, off the passes).
        "dcgm_s": per_call("dcgm"),
        "dcgm_worker_cpu_s": float(f"{statistics.median(worker_cpu):.3g}") if worker_cpu else 0.0,
        # The pods' CPU (metrics-server), per pass: the read's wall time, the thread's CPU.
        "pod_cpu": pod_cpu,
        "pod_cpu_s": per_call("pod_cpu"),
        "pod_cpu_thread_cpu_s": per_call("pod_cpu_thread"),
        "first_pass_store_write_s": round(first_parts.get("store_write", 0.0), 3),
        "first_pass_rows_written": first_counts.get("store_write", 0),
        "ingest_us": round(statistics.median(ingest_s) * 1e6, 1),
        "dcgm_mb": round(ready["dcgm_bytes"] / 2**20, 1),
        "exporters": len(ready["exporter_urls"]),
        "states": ",".join(f"{k}:{v}" for k, v in sorted(states.items())),
        "culls": ",".join(f"{k}:{v}" for k, v in sorted(said.items())),
        "governor_seen": gov_seen,
        "idle_culler_seen": cul_seen,
        "first_pass_seen": first_seen,
        "passes": passes,
        "page_size": page_size,
        "concurrency": concurrency,
    }
    figures["by_changed"] = shares  # the first share's are also at the top level
    if profile:
        figures["profile"] = profile
    return figures


def _share_figures(
    n: int,
    share: float,
    changed_n: int,
    gov_s: list[float],
    cul_s: list[float],
    parts: dict[str, list[float]],
    written: list[int],
) -> dict[str, Any]:
    """The figures of the passes run with ``share`` of the GPU servers changed before each."""

    def med(name: str) -> float:
        # Three significant digits: a small fleet's DCGM parse takes microseconds, not 0.
        return float(f"{statistics.median(parts[name]):.3g}") if parts[name] else 0.0

    gov_mean, cul_mean = statistics.fmean(gov_s), statistics.fmean(cul_s)
    ledger = [bool(x) for x in parts["ledger_pass"]] or [False] * len(gov_s)
    without = [s for s, wrote in zip(gov_s, ledger, strict=True) if not wrote]
    return {
        "changed": share,
        "changed_servers": changed_n,
        "governor_s_mean": round(gov_mean, 3),
        "idle_culler_s_mean": round(cul_mean, 3),
        "ratio": round(gov_mean / cul_mean, 2),
        "governor_s_median": round(statistics.median(gov_s), 3),
        "idle_culler_s_median": round(statistics.median(cul_s), 3),
        # What a pass costs per server that exists, and per server that changed.
        "governor_us_per_server": round(1e6 * gov_mean / n, 1),
        "governor_ms_per_changed": round(1e3 * gov_mean / changed_n, 3) if changed_n else None,
        "idle_culler_us_per_server": round(1e6 * cul_mean / n, 1),
        "idle_culler_ms_per_changed": round(1e3 * cul_mean / changed_n, 3) if changed_n else None,
        # The measured passes that wrote the usage ledger (one in five), and the governor's
        # mean pass without them (None: every measured pass wrote it).
        "ledger_passes": sum(ledger),
        "measured_passes": len(gov_s),
        "governor_s_mean_no_ledger": round(statistics.fmean(without), 3) if without else None,
        # The governor's pass, medians of the parts.
        "store_read_s": med("store_read"),
        "decide_s": med("decide"),
        "store_write_s": round(med("store_write") + med("store_audit"), 3),
        "ledger_write_s": med("ledger_write"),  # per write (one pass in five)
        "metrics_s": med("metrics"),
        "rows_written": int(statistics.median(written)) if written else 0,
        # Servers decided a pass (the others kept their decision: hub/unchanged.py), median.
        "decided": int(med("decided")),
        # Passes that listed every user from the Hub (hub/listing.py), of ``len(gov_s)``.
        "listed_whole": int(sum(parts["listed_whole"])),
        # The mix a pass decided, medians: running servers by state after it, and its audit
        # rows by action (warnings, checkpoints asked, culls, state changes).
        "mix": ",".join(f"{s}:{int(med(f'state:{s}'))}" for s in MIX_STATES),
        "mix_audited": ",".join(f"{a}:{int(med(f'audit:{a}'))}" for a in MIX_ACTIONS),
    }


def run(
    servers: int = 2000,
    passes: int = 5,
    *,
    page_size: int = 200,
    concurrency: int = 10,
    gpus_per_exporter: int = 0,
    cycle_s: float = 60.0,
    seed: int = 0,
    profile_top: int = 0,
    changed: list[float] | None = None,
    full_every: int = 1,
    stagger: int = 1,
    pod_cpu: bool = True,
) -> dict:
    """Start the fake Hub and exporter, time the passes, return the figures. ``changed``: the
    shares of GPU servers whose GPU changes state (active <-> idle) between two passes, each
    measured over ``passes`` passes (default: 0.1); ``by_changed`` has each one's figures."""
    if changed is not None and (not changed or any(not 0 <= c <= 1 for c in changed)):
        raise ValueError(f"changed: shares between 0 and 1, got {changed!r}")
    from tornado.httpclient import AsyncHTTPClient

    from jupyter_gpu_gov.core import clock

    hub_proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.reconcile",
            "--serve",
            f"--servers={servers}",
            f"--seed={seed}",
            f"--page-size={page_size}",
            f"--gpus-per-exporter={gpus_per_exporter}",
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    # cull_idle() reconfigures tornado's AsyncHTTPClient for the whole process, and the
    # governor's clock is moved: put both back, so that tests running after this one see neither.
    saved_http = AsyncHTTPClient._save_configuration()
    saved_offset = clock._offset_s
    timers = Timers()
    try:
        line = hub_proc.stdout.readline()
        if not line:
            raise RuntimeError("the fake Hub subprocess did not start")
        ready = json.loads(line)
        with tempfile.TemporaryDirectory(prefix="bench-reconcile-") as workdir:
            return asyncio.run(
                _bench(
                    ready,
                    servers,
                    seed,
                    passes,
                    page_size,
                    concurrency,
                    cycle_s,
                    workdir,
                    profile_top,
                    timers,
                    changed or [DEFAULT_CHANGED],
                    full_every,
                    stagger,
                    pod_cpu,
                )
            )
    finally:
        timers.restore()
        AsyncHTTPClient._restore_configuration(saved_http)
        clock.reset()
        clock.advance(saved_offset)
        hub_proc.stdin.close()
        try:
            hub_proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            hub_proc.kill()
            hub_proc.wait()


def _numbers(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"a comma-separated list, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("an empty list")
        return values

    return parse


def curve(rows: list[dict]) -> str:
    """The pass against the culler's, by fleet size and share changed: a Markdown table. Per
    server that exists and per server that changed, both tools side by side; what the governor
    decided and wrote, the mix it ended in, and in how many of the measured passes the usage
    ledger's write (one pass in five) fell, with the governor's mean pass without it."""

    def mix(text: str) -> str:
        counts = (part.split(":") for part in text.split(",") if part)
        return " / ".join(f"{name} {int(count):,}" for name, count in counts if int(count))

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} ms"

    lines = [
        "| servers | changed between passes | decided | rows written | mix (states; audited)"
        " | governor pass (mean) | without a ledger write | idle-culler pass (mean) | ratio"
        " | per server: governor / culler | per changed server: governor / culler"
        " | ledger writes | decide |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        no_ledger = r.get("governor_s_mean_no_ledger")
        lines.append(
            f"| {r['servers']:,} | {r['changed']:.0%} ({r['changed_servers']:,}) "
            f"| {r['decided']:,} | {r['rows_written']:,} "
            f"| {mix(r['mix'])}; {mix(r['mix_audited']) or 'none'} "
            f"| {r['governor_s_mean']:.2f} s "
            f"| {'-' if no_ledger is None else f'{no_ledger:.2f} s'} "
            f"| {r['idle_culler_s_mean']:.2f} s | {r['ratio']:.2f} "
            f"| {r['governor_us_per_server']:.0f} / {r['idle_culler_us_per_server']:.0f} µs "
            f"| {ms(r['governor_ms_per_changed'])} / {ms(r['idle_culler_ms_per_changed'])} "
            f"| {r['ledger_passes']} of {r['measured_passes']} | {r['decide_s']:.2f} s |"
        )
    return "\n".join(lines)


def _default_full_every() -> int:
    from jupyter_gpu_gov.hub.options import Options

    return Options.full_pass_every


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--servers",
        type=_numbers(int),
        default=[2000],
        help="fleet sizes, comma-separated (e.g. 1000,10000,50000), each run apart",
    )
    parser.add_argument("--passes", type=int, default=5, help="measured passes of each")
    parser.add_argument(
        "--changed",
        type=_numbers(float),
        default=[DEFAULT_CHANGED],
        help="shares of GPU servers changing state between passes, comma-separated (0..1)",
    )
    parser.add_argument("--page-size", type=int, default=200, help="users per /users page")
    parser.add_argument("--concurrency", type=int, default=10, help="Hub requests in flight")
    parser.add_argument(
        "--gpus-per-exporter",
        type=int,
        default=0,
        help="GPUs per exporter URL (0: one URL while its answer stays within the service's "
        "dcgm_max_bytes, else the fewest shards that do)",
    )
    parser.add_argument("--cycle", type=float, default=60.0, help="seconds between passes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--full-every",
        type=int,
        default=None,
        metavar="N",
        help="the governor's full_pass_every: decide and list every server one pass in N, "
        "else only what changed or fell due (1: every server every pass; default: the "
        "service's default)",
    )
    parser.add_argument(
        "--stagger",
        type=int,
        default=DEFAULT_STAGGER,
        metavar="N",
        help="the GPU servers' first reports spread over N unmeasured passes, then N more "
        "settle them before the measured ones (1: every report from the first pass)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile one more pass after the measured ones (before the day later), top N",
    )
    parser.add_argument(
        "--no-pod-cpu",
        action="store_true",
        help="the governor reads no pods' CPU (a cluster without metrics-server)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.servers[0], args.seed, args.page_size, args.gpus_per_exporter))
        return
    rows = []
    for servers in args.servers:
        figures = run(
            servers,
            args.passes,
            page_size=args.page_size,
            concurrency=args.concurrency,
            gpus_per_exporter=args.gpus_per_exporter,
            cycle_s=args.cycle,
            seed=args.seed,
            profile_top=args.profile,
            changed=args.changed,
            full_every=args.full_every or _default_full_every(),
            stagger=args.stagger,
            pod_cpu=not args.no_pod_cpu,
        )
        profile = figures.pop("profile", "")
        by_changed = figures.pop("by_changed")
        print("reconcile:", " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
        for share in by_changed[1:]:
            print("reconcile:", " ".join(f"{k}={v}" for k, v in share.items()), flush=True)
        rows += [{"servers": servers, **share} for share in by_changed]
        if profile:
            print(profile, file=sys.stderr)
    if len(rows) > 1:
        print(curve(rows))


if __name__ == "__main__":
    main()
