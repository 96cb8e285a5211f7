"""Reading DCGM: from Prometheus or straight from the exporters, in a worker process, never
raising on I/O (``DcgmSource``); what the read means is ``hub/dcgm.py``'s."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
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
    The service only unpickles the evidence (the figures: docs/benchmarks-history.md).

    An exporter whose body is byte-for-byte the last one's (it has not collected since: its
    ``-c`` interval is longer than the cycle) is not parsed again nor sent back: the service
    keeps what that body said (``_last``, by URL).
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
        # Per exporter URL: its last body's digest, and the evidence and errors it gave.
        self._last: dict[str, tuple[bytes, tuple[GpuEvidence, ...], tuple[str, ...]]] = {}

    async def fetch(self) -> DcgmSnapshot:
        # Stamped when the read starts, on the service's clock: what a slow answer says is as
        # old as the question (the governor ignores evidence past its dcgm_max_age).
        asked, asked_monotonic = clock.utcnow(), time.monotonic()
        loop = asyncio.get_running_loop()
        known = {url: last[0] for url, last in self._last.items()}
        try:
            reads, cpu_s = await loop.run_in_executor(_worker(), self.reader.read, known)
        except BrokenProcessPool as e:  # the worker died (killed, out of memory): start afresh
            _reset_worker()
            self._last.clear()
            return DcgmSnapshot(
                (), asked, (f"DCGM worker: {type(e).__name__}: {e}",), 0.0, asked_monotonic
            )
        evidence: list[GpuEvidence] = []
        errors: list[str] = []
        for source, digest, found, said in reads:
            if found is None:  # the body this service parsed last time
                last = self._last.get(source)  # (gone only if another read cleared it meanwhile)
                found, said = last[1:] if last else ((), (f"{source}: read again next time",))
            elif digest is None:  # a failed read, or Prometheus (its answers always move)
                self._last.pop(source, None)
            else:
                self._last[source] = (digest, tuple(found), tuple(said))
            evidence += found
            errors += said
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

    def read(self, known: Mapping[str, bytes] | None = None) -> tuple[list[Read], float]:
        """The blocking read, run in the worker: what each source said, and the CPU seconds it
        took. ``known``: each exporter's last body's digest, as the service holds it parsed; a
        body the same is neither parsed nor sent back (its evidence ``None``)."""
        started = time.process_time()
        if self.prometheus_url:
            found, errors = self._query_prometheus(self.prometheus_url)
            reads = [(self.prometheus_url, None, found, errors)]
        else:
            known = known or {}
            with ThreadPoolExecutor(min(16, len(self.exporter_urls))) as pool:
                reads = list(
                    pool.map(self._scrape, self.exporter_urls, map(known.get, self.exporter_urls))
                )
        return reads, time.process_time() - started

    def _get(self, url: str, accept: str) -> bytes:
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
            if response.status == 200 and _unframed(response) and not gzipped:
                raise ValueError(
                    "the answer has neither a Content-Length nor chunked encoding: where it "
                    "ends only the connection's close says, and a connection dropped mid-answer "
                    "would read as whole (an HTTP/1.0 server or proxy?)"
                )
            body = _Body(self.max_bytes, gzipped)
            while chunk := response.read1(1 << 20):
                body.add(chunk)
            if response.length:  # (http.client ends the read quietly where the peer closed)
                raise ValueError(
                    f"the answer ends early: {response.length} of its Content-Length's bytes "
                    "never came (its last line may be cut: 45 read as 4)"
                )
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
        data = body.bytes()
        if response.status != 200:
            text = _text(data[:200])
            raise OSError(f"HTTP {response.status} {response.reason}: {text.strip()}")
        return data

    def _scrape(self, url: str, known: bytes | None = None) -> Read:
        rejected: list[str] = []
        try:
            data = self._get(url, "text/plain")
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if digest == known:
                return url, digest, None, []
            evidence = parse_exposition(_text(data), self.config, rejected)
        except Exception as e:  # any failure degrades to "no DCGM for this node", never a crash
            return url, None, [], [f"{url}: {type(e).__name__}: {e}"]
        return url, digest, evidence, _rejections(url, rejected)

    def _query_prometheus(self, base: str) -> tuple[list[GpuEvidence], list[str]]:
        query = urlencode({"query": prometheus_query(self.config)})
        url = f"{base.rstrip('/')}/api/v1/query?{query}"
        rejected: list[str] = []
        try:
            payload = json.loads(_text(self._get(url, "application/json")))
            evidence = parse_prometheus_query(payload, self.config, rejected)
        except Exception as e:  # any failure degrades to "no DCGM", never a crash
            return [], [f"{base}: {type(e).__name__}: {e}"]
        # Warnings flag partial data (e.g. a Thanos store that did not answer).
        warnings = [f"{base}: warning: {w}" for w in payload.get("warnings") or []]
        return evidence, warnings + _rejections(base, rejected)


def _unframed(response: http.client.HTTPResponse) -> bool:
    """Whether only the connection's close ends this answer: then a peer that closed early (an
    exporter killed, a proxy dropping it) cannot be told from one that finished, and a cut at a
    line's end loses whole series (a GPU's PCIe traffic: a loading GPU read as idle). A gzip
    body's trailer still says where it ends (``_Body.end``)."""
    return response.length is None and not response.chunked


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

    def bytes(self) -> bytes:
        return b"".join(self.chunks)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


# What the worker read from one source: the source, its body's digest (``None``: not kept, a
# failed read or Prometheus), its evidence (``None``: the body the service already parsed)
# and its errors.
Read = tuple[str, bytes | None, list[GpuEvidence] | None, list[str]]


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
