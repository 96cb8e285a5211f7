"""Every layer's number settings, and the one check of a number's range they and the admin's
dicts share. The governor's (``c.GpuGovernor``), the profile layer's (``c.GpuProfiles``,
``c.ClusterGpus``) and the server extension's (``c.GpuGovApp``) settings import them from
here, the one place they share."""

from __future__ import annotations

import math

import traitlets

from .text import quoted


class OutOfRange(traitlets.TraitError, ValueError):
    """A number setting (or an admin's number) that is no number, or outside its range: a
    ``TraitError`` (traitlets' Application stops at start-up saying it) and a ``ValueError``
    (what the admin's dict loaders and the server extension's callers catch)."""


def _shown(bound: float) -> str:
    if isinstance(bound, float) and bound.is_integer():
        bound = int(bound)
    return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"


def check_number(
    name: str,
    value: object,
    low: float,
    high: float,
    *,
    whole: bool = False,
    above: bool = False,
    unit: str = "",
    error: type[Exception] = OutOfRange,
):
    """``value`` as it is if it is a number (an int where ``whole``; never a bool) from ``low``
    to ``high`` (both included; ``low`` left out where ``above``), else raise ``error`` naming
    ``name``, the range and the value: ``GpuGovernor.timeout must be a whole number of seconds
    from 1 to 3,153,600,000, got 100000000000000000000``. NaN and inf are outside every range
    (no comparison with NaN holds), and an int too large for a float is compared exactly."""
    number = not isinstance(value, bool) and isinstance(value, int if whole else int | float)
    if number and (low < value if above else low <= value) and value <= high:
        return value
    kind = "a whole number" if whole else "a number"
    of = f" of {unit}" if unit else ""
    raise error(f"{name} must be {kind}{of} {range_words(low, high, above)}, got {quoted(value)}")


def range_words(low: float, high: float, above: bool = False) -> str:
    """``from 1 to 3,153,600,000``; ``from 0 (exclusive) to 1`` where ``above``."""
    start = f"{_shown(low)} (exclusive)" if above else _shown(low)
    return f"from {start} to {_shown(high)}"


def _check_range(low: float, high: float) -> None:
    """A setting's own range, as its declaration gives it: two finite numbers, in order."""
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(f"a setting's range is two finite numbers, got {low!r}, {high!r}")


class _Bounded:
    """A number trait with a range it is checked against (``check_number``), both ends
    required: a setting without them took 10**20 (an OverflowError naming nothing), a negative
    count, or a year of seconds where a minute was meant. traitlets' own ``min``/``max`` are
    not used: its message names neither the range nor, past 4,300 digits, the value."""

    def __init__(
        self, default_value=traitlets.Undefined, *, min, max, above=False, unit="", **kwargs
    ):
        _check_range(min, max)
        super().__init__(default_value, **kwargs)
        self.low, self.high, self.above, self.unit = min, max, above, unit

    def validate(self, obj, value):
        if isinstance(value, int | float) and not isinstance(value, bool):  # before float()
            check_number(
                f"{type(obj).__name__}.{self.name}",
                value,
                self.low,
                self.high,
                whole=isinstance(self, traitlets.Int),
                above=self.above,
                unit=self.unit,
            )
        return super().validate(obj, value)


class FiniteFloat(_Bounded, traitlets.Float):
    """traitlets' Float, finite and in its range: ``nan`` and ``inf`` (YAML's ``.nan``, an
    ``inf`` meant as "never") passed every bound (no comparison with NaN holds): a pass waited
    NaN seconds, showback priced every hour NaN, a cluster reading was never fresh."""


class BoundedInt(_Bounded, traitlets.Int):
    """traitlets' Int in its range: a count, a port, seconds counted whole."""


class NumberDict(traitlets.Dict):
    """A dict of names (tiers, teams) to numbers, each in its range (``check_number``), named
    ``GpuProfiles.capacity['h100']``: such dicts had no upper bound (a capacity of 10**5000
    crashed building its own message, a price of 1e300 an hour billed past reading). ``per``
    says what a key is (the ranges table of docs/api.md); ``parts``, where an entry may be an
    object of numbers instead (``node_pool_max``'s node shape), gives each part's range as
    ``(low, high, unit)``."""

    def __init__(
        self,
        default_value=traitlets.Undefined,
        *,
        min,
        max,
        whole=False,
        above=False,
        unit="",
        per="",
        parts=None,
        **kwargs,
    ):
        _check_range(min, max)
        super().__init__(default_value, **kwargs)
        self.low, self.high, self.whole, self.above = min, max, whole, above
        self.unit, self.per, self.parts = unit, per, parts or {}

    def validate(self, obj, value):
        value = super().validate(obj, value)
        owner = f"{type(obj).__name__}.{self.name}"
        for key, number in value.items():
            self.check_entry(f"{owner}[{quoted(key)}]", number)
        return value

    def check_entry(self, name: str, value: object) -> None:
        """Raise ``OutOfRange`` naming ``name`` unless ``value`` is an entry in range."""
        if self.parts and not isinstance(value, int | float):
            if not isinstance(value, dict) or set(value) != set(self.parts):
                kind = "a whole number" if self.whole else "a number"
                of = f" of {self.unit}" if self.unit else ""
                wanted = " and ".join(quoted(part) for part in self.parts)
                got = (
                    f"an object of {', '.join(quoted(k, 40) for k in list(value)[:5])}"
                    if isinstance(value, dict)
                    else quoted(value)
                )
                raise OutOfRange(
                    f"{name} must be {kind}{of} {range_words(self.low, self.high, self.above)} "
                    f"or an object of {wanted}, got {got}"
                )
            for part, (low, high, unit) in self.parts.items():
                check_number(
                    f"{name}[{quoted(part)}]", value[part], low, high, whole=True, unit=unit
                )
            return
        check_number(
            name, value, self.low, self.high, whole=self.whole, above=self.above, unit=self.unit
        )
