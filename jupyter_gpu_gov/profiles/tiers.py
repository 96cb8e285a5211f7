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
from ..core.grant import MAX_WEIGHT
from ..core.policy import TASK_TYPES
from ..core.rightsize import former_name_clash
from ..core.traits import check_number

MIN_SHARE = 1 / 8  # no slice smaller than an eighth of a card
# A tier's devices at most, in a capacity, a pool or a team's quota: a million (ten times the
# largest clusters).
MAX_TIER_DEVICES = 1_000_000
MAX_CLASS_MEMORY_GB = 4096  # a capability class's 'min_memory_gb': as a card's 'memory_gb'
GPU_VENDOR_PREFIX = "nvidia.com/"  # every resource of NVIDIA's device plugin (below)
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"  # time-slicing with renameByDefault: true
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # the device plugin's mixed strategy
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
    mig_slices: tuple[int, int] = (7, 8)  # compute and memory slices of the whole card


def _mig(*sizes: str, me: str = "", slices: tuple[int, int] = (7, 8)) -> dict[str, Any]:
    """A card's MIG profiles as NVIDIA's MIG user guide lists them; ``me``: the profile that
    also exists with the media extensions (``+me``: the card's decoders, JPEG and OFA)."""
    profiles = [*sizes[:1], *([f"{me}+me"] if me else []), *sizes[1:]]
    return {"mig_profiles": tuple(profiles), "mig_slices": slices}


_A100_80 = _mig("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", me="1g.10gb")
_H100_94 = _mig("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb", me="1g.12gb")
_H200 = _mig("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", me="1g.18gb")

# The built-in catalogue: NVIDIA's MIG user guide ("Supported MIG Profiles") for the profiles,
# GPU feature discovery's nvidia.com/gpu.product values (the NVML name, spaces as dashes) for
# the products. c.GpuProfiles.cards adds cards or replaces these by key.
CARDS: dict[str, Card] = {
    card.key: card
    for card in (
        Card("A30-24GB", ("NVIDIA-A30",), 24,
             **_mig("1g.6gb", "2g.12gb", "2g.12gb+me", "4g.24gb", me="1g.6gb", slices=(4, 4))),
        Card("A100-40GB", ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"), 40,
             **_mig("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", me="1g.5gb")),
        Card("A100-80GB", ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"), 80, **_A100_80),
        # Any 80 GB H100 (SXM or PCIe); the next two name one form factor each.
        Card("H100-80GB", ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"), 80, **_A100_80),
        Card("H100-SXM-80GB", ("NVIDIA-H100-80GB-HBM3",), 80, **_A100_80),
        Card("H100-PCIe-80GB", ("NVIDIA-H100-PCIe",), 80, **_A100_80),
        Card("H100-NVL-94GB", ("NVIDIA-H100-NVL",), 94, **_H100_94),
        Card("H200-141GB", ("NVIDIA-H200", "NVIDIA-H200-NVL"), 141, **_H200),
        Card("GH200-96GB", ("NVIDIA-GH200-480GB",), 96,
             **_mig("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb",
                    me="1g.12gb")),
        Card("GH200-144GB", ("NVIDIA-GH200-144G-HBM3e",), 144,
             **_mig("1g.18gb", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb",
                    me="1g.18gb")),
        Card("B200-180GB", ("NVIDIA-B200",), 180,
             **_mig("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb",
                    me="1g.23gb")),
        Card("L40S-48GB", ("NVIDIA-L40S",), 48),
        Card("L4-24GB", ("NVIDIA-L4",), 24),
        Card("A10-24GB", ("NVIDIA-A10",), 24),
        Card("T4-16GB", ("Tesla-T4",), 16),
        Card("V100-16GB", ("Tesla-V100-SXM2-16GB", "Tesla-V100-PCIE-16GB"), 16),
        Card("V100-32GB", ("Tesla-V100-SXM2-32GB", "Tesla-V100-PCIE-32GB",
                           "Tesla-V100S-PCIE-32GB"), 32),
    )
}  # fmt: skip

_MIG = re.compile(r"^([1-7])g\.(\d+)gb(\+me)?$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")  # a Kubernetes label value, lower
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_CARD_KEY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$")
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
    "task_types",
    "kubespawner_override",
    "formerly",
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
    # What its servers may be for (``gpu-gov/task-type``, matchable in governor policies): the
    # first is the default, the owner may pick another of these on the spawn form.
    task_types: tuple[str, ...] = ("interactive",)
    kubespawner_override: Mapping[str, Any] = field(default_factory=dict)
    # Names this tier had: servers granted under one (and their pods' gpu-gov/tier) are this
    # tier's, or a rename would hand the team its guarantee again beside them.
    formerly: tuple[str, ...] = ()

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
            return mig_profile == self.mig_profile and gpu_product(parent) in self.card.products
        if mig_profile is not None:
            return False
        if self.card is not None:
            return gpu_product(name) in self.card.products
        return memory_total_mb is not None and memory_total_mb >= _class_floor_mib(
            self.min_memory_gb
        )


def frees_cards_for(holder: Tier, wanted: Tier) -> bool:
    """Whether a server of ``holder`` holds whole cards a server of ``wanted`` can use, so that
    its stop (a cull, a reclaim) frees cards for it: one card and a pair of one model (their
    products overlap); a named card and a capability class it is in (an H100 for "any 80 GB
    card"); a capability class and a wider one (80 GB or more for 40 GB or more). Not a class's
    servers for a named card: they may hold another model (an A100 for "any 80 GB card"), and a
    grant names its tier, not its card (``may_free_cards_for``: per server, where the hub knows
    its card). MIG slices and time-shares are devices of their own."""
    if holder.kind != "whole" or wanted.kind != "whole":
        return False
    if wanted.card is not None:
        return holder.card is not None and bool(
            set(holder.card.products) & set(wanted.card.products)
        )
    # A capability class: nominal sizes, which its node affinity (95 % of them) admits.
    held_gb = holder.card.memory_gb if holder.card is not None else holder.min_memory_gb
    return held_gb >= wanted.min_memory_gb


def may_free_cards_for(holder: Tier, wanted: Tier) -> bool:
    """Whether a server of ``holder`` holds whole cards a server of ``wanted`` can use only if
    its card is of ``wanted``'s model: a capability class that takes ``wanted``'s named card
    (an "any 80 GB card" server on an H100 node, for an H100). Which card a server holds is
    known per server (its pod's node, its devices), not per tier."""
    return (
        holder.kind == "whole"
        and wanted.kind == "whole"
        and holder.card is None
        and wanted.card is not None
        and wanted.card.memory_gb >= holder.min_memory_gb
    )


def card_sharing(tiers: Mapping[str, Tier], wanted: Tier) -> tuple[str, ...]:
    """``wanted``'s name, then the other tiers whose servers free cards for it
    (``frees_cards_for``), in ``tiers``' order."""
    return (
        wanted.name,
        *(n for n, t in tiers.items() if n != wanted.name and frees_cards_for(t, wanted)),
    )


def mig_weight(profile: str, card: Card) -> float:
    """GPU-equivalents of a MIG slice: the larger of its compute and memory share."""
    match = _MIG.match(profile)
    compute_slices, memory_slices = card.mig_slices
    compute = int(match[1]) / compute_slices
    memory = round(int(match[2]) / card.memory_gb * memory_slices) / memory_slices
    return round(max(compute, memory), 4)


def mig_resource(profile: str) -> str:
    """The device plugin's resource for a MIG profile: it spells a profile's '+' as '.'
    (``1g.10gb+me`` is ``nvidia.com/mig-1g.10gb.me``), '+' being no resource-name character."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def check_entry(label: str, entry: Any, known: set[str], error: type[ValueError]) -> None:
    """An admin's dict entry: raise ``error`` naming ``label`` unless it is a dict of ``known``
    keys."""
    if not isinstance(entry, Mapping):
        raise error(f"{label}: expected a dict, got {type(entry).__name__}")
    unknown = set(entry) - known
    if unknown:
        raise error(
            f"{label}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(known))})"
        )


class CardError(ValueError):
    """A card entry of ``GpuProfiles.cards`` that cannot be used; the message names it."""


_CARD_KEYS = {"products", "memory_gb", "mig_profiles", "mig_slices"}


def load_cards(entries: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Card]:
    """The built-in catalogue with the admin's cards (key -> dict) added or put in place of the
    built-in ones of the same key, e.g. ``{"RTX-6000-48GB": {"products": ["NVIDIA-RTX-6000-Ada-
    Generation"], "memory_gb": 48}}``. Raises ``CardError`` naming the card and the key."""
    cards = dict(CARDS)
    for key, entry in (entries or {}).items():
        label = f"card {key!r}"
        if not isinstance(key, str) or not _CARD_KEY.fullmatch(key):
            raise CardError(f"{label}: a key is letters, digits, '.', '_' or '-', got {key!r}")
        check_entry(label, entry, _CARD_KEYS, CardError)
        products = entry.get("products")
        if (
            not isinstance(products, list | tuple)
            or not products
            or not all(isinstance(p, str) and _LABEL_VALUE.fullmatch(p) for p in products)
        ):
            raise CardError(
                f"{label}: 'products' must be a non-empty list of nvidia.com/gpu.product label "
                f"values, got {products!r}"
            )
        memory = entry.get("memory_gb")
        if isinstance(memory, bool) or not isinstance(memory, int) or not 1 <= memory <= 4096:
            raise CardError(f"{label}: 'memory_gb' must be a whole number of GB, got {memory!r}")
        slices = tuple(entry.get("mig_slices", (7, 8)))
        if len(slices) != 2 or not all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 8 for n in slices
        ):
            raise CardError(
                f"{label}: 'mig_slices' must be [compute, memory] slices from 1 to 8, got "
                f"{entry.get('mig_slices')!r}"
            )
        profiles = entry.get("mig_profiles", [])
        if not isinstance(profiles, list | tuple) or not all(
            isinstance(p, str) and _MIG.fullmatch(p) for p in profiles
        ):
            raise CardError(
                f"{label}: 'mig_profiles' must be a list of profiles such as '1g.10gb' or "
                f"'1g.10gb+me', got {profiles!r}"
            )
        card = Card(key, tuple(products), memory, tuple(profiles), slices)
        for profile in profiles:
            if int(_MIG.match(profile)[1]) > slices[0] or int(_MIG.match(profile)[2]) > memory:
                raise CardError(f"{label}: MIG profile {profile!r} is larger than the card")
        cards[key] = card
    return cards


def load_tiers(
    entries: Iterable[Mapping[str, Any]], cards: Mapping[str, Card] | None = None
) -> dict[str, Tier]:
    """Validate admin-written tier dicts into ``Tier`` objects, by name, in the given order;
    ``gpu`` names a card of ``cards`` (default: the built-in catalogue, ``CARDS``).

    Raises ``TierError`` naming the entry and the key of the first problem.
    """
    cards = CARDS if cards is None else cards
    tiers: dict[str, Tier] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise TierError(f"tier {index}: expected a dict, got {type(entry).__name__}")
        label = f"tier {index} ({entry.get('name', '?')!r})"
        try:
            tier = _tier(dict(entry), cards)
        except (TypeError, ValueError) as error:
            raise TierError(f"{label}: {error}") from None
        if tier.name in tiers:
            raise TierError(f"{label}: the name is used twice")
        tiers[tier.name] = tier
    clash = former_name_clash((tier.name, tier.formerly) for tier in tiers.values())
    if clash:
        raise TierError(clash)
    return tiers


def renamed(tiers: Mapping[str, Tier]) -> dict[str, str]:
    """Former tier name -> the tier's name now (``formerly``)."""
    return {old: t.name for t in tiers.values() for old in t.formerly}


def _tier(entry: dict[str, Any], cards: Mapping[str, Card]) -> Tier:
    unknown = set(entry) - _KEYS
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_KEYS))})")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"'name' must be a lower-case label value (a-z, 0-9, '-', '.'), got {name!r}"
        )
    card = None
    if "gpu" in entry:
        card = cards.get(entry["gpu"]) if isinstance(entry["gpu"], str) else None
        if card is None:
            raise ValueError(
                f"'gpu' {entry['gpu']!r} is not a known card (known: {', '.join(cards)}; "
                "add one with c.GpuProfiles.cards)"
            )
    mig, replicas = entry.get("mig"), entry.get("replicas")
    count = _whole(entry, "count", 1, high=16)
    min_memory = entry.get("min_memory_gb")
    if min_memory is not None:
        check_number("'min_memory_gb'", min_memory, 0, MAX_CLASS_MEMORY_GB, above=True, unit="GB")
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
            raise ValueError(
                "'mig' needs 'gpu' naming a MIG-capable card (A30, A100, H100, H200, GH200, B200)"
            )
        if mig not in card.mig_profiles:
            raise ValueError(
                f"'mig' {mig!r} is not a MIG profile of {card.key} "
                f"(known: {', '.join(card.mig_profiles)})"
            )
        kind, resource = "mig", mig_resource(mig)
        memory_gb = float(_MIG.match(mig)[2])
        weight = mig_weight(mig, card)
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
        weight = check_number(
            "'weight'", entry["weight"], 0, MAX_WEIGHT, above=True, unit="GPU-equivalents"
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
        task_types=_task_types(entry),
        kubespawner_override=dict(_mapping(entry, "kubespawner_override")),
        formerly=_formerly(entry, name),
    )


def _formerly(entry: Mapping, name: str) -> tuple[str, ...]:
    value = entry.get("formerly", [])
    if (
        not isinstance(value, list | tuple)
        or not all(isinstance(v, str) and _NAME.fullmatch(v) and v != name for v in value)
        or len(set(value)) != len(value)
    ):
        raise ValueError(
            f"'formerly' must be a list of distinct earlier names of this tier (lower-case "
            f"label values), got {value!r}"
        )
    return tuple(value)


def _task_types(entry: Mapping) -> tuple[str, ...]:
    value = entry.get("task_types", ["interactive"])
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(v, str) and v in TASK_TYPES for v in value)
        or len(set(value)) != len(value)
    ):
        raise ValueError(
            f"'task_types' must be a list of distinct task types out of {', '.join(TASK_TYPES)} "
            f"(the first is the default), got {value!r}"
        )
    return tuple(value)


def gpu_product(nvml_name: str) -> str:
    """GPU feature discovery's ``nvidia.com/gpu.product`` for a card NVML names (spaces as
    dashes)."""
    return nvml_name.strip().replace(" ", "-")


def _class_floor_mib(gb: float) -> int:
    # Cards report a little less than their nominal size (an "80 GB" H100 shows 81559 MiB,
    # an "80 GB" A100 81920): a class of N GB takes anything with at least 95 % of N GiB.
    return int(gb * 1024 * 0.95)


def _whole(entry: Mapping, key: str, default: int | None, low: int = 1, high: int = 16) -> int:
    return check_number(repr(key), entry.get(key, default), low, high, whole=True)


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
