"""Steps of the governor's wall clock (issue 18, item 7), on a real hub: the governor runs under
libfaketime (its wall clock follows a file this test writes; its monotonic clock is the real
one, as on a host whose clock NTP or an admin steps).

- stepped back an hour, it still runs a pass every ``cull_every``;
- stepped forward an hour right after warning dora, it gives her warning its full notice, and
  bills her the minutes her server ran, not an hour more.

Skipped, saying why, without libfaketime (Debian: ``apt-get install libfaketime``).
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from governor_harness import Gov, governed_hub, kernel_with, server_running, wait

from jupyter_gpu_gov.core.clock import parse

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not FAKETIME.exists(), reason=f"{FAKETIME} is missing (apt-get install libfaketime)"
    ),
]
NOTICE = 24  # seconds between dora's warning and her cull


@pytest.fixture(scope="module")
def offset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faketime") / "offset"
    path.write_text("+0\n")
    return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory, offset):
    harness = governed_hub(
        tmp_path_factory.mktemp("security-clock"),
        extra_policies=[
            {
                "name": "noticed",
                "match": {"users": ["dora"]},
                "warn_after": "1s",
                "cull_after": f"{NOTICE + 1}s",
                "checkpoint": False,
            }
        ],
        governor_environment={
            "LD_PRELOAD": str(FAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(offset),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_NO_CACHE": "1",
        },
    )
    with harness as hub:
        hub.create_user("govadmin")
        hub.start_server("dora")
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def passes(gov: Gov) -> float:
    """Passes the governor has made (its reconcile histogram's count)."""
    url = gov.base.removesuffix("/api") + "/metrics"
    text = requests.get(
        url, headers={"Authorization": f"token {gov.hub.token('govadmin')}"}, timeout=30
    ).text
    return float(
        re.search(r"^jupyter_gpu_gov_reconcile_duration_seconds_count (\S+)$", text, re.M)[1]
    )


def test_a_clock_stepped_back_an_hour_does_not_stall_the_passes(gov, offset):
    def step_seen() -> bool:
        audit = gov.admin("GET", "audit?limit=50").json()["audit"]
        return any(a["action"] == "clock-step" and "stepped by -36" in a["reason"] for a in audit)

    offset.write_text("-1h\n")
    try:
        wait(step_seen, 60, "the step on the audit trail")
        # Then the passes go on, every cull_every (0.5 s): three more, where a loop waiting
        # for its wall clock would stall for the hour. (A loaded machine makes passes slower,
        # not an hour apart: their count, not a rate, is what tells.)
        before = passes(gov)
        wait(lambda: passes(gov) >= before + 3, 60, "three passes after the step")
    finally:
        offset.write_text("+0\n")


def test_a_clock_stepped_forward_neither_shortens_a_notice_nor_bills_phantom_hours(
    hub, gov, offset
):
    def culled() -> bool:
        if not server_running(hub, "dora"):
            return True
        # Asking the governor meanwhile, as a user's panel does: the proxy's kept connection to
        # it is never left idle for its idle timeout (30 s, about this wait), so the audit read
        # below never meets the two sides closing that connection at once (a 503).
        gov.verdict("dora")
        return False

    tab = kernel_with(hub, "dora", "from jupyter_gpu_gov import simulate; simulate.hold(2048)")
    try:
        verdict = wait(
            lambda: (v := gov.verdict("dora"))["state"] == "warned" and v, 45, "a warning"
        )
        moved_from = verdict["cull_at"]  # the deadline before the step: its warning came before
        offset.write_text("+1h\n")
        # The first pass after the step moves the deadline with the clock (a pass that took the
        # step for an hour of idleness culls instead: never moved, this wait fails). Waited
        # for, not slept on: a loaded machine's passes come late, and an asleep test then read
        # the deadline from before the step. That the notice ran in full is the audit's, below.
        stepped = wait(
            lambda: (
                (v := gov.verdict("dora"))["cull_at"]
                and (parse(v["cull_at"]) - parse(moved_from)).total_seconds() > 1800
                and v
            ),
            60,
            "the deadline to move with the clock",
        )
        moved = parse(stepped["cull_at"]) - parse(moved_from)
        assert 3590 <= moved.total_seconds() <= 3610, moved  # the same deadline, on the new clock
        wait(culled, 90, "dora's cull after the notice")
    finally:
        tab.close()
        offset.write_text("+0\n")
    # The notice as the warning announced it: no cull before the deadline it named (a step
    # taken for an hour of idleness culls at once). On the governor's own clock, audited: a
    # cull after the step was adopted is an hour later by it (a slow pass under way at the
    # step can cull before adopting it, the notice over). Not the warning's audit time: the
    # deadline counts from the pass's decision, its row from when the pass reached dora.
    audit = gov.admin("GET", "audit", params={"limit": 500}).json()["audit"]
    cull = min((a for a in audit if a["action"] == "cull"), key=lambda a: a["id"])
    warn = max(
        (a for a in audit if a["action"] == "warn" and a["id"] < cull["id"]), key=lambda a: a["id"]
    )
    adopted = any(
        a["action"] == "clock-step" and "stepped by +3600" in a["reason"]
        for a in audit
        if warn["id"] < a["id"] < cull["id"]
    )
    culled_at = parse(cull["at"]) - (timedelta(hours=1) if adopted else timedelta(0))
    assert culled_at >= parse(moved_from) - timedelta(seconds=1), (culled_at, moved_from, audit)
    usage = gov.admin("GET", "usage", params={"group_by": "user", "user": "dora"}).json()["usage"]
    hours = sum(row["gpu_hours_allocated"] + row["gpu_hours_unobserved"] for row in usage)
    assert hours < 0.1, usage  # the few minutes she ran, not an hour more
