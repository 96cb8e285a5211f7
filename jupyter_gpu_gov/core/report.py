"""The report a server sends (docs/api.md, "The report"): validation, and what it says about the GPU.

Its fields are the dataclasses of ``core/wire.py``, whose ``Report.from_json`` is this
``validate`` followed by the conversion.

Validation names the first bad field (``targets[2].gpu.sm``) so the server's log says what is
wrong; a report that does not validate changes nothing. A report comes from a process its user
controls, so every value is bounded: times lie between the server's start and a few minutes
from now, kernel ids are UUIDs, strings and lists have a length a real report never reaches.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from math import isfinite

from . import health
from .clock import parse, utcnow
from .policy import GpuSignal, is_quiet
from .vocabulary import STOP_SERVER
from .wire import (
    BACKENDS,
    CONFIDENCES,
    MAX_COUNT,
    MAX_DEVICES,
    MAX_ERROR,
    MAX_MEMORY_MB,
    MAX_TARGETS,
    MAX_TEXT,
    REPORT_FORMAT,
    TARGET_KINDS,
)

# The report's fields and bounds are defined in core/wire.py (the dataclasses, the schema).
SCHEMA = REPORT_FORMAT
# How far a report's times may run ahead of the governor's clock (the two clocks differ a
# little); further is a lie or a broken clock, and would push deadlines out of reach.
MAX_CLOCK_SKEW = timedelta(minutes=5)
# Jupyter names a kernel by a UUID; only such an id can ever be acted on (a kernel shutdown).
KERNEL_ID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


class ReportError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def validate(report: object, now: datetime | None = None) -> dict:
    """Check a decoded report; return it unchanged or raise ``ReportError``.

    ``now`` (default: the clock) bounds its times: none may be later than ``now`` plus
    ``MAX_CLOCK_SKEW``, and none but ``server.started`` earlier than the server's start.

    Each check is given where the field is (``targets[2].gpu``) and its key (``sm``) apart: the
    field's name is written only on an error (a report has about a hundred fields, and this
    runs for each of them on every report); and an object's fields of a kind are checked in
    one call (``_texts``, ``_bounded``, ``_times``), in the order they were checked one by one
    (a call a field: 155 Python calls a report, 103 so)."""
    _expect(report, Mapping, "", "report", "an object")
    if report.get("schema") != SCHEMA:
        raise ReportError("schema", f"must be {SCHEMA}, got {report.get('schema')!r}")
    server = _expect(report.get("server"), Mapping, "", "server", "an object")
    latest = (now or utcnow()) + MAX_CLOCK_SKEW
    parsed: dict[str, datetime] = {}  # this report's times, each parsed once
    started = _times(server, _STARTED, "server", None, latest, parsed)
    try:
        earliest = started - MAX_CLOCK_SKEW if started is not None else None
    except OverflowError:  # in the first minutes of year 1: raised past every handler (a 500)
        raise ReportError(
            "server.started", f"{server['started']} is before any server started"
        ) from None

    _times(report, _SAMPLED_AT, "", earliest, latest, parsed, required=True)
    if report.get("backend") not in BACKENDS:
        raise ReportError("backend", f"must be one of {', '.join(BACKENDS)}")
    _texts(report, _ERROR, "", MAX_ERROR)

    if not isinstance(server.get("user"), str) or not server["user"]:
        raise ReportError("server.user", "must be a non-empty string")
    _texts(server, _USER, "server")
    _expect(server.get("name", ""), str, "server", "name", "a string")
    _texts(server, _NAME, "server")
    _times(server, _LAST_ACTIVITY, "server", earliest, latest, parsed)
    _texts(server, _POD, "server")
    _expect(server.get("gpu_allocated", False), bool, "server", "gpu_allocated", "true or false")

    devices = _list(report, "devices", MAX_DEVICES)
    for i, device in enumerate(devices):
        where = ("devices", i, "")
        _expect(device, Mapping, where, "", "an object")
        _expect(device.get("uuid"), str, where, "uuid", "a string")
        _texts(device, _DEVICE_TEXTS, where)
        _bounded(device, _DEVICE_NUMBERS, where)
        _expect(device.get("shared", False), bool, where, "shared", "true or false")
        device_health = device.get("health")  # absent: nothing to check, no name to write
        if device_health is not None:
            field = _field(where, "health")
            wrong = health.validate(device_health, field)
            if wrong:
                raise ReportError(field, wrong)

    targets = _list(report, "targets", MAX_TARGETS)
    for i, target in enumerate(targets):
        where = ("targets", i, "")
        _expect(target, Mapping, where, "", "an object")
        if target.get("kind") not in TARGET_KINDS:
            raise ReportError(_field(where, "kind"), f"must be one of {', '.join(TARGET_KINDS)}")
        _expect(target.get("id"), str, where, "id", "a string")
        if target["kind"] == "kernel" and not KERNEL_ID.fullmatch(target["id"]):
            raise ReportError(
                _field(where, "id"), f"must be a kernel id (a UUID), got {target['id']!r:.80}"
            )
        _texts(target, _TARGET_TEXTS, where)
        _times(target, _TARGET_TIMES, where, earliest, latest, parsed)
        _bounded(target, _CONNECTIONS, where)
        gpu = _expect(target.get("gpu"), Mapping, where, "gpu", "an object")
        in_gpu = ("targets", i, ".gpu")
        gpu_devices = _expect(gpu.get("devices", []), list, in_gpu, "devices", "a list")
        if len(gpu_devices) > MAX_DEVICES or not _uuids(gpu_devices):
            raise ReportError(_field(in_gpu, "devices"), "must be a list of device UUIDs")
        # Nothing the governor decides or shows reads active_fraction, pids and history (the
        # server's own panel does, from its own status); checked all the same, as the wire
        # defines them, so that no reader to come takes a string or an object for a number.
        _bounded(gpu, _GPU_NUMBERS, in_gpu)
        _numbers(gpu, "pids", in_gpu, "process IDs (whole numbers, 0 to 2^31)", whole=True)
        _numbers(gpu, "history", in_gpu, "SM activities (numbers 0 to 1, or null)")
        _expect(gpu.get("holds_context"), bool, in_gpu, "holds_context", "true or false")
        if gpu.get("confidence") not in CONFIDENCES:
            raise ReportError(
                _field(in_gpu, "confidence"), f"must be one of {', '.join(CONFIDENCES)}"
            )
        _times(gpu, _GPU_TIMES, in_gpu, earliest, latest, parsed)
        _cpu(target.get("cpu"), ("targets", i, ".cpu"))

    window = _expect(report.get("window"), Mapping, "", "window", "an object")
    _bounded(window, _WINDOW_SECONDS, "window", required=True)
    _bounded(window, _WINDOW_NUMBERS, "window")
    _times(window, _WINDOW_TIMES, "window", earliest, latest, parsed)
    if report.get("checkpoint") is not None:
        checkpoint = _expect(report["checkpoint"], Mapping, "", "checkpoint", "an object or null")
        _texts(checkpoint, _STATUS, "checkpoint")
        _times(checkpoint, _REQUESTED_AT, "checkpoint", earliest, latest, parsed)
        # Its fields are the server's words, read as far as they are what the manifest's
        # table says (hub/checkpoints.py): nothing reads a manifest that is no object.
        if checkpoint.get("manifest") is not None:
            _expect(checkpoint["manifest"], Mapping, "checkpoint", "manifest", "an object or null")
    return dict(report)


# Each object's fields of a kind, in the order they are checked (``validate``).
_STARTED, _SAMPLED_AT, _LAST_ACTIVITY = ("started",), ("sampled_at",), ("last_activity",)
_ERROR, _USER, _NAME, _POD = ("error",), ("user",), ("name",), ("pod", "namespace")
_DEVICE_TEXTS = ("uuid", "parent_uuid", "name", "mig_profile")
_DEVICE_NUMBERS = (
    ("memory_total_mb", 0, MAX_MEMORY_MB),
    ("memory_used_mb", 0, MAX_MEMORY_MB),
    ("activity", 0, 1),
    ("memory_activity", 0, 1),
)
_TARGET_TEXTS = ("id", "name", "path", "execution_state")
_TARGET_TIMES = ("last_activity", "busy_since")
_CONNECTIONS = (("connections", 0, MAX_COUNT),)
_GPU_NUMBERS = (("memory_mb", 0, MAX_MEMORY_MB), ("sm", 0, 1), ("active_fraction", 0, 1))
_GPU_TIMES = ("last_active", "idle_since")
_CPU_NUMBERS = (
    ("cores", 0, MAX_COUNT),
    ("iowait", 0, 1),
    ("read_mb_s", 0, MAX_COUNT),
    ("seconds", 0, MAX_COUNT),
    ("top_thread", 0, 1),
)
_WINDOW_SECONDS = (("seconds", 0, MAX_COUNT),)
_WINDOW_NUMBERS = (("gpu_active_fraction", 0, 1),)
_WINDOW_TIMES = ("gpu_last_active", "gpu_idle_since")
_STATUS, _REQUESTED_AT = ("status",), ("requested_at",)


def gpu_signal(report: Mapping, *, idle_threshold: float, cull_action: str) -> GpuSignal:
    """What a (validated) report says about the server's GPU, for ``core.policy.decide``.

    A server holds a GPU while a process holds a context; with ``stop-server`` it also holds
    the GPUs allocated to it (a Kubernetes GPU request, the workstation allocator's devices),
    context or not, and their activity is its own. Otherwise a device none of its processes
    holds a context on is not its work; shared devices' own activity says nothing about it.
    """
    backend = report["backend"]
    if backend == "none":
        return GpuSignal(holds_gpu=False, active=False, detail="no GPUs")
    holders = [t for t in report["targets"] if t["gpu"]["holds_context"]]
    if backend == "unavailable":
        return GpuSignal(
            holds_gpu=True, active=None, detail=f"GPU backend unavailable: {report.get('error')}"
        )
    devices = report["devices"]
    allocated = bool(devices) and report["server"].get("gpu_allocated", False)
    holds_gpu = bool(holders) or (cull_action == STOP_SERVER and allocated)

    window = report["window"]
    if (window.get("gpu_active_fraction") or 0) > 0:  # recently active: nothing else to check
        return GpuSignal(holds_gpu, True)
    # What the wire leaves optional may be absent from a valid report (``.get``): read as
    # always there, a report without a target's ``sm`` failed its server's every decision.
    sms = [t["gpu"].get("sm") for t in holders]
    held = {d for t in holders for d in t["gpu"].get("devices", ())}
    if cull_action == STOP_SERVER and allocated:
        # The server's own allocation, no one else's process seen on it ("shared" otherwise):
        # its activity is the server's even where NVML lists no process on it (WSL2, a driver
        # hiding the list). It read idle: a working card culled.
        held |= {d["uuid"] for d in devices}
    own_activity = [d.get("activity") for d in devices if not d.get("shared") and d["uuid"] in held]
    if any(sm is not None and sm >= idle_threshold for sm in sms) or any(
        a is not None and a >= idle_threshold for a in own_activity
    ):
        return GpuSignal(holds_gpu, True)
    if any(sm is None for sm in sms):
        unknown = next(t for t in holders if t["gpu"].get("sm") is None)
        return GpuSignal(
            holds_gpu,
            None,
            detail=f"{unknown['kind']} {unknown.get('name') or unknown['id']}: no activity data",
        )

    running = [t for t in holders if t["kind"] == "kernel" and t.get("execution_state") == "busy"]
    busy = [parse(t.get("busy_since")) or parse(report["sampled_at"]) for t in running]
    return GpuSignal(
        holds_gpu,
        False,
        idle_since=parse(window.get("gpu_idle_since")),
        kernel_busy_since=min(busy, default=None),
        cell_quiet=_cells_quiet(running),
    )


def _cells_quiet(running: list[Mapping]) -> bool | None:
    """Whether every kernel running a cell did nothing over the window (``is_quiet`` of its
    ``cpu``): one that worked makes it False; one whose CPU is not known, None."""
    if not running:
        return None
    verdicts = []
    for target in running:
        cpu = target_cpu(target) or {}
        verdicts.append(is_quiet(cpu.get("cores"), cpu.get("iowait"), cpu.get("read_mb_s")))
    if False in verdicts:
        return False
    return None if None in verdicts else True


def target_cpu(target: Mapping) -> Mapping | None:
    """A (validated) target's ``cpu`` section, or ``None`` when it has none we understand (not
    sent, the first sample, or an older server's ``{"percent", "iowait"}``)."""
    cpu = target.get("cpu")
    return cpu if isinstance(cpu, Mapping) and "cores" in cpu else None


def user_last_activity(report: Mapping) -> datetime | None:
    return parse(report["server"].get("last_activity"))


def tab_open(report: Mapping) -> bool:
    """A (validated) report names a browser connected to one of its kernels or terminals."""
    return any((target.get("connections") or 0) > 0 for target in report["targets"])


# -- helpers -----------------------------------------------------------------------------------


# Where a field is: "" (the top level), "server", or ``(items, index, inside)`` for
# ``targets[2].gpu``, written out only when it is named in an error (a tuple: an object with
# an ``__init__`` cost 0.3 µs, ten a report; docs/benchmarks-history.md, "Issue 26, wave 24").
_Where = tuple[str, int, str]


def _field(where: str | _Where, key: str) -> str:
    """The field's name: ``where.key``, ``where`` alone (no key), ``key`` alone (top level)."""
    if type(where) is tuple:
        items, index, inside = where
        where = f"{items}[{index}]{inside}"
    if not key:
        return where
    return f"{where}.{key}" if where else key


def _expect(value, kind, where: str | _Where, key: str, words: str):
    if type(value) is kind or (kind is Mapping and type(value) is dict):
        return value  # JSON's own types (most): no ABC check, no bool to rule out
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ReportError(_field(where, key), f"must be {words}")
    return value


def _cpu(cpu, where: _Where) -> None:
    """``targets[].cpu``: optional; ``{"cores", "iowait", "read_mb_s", "seconds",
    "top_thread"}``, each a number or null. An older server's ``{"percent", "iowait"}`` (iowait in %) is accepted and
    ignored, so a governor upgraded first keeps taking its reports."""
    if cpu is None:
        return
    _expect(cpu, Mapping, where, "", "an object or null")
    if "cores" not in cpu and "percent" in cpu:
        return
    _bounded(cpu, _CPU_NUMBERS, where)


def _texts(obj: Mapping, keys: tuple[str, ...], where: str | _Where, limit: int = MAX_TEXT) -> None:
    """Each of ``keys``: a string of at most ``limit`` characters, or null."""
    for key in keys:
        value = obj.get(key)
        if value is None or (type(value) is str and len(value) <= limit):
            continue
        if not isinstance(value, str):
            raise ReportError(_field(where, key), "must be a string or null")
        if len(value) > limit:
            raise ReportError(
                _field(where, key), f"is {len(value)} characters long, more than {limit}"
            )


def _bounded(
    obj: Mapping, bounds: tuple[tuple[str, int, int], ...], where: str | _Where, required=False
) -> None:
    """Each ``(key, low, high)`` of ``bounds``: a finite number from ``low`` to ``high`` (not
    a bool), or null unless ``required``."""
    for key, low, high in bounds:
        value = obj.get(key)
        if value is None:
            if required:
                raise ReportError(_field(where, key), "is required")
            continue
        kind = type(value)
        if kind is float:  # what JSON decodes to first: no bool or odd subclass to rule out
            finite = isfinite(value)
        elif kind is int:
            finite = _finite(value)
        else:
            finite = (
                not isinstance(value, bool) and isinstance(value, int | float) and _finite(value)
            )
        if not finite:
            raise ReportError(_field(where, key), "must be a number or null")
        if value < low or value > high:
            raise ReportError(_field(where, key), f"must be in [{low}, {high}], got {value}")


def _numbers(obj: Mapping, key: str, where: _Where, words: str, whole: bool = False) -> None:
    """A list of process IDs (``whole``: integers up to ``MAX_COUNT``) or of shares (0 to 1,
    or null); absent or null is none. How many is bounded by the report's size."""
    values = obj.get(key)
    if values is None:
        return
    if type(values) is list:  # loops, not all(): every report has a dozen of these
        if whole:
            for v in values:
                if type(v) is not int or not 0 <= v <= MAX_COUNT:
                    break
            else:
                return
        else:
            for v in values:
                if v is not None and (type(v) not in _SHARE_TYPES or not 0 <= v <= 1):
                    break
            else:
                return
    raise ReportError(_field(where, key), f"must be a list of {words}")


_SHARE_TYPES = (float, int)  # JSON's (a bool is neither)


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float (JSON allows 10**400)
        return False


def _times(
    obj: Mapping,
    keys: tuple[str, ...],
    where: str | _Where,
    earliest: datetime | None,
    latest: datetime,
    parsed: dict[str, datetime],
    required: bool = False,
) -> datetime | None:
    """Each of ``keys``: an ISO 8601 time from ``earliest`` (none: any) to ``latest``, or null
    unless ``required``; the last one's time. ``parsed``: the report's times read so far, by
    their text (a report sends the same time in several fields)."""
    when = None
    for key in keys:
        value = obj.get(key)
        if value is None:
            if required:
                raise ReportError(_field(where, key), "is required")
            when = None
            continue
        when = parsed.get(value) if type(value) is str else None
        if when is None:
            try:
                if not isinstance(value, str) or len(value) > 64:
                    raise ValueError
                when = parsed[value] = parse(value)
            except (ValueError, OverflowError):
                raise ReportError(
                    _field(where, key), f"must be an ISO 8601 time, got {value!r:.80}"
                ) from None
        if when > latest:
            raise ReportError(
                _field(where, key), f"{value} is in the future (the governor's clock is earlier)"
            )
        if earliest is not None and when < earliest:
            raise ReportError(_field(where, key), f"{value} is before the server started")
    return when


def _uuids(values: list) -> bool:
    """Every value a string of at most ``MAX_TEXT`` characters (a loop, not all(): a generator
    a target)."""
    for value in values:  # noqa: SIM110
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            return False
    return True


def _list(obj: Mapping, key: str, limit: int) -> list:
    value = _expect(obj.get(key), list, "", key, "a list")
    if len(value) > limit:
        raise ReportError(key, f"has {len(value)} entries, more than {limit}")
    return value
