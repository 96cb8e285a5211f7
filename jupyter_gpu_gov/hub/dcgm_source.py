"""Reading DCGM: from Prometheus or straight from the exporters, in a worker process, never
raising on I/O (``DcgmSource``); what the read means is ``hub/dcgm.py``'s."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import multiprocessing
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from signal import SIG_IGN, SIGINT
from signal import signal as set_signal_handler
from urllib.parse import urlencode, urlsplit

from ..core import clock
from .dcgm import (
    DEFAULT_MAX_BYTES,
    DcgmConfig,
    DcgmSnapshot,
    GpuEvidence,
    parse_exposition,
    parse_prometheus_query,
    prometheus_query,
)


class DcgmSource:
    """Reads DCGM evidence from Prometheus or straight from exporters; never raises on I/O.

    Prometheus mode sends *one* regex query (``prometheus_query``) rather than one per metric:
    one round trip per cycle, and every metric is evaluated at the same instant, so a GPU's
    activity and PCIe readings belong together. Exporter mode scrapes every URL concurrently;
    an exporter that fails costs only its own node's GPUs, recorded in ``errors``.

    ``fetch`` runs the whole read (HTTP, decompression, parsing) in a worker *process*: a
    10,000-GPU fleet is about 40 MB of text and most of a second of CPU, which in a thread would
    still hold the service's GIL for that long, slowing the pass and every report meanwhile.
    The service only unpickles the evidence (the figures: docs/benchmarks.md).
    """

    def __init__(
        self,
        *,
        prometheus_url: str | None = None,
        exporter_urls: Sequence[str] = (),
        config: DcgmConfig | None = None,
        timeout_s: float = 5.0,
        bearer_token: str | None = None,
        headers: Mapping[str, str] | None = None,
        validate_cert: bool = True,
        ca_certs: str | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if bool(prometheus_url) == bool(exporter_urls):
            raise ValueError("DcgmSource: give either prometheus_url or exporter_urls")
        headers = dict(headers or {})
        if bearer_token:
            headers["Authorization"] = f"Bearer {bearer_token}"
        self.reader = DcgmReader(
            prometheus_url=prometheus_url,
            exporter_urls=tuple(exporter_urls),
            config=config or DcgmConfig(),
            timeout_s=timeout_s,
            headers=headers,
            validate_cert=validate_cert,
            ca_certs=ca_certs,
            max_bytes=max_bytes,
        )

    async def fetch(self) -> DcgmSnapshot:
        # Stamped when the read starts, on the service's clock: what a slow answer says is as
        # old as the question (the governor ignores evidence past its dcgm_max_age).
        asked, asked_monotonic = clock.utcnow(), time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            evidence, errors, cpu_s = await loop.run_in_executor(_worker(), self.reader.read)
        except BrokenProcessPool as e:  # the worker died (killed, out of memory): start afresh
            _reset_worker()
            evidence, errors, cpu_s = [], [f"DCGM worker: {type(e).__name__}: {e}"], 0.0
        return DcgmSnapshot(tuple(evidence), asked, tuple(errors), cpu_s, asked_monotonic)


@dataclass(frozen=True)
class DcgmReader:
    """The blocking read, sent to the worker process (so it holds only what pickles)."""

    prometheus_url: str | None
    exporter_urls: tuple[str, ...]
    config: DcgmConfig
    timeout_s: float
    headers: Mapping[str, str]
    validate_cert: bool
    ca_certs: str | None
    max_bytes: int = DEFAULT_MAX_BYTES

    def read(self) -> tuple[list[GpuEvidence], list[str], float]:
        """The blocking read, run in the worker: evidence, errors, and the CPU seconds it took."""
        started = time.process_time()
        if self.prometheus_url:
            results = [self._query_prometheus(self.prometheus_url)]
        else:
            with ThreadPoolExecutor(min(16, len(self.exporter_urls))) as pool:
                results = list(pool.map(self._scrape, self.exporter_urls))
        evidence = [e for found, _ in results for e in found]
        errors = [error for _, errs in results for error in errs]
        return evidence, errors, time.process_time() - started

    def _get(self, url: str, accept: str) -> str:
        """The body of a GET, within ``timeout_s`` in all (connecting, headers, body: a server
        that trickles bytes is cut off at the deadline), at most ``max_bytes`` once
        decompressed. Plain ``http.client``: no proxy from the environment (the exporters are
        in-cluster) and no redirects."""
        parts = urlsplit(url)
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=self.ca_certs)
            if not self.validate_cert:
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.netloc, timeout=self.timeout_s, context=context
            )
        elif parts.scheme == "http":
            connection = http.client.HTTPConnection(parts.netloc, timeout=self.timeout_s)
        else:
            raise ValueError(f"not an http(s) URL: {url!r}")
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        # A socket timeout bounds each wait, not the read: a watchdog ends the whole of it.
        expired = threading.Event()
        watchdog = threading.Timer(self.timeout_s, _cut_off, (connection, expired))
        watchdog.start()
        try:
            headers = {"Accept": accept, "Accept-Encoding": "gzip", **self.headers}
            connection.request("GET", target, headers=headers)
            response = connection.getresponse()
            gzipped = response.getheader("Content-Encoding", "").lower() == "gzip"
            body = _Body(self.max_bytes, gzipped)
            while chunk := response.read1(1 << 20):
                body.add(chunk)
            body.end()
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise TimeoutError(f"no whole answer within {self.timeout_s:g}s") from None
            raise
        finally:
            watchdog.cancel()
            connection.close()
        if expired.is_set():
            raise TimeoutError(f"no whole answer within {self.timeout_s:g}s")
        text = body.text()
        if response.status != 200:
            raise OSError(f"HTTP {response.status} {response.reason}: {text[:200].strip()}")
        return text

    def _scrape(self, url: str) -> tuple[list[GpuEvidence], list[str]]:
        rejected: list[str] = []
        try:
            evidence = parse_exposition(self._get(url, "text/plain"), self.config, rejected)
        except Exception as e:  # any failure degrades to "no DCGM for this node", never a crash
            return [], [f"{url}: {type(e).__name__}: {e}"]
        return evidence, _rejections(url, rejected)

    def _query_prometheus(self, base: str) -> tuple[list[GpuEvidence], list[str]]:
        query = urlencode({"query": prometheus_query(self.config)})
        url = f"{base.rstrip('/')}/api/v1/query?{query}"
        rejected: list[str] = []
        try:
            payload = json.loads(self._get(url, "application/json"))
            evidence = parse_prometheus_query(payload, self.config, rejected)
        except Exception as e:  # any failure degrades to "no DCGM", never a crash
            return [], [f"{base}: {type(e).__name__}: {e}"]
        # Warnings flag partial data (e.g. a Thanos store that did not answer).
        warnings = [f"{base}: warning: {w}" for w in payload.get("warnings") or []]
        return evidence, warnings + _rejections(base, rejected)


def _cut_off(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The read's deadline: the blocked read ends (as an error the reader then names)."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Body:
    """An answer's bytes as they come, decompressed as they come, never past ``limit``."""

    def __init__(self, limit: int, gzipped: bool):
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None

    def add(self, chunk: bytes) -> None:
        if self.inflate is None:
            self._keep(chunk)
            return
        while chunk:
            # At most what is still allowed (+1, to notice going over), however it inflates.
            self._keep(self.inflate.decompress(chunk, self.limit - self.size + 1))
            chunk = self.inflate.unconsumed_tail

    def end(self) -> None:
        if self.inflate is not None:
            self._keep(self.inflate.flush())
            if not self.inflate.eof:
                raise ValueError("the gzip body ends early")

    def _keep(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise ValueError(f"the answer is over {self.limit} bytes (decompressed)")
        self.chunks.append(data)

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")


def _rejections(source: str, rejected: list[str], shown: int = 3) -> list[str]:
    if not rejected:
        return []
    more = f" and {len(rejected) - shown} more" if len(rejected) > shown else ""
    named = ", ".join(rejected[:shown])
    return [f"{source}: {len(rejected)} value(s) out of range ignored (unknown): {named}{more}"]


# One worker process for the service, started at the first fetch. "spawn": the service runs
# threads (asyncio's executor, the diagnosis trainer), which a forked child must not inherit.
_pool: ProcessPoolExecutor | None = None


def _worker() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        context = multiprocessing.get_context("spawn")
        _pool = ProcessPoolExecutor(1, mp_context=context, initializer=_ignore_interrupts)
    return _pool


def _reset_worker() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
    _pool = None


def _ignore_interrupts() -> None:
    # Ctrl-C in a terminal reaches the whole process group: the service shuts its worker down.
    set_signal_handler(SIGINT, SIG_IGN)
