"""Root-cause diagnosis in the governor (docs/api.md "Root causes"): why a server's GPU is
underused, how sure we are, and what each cause costs the cluster.

Every report becomes a diagnosis window (``diagnose.features.windows_from_report``), with
DCGM's DRAM, tensor and PCIe activity when a DCGM snapshot covers the server's GPUs, read in its
server's context (``features.with_context``: the median with the server's last running windows,
of which the numbers it reads are kept, packed, ``_Server.recent``, and read as they are:
``features.with_packed_context``). The model
(``diagnose.counterfactual.Diagnoser``) learns each node's reference online from that window
(``observe``: O(1); at most one window per server per ``diagnose_sample_every``, so no server
weighs more than another by reporting more often) and scores it (``score``: tens of
microseconds), so the verdict that answers the report names the cause, with its confidence.
Windows also go into a bounded history (oldest first out: by age, by count); every
``diagnose_train_every`` a worker thread rebuilds the model from it (``fit``: the references
then reflect exactly the history kept) and saves it; the event loop only hands over the list
and swaps the model in. Each scored window books the time since the server's previous one to
its cause (``diagnose.cluster.CostLedger``), per team and per node.

The diagnosis is advisory: it never changes a decision by itself, and no error in it keeps a
report out. Only a *confident* zombie (``root_cause["confident"]``) may drive an action.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

from ..core import clock
from ..diagnose import cluster, rules
from ..diagnose.counterfactual import Diagnoser
from ..diagnose.features import (
    CONTEXT_HORIZON_S,
    CONTEXT_K,
    CONTEXT_ROW,
    Window,
    is_running,
    windows_from_report,
    with_packed_context,
)
from ..diagnose.labels import UNKNOWN, Diagnosis, names_cause
from . import metrics
from .dcgm import GpuEvidence
from .diagnosis_windows import History, dcgm_fields, node_of, unpack

log = logging.getLogger("jupyter_gpu_gov.hub")

# A server's recent running windows kept for its context: the model's ``context`` of them, as
# ``features.in_context`` keeps reading a file (so a window scored online reads as it does
# there), and never more than this.
CONTEXT_KEEP = 16
# What ``with_context`` reads of an earlier running window is kept as numbers
# (``features.CONTEXT_ROW``): a ``Window`` is ~470 bytes with its floats and strings, these 88.


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


@dataclass(frozen=True, slots=True)  # one per server: no __dict__ each
class Scored:
    """A server's latest diagnosis: its label, and the diagnosis itself only where it names a
    cause (what ``root_cause`` reads; most servers' are healthy, and a diagnosis is two dicts)."""

    label: str
    cause: Diagnosis | None  # None: it names no cause
    at: datetime  # when the report arrived
    # the window's (node, server), whose task reference the model forgets when it stops
    node: str | None
    server: str | None

    @classmethod
    def of(cls, d: Diagnosis, window: Window, at: datetime, before: Scored | None) -> Scored:
        silent = not names_cause(d.label, d.candidates)
        node, server = window.node, window.server
        if before is not None and (before.node, before.server) == (node, server):
            node, server = before.node, before.server  # one string each, not one a report
        return cls(d.label, None if silent else d, at, node, server)

    def root_cause(self) -> dict | None:
        """The verdict's ``root_cause``: ``label``, ``hint``, ``contributions``, ``source``,
        and ``cause`` (the most likely label), ``confidence``, ``confident``, ``candidates``,
        ``gain``; ``None`` when it names no cause (healthy, unknown, or uncertain between
        those)."""
        if self.cause is None:
            return None
        out = self.cause.as_dict()
        out["contributions"] = {
            k: round(float(v), 4)
            for k, v in out["contributions"].items()
            if v is not None and math.isfinite(v)
        }
        return out


@dataclass
class TrainingState:
    trained_at: datetime | None = None
    windows: int = 0
    seconds: float | None = None
    error: str | None = None
    running_since: datetime | None = None
    runs: int = 0


@dataclass(slots=True)  # one per server: no __dict__ each
class _Server:
    """What the diagnosis keeps of a server between its reports (one record, not a dict each)."""

    sampled_at: object = None  # its last report's: the same report again is nothing new
    kept_at: float | None = None  # when its last window was kept (epoch seconds)
    # its last running windows' CONTEXT_ROW, oldest first (``_in_context``)
    recent: array | None = None
    # where its time goes in the cost ledger: when its last window was booked, whose, how many
    # GPU-equivalents (none: not booked)
    booked_at: float | None = None
    team: str = ""
    gpus: float | None = None
    # the card kind its first report named (without DCGM: the report's own words), kept for
    # the session: a server does not change its GPUs while it runs, and a new name in every
    # report would have made a node reference and a task each (~10 kB a report, for good)
    named_node: str | None = None

    def drop(self) -> None:
        """What it is now forgotten (not which report it sent last, nor when one was kept)."""
        self.recent = None
        self.booked_at, self.team, self.gpus = None, "", None


class DiagnosisService:
    """The governor's diagnosis: online scoring, history, training in a worker, the cluster."""

    def __init__(self, options: DiagnosisOptions | None = None):
        self.options = options or DiagnosisOptions()
        self.history = History(self.options.history, self.options.max_windows)
        self.model = Diagnoser()  # learns online from the first report; rebuilt by training
        self.training = TrainingState()
        self.results: dict[str, Scored] = {}
        self.costs = cluster.CostLedger(max(1, self.options.history.days or 1))
        self.score_seconds: float | None = None  # one report's window: context, learn, score
        self._servers: dict[str, _Server] = {}
        # the UTC day the cost ledger books to, and the epoch seconds it spans (``_book``)
        self._day: tuple[float, float, date | None] = (math.inf, -math.inf, None)
        self._task: asyncio.Future | None = None
        self._loaded = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="jupyter-gpu-gov-train")

    # -- online ---------------------------------------------------------------------------------

    def observe(
        self,
        key: str,
        report: Mapping,
        evidence: Sequence[GpuEvidence] = (),
        now=None,
        *,
        team: str | None = None,
        gpus: float | None = None,
        learn: bool = True,
        node: str | None = None,
        believed: bool = True,
    ) -> Scored | None:
        """A report came in: its window learnt, scored and booked (``team``, ``gpus``: whose
        and how many GPU-equivalents, for the cost ledger; ``gpus`` unknown: not booked;
        ``learn`` False: scored, not learnt or kept, as for a report not believed; ``node``:
        the window's node from the Hub's records, ``trusted_node``, else the report's and
        DCGM's, ``node_of``; ``believed`` False: the report contradicts the Hub's records, so
        DCGM's reading of the cards it names places nothing in the cost ledger). Never raises."""
        if not self.options.enabled:
            return None
        now = now or clock.utcnow()
        try:
            started = time.perf_counter()
            server = self._servers.get(key)
            sampled_at = report.get("sampled_at")
            if server is not None and server.sampled_at == sampled_at:
                return self.results.get(key)  # the same report again: nothing new
            if server is None:
                server = self._servers[key] = _Server()
            # The cost ledger's node: one a trusted source names (the Hub's records, DCGM's
            # Hostname), else UNPLACED: a report's card name is its user's word, a key a session.
            booked_node = node
            if node is None:
                if evidence and any(e.hostname for e in evidence):
                    node = booked_node = node_of(report, evidence)
                    if not believed:  # another's card, named by a report not believed
                        booked_node = cluster.UNPLACED
                else:  # named by the report, not by DCGM: its first report's name (read once)
                    node = server.named_node = server.named_node or node_of(report, evidence)
                    booked_node = cluster.UNPLACED
            # t is the report's sampled_at: user_idle_s then reads one clock, the server's.
            dcgm = dcgm_fields(evidence) if evidence else None  # most: no DCGM
            windows = windows_from_report(report, node=node, dcgm=dcgm)
            server.sampled_at = sampled_at
            if not windows:  # it holds no GPU: nothing to diagnose
                self._drop(key)
                return None
            raw = windows[-1]
            stamp = now.timestamp()
            window = self._in_context(server, raw)
            model = self.model
            last = server.kept_at
            if learn and (
                last is None or stamp - last >= self.options.sample_every.total_seconds()
            ):
                # At most one window per server per sample_every is learnt (and kept): a
                # server that reports often weighs no more in its node's reference than one
                # that does not.
                self.history.add(key, raw, stamp)
                server.kept_at = stamp
                model.observe(window)
            diagnosis = self._score(model, window)
            scored = Scored.of(diagnosis, window, now, self.results.get(key))
            self.results[key] = scored
            self._book(server, window, diagnosis, stamp, team, gpus, booked_node)
            cost = time.perf_counter() - started
            self.score_seconds = cost if self.score_seconds is None else (
                0.9 * self.score_seconds + 0.1 * cost
            )  # fmt: skip
            metrics.DIAGNOSIS_SECONDS.observe(cost)
            return scored
        except Exception as error:  # advisory: a report is never refused for it
            log.warning("gpu-gov: diagnosis of %s failed: %s", key, error, exc_info=True)
            self._drop(key)
            return None

    def _in_context(self, server: _Server, window: Window) -> Window:
        """``window`` read with the server's recent running windows (as the model reads its
        training windows); it joins them when it is running."""
        if not is_running(window) or window.t is None:
            return window  # as ``with_context`` reads it; and it joins no context
        model = self.model
        k = getattr(model, "context", CONTEXT_K)
        horizon = getattr(model, "context_horizon_s", CONTEXT_HORIZON_S)
        recent = server.recent
        # read from the numbers kept, as ``with_context`` reads the windows they were
        scored = with_packed_context(window, recent.tolist() if recent else (), k, horizon)
        columns = vars(window)
        row = array("d", [math.nan if (v := columns[c]) is None else v for c in CONTEXT_ROW])
        # as many as a file's reading keeps; a new array each time, its size exact (one that
        # grows keeps room for more)
        keep = (min(max(k, 1), CONTEXT_KEEP) - 1) * len(CONTEXT_ROW)
        server.recent = row if not recent or not keep else recent[-keep:] + row
        return scored

    def _score(self, model: Diagnoser, window: Window) -> Diagnosis:
        """The model's diagnosis, with this site's zombie idle time when it has one of its own
        (the window is read as "away for the rules' time" or "not away")."""
        idle = self.options.zombie_idle
        if idle is not None and window.user_idle_s is not None:
            away = window.user_idle_s >= idle.total_seconds()
            window = replace(window, user_idle_s=rules.ZOMBIE_IDLE_S if away else 0.0)
        # What names no cause is kept as its label alone (``Scored``), and booked by it
        return model.score(window, causes_only=True)

    def _book(
        self, server: _Server, window: Window, d: Diagnosis, stamp, team, gpus, node: str
    ) -> None:
        """The time since the server's last booked window, to this window's cause, under
        ``node`` (the trusted one, or ``cluster.UNPLACED``)."""
        at = server.booked_at
        server.booked_at = stamp
        server.team = team if team is not None else server.team
        server.gpus = gpus if gpus is not None else server.gpus
        if at is None or not server.gpus:
            return
        seconds = min(max(0.0, stamp - at), cluster.MAX_GAP_S)
        first, last, day = self._day
        if not first <= stamp < last:  # a new day (or the clock stepped back)
            day = datetime.fromtimestamp(stamp, tz=timezone.utc).date()
            first = datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()
            # up to a microsecond before the next midnight (fromtimestamp rounds to one)
            last = first + 86400 - 1e-6
            self._day = first, last, day
        self.costs.add(
            day,
            server.team,
            node or cluster.UNPLACED,
            d,
            seconds * server.gpus,
            window.sm_active,
            window.kernel_busy,
        )

    def _drop(self, key: str) -> None:
        self.results.pop(key, None)
        server = self._servers.get(key)
        if server is not None:
            server.drop()

    def root_cause(self, key: str, stale_after: timedelta | None = None) -> dict | None:
        """The verdict's ``root_cause`` (``Scored.root_cause``): ``None`` when it names no
        cause, when not diagnosed, or when the last report is older than ``stale_after``."""
        scored = self.results.get(key)
        if scored is None or scored.cause is None:
            return None  # stale or not: most servers, twice a pass, without a clock read
        if stale_after is not None and clock.utcnow() - scored.at > stale_after:
            return None
        return scored.root_cause()

    def forget(self, key: str) -> None:
        """A server stopped: drop what it is now (its windows stay, for training)."""
        scored = self.results.pop(key, None)
        if scored is not None:
            self.model.forget_task(scored.node, scored.server)
        self._servers.pop(key, None)

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
        count, windows = len(self.history), self.history.snapshot()
        self.training.running_since = now
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            model = await loop.run_in_executor(self._executor, self._fit, unpack(windows))
        except Exception as error:
            self.training.error = f"{type(error).__name__}: {error}"
            log.error("gpu-gov: training the diagnosis model failed: %s", error, exc_info=True)
            return
        seconds = time.perf_counter() - started
        self.model = model
        self.training = TrainingState(
            trained_at=now, windows=count, seconds=seconds, runs=self.training.runs + 1
        )
        metrics.DIAGNOSIS_TRAIN_SECONDS.observe(seconds)
        log.info("gpu-gov: diagnosis model trained on %d windows in %.1f s", count, seconds)

    def _fit(self, windows: Iterable[Window]) -> Diagnoser:
        """In the worker thread: learn the references from the history and save the model.
        (Windows that arrive meanwhile are learnt by the model in use; the history keeps them
        for the next run.)"""
        model = Diagnoser(self.model.params).fit(windows)
        if self.options.model_path:
            path = Path(self.options.model_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            model.save(tmp)
            tmp.replace(path)  # whole or not at all
        return model

    async def _load(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            model = await loop.run_in_executor(self._executor, Diagnoser.load, path)
        except Exception as error:
            log.warning("gpu-gov: cannot load the diagnosis model %s: %s", path, error)
            return
        self.model = model
        mtime = datetime.fromtimestamp(Path(path).stat().st_mtime, tz=clock.utcnow().tzinfo)
        self.training = TrainingState(trained_at=mtime)
        log.info("gpu-gov: diagnosis model loaded from %s", path)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- the cluster ----------------------------------------------------------------------------

    def summary(
        self,
        running: Iterable[str],
        shares: Sequence[float],
        demand: cluster.Demand,
        stale_after: timedelta | None = None,
        *,
        teams: Mapping[str, str] | None = None,
        days: int = 7,
        cards_unknown: str = "",
        nodes: Mapping | None = None,
    ) -> dict:
        """``GET api/diagnosis``: the running servers' causes (with confidence), what each
        cause has cost over the last ``days`` per team and per node, the model, and
        fragmentation (``shares``: per card, the share allocated; ``demand``: spawns waiting;
        ``cards_unknown``: why no card is known, when none is; ``nodes``: on a cluster, what
        blocks each waiting spawn, ``cluster.placement``)."""
        running = set(running)
        now = clock.utcnow()
        counts: Counter[str] = Counter()
        servers = []
        for key in sorted(running):
            scored = self.results.get(key)
            if scored is None or (stale_after is not None and now - scored.at > stale_after):
                counts[UNKNOWN] += 1
                continue
            counts[scored.label] += 1
            cause = scored.root_cause()
            if cause is not None:
                servers.append({"server": key, "team": (teams or {}).get(key, ""), **cause})
        training = self.training
        next_at = None
        if training.trained_at is not None:
            next_at = clock.isoformat(training.trained_at + self.options.train_every)
        since = (now - timedelta(days=max(1, days) - 1)).date()
        return {
            "enabled": self.options.enabled,
            "source": "model",
            "labels": dict(sorted(counts.items())),
            "servers": servers,
            "cost": {"days": days, **self.costs.report(since)},
            "fragmentation": cluster.fragmentation_report(
                list(shares), demand, cards_unknown, nodes
            ),
            "model": {
                "trained_at": clock.isoformat(training.trained_at),
                "training": self.training_running,
                "windows": training.windows,
                "learned": self.model.trained_on,
                "nodes": len({node for node, _ in self.model.nodes}),
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
                "servers": self.history.servers,
                "max_windows": self.options.max_windows,
                "max_age_s": int(self.options.history.total_seconds()),
            },
        }
