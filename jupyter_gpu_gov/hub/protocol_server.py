"""The service's HTTP/1.1 server: its tornado ``Application`` served from an ``asyncio.Protocol``.

Why not tornado's ``HTTPServer``: at 10,000 servers a report arrives every 6 ms, each on a
connection of its own, and tornado's ``IOStream`` and ``HTTP1Connection`` cost about 1 ms of CPU
a connection before any handler runs, against 0.2 ms for a protocol on uvloop
(``benchmarks/http_floor.py``; docs/benchmarks-history.md, "Issue 26, wave 17"). Everything above
the connection is tornado's own: its request objects, routing, ``RequestHandler``s and HubAuth,
so who a caller is and what they may do is decided exactly as before.

What this layer owns, and bounds (a user owns the server that sends reports):

- the request's head: at most ``max_header_size`` bytes, parsed by tornado's own parsers, within
  ``idle_timeout`` of the connection's start or its last answer (else closed, unanswered);
- the body: only with a ``Content-Length`` (a chunked request is refused, 411), at most
  ``max_body_size`` (refused, 413, before it is read), within ``body_timeout``; ``Expect:
  100-continue`` is answered;
- the answer's framing: ``Content-Length`` when the handler gave one, chunked otherwise (HTTP/1.1),
  else the connection closes after it; header lines with CR or LF are refused (no injection);
- keep-alive for HTTP/1.1, one request at a time (a pipelined one waits its turn, and for the
  client to take the last answer); a connection idle ``idle_timeout`` is closed, but for a
  proxy's (its last request named the client it forwards, ``X-Forwarded-For``, where
  ``xheaders``), whose head is given ``idle_timeout`` from its first byte instead: the Hub's
  proxy keeps its connections for ever and cannot be told otherwise, so one closed while idle
  is sooner or later closed as the proxy sends a request on it (the user's answer: a 503);
- writes wait while the client does not read (flow control), so a large answer streams; a
  client that takes none of it for ``body_timeout`` is let go;
- requests handled in batches while they come fast (``accept_interval``);
- how many connections are open: at most ``max_connections_per_peer`` from one address (0:
  no such cap; ``max_connections_per_address``) and ``max_connections`` in all (below the
  open-file limit); past either, the connection idle the
  longest (not being answered) is let go, so new ones, others' reports among them, are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tornado import httputil
from tornado.netutil import is_valid_ip

from ..core import browser_json
from ..core.wire import REPORT_CONNECTION_IDLE_S

log = logging.getLogger("jupyter_gpu_gov.hub")

MAX_HEADER_BYTES = 64 * 1024  # tornado's default
IDLE_TIMEOUT_S = REPORT_CONNECTION_IDLE_S
BODY_TIMEOUT_S = 60.0
# Connections the kernel keeps waiting for the service to accept (tornado's default: 128). At
# 10,000 servers 167 come a second, and the batching leaves them waiting by design; when the
# loop stalls longer than 0.8 s (a starved CPU), 128 overflow, and a dropped connection is
# tried again by the server's kernel only 1, 3, 7, 15... s later: a report late by seconds
# (docs/benchmarks-history.md, "Issue 26, wave 8"). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 1024
# Open connections, from one address and in all. Idle, each costs a few kB; holding a head of
# 64 KiB, 64 KiB for 30 s. Without a cap a user's process held every file the service may open:
# other servers' connections were reset, and the service could not open a socket or a file (the
# Hub's API, DCGM, its store). A pod is one address, a server keeps one connection: 512 leaves
# room for a proxy's or a workstation's many (all of theirs from one address). Behind a mesh's
# sidecar or SNAT every server is one address: the setting ``max_connections_per_address``.
MAX_CONNECTIONS = 20_000
MAX_CONNECTIONS_PER_PEER = 512
# Open files the service keeps for itself (the Hub's API, DCGM, its store, logs): of a low
# limit, a quarter.
FILES_KEPT = 1024
# How early a timer may run (uvloop's count whole milliseconds).
_TIMER_SLACK_S = 0.001
_CRLF = b"\r\n"
_END_OF_HEAD = b"\r\n\r\n"
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A request target as node's parser (the Hub's proxy) reads one: visible ASCII only.
_TARGET = re.compile(r"[!-~]+")
# The fields that frame a request, read by this layer alone (one reading: no smuggling).
_FRAMING = ("content-length", "transfer-encoding", "connection", "expect")


@dataclass(slots=True)
class Head:
    """A request's head as this layer reads it: the request line, and each field by its
    lower-case name (``fields``; a repeated one joined by ", ", as HTTP allows)."""

    method: str
    target: str
    version: str
    fields: dict[str, str]
    text: str  # the header lines, for tornado's ``HTTPHeaders.parse``

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


@dataclass(slots=True)
class DirectRequest:
    """What a direct route is given: the head, the whole body, and the address it came from
    (the socket's)."""

    head: Head
    body: bytes
    peer: str = ""


# A direct route: the answer's status and JSON body (bytes), and optionally header lines each
# ending in CRLF (``Retry-After``), for a request, or an awaitable of them where it must wait
# (the Hub's answer for a token it has not cached).
DirectRoute = Callable[[DirectRequest], "tuple | Awaitable[tuple]"]


def parse_head(head: bytes) -> Head:
    """The request line and fields of a head (without its blank line), or ``_Refusal(400)``
    naming what is wrong: lines ending in CRLF, a request line of three parts (a token, a
    target of visible ASCII, the version), field names that are tokens, no folded lines, at
    most one ``Content-Length``."""
    text = head.decode("latin1").lstrip("\r\n")
    if text.count("\n") != text.count("\r\n"):
        # A lone LF would end a line here (a blank one: a head read on) where the proxy's
        # parser refuses the request: a Content-Length only this layer sees.
        raise _Refusal(400, "a header line ends in LF without CR")
    line, _, rest = text.partition("\n")
    parts = line.rstrip("\r").split(" ")
    if len(parts) != 3 or not _FIELD_NAME.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise _Refusal(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Refusal(505, f"{version[:20]!r} is not served")
    fields: dict[str, str] = {}
    for raw in rest.split("\n"):
        raw = raw.rstrip("\r")
        if not raw:
            continue
        if raw[0] in " \t":
            raise _Refusal(400, "folded header lines are not accepted")
        name, colon, value = raw.partition(":")
        if not colon or not _FIELD_NAME.fullmatch(name):
            raise _Refusal(400, "malformed header line")
        name, value = name.lower(), value.strip(" \t")
        if name in fields:
            if name == "content-length":
                raise _Refusal(400, "more than one Content-Length")
            value = f"{fields[name]}, {value}"
        fields[name] = value
    return Head(method, target, version, fields, rest)


class RequestContext:
    """What tornado's ``HTTPServerRequest`` reads of a connection (``remote_ip``, ``protocol``),
    with ``X-Forwarded-For``/``X-Real-Ip`` and ``X-Forwarded-Proto``/``X-Scheme`` applied per
    request when the server trusts them (``xheaders``: the service sits behind the Hub's proxy).
    Nothing decides on them; they name the caller in the log."""

    __slots__ = ("_ip", "_protocol", "address", "protocol", "remote_ip")

    def __init__(self, address, protocol: str = "http") -> None:
        self.address = address
        ip = address[0] if isinstance(address, tuple) and address else "0.0.0.0"
        self.remote_ip = self._ip = ip
        self.protocol = self._protocol = protocol

    def apply_xheaders(self, headers: httputil.HTTPHeaders) -> None:
        forwarded = headers.get("X-Forwarded-For", "").split(",")[-1].strip()
        ip = headers.get("X-Real-Ip", forwarded).strip()
        if ip and is_valid_ip(ip):
            self.remote_ip = ip
        scheme = headers.get("X-Scheme", headers.get("X-Forwarded-Proto", ""))
        scheme = scheme.split(",")[-1].strip()
        if scheme in ("http", "https"):
            self.protocol = scheme

    def reset(self) -> None:
        self.remote_ip, self.protocol = self._ip, self._protocol

    def __str__(self) -> str:
        return self.remote_ip


class _Refusal(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Connection(asyncio.Protocol):
    """One client connection: reads requests, hands each to the application, writes its answer.
    It is also the request's ``HTTPConnection`` (what a ``RequestHandler`` writes through)."""

    def __init__(self, server: ProtocolHTTPServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.context: RequestContext | None = None  # made for tornado's first request
        self.buffer = bytearray()
        self.scanned = 0  # how much of the buffer holds no end of a head
        self.delegate: httputil.HTTPMessageDelegate | None = None  # the request being answered
        self.body_left = 0  # bytes of the current request's body not yet read
        self.close_callback: Callable[[], None] | None = None
        self.keep_alive = False
        self.chunked = False
        self.head_only = False
        self.writable: asyncio.Future | None = None  # set while the client reads too slowly
        self.timer: asyncio.TimerHandle | None = None  # a body's timeout, while it comes
        self.stalled: asyncio.TimerHandle | None = None  # while the client takes nothing
        self.unsent = 0  # what was left to send when that timer was set
        self.closed = False
        self.answering = False  # a request read, its answer not finished: the next one waits
        self.peer = ""  # the address it comes from (the socket's: no header can name another)
        self.proxied = False  # its last request came through a proxy (X-Forwarded-For)
        self.unwatched = False  # a proxy's, idle: its head's time starts with its first byte

    # -- asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport
        address = transport.get_extra_info("peername")
        self.peer = str(address[0]) if isinstance(address, tuple) and address else ""
        self._expect_head()
        self.server.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.unwatched:
            self.unwatched = False
            self.server.expect_head(self, begun=True)
        self.buffer += data
        if self.answering and len(self.buffer) > self.server.max_header_size:
            # A request sent before the last is answered waits; more than a head of it waits
            # in the kernel, not here (resumed by finish).
            self.transport.pause_reading()
        try:
            self._advance()
        except _Refusal as refusal:
            self._refuse(refusal.code, str(refusal))

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.forget(self)
        self._cancel_timer()
        self._cancel_stalled()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        if self.delegate is not None:
            delegate, self.delegate = self.delegate, None
            delegate.on_connection_close()
        if self.close_callback is not None:
            callback, self.close_callback = self.close_callback, None
            callback()

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = self.server.loop.create_future()
        if self.stalled is None:
            # A streamed answer waits here for the client: one that never reads would hold
            # the connection and the handler for ever.
            self._watch_stall()

    def resume_writing(self) -> None:
        self._cancel_stalled()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    # -- reading

    def _advance(self) -> None:
        """Read what the buffer holds: a head, then its body; the answer comes later."""
        while not self.closed:
            if self.delegate is None:  # between requests: waiting for a head
                if self.answering:
                    return  # the last request's answer is not finished: pipelining waits
                end = self.buffer.find(_END_OF_HEAD, self.scanned)
                if end < 0:
                    if len(self.buffer) > self.server.max_header_size:
                        raise _Refusal(431, "the request's head is too large")
                    # The next read searches its own bytes, not the whole head again: a head
                    # sent a byte at a time cost a second of CPU (64 KiB scanned 64,000 times).
                    self.scanned = max(0, len(self.buffer) - len(_END_OF_HEAD) + 1)
                    return
                self.scanned = 0
                self.server.head_read(self)
                if end > self.server.max_header_size:
                    raise _Refusal(431, "the request's head is too large")
                head = bytes(self.buffer[:end])
                del self.buffer[: end + 4]
                self._start_request(head)
            elif self.body_left:
                if len(self.buffer) < self.body_left:
                    # Handed over whole: a body sent a byte at a time made a million objects
                    # of a byte (42 MiB for 1 MiB) in the report route's list of chunks.
                    return
                body = bytes(self.buffer[: self.body_left])
                del self.buffer[: self.body_left]
                self.body_left = 0
                self.delegate.data_received(body)
            if self.delegate is not None and not self.body_left:
                self._cancel_timer()
                delegate, self.delegate = self.delegate, None
                self.answering = True
                self.server.handle(delegate.finish)  # the handler runs; its answer ends in finish()
                return

    def _start_request(self, raw: bytes) -> None:
        head = parse_head(raw)
        fields = head.fields
        if "transfer-encoding" in fields:
            raise _Refusal(411, "a request body needs a Content-Length (no Transfer-Encoding)")
        length = fields.get("content-length", "0")
        if not (length.isascii() and length.isdigit()) or len(length) > 12:
            raise _Refusal(400, "Content-Length is not a number")
        if int(length) > self.server.max_body_size:
            raise _Refusal(
                413, f"a request's body may be at most {self.server.max_body_size} bytes"
            )
        self.body_left = int(length)
        self.keep_alive = (
            head.version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
        )
        self.proxied = self.server.xheaders and "x-forwarded-for" in fields
        self.head_only = head.method == "HEAD"
        if self.body_left and fields.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 (Continue)\r\n\r\n")
        # A body already read needs no timer: nearly every report comes in one read.
        if self.body_left > len(self.buffer) and self.server.body_timeout:
            self.timer = self.server.loop.call_later(self.server.body_timeout, self._timed_out)
        route = self.server.direct.get((head.method, head.path))
        if route is not None:
            self.delegate = _Direct(self, route, head)
            return
        if self.context is None:  # what tornado's request reads (a direct route reads none)
            self.context = RequestContext(self.transport.get_extra_info("peername"))
        try:
            start_line = httputil.RequestStartLine(head.method, head.target, head.version)
            headers = httputil.HTTPHeaders.parse(head.text)
        except (httputil.HTTPInputError, ValueError) as error:  # ValueError: older tornado's
            raise _Refusal(400, f"malformed request: {error}") from None
        if self.server.xheaders:
            self.context.apply_xheaders(headers)
        delegate = self.server.app.start_request(self.server, self)
        try:  # tornado's request checks the head too (a missing or bad Host)
            # A RequestHandler's route returns no awaitable here (no body is streamed in).
            delegate.headers_received(start_line, headers)
        except httputil.HTTPInputError as error:
            raise _Refusal(400, f"malformed request: {error}") from None
        self.delegate = delegate

    # -- tornado's HTTPConnection: what a RequestHandler writes through

    def write_headers(self, start_line, headers, chunk=None) -> asyncio.Future:
        code = start_line.code
        bodyless = self.head_only or code in (204, 304) or 100 <= code < 200
        self.chunked = not bodyless and "Content-Length" not in headers and self.keep_alive
        if not bodyless and "Content-Length" not in headers and not self.chunked:
            self.keep_alive = False  # the body ends when the connection does
        if self.chunked:
            headers["Transfer-Encoding"] = "chunked"
        if not self.keep_alive:
            headers["Connection"] = "close"
        try:
            lines = [b"HTTP/1.1 %d %s" % (code, start_line.reason.encode("latin1"))]
            lines += [f"{name}: {value}".encode("latin1") for name, value in headers.get_all()]
            if any(b"\r" in line or b"\n" in line for line in lines):
                raise ValueError("CR or LF in the answer's head")
        except (ValueError, UnicodeEncodeError) as error:
            # The client gets a 500 and the connection ends, not a head it would misread.
            self._refuse(500, "Internal Server Error")
            raise ValueError(f"the answer's head cannot be sent: {error}") from None
        self.head_only = bodyless
        self._send(_CRLF.join(lines) + _END_OF_HEAD)
        return self.write(chunk) if chunk else self._written()

    def write(self, chunk: bytes, callback=None) -> asyncio.Future:
        if chunk and not self.head_only:
            self._send(b"%x\r\n%s\r\n" % (len(chunk), chunk) if self.chunked else chunk)
        return self._written()

    def finish(self) -> None:
        if self.chunked:
            self._send(b"0\r\n\r\n")
        self.chunked = False
        self.close_callback = None
        if self.context is not None:
            self.context.reset()
        if not self.keep_alive or self.closed:
            self._close()
            return
        self._expect_head()
        self.server.answered(self)
        if self.writable is not None and not self.writable.done():
            # The client is not reading its answers: a pipelined request waits until it does
            # (a handler's finish does not wait for its flush), else each one's answer would
            # be buffered here without end.
            self.writable.add_done_callback(lambda _: self._next_request())
        else:
            self._next_request()

    def _next_request(self) -> None:
        self.answering = False
        if self.closed:
            return
        self.transport.resume_reading()
        if self.buffer:  # a request sent before this answer was finished
            self.server.loop.call_soon(self.data_received, b"")

    def close(self) -> None:
        """Ends the connection now, what was written flushed (tornado's ``HTTP1Connection``'s):
        a streamed answer that failed part-way goes without its last chunk, incomplete."""
        self._close()

    def set_close_callback(self, callback: Callable[[], None] | None) -> None:
        self.close_callback = callback

    def set_max_body_size(self, max_body_size: int) -> None:  # streamed bodies only: none here
        pass

    def set_body_timeout(self, timeout: float) -> None:  # likewise
        pass

    # -- helpers

    def _send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def _written(self) -> asyncio.Future:
        if self.writable is not None and not self.writable.done():
            return self.writable
        future = self.server.loop.create_future()
        future.set_result(None)
        return future

    def _expect_head(self) -> None:
        self._cancel_timer()
        self.server.expect_head(self)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        """Let the client go, unanswered (a timeout, or a cap on connections)."""
        self._cancel_timer()
        if self.transport.get_write_buffer_size() and not self.closed:
            # Closing would wait for the client to read what is left: one that never reads
            # would keep its socket and those bytes here for ever.
            self.closed = True
            self.transport.abort()
            return
        self._close()  # a slow or idle client: closed, as tornado closes them, unanswered

    def _watch_stall(self) -> None:
        self.unsent = self.transport.get_write_buffer_size()
        self.stalled = self.server.loop.call_later(self.server.body_timeout, self._stalled)

    def _stalled(self) -> None:
        """Let the client go if it took none of its answer for ``body_timeout`` (a close
        would wait for it to read); one that reads slowly, however slowly, is waited for."""
        self.stalled = None
        if self.closed:
            return
        if self.transport.get_write_buffer_size() < self.unsent:
            self._watch_stall()
            return
        self.closed = True
        self.transport.abort()

    def _cancel_stalled(self) -> None:
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None

    def _refuse(self, code: int, message: str) -> None:
        body = browser_json.dumps({"status": code, "message": message}).encode()
        reason = httputil.responses.get(code, "Error").encode()
        self._send(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (code, reason, len(body), body)
        )
        delegate, self.delegate = self.delegate, None
        if delegate is not None:
            delegate.on_connection_close()
        self._close()

    def _close(self) -> None:
        self._cancel_timer()
        self.server.head_read(self)  # no head is awaited any more
        if not self.closed:
            self.closed = True
            self.transport.close()


class _Direct(httputil.HTTPMessageDelegate):
    """A request for a direct route: its body gathered, the route called (and awaited when it
    must wait), its answer written with a ``Content-Length``. No tornado request, handler or
    header object is made, and no task where the route answers at once."""

    def __init__(self, connection: Connection, route: DirectRoute, head: Head) -> None:
        self.connection, self.route, self.head = connection, route, head
        self.chunks: list[bytes] = []

    def data_received(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def finish(self) -> None:
        body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        request = DirectRequest(self.head, body, self.connection.peer)
        try:
            answer = self.route(request)
        except Exception:
            answer = self._failed()
        if type(answer) is tuple:
            self._write(*answer)
        else:
            self.connection.server.spawn(self._await(answer))

    def on_connection_close(self) -> None:
        pass

    async def _await(self, answer: Awaitable[tuple]) -> None:
        try:
            answer = await answer
        except Exception:
            answer = self._failed()
        self._write(*answer)

    def _failed(self) -> tuple[int, bytes]:
        log.exception("gpu-gov: %s %s failed", self.head.method, self.head.path)
        return 500, b'{"status": 500, "message": "Internal Server Error"}'

    def _write(self, code: int, body: bytes, lines: bytes = b"") -> None:
        """``lines``: the route's own header lines, each ending in CRLF (``Retry-After``)."""
        connection = self.connection
        if connection.closed:
            return
        reason = httputil.responses.get(code, "Unknown").encode()
        close = b"" if connection.keep_alive else b"Connection: close\r\n"
        connection._send(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"%s%s\r\n%s" % (code, reason, len(body), lines, close, body)
        )
        connection.finish()


class ProtocolHTTPServer:
    """Serves ``app`` (a tornado ``Application``, or any ``HTTPServerConnectionDelegate``) on
    sockets bound by the caller: ``await add_sockets(bind_sockets(...))``. Connections are
    accepted and read by the event loop itself (uvloop's, in C, where it runs).

    ``accept_interval``: once a request has been handled, the next ones read within that many
    seconds wait and are then handled back to back (a lone request costs the service more CPU
    than one right after another: the interpreter's caches have gone cold in between;
    docs/benchmarks-history.md, "Report ingest over HTTP"), only while they come fast enough for a
    pause to gather two or more (over the last second, at least ``2 / accept_interval`` a
    second). Nothing the service itself sends (Hub API calls, checkpoint requests) waits.

    ``direct``: routes (method, path) answered without tornado's request machinery, for the
    one request that comes thousands of times a minute (a server's report): its CPU is most of
    the service's (docs/benchmarks-history.md, "Issue 26, wave 17"). Every other request is the
    application's."""

    def __init__(
        self,
        app: httputil.HTTPServerConnectionDelegate,
        *,
        max_body_size: int,
        xheaders: bool = False,
        accept_interval: float = 0.0,
        max_header_size: int = MAX_HEADER_BYTES,
        idle_timeout: float = IDLE_TIMEOUT_S,
        body_timeout: float = BODY_TIMEOUT_S,
        direct: dict[tuple[str, str], DirectRoute] | None = None,
        max_connections: int | None = None,
        max_connections_per_peer: int = MAX_CONNECTIONS_PER_PEER,
    ) -> None:
        self.app = app
        self.direct = dict(direct or {})
        self.max_body_size = max_body_size
        self.max_header_size = max_header_size
        self.idle_timeout = idle_timeout
        self.body_timeout = body_timeout
        self.xheaders = xheaders
        self.accept_interval = accept_interval
        # Open connections, least recently answered (or opened) first; and by address.
        self.connections: dict[Connection, None] = {}
        self._peers: dict[str, dict[Connection, None]] = {}
        self._tasks: set[asyncio.Task] = set()
        files = _allow_open_files()
        kept = min(FILES_KEPT, files // 4)
        self.max_connections = max_connections or min(MAX_CONNECTIONS, files - kept)
        self.max_connections_per_peer = max_connections_per_peer
        self._servers: list[asyncio.AbstractServer] = []
        # The loop add_sockets runs on, looked up once: on Python 3.11 each
        # asyncio.get_running_loop() is a getpid() system call (its check for a fork).
        self.loop: asyncio.AbstractEventLoop | None = None
        # Connections waiting for a head, each with its deadline, in the order they began to
        # wait: with one idle_timeout that is the deadlines' order, so one timer, set for the
        # first, keeps every deadline (a timer per connection cost a call_later and a cancel a
        # report: docs/benchmarks-history.md, "Issue 26, wave 27").
        self._waiting: dict[Connection, float] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._held: list[Callable[[], None]] | None = None  # requests waiting for their batch
        self._stopped = False
        self._rate = 0.0  # connections a second over the last window (>= 1 s)
        self._count = 0
        self._window = 0.0

    def opened(self, connection: Connection) -> None:
        """Count a new connection; past a cap, let go the one of its address, then of all,
        idle the longest (a request being answered is never cut off)."""
        self.connections[connection] = None
        peers = self._peers.setdefault(connection.peer, {})
        peers[connection] = None
        if 0 < self.max_connections_per_peer < len(peers):  # 0: no cap per address
            self._let_go_one(peers)
        if len(self.connections) > self.max_connections:
            self._let_go_one(self.connections)

    def answered(self, connection: Connection) -> None:
        """A connection waits for its next request: idle from now (last in line to be let go)."""
        for kept in (self.connections, self._peers.get(connection.peer)):
            if kept is not None and connection in kept:
                del kept[connection]
                kept[connection] = None

    def forget(self, connection: Connection) -> None:
        self._waiting.pop(connection, None)
        self.connections.pop(connection, None)
        peers = self._peers.get(connection.peer)
        if peers is not None:
            peers.pop(connection, None)
            if not peers:
                del self._peers[connection.peer]

    def expect_head(self, connection: Connection, begun: bool = False) -> None:
        """``connection`` waits for a request's head from now: closed unanswered if none has
        come within ``idle_timeout``. A proxy's connection between requests waits without a
        deadline until a head is ``begun`` (its first byte): configurable-http-proxy keeps its
        connections to a service open for ever, and Node's agent ignores a ``Keep-Alive:
        timeout=`` hint from the server where the agent itself sets no timeout (Node 20's
        ``Agent.keepSocketAlive``), so a connection closed while idle is one the proxy may
        already be sending a request on (``503 ... socket hang up`` for the user). Such
        connections stay counted and are the first let go at the caps on connections; a
        server's report, sent without the header, keeps ``idle_timeout``."""
        waiting = self._waiting
        waiting.pop(connection, None)  # to the end: the latest deadline
        if not self.idle_timeout:  # 0: no timeout, as before
            return
        if connection.proxied and not begun:
            connection.unwatched = True
            return
        deadline = waiting[connection] = self.loop.time() + self.idle_timeout
        if self._sweep is None:
            self._sweep = self.loop.call_at(deadline, self._sweep_idle)

    def head_read(self, connection: Connection) -> None:
        """``connection`` waits for no head (one came, or it closes)."""
        connection.unwatched = False
        self._waiting.pop(connection, None)

    def _sweep_idle(self) -> None:
        """Let go the connections whose head is due; the timer again for the next deadline."""
        self._sweep = None
        # A timer may run a little before its time (uvloop's are in whole milliseconds): a
        # deadline within one is due, not set again for the fraction left.
        now = self.loop.time() + _TIMER_SLACK_S
        waiting = self._waiting
        while waiting:
            connection, deadline = next(iter(waiting.items()))
            if deadline > now:
                self._sweep = self.loop.call_at(deadline, self._sweep_idle)
                return
            del waiting[connection]
            try:
                connection._timed_out()
            except Exception:  # one connection's failure leaves the others' deadlines kept
                log.exception("gpu-gov: closing an idle connection failed")

    def _let_go_one(self, connections: dict[Connection, None]) -> None:
        # The newest is let go only where every older one is being answered.
        for connection in connections:
            if not connection.answering:
                self.forget(connection)
                connection._timed_out()
                return

    def spawn(self, coroutine) -> None:
        """Run ``coroutine`` as a task, kept until it is done (asyncio keeps only a weak
        reference); a failure is logged."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("gpu-gov: a connection failed: %s", task.exception())

    async def add_sockets(self, sockets) -> None:
        """Serve on sockets bound by the caller (``tornado.netutil.bind_sockets``)."""
        loop = self.loop = asyncio.get_running_loop()
        for sock in sockets:
            self._servers.append(
                await loop.create_server(
                    lambda: Connection(self), sock=sock, backlog=LISTEN_BACKLOG
                )
            )

    def handle(self, request: Callable[[], None]) -> None:
        """Run a read request's handling now, or with the others that come within
        ``accept_interval`` while requests come fast (see the class)."""
        if self.accept_interval <= 0:
            request()
            return
        if self._held is not None:
            self._held.append(request)
            return
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._rate = self._count / (now - self._window)
            self._window, self._count = now, 0
        self._count += 1
        if self._rate * self.accept_interval >= 2 and not self._stopped:
            # This one now, those that come meanwhile together after the interval.
            self._held = []
            self.loop.call_later(self.accept_interval, self._release)
        request()

    @property
    def holding(self) -> bool:
        """Whether requests are being held for a batch."""
        return self._held is not None

    def _release(self) -> None:
        held, self._held = self._held or [], None
        self._count += len(held)
        for request in held:
            try:
                request()
            except Exception:
                log.exception("gpu-gov: handling a request failed")

    async def close_all_connections(self) -> None:
        """Close every open connection (a request being answered is cut off)."""
        for connection in list(self.connections):
            connection._close()
        await asyncio.sleep(0)  # their connection_lost runs

    def stop(self) -> None:
        """Stop listening; open connections finish what they answer."""
        self._stopped = True
        for server in self._servers:
            server.close()
        self._servers.clear()
        if self._held:
            self._release()


def _allow_open_files() -> int:
    """Raise the soft limit on open files to the hard one: a connection kept per reporting
    server would pass a soft limit of 1,024 at about a thousand servers (accept then fails).
    The limit now (unlimited: ``MAX_CONNECTIONS`` and what the service keeps)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # ValueError: an unlimited hard limit above the kernel's ceiling; then the soft one stays.
    with contextlib.suppress(ValueError, OSError):
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS + FILES_KEPT if soft == resource.RLIM_INFINITY else soft
