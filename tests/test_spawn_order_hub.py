"""JupyterHub saves a spawn's ``user_options`` on the spawner's row before any hook runs
(``User.spawn``: the row, then the Authenticator's ``pre_spawn_start``, the ``auth_state_hook``,
the ``apply_user_options`` of JupyterHub 5.3 and the ``pre_spawn_hook``), and JupyterHub 6
saves them with no spawn at all (``PUT`` and ``PATCH`` of a named server). On real hubs whose
admin refuses a spawn in a hook that runs before the guard (``add_governor``'s, or the profile
layer's admission at ``start()``), a user's oversized choice was kept in the Hub's database:
100 kB a request here, any JSON up to the Hub's 100 MB body limit, sent back in every listing
of stopped servers (the admin page) and spawned with by the next start without options. Now
nothing larger than ``core.grant.oversized`` keeps reaches the row, whatever refuses the
spawn, and the spawn that sent it is still refused naming the choice."""

from __future__ import annotations

import json
import sqlite3

import jupyterhub
import pytest
from governor_harness import governed_hub
from hub_harness import HubHarness

pytestmark = pytest.mark.timeout(300)

BIG = "y" * 100_000

# The admin's own refusals, in each hook JupyterHub runs before the pre_spawn_hook.
REFUSING = """
from jupyterhub.auth import DummyAuthenticator
from tornado import web


class _Refusing(DummyAuthenticator):
    def pre_spawn_start(self, user, spawner):
        if user.name.startswith("closed-"):
            raise web.HTTPError(403, "this account may not start servers")


c.JupyterHub.authenticator_class = _Refusing


def _auth_state_hook(spawner, auth_state):
    if spawner.user.name.startswith("held-"):
        raise web.HTTPError(403, "held by the identity provider")


c.Spawner.auth_state_hook = _auth_state_hook
"""

# JupyterHub 5.3's declarative form: a choice sets a trait, and a value the trait refuses is
# a 400 (Invalid user options) before the pre_spawn_hook. (Older hubs ignore the setting.)
DICT_FORM = """
c.Spawner.apply_user_options = {"mem": "mem_limit"}
c.JupyterHub.allow_named_servers = True
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with governed_hub(
        tmp_path_factory.mktemp("spawn-order"), hub_config=REFUSING + DICT_FORM
    ) as hub:
        yield hub


def stored(hub: HubHarness, user: str, name: str = "") -> dict | None:
    """The ``user_options`` on the spawner's row in the Hub's database, as saved."""
    path = hub.workdir / "jupyterhub.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT s.user_options FROM spawners s JOIN users u ON u.id = s.user_id"
            " WHERE u.name = ? AND s.name = ?",
            (user, name),
        ).fetchone()
    return None if row is None or row[0] is None else json.loads(row[0])


def listed(hub: HubHarness, user: str, name: str = "") -> dict:
    """The ``user_options`` the Hub's REST API lists for the server (stopped ones too)."""
    model = hub.api("GET", f"users/{user}", params={"include_stopped_servers": "1"}).json()
    return model["servers"][name]["user_options"]


def assert_nothing_oversized(
    hub: HubHarness, user: str, name: str = "", kept: tuple[str, str] = ("image", "usual")
) -> None:
    row = stored(hub, user, name)
    assert row is not None and len(json.dumps(row)) < 2000, f"{len(json.dumps(row)):,} chars kept"
    assert row.get(kept[0]) == kept[1], row  # what may be kept, is
    shown = listed(hub, user, name)
    assert len(json.dumps(shown)) < 2000, f"{len(json.dumps(shown)):,} chars listed"


@pytest.mark.parametrize(
    ("user", "refusal"),
    [
        ("closed-pat", "this account may not start servers"),  # Authenticator.pre_spawn_start
        ("held-hana", "held by the identity provider"),  # Spawner.auth_state_hook
    ],
)
def test_a_spawn_refused_before_the_guard_keeps_no_oversized_choice(hub, user, refusal):
    hub.create_user(user)
    r = hub.api("POST", f"users/{user}/server", json={"image": "usual", "note": BIG})
    assert r.status_code == 403 and refusal in r.text, f"{r.status_code} {r.text[:300]}"
    assert_nothing_oversized(hub, user)


def test_an_apply_user_options_dict_that_refuses_a_value_keeps_no_oversized_choice(hub):
    hub.create_user("dora")
    r = hub.api("POST", "users/dora/server", json={"image": "usual", "mem": BIG})
    # Refused naming the choice: it never reached the admin's trait ("Invalid user options").
    said = r.json()["message"]
    assert r.status_code == 400 and "'mem'" in said and "at most" in said, f"{r.status_code} {said}"
    assert_nothing_oversized(hub, "dora")


@pytest.mark.skipif(jupyterhub.version_info < (6,), reason="PUT and PATCH of a server: 6.0")
def test_options_saved_without_a_spawn_are_bounded_too(hub):
    hub.create_user("petra")
    r = hub.api(
        "PUT", "users/petra/servers/nb", json={"user_options": {"image": "usual", "a": BIG}}
    )
    assert r.status_code == 201, f"{r.status_code} {r.text[:300]}"
    assert_nothing_oversized(hub, "petra", "nb")
    r = hub.api(
        "PATCH", "users/petra/servers/nb", json={"user_options": {"image": "usual", "b": BIG}}
    )
    assert r.status_code == 200, f"{r.status_code} {r.text[:300]}"
    assert_nothing_oversized(hub, "petra", "nb")


# The profile layer alone (no governor): its admission, at start(), bounds the options and
# refuses the spawn; an Authenticator's refusal comes before it.
PROFILES = """
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = [{"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}]
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
c.GpuProfiles.tiers = [{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}]
c.GpuProfiles.quotas = {"lab": {"guaranteed": {"h100": 1}}}
c.GpuProfiles.default_team = "lab"
add_gpu_profiles(c, spawner="simple")
"""


def test_the_profile_layer_keeps_no_oversized_choice_of_a_spawn_refused_before_admission(
    tmp_path,
):
    with HubHarness(workdir=tmp_path / "hub", extra_config=PROFILES + REFUSING) as hub:
        hub.create_user("closed-omar")
        options = {"profile": "h100", "team": "lab", "profile-option-image": BIG}
        r = hub.api("POST", "users/closed-omar/server", json=options)
        assert r.status_code == 403 and "may not start" in r.text, f"{r.status_code} {r.text[:300]}"
        assert_nothing_oversized(hub, "closed-omar", kept=("team", "lab"))
        # Admission still refuses the choice, naming it, where nothing refused before.
        hub.create_user("olga")
        r = hub.api("POST", "users/olga/server", json=options)
        said = r.json()["message"]
        assert r.status_code == 403 and "'profile-option-image'" in said, f"{r.status_code} {said}"
        assert_nothing_oversized(hub, "olga", kept=("team", "lab"))
        # A profile refused stays on the row as the Hub saved it, and gains nothing: a start
        # that sends no options (the Hub's default: the last ones) is checked again.
        r = hub.api("POST", "users/olga/server", json={"profile": "a100", "team": "lab"})
        assert r.status_code == 403 and "no GPU tier 'a100'" in r.text, r.text[:300]
        assert stored(hub, "olga") == {"profile": "a100", "team": "lab"}
        r = hub.api("POST", "users/olga/server")
        assert r.status_code == 403 and "no GPU tier 'a100'" in r.text, r.text[:300]
