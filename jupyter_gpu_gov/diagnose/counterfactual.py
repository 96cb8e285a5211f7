"""The counterfactual model (DESIGN §8): why is this GPU less busy than it could be?

What it does, for a window in which code runs:

0. **Server context.** Each running window is read with its server's recent running windows:
   the median of the last ``context`` (4, this one included) within ``context_horizon_s``
   (10 min), earlier ones only (``features.in_context``), in training and in scoring alike.
   Warm-up, evaluation and checkpoint windows and per-window noise blur single windows; four
   minutes of the same server say what it usually does. Idle, zombie and unknown windows are
   read as they are.
1. **Best state and peak per node.** The node's memory *peak* is the 98th percentile of its
   DRAM intensity (step 2) over windows whose kernels ran at least ``KERNEL_TIME_MIN`` of the
   time: what its memory interface gives at most. Over the node's other windows (not
   memory-bound, step 4), those in the top tenth of ``sm_active`` are its best state:
   ``best_sm`` is their median SM activity, and each signal's best value is its median
   there. A node with fewer than ``min_node_windows`` running windows uses the state of the
   nodes that measure the way it does, with the median of their peaks (a typical card's, not
   the highest's).
2. **A regressor of GPU activity.** scikit-learn's ``HistGradientBoostingRegressor`` (missing
   values taken as they are) learns ``sm_active / best_sm`` of the window's node from the
   *cause* signals (``CAUSES``). It is fitted to the 80th percentile (quantile loss), so it
   predicts the activity a node reaches *at its best* for windows with these signals, not the
   average one; it is additive (no interactions), so each signal's effect is its own; and
   each signal's direction is fixed by what it means (``DIRECTIONS``: more I/O wait or a more
   memory-bound kernel mix never helps). DRAM enters as a share of the node's peak.
3. **Contributions.** Each cause signal alone is set to its best-state value; the change in
   predicted ``sm_active`` is its contribution (positive: it would help). What the signals do
   not explain — the window's predicted activity minus its actual one — is ``unexplained``.
4. **The label.** ``memory_bandwidth`` when the kernels, while they run, keep the memory
   interface at ``MEMORY_BOUND`` of the node's peak or more (and above an absolute floor): a
   memory-bound loop keeps every SM "active" (waiting on memory), so SM activity alone cannot
   show it, and its shortfall, if any, is the launch gaps of its many short kernels.
   ``healthy`` when ``sm_active`` is within ``healthy_ratio`` of ``best_sm``.
   Otherwise, the largest contribution names the cause (``CAUSE_OF``) when it accounts for at
   least ``explained_share`` of the shortfall (``best_sm - sm_active``). Else the shortfall is
   mostly invisible to the signals: the GPU waits between kernels. Occupancy says whether the
   kernels themselves are small (``sm_active / gr_active`` below ``SMALL_OCCUPANCY`` of the
   node's best: tiny kernels that also leave launch gaps -> ``small_work``; where there is no
   ``gr_active`` and the tree is not blocked on reads, memory traffic per unit of kernel time
   below ``LITTLE_TRAFFIC`` of the node's best says the same: small kernels move little data);
   else the CPU says
   which: a loop that is CPU-bound keeps its process busy for at least the share of the window
   the GPU idles (``cpu_cores - cpu_iowait >= CPU_FACTOR * shortfall / best_sm``: time the
   process tree spent blocked on I/O is waiting, not computing, however busy its other
   processes are) -> ``cpu_serial``, unless the tree is blocked on reads for at least
   ``rules.HIGH_IOWAIT`` of the window -> ``data_io``; a process idle that long is waiting ->
   ``data_io`` (on nodes without ``cpu_iowait`` this is the only way a data wait shows).

Before the model, by definition: no ``sm_active`` -> ``unknown``; the zombie definition
(``rules.is_zombie``) -> ``zombie``; a kernel running nothing -> ``healthy`` (nothing to tune:
idle culling is the policy's business). With fewer than ``min_windows`` running windows in
the history there is no model and ``diagnose`` answers with ``rules.baseline``.

Choices, and why:

- *Which signals are causes.* DCGM's DRAM activity is a time average over the same window as
  ``sm_active``: when the GPU idles half the window it halves too, whatever the cause, and used
  raw it "explains" every idle GPU. The model reads it as an intensity while kernels run
  (``dram_active / gr_active``; ``/ sm_active`` where there is no ``gr_active``: on nodes
  without DCGM that is NVML's share of time a kernel ran): how memory-bound the kernels are
  when they run. Per unit of *SM* activity, small kernels (few SMs busy) looked memory-bound
  and a quarter of the simulated ``small_work`` windows were called ``memory_bandwidth``, with
  a spread of seven points between training sets; per unit of engine time the spread is
  three (``docs/benchmarks.md``). Tensor and
  PCIe activity, reads, CPU cores (DataLoader workers and CUDA's spin-wait keep cores busy in
  proportion to throughput), user idle time and kernel state describe the workload or follow
  its throughput; given to the regressor they let it recognise individual servers (they are
  nearly constant per server) and blame effects for causes. They stay out of the regressor.
  ``cpu_cores`` is used in step 4 only.
- *One regressor shape for all nodes, each node its own scale and best state.* Per-node
  regressors were tried first: with a few dozen servers per node they learned the servers,
  not the signals, and their contributions varied from node to node. Normalising by the node
  (activity by ``best_sm``, DRAM intensity by the node's peak) keeps what differs between
  cards — the scale of their readings — per node, and learns the shape from every node.
- *No memory cause; occupancy and saturated DRAM read as they are.* Measured on an H200
  (``benchmarks/gpu_faults.py``, ``docs/benchmarks.md``): a healthy bf16 training loop held
  1.4 % of the card's memory, so "more memory in use, bigger batches" (which the simulator assumed,
  and the model once used as the ``small_work`` cause) named every slow loop on a big card
  ``small_work`` (43 % of the real windows right); a floor under ``gr_active`` made a starved
  loop's full-size kernels look small; an elementwise loop over 1 GiB tensors read SM activity
  0.98 with DRAM at 0.89, so it was ``healthy`` until the memory-bound test of step 4 came
  first; a loop blocked on reads 46 % of the window while its threads kept 1.4 cores busy was
  ``cpu_serial``. Fixed on the first H200 run and checked on a second with other fault sizes
  (85.7 % with GPM, 71.4 % with NVML alone, the rules 42.9 %), at a cost of about 1.5 points on
  the simulated validation seeds (whose simulator then still tied memory to the cause). The
  light-traffic reading of ``small_work`` without ``gr_active`` came after, on simulator v4's
  validation seeds (+1.1 and +1.7 points); it also names the H200's NVML-only tiny-batch loop
  (85.7 % with NVML alone on both runs).
- The model never sees a label: it is trained on unlabelled history, as the service has it.
- *Context of three windows (four since format 4), and the CPU split net of I/O wait*: chosen
  on validation seeds (train seed 0, validate seeds 7 and 8; never the benchmark's test seeds):
  single windows 84.8 %, context of 3 86.4 % (4: 86.0 %, 5: 85.9 %), and the CPU split net of
  I/O wait 87.2 %. Tried and left out: naming a cause in a window within ``healthy_ratio`` of
  the best when its contribution is at least 5 % of ``best_sm`` (memory-bound windows near the
  best: +8 points there, but healthy windows with a mild second cause lost as many, 86.1 %),
  and a lower ``explained_share`` (0.15: 86.0 %).
- *DRAM against the node's peak, not its best state* (format 4). The best state is the few
  servers that run best on a node, and their DRAM intensity varies 2.5 times between
  ordinary loops (0.2-0.5 of the interface in the simulator) — as much as between an
  ordinary loop and a memory-bound one. Read against the best state, a node whose best
  servers happened to move little data called every ordinary loop on it memory-bound (the
  validation H100 PCIe node: 68 %). Against the peak, which memory-bound loops reach on any
  card, the reading is stable. On the same validation seeds (84.7 %, 88.5 % before): the peak
  and the memory-bound test first, 88.9 % and 91.5 %; an unseen node against the median
  peak, 89.3 % and 91.7 %; ``CPU_FACTOR`` 0.9 and ``healthy_ratio`` 0.75 (a loop at three
  quarters of its node's best is not worth a hint), 90.7 % and 92.5 %; the regressor fitted
  to the 80th percentile rather than the 90th (a frontier less set by single noisy windows)
  and NVML's memory-bound share at 0.8, 92.1 % and 93.2 %; the best state taken among loops
  that are not memory-bound (on a real node with a memory-bound loop in its history, that
  loop was "the best": 91.9 %, 93.1 %, and the H200's own history read right); a context of
  four windows, 92.4 % and 93.8 % (3: 91.9 %, 93.1 %; 5: 91.7 %, 93.6 %). Tried and left
  out: keeping NVML's memory utilisation out of the regressor (89.0 %, 91.2 %), a context
  of 5-12 windows, peak quantile 0.95 or 0.99.

scikit-learn (and numpy) are imported when a model is fitted, loaded or used, never at import.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from . import rules
from .features import (
    CONTEXT_HORIZON_S,
    CONTEXT_K,
    FEATURES,
    Window,
    in_context,
    to_vector,
    with_context,
)
from .labels import (
    CPU_SERIAL,
    DATA_IO,
    FRAGMENTATION,
    HEALTHY,
    MEMORY_BANDWIDTH,
    SMALL_WORK,
    UNKNOWN,
    ZOMBIE,
    Diagnosis,
    diagnosis,
)

FORMAT = 4  # 2: server context; 3: no memory cause (real GPUs); 4: DRAM read against its peak

# The regressor's inputs, the direction each moves GPU activity (+1: more helps, -1: more
# hurts), and the label a contribution names.
CAUSES = ("dram_active", "cpu_iowait")
DIRECTIONS: Mapping[str, int] = {"dram_active": -1, "cpu_iowait": -1}
CAUSE_OF: Mapping[str, str] = {"dram_active": MEMORY_BANDWIDTH, "cpu_iowait": DATA_IO}
INTENSITIES = ("dram_active",)  # read per unit of time a kernel ran
SM_FLOOR = 0.05  # the intensities' denominator floor: nearly idle windows stay bounded
UNEXPLAINED = "unexplained"  # the contributions' key for what the signals do not explain

_COLUMNS = [FEATURES.index(name) for name in CAUSES]
SMALL_OCCUPANCY = 0.75  # occupancy below this share of the node's best: the kernels are small
LITTLE_TRAFFIC = 0.5  # memory traffic per kernel time below this share of the best: small kernels
GR_MIN = 0.005  # below this engine activity, occupancy is not read (nothing ran to fill the SMs)
# A node's memory interface at its practical peak: this quantile of its DRAM intensity, read in
# windows whose kernels ran at least KERNEL_TIME_MIN of the time (below, the ratio is noise).
PEAK_QUANTILE = 0.98
KERNEL_TIME_MIN = 0.3
# Kernels that run at this share of the node's peak DRAM intensity, and at least at the floor,
# are memory-bound. Keyed by whether the window has DCGM's engine activity: NVML's memory
# utilisation is the share of *time* memory was touched, so it saturates early and reads near
# its peak for ordinary loops too (simulator: 0.6-0.85 of it; DCGM's DRAM activity: 0.2-0.55).
# The floor, on DCGM's absolute scale, keeps a node that never ran a memory-bound loop from
# calling its heaviest ordinary one memory-bound (an H200 run's 16 MiB elementwise loop: 0.46).
MEMORY_BOUND = {True: 0.65, False: 0.8}
MEMORY_BOUND_FLOOR = {True: 0.5, False: 0.8}
CPU_FACTOR = 0.9  # a CPU-bound loop keeps a core busy >= this share of the GPU's idle time
GLOBAL = ""  # the key of all nodes together
# Nodes an unseen node is compared with: those that measure the way it does (DCGM's engine
# activity, or NVML alone, whose memory utilisation reads on another scale than DCGM's DRAM).
GLOBAL_BY_KIND = {True: "(with gr_active)", False: "(without gr_active)"}


@dataclass
class NodeState:
    """A node's best state: ``best_sm`` and each cause signal's best value (``nan``: unknown)."""

    best_sm: float
    best: dict[str, float]
    windows: int
    best_occupancy: float = math.nan  # sm_active / gr_active in the best state
    peak: dict[str, float] = field(default_factory=dict)  # each intensity's practical peak


@dataclass
class _Additive:
    """The fitted regressor as what it is — a sum of step functions, one per input (the
    regressor has no interactions) — so that scoring a window is a few binary searches, not a
    scikit-learn call (whose input checks alone take milliseconds). ``compile`` checks it
    against the regressor and returns ``None`` on any difference."""

    base: float
    thresholds: list  # per input: sorted split thresholds (x <= t goes left, as in sklearn)
    values: list  # per input: the step function's value on each interval (len + 1)
    missing: list[float]  # per input: its value for a missing input

    def predict(self, X, np):
        out = np.full(X.shape[0], self.base)
        for j in range(X.shape[1]):
            x = X[:, j]
            nan = np.isnan(x)
            index = np.searchsorted(self.thresholds[j], np.where(nan, 0.0, x), side="left")
            out += np.where(nan, self.missing[j], self.values[j][index])
        return out

    @classmethod
    def compile(cls, regressor, X, np) -> _Additive | None:
        try:
            width = X.shape[1]
            cuts: list[set[float]] = [set() for _ in range(width)]
            for trees in regressor._predictors:
                for tree in trees:
                    nodes = tree.nodes
                    for node in nodes[nodes["is_leaf"] == 0]:
                        cuts[int(node["feature_idx"])].add(float(node["num_threshold"]))
            thresholds = [np.array(sorted(c), dtype=float) for c in cuts]
            probes = [np.full(width, np.nan)]
            for j, t in enumerate(thresholds):
                points = [*t, (t[-1] + 1.0) if t.size else 0.0]
                for v in points:
                    row = np.full(width, np.nan)
                    row[j] = v
                    probes.append(row)
            predicted = regressor.predict(np.vstack(probes))
            base = float(predicted[0])
            values, missing, at = [], [], 1
            for t in thresholds:
                values.append(predicted[at : at + t.size + 1] - base)
                missing.append(0.0)  # the all-missing row is the base
                at += t.size + 1
            compiled = cls(base, thresholds, values, missing)
            sample = X[:: max(1, X.shape[0] // 2000)]
            if not np.allclose(compiled.predict(sample, np), regressor.predict(sample), atol=1e-9):
                return None
            return compiled
        except Exception:  # a private API of scikit-learn: fall back to predict()
            return None


@dataclass
class Diagnoser:
    """Fit on windows (``fit``), then ``diagnose`` one window or ``diagnose_many``.

    ``min_node_windows``: running windows a node needs for a best state of its own;
    ``min_windows``: for a model at all (fewer: ``diagnose`` answers with the rules);
    ``best_quantile``: windows above this quantile of ``sm_active`` are the best state;
    ``frontier``: the quantile the regressor is fitted to;
    ``healthy_ratio``: ``sm_active`` at least this share of ``best_sm`` is healthy;
    ``explained_share``: a contribution this share of the shortfall names the cause;
    ``min_gain``: changes in ``sm_active`` smaller than this name nothing;
    ``max_iter``, ``min_samples_leaf``: the regressor's (a leaf holds more windows than one
    server has in an hour, so it cannot learn single servers);
    ``threads``: OpenMP threads for scikit-learn (1: the service trains in a worker thread
    next to its event loop, and one thread has no barriers to spin on under load);
    ``context``, ``context_horizon_s``: each running window is read with its server's recent
    running windows (``features.with_context``: the median of the last ``context`` within
    ``context_horizon_s``), in training and in scoring alike; ``context=1``: single windows.
    """

    min_node_windows: int = 300
    min_windows: int = 100
    best_quantile: float = 0.9
    frontier: float = 0.8
    healthy_ratio: float = 0.75
    explained_share: float = 0.25
    min_gain: float = 0.01
    max_iter: int = 150
    min_samples_leaf: int = 100
    threads: int = 1
    random_state: int = 0
    context: int = CONTEXT_K
    context_horizon_s: float = CONTEXT_HORIZON_S
    regressor: object | None = field(default=None, repr=False)
    nodes: dict[str, NodeState] = field(default_factory=dict, repr=False)
    columns: list[int] = field(default_factory=list, repr=False)  # of CAUSES, that vary
    additive: _Additive | None = field(default=None, repr=False)  # the regressor, compiled
    trained_on: int = 0

    # -- training --------------------------------------------------------------------------------

    def fit(self, windows: Iterable[Window]) -> Diagnoser:
        """Learn from windows in which code runs (``sm_active`` known, not a zombie, the kernel
        not idle), each read in its server's context (``in_context``: pass every server's
        windows oldest first). Labels are never used."""
        import numpy as np
        from sklearn.ensemble import HistGradientBoostingRegressor

        by_node: dict[str, list[Window]] = {}
        usable: list[Window] = []
        for w in self.in_context(windows):
            if w.sm_active is None or w.kernel_busy is False or rules.is_zombie(w):
                continue
            usable.append(w)
            by_node.setdefault(w.node or GLOBAL, []).append(w)
        self.regressor, self.nodes, self.columns, self.additive = None, {}, [], None
        self.trained_on = len(usable)
        if len(usable) < self.min_windows:
            return self

        for node, group in by_node.items():
            if node != GLOBAL and len(group) >= self.min_node_windows:
                self.nodes[node] = self._best_state(group, np)
        # Nodes too new for a state of their own borrow one from the nodes that measure alike,
        # read against a typical card's peak (the median of theirs), not the highest card's.
        engine = {  # does the node have DCGM's engine activity (most of its windows)
            node: 2 * sum(w.gr_active is not None for w in group) > len(group)
            for node, group in by_node.items()
            if node in self.nodes
        }
        pooled = [(None, GLOBAL, usable)]
        for sees_engine, key in GLOBAL_BY_KIND.items():
            kind = [w for w in usable if (w.gr_active is not None) == sees_engine]
            if len(kind) >= self.min_node_windows:
                pooled.append((sees_engine, key, kind))
        for sees_engine, key, group in pooled:
            alike = [n for n, e in engine.items() if sees_engine is None or e == sees_engine]
            peak = {}
            for name in INTENSITIES:
                peaks = [p for p in (self.nodes[n].peak[name] for n in alike) if p > 0]
                if peaks:
                    peak[name] = float(np.median(peaks))
            self.nodes[key] = self._best_state(group, np, peak)
        X = np.vstack(
            [self._inputs(group, self.state(node), np) for node, group in by_node.items()]
        )
        y = np.concatenate(
            [
                np.array([w.sm_active for w in group]) / self.state(node).best_sm
                for node, group in by_node.items()
            ]
        )
        regressor = HistGradientBoostingRegressor(
            loss="quantile",
            quantile=self.frontier,
            max_iter=self.max_iter,
            learning_rate=0.1,
            min_samples_leaf=self.min_samples_leaf,
            interaction_cst="no_interactions",
            early_stopping=False,
            random_state=self.random_state,
        )
        # scikit-learn's binning fails on a column with one distinct value (and it says nothing).
        self.columns = [
            j for j in range(X.shape[1]) if np.unique(X[~np.isnan(X[:, j]), j]).size >= 2
        ]
        if not self.columns:
            self.nodes = {}
            return self
        regressor.set_params(monotonic_cst=[DIRECTIONS[CAUSES[j]] for j in self.columns])
        with _threads(self.threads):
            regressor.fit(X[:, self.columns], y)
            self.additive = _Additive.compile(regressor, X[:, self.columns], np)
        self.regressor = regressor
        return self

    def _best_state(
        self, windows: Sequence[Window], np, peak: dict[str, float] | None = None
    ) -> NodeState:
        """The windows' best state; their own peak unless ``peak`` gives one (per intensity)."""
        sm = np.array([w.sm_active for w in windows], dtype=float)
        X = self._raw(windows, np)
        ran = np.array([_kernel_time(w) for w in windows], dtype=float)
        peak = dict(peak or {})
        for name in INTENSITIES:
            if name in peak:
                continue
            column = X[ran >= KERNEL_TIME_MIN, CAUSES.index(name)]
            column = column[~np.isnan(column)]
            peak[name] = float(np.quantile(column, PEAK_QUANTILE)) if column.size else math.nan
        # The best state is the best of the loops that compute: a memory-bound loop keeps its
        # SMs "active" while they wait, and its DRAM is not what a well-fed loop moves.
        computing = ~np.array([_memory_bound(w, peak.get("dram_active")) for w in windows])
        if not computing.any():
            computing[:] = True
        top = computing & (sm >= np.quantile(sm[computing], self.best_quantile))
        best = {}
        for j, name in enumerate(CAUSES):
            column = X[top, j]
            column = column[~np.isnan(column)]
            best[name] = float(np.median(column)) if column.size else math.nan
        best_sm = max(float(np.median(sm[top])), SM_FLOOR)
        occupancy = _occupancy(windows, np)[top]
        occupancy = occupancy[~np.isnan(occupancy)]
        best_occupancy = float(np.median(occupancy)) if occupancy.size else math.nan
        return NodeState(best_sm, best, len(windows), best_occupancy, peak)

    def _raw(self, windows: Sequence[Window], np):
        """The cause signals, DRAM as an intensity per unit of time a kernel ran."""
        X = np.array([to_vector(w) for w in windows], dtype=float).reshape(-1, len(FEATURES))
        X = X[:, _COLUMNS]
        ran = np.array([_kernel_time(w) for w in windows], dtype=float)
        for name in INTENSITIES:
            X[:, CAUSES.index(name)] /= np.maximum(ran, SM_FLOOR)
        return X

    def _inputs(self, windows: Sequence[Window], states: NodeState | Sequence[NodeState], np):
        """The regressor's inputs: the intensities as shares of their node's peak (one state
        for all the windows, or one per window)."""
        X = self._raw(windows, np)
        many = not isinstance(states, NodeState)
        for name in INTENSITIES:
            j = CAUSES.index(name)
            if many:
                peak = np.array([s.peak[name] for s in states], dtype=float)
            else:
                peak = np.full(len(windows), states.peak[name])
            usable = peak > 0  # nan > 0 is False
            X[:, j] = np.where(usable, X[:, j] / np.where(usable, peak, 1.0), np.nan)
        return X

    # -- scoring ---------------------------------------------------------------------------------

    @property
    def fitted(self) -> bool:
        return self.regressor is not None

    def state(self, node: str | None, window: Window | None = None) -> NodeState:
        """The node's best state; for a node with too little history, that of the nodes that
        measure the way ``window`` does (else of all nodes)."""
        own = self.nodes.get(node or GLOBAL)
        if own is not None:
            return own
        if window is not None:
            kind = self.nodes.get(GLOBAL_BY_KIND[window.gr_active is not None])
            if kind is not None:
                return kind
        return self.nodes[GLOBAL]

    def in_context(self, windows: Iterable[Window]) -> list[Window]:
        """``features.in_context`` with this model's ``context`` and horizon."""
        return in_context(windows, self.context, self.context_horizon_s)

    def with_context(self, window: Window, earlier: Sequence[Window]) -> Window:
        """``features.with_context`` with this model's ``context`` and horizon."""
        return with_context(window, earlier, self.context, self.context_horizon_s)

    def diagnose(self, window: Window, earlier: Sequence[Window] = ()) -> Diagnosis:
        """One window, read with ``earlier`` windows of its server (oldest first)."""
        return self.diagnose_many([self.with_context(window, earlier)], context=False)[0]

    def diagnose_many(self, windows: Sequence[Window], *, context: bool = True) -> list[Diagnosis]:
        """One diagnosis per window, in order; one regressor call for them all. ``context``:
        each window is read with the earlier windows of its server in ``windows``
        (``in_context``); ``False``: the windows are read as given (already in context, as
        the service scores them)."""
        if context:
            windows = self.in_context(windows)
        out: list[Diagnosis | None] = [None] * len(windows)
        pending: list[int] = []
        for i, w in enumerate(windows):
            early = _before_model(w)
            if early is not None:
                out[i] = early
            elif not self.fitted:
                out[i] = rules.baseline(w)
            else:
                pending.append(i)
        if pending:
            import numpy as np

            states = [self.state(windows[i].node, windows[i]) for i in pending]
            X = self._inputs([windows[i] for i in pending], states, np)
            n = len(pending)
            rows, plan = [X], []  # plan: per cause, the windows with a counterfactual row
            for j in self.columns:
                name = CAUSES[j]
                if name in INTENSITIES:  # the best state's, as a share of the peak
                    target = np.array([s.best[name] / s.peak[name] for s in states], dtype=float)
                else:
                    target = np.array([s.best[name] for s in states], dtype=float)
                which = np.flatnonzero(~np.isnan(X[:, j]) & ~np.isnan(target) & (X[:, j] != target))
                if which.size:
                    counter = X[which]
                    counter[:, j] = target[which]
                    rows.append(counter)
                    plan.append((j, which))
            inputs = np.vstack(rows)[:, self.columns]
            if self.additive is not None:
                predicted = self.additive.predict(inputs, np)
            else:
                with _threads(self.threads):
                    predicted = self.regressor.predict(inputs)
            scale = np.array([s.best_sm for s in states])
            contributions: list[dict[str, float]] = [{} for _ in pending]
            at = n
            for j, which in plan:
                changes = (predicted[at : at + which.size] - predicted[which]) * scale[which]
                at += which.size
                for g, change in zip(which.tolist(), changes.tolist(), strict=True):
                    contributions[g][CAUSES[j]] = change
            for g, i in enumerate(pending):
                predicted_sm = float(predicted[g] * scale[g])
                out[i] = self._label(windows[i], states[g], contributions[g], predicted_sm)
        return out  # type: ignore[return-value]

    def _label(
        self, w: Window, state: NodeState, contributions: dict[str, float], predicted_sm: float
    ) -> Diagnosis:
        shortfall = state.best_sm - w.sm_active
        unexplained = predicted_sm - w.sm_active
        top_name = max(contributions, key=contributions.__getitem__, default=None)
        top = contributions.get(top_name, 0.0) if top_name else 0.0
        if _memory_bound(w, state.peak.get("dram_active")):
            label = MEMORY_BANDWIDTH  # however busy the SMs read: they wait on memory
        elif w.sm_active >= self.healthy_ratio * state.best_sm:
            label = HEALTHY
        elif top > self.min_gain and top >= self.explained_share * shortfall:
            label = CAUSE_OF[top_name]
        elif unexplained > self.min_gain and _small_kernels(w, state):
            label = SMALL_WORK
        elif unexplained > self.min_gain and (w.cpu_iowait or 0.0) >= rules.HIGH_IOWAIT:
            label = DATA_IO  # the tree is blocked on reads, whatever else its threads do
        elif unexplained > self.min_gain and _little_traffic(w, state):
            label = SMALL_WORK
        elif unexplained > self.min_gain and w.cpu_cores is not None:
            idle_share = shortfall / state.best_sm
            computing = w.cpu_cores - (w.cpu_iowait or 0.0)  # blocked on I/O is not computing
            label = CPU_SERIAL if computing >= CPU_FACTOR * idle_share else DATA_IO
        elif top > self.min_gain:
            label = CAUSE_OF[top_name]
        else:
            label = HEALTHY
        shown = {k: round(v, 4) for k, v in contributions.items()}
        shown[UNEXPLAINED] = round(unexplained, 4)
        return diagnosis(label, shown, source="model")

    # -- persistence -----------------------------------------------------------------------------

    def save(self, path) -> None:
        """Pickle the model (load only files you trust: loading a pickle runs code)."""
        import sklearn

        with open(path, "wb") as file:
            pickle.dump(
                {"format": FORMAT, "sklearn": sklearn.__version__, "diagnoser": self},
                file,
                protocol=pickle.HIGHEST_PROTOCOL,
            )

    @classmethod
    def load(cls, path) -> Diagnoser:
        with open(path, "rb") as file:
            try:
                data = pickle.load(file)
            except Exception as error:
                raise ValueError(f"{path}: not a diagnosis model ({error})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path}: not a jupyter-gpu-gov diagnosis model (format {FORMAT})")
        model = data.get("diagnoser")
        if not isinstance(model, cls):
            raise ValueError(f"{path}: not a jupyter-gpu-gov diagnosis model")
        return model


def _occupancy_of(w: Window) -> float | None:
    """``sm_active / gr_active``: how much of the GPU the kernels fill while one runs (not read
    where almost nothing ran: a floor under ``gr_active`` would call a starved loop's full-size
    kernels small)."""
    if w.sm_active is None or w.gr_active is None or w.gr_active < GR_MIN:
        return None
    return w.sm_active / w.gr_active


def _occupancy(windows: Sequence[Window], np):
    return np.array([_occupancy_of(w) for w in windows], dtype=float)  # None -> nan


def _small_kernels(w: Window, state: NodeState) -> bool:
    """The kernels that run fill few SMs (far below the node's best occupancy)."""
    occupancy = _occupancy_of(w)
    if occupancy is None or not state.best_occupancy > 0:
        return False
    return occupancy < SMALL_OCCUPANCY * state.best_occupancy


def _little_traffic(w: Window, state: NodeState) -> bool:
    """Without engine activity (NVML alone), small kernels show as little memory traffic while
    a kernel runs: memory activity per unit of kernel time below ``LITTLE_TRAFFIC`` of the
    node's best (not read under ``SM_FLOOR``, where NVML's whole percents are too coarse)."""
    best = state.best.get("dram_active")
    if w.gr_active is not None or w.dram_active is None or not best or not best > 0:
        return False
    return w.sm_active >= SM_FLOOR and _dram_intensity(w) < LITTLE_TRAFFIC * best


def _kernel_time(w: Window) -> float | None:
    """The share of the window a kernel ran: DCGM's engine activity, else NVML's utilisation
    (which is that share already)."""
    return w.sm_active if w.gr_active is None else w.gr_active


def _dram_intensity(w: Window) -> float:
    """DRAM activity per unit of kernel time (``_raw``'s column, for one window whose kernel
    time and DRAM are known and non-zero)."""
    return w.dram_active / _kernel_time(w)


def _memory_bound(w: Window, peak: float | None) -> bool:
    """The kernels, while they run, keep the memory interface near the node's ``peak`` DRAM
    intensity (``MEMORY_BOUND`` of it, and at least ``MEMORY_BOUND_FLOOR``)."""
    ran = _kernel_time(w)
    if w.dram_active is None or ran is None or ran < KERNEL_TIME_MIN or not (peak or 0) > 0:
        return False
    intensity = _dram_intensity(w)
    dcgm = w.gr_active is not None
    return intensity >= MEMORY_BOUND_FLOOR[dcgm] and intensity >= MEMORY_BOUND[dcgm] * peak


def _before_model(w: Window) -> Diagnosis | None:
    if w.sm_active is None:
        return diagnosis(UNKNOWN)
    if rules.is_zombie(w):
        return diagnosis(ZOMBIE)
    if w.kernel_busy is False:
        return diagnosis(HEALTHY)
    return None


class _threads:
    """``threadpoolctl.threadpool_limits`` when there is one (scikit-learn depends on it)."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self._ctx = None

    def __enter__(self):
        if self.limit:
            try:
                from threadpoolctl import threadpool_limits
            except ImportError:  # pragma: no cover
                return self
            self._ctx = threadpool_limits(limits=self.limit, user_api="openmp")
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


# -- the cluster ---------------------------------------------------------------------------------

FRAGMENT_MIN_FREE = 1.0  # a whole card's worth free, but scattered over partly used cards


def fragmentation(
    devices_used: Sequence[float], refused_or_queued: int, *, min_free: float = FRAGMENT_MIN_FREE
) -> Diagnosis | None:
    """``fragmentation`` when spawns are refused or queued while no card is free but the free
    shares of at least two partly used cards add up to ``min_free`` cards or more; else
    ``None``.

    ``devices_used``: per card, the share in use (0..1: memory, MIG slices or time slices
    allocated). Contributions: ``free_scattered`` (cards' worth free on partly used cards),
    ``partly_used`` (how many), ``waiting`` (spawns refused or queued)."""
    used = [
        min(1.0, max(0.0, float(u)))
        for u in devices_used
        if isinstance(u, int | float) and math.isfinite(u)
    ]
    if refused_or_queued <= 0 or any(u == 0.0 for u in used):
        return None
    partly = [u for u in used if 0.0 < u < 1.0]
    free = sum(1.0 - u for u in partly)
    if len(partly) < 2 or free < min_free - 1e-9:
        return None
    return diagnosis(
        FRAGMENTATION,
        {
            "free_scattered": round(free, 3),
            "partly_used": float(len(partly)),
            "waiting": float(refused_or_queued),
        },
    )
