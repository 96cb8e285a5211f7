"""The trait every layer's number settings are: traitlets' Float, finite. The governor's
(``c.GpuGovernor``), the profile layer's (``c.ClusterGpus``) and the server extension's
(``c.GpuGovApp``) settings import it from here, the one place they share."""

from __future__ import annotations

import math

import traitlets


class FiniteFloat(traitlets.Float):
    """traitlets' Float, finite: ``nan`` and ``inf`` (YAML's ``.nan``, an ``inf`` meant as
    "never") passed every bound (no comparison with NaN holds, and ``min``/``max`` are
    comparisons): a pass waited NaN seconds, showback priced every hour NaN, a cluster
    reading was never fresh. Refused, naming the class and the setting."""

    def validate(self, obj, value):
        value = super().validate(obj, value)
        if not math.isfinite(value):
            raise traitlets.TraitError(
                f"{type(obj).__name__}.{self.name} must be a finite number, got {value!r}"
            )
        return value
