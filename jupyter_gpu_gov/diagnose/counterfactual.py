"""The counterfactual model (docs/api.md "Root causes"): why is this GPU less busy than it
could be, and how sure are we?

Every signal is read against what is normal *for this node and this kind of measurement*
(``reference.NodeReference``: learned online from the node's own windows, from its first ones
on) and against the task's own best windows (``reference.TaskReference``), never against
another node's. What the model decides with is what defines each cause physically:

0. **Definitions first.** No ``sm_active``: ``unknown`` (never idle, never blamed). A kernel
   running nothing: a ``zombie`` when memory is held, its owner has been away at least
   ``rules.ZOMBIE_IDLE_S`` and the SMs do no work — at most ``zombie_sm`` above the node's idle
   floor, so a few percent of SM noise is still no work (the confidence falls as SM activity
   nears that bound); else ``healthy`` (an interactive pause; the idle policy handles it).
   Without kernel state (a terminal), a process tree doing nothing on the CPU
   (``zombie_cores``) with the GPU as quiet is running nothing either: the same test,
   ``terminal_certainty`` as sure for the zombie — and an idle terminal, not a starved loop,
   while its owner is around. With no kernel, no process measured, no memory held and the SMs
   quiet, the server has not started using its card: ``healthy``.
1. **Memory-bound** kernels keep the memory interface near the node's *peak* DRAM intensity
   (DRAM activity per unit of kernel time, at ``memory_bound`` of the peak) and are heavy by
   one of three measures, since cards' DRAM counters differ in scale: above an absolute floor,
   ``memory_heavy`` times the DRAM intensity of the node's *compute loops* (a low quantile of
   its fed windows', which memory-bound loops on the node do not drag up, where a mean would),
   or with the tensor pipes idle where the node's loops keep them busy (not matrix math). The
   GPU must be busy (``memory_fed`` of its fed level): a memory-bound loop keeps it busy; a
   loop that starves it is held back by something else, whatever its kernels do meanwhile.
   Busy tensor pipes rule it out (the kernels compute). A node whose ordinary loops already
   read near the peak (``saturated``: NVML's memory utilisation saturates early) cannot show
   it at all; NVML's time share counts less than DCGM's DRAM activity. NVML's memory
   utilisation is also read as what it is, a time share with a ceiling: at ``ceiling`` of the
   most this node's counter reads (its *DRAM ceiling*, learnt from its own windows) the memory
   was busy nearly all the time, which is memory-bound wherever the node's loops do not all
   read so (the intensity's peak alone is a ratio of two time shares sampled apart: its tail
   runs past 1 wherever a window's kernel time reads low, and set the bar above what the
   node's memory-bound loops read).
2. **Fed or starved.** The kernel-time share (``gr_active``; NVML's utilisation where that is
   all there is) against the node's *fed level* (the median of its fed group of loops, never
   below ``reference.TIME_SHARE_FED`` where it is a share of time): at ``fed`` of it or more
   the GPU is fed — ``healthy``, unless its kernels fill under ``underfilled`` of the SMs the
   node's fed loops fill (small kernels back to back: ``small_work``). SM activity without
   ``gr_active`` depends on the card (0.3 on one, 0.9 on another), which is why it is read
   against the node's own — and against what no card's fed loops read less than
   (``reference.SM_FED_MIN``): a node whose first loops all starve has no fed loop to learn
   from, and well under that floor a loop is starved on any card.
3. **Why starved.** The GPU idles ``1 - fed`` of its fed time, and the question is what the
   loop does meanwhile:

   - ``small_work``: its kernels are too small. Signs, added (noisy-or), none certain alone:
     they fill few SMs (occupancy ``sm/gr`` below ``small`` of the fed state's, where
     measured: the strongest); per unit of SM activity they move little data and leave the
     tensor pipes idle against the node's fed loops (``light_traffic``: tiny kernels are
     latency-bound); the task holds a quarter of the node's usual memory or less
     (``memory_weight``: a small batch, a small model). And a thread must keep launching them:
     less so while the loop waits (``idle_thread``), and not where kernels run under
     ``launch_time`` of the window — a kernel lasts some microseconds at least and a launch
     some tens at most, so a loop that launches back to back keeps the GPU busier than that.
   - else ``data_io`` against ``cpu_serial``, as log-odds that add up, so signs that disagree
     leave the answer open: moving data (``reads_mb_s`` or more, and more so near the node's
     *read peak*: a loop its storage holds up reads at the storage's pace) or reading nothing
     (``unread_weight``: weaker, as a FUSE mount's reads are not counted, and nothing on a
     node whose loops are never seen reading); blocked on reads
     beyond the node's fed loops' I/O wait (``io`` of the idle time); a thread computing
     through the idle time (``cpu_top_thread``, the busiest thread's share of a core, where the
     server reports it: a serial loop saturates one thread; else the tree's cores net of I/O
     wait) or the loop waiting. A loop that waits and reads nothing is either's (a
     ``time.sleep`` and a network mount's wait look the same): ``uncertain``. What the two
     words mean is docs/api.md's ("What each label means"): ``data_io`` is the input
     pipeline — reading, decoding and copying the batches, by workers or by the main thread
     with ``num_workers=0`` — and ``cpu_serial`` the loop's own host work. So a thread
     computing is evidence for the host only beside what the input side shows: where neither
     reads nor I/O wait is measured, a starved loop is ``uncertain`` between the two whatever
     its CPU (the main thread decoding its batches and a Python loop both saturate a thread).

Each test is a smooth gate (a logistic of width ``*_width``) rather than a threshold, and the
gates chain as a decision tree, so the labels get probabilities that sum to one: the most likely
is the label, its probability the ``confidence``. Below ``confident`` the answer is
``uncertain`` with the two most likely labels as ``candidates`` — never a confident wrong label
where the signals sit on a boundary or the columns present cannot tell two causes apart. Only a
confident ``zombie`` may drive an action.

``cpu_serial`` is said at most ``residual`` sure. It is the starved branch's residual: what a
starved loop is called when neither small kernels nor the input side show, and every column it
rests on is shared — a thread busy through the GPU's idle time and nothing read from storage is
also what a main thread loading its own batches from the page cache shows (``data_io`` by its
written meaning; page-cache reads are not storage reads) and what a loop launch-bound on
ordinary kernels shows (``small_work``: a dispatching thread is a busy thread, and no column
counts launches). The other labels each have a sign of their own (the fed level, the DRAM peak,
occupancy or light traffic, reads or I/O wait). So the host's own work is answered — the
likeliest reading of that signature, and abstaining on it costs strict accuracy and coverage on
every world (docs/benchmarks-history.md, round five) — but never as a sure answer, whatever its
probability: worlds written apart give the same windows different truths (round thirteen).

Contributions are the within-node counterfactual: the SM activity the node's fed state reads
minus this window's (``gain["node"]``), shared among the causes by their probabilities; the
task's own best windows give ``gain["task"]`` (what the same task already reached).

Every constant is in ``Params``, set from physics (its docstring); ``benchmarks/diagnose.py``
measures them on every world, and chooses them on each world in turn to measure those on the
others (``docs/benchmarks-history.md``). Nothing here is fitted to labels, and nothing needs
scikit-learn: ``fit`` learns the references from unlabelled windows (as the service does from
its history, and as it goes on doing online, ``observe``).
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

from . import rules
from .features import (
    CONTEXT_HORIZON_S,
    CONTEXT_K,
    Window,
    in_context,
    iter_in_context,
    time_key,
    with_context,
)
from .labels import (
    CPU_SERIAL,
    DATA_IO,
    HEALTHY,
    MEMORY_BANDWIDTH,
    SMALL_WORK,
    UNCERTAIN,
    UNKNOWN,
    ZOMBIE,
    Diagnosis,
    diagnosis,
    names_cause,
)
from .reference import (
    DCGM,
    ENGINE,
    KERNEL_TIME_MIN,
    NVML,
    SM_FED_MIN,
    NodeReference,
    TaskReference,
    dram_intensity,
    kernel_time,
    kind_of,
    occupancy,
    tensor_share,
)

FORMAT = 8  # 8: a node's DRAM ceiling (7: a DCGM node's fed level floored; 6: compute-loop anchor)
# Formats still read: 7's node references lack the DRAM ceiling and learn it from their next
# windows (``reference.NodeReference.__setstate__``); older ones are refused (retrain).
READS = (7, FORMAT)
UNEXPLAINED = "unexplained"
# The contribution each cause's signal carries.
SIGNAL_OF = {
    MEMORY_BANDWIDTH: "dram_active",
    DATA_IO: "cpu_iowait",
    CPU_SERIAL: "cpu_cores",
    SMALL_WORK: "occupancy",
}


@dataclass(frozen=True)
class Params:
    """Every constant the model decides with (the module docstring says where each acts). They
    are set from physics, not chosen on a world: where a value is a share or a factor, it is
    the one the physics names (a fed loop runs 75 % of its node's fed level or more; a
    memory-bound loop reads its DRAM at two thirds of the node's peak or more; a launch-bound
    loop keeps kernels running 6 % of the time at least); where it is a weight, it says how
    far one sign may go alone (the weaker signs of small kernels 0.7-0.75, each log-odds sign of
    data or host 1.2-2.25). ``benchmarks.diagnose`` measures these values on every world, and
    what tuning them on one world does to the others."""

    fed: float = 0.75  # kernel-time share at this share of the node's fed level: fed
    fed_width: float = 0.07
    memory_bound: float = 0.65  # DRAM intensity at this share of the node's peak...
    memory_floor: float = 0.5  # ... and at least this (DCGM's DRAM activity per kernel time)
    memory_heavy: float = 1.8  # ... or at least this many times the node's fed loops'
    memory_bound_nvml: float = 0.85  # NVML's memory utilisation saturates early: only its top
    memory_floor_nvml: float = 0.8
    nvml_memory_weight: float = 0.85  # a time share is weaker evidence than DCGM's DRAM activity
    memory_width: float = 0.05
    ceiling: float = 0.9  # NVML's memory utilisation at this share of the node's ceiling: busy
    saturated: float = 1.0  # the node's fed loops' DRAM intensity at this share of its peak
    tensor_busy: float = 0.35  # tensor pipes at this share of SM activity: the kernels compute
    memory_fed: float = 0.6  # memory-bound: the GPU busy at least this share of its fed level
    underfilled: float = 0.45  # fed, occupancy below this share of the fed state's: small kernels
    tensor_used: float = 0.15  # the node's fed loops' tensor share from which its lack tells
    pipes_idle: float = 0.25  # tensor share below this share of the node's fed loops': no matmul
    small: float = 0.7  # occupancy below this share of the fed state's: small kernels
    occupancy_says: float = 0.3  # how far a measured occupancy overrules the weaker signs
    small_width: float = 0.07
    light_traffic: float = 0.4  # DRAM intensity below this share of the fed state's: small kernels
    light_width: float = 0.1
    light_weight: float = 0.75  # how far light traffic alone may go towards small_work
    launch_share: float = 0.0  # without occupancy, of a busy host thread: maybe launching
    launch_time: float = 0.06  # a launch-bound loop keeps kernels running this share at least
    idle_thread: float = 0.5  # how much of small_work a waiting (not computing) thread keeps
    io: float = 0.25  # I/O wait beyond the fed state's, as a share of the idle time: blocked
    io_width: float = 0.08
    io_weight: float = 2.0  # log-odds towards data_io of a loop blocked on reads
    waiting: float = 0.75  # cores net of I/O wait below this share of the idle time: waiting
    waiting_width: float = 0.3
    host_weight: float = 1.5  # log-odds towards cpu_serial of computing through the idle time
    thread_weight: float = 2.25  # ... where it is the busiest thread that is measured
    reads_mb_s: float = 10.0  # a process reading this much is moving a loader's data...
    storage_share: float = 10.0  # ... and more so within this factor of the node's read peak
    reads_weight: float = 2.0  # log-odds towards data_io of moving data
    unread_weight: float = 1.2  # log-odds towards cpu_serial of reading nothing
    zombie_sm: float = 0.05  # SM activity above the node's idle floor that is still no work
    zombie_width: float = 0.01
    zombie_cores: float = 0.1  # without kernel state: a tree this quiet runs nothing
    terminal_certainty: float = 0.9  # ... and is a zombie this much less surely
    memory_weight: float = 0.7  # holding a quarter of the node's usual memory, or less: small
    confident: float = 0.55  # below: uncertain
    # cpu_serial, which no column shows apart from a main-thread loader or a launch-bound loop
    # (the module docstring), at most this sure: the lowest band of answers (0.55-0.70)
    residual: float = 0.65

    def replace(self, **changes) -> Params:
        return Params(**{f.name: changes.get(f.name, getattr(self, f.name)) for f in fields(self)})


# What a node's reference assumes before it has history of its own (a fed loop keeps a kernel
# running 0.8-1 of the time; a memory interface's practical peak is about 0.9 of its time).
# DCGM's SM activity without gr_active depends on the card: no prior, so an unseen node of that
# kind is ``uncertain`` about fed and starved until it has ``min_node_windows`` windows.
PRIOR = {
    ENGINE: {"fed_level": 0.9, "occupancy": 0.85, "peak": 0.9, "dram_intensity": 0.3,
             "compute_dram": 0.2},
    NVML: {"fed_level": 0.9, "occupancy": math.nan, "peak": 1.0, "dram_intensity": 0.6,
           "compute_dram": 0.4, "dram_ceiling": 1.0},
    DCGM: {"fed_level": math.nan, "occupancy": math.nan, "peak": 0.9, "dram_intensity": 0.3,
           "compute_dram": 0.2},
}  # fmt: skip


# The node figures read by name; the rest are fed-state means.
REFERENCE_FIGURES = ("fed_level", "peak", "compute_dram", "dram_ceiling")


def _gate(x: float, centre: float, width: float) -> float:
    """A smooth step: 0.5 at ``centre``, 0.73 one ``width`` above, 0.27 one below."""
    z = (x - centre) / width
    return 1.0 / (1.0 + math.exp(-z)) if z > -40 else 0.0


@dataclass
class Diagnoser:
    """Learn node references from windows (``fit``, ``observe``), then ``diagnose`` one window
    or ``diagnose_many``.

    ``params``: the decision constants; ``min_node_windows``, ``min_node_servers``: running
    windows and distinct servers of a node (and kind) before its own reference has replaced
    the prior (blended in proportion before that); ``min_windows``: running windows in all
    before ``fitted`` (the service and the command line use the rules until then);
    ``context``, ``context_horizon_s``: each running window is read with its server's recent
    running windows (``features.with_context``), in learning and in scoring alike.
    """

    params: Params = field(default_factory=Params)
    min_node_windows: int = 30
    min_node_servers: int = 6
    min_windows: int = 100
    context: int = CONTEXT_K
    context_horizon_s: float = CONTEXT_HORIZON_S
    nodes: dict = field(default_factory=dict, repr=False)  # (node, kind) -> NodeReference
    tasks: dict = field(default_factory=dict, repr=False)  # (node, server) -> TaskReference
    trained_on: int = 0  # running windows learned from

    # -- learning --------------------------------------------------------------------------------

    def fit(self, windows: Iterable[Window], *, context: bool = True) -> Diagnoser:
        """Learn the references from ``windows`` (every server's oldest first; labels, if the
        source has them, are never read), forgetting what was learned before. ``context``:
        each window read with the earlier windows of its server; ``False``: as given (already
        in context, as ``diagnose_many``'s)."""
        self.nodes, self.tasks, self.trained_on = {}, {}, 0
        if context:
            windows = iter_in_context(windows, self.context, self.context_horizon_s)
        for w in windows:
            self.observe(w)
        for ref in self.nodes.values():
            ref.refresh()  # figures as of the last window, not of the last REFRESH
        return self

    def observe(self, window: Window) -> None:
        """One window (already in its server's context) into its node's reference (idle
        windows feed the node's idle floor) and, when running, its task's: O(1)."""
        if window.sm_active is None:
            return
        key = (window.node or "", kind_of(window))
        ref = self.nodes.get(key)
        if ref is None:
            ref = self.nodes[key] = NodeReference(key[1])
        ref.observe(window)
        if window.kernel_busy is not False:
            self.trained_on += 1
            if window.server is None:
                return  # no task to learn: windows of unnamed servers are not one task
            task = (window.node or "", window.server)
            if task not in self.tasks:
                self.tasks[task] = TaskReference()
            self.tasks[task].observe(window)

    def forget_task(self, node: str | None, server: str | None) -> None:
        self.tasks.pop((node or "", server or ""), None)

    @property
    def fitted(self) -> bool:
        return self.trained_on >= self.min_windows

    def in_context(self, windows: Iterable[Window]) -> list[Window]:
        return in_context(windows, self.context, self.context_horizon_s)

    def with_context(self, window: Window, earlier: Sequence[Window]) -> Window:
        return with_context(window, earlier, self.context, self.context_horizon_s)

    # -- scoring ---------------------------------------------------------------------------------

    def diagnose(self, window: Window, earlier: Sequence[Window] = ()) -> Diagnosis:
        """One window, read with ``earlier`` windows of its server (oldest first)."""
        return self.score(self.with_context(window, earlier))

    def diagnose_many(
        self, windows: Sequence[Window], *, context: bool = True, learn: bool = True
    ) -> list[Diagnosis]:
        """One diagnosis per window, in order. ``context``: each window read with the earlier
        windows of its server in ``windows``; ``False``: as given (already in context).
        ``learn``: nodes the model has too little history of learn from these windows first,
        unlabelled, as ``fit`` would (the model itself is not changed)."""
        if context:
            windows = self.in_context(windows)
        # As they came, whatever the file's order.
        model = self.learnt(sorted(windows, key=time_key)) if learn else self
        return [model.score(w) for w in windows]

    def learnt(self, windows: Iterable[Window]) -> Diagnoser:
        """This model with the nodes it has too little history of learnt from ``windows`` (in
        context, in time order; read once, a window at a time), unlabelled, as ``fit`` would;
        the model itself is not changed (itself when no node is young)."""
        model = self
        young: dict[tuple[str, str], bool] = {}  # node key -> learnt here
        for w in windows:
            if w.sm_active is None:
                continue
            key = (w.node or "", kind_of(w))
            learns = young.get(key)
            if learns is None:
                learns = young[key] = self._maturity(self.nodes.get(key)) < 1.0
                if learns:
                    if model is self:
                        model = copy.copy(self)
                        model.nodes = dict(self.nodes)
                        model.tasks = dict(self.tasks)
                    old = self.nodes.get(key)
                    model.nodes[key] = copy.deepcopy(old) if old else NodeReference(key[1])
            if learns:
                model.nodes[key].observe(w)
        for key, learns in young.items():
            if learns:
                model.nodes[key].refresh()
        return model

    def score(self, w: Window, *, causes_only: bool = False) -> Diagnosis:
        """One window as it is (in context already). ``causes_only``: a diagnosis that names
        no cause (``labels.names_cause``) is its label, confidence and candidates alone, its
        contributions and gains not worked out (the service keeps nothing else of it)."""
        if w.sm_active is None:
            return diagnosis(UNKNOWN)
        ref = self.nodes.get((w.node or "", kind_of(w)))
        if w.kernel_busy is False:
            return self._idle(w, ref)
        if (
            w.kernel_busy is None
            and w.cpu_cores is not None
            and w.cpu_cores <= self.params.zombie_cores
        ):
            # No kernel state (a terminal): a process tree doing nothing on the CPU is not
            # running a thing either — the zombie definition applies, a little less surely;
            # and with the GPU quiet too, it is an idle terminal, not a loop held back.
            found = self._idle(w, ref, self.params.terminal_certainty)
            if found.label == ZOMBIE or w.sm_active <= self.params.zombie_sm:
                return found
        if (
            w.kernel_busy is None
            and w.cpu_cores is None
            and w.gpu_mem_frac is not None
            and w.gpu_mem_frac <= rules.ZOMBIE_MEM_FRAC
            and w.sm_active <= self.params.zombie_sm
        ):
            # No kernel, no process on the card, none of its memory held, its SMs quiet: a
            # server that has not started using its GPU runs nothing to be held back (it read
            # "not sure: data_io or cpu_serial", with the data hint). Never a zombie: nothing
            # is held.
            return diagnosis(HEALTHY)
        return self._running(w, ref, causes_only)

    def _idle(self, w: Window, ref: NodeReference | None, certainty: float = 1.0) -> Diagnosis:
        """Nothing running: the zombie definition, with its confidence (SM activity up to
        ``zombie_sm`` above the node's idle floor is noise, not work)."""
        p = self.params
        if (w.gpu_mem_frac is not None and w.gpu_mem_frac <= rules.ZOMBIE_MEM_FRAC) or (
            w.user_idle_s is not None and w.user_idle_s < rules.ZOMBIE_IDLE_S
        ):
            return diagnosis(HEALTHY)  # no memory held, or somebody there
        floor = ref.idle_floor if ref is not None and ref.idle_floor > 0 else 0.0
        # The floor is learnt from every server's idle windows, reports included: it may
        # raise the bound by 2 % at most, whatever anyone reports.
        idle = 1.0 - _gate(w.sm_active, p.zombie_sm + min(floor, 0.02), p.zombie_width)
        idle *= certainty
        if (w.gpu_mem_frac is None or w.user_idle_s is None) and idle >= 0.5:
            # Memory held or presence not measured: a quiet kernel may be a zombie or its owner
            # thinking. Say so; never call it either surely (a cull takes only a sure zombie).
            idle = 0.5
        return self._decide({ZOMBIE: idle, HEALTHY: 1.0 - idle}, {}, {}, source="rules")

    def _maturity(self, ref: NodeReference | None) -> float:
        if ref is None:
            return 0.0
        return ref.maturity(self.min_node_windows, self.min_node_servers)

    def _reference(
        self, ref: NodeReference | None, kind: str, name: str, mature: float | None = None
    ) -> float:
        """A node's figure, blended with the prior while the node is young (``mature``: the
        node's ``_maturity``, where the caller has it: one score reads up to nine figures)."""
        prior = PRIOR[kind].get(name, math.nan)
        if ref is None:
            return prior
        own = getattr(ref, name) if name in REFERENCE_FIGURES else ref.fed.get(name, math.nan)
        if math.isnan(own):
            return prior
        if math.isnan(prior):
            return own
        if mature is None:
            mature = self._maturity(ref)
        return mature * own + (1.0 - mature) * prior

    def _running(
        self, w: Window, ref: NodeReference | None, causes_only: bool = False
    ) -> Diagnosis:
        p = self.params
        kind = kind_of(w)
        mature = self._maturity(ref)
        # TIME_SHARE_FED at least, but DCGM's
        level = self._reference(ref, kind, "fed_level", mature)
        x = kernel_time(w)
        if math.isnan(level) or level <= 0:
            fed_gate, fed = 0.5, math.nan  # nothing to compare with: undecided
        else:
            fed = x / max(level, 0.05)
            fed_gate = _gate(fed, p.fed, p.fed_width)
            if kind == DCGM:  # no prior for a card's SM activity: undecided until it is known
                fed_gate = 0.5 + (fed_gate - 0.5) * mature
        if kind == DCGM and x is not None:
            # ... but no card's fed level is below SM_FED_MIN: well under it, a loop is starved
            # on any node, young or not (the other way round, a young node stays undecided: a
            # busy memory-bound loop is not a fed one)
            fed_gate = min(fed_gate, _gate(x / SM_FED_MIN, p.fed, p.fed_width))

        memory = self._memory_bound(w, ref, kind, x, fed, mature)
        occ, occ_fed = occupancy(w), self._reference(ref, kind, "occupancy", mature)
        # Busy but with kernels that fill a fraction of the SMs: small kernels back to back.
        underfilled = 0.0
        if occ is not None and occ_fed > 0:
            underfilled = _gate(-occ / occ_fed, -p.underfilled, p.small_width)
        idle_share = max(0.05, 1.0 - min(fed, 1.0)) if not math.isnan(fed) else 0.5
        busy = self._computing(w, idle_share)
        small = self._small_kernels(w, ref, kind, x, occ, occ_fed, busy, mature)
        data = self._data_or_host(w, ref, idle_share, busy, mature)

        starved = (1.0 - memory) * (1.0 - fed_gate)
        fed_work = (1.0 - memory) * fed_gate
        probabilities = {
            MEMORY_BANDWIDTH: memory,
            HEALTHY: fed_work * (1.0 - underfilled),
            SMALL_WORK: fed_work * underfilled + starved * small,
            DATA_IO: starved * (1.0 - small) * data,
            CPU_SERIAL: starved * (1.0 - small) * (1.0 - data),
        }
        label, top, candidates = self._ranked(probabilities, {CPU_SERIAL: p.residual})
        if causes_only and not names_cause(label, candidates):
            return diagnosis(label, None, "model", confidence=top, candidates=candidates)
        fed_sm = ref.fed.get("sm", math.nan) if ref is not None else math.nan
        gain = {}
        if fed_sm > 0:
            gain["node"] = round(max(0.0, fed_sm - w.sm_active), 4)
            gain["share"] = round(gain["node"] / fed_sm, 4)  # of the node's fed GPU work
        task = self.tasks.get((w.node or "", w.server)) if w.server is not None else None
        if task is not None and task.sm:
            gain["task"] = round(max(0.0, task.best_sm - w.sm_active), 4)
        shortfall = gain.get("node", 0.0)
        contributions = {
            SIGNAL_OF[label]: round(probabilities[label] * shortfall, 4) for label in SIGNAL_OF
        }
        contributions[UNEXPLAINED] = round(probabilities[HEALTHY] * shortfall, 4)
        return diagnosis(
            label, contributions, "model", confidence=top, candidates=candidates, gain=gain
        )

    def _memory_bound(self, w: Window, ref, kind: str, x: float, fed: float, mature) -> float:
        """How likely the GPU is busy moving data: DRAM intensity near the node's peak, heavy
        (above an absolute floor, or ``memory_heavy`` times the node's compute loops'), the
        tensor pipes idle, the counter not one its ordinary loops saturate — and the GPU busy
        (a memory-bound loop keeps it busy; a starved one is held back by something else)."""
        p = self.params
        di = dram_intensity(w)
        peak = self._reference(ref, kind, "peak", mature)
        if di is None or not peak > 0:
            return 0.0
        nvml = kind == NVML
        heavy = _gate(di, p.memory_floor_nvml if nvml else p.memory_floor, p.memory_width)
        anchor = self._reference(ref, kind, "compute_dram", mature)
        if anchor > 0:  # or heavy against the node's compute loops (cards' scales differ)
            heavy = max(heavy, _gate(di / anchor, p.memory_heavy, 0.15))
        ts, fed_ts = tensor_share(w), self._reference(ref, kind, "tensor_share", mature)
        if ts is not None and fed_ts >= p.tensor_used:
            # or the node's loops keep the tensor pipes busy and these kernels do not: not matrix
            # math, so near the DRAM peak they are streaming data (whatever the counter's scale)
            heavy = max(heavy, _gate(-ts / fed_ts, -p.pipes_idle, 0.08))
        busy = _gate(x, KERNEL_TIME_MIN, 0.05)
        if not math.isnan(fed):
            busy *= _gate(fed, p.memory_fed, p.fed_width)
        near = _gate(di / peak, p.memory_bound_nvml if nvml else p.memory_bound, p.memory_width)
        if nvml:  # or the time share at this node's own ceiling: busy nearly all the time
            ceiling = self._reference(ref, kind, "dram_ceiling", mature)
            if ceiling > 0:
                near = max(near, _gate(w.dram_active / ceiling, p.ceiling, p.memory_width))
        memory = near * heavy * busy * (p.nvml_memory_weight if nvml else 1.0)
        if ts is not None:
            memory *= 1.0 - _gate(ts, p.tensor_busy, 0.05)
        fed_di = self._reference(ref, kind, "dram_intensity", mature)
        if fed_di > 0:  # a counter the node's ordinary loops already saturate tells nothing
            memory *= 1.0 - _gate(fed_di / peak, p.saturated, 0.05)
        return memory

    def _computing(self, w: Window, idle_share: float) -> float:
        """How likely a thread of the loop computes through the GPU's idle time: its busiest
        thread (what a serial loop saturates) where the server reports it, else the tree's
        cores net of the time blocked on reads; 0.5 when neither is known."""
        p = self.params
        if w.cpu_top_thread is not None:
            return _gate(w.cpu_top_thread / idle_share, p.waiting, p.waiting_width)
        if w.cpu_cores is not None:
            computing = w.cpu_cores - (w.cpu_iowait or 0.0)
            return _gate(computing / idle_share, p.waiting, p.waiting_width)
        return 0.5

    def _small_kernels(self, w, ref, kind, x, occ, occ_fed, busy, mature) -> float:
        """How likely a starved loop's kernels are too small: they fill few SMs (occupancy,
        where it is measured); per unit of SM activity they move little data and leave the
        tensor pipes idle (tiny kernels are latency-bound); the task holds little memory (a
        small batch or model). The signs add up, none certain alone. And only where a thread
        keeps launching them: less while the loop waits, not where kernels run less of the time
        than tiny ones launched back to back give (a kernel lasts a few microseconds at least, a
        launch some tens at most: below that the host is busy with something else)."""
        p = self.params
        signs = []
        di, fed_di = dram_intensity(w), self._reference(ref, kind, "dram_intensity", mature)
        if di is not None and fed_di > 0 and w.sm_active >= 0.05:
            light = _gate(-di / fed_di, -p.light_traffic, p.light_width)
            ts, fed_ts = tensor_share(w), self._reference(ref, kind, "tensor_share", mature)
            if ts is not None and fed_ts >= p.tensor_used:  # the node's loops use the pipes
                light = min(light, _gate(-ts / fed_ts, -p.light_traffic, p.light_width))
            signs.append(p.light_weight * light)
        fed_mem = self._reference(ref, kind, "log_mem", mature)
        if w.gpu_mem_frac and not math.isnan(fed_mem):
            little = _gate(fed_mem - math.log(w.gpu_mem_frac), math.log(4.0), 0.5) * mature
            signs.append(p.memory_weight * little)
        small = 1.0 - math.prod(1.0 - s for s in signs)
        if occ is not None and occ_fed > 0:  # measured, occupancy weighs most
            filled = _gate(-occ / occ_fed, -p.small, p.small_width)
            small = filled + (1.0 - filled) * small * (1.0 - p.occupancy_says)
        else:  # a thread busy through the idle time may be launching tiny kernels
            small = max(small, busy * p.launch_share)
        small *= p.idle_thread + (1.0 - p.idle_thread) * busy
        if kind != DCGM:  # x is the kernel-time share
            small *= _gate(x, p.launch_time, 0.02)
        return small

    def _data_or_host(self, w, ref, idle_share, busy, mature) -> float:
        """How likely a starved loop (not launch-bound) waits on data rather than on its host.
        Each sign adds log-odds, so signs that disagree leave the answer open: moving data (a
        loader's worth, more so near the node's storage peak: a loop the storage holds up reads
        at its pace) or reading nothing; blocked on reads beyond the node's fed loops' I/O wait;
        a thread computing through the idle time (the host's work) or waiting (either's: a
        ``time.sleep`` and a network mount's wait look the same)."""
        p = self.params
        if w.read_mb_s is None and w.cpu_iowait is None:
            # Nothing of the input side is measured: a thread computing is either's (the main
            # thread decoding its own batches is data_io, docs/api.md "What each label
            # means"), and a waiting one too. Abstain rather than guess from the CPU alone.
            return 0.5
        # the busiest thread measures a serial loop directly; the tree's cores only bound it
        host = p.thread_weight if w.cpu_top_thread is not None else p.host_weight
        evidence = host * (1.0 - 2.0 * busy)
        if w.read_mb_s is not None:
            moving = _gate(math.log1p(w.read_mb_s), math.log1p(p.reads_mb_s), 0.5)
            peak_reads = ref.read_peak if ref is not None else math.nan
            if peak_reads > math.log1p(p.reads_mb_s):
                near = math.log1p(w.read_mb_s) - (peak_reads - math.log(p.storage_share))
                moving *= 1.0 - mature + mature * _gate(near, 0.0, 0.5)
            # reading nothing weighs about as much as waiting (a FUSE mount's reads are not
            # counted), so a loop that waits and reads nothing is either's; and it tells
            # nothing on a node whose loops are never seen reading (a FUSE mount, an object
            # store streamed over HTTP: reads nobody counts), read against the node's own
            signed = 2.0 * moving - 1.0
            if signed > 0:
                evidence += signed * p.reads_weight
            else:
                seen = _gate(peak_reads, math.log1p(p.reads_mb_s), 0.5) if peak_reads > 0 else 0.0
                evidence += signed * p.unread_weight * (1.0 - mature + mature * seen)
        if w.cpu_iowait is not None:
            normal = ref.fed.get("iowait", math.nan) if ref is not None else math.nan
            excess = w.cpu_iowait - (normal if normal > 0 else 0.0) * mature
            evidence += p.io_weight * _gate(excess / idle_share, p.io, p.io_width)
        return 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, evidence))))

    def _decide(self, probabilities: dict, contributions: dict, gain: dict, source: str, most=None):
        """The diagnosis of ``_ranked``'s label."""
        label, top, candidates = self._ranked(probabilities, most)
        return diagnosis(
            label,
            contributions,
            source,
            confidence=top,
            candidates=candidates,
            gain=gain,
        )

    def _ranked(self, probabilities: dict, most=None) -> tuple[str, float, tuple[str, ...]]:
        """The most likely label, its probability the confidence — at most ``most[label]``
        where given (a label no column shows apart from others: see ``residual``) — and the
        two most likely labels."""
        ranked = sorted(probabilities, key=probabilities.__getitem__, reverse=True)
        top = probabilities[ranked[0]]
        if most and ranked[0] in most:
            top = min(top, most[ranked[0]])
        label = ranked[0] if top >= self.params.confident else UNCERTAIN
        return label, top, tuple(ranked[:2])

    # -- persistence -----------------------------------------------------------------------------

    def save(self, path) -> None:
        """Pickle the model (load only files you trust: loading a pickle runs code)."""
        with open(path, "wb") as file:
            self.dump(file)

    def dump(self, file) -> None:
        """Pickle the model into ``file``, open for writing bytes."""
        pickle.dump({"format": FORMAT, "diagnoser": self}, file, pickle.HIGHEST_PROTOCOL)

    @classmethod
    def load(cls, path) -> Diagnoser:
        with open(path, "rb") as file:
            try:
                data = pickle.load(file)
            except Exception as error:
                raise ValueError(f"{path}: not a diagnosis model ({error})") from None
        if not isinstance(data, dict) or data.get("format") not in READS:
            formats = " or ".join(map(str, READS))
            raise ValueError(f"{path}: not a jupyter-gpu-gov diagnosis model (format {formats})")
        model = data.get("diagnoser")
        if not isinstance(model, cls):
            raise ValueError(f"{path}: not a jupyter-gpu-gov diagnosis model")
        return model
