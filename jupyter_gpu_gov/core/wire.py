"""The report and the verdict, defined once: frozen dataclasses whose fields carry their meaning
and bounds, from which the JSON Schema (``jupyter_gpu_gov/events/wire.v1.schema.json``), the
labextension's wire types (``labextension/src/wire.ts``) and the field tables of docs/api.md are
generated (``python -m jupyter_gpu_gov.core.wire_schema``; tests fail when they drift).

``Report.from_json`` is the validator (``core.report.validate``: the first bad field is named,
every value bounded) followed by the conversion; ``to_json`` gives the JSON object back. ``null``
always means *unknown*, never zero.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .vocabulary import CHECKPOINT_REQUESTED, CULL_ACTIONS, INTERRUPT, POLICY_CHANGES, STATES

REPORT_FORMAT = 1  # the report's "schema"
# Report bounds (a report comes from a process its user controls).
BACKENDS = ("nvml", "simulated", "unavailable", "none")
TARGET_KINDS = ("kernel", "terminal", "other")
CONFIDENCES = ("exact", "inferred", "unknown")
MAX_DEVICES = 64
MAX_TARGETS = 2000
MAX_TEXT = 1024  # characters of a name, id or path
MAX_ERROR = 4096  # characters of an error message
# A number's bound where its meaning sets none: JSON's numbers have no size, and 10^308 MiB held
# (finite as a float, an integer in Python) made right-sizing raise on every listing of the
# admin's, and two kernels of 1e308 MiB summed to infinity ("Infinity" is not JSON).
MAX_MEMORY_MB = 2**30  # MiB: 1 PiB, thousands of times any GPU's
MAX_COUNT = 2**31  # connections, CPU cores, MB/s, seconds (68 years)
MEMORY = {"minimum": 0, "maximum": MAX_MEMORY_MB}
COUNT = {"minimum": 0, "maximum": MAX_COUNT}
CHECKPOINT_STATES = (CHECKPOINT_REQUESTED, "none")  # the verdict's "checkpoint"
EXTENSION_REASONS = ("optional", "required")
AT_DEADLINES = (INTERRUPT,)  # the verdict's "at_deadline": what comes at cull_at, if not a cull
# How long the governor keeps a server's report connection open without a request (HTTP/1.1
# keep-alive). A server whose reports come closer together keeps its connection between them; one
# that reports less often (the default, 60 s) closes it after each answer: an idle connection
# held per server costs the governor ~9 kB (88 MB at 10,000 servers) and saved no CPU at the
# steady rate (docs/benchmarks-history.md, "Issue 26, wave 7").
REPORT_CONNECTION_IDLE_S = 30.0
# The header in which a server's Extend or Stop carries the token of the person who asked,
# where that is not its owner (a guest of a shared server, an admin): ``token <t>``. The
# governor asks the Hub whose it is and puts that person on record (docs/api.md).
ASKER_HEADER = "Gpu-Gov-Asker"
# Characters of a reason, wherever one is taken (an Extend's or Stop's, through the server
# extension too; an admin's action, form or API; a policy's apply, revert or dry run; a
# checkpoint's, kept in its manifest): an audit row or a manifest is not a megabyte. One past
# it is refused with ``reason_too_long``'s words, never cut unsaid.
MAX_REASON = 2000


def reason_too_long(text: str, key: str = "reason") -> str | None:
    """The refusal of ``text`` (the field ``key``) as longer than ``MAX_REASON``, counted as
    sent (a browser's ``maxlength`` counts so); None: it is not."""
    if len(text) <= MAX_REASON:
        return None
    return f"'{key}' may be at most {MAX_REASON} characters"


def spec(doc: str, default: Any = None, **schema: Any) -> Any:
    """A wire field: its meaning (``doc``, the docs table's text) and JSON Schema keywords
    (``enum``, ``minimum``, ``maximum``, ``maxLength``, ``maxItems``, ``format``, ``const``;
    ``required=True`` where a report without it is refused)."""
    factory = {"default_factory": default} if callable(default) else {"default": default}
    return dataclasses.field(metadata={"doc": doc, **schema}, **factory)


TIME = {"format": "date-time"}
SHARE = {"minimum": 0, "maximum": 1}


class Wire:
    """What the wire dataclasses share: ``to_json`` and conversion from a validated object."""

    def to_json(self) -> dict:
        # Fields in their order (a frozen dataclass's __dict__ holds them, nothing else); only
        # the nested ones are converted: a verdict goes out with every report.
        out = dict(self.__dict__)
        for name in _nested(type(self)):
            out[name] = _to_json(out[name])
        return out

    @classmethod
    def _from_checked(cls, obj: Mapping) -> Any:
        """From an object already validated: nested wire types converted, unknown keys
        ignored."""
        values = {}
        for name, convert in _converters(cls):
            if name in obj:
                value = obj[name]
                values[name] = value if convert is None or value is None else convert(value)
        return cls(**values)


def _to_json(value: Any) -> Any:
    if isinstance(value, Wire):
        return value.to_json()
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    return value


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


@functools.cache
def _nested(cls: type) -> tuple[str, ...]:
    """The fields of ``cls`` that hold wire objects or tuples (``to_json`` converts them)."""
    return tuple(name for name, hint in _hints(cls).items() if _holds_wire(hint))


def _holds_wire(hint: Any) -> bool:
    return any(
        typing.get_origin(part) is tuple or (isinstance(part, type) and issubclass(part, Wire))
        for part in (hint, *typing.get_args(hint))
    )


@functools.cache
def _converters(cls: type) -> tuple[tuple[str, Callable[[Any], Any] | None], ...]:
    """Each field of ``cls`` with what turns its JSON value (not null) into the field's value;
    None where it is the same (worked out once per class: a report has many targets)."""
    return tuple((name, _converter(hint)) for name, hint in _hints(cls).items())


def _converter(hint: Any) -> Callable[[Any], Any] | None:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, type) and issubclass(hint, Wire):
        return hint._from_checked
    if typing.get_origin(hint) is tuple:
        item = _converter(args[0])
        if item is None:
            return tuple
        return lambda values: tuple(None if v is None else item(v) for v in values)
    if len(args) == 1 and typing.get_origin(hint) is not dict:  # X | None
        return _converter(args[0])
    return None


# -- the report (server -> governor) ------------------------------------------------------------


@dataclass(frozen=True)
class Server(Wire):
    """Who the server is."""

    user: str = spec("the Hub user", required=True, maxLength=MAX_TEXT)
    name: str = spec('the server name (`""` for the default server)', "", maxLength=MAX_TEXT)
    started: str | None = spec("when this server started", **TIME)
    last_activity: str | None = spec(
        "last activity of people and clients (API calls, kernel messages, terminals), "
        "**excluding** GPU work, so the governor can tell an open tab from GPU work",
        **TIME,
    )
    pod: str | None = spec("the Kubernetes pod, `null` outside Kubernetes", maxLength=MAX_TEXT)
    namespace: str | None = spec(
        "the Kubernetes namespace, `null` outside Kubernetes", maxLength=MAX_TEXT
    )
    gpu_allocated: bool = spec(
        "the GPUs it sees are its own allocation (a Kubernetes GPU request, the workstation "
        "allocator's devices), not a machine's shared cards",
        False,
    )


@dataclass(frozen=True)
class Device(Wire):
    """A leaf device: a whole GPU or a MIG instance."""

    uuid: str = spec("NVML UUID (`GPU-…` or `MIG-…`)", required=True, maxLength=MAX_TEXT)
    name: str | None = spec("product name", maxLength=MAX_TEXT)
    mig_profile: str | None = spec(
        "e.g. `1g.18gb` for a MIG instance; `null` for a whole GPU", maxLength=MAX_TEXT
    )
    parent_uuid: str | None = spec(
        "the physical GPU of a MIG instance; `null` for a whole GPU", maxLength=MAX_TEXT
    )
    memory_total_mb: float | None = spec("MiB", **MEMORY)
    memory_used_mb: float | None = spec("MiB", **MEMORY)
    activity: float | None = spec(
        "0..1 over the driver's last sample period; `null` where there is no utilisation API "
        "(MIG without GPM)",
        **SHARE,
    )
    memory_activity: float | None = spec("memory controller activity 0..1", **SHARE)
    shared: bool = spec(
        "other people's processes use this card (workstation: processes of another Unix user; "
        "the server's own user's outside the server are its `other` target), or it is "
        "time-sliced",
        False,
    )
    health: dict | None = spec(
        "the GPU's health (a MIG instance: its GPU's), [GPU health](#gpu-health): "
        '`{"status": "ok"|"unhealthy"|"unknown", "reasons": [...], "action": "reset"|"drain"|null, "warnings": [...]}`; `null` '
        "from a server that does not check",
        tsType="IDeviceHealth",
    )


@dataclass(frozen=True)
class TargetGpu(Wire):
    """What a target holds of the GPUs."""

    devices: tuple[str, ...] = spec(
        "UUIDs of the devices this target holds", tuple, maxItems=MAX_DEVICES
    )
    memory_mb: float | None = spec("GPU memory it holds, MiB", **MEMORY)
    sm: float | None = spec("SM activity 0..1 (of its busiest device) at this sample", **SHARE)
    holds_context: bool = spec(
        "it has a CUDA context on a GPU (holds the card even if idle)", False, required=True
    )
    confidence: str = spec(
        "how sure the attribution is: `exact` (local PIDs, per-process data), `inferred` "
        "(derived from device totals or open device files), `unknown` (no split possible)",
        "unknown",
        enum=CONFIDENCES,
        required=True,
    )
    last_active: str | None = spec("last sample at or above `active_threshold`", **TIME)
    idle_since: str | None = spec("start of the current idle stretch (`null` unless idle)", **TIME)
    active_fraction: float | None = spec(
        "share of known samples in the window that were active", **SHARE
    )
    pids: tuple[int, ...] = spec(
        "the GPU process IDs as the backend reported them (host PIDs in a container)", tuple
    )
    history: tuple[float | None, ...] = spec(
        "the window's `sm` values, oldest first (sparklines)", tuple
    )


@dataclass(frozen=True)
class TargetCpu(Wire):
    """What a target's process tree did over the rolling window."""

    cores: float | None = spec(
        "CPU cores busy on average (user + system time / wall time): `1.0` is one core "
        "saturated, e.g. a Python loop",
        **COUNT,
    )
    iowait: float | None = spec(
        "share 0..1 of the window the tree's processes spent blocked on block I/O "
        "(`delayacct_blkio_ticks`, field 42 of `stat`; the main thread of each process; summed "
        "over processes and capped at 1). `null` when the kernel does not account I/O delay "
        "(`/proc/sys/kernel/task_delayacct` is `0`, the default since Linux 5.14; `sysctl "
        "kernel.task_delayacct=1` turns it on)",
        **SHARE,
    )
    read_mb_s: float | None = spec(
        "reads from storage (`read_bytes` of `/proc/<pid>/io`: page-cache misses, not cached "
        "re-reads), in MB/s (10^6 bytes); `null` when `io` is unreadable for any process of the "
        "tree, and for `other`",
        **COUNT,
    )
    seconds: float | None = spec("the span these figures cover", **COUNT)
    top_thread: float | None = spec(
        "share 0..1 of a core the tree's busiest thread used, tick by tick, averaged over the "
        "window (`/proc/<pid>/task/<tid>/schedstat` where the kernel keeps it, else `stat`; "
        "at most 512 threads a process): a serial loop "
        "saturates one thread (1.0) where workers sharing a load each read less; `null` when a "
        "task list is unreadable",
        **SHARE,
    )


@dataclass(frozen=True)
class Target(Wire):
    """A kernel, a terminal, or the server's other processes."""

    kind: str = spec(
        "`kernel`, `terminal` or `other` (the server's other processes)",
        "other",
        enum=TARGET_KINDS,
        required=True,
    )
    id: str = spec(
        "a kernel's id (a UUID), a terminal's name, or `server`",
        "",
        required=True,
        maxLength=MAX_TEXT,
    )
    name: str | None = spec("the kernel's name", maxLength=MAX_TEXT)
    path: str | None = spec(
        "the notebook or console a kernel belongs to, when there is a session",
        maxLength=MAX_TEXT,
    )
    execution_state: str | None = spec(
        "as Jupyter Server reports it for the kernel", maxLength=MAX_TEXT
    )
    busy_since: str | None = spec("when the running cell began (`busy` only)", **TIME)
    last_activity: str | None = spec(
        "as Jupyter Server reports it (terminals: their last activity)", **TIME
    )
    connections: float | None = spec(
        "clients connected (browser tabs; terminals: their clients)", **COUNT
    )
    gpu: TargetGpu = spec("what it holds of the GPUs", TargetGpu, required=True)
    cpu: TargetCpu | None = spec(
        "what the target's process tree did over the rolling window (the same `window.seconds` "
        "as the GPU's, shorter just after a start), from `/proc/<pid>/stat` and "
        "`/proc/<pid>/io` deltas between samples; `null` on the first sample. Optional: a "
        "governor accepts reports without it"
    )

    @classmethod
    def _from_checked(cls, obj: Mapping) -> Target:
        cpu = obj.get("cpu")
        if isinstance(cpu, Mapping) and "cores" not in cpu:
            obj = {**obj, "cpu": None}  # an older server's {"percent", "iowait"}: ignored
        return super()._from_checked(obj)


@dataclass(frozen=True)
class Window(Wire):
    """The rolling window, for the whole server."""

    seconds: float = spec(
        "length of the rolling window (`GpuGovApp.window_seconds`)", 0, required=True, **COUNT
    )
    gpu_active_fraction: float | None = spec(
        "share of the window's known samples in which any GPU-holding target was active; "
        "`null` when nothing is known",
        **SHARE,
    )
    gpu_last_active: str | None = spec("the last active sample, for the whole server", **TIME)
    gpu_idle_since: str | None = spec(
        "start of the server's idle stretch, no earlier than it took a GPU (a context, or the "
        "GPUs allocated to it); the governor reads it as no earlier than it received this "
        "server process's first report holding a GPU, nor than the Hub's `started`",
        **TIME,
    )


@dataclass(frozen=True)
class CheckpointState(Wire):
    """The server's last checkpoint."""

    requested_at: str | None = spec("when the checkpoint was asked for", **TIME)
    status: str | None = spec("`null`, `running`, `done` or `failed`", maxLength=MAX_TEXT)
    manifest: dict | None = spec(
        "its manifest ([what a checkpoint does](#what-a-checkpoint-does))",
        tsType="ICheckpointManifest",
    )


@dataclass(frozen=True)
class Report(Wire):
    """What a server knows of its GPUs, kernels and terminals."""

    schema: int = spec(
        "report format version, `1`", REPORT_FORMAT, const=REPORT_FORMAT, required=True
    )
    sampled_at: str = spec("when the GPUs were sampled (RFC 3339, UTC)", "", required=True, **TIME)
    backend: str = spec(
        "`nvml`, `simulated`, `unavailable` (the backend failed: see `error`) or `none` (no GPU "
        "backend: `GpuGovApp.backend` is `none`, or `auto` found no driver, as in a CPU-only pod; "
        "a CPU-only server where a backend runs, `CUDA_VISIBLE_DEVICES` empty, names that backend "
        "with no `devices`)",
        "none",
        enum=BACKENDS,
        required=True,
    )
    error: str | None = spec(
        "why the backend is unavailable, naming the device when known; else `null`",
        maxLength=MAX_ERROR,
    )
    server: Server = spec("who this server is", Server, required=True)
    devices: tuple[Device, ...] = spec(
        "the leaf devices this server may use (a whole GPU or a MIG instance; "
        "restricted by `CUDA_VISIBLE_DEVICES`)",
        tuple,
        required=True,
        maxItems=MAX_DEVICES,
    )
    targets: tuple[Target, ...] = spec(
        "every kernel and terminal of the server, plus "
        '`{"kind": "other", "id": "server"}` when the server\'s other processes hold a GPU',
        tuple,
        required=True,
        maxItems=MAX_TARGETS,
    )
    window: Window = spec("the rolling window, for the whole server", Window, required=True)
    checkpoint: CheckpointState | None = spec("the last checkpoint")

    @classmethod
    def from_json(cls, obj: object, now: datetime | None = None) -> Report:
        """Validate (``core.report.validate``: ``ReportError`` names the first bad field) and
        convert."""
        from .report import validate

        return cls._from_checked(validate(obj, now))


@functools.cache
def report_words() -> dict[str, str]:
    """Every name and enumerated value of the report (its fields, at every depth, and values
    such as ``"kernel"`` or ``"exact"``), each as one string: a governor keeping thousands of
    reports keeps one copy of each word instead of one per report (``hub/ingest.py``)."""
    words: set[str] = set()
    todo: list[type] = [Report]
    while todo:
        cls = todo.pop()
        for field in dataclasses.fields(cls):
            words.add(field.name)
            words.update(v for v in field.metadata.get("enum", ()) if isinstance(v, str))
        for hint in _hints(cls).values():
            for part in (hint, *typing.get_args(hint)):
                for inner in (part, *typing.get_args(part)):
                    if isinstance(inner, type) and issubclass(inner, Wire) and inner not in todo:
                        todo.append(inner)
    return {word: word for word in words}


# -- the verdict (governor -> server) -----------------------------------------------------------

MAX_LINE_STARTS = 16  # a user's servers started from the line, on one verdict


@dataclass(frozen=True)
class LineStart(Wire):
    """Another server of the same owner that the spawn queue started on their behalf."""

    name: str = spec('the server name (`""` for the default server)', "", maxLength=MAX_TEXT)
    url: str = spec(
        "its path on the Hub, as the Hub names it (`/user/alice/gpu/`)",
        "",
        required=True,
        maxLength=MAX_TEXT,
    )
    tier: str | None = spec("the GPU tier it waited for", maxLength=MAX_TEXT)
    started: str = spec("when it started", "", required=True, **TIME)
    claim_by: str = spec(
        "when it is given back unless someone opens it (`queue_claim_within` after its start)",
        "",
        required=True,
        **TIME,
    )


@dataclass(frozen=True)
class Verdict(Wire):
    """What the governor answers a report with."""

    state: str = spec(
        "`active`, `idle`, `busy` (a cell runs while the GPU idles, past `busy_grace`: `reason` "
        "names the cause and what to do), `warned`, `checkpointing`, `culled`, `exempt`, "
        "`unknown` or `gpu-failed` (the server's GPU failed: [GPU health](#gpu-health))",
        "unknown",
        enum=STATES,
        required=True,
        tsName="GovState",
    )
    idle_since: str | None = spec("the idle clock (`null` when none)", **TIME)
    warn_at: str | None = spec("when the warning goes out (`null` when none)", **TIME)
    cull_at: str | None = spec("when the cull is due (`null` when none)", **TIME)
    reason: str | None = spec(
        "why, in words: e.g. `GPU idle since 2026-01-05 09:14 UTC; server stopped at 2026-01-05 "
        "11:14 UTC unless extended`"
    )
    hard_deadline: bool = spec(
        "a hard deadline — the maximum age, a borrowed GPU given back, an admin's cull — has "
        "been announced to the owner: the cull at `cull_at` comes whatever the GPU does and "
        "Extend does not move it (`reason` says why)",
        False,
    )
    extensions_left: int = spec("how many more times Extend gives time", 0, minimum=0)
    extension_step_s: int = spec("seconds each Extend gives", 0, minimum=0)
    extension_reason: str = spec(
        "whether Extend needs a reason (`optional` or `required`)",
        "optional",
        enum=EXTENSION_REASONS,
    )
    approval_pending: bool = spec("an extension waits for an admin", False)
    policy: str | None = spec("the policy that applies")
    cull_action: str | None = spec(
        "what a cull does (`stop-server` or `shutdown-kernels`)", enum=CULL_ACTIONS
    )
    at_deadline: str | None = spec(
        "what comes at `cull_at` when it is not a cull: `interrupt` (a running cell's limit, "
        "`on_busy_limit: interrupt` with `after_interrupt: warn`: the cell is interrupted and "
        "a checkpoint saved, the server and kernel stay; while `checkpointing`, that interrupt "
        "has happened and no stop follows); `null` when `cull_at` is a cull (`cull_action`)",
        enum=AT_DEADLINES,
    )
    policy_change: str | None = spec(
        "set while `reason` says a policy brought in as this server ran set its deadline or "
        "warning (sooner than it was told before, perhaps): how it came in, `applied` (an "
        "admin applied policies, or reverted to the config file's) or `config-changed` (the "
        "config file's policy changed since the service last ran); `null` otherwise. "
        "JupyterLab's toast says the policy changed on it, whatever the reason's words",
        enum=POLICY_CHANGES,
    )
    reclaim_withdrawn: str | None = spec(
        "when a reclaim this server was warned of was withdrawn (the team that asked its "
        "borrowed GPU back no longer needs it: its deadline is lifted, the server keeps the "
        "GPU), for `RECLAIM_WITHDRAWN_NOTICE` (15 min) after, a restart of the governor "
        "within them included, a standby's answer included (it reads the holder's audit "
        "rows back each pass), a new session of the server (stopped and started since: its "
        "Hub `started` is not the one the reclaim was lifted on, whatever the two clocks say) "
        "not; `null` otherwise. JupyterLab tells the owner once and its "
        'status bar reads "reclaim lifted" meanwhile',
        **TIME,
    )
    checkpoint: str = spec(
        "`requested` while the governor waits for a checkpoint, else `none`",
        "none",
        enum=CHECKPOINT_STATES,
    )
    dry_run: bool = spec("the governor records decisions but acts on none", False)
    root_cause: dict | None = spec(
        'why the GPU is underused ([root causes](#root-causes)): `{"label", "hint", '
        '"contributions", "source"}` (and the diagnosis\'s `cause`, `confidence`, '
        "`candidates`), or `null` when the server is "
        "healthy, its GPU data is unknown, it holds no GPU, or its last report is older than "
        "`report_stale_after`",
        tsType="IRootCause",
    )
    right_size: dict | None = spec(
        "a smaller tier this session's measured use fits: "
        '`{"tier", "label", "reason"}` (e.g. `{"tier": "h100-1g", "label": "Small H100 slice", '
        '"reason": "it used at most 4.3 GB of GPU memory and 5% of the GPU over 1h 10m; Small '
        "H100 slice has 10 GB and counts 14% of H100 80 GB's GPU-equivalents\"}`), or `null` "
        "(no catalogue, too little evidence, or nothing smaller fits)",
        tsType="IRightSize",
    )
    requests: dict = spec(
        "what the governor asks of the server (it never calls it): "
        '`{"checkpoint": {"requested_at", "reason", "cull_reason"}}`, '
        '`{"interrupt_kernels": {"requested_at", "kernels": [ids], "reason"}}` and/or '
        '`{"shutdown_kernels": {"requested_at", "kernels": [ids], "reason"}}`; `{}` when '
        "nothing (always in a dry run). The server does each once per `requested_at`",
        dict,
        tsType="IVerdictRequests",
    )
    started_from_line: tuple[LineStart, ...] = spec(
        "the owner's *other* servers that the spawn queue started on their behalf and nobody "
        "has opened yet, until one is opened or given back (`[]` when none): JupyterLab on "
        "this server tells the owner, with a link. From the Hub's records, carried on the "
        "verdict this server polls anyway: no server is given a credential to see another. "
        "The owner's alone: the server extension's `status` and the verdict its `extend` and "
        "`stop` answer give anyone else (a guest of a shared server, an admin in its "
        "JupyterLab) `[]`",
        tuple,
        maxItems=MAX_LINE_STARTS,
    )

    @classmethod
    def from_json(cls, obj: object) -> Verdict:
        return cls._from_checked(obj if isinstance(obj, Mapping) else {})
