"""Trusted per-GPU evidence from DCGM (dcgm-exporter), mapped to the pods that hold the GPUs.

A server's report is user-controlled; DCGM is not (docs/security.md). This module turns dcgm-exporter
series into one ``GpuEvidence`` per *leaf* GPU (a whole GPU, or a MIG GPU instance) and indexes
them by pod and by GPU UUID for the governor. Pure: ``hub/prometheus.py`` reads the formats, ``hub/dcgm_source.py`` does the I/O.

Two ways in: scrape each exporter's text exposition (``http://<node>:9400/metrics``), or ask
Prometheus (``/api/v1/query``) when it already scrapes the exporters. Through Prometheus the
workload labels depend on the scrape config: with ``honorLabels: true`` an unattributed GPU
carries the *exporter's own* ``pod/namespace/container`` target labels; with ``honorLabels:
false`` the workload's labels are renamed ``exported_*`` and ``pod`` is the exporter. The
exporter is never an owner.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from ..core import health, slotted
from ..core.health import Health
from ..core.wire import MAX_MEMORY_MB
from .prometheus import (
    METRIC_NAME,
    Sample,
    exposition_samples,
    not_text_label,
    vector_samples,
)

# Health fields (``health_of``): the last XID (DCGM keeps it until the driver or the exporter
# restarts), the exporter's count of each XID over its window (``xid`` label), volatile
# double-bit ECC errors, pages pending retirement, rows pending remapping or failed to remap, and
# the clocks event (throttle) reasons bitmask.
HEALTH_SIGNALS = frozenset(
    {
        "xid",
        "xid_count",
        "ecc_dbe_volatile",
        "retired_pending",
        "row_remap_pending",
        "row_remap_failed",
        "clock_events",
    }
)

# The values a metric can feed. ``gpu_util`` is a percentage; the rest are in the field's unit.
SIGNALS = frozenset(
    {
        "gr_engine_active",
        "sm_active",
        "gpu_util",
        "dram_active",
        "tensor_active",
        "pcie_tx_bytes",
        "pcie_rx_bytes",
        "memory_used_mb",
        "memory_free_mb",
        "power_w",
        *HEALTH_SIGNALS,
    }
)

# Metric name -> signal: the one table. A site that relabels metrics extends it
# (``DcgmConfig().with_metrics({"gpu_util": "gpu_util"})``); the Prometheus query asks for its keys.
DEFAULT_METRICS: Mapping[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "pcie_tx_bytes",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "pcie_rx_bytes",
    "DCGM_FI_DEV_FB_USED": "memory_used_mb",
    "DCGM_FI_DEV_FB_FREE": "memory_free_mb",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    # Health, under dcgm-exporter's names (default-counters.csv) and DCGM 4's current names.
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_XID_ERROR": "xid",
    "DCGM_EXP_XID_ERRORS_COUNT": "xid_count",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_volatile",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pending",
    "DCGM_FI_DEV_PAGE_RETIRED_PENDING": "retired_pending",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "row_remap_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failed",
    "DCGM_FI_DEV_ROW_REMAP_FAILED": "row_remap_failed",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clock_events",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clock_events",
}

# DaemonSet pods: the GPU Operator's (nvidia-dcgm-exporter-wqqqn, container nvidia-dcgm-exporter)
# and NVIDIA's standalone chart's (<release>-dcgm-exporter-xxxxx, container exporter).
DEFAULT_EXPORTER_POD_REGEX = r"(?:[a-z0-9-]+-)?dcgm-exporter-[a-z0-9]{5}"
DEFAULT_EXPORTER_CONTAINERS = frozenset({"nvidia-dcgm-exporter", "dcgm-exporter", "exporter"})

# What each signal can be: a value outside is a broken (or forged) exporter, never evidence.
# A hair over 1 is rounding (clamped); a negative utilisation once read as idle. Amounts are
# bounded far past any GPU's (memory as a report's, ``core.wire.MAX_MEMORY_MB``): 1e308 MiB was
# taken as read, and the pass's history (every server's rows, one write) could not be stored.
_MAX_COUNT = 2.0**53  # a count past this is not one a float holds exactly: not a count
_RANGES: Mapping[str, tuple[float, float]] = {
    "gr_engine_active": (0.0, 1.01),
    "sm_active": (0.0, 1.01),
    "dram_active": (0.0, 1.01),
    "tensor_active": (0.0, 1.01),
    "gpu_util": (0.0, 101.0),
    "pcie_tx_bytes": (0.0, 1e13),  # bytes/s: PCIe 7.0 x16 is 2.6e11
    "pcie_rx_bytes": (0.0, 1e13),
    "memory_used_mb": (0.0, MAX_MEMORY_MB),
    "memory_free_mb": (0.0, MAX_MEMORY_MB),
    "power_w": (0.0, 1e5),  # a GPU draws about 1e3
    # Health: an XID number, counts, flags and the clocks event reasons bitmask.
    "xid": (0.0, 1e6),
    "xid_count": (0.0, _MAX_COUNT),
    "ecc_dbe_volatile": (0.0, _MAX_COUNT),
    "retired_pending": (0.0, _MAX_COUNT),
    "row_remap_pending": (0.0, _MAX_COUNT),
    "row_remap_failed": (0.0, _MAX_COUNT),
    "clock_events": (0.0, 2.0**64),
}
# The longest a label the evidence keeps may be: a Kubernetes object's or a DNS name's (pods,
# nodes); a UUID as an admin can name one to dismiss its claim (``health.not_a_uuid``). A GPU
# whose series carry a longer one is unknown, named: a 10 MB Hostname was kept as read, as the
# health page's node and the governor's own /metrics label.
MAX_LABEL_CHARS = 253
_MAX_UUID_CHARS = 104
_LEAF_LABELS = ("GPU_I_ID", "gpu", "Hostname", "hostname", "modelName", "GPU_I_PROFILE")
_CLAMP = {"gr_engine_active": 1.0, "sm_active": 1.0, "dram_active": 1.0, "tensor_active": 1.0}
_CLAMP["gpu_util"] = 100.0
# The most a read may decompress to (a whole 10,000-GPU fleet through Prometheus is ~40 MB).
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# PromQL label matchers, e.g. ``job="nvidia-dcgm-exporter", namespace="gpu-operator"``.
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*'
LABEL_MATCHERS = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*")


@dataclass(frozen=True)
class DcgmConfig:
    """How to read a site's DCGM series: metric names, and how to recognise the exporter's pod."""

    metrics: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_METRICS))
    # The exporter's own pod, seen through Prometheus target labels, is never an owner.
    exporter_pod_regex: str = DEFAULT_EXPORTER_POD_REGEX  # full match against the pod name
    exporter_containers: frozenset[str] = DEFAULT_EXPORTER_CONTAINERS  # and its container's
    # Prometheus: label matchers only the exporter's series meet (its job, its namespace), so
    # that series of these names from any other target (a user's pod scraped for its own
    # metrics, a Pushgateway) are never read as DCGM's word.
    prometheus_selector: str = ""
    _exporter_pod: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, signal in self.metrics.items():
            if not METRIC_NAME.fullmatch(name):
                raise ValueError(f"DcgmConfig.metrics: {name!r} is not a Prometheus metric name")
            if signal not in SIGNALS:
                raise ValueError(
                    f"DcgmConfig.metrics[{name!r}]: unknown field {signal!r}; "
                    f"one of {', '.join(sorted(SIGNALS))}"
                )
        if self.prometheus_selector and not LABEL_MATCHERS.fullmatch(self.prometheus_selector):
            raise ValueError(
                f"DcgmConfig.prometheus_selector: {self.prometheus_selector!r:.200} is not "
                'PromQL label matchers, e.g. job="nvidia-dcgm-exporter"'
            )
        try:
            pattern = re.compile(self.exporter_pod_regex)
        except re.error as e:
            raise ValueError(f"DcgmConfig.exporter_pod_regex: {e}") from None
        object.__setattr__(self, "_exporter_pod", pattern)

    def with_metrics(self, extra: Mapping[str, str]) -> DcgmConfig:
        """This config with more metric names, e.g. ``{"gpu_util": "gpu_util"}`` for a relabel."""
        return replace(self, metrics={**self.metrics, **extra})

    def is_exporter(self, pod: str, container: str | None) -> bool:
        # Both must match: a user picks their pod's name (a named server) but not its container's,
        # so a name alone must never hide a workload's GPU from the trusted evidence. Workload
        # series always carry a container label; only a bare target may lack one.
        if not self._exporter_pod.fullmatch(pod):
            return False
        return container is None or container in self.exporter_containers


@dataclass(frozen=True, slots=True)  # 15,000 at 10,000 servers, two reads alive: no __dict__
class GpuEvidence:
    """What DCGM says about one leaf GPU and the pod holding it. ``None`` is unknown, never 0.

    A MIG instance carries its *physical* GPU's ``uuid`` (DCGM labels series that way) and is
    told apart by ``gpu_instance_id``. A GPU shared by several pods (time-slicing) yields one
    record per pod, with the same device values.
    """

    uuid: str
    gpu_index: int | None = None
    hostname: str | None = None
    model: str | None = None
    mig_profile: str | None = None  # e.g. "1g.5gb"; None for a whole GPU
    gpu_instance_id: int | None = None
    namespace: str | None = None
    pod: str | None = None  # None: no workload holds it (or only the exporter was seen)
    container: str | None = None
    activity: float | None = None  # 0..1
    activity_source: str | None = None  # the signal ``activity`` came from, e.g. "gpu_util"
    sm_active: float | None = None  # 0..1, SM_ACTIVE: how many SMs the kernels fill, over time
    # 0..1, GR_ENGINE_ACTIVE: the share of time a kernel ran. Not GPU_UTIL, which means the same
    # but is sampled coarsely and overstates (the T4 fixture: 91 % against 15.6 %).
    gr_active: float | None = None
    dram_active: float | None = None  # 0..1
    tensor_active: float | None = None  # 0..1
    pcie_bytes_per_s: float | None = None  # TX + RX
    memory_used_mb: float | None = None
    memory_free_mb: float | None = None
    power_w: float | None = None
    health: Health | None = None  # None: DCGM sent no health field for it

    @property
    def owner(self) -> tuple[str | None, str] | None:
        return (self.namespace, self.pod) if self.pod else None

    def __reduce__(self) -> tuple:
        # Sent from the read's worker (hub/dcgm_source.py) as its values, its texts interned
        # there too (one string in the answer for every record's model, node, namespace), and
        # rebuilt sharing the texts the service already holds (``_unpickled``).
        return _unpickled, (_interned(_values(self)),)


_FIELDS = tuple(f.name for f in fields(GpuEvidence))
_values = operator.attrgetter(*_FIELDS)
_built = slotted.builder(GpuEvidence)


def _interned(values: tuple) -> list:
    return [sys.intern(v) if v.__class__ is str else v for v in values]


def _unpickled(values: list) -> GpuEvidence:
    """A record as the worker sent it, its texts interned: the same UUID, pod, node, model
    (every record's), namespace and container as the read before it (alive until the next pass
    adopts this one) are one string each, not one a record a read: at 10,000 servers the two
    reads alive between passes were 28.3 MB, ~945 bytes a record (docs/benchmarks-history.md,
    "Issue 26, wave 40: the service's memory, where reading DCGM leaves it"). Slotted, made
    without a call a field (``core.slotted``): ~120 bytes a record less than its ``__dict__``."""
    return _built(_interned(values))


@dataclass(frozen=True)
class DcgmSnapshot:
    """One fetch. ``errors`` says what could not be read; GPUs missing here are unknown."""

    evidence: tuple[GpuEvidence, ...]
    fetched_at: datetime  # when the read started (the service's wall clock)
    errors: tuple[str, ...] = ()
    cpu_s: float = 0.0  # what the read cost the worker: HTTP, decompression, parsing
    asked: float = field(default_factory=time.monotonic)  # the same, on the monotonic clock

    @property
    def age_s(self) -> float:
        """Seconds since the read started, as observed (a step of the wall clock, or a test
        moving it, does not age it)."""
        return time.monotonic() - self.asked


# --- parsing (pure) ---------------------------------------------------------------------------


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    """The first non-empty value: an empty label (``pod_uid=""``) is an absent one."""
    for name in names:
        if value := labels.get(name):
            return value
    return None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


_Owner = tuple[str | None, str, str | None]  # namespace, pod, container


def _owner(labels: Mapping[str, str], config: DcgmConfig) -> _Owner | None:
    """The workload a series names (``None``: none, or the exporter itself); raises
    ``ValueError`` naming a label longer than any Kubernetes name."""
    # exported_* exist only when Prometheus renamed the workload's labels; then pod is the exporter.
    if _label(labels, "exported_pod"):
        names = ("exported_namespace", "exported_pod", "exported_container")
    else:
        names = ("namespace", "pod", "container")
    namespace, pod, container = (_label(labels, n) for n in names)
    if not pod:
        return None
    if len(pod) > MAX_LABEL_CHARS or len(namespace or "") > MAX_LABEL_CHARS:
        raise ValueError(names[1] if len(pod) > MAX_LABEL_CHARS else names[0])
    if len(container or "") > MAX_LABEL_CHARS:
        raise ValueError(names[2])
    if config.is_exporter(pod, container):
        return None
    return namespace, pod, container


def _overlong(labels: Mapping[str, str], uuid: str) -> str | None:
    """The name of a label of a leaf's first series that is too long to keep (``None``: none)."""
    if len(uuid) > _MAX_UUID_CHARS:
        return "UUID"
    return next((n for n in _LEAF_LABELS if len(labels.get(n) or "") > MAX_LABEL_CHARS), None)


@dataclass
class _Leaf:
    labels: Mapping[str, str]  # of the first series seen; identity labels agree across series
    values: dict[str, float] = field(default_factory=dict)
    owners: dict[_Owner, None] = field(default_factory=dict)  # an ordered set
    refused: bool = False  # a series of it carries a label too long to keep: unknown, whole


def _activity(values: Mapping[str, float]) -> tuple[float | None, str | None]:
    # GR_ENGINE_ACTIVE first: GPU_UTIL counts any kernel running, however small, so it overstates.
    # SM_ACTIVE last: averaged over all SMs, a low-occupancy kernel that is working reads near 0.
    if "gr_engine_active" in values:
        return values["gr_engine_active"], "gr_engine_active"
    if "gpu_util" in values:
        return values["gpu_util"] / 100.0, "gpu_util"
    if "sm_active" in values:
        return values["sm_active"], "sm_active"
    return None, None


def _pcie(values: Mapping[str, float]) -> float | None:
    # With one direction missing the known one is a lower bound: still enough to prove "busy".
    parts = [values[k] for k in ("pcie_tx_bytes", "pcie_rx_bytes") if k in values]
    return sum(parts) if parts else None


def evidence_from_samples(
    samples: Iterable[Sample], config: DcgmConfig | None = None, rejected: list | None = None
) -> list[GpuEvidence]:
    """One record per leaf GPU (and per pod holding it) from (name, labels, value) samples.

    Series without a ``UUID`` label, of metrics not in ``config.metrics``, or with NaN/Inf
    values are ignored; so are values out of their signal's range (a negative utilisation),
    each named in ``rejected`` when given. Duplicates of a series (an HA Prometheus pair, two
    scrape jobs) merge keeping the highest value, so a duplicate can never make a GPU look
    idler than it is.
    """
    config = config or DcgmConfig()
    metrics = config.metrics
    leaves: dict[tuple[str, str | None], _Leaf] = {}
    # A GPU's label set repeats once per metric, and the text parser shares one dict for each
    # distinct set: find its leaf (and add its owner) once per set, not once per sample.
    read: dict[int, tuple[Mapping[str, str], dict[str, float] | None]] = {}
    for name, labels, value in samples:
        signal = metrics.get(name)
        if signal is None:
            continue
        known = read.get(id(labels))  # the tuple keeps ``labels`` alive: its id stays its own
        if known is None:
            uuid = _label(labels, "UUID")
            values = None
            if uuid is not None:
                # Key MIG leaves by the raw label so an odd GPU_I_ID never merges with its parent.
                gi_id = _label(labels, "GPU_I_ID")
                leaf = leaves.get((uuid, gi_id))
                if leaf is None:
                    leaf = leaves[(uuid, gi_id)] = _Leaf(labels)
                    too_long = _overlong(labels, uuid)
                else:
                    too_long = None
                try:
                    owner = _owner(labels, config)
                except ValueError as e:
                    owner, too_long = None, str(e)
                if too_long and not leaf.refused:
                    # All of its series, not this one's: a GPU with its PCIe series left out
                    # and its activity low would read as idle.
                    leaf.refused = True
                    if rejected is not None:
                        bound = _MAX_UUID_CHARS if too_long == "UUID" else MAX_LABEL_CHARS
                        rejected.append(
                            f"a {too_long} label over {bound} characters for "
                            f"{uuid[:_MAX_UUID_CHARS]}"
                        )
                if owner:
                    leaf.owners[owner] = None
                values = None if leaf.refused else leaf.values
            known = read[id(labels)] = (labels, values)
        values = known[1]
        if values is None or not math.isfinite(value):
            continue
        low, high = _RANGES[signal]
        if not low <= value <= high:
            if rejected is not None:
                rejected.append(f"{name}={value:g} for {_label(labels, 'UUID')}")
            continue
        value = min(float(value), _CLAMP.get(signal, math.inf))
        if signal == "xid_count" and value > 0:  # one series per XID seen in the window
            values[f"xid_count:{labels.get('xid')}"] = value
        held = values.get(signal)
        if held is None or not held > value:  # max(value, held): the new one on a tie
            values[signal] = value

    evidence = []
    for (uuid, gi_id), leaf in leaves.items():
        if leaf.refused:
            continue
        activity, source = _activity(leaf.values)
        fields = {
            "uuid": uuid,
            "gpu_index": _int(_label(leaf.labels, "gpu")),
            "hostname": _label(leaf.labels, "Hostname", "hostname"),
            "model": _label(leaf.labels, "modelName"),
            "mig_profile": _label(leaf.labels, "GPU_I_PROFILE"),
            "gpu_instance_id": _int(gi_id),
            "activity": activity,
            "activity_source": source,
            "sm_active": leaf.values.get("sm_active"),
            "gr_active": leaf.values.get("gr_engine_active"),
            "dram_active": leaf.values.get("dram_active"),
            "tensor_active": leaf.values.get("tensor_active"),
            "pcie_bytes_per_s": _pcie(leaf.values),
            "memory_used_mb": leaf.values.get("memory_used_mb"),
            "memory_free_mb": leaf.values.get("memory_free_mb"),
            "power_w": leaf.values.get("power_w"),
            "health": health_of(leaf.values),
        }
        if not leaf.owners:
            evidence.append(GpuEvidence(**fields))
        for namespace, pod, container in leaf.owners:
            evidence.append(
                GpuEvidence(**fields, namespace=namespace, pod=pod, container=container)
            )
    return evidence


def health_of(values: Mapping[str, float]) -> Health | None:
    """A leaf GPU's health from its DCGM health fields (``None`` when it has none)."""
    read = [values[signal] for signal in HEALTH_SIGNALS if signal in values]
    if not read:
        return None
    if not any(read):  # every field 0 (no XID, no error, no throttling): most GPUs
        return health.HEALTHY
    xids = []
    last = values.get("xid")
    if last and last.is_integer() and 0 < last < 1000:  # 0: none yet
        xids.append(int(last))
    if "xid_count" in values:
        for key in values:
            number = key[len("xid_count:") :] if key.startswith("xid_count:") else ""
            if number.isascii() and number.isdigit():
                xids.append(int(number))

    def flag(signal: str) -> bool | None:
        value = values.get(signal)
        return None if value is None else value > 0

    events = values.get("clock_events")
    ecc = values.get("ecc_dbe_volatile")
    return _assess(
        health.Reading(
            xids=tuple(xids),
            ecc_dbe_volatile=None if ecc is None else int(ecc),
            retired_pages_pending=flag("retired_pending"),
            remapped_rows_pending=flag("row_remap_pending"),
            remap_failure=flag("row_remap_failed"),
            clock_events=int(events) if events is not None and events >= 0 else None,
        )
    )


# GPUs in the same state share one Health: pickled once for the fleet, not once per GPU.
_assess = functools.lru_cache(maxsize=1024)(health.assess)


def parse_exposition(
    text: str, config: DcgmConfig | None = None, rejected: list | None = None
) -> list[GpuEvidence]:
    """Evidence from an exporter's ``/metrics`` body (Prometheus text format).

    Raises ``ValueError``, naming the line, on a malformed sample line of a metric in
    ``config.metrics``; lines of other metrics, comments and HELP/TYPE lines are skipped unread.
    """
    config = config or DcgmConfig()
    return evidence_from_samples(exposition_samples(text, config.metrics), config, rejected)


def parse_prometheus_query(
    payload: Mapping[str, Any], config: DcgmConfig | None = None, rejected: list | None = None
) -> list[GpuEvidence]:
    """Evidence from a decoded Prometheus ``/api/v1/query`` response (``resultType: vector``).

    Raises ``ValueError`` for an error response, another result type or a malformed sample.
    """
    if payload.get("status") != "success":
        raise ValueError(
            f"Prometheus query failed: {payload.get('errorType')}: {payload.get('error')}"
        )
    data = payload.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"expected a vector result, got {data.get('resultType')!r}")
    result = data.get("result") or []
    try:
        return evidence_from_samples(vector_samples(result), config, rejected)
    except (AttributeError, TypeError):  # a label read that is not text (odd JSON): named
        odd = not_text_label(result)
        if odd is None:
            raise
        raise ValueError(
            f"malformed vector sample {odd!r:.200}: a label's value is not text"
        ) from None


def prometheus_query(config: DcgmConfig | None = None) -> str:
    """One instant query for every metric in the table, e.g. ``{__name__=~"A|B"}``, of the
    series the config's ``prometheus_selector`` matches."""
    config = config or DcgmConfig()
    names = "|".join(sorted(config.metrics))
    selector = f",{config.prometheus_selector}" if config.prometheus_selector else ""
    return f'{{__name__=~"{names}"{selector}}}'


# --- judgement and lookup (pure) --------------------------------------------------------------


def is_idle(
    evidence: GpuEvidence,
    idle_threshold: float = 0.05,
    pcie_floor_bytes_per_s: float = 1_000_000,
) -> bool | None:
    """True when activity is below the threshold and PCIe traffic (if known) below the floor.

    ``None`` when activity is unknown: unknown is never idle. The floor sits above the ~0.1 MB/s
    an idle GPU's driver traffic shows on PCIe, and below any real host<->device copy.
    """
    if evidence.activity is None:
        return None
    if evidence.activity >= idle_threshold:
        return False
    return evidence.pcie_bytes_per_s is None or evidence.pcie_bytes_per_s < pcie_floor_bytes_per_s


def index_by_pod(
    evidence: Iterable[GpuEvidence],
) -> dict[tuple[str | None, str], list[GpuEvidence]]:
    """(namespace, pod) -> the leaf GPUs it holds. Unattributed GPUs are left out."""
    index: dict[tuple[str | None, str], list[GpuEvidence]] = {}
    for e in evidence:
        if e.owner:
            index.setdefault(e.owner, []).append(e)
    return index


def moved_gpus(before: Sequence, after: Sequence) -> frozenset[str] | None:
    """What moved between two reads of the same GPUs: the physical UUIDs and pod names of the
    records that differ (empty: none). ``None`` when the records are not the same GPUs in the
    same order (a GPU or an instance came or went, a node's exporter failed or came back):
    then nothing is said of what moved. A record an exporter's unchanged body gave is the
    same object in both reads (``hub/dcgm_source.py``): only a changed body's are compared.
    The governor compares what its decisions read of each record (``hub/unchanged.dcgm_read``,
    which has the same ``uuid``, ``gpu_instance_id`` and ``pod``), not the records whole."""
    if len(before) != len(after):
        return None
    moved: set[str] = set()
    for old, new in zip(before, after, strict=True):
        if old is new or old == new:
            continue
        if old.uuid != new.uuid or old.gpu_instance_id != new.gpu_instance_id:
            return None
        moved.update(n for n in (new.uuid, new.pod, old.pod) if n)
    return frozenset(moved)


def index_by_uuid(evidence: Iterable[GpuEvidence]) -> dict[str, list[GpuEvidence]]:
    """Physical GPU UUID -> its records: the whole GPU and any MIG instances of it."""
    index: dict[str, list[GpuEvidence]] = {}
    for e in evidence:
        index.setdefault(e.uuid, []).append(e)
    return index
