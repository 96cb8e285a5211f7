"""The governor as a drop-in for jupyterhub-idle-culler, proven side by side: pairs of real hubs,
one running jupyterhub-idle-culler and one the governor, each as the managed service
zero-to-jupyterhub gives that culler (no URL, only its four scopes: ``list:users``,
``read:users:activity``, ``read:servers``, ``delete:servers``; plus ``admin:users`` with
``--cull-users``, as zero-to-jupyterhub adds it), the same flags, and the same scripted activity
on servers that send no GPU report. Who is culled, and when (from each server's start), must
agree within one ``--cull-every``.

The activity is scripted as the Hub records it: each server's last activity is posted once,
as a time relative to its start (the Hub keeps the latest and accepts times up to an hour
ahead), so both hubs see the same timeline however long their spawns took.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import pytest
from hub_harness import HubHarness, free_port

from jupyter_gpu_gov.core.clock import isoformat, parse

pytestmark = pytest.mark.timeout(300)

CULLER_SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]
TIMEOUT, CULL_EVERY, MAX_AGE = 10, 5, 25
# How late the reference itself may cull on a loaded machine (a real process whose passes
# and the Hub's DELETE run late: seen 16.1 s for a 15 s bound under a load of 13 on 2 cores).
# What this test holds the governor to is the next assert: within one --cull-every of it.
REFERENCE_LATE = 3
FLAGS = [f"--timeout={TIMEOUT}", f"--cull-every={CULL_EVERY}", f"--max-age={MAX_AGE}"]
POLL = 0.5


# The servers: any HTTP server on the port the Hub gives will do (the Hub waits for any
# answer), and sends no GPU report. Up in a blink, so that eight of them on two loaded cores
# start when asked and the cullers' clocks, which start with them, mean the same on both hubs.
SERVER = """
import http.server, os, urllib.parse
url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
try:
    http.server.ThreadingHTTPServer((url.hostname, url.port), Answer).serve_forever()
except KeyboardInterrupt:  # the Hub stops it
    pass
"""


def culler_hub(workdir: Path, command: list[str], scopes: list[str]) -> HubHarness:
    """A hub whose only service is ``command``, entered as zero-to-jupyterhub enters
    jupyterhub-idle-culler: no URL, a role with ``scopes``."""
    extra = f"""
        c.JupyterHub.allow_named_servers = True
        c.JupyterHub.services.append({{"name": "culler", "command": {command!r}}})
        c.JupyterHub.load_roles.append(
            {{"name": "culler", "scopes": {scopes!r}, "services": ["culler"]}}
        )
        c.Spawner.cmd = [sys.executable, "-c", {SERVER!r}]
        c.Spawner.args = []
    """
    return HubHarness(workdir=workdir, extra_config=extra, timeout=120)


def idle_culler(workdir: Path, flags: list[str], scopes: list[str]) -> HubHarness:
    return culler_hub(workdir, [sys.executable, "-m", "jupyterhub_idle_culler", *flags], scopes)


def governor(workdir: Path, flags: list[str], scopes: list[str]) -> HubHarness:
    # Its own port (the entry has no URL, as the culler's has none) and database.
    own = [f"--GpuGovernor.port={free_port()}", f"--db-url=sqlite:///{workdir / 'gov.sqlite'}"]
    return culler_hub(workdir, [sys.executable, "-m", "jupyter_gpu_gov.hub", *flags, *own], scopes)


def side_by_side(method: str, hubs: list[HubHarness]) -> None:
    """``hub.<method>()`` for every hub at once (a hub takes seconds to start and to stop)."""
    threads = [threading.Thread(target=getattr(hub, method)) for hub in hubs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def spawn(hub: HubHarness, servers: list[tuple[str, str]]) -> None:
    for user, name in servers:
        hub.create_user(user)
        path = f"users/{user}/servers/{name}" if name else f"users/{user}/server"
        assert hub.api("POST", path).status_code == 201, hub.log_tail()


def script_activity(hub: HubHarness, last_active: Mapping[tuple[str, str], float]) -> dict:
    """Post each server's last activity (seconds after its start); return the starts."""
    started = {}
    for user in {u for u, _ in last_active}:
        model = hub.api("GET", f"users/{user}").json()
        for name, server in model["servers"].items():
            started[(user, name)] = parse(server["started"])
    for (user, name), offset in last_active.items():
        if offset is None:
            continue
        when = isoformat(started[(user, name)] + timedelta(seconds=offset))
        body = {"last_activity": when, "servers": {name: {"last_activity": when}}}
        assert hub.api("POST", f"users/{user}/activity", json=body).status_code == 200
    return started


def watch(hubs: list[HubHarness], keys, until: float, culled) -> list[dict]:
    """When each hub stopped each server (first seen stopping, or gone) and deleted each user
    (``("user", name)``), in seconds since the epoch: ``(low, high)``, from the start of the
    last poll that still saw it (None: the first poll did not) to the end of the first that
    did not, or None if not by ``until``. Polls every POLL seconds, until then or until each
    hub has culled what it should (``culled``, by hub: the latest of them come after the
    others would have been culled by mistake). A key a hub never had stays None.

    A loaded machine makes each poll of the four hubs slow: the stop is known only between
    those two polls, and is compared so (a time stamped once per poll was off by a poll's
    length, which the comparison's slack of two POLLs did not always cover)."""
    seen: list[dict] = [dict.fromkeys(keys) for _ in hubs]
    polled: list[float | None] = [None for _ in hubs]  # the start of each hub's last poll
    while time.time() < until and not all(
        found[key] is not None for found, keys in zip(seen, culled, strict=True) for key in keys
    ):
        for i, (hub, found) in enumerate(zip(hubs, seen, strict=True)):
            started = time.time()
            users = {m["name"]: m for m in hub.api("GET", "users").json()}
            answered = time.time()
            for key, when in found.items():
                if when is not None:
                    continue
                user, name = key
                if user == "user":
                    gone = name not in users
                else:
                    server = (users.get(user, {}).get("servers") or {}).get(name)
                    gone = server is None or server.get("pending") == "stop"
                if gone:
                    found[key] = (polled[i], answered)
            polled[i] = started
        time.sleep(POLL)
    return seen


def compare(hubs, started, stopped, expected: Mapping) -> dict:
    """Each server's stop, in seconds after its start (between two polls), on both hubs;
    assert they agree."""

    def since(stop, start):
        return tuple(None if t is None else t - start.timestamp() for t in stop or (None, None))

    table = {}
    for key in expected:
        table[key] = tuple(
            since(stop[key], start[key]) for stop, start in zip(stopped, started, strict=True)
        )
    print("server: (jupyterhub-idle-culler, governor) seconds after its start", table)
    for key, ((culler_low, culler), (ours_low, ours)) in table.items():
        low, high = expected[key]
        assert culler is not None and ours is not None, (key, table, hubs[1].log_tail())
        culler_low = -math.inf if culler_low is None else culler_low
        ours_low = -math.inf if ours_low is None else ours_low
        # Where jupyterhub-idle-culler culls it (its rule, give or take a pass)...
        assert low <= culler and culler_low <= high + CULL_EVERY + REFERENCE_LATE, (key, table)
        # ...the governor does too, within one --cull-every.
        assert ours_low <= culler + CULL_EVERY and culler_low <= ours + CULL_EVERY, (
            key,
            table,
            hubs[1].log_tail(),
        )
    return table


def test_the_governor_culls_who_and_when_jupyterhub_idle_culler_does(tmp_path):
    """Two pairs of hubs at once: --max-age with the culler's four scopes, and --cull-users
    with admin:users too (as zero-to-jupyterhub adds it)."""
    users_flags = [f"--timeout={TIMEOUT}", f"--cull-every={CULL_EVERY}", "--cull-users=true"]
    pairs = {
        "max-age": (FLAGS, CULLER_SCOPES),
        "cull-users": (users_flags, [*CULLER_SCOPES, "admin:users"]),
    }
    # Seconds after each server's start at which its last activity is scripted (None: none).
    last_active = {
        "max-age": {
            ("idle", ""): None,  # inactive from the start: culled at --timeout
            ("paused", ""): 6,  # active, then not: culled --timeout after its last activity
            ("busy", ""): MAX_AGE - 5,  # active to the end: culled at --max-age all the same
            ("busy", "lab"): MAX_AGE - 5,  # a named server: the same rules
        },
        "cull-users": {("idle", ""): None, ("busy", ""): MAX_AGE + TIMEOUT},
    }
    expected = {  # (earliest, latest) stop by jupyterhub-idle-culler's rules
        "max-age": {
            ("idle", ""): (TIMEOUT, TIMEOUT),
            ("paused", ""): (6 + TIMEOUT, 6 + TIMEOUT),
            ("busy", ""): (MAX_AGE, MAX_AGE),
            ("busy", "lab"): (MAX_AGE, MAX_AGE),
        },
        # A user goes with their last server when inactive long enough (in the same pass),
        # a user without a server when inactive since created; an active one stays.
        "cull-users": {
            ("idle", ""): (TIMEOUT, TIMEOUT),
            ("user", "idle"): (TIMEOUT, TIMEOUT),
            ("user", "serverless"): (TIMEOUT, TIMEOUT),
        },
    }
    kept = {"max-age": [], "cull-users": [("busy", ""), ("user", "busy")]}
    hubs = {
        name: [
            idle_culler(tmp_path / f"{name}-idle-culler", flags, scopes),
            governor(tmp_path / f"{name}-governor", flags, scopes),
        ]
        for name, (flags, scopes) in pairs.items()
    }
    every = [hub for pair in hubs.values() for hub in pair]
    try:
        side_by_side("start", every)
        for hub in every:
            if hub.proc is None or hub.proc.poll() is not None:
                raise AssertionError(f"a hub did not start:\n{hub.log_tail()}")
        started = {}
        for name, pair in hubs.items():
            for hub in pair:
                if name == "cull-users":
                    hub.create_user("serverless")
                spawn(hub, list(last_active[name]))
            started[name] = [script_activity(hub, last_active[name]) for hub in pair]
        for hub, starts in zip(hubs["cull-users"], started["cull-users"], strict=True):
            created = hub.api("GET", "users/serverless").json()["created"]
            starts[("user", "serverless")] = parse(created)
            starts[("user", "idle")] = starts[("idle", "")]
        last = max(s.timestamp() for pair in started.values() for x in pair for s in x.values())
        stopped = watch(
            every,
            [key for name in pairs for key in (*expected[name], *kept[name])],
            until=last + MAX_AGE + 2 * CULL_EVERY,
            culled=[expected[name] for name, pair in hubs.items() for _ in pair],
        )
        logs = [hubs["max-age"][1].log_tail(200_000), hubs["cull-users"][1].log_tail(200_000)]
    finally:
        side_by_side("stop", every)
    for i, name in enumerate(pairs):
        pair_stopped = stopped[2 * i : 2 * i + 2]
        compare(hubs[name], started[name], pair_stopped, expected[name])
        for found in pair_stopped:
            assert all(found[key] is None for key in kept[name]), (name, found)
    # The governor said once what the culler's scopes leave out, and asked nothing else of
    # servers that send no report (no checkpoint requests, no 403 for groups every pass).
    for log in logs:
        assert log.count("lacks list:groups") == 1 and "lacks access:servers" not in log
        assert "checkpoint of" not in log and "cannot list groups" not in log
