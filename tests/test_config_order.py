"""What ``add_governor`` adds holds whatever ``jupyterhub_config.py`` sets after it, in every
JupyterHub that loads the file: the Hub starting up, and the Hub of its own that
``jupyterhub token <user>`` and ``jupyterhub upgrade-db`` load it into (not the singleton).
``token`` goes on to load the roles into the running Hub's database, deleting those no longer
configured: the governor's, where a later line set ``load_roles``."""

from __future__ import annotations

import pytest
from traitlets.config import Application

from jupyter_gpu_gov import hub_process
from jupyter_gpu_gov.hub.hubconfig import ACTIVITY_INTERVAL_ENV
from jupyter_gpu_gov.hub_process import bound_where_stored, cut_where_stored

jupyterhub_app = pytest.importorskip("jupyterhub.app")

CONFIG = """
from jupyter_gpu_gov.hub.hubconfig import add_governor

c = get_config()
add_governor(c, admin_users=["alice"])
# Set after the call: each line replaced what it added.
c.JupyterHub.load_roles = [{"name": "mine", "users": ["bob"], "scopes": ["self"]}]
c.JupyterHub.services = []
c.JupyterHub.last_activity_interval = 1800
# The admin's own URL for the servers' reports (a port of their own), set after the call: kept.
c.Spawner.environment.update({"JUPYTER_GPU_GOV_URL": "http://127.0.0.1:8999/services/gpu-gov/"})
"""


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "jupyterhub_config.py"
    path.write_text(CONFIG)
    return path


def _roles(app) -> list[str]:
    return [r["name"] for r in app.load_roles]


def test_a_hub_that_a_subcommand_makes_keeps_the_governors_roles(config_file):
    # As NewToken.start and UpgradeDB.start do: JupyterHub(parent=self), not the singleton.
    assert not jupyterhub_app.JupyterHub.initialized()
    for _ in range(2):  # a second Hub loading the same file: nothing doubled, nothing left
        hub = jupyterhub_app.JupyterHub()
        hub.load_config_file(str(config_file))
        assert _roles(hub) == ["mine", "gpu-gov-service", "gpu-gov-admins", "user"]
        [service] = hub.services
        assert service["environment"][ACTIVITY_INTERVAL_ENV] == "1800"
        url = hub.config.Spawner.environment.get_value({})["JUPYTER_GPU_GOV_URL"]
        assert url == "http://127.0.0.1:8999/services/gpu-gov/"
        assert "update_config" not in vars(hub)  # the wrapper went with its one call


def test_an_application_that_is_no_hub_gets_the_file_as_written(config_file):
    # The governor (or any traitlets app) loading the same file: no Hub's config to add to.
    class Other(Application):
        pass

    other = Other()
    other.load_config_file(str(config_file))
    assert other.config.JupyterHub.load_roles == [
        {"name": "mine", "users": ["bob"], "scopes": ["self"]}
    ]
    assert other.config.JupyterHub.services == []


@pytest.fixture
def bound():
    from jupyterhub import orm
    from sqlalchemy import event

    bound_where_stored()
    bound_where_stored()  # once only, however often it is called
    yield orm
    # Not left to the rest of this process's tests.
    event.remove(orm.Spawner.user_options, "set", hub_process._bounded)
    assert not event.contains(orm.Spawner.user_options, "set", hub_process._bounded)


def test_options_are_cut_where_the_hub_stores_them(bound):
    # JupyterHub stores a spawn's user_options on the spawner's row before any hook runs.
    orm = bound
    db = orm.new_session_factory("sqlite:///:memory:")()
    user = orm.User(name="ursula")
    row = orm.Spawner(user=user, name="", server=orm.Server())
    db.add_all([user, row])
    db.commit()
    sent = {"image": "usual", "note": "y" * 1025}
    row.user_options = sent
    db.commit()
    # Cut in place: the Hub hands the same dict to the spawner, whose options it lists.
    assert row.user_options is sent and sent == {"image": "usual"}
    assert "'note' is 1,025 characters long" in cut_where_stored(row)
    db.expire_all()
    assert row.user_options == {"image": "usual"}  # as saved
    # The spawn under way is refused for it; a later one (its own server) is not.
    row.server = orm.Server()
    db.commit()
    assert cut_where_stored(row) is None
    row.user_options = {"image": "usual"}
    assert cut_where_stored(row) is None


PROFILES = """
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c = get_config()
c.GpuProfiles.tiers = [{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}]
c.GpuProfiles.quotas = {"lab": {"guaranteed": {"h100": 1}}}
# Lazy (traitlets keeps .update and .append until the Hub loads them), before the call:
# list() of them was a TypeError that stopped the Hub's start.
c.JupyterHub.template_vars.update({"org": "Ex"})
c.JupyterHub.template_paths.append("/srv/own-templates")
add_gpu_profiles(c, spawner="simple")
c.JupyterHub.template_vars.update({"after": 1})  # after it: the dict the call left
"""


def test_lazy_template_settings_keep_the_queue_templates(tmp_path):
    from jupyter_gpu_gov.profiles.hubconfig import TEMPLATES

    path = tmp_path / "jupyterhub_config.py"
    path.write_text(PROFILES)
    hub = jupyterhub_app.JupyterHub()
    hub.load_config_file(str(path))
    assert sorted(hub.template_vars) == ["after", "gpu_gov_waiting", "org"]
    assert hub.template_vars["gpu_gov_waiting"](None) == {}
    # The admin's first, then ours, before JupyterHub's own (which it adds back last).
    assert hub.template_paths == ["/srv/own-templates", str(TEMPLATES)]
