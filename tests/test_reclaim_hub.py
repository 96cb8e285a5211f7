"""A reclaim withdrawn on a real hub: the profile layer on a one-GPU workstation (simulated), the
governor service, real single-user servers, real HTTP.

ivan (interns, no guarantee) borrows the one H100; vera (lab, guaranteed it) joins the line for
it, so ivan's server is asked back and warned with a deadline (``reclaim_grace``). vera then
cancels. Before, ivan still lost his server at the deadline, for nobody; now the hub lifts the
reclaim at the governor's next sync, the governor puts it on record, ivan's verdict carries no
deadline and his server runs on past it; his verdict says the reclaim was lifted, across a
restart of the governor.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from governor_harness import (
    Gov,
    cancel_button,
    governed_hub,
    join,
    queue_line,
    server_running,
    service_pid,
    wait,
)
from hub_harness import HubHarness

from jupyter_gpu_gov.core.clock import parse

pytestmark = pytest.mark.timeout(300)

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
GRACE = 30  # seconds: long enough to cancel and see the withdrawal on a loaded machine
PROFILES = f"""
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c.JupyterHub.cleanup_servers = False
c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = {[H100]!r}
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
c.GpuProfiles.tiers = [{{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}}]
c.GpuProfiles.quotas = {{
    "lab": {{"guaranteed": {{"h100": 1}}}},
    "interns": {{"borrowing_limit": {{"h100": 1}}, "tiers": ["h100"]}},
}}
c.GpuProfiles.team_map = {{"ivan": "interns", "vera": "lab"}}
add_gpu_profiles(c, spawner="simple")
"""
SINGLEUSER = f"c.GpuGovApp.simulated_devices = {[H100]!r}\n"


def ivan_borrows_the_h100(hub: HubHarness) -> Gov:
    """The users made, the governor up, and ivan (interns) holding the one H100, which vera's
    team (lab) is guaranteed: what joining the line then asks back."""
    for user in ("govadmin", "ivan", "vera"):
        hub.create_user(user)
    gov = Gov(hub)
    gov.wait_up()
    r = hub.api("POST", "users/ivan/server", json={"profile": "h100"})
    assert r.status_code in (201, 202), r.text
    hub.wait_for_server("ivan")
    return gov


def test_a_reclaim_is_withdrawn_when_the_team_that_asked_cancels(tmp_path):
    # ivan's work is never idle-culled here: only the reclaim could stop it.
    keep = {"name": "borrower", "match": {"users": ["ivan"]}, "warn_after": "1h",
            "cull_after": "2h", "reclaim_grace": f"{GRACE}s"}  # fmt: skip
    with governed_hub(
        tmp_path, hub_config=PROFILES, singleuser_config=SINGLEUSER, extra_policies=[keep]
    ) as hub:
        gov = ivan_borrows_the_h100(hub)

        r = join(hub, "vera", {"profile": "h100"})
        assert r.status_code == 302, r.text
        assert "vera" in queue_line(hub)
        # Logged in and her queue page read now: between ivan's warning and his deadline only
        # her press of Cancel and the governor's sync race it (on a loaded machine the login
        # and the page took seconds of the grace).
        cancel = cancel_button(hub, "vera")
        warned = wait(
            lambda: next((a for a in gov.audit("ivan/") if a["action"] == "reclaim-warn"), None),
            60,
            "ivan's reclaim warning",
        )
        assert "team lab, within its guarantee" in warned["reason"], warned
        due = parse(gov.verdict("ivan")["cull_at"])

        cancel()

        withdrawn = wait(
            lambda: next(
                (a for a in gov.audit("ivan/") if a["action"] == "reclaim-withdrawn"), None
            ),
            60,
            "the reclaim's withdrawal on ivan's record",
        )
        assert "team lab" in withdrawn["reason"] and "deadline is lifted" in withdrawn["reason"]
        # Withdrawn in time, or this run proves nothing of what follows (a machine too slow
        # for the grace names itself here, not as a server culled past a withdrawal).
        assert parse(withdrawn["at"]) < due, ("withdrawn after the deadline", withdrawn, due)
        # His verdict no longer names the reclaim; its deadline is his idle policy's (2 h).
        wait(lambda: "within its guarantee" not in gov.verdict("ivan")["reason"], 30, "the verdict")
        told = gov.verdict("ivan")
        assert parse(told["cull_at"]) > due + timedelta(minutes=30)
        assert told["hard_deadline"] is False  # an idle deadline: his work puts it off
        # ...and says it was lifted (JupyterLab tells him once), when the governor put it on record.
        assert told["reclaim_withdrawn"] == withdrawn["at"], (told, withdrawn)
        # The governor restarts within those 15 minutes (killed; the hub starts it again): his
        # verdict says it still, from the same time (it was kept in the governor's memory alone).
        pid = service_pid(hub)
        os.kill(pid, signal.SIGKILL)
        wait(lambda: service_pid(hub) not in (None, pid), 60, "the hub to restart the governor")
        gov.wait_up()
        after = gov.verdict("ivan")
        assert after["reclaim_withdrawn"] == withdrawn["at"], (after, withdrawn)
        # Past the deadline that was announced, and two passes more: his server runs on.
        time.sleep(max(0.0, due.timestamp() - time.time()))
        passes = gov.passes()
        wait(lambda: gov.passes() >= passes + 2, 60, "two passes past the deadline")
        assert server_running(hub, "ivan")
        assert "cull" not in gov.actions("ivan/"), gov.audit("ivan/")
