"""Put simulated GPU memory and load on a simulated device, from any process.

Kernels, terminal scripts and threads call this API; ``gpu.simulated.SimulatedBackend`` samples
the result. Everything lives in one JSON state file (``state_path()``) so every process of a
server, and its sampler, see the same simulated GPUs. This module imports only the standard
library because it is imported inside user kernels. POSIX only (``fcntl``).

State file format (``"format": 1``)::

    {"format": 1,
     "error": null,                      # set by fail(error): the backend reports "unavailable"
     "faults": {                         # set by fail(xid=…, …), per physical GPU, until heal()
       "GPU-…": {"xids": [79], "lost": true, "ecc": 0, "remap": null, "retired_pages": false,
                 "throttle": null}},
     "devices": [                        # leaf devices, written by SimulatedBackend
       {"index": 0, "uuid": "GPU-…", "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559,
        "mig_profile": null, "parent_uuid": null, "minor_number": null,
        "reports_activity": true}],
     "processes": [                      # one entry per (pid, device)
       {"pid": 4242, "started": "123456", "device": "GPU-…", "memory_mb": 4096,
        "loads": [{"sm": 0.8, "until": 1712345678.5}]}]}   # until: epoch seconds or null

``started`` is the process start time from ``/proc/<pid>/stat`` ("" where there is no /proc), so
a reused PID does not inherit a dead process's memory.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import operator
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "SimulatedStateError",
    "devices",
    "fail",
    "heal",
    "hold",
    "load",
    "recover",
    "release",
    "state_path",
]

STATE_ENV = "JUPYTER_GPU_GOV_SIM_STATE"
REMAP = ("pending", "failure")  # fail(remap=…): rows wait to be remapped, or remapping failed
THROTTLE = ("thermal", "power", "slowdown")  # fail(throttle=…): why the clocks are slowed
XID_LOST = 79  # "the GPU fell off the bus": the driver cannot reach it afterwards
STATE_FORMAT = 1
_STATE_NAME = "jupyter-gpu-gov-sim.json"
_HAS_PROC = os.path.exists("/proc/self/stat")

DeviceArg = int | str | None


class SimulatedStateError(RuntimeError):
    """The simulated GPU state file is missing or unreadable."""


# --- where the state lives ----------------------------------------------------------------------


def _envset(name: str) -> bool:
    # jupyter_core.paths.envset
    return os.environ.get(name, "no").lower() not in ("no", "n", "false", "off", "0", "0.0")


def _jupyter_runtime_dir() -> str:
    """``jupyter_core.paths.jupyter_runtime_dir()``, mirrored so kernels need not import it."""
    env = os.environ
    if env.get("JUPYTER_RUNTIME_DIR"):
        return env["JUPYTER_RUNTIME_DIR"]
    if env.get("JUPYTER_DATA_DIR"):
        return os.path.join(env["JUPYTER_DATA_DIR"], "runtime")
    if _envset("JUPYTER_PLATFORM_DIRS"):
        # platformdirs.user_data_dir("jupyter", appauthor=False)
        home = os.path.expanduser("~")
        if sys.platform == "darwin":
            data = os.path.join(home, "Library", "Application Support")
        else:
            data = env.get("XDG_DATA_HOME", "").strip() or os.path.join(home, ".local", "share")
    else:
        home = str(Path("~").expanduser().resolve())
        if sys.platform == "darwin":
            return os.path.join(home, "Library", "Jupyter", "runtime")
        data = env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return os.path.join(data, "jupyter", "runtime")


def state_path() -> str:
    """The state file: ``$JUPYTER_GPU_GOV_SIM_STATE``, else in the Jupyter runtime dir."""
    return os.environ.get(STATE_ENV) or os.path.join(_jupyter_runtime_dir(), _STATE_NAME)


# --- file format, shared with gpu/simulated.py ---------------------------------------------------


def _empty_state() -> dict[str, Any]:
    return {"format": STATE_FORMAT, "error": None, "faults": {}, "devices": [], "processes": []}


def _read_state(path: str, missing_ok: bool = False) -> dict[str, Any]:
    """Parse the state file; raise SimulatedStateError naming the file if it is unusable."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if missing_ok:
            return _empty_state()
        raise SimulatedStateError(f"simulated GPU state file {path} does not exist") from None
    except OSError as e:
        raise SimulatedStateError(f"cannot read simulated GPU state file {path}: {e}") from e
    try:
        state = json.loads(text)
    except ValueError as e:
        raise SimulatedStateError(f"simulated GPU state file {path} is not JSON: {e}") from e
    if not (
        isinstance(state, dict)
        and state.get("format") == STATE_FORMAT
        and isinstance(state.get("devices"), list)
        and isinstance(state.get("processes"), list)
    ):
        raise SimulatedStateError(
            f"simulated GPU state file {path} is not in format {STATE_FORMAT} "
            "(delete it; the server's SimulatedBackend rewrites it on start)"
        )
    return state


def _write_state(path: str, state: dict[str, Any]) -> None:
    # Readers never take the lock: they must only ever see a complete file.
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, path)


@contextmanager
def _edit_state(path: str | None = None, reset: bool = False) -> Iterator[dict[str, Any]]:
    """Read-modify-write the state under an exclusive lock; the edit is saved on normal exit.

    ``reset`` starts from an empty state instead of reading (to replace a corrupt file).
    """
    path = path or state_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    # A sibling lock file, because the state file itself is replaced on every write.
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _empty_state() if reset else _read_state(path, missing_ok=True)
        _prune(state, time.time())
        yield state
        _write_state(path, state)
    finally:
        os.close(lock)  # releases the flock


def _process_started(pid: int) -> str | None:
    """An identity for a running process (its start time), "" if unknown, None if it is gone."""
    if _HAS_PROC:
        try:  # raw reads: the simulated backend asks this of every process at every sample
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
            try:
                fields = os.read(fd, 4096).rsplit(b")", 1)[1].split()
            finally:
                os.close(fd)
        except (OSError, IndexError):
            return None
        # A zombie has exited: like a real GPU, the driver has already freed its memory.
        return None if fields[0] == b"Z" else fields[19].decode()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by someone else
    return ""


def _alive(entry: dict[str, Any]) -> bool:
    pid = entry["pid"]
    if not isinstance(pid, int) or pid <= 0:  # kill(0 or -1) would address a process group
        return False
    started = _process_started(pid)
    return started is not None and (not entry.get("started") or started == entry["started"])


def _active_loads(entry: dict[str, Any], now: float) -> list[dict[str, Any]]:
    return [x for x in entry["loads"] if x["until"] is None or x["until"] > now]


def _prune(state: dict[str, Any], now: float) -> None:
    """Forget dead processes and expired loads, so the file stays small."""
    kept = []
    for entry in state["processes"]:
        if _alive(entry):
            entry["loads"] = _active_loads(entry, now)
            kept.append(entry)
    state["processes"] = kept


# --- the API ------------------------------------------------------------------------------------


def _resolve(state: dict[str, Any], device: DeviceArg) -> dict[str, Any]:
    """The leaf a ``device`` argument names, as CUDA would pick it."""
    leaves = state["devices"]
    hint = "" if leaves else f" (no simulated devices in {state_path()}: start a SimulatedBackend)"
    if device is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            if not leaves:
                raise ValueError(f"device 0 is not a simulated GPU{hint}")
            return leaves[0]
        first = visible.split(",")[0].strip()
        if not first:
            raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} makes no device visible")
        device = int(first) if first.lstrip("-").isdigit() else first
    if isinstance(device, bool) or not isinstance(device, int | str):
        raise ValueError(f"device must be a leaf index, a UUID or None, got {device!r}")
    if isinstance(device, int):
        if 0 <= device < len(leaves):
            return leaves[device]
        raise ValueError(
            f"device {device} is not a simulated GPU index (0..{len(leaves) - 1}){hint}"
        )
    for leaf in leaves:
        if leaf["uuid"] == device:
            return leaf
    raise ValueError(f"device {device!r} is not a simulated GPU UUID{hint}")


def _own_entry(state: dict[str, Any], uuid: str) -> dict[str, Any]:
    pid = os.getpid()
    for entry in state["processes"]:
        if entry["pid"] == pid and entry["device"] == uuid:
            return entry
    entry = {
        "pid": pid,
        "started": _process_started(pid) or "",
        "device": uuid,
        "memory_mb": 0,
        "loads": [],
    }
    state["processes"].append(entry)
    return entry


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def hold(memory_mb: int, device: DeviceArg = None) -> int:
    """Add ``memory_mb`` to what this process holds on ``device``; return the new total (MB).

    ``device``: None (the first of ``$CUDA_VISIBLE_DEVICES``, else leaf 0), a leaf index or a UUID.
    """
    try:
        mb = -1 if isinstance(memory_mb, bool) else operator.index(memory_mb)  # numpy ints too
    except TypeError:
        mb = -1
    if mb < 0:
        raise ValueError(f"memory_mb must be an integer number of MB >= 0, got {memory_mb!r}")
    with _edit_state() as state:
        entry = _own_entry(state, _resolve(state, device)["uuid"])
        entry["memory_mb"] += mb
        return entry["memory_mb"]


def load(sm: float, seconds: float | None = None, device: DeviceArg = None) -> float:
    """Add activity ``sm`` (0..1) from this process until released, or for ``seconds``.

    Returns this process's total activity on the device (capped at 1).
    """
    if not _is_number(sm) or not 0 <= sm <= 1:
        raise ValueError(f"sm must be between 0 and 1, got {sm!r}")
    if seconds is not None and (not _is_number(seconds) or seconds <= 0):
        raise ValueError(f"seconds must be a positive number or None, got {seconds!r}")
    with _edit_state() as state:
        entry = _own_entry(state, _resolve(state, device)["uuid"])
        until = None if seconds is None else time.time() + seconds
        entry["loads"].append({"sm": float(sm), "until": until})
        return min(1.0, sum(x["sm"] for x in entry["loads"]))


def release(device: DeviceArg = None) -> None:
    """Drop this process's memory and load: on ``device``, or on every device when None."""
    pid = os.getpid()
    with _edit_state() as state:
        uuid = None if device is None else _resolve(state, device)["uuid"]
        state["processes"] = [
            e
            for e in state["processes"]
            if not (e["pid"] == pid and (uuid is None or e["device"] == uuid))
        ]


def devices() -> list[dict[str, Any]]:
    """The leaf devices in the state, in index order (empty before a backend has started)."""
    return _read_state(state_path(), missing_ok=True)["devices"]


def fail(
    error: str | None = None,
    *,
    xid: int | None = None,
    ecc: int = 0,
    remap: str | None = None,
    retired_pages: bool = False,
    throttle: str | None = None,
    lost: bool = False,
    device: DeviceArg = None,
) -> None:
    """Inject a fault, as a GPU or its driver would have it, until ``heal()``.

    ``fail("why")`` alone: the driver is down, the backend reports ``unavailable`` with that
    error (``recover()`` or ``heal()`` undo it). Otherwise a fault of one physical GPU (the one
    ``device`` names, as in ``hold``; a MIG instance stands for its GPU):

    - ``xid=79``: the driver reports XID 79 (the GPU is then lost from the bus, as for real);
      any other XID is only reported (``xid=48`` a double-bit ECC error, ``xid=13`` an
      application error);
    - ``ecc=2``: two more uncorrectable (double-bit) volatile ECC errors;
    - ``remap="pending"`` or ``"failure"``: memory rows wait to be remapped, or remapping failed;
    - ``retired_pages=True``: memory pages wait to be retired (GPUs before Ampere);
    - ``throttle="thermal"``, ``"power"`` or ``"slowdown"``: the clocks are slowed;
    - ``lost=True``: the GPU fell off the bus without an XID.
    """
    faults = {
        "xid": xid,
        "ecc": ecc,
        "remap": remap,
        "retired_pages": retired_pages,
        "throttle": throttle,
        "lost": lost,
    }
    injected = [k for k, v in faults.items() if v not in (None, 0, False)]
    if error is not None:
        if not isinstance(error, str) or not error:
            raise ValueError(f"error must be a non-empty string, got {error!r}")
        if injected or device is not None:
            raise ValueError("fail(error) stops the whole driver; give a GPU fault alone")
        with _edit_state() as state:
            state["error"] = error
        return
    if not injected:
        raise ValueError(
            "fail() needs a fault: error, xid, ecc, remap, retired_pages, throttle or lost"
        )
    if xid is not None and (
        isinstance(xid, bool) or not isinstance(xid, int) or not 0 < xid < 1000
    ):
        raise ValueError(f"xid must be an XID number (1..999), got {xid!r}")
    if isinstance(ecc, bool) or not isinstance(ecc, int) or ecc < 0:
        raise ValueError(f"ecc must be a number of errors >= 0, got {ecc!r}")
    if remap not in (None, *REMAP):
        raise ValueError(f"remap must be one of {', '.join(REMAP)}, got {remap!r}")
    if throttle not in (None, *THROTTLE):
        raise ValueError(f"throttle must be one of {', '.join(THROTTLE)}, got {throttle!r}")
    for key in ("retired_pages", "lost"):
        if not isinstance(faults[key], bool):
            raise ValueError(f"{key} must be true or false, got {faults[key]!r}")
    with _edit_state() as state:
        leaf = _resolve(state, device)
        gpu = state.setdefault("faults", {}).setdefault(leaf["parent_uuid"] or leaf["uuid"], {})
        if xid is not None:
            gpu["xids"] = [*gpu.get("xids", []), xid]
        gpu["ecc"] = gpu.get("ecc", 0) + ecc
        gpu["lost"] = gpu.get("lost", False) or lost or xid == XID_LOST
        gpu["retired_pages"] = gpu.get("retired_pages", False) or retired_pages
        for key, value in (("remap", remap), ("throttle", throttle)):
            if value is not None:
                gpu[key] = value


def heal(device: DeviceArg = None) -> None:
    """Undo ``fail()``: the faults of ``device``'s GPU; with no ``device``, every fault and a
    stopped driver (as a GPU reset, or a reboot, would)."""
    with _edit_state() as state:
        if device is None:
            state["faults"], state["error"] = {}, None
            return
        leaf = _resolve(state, device)
        state.setdefault("faults", {}).pop(leaf["parent_uuid"] or leaf["uuid"], None)


def recover() -> None:
    """Undo ``fail(error)``: the simulated backend reports its devices again."""
    with _edit_state() as state:
        state["error"] = None


# --- CLI ----------------------------------------------------------------------------------------


def _device_arg(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def _fraction(value: str) -> float:
    try:
        sm = float(value)
    except ValueError:
        sm = math.nan
    if not 0 <= sm <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return sm


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_gpu_gov.simulate",
        description="Drive the simulated GPUs of jupyter-gpu-gov "
        f"(state file: ${STATE_ENV}, default in the Jupyter runtime dir).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    h = sub.add_parser(
        "hold",
        help="hold GPU memory (and load) from this process until killed",
        description="Hold MEMORY_MB on a simulated GPU from this process and sleep until "
        "killed (SIGTERM/Ctrl-C release it) or until --for SECONDS have passed.",
    )
    h.add_argument("memory_mb", type=int, metavar="MEMORY_MB", help="memory to hold, in MB")
    h.add_argument("--load", type=_fraction, metavar="SM", help="also add activity SM (0..1)")
    h.add_argument(
        "--device",
        type=_device_arg,
        metavar="X",
        help="leaf index or UUID (default: first of $CUDA_VISIBLE_DEVICES, else 0)",
    )
    h.add_argument(
        "--for",
        dest="seconds",
        type=float,
        metavar="SECONDS",
        help="release and exit after SECONDS (default: hold until killed)",
    )
    sub.add_parser("devices", help="print the simulated leaf devices as JSON")
    f = sub.add_parser(
        "fail",
        help="inject a GPU fault (or stop the driver)",
        description="Inject a fault into one simulated GPU (--xid, --ecc, --remap, "
        "--retired-pages, --throttle, --lost), or with ERROR alone make every GPU unavailable.",
    )
    f.add_argument("error", nargs="?", help="stop the driver with this error")
    f.add_argument("--xid", type=int, help="report this XID (79: the GPU falls off the bus)")
    f.add_argument("--ecc", type=int, default=0, help="add this many double-bit ECC errors")
    f.add_argument("--remap", choices=REMAP, help="memory rows pending remapping, or failed")
    f.add_argument("--retired-pages", action="store_true", help="pages pending retirement")
    f.add_argument("--throttle", choices=THROTTLE, help="slow the clocks for this reason")
    f.add_argument("--lost", action="store_true", help="the GPU falls off the bus")
    f.add_argument("--device", type=_device_arg, metavar="X", help="leaf index or UUID")
    h2 = sub.add_parser("heal", help="undo fail(): every fault, or the one GPU's")
    h2.add_argument("--device", type=_device_arg, metavar="X", help="leaf index or UUID")
    sub.add_parser("recover", help="make the simulated GPUs available again")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "devices":
        print(json.dumps(devices(), indent=1))
    elif args.command == "fail":
        faults = {
            key: getattr(args, key)
            for key in ("xid", "ecc", "remap", "retired_pages", "throttle", "lost", "device")
        }
        try:
            fail(args.error, **faults)
        except (ValueError, SimulatedStateError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    elif args.command == "heal":
        heal(args.device)
    elif args.command == "recover":
        recover()
    else:
        return _hold_until_killed(args.memory_mb, args.load, args.device, args.seconds)
    return 0


def _hold_until_killed(
    memory_mb: int, sm: float | None, device: int | str | None, seconds: float | None
) -> int:
    # SIGTERM (kill, a terminal closed by Jupyter) unwinds through `finally` like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uuid = _resolve(_read_state(state_path(), missing_ok=True), device)["uuid"]
        total = hold(memory_mb, uuid)
        if sm is not None:
            load(sm, device=uuid)
        print(
            f"pid {os.getpid()} holds {total} MB"
            + (f" and load {sm}" if sm is not None else "")
            + f" on {uuid}; Ctrl-C releases it",
            flush=True,
        )
        if seconds is not None:
            time.sleep(seconds)
        else:
            while True:
                time.sleep(3600)
    except (ValueError, SimulatedStateError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    finally:
        release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
