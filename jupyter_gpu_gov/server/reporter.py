"""Pushes this server's report to the governor and keeps the verdict that comes back.

Reports are pushed (like the Hub's activity reports), so the governor never fans out a request
per server per cycle; the verdict rides back on the response.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


class GovernorError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Reporter:
    def __init__(self, governor_url: str, token: str, log: logging.Logger, timeout: float = 20.0):
        self.base = governor_url.rstrip("/") + "/"
        self.token = token
        self.log = log
        self.timeout = timeout
        self.http = AsyncHTTPClient()

    async def send(self, report: dict) -> dict:
        """POST the report; return the verdict."""
        body = await self._call("POST", "api/reports", report)
        return body["verdict"]

    async def extend(self, user: str, name: str, reason: str) -> tuple[int, dict]:
        return await self._call_with_status(
            "POST", f"{_server_path(user, name)}/extend", {"reason": reason}
        )

    async def stop(self, user: str, name: str, reason: str) -> tuple[int, dict]:
        return await self._call_with_status(
            "POST", f"{_server_path(user, name)}/stop", {"reason": reason}
        )

    async def _call(self, method: str, path: str, body: dict) -> dict:
        status, data = await self._call_with_status(method, path, body)
        if status >= 400:
            raise GovernorError(status, data.get("message", ""))
        return data

    async def _call_with_status(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        request = HTTPRequest(
            self.base + path,
            method=method,
            body=json.dumps(body),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
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
        try:
            data = json.loads(response.body) if response.body else {}
        except ValueError:
            data = {"message": response.body[:200].decode(errors="replace")}
        return response.code, data


def _server_path(user: str, name: str) -> str:
    user = quote(user, safe="")
    return (
        f"api/users/{user}/servers/{quote(name, safe='')}" if name else f"api/users/{user}/server"
    )
