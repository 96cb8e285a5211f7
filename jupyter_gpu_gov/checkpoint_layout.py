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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .core import clock
from .core.vocabulary import CHECKPOINT_DONE, CHECKPOINT_FAILED, CHECKPOINT_TIMEOUT

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

_ID = re.compile(r"^(\d{8}T\d{6}Z)(?:-([1-9]\d*))?$")
_MAX_SUFFIX = 10_000  # ids taken within one second before giving up


def is_checkpoint_id(value: object) -> bool:
    return isinstance(value, str) and bool(_ID.match(value))


def id_key(checkpoint_id: str) -> tuple[str, int]:
    """Sort key: by time, then by suffix as a number (``-10`` after ``-9``); not an id: first."""
    m = _ID.match(checkpoint_id)
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
