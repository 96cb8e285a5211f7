"""``jupyterhub_config.py`` is Python, and admins set things anywhere in it: on a real hub whose
config sets, *after* ``add_governor(c)``, its own ``pre_spawn_hook``, the Hub's
``last_activity_interval`` and the spawners' ``environment`` (the "wrong" order), the governor
still has what it added. Before, each of those lines silently replaced it: the guard that
refuses oversized ``user_options`` was gone (the REST API kept any JSON again), the governor
was told JupyterHub's default activity interval (300 s: it judged warnings unread after 15
minutes of a Hub that gathers activity every 30), and servers had no governor URL (no report).
An admin's ``apply_user_options`` (JupyterHub 5.3 runs it before the hooks) that refused an
unknown image left the oversized choice kept: now cut where the Hub saves it, before any hook
(``tests/test_spawn_order_hub.py``: the hooks before it that refuse), the function sees only what
is kept, and the guard refuses the spawn naming the choice. So is a spawn an
``auth_state_hook`` refused before any of them, and an admin's ``post_stop_hook`` set after
the call still runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from governor_harness import Gov, governed_hub, service_pid, wait
from hub_harness import HubHarness, HubHarnessError

from jupyter_gpu_gov.hub.hubconfig import ACTIVITY_INTERVAL_ENV

pytestmark = pytest.mark.timeout(300)

# Appended after the harness's add_governor(c): every line replaces what it set.
LATE = """
def _late_hook(spawner):
    spawner.environment["LATE_HOOK"] = "ran"

c.Spawner.pre_spawn_hook = _late_hook


def _known_images_only(spawner, options):  # JupyterHub 5.3's place for them, before the hook
    from tornado import web

    if options.get("image", "usual") != "usual":
        raise web.HTTPError(400, "unknown image")


c.Spawner.apply_user_options = _known_images_only


def _no_spawns_for_olga(spawner, auth_state):  # runs before every hook and apply function
    if spawner.user.name == "olga":
        from tornado import web

        raise web.HTTPError(403, "olga may not start servers here")


c.Spawner.auth_state_hook = _no_spawns_for_olga


def _late_stop_hook(spawner):
    spawner.log.info("late post_stop_hook ran for %s", spawner.user.name)


c.Spawner.post_stop_hook = _late_stop_hook
c.JupyterHub.last_activity_interval = 1800
c.Spawner.environment = {**HARNESS_ENV, "LATE_ENV": "set"}
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with governed_hub(tmp_path_factory.mktemp("order"), hub_config=LATE) as hub:
        hub.create_user("govadmin")
        Gov(hub).wait_up()
        yield hub


def test_a_hook_set_after_add_governor_runs_after_its_guard(hub):
    hub.create_user("ursula")
    r = hub.api("POST", "users/ursula/server", json={"image": "y" * 100_000})
    assert r.status_code == 400, f"{r.status_code} {r.text[:300]}"
    assert "'image'" in r.json()["message"] and "at most" in r.json()["message"], r.text
    model = hub.api("GET", "users/ursula", params={"include_stopped_servers": "1"}).json()
    assert len(json.dumps(model["servers"].get("", {}).get("user_options"))) < 2000

    hub.start_server("ursula", options={"image": "usual"})
    kernel = hub.start_kernel("ursula")
    code = (
        "import os; print(os.environ.get('LATE_HOOK'), os.environ.get('LATE_ENV'),"
        " bool(os.environ.get('JUPYTER_GPU_GOV_URL')))"
    )
    # The admin's hook and environment, and the governor's URL: the server reports.
    assert hub.execute("ursula", kernel, code).strip() == "ran set True"
    gov = Gov(hub)
    wait(
        lambda: (gov.admin("GET", "users/ursula/server").json() or {}).get("gpu"),
        60,
        "a GPU report from ursula's server",
    )
    hub.stop_server("ursula")


def test_a_stop_hook_set_after_add_governor_runs_after_its_guard(hub):
    """The Hub saves a spawn's options as sent before any hook runs: a spawn the admin's
    auth_state_hook refused (before the pre_spawn_hook's guard) kept a megabyte of them. The
    stop of the failed spawn drops them, and then runs the admin's own post_stop_hook, set
    after add_governor (attack 33)."""
    hub.create_user("olga")
    r = hub.api("POST", "users/olga/server", json={"image": "y" * 1_000_000, "size": "s"})
    assert r.status_code == 403 and "olga may not" in r.json()["message"], r.text[:300]
    model = hub.api("GET", "users/olga", params={"include_stopped_servers": "1"}).json()
    assert model["servers"][""]["user_options"] == {"size": "s"}, str(model)[:300]
    wait(
        lambda: "late post_stop_hook ran for olga" in hub.log_path.read_text(),
        30,
        "the admin's own post_stop_hook",
    )


def test_the_activity_interval_set_after_add_governor_reaches_the_governor(hub):
    pid = service_pid(hub)
    assert pid is not None, "the governor service is not running"
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    passed = [e.decode() for e in environ if e.startswith(ACTIVITY_INTERVAL_ENV.encode() + b"=")]
    assert passed == [f"{ACTIVITY_INTERVAL_ENV}=1800"], passed


# The profile layer (no governor), with lines after add_gpu_profiles(c) that replace the Hub's
# handlers: the spawn form's estimate, the queue's pages and the API the governor syncs the line
# through were gone (404), the line never drained.
PROFILES = """
from jupyterhub.handlers import BaseHandler

from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = [{"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}]
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
c.GpuProfiles.tiers = [{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}]
c.GpuProfiles.quotas = {"lab": {"guaranteed": {"h100": 1}}}
c.GpuProfiles.default_team = "lab"
add_gpu_profiles(c, spawner="simple")


class _Hello(BaseHandler):
    def get(self):
        self.finish("hello")


c.JupyterHub.extra_handlers = [(r"/hello", _Hello)]
"""


def test_handlers_set_after_add_gpu_profiles_keep_its_own(tmp_path):
    with HubHarness(workdir=tmp_path / "hub", extra_config=PROFILES) as hub:
        assert hub.get(f"{hub.url}/hub/hello").text == "hello"  # the admin's
        r = hub.api("GET", "gpu-gov/queue")
        assert r.status_code == 200 and r.json()["line"] == [], r.text
        r = hub.login("alice").get(
            f"{hub.url}/hub/gpu-gov/estimate",
            params={"params": "7B", "precision": "bf16", "mode": "inference"},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["tier"] == "h100", r.text


def test_tiers_set_after_add_gpu_profiles_are_checked_at_start_up(tmp_path):
    late = PROFILES + 'c.GpuProfiles.tiers = [{"name": "h100", "gpu": "H100-80GB", "mig": 7}]\n'
    harness = HubHarness(workdir=tmp_path / "hub", extra_config=late, timeout=60)
    try:
        with pytest.raises(HubHarnessError) as refused:
            harness.start()
    finally:
        harness.stop()
    said = str(refused.value)
    assert "'mig' 7 is not a MIG profile of H100-80GB" in said, said[-3000:]
