"""The CPU of the servers' pods as the kubelet measures it (cAdvisor), read from metrics-server:
``GET /apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods`` (PodMetrics), one list per namespace
the Hub's records name, once a pass. A server that sends no report and whose container's CPU
stays busy while DCGM reads its GPU idle is in a CPU stage (``core.cpu_stage``).

A pod is matched to a server by the Hub's records alone (KubeSpawner's state: namespace and pod
name), never by labels a pod can copy. What the API answers is bounded (bytes, items,
containers) and each item checked; an item that fails is left out (its server unknown: decided
on DCGM alone, as before), never the list. The answer is read item by item in a thread of its
own (at 10,000 pods the whole document would be tens of MB of objects at once), and folded
there into new runs the loop then takes whole. Without metrics-server (404) or the RBAC to read
it (403), this is said when found and the namespace asked again every ``RETRY_ABSENT`` (every
server is decided as before meanwhile); when it answers again, that is said once too.
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
from ..core.vocabulary import DNS_SUBDOMAIN
from .health import SERVICE_ACCOUNT, bearer

log = logging.getLogger("jupyter_gpu_gov.hub")

METRICS_PATH = "/apis/metrics.k8s.io/v1beta1/namespaces/{}/pods"
# Bounds on an answer: its bytes (a PodMetrics item is about 300 bytes a container: 30,000
# pods is about 10 MB), items, containers an item, namespaces read a pass.
MAX_BYTES = 32 * 1024 * 1024
MAX_ITEMS = 50_000
MAX_CONTAINERS = 64
MAX_NAMESPACES = 16
# A namespace whose list answered 404 (no metrics-server) or 403 (no RBAC) is asked again after
# this: an admin who installs metrics-server or grants the role is seen without a restart, and
# a cluster without it costs one request a namespace this often.
RETRY_ABSENT = timedelta(minutes=10)
# The most cores a container's reading may say: a node with more is not made (a 2-socket
# server has 384 threads); a larger figure is garbage, not a busy server.
MAX_CORES = 1024.0
# A CPU quantity as metrics-server writes one: a whole or decimal number of cores, or of
# thousandths (m), millionths (u) or billionths (n) of a core.
_QUANTITY = re.compile(r"([0-9]{1,18})(?:\.([0-9]{1,9}))?([num]?)")
_SCALE = {"": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
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


def _reading(
    item: object, namespace: str, stamps: dict[str, datetime]
) -> tuple[str, datetime, float] | None:
    """One PodMetrics item: (pod, when read, cores of its containers together), or None when it
    is not well formed (its name, its time, a quantity) or names another namespace. ``stamps``:
    the times already parsed (metrics-server stamps a node's pods alike), shared."""
    try:
        meta = item["metadata"]
        name, ns = meta["name"], meta.get("namespace", namespace)
        if ns != namespace or not isinstance(name, str) or not DNS_SUBDOMAIN.fullmatch(name):
            return None  # (another namespace's pod, in an answer for this one: not believed)
        stamp = item["timestamp"]
        at = stamps.get(stamp) if isinstance(stamp, str) else None
        if at is None:
            if not isinstance(stamp, str) or len(stamp) > 40:
                return None
            at = stamps[stamp] = clock.parse(stamp)
        containers = item["containers"]
        if not isinstance(containers, list) or not 0 < len(containers) <= MAX_CONTAINERS:
            return None
        cores = [parse_cpu(c["usage"]["cpu"]) for c in containers]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if any(c is None for c in cores):
        return None
    return name, at, min(sum(cores), MAX_CORES)


def pod_readings(body: object, namespace: str) -> dict[tuple[str, str], tuple[datetime, float]]:
    """The pods of one PodMetricsList (parsed): (namespace, pod) -> (when read, cores of its
    containers together). An item that is not well formed is left out."""
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a PodMetricsList (no items)")
    found: dict[tuple[str, str], tuple[datetime, float]] = {}
    stamps: dict[str, datetime] = {}
    for item in items[:MAX_ITEMS]:
        if (reading := _reading(item, namespace, stamps)) is not None:
            found[(namespace, reading[0])] = reading[1:]
    return found


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


def _items(text: str):
    """The items of a PodMetricsList's JSON, decoded one at a time: the whole document is never
    built (at 10,000 pods it is tens of MB of objects; one item is a few kB). The top-level
    object's other members are decoded and dropped. Raises ValueError for what is not JSON, not
    an object, or has no ``items`` list (as ``json.loads`` and ``pod_readings`` would)."""

    def skip(at: int) -> int:
        return _WHITESPACE.match(text, at).end()

    at = skip(0)
    if text[at : at + 1] != "{":
        raise ValueError("not a PodMetricsList (no items)")
    at, found = skip(at + 1), False
    if text[at : at + 1] == "}":
        at += 1
    else:
        while True:
            key, at = _decoder.raw_decode(text, at)
            if not isinstance(key, str):
                raise ValueError("a member's name is not a string")
            at = skip(at)
            if text[at : at + 1] != ":":
                raise ValueError("expected ':'")
            at = skip(at + 1)
            if key == "items" and text[at : at + 1] == "[":
                if found:
                    raise ValueError("two item lists")
                found, at = True, skip(at + 1)
                if text[at : at + 1] == "]":
                    at += 1
                else:
                    while True:
                        item, at = _decoder.raw_decode(text, at)
                        yield item
                        at = skip(at)
                        if text[at : at + 1] == "]":
                            at += 1
                            break
                        if text[at : at + 1] != ",":
                            raise ValueError("expected ',' or ']'")
                        at = skip(at + 1)
            else:
                _, at = _decoder.raw_decode(text, at)  # kind, apiVersion, metadata: dropped
            at = skip(at)
            if text[at : at + 1] == "}":
                at += 1
                break
            if text[at : at + 1] != ",":
                raise ValueError("expected ',' or '}'")
            at = skip(at + 1)
    if skip(at) != len(text):
        raise ValueError("extra data after the document")
    if not found:
        raise ValueError("not a PodMetricsList (no items)")


def _fold(
    body: bytearray,
    namespace: str,
    runs: dict[tuple[str, str], cpu_stage.CpuRun],
    now: datetime,
    options: PodCpuOptions,
) -> dict[tuple[str, str], cpu_stage.CpuRun]:
    """In the parser's thread: one namespace's answer read item by item and folded into the
    runs its pods had (``runs``, read only: a new dict is returned, so the loop's is never
    changed under it): the runs of the pods it lists, no others."""
    text = body.decode()
    del body[:]  # (the bytes are not needed twice)
    found: dict[str, tuple[datetime, float]] = {}
    stamps: dict[str, datetime] = {}
    for count, item in enumerate(_items(text)):
        if count == MAX_ITEMS:
            break  # (the rest is not read)
        if (reading := _reading(item, namespace, stamps)) is not None:
            found[reading[0]] = reading[1:]
    folded = {}
    for name, (at, cores) in found.items():
        pod = (namespace, name)
        folded[pod] = cpu_stage.fold(
            runs.get(pod),
            min(at, now),  # (a clock ahead of ours: read as now)
            cores,
            threshold=options.cores,
            gap=options.max_age,
        )
    return folded


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
        self._runs: dict[tuple[str, str], cpu_stage.CpuRun] = {}  # replaced, never changed
        self._namespaces: set[str] = set()  # the namespaces the Hub's records named
        self._keys: dict[tuple[str, str], str] = {}  # pod -> the server the records give it
        self._stages: dict[tuple[str, str], datetime] = {}  # as of the last ``changed``
        self._http: AsyncHTTPClient | None = None
        self._failing: dict[str, str] = {}  # namespace -> the error last logged
        # Namespaces whose list answered 404 or 403 (no metrics-server, no RBAC): when to ask
        # again (``RETRY_ABSENT``): an admin who installs it or grants the role needs no restart.
        self._absent: dict[str, datetime] = {}

    def want(self, pod: tuple[str | None, str] | None, key: str) -> None:
        """A pod the Hub's records name for server ``key``: its namespace is read from the
        next pass."""
        if not self.enabled or pod is None or not pod[0]:
            return
        self._keys[(pod[0], pod[1])] = key
        if (
            pod[0] not in self._namespaces
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
        after, max_age = self.options.after, self.options.max_age
        stages = {  # (``cpu_stage.busy_since``, inline: every pod a pass)
            pod: run.since
            for pod, run in self._runs.items()
            if run is not None
            and run.since is not None
            and now - run.last <= max_age
            and run.last - run.since >= after
        }
        last, self._stages = self._stages, stages
        if stages == last:
            return set()
        moved = {p for p in stages.keys() | last.keys() if stages.get(p) != last.get(p)}
        return {self._keys[p] for p in moved if p in self._keys}

    async def read(self, now: datetime) -> None:
        """One list per namespace, folded into each pod's run; pods no list names any more are
        forgotten. A namespace whose list fails leaves its pods' runs to go stale; one without
        metrics-server or the RBAC to read it is asked again after ``RETRY_ABSENT``."""
        if not self.enabled or not self._namespaces:
            return
        namespaces = [ns for ns in sorted(self._namespaces) if self._due(ns, now)]
        if not namespaces:
            return
        answers = await asyncio.gather(*(self._list(ns, now) for ns in namespaces))
        read = dict(zip(namespaces, answers, strict=True))
        runs: dict[tuple[str, str], cpu_stage.CpuRun] = {}
        for pod, run in self._runs.items():  # namespaces not read, or failed: kept
            if pod[0] not in read or read[pod[0]] is None:
                runs[pod] = run
        for folded in answers:
            if folded is not None:
                runs.update(folded)
        self._runs = runs
        self._keys = {p: k for p, k in self._keys.items() if p in runs}

    def _due(self, namespace: str, now: datetime) -> bool:
        retry_at = self._absent.get(namespace)
        # (a clock that went back more than the wait is not waited for)
        return retry_at is None or not now < retry_at <= now + RETRY_ABSENT

    async def _list(
        self, namespace: str, now: datetime
    ) -> dict[tuple[str, str], cpu_stage.CpuRun] | None:
        """The namespace's pods' runs with this answer folded in; None when it failed."""
        url = self.options.kubernetes_api_url.rstrip("/") + METRICS_PATH.format(
            quote(namespace, safe="")
        )
        ca = self.options.kubernetes_ca_file
        body = bytearray()

        def keep(chunk: bytes) -> None:
            body.extend(chunk)
            if len(body) > MAX_BYTES:
                raise ValueError(f"the answer is over {MAX_BYTES} bytes")

        if self._http is None:
            self._http = AsyncHTTPClient()
        try:
            # (a token file that cannot be read fails this read; it raised out of the pass)
            headers = {"Accept": "application/json", **bearer(self.options.kubernetes_token_file)}
            request = HTTPRequest(
                url,
                headers=headers,
                ca_certs=ca if url.startswith("https:") and ca and Path(ca).is_file() else None,
                request_timeout=self.options.timeout,
                follow_redirects=False,
                streaming_callback=keep,
            )
            await self._http.fetch(request)
            folded = await asyncio.get_running_loop().run_in_executor(
                _parser, _fold, body, namespace, self._runs, now, self.options
            )
        except HTTPClientError as error:
            if error.code in (403, 404):
                return self._missing(namespace, now, error.code)
            return self._failed(namespace, str(error))
        except Exception as error:  # a failed read changes nothing: its runs go stale
            return self._failed(namespace, f"{type(error).__name__}: {error}")
        self._failing.pop(namespace, None)
        if self._absent.pop(namespace, None) is not None:
            log.warning(
                "gpu-gov: the pods' CPU (metrics.k8s.io PodMetrics in %s) is read again: CPU "
                "stages of servers without the extension are seen from now on",
                namespace,
            )
        return folded

    def _missing(self, namespace: str, now: datetime, code: int) -> dict:
        """No metrics-server (404) or no RBAC to read it (403): said when it is found (not
        again while it stays so), the namespace's runs dropped (none are known: every server
        is decided as without this reading) and asked again after ``RETRY_ABSENT``."""
        if namespace not in self._absent:
            why = "no RBAC to read it" if code == 403 else "no metrics-server"
            log.warning(
                "gpu-gov: the pods' CPU (metrics.k8s.io PodMetrics in %s) cannot be read "
                "(%s: %s): CPU stages of servers without the extension are not seen; they "
                "are decided on DCGM alone (a cull waits busy_grace). Needs metrics-server "
                "and RBAC: list on pods.metrics.k8s.io (docs/kubernetes.md); asked again "
                "every %d minutes, no restart needed",
                namespace,
                code,
                why,
                RETRY_ABSENT // timedelta(minutes=1),
            )
        self._absent[namespace] = now + RETRY_ABSENT
        self._failing.pop(namespace, None)
        return {}  # (read: it has no pods' readings)

    def _failed(self, namespace: str, error: str) -> None:
        if self._failing.get(namespace) != error[:200]:  # said once per change, not per pass
            log.warning("gpu-gov: reading the pods' CPU in %s failed: %s", namespace, error[:200])
            self._failing[namespace] = error[:200]
        return None
