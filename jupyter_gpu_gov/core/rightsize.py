"""Right-sizing: the smallest tier that a server's measured use would have fit.

The governor knows each server's peak GPU memory and peak SM activity from its reports; the tier
catalogue (``load_tier_sizes``: what each tier gives one server, from ``profiles``' tiers through
configuration) says which smaller tier would hold them. A server whose use fits a tier of fewer
GPU-equivalents — typically a MIG slice instead of a whole card, the ``small_work`` cause — gets
a recommendation naming it, and showback counts the GPU-hours it would have freed.

Fit, the same rule the memory estimate uses for a model (``profiles/estimate.py``): the measured
peak plus ``RESERVE`` (allocator fragmentation, workspaces) within the tier's memory; and the
peak activity, scaled to the smaller tier's share of compute, at most ``MAX_LOAD`` of it, so
that the busiest minute seen would not saturate the slice. A recommendation needs
``MIN_OBSERVED`` (or the governor's ``right_size_after``) of reports with the GPU held, and some GPU work (an idle server is not a
right-sizing case: the idle policy reclaims it).

Pure: stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from .durations import format_duration

RESERVE = 0.12  # CUDA context, allocator fragmentation, workspaces: 10 to 15 %
MAX_LOAD = 0.8  # the smaller tier's compute at most this busy at the measured peak
MIN_OBSERVED = timedelta(hours=1)
_MIB = 2**20  # reports count memory in MiB
_GB = 1e9  # tiers' nominal sizes are in 10⁹ bytes


class TierSizeError(ValueError):
    """A catalogue entry that cannot be used; the message names the entry and the key."""


@dataclass(frozen=True)
class TierSize:
    """What one server of a tier gets."""

    name: str
    label: str
    memory_gb: float  # GPU memory one server can count on
    weight: float  # GPU-equivalents one server holds
    formerly: tuple[str, ...] = ()  # names the tier had (the profile layer's ``formerly``)


def load_tier_sizes(entries: Iterable[Mapping]) -> dict[str, TierSize]:
    """Validate ``[{"name", "label", "memory_gb", "weight", "formerly"}, ...]`` (``label`` and
    ``formerly``, the names a renamed tier had, optional)."""
    sizes: dict[str, TierSize] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise TierSizeError(f"tier {index}: expected a dict, got {type(entry).__name__}")
        where = f"tier {index} ({entry.get('name', '?')!r})"
        unknown = set(entry) - {"name", "label", "memory_gb", "weight", "formerly"}
        if unknown:
            raise TierSizeError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        name, label = entry.get("name"), entry.get("label", entry.get("name"))
        if not isinstance(name, str) or not name or not isinstance(label, str):
            raise TierSizeError(f"{where}: 'name' (and 'label') must be non-empty strings")
        numbers = []
        for key in ("memory_gb", "weight"):
            value = entry.get(key)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value < math.inf  # NaN too: no comparison holds
            ):
                raise TierSizeError(f"{where}: {key!r} must be a number > 0, got {value!r}")
            numbers.append(float(value))
        formerly = entry.get("formerly", [])
        if not isinstance(formerly, list | tuple) or not all(
            isinstance(old, str) and old and old != name for old in formerly
        ):
            raise TierSizeError(f"{where}: 'formerly' must be a list of earlier names")
        if name in sizes:
            raise TierSizeError(f"{where}: the name is used twice")
        sizes[name] = TierSize(name, label, *numbers, tuple(dict.fromkeys(formerly)))
    clash = former_name_clash((size.name, size.formerly) for size in sizes.values())
    if clash:
        raise TierSizeError(clash)
    return sizes


def former_name_clash(tiers: Iterable[tuple[str, Iterable[str]]]) -> str | None:
    """What is wrong when a tier's former name (``formerly``) is also another tier's name or
    former name (None: nothing). One rule for the catalogue (``profiles.tiers``) and the
    governor's sizes of it: a server granted under that name would belong to two tiers."""
    tiers = [(name, tuple(formerly)) for name, formerly in tiers]
    names = [n for name, formerly in tiers for n in (name, *formerly)]
    for name, formerly in tiers:
        for old in formerly:
            if names.count(old) > 1:
                return (
                    f"tier {name!r}: 'formerly' names {old!r}, which is also another "
                    "tier's name or former name"
                )
    return None


def tier_names(sizes: Mapping[str, TierSize]) -> dict[str, tuple[str, ...]]:
    """Every name of a renamed tier (its name now, then those it had) -> all its names, name
    now first: a server granted under a former name, and a setting keyed by one, are that
    tier's."""
    names: dict[str, tuple[str, ...]] = {}
    for size in sizes.values():
        if size.formerly:
            every = (size.name, *size.formerly)
            for name in every:
                names[name] = every
    return names


@dataclass(frozen=True)
class Use:
    """A server's measured use this session."""

    peak_memory_mb: float  # the most GPU memory its processes held at once (MiB)
    peak_activity: float  # the busiest window's SM activity, 0..1 of its current tier
    observed: timedelta  # how long reports showed the GPU held


@dataclass
class Meter:
    """A server's use as its reports come, this session: the peaks and how long they cover."""

    peak_memory_mb: float = 0.0
    peak_activity: float = 0.0
    first_held: datetime | None = None
    last_held: datetime | None = None

    def add(self, memory_mb: float, activity: float, at: datetime) -> bool:
        """One report with the GPU held; whether a peak moved."""
        moved = memory_mb > self.peak_memory_mb or activity > self.peak_activity
        self.peak_memory_mb = max(self.peak_memory_mb, memory_mb)
        self.peak_activity = max(self.peak_activity, activity)
        self.first_held = self.first_held or at
        self.last_held = at
        return moved

    def measured(self) -> Use | None:
        if self.first_held is None or self.last_held is None:
            return None
        return Use(self.peak_memory_mb, self.peak_activity, self.last_held - self.first_held)


def right_size(
    tier: str | None,
    use: Use | None,
    sizes: Mapping[str, TierSize],
    cause: str | None = None,
    min_observed: timedelta = MIN_OBSERVED,
) -> tuple[TierSize, dict] | None:
    """The smallest tier (fewest GPU-equivalents, then least memory, then name) that ``use``
    fits and that holds fewer GPU-equivalents than ``tier``, with the verdict's
    ``{"tier", "label", "reason"}``; None when there is none, or too little is known."""
    current = sizes.get(tier or "")
    if current is None or use is None or use.observed < min_observed:
        return None
    if use.peak_memory_mb <= 0 or use.peak_activity <= 0:
        return None
    needed = use.peak_memory_mb * _MIB * (1 + RESERVE)
    fitting = [
        t
        for t in sizes.values()
        if t.weight < current.weight
        and t.memory_gb * _GB >= needed
        and use.peak_activity * current.weight / t.weight <= MAX_LOAD
    ]
    if not fitting:
        return None
    best = min(fitting, key=lambda t: (t.weight, t.memory_gb, t.name))
    # Whose figures are whose: "it has 10 GB, at 14% of the GPU-equivalents" left a reader
    # to guess what "it" was and 14 % of what (the smaller tier's count against this one's).
    why = (
        f"it used at most {use.peak_memory_mb * _MIB / _GB:.1f} GB of GPU memory and "
        f"{use.peak_activity:.0%} of the GPU over {format_duration(use.observed)}; "
        f"{best.label} has {best.memory_gb:g} GB and counts "
        f"{best.weight / current.weight:.0%} of {current.label}'s GPU-equivalents"
    )
    if cause == "small_work":
        why += " (the diagnosis: too little work per step)"
    return best, {"tier": best.name, "label": best.label, "reason": why}
