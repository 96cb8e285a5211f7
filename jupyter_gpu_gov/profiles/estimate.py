"""How much GPU memory a model needs, and the smallest tier that holds it.

A rule of thumb (``jupyter-gpu-gov estimate`` prints it)::

    memory = parameters x bytes per parameter x redundancy x (1 + reserve)

- *Bytes per parameter* follow the precision the weights are held in: fp32 4, bf16 and fp16 2,
  int8 1, int4 0.5.
- *Redundancy* is how many times the weights' memory a job holds in all. Training holds
  gradients and the optimizer's state besides the weights: with Adam, two moments per
  parameter, often in fp32 beside bf16 weights, 4 to 6 times the weights (default 5) before
  activations. Inference holds the weights plus the KV cache and activations, 1.2 to 1.5 times
  the weights (default 1.3) for moderate batch sizes and context lengths.
- The *reserve*, 10 to 15 % on top (default 12 %, ``core.rightsize.RESERVE``, which the
  governor's right-sizing adds to a measured peak too), covers the CUDA context, the
  framework's allocator fragmentation and workspace buffers.

Units: 1 GB is 10⁹ bytes, the unit of the tiers' nominal sizes (``memory_gb``: "80 GB" H100,
MIG ``3g.71gb``). Nominal sizes are at or a little below what the devices really hold in bytes
(an "80 GB" H100 has 81,559 MiB, 85.5 x 10⁹ bytes; a ``1g.10gb`` slice 9.75 GiB), so comparing
in 10⁹ bytes errs on the safe side.

Pure: the standard library, ``core`` and ``.tiers`` only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.rightsize import RESERVE
from .tiers import MIN_SHARE, Tier, load_tiers

GB = 1e9  # bytes: the unit of Tier.memory_gb

# Bytes per parameter, by precision (and the spellings people use for it).
PRECISIONS: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "int4": 0.5}
_PRECISION_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}

# Redundancy per mode: (default, low, high).
MODES: dict[str, tuple[float, float, float]] = {
    "training": (5.0, 4.0, 6.0),  # weights + gradients + Adam moments
    "inference": (1.3, 1.2, 1.5),  # weights + KV cache and activations
}
MODE_WHY = {
    "training": "weights, gradients and optimizer state",
    "inference": "weights, KV cache and activations",
}
RESERVE_RANGE = (0.10, 0.15)
_EPS = 1e-9

_SUFFIXES = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
# Beyond any model (the largest have a few trillion); larger counts overflow the arithmetic.
MAX_PARAMS = 10**15
_PARAMS = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?([kmbt]?)$")

# A built-in catalogue for the command line when no --tiers file is given: the MIG slices of an
# H200 (mixed strategy) and whole H100 and H200 cards.
DEFAULT_TIERS: tuple[dict[str, Any], ...] = (
    {"name": "h200-1g", "gpu": "H200-141GB", "mig": "1g.18gb"},
    {"name": "h200-1g-35", "gpu": "H200-141GB", "mig": "1g.35gb"},
    {"name": "h200-2g", "gpu": "H200-141GB", "mig": "2g.35gb"},
    {"name": "h200-3g", "gpu": "H200-141GB", "mig": "3g.71gb"},
    {"name": "h200-4g", "gpu": "H200-141GB", "mig": "4g.71gb"},
    {"name": "h200-7g", "gpu": "H200-141GB", "mig": "7g.141gb"},
    {"name": "h100", "gpu": "H100-80GB"},
    {"name": "h100x2", "gpu": "H100-80GB", "count": 2},
    {"name": "h200", "gpu": "H200-141GB"},
    {"name": "h200x2", "gpu": "H200-141GB", "count": 2},
    {"name": "h200x4", "gpu": "H200-141GB", "count": 4},
    {"name": "h200x8", "gpu": "H200-141GB", "count": 8},
)


@dataclass(frozen=True)
class Estimate:
    """GPU memory for one model, in bytes; ``gb`` and the breakdown in 10⁹ bytes."""

    params: int
    precision: str
    bytes_per_param: float
    mode: str
    redundancy: float
    reserve: float  # a fraction: 0.12 is 12 %
    weights_bytes: int  # params x bytes per parameter
    working_bytes: int  # x redundancy
    bytes: int  # x (1 + reserve): the estimate

    @property
    def gb(self) -> float:
        return self.bytes / GB

    @property
    def weights_gb(self) -> float:
        return self.weights_bytes / GB

    @property
    def working_gb(self) -> float:
        return self.working_bytes / GB

    @property
    def reserve_gb(self) -> float:
        return (self.bytes - self.working_bytes) / GB

    @property
    def breakdown(self) -> dict[str, float]:
        return {
            "weights_gb": self.weights_gb,
            "redundancy": self.redundancy,
            "with_redundancy_gb": self.working_gb,
            "reserve": self.reserve,
            "reserve_gb": self.reserve_gb,
            "total_gb": self.gb,
        }

    def fits(self, tiers: Mapping[str, Tier]) -> list[Tier]:
        """The tiers that hold this estimate, smallest first (see ``smallest_tier``)."""
        fitting = [
            tier
            for tier in tiers.values()
            if tier.weight >= MIN_SHARE - _EPS and tier_memory_gb(tier) * GB >= self.bytes
        ]
        return sorted(fitting, key=lambda t: (t.weight, tier_memory_gb(t), t.name))

    def as_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "precision": self.precision,
            "bytes_per_param": self.bytes_per_param,
            "mode": self.mode,
            "redundancy": self.redundancy,
            "reserve": self.reserve,
            "bytes": self.bytes,
            "gb": self.gb,
            "breakdown": self.breakdown,
        }


def estimate_memory(
    params: int | float | str,
    precision: str = "bf16",
    mode: str = "inference",
    *,
    redundancy: float | None = None,
    reserve: float = RESERVE,
) -> Estimate:
    """The memory a model of ``params`` parameters needs in ``mode`` ("training" or
    "inference"). ``redundancy`` must lie in the mode's range (training 4-6, inference 1.2-1.5),
    ``reserve`` in 0.10-0.15. Raises ``ValueError`` naming the argument and the bad value."""
    count = parse_params(params)
    name = _precision(precision)
    mode_name = _mode(mode)
    default, low, high = MODES[mode_name]
    if redundancy is None:
        redundancy = default
    redundancy = _number(redundancy, "redundancy")
    if not low - _EPS <= redundancy <= high + _EPS:
        raise ValueError(
            f"redundancy: {redundancy:g} is outside {low:g}-{high:g}, the range for {mode_name}"
        )
    reserve = _number(reserve, "reserve")
    if not RESERVE_RANGE[0] - _EPS <= reserve <= RESERVE_RANGE[1] + _EPS:
        raise ValueError(
            f"reserve: {reserve:g} is outside {RESERVE_RANGE[0]:g}-{RESERVE_RANGE[1]:g} "
            "(a fraction: 0.12 is 12 %)"
        )
    per_param = PRECISIONS[name]
    weights = count * per_param
    return Estimate(
        params=count,
        precision=name,
        bytes_per_param=per_param,
        mode=mode_name,
        redundancy=redundancy,
        reserve=reserve,
        weights_bytes=round(weights),
        working_bytes=round(weights * redundancy),
        bytes=round(weights * redundancy * (1 + reserve)),
    )


def smallest_tier(estimate: Estimate, tiers: Mapping[str, Tier]) -> Tier | None:
    """The tier that holds ``estimate`` with the least weight (GPU-equivalents), ties broken by
    the least memory, then the name; ``None`` when none does. A time-shared tier counts only its
    fair share of the card's memory (the other servers on the card use the rest)."""
    fitting = estimate.fits(tiers)
    return fitting[0] if fitting else None


def tier_memory_gb(tier: Tier) -> float:
    """GPU memory one server of ``tier`` can count on: all its devices' memory, or for a
    time-shared card (no memory isolation between its servers) its 1/replicas share."""
    if tier.kind == "shared" and tier.replicas:
        return tier.memory_gb / tier.replicas
    return tier.memory_gb * tier.count


def tier_sizes(entries: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What one server of each tier gets, for the governor's right-sizing
    (``c.GpuGovernor.right_size_tiers``, ``core.rightsize``): the tiers of
    ``c.GpuProfiles.tiers``, as the memory estimate counts their memory."""
    return [
        {
            "name": t.name,
            "label": t.display_name,
            "memory_gb": tier_memory_gb(t),
            "weight": t.weight,
            **({"formerly": list(t.formerly)} if t.formerly else {}),  # the governor's too
        }
        for t in load_tiers(entries).values()
    ]


def parse_params(value: int | float | str) -> int:
    """A parameter count: ``7_000_000_000``, ``7e9``, ``"7B"``, ``"350M"``, ``"1.3b"``,
    ``"70e9"`` (suffixes K, M, B, T; any case)."""
    if isinstance(value, bool):
        raise ValueError(f"params: expected a number of parameters, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = "".join(value.split()).lower().replace("_", "").replace(",", "")
        match = _PARAMS.match(text)
        if match is None:
            raise ValueError(
                f"params: {value!r:.60} is not a number of parameters (use e.g. 7B, 350M, 1.3b, "
                "70e9)"
            )
        mantissa, exponent, suffix = match.groups()
        number = float(f"{mantissa}e{exponent or 0}") * _SUFFIXES[suffix]
    else:
        raise ValueError(
            f"params: expected a number of parameters, got {type(value).__name__} {value!r:.60}"
        )
    if not math.isfinite(number) or round(number) < 1:
        raise ValueError(f"params: {value!r:.60} is not a positive, finite number of parameters")
    if number > MAX_PARAMS:
        raise ValueError(f"params: {value!r:.60} is more than 1,000T parameters")
    return round(number)


def format_params(count: int) -> str:
    """``7B``, ``350M``, ``1.3B``: a parameter count as people write it."""
    for suffix, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return str(count)


def _precision(value: Any) -> str:
    if isinstance(value, str):
        name = value.strip().lower()
        name = _PRECISION_ALIASES.get(name, name)
        if name in PRECISIONS:
            return name
    raise ValueError(f"precision: {value!r:.60} is not known (known: {', '.join(PRECISIONS)})")


def _mode(value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() in MODES:
        return value.strip().lower()
    raise ValueError(f"mode: {value!r:.60} is not known (known: {', '.join(MODES)})")


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    return float(value)
