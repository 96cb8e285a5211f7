"""GPU tiers: what a researcher asks for, described once by the admin.

A tier is a whole card (or several) of a capability class, one MIG slice of a known card, or a
time-sliced share of a card. Each tier knows its Kubernetes resource name (the NVIDIA device
plugin's, mixed MIG strategy), the GPU feature discovery labels that select its nodes, its weight
in GPU-equivalents (what quotas and showback count) and its maximum age::

    load_tiers([
        {"name": "h100", "gpu": "H100-80GB", "interconnect": "nvlink", "max_age": "3d"},
        {"name": "h200-3g", "gpu": "H200-141GB", "mig": "3g.71gb"},
        {"name": "l4-shared", "gpu": "L4-24GB", "replicas": 4},
        {"name": "big", "min_memory_gb": 80, "count": 2},
    ])

Pure: no Kubernetes, JupyterHub or NVML imports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..core.durations import format_duration, parse_duration

MIN_SHARE = 1 / 8  # no slice smaller than an eighth of a card
MIG_COMPUTE_SLICES = 7  # A100, H100, H200
MIG_MEMORY_SLICES = 8
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"  # time-slicing with renameByDefault: true
PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU feature discovery
MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, GPU feature discovery
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
# GPU nodes are usually tainted so that only pods asking for GPUs land there.
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Card:
    """A GPU model as GPU feature discovery and NVML name it."""

    key: str
    products: tuple[str, ...]  # nvidia.com/gpu.product values (NVML names with '-' for ' ')
    memory_gb: int
    mig_profiles: tuple[str, ...] = ()


CARDS: dict[str, Card] = {
    card.key: card
    for card in (
        Card(
            "A100-40GB",
            ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
            40,
            ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        ),
        Card(
            "A100-80GB",
            ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
            80,
            ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        ),
        Card(
            "H100-80GB",
            ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"),
            80,
            ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        ),
        Card(
            "H200-141GB",
            ("NVIDIA-H200", "NVIDIA-H200-NVL"),
            141,
            ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        ),
        Card("L40S-48GB", ("NVIDIA-L40S",), 48),
        Card("L4-24GB", ("NVIDIA-L4",), 24),
        Card("A10-24GB", ("NVIDIA-A10",), 24),
    )
}

_MIG = re.compile(r"^([1-7])g\.(\d+)gb$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")  # a Kubernetes label value, lower
_KEYS = {
    "name",
    "display_name",
    "description",
    "gpu",
    "mig",
    "replicas",
    "count",
    "min_memory_gb",
    "interconnect",
    "weight",
    "resource",
    "node_selector",
    "node_affinity",
    "tolerations",
    "max_age",
    "kubespawner_override",
}


class TierError(ValueError):
    """A tier entry that cannot be used; the message names the entry and the key."""


@dataclass(frozen=True)
class Tier:
    name: str  # the slug users and labels see: gpu-gov/tier
    display_name: str
    kind: str  # "whole" | "mig" | "shared"
    resource: str  # the extended resource a pod asks for
    count: int  # devices per server
    memory_gb: float  # usable GPU memory per device
    weight: float  # GPU-equivalents per server: what quotas, caps and showback count
    card: Card | None = None
    mig_profile: str | None = None
    replicas: int | None = None  # servers sharing one card (kind "shared")
    min_memory_gb: float | None = None  # capability class instead of a named card
    interconnect: str | None = None
    description: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: tuple[Mapping[str, Any], ...] = ()  # required match expressions
    tolerations: tuple[Mapping[str, Any], ...] = (GPU_TOLERATION,)
    max_age: timedelta | None = None
    kubespawner_override: Mapping[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """One line for the spawn form: what this tier gives."""
        if self.kind == "mig":
            what = f"MIG slice {self.mig_profile} of an {self.card.key}"
        elif self.kind == "shared":
            what = f"1/{self.replicas} time-share of an {self.card.key if self.card else 'GPU'}"
        else:
            card = self.card.key if self.card else f"≥ {self.memory_gb:g} GB GPU"
            what = f"{self.count} x {card}"
            if self.interconnect:
                what += f", {self.interconnect}"
        parts = [what, f"{self.memory_gb * (self.count):g} GB GPU memory"]
        if self.max_age:
            parts.append(f"up to {format_duration(self.max_age)}")
        return " · ".join(parts)

    def fits_device(self, name: str, mig_profile: str | None, memory_total_mb: int | None) -> bool:
        """Whether a local leaf device (as NVML names it) can serve this tier."""
        if self.kind == "mig":
            parent = name.split(" MIG ")[0]
            return mig_profile == self.mig_profile and _product(parent) in self.card.products
        if mig_profile is not None:
            return False
        if self.card is not None:
            return _product(name) in self.card.products
        return memory_total_mb is not None and memory_total_mb >= _class_floor_mib(
            self.min_memory_gb
        )


def mig_weight(profile: str, card_memory_gb: int) -> float:
    """GPU-equivalents of a MIG slice: the larger of its compute and memory share."""
    match = _MIG.match(profile)
    compute = int(match[1]) / MIG_COMPUTE_SLICES
    memory = round(int(match[2]) / card_memory_gb * MIG_MEMORY_SLICES) / MIG_MEMORY_SLICES
    return round(max(compute, memory), 4)


def load_tiers(entries: Iterable[Mapping[str, Any]]) -> dict[str, Tier]:
    """Validate admin-written tier dicts into ``Tier`` objects, by name, in the given order.

    Raises ``TierError`` naming the entry and the key of the first problem.
    """
    tiers: dict[str, Tier] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise TierError(f"tier {index}: expected a dict, got {type(entry).__name__}")
        label = f"tier {index} ({entry.get('name', '?')!r})"
        try:
            tier = _tier(dict(entry))
        except (TypeError, ValueError) as error:
            raise TierError(f"{label}: {error}") from None
        if tier.name in tiers:
            raise TierError(f"{label}: the name is used twice")
        tiers[tier.name] = tier
    return tiers


def _tier(entry: dict[str, Any]) -> Tier:
    unknown = set(entry) - _KEYS
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_KEYS))})")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"'name' must be a lower-case label value (a-z, 0-9, '-', '.'), got {name!r}"
        )
    card = None
    if "gpu" in entry:
        card = CARDS.get(entry["gpu"])
        if card is None:
            raise ValueError(
                f"'gpu' {entry['gpu']!r} is not a known card (known: {', '.join(CARDS)})"
            )
    mig, replicas = entry.get("mig"), entry.get("replicas")
    count = _whole(entry, "count", 1, high=16)
    min_memory = entry.get("min_memory_gb")
    if min_memory is not None and (
        isinstance(min_memory, bool) or not isinstance(min_memory, int | float) or min_memory <= 0
    ):
        raise ValueError(f"'min_memory_gb' must be a positive number, got {min_memory!r}")
    if card is None and min_memory is None:
        raise ValueError("give 'gpu' (a known card) or 'min_memory_gb' (a capability class)")
    if card is not None and min_memory is not None:
        raise ValueError("give 'gpu' or 'min_memory_gb', not both")
    if mig is not None and replicas is not None:
        raise ValueError("give 'mig' or 'replicas', not both")
    if (mig is not None or replicas is not None) and count != 1:
        raise ValueError("'count' must be 1 for a MIG slice or a time-shared card")

    selector: dict[str, str] = {}
    affinity: list[dict[str, Any]] = []
    if card is not None:
        if len(card.products) == 1:
            selector[PRODUCT_LABEL] = card.products[0]
        else:
            affinity.append({"key": PRODUCT_LABEL, "operator": "In", "values": list(card.products)})
    else:
        floor = _class_floor_mib(min_memory)
        affinity.append({"key": MEMORY_LABEL, "operator": "Gt", "values": [str(floor - 1)]})

    if mig is not None:
        if card is None or not card.mig_profiles:
            raise ValueError("'mig' needs 'gpu' naming a MIG-capable card (A100, H100, H200)")
        if mig not in card.mig_profiles:
            raise ValueError(
                f"'mig' {mig!r} is not a MIG profile of {card.key} "
                f"(known: {', '.join(card.mig_profiles)})"
            )
        kind, resource = "mig", f"nvidia.com/mig-{mig}"
        memory_gb = float(_MIG.match(mig)[2])
        weight = mig_weight(mig, card.memory_gb)
        selector[MIG_STRATEGY_LABEL] = "mixed"
    elif replicas is not None:
        replicas = _whole(entry, "replicas", None, low=2, high=int(1 / MIN_SHARE))
        if card is None:
            raise ValueError("'replicas' needs 'gpu' naming the shared card")
        kind, resource = "shared", SHARED_RESOURCE
        memory_gb, weight = float(card.memory_gb), round(1 / replicas, 4)
    else:
        kind, resource = "whole", GPU_RESOURCE
        memory_gb = float(card.memory_gb if card else min_memory)
        weight = float(count)

    if "weight" in entry:
        weight = entry["weight"]
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ValueError(
                f"'weight' must be a positive number of GPU-equivalents, got {weight!r}"
            )
    if weight < MIN_SHARE:
        raise ValueError(f"'weight' {weight:g} is below 1/8 of a card, the smallest share offered")

    return Tier(
        name=name,
        display_name=_text(entry, "display_name") or name,
        description=_text(entry, "description") or "",
        kind=kind,
        resource=_text(entry, "resource") or resource,
        count=count,
        memory_gb=memory_gb,
        weight=float(weight),
        card=card,
        mig_profile=mig,
        replicas=replicas,
        min_memory_gb=min_memory,
        interconnect=_text(entry, "interconnect"),
        node_selector={**selector, **_str_map(entry, "node_selector")},
        node_affinity=tuple(affinity) + tuple(_dicts(entry, "node_affinity", [])),
        tolerations=tuple(_dicts(entry, "tolerations", [GPU_TOLERATION])),
        max_age=None
        if entry.get("max_age") is None
        else parse_duration(entry["max_age"], "'max_age'"),
        kubespawner_override=dict(_mapping(entry, "kubespawner_override")),
    )


def _product(nvml_name: str) -> str:
    return nvml_name.strip().replace(" ", "-")


def _class_floor_mib(gb: float) -> int:
    # Cards report a little less than their nominal size (an "80 GB" H100 shows 81559 MiB,
    # an "80 GB" A100 81920): a class of N GB takes anything with at least 95 % of N GiB.
    return int(gb * 1024 * 0.95)


def _whole(entry: Mapping, key: str, default: int | None, low: int = 1, high: int = 16) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key!r} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _text(entry: Mapping, key: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key!r} must be a string, got {value!r}")
    return value


def _mapping(entry: Mapping, key: str) -> Mapping:
    value = entry.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{key!r} must be a dict, got {value!r}")
    return value


def _str_map(entry: Mapping, key: str) -> dict[str, str]:
    value = _mapping(entry, key)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{key!r} must map strings to strings, got {value!r}")
    return dict(value)


def _dicts(entry: Mapping, key: str, default: list) -> list[dict]:
    value = entry.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ValueError(f"{key!r} must be a list of dicts, got {value!r}")
    return [dict(v) for v in value]
