"""What the governor needs from its configuration, as one frozen value (``GpuGovernor`` in
``hub/app.py`` holds the settings and their help, and builds it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from ..core import rightsize
from .diagnosis import DiagnosisOptions
from .health import HealthOptions
from .history import HistoryOptions
from .pod_cpu import PodCpuOptions
from .proc_cpu import ProcCpuOptions


@dataclass(frozen=True)
class Options:
    """What the governor needs from its configuration (see ``GpuGovernor`` for the help)."""

    dry_run: bool = False
    report_stale_after: timedelta = timedelta(minutes=5)
    # How late the Hub's activity may be (core.policy.hub_activity_lag of the Hub's activity
    # interval); None: not known (no warning is then judged unread for want of activity).
    hub_activity_lag: timedelta | None = None
    cull_default_servers: bool = True
    cull_named_servers: bool = True
    cull_admin_users: bool = True
    cull_users: bool = False
    # jupyterhub-idle-culler's --timeout and --max-age, for users (--cull-users): a user is
    # deleted when inactive that long, or created that long ago.
    timeout: timedelta = timedelta(hours=1)
    max_age: timedelta | None = None
    remove_named_servers: bool = False
    team_map: Mapping[str, str] = field(default_factory=dict)
    pcie_floor_bytes_per_s: float = 1_000_000
    # DCGM evidence older than this is unknown (a slow or stuck read must not cull on old news).
    dcgm_max_age: timedelta = timedelta(minutes=3)
    diagnosis: DiagnosisOptions = field(default_factory=DiagnosisOptions)
    # The usage ledger: GPU-equivalents of a tier (else the grant's gpu-gov/weight, else the
    # reported devices), and the longest gap between two looks at a server that is billed.
    tier_weights: Mapping[str, float] = field(default_factory=dict)
    ledger_max_gap: timedelta = timedelta(minutes=3)
    # How often the ledger is written (and whenever it is read, and at stop): a row per running
    # server each time. A crash leaves the unwritten interval unobserved, as any outage.
    usage_write_every: timedelta = timedelta(minutes=5)
    # Showback: the price of one GPU-equivalent hour per tier (else the default), its
    # currency, and the GPU-equivalents each team is guaranteed (shown on "my GPU usage").
    gpu_hour_cost: Mapping[str, float] = field(default_factory=dict)
    gpu_hour_cost_default: float = 0.0
    currency: str = "USD"
    team_quotas: Mapping[str, float] = field(default_factory=dict)
    health: HealthOptions = field(default_factory=HealthOptions)
    # The pods' CPU from metrics-server: a CPU stage of a server without the extension
    # (hub/pod_cpu.py, core/cpu_stage.py). No Kubernetes API URL: not read.
    pod_cpu: PodCpuOptions = field(default_factory=PodCpuOptions)
    # A workstation's server processes' CPU (hub/proc_cpu.py): read where same_host.
    proc_cpu: ProcCpuOptions = field(default_factory=ProcCpuOptions)
    # Right-sizing: what a server of each tier gets (``core.rightsize``); empty: no hints.
    tier_sizes: Mapping[str, rightsize.TierSize] = field(default_factory=dict)
    right_size_after: timedelta = rightsize.MIN_OBSERVED  # of reports, before a hint
    # Decide every server at one pass in this many, and between them only those whose inputs
    # changed or whose time came (``hub/unchanged.py``); 1: every server at every pass.
    full_pass_every: int = 10
    # A start from the spawn queue's line that the Hub refused, or that failed after it took it,
    # is tried again after this (``hub/queue.py``), not at every pass.
    queue_retry_after: timedelta = timedelta(minutes=1)
    # A left pod's delete that failed is asked (and audited) again after this (``hub/queue.py``).
    left_pod_retry: timedelta = timedelta(seconds=15)
    # The rows of a user's stopped servers kept, those stopped most lately (older ones are
    # forgotten as the user's servers stop: ``Governor._forget_stopped``).
    stopped_kept_per_user: int = 100
    # A server's distrusted report is audited (and logged) at each change, at most this many
    # times an hour; the next says how many changes went unsaid (``Evidence._distrust``).
    distrust_said_per_hour: int = 6
    history: HistoryOptions = field(default_factory=HistoryOptions)  # hub/history.py

    def __post_init__(self) -> None:
        # Read at every look at a server: a renamed tier's names, from ``tier_sizes``.
        object.__setattr__(self, "_tier_names", rightsize.tier_names(self.tier_sizes))

    def tier_names(self, tier: str) -> tuple[str, ...]:
        """The names of ``tier``: its name now first, then those it had (``formerly``)."""
        return self._tier_names.get(tier) or (tier,)

    def by_tier(self, table: Mapping[str, float], tier: str | None) -> float | None:
        """``table``'s value for ``tier`` (a cost, a weight), keyed by any of its names: by the
        name given first, then its name now, then a former one; None where none is listed."""
        if tier is None:
            return None
        if tier in table:
            return table[tier]
        return next((table[n] for n in self.tier_names(tier) if n in table), None)

    def cost_per_hour(self, tier: str) -> float:
        cost = self.by_tier(self.gpu_hour_cost, tier)
        return float(self.gpu_hour_cost_default if cost is None else cost)
