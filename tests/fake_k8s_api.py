"""A small Kubernetes API server for tests: the REST protocol KubeSpawner and the profile layer
speak, with a scheduler and a kubelet that runs pods as local processes.

What it serves (``/api/v1``, JSON):

- namespaced ``pods``, ``events``, ``persistentvolumeclaims``, ``services``, ``secrets``,
  ``configmaps``: create (POST), get, list, patch (merge and strategic-merge patches as merge
  patches, JSON patches), replace (PUT, with the ``resourceVersion`` check) and delete (a
  ``preconditions.uid`` that is not the object's: 409 Conflict);
- ``nodes`` (cluster-scoped): get and list;
- list + watch of every collection with ``labelSelector`` (``=``, ``==``, ``!=``, ``in``,
  ``notin``, exists, ``!``), ``fieldSelector`` (``metadata.name``, ``metadata.namespace``,
  ``spec.nodeName``, ``status.phase``, ``involvedObject.kind|name|namespace``),
  ``resourceVersion`` (a watch replays what changed after it, or answers 410 Gone in an
  ``ERROR`` event when that is older than the history kept) and ``timeoutSeconds``;
- a list in pages: ``limit`` items at most, in the storage's key order, and, when more follow,
  ``metadata.continue`` (``remainingItemCount`` too where no selector filters the list); a
  ``continue`` token reads on in the first page's snapshot, or answers 410 Expired once that
  is dropped (``expire_lists``, as the API server's compaction does after a few minutes);
- errors as the API server writes them: a ``Status`` object with ``reason`` and ``details``
  (404 NotFound, 409 AlreadyExists / Conflict, 422 Invalid with ``causes``, 400 BadRequest).

Objects are checked as the API server would: ``kubernetes-validate`` (the OpenAPI schemas of a
Kubernetes release, strict: unknown fields are errors), then the checks the schema cannot
express that matter here (names, label keys and values, extended resources whose request must
equal their limit). Every object a client sends is kept in ``received`` for the tests.

The scheduler binds a pending pod to a node that fits (node selector, required node affinity,
taints and tolerations, CPU, memory and extended resources such as ``nvidia.com/gpu`` against
what the pods bound there request) or records a ``FailedScheduling`` event worded as the real
scheduler words it ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.") and tries again
whenever a pod goes away or a node is added.

The kubelet runs a bound pod's first container as a process of this machine: its ``args``
(``command`` first) with the container's environment (values, and ``valueFrom`` secrets,
config maps and the downward API), ``PATH`` pointing at this Python's scripts (the "image"), in
a directory of its own (``HOME``; a PVC-backed volume is a directory that outlives the pod).
Init containers are reported completed without running (z2jh's iptables one cannot run here).
Each pod gets its own loopback address (127.x.y.z) as its IP; a pod's ``0.0.0.0`` (its own
network namespace, in a cluster) is that address, so several servers listen on port 8888 side
by side. The pod is Running and its container ready once the process has started (no readiness
probe, as KubeSpawner's pods have none); the Hub then waits for the server to answer, as on a
cluster. Deleting a pod sends SIGTERM, then SIGKILL after the grace period, and removes it.
A process that exits leaves its pod Succeeded or Failed with the exit code.

Faults, on chosen paths (``fail``; ``clear_faults``): an error answer (500 InternalError, 409
Conflict, 503, ... as a ``Status``), a slow answer (the request is carried out, then answered
``seconds`` later: a client that gave up meanwhile finds its create done when it retries), a
dropped connection before anything is done, or after the request was carried out (its answer
lost), or an answer of the fault's ``code`` with the fault's ``body`` (``answer``: JSON out of
any object's shape, from a broken API server or a proxy); each for the next ``times`` requests
that match, or until cleared. They apply to the
API, ``/dcgm/...`` and ``/prometheus/...``; a fault's ``hits`` counts the requests it met.

metrics-server: ``/apis/metrics.k8s.io/v1beta1/namespaces/<ns>/pods`` lists a PodMetrics for
each running pod of the namespace, its first container's ``usage.cpu`` in nanocores as
``set_pod_cpu`` set it (0.002 cores unless set: an idle server), ``timestamp`` now and
``window`` 15s, as metrics-server writes them; ``metrics_server = False``: 404, as an API
server without it answers (``forbidden`` holding ``pods.metrics.k8s.io``: 403).

The device plugin: whole GPUs and MIG slices of a node are devices with UUIDs; a pod's
container gets ``NVIDIA_VISIBLE_DEVICES`` with its devices' UUIDs, and ``/dcgm/<node>/metrics``
answers as dcgm-exporter with pod attribution does, with each device's utilisation set by
``set_gpu_activity`` (0 unless set).

The record (``record_path``, ``requests.log`` in the work directory, kept with it): every
request (method, path and query, status, time taken), each watch's start (its
``resourceVersion``, ``timeoutSeconds``, backlog), every event it sends and its end (why), every
change and the watches it went to, and the kubelet's starts and exits; each pod's process
output is a file of its own (``pod_log``). ``evidence(name)`` quotes what concerns a pod, for a
failing test's message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import itertools
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hub_harness import MARKER_ENV, RUN_MARKER  # processes the sweeps end
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.log import access_log
from tornado.netutil import bind_sockets

KUBERNETES_VERSION = "1.32"  # the schemas objects are validated against
HISTORY = 1000  # watch events kept for resourceVersion replays
SNAPSHOTS = 16  # paged lists whose continue tokens are kept (older ones: 410 Expired)

KINDS = {  # plural -> (kind, namespaced)
    "pods": ("Pod", True),
    "events": ("Event", True),
    "persistentvolumeclaims": ("PersistentVolumeClaim", True),
    "services": ("Service", True),
    "secrets": ("Secret", True),
    "configmaps": ("ConfigMap", True),
    "nodes": ("Node", False),
}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_HARD_TAINTS = ("NoSchedule", "NoExecute")


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error answer: a ``Status`` object as the API server writes it."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def not_found(plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 with the field errors as ``causes`` (reason, field, message)."""
    text = ", ".join(f"{f}: {m}" for _, f, m in causes)
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {text}',
        {
            "name": name,
            "kind": kind,
            "causes": [{"reason": r, "field": f, "message": m} for r, f, m in causes],
        },
    )


# -- quantities ---------------------------------------------------------------------------------

_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
    "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "m": 1e-3, "": 1,
}  # fmt: skip


def quantity(value: Any) -> float:
    """A Kubernetes quantity ("500m", "1Gi", 8, "2.5") as a number."""
    match = re.fullmatch(r"([0-9.]+(?:[eE][-+]?[0-9]+)?)([A-Za-z]*)", str(value).strip())
    if not match or match[2] not in _SUFFIX:
        raise ValueError(f"quantities must match the regular expression, got {value!r}")
    return float(match[1]) * _SUFFIX[match[2]]


# -- selectors ----------------------------------------------------------------------------------


def label_selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    for requirement in _split_selector(selector):
        if m := re.fullmatch(r"\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*", requirement):
            key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",")}
            if (labels.get(key) in values) != (op == "in") or (op == "in" and key not in labels):
                return False
        elif m := re.fullmatch(r"\s*([^\s!=]+)\s*(==|=|!=)\s*([^\s]*)\s*", requirement):
            key, op, value = m[1], m[2], m[3]
            if (labels.get(key) == value) != (op != "!="):
                return False
        elif m := re.fullmatch(r"\s*!\s*([^\s]+)\s*", requirement):
            if m[1] in labels:
                return False
        elif requirement.strip() and requirement.strip() not in labels:
            return False
    return True


def _split_selector(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector or "":
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current] if current else parts


FIELDS = {
    "metadata.name": lambda o: o["metadata"].get("name"),
    "metadata.namespace": lambda o: o["metadata"].get("namespace"),
    "spec.nodeName": lambda o: (o.get("spec") or {}).get("nodeName", ""),
    "status.phase": lambda o: (o.get("status") or {}).get("phase"),
    "involvedObject.kind": lambda o: (o.get("involvedObject") or {}).get("kind"),
    "involvedObject.name": lambda o: (o.get("involvedObject") or {}).get("name"),
    "involvedObject.namespace": lambda o: (o.get("involvedObject") or {}).get("namespace"),
}


def field_selector_matches(selector: str, obj: Mapping) -> bool:
    for requirement in filter(None, (selector or "").split(",")):
        m = re.fullmatch(r"([^!=]+)(==|=|!=)(.*)", requirement)
        if not m or m[1] not in FIELDS:
            raise ApiError(
                400,
                "BadRequest",
                f'"{requirement}" is not a known field selector: only "{", ".join(FIELDS)}"',
            )
        if (str(FIELDS[m[1]](obj) or "") == m[3]) != (m[2] != "!="):
            return False
    return True


def _node_matches_expression(labels: Mapping[str, str], e: Mapping) -> bool:
    key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels:
        with contextlib.suppress(ValueError):
            a, b = int(labels[key]), int(values[0])
            return a > b if op == "Gt" else a < b
    return False


def _tolerated(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


# -- nodes and devices --------------------------------------------------------------------------


@dataclass
class Device:
    uuid: str
    index: int
    resource: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", ...
    model: str
    activity: float = 0.0  # DCGM_FI_DEV_GPU_UTIL / 100
    holder: tuple[str, str, str] | None = None  # (namespace, pod, container)


def gpu_node(
    name: str,
    product: str,
    *,
    gpus: int = 8,
    memory_mib: int = 81559,
    mig: Mapping[str, int] | None = None,
    labels: Mapping[str, str] | None = None,
    taint: bool = True,
    cpu: str = "112",
    memory: str = "2Ti",
    allocatable: Mapping[str, str] | None = None,
) -> dict:
    """A GPU node as the GPU operator leaves it: GPU feature discovery labels, the device
    plugin's allocatable resources (``mig``: slices per profile on the whole node, mixed
    strategy; ``allocatable``: more, e.g. time-slicing's ``nvidia.com/gpu.shared``) and the
    ``nvidia.com/gpu`` NoSchedule taint."""
    node_labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/mig.strategy": "mixed" if mig else "none",
        **(labels or {}),
    }
    allocatable_more, allocatable = allocatable, {"cpu": cpu, "memory": memory, "pods": "110"}
    allocatable["nvidia.com/gpu"] = "0" if mig else str(gpus)
    for profile, count in (mig or {}).items():
        allocatable["nvidia.com/mig-" + profile.replace("+", ".")] = str(count)
    allocatable.update(allocatable_more or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels},
        "spec": {
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            if taint
            else []
        },
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def cpu_node(name: str, *, labels: Mapping[str, str] | None = None) -> dict:
    node = gpu_node(name, "none", gpus=0, labels=labels, taint=False)
    node["metadata"]["labels"] = {"kubernetes.io/hostname": name, **(labels or {})}
    del node["status"]["allocatable"]["nvidia.com/gpu"]
    return node


# -- the server ---------------------------------------------------------------------------------


FAULT_KINDS = ("error", "slow", "drop", "drop-after", "answer")


@dataclass
class Fault:
    """What requests matching ``method`` (``*``: any) and ``path`` (a regular expression
    searched in the request's path) meet: see the module docstring."""

    method: str
    path: str
    kind: str = "error"
    code: int = 500
    reason: str = "InternalError"
    message: str = 'an error on the server ("injected") has prevented the request'
    seconds: float = 0.0  # slow: how long before the answer
    times: int | None = None  # None: until cleared
    hits: int = 0
    body: str = ""  # answer: what is sent, with ``code``

    def matches(self, method: str, path: str) -> bool:
        return (
            self.method in ("*", method)
            and re.search(self.path, path) is not None
            and (self.times is None or self.hits < self.times)
        )


@dataclass
class Watcher:
    plural: str
    namespace: str | None
    labels: str
    fields: str
    id: int = 0  # the record's name for it
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class FakeKubernetes:
    """The API server, scheduler, kubelet and device plugin, on a thread of their own.

    ``with FakeKubernetes(nodes=[gpu_node(...)]) as k8s:`` starts it; ``k8s.url`` is the API
    server, ``k8s.kubeconfig(path)`` writes a kubeconfig for it.
    """

    def __init__(
        self,
        nodes: Iterable[dict] = (),
        *,
        workdir: str | os.PathLike | None = None,
        python: str = sys.executable,
        extra_env: Mapping[str, str] | None = None,
        validate: bool = True,
    ):
        self._nodes = [copy.deepcopy(n) for n in nodes]
        self.python = python
        self.extra_env = dict(extra_env or {})
        self.validate = validate
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fake-k8s-"))
        self.objects: dict[str, dict[tuple[str, str], dict]] = {p: {} for p in KINDS}
        self.history: list[tuple[int, str, str, dict]] = []  # (rv, plural, type, object)
        self.received: list[tuple[str, str, dict]] = []  # (verb, plural, body) as sent
        self.lists: list[tuple] = []  # (plural, namespace, limit, continue) of each list asked for
        self._snapshots: dict[tuple[str, str], list] = {}  # (plural, rv) -> a paged list's
        self.rejected: list[ApiError] = []
        self.forbidden: set[str] = set()  # collections the client's RBAC does not allow
        self.forbidden_cluster_wide: set[str] = set()  # ... but in a namespace
        self.faults: list[Fault] = []  # see ``fail``
        self.devices: dict[str, list[Device]] = {}
        self.pod_cpu: dict[tuple[str, str], float] = {}  # (namespace, pod) -> cores
        self.metrics_server = True
        # metrics-server's clock (a test that moves the governor's clock moves this one too).
        self.metrics_now = lambda: datetime.now(timezone.utc)
        self.processes: dict[tuple[str, str], subprocess.Popen] = {}
        self._rv = itertools.count(1000)
        self.resource_version = 999
        self._watchers: list[Watcher] = []
        self._ips = self._address_pool()
        self._lock = threading.RLock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ioloop: IOLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self.url = ""
        self.record_path = self.workdir / "requests.log"
        self._record_lock = threading.Lock()
        self._record_file: Any = None
        self._pod_logs: dict[tuple[str, str], Path] = {}  # the last process's output per pod
        self._watch_ids = itertools.count(1)

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> FakeKubernetes:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._record_file = open(self.record_path, "a", buffering=1)  # noqa: SIM115  (stop())
        sockets = bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        ready = threading.Event()

        def run():
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self._ioloop = IOLoop.current()
            server = HTTPServer(self._app(), idle_connection_timeout=3600)
            server.add_sockets(sockets)
            for node in self._nodes:
                self._create("nodes", None, node)
            ready.set()
            self.loop.run_forever()
            server.stop()
            # The kubelet's tasks of pods stop() just killed: let them end, not be destroyed.
            pending = list(self._tasks)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

        self._thread = threading.Thread(target=run, name="fake-k8s", daemon=True)
        self._thread.start()
        ready.wait(10)

    def stop(self) -> None:
        for key in list(self.processes):
            self._kill(key, grace=3)
        if self.loop is not None and self.loop.is_running():
            for watcher in list(self._watchers):
                self.loop.call_soon_threadsafe(watcher.queue.put_nowait, None)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        with self._record_lock:
            if self._record_file is not None:
                self._record_file.close()
                self._record_file = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the server's loop (thread-safe) and return its result."""
        done = threading.Event()
        box: dict[str, Any] = {}

        def run():
            try:
                box["value"] = fn(*args)
            except BaseException as error:
                box["error"] = error
            done.set()

        self.loop.call_soon_threadsafe(run)
        if not done.wait(30):
            self._note(f"call {getattr(fn, '__name__', fn)}{args!r}: not run in 30 s")
            raise TimeoutError(f"the fake API's loop did not run {fn} in 30 s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def kubeconfig(self, path: str | os.PathLike, namespace: str = "default") -> Path:
        path = Path(path)
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                        }
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    # -- the record ----------------------------------------------------------------------------

    def _note(self, line: str) -> None:
        """A line of the record (any thread: the kubelet's kills run on others)."""
        stamp = datetime.now(timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        with self._record_lock:
            if self._record_file is not None:
                self._record_file.write(f"{stamp} {line}\n")

    def pod_log(self, namespace: str, pod: str) -> Path | None:
        """The file the output of ``pod``'s last process went to."""
        return self._pod_logs.get((namespace, pod))

    def evidence(self, pod: str, lines: int = 250) -> str:
        """What a failing test's message quotes of ``pod``: the files (kept with the work
        directory), the record's lines that name the pod or are a watch's start and end (a
        pod's watch names no pod until it sends one), and the end of each of its processes'
        output."""
        try:
            record = self.record_path.read_text(errors="replace").splitlines()
        except OSError:
            record = []
        mine = [line for line in record if pod in line or _a_watchs(line)]
        parts = [
            f"fake Kubernetes API record: {self.record_path} ({len(record)} lines); the last "
            f"{min(lines, len(mine))} of the {len(mine)} naming {pod} or a watch's start, end "
            "or request, or a list from a resourceVersion (a watch's relist):",
            *mine[-lines:],
        ]
        for (ns, name), path in sorted(self._pod_logs.copy().items()):  # (the loop adds)
            if name == pod or name.startswith(f"{pod}-"):  # a named server's too
                try:
                    output = path.read_text(errors="replace").splitlines()
                except OSError as error:
                    output = [f"(unreadable: {error})"]
                parts += [f"output of {ns}/{name}'s process: {path} (its last 60 lines):"]
                parts += output[-60:]
        return "\n".join(parts)

    # -- what tests read and change --------------------------------------------------------------

    def get(self, plural: str, name: str, namespace: str | None = "default") -> dict | None:
        with self._lock:
            obj = self.objects[plural].get((namespace or "", name))
            return copy.deepcopy(obj) if obj else None

    def list(self, plural: str, namespace: str | None = None) -> list[dict]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self.objects[plural].items())
                if namespace is None or ns == namespace
            ]

    def events_for(self, pod: str, namespace: str = "default") -> list[dict]:
        """A pod's events, oldest first."""
        events = [
            e
            for e in self.list("events", namespace)
            if e["involvedObject"]["kind"] == "Pod" and e["involvedObject"]["name"] == pod
        ]
        return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))

    def fail(self, method: str, path: str, kind: str = "error", **how) -> Fault:
        """Make the requests matching ``method`` and ``path`` fail as ``kind`` says (the
        module docstring); the first matching fault wins. Returns it (``hits`` counts)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"kind must be one of {FAULT_KINDS}")
        fault = Fault(method, path, kind, **how)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            fault = next((f for f in self.faults if f.matches(method, path)), None)
            if fault is not None:
                fault.hits += 1
            return fault

    def add_node(self, node: dict) -> None:
        self.call(self._create, "nodes", None, copy.deepcopy(node))
        self.call(self._schedule_pending)

    def create(self, plural: str, obj: dict, namespace: str = "default") -> dict:
        """Create an object as a client other than the hub would (e.g. a GPU pod of a batch
        job): validated and scheduled like any other."""
        return self.call(self._create, plural, namespace, copy.deepcopy(obj))

    def set_gpu_activity(self, namespace: str, pod: str, activity: float) -> None:
        with self._lock:
            for devices in self.devices.values():
                for device in devices:
                    if device.holder and device.holder[:2] == (namespace, pod):
                        device.activity = activity

    def set_pod_cpu(self, namespace: str, pod: str, cores: float) -> None:
        """What metrics-server says of the pod's container CPU from now on."""
        with self._lock:
            self.pod_cpu[(namespace, pod)] = cores

    def _pod_metrics(self, namespace: str) -> dict:
        with self._lock:
            now = self.metrics_now().strftime("%Y-%m-%dT%H:%M:%SZ")
            items = []
            for (ns, name), pod in sorted(self.objects["pods"].items()):
                if ns != namespace or pod.get("status", {}).get("phase") != "Running":
                    continue
                cores = self.pod_cpu.get((ns, name), 0.002)
                container = pod["spec"]["containers"][0]["name"]
                items.append({
                    "metadata": {"name": name, "namespace": ns, "creationTimestamp": now,
                                 "labels": dict(pod["metadata"].get("labels") or {})},
                    "timestamp": now,
                    "window": "15s",
                    "containers": [{"name": container, "usage": {
                        "cpu": f"{round(cores * 1e9)}n", "memory": "104860Ki"}}],
                })  # fmt: skip
        return {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {}, "items": items}  # fmt: skip

    def pod_devices(self, namespace: str, pod: str) -> list[Device]:
        with self._lock:
            return [
                d
                for devices in self.devices.values()
                for d in devices
                if d.holder and d.holder[:2] == (namespace, pod)
            ]

    def dcgm_url(self, node: str) -> str:
        return f"{self.url}/dcgm/{node}/metrics"

    # -- storage ---------------------------------------------------------------------------------

    def _bump(self, obj: dict) -> None:
        self.resource_version = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self.resource_version)

    def _emit(self, plural: str, kind: str, obj: dict) -> None:
        self.history.append((self.resource_version, plural, kind, copy.deepcopy(obj)))
        del self.history[:-HISTORY]
        to = []
        for watcher in self._watchers:
            if self._watched(watcher, plural, obj):
                watcher.queue.put_nowait({"type": kind, "object": copy.deepcopy(obj)})
                to.append(f"watch#{watcher.id}")
        self._note(f"change rv={self.resource_version} {kind} {plural} {_described(obj)} -> "
                   f"{', '.join(to) or 'no watch'}")  # fmt: skip

    @staticmethod
    def _watched(watcher: Watcher, plural: str, obj: dict) -> bool:
        return (
            watcher.plural == plural
            and (watcher.namespace is None or obj["metadata"].get("namespace") == watcher.namespace)
            and label_selector_matches(watcher.labels, obj["metadata"].get("labels") or {})
            and field_selector_matches(watcher.fields, obj)
        )

    def _create(self, plural: str, namespace: str | None, body: dict) -> dict:
        kind, namespaced = KINDS[plural]
        if body.get("kind") not in (None, kind):
            raise ApiError(400, "BadRequest", f"the kind of the object ({body['kind']}) does not "
                           f"match the resource ({plural})")  # fmt: skip
        body.setdefault("apiVersion", "v1")  # clients may leave them to the URL
        body["kind"] = kind
        meta = body.setdefault("metadata", {})
        if namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request",
                )
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        self._check(plural, body)
        key = (namespace or "", meta["name"])
        with self._lock:
            if key in self.objects[plural]:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{plural} "{meta["name"]}" already exists',
                    {"name": meta["name"], "kind": plural},
                )
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso())
            if plural == "pods":
                body["status"] = {"phase": "Pending", "qosClass": "Burstable"}
            elif plural == "persistentvolumeclaims":
                body["status"] = {"phase": "Bound"}
            self._bump(body)
            self.objects[plural][key] = body
            self._emit(plural, "ADDED", body)
        if plural == "pods":
            self._schedule_pending()
        return copy.deepcopy(body)

    def _check(self, plural: str, body: dict) -> None:
        # Go decodes a JSON null in a map[string]string as "": so does the API server.
        for key in ("labels", "annotations"):
            if isinstance(body["metadata"].get(key), dict):
                body["metadata"][key] = {
                    k: "" if v is None else v for k, v in body["metadata"][key].items()
                }
        kind = KINDS[plural][0]
        name = body["metadata"].get("name") or ""
        causes: list[tuple[str, str, str]] = []
        pattern = _DNS_LABEL if plural == "services" else _DNS_SUBDOMAIN
        if plural != "events" and (not pattern.match(name) or len(name) > 253):
            causes.append(
                ("FieldValueInvalid", "metadata.name", f'Invalid value: "{name}": a lowercase '
                 "RFC 1123 name must consist of lower case alphanumeric characters, '-' or '.'")
            )  # fmt: skip
        for key, value in (body["metadata"].get("labels") or {}).items():
            prefix, _, label = key.rpartition("/")
            if (
                not _LABEL_NAME.match(label)
                or len(label) > 63
                or (prefix and not _DNS_SUBDOMAIN.match(prefix))
            ):
                causes.append(("FieldValueInvalid", "metadata.labels", f'Invalid value: "{key}"'))
            if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
                causes.append(
                    ("FieldValueInvalid", "metadata.labels", f'Invalid value: "{value}": a valid '
                     "label must be an empty string or consist of alphanumeric characters, '-', "
                     "'_' or '.', and must start and end with an alphanumeric character")
                )  # fmt: skip
        if plural == "pods":
            causes += self._check_resources(body)
        if self.validate and plural != "nodes" and not causes:
            causes += _schema_errors(body)
        if causes:
            error = invalid(kind, name, causes)
            self.rejected.append(error)
            raise error

    @staticmethod
    def _check_resources(pod: dict) -> list[tuple[str, str, str]]:
        causes = []
        for i, container in enumerate((pod.get("spec") or {}).get("containers") or []):
            resources = container.get("resources") or {}
            limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
            for where, amounts in (("limits", limits), ("requests", requests)):
                for name, value in amounts.items():
                    path = f"spec.containers[{i}].resources.{where}[{name}]"
                    try:
                        amount = quantity(value)
                    except ValueError as error:
                        causes.append(("FieldValueInvalid", path, str(error)))
                        continue
                    if "/" in name and not name.startswith("kubernetes.io/"):
                        if amount != int(amount):
                            causes.append(
                                ("FieldValueInvalid", path, f"Invalid value: {value!r}: must be "
                                 "an integer")
                            )  # fmt: skip
                        if where == "requests" and name not in limits:
                            causes.append(
                                ("FieldValueForbidden", path, "Forbidden: Limit must be set for "
                                 "non overcommitable resources")
                            )  # fmt: skip
                        if (
                            where == "requests"
                            and name in limits
                            and quantity(limits[name]) != amount
                        ):
                            causes.append(
                                ("FieldValueInvalid", path, f"Invalid value: {value!r}: must be "
                                 f"equal to {name} limit of {limits[name]}")
                            )  # fmt: skip
        return causes

    def _update(self, plural: str, namespace: str | None, name: str, body: dict) -> dict:
        key = (namespace or "", name)
        with self._lock:
            current = self.objects[plural].get(key)
            if current is None:
                raise not_found(plural, name)
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent and sent != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    {"name": name, "kind": plural},
                )
            body.setdefault("metadata", {})
            for keep in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
                if keep in current["metadata"]:
                    body["metadata"][keep] = current["metadata"][keep]
            body["kind"], body["apiVersion"] = current["kind"], current.get("apiVersion", "v1")
            if plural == "pods":
                body["status"] = current["status"]  # the status is the kubelet's
            self._check(plural, body)
            self._bump(body)
            self.objects[plural][key] = body
            self._emit(plural, "MODIFIED", body)
            return copy.deepcopy(body)

    def _set_status(
        self, plural: str, key: tuple[str, str], change, uid: str | None = None
    ) -> dict | None:
        """Change the object at ``key`` (only if it is still the one of ``uid``, when given: a
        pod deleted and created again under its name is another pod)."""
        with self._lock:
            obj = self.objects[plural].get(key)
            if obj is None or (uid is not None and obj["metadata"].get("uid") != uid):
                return None
            change(obj)
            self._bump(obj)
            self._emit(plural, "MODIFIED", obj)
            return obj

    def _remove(self, plural: str, key: tuple[str, str]) -> dict | None:
        with self._lock:
            obj = self.objects[plural].pop(key, None)
            if obj is None:
                return None
            self._bump(obj)
            self._emit(plural, "DELETED", obj)
        if plural == "pods":
            for devices in self.devices.values():
                for device in devices:
                    if device.holder and device.holder[:2] == key:
                        device.holder, device.activity = None, 0.0
            self._schedule_pending()
        return obj

    def _delete(
        self, plural: str, namespace: str | None, name: str, grace: int | None, uid=None
    ) -> dict:
        key = (namespace or "", name)
        with self._lock:
            obj = self.objects[plural].get(key)
            if obj is None:
                raise not_found(plural, name)
        if uid is not None and uid != obj["metadata"].get("uid"):  # DeleteOptions.preconditions
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{obj['metadata'].get('uid')}",
            )
        if plural != "pods" or not (obj.get("spec") or {}).get("nodeName"):
            return self._remove(plural, key)
        if "deletionTimestamp" in obj["metadata"]:
            return copy.deepcopy(obj)
        grace = (obj["spec"].get("terminationGracePeriodSeconds", 30)) if grace is None else grace

        def mark(o):
            o["metadata"]["deletionTimestamp"] = now_iso()
            o["metadata"]["deletionGracePeriodSeconds"] = grace

        obj = self._set_status("pods", key, mark)
        self._spawn(self._terminate(key, grace))
        return copy.deepcopy(obj)

    # -- events --------------------------------------------------------------------------------

    def _event(self, pod: dict, kind: str, reason: str, message: str, component: str) -> None:
        meta = pod["metadata"]
        stamp = now_iso()
        self._create(
            "events",
            meta["namespace"],
            {
                "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
                "involvedObject": {
                    "kind": "Pod",
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                    "apiVersion": "v1",
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "source": {"component": component},
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
                "reportingComponent": component,
            },
        )

    # -- the scheduler -------------------------------------------------------------------------

    def _schedule_pending(self) -> None:
        with self._lock:
            pending = [
                p
                for p in self.objects["pods"].values()
                if not p["spec"].get("nodeName") and "deletionTimestamp" not in p["metadata"]
            ]
        for pod in sorted(pending, key=lambda p: p["metadata"]["resourceVersion"]):
            self._schedule(pod)

    def _requests(self, pod: dict) -> dict[str, float]:
        asked: dict[str, float] = {}
        for container in pod["spec"].get("containers") or []:
            resources = container.get("resources") or {}
            amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            for name, value in amounts.items():
                asked[name] = asked.get(name, 0) + quantity(value)
        return asked

    def _schedule(self, pod: dict) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        nodes = self.list("nodes")
        reasons: dict[str, int] = {}
        chosen = None
        spec = pod["spec"]
        asked = self._requests(pod)
        for node in nodes:
            why = self._unfit(node, spec, asked)
            if why is None:
                chosen = node
                break
            reasons[why] = reasons.get(why, 0) + 1
        if chosen is None:
            detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
            message = f"0/{len(nodes)} nodes are available: {detail}."
            conditions = pod["status"].get("conditions") or []
            if conditions and conditions[0].get("message") == message:
                return  # said already

            def unschedulable(p):
                p["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                        "lastTransitionTime": now_iso(),
                    }
                ]

            if self._set_status("pods", key, unschedulable):
                self._event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            return
        node_name = chosen["metadata"]["name"]
        devices = self._allocate(node_name, key, spec, asked)

        def bind(p):
            p["spec"]["nodeName"] = node_name
            p["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_iso()}
            ]

        bound = self._set_status("pods", key, bind)
        if bound:
            self._event(
                bound,
                "Normal",
                "Scheduled",
                f"Successfully assigned {key[0]}/{key[1]} to {node_name}",
                "default-scheduler",
            )
            self._spawn(self._run(key, bound["metadata"]["uid"], devices))

    def _unfit(self, node: dict, spec: dict, asked: Mapping[str, float]) -> str | None:
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        required = (
            ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            )
            or {}
        ).get("nodeSelectorTerms") or []
        if required and not any(
            all(_node_matches_expression(labels, e) for e in term.get("matchExpressions") or [])
            for term in required
        ):
            return "node(s) didn't match Pod's node affinity/selector"
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") in _HARD_TAINTS and not _tolerated(
                spec.get("tolerations") or [], taint
            ):
                value = f": {taint['value']}" if taint.get("value") else ""
                return f"node(s) had untolerated taint {{{taint['key']}{value}}}"
        allocatable = node["status"].get("allocatable") or {}
        used: dict[str, float] = {}
        for other in self.list("pods"):
            if other["spec"].get("nodeName") == node["metadata"]["name"] and other["status"].get(
                "phase"
            ) not in ("Succeeded", "Failed"):
                for name, amount in self._requests(other).items():
                    used[name] = used.get(name, 0) + amount
        for name, amount in sorted(asked.items()):
            if amount and quantity(allocatable.get(name, 0)) - used.get(name, 0) < amount:
                return f"Insufficient {name}"
        return None

    def _allocate(self, node: str, key, spec: dict, asked: Mapping[str, float]) -> list[Device]:
        """The device plugin: hand the pod's container free devices of what it asked for."""
        with self._lock:
            devices = self.devices.setdefault(node, [])
            chosen = []
            container = (spec.get("containers") or [{}])[0].get("name", "")
            for resource, amount in asked.items():
                if not resource.startswith("nvidia.com/"):
                    continue
                free = [d for d in devices if d.resource == resource and d.holder is None]
                while len(free) < amount:  # devices are made when first asked for
                    product = self.get("nodes", node, None)["metadata"]["labels"].get(
                        "nvidia.com/gpu.product", "GPU"
                    )
                    new = Device(
                        uuid=("MIG-" if "mig-" in resource else "GPU-") + str(uuid.uuid4()),
                        index=len(devices),
                        resource=resource,
                        model=product.replace("-", " "),
                    )
                    devices.append(new)
                    free.append(new)
                for device in free[: int(amount)]:
                    device.holder = (*key, container)
                    chosen.append(device)
            return chosen

    # -- the kubelet ---------------------------------------------------------------------------

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _address_pool(self):
        # A /16 of 127/8 of its own: under pytest-xdist each worker draws from its share, so
        # two fake clusters running at once never give two pods one address.
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
        base = random.choice([b for b in range(1, 254) if b % workers == worker % workers])
        for third in range(1, 255):
            for fourth in range(2, 255):
                yield f"127.{base}.{third}.{fourth}"

    def _env(self, pod: dict, container: dict, ip: str, home: Path) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env = {
            "PATH": f"{Path(self.python).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "HOME": str(home),
            "HOSTNAME": pod["metadata"]["name"],
            "KUBERNETES_SERVICE_HOST": "",
            **self.extra_env,
        }
        for marker in (MARKER_ENV, RUN_MARKER):  # a pod's processes are the test run's
            if marker in os.environ:
                env[marker] = os.environ[marker]
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = var["value"]
            elif "valueFrom" in var:
                env[var["name"]] = self._value_from(var["valueFrom"], pod, ns, ip)
        for source in container.get("envFrom") or []:
            ref = source.get("secretRef") or source.get("configMapRef") or {}
            plural = "secrets" if "secretRef" in source else "configmaps"
            obj = self.get(plural, ref.get("name", ""), ns) or {}
            env.update({k: _decoded(plural, v) for k, v in (obj.get("data") or {}).items()})
        # The pod's own network namespace: its 0.0.0.0 is its own address.
        for name, value in env.items():
            env[name] = value.replace("://0.0.0.0:", f"://{ip}:")
        return env

    def _value_from(self, source: dict, pod: dict, ns: str, ip: str) -> str:
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            return {
                "metadata.name": pod["metadata"]["name"],
                "metadata.namespace": ns,
                "status.podIP": ip,
                "spec.nodeName": pod["spec"].get("nodeName", ""),
            }.get(path, "")
        for ref_key, plural in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if ref_key in source:
                ref = source[ref_key]
                obj = self.get(plural, ref["name"], ns) or {}
                return _decoded(plural, (obj.get("data") or {}).get(ref["key"], ""))
        return ""

    async def _run(self, key: tuple[str, str], uid: str, devices: list[Device]) -> None:
        """Run the pod of ``uid`` until its process ends. Every change is to that pod only: its
        name may be taken by a new pod (deleted, created again) before this one's process ends."""
        pod = self.get("pods", key[1], key[0])
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        spec = pod["spec"]
        ip = next(self._ips)
        home = self.workdir / "pods" / key[0] / key[1]
        for volume in spec.get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim:  # the user's storage: a directory that outlives the pod
                home = self.workdir / "pvcs" / key[0] / claim
        home.mkdir(parents=True, exist_ok=True)
        container = spec["containers"][0]
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        env = self._env(pod, container, ip, home)
        if devices:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(d.uuid for d in devices)
        init = [
            {  # what the client's model requires of a status, as the API server writes it
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": f"local://{c.get('image', '')}",
                "restartCount": 0,
                "ready": False,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }
            for c in spec.get("initContainers") or []
        ]
        try:
            if not argv:
                raise FileNotFoundError("the container has no command or args")
            argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
            self._pod_logs[key] = home / f"{key[1]}.log"
            log = open(home / f"{key[1]}.log", "ab")  # noqa: SIM115  (the process owns it)
            process = subprocess.Popen(
                argv,
                env=env,
                cwd=container.get("workingDir") or home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
        except OSError as error:
            why = f"failed to start container: {error}"
            self._note(f"kubelet {_key(key)} {why}")
            self._event(pod, "Warning", "Failed", f"Error: {why}", "kubelet")
            self._set_status("pods", key, lambda p: _terminated(p, 128, why, init), uid)
            return
        self.processes[key] = process
        self._note(f"kubelet {_key(key)} started pid {process.pid} at {ip}: {argv} (output: "
                   f"{self._pod_logs[key]})")  # fmt: skip
        self._event(pod, "Normal", "Started", f"Started container {container['name']}", "kubelet")

        def running(p):
            p["status"].update(
                phase="Running",
                podIP=ip,
                podIPs=[{"ip": ip}],
                hostIP="127.0.0.1",
                startTime=now_iso(),
                initContainerStatuses=init,
                containerStatuses=[
                    {
                        "name": container["name"],
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "image": container.get("image", ""),
                        "imageID": f"local://{container.get('image', '')}",
                        "state": {"running": {"startedAt": now_iso()}},
                    }
                ],
            )
            p["status"]["conditions"] = [
                *(p["status"].get("conditions") or []),
                {"type": "Ready", "status": "True", "lastTransitionTime": now_iso()},
            ]

        self._set_status("pods", key, running, uid)
        while process.poll() is None:
            await asyncio.sleep(0.2)
        self._note(f"kubelet {_key(key)} pid {process.pid} exited {process.returncode}")
        if self.processes.get(key) is process:
            del self.processes[key]
        current = self.get("pods", key[1], key[0])
        if current is not None and "deletionTimestamp" not in current["metadata"]:
            code = process.returncode
            self._set_status("pods", key, lambda p: _terminated(p, code, "", init), uid)

    async def _terminate(self, key: tuple[str, str], grace: int) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._kill, key, grace)
        self._remove("pods", key)

    def _kill(self, key, grace: float) -> None:
        process = self.processes.pop(key, None)
        if process is None or process.poll() is not None:
            return
        self._note(f"kubelet {_key(key)} SIGTERM to pid {process.pid} (grace {grace} s)")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(max(grace, 0.1))
        except subprocess.TimeoutExpired:
            self._note(f"kubelet {_key(key)} SIGKILL to pid {process.pid}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    # -- HTTP ----------------------------------------------------------------------------------

    def _list(
        self, plural: str, namespace: str | None, labels: str, fields: str, limit: int, token: str
    ) -> dict:
        """A list as the API server answers it: with ``limit``, that many items at most and,
        when more follow, ``metadata.continue``, a token for the rest of the same snapshot
        (the first page's ``resourceVersion``: objects made, changed or deleted since are
        not seen), and ``remainingItemCount`` when no selector filters the list; a token
        whose snapshot was dropped (``expire_lists``; the API server keeps one a few
        minutes) is 410 Expired."""
        start = ""
        self.lists.append((plural, namespace, limit, token))  # answered or not
        with self._lock:
            if token:
                try:
                    cont = json.loads(base64.b64decode(token))
                    version, start = str(cont["rv"]), cont["start"]
                except (ValueError, KeyError, TypeError):
                    raise ApiError(400, "BadRequest", "continue key is not valid") from None
                objects = self._snapshots.get((plural, version))
                if objects is None:
                    raise ApiError(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent "
                        "list result. You can start a new list without the continue parameter.",
                    )
            else:
                version = str(self.resource_version)
                # in the order of the API server's storage keys (etcd's: "<namespace>/<name>")
                objects = sorted(((_key(k), k, o) for k, o in self.objects[plural].items()))
            matching = [
                (key, o)
                for at, key, o in objects
                if at >= start
                and (namespace is None or key[0] == namespace)
                and label_selector_matches(labels, o["metadata"].get("labels") or {})
                and field_selector_matches(fields, o)
            ]
            page = matching[:limit] if limit > 0 else matching
            metadata: dict[str, Any] = {"resourceVersion": version}
            if len(page) < len(matching):
                if not token:  # the snapshot the next pages come from
                    self._snapshots[(plural, version)] = [
                        (at, k, copy.deepcopy(o)) for at, k, o in objects
                    ]
                    while len(self._snapshots) > SNAPSHOTS:
                        self._snapshots.pop(next(iter(self._snapshots)))
                after = _key(page[-1][0]) + "\x00"
                metadata["continue"] = base64.b64encode(
                    json.dumps({"v": "meta.k8s.io/v1", "rv": int(version), "start": after}).encode()
                ).decode()
                if not labels and not fields:
                    metadata["remainingItemCount"] = len(matching) - len(page)
            items = [copy.deepcopy(o) for _, o in page]
        return {
            "kind": f"{KINDS[plural][0]}List",
            "apiVersion": "v1",
            "metadata": metadata,
            "items": items,
        }

    def expire_lists(self) -> None:
        """Drop every list's snapshot, as the API server's compaction does: a continue token
        given out before is then 410 Expired."""
        with self._lock:
            self._snapshots.clear()

    def _app(self) -> web.Application:
        api = self
        path = r"/api/v1(?:/namespaces/([^/]+))?/([a-z]+)(?:/([^/]+))?/?"

        class Faulty(web.RequestHandler):
            """A request meets its fault (``fail``) before its handler runs; one whose answer
            is to be lost is carried out, then its connection closed."""

            _lose_answer = False
            _late: float | None = None  # a slow answer: seconds to hold it back

            async def prepare(self):
                fault = api._fault_for(self.request.method, self.request.path)
                if fault is None:
                    return
                if fault.kind == "slow":
                    self._late = fault.seconds
                elif fault.kind == "drop":
                    self._drop()
                elif fault.kind == "drop-after":
                    self._lose_answer = True
                elif fault.kind == "answer":
                    self.set_status(fault.code)
                    self.set_header("Content-Type", "application/json")
                    self.finish(fault.body)
                else:
                    self.set_status(fault.code)
                    self.set_header("Content-Type", "application/json")
                    error = ApiError(fault.code, fault.reason, fault.message)
                    self.finish(json.dumps(error.status()))

            def _drop(self):
                self.request.connection.stream.close()
                self._finished = True  # nothing more is written, nor the handler run

            def finish(self, chunk=None):
                if self._lose_answer:
                    return self._drop()
                if self._late is not None:  # carried out now, answered later (once)
                    delay, self._late = self._late, None
                    self._held_back = True
                    later = super().finish
                    return asyncio.ensure_future(_after(delay, lambda: later(chunk)))
                if getattr(self, "_held_back", False):
                    return None  # tornado's own finish after the handler: the answer waits
                return super().finish(chunk)

        class Handler(Faulty):
            def check_xsrf_cookie(self):
                pass

            def write_error(self, status_code, **kwargs):
                error = kwargs.get("exc_info", (None, None))[1]
                if not isinstance(error, ApiError):
                    error = ApiError(status_code, "InternalError", self._reason)
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(error.status()))

            def _fail(self, error: ApiError):
                self.set_status(error.code)
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(error.status()))

            def _plural(self, plural):
                if plural not in KINDS:
                    raise ApiError(404, "NotFound", "the server could not find the requested "
                                   "resource")  # fmt: skip
                if plural in api.forbidden:
                    verb = {"GET": "list", "POST": "create"}.get(self.request.method, "get")
                    raise ApiError(
                        403,
                        "Forbidden",
                        f'{plural} is forbidden: User "system:serviceaccount:jhub:hub" cannot '
                        f'{verb} resource "{plural}" in API group "" at the cluster scope',
                        {"kind": plural},
                    )
                return plural

            def _body(self):
                try:
                    return json.loads(self.request.body or b"{}")
                except ValueError as error:
                    raise ApiError(400, "BadRequest", f"error decoding body: {error}") from None

            def _reply(self, obj, status=200):
                self.set_status(status)
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(obj))

            async def get(self, namespace, plural, name):
                try:
                    plural = self._plural(plural)
                    if name:
                        obj = api.get(plural, name, namespace)
                        if obj is None:
                            raise not_found(plural, name)
                        return self._reply(obj)
                    if namespace is None and plural in api.forbidden_cluster_wide:
                        raise ApiError(
                            403,
                            "Forbidden",
                            f'{plural} is forbidden: User "system:serviceaccount:jhub:hub" '
                            f'cannot list resource "{plural}" in API group "" at the cluster '
                            "scope",
                            {"kind": plural},
                        )
                    if self.get_argument("watch", "") in ("1", "true", "True"):
                        return await self._watch(namespace, plural)
                    labels = self.get_argument("labelSelector", "")
                    fields = self.get_argument("fieldSelector", "")
                    limit = int(self.get_argument("limit", "0") or 0)
                    token = self.get_argument("continue", "")
                    self._reply(api._list(plural, namespace, labels, fields, limit, token))
                except ApiError as error:
                    self._fail(error)

            async def _watch(self, namespace, plural):
                labels = self.get_argument("labelSelector", "")
                fields = self.get_argument("fieldSelector", "")
                field_selector_matches(fields, {"metadata": {}})  # 400 for an unknown field
                since = self.get_argument("resourceVersion", "")
                timeout = float(self.get_argument("timeoutSeconds", "1800"))
                watcher = Watcher(plural, namespace, labels, fields, next(api._watch_ids))
                with api._lock:
                    if since in ("", "0"):  # everything there is, as ADDED
                        backlog = [
                            {"type": "ADDED", "object": copy.deepcopy(o)}
                            for (ns, _), o in sorted(api.objects[plural].items())
                            if api._watched(watcher, plural, o)
                        ]
                    else:
                        oldest = api.history[0][0] if api.history else api.resource_version
                        if int(since) < oldest - 1 and len(api.history) >= HISTORY:
                            backlog = [_gone(since)]
                        else:
                            backlog = [
                                {"type": kind, "object": copy.deepcopy(o)}
                                for rv, p, kind, o in api.history
                                if rv > int(since) and api._watched(watcher, p, o)
                            ]
                    api._watchers.append(watcher)
                    api._note(
                        f"watch#{watcher.id} start {plural} namespace={namespace} "
                        f"labels={labels!r} fields={fields!r} resourceVersion={since!r} "
                        f"timeoutSeconds={timeout:g} backlog={len(backlog)} "
                        f"(at rv {api.resource_version})"
                    )
                self.set_header("Content-Type", "application/json")
                self.set_header("Transfer-Encoding", "chunked")
                deadline = time.monotonic() + timeout
                sent, why = 0, "gone (410)"

                def send(event):
                    api._note(f"watch#{watcher.id} sends {event['type']} "
                              f"{_described(event['object'])}")  # fmt: skip
                    self.write(json.dumps(event) + "\n")

                try:
                    for event in backlog:
                        send(event)
                        sent += 1
                    await self.flush()
                    while backlog[-1:] != [_gone(since)]:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            why = "timeoutSeconds"
                            break
                        try:
                            event = await asyncio.wait_for(watcher.queue.get(), left)
                        except asyncio.TimeoutError:
                            why = "timeoutSeconds"
                            break
                        if event is None or self.request.connection.stream.closed():
                            why = "stopped" if event is None else "the client closed it"
                            break
                        send(event)
                        sent += 1
                        await self.flush()
                except Exception as error:
                    why = f"{type(error).__name__}: {error}"
                finally:
                    with api._lock:
                        api._watchers.remove(watcher)
                    left_over = watcher.queue.qsize()
                    api._note(
                        f"watch#{watcher.id} end ({why}), {sent} sent"
                        + (f", {left_over} queued not sent" if left_over else "")
                    )
                with contextlib.suppress(Exception):
                    self.finish()

            def post(self, namespace, plural, name):
                try:
                    plural = self._plural(plural)
                    body = self._body()
                    api.received.append(("create", plural, copy.deepcopy(body)))
                    self._reply(api._create(plural, namespace, body), 201)
                except ApiError as error:
                    self._fail(error)

            def put(self, namespace, plural, name):
                try:
                    body = self._body()
                    api.received.append(("replace", plural, copy.deepcopy(body)))
                    self._reply(api._update(self._plural(plural), namespace, name, body))
                except ApiError as error:
                    self._fail(error)

            def patch(self, namespace, plural, name):
                try:
                    plural = self._plural(plural)
                    current = api.get(plural, name, namespace)
                    if current is None:
                        raise not_found(plural, name)
                    patch = self._body()
                    api.received.append(("patch", plural, copy.deepcopy(patch)))
                    kind = self.request.headers.get("Content-Type", "").split(";")[0]
                    if kind == "application/json-patch+json":
                        updated = _json_patch(current, patch)
                    else:  # merge and strategic merge patches
                        updated = _merge_patch(current, patch)
                    updated["metadata"].pop("resourceVersion", None)
                    self._reply(api._update(plural, namespace, name, updated))
                except ApiError as error:
                    self._fail(error)

            def delete(self, namespace, plural, name):
                try:
                    plural = self._plural(plural)
                    body = self._body() if self.request.body else {}
                    grace = self.get_argument("gracePeriodSeconds", None)
                    grace = body.get("gracePeriodSeconds") if grace is None else int(grace)
                    uid = (body.get("preconditions") or {}).get("uid")
                    self._reply(api._delete(plural, namespace, name, grace, uid))
                except ApiError as error:
                    self._fail(error)

        class PodMetrics(Faulty):
            """metrics-server's PodMetrics list of a namespace (the module docstring)."""

            def get(self, namespace):
                self.set_header("Content-Type", "application/json")
                if not api.metrics_server:
                    self.set_status(404)
                    return self.finish(json.dumps(ApiError(
                        404, "NotFound", "the server could not find the requested resource"
                    ).status()))  # fmt: skip
                if "pods.metrics.k8s.io" in api.forbidden:
                    self.set_status(403)
                    return self.finish(json.dumps(ApiError(
                        403, "Forbidden", 'pods.metrics.k8s.io is forbidden: User '
                        '"system:serviceaccount:jhub:hub" cannot list resource "pods" in API '
                        f'group "metrics.k8s.io" in the namespace "{namespace}"',
                        {"group": "metrics.k8s.io", "kind": "pods"},
                    ).status()))  # fmt: skip
                self.finish(json.dumps(api._pod_metrics(namespace)))

        class Dcgm(Faulty):
            def get(self, node):
                self.set_header("Content-Type", "text/plain; version=0.0.4")
                self.finish(api._dcgm_text(node))

        class Prometheus(Faulty):
            """``/prometheus/api/v1/query`` for ``{__name__=~"A|B"[,label="v"|=~"re"]...}``: the
            exporters' series as Prometheus keeps them when it scrapes dcgm-exporter (the GPU
            operator's job) with ``honorLabels: true``."""

            def get(self):
                query = self.get_argument("query")
                match = re.fullmatch(r'\{__name__=~"([^"]*)"((?:,\w+=~?"[^"]*")*)\}', query)
                if not match:
                    self.set_status(400)
                    return self.finish({"status": "error", "errorType": "bad_data",
                                        "error": f"unsupported query {query!r}"})  # fmt: skip
                names = set(match[1].split("|"))
                matchers = re.findall(r',(\w+)(=~?)"([^"]*)"', match[2])
                result = []
                for node in list(api.devices):
                    for name, labels, value in api._dcgm_samples(node):
                        metric = {"__name__": name, **labels, "instance": f"{node}:9400",
                                  "job": "nvidia-dcgm-exporter"}  # fmt: skip
                        if name in names and all(
                            re.fullmatch(want, metric.get(label, ""))
                            if op == "=~"
                            else metric.get(label, "") == want
                            for label, op, want in matchers
                        ):
                            result.append({"metric": metric, "value": [time.time(), str(value)]})
                self.finish({"status": "success",
                             "data": {"resultType": "vector", "result": result}})  # fmt: skip

        return web.Application(
            [
                (path, Handler),
                (r"/dcgm/([^/]+)/metrics", Dcgm),
                (r"/apis/metrics\.k8s\.io/v1beta1/namespaces/([^/]+)/pods/?", PodMetrics),
                (r"/prometheus/api/v1/query", Prometheus),
            ],
            log_function=lambda handler: _access_log(api, handler),
        )

    def _dcgm_samples(self, node: str) -> list[tuple[str, dict, float]]:
        """dcgm-exporter's series for one node, with pod attribution (its ``--kubernetes``
        mode): the holder's pod, namespace and container on each device's series."""
        samples = []
        with self._lock:
            devices = list(self.devices.get(node, ()))
        for name, value in (
            ("DCGM_FI_DEV_GPU_UTIL", lambda d: round(d.activity * 100)),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", lambda d: d.activity),
            ("DCGM_FI_DEV_FB_USED", lambda d: 2048 if d.holder else 0),
        ):
            for d in devices:
                labels = {
                    "gpu": str(d.index),
                    "UUID": d.uuid,
                    "device": f"nvidia{d.index}",
                    "modelName": d.model,
                    "Hostname": node,
                }
                if d.holder:
                    labels.update(namespace=d.holder[0], pod=d.holder[1], container=d.holder[2])
                samples.append((name, labels, value(d)))
        return samples

    def _dcgm_text(self, node: str) -> str:
        lines = []
        for name, labels, value in self._dcgm_samples(node):
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {value}")
        return "\n".join(lines) + "\n"


async def _after(seconds: float, then) -> None:
    await asyncio.sleep(seconds)
    with contextlib.suppress(Exception):  # the client gave up meanwhile
        await then()


def _access_log(api: FakeKubernetes, handler: web.RequestHandler) -> None:
    """Every request in the record; a line on the test's output for each request that changes
    the cluster or fails: the hub and the governor read pods, DCGM and Prometheus every half
    second, and those lines would bury a failing test's output (the hub's own log after them)."""
    status = handler.get_status()
    request = handler.request
    api._note(f"{status} {request.method} {request.uri} {1000 * request.request_time():.1f}ms")
    if handler.request.method == "GET" and status < 400:
        return
    level = logging.WARNING if status >= 400 else logging.INFO
    took = 1000 * handler.request.request_time()
    access_log.log(level, "%d %s %.2fms", status, handler._request_summary(), took)


def _terminated(pod: dict, code: int, message: str, init: list) -> None:
    pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
    pod["status"]["initContainerStatuses"] = init
    # A pod ended before its container started (deleted while starting) still has the status
    # the API server writes for it: the client's model requires image, imageID, restartCount.
    first = (pod.get("spec", {}).get("containers") or [{}])[0]
    image = first.get("image", "")
    never = {"name": first.get("name", "notebook"), "image": image, "imageID": "",
             "restartCount": 0}  # fmt: skip
    for status in pod["status"].get("containerStatuses") or [never]:
        status.update(
            ready=False,
            state={"terminated": {"exitCode": code, "reason": "Error" if code else "Completed",
                                  "message": message}},
        )  # fmt: skip
    pod["status"].setdefault("containerStatuses", [status])


def _a_watchs(line: str) -> bool:
    """A record line of a watch's start or end, its request, or a list at a resourceVersion
    (KubeSpawner's reflectors list so before each watch)."""
    return (" watch#" in line and (" start " in line or " end " in line)) or (
        "resourceVersion=" in line and " change " not in line
    )


def _described(obj: dict) -> str:
    """An object as the record names it: namespace/name, resourceVersion, a pod's phase and
    node, an event's reason and the pod it is about."""
    meta = obj.get("metadata") or {}
    text = f"{meta.get('namespace') or ''}/{meta.get('name')} rv={meta.get('resourceVersion')}"
    if obj.get("kind") == "Pod":
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        text += f" phase={status.get('phase')} node={spec.get('nodeName') or '-'}"
        text += " deleting" if "deletionTimestamp" in meta else ""
    elif obj.get("kind") == "Event":
        text += f" {obj.get('reason')} of {(obj.get('involvedObject') or {}).get('name')}"
    elif obj.get("kind") == "Status":
        text += f" {obj.get('code')} {obj.get('message')}"
    return text


def _key(key: tuple) -> str:
    namespace, name = key
    return f"{namespace or ''}/{name}"


def _gone(since: str) -> dict:
    return {
        "type": "ERROR",
        "object": ApiError(410, "Expired", f"too old resource version: {since}").status(),
    }


def _decoded(plural: str, value: str) -> str:
    if plural == "secrets":
        import base64

        return base64.b64decode(value).decode()
    return value


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _json_patch(target: dict, operations: list) -> dict:
    doc = copy.deepcopy(target)
    for op in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ApiError(422, "Invalid", f"unsupported JSON patch operation {op['op']!r}")
    return doc


_schema_cache: dict[str, Any] = {}


def _schema_errors(obj: dict) -> list[tuple[str, str, str]]:
    """The object against the OpenAPI schema of its kind (kubernetes-validate, strict)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path) or "<root>"
        return [("FieldValueInvalid", where, error.message.splitlines()[0])]
    return []
