"""The count admission reads, kept between spawns, in a real JupyterHub: real single-user
servers, the REST API, the hub's own SQLite database. Team lab is guaranteed one H100 of two
and may borrow none.

A grant taken out of the database behind the hub's back (another process, an admin's edit)
must not go on counting: the next spawn finds it by the fingerprint, says so in the hub's log
and is admitted as a fresh count admits it.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from hub_harness import HubHarness, hub_fixture

pytestmark = pytest.mark.timeout(300)

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
TIERS = [{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}]
QUOTAS = {"lab": {"guaranteed": {"h100": 1}, "borrowing_limit": {"h100": 0}}}
USERS = ["alice", "bob", "carol"]

hub = hub_fixture(
    users=USERS,
    extra_config=f"""
        from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

        c.LocalGpus.backend = "simulated"
        c.LocalGpus.simulated_devices = {[H100, H100]!r}
        c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
        c.GpuProfiles.tiers = {TIERS!r}
        c.GpuProfiles.quotas = {QUOTAS!r}
        c.GpuProfiles.team_map = {dict.fromkeys(USERS, "lab")!r}
        add_gpu_profiles(c, spawner="simple")
        """,
    singleuser_config=f"c.GpuGovApp.simulated_devices = {[H100, H100]!r}\n",
)


def spawn(hub: HubHarness, user: str):
    return hub.api("POST", f"users/{user}/server", json={"profile": "h100"})


def test_a_grant_removed_behind_the_hubs_back_is_found_and_the_spawn_that_fits_admitted(hub):
    r = spawn(hub, "alice")
    assert r.status_code in (201, 202), r.text
    hub.wait_for_server("alice")
    r = spawn(hub, "bob")
    assert (
        r.status_code == 403
        and "guarantee of 1 H100 80 GB card; it holds 1, none borrowed" in r.json()["message"]
    ), r.text

    hub.stop_server("alice")  # the hub's own stop (the admin's API): counted out
    r = spawn(hub, "bob")
    assert r.status_code in (201, 202), r.text
    hub.wait_for_server("bob")
    # Carol's spawn form: the count, up to date with what the hub wrote, says the team is full.
    page = hub.login("carol").get(hub.spawn_page_url("carol"), timeout=30).text
    assert "may not borrow" in page, page[-3000:]

    # Bob's grant taken out of the hub's database by another process.
    with sqlite3.connect(hub.workdir / "jupyterhub.sqlite", timeout=30) as db:
        [(row, state)] = db.execute(
            "SELECT spawners.id, spawners.state FROM spawners JOIN users"
            " ON spawners.user_id = users.id WHERE users.name = 'bob' AND spawners.name = ''"
        ).fetchall()
        state = json.loads(state)
        assert state.pop("gpu_gov_grant")["gpu-gov/team"] == "lab"
        db.execute("UPDATE spawners SET state = ? WHERE id = ?", (json.dumps(state), row))

    r = spawn(hub, "carol")  # the team holds nothing the database says: carol fits

    assert r.status_code in (201, 202), r.text
    log = hub.log_path.read_text(errors="replace")
    said = [x for x in log.splitlines() if "the kept GPU count had drifted" in x]
    assert len(said) == 1, log[-3000:]
    [line] = said
    assert "found by a fingerprint recount" in line and "h100/lab: kept 1, database 0" in line
    hub.wait_for_server("carol")
