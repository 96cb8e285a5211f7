"""KubeSpawner glue: GPU tiers as KubeSpawner profiles, admission at spawn, ownership labels.

``GpuKubeSpawner`` is KubeSpawner with the profile layer mixed in:

- ``profile_list`` is a callable returning only the tiers offered to the user's teams, each with
  what its team has left in the description, and each carrying the tier's resource limit, node
  selector, node affinity and tolerations as its ``kubespawner_override``;
- the spawn form is the profile layer's (tiers, team, project, the memory estimate);
- ``start()`` admits the server against a fresh count before KubeSpawner creates the pod;
- the pod carries the ownership labels (``gpu-gov/user``, ``team``, ``project``, ``tier``,
  ``borrowed``, ``max-age``) that dcgm-exporter's pod-label feature and the governor read, with
  the raw values in annotations of the same names.

Use it with ``c.JupyterHub.spawner_class = "jupyter_gpu_gov.profiles.kubespawner.GpuKubeSpawner"``
(``add_gpu_profiles(c, spawner="kubernetes")`` does that).
"""

from __future__ import annotations

from typing import Any

from kubespawner import KubeSpawner
from kubespawner.slugs import is_valid_label, safe_slug
from traitlets import default

from .config import LABEL_PREFIX
from .quota import tier_use
from .spawner import NO_GPU, GpuProfilesMixin
from .tiers import Tier

OWNER = f"{LABEL_PREFIX}user"


def tier_override(tier: Tier) -> dict[str, Any]:
    """What a tier sets on KubeSpawner (the admin's own ``kubespawner_override`` last)."""
    override: dict[str, Any] = {
        # Extended resources are requested by their limit (the request defaults to it).
        "extra_resource_limits": {tier.resource: str(tier.count)},
        "node_selector": dict(tier.node_selector),
        "tolerations": [dict(t) for t in tier.tolerations],
    }
    if tier.node_affinity:
        override["node_affinity_required"] = [
            {"matchExpressions": [dict(e) for e in tier.node_affinity]}
        ]
    override.update(tier.kubespawner_override)
    return override


async def gpu_profile_list(spawner: GpuKubeSpawner) -> list[dict[str, Any]]:
    """KubeSpawner's ``profile_list``: the tiers offered to the user's teams, with what is left."""
    conf = spawner.gpu_profiles
    teams = await spawner.gpu_teams()
    usage = spawner.gpu_usage()
    capacity = spawner.gpu_capacity(usage)
    descriptions: dict[str, list[str]] = {}
    for team in teams:
        for use in tier_use(
            spawner.user.name,
            team,
            usage,
            capacity,
            conf.quota_map,
            conf.tier_map,
            server=spawner._gpu_server_key(),
        ):
            admission = use.admission
            state = (
                "would borrow"
                if admission.borrowed
                else f"{use.guaranteed_left} of {use.guaranteed} guaranteed left"
                if admission.allowed
                else "not now"
            )
            descriptions.setdefault(use.tier, []).append(f"{team}: {state}")
    profiles = [
        {
            "display_name": tier.display_name,
            "slug": tier.name,
            "description": " · ".join([tier.summary, *descriptions[tier.name]]),
            "kubespawner_override": tier_override(tier),
        }
        for tier in conf.tier_map.values()
        if tier.name in descriptions
    ]
    if conf.allow_no_gpu:
        # The default: a server started without a choice (e.g. through the REST API) gets no GPU,
        # which is also what admission assumes.
        profiles.append(
            {
                "display_name": "No GPU",
                "slug": NO_GPU,
                "description": "CPU only; counts against no quota",
                "default": True,
                "kubespawner_override": {},
            }
        )
    return profiles


class GpuKubeSpawner(GpuProfilesMixin, KubeSpawner):
    """KubeSpawner with GPU tiers, team quotas, admission and ownership labels."""

    @default("profile_list")
    def _gpu_profile_list(self):
        return gpu_profile_list

    async def get_pod_manifest(self):
        pod = await super().get_pod_manifest()
        grant = self.gpu_grant
        if grant:
            raw = {OWNER: self.user.name, **grant}
            pod.metadata.labels.update(
                {key: safe_slug(value, is_valid=is_valid_label) for key, value in raw.items()}
            )
            pod.metadata.annotations.update(raw)
        return pod
