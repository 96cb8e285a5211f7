"""The profile layer's settings, read once from the hub's config (``c.GpuProfiles.*``).

Validated when the hub loads its config (``add_gpu_profiles`` builds one), so a bad tier or quota
stops the hub with a message that names the entry and the key, before anyone spawns.
"""

from __future__ import annotations

import re
from datetime import timedelta
from functools import cached_property

from traitlets import Bool, Dict, List, TraitError, Unicode, validate
from traitlets.config import SingletonConfigurable

from ..core.durations import parse_duration
from ..core.traits import BoundedInt, NumberDict
from ..core.vocabulary import LABEL_PREFIX
from .cluster import PoolShape
from .quota import QuotaError, TeamQuota, load_quotas
from .tiers import (
    MAX_TIER_DEVICES,
    Card,
    CardError,
    Tier,
    TierError,
    load_cards,
    load_tiers,
    renamed,
)

# A pool's nodes at most 100,000 (Kubernetes supports 5,000 a cluster), each with 1 to 4,096
# devices (8 cards of 7 MIG instances hold 56; time-sliced replicas a few hundred).
MAX_POOL_NODES = 100_000
MAX_NODE_DEVICES = 4096

# A Kubernetes label prefix: a DNS subdomain, then '/'.
_PREFIX = re.compile(
    r"^(?=.{1,253}/$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/$"
)


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

    cards = Dict(
        help="""Cards added to the built-in catalogue (or replacing one of the same key), key ->
        dict: ``products`` (nvidia.com/gpu.product values), ``memory_gb``, and for MIG-capable
        cards ``mig_profiles`` and ``mig_slices`` ([compute, memory], default [7, 8]).

        Example::

            c.GpuProfiles.cards = {
                "RTX-6000-Ada-48GB": {"products": ["NVIDIA-RTX-6000-Ada-Generation"],
                                      "memory_gb": 48},
            }
        """,
    ).tag(config=True)

    capacity = NumberDict(
        min=0,
        max=MAX_TIER_DEVICES,
        whole=True,
        unit="devices",
        per="tier",
        help="""Devices per tier, e.g. ``{"h100": 16}``. On Kubernetes, GpuKubeSpawner counts the
        devices of the nodes each tier selects (less what other pods hold there) when it
        may read nodes; an entry here then caps that count (a share of the cluster for this hub),
        and stands in for it while nodes cannot be read. A tier without an entry or a count is
        bounded by quotas alone. Workstation spawners count their own devices.""",
    ).tag(config=True)

    node_pool_max = NumberDict(
        min=0,
        max=MAX_TIER_DEVICES,
        whole=True,
        unit="devices",
        per="tier",
        parts={
            "nodes": (0, MAX_POOL_NODES, "nodes"),
            "devices_per_node": (1, MAX_NODE_DEVICES, "devices a node"),
        },
        help="""What the tier's nodes can hold at most once the cluster autoscaler (or
        Karpenter) has added every node it may: the pool's node shape, ``{"nodes": 2,
        "devices_per_node": 8}`` for a pool of up to two 8-card nodes scaled to zero when idle
        (a server's devices are on one node: such a pool holds four servers of 3 cards, not
        five), or a number of devices, e.g. ``{"h100": 16}``. GpuKubeSpawner counts what the
        nodes lack of this today as free: a spawn is admitted (team quotas and caps as ever)
        and its pod waits Pending while the autoscaler adds a node (raise KubeSpawner's
        ``start_timeout`` to cover that). A tier without an entry counts the nodes that exist.
        ``capacity`` still caps the sum.""",
    ).tag(config=True)

    label_prefix = Unicode(
        LABEL_PREFIX,
        help="""Prefix of the ownership labels and annotations on user pods (``<prefix>team``,
        ``<prefix>tier``, ...): a DNS subdomain and '/', e.g. ``gpu-gov.example.org/``.
        dcgm-exporter's pod labels and showback dashboards then carry that prefix. The governor
        reads ownership from the Hub, not from pod labels, so it needs no change.""",
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

    queue = Bool(
        True,
        help="""Offer to wait in line when a GPU spawn cannot be admitted now (the cards are taken,
        the user's cap or the team's borrowing limit is reached): the server then starts by
        itself, on its owner's behalf, when admission lets it in. Needs the governor
        (``add_governor``), which starts waiting servers: the offer shows only while it is heard
        from.""",
    ).tag(config=True)

    queue_expire_after = Unicode(
        "8h",
        help="""How long a request waits in line before it expires (a duration: "30m", "8h",
        "2d"; 10 seconds to 30 days), counted from when it joined. Waiting again for the same tier
        and team renews it and keeps its place.""",
    ).tag(config=True)

    queue_claim_within = Unicode(
        "15m",
        help="""A server started from the line that its owner does not open within this time
        (no request to a kernel or terminal, no Hub activity after its start) is given back by
        the governor and counted (cull reason ``unclaimed``). A duration, 10 seconds to 1 day;
        keep it above JupyterHub's ``last_activity_interval`` (5 minutes).""",
    ).tag(config=True)

    queue_per_user = BoundedInt(
        2,
        min=1,
        max=100,
        unit="servers",
        help="""Servers one user may have waiting in line at once (1 to 100); also how many of
        a user's servers refused for want of a GPU count in the cluster's refused demand.""",
    ).tag(config=True)

    recount_every = BoundedInt(
        600,
        min=0,
        max=86_400,  # a day: the count kept between spawns drifts unchecked for as long
        unit="seconds",
        help="""Seconds between full recounts of the started servers' grants from the hub's
        database, compared with the count kept between spawns (a difference is logged as drift,
        counted in ``gpu_gov_grant_count_drift_total`` and corrected); begun at the next spawn,
        form or line after that long, read in a thread of its own (off the Hub's event loop;
        SQLite in memory: in the use) and compared at a use after it. 0: recount in every use
        (half a second per spawn at 10,000 servers).""",
    ).tag(config=True)

    max_expected_duration = Unicode(
        "7d",
        help="""The longest expected duration an owner may give at spawn (the spawn form's
        "Expected duration", ``gpu-gov/expected-duration``); a tier's ``max_age`` bounds it
        further. A duration such as "7d" (at most 100 years).""",
    ).tag(config=True)

    @validate("queue_expire_after")
    def _valid_queue_expire_after(self, proposal):
        return _within(proposal, timedelta(seconds=10), timedelta(days=30), "10 seconds to 30 days")

    @validate("queue_claim_within")
    def _valid_queue_claim_within(self, proposal):
        return _within(proposal, timedelta(seconds=10), timedelta(days=1), "10 seconds to 1 day")

    @validate("max_expected_duration")
    def _valid_max_expected_duration(self, proposal):
        if _duration(proposal.value, "max_expected_duration") < timedelta(minutes=1):
            raise TraitError("GpuProfiles.max_expected_duration must be at least 1 minute")
        return proposal.value

    @property
    def queue_expiry(self) -> timedelta:
        return parse_duration(self.queue_expire_after)

    @property
    def expected_duration_bound(self) -> timedelta:
        return parse_duration(self.max_expected_duration)

    @cached_property
    def card_map(self) -> dict[str, Card]:
        try:
            return load_cards(self.cards)
        except CardError as error:
            raise TraitError(f"GpuProfiles.cards: {error}") from None

    @validate("cards")
    def _valid_cards(self, proposal):
        try:
            load_cards(proposal.value)
        except CardError as error:
            raise TraitError(f"GpuProfiles.cards: {error}") from None
        return proposal.value

    @validate("label_prefix")
    def _valid_label_prefix(self, proposal):
        if not _PREFIX.match(proposal.value):
            raise TraitError(
                "GpuProfiles.label_prefix must be a DNS subdomain followed by '/' (lower-case "
                f"letters, digits, '-' and '.'), such as 'gpu-gov/', got {proposal.value!r}"
            )
        return proposal.value

    @cached_property
    def tier_map(self) -> dict[str, Tier]:
        # Checked here rather than when set: the tiers may name cards set after them.
        try:
            return load_tiers(self.tiers, self.card_map)
        except TierError as error:
            raise TraitError(f"GpuProfiles.tiers: {error}") from None

    @cached_property
    def tier_renamed(self) -> dict[str, str]:
        """Former tier name -> the tier's name now (a tier's ``formerly``)."""
        return renamed(self.tier_map)

    @cached_property
    def said_gone(self) -> set[str]:
        """Tiers no longer configured that running servers hold, already named in the log."""
        return set()

    @cached_property
    def quota_map(self) -> dict[str, TeamQuota]:
        try:
            return load_quotas(self.quotas, self.tier_map)
        except QuotaError as error:
            raise TraitError(f"GpuProfiles.quotas: {error}") from None

    @cached_property
    def node_pools(self) -> dict[str, int | PoolShape]:
        """``node_pool_max`` as ``profiles.cluster`` counts it: per tier, devices or the
        pool's node shape."""
        return {
            tier: PoolShape(most["nodes"], most["devices_per_node"])
            if isinstance(most, dict)
            else most
            for tier, most in self.node_pool_max.items()
        }

    def check(self) -> None:
        """Raise ``TraitError`` naming what is wrong with the settings."""
        self.quota_map  # noqa: B018  (loads and validates tiers, then quotas)
        for key in ("capacity", "node_pool_max"):
            for tier, devices in getattr(self, key).items():
                if tier not in self.tier_map:
                    raise TraitError(f"GpuProfiles.{key}: {tier!r} is not a tier")
                count = self.tier_map[tier].count
                if isinstance(devices, dict):  # a node shape: a server's devices on one node
                    per_node = devices["devices_per_node"]
                    if per_node < count:
                        raise TraitError(
                            f"GpuProfiles.{key}: {tier!r}: a node of its pool holds {per_node} "
                            f"devices and a server takes {count}: none would ever fit"
                        )
                    continue
                if devices % count:
                    raise TraitError(
                        f"GpuProfiles.{key}: {tier!r} counts devices and a server takes "
                        f"{count}: give a multiple of {count}, got {devices}"
                    )


def _within(proposal, low: timedelta, high: timedelta, words: str) -> str:
    """A duration setting's value, refused unless from ``low`` to ``high``."""
    name = proposal.trait.name
    if not low <= _duration(proposal.value, name) <= high:
        raise TraitError(f"GpuProfiles.{name} must be from {words}, got {proposal.value!r}")
    return proposal.value


def _duration(value: str, name: str) -> timedelta:
    try:
        return parse_duration(value, f"GpuProfiles.{name}")
    except ValueError as error:
        raise TraitError(str(error)) from None
