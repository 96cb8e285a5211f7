"""The CPU of the servers' pods as the kubelet measures it (cAdvisor), read from metrics-server:
``GET /apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods`` (PodMetrics), one list per namespace
the Hub's records name, once a pass. A server that sends no report and whose container's CPU
stays busy while DCGM reads its GPU idle is in a CPU stage (``core.cpu_stage``).

A pod is matched to a server by the Hub's records alone (KubeSpawner's state: namespace and pod
name), never by labels a pod can copy. What the API answers is bounded (bytes, items,
containers) and each item checked; an item that fails is left out (its server unknown: decided
on DCGM alone, as before), never the list. Without metrics-server (404) or the RBAC to read it
(403), this is said once and no more reads are made: every server is decided as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..core import clock, cpu_stage
from .health import SERVICE_ACCOUNT

log = logging.getLogger("jupyter_gpu_gov.hub")

METRICS_PATH = "/apis/metrics.k8s.io/v1beta1/namespaces/{}/pods"
# Bounds on an answer: its bytes (a PodMetrics item is about 300 bytes a container: 30,000
# pods is about 10 MB), items, containers an item, namespaces read a pass.
MAX_BYTES = 32 * 1024 * 1024
MAX_ITEMS = 50_000
MAX_CONTAINERS = 64
MAX_NAMESPACES = 16
# The most cores a container's reading may say: a node with more is not made (a 2-socket
# server has 384 threads); a larger figure is garbage, not a busy server.
MAX_CORES = 1024.0
# A CPU quantity as metrics-server writes one: a whole or decimal number of cores, or of
# thousandths (m), millionths (u) or billionths (n) of a core.
_QUANTITY = re.compile(r"([0-9]{1,18})(?:\.([0-9]{1,9}))?([num]?)")
_SCALE = {"": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_parser = ThreadPoolExecutor(1, thread_name_prefix="gpu-gov-pod-cpu")  # not the loop's default


def parse_cpu(quantity: object) -> float | None:
    """Cores from a CPU quantity (``"1250m"``, ``"1234567n"``, ``"2"``); None for anything else
    (garbage, an exponent, a sign) or a figure past ``MAX_CORES``."""
    if not isinstance(quantity, str) or len(quantity) > 32:
        return None
    match = _QUANTITY.fullmatch(quantity)
    if match is None:
        return None
    whole, fraction, suffix = match.groups()
    cores = float(f"{whole}.{fraction or 0}") * _SCALE[suffix]
    return cores if cores <= MAX_CORES else None


def pod_readings(body: object, namespace: str) -> dict[tuple[str, str], tuple[datetime, float]]:
    """The pods of one PodMetricsList: (namespace, pod) -> (when read, cores of its containers
    together). An item that is not well formed (its name, its time, a quantity) is left out."""
    found: dict[tuple[str, str], tuple[datetime, float]] = {}
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a PodMetricsList (no items)")
    for item in items[:MAX_ITEMS]:
        try:
            meta = item["metadata"]
            name, ns = meta["name"], meta.get("namespace", namespace)
            if ns != namespace or not isinstance(name, str) or not _POD_NAME.fullmatch(name):
                continue  # (another namespace's pod, in an answer for this one: not believed)
            at = clock.parse(item["timestamp"])
            containers = item["containers"]
            if not isinstance(containers, list) or not 0 < len(containers) <= MAX_CONTAINERS:
                continue
            cores = [parse_cpu(c["usage"]["cpu"]) for c in containers]
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if any(c is None for c in cores):
            continue
        found[(ns, name)] = (at, min(sum(cores), MAX_CORES))
    return found


def _parse(body: bytes, namespace: str) -> dict[tuple[str, str], tuple[datetime, float]]:
    return pod_readings(json.loads(body), namespace)


@dataclass(frozen=True)
class PodCpuOptions:
    """What ``PodCpu`` reads, and what a CPU stage is (``core.cpu_stage``)."""

    kubernetes_api_url: str = ""  # "": none (not on Kubernetes): nothing is read
    kubernetes_token_file: str = f"{SERVICE_ACCOUNT}/token"
    kubernetes_ca_file: str = f"{SERVICE_ACCOUNT}/ca.crt"
    cores: float = cpu_stage.CPU_STAGE_CORES  # 0: off
    after: timedelta = cpu_stage.CPU_STAGE_AFTER
    # A reading older than this is stale (unknown), and readings further apart are no run.
    max_age: timedelta = timedelta(minutes=3)
    timeout: float = 10.0  # seconds a list may take


class PodCpu:
    """Each pod's folded CPU readings (``core.cpu_stage.CpuRun``), by (namespace, pod)."""

    def __init__(self, options: PodCpuOptions):
        self.options = options
        self.enabled = bool(options.kubernetes_api_url) and options.cores > 0
        self._runs: dict[tuple[str, str], cpu_stage.CpuRun] = {}
        self._namespaces: set[str] = set()  # the namespaces the Hub's records named
        self._keys: dict[tuple[str, str], str] = {}  # pod -> the server the records give it
        self._stages: dict[tuple[str, str], datetime] = {}  # as of the last ``changed``
        self._http: AsyncHTTPClient | None = None
        self._failing: dict[str, str] = {}  # namespace -> the error last logged

    def want(self, pod: tuple[str | None, str] | None, key: str) -> None:
        """A pod the Hub's records name for server ``key``: its namespace is read from the
        next pass."""
        if self.enabled and pod is not None and pod[0]:
            self._keys[(pod[0], pod[1])] = key
        if (
            self.enabled
            and pod is not None
            and pod[0]
            and pod[0] not in self._namespaces
            and len(self._namespaces) < MAX_NAMESPACES
            and _DNS_LABEL.fullmatch(pod[0])
        ):
            self._namespaces.add(pod[0])

    def busy_since(self, pod: tuple[str | None, str] | None, now: datetime) -> datetime | None:
        """Since when the pod's containers have been busy (a CPU stage), if they are by fresh
        readings; None when not, or not known."""
        if not self.enabled or pod is None or pod[0] is None:
            return None
        run = self._runs.get((pod[0], pod[1]))
        return cpu_stage.busy_since(
            run, now, after=self.options.after, max_age=self.options.max_age
        )

    def changed(self, now: datetime) -> set[str]:
        """The servers whose CPU stage began, ended or moved since the last call: to be
        decided again this pass, where a kept decision would otherwise stand."""
        stages = {
            pod: since for pod in self._runs if (since := self.busy_since(pod, now)) is not None
        }
        last, self._stages = self._stages, stages
        moved = {p for p in stages.keys() | last.keys() if stages.get(p) != last.get(p)}
        return {self._keys[p] for p in moved if p in self._keys}

    async def read(self, now: datetime) -> None:
        """One list per namespace, folded into each pod's run; pods no list names any more are
        forgotten. A namespace whose list fails leaves its pods' runs to go stale."""
        if not self.enabled or not self._namespaces:
            return
        namespaces = sorted(self._namespaces)
        answers = await asyncio.gather(*(self._list(ns) for ns in namespaces))
        listed: set[tuple[str, str]] = set()
        for namespace, readings in zip(namespaces, answers, strict=True):
            if readings is None:
                listed |= {pod for pod in self._runs if pod[0] == namespace}
                continue
            for pod, (at, cores) in readings.items():
                listed.add(pod)
                self._runs[pod] = cpu_stage.fold(
                    self._runs.get(pod),
                    min(at, now),  # (a clock ahead of ours: read as now)
                    cores,
                    threshold=self.options.cores,
                    gap=self.options.max_age,
                )
        for pod in [p for p in self._runs if p not in listed]:
            del self._runs[pod]
        self._keys = {p: k for p, k in self._keys.items() if p in listed}

    async def _list(self, namespace: str) -> dict | None:
        url = self.options.kubernetes_api_url.rstrip("/") + METRICS_PATH.format(
            quote(namespace, safe="")
        )
        headers = {"Accept": "application/json"}
        token_file = Path(self.options.kubernetes_token_file)
        if self.options.kubernetes_token_file and token_file.is_file():
            headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"  # (rotated)
        ca = self.options.kubernetes_ca_file
        chunks: list[bytes] = []
        size = 0

        def keep(chunk: bytes) -> None:
            nonlocal size
            size += len(chunk)
            if size > MAX_BYTES:
                raise ValueError(f"the answer is over {MAX_BYTES} bytes")
            chunks.append(chunk)

        request = HTTPRequest(
            url,
            headers=headers,
            ca_certs=ca if url.startswith("https:") and ca and Path(ca).is_file() else None,
            request_timeout=self.options.timeout,
            follow_redirects=False,
            streaming_callback=keep,
        )
        if self._http is None:
            self._http = AsyncHTTPClient()
        try:
            await self._http.fetch(request)
            readings = await asyncio.get_running_loop().run_in_executor(
                _parser, _parse, b"".join(chunks), namespace
            )
        except HTTPClientError as error:
            if error.code in (403, 404):
                self.enabled = False
                self._runs.clear()
                why = "no RBAC to read it" if error.code == 403 else "no metrics-server"
                log.warning(
                    "gpu-gov: the pods' CPU (metrics.k8s.io PodMetrics in %s) cannot be read "
                    "(%s: %s): CPU stages of servers without the extension are not seen; they "
                    "are decided on DCGM alone (a cull waits busy_grace). Needs metrics-server "
                    "and RBAC: list on pods.metrics.k8s.io (docs/kubernetes.md)",
                    namespace,
                    error.code,
                    why,
                )
                return None
            return self._failed(namespace, str(error))
        except Exception as error:  # a failed read changes nothing: its runs go stale
            return self._failed(namespace, f"{type(error).__name__}: {error}")
        self._failing.pop(namespace, None)
        return readings

    def _failed(self, namespace: str, error: str) -> None:
        if self._failing.get(namespace) != error[:200]:  # said once per change, not per pass
            log.warning("gpu-gov: reading the pods' CPU in %s failed: %s", namespace, error[:200])
            self._failing[namespace] = error[:200]
        return None
