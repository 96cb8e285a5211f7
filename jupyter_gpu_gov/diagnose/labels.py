"""The root-cause labels (DESIGN §8), their one-line hints, and a diagnosis.

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

# The labels of one server's window, in the order reports and benchmarks list them.
LABELS = (HEALTHY, ZOMBIE, DATA_IO, CPU_SERIAL, MEMORY_BANDWIDTH, SMALL_WORK)

HINTS: Mapping[str, str] = {
    HEALTHY: "",
    ZOMBIE: (
        "This kernel holds GPU memory but has done no GPU work and nobody has used it for a "
        "while: save what you need and shut it down (or restart the kernel) to give the GPU back."
    ),
    DATA_IO: (
        "Data loading: the GPU waits on reads — try more DataLoader workers, pin_memory=True, "
        "or local/cached data."
    ),
    CPU_SERIAL: (
        "A CPU-bound loop: one core is saturated while the GPU waits — move the work to the GPU, "
        "vectorise, or use DataLoader workers."
    ),
    MEMORY_BANDWIDTH: (
        "Memory-bound kernels: the GPU is busy moving data, not computing — fuse elementwise ops "
        "(torch.compile), use bf16/fp16."
    ),
    SMALL_WORK: (
        "Too little work per step: the GPU finishes each kernel and waits — increase the batch "
        "size, or use CUDA graphs / torch.compile."
    ),
    FRAGMENTATION: (
        "GPUs are partly used while spawns wait for one: consolidate onto fewer cards or offer "
        "smaller slices."
    ),
    UNKNOWN: "",
}


@dataclass(frozen=True)
class Diagnosis:
    """What one window (or the cluster) says.

    ``contributions``: feature -> change in predicted ``sm_active`` when that feature alone is
    set to its value in the node's best state (positive: it would help); empty for the rules.
    ``source``: ``"model"`` (the counterfactual model) or ``"rules"`` (thresholds: the baseline,
    the zombie definition, a missing GPU signal, or no model for this window).
    """

    label: str
    contributions: Mapping[str, float] = field(default_factory=dict)
    hint: str = ""
    source: str = "rules"

    def as_dict(self) -> dict:
        return {
            "label": self.label,
            "contributions": dict(self.contributions),
            "hint": self.hint,
            "source": self.source,
        }


def diagnosis(label: str, contributions: Mapping[str, float] | None = None, source="rules"):
    """A ``Diagnosis`` with the label's hint."""
    return Diagnosis(label, dict(contributions or {}), HINTS.get(label, ""), source)
