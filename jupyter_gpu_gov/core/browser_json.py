"""JSON as a browser's ``JSON.parse`` reads it: the one way an answer (a page's or the API's,
the governor's or the server extension's) is written.

``json.dumps`` writes a float NaN or infinity as ``NaN``/``Infinity``, which no JSON parser
but Python's takes: one such figure (a manifest a kernel's hook or a hand edit wrote, a number
a proxy passed on) made JupyterLab's or the dashboard's ``JSON.parse`` refuse the whole answer.
Here it is written as ``null``, what the readers take as unknown."""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)``, every float that is not finite written as ``null``
    (a dict key too). Written strictly first (``allow_nan=False``, in C): only an answer that
    holds such a float is walked and cleaned, so a large answer costs what it did."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:  # "Out of range float values are not JSON compliant"
        return json.dumps(finite(value), allow_nan=False, **options)


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite, in it at any depth, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {finite(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
