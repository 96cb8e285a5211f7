"""Pushes this server's report to the governor and keeps the verdict that comes back.

Reports are pushed (like the Hub's activity reports), so the governor never fans out a request
per server per cycle; the verdict rides back on the response. A server that reports often
sends its reports on one connection kept open from one report to the next
(``ReportConnection``); the rare other calls (a user's Extend or Stop) go on a connection of
their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from urllib.parse import urlsplit

from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpclient import TCPClient

from ..core.text import path_segment
from ..core.wire import ASKER_HEADER as ASKER
from ..core.wire import REPORT_CONNECTION_IDLE_S

MAX_ANSWER_BYTES = 1024 * 1024  # a verdict is a few hundred bytes
MAX_RETRY_AFTER_S = 600.0  # a Retry-After is the governor's word, but not for longer than this


class GovernorError(Exception):
    def __init__(self, status: int, message: str, retry_after: float = 0.0):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after  # 429: the seconds the governor asked to wait


class Held(GovernorError):
    """Not sent: the governor's last answer was 429 and its ``Retry-After`` has not passed."""


class Reporter:
    def __init__(
        self,
        governor_url: str,
        token: str,
        log: logging.Logger,
        timeout: float = 20.0,
        report_interval: float = 0.0,
    ):
        self.base = governor_url.rstrip("/") + "/"
        self.token = token
        self.log = log
        self.timeout = timeout
        self.http = AsyncHTTPClient()
        # Only a server that reports within the governor's idle timeout keeps a connection;
        # one that reports less often (the default) gains nothing from it: tornado's client,
        # a connection per report.
        keeps = report_interval < ReportConnection.REUSE_WITHIN_S
        self.connection = ReportConnection(self.base, timeout) if keeps else None
        self.held_until = 0.0  # time.monotonic() before which no report is sent (a 429)

    async def send(self, report: dict) -> dict:
        """POST the report; return the verdict. Answered 429, no report is sent before its
        ``Retry-After`` has passed (``Held``): sending sooner would only be refused again."""
        wait = self.held_until - time.monotonic()
        if wait > 0:
            raise Held(429, f"not sent: the governor asked for none for {wait:.0f} s more", wait)
        try:
            return await self._send(report)
        except GovernorError as error:
            if error.status == 429:
                self.held_until = time.monotonic() + error.retry_after
            raise

    async def _send(self, report: dict) -> dict:
        if self.connection is None or self.connection.busy:  # busy: a slow governor
            return _verdict(*await self._call("POST", "api/reports", report))
        try:
            status, answer, retry_after = await self.connection.post(
                "api/reports",
                json.dumps(report).encode(),
                {"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            )
        except (OSError, StreamClosedError, httputil.HTTPInputError, asyncio.TimeoutError) as error:
            why = getattr(error, "real_error", None) or error
            raise GovernorError(
                599, f"the governor at {self.base} did not answer: {why!r}"
            ) from None
        return _verdict(status, _answer_json(answer), retry_after)

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()

    async def extend(
        self, user: str, name: str, reason: str, asker_token: str | None = None
    ) -> tuple[int, dict, float]:
        """The governor's answer to an Extend: status, JSON, ``Retry-After`` (s).
        ``asker_token``: the token of the person who asked, where not the owner (``ASKER``)."""
        path = f"{_server_path(user, name)}/extend"
        return await self._call("POST", path, {"reason": reason}, asker_token)

    async def stop(
        self, user: str, name: str, reason: str, asker_token: str | None = None
    ) -> tuple[int, dict, float]:
        """The governor's answer to a Stop: status, JSON, ``Retry-After`` (s)."""
        path = f"{_server_path(user, name)}/stop"
        return await self._call("POST", path, {"reason": reason}, asker_token)

    async def checkpoint(
        self, user: str, name: str, reason: str, source: str, asker_token: str | None = None
    ) -> tuple[int, dict, float]:
        """Put a checkpoint a person asked of this server on the governor's record, before it
        is taken: status, JSON, ``Retry-After`` (s)."""
        path = f"{_server_path(user, name)}/checkpoint"
        return await self._call("POST", path, {"reason": reason, "source": source}, asker_token)

    async def _call(
        self, method: str, path: str, body: dict, asker_token: str | None = None
    ) -> tuple[int, dict, float]:
        """The answer's status and JSON object, and its ``Retry-After`` in seconds (0.0: none)."""
        headers = {"Authorization": f"token {self.token}", "Content-Type": "application/json"}
        if asker_token:
            # A guest of a shared server (or an admin) asked: the governor asks the Hub whose
            # token it is and that it reaches this server, and puts that person on record.
            headers[ASKER] = f"token {asker_token}"
        request = HTTPRequest(
            self.base + path,
            method=method,
            body=json.dumps(body),
            headers=headers,
            request_timeout=self.timeout,
            follow_redirects=False,
        )
        try:
            response = await self.http.fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as error:
            raise GovernorError(
                599, f"the governor at {self.base} did not answer: {error}"
            ) from None
        if response.code == 599:
            raise GovernorError(
                599, f"the governor at {self.base} did not answer: {response.error}"
            )
        return (
            response.code,
            _answer_json(response.body),
            _retry_after(response.headers.get("Retry-After", "")),
        )


def _answer_json(body: bytes | None) -> dict:
    """The answer's JSON object; anything else (a proxy's page) as a message, its start."""
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        data = None
    if isinstance(data, dict):
        return data
    return {"message": (body or b"")[:200].decode(errors="replace")}


def _retry_after(value: str) -> float:
    """A ``Retry-After`` of seconds, within reason; an HTTP date or anything else: 0.0 (the
    governor sends seconds; a proxy's date is not worth parsing: the next interval waits)."""
    value = value.strip()
    if not (value.isascii() and value.isdigit()):
        return 0.0
    return min(float(value[:6]), MAX_RETRY_AFTER_S)


def _verdict(status: int, data: dict, retry_after: float = 0.0) -> dict:
    """The verdict an answer carries; a ``GovernorError`` for an error, or for an answer with
    none (what answers in the governor's place: a proxy's page, a redirect to a login)."""
    verdict = data.get("verdict")
    if status < 400 and isinstance(verdict, dict):
        return verdict
    message = str(data.get("message") or "")
    if status < 400:
        message = f"no verdict in the answer{': ' if message else ''}{message}"
    raise GovernorError(status, message, retry_after if status == 429 else 0.0)


class ReportConnection:
    """One HTTP/1.1 connection to the governor, kept open from one report to the next.

    tornado's ``AsyncHTTPClient`` opens a connection per request and closes it after the
    answer. Kept, a report costs the governor about a quarter less CPU in a burst, but each
    idle connection held costs it memory (docs/benchmarks-history.md, "Issue 26, wave 7"): a server
    keeps it only when it reports within ``REPORT_CONNECTION_IDLE_S``, what the governor keeps
    an idle connection for; one idle for most of that is not reused (the governor may be
    closing it). A request the governor never answered because it had closed the connection
    first (its idle timeout, a restart) is sent once more on a new connection: a report is a
    snapshot, so sending it twice does no harm. One request at a time.
    """

    REUSE_WITHIN_S = 0.8 * REPORT_CONNECTION_IDLE_S

    def __init__(self, base_url: str, timeout: float):
        url = urlsplit(base_url)
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.netloc = url.netloc
        self.prefix = url.path
        self.timeout = timeout
        self.busy = False
        self._stream: IOStream | None = None
        self._used_at = 0.0

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple:
        """POST ``body`` to ``path`` (under the base URL); the status, the answer's body and its
        ``Retry-After`` in seconds (0.0: none)."""
        self.busy = True
        try:
            reused = self._reusable()
            if not reused:
                self.close()
            try:
                return await asyncio.wait_for(self._exchange(path, body, headers), self.timeout)
            except _NotAnswered:
                self.close()
                if not reused:
                    raise StreamClosedError() from None
            return await asyncio.wait_for(self._exchange(path, body, headers), self.timeout)
        except BaseException:
            self.close()  # whatever state the connection was left in, it is not used again
            raise
        finally:
            self.busy = False
            self._used_at = time.monotonic()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _reusable(self) -> bool:
        stream = self._stream
        fresh = time.monotonic() - self._used_at < self.REUSE_WITHIN_S
        return stream is not None and not stream.closed() and fresh

    async def _exchange(self, path: str, body: bytes, headers: dict[str, str]):
        if self._stream is None:
            self._stream = await TCPClient().connect(self.host, self.port, ssl_options=self.ssl)
        stream = self._stream
        stream.set_nodelay(True)  # the answer is awaited: no delayed ACK on the request
        connection = HTTP1Connection(
            stream, True, HTTP1ConnectionParameters(max_body_size=MAX_ANSWER_BYTES)
        )
        head = httputil.HTTPHeaders(headers)
        head["Host"] = self.netloc
        head["Content-Length"] = str(len(body))
        answer = _Answer()
        try:
            # The body rides with the headers: one write, one segment.
            connection.write_headers(
                httputil.RequestStartLine("POST", self.prefix + path, "HTTP/1.1"), head, body
            )
            connection.finish()
            await connection.read_response(answer)
        except StreamClosedError:
            if answer.code is None:
                raise _NotAnswered() from None
            raise
        if answer.code is None or not answer.finished:
            raise _NotAnswered()
        if not answer.keep_alive or stream.closed():
            self.close()
        return answer.code, b"".join(answer.chunks), answer.retry_after


class _NotAnswered(Exception):
    """The connection closed before any answer: the governor did not take the request."""


class _Answer(httputil.HTTPMessageDelegate):
    def __init__(self) -> None:
        self.code: int | None = None
        self.keep_alive = True
        self.finished = False
        self.retry_after = 0.0
        self.chunks: list[bytes] = []

    def headers_received(self, start_line, headers) -> None:
        assert isinstance(start_line, httputil.ResponseStartLine)
        self.code = start_line.code
        self.keep_alive = start_line.version == "HTTP/1.1" and (
            headers.get("Connection", "").lower() != "close"
        )
        self.retry_after = _retry_after(headers.get("Retry-After", ""))

    def data_received(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def finish(self) -> None:
        self.finished = True


def _server_path(user: str, name: str) -> str:
    user = path_segment(user)
    return f"api/users/{user}/servers/{path_segment(name)}" if name else f"api/users/{user}/server"
