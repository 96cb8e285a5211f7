"""Wiring the profile layer into a ``jupyterhub_config.py`` in one call, after the
``c.GpuProfiles.*`` settings::

    from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

    c.GpuProfiles.tiers = [...]
    c.GpuProfiles.quotas = {...}
    add_gpu_profiles(c, spawner="kubernetes")   # or "local", or "simple" (demos)

It checks the tiers and quotas now, so a mistake stops the hub at start-up with a message naming
the entry and the key, sets the spawner class, and adds the spawn form's memory estimate at
``/hub/gpu-gov/estimate`` and the spawn queue's pages and API (``queue_pages.py``). The checks,
templates and handlers are made again on the Hub's whole configuration once read: a line after
the call (``c.JupyterHub.extra_handlers = [...]``, new tiers) neither drops nor skips them.

On Kubernetes the Zero to JupyterHub chart has already set ``c.KubeSpawner.profile_list`` from
``singleuser.profileList`` when ``hub.extraConfig`` runs: the chart's default, ``[]``, is taken
as "GpuKubeSpawner's tiers"; an admin's own profiles are refused here, at start-up, with what to
do instead (the spawn form offers tiers, not profiles, so they could never be chosen).
"""

from __future__ import annotations

from pathlib import Path

from traitlets.config import LazyConfigValue

from ..core.config_order import listed
from ..hub_process import again_on_the_whole_config, bound_where_stored

TEMPLATES = Path(__file__).parent / "templates" / "hub"  # JupyterHub's pages, extended

SPAWNERS = {
    "kubernetes": "jupyter_gpu_gov.profiles.kubespawner.GpuKubeSpawner",
    "local": "jupyter_gpu_gov.profiles.local.GpuLocalProcessSpawner",
    "simple": "jupyter_gpu_gov.profiles.local.GpuSimpleLocalProcessSpawner",
}


def add_gpu_profiles(c, *, spawner: str = "local") -> None:
    """Add the profile layer to JupyterHub config ``c``."""
    from .config import GpuProfiles
    from .handlers import EstimateHandler
    from .left_pods import LeftPodsApiHandler
    from .queue_pages import (
        QueueApiHandler,
        QueueCancelHandler,
        QueueJoinHandler,
        QueuePageHandler,
    )

    if spawner not in SPAWNERS:
        raise ValueError(
            f"add_gpu_profiles: spawner must be one of {', '.join(SPAWNERS)}, got {spawner!r}"
        )
    server = r"([^/]+)(?:/([^/]+))?"  # user[/server name]
    handlers = [
        (r"/gpu-gov/estimate", EstimateHandler),
        (r"/gpu-gov/queue", QueuePageHandler),
        (rf"/gpu-gov/queue/cancel/{server}", QueueCancelHandler),
        (rf"/gpu-gov/queue/join/{server}", QueueJoinHandler),
        (r"/api/gpu-gov/queue", QueueApiHandler),
        (r"/api/gpu-gov/left-pods", LeftPodsApiHandler),
    ]

    def add(config) -> None:
        # Idempotent: run on ``c`` now, and again on the Hub's whole configuration (tiers or
        # a profile list set after the call are checked too).
        GpuProfiles(config=config).check()
        if spawner == "kubernetes":
            for section in ("KubeSpawner", "GpuKubeSpawner"):
                if "profile_list" in config[section]:
                    profiles = config[section].profile_list
                    if profiles != [] and not callable(profiles):
                        raise ValueError(profile_list_refusal(profiles, f"{section}.profile_list"))
        add_queue_templates(config)
        kept = config.JupyterHub.extra_handlers
        patterns = {h[0] for h in listed(kept) if isinstance(h, (list, tuple)) and h}
        kept.extend([h for h in handlers if h[0] not in patterns])

    add(c)
    # Once only: a spawner class set after the call is the admin's choice (a subclass of ours).
    c.JupyterHub.spawner_class = SPAWNERS[spawner]
    again_on_the_whole_config(add)
    # Admission bounds a spawn's user_options at start(): the Hub saved them before that, and
    # before an admin's own hooks that may refuse the spawn first.
    bound_where_stored()


def team_guarantees(c) -> dict[str, float]:
    """GPU-equivalents each team of ``c.GpuProfiles.quotas`` is guaranteed (a guaranteed server
    of a tier counts its weight: a pair 2, a quarter of an L4 0.25), as the governor's
    ``c.GpuGovernor.team_quotas`` shows them on My GPU usage:
    ``add_governor(c, team_quotas=team_guarantees(c))``, after the tiers and quotas are set."""
    from .config import GpuProfiles

    profiles = GpuProfiles(config=c)  # the profile layer's own reading, its checks included
    tiers = profiles.tier_map
    return {
        team: round(
            sum(n // tiers[t].count * tiers[t].weight for t, n in quota.guaranteed.items()), 4
        )
        for team, quota in profiles.quota_map.items()
    }


def add_queue_templates(c) -> None:
    """JupyterHub's home and "not running" pages, extended to show the owner's servers waiting
    in line (``templates/hub/``). Added after any ``template_paths`` already set (an admin's,
    z2jh's ``hub.templatePaths``): an admin's own ``home.html`` wins, and can show the line with
    ``{% import "gpu_gov_queue.html" as gpu_gov with context %}{{ gpu_gov.waiting(gpu_gov_waiting)
    }}``. ``template_vars`` keeps what is set, plus ``gpu_gov_waiting``."""
    from .queue_pages import places

    # A lazy .append() (list() of it stopped the Hub) would go after JupyterHub's own
    # templates, the default it is merged onto, which then win: ours go before them.
    paths = listed(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    if str(TEMPLATES) not in paths:
        c.JupyterHub.template_paths = [*paths, str(TEMPLATES)]
    variables = c.JupyterHub.template_vars if "template_vars" in c.JupyterHub else {}
    if isinstance(variables, LazyConfigValue):  # .update() so far (dict() of it stopped the Hub)
        variables.update({"gpu_gov_waiting": places})
    else:
        c.JupyterHub.template_vars = {**variables, "gpu_gov_waiting": places}


def profile_list_refusal(profiles, source: str) -> str:
    """Why an admin's own profile list cannot stand beside the GPU tiers, and what to do."""
    slugs = [p.get("slug") or p.get("display_name") for p in profiles if isinstance(p, dict)]
    named = f" ({', '.join(map(repr, slugs[:5]))})" if slugs else ""
    return (
        f"{source} has {len(profiles) if isinstance(profiles, list) else 'a'} profile(s) of its "
        f"own{named}, set in z2jh by singleuser.profileList. GpuKubeSpawner builds the profile "
        "list from c.GpuProfiles.tiers and its spawn form offers those tiers, so these could "
        "never be chosen: leave singleuser.profileList empty ([], the chart's default), and move "
        "each profile's kubespawner_override into a tier's 'kubespawner_override' (GPU) or into "
        "singleuser settings (CPU-only servers, the 'No GPU' choice)."
    )
