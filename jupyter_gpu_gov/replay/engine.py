"""Replay a trace through the live service's policy (``core.policy.decide``), and score a run.

``replay`` turns each server's samples, in time order, into the ``ServerView`` and ``GpuSignal``
the hub service would build, keeps its ``Record``, and yields the actions ``decide`` returns.
After a cull the server's later rows are ignored: its GPU was given back. Those rows are what
the server *would* have done, which is what ``score`` measures a run against.

``score`` is pure and streams, so benchmarks can score any run (ours or a baseline's) the same
way, with the same yardstick.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from ..core import cpu_stage
from ..core.durations import format_duration
from ..core.policy import (
    Decision,
    GpuSignal,
    Policy,
    PolicyError,
    Record,
    ServerView,
    dcgm_only,
    decide,
    evolve,
    is_quiet,
    load_policies,
    max_age_of,
    select,
)
from ..core.vocabulary import (
    CHECKPOINT,
    CHECKPOINTING,
    CULL,
    INTERRUPT,
    MAX_AGE_WARN,
    NOTICES,
    PROJECT_LABEL,
    RECLAIM_WARN,
    SHUTDOWN_KERNELS,
    TEAM_LABEL,
    TIER_LABEL,
    USER_LABEL,
    WARN,
    WARNINGS,
)
from .trace import Sample

# The trace's t = 0. Any fixed UTC instant works; output keeps t in seconds.
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
# Scoring's yardstick for "the GPU did work", the same for every run whatever its policy says.
ACTIVE_SM = 0.05
# Ground-truth labels under which culling loses nobody's work: the root causes' (docs/api.md), and the idle ones
# of the reclamation benchmark's traces (benchmarks/replay/generate.py).
NOT_LIVE_TRUTHS = frozenset({"zombie", "idle", "idle_held", "idle_free"})


def at(t: float) -> datetime:
    return EPOCH + timedelta(seconds=t)


@dataclass(frozen=True)
class Action:
    """One output line: ``{"t": …, "server": …, "action": …, "reason": …}``, and ``"started"``
    for a trace whose rows say when each run of a server started."""

    t: float
    server: str
    action: str  # warn | notice | checkpoint | interrupt | cull
    reason: str
    started: float | None = None  # the run of the server (the sample's ``started``)
    # Why a cull, in a word (``core.policy.CULL_REASONS``: gpu-idle, max-age, reclaim, admin,
    # busy-limit, inactive); None for other actions and for the stock cullers.
    cull_reason: str | None = None

    @property
    def session(self) -> tuple[str, float | None]:
        return self.server, self.started

    def as_dict(self) -> dict:
        line = {"t": self.t, "server": self.server, "action": self.action, "reason": self.reason}
        if self.started is not None:
            line["started"] = self.started
        return line


# -- policies ----------------------------------------------------------------------------------


class ConfigError(ValueError):
    """A config file that cannot be loaded (missing, or it raises)."""


def policies_from_config(path: str | None) -> list[Policy]:
    """The policies of a traitlets config file (``c.GpuGovernor.policies``, a list of dicts, and
    ``c.GpuGovernor.policy_defaults``, a dict, over ``c.GpuGovernor.timeout`` and ``max_age`` in
    seconds), as the hub service reads them. No path: the shipped default policy. Raises
    ``PolicyError`` (naming the entry and key) or ``ConfigError``.
    """
    return load_policies([]) if path is None else policies_of(load_config(path))


def load_config(path: str):
    """A traitlets config file (a ``jupyterhub_config.py``, or a file of just the settings a
    command needs), loaded as the Hub loads it; ``ConfigError`` if it cannot be."""
    import os

    from traitlets.config.loader import PyFileConfigLoader

    try:
        return PyFileConfigLoader(
            os.path.basename(path), path=os.path.dirname(path) or "."
        ).load_config()
    except Exception as error:  # the file is Python: it may raise anything
        raise ConfigError(f"{path}: {type(error).__name__}: {error}") from None


def policies_of(config) -> list[Policy]:
    """The policies a loaded config gives the service (see ``policies_from_config``)."""
    from traitlets.config.loader import LazyConfigValue

    section = config.GpuGovernor
    values = {}
    for key, empty, kind in (("policies", [], list), ("policy_defaults", {}, dict)):
        value = section.get(key, empty)
        if isinstance(value, LazyConfigValue):  # c.GpuGovernor.policies.append(...)
            value = value.get_value(empty)
        if not isinstance(value, kind):
            raise PolicyError(f"c.GpuGovernor.{key} must be a {kind.__name__}, got {value!r}")
        values[key] = value
    # As the service does: its idle-culler options are the defaults policy_defaults refines.
    defaults = {}
    if "timeout" in section:
        defaults["inactive_timeout"] = section.timeout
    if section.get("max_age"):
        defaults["max_age"] = section.max_age
    defaults.update(values["policy_defaults"])
    return load_policies(values["policies"], defaults)


# -- replay ------------------------------------------------------------------------------------


class _Server:
    """What the service would know of one server between cycles."""

    def __init__(self, started: datetime):
        self.started = started
        self.record = Record()
        self.hub_last: datetime | None = None  # Jupyter activity: a person, a kernel, a tab
        self.gpu_last: datetime | None = None  # GPU activity, reported by our extension
        self.user_last: datetime | None = None
        self.busy_since: datetime | None = None
        # Its container's CPU (a ``reports: false`` row's ``cpu_cores``, as the kubelet
        # measures it), folded reading by reading (``core.cpu_stage``).
        self.cpu: cpu_stage.CpuRun | None = None
        self.checkpoint_fails: bool | None = None  # a checkpoint is in flight
        # The running cell was interrupted: the trace's rest of it (a busy kernel, the GPU
        # work it would have done) did not happen, until the kernel is next seen idle.
        self.interrupted = False
        self.culled = False


def replay(samples: Iterable[Sample], policies: Sequence[Policy]) -> Iterator[Action]:
    """Yield the actions the service would take, sample by sample (first policy match wins)."""
    servers: dict[tuple[str, float | None], _Server] = {}
    latest: dict[str, _Server] = {}  # each server's latest session, as the store keeps its row
    for sample in samples:
        now = at(sample.t)
        server = servers.get(sample.session)
        if server is None:
            started = now if sample.started is None else at(sample.started)
            server = servers[sample.session] = _Server(started)
            previous = latest.get(sample.server)
            if previous is not None:  # what the governor learned of the server, as it does
                server.record = previous.record.next_session()
            latest[sample.server] = server
        if server.culled:
            continue
        sample = _observe(server, sample, now)
        identity = server_view(sample)
        policy = select(policies, identity)
        if sample.reports and sample.gpu_sm is not None and sample.gpu_sm >= policy.idle_threshold:
            server.gpu_last = now  # our extension reports GPU activity to the Hub
        hub_last = _latest(server.hub_last, server.gpu_last if sample.reports else None)
        view = evolve(
            identity,
            started=server.started,
            hub_last_activity=hub_last,
            # People's interaction is read from reports; the Hub's activity includes open tabs.
            user_last_activity=server.user_last if sample.reports else None,
            tab_open=sample.connections > 0 if sample.reports else None,
            reports=sample.reports,
            gpu=gpu_signal(
                sample, policy, server.busy_since, cpu_stage.busy_since(server.cpu, now)
            ),
        )
        decision = decide(view, server.record, policy, now)
        server.record = decision.record
        for action in decision.actions:
            if action == CHECKPOINT:
                server.checkpoint_fails = sample.checkpoint_fails
            elif action == INTERRUPT:
                server.interrupted, server.busy_since = True, None
            elif action == CULL:
                server.culled = True
            yield Action(
                sample.t,
                sample.server,
                _output_name(action),
                _reason(action, decision, view, policy, now),
                sample.started,
                decision.cull_reason if action == CULL else None,
            )


def server_view(sample: Sample, **state: Any) -> ServerView:
    """Who the server is (all ``select`` needs to choose its policy), plus any ``state``: as
    the service reads it (``hub/ownership.py``), on the tier its ``profile`` names where no
    label says, and labelled with its team, tier and user. Read from the label alone, a trace
    written with ``profile`` matched no policy on ``tiers`` (nor on those labels) that the
    service then applied."""
    labels = sample.labels
    tier = labels.get(TIER_LABEL) or sample.profile
    owner = ((TEAM_LABEL, sample.team), (TIER_LABEL, tier), (USER_LABEL, sample.user))
    if any(value and label not in labels for label, value in owner):
        labels = {**{label: value for label, value in owner if value}, **labels}
    return ServerView(
        user=sample.user,
        name=sample.name,
        profile=sample.profile,
        tier=tier,
        team=sample.team,
        project=labels.get(PROJECT_LABEL),
        labels=labels,
        **state,
    )


def gpu_signal(
    sample: Sample,
    policy: Policy,
    kernel_busy_since: datetime | None,
    cpu_busy_since: datetime | None = None,
) -> GpuSignal | None:
    """The GPU as the service would see it: from the server's report, or for a server without
    the extension from DCGM (``gpu_sm`` on a ``reports: false`` row) as the hub decides it
    (``dcgm_only``: the card, never the kernels — a cull waits ``busy_grace`` whether or not
    a cell runs, unless its container's CPU, that row's ``cpu_cores``, has been busy:
    ``cpu_busy_since``, a CPU stage); None when neither says anything (jupyterhub-idle-culler's
    rule then). A server holds its GPU allocation with or without a context (stop-server);
    shutting kernels down frees only what they hold."""
    if not sample.reports:
        if sample.gpu_sm is None:
            return None
        return dcgm_only(sample.gpu_sm >= policy.idle_threshold, "DCGM", cpu_busy_since)
    holds = sample.holds_gpu_memory if policy.cull_action == SHUTDOWN_KERNELS else True
    active = None if sample.gpu_sm is None else sample.gpu_sm >= policy.idle_threshold
    quiet = is_quiet(sample.cpu_cores, sample.iowait, sample.read_mb_s)
    return GpuSignal(holds, active, kernel_busy_since=kernel_busy_since, cell_quiet=quiet)


def _observe(server: _Server, sample: Sample, now: datetime) -> Sample:
    """Fold this step's activity into the server's state; the sample as it happened (an
    interrupted cell neither runs on nor uses the GPU)."""
    if server.interrupted:
        if sample.kernel_busy and not sample.user_active:
            sample = replace(sample, kernel_busy=False, gpu_sm=0.0 if sample.reports else None)
        else:
            server.interrupted = False  # idle again, or the owner ran something new
    if sample.user_active or sample.kernel_busy or sample.connections > 0:
        server.hub_last = now  # an open tab polls the API, which keeps Hub activity fresh
    if sample.user_active:
        server.user_last = now
    if not sample.reports:  # the kubelet's reading of its container (no report to read)
        server.cpu = cpu_stage.fold(server.cpu, now, sample.cpu_cores)
    if sample.kernel_busy and sample.holds_context:
        server.busy_since = server.busy_since or now
    else:
        server.busy_since = None
    if server.checkpoint_fails is not None:
        # The checkpoint asked for last step has finished; it fails when either step says so.
        if server.record.state == CHECKPOINTING and server.record.checkpoint_status == "requested":
            failed = server.checkpoint_fails or sample.checkpoint_fails
            server.record = replace(server.record, checkpoint_status="failed" if failed else "done")
        server.checkpoint_fails = None
    return sample


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    return max(a, b) if a and b else a or b


def _output_name(action: str) -> str:
    """Warnings of every kind are ``warn``, notices ``notice``."""
    return WARN if action in WARNINGS else "notice" if action in NOTICES else action


def _reason(
    action: str, decision: Decision, view: ServerView, policy: Policy, now: datetime
) -> str:
    if action == MAX_AGE_WARN:
        max_age, whose = max_age_of(policy, view)
        left = view.started + max_age - now
        return (
            f"max age: the server reaches the maximum age of {format_duration(max_age)} "
            f"for this {whose} in {format_duration(left)} (policy {policy.name!r})"
        )
    if action == RECLAIM_WARN:
        return f"reclaim: {decision.notice} (policy {policy.name!r})"
    return decision.reason


# -- scoring -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    servers: int  # distinct servers in the trace (each run, where rows say when it started)
    warnings: int  # warn actions (max-age warnings included)
    checkpoints: int
    culls: int
    gpu_hours_held: float  # the trace as recorded: holding a GPU context or memory
    gpu_hours_idle_held: float  # of which gpu_sm < ACTIVE_SM
    gpu_hours_reclaimed: float  # idle-held hours at or after a cull: given back
    gpu_hours_work_lost: float  # active-held hours at or after a cull: cut short
    false_culls: int  # culls of servers that did GPU work (or live work, by truth) after
    warned_cull_share: float | None  # culls preceded by a warning to that server; None: no culls
    median_idle_to_reclaim_s: float | None  # from the start of the idle stretch to the cull

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


class _Tally:
    """One server's running score."""

    __slots__ = ("cull_t", "false_cull", "idle_start", "idle_to_reclaim", "pending", "reached")

    def __init__(self, cull_t: float | None):
        self.cull_t = cull_t
        self.pending: Sample | None = None  # its state lasts until the server's next row
        self.idle_start: float | None = None  # of the current idle-held stretch
        self.idle_to_reclaim: float | None = None
        self.reached = False  # a row at or after the cull has been seen
        self.false_cull = False


def score(
    samples: Iterable[Sample],
    actions: Iterable[Action],
    *,
    active_sm: float = ACTIVE_SM,
    not_live: frozenset[str] = NOT_LIVE_TRUTHS,
) -> Summary:
    """Score a run's actions against the trace it ran on.

    A row's state lasts until that server's next row (a server's last row ends its trace). A cull
    at ``t`` gives the GPU back from ``t`` on, so the rows at or after it are what the server
    would have done: idle-held ones are reclaimed, active ones (``gpu_sm >= active_sm``) are work
    cut short and make the cull false, as does a ``truth`` label outside ``not_live`` there.
    """
    counts: Counter[str] = Counter()
    cull_at: dict[tuple[str, float | None], float] = {}
    warned: set[tuple[str, float | None]] = set()
    warned_culls = 0
    for action in actions:
        counts[action.action] += 1
        if action.action == WARN:
            warned.add(action.session)
        elif action.action == CULL and action.session not in cull_at:
            cull_at[action.session] = action.t
            warned_culls += action.session in warned

    hours = {"held": 0.0, "idle": 0.0, "reclaimed": 0.0, "lost": 0.0}

    def close(row: Sample, tally: _Tally, until: float) -> None:
        if not row.holds_gpu_memory:
            return
        span = (until - row.t) / 3600
        after_cull = tally.cull_t is not None and row.t >= tally.cull_t
        hours["held"] += span
        if row.gpu_sm is not None and row.gpu_sm < active_sm:
            hours["idle"] += span
            hours["reclaimed"] += span * after_cull
        elif row.gpu_sm is not None:
            hours["lost"] += span * after_cull

    tallies: dict[tuple[str, float | None], _Tally] = {}
    for row in samples:
        tally = tallies.get(row.session)
        if tally is None:
            tally = tallies[row.session] = _Tally(cull_at.get(row.session))
        if tally.pending is not None:
            close(tally.pending, tally, row.t)
        tally.pending = row
        idle_held = row.holds_gpu_memory and row.gpu_sm is not None and row.gpu_sm < active_sm
        if not idle_held:
            tally.idle_start = None
        elif tally.idle_start is None:
            tally.idle_start = row.t
        if tally.cull_t is not None and row.t >= tally.cull_t:
            truth = row.extra.get("truth")
            live = isinstance(truth, str) and truth not in not_live
            tally.false_cull |= live or (row.gpu_sm is not None and row.gpu_sm >= active_sm)
            if not tally.reached and tally.idle_start is not None:
                tally.idle_to_reclaim = tally.cull_t - tally.idle_start
            tally.reached = True

    waits = [t.idle_to_reclaim for t in tallies.values() if t.idle_to_reclaim is not None]
    return Summary(
        servers=len(tallies),
        warnings=counts[WARN],
        checkpoints=counts[CHECKPOINT],
        culls=counts[CULL],
        gpu_hours_held=hours["held"],
        gpu_hours_idle_held=hours["idle"],
        gpu_hours_reclaimed=hours["reclaimed"],
        gpu_hours_work_lost=hours["lost"],
        false_culls=sum(t.false_cull for t in tallies.values()),
        warned_cull_share=warned_culls / len(cull_at) if cull_at else None,
        median_idle_to_reclaim_s=statistics.median(waits) if waits else None,
    )
