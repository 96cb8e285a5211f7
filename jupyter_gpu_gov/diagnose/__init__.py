"""Root-cause diagnosis (DESIGN §8, §9): why a server's GPU is underused.

- ``features``: the diagnosis window (``Window``), reading CSV/JSON Lines, windows from reports;
- ``labels``: the labels, their hints, ``Diagnosis``;
- ``rules``: the zombie definition and the threshold baseline;
- ``counterfactual``: the counterfactual model (``Diagnoser``) and cluster ``fragmentation``;
- ``simulate``: the fault-injection simulator behind the evaluation.

Importing this package needs no scikit-learn; fitting, loading or scoring a model does.
"""

from .counterfactual import Diagnoser, fragmentation
from .features import FEATURES, Window, read_windows, to_vector, windows_from_report
from .labels import HINTS, LABELS, UNKNOWN, Diagnosis
from .rules import baseline, is_zombie

__all__ = [
    "FEATURES",
    "HINTS",
    "LABELS",
    "UNKNOWN",
    "Diagnoser",
    "Diagnosis",
    "Window",
    "baseline",
    "fragmentation",
    "is_zombie",
    "read_windows",
    "to_vector",
    "windows_from_report",
]
