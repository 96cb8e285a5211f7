# Demo hub for jupyter-gpu-gov: a real JupyterHub on one machine with simulated GPUs.
# Run it with `make demo` (from the repository root), then open http://127.0.0.1:8000.
#
# Choices, in short:
# - Listens on 127.0.0.1:8000 only; all state (SQLite db, cookie secret, proxy pid, user homes,
#   simulated GPU state) lives under .demo/ in the repository root (gitignored), so
#   `make clean` resets the demo.
# - configurable-http-proxy comes from ./node_modules/.bin (`make node_modules`), not from PATH.
# - SimpleLocalProcessSpawner: users need no Unix account and the spawner never switches users;
#   we run as root, so single-user servers get --allow-root. Each user's home is
#   .demo/home/<user>. Never use this spawner outside a demo: users are not isolated.
# - Login: SharedPasswordAuthenticator. Any username with the password "gpu-gov-demo";
#   the admin user "admin" logs in with "gpu-gov-demo-admin-only-on-localhost" (JupyterHub
#   requires >= 32 characters for an admin password). DummyAuthenticator.password is
#   deprecated since JupyterHub 5.3. "lena" (same password) is team vision's lead (below).
# - Single-user servers load the jupyter_gpu_gov server extension (auto-enabled on install) with
#   the simulated backend, chosen per server via $JUPYTER_GPU_GOV_BACKEND, and one shared state
#   file for the whole machine, like the GPUs of a real workstation. The GpuGovApp settings
#   (simulated devices, sample interval) are in hub_config/singleuser/jupyter_server_config.py,
#   which the servers find through $JUPYTER_CONFIG_PATH.
import json
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

REPO = Path(__file__).resolve().parent.parent
STATE = REPO / ".demo"
STATE.mkdir(exist_ok=True)
VENV_BIN = Path(sys.executable).parent  # the interpreter running the hub (.venv/bin)

# --- hub, proxy, database ---------------------------------------------------------------------
c.JupyterHub.bind_url = "http://127.0.0.1:8000"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.command = [str(REPO / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")

# --- login ------------------------------------------------------------------------------------
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = "gpu-gov-demo"
c.SharedPasswordAuthenticator.admin_users = {"admin"}
c.SharedPasswordAuthenticator.admin_password = "gpu-gov-demo-admin-only-on-localhost"
c.Authenticator.allow_all = True  # any username may log in with the demo password

# --- single-user servers ----------------------------------------------------------------------
c.JupyterHub.allow_named_servers = True  # e.g. a second server, to see the per-user cap
c.SimpleLocalProcessSpawner.home_dir_template = str(STATE / "home" / "{username}")
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.args = ["--allow-root"]
c.Spawner.default_url = "/lab"
c.Spawner.environment = {
    "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    "JUPYTER_CONFIG_PATH": str(REPO / "hub_config" / "singleuser"),
    "JUPYTER_GPU_GOV_BACKEND": "simulated",
    "JUPYTER_GPU_GOV_SIM_STATE": str(STATE / "sim-gpus.json"),
}

# --- GPU tiers, team quotas, the spawn form and the device allocator (jupyter_gpu_gov.profiles)
# The hub hands each server free simulated devices (hub_config/demo_gpus.json: two whole H100s and
# one H100 in MIG slices) through CUDA_VISIBLE_DEVICES. Try: alice (team vision) starts an H100,
# then a second server: her per-user cap refuses it, and the spawn page says why. The queue
# (README step 7): alice and bob each start an H100; erin's spawn form then offers "Wait in line"
# for the H100, with her place and an estimate; when the governor culls bob's idle borrowed
# server (hub_config/gpu_gov_config.py: 90 s), erin's starts by itself.
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles  # noqa: E402

c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = json.loads((REPO / "hub_config" / "demo_gpus.json").read_text())
c.LocalGpus.sim_state_path = str(STATE / "sim-gpus.json")
c.GpuProfiles.tiers = [
    {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB", "max_age": "8h"},
    {
        "name": "h100-3g",
        "display_name": "Half an H100 (MIG 3g.40gb)",
        "gpu": "H100-80GB",
        "mig": "3g.40gb",
    },
    {"name": "h100-2g", "display_name": "H100 MIG 2g.20gb", "gpu": "H100-80GB", "mig": "2g.20gb"},
    {
        "name": "h100-1g",
        "display_name": "Small H100 slice (MIG 1g.10gb)",
        "gpu": "H100-80GB",
        "mig": "1g.10gb",
        "description": "For notebooks that try things out on small models.",
    },
]
c.GpuProfiles.quotas = {
    # vision: one card and one small slice guaranteed, may borrow one more card; 1 GPU per person.
    "vision": {
        "guaranteed": {"h100": 1, "h100-1g": 1},
        "borrowing_limit": {"h100": 1},
        "user_cap": 1,
    },
    # nlp: the larger slices; may borrow anything left over.
    "nlp": {"guaranteed": {"h100-3g": 1, "h100-2g": 1, "h100-1g": 1}, "tiers": "*", "priority": 10},
    # everyone else: may borrow a small slice or a card when the teams leave one free.
    "guests": {"tiers": ["h100", "h100-1g"], "user_cap": 1},
}
c.GpuProfiles.default_team = "guests"
c.GpuProfiles.team_map = {"alice": "vision", "bob": "nlp", "carol": ["vision", "nlp"]}
c.GpuProfiles.projects = {"vision": ["segmentation", "detection"], "nlp": ["summaries"]}
add_gpu_profiles(c, spawner="simple")

# --- GPU governor hub service (jupyter_gpu_gov.hub) -------------------------------------------
# A managed service with least-privilege roles (see jupyter_gpu_gov/hub/hubconfig.py). Its
# policies (short demo timers) are in hub_config/gpu_gov_config.py. Servers report with their
# own token; the user "admin" gets the governor's admin scope.
from jupyter_gpu_gov.hub.hubconfig import add_governor  # noqa: E402
from jupyter_gpu_gov.profiles.estimate import tier_sizes  # noqa: E402
from jupyter_gpu_gov.profiles.hubconfig import team_guarantees  # noqa: E402

add_governor(
    c,
    url="http://127.0.0.1:10101",
    args=[f"--config={REPO / 'hub_config' / 'gpu_gov_config.py'}"],
    admin_users=["admin"],
    tiers=tier_sizes(c.GpuProfiles.tiers),  # right-sizing hints name the tiers offered here
    team_quotas=team_guarantees(c),  # "My GPU usage": the guarantees of c.GpuProfiles.quotas
)
# A team lead: lena reads team vision's showback (the page, its CSV and JSON) and acts on no one's
# server. The governor's scope, filtered to the group vision: a group that names no team stands
# for the team of its name (vision, from team_map). README step 6; docs/api.md, "Team leads".
c.JupyterHub.load_roles.append(
    {"name": "vision-leads", "users": ["lena"], "scopes": ["custom:gpu-gov:showback!group=vision"]}
)
