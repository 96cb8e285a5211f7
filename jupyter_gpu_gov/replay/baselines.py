"""The stock cullers, replayed on the same traces for comparison (same output as ``replay``).

- ``idle_culler``: jupyterhub-idle-culler. Every ``cull_every`` seconds (its default: half the
  timeout) it stops a server whose Hub ``last_activity`` (or, with none yet, its start) is at
  least ``timeout`` old. The Hub sees a person, a busy kernel or an open tab (which polls the
  API); it sees no GPU. No warnings, no checkpoints.
- ``kernel_culler``: jupyter-server's ``MappingKernelManager`` culling with ``cull_idle_timeout =
  timeout``, ``cull_interval`` (default 300 s), ``cull_connected = False``, ``cull_busy = False``.
  Every interval it shuts down a kernel that is not busy, has no connections and whose last
  activity (a busy step or the user's interaction; else its start) is more than ``timeout`` old.
  Only kernels that hold the GPU (a context or memory) are considered; shutting one down frees
  that memory.

Checks run on a grid of the interval on the trace clock; each is applied at a server's first row
at or after it. After a cull the server's later rows are ignored, as in ``replay``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ..core.durations import format_duration
from .engine import Action
from .trace import Sample

IDLE_CULLER_TIMEOUT_S = 3600.0  # zero-to-jupyterhub's cull.timeout
KERNEL_CULL_INTERVAL_S = 300.0  # MappingKernelManager.cull_interval's default


def idle_culler(
    samples: Iterable[Sample],
    timeout: float = IDLE_CULLER_TIMEOUT_S,
    cull_every: float | None = None,
) -> Iterator[Action]:
    def cull(sample: Sample, inactive: float) -> str | None:
        if inactive < timeout:
            return None
        return (
            f"idle-culler: Hub last activity {format_duration(inactive)} ago "
            f"(timeout {format_duration(timeout)})"
        )

    return _periodic_culler(
        samples,
        cull_every or timeout / 2,
        lambda s: s.user_active or s.kernel_busy or s.connections > 0,
        cull,
    )


def kernel_culler(
    samples: Iterable[Sample],
    timeout: float = IDLE_CULLER_TIMEOUT_S,
    cull_interval: float | None = None,
) -> Iterator[Action]:
    def cull(sample: Sample, idle: float) -> str | None:
        if not sample.holds_gpu_memory or sample.kernel_busy or sample.connections > 0:
            return None
        if idle <= timeout:
            return None
        return (
            f"kernel culler: kernel idle for {format_duration(idle)} with no connections "
            f"(cull_idle_timeout {format_duration(timeout)}); its GPU memory is freed"
        )

    return _periodic_culler(
        samples,
        cull_interval or KERNEL_CULL_INTERVAL_S,
        # Kernel messages (a busy step, the user's interaction) update its last_activity.
        lambda s: s.kernel_busy or s.user_active,
        cull,
    )


def _periodic_culler(
    samples: Iterable[Sample],
    every: float,
    is_activity: Callable[[Sample], bool],
    cull: Callable[[Sample, float], str | None],
) -> Iterator[Action]:
    """What both stock cullers share: on each check, ``cull(sample, inactive_seconds)`` says
    why to cull (or None); a culled server's later rows are ignored."""
    started: dict[tuple[str, float | None], float] = {}
    last_activity: dict[tuple[str, float | None], float] = {}
    previous: dict[tuple[str, float | None], float] = {}
    culled: set[tuple[str, float | None]] = set()
    for sample in samples:
        key = sample.session
        if key in culled:
            continue
        started.setdefault(key, sample.t if sample.started is None else sample.started)
        if is_activity(sample):
            last_activity[key] = sample.t
        due = _check_due(previous.get(key), sample.t, every)
        previous[key] = sample.t
        if not due:
            continue
        reason = cull(sample, sample.t - last_activity.get(key, started[key]))
        if reason is not None:
            culled.add(key)
            yield Action(sample.t, sample.server, "cull", reason, sample.started)


def _check_due(previous: float | None, t: float, every: float) -> bool:
    """A check time (a multiple of ``every``) falls in (previous, t]; always on a first row."""
    return previous is None or t // every > previous // every
