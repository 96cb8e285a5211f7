"""Wiring the profile layer into a ``jupyterhub_config.py`` in one call, after the
``c.GpuProfiles.*`` settings::

    from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

    c.GpuProfiles.tiers = [...]
    c.GpuProfiles.quotas = {...}
    add_gpu_profiles(c, spawner="kubernetes")   # or "local", or "simple" (demos)

It checks the tiers and quotas now, so a mistake stops the hub at start-up with a message naming
the entry and the key, sets the spawner class, and adds the spawn form's memory estimate at
``/hub/gpu-gov/estimate``.
"""

from __future__ import annotations

SPAWNERS = {
    "kubernetes": "jupyter_gpu_gov.profiles.kubespawner.GpuKubeSpawner",
    "local": "jupyter_gpu_gov.profiles.local.GpuLocalProcessSpawner",
    "simple": "jupyter_gpu_gov.profiles.local.GpuSimpleLocalProcessSpawner",
}


def add_gpu_profiles(c, *, spawner: str = "local") -> None:
    """Add the profile layer to JupyterHub config ``c``."""
    from .config import GpuProfiles
    from .handlers import EstimateHandler

    if spawner not in SPAWNERS:
        raise ValueError(
            f"add_gpu_profiles: spawner must be one of {', '.join(SPAWNERS)}, got {spawner!r}"
        )
    GpuProfiles(config=c).check()
    c.JupyterHub.spawner_class = SPAWNERS[spawner]
    c.JupyterHub.extra_handlers.append((r"/gpu-gov/estimate", EstimateHandler))
