"""What a node and a task normally look like, learned online from their own windows.

A diagnosis reads every signal against the node's own history, never against another node's:
cards differ in what SM activity a well-fed loop reads (0.3 on one, 0.9 on another), in the
scale of their DRAM counter, in the I/O wait their disks cause, in the cores their loops keep
busy. ``NodeReference`` learns these per node, from the node's first windows on, in O(1) per
window (fixed histograms and sums; the derived figures are recomputed every ``REFRESH``
windows), and forgets slowly (counts halve past ``CAP``). ``TaskReference`` keeps a server's
own best, for the within-task counterfactual.

Windows are grouped by *how they were measured* (``kind``): ``engine`` (DCGM's engine
activity, ``gr_active``, is known: the kernel-time share is measured, card-independent),
``dcgm`` (DCGM counters without ``gr_active``: SM activity depends on the card) and ``nvml``
(NVML alone: ``sm_active`` is the share of time a kernel ran). One node may have windows of two
kinds (a DCGM scrape lost falls back to NVML's readings); each kind has its own reference.

A node's *fed level* is the kernel-time share (``gr_active``; else ``sm_active``) of its loops
that are not held back: the node's running windows split in two at Otsu's threshold (the split
that best separates a starved group from a fed one), and the median of the upper group — never
below ``TIME_SHARE_FED`` where it is a share of time (a node whose loops are mostly starved
would otherwise call its starved loops fed). Its *fed state* is the mean of each signal over
the windows within ``FED_SHARE`` of the fed level that are not memory-bound (the best state
among computing loops): the I/O wait, cores, reads, memory and DRAM intensity that its healthy
loops show. Its *peak* DRAM intensity is the 98th percentile over windows whose kernels ran at
least 30 % of the time (DCGM's: at most 1, the interface busy all the time); its *compute
DRAM* the lower quartile over its fed windows (its compute loops', as long as a quarter of
them compute); its *read peak* the 98th percentile of what its loops read (MB/s): what its
storage gives at most. Its *DRAM ceiling* is the 98th percentile of the DRAM counter itself over
the same windows as the peak: the most *this node's* counter reads, whatever its scale. NVML's
memory utilisation is a time share that saturates (GDDR cards, a driver's sampling), and its
ceiling differs per node (1.0 on one, 0.9 on another): a memory-bound loop keeps it at that
ceiling, which a fleet constant would not know. Its *idle floor* is what SM activity reads
in windows whose kernel runs nothing.

A reference pickled before a figure existed (model format 7: no DRAM ceiling) is read with
that figure's empty default (``__setstate__``): it learns it from the node's next windows,
and the model uses its prior until then.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import MISSING, dataclass, field, fields

from .features import Window

REFRESH = 16  # windows between two recomputations of a reference's figures
CAP = 50_000.0  # past this many (weighted) windows, a reference's counts halve
SM_FLOOR = 0.05  # denominators of intensities: nearly idle windows stay bounded
KERNEL_TIME_MIN = 0.3  # DRAM peak: only windows whose kernels ran this share of the time
PEAK_QUANTILE = 0.98
# A memory interface is busy all of the time at most: DCGM's DRAM activity per unit of kernel
# time above 1 is copies outside kernels, not a higher peak (min() keeps NaN). Not NVML's: its
# memory utilisation is a time share sampled apart from the kernels', whose ratio is no bound
# (and its ordinary loops saturate it: the peak is what tells them from memory-bound ones).
PEAK_MAX = 1.0
# The DRAM intensity of a node's compute loops: this quantile of its fed windows' (memory-bound
# loops included: a low quantile stays the compute loops' as long as a quarter of the fed
# windows compute, where a mean would drift up with every memory-bound loop the node runs).
COMPUTE_QUANTILE = 0.25
FED_BINS = 20
FED_SHARE = 0.75  # the fed state: windows at this share of the fed level or more
MANY = 64  # distinct servers a reference counts, at most

ENGINE, DCGM, NVML = "engine", "dcgm", "nvml"
# Where the kernel-time share is measured (``engine``, ``nvml``) a fed loop keeps a kernel
# running at least this share of the time, on any card: a node's fed level is never below it.
TIME_SHARE_FED = 0.8
# Where only DCGM's SM activity is known (no engine activity), a fed loop of ordinary kernels
# reads at least this on any card: SM activity is the share of SMs with a warp resident, a fed
# loop's kernels run most of the time on most of the SMs, and the slowest cards' fed loops read
# about 0.3 (a third below that is the floor: no card is known to read less). A node's fed level
# is never below it, so a node whose first loops all starve does not call them fed; kernels
# that fill fewer SMs are small work either way.
SM_FED_MIN = 0.2
# DRAM intensity at this share of the node's peak is a memory-bound loop's: left out of the fed
# state (NVML's memory utilisation saturates early: ordinary loops read high on it too).
MEMORY_BOUND_SHARE = {ENGINE: 0.65, DCGM: 0.65, NVML: 0.85}


def kind_of(w: Window) -> str:
    """How the window was measured (see the module docstring)."""
    if w.gr_active is not None:
        return ENGINE
    if w.tensor_active is not None or w.pcie_mb_s is not None:
        return DCGM
    return NVML


def kernel_time(w: Window) -> float | None:
    """The share of the window a kernel ran: ``gr_active``, else ``sm_active`` (NVML's
    utilisation is that share; DCGM's SM activity without ``gr_active`` is the best there is)."""
    return w.gr_active if w.gr_active is not None else w.sm_active


def occupancy(w: Window) -> float | None:
    """``sm_active / gr_active``: how much of the card the kernels fill while one runs (not read
    where almost nothing ran)."""
    if w.sm_active is None or w.gr_active is None or w.gr_active < SM_FLOOR:
        return None
    return w.sm_active / w.gr_active


def dram_intensity(w: Window) -> float | None:
    """DRAM activity per unit of time a kernel ran: how memory-bound the kernels are when they
    run (a time average halves when the GPU idles half the window, whatever the cause)."""
    ran = kernel_time(w)
    if w.dram_active is None or ran is None:
        return None
    return w.dram_active / max(ran, SM_FLOOR)


def tensor_share(w: Window) -> float | None:
    """Tensor-pipe activity per unit of SM activity: how much of the work is matrix math."""
    if w.tensor_active is None or w.sm_active is None or w.sm_active < SM_FLOOR:
        return None
    return w.tensor_active / w.sm_active


class Histogram:
    """Counts over fixed bins of ``[low, high]`` (values outside go to the end bins)."""

    __slots__ = ("counts", "high", "low", "total", "width")

    def __init__(self, bins: int, low: float = 0.0, high: float = 1.0):
        self.counts = [0.0] * bins
        self.low, self.high = low, high
        self.width = (high - low) / bins
        self.total = 0.0

    def bin(self, x: float) -> int:
        i = int((x - self.low) / self.width)
        return 0 if i < 0 else min(i, len(self.counts) - 1)

    def add(self, x: float, weight: float = 1.0) -> None:
        counts = self.counts
        i = int((x - self.low) / self.width)  # ``bin(x)``, written out: once or more a report
        counts[0 if i < 0 else min(i, len(counts) - 1)] += weight
        self.total += weight

    def halve(self) -> None:
        self.counts = [c / 2 for c in self.counts]
        self.total /= 2

    def centre(self, i: int) -> float:
        return self.low + (i + 0.5) * self.width

    def quantile(self, q: float, start: int = 0) -> float:
        """The ``q`` quantile of the values in bins ``start..``, interpolated within a bin."""
        counts = self.counts
        total = sum(counts[start:])
        if total <= 0:
            return math.nan
        target, seen = q * total, 0.0
        for i in range(start, len(counts)):
            c = counts[i]
            if c > 0 and seen + c >= target:
                return self.low + (i + (target - seen) / c) * self.width
            seen += c
        return self.high

    def otsu(self) -> int:
        """The first bin of the upper group that best separates the values in two (Otsu's
        threshold: the largest between-group variance)."""
        counts = self.counts
        total = sum(counts)
        if total <= 0:
            return 0
        # ``centre(i)`` written out (the same sums): a node's figures are refreshed every
        # REFRESH running windows, and this read 200 calls each time
        low, width = self.low, self.width
        mean_all = sum(c * (low + (i + 0.5) * width) for i, c in enumerate(counts)) / total
        best, split, weight, moment = -1.0, 1, 0.0, 0.0
        for i in range(len(counts) - 1):
            weight += counts[i]
            moment += counts[i] * (low + (i + 0.5) * width)
            if weight <= 0 or weight >= total:
                continue
            mean_low = moment / weight
            mean_high = (mean_all * total - moment) / (total - weight)
            between = weight * (total - weight) * (mean_low - mean_high) ** 2
            if between > best:
                best, split = between, i + 1
        return split


# The signals whose fed-state value a node keeps (means over the fed group), and how each is
# read from a window.
FED_SIGNALS = ("sm", "occupancy", "dram_intensity", "tensor_share", "iowait", "cores",
               "log_reads", "log_mem")  # fmt: skip


def _signals(w: Window, di: float | None) -> tuple[float | None, ...]:
    """The window's ``FED_SIGNALS``, in their order (``di``: its ``dram_intensity``, read
    already)."""
    return (
        w.sm_active,
        occupancy(w),
        di,
        tensor_share(w),
        w.cpu_iowait,
        w.cpu_cores,
        None if w.read_mb_s is None else math.log1p(w.read_mb_s),
        None if not w.gpu_mem_frac else math.log(w.gpu_mem_frac),
    )


@dataclass
class NodeReference:
    """One node's (one measurement kind's) online reference; see the module docstring."""

    kind: str
    windows: float = 0.0  # running windows seen (weighted: halves past CAP)
    servers: set = field(default_factory=set)  # distinct servers seen running (up to MANY)
    kernel: Histogram = field(default_factory=lambda: Histogram(100))
    intensity: Histogram = field(default_factory=lambda: Histogram(100, 0.0, 2.0))
    # the DRAM counter itself over the same windows (``dram_ceiling``; NVML's: a time share)
    busy_dram: Histogram = field(default_factory=lambda: Histogram(50))
    # DRAM intensity of the fed group's windows, memory-bound ones included (``compute_dram``)
    fed_intensity: Histogram = field(default_factory=lambda: Histogram(100, 0.0, 2.0))
    idle: Histogram = field(default_factory=lambda: Histogram(50, 0.0, 0.25))
    reads: Histogram = field(default_factory=lambda: Histogram(80, 0.0, 10.0))  # log1p(MB/s)
    # per bin of kernel-time share: [count, sum] of each fed signal (memory-bound excluded)
    sums: list = field(default_factory=lambda: [[0.0] * (2 * len(FED_SIGNALS))
                                                 for _ in range(FED_BINS)])  # fmt: skip
    # derived (``refresh``)
    fed_level: float = math.nan  # the fed group's median kernel-time share
    threshold: float = math.nan  # Otsu's split of the kernel-time share
    peak: float = math.nan  # practical peak of DRAM intensity
    fed: dict = field(default_factory=dict)  # fed-state mean of each FED_SIGNALS
    idle_floor: float = math.nan  # median SM activity of idle kernels
    read_peak: float = math.nan  # log1p of the most the node's loops read (MB/s): its storage
    compute_dram: float = math.nan  # DRAM intensity of its compute loops (see COMPUTE_QUANTILE)
    dram_ceiling: float = math.nan  # the most its DRAM counter reads (PEAK_QUANTILE)
    _since: int = 0

    def __setstate__(self, state: dict) -> None:
        """Unpickle, giving any field an older model lacks its default (the migration)."""
        self.__dict__.update(state)
        for f in fields(self):
            if f.name not in state:
                default = f.default_factory() if f.default_factory is not MISSING else f.default
                setattr(self, f.name, default)

    def observe(self, w: Window) -> None:
        """One window of this node and kind (running or idle; in its server's context)."""
        if w.sm_active is None:
            return
        if w.kernel_busy is False:
            self.idle.add(min(w.sm_active, 0.2499))
            return
        x = kernel_time(w)
        self.windows += 1
        if len(self.servers) < MANY:
            self.servers.add(w.server)
        di = dram_intensity(w)
        # Memory-bound loops are left out of the fed level and state: their SMs read busy while
        # they wait on memory, higher than the node's compute loops on some cards.
        share = MEMORY_BOUND_SHARE[self.kind]
        computing = not (di is not None and self.peak > 0 and di >= share * self.peak)
        if computing:
            self.kernel.add(x)
        if di is not None and x >= KERNEL_TIME_MIN:
            self.intensity.add(di)
            self.busy_dram.add(w.dram_active)
            if x >= max(self.threshold, FED_SHARE * self.fed_level):  # false while unknown
                self.fed_intensity.add(di)
        if w.read_mb_s is not None:
            self.reads.add(math.log1p(w.read_mb_s))
        if computing:
            row = self.sums[min(int(x * FED_BINS), FED_BINS - 1)]
            for j, value in enumerate(_signals(w, di)):
                if value is not None:
                    row[2 * j] += 1.0
                    row[2 * j + 1] += value
        if self.windows > CAP:
            for h in (self.kernel, self.intensity, self.busy_dram, self.fed_intensity,
                      self.idle, self.reads):  # fmt: skip
                h.halve()
            self.sums = [[v / 2 for v in row] for row in self.sums]
            self.windows /= 2
        self._since += 1
        if self._since >= REFRESH or math.isnan(self.fed_level):
            self.refresh()

    def maturity(self, windows: int, servers: int) -> float:
        """0..1: how far this reference has seen enough windows *and* enough servers (a node
        whose only history is one server knows that server, not the node)."""
        seen = self.servers
        if len(seen) == 1 and None in seen:  # no window names its server: how many there are
            # is unknown (``== {None}`` made a set each time: every score asks)
            return min(1.0, self.windows / windows)
        return min(1.0, self.windows / windows, len(seen) / servers)

    def refresh(self) -> None:
        self._since = 0
        k = self.kernel
        if k.total <= 0:
            return
        split = k.otsu()
        self.threshold = k.low + split * k.width
        upper = sum(k.counts[split:])
        self.fed_level = k.quantile(0.5, split) if upper > 0 else k.quantile(0.9)
        if self.kind != DCGM:  # a share of time: a fed loop keeps a kernel running most of it,
            # whatever the node's loops mostly do (a node of starved loops has a low median)
            self.fed_level = max(self.fed_level, TIME_SHARE_FED)
        else:
            self.fed_level = max(self.fed_level, SM_FED_MIN)
        self.peak = self.intensity.quantile(PEAK_QUANTILE)
        if self.kind != NVML:
            self.peak = min(self.peak, PEAK_MAX)
        # The fed state: windows whose kernel share is near the fed level (not every window
        # of the upper group: launch-bound loops may sit in it, running tiny kernels often).
        first = min(int(max(self.threshold, FED_SHARE * self.fed_level) * FED_BINS), FED_BINS - 1)
        fed = {}
        rows = self.sums[first:]
        for j, name in enumerate(FED_SIGNALS):
            # sums of lists, not of generators: the same additions in the same order, faster
            n = sum([row[2 * j] for row in rows])
            s = sum([row[2 * j + 1] for row in rows])
            if n <= 0:  # no fed group yet: every window
                n = sum([row[2 * j] for row in self.sums])
                s = sum([row[2 * j + 1] for row in self.sums])
            fed[name] = s / n if n > 0 else math.nan
        self.fed = fed
        self.idle_floor = self.idle.quantile(0.5)
        self.read_peak = self.reads.quantile(PEAK_QUANTILE)
        self.compute_dram = self.fed_intensity.quantile(COMPUTE_QUANTILE)
        self.dram_ceiling = self.busy_dram.quantile(PEAK_QUANTILE)


TASK_KEEP = 32  # running windows a task keeps for its own best


@dataclass
class TaskReference:
    """A server's (task's) own recent running windows: its best SM activity (the 90th
    percentile of the last ``TASK_KEEP``)."""

    # Packed, not a deque of float objects: the service keeps one a running server (0.3 kB
    # against 2.4 kB; docs/benchmarks-history.md, "Issue 26, wave 14"). A model saved with a deque
    # here still loads and learns: both append, index and sort alike.
    sm: array = field(default_factory=lambda: array("d"))

    def observe(self, w: Window) -> None:
        if w.sm_active is not None and w.kernel_busy is not False:
            sm = self.sm
            sm.append(w.sm_active)
            if len(sm) > TASK_KEEP:
                del sm[0]

    @property
    def best_sm(self) -> float:
        ordered = sorted(self.sm)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if ordered else math.nan
