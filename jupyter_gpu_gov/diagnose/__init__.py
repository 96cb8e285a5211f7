"""Root-cause diagnosis (docs/api.md "Root causes"): why a server's GPU is underused.

- ``features``: the diagnosis window (``Window``), reading CSV/JSON Lines, windows from reports;
- ``labels``: the labels, their hints, ``Diagnosis`` (with its confidence and candidates);
- ``rules``: the zombie definition and the threshold baseline;
- ``reference``: what a node and a task normally look like, learned online from their windows;
- ``counterfactual``: the model (``Diagnoser``): each signal against its node's reference;
- ``cluster``: what each cause costs (``CostLedger``) and fragmentation;
- ``simulate``: the project's fault-injection simulator (``benchmarks/worlds`` has three more).

Plain Python: nothing beyond the standard library.
"""

from .cluster import CostLedger, Demand, fragmentation
from .counterfactual import Diagnoser, Params
from .features import FEATURES, Window, read_windows, to_vector, windows_from_report
from .labels import HINTS, LABELS, UNCERTAIN, UNKNOWN, Diagnosis
from .rules import baseline, is_zombie

__all__ = [
    "FEATURES",
    "HINTS",
    "LABELS",
    "UNCERTAIN",
    "UNKNOWN",
    "CostLedger",
    "Demand",
    "Diagnoser",
    "Diagnosis",
    "Params",
    "Window",
    "baseline",
    "fragmentation",
    "is_zombie",
    "read_windows",
    "to_vector",
    "windows_from_report",
]
