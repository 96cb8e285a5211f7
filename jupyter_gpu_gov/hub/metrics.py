"""The governor's Prometheus metrics, in a registry of its own (served at ``/metrics``)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

SERVERS = Gauge(
    "jupyter_gpu_gov_servers",
    "Running servers by governor state",
    ("state",),
    registry=REGISTRY,
)
REPORTS = Counter(
    "jupyter_gpu_gov_reports_total",
    "Reports received from servers, by result (accepted, invalid, forbidden)",
    ("result",),
    registry=REGISTRY,
)
WARNINGS = Counter(
    "jupyter_gpu_gov_warnings_total", "Idle and max-age warnings issued", registry=REGISTRY
)
EXTENSIONS = Counter(
    "jupyter_gpu_gov_extensions_total",
    "Extension requests by outcome (granted, pending, refused)",
    ("status",),
    registry=REGISTRY,
)
CULLS = Counter(
    "jupyter_gpu_gov_culls_total",
    "Culls by reason (gpu-idle, max-age, inactive, admin) and action",
    ("reason", "action"),
    registry=REGISTRY,
)
GPUS_RECLAIMED = Counter(
    "jupyter_gpu_gov_gpus_reclaimed_total",
    "GPUs (whole cards or MIG instances) given back by culls of idle servers",
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "jupyter_gpu_gov_reconcile_duration_seconds",
    "Wall time of one reconcile pass over every server",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)

DIAGNOSIS_SECONDS = Histogram(
    "jupyter_gpu_gov_diagnosis_duration_seconds",
    "Time to turn one report into a diagnosis window and score it (on the event loop)",
    buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
    registry=REGISTRY,
)
DIAGNOSIS_TRAIN_SECONDS = Histogram(
    "jupyter_gpu_gov_diagnosis_training_duration_seconds",
    "Wall time of one training run of the diagnosis model (in a worker thread)",
    buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 300, 900),
    registry=REGISTRY,
)

STATES = ("active", "idle", "warned", "checkpointing", "culled", "exempt", "unknown")


def observe_states(rows: Iterable) -> None:
    tally = Tally(row.state for row in rows)
    for state in STATES:
        SERVERS.labels(state).set(tally.get(state, 0))
