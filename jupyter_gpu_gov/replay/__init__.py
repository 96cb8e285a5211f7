"""Offline replay of traces (docs/architecture.md, "Replay traces") through ``core.policy``, the stock cullers, and scoring.

Stdlib and traitlets only, like ``core``: benchmarks and the CLI import it without a hub.
"""

from .baselines import idle_culler, kernel_culler
from .engine import (
    ACTIVE_SM,
    EPOCH,
    Action,
    ConfigError,
    Summary,
    policies_from_config,
    replay,
    score,
)
from .trace import Sample, TraceError, parse_lines, read_trace

__all__ = [
    "ACTIVE_SM",
    "EPOCH",
    "Action",
    "ConfigError",
    "Sample",
    "Summary",
    "TraceError",
    "idle_culler",
    "kernel_culler",
    "parse_lines",
    "policies_from_config",
    "read_trace",
    "replay",
    "score",
]
