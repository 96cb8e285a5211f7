"""The profile layer's settings, read once from the hub's config (``c.GpuProfiles.*``).

Validated when the hub loads its config (``add_gpu_profiles`` builds one), so a bad tier or quota
stops the hub with a message that names the entry and the key, before anyone spawns.
"""

from __future__ import annotations

from functools import cached_property

from traitlets import Bool, Dict, List, TraitError, Unicode, validate
from traitlets.config import SingletonConfigurable

from .quota import QuotaError, TeamQuota, load_quotas
from .tiers import Tier, TierError, load_tiers

LABEL_PREFIX = "gpu-gov/"  # the same prefix as core.policy's ownership labels


class GpuProfiles(SingletonConfigurable):
    """GPU tiers, team quotas and how teams are found: one instance per hub process."""

    tiers = List(
        Dict(),
        help="""GPU tiers offered on the spawn form, in order (see profiles/tiers.py).

        Example::

            c.GpuProfiles.tiers = [
                {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB",
                 "interconnect": "nvlink", "max_age": "3d"},
                {"name": "h200-3g", "display_name": "Half an H200", "gpu": "H200-141GB",
                 "mig": "3g.71gb"},
            ]
        """,
    ).tag(config=True)

    quotas = Dict(
        help="""Team quotas, team → dict (see profiles/quota.py): ``guaranteed``,
        ``borrowing_limit`` and ``lending_limit`` (tier → devices), ``tiers`` (a list or "*"),
        ``user_cap`` (GPU-equivalents per user) and ``priority``.

        Example::

            c.GpuProfiles.quotas = {
                "vision": {"guaranteed": {"h100": 4}, "borrowing_limit": {"h100": 2},
                           "user_cap": 2},
            }
        """,
    ).tag(config=True)

    capacity = Dict(
        help="""Devices per tier in the cluster (Kubernetes), e.g. ``{"h100": 16}``. A tier without
        an entry is bounded by quotas alone. Workstation spawners count their own devices.""",
    ).tag(config=True)

    team_map = Dict(
        help="""User → team (or list of teams), for users whose team is not a Hub group with the
        ``gpu-gov/team`` property nor in auth_state.""",
    ).tag(config=True)

    default_team = Unicode(
        "",
        help="""Team of users found in no team (e.g. "guests", with a small quota). Empty: such
        users may start servers without a GPU only.""",
    ).tag(config=True)

    auth_state_teams_key = Unicode(
        "",
        help="""Key of ``auth_state`` holding the user's teams (a string or a list), e.g. an
        OAuth ``groups`` claim. Empty: auth_state is not read.""",
    ).tag(config=True)

    projects = Dict(
        help="""Suggested projects per team (team → list of names), offered on the spawn form;
        users may also type one.""",
    ).tag(config=True)

    require_project = Bool(False, help="Refuse a GPU spawn whose form names no project.").tag(
        config=True
    )

    allow_no_gpu = Bool(
        True, help="Offer a 'No GPU' choice on the spawn form (not counted against quotas)."
    ).tag(config=True)

    @validate("tiers")
    def _valid_tiers(self, proposal):
        try:
            load_tiers(proposal.value)
        except TierError as error:
            raise TraitError(f"GpuProfiles.tiers: {error}") from None
        return proposal.value

    @validate("capacity")
    def _valid_capacity(self, proposal):
        for tier, devices in proposal.value.items():
            if isinstance(devices, bool) or not isinstance(devices, int) or devices < 0:
                raise TraitError(
                    f"GpuProfiles.capacity: {tier!r} must be a whole number >= 0, got {devices!r}"
                )
        return proposal.value

    @cached_property
    def tier_map(self) -> dict[str, Tier]:
        return load_tiers(self.tiers)

    @cached_property
    def quota_map(self) -> dict[str, TeamQuota]:
        try:
            return load_quotas(self.quotas, self.tier_map)
        except QuotaError as error:
            raise TraitError(f"GpuProfiles.quotas: {error}") from None

    def check(self) -> None:
        """Raise ``TraitError`` naming what is wrong with the settings."""
        self.quota_map  # noqa: B018  (loads and validates tiers, then quotas)
        for tier, devices in self.capacity.items():
            if tier not in self.tier_map:
                raise TraitError(f"GpuProfiles.capacity: {tier!r} is not a tier")
            count = self.tier_map[tier].count
            if devices % count:
                raise TraitError(
                    f"GpuProfiles.capacity: {tier!r} counts devices and a server takes {count}: "
                    f"give a multiple of {count}, got {devices}"
                )
