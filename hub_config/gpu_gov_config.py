# The GPU governor's settings for the demo hub: short timers so a demo user sees an idle kernel
# go warned → checkpointed → culled within minutes. A real hub uses hours (the defaults).
from pathlib import Path

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

STATE = Path(__file__).resolve().parent.parent / ".demo"

c.GpuGovernor.db_url = f"sqlite:///{STATE / 'gpu-gov.sqlite'}"
c.GpuGovernor.cull_every = 5  # seconds between reconcile passes
c.GpuGovernor.timeout = 3600  # servers without GPU reports: jupyterhub-idle-culler's rule
c.GpuGovernor.report_stale_after = 60
c.GpuGovernor.team_map = {"alice": "vision", "bob": "nlp"}
c.GpuGovernor.policy_defaults = {
    "warn_after": "1m",
    "cull_after": "3m",
    "user_activity_grace": "1m",
    "extension_step": "2m",
    "max_extensions": 2,
    "checkpoint_timeout": "1m",
    "reclaim_grace": "1m",  # a borrowed GPU asked back by a team within its guarantee
}
# Root causes: an idle kernel nobody has touched for a minute is a zombie (real hubs: 30 minutes),
# so the warning a demo user sees says why and what to do.
c.GpuGovernor.diagnose_zombie_idle = 60
c.GpuGovernor.policies = [
    # Borrowed GPUs (beyond a team's guarantee) are given back sooner.
    {
        "name": "borrowed",
        "match": {"labels": {"gpu-gov/borrowed": "true"}},
        "warn_after": "30s",
        "cull_after": "90s",
    },
]

# GPU health: a server whose GPU state stays unknown (or failed: try `simulate.fail(xid=79)` in a
# notebook) is flagged on the dashboard after 2 minutes (real hubs: 30).
c.GpuGovernor.gpu_unknown_alert_after = 120

# Showback: what a GPU-equivalent hour costs per tier (the dashboard's idle cost by team). Each
# team's guarantee on "My GPU usage" comes from the spawn-time quotas in jupyterhub_config.py
# (add_governor's team_quotas).
c.GpuGovernor.currency = "EUR"
c.GpuGovernor.gpu_hour_cost = {"h100": 2.5, "h100-3g": 1.25, "h100-2g": 0.75, "h100-1g": 0.4}
