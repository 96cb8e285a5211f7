"""The root-cause labels (docs/api.md, "Root causes"), their one-line hints, and a diagnosis.

The hints live here and only here: the verdict, the admin list and ``jupyter-gpu-gov diagnose``
all show the same words. Each says what a researcher can do about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

HEALTHY = "healthy"
ZOMBIE = "zombie"
DATA_IO = "data_io"
CPU_SERIAL = "cpu_serial"
MEMORY_BANDWIDTH = "memory_bandwidth"
SMALL_WORK = "small_work"
FRAGMENTATION = "fragmentation"  # cluster level only
UNKNOWN = "unknown"  # the GPU signal itself (sm_active) is missing: never idle, never blamed
UNCERTAIN = "uncertain"  # the model's best label is below its confidence: two candidates instead

# Labels that name no cause: no root cause in a verdict (nor an uncertain answer between two of
# them).
SILENT_LABELS = frozenset({HEALTHY, UNKNOWN})

# The labels of one server's window, in the order reports and benchmarks list them.
LABELS = (HEALTHY, ZOMBIE, DATA_IO, CPU_SERIAL, MEMORY_BANDWIDTH, SMALL_WORK)

HINTS: Mapping[str, str] = {
    HEALTHY: "",
    ZOMBIE: (
        "This kernel holds GPU memory but has done no GPU work and nobody has used it for a "
        "while: save what you need and shut it down (or restart the kernel) to give the GPU back."
    ),
    DATA_IO: (
        "Data loading: the GPU waits for its input to be read or decoded — try more DataLoader "
        "workers, pin_memory=True, local/cached or pre-decoded data, or decoding on the GPU."
    ),
    CPU_SERIAL: (
        "A CPU-bound loop: the loop's own Python work holds the GPU back — move the work to the "
        "GPU, vectorise it, or do it less often (logging, metrics, .item())."
    ),
    MEMORY_BANDWIDTH: (
        "Memory-bound kernels: the GPU is busy moving data, not computing — fuse elementwise ops "
        "(torch.compile), use bf16/fp16."
    ),
    SMALL_WORK: (
        "Too little work per kernel: the GPU finishes each one and waits for the next launch — "
        "increase the batch size, or use CUDA graphs / torch.compile."
    ),
    FRAGMENTATION: (
        "GPUs are partly used while spawns wait for one: consolidate onto fewer cards or offer "
        "smaller slices."
    ),
    UNKNOWN: "",
    UNCERTAIN: "",
}


@dataclass(frozen=True)
class Diagnosis:
    """What one window (or the cluster) says.

    ``label``: one of ``LABELS``, ``unknown``, ``fragmentation``, or ``uncertain`` when the most
    likely label's ``confidence`` is below the model's threshold (``candidates`` then says
    which two it is between). ``confidence``: the probability the model gives its most likely
    label (0..1; 1 for a definition the window meets, such as a missing GPU signal).
    ``candidates``: the two most likely labels, most likely first (one for a definition).
    ``contributions``: cause signal -> SM activity (0..1) that removing that cause would give
    back, weighed by how likely it is the cause (``unexplained``: the shortfall the model does
    not put on a cause); empty for the rules. ``gain``: the shortfall against the node's fed
    state (``node``) and against the task's own best windows (``task``), SM activity 0..1.
    ``source``: ``"model"`` or ``"rules"`` (the threshold baseline, or a definition: the zombie,
    a missing GPU signal, a kernel running nothing).
    """

    label: str
    contributions: Mapping[str, float] = field(default_factory=dict)
    hint: str = ""
    source: str = "rules"
    confidence: float = 1.0
    candidates: tuple[str, ...] = ()
    gain: Mapping[str, float] = field(default_factory=dict)

    @property
    def cause(self) -> str:
        """The most likely label, even when not confident (``label`` is then ``uncertain``)."""
        return self.candidates[0] if self.candidates else self.label

    @property
    def confident(self) -> bool:
        return self.label != UNCERTAIN

    def as_dict(self) -> dict:
        return {
            "label": self.label,
            "cause": self.cause,
            "confidence": round(self.confidence, 4),
            "confident": self.confident,
            "candidates": list(self.candidates or (self.label,)),
            "contributions": dict(self.contributions),
            "gain": dict(self.gain),
            "hint": self.hint,
            "source": self.source,
        }


def names_cause(label: str, candidates: tuple[str, ...]) -> bool:
    """Whether a diagnosis names a cause: not healthy, not unknown, nor uncertain between
    those."""
    if label in SILENT_LABELS:
        return False
    return label != UNCERTAIN or not all(c in SILENT_LABELS for c in candidates)


def diagnosis(
    label: str,
    contributions: Mapping[str, float] | None = None,
    source: str = "rules",
    *,
    confidence: float = 1.0,
    candidates: tuple[str, ...] | None = None,
    gain: Mapping[str, float] | None = None,
) -> Diagnosis:
    """A ``Diagnosis`` with the label's hint (for ``uncertain``, the hint of the most likely
    candidate that names a cause, prefixed to say it is a guess)."""
    candidates = tuple(candidates) if candidates else (label,)
    hint = HINTS.get(label, "")
    if label == UNCERTAIN:
        named = [c for c in candidates if HINTS.get(c)]
        hint = f"Not sure yet ({' or '.join(candidates)}). " + HINTS[named[0]] if named else ""
    # What ``Diagnosis(...)`` makes (its fields in their order), without the frozen dataclass's
    # seven setattrs: every report is diagnosed (docs/benchmarks-history.md, "Issue 26, wave
    # 36").
    d = object.__new__(Diagnosis)
    object.__setattr__(
        d,
        "__dict__",
        {
            "label": label,
            "contributions": dict(contributions or {}),
            "hint": hint,
            "source": source,
            "confidence": confidence,
            "candidates": candidates,
            "gain": dict(gain or {}),
        },
    )
    return d
