"""The checkpoint folder, defined once for the two sides that write it.

The server (``server/checkpoint.py``) and the kernels (``checkpoint.py``, imported inside users'
kernels, so this module imports only the standard library and the pure core) write the same
folders, and ``checkpoint.restore()`` reads them. One checkpoint is ``<root>/<id>/``::

    manifest.json                      written when the checkpoint ends (MANIFEST)
    kernels/<kernel id>/hooks.json     written by the kernel (HOOKS_FILE)
    kernels/<kernel id>/<hook>/...     each hook's files (a torch hook: state.pt)
    terminals/<name>.txt               terminal scrollback, written by the server

``<id>`` is the UTC time the checkpoint began, ``YYYYMMDDTHHMMSSZ``, with ``-2``, ``-3``, ...
when taken; ``<root>`` is ``$JUPYTER_GPU_GOV_CHECKPOINT_DIR`` (the server's ``checkpoint_dir``).
The formats are in docs/api.md ("What a checkpoint does").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .core import clock
from .core.vocabulary import CHECKPOINT_DONE, CHECKPOINT_FAILED, CHECKPOINT_TIMEOUT
from .core.wire import MAX_TEXT

ROOT_ENV = "JUPYTER_GPU_GOV_CHECKPOINT_DIR"
DEFAULT_ROOT = "~/.jupyter-gpu-gov/checkpoints"
FORMAT = 1  # the manifest's "format"
MANIFEST = "manifest.json"
HOOKS_FILE = "hooks.json"
KERNELS_DIR = "kernels"
TERMINALS_DIR = "terminals"
TORCH_FILE = "state.pt"
RESTORE_HINT = "from jupyter_gpu_gov import checkpoint; checkpoint.restore()"

# Statuses: a manifest's and a hook's are RUNNING, then DONE or FAILED; a kernel's entry in the
# manifest is DONE, FAILED, TIMEOUT (its hooks ran past the server's timeout) or NO_HOOKS.
RUNNING = "running"
DONE = CHECKPOINT_DONE
FAILED = CHECKPOINT_FAILED
TIMEOUT = CHECKPOINT_TIMEOUT
NO_HOOKS = "no-hooks"

# Who asked for a checkpoint (a manifest's "source").
SOURCE_GOVERNOR = "governor"
SOURCE_FRONTEND = "frontend"
SOURCE_USER = "user"
SOURCES = (SOURCE_USER, SOURCE_FRONTEND, SOURCE_GOVERNOR)

# The governor refuses a report over 256 KiB (hub/routes.py). A manifest lists every file of
# every hook and each error whole: a hook that copies a folder of thousands of files, or fails
# with a long message, made every later report a 413, so the governor never heard that the
# checkpoint ended, nor anything else. A report carries at most this much of it, and the
# governor keeps (in its store, audit trail and API) at most this much of what a server sent.
MANIFEST_REPORTED_BYTES = 64 * 1024

# A manifest's fields that are one value each (docs/api.md, "The manifest"), what an abridged
# one keeps of them, and how many of its errors and notebooks.
SCALAR_FIELDS = (
    "format",
    "id",
    "path",
    "reason",
    "cull_reason",
    "source",
    "requested_at",
    "completed_at",
    "status",
    "saved_by_frontend_first",
    "bytes",
    "dry_run",
    "error",
    "abridged",
)
ABRIDGED_ERRORS = 10
ABRIDGED_NOTEBOOKS = 20


def abridged(manifest: Mapping, max_bytes: int) -> Mapping:
    """The manifest itself when its JSON is at most ``max_bytes``; else its one-value fields
    (each text at most ``MAX_TEXT``), its first errors and notebooks, and ``"abridged"``, which
    says where the whole one is. The server sends a report within the governor's size so; the
    governor keeps what a server sent within its own."""
    if len(json.dumps(manifest, default=str)) <= max_bytes:
        return manifest
    errors = manifest.get("errors")
    errors = [str(e) for e in errors] if isinstance(errors, list | tuple) else []
    notebooks = manifest.get("notebooks")
    notebooks = notebooks if isinstance(notebooks, list | tuple) else []
    short = {
        k: _clip(manifest[k]) for k in SCALAR_FIELDS if k in manifest and _is_scalar(manifest[k])
    }
    short["errors"] = [_clip(e) for e in errors[:ABRIDGED_ERRORS]]
    if len(errors) > ABRIDGED_ERRORS:
        short["errors"].append(f"and {len(errors) - ABRIDGED_ERRORS} more error(s) in the manifest")
    short["notebooks"] = [
        {"path": _clip(n.get("path")), "checkpoint_id": _clip(n.get("checkpoint_id"))}
        for n in notebooks[:ABRIDGED_NOTEBOOKS]
        if isinstance(n, Mapping)
    ]
    path = manifest.get("path")
    where = f"{_clip(path)}/{MANIFEST}" if isinstance(path, str) and path else "the server's status"
    short.setdefault("abridged", _clip(f"the whole manifest is in {where}"))
    return short


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _clip(value):
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[: MAX_TEXT - 1] + "…"
    return value


# fullmatch, ASCII digits: "$" also matched before a final newline, "\d" any script's digits
_ID = re.compile(r"([0-9]{8}T[0-9]{6}Z)(?:-([1-9][0-9]*))?")
_MAX_SUFFIX = 10_000  # ids taken within one second before giving up


def is_checkpoint_id(value: object) -> bool:
    return isinstance(value, str) and bool(_ID.fullmatch(value))


def id_key(checkpoint_id: str) -> tuple[str, int]:
    """Sort key: by time, then by suffix as a number (``-10`` after ``-9``); not an id: first."""
    m = _ID.fullmatch(checkpoint_id)
    return (m.group(1), int(m.group(2) or 1)) if m else ("", 0)


def root_dir() -> Path:
    """Where checkpoints live: ``$JUPYTER_GPU_GOV_CHECKPOINT_DIR``, set by the server."""
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT).expanduser()


def new_checkpoint_dir(root: Path) -> tuple[str, Path]:
    """Create ``<root>/<id>/``, readable by its owner only, and answer (id, path); ``mkdir`` is
    the lock between concurrent writers (several servers or kernels of one user)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = clock.utcnow().strftime("%Y%m%dT%H%M%SZ")
    for n in range(1, _MAX_SUFFIX):
        checkpoint_id = stamp if n == 1 else f"{stamp}-{n}"
        path = root / checkpoint_id
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return checkpoint_id, path
    raise FileExistsError(f"{root} already holds {_MAX_SUFFIX - 1} checkpoints named {stamp}")


def kernel_dir(checkpoint: Path, kernel_id: str) -> Path:
    return checkpoint / KERNELS_DIR / kernel_id


def write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    """Write through a temporary file, so that a reader never sees a truncated file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict) -> None:
    """A manifest or hooks.json, whole or not at all."""
    text = (json.dumps(data, indent=1, default=str) + "\n").encode()
    write_atomic(path, lambda f: f.write(text))


def read_json(path: Path) -> dict | None:
    """A JSON object from a file; None when it is absent, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def notebook_paths(manifest: dict) -> list[str]:
    """The paths of the notebooks a manifest says it checkpointed, as far as it reads: a
    manifest is a file in the user's folder (edited, or cut short by a full disk)."""
    notebooks = manifest.get("notebooks")
    return [
        n["path"]
        for n in (notebooks if isinstance(notebooks, list) else ())
        if isinstance(n, dict) and isinstance(n.get("path"), str)
    ]
