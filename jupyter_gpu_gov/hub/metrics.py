"""The governor's Prometheus metrics, in a registry of its own (served at ``/metrics``)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from contextlib import suppress

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..core.vocabulary import STATES

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
STORE_ERRORS = Counter(
    "jupyter_gpu_gov_store_errors_total",
    "Writes the store refused (locked, full, unreachable); their actions were not taken",
    registry=REGISTRY,
)
DCGM_ERRORS = Counter(
    "jupyter_gpu_gov_dcgm_errors_total",
    "DCGM reads that failed or came back partial (an exporter or Prometheus not answering, a "
    "malformed answer, a Prometheus warning); those passes govern without DCGM",
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

GPU_SECONDS = Counter(
    "jupyter_gpu_gov_gpu_seconds_total",
    "GPU-equivalent seconds held by servers, by team and state (active, idle_held: idle with "
    "GPU memory held, idle_free: idle without a context, unknown, unobserved: a gap in the "
    "governor's observations), as the usage ledger bills them",
    ("team", "state"),
    registry=REGISTRY,
)
TEAM_SERVERS = Gauge(
    "jupyter_gpu_gov_team_servers",
    "Running servers by team and governor state",
    ("team", "state"),
    registry=REGISTRY,
)
SERVER_INFO = Gauge(
    "jupyter_gpu_gov_server_gpu_equivalents",
    "GPU-equivalents each running server holds, with its ownership (join with dcgm-exporter "
    "series on the pod, or on user and server). No state label: a series per server for its "
    "whole life; states are counted in jupyter_gpu_gov_team_gpu_equivalents",
    ("user", "server", "team", "project", "tier", "pod", "namespace"),
    registry=REGISTRY,
)
TEAM_GPUS = Gauge(
    "jupyter_gpu_gov_team_gpu_equivalents",
    "GPU-equivalents held by running servers, by team and governor state",
    ("team", "state"),
    registry=REGISTRY,
)

# SERVER_INFO's series and their values, as last set (only observe_states writes SERVER_INFO).
_server_series: dict[tuple[str, ...], float] = {}


def observe_states(rows: Iterable, gpus: dict | None = None, pods: dict | None = None) -> None:
    """Servers by state, by team and state, GPU-equivalents by team and state, and one series
    per server (its GPU-equivalents, from ``gpus``: server key -> GPU-equivalents; ``pods``:
    key -> (namespace, pod)). A server's own series carries no state, so a change of state
    moves a count, never makes a new series."""
    gpus, pods = gpus or {}, pods or {}
    by_state: Tally = Tally()
    by_team: Tally = Tally()
    held: Tally = Tally()
    series = {}
    for row in rows:  # each attribute read once: rows are ORM objects, 10,000 of them
        key, state, team = row.key, row.state, row.team or ""
        by_state[state] += 1
        by_team[team, state] += 1
        namespace, pod = pods.get(key) or ("", "")
        labels = (row.user, row.name, team, row.project or "", row.tier or "")
        series[(*labels, pod, namespace)] = gpus.get(key, 0.0)
        held[team, state] += gpus.get(key, 0.0)
    for state in STATES:
        SERVERS.labels(state).set(by_state.get(state, 0))
    for gauge, counts in ((TEAM_SERVERS, by_team), (TEAM_GPUS, held)):
        gauge.clear()
        for (team, state), count in counts.items():
            gauge.labels(team, state).set(count)
    # Update in place (a series made anew costs a label check) and only where the value changed
    # (most do not, pass after pass): labels() is not free (docs/benchmarks.md, "Performance
    # measures, one place each").
    for gone in _server_series.keys() - series.keys():
        with suppress(KeyError):  # already gone
            SERVER_INFO.remove(*gone)
    for labels, value in series.items():
        if _server_series.get(labels) != value:
            SERVER_INFO.labels(*labels).set(value)
    _server_series.clear()
    _server_series.update(series)


# -- GPU health (hub/health.py; the alert rules in hub_config/prometheus/ read these) ----------

GPU_UNHEALTHY = Gauge(
    "jupyter_gpu_gov_gpu_unhealthy",
    "1 for each GPU that is not healthy: status unhealthy (action reset: it failed; drain: it "
    "needs a reset once its work is done) or unknown (DCGM stopped reporting it); source dcgm "
    "(trusted) or report (the server holding it says so)",
    ("node", "gpu", "uuid", "status", "action", "source"),
    registry=REGISTRY,
)
SERVERS_GPU_UNKNOWN = Gauge(
    "jupyter_gpu_gov_servers_gpu_unknown_too_long",
    "Running servers whose GPU state has been unknown (or failed) longer than "
    "unknown_alert_after: an admin should look; they are not culled for it",
    registry=REGISTRY,
)


def observe_gpu_health(problems: Iterable[tuple], flagged: int) -> None:
    """``problems``: (node, gpu index, uuid, Health, source) of each GPU that is not healthy."""
    GPU_UNHEALTHY.clear()  # a handful of series at most: rebuilt each pass
    for node, index, uuid, checked, source in problems:
        GPU_UNHEALTHY.labels(node, index, uuid, checked.status, checked.action or "", source).set(1)
    SERVERS_GPU_UNKNOWN.set(flagged)
