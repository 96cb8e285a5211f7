"""The Hub client's cost per request: kept connections (libcurl) against one per request.

    python -m benchmarks.hub_requests [--requests 1000] [--concurrency 10] [--rounds 2]

A pass's culls each cost a fresh read of their user (``GET /users/{name}``) and a stop, through
``hub.hubapi.HubApi``. This asks the reconcile benchmark's fake Hub (a subprocess, 2,000 users)
for ``--requests`` users, ``--concurrency`` in flight, with each client in turn: tornado's own
(``SimpleAsyncHTTPClient``: a TCP connection and a thread-pool DNS lookup per request), and
libcurl's (``CurlAsyncHTTPClient``, what ``HubApi`` uses when pycurl is installed). Prints this
process's CPU per request and the wall time, per client and round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


async def _round(api_url: str, token: str, users: list[str], client, concurrency: int) -> dict:
    from jupyter_gpu_gov.hub import hubapi

    hubapi._Client, kept = client, hubapi._Client
    try:
        api = hubapi.HubApi(api_url, token, concurrency=concurrency)
        await api.get_user(users[0])  # the client exists, a connection is open
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(api.get_user(user) for user in users))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        api.close()
    finally:
        hubapi._Client = kept
    return {"cpu_ms_per_request": round(1e3 * cpu / len(users), 3), "wall_s": round(wall, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from tornado.curl_httpclient import CurlAsyncHTTPClient
    from tornado.simple_httpclient import SimpleAsyncHTTPClient

    hub = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.reconcile", "--serve", "--servers=2000"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready = json.loads(hub.stdout.readline())
        users = (list(ready["servers"]) * args.requests)[: args.requests]
        clients = {"one connection a request": SimpleAsyncHTTPClient, "kept": CurlAsyncHTTPClient}
        for _ in range(args.rounds):
            for name, client in clients.items():
                figures = asyncio.run(
                    _round(ready["api_url"], ready["token"], users, client, args.concurrency)
                )
                print(f"hub_requests: client={name!r}", *(f"{k}={v}" for k, v in figures.items()))
    finally:
        hub.stdin.close()
        hub.wait(timeout=10)


if __name__ == "__main__":
    main()
