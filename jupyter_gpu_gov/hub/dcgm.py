"""Trusted per-GPU evidence from DCGM (dcgm-exporter), mapped to the pods that hold the GPUs.

A server's report is user-controlled; DCGM is not (docs/security.md). This module turns dcgm-exporter
series into one ``GpuEvidence`` per *leaf* GPU (a whole GPU, or a MIG GPU instance) and indexes
them by pod and by GPU UUID for the governor. Parsing is pure; ``DcgmSource`` does the I/O.

Two ways in: scrape each exporter's text exposition (``http://<node>:9400/metrics``), or ask
Prometheus (``/api/v1/query``) when it already scrapes the exporters. Through Prometheus the
workload labels depend on the scrape config: with ``honorLabels: true`` an unattributed GPU
carries the *exporter's own* ``pod/namespace/container`` target labels; with ``honorLabels:
false`` the workload's labels are renamed ``exported_*`` and ``pod`` is the exporter. The
exporter is never an owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import json
import math
import multiprocessing
import re
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Collection, Container, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import datetime
from signal import SIG_IGN, SIGINT
from signal import signal as set_signal_handler
from typing import Any
from urllib.parse import urlencode, urlsplit

from ..core import clock, health
from ..core.health import Health

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

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

# What each signal can be: a value outside is a broken (or forged) exporter, never evidence.
# A hair over 1 is rounding (clamped); a negative utilisation once read as idle.
_RANGES: Mapping[str, tuple[float, float]] = {
    "gr_engine_active": (0.0, 1.01),
    "sm_active": (0.0, 1.01),
    "dram_active": (0.0, 1.01),
    "tensor_active": (0.0, 1.01),
    "gpu_util": (0.0, 101.0),
    "pcie_tx_bytes": (0.0, math.inf),
    "pcie_rx_bytes": (0.0, math.inf),
    "memory_used_mb": (0.0, math.inf),
    "memory_free_mb": (0.0, math.inf),
    "power_w": (0.0, math.inf),
    # Health: an XID number, counts, flags and the clocks event reasons bitmask.
    "xid": (0.0, 1e6),
    "xid_count": (0.0, math.inf),
    "ecc_dbe_volatile": (0.0, math.inf),
    "retired_pending": (0.0, math.inf),
    "row_remap_pending": (0.0, math.inf),
    "row_remap_failed": (0.0, math.inf),
    "clock_events": (0.0, 2.0**64),
}
_CLAMP = {"gr_engine_active": 1.0, "sm_active": 1.0, "dram_active": 1.0, "tensor_active": 1.0}
_CLAMP["gpu_util"] = 100.0
# The most a read may decompress to (a whole 10,000-GPU fleet through Prometheus is ~40 MB).
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class DcgmConfig:
    """How to read a site's DCGM series: metric names, and how to recognise the exporter's pod."""

    metrics: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_METRICS))
    # The exporter's own pod, seen through Prometheus target labels, is never an owner.
    exporter_pod_regex: str = DEFAULT_EXPORTER_POD_REGEX  # full match against the pod name
    exporter_containers: frozenset[str] = DEFAULT_EXPORTER_CONTAINERS  # and its container's
    _exporter_pod: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, signal in self.metrics.items():
            if not _METRIC_NAME.fullmatch(name):
                raise ValueError(f"DcgmConfig.metrics: {name!r} is not a Prometheus metric name")
            if signal not in SIGNALS:
                raise ValueError(
                    f"DcgmConfig.metrics[{name!r}]: unknown field {signal!r}; "
                    f"one of {', '.join(sorted(SIGNALS))}"
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


@dataclass(frozen=True)
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

Sample = tuple[str, Mapping[str, str], float]  # metric name, labels, value


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    """The first non-empty value: an empty label (``pod_uid=""``) is an absent one."""
    for name in names:
        if value := labels.get(name):
            return value
    return None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


_Owner = tuple[str | None, str, str | None]  # namespace, pod, container


def _owner(labels: Mapping[str, str], config: DcgmConfig) -> _Owner | None:
    # exported_* exist only when Prometheus renamed the workload's labels; then pod is the exporter.
    if _label(labels, "exported_pod"):
        names = ("exported_namespace", "exported_pod", "exported_container")
    else:
        names = ("namespace", "pod", "container")
    namespace, pod, container = (_label(labels, n) for n in names)
    if not pod or config.is_exporter(pod, container):
        return None
    return namespace, pod, container


@dataclass
class _Leaf:
    labels: Mapping[str, str]  # of the first series seen; identity labels agree across series
    values: dict[str, float] = field(default_factory=dict)
    owners: dict[_Owner, None] = field(default_factory=dict)  # an ordered set


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
                owner = _owner(labels, config)
                if owner:
                    leaf.owners[owner] = None
                values = leaf.values
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
            if number.isdigit():
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


# The text exposition format (0.0.4), read by hand: prometheus_client's parser takes ~9 s over a
# 10,000-GPU body, mostly on series the table never reads. Names are read as written, as
# Prometheus does; prometheus_client would rename a counter's samples to ``<name>_total``.
# One label and its separator. A value escapes only \\, \" and \n (any other escape is an error,
# as in Prometheus); unrolled as runs between escapes, which ``re`` scans far faster than a char
# alternation.
_LABEL = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\[\\"n][^"\\]*)*)"[ \t]*(?:,|\Z)'
)
_LABELS = re.compile(f"(?:{_LABEL.pattern})*")  # labels one after another, as the loop reads them
_VALUE = re.compile(r"[ \t]+(\S+)(?:[ \t]+[-+]?[0-9]+)?")  # then an optional timestamp (ms)
_ESCAPE = re.compile(r'\\[\\"n]')
_UNESCAPED = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _label_set(raw: str) -> dict[str, str]:
    """The labels between ``{`` and ``}``; each label must follow the last, or it is malformed."""
    raw = raw.strip(" \t")
    # Checked and split by two C scans; any fault is named by the label-by-label reader.
    pairs = _LABEL.findall(raw) if _LABELS.fullmatch(raw) else None
    if pairs is None or len({name for name, _ in pairs}) != len(pairs):
        return _label_set_named_fault(raw)
    if "\\" not in raw:
        return dict(pairs)
    return {
        name: _ESCAPE.sub(lambda m: _UNESCAPED[m[0]], value) if "\\" in value else value
        for name, value in pairs
    }


def _label_set_named_fault(raw: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(raw):
        label = _LABEL.match(raw, pos)
        if label is None:
            raise ValueError(f"malformed label at {raw[pos : pos + 40]!r}")
        name, value = label.groups()
        if name in labels:
            raise ValueError(f"duplicate label {name!r}")
        labels[name] = _ESCAPE.sub(lambda m: _UNESCAPED[m[0]], value) if "\\" in value else value
        pos = label.end()
    return labels


def _sample(
    line: str, start: int, label_sets: dict[str, dict[str, str]]
) -> tuple[dict[str, str], float]:
    """The labels and value of a sample line whose metric name ends at ``start``."""
    labels: dict[str, str] = {}
    brace = line.find("{", start)
    if brace != -1 and not line[start:brace].strip(" \t"):
        # The last "}" closes the set: a value may hold "}", but what follows the set may not.
        close = line.rfind("}")
        if close < brace:
            raise ValueError("unclosed label set")
        raw = line[brace + 1 : close]
        # A GPU's label set repeats once per metric: parse each distinct one once, share the dict.
        cached = label_sets.get(raw)
        if cached is None:
            cached = label_sets[raw] = _label_set(raw)
        labels, start = cached, close + 1
    value = _VALUE.fullmatch(line, start)
    if value is None:
        raise ValueError("expected a value and an optional timestamp")
    if "_" in value[1]:  # float() takes "1_000"; the format does not
        raise ValueError(f"invalid value {value[1]!r}")
    return labels, float(value[1])


def _line_samples(
    lines: Iterable[tuple[int, str]], metrics: Container[str], label_sets: dict[str, dict]
) -> Iterator[Sample]:
    """The reference reader: line by line, in Python (the scanner below falls back to it)."""
    for number, line in lines:
        line = line.strip()  # the A100 MIG fixture's lines are indented
        if not line or line[0] == "#":
            continue
        name = _METRIC_NAME.match(line)
        if name is None:
            raise ValueError(f"line {number}: no metric name: {line[:200]!r}")
        if name[0] not in metrics:
            continue
        try:
            labels, value = _sample(line, name.end(), label_sets)
        except ValueError as e:
            raise ValueError(f"line {number}: {e}: {line[:200]!r}") from None
        yield name[0], labels, value


@functools.lru_cache(maxsize=16)
def _scanner(names: frozenset[str]) -> re.Pattern[str]:
    """One pattern that finds, in C, every line after the first whose metric is in ``names``.

    It starts with a literal "\\n", so ``re`` jumps from line to line without looking at the
    other lines' text. A line in the common form (labels up to the line's *last* "}", a value
    with neither "_" nor "}", an optional timestamp, blanks) gives its raw labels and value
    (groups 2, 3); any other line of a wanted metric gives group 4 (the rest of the line), and
    the caller hands the whole text to the reference reader, which reads odd forms or names the
    error. A wanted line is one whose longest metric-name prefix is in ``names``, as there.
    """
    alternation = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    common = r"(?:[ \t]*\{(.*)\})?[ \t]+([^\s}_]+)(?:[ \t]+[-+]?[0-9]+)?[^\S\n]*(?=\n|\Z)"
    return re.compile(
        rf"\n[^\S\n]*({alternation})(?![a-zA-Z0-9_:])(?:{common}|([^\n]*))" if names else r"(?!)"
    )


# A line (after the first) that is neither blank, a comment nor starts with a metric name.
_NAMELESS = re.compile(r"\n[^\S\n]*[^\s#a-zA-Z_:]")


def _exposition_samples(text: str, metrics: Collection[str]) -> Iterator[Sample]:
    """(name, labels, value) for each sample of a metric in ``metrics``; other lines unparsed.

    Samples, their order, shared label dicts and errors are those of ``_line_samples`` over
    every line: a 38 MB exposition is scanned in C and only wanted lines reach Python (5x
    faster); an exposition with any line the scanner does not read plainly is read by
    ``_line_samples`` instead.
    """
    label_sets: dict[str, dict[str, str]] = {}
    first_end = text.find("\n")
    if first_end == -1 or _NAMELESS.search(text, first_end):
        yield from _line_samples(enumerate(text.split("\n"), 1), metrics, label_sets)
        return
    samples = list(_line_samples([(1, text[:first_end])], metrics, label_sets))
    for match in _scanner(frozenset(metrics)).finditer(text, first_end):
        name, raw, value, other = match.groups()
        if other is not None:
            samples = None
            break
        if raw is None:
            labels = {}
        else:
            labels = label_sets.get(raw)
            if labels is None:
                try:
                    labels = label_sets[raw] = _label_set(raw)
                except ValueError:
                    samples = None
                    break
        try:
            samples.append((name, labels, float(value)))
        except ValueError:
            samples = None
            break
    if samples is None:  # a line in another form: the reference reader reads it, or says why
        yield from _line_samples(enumerate(text.split("\n"), 1), metrics, {})
        return
    yield from samples


def parse_exposition(
    text: str, config: DcgmConfig | None = None, rejected: list | None = None
) -> list[GpuEvidence]:
    """Evidence from an exporter's ``/metrics`` body (Prometheus text format).

    Raises ``ValueError``, naming the line, on a malformed sample line of a metric in
    ``config.metrics``; lines of other metrics, comments and HELP/TYPE lines are skipped unread.
    """
    config = config or DcgmConfig()
    return evidence_from_samples(_exposition_samples(text, config.metrics), config, rejected)


def _vector_samples(result: Iterable[Any]) -> Iterator[Sample]:
    for series in result:
        try:
            labels = series["metric"]
            # Prometheus sends values as strings ("0", "NaN", "+Inf").
            yield labels.get("__name__", ""), labels, float(series["value"][1])
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"malformed vector sample {series!r:.200}: {e!r}") from None


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
    return evidence_from_samples(_vector_samples(data.get("result") or []), config, rejected)


def prometheus_query(config: DcgmConfig | None = None) -> str:
    """One instant query for every metric in the table, e.g. ``{__name__=~"A|B"}``."""
    names = "|".join(sorted((config or DcgmConfig()).metrics))
    return f'{{__name__=~"{names}"}}'


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


def index_by_uuid(evidence: Iterable[GpuEvidence]) -> dict[str, list[GpuEvidence]]:
    """Physical GPU UUID -> its records: the whole GPU and any MIG instances of it."""
    index: dict[str, list[GpuEvidence]] = {}
    for e in evidence:
        index.setdefault(e.uuid, []).append(e)
    return index


# --- fetching ---------------------------------------------------------------------------------


class DcgmSource:
    """Reads DCGM evidence from Prometheus or straight from exporters; never raises on I/O.

    Prometheus mode sends *one* regex query (``prometheus_query``) rather than one per metric:
    one round trip per cycle, and every metric is evaluated at the same instant, so a GPU's
    activity and PCIe readings belong together. Exporter mode scrapes every URL concurrently;
    an exporter that fails costs only its own node's GPUs, recorded in ``errors``.

    ``fetch`` runs the whole read (HTTP, decompression, parsing) in a worker *process*: a
    10,000-GPU fleet is about 40 MB of text and most of a second of CPU, which in a thread would
    still hold the service's GIL for that long, slowing the pass and every report meanwhile.
    The service only unpickles the evidence (about 25 ms for 10,000 GPUs).
    """

    def __init__(
        self,
        *,
        prometheus_url: str | None = None,
        exporter_urls: Sequence[str] = (),
        config: DcgmConfig | None = None,
        timeout_s: float = 5.0,
        bearer_token: str | None = None,
        headers: Mapping[str, str] | None = None,
        validate_cert: bool = True,
        ca_certs: str | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if bool(prometheus_url) == bool(exporter_urls):
            raise ValueError("DcgmSource: give either prometheus_url or exporter_urls")
        headers = dict(headers or {})
        if bearer_token:
            headers["Authorization"] = f"Bearer {bearer_token}"
        self.reader = DcgmReader(
            prometheus_url=prometheus_url,
            exporter_urls=tuple(exporter_urls),
            config=config or DcgmConfig(),
            timeout_s=timeout_s,
            headers=headers,
            validate_cert=validate_cert,
            ca_certs=ca_certs,
            max_bytes=max_bytes,
        )

    async def fetch(self) -> DcgmSnapshot:
        # Stamped when the read starts, on the service's clock: what a slow answer says is as
        # old as the question (the governor ignores evidence past its dcgm_max_age).
        asked, asked_monotonic = clock.utcnow(), time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            evidence, errors, cpu_s = await loop.run_in_executor(_worker(), self.reader.read)
        except BrokenProcessPool as e:  # the worker died (killed, out of memory): start afresh
            _reset_worker()
            evidence, errors, cpu_s = [], [f"DCGM worker: {type(e).__name__}: {e}"], 0.0
        return DcgmSnapshot(tuple(evidence), asked, tuple(errors), cpu_s, asked_monotonic)


@dataclass(frozen=True)
class DcgmReader:
    """The blocking read, sent to the worker process (so it holds only what pickles)."""

    prometheus_url: str | None
    exporter_urls: tuple[str, ...]
    config: DcgmConfig
    timeout_s: float
    headers: Mapping[str, str]
    validate_cert: bool
    ca_certs: str | None
    max_bytes: int = DEFAULT_MAX_BYTES

    def read(self) -> tuple[list[GpuEvidence], list[str], float]:
        """The blocking read, run in the worker: evidence, errors, and the CPU seconds it took."""
        started = time.process_time()
        if self.prometheus_url:
            results = [self._query_prometheus(self.prometheus_url)]
        else:
            with ThreadPoolExecutor(min(16, len(self.exporter_urls))) as pool:
                results = list(pool.map(self._scrape, self.exporter_urls))
        evidence = [e for found, _ in results for e in found]
        errors = [error for _, errs in results for error in errs]
        return evidence, errors, time.process_time() - started

    def _get(self, url: str, accept: str) -> str:
        """The body of a GET, within ``timeout_s`` in all (connecting, headers, body: a server
        that trickles bytes is cut off at the deadline), at most ``max_bytes`` once
        decompressed. Plain ``http.client``: no proxy from the environment (the exporters are
        in-cluster) and no redirects."""
        parts = urlsplit(url)
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=self.ca_certs)
            if not self.validate_cert:
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.netloc, timeout=self.timeout_s, context=context
            )
        elif parts.scheme == "http":
            connection = http.client.HTTPConnection(parts.netloc, timeout=self.timeout_s)
        else:
            raise ValueError(f"not an http(s) URL: {url!r}")
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        # A socket timeout bounds each wait, not the read: a watchdog ends the whole of it.
        expired = threading.Event()
        watchdog = threading.Timer(self.timeout_s, _cut_off, (connection, expired))
        watchdog.start()
        try:
            headers = {"Accept": accept, "Accept-Encoding": "gzip", **self.headers}
            connection.request("GET", target, headers=headers)
            response = connection.getresponse()
            gzipped = response.getheader("Content-Encoding", "").lower() == "gzip"
            body = _Body(self.max_bytes, gzipped)
            while chunk := response.read1(1 << 20):
                body.add(chunk)
            body.end()
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise TimeoutError(f"no whole answer within {self.timeout_s:g}s") from None
            raise
        finally:
            watchdog.cancel()
            connection.close()
        if expired.is_set():
            raise TimeoutError(f"no whole answer within {self.timeout_s:g}s")
        text = body.text()
        if response.status != 200:
            raise OSError(f"HTTP {response.status} {response.reason}: {text[:200].strip()}")
        return text

    def _scrape(self, url: str) -> tuple[list[GpuEvidence], list[str]]:
        rejected: list[str] = []
        try:
            evidence = parse_exposition(self._get(url, "text/plain"), self.config, rejected)
        except Exception as e:  # any failure degrades to "no DCGM for this node", never a crash
            return [], [f"{url}: {type(e).__name__}: {e}"]
        return evidence, _rejections(url, rejected)

    def _query_prometheus(self, base: str) -> tuple[list[GpuEvidence], list[str]]:
        query = urlencode({"query": prometheus_query(self.config)})
        url = f"{base.rstrip('/')}/api/v1/query?{query}"
        rejected: list[str] = []
        try:
            payload = json.loads(self._get(url, "application/json"))
            evidence = parse_prometheus_query(payload, self.config, rejected)
        except Exception as e:  # any failure degrades to "no DCGM", never a crash
            return [], [f"{base}: {type(e).__name__}: {e}"]
        # Warnings flag partial data (e.g. a Thanos store that did not answer).
        warnings = [f"{base}: warning: {w}" for w in payload.get("warnings") or []]
        return evidence, warnings + _rejections(base, rejected)


def _cut_off(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The read's deadline: the blocked read ends (as an error the reader then names)."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Body:
    """An answer's bytes as they come, decompressed as they come, never past ``limit``."""

    def __init__(self, limit: int, gzipped: bool):
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None

    def add(self, chunk: bytes) -> None:
        if self.inflate is None:
            self._keep(chunk)
            return
        while chunk:
            # At most what is still allowed (+1, to notice going over), however it inflates.
            self._keep(self.inflate.decompress(chunk, self.limit - self.size + 1))
            chunk = self.inflate.unconsumed_tail

    def end(self) -> None:
        if self.inflate is not None:
            self._keep(self.inflate.flush())
            if not self.inflate.eof:
                raise ValueError("the gzip body ends early")

    def _keep(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise ValueError(f"the answer is over {self.limit} bytes (decompressed)")
        self.chunks.append(data)

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")


def _rejections(source: str, rejected: list[str], shown: int = 3) -> list[str]:
    if not rejected:
        return []
    more = f" and {len(rejected) - shown} more" if len(rejected) > shown else ""
    named = ", ".join(rejected[:shown])
    return [f"{source}: {len(rejected)} value(s) out of range ignored (unknown): {named}{more}"]


# One worker process for the service, started at the first fetch. "spawn": the service runs
# threads (asyncio's executor, the diagnosis trainer), which a forked child must not inherit.
_pool: ProcessPoolExecutor | None = None


def _worker() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        context = multiprocessing.get_context("spawn")
        _pool = ProcessPoolExecutor(1, mp_context=context, initializer=_ignore_interrupts)
    return _pool


def _reset_worker() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
    _pool = None


def _ignore_interrupts() -> None:
    # Ctrl-C in a terminal reaches the whole process group: the service shuts its worker down.
    set_signal_handler(SIGINT, SIG_IGN)
