"""What may wait in the spawn queue, end to end: a real hub with the profile layer on a
one-H100 workstation (simulated), real single-user servers, real HTTP; teams are Hub groups.

The test plays the governor's sync itself (``POST /hub/api/gpu-gov/queue``, as the governor
would every pass): the line is offered only while it is heard from.

- a request that can never start as the hub is configured (beyond the user's cap with nothing
  held) is refused at the line, not left waiting until it expires;
- a request that can no longer start (its owner left the team) leaves the line at the next
  sync, counted as cancelled, and the request behind it is next, instead of being refused
  "1 request is waiting in line before you" until the dead one expires;
- the team decided when joining goes with the request, so joining a second team meanwhile
  does not make its start ask "which team?";
- joining the line names servers under JupyterHub's own rules (``named_server_limit_per_user``,
  valid names), and cancelling makes no server.
"""

from __future__ import annotations

import html
import re

import pytest
import requests
from hub_harness import HubHarness, hub_fixture

pytestmark = pytest.mark.timeout(300)

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
TIERS = [
    {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"},
    {"name": "h100x2", "display_name": "H100 pair", "gpu": "H100-80GB", "count": 2},
]
QUOTAS = {
    "lab": {"guaranteed": {"h100": 1}, "user_cap": 1, "tiers": "*"},
    "ops": {"guaranteed": {}, "tiers": "*"},
}
USERS = ["carol", "fay", "erin", "gus", "hal"]

hub = hub_fixture(
    users=USERS,
    extra_config=f"""
        from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

        c.JupyterHub.allow_named_servers = True
        c.JupyterHub.named_server_limit_per_user = 2
        c.LocalGpus.backend = "simulated"
        c.LocalGpus.simulated_devices = {[H100]!r}
        c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
        c.GpuProfiles.tiers = {TIERS!r}
        c.GpuProfiles.quotas = {QUOTAS!r}
        add_gpu_profiles(c, spawner="simple")
        """,
    singleuser_config=f"c.GpuGovApp.simulated_devices = {[H100]!r}\n",
)


@pytest.fixture(scope="module", autouse=True)
def teams(hub):
    for team in ("lab", "ops"):
        assert hub.api("POST", f"groups/{team}").status_code in (201, 409)
        r = hub.api("PUT", f"groups/{team}/properties", json={"gpu-gov/team": True})
        assert r.status_code == 200, r.text
    r = hub.api("POST", "groups/lab/users", json={"users": USERS})
    assert r.status_code == 200, r.text


def sync(hub: HubHarness) -> dict:
    """The governor's sync: no releases known; the line and the departures back."""
    r = hub.api("POST", "gpu-gov/queue", json={"releases": {}})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_sync_nested_too_deeply_is_a_400_naming_it_and_the_next_one_is_answered(hub):
    """The sync's body is JSON from the governor's token: one nested past the parser's
    recursion limit (100 kB of brackets, well under the 8 MiB bound) raised RecursionError,
    which no except caught: a 500 with a traceback in the Hub's log."""
    deep = '{"releases": ' + "[" * 50_000 + "]" * 50_000 + "}"
    r = hub.api("POST", "gpu-gov/queue", data=deep, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "nested too deeply" in r.json()["message"], r.text[:300]
    assert "line" in sync(hub)


def join(hub: HubHarness, user: str, fields: dict, server: str = "") -> requests.Response:
    """Post the spawn form's choices to "Wait in line", as the button does (the XSRF token
    from the default server's spawn page)."""
    session = hub.login(user)
    page = session.get(hub.spawn_page_url(user), timeout=30)
    xsrf = re.search(r"_xsrf=([^&\"']+)", page.text)
    assert xsrf, page.text[:2000]
    path = f"{user}/{server}" if server else user
    url = f"{hub.url}/hub/gpu-gov/queue/join/{path}?_xsrf={html.unescape(xsrf[1])}"
    return session.post(url, data=fields, allow_redirects=False, timeout=60)


def line(hub: HubHarness) -> dict[str, dict]:
    r = hub.api("GET", "gpu-gov/queue")
    assert r.status_code == 200, r.text
    return {w["user"]: w for w in r.json()["line"]}


def server_names(hub: HubHarness, user: str) -> set[str]:
    r = hub.api("GET", f"users/{user}", params={"include_stopped_servers": "1"})
    assert r.status_code == 200, r.text
    return set(r.json()["servers"])


def test_a_request_that_can_never_start_is_refused_at_the_line(hub):
    sync(hub)
    # A pair counts 2 GPU-equivalents; lab's per-user cap is 1: never, whatever frees.
    r = join(hub, "gus", {"profile": "h100x2", "team": "lab"})
    assert r.status_code == 403, r.status_code
    page = html.unescape(r.text)
    assert "H100 pair can never start for team lab as this hub is configured" in page, page
    assert "per-user cap" in page and "It cannot wait in line." in page, page
    assert "gus" not in line(hub)


def test_a_request_that_can_no_longer_start_leaves_the_line(hub):
    hub.start_server("carol", options={"profile": "h100", "team": "lab"})
    try:
        sync(hub)
        assert join(hub, "fay", {"profile": "h100"}).status_code == 302
        assert join(hub, "erin", {"profile": "h100"}).status_code == 302
        waiting = line(hub)
        assert (waiting["fay"]["position"], waiting["erin"]["position"]) == (1, 2)
        # The team decided when joining is recorded: the start decides no other.
        assert waiting["fay"]["options"]["team"] == "lab", waiting["fay"]

        # fay leaves the team, then the card frees: her request could never start now.
        r = hub.api("DELETE", "groups/lab/users", json={"users": ["fay"]})
        assert r.status_code == 200, r.text
    finally:
        hub.stop_server("carol")

    answer = sync(hub)
    left = [d for d in answer["left"] if d["server"] == "fay/"]
    assert [d["outcome"] for d in left] == ["cancelled"], answer["left"]
    # Why, for the owner's audit trail (the governor records it).
    assert left[0]["why"].startswith("it can no longer start: You are in no team with GPU access")
    waiting = line(hub)
    assert "fay" not in waiting
    assert waiting["erin"]["position"] == 1 and waiting["erin"]["ready"], waiting["erin"]


def test_joining_the_line_follows_jupyterhub_s_rules_for_server_names(hub):
    sync(hub)
    for name in ("a", "b"):  # two named servers: the limit
        r = join(hub, "hal", {"profile": "h100", "team": "lab"}, server=name)
        assert r.status_code in (302, 403), r.text[:3000]
    assert server_names(hub, "hal") >= {"a", "b"}
    before = server_names(hub, "hal")
    r = join(hub, "hal", {"profile": "h100", "team": "lab"}, server="c")
    assert r.status_code == 400 and "maximum of 2 named servers" in r.text, r.text[:2000]
    r = join(hub, "hal", {"profile": "h100", "team": "lab"}, server="a" * 300)
    assert r.status_code == 400, r.text[:2000]
    # Cancelling a server that does not exist makes none.
    session = hub.login("hal")
    xsrf = session.cookies.get("_xsrf")
    r = session.post(
        f"{hub.url}/hub/gpu-gov/queue/cancel/hal/zzz",
        data={"_xsrf": xsrf} if xsrf else {},
        allow_redirects=False,
        timeout=30,
    )
    assert r.status_code == 404, r.status_code
    assert server_names(hub, "hal") == before
