"""The profile layer end to end: a real JupyterHub with GpuSimpleLocalProcessSpawner, real
single-user servers, real HTTP (login, spawn form, REST API, kernels), simulated GPUs.

Two hubs, each started once for the module:

- ``hub``: the demo's devices (two whole H100s and one H100 in MIG slices) and quotas (vision,
  nlp), for the spawn form, admission, device pinning, refusals and the memory estimate;
- ``pool``: four whole H100s shared by two teams with ``cleanup_servers = False``, for concurrent
  spawns against a quota and for a hub restart that must keep every allocation.

The hub's allocator (``LocalGpus``) and the servers (``GpuGovApp``) use the same device list and
the same simulated state file, so both agree on the UUIDs; the test computes them the same way.
"""

from __future__ import annotations

import html
import json
import re
import threading
from typing import Any

import pytest
import requests
from hub_harness import HubHarness, hub_fixture

from jupyter_gpu_gov.gpu.simulated import leaf_devices
from jupyter_gpu_gov.profiles.estimate import estimate_memory, smallest_tier
from jupyter_gpu_gov.profiles.tiers import load_tiers

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
DEMO_DEVICES = [H100, H100, {**H100, "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}]
POOL_DEVICES = [H100] * 4

TIERS = [
    {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB", "max_age": "8h"},
    {"name": "h100-3g", "display_name": "Half an H100", "gpu": "H100-80GB", "mig": "3g.40gb"},
    {
        "name": "h100-2g",
        "display_name": "H100 MIG 2g",
        "gpu": "H100-80GB",
        "mig": "2g.20gb",
        "task_types": ["interactive", "batch"],
    },
    {"name": "h100-1g", "display_name": "Small H100 slice", "gpu": "H100-80GB", "mig": "1g.10gb"},
]
QUOTAS = {
    # one card and one small slice guaranteed, may borrow one more card; 1 GPU per person
    "vision": {
        "guaranteed": {"h100": 1, "h100-1g": 1},
        "borrowing_limit": {"h100": 1},
        "user_cap": 1,
    },
    "nlp": {"guaranteed": {"h100-3g": 1, "h100-2g": 1, "h100-1g": 1}, "tiers": "*"},
}
TEAM_MAP = {"alice": "vision", "dave": "vision", "bob": "nlp", "carol": ["vision", "nlp"]}

POOL_TIERS = [{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}]
POOL_QUOTAS = {
    "lab": {"guaranteed": {"h100": 2}, "borrowing_limit": {"h100": 0}},
    "ops": {"guaranteed": {"h100": 2}},
}
LAB = [f"lab{i}" for i in range(1, 6)]
POOL_TEAM_MAP = {**dict.fromkeys(LAB, "lab"), "ops1": "ops", "ops2": "ops"}

DEVICES_STATE = "gpu_gov_devices"
TIER, TEAM, PROJECT, BORROWED = (f"gpu-gov/{k}" for k in ("tier", "team", "project", "borrowed"))
TASK_TYPE, EXPECTED = "gpu-gov/task-type", "gpu-gov/expected-duration"


def _hub_config(devices, tiers, quotas, team_map, extra: str = "") -> str:
    return f"""
        from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

        c.JupyterHub.allow_named_servers = True
        c.LocalGpus.backend = "simulated"
        c.LocalGpus.simulated_devices = {devices!r}
        c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
        c.GpuProfiles.tiers = {tiers!r}
        c.GpuProfiles.quotas = {quotas!r}
        c.GpuProfiles.team_map = {team_map!r}
        add_gpu_profiles(c, spawner="simple")
        {extra}
        """


def _singleuser_config(devices) -> str:
    return f"c.GpuGovApp.simulated_devices = {devices!r}\n"


# The admin's own choice of image (JupyterHub 5.3's apply_user_options, as its docs show it),
# which refuses an image it does not know, before the spawner's start (and admission) runs.
IMAGES = """def _image(spawner, options):
            if options.get("image", "base") not in ("base", "torch"):
                from tornado import web
                raise web.HTTPError(400, "Unknown image: choose base or torch.")
        c.Spawner.apply_user_options = _image"""

hub = hub_fixture(
    users=["alice", "bob", "carol", "dave", "erin"],
    extra_config=_hub_config(DEMO_DEVICES, TIERS, QUOTAS, TEAM_MAP, extra=IMAGES),
    singleuser_config=_singleuser_config(DEMO_DEVICES),
)
pool = hub_fixture(
    users=[*LAB, "ops1", "ops2"],
    extra_config=_hub_config(
        POOL_DEVICES,
        POOL_TIERS,
        POOL_QUOTAS,
        POOL_TEAM_MAP,
        extra="c.JupyterHub.cleanup_servers = False",
    ),
    singleuser_config=_singleuser_config(POOL_DEVICES),
)

LEAVES = leaf_devices(DEMO_DEVICES)
WHOLE_UUIDS = {leaf["uuid"] for leaf in LEAVES if leaf["mig_profile"] is None}
MIG_UUIDS = {leaf["mig_profile"]: leaf["uuid"] for leaf in LEAVES if leaf["mig_profile"]}
POOL_UUIDS = [leaf["uuid"] for leaf in leaf_devices(POOL_DEVICES)]


# --- helpers ---------------------------------------------------------------------------------


def tier_lines(page: str) -> dict[str, dict[str, tuple[str, str]]]:
    """The spawn form's tiers: tier → team → (css class, sentence)."""
    tiers = {}
    for tier, body in re.findall(r'data-tier="([^"]+)">(.*?)</label>', page, re.S):
        lines = re.findall(r'<li class="(\w+)" data-team="([^"]+)">(.*?)</li>', body, re.S)
        tiers[tier] = {team: (css, html.unescape(text)) for css, team, text in lines}
    return tiers


def spawn_page(hub: HubHarness, user: str, server_name: str = "") -> str:
    """The spawn page as ``user`` sees it (logged in through /hub/login)."""
    url = hub.spawn_page_url(user, server_name)
    r = hub.login(user).get(url, allow_redirects=False, timeout=30)
    assert r.status_code == 200, f"{r.status_code} {r.text[:2000]}"
    return r.content.decode()  # UTF-8, as its <meta charset> says (the header does not)


def error_message(page: str) -> str:
    """The refusal the spawn page shows (``spawn-error-msg``), unescaped."""
    found = re.search(r'class="spawn-error-msg[^"]*">\s*(.*?)\s*</p>', page, re.S)
    assert found, f"no spawn-error-msg on the page:\n{page[:3000]}"
    return html.unescape(found[1]).removeprefix("Error: ")


def servers(hub: HubHarness, user: str) -> dict[str, dict[str, Any]]:
    """The user's active servers as the hub's API shows them (with state: the harness's token
    has admin:server_state)."""
    r = hub.api("GET", f"users/{user}")
    assert r.status_code == 200, r.text
    return r.json().get("servers") or {}


def held(hub: HubHarness) -> dict[str, list[str]]:
    """Device UUIDs per active server ("user/name") of the whole hub, from spawner state."""
    r = hub.api("GET", "users")
    assert r.status_code == 200, r.text
    return {
        f"{user['name']}/{name}": (server.get("state") or {}).get(DEVICES_STATE, [])
        for user in r.json()
        for name, server in (user.get("servers") or {}).items()
    }


def visible_devices(hub: HubHarness, user: str) -> str:
    """``CUDA_VISIBLE_DEVICES`` as a kernel of the user's server sees it."""
    kernel = hub.start_kernel(user)
    out = hub.execute(user, kernel, 'import os; print(os.environ["CUDA_VISIBLE_DEVICES"])')
    return out.strip()


def api_spawn(hub: HubHarness, user: str, options: dict[str, Any]) -> requests.Response:
    return hub.api("POST", f"users/{user}/server", json=options)


# --- 1. the spawn form -----------------------------------------------------------------------


def test_form_lists_the_teams_tiers_with_what_is_left(hub):
    page = spawn_page(hub, "alice")
    tiers = tier_lines(page)
    # vision's tiers only, with what is left; no team selector for a single team
    assert set(tiers) == {"h100", "h100-1g", "no-gpu"}, tiers
    assert tiers["h100"] == {"vision": ("ok", "vision: 1 of 1 guaranteed left · 2 of 2 free")}
    assert tiers["h100-1g"] == {"vision": ("ok", "vision: 1 of 1 guaranteed left · 2 of 2 free")}
    assert 'id="gpu-gov-team"' not in page
    assert '<input type="hidden" name="team" value="vision">' in page

    # nlp may use every tier; h100 has no nlp guarantee: it would borrow
    tiers = tier_lines(spawn_page(hub, "bob"))
    assert set(tiers) == {"h100", "h100-3g", "h100-2g", "h100-1g", "no-gpu"}, tiers
    css, sentence = tiers["h100"]["nlp"]
    assert css == "borrow"
    assert sentence.startswith("nlp: would borrow (no guarantee here"), sentence
    assert tiers["h100-3g"] == {"nlp": ("ok", "nlp: 1 of 1 guaranteed left · 1 of 1 free")}


def test_form_for_two_teams_has_a_team_selector(hub):
    page = spawn_page(hub, "carol")
    select = re.search(
        r'<select[^>]*id="gpu-gov-team"[^>]*name="team"[^>]*>(.*?)</select>', page, re.S
    )
    assert select, page[:3000]
    assert re.findall(r'<option value="([^"]+)"', select[1]) == ["vision", "nlp"]
    tiers = tier_lines(page)
    assert set(tiers["h100"]) == {"vision", "nlp"}
    # Not a vision tier: said so on vision's line, which the page shows while vision is chosen.
    assert tiers["h100-3g"]["vision"] == ("refused", "vision: not offered to this team")
    assert tiers["h100-3g"]["nlp"][0] == "ok"


def test_form_for_no_team_says_ask_the_admin(hub):
    page = spawn_page(hub, "erin")
    assert "You are in no team with GPU access. Ask your hub admin" in page
    assert set(tier_lines(page)) == {"no-gpu"}
    # Asking for a GPU anyway is refused with the same advice, and nothing starts.
    r = hub.spawn_form("erin", fields={"profile": "h100"})
    assert r.status_code == 403, r.text[:2000]
    assert error_message(r.text).startswith("You are in no team with GPU access. Ask your hub")
    assert servers(hub, "erin") == {}


# --- 2. spawns within quota get distinct devices -------------------------------------------


def test_a_server_without_a_gpu_is_recorded_as_such(hub):
    """The grant the governor reads says "no GPU" (an empty grant, no device), not nothing: a
    CPU-only server is then never taken for a GPU server whose GPU state is unknown. A forged
    grant in user_options is dropped."""
    r = api_spawn(hub, "erin", {"profile": "no-gpu", TIER: "h100", DEVICES_STATE: ["GPU-x"]})
    assert r.status_code in (201, 202), r.text
    hub.wait_for_server("erin")
    state = servers(hub, "erin")[""]["state"]
    assert state["gpu_gov_grant"] == {} and DEVICES_STATE not in state, state
    assert visible_devices(hub, "erin") == ""
    hub.stop_server("erin")


def test_spawns_within_quota_get_distinct_devices(hub):
    fields = {"alice": "h100", "dave": "h100", "bob": "h100-3g"}
    for user, profile in fields.items():
        project = {"project": "segmentation"} if user == "alice" else {}
        r = hub.spawn_form(user, fields={"profile": profile, **project})
        assert r.status_code == 302, f"{user}: {r.status_code} {error_message(r.text)}"
        assert "spawn-pending" in r.headers["Location"]
    for user in fields:
        hub.wait_for_server(user)

    options = {user: servers(hub, user)[""]["user_options"] for user in fields}
    assert options["alice"]["profile"] == "h100"  # what the form asked for is kept
    assert {k: options["alice"].get(k) for k in (TIER, TEAM, BORROWED, PROJECT)} == {
        TIER: "h100",
        TEAM: "vision",
        BORROWED: "false",  # within vision's guarantee of one card
        PROJECT: "segmentation",
    }
    assert {k: options["dave"].get(k) for k in (TIER, TEAM, BORROWED)} == {
        TIER: "h100",
        TEAM: "vision",
        BORROWED: "true",  # the guarantee is alice's: dave borrows the second card
    }
    assert {k: options["bob"].get(k) for k in (TIER, TEAM, BORROWED)} == {
        TIER: "h100-3g",
        TEAM: "nlp",
        BORROWED: "false",
    }

    seen = {user: visible_devices(hub, user) for user in fields}
    state = {user: servers(hub, user)[""]["state"][DEVICES_STATE] for user in fields}
    assert seen["alice"] in WHOLE_UUIDS and seen["dave"] in WHOLE_UUIDS, seen
    assert seen["alice"] != seen["dave"]
    assert seen["bob"] == MIG_UUIDS["3g.40gb"] and seen["bob"].startswith("MIG-")
    assert state == {user: [uuid] for user, uuid in seen.items()}


# --- 3. spawns over quota are refused with a reason ----------------------------------------


def test_over_user_cap_the_form_says_why(hub):
    before = held(hub)
    assert before.get("alice/"), "needs alice's h100 server from the previous test"
    r = hub.spawn_form("alice", "second", fields={"profile": "h100-1g"})
    assert r.status_code == 403, r.text[:2000]  # the spawn page again, never a bare 500
    assert 'id="spawn_form"' in r.text
    message = error_message(r.text)
    # why (the cap, the team's name, what she holds) and what to do
    assert re.match(r"You may hold 1 GPU-equivalents? at once", message), message
    assert "team vision" in message and "H100 80 GB" in message, message
    assert "Stop one of your servers" in message, message
    # The form under the message is second's, as a GET of it is: JupyterHub re-renders its
    # user's default server's form on a refusal, where alice's own H100 is not counted ("1 of
    # 1 guaranteed left", "1 of 2 free"), contradicting the message above it.
    css, line = tier_lines(r.text)["h100-1g"]["vision"]
    assert css != "ok" and "per-user cap" in line, line
    assert (css, line) == tier_lines(spawn_page(hub, "alice", "second"))["h100-1g"]["vision"]
    assert "second" not in servers(hub, "alice")
    assert held(hub) == before


def test_over_team_borrowing_limit_form_and_api_say_why(hub):
    before = held(hub)
    assert len([d for d in before.values() if d and d[0] in WHOLE_UUIDS]) == 2, before
    # The form already shows h100 as refused for both of carol's teams.
    page = spawn_page(hub, "carol")
    lines = tier_lines(page)["h100"]
    assert lines["vision"][0] == "refused", lines
    assert "may borrow at most 1 " in lines["vision"][1], lines

    r = hub.spawn_form("carol", fields={"profile": "h100", "team": "vision"})
    assert r.status_code == 403, r.text[:2000]
    message = error_message(r.text)
    # why (the team, its use, guarantee and borrowing limit) and what to do
    assert message.startswith(
        "Team vision may borrow at most 1 H100 80 GB card beyond its guarantee of 1; it holds 2, "
        "1 of them borrowed."
    ), message
    assert "Stop one of the team's servers on H100 80 GB" in message, message
    assert servers(hub, "carol") == {}

    # The same refusal through the REST API: an error whose message is the refusal.
    r = api_spawn(hub, "carol", {"profile": "h100", "team": "vision"})
    assert r.status_code == 403, r.text
    assert r.json()["message"] == message
    assert servers(hub, "carol") == {}
    assert held(hub) == before


def test_rest_spawn_checks_the_project_as_the_form_does(hub):
    """The project becomes the gpu-gov/project label: the API must refuse what the form refuses."""
    r = hub.spawn_form("carol", fields={"profile": "h100-2g", "team": "nlp", "project": "a b!"})
    assert r.status_code == 403, r.text[:2000]
    refusal = error_message(r.text)
    assert refusal.startswith("Project 'a b!' cannot be used"), refusal

    r = api_spawn(hub, "carol", {"profile": "h100-2g", "team": "nlp", "project": "a b!"})
    assert r.status_code == 403, f"{r.status_code} {servers(hub, 'carol')}"
    assert r.json()["message"] == refusal


def test_task_type_and_expected_duration_are_granted_and_forged_labels_dropped(hub):
    """The owner picks a task type among those the tier allows and an expected duration within
    bounds; the grant (the spawner's state, which the governor reads) records them. A bad value
    is refused and starts nothing; labels sent in user_options are dropped."""
    before = held(hub)
    nlp = {"profile": "h100-2g", "team": "nlp"}
    r = hub.spawn_form("carol", fields={**nlp, "task_type": "inference"})
    assert r.status_code == 403, r.text[:2000]
    refusal = error_message(r.text)
    assert refusal.startswith("A H100 MIG 2g server may be for: interactive, batch;"), refusal
    r = api_spawn(hub, "carol", {**nlp, "task_type": "inference"})
    assert (r.status_code, r.json()["message"]) == (403, refusal)
    r = hub.spawn_form("carol", fields={**nlp, "expected_duration": "30d"})
    assert r.status_code == 403, r.text[:2000]
    assert "Expected duration '30d': give 1m to 7d (the hub's limit)" in error_message(r.text)
    assert servers(hub, "carol") == {} and held(hub) == before

    forged = {EXPECTED: "60", TASK_TYPE: "inference", "gpu-gov/exempt": "true"}
    choices = {**nlp, "task_type": "batch", "expected_duration": "2h"}
    r = api_spawn(hub, "carol", {**choices, **forged})
    assert r.status_code in (201, 202), r.text
    hub.wait_for_server("carol")
    grant = servers(hub, "carol")[""]["state"]["gpu_gov_grant"]
    assert (grant[TASK_TYPE], grant[EXPECTED]) == ("batch", "7200"), grant
    assert "gpu-gov/exempt" not in grant
    hub.stop_server("carol")

    # Not given: the tier's default task type, and no expected duration.
    r = api_spawn(hub, "carol", nlp)
    assert r.status_code in (201, 202), r.text
    hub.wait_for_server("carol")
    grant = servers(hub, "carol")[""]["state"]["gpu_gov_grant"]
    assert grant[TASK_TYPE] == "interactive" and EXPECTED not in grant, grant
    hub.stop_server("carol")
    assert held(hub) == before


def test_a_choice_too_large_to_keep_is_refused_and_not_kept(hub):
    """What the profile layer keeps of ``user_options`` the Hub sends in every listing of its
    users, and the governor lists them at each pass. Its choices were kept whole: an expected
    duration of "2h" and millions of spaces (read as 2h), or any ``profile-option-*`` key
    (KubeSpawner ignores one it does not offer), of any size and number. Measured on a hub
    with the governor: 60 MB of one user's options took its passes from 0.02 s to 1.2 s. A
    spawn naming such a choice is refused naming it, and none of it is kept."""
    nlp = {"profile": "h100-2g", "team": "nlp"}
    assert servers(hub, "carol") == {}
    for big in (
        {"expected_duration": "2h" + " " * 1_000_000},
        {"profile-option-image": "y" * 1_000_000},
        {"profile-option-" + "k" * 5000: "v"},
        {f"profile-option-o{i}": "v" for i in range(500)},
    ):
        r = api_spawn(hub, "carol", {**nlp, **big})
        assert r.status_code == 403, f"{r.status_code} {str(servers(hub, 'carol'))[:300]}"
        message = r.json()["message"]
        assert "choice" in message and "at most" in message, message
        assert servers(hub, "carol") == {}
        model = hub.api("GET", "users/carol", params={"include_stopped_servers": "1"}).json()
        kept = json.dumps(model["servers"][""]["user_options"])
        assert len(kept) < 2000, kept[:300]
    r = api_spawn(hub, "carol", {**nlp, "expected_duration": " 2h ", "profile-option-a": "b"})
    assert r.status_code in (201, 202), r.text  # usual choices are kept as before
    hub.wait_for_server("carol")
    assert servers(hub, "carol")[""]["user_options"]["profile-option-a"] == "b"
    hub.stop_server("carol")


def test_a_spawn_refused_before_admission_keeps_no_choice_too_large(hub):
    """The Hub saves a spawn's ``user_options`` as sent before anything of the spawn runs;
    admission, which keeps none too large, runs in the spawner's start. A spawn the admin's
    ``apply_user_options`` refused first (an image it does not offer: JupyterHub runs it before
    the start) kept a megabyte of choices, listed to the governor at every pass and in every
    listing of the Hub's users, for as long as the user liked (attack 33)."""
    nlp = {"profile": "h100-2g", "team": "nlp"}
    r = api_spawn(hub, "carol", {**nlp, "image": "mine", "profile-option-x": "y" * 1_000_000})
    assert r.status_code == 400 and "Unknown image" in r.json()["message"], r.text
    assert servers(hub, "carol") == {}
    model = hub.api("GET", "users/carol", params={"include_stopped_servers": "1"}).json()
    kept = model["servers"][""]["user_options"]
    assert "profile-option-x" not in kept and len(json.dumps(kept)) < 2000, str(kept)[:300]
    assert kept["image"] == "mine"  # the choices that fit stay, as the Hub keeps them
    # The admin's images start as before; a stop keeps what admission kept, every one of as
    # many choices as a spawn may make, and its grant's copy beside them.
    many = {f"profile-option-o{i}": "v" for i in range(60)}
    r = api_spawn(hub, "carol", {**nlp, "image": "torch", **many})
    assert r.status_code in (201, 202), r.text
    hub.wait_for_server("carol")
    admitted = servers(hub, "carol")[""]["user_options"]
    assert many.items() <= admitted.items() and admitted[TIER] == "h100-2g", sorted(admitted)
    hub.stop_server("carol")
    model = hub.api("GET", "users/carol", params={"include_stopped_servers": "1"}).json()
    assert model["servers"][""]["user_options"] == admitted


# --- 6. the memory estimate ----------------------------------------------------------------


def test_estimate_for_a_logged_in_user(hub):
    session = hub.login("alice")
    url = f"{hub.url}/hub/gpu-gov/estimate"
    r = session.get(
        url, params={"params": "7B", "precision": "bf16", "mode": "inference"}, timeout=30
    )
    assert r.status_code == 200, r.text
    body = r.json()
    estimate = estimate_memory("7B", "bf16", "inference")
    expected = smallest_tier(estimate, load_tiers(TIERS))
    assert expected is not None and expected.memory_gb >= estimate.gb
    assert body["tier"] == expected.name
    assert body["gb"] == pytest.approx(estimate.gb, abs=0.01)
    assert expected.display_name in body["message"]
    assert body["tier"] == "h100-3g"  # ~20 GB: half an H100, the smallest tier that holds it
    # With the team chosen on the form, only that team's tiers: vision has no half card.
    r = session.get(url, params={"params": "7B", "team": "vision"}, timeout=30)
    assert r.json()["tier"] == "h100", r.text

    r = session.get(url, params={"params": "lots", "precision": "bf16"}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["message"].startswith("params: 'lots'"), r.text
    # A count too large to compute with (an error page, 500, once) and a long one: a 400 that
    # names the parameter briefly.
    for huge in ("1e308", "9" * 5000, "precision"):
        query = (
            {"params": "7B", "precision": "x" * 5000} if huge == "precision" else {"params": huge}
        )
        r = session.get(url, params=query, timeout=30)
        assert r.status_code == 400, (huge[:10], r.status_code, r.text[:200])
        message = r.json()["message"]
        assert message.split(":")[0] in ("params", "precision") and len(message) < 300, message

    anonymous = requests.Session()
    anonymous.trust_env = False
    r = anonymous.get(url, params={"params": "7B"}, allow_redirects=False, timeout=30)
    assert r.status_code in (302, 403), r.status_code
    if r.status_code == 302:
        assert "/hub/login" in r.headers["Location"], r.headers["Location"]


def test_estimate_for_a_script_with_a_token(hub):
    """A script (or a notebook, with its server's token) asks the estimate with a Hub token,
    as every other API: it was sent to the login page (the route took only the login cookie).
    A token the Hub does not know is refused in JSON, not redirected."""
    url = f"{hub.url}/hub/gpu-gov/estimate"
    script = requests.Session()
    script.trust_env = False
    for token in (hub.token("alice"), hub.token("alice", scopes=["read:users:name!user"])):
        r = script.get(
            url,
            params={"params": "7B", "team": "vision"},
            headers={"Authorization": f"token {token}"},
            allow_redirects=False,
            timeout=30,
        )
        assert r.status_code == 200, (r.status_code, r.headers.get("Location"))
        assert r.json()["tier"] == "h100", r.text
    r = script.get(
        url,
        params={"params": "7B"},
        headers={"Authorization": "token not-a-token-the-hub-made"},
        allow_redirects=False,
        timeout=30,
    )
    assert r.status_code == 403, (r.status_code, r.headers.get("Location"))
    assert r.json() == {"tier": None, "message": "the token is not one the Hub accepts"}


# --- 4. concurrent spawns never exceed a quota ---------------------------------------------


def test_concurrent_spawns_never_exceed_the_quota(pool):
    barrier = threading.Barrier(len(LAB))
    answers: dict[str, requests.Response] = {}

    def spawn(user: str) -> None:
        with requests.Session() as session:
            session.trust_env = False
            barrier.wait()
            answers[user] = session.post(
                f"{pool.hub_api_url}/users/{user}/server",
                headers={"Authorization": f"token {pool.api_token}"},
                json={"profile": "h100"},
                timeout=60,
            )

    threads = [threading.Thread(target=spawn, args=(user,)) for user in LAB]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    codes = {user: r.status_code for user, r in answers.items()}
    admitted = [user for user, code in codes.items() if code in (201, 202)]
    refused = [user for user, code in codes.items() if code == 403]
    assert len(admitted) == 2 and len(refused) == 3, codes
    for user in refused:
        message = answers[user].json()["message"]
        assert re.match(r"Team lab may not borrow beyond .*; it holds 2\b", message), message

    for user in admitted:
        pool.wait_for_server(user)
    running = {user: servers(pool, user) for user in LAB}
    assert sorted(u for u, s in running.items() if s) == sorted(admitted), running
    assert all(running[u][""]["ready"] for u in admitted)
    devices = [running[u][""]["state"][DEVICES_STATE] for u in admitted]
    assert len({d[0] for d in devices}) == 2 and all(len(d) == 1 for d in devices), devices


# --- 5. a hub restart keeps allocations ----------------------------------------------------


def test_restart_keeps_allocations(pool):
    r = api_spawn(pool, "ops1", {"profile": "h100"})
    assert r.status_code in (201, 202), r.text
    pool.wait_for_server("ops1")
    mine = servers(pool, "ops1")[""]
    device = mine["state"][DEVICES_STATE]
    assert len(device) == 1 and device[0] in POOL_UUIDS
    assert visible_devices(pool, "ops1") == device[0]
    before = held(pool)

    pool.restart()

    after = servers(pool, "ops1")[""]
    assert after["ready"]
    assert after["state"][DEVICES_STATE] == device
    assert after["user_options"][TIER] == "h100" and after["user_options"][TEAM] == "ops"
    assert held(pool) == before
    # The same server process still answers, through the new proxy, with its device.
    pool.wait_for_server("ops1")
    assert visible_devices(pool, "ops1") == device[0]

    # A new spawn does not get the held device.
    r = api_spawn(pool, "ops2", {"profile": "h100"})
    assert r.status_code in (201, 202), r.text
    pool.wait_for_server("ops2")
    other = servers(pool, "ops2")[""]["state"][DEVICES_STATE]
    assert other and other[0] not in {d for ds in before.values() for d in ds}

    # Stopping the server frees its device: the next server takes it (the lowest free).
    pool.stop_server("ops1")
    assert "ops1/" not in held(pool)
    r = api_spawn(pool, "ops1", {"profile": "h100"})
    assert r.status_code in (201, 202), r.text
    pool.wait_for_server("ops1")
    assert servers(pool, "ops1")[""]["state"][DEVICES_STATE] == device
