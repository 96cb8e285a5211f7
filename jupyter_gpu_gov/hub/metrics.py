"""The governor's Prometheus metrics, in a registry of its own (served at ``/metrics``)."""

from __future__ import annotations

import math
import threading
from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..core.vocabulary import STATES

REGISTRY = CollectorRegistry()
# Held while gauges are rebuilt (cleared, then set again) and while a scrape is written: the
# scrape is written in a worker thread (``routes.MetricsHandler``), and without it could read a
# team's series between their clear and their set, as missing.
REBUILDING = threading.Lock()


def exposition() -> bytes:
    """The registry in Prometheus' text format, never in the middle of a rebuild (a worker's)."""
    with REBUILDING:
        return generate_latest(REGISTRY)


SERVERS = Gauge(
    "jupyter_gpu_gov_servers",
    "Running servers by governor state",
    ("state",),
    registry=REGISTRY,
)
REPORTS = Counter(
    "jupyter_gpu_gov_reports_total",
    "Reports received from servers, by result (accepted, invalid, forbidden, throttled)",
    ("result",),
    registry=REGISTRY,
)
CALLERS_REFUSED = Counter(
    "jupyter_gpu_gov_callers_refused_total",
    "Requests to the API and the pages refused (403) from callers the Hub knows that lack the "
    "service's access scope (logged once per caller a minute, then a count)",
    registry=REGISTRY,
)
WARNINGS = Counter(
    "jupyter_gpu_gov_warnings_total",
    "Warnings issued, as the audit names them: warn (idle), max-age-warn, reclaim-warn, admin-warn",
    registry=REGISTRY,
)
EXTENSIONS = Counter(
    "jupyter_gpu_gov_extensions_total",
    "Extension requests on record (GET api/extensions), by their outcome when asked (granted, "
    "pending, refused); an ask repeated while nothing changed, answered as before, is none",
    ("status",),
    registry=REGISTRY,
)
CULLS = Counter(
    "jupyter_gpu_gov_culls_total",
    "Culls by reason (gpu-idle, max-age, reclaim, admin, busy-limit, inactive, unclaimed) and action",
    ("reason", "action"),
    registry=REGISTRY,
)
GPUS_RECLAIMED = Counter(
    "jupyter_gpu_gov_gpus_reclaimed_total",
    "GPUs (whole cards or MIG instances) given back by culls of idle servers",
    registry=REGISTRY,
)
LEADER = Gauge(
    "jupyter_gpu_gov_leader",
    "1 while this governor holds its store's lease and acts; 0 on standby (another one acts)",
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


class ServerSeries:
    """``jupyter_gpu_gov_server_gpu_equivalents``: a gauge with one series per running server,
    read as a ``Gauge`` with these labels reads, from a dict of each series' labels and value.
    A ``Gauge`` kept a child a series (its ``__dict__``, a value with its own lock): about
    0.65 kB a server, 6 MB at 10,000 (docs/benchmarks-history.md, "Issue 26, wave 27: memory")."""

    NAME = "jupyter_gpu_gov_server_gpu_equivalents"
    DOCUMENTATION = (
        "GPU-equivalents each running server holds, with its ownership (join with dcgm-exporter "
        "series on the pod, or on user and server). No state label: a series per server for its "
        "whole life; states are counted in jupyter_gpu_gov_team_gpu_equivalents"
    )
    LABELS = ("user", "server", "team", "project", "tier", "pod", "namespace")

    def __init__(self) -> None:
        self._values: dict[tuple[str, ...], float] = {}  # labels -> GPU-equivalents

    def set(self, labels: tuple, value: float) -> None:
        self._values[_texts(labels)] = float(value)

    def remove(self, labels: tuple) -> None:
        self._values.pop(_texts(labels), None)

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.NAME, self.DOCUMENTATION, labels=self.LABELS)]

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.NAME, self.DOCUMENTATION, labels=self.LABELS)
        for labels, value in list(self._values.items()):
            family.add_metric(labels, value)
        return [family]


def _texts(labels: tuple) -> tuple[str, ...]:
    """Label values as a ``Gauge`` keeps them (``str`` of each); the tuple itself when they are
    strings already, as a server's are, so the series shares it with ``StateGauges``."""
    if all(type(value) is str for value in labels):
        return labels
    return tuple(map(str, labels))


SERVER_INFO = ServerSeries()
REGISTRY.register(SERVER_INFO)  # where the Gauge was: /metrics lists the same order

TEAM_GPUS = Gauge(
    "jupyter_gpu_gov_team_gpu_equivalents",
    "GPU-equivalents held by running servers, by team and governor state",
    ("team", "state"),
    registry=REGISTRY,
)


class StateGauges:
    """Servers by state, by team and state, GPU-equivalents by team and state, and one series
    per server (its GPU-equivalents; its pod), kept per server: a pass sets the servers it
    decided or found stopped (``set``, ``drop``), not every running one, and ``publish``es.
    A server's own series carries no state, so a change of state moves a count, never makes a
    new series. A team's GPU-equivalents are summed exactly (``math.fsum``): the same figure
    whatever order the servers came in."""

    def __init__(self) -> None:
        self._each: dict[str, tuple] = {}  # key -> ((team, state), gpus, series labels)
        self._groups: dict[tuple[str, str], dict[str, float]] = {}  # (team, state) -> key -> gpus
        self._sums: dict[tuple[str, str], float] = {}  # each group's GPU-equivalents
        self._moved: dict[tuple, float | None] = {}  # SERVER_INFO to set (None: remove)

    def __iter__(self):
        return iter(list(self._each))

    def set(self, key: str, row, gpus: float, pod: tuple[str, str]) -> None:
        """A running server as its row (state, ownership), ledger and report say now
        (``pod``: (namespace, pod))."""
        team, state = row.team or "", row.state  # each attribute read once: ORM rows
        namespace, name = pod
        labels = (row.user, row.name, team, row.project or "", row.tier or "", name, namespace)
        old = self._each.get(key)
        if old is not None and old[2] == labels:
            labels = old[2]  # the tuple the series holds: one a server, not one a pass
        entry = ((team, state), gpus, labels)
        if old == entry:
            return
        if old is not None:
            self._leave(key, old)
        self._each[key] = entry
        self._groups.setdefault(entry[0], {})[key] = gpus
        self._sums.pop(entry[0], None)
        self._moved[labels] = gpus

    def drop(self, key: str) -> None:
        """A server no longer running."""
        old = self._each.pop(key, None)
        if old is not None:
            self._leave(key, old)

    def _leave(self, key: str, old: tuple) -> None:
        group, _, labels = old
        members = self._groups[group]
        del members[key]
        if not members:
            del self._groups[group]
        self._sums.pop(group, None)
        self._moved[labels] = None  # removed, unless set again before the next publish

    def publish(self) -> None:
        by_state: Tally = Tally()
        for (_, state), members in self._groups.items():
            by_state[state] += len(members)
        for state in STATES:
            SERVERS.labels(state).set(by_state.get(state, 0))
        with REBUILDING:
            TEAM_SERVERS.clear()
            TEAM_GPUS.clear()
            for group, members in sorted(self._groups.items()):
                total = self._sums.get(group)
                if total is None:
                    total = self._sums[group] = math.fsum(members.values())
                TEAM_SERVERS.labels(*group).set(len(members))
                TEAM_GPUS.labels(*group).set(total)
        # Only the series that moved: labels() is not free (docs/benchmarks-history.md, "Performance
        # measures, one place each").
        for labels, value in self._moved.items():
            if value is None:
                SERVER_INFO.remove(labels)
            else:
                SERVER_INFO.set(labels, value)
        self._moved.clear()


# -- GPU health (hub/health.py; the alert rules in hub_config/prometheus/ read these) ----------

GPU_UNHEALTHY = Gauge(
    "jupyter_gpu_gov_gpu_unhealthy",
    "1 for each GPU that is not healthy: status unhealthy (action reset: it failed; drain: it "
    "needs a reset once its work is done) or unknown (DCGM stopped reporting it); source dcgm "
    "(DCGM reads it so: the shipped alert rules read these alone) or report (the server's own "
    "claim, which no trusted source corroborates: shown, never alerted on)",
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
    problems = list(problems)  # read before the lock: a scrape waits for the rebuild alone
    with REBUILDING:
        GPU_UNHEALTHY.clear()  # a handful of series at most: rebuilt each pass
        for node, index, uuid, checked, source in problems:
            labels = (node, index, uuid, checked.status, checked.action or "", source)
            GPU_UNHEALTHY.labels(*labels).set(1)
    SERVERS_GPU_UNKNOWN.set(flagged)
