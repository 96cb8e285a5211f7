"""What each of the governor's routes other than the reports' costs at N servers (wave 27).

    python -m benchmarks.routes [--servers 1000,10000] [--calls 3] [--only NAME,...]

As ``benchmarks.ingest`` runs them: the fake Hub in its own process (N users, each with a
running server and a token), the service (``python -m jupyter_gpu_gov.hub``, its start-up pass
done, on the standard library's event loop under ``benchmarks.ingest_probe``), then every server
reports once, so every server has a report and a verdict. Then each route an admin or a user
calls, ``--calls`` times, one at a time, while this process sends a probe report every few
milliseconds (another server's each time, as the servers do): per route, the median and the
worst of the calls of

- ``wall_ms``: from the request sent to the whole answer read;
- ``hold_ms``: the longest event-loop callback of the service during the call (what every report
  that arrives meanwhile waits behind: ``ingest_probe``'s timing, callbacks of 20 ms or more);
- ``report_ms``: the slowest probe report's round trip during the call (what a server saw);
- ``cpu_ms``: the service's CPU over the call (every thread: a worker's too);
- ``bytes``: the answer's body.

The state is one report per server and what the start-up pass wrote (few audit rows, little
usage): the listings' and pages' cost is the servers'; the history's and ledger's exports grow
with time as well, which ``benchmarks.history_export`` measures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from .ingest import ACCESS_SCOPE, PREFIX, PROBE_TOKEN, REPO, cpu_seconds, service
from .ingest_load import Connections, encode, report_for
from .ingest_probe import PROBE_ENV

ADMIN_TOKEN = "routes-admin"
PERSON_TOKEN = "routes-person"
_PROBES = itertools.count()  # the probe reports' servers, in turn across every call
ADMIN_SCOPE = "custom:gpu-gov:admin"


def user_token(user: str) -> str:
    return f"routes-{user}"


def _serve_hub(n: int) -> None:
    """The fake Hub: ``n`` users with a running server and a token each, an admin's token."""
    sys.path.insert(0, str(REPO / "tests"))
    from fake_hub_api import FakeHub

    async def serve() -> None:
        hub = FakeHub(service_name="gpu-gov")
        users = hub.populate(n)
        for user in users:
            hub.add_user_token(user, user_token(user), extra_scopes=[ACCESS_SCOPE])
        hub.add_token(PROBE_TOKEN, {ACCESS_SCOPE})
        hub.add_token(ADMIN_TOKEN, {ACCESS_SCOPE, ADMIN_SCOPE})
        # A person's own token (the user's pages and API as their browser calls them), not
        # their server's: it reads their usage and their page.
        hub.add_token(PERSON_TOKEN, {ACCESS_SCOPE})
        hub.token_owners[PERSON_TOKEN] = person(users)
        hub.start()
        ready = {"api_url": hub.api_url, "token": hub.token, "users": users}
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        hub.stop()

    asyncio.run(serve())


@contextlib.contextmanager
def _hub(n: int):
    import subprocess

    hub = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.routes", "--serve-hub", f"--servers={n}"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield json.loads(hub.stdout.readline())
    finally:
        hub.stdin.close()
        hub.wait(timeout=30)


def person(users: list[str]) -> str:
    """The user whose own routes are called."""
    return users[len(users) // 2]


def routes(users: list[str]) -> list[tuple[str, str, str, str, bytes | None]]:
    """(name, who, method, path under the prefix, body): every route an admin or a user reads."""
    me = person(users)
    admin = [
        ("info", "GET", "api/", None),
        ("servers", "GET", "api/servers", None),
        ("servers_all", "GET", "api/servers?all=1", None),
        ("server", "GET", f"api/users/{me}/server", None),
        ("extensions", "GET", "api/extensions", None),
        ("audit", "GET", "api/audit", None),
        ("audit_5000", "GET", "api/audit?limit=5000", None),
        ("policies", "GET", "api/policies", None),
        ("policy", "GET", "api/policy", None),
        ("diagnosis", "GET", "api/diagnosis", None),
        ("health", "GET", "api/health", None),
        ("usage", "GET", "api/usage?group_by=user,day&since=7d", None),
        ("usage_csv", "GET", "api/usage?group_by=user,day&since=7d&format=csv", None),
        ("trace", "GET", "api/history/trace?since=1h", None),
        ("metrics", "GET", "metrics", None),
        ("what_if", "POST", "api/policy/what-if", b"WHAT_IF"),
        ("dashboard", "GET", "", None),
        ("dashboard_all", "GET", "?all=1", None),
        ("showback", "GET", "showback", None),
        ("policy_page", "GET", "policy", None),
    ]
    user = [
        ("servers", "GET", "api/servers", None),
        ("server", "GET", f"api/users/{me}/server", None),
        ("audit", "GET", "api/audit", None),
        ("usage", "GET", "api/usage?since=7d", None),
        ("me", "GET", "me", None),
    ]
    return [(f"admin {n}", ADMIN_TOKEN, *r) for n, *r in admin] + [
        (f"user {n}", PERSON_TOKEN, *r) for n, *r in user
    ]


def _call(port: int, token: str, method: str, path: str, body: bytes | None) -> tuple[int, int]:
    """One request (urllib, in a thread): its status and the answer's body's bytes."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{PREFIX}{path}",
        data=body,
        method=method,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            return answer.status, len(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, len(error.read())


def _holds(probe: Path, since: float, until: float) -> float:
    """The longest callback the probe wrote between ``since`` and ``until`` (wall clock)."""
    longest = 0.0
    with probe.open() as lines:
        for line in lines:
            event = json.loads(line)
            if since <= event["at"] <= until + 0.05 and not event["what"].startswith("gc "):
                longest = max(longest, event["ms"])
    return longest


async def _one(port, pid, probe, token, method, path, body, users, connections) -> dict:
    loop = asyncio.get_running_loop()
    cpu, began, started = cpu_seconds(pid), time.time(), time.perf_counter()
    call = loop.run_in_executor(None, _call, port, token, method, path, body)
    slowest = 0.0
    while not call.done():
        index = next(_PROBES)
        user = users[index % len(users)]
        report = encode(report_for(user, index, _now()))
        sent = await connections.post(user, f"{PREFIX}api/reports", user_token(user), report)
        slowest = max(slowest, sent.round_trip)
        await asyncio.sleep(0.005)
    status, size = await call
    wall = time.perf_counter() - started
    used = cpu_seconds(pid) - cpu
    return {
        "status": status,
        "wall_ms": 1000 * wall,
        "hold_ms": _holds(probe, began, time.time()),
        "report_ms": 1000 * slowest,
        "cpu_ms": 1000 * used,
        "bytes": size,
    }


def _now():
    from jupyter_gpu_gov.core import clock

    return clock.utcnow()


async def _reported(port: int, users: list[str]) -> None:
    """Every server's report, 16 at a time."""
    connections = Connections(port, keep=True)
    now = _now()
    queue = iter(enumerate(users))

    async def worker() -> None:
        for index, user in queue:
            body = encode(report_for(user, index, now))
            await connections.post(user, f"{PREFIX}api/reports", user_token(user), body)

    await asyncio.gather(*(worker() for _ in range(16)))
    connections.drop_all()


def _what_if_body(port: int) -> bytes:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{PREFIX}api/policy",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        source = json.load(answer)["source"]
    return json.dumps({"candidate": source, "days": 7}).encode()


def run(n: int, calls: int, only: set[str] | None) -> list[tuple[str, dict]]:
    with contextlib.ExitStack() as stack:
        probe = Path(stack.enter_context(tempfile.TemporaryDirectory()), "probe.jsonl")
        pythonpath = [p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p]
        ready = stack.enter_context(_hub(n))
        process, port = stack.enter_context(
            service(
                ready,
                command=(str(REPO / "benchmarks" / "ingest_probe.py"),),
                env={PROBE_ENV: str(probe), "PYTHONPATH": os.pathsep.join(pythonpath)},
                # No request budget: the benchmark is one caller calling every route in turn.
                args=("--GpuGovernor.event_loop=asyncio", "--GpuGovernor.api_budget=0"),
            )
        )
        users = ready["users"]
        asyncio.run(_reported(port, users))
        what_if = _what_if_body(port)

        async def measure() -> list[tuple[str, dict]]:
            connections = Connections(port, keep=True)
            out = []
            for name, token, method, path, body in routes(users):
                if only and not {name.split(" ", 1)[1], name.replace(" ", ":")} & only:
                    continue
                body = what_if if body == b"WHAT_IF" else body
                runs = [
                    await _one(
                        port, process.pid, probe, token, method, path, body, users, connections
                    )
                    for _ in range(calls)
                ]
                out.append((name, runs))
            return out

        return asyncio.run(measure())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="1000,10000")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--only", default="", help="routes (servers: both callers'; admin:servers)")
    parser.add_argument("--serve-hub", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_hub:
        _serve_hub(int(args.servers))
        return
    only = set(filter(None, args.only.split(","))) or None
    for n in (int(s) for s in args.servers.split(",")):
        for name, runs in run(n, args.calls, only):
            figures = []
            for key in ("wall_ms", "hold_ms", "report_ms", "cpu_ms"):
                values = [r[key] for r in runs]
                figures.append(f"{key}={statistics.median(values):.1f}/{max(values):.1f}")
            statuses = sorted({r["status"] for r in runs})
            print(
                f"routes: servers={n} route={name.replace(' ', ':')}",
                f"status={','.join(map(str, statuses))}",
                *figures,
                f"bytes={runs[-1]['bytes']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
