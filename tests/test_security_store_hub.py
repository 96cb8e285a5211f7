"""The governor's record under failure, on a real hub (issue 18, items 9 and 10): its SQLite
store locked by another process, and the service killed while a cull is under way.

tom   idle, due for a cull while the store is locked: nothing is done until it can be recorded
sam   extends while the store is locked: refused, changing nothing; granted once it is free
ulla  culled while her server takes seconds to stop; the service is killed meanwhile (SIGKILL)
      and the hub restarts it: one cull on record, one DELETE
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time

import pytest
import requests
from governor_harness import (
    Gov,
    governed_hub,
    kernel_with,
    server_running,
    service_pid,
    start_all,
    wait,
)

from jupyter_gpu_gov.core.clock import parse

pytestmark = pytest.mark.timeout(300)

HOLD = "from jupyter_gpu_gov import simulate; simulate.hold(2048)"
QUICK = {"warn_after": "1s", "cull_after": "4s", "checkpoint": False}
# tom's notice outlasts the few requests between seeing his warning and locking the store on
# a loaded machine (his cull falls due under the lock, not before it), and ends well before the
# governor, unable to renew its lease (30 s) in the locked store, stands by from 22.5 s on.
NOTICE = 6
POLICIES = [
    {"name": "quick", "match": {"users": ["ulla"]}, **QUICK},
    {"name": "noticed", "match": {"users": ["tom"]}, **QUICK, "cull_after": f"{NOTICE + 1}s"},
    {"name": "extender", "match": {"users": ["sam"]}, "warn_after": "1s", "cull_after": "10m"},
]
# ulla's server takes 8 s to stop (a pod's grace period, say): the Hub's DELETE is in flight.
SLOW_STOP = """
import asyncio, pathlib
from jupyterhub.spawner import SimpleLocalProcessSpawner

class SlowStop(SimpleLocalProcessSpawner):
    async def stop(self, now=False):
        if self.user.name == "ulla":
            pathlib.Path(HARNESS_DIR, "ulla-stopping").touch()
            await asyncio.sleep(8)
        return await super().stop(now=now)

c.JupyterHub.spawner_class = SlowStop
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    harness = governed_hub(
        tmp_path_factory.mktemp("security-store"), extra_policies=POLICIES, hub_config=SLOW_STOP
    )
    with harness as hub:
        hub.create_user("govadmin")
        start_all(hub, dict.fromkeys(("tom", "sam", "ulla")))
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


class Lock:
    """Another process's write transaction on the governor's SQLite file, held until released."""

    def __init__(self, path):
        self.connection = sqlite3.connect(
            path, timeout=30, isolation_level=None, check_same_thread=False
        )
        self.connection.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.connection.execute("ROLLBACK")
        self.connection.close()


def extend(hub, user: str) -> requests.Response:
    return requests.post(
        hub.user_url(user, "jupyter-gpu-gov/extend"),
        json={"reason": "a last figure"},
        headers={"Authorization": f"token {hub.token(user)}"},
        timeout=60,
    )


def store_errors(gov: Gov) -> float:
    """Writes the governor's store refused (its metrics): passes that acted on nothing."""
    r = gov.hub.get(f"{gov.base.removesuffix('/api')}/metrics", token=gov.hub.token("govadmin"))
    assert r.status_code == 200, r.text[:300]
    found = re.search(r"^jupyter_gpu_gov_store_errors_total (\S+)$", r.text, re.M)
    return float(found[1]) if found else 0.0


def test_a_locked_store_means_nothing_is_done_and_nothing_is_half_done(hub, gov):
    # sam warned first, then tom: tom's warning is the last thing before the lock. (Both at
    # once, tom's cull once fell due while sam's kernel started on a loaded machine: culled
    # before the lock, as it should be.)
    tabs = [kernel_with(hub, "sam", HOLD)]
    try:
        wait(lambda: gov.verdict("sam")["state"] == "warned", 45, "sam to be warned")
        tabs.append(kernel_with(hub, "tom", HOLD))
        due = parse(
            wait(
                lambda: (v := gov.verdict("tom"))["state"] == "warned" and v["cull_at"],
                45,
                "tom to be warned",
            )
        ).timestamp()
        left = gov.verdict("sam")["extensions_left"]
        lock = Lock(hub.workdir / "gpu-gov.sqlite")
        try:
            assert time.time() < due, "the store was locked after tom's cull fell due"
            r = extend(hub, "sam")
            assert r.status_code == 503, r.text
            assert (
                "unavailable" in r.json()["message"]
                and "Nothing was changed" in r.json()["message"]
            )
            # tom's cull falls due: it is neither done nor half done (done, never recorded).
            # A pass past his deadline decides it and the store refuses its record: waited
            # for, not slept on, as a loaded machine's governor may make no pass in a sleep.
            wait(lambda: time.time() > due, NOTICE + 30, "tom's cull to fall due")
            refused = store_errors(gov)
            wait(lambda: store_errors(gov) > refused, 60, "a pass past it the store refused")
            assert server_running(hub, "tom")
            assert hub.api("GET", "users/tom").json()["servers"][""]["pending"] is None
            assert not [a for a in gov.audit("tom/") if a["action"] == "cull"]  # (WAL: read)
        finally:
            lock.release()
        # A lock that outlasted the governor's lease leaves it standing by until it takes the
        # lease back ("Nothing was changed; try again"): sam asks again until then.
        refused: list[str] = []

        def granted():
            a = extend(hub, "sam")
            if a.status_code == 503:
                refused.append(a.json()["message"])
                return None
            return a

        r = wait(granted, 60, "the governor to act")
        assert r.status_code == 200 and r.json()["status"] == "granted", r.text
        # Meanwhile said as it was: its own lease lapsed, no other governor acting.
        assert not [m for m in refused if "another one acts" in m], refused
        assert r.json()["verdict"]["extensions_left"] == left - 1
        wait(lambda: not server_running(hub, "tom"), 60, "tom to be culled once it can be recorded")
    finally:
        for tab in tabs:
            tab.close()
    audit, cull = gov.carried_out_cull("tom/")
    assert [a["action"] for a in audit].count("cull") == 1, audit
    assert cull["details"]["outcome"] in ("stopped", "stopping"), cull


def test_a_service_killed_mid_cull_neither_forgets_it_nor_repeats_it(hub, gov):
    marker = hub.workdir / "ulla-stopping"
    tab = kernel_with(hub, "ulla", HOLD)
    try:
        wait(marker.exists, 60, "the hub to start stopping ulla's server (the governor's DELETE)")
        pid = service_pid(hub)
        os.kill(pid, signal.SIGKILL)  # while the hub is still answering that DELETE
    finally:
        tab.close()
    wait(lambda: service_pid(hub) not in (None, pid), 60, "the hub to restart the governor")
    gov.wait_up()
    wait(lambda: not server_running(hub, "ulla"), 60, "ulla's server to be stopped")
    passes = gov.passes()  # passes of the restarted service (a sleep: none, when loaded)
    wait(lambda: gov.passes() >= passes + 3, 60, "three passes of the restarted service")
    culls = [a for a in gov.audit("ulla/") if a["action"].startswith("cull")]
    assert [a["action"] for a in culls] == ["cull"], culls  # on record before the DELETE
    log = hub.log_path.read_text(errors="replace")
    assert log.count("DELETE /hub/api/users/ulla/server") == 1, log[-3000:]
