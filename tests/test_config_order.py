"""What ``add_governor`` adds holds whatever ``jupyterhub_config.py`` sets after it, in every
JupyterHub that loads the file: the Hub starting up, and the Hub of its own that
``jupyterhub token <user>`` and ``jupyterhub upgrade-db`` load it into (not the singleton).
``token`` goes on to load the roles into the running Hub's database, deleting those no longer
configured: the governor's, where a later line set ``load_roles``."""

from __future__ import annotations

import pytest
from traitlets.config import Application

from jupyter_gpu_gov.hub.hubconfig import ACTIVITY_INTERVAL_ENV

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
