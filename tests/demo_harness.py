"""The demo's own configuration (``hub_config/``: the shared-password login, GPU tiers and
quotas, the spawn form, the governor and its policies) on a real hub, with this test's free
ports and directory, and the governor's timers cut from minutes to seconds by the test's own
governor settings: what a person does in ``make demo``, walked by a test
(tests/test_quickstart_browser.py, tests/test_demo_queue_hub.py)."""

from __future__ import annotations

from pathlib import Path

from governor_harness import free_port
from hub_harness import REPO, HubHarness

DEMO = REPO / "hub_config"
PASSWORD = "gpu-gov-demo"
ADMIN_PASSWORD = "gpu-gov-demo-admin-only-on-localhost"

# The demo's hub configuration on this harness's ports, state in its directory.
HUB_CONFIG = """
_harness = {{
    "bind_url": c.JupyterHub.bind_url,
    "hub_port": c.JupyterHub.hub_port,
    "db_url": c.JupyterHub.db_url,
    "cookie_secret_file": c.JupyterHub.cookie_secret_file,
}}
_proxy_api, _proxy_pid = c.ConfigurableHTTPProxy.api_url, c.ConfigurableHTTPProxy.pid_file
_services, _roles = list(c.JupyterHub.services), list(c.JupyterHub.load_roles)
c.JupyterHub.services, c.JupyterHub.load_roles = [], []
load_subconfig({demo_hub!r})
for _key, _value in _harness.items():
    setattr(c.JupyterHub, _key, _value)
c.ConfigurableHTTPProxy.api_url, c.ConfigurableHTTPProxy.pid_file = _proxy_api, _proxy_pid
c.SimpleLocalProcessSpawner.home_dir_template = HARNESS_DIR + "/home/{{username}}"
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
(_governor,) = c.JupyterHub.services
_governor["url"] = "http://127.0.0.1:{gov_port}"
_governor["command"] = [
    arg if not arg.startswith("--config=") else "--config={gov_config}"
    for arg in _governor["command"]
]
_governor["environment"]["JUPYTER_GPU_GOV_PROXY_URL"] = c.JupyterHub.bind_url
c.JupyterHub.services = _services + [_governor]
c.JupyterHub.load_roles = _roles + list(c.JupyterHub.load_roles)
c.Spawner.environment.update(
    {{k: v for k, v in HARNESS_ENV.items() if k != "JUPYTER_CONFIG_PATH"}},
    JUPYTER_GPU_GOV_URL="http://127.0.0.1:{gov_port}/services/gpu-gov/",
)
"""


def demo_hub(workdir: Path, governor_config: str, timeout: float = 180) -> HubHarness:
    """A :class:`HubHarness` (not started) running the demo's hub config, its governor loading
    the demo's governor config then ``governor_config`` (Python: the test's timers)."""
    gov_port = free_port()
    gov_config = workdir / "gpu_gov_config.py"
    gov_config.write_text(
        f"load_subconfig({str(DEMO / 'gpu_gov_config.py')!r})\n"
        f'c.GpuGovernor.db_url = "sqlite:///{workdir / "gpu-gov.sqlite"}"\n' + governor_config
    )
    extra = HUB_CONFIG.format(
        demo_hub=str(DEMO / "jupyterhub_config.py"),
        gov_port=gov_port,
        gov_config=gov_config,
    )
    return HubHarness(workdir=workdir / "hub", extra_config=extra, timeout=timeout)
