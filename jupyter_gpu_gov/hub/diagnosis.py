"""Root-cause diagnosis in the governor (DESIGN §8): why a server's GPU is underused.

Every report becomes a diagnosis window (``diagnose.features.windows_from_report``), with
DCGM's DRAM, tensor and PCIe activity when a DCGM snapshot covers the server's GPUs. Windows go
into a bounded, in-memory history (oldest first out: by age, by count) from which a
``diagnose.counterfactual.Diagnoser`` is trained in a worker thread every
``diagnose_train_every``, the first time as soon as ``diagnose_min_windows`` exist; the event
loop only hands over the list and swaps the model in. Each report is scored when it arrives
(the rules baseline until a model exists), so the verdict that answers it names the cause.

A window is scored in its server's context, as the model was trained
(``diagnose.features.with_context``): each server's last running windows are kept (at most
``CONTEXT_KEEP``, whatever the history's sampling) and the new window is read as their median
with it — a few microseconds, so scoring stays in milliseconds.

The diagnosis is advisory: it never changes a decision, and no error in it keeps a report out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from ..core import clock
from ..diagnose import labels, rules
from ..diagnose.features import (
    CONTEXT_HORIZON_S,
    CONTEXT_K,
    Window,
    is_running,
    windows_from_report,
    with_context,
)
from ..diagnose.labels import HINTS
from . import metrics
from .dcgm import GpuEvidence

log = logging.getLogger("jupyter_gpu_gov.hub")

# A window is scored on the event loop when the model scores one in less than this (seconds,
# measured); else in the scoring thread, in batches.
INLINE_SCORING_S = 0.002

# A server's recent running windows kept for its context (``with_context`` reads the last
# ``Diagnoser.context`` of them).
CONTEXT_KEEP = 16

# Labels that name no cause: no root cause in the verdict.
SILENT_LABELS = frozenset({"healthy", "unknown"})


@dataclass(frozen=True)
class DiagnosisOptions:
    """See ``GpuGovernor.diagnose_*`` for the help."""

    enabled: bool = True
    train_every: timedelta = timedelta(hours=6)
    min_windows: int = 1000
    sample_every: timedelta = timedelta(seconds=60)  # at most one window per server this often
    history: timedelta = timedelta(days=7)
    max_windows: int = 250_000
    model_path: str = ""
    # "No human activity" of the zombie definition: None is the rules' (30 minutes); a demo
    # or test hub with timers in seconds shortens it like its other timers.
    zombie_idle: timedelta | None = None


@dataclass(frozen=True)
class Scored:
    """A server's latest diagnosis, and the window it is about."""

    label: str
    hint: str
    contributions: Mapping[str, float]
    source: str  # model | rules
    window: Window  # as scored: in its server's context
    at: datetime  # when the report arrived

    def root_cause(self) -> dict | None:
        if self.label in SILENT_LABELS:
            return None
        return {
            "label": self.label,
            "hint": self.hint,
            "contributions": dict(self.contributions),
            "source": self.source,
        }


@dataclass
class TrainingState:
    trained_at: datetime | None = None
    windows: int = 0
    seconds: float | None = None
    error: str | None = None
    running_since: datetime | None = None
    runs: int = 0


def node_of(report: Mapping, evidence: Sequence[GpuEvidence]) -> str | None:
    """The window's ``node``: DCGM's hostname of the server's GPUs; without DCGM, the kind of
    GPU it uses ("NVIDIA H100 80GB HBM3", "… MIG 1g.18gb"), so servers on the same kind of card
    share a model (a report does not name its machine)."""
    hostnames = sorted({e.hostname for e in evidence if e.hostname})
    if hostnames:
        return hostnames[0]
    for device in report.get("devices") or ():
        name = device.get("name")
        if name:
            profile = device.get("mig_profile")
            return f"{name} MIG {profile}" if profile and profile not in name else name
    return None


def dcgm_fields(evidence: Sequence[GpuEvidence]) -> dict:
    """A server's DCGM columns from the evidence of its GPUs: the busiest GPU's SM, GR-engine,
    DRAM and tensor activity (as the report's ``sm`` is its busiest device's), PCIe summed, in
    MB/s. Missing stays missing."""

    def busiest(values: Iterable[float | None]) -> float | None:
        known = [v for v in values if v is not None and math.isfinite(v)]
        return max(known) if known else None

    pcie = [e.pcie_bytes_per_s for e in evidence if e.pcie_bytes_per_s is not None]
    return {
        "sm_active": busiest(e.sm_active for e in evidence),
        "gr_active": busiest(e.gr_active for e in evidence),
        "dram_active": busiest(e.dram_active for e in evidence),
        "tensor_active": busiest(e.tensor_active for e in evidence),
        "pcie_mb_s": round(sum(pcie) / 1e6, 3) if pcie else None,
    }


class History:
    """Windows per server, oldest out first once older than ``max_age`` or beyond ``limit`` in
    all: one FIFO over every server, so a cap costs O(1) per window."""

    def __init__(self, max_age: timedelta, limit: int):
        self.max_age = max_age.total_seconds()
        self.limit = limit
        self.by_server: dict[str, deque[Window]] = {}
        self._order: deque[tuple[float, str]] = deque()  # (when added, server) per window

    def __len__(self) -> int:
        return len(self._order)

    def add(self, key: str, window: Window, now: float) -> None:
        self.by_server.setdefault(key, deque()).append(window)
        self._order.append((now, key))
        self.trim(now)

    def trim(self, now: float) -> None:
        order = self._order
        while order and (len(order) > self.limit or now - order[0][0] > self.max_age):
            _, key = order.popleft()
            windows = self.by_server[key]
            windows.popleft()
            if not windows:
                del self.by_server[key]

    def windows(self) -> list[Window]:
        return [w for windows in self.by_server.values() for w in windows]


class DiagnosisService:
    """The governor's diagnosis: history, training in a worker, scoring, and what it found."""

    def __init__(self, options: DiagnosisOptions | None = None):
        self.options = options or DiagnosisOptions()
        self.history = History(self.options.history, self.options.max_windows)
        self.model = None  # a diagnose.counterfactual.Diagnoser once trained (or loaded)
        self.training = TrainingState()
        self.results: dict[str, Scored] = {}
        self._latest: dict[str, tuple[Window, datetime]] = {}  # each server's last window
        self._recent: dict[str, deque[Window]] = {}  # each server's last running windows
        self._pending: dict[str, Window] = {}  # windows waiting for the model
        self._scoring: asyncio.Future | None = None
        self.score_seconds: float | None = None  # one window's scoring with the model, measured
        self._previous: dict[str, dict] = {}  # the last report of each server
        self._last_kept: dict[str, float] = {}  # when each server's last window was kept
        self._task: asyncio.Future | None = None
        self._loaded = False
        # Training may take minutes; scoring must not wait behind it: a thread each, both
        # with scikit-learn's OpenMP kept to themselves (``_one_openmp_thread``).
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix="jupyter-gpu-gov-train", initializer=_one_openmp_thread
        )
        self._score_executor = ThreadPoolExecutor(
            1, thread_name_prefix="jupyter-gpu-gov-score", initializer=_one_openmp_thread
        )

    # -- online ---------------------------------------------------------------------------------

    def observe(
        self, key: str, report: Mapping, evidence: Sequence[GpuEvidence] = (), now=None
    ) -> Scored | None:
        """A report came in: its window into the history and its diagnosis. Never raises.

        The rules (until a model exists) and a model that scores a window in under
        ``INLINE_SCORING_S`` diagnose at once, so the verdict answering this report carries
        its root cause. A slower model scores in the scoring thread, in batches with the
        windows of other servers that arrive meanwhile (a scikit-learn call costs about as
        much for one window as for a hundred); its result replaces the server's previous one
        within milliseconds, and the verdict answering this report carries the previous one
        (as its state is the last pass's)."""
        if not self.options.enabled:
            return None
        now = now or clock.utcnow()
        try:
            started = time.perf_counter()
            previous = self._previous.get(key)
            if previous is not None and previous.get("sampled_at") == report.get("sampled_at"):
                return self.results.get(key)  # the same report again: nothing new
            # t is the report's sampled_at: user_idle_s then reads one clock, the server's.
            windows = windows_from_report(
                report, previous, node=node_of(report, evidence), dcgm=dcgm_fields(evidence)
            )
            self._previous[key] = report
            if not windows:  # it holds no GPU: nothing to diagnose
                self._drop(key)
                return None
            raw = windows[-1]
            stamp = now.timestamp()
            last = self._last_kept.get(key)
            if last is None or stamp - last >= self.options.sample_every.total_seconds():
                self.history.add(key, raw, stamp)
                self._last_kept[key] = stamp
            window = self._in_context(key, raw)
            self._latest[key] = (window, now)
            inline = self.score_seconds is not None and self.score_seconds < INLINE_SCORING_S
            if self.model is None or inline or not _loop_running():
                scoring = time.perf_counter()
                self.results[key] = self._scored(
                    self._diagnose([window], self.model)[0], window, now
                )
                if self.model is not None:  # keep the measure current: slower, off the loop
                    cost = time.perf_counter() - scoring
                    self.score_seconds = 0.9 * (self.score_seconds or cost) + 0.1 * cost
            else:
                self._pending[key] = window
                self._kick()
            metrics.DIAGNOSIS_SECONDS.observe(time.perf_counter() - started)
            return self.results.get(key)
        except Exception as error:  # advisory: a report is never refused for it
            log.warning("gpu-gov: diagnosis of %s failed: %s", key, error, exc_info=True)
            self._drop(key)
            return None

    def _in_context(self, key: str, window: Window) -> Window:
        """``window`` read with the server's recent running windows (as the model reads its
        training windows); it joins them when it is running."""
        model = self.model
        k = getattr(model, "context", CONTEXT_K)
        horizon = getattr(model, "context_horizon_s", CONTEXT_HORIZON_S)
        recent = self._recent.setdefault(key, deque(maxlen=CONTEXT_KEEP))
        scored = with_context(window, recent, k, horizon)
        if is_running(window) and window.t is not None:
            recent.append(window)
        return scored

    def _kick(self) -> None:
        """Score the pending windows in the scoring thread, one batch at a time."""
        if not self._pending or (self._scoring is not None and not self._scoring.done()):
            return
        batch, self._pending = self._pending, {}
        model = self.model
        keys, windows = list(batch), list(batch.values())
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._score_executor, self._timed, windows, model)

        def done(future: asyncio.Future) -> None:
            if future.cancelled():  # shutting down
                return
            try:
                diagnoses, seconds = future.result()
                if len(windows) == 1 and model is self.model:
                    self.score_seconds = seconds
            except Exception as error:
                log.warning("gpu-gov: scoring %d windows failed: %s", len(windows), error)
                diagnoses = [None] * len(windows)
            for key, window, diagnosis in zip(keys, windows, diagnoses, strict=True):
                latest = self._latest.get(key)
                if latest is None or latest[0] is not window:
                    continue  # a newer report came, or the server stopped
                if model is not self.model:  # a new model meanwhile: score it again
                    self._pending.setdefault(key, window)
                elif diagnosis is None:
                    self.results.pop(key, None)
                else:
                    self.results[key] = self._scored(diagnosis, window, latest[1])
            self._kick()

        self._scoring = future
        future.add_done_callback(done)

    async def settled(self) -> None:
        """Wait until every window received so far is scored (tests, shutdown)."""
        while self._pending or (self._scoring is not None and not self._scoring.done()):
            if self._scoring is not None and not self._scoring.done():
                await asyncio.wait([self._scoring])
            await asyncio.sleep(0)
            self._kick()

    @staticmethod
    def _scored(diagnosis, window: Window, at: datetime) -> Scored:
        label = diagnosis.label
        return Scored(
            label=label,
            hint=diagnosis.hint or HINTS.get(label, ""),
            contributions={
                k: round(float(v), 4)
                for k, v in (diagnosis.contributions or {}).items()
                if v is not None and math.isfinite(v)
            },
            source=diagnosis.source,
            window=window,
            at=at,
        )

    def _diagnose(self, windows: Sequence[Window], model) -> list:
        """The model's diagnoses (the rules' until there is one), with this site's zombie idle
        time when it has one of its own. Runs in the scoring or training thread with a model."""
        out: list = [None] * len(windows)
        rest: list[int] = []
        scored: list[Window] = []
        idle = self.options.zombie_idle
        for i, window in enumerate(windows):
            if idle is not None and window.user_idle_s is not None:
                # The rules' definition, "nobody for zombie_idle" for "nobody for 30 minutes".
                away = window.user_idle_s >= idle.total_seconds()
                if rules.is_zombie(
                    replace(window, user_idle_s=rules.ZOMBIE_IDLE_S if away else 0.0)
                ):
                    out[i] = labels.diagnosis(labels.ZOMBIE)
                    continue
                if rules.is_zombie(window):  # a longer site time: not a zombie yet here
                    window = replace(window, user_idle_s=rules.ZOMBIE_IDLE_S - 1.0)
            rest.append(i)
            scored.append(window)
        if model is not None:
            found = model.diagnose_many(scored, context=False)  # in context already
        else:
            found = [rules.baseline(w) for w in scored]
        for i, diagnosis in zip(rest, found, strict=True):
            out[i] = diagnosis
        return out

    def _timed(self, windows: Sequence[Window], model) -> tuple[list, float]:
        started = time.perf_counter()
        return self._diagnose(windows, model), time.perf_counter() - started

    def _one_window_seconds(self, model, windows: Sequence[Window]) -> float | None:
        """How long ``model`` takes for one window alone: the slowest of up to 20 recent
        windows in which code runs (those the regressor scores), each scored alone."""
        running = [w for w in windows if w.kernel_busy and w.sm_active is not None][-20:]
        costs = []
        for window in running or list(windows)[-20:]:
            started = time.perf_counter()
            self._diagnose([window], model)
            costs.append(time.perf_counter() - started)
        return max(costs) if costs else None

    def _drop(self, key: str) -> None:
        self._recent.pop(key, None)
        self.results.pop(key, None)
        self._latest.pop(key, None)
        self._pending.pop(key, None)

    def root_cause(self, key: str, stale_after: timedelta | None = None) -> dict | None:
        """The verdict's ``root_cause``: ``None`` when healthy, unknown, or not diagnosed (or
        the last report is older than ``stale_after``)."""
        scored = self.results.get(key)
        if scored is None:
            return None
        if stale_after is not None and clock.utcnow() - scored.at > stale_after:
            return None
        return scored.root_cause()

    def forget(self, key: str) -> None:
        """A server stopped: drop what it is now (its windows stay, for training)."""
        self._drop(key)
        self._previous.pop(key, None)
        self._last_kept.pop(key, None)

    # -- training, in the worker ----------------------------------------------------------------

    @property
    def training_running(self) -> bool:
        return self._task is not None and not self._task.done()

    def due(self, now: datetime) -> bool:
        if not self.options.enabled or self.training_running:
            return False
        if len(self.history) < max(1, self.options.min_windows):
            return False
        last = self.training.trained_at
        if self.training.error is not None and self.training.running_since is not None:
            last = self.training.running_since  # a failed run waits a full period too
        return last is None or now - last >= self.options.train_every

    def maybe_train(self, now: datetime | None = None) -> asyncio.Future | None:
        """Start a training run in the worker when one is due (the reconcile pass calls this);
        returns its task, or ``None``. The loop only copies the list of windows."""
        now = now or clock.utcnow()
        if not self._loaded:
            self._loaded = True
            if self.options.model_path and Path(self.options.model_path).exists():
                self._task = asyncio.ensure_future(self._load(self.options.model_path))
                return self._task
        if not self.due(now):
            return None
        self._task = asyncio.ensure_future(self.train(now))
        return self._task

    async def train(self, now: datetime | None = None) -> None:
        now = now or clock.utcnow()
        windows = self.history.windows()
        latest = {key: window for key, (window, _) in self._latest.items()}
        self.training.running_since = now
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            model, rescored, cost = await loop.run_in_executor(
                self._executor, self._fit, windows, latest, now
            )
        except Exception as error:
            self.training.error = f"{type(error).__name__}: {error}"
            log.error("gpu-gov: training the diagnosis model failed: %s", error, exc_info=True)
            return
        seconds = time.perf_counter() - started
        self.model, self.score_seconds = model, cost
        self.training = TrainingState(
            trained_at=now, windows=len(windows), seconds=seconds, runs=self.training.runs + 1
        )
        metrics.DIAGNOSIS_TRAIN_SECONDS.observe(seconds)
        for key, latest in self._latest.items():
            window, diagnosis = rescored.get(key, (None, None))
            if latest[0] is window:
                self.results[key] = self._scored(diagnosis, *latest)
            else:  # a report that came during the training: the new model scores it
                self._pending[key] = latest[0]
        if _loop_running():
            self._kick()
        log.info("gpu-gov: diagnosis model trained on %d windows in %.1f s", len(windows), seconds)

    def _fit(self, windows: list[Window], latest: Mapping[str, Window], now: datetime):
        """In the worker thread: fit, save, and re-score each server's latest window."""
        from ..diagnose.counterfactual import Diagnoser

        model = Diagnoser().fit(windows)
        if self.options.model_path:
            path = Path(self.options.model_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            model.save(tmp)
            tmp.replace(path)  # whole or not at all
        cost = self._one_window_seconds(model, windows)
        keys, windows = list(latest), list(latest.values())
        diagnoses = self._diagnose(windows, model)
        rescored = {k: (w, d) for k, w, d in zip(keys, windows, diagnoses, strict=True)}
        return model, rescored, cost

    async def _load(self, path: str) -> None:
        from ..diagnose.counterfactual import Diagnoser

        loop = asyncio.get_running_loop()
        try:
            model = await loop.run_in_executor(self._executor, Diagnoser.load, path)
            recent = [w for windows in self.history.by_server.values() for w in windows][-200:]
            cost = await loop.run_in_executor(
                self._executor, self._one_window_seconds, model, recent
            )
        except Exception as error:
            log.warning("gpu-gov: cannot load the diagnosis model %s: %s", path, error)
            return
        self.model, self.score_seconds = model, cost
        mtime = datetime.fromtimestamp(Path(path).stat().st_mtime, tz=clock.utcnow().tzinfo)
        self.training = TrainingState(trained_at=mtime)
        log.info("gpu-gov: diagnosis model loaded from %s", path)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for executor in (self._executor, self._score_executor):
            executor.shutdown(wait=False, cancel_futures=True)

    # -- the cluster ----------------------------------------------------------------------------

    def summary(
        self,
        running: Iterable[str],
        devices_used: Sequence[float],
        queued: int,
        stale_after: timedelta | None = None,
    ) -> dict:
        """``GET api/diagnosis``: labels of the running servers, the model, fragmentation."""
        running = set(running)
        now = clock.utcnow()
        counts: Counter[str] = Counter()
        servers = []
        for key in sorted(running):
            scored = self.results.get(key)
            if scored is None or (stale_after is not None and now - scored.at > stale_after):
                counts["unknown"] += 1
                continue
            counts[scored.label] += 1
            if scored.label not in SILENT_LABELS:
                servers.append({"server": key, **scored.root_cause()})
        cluster = cluster_fragmentation(devices_used, queued)
        training = self.training
        next_at = None
        if training.trained_at is not None:
            next_at = clock.isoformat(training.trained_at + self.options.train_every)
        return {
            "enabled": self.options.enabled,
            "source": "model" if self.model is not None else "rules",
            "labels": dict(sorted(counts.items())),
            "servers": servers,
            "fragmentation": cluster,
            "model": {
                "trained_at": clock.isoformat(training.trained_at),
                "training": self.training_running,
                "windows": training.windows,
                "train_seconds": None if training.seconds is None else round(training.seconds, 3),
                "error": training.error,
                "next_training_at": next_at,
                "min_windows": self.options.min_windows,
                "score_ms": None
                if self.score_seconds is None
                else round(self.score_seconds * 1000, 3),
            },
            "history": {
                "windows": len(self.history),
                "servers": len(self.history.by_server),
                "max_windows": self.options.max_windows,
                "max_age_s": int(self.options.history.total_seconds()),
            },
        }


def preload() -> bool:
    """Import scikit-learn now, at start-up, while nothing waits on the event loop: loading
    its shared libraries (and scipy's) holds the GIL for a few hundred milliseconds, which the
    first training would otherwise take out of the loop. ``False`` without scikit-learn (the
    rules then diagnose)."""
    try:
        import sklearn.ensemble  # noqa: F401
    except ImportError:
        return False
    return True


def _one_openmp_thread() -> None:
    """The worker threads' initializer: scikit-learn's OpenMP runs in the calling thread
    alone from now on. With a team per core, its threads spin at every barrier while the event
    loop (or anything else on the machine) holds a core: training took 30-100 times longer on
    two cores, and the spinning threads starve the service. OpenMP's thread count is per
    thread, so nothing else in the process is affected. (Set once: setting it costs about
    2 ms, more than scoring a window.)"""
    try:
        # Load scikit-learn's OpenMP runtime first: threadpoolctl limits only the libraries
        # loaded when it is called, and scikit-learn is imported lazily, at the first fit.
        import sklearn.ensemble  # noqa: F401
        from threadpoolctl import threadpool_limits
    except ImportError:  # no scikit-learn: no model either
        return
    threadpool_limits(limits=1, user_api="openmp")


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def cluster_fragmentation(devices_used: Sequence[float], queued: int | None) -> dict:
    """The cluster-level flag: GPUs partly used while spawns are refused or queued
    (``diagnose.counterfactual.fragmentation`` decides; ``queued`` ``None``: not known, only
    the devices count)."""
    from ..diagnose import counterfactual

    partly = [used for used in devices_used if 0 < used < 1]
    finding = counterfactual.fragmentation(list(devices_used), queued or 0)
    return {
        "flag": finding is not None,
        "label": finding.label if finding is not None else None,
        "hint": finding.hint if finding is not None else None,
        "devices": len(devices_used),
        "devices_partly_used": len(partly),
        "free_scattered": round(sum(1 - used for used in partly), 3),  # cards' worth
        "spawns_waiting": queued,
    }
