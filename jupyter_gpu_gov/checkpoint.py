"""Save what a notebook needs before its GPU is taken back, and get it back after a restart.

    from jupyter_gpu_gov import checkpoint
    checkpoint.save_variables("results", "config")       # pickled at every checkpoint
    checkpoint.save_torch(model, optimizer)              # their state_dicts (torch.save)
    @checkpoint.register                                 # anything else: write files into directory
    def tokenizer(directory): tok.save_pretrained(directory)
    # ... after the restart, in the same notebook:
    saved = checkpoint.restore()      # {"results": ..., "config": ..., "torch": {...}, "tokenizer": Path}
    model.load_state_dict(saved["torch"]["model"]); optimizer.load_state_dict(saved["torch"]["optimizer"])
    %gpu_checkpoint save results config | torch model optimizer | now | restore | list | help

Before the governor culls an idle GPU, the server runs every registered hook of the kernel
(``_run_hooks``) into ``<root>/<id>/kernels/<kernel id>/<hook name>/``; ``<root>`` is
``$JUPYTER_GPU_GOV_CHECKPOINT_DIR`` (default ``~/.jupyter-gpu-gov/checkpoints``). Registering a
hook under a name already taken replaces it (re-running a cell), except that ``save_variables``
adds its names to the variables already registered. Hooks keep references to the objects they
save: ``unregister`` a ``save_torch`` hook before deleting a model to free its GPU memory.

This module imports only the standard library (it is imported inside user kernels); torch and
IPython are imported when used. The folder's layout is ``checkpoint_layout`` (shared with the
server); the file formats are in docs/api.md ("What a checkpoint does").
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint_layout import (
    DONE,
    FAILED,
    FORMAT,
    HOOKS_FILE,
    KERNELS_DIR,
    MANIFEST,
    ROOT_ENV,
    RUNNING,
    SOURCE_USER,
    TORCH_FILE,
    id_key,
    is_checkpoint_id,
    kernel_dir,
    new_checkpoint_dir,
    notebook_paths,
    read_json,
    root_dir,
    write_atomic,
    write_json,
)
from .core import clock

__all__ = [
    "Restored",
    "hooks",
    "load_ipython_extension",
    "register",
    "restore",
    "save_torch",
    "save_variables",
    "unregister",
]

_HOOK_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # one safe directory name


# --- registering hooks ---------------------------------------------------------------------------


@dataclass
class _Hook:
    name: str
    kind: str  # "variables" | "torch" | "function"
    fn: Callable[[Path], Any] | None = None  # function
    variables: list[str] = field(default_factory=list)  # variables: the names to pickle
    namespace: dict | None = None  # variables: where they live (read when the hook runs)
    sources: dict[str, Callable[[], Any]] = field(default_factory=dict)  # torch: key -> object

    def run(self, directory: Path) -> Any:
        if self.kind == "variables":
            return _pickle_variables(directory, self.variables, self.namespace)
        if self.kind == "torch":
            return _torch_save(directory, self.sources)
        return self.fn(directory)


_HOOKS: dict[str, _Hook] = {}


def _check_hook_name(name: object) -> str:
    if not isinstance(name, str) or not _HOOK_NAME.fullmatch(name) or name == HOOKS_FILE:
        raise ValueError(
            f"hook name {name!r} cannot be a directory name: pass name='...' "
            "(letters, digits, '_', '.', '-')"
        )
    return name


def register(fn: Callable[[Path], Any] | None = None, *, name: str | None = None):
    """Run ``fn(directory)`` at every checkpoint; it writes its files into ``directory``.

    Use as ``@register``, ``@register(name="x")`` or ``register(fn)``. What ``fn`` returns (a
    JSON-able note, or None) is recorded in hooks.json. ``restore()`` gives back the directory.
    """
    if fn is None:
        return lambda f: register(f, name=name)
    if not callable(fn):
        raise TypeError(f"register() needs a function of one argument (a directory), got {fn!r}")
    hook_name = _check_hook_name(name if name is not None else getattr(fn, "__name__", None))
    _HOOKS[hook_name] = _Hook(hook_name, "function", fn=fn)
    return fn


def save_variables(*names: str, name: str = "variables", namespace: dict | None = None) -> None:
    """Pickle these variables (one file each) at every checkpoint; ``restore()`` returns them.

    ``namespace`` defaults to the notebook's (IPython's user namespace), read at checkpoint time,
    so the values saved are the current ones. Each variable is pickled on its own: one that
    cannot be pickled fails the hook (naming it) without losing the others.
    """
    if not names:
        raise ValueError("save_variables() needs at least one variable name")
    for var in names:
        if not isinstance(var, str) or not var.isidentifier():
            raise ValueError(f"save_variables() takes variable names as strings, got {var!r}")
    ns = _namespace(namespace)
    missing = [var for var in names if var not in ns]
    if missing:  # most likely a typo: say so now rather than at the cull
        raise NameError(
            f"save_variables(): {', '.join(map(repr, missing))} "
            f"{'is' if len(missing) == 1 else 'are'} not defined in the notebook namespace"
        )
    _check_hook_name(name)
    old = _HOOKS.get(name)
    if old is not None and old.kind == "variables" and old.namespace is ns:
        names = tuple(old.variables) + tuple(v for v in names if v not in old.variables)
    _HOOKS[name] = _Hook(name, "variables", variables=list(dict.fromkeys(names)), namespace=ns)


def save_torch(model=None, optimizer=None, *, name: str = "torch", **objects: Any) -> None:
    """Save ``model`` and ``optimizer`` (their ``state_dict()``) at every checkpoint.

    More objects by keyword (a scheduler, a GradScaler, a step count): their ``state_dict()``
    when they have one, else the object itself. All go into one ``torch.save`` file;
    ``restore()[name]`` is that dict, e.g. ``{"model": ..., "optimizer": ..., "scheduler": ...}``.
    """
    given = {"model": model, "optimizer": optimizer}
    sources = {k: (lambda v=v: v) for k, v in given.items() if v is not None}
    sources.update({k: (lambda v=v: v) for k, v in objects.items()})
    if not sources:
        raise ValueError("save_torch() needs a model, an optimizer or other objects to save")
    _register_torch(sources, _check_hook_name(name))


def _register_torch(sources: dict[str, Callable[[], Any]], name: str) -> None:
    _HOOKS[name] = _Hook(name, "torch", sources=sources)


def unregister(name: str) -> None:
    """Stop saving the hook ``name`` (see ``hooks()``)."""
    if name not in _HOOKS:
        raise KeyError(f"no checkpoint hook named {name!r} (registered: {_names_or_none()})")
    del _HOOKS[name]


def hooks() -> list[str]:
    """The names of the registered hooks, in the order they run."""
    return list(_HOOKS)


def _names_or_none() -> str:
    return ", ".join(_HOOKS) or "none"


# --- what the built-in hooks do ------------------------------------------------------------------


def _ipython():
    # Only a running IPython has a shell; never import IPython into a plain Python process.
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def _namespace(namespace: dict | None) -> dict:
    if namespace is not None:
        return namespace
    shell = _ipython()
    if shell is not None:
        return shell.user_ns
    import __main__

    return vars(__main__)


def _pickle_variables(directory: Path, names: list[str], namespace: dict | None) -> None:
    ns = _namespace(namespace)
    problems: list[BaseException] = []
    for var in names:
        if var not in ns:
            problems.append(NameError(f"variable {var!r} is not defined in the notebook"))
            continue
        value = ns[var]
        try:
            write_atomic(directory / f"{var}.pkl", lambda f, v=value: pickle.dump(v, f, protocol=5))
        except OSError:
            raise  # the disk, not the variable: the others would fail the same way
        except Exception as e:
            problems.append(
                pickle.PicklingError(
                    f"variable {var!r} cannot be pickled ({type(e).__name__}: {e})"
                )
            )
    if problems:
        first = problems[0]
        raise type(first)("; ".join(str(p) for p in problems))


def _torch_save(directory: Path, sources: dict[str, Callable[[], Any]]) -> None:
    import torch

    state = {}
    for key, get in sources.items():
        obj = get()
        state[key] = obj.state_dict() if callable(getattr(obj, "state_dict", None)) else obj
    write_atomic(directory / TORCH_FILE, lambda f: torch.save(state, f))


# --- running the hooks (the server's entry point) ------------------------------------------------


def _jsonable(note: Any) -> Any:
    try:
        json.dumps(note)
        return note
    except (TypeError, ValueError):
        return repr(note)


def _files(directory: Path, hook_dir: Path) -> list[dict]:
    return [
        {"path": p.relative_to(directory).as_posix(), "bytes": p.stat().st_size}
        for p in sorted(hook_dir.rglob("*"))
        if p.is_file()
    ]


def _run_hooks(directory: str, reason: str) -> dict:
    """Run every registered hook into ``directory/<hook name>/``; keep ``hooks.json`` current.

    Called by the server through a silent execute request before a cull. Never raises for a
    failing hook: each is recorded ("failed", its error) and the next one runs. hooks.json is
    rewritten before and after each hook, so one that hangs is left recorded as "running".
    """
    if not _HOOKS:
        return {"hooks": []}
    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)
    record = {
        "format": FORMAT,
        "notebook": os.environ.get("JPY_SESSION_NAME") or None,
        "reason": reason,
        "started_at": clock.isoformat(clock.utcnow()),
        "completed_at": None,
        "hooks": [],
    }

    def save_record() -> None:
        # On a full disk the hooks' own errors say so: keep going and return the record.
        with contextlib.suppress(OSError):
            write_json(base / HOOKS_FILE, record)

    for hook in list(_HOOKS.values()):
        entry = {"name": hook.name, "kind": hook.kind, "status": RUNNING, "files": []}
        entry.update(bytes=0, seconds=None, error=None, note=None)
        record["hooks"].append(entry)
        save_record()
        started = time.monotonic()
        hook_dir = base / hook.name
        try:
            hook_dir.mkdir(exist_ok=True)
            entry["note"] = _jsonable(hook.run(hook_dir))
            entry["status"] = DONE
        except Exception as e:  # not KeyboardInterrupt: the server interrupts a hung hook
            entry["status"] = FAILED
            entry["error"] = f"{type(e).__name__}: {e}"
        entry["seconds"] = round(time.monotonic() - started, 3)
        if hook_dir.is_dir():
            entry["files"] = _files(base, hook_dir)
            entry["bytes"] = sum(f["bytes"] for f in entry["files"])
    record["completed_at"] = clock.isoformat(clock.utcnow())
    save_record()
    return record


# --- finding and restoring a checkpoint ----------------------------------------------------------


class Restored(dict):
    """What ``restore()`` found: variables by name, torch hooks by hook name (their dict),
    function hooks by hook name (their directory). Attributes: ``path`` (the checkpoint
    directory), ``id``, ``manifest`` (the server's manifest.json, None if absent),
    ``notebook`` (the notebook that saved it), ``errors`` (what could not be loaded)."""

    def __init__(self, *args, path=None, id=None, manifest=None, notebook=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.path: Path | None = path
        self.id: str | None = id
        self.manifest: dict | None = manifest
        self.notebook: str | None = notebook
        self.errors: list[str] = []

    def __repr__(self) -> str:  # the values may be large tensors: show what there is
        return f"Restored(id={self.id!r}, notebook={self.notebook!r}, keys={list(self)!r})"


def _checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under root, newest first (ids sort by time, then suffix); a link
    is no checkpoint (restore follows none)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_checkpoint_id(p.name) and _real_dir(p)]
    return sorted(found, key=lambda p: id_key(p.name), reverse=True)


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _real_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _hook_name_ok(name: object) -> bool:
    return isinstance(name, str) and bool(_HOOK_NAME.fullmatch(name)) and name != HOOKS_FILE


def _kernel_records(checkpoint: Path) -> list[tuple[Path, dict]]:
    """(kernel directory, hooks.json) of the kernels in a checkpoint that saved something."""
    kernels = checkpoint / KERNELS_DIR
    out = []
    for kdir in sorted(kernels.iterdir()) if _real_dir(kernels) else []:
        if not _real_dir(kdir) or not _real_file(kdir / HOOKS_FILE):
            continue
        record = read_json(kdir / HOOKS_FILE)
        hook_list = record.get("hooks") if record else None
        # A kernel whose every hook failed before writing anything has nothing to give back.
        if isinstance(hook_list, list) and any(
            isinstance(h, dict) and (h.get("files") or h.get("status") == DONE) for h in hook_list
        ):
            out.append((kdir, record))
    # The newest kernel run first, when a checkpoint holds several.
    return sorted(out, key=lambda kr: str(kr[1].get("started_at") or ""), reverse=True)


def _pick(checkpoints: list[Path], notebook: str | None) -> tuple[Path, Path, dict] | None:
    """This notebook's newest checkpoint, else the newest one holding any hooks."""
    if notebook:
        for ck in checkpoints:
            for kdir, record in _kernel_records(ck):
                if record.get("notebook") == notebook:
                    return ck, kdir, record
    for ck in checkpoints:
        records = _kernel_records(ck)
        if records:
            return ck, *records[0]
    return None


def _resolve_checkpoint(checkpoint: str | os.PathLike, root: Path) -> Path:
    path = Path(checkpoint).expanduser()
    if path.is_dir() and (path.is_absolute() or os.sep in str(checkpoint)):
        return path
    if _real_dir(root / str(checkpoint)):
        return root / str(checkpoint)
    ids = [p.name for p in _checkpoints(root)[:5]]
    raise FileNotFoundError(
        f"no checkpoint {str(checkpoint)!r} in {root}"
        + (f" (newest: {', '.join(ids)})" if ids else " (it holds no checkpoints)")
    )


def _torch_load(path: Path) -> Any:
    import torch

    # Tensors come back on the CPU, so a checkpoint made on a GPU restores anywhere;
    # load_state_dict() copies them to the model's device.
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # weights_only=True refuses objects other than tensors and plain containers (extra
        # objects given to save_torch as-is). This file was written by the user's own kernel
        # into their own directory, trusted like the pickles of save_variables.
        return torch.load(path, map_location="cpu", weights_only=False)


def restore(
    checkpoint: str | os.PathLike | None = None,
    *,
    root: str | os.PathLike | None = None,
    into: dict | None = None,
) -> Restored:
    """Load what the hooks saved: from ``checkpoint`` (an id or a directory), else from this
    notebook's newest checkpoint, else from the newest checkpoint holding any hooks.

    ``into``: a dict (e.g. ``globals()``) that also gets the saved variables. A value that
    cannot be loaded is left out and named in ``.errors`` (and a warning).
    """
    base = Path(root).expanduser() if root is not None else root_dir()
    notebook = os.environ.get("JPY_SESSION_NAME") or None
    if checkpoint is not None:
        candidates = [_resolve_checkpoint(checkpoint, base)]
        where = str(candidates[0])
    else:
        candidates = _checkpoints(base)
        where = f"{len(candidates)} checkpoint(s) in {base}"
        if not base.is_dir():
            where = f"{base}, which does not exist (${ROOT_ENV})"
    found = _pick(candidates, notebook)
    if found is None:
        raise FileNotFoundError(
            f"nothing to restore: no kernel saved anything in {where} (looked for "
            "kernels/*/hooks.json; register hooks with save_variables, save_torch or register)"
        )
    ck, kdir, record = found
    out = Restored(path=ck, id=ck.name, notebook=record.get("notebook"))
    out.manifest = read_json(ck / MANIFEST)
    variables: dict[str, Any] = {}
    for hook in record["hooks"]:
        if not isinstance(hook, dict):
            continue
        name, kind = hook.get("name"), hook.get("kind")
        if not _hook_name_ok(name):
            # hooks.json is a file in the user's folder: a name like ../../x would read (and
            # unpickle) whatever lies there.
            out.errors.append(f"hook {name!r:.80} was not read: not a hook name")
            continue
        hook_dir = kdir / name
        if hook.get("status") != DONE:  # what it did write is still given back
            failed = "did not finish" if hook.get("status") == RUNNING else "failed"
            out.errors.append(f"hook {name!r} {failed} at the checkpoint: {hook.get('error')}")
        if hook_dir.is_symlink():
            out.errors.append(f"hook {name!r} was not read: its folder is a link")
            continue
        if not hook_dir.is_dir():
            continue
        if kind == "variables":
            for pkl in sorted(hook_dir.glob("*.pkl")):
                if not _real_file(pkl):
                    out.errors.append(f"variable {pkl.stem!r} was not read: not a plain file")
                    continue
                try:
                    with open(pkl, "rb") as f:
                        variables[pkl.stem] = out[pkl.stem] = pickle.load(f)
                except Exception as e:  # e.g. a class defined in the notebook, not yet again
                    out.errors.append(
                        f"variable {pkl.stem!r} could not be loaded: {type(e).__name__}: {e}"
                    )
        elif kind == "torch" and (hook_dir / TORCH_FILE).is_symlink():
            out.errors.append(f"hook {name!r} was not read: {TORCH_FILE} is a link")
        elif kind == "torch" and (hook_dir / TORCH_FILE).is_file():
            try:
                out[name] = _torch_load(hook_dir / TORCH_FILE)
            except Exception as e:
                out.errors.append(f"hook {name!r} could not be loaded: {type(e).__name__}: {e}")
        elif kind == "function":
            out[name] = hook_dir
    out.update(variables)  # a variable wins over a hook of the same name
    if into is not None:
        into.update(variables)
    if out.errors:
        import warnings

        warnings.warn(f"checkpoint {out.id}: " + "; ".join(out.errors), stacklevel=2)
    return out


# --- %gpu_checkpoint ------------------------------------------------------------------------------

_HELP = """\
%gpu_checkpoint save NAME [NAME...]     save these variables at every checkpoint
%gpu_checkpoint torch MODEL [OPTIMIZER] save the state_dicts of these variables
%gpu_checkpoint now                     make a checkpoint now (runs the hooks)
%gpu_checkpoint restore [ID]            put the saved variables back (newest checkpoint of this notebook)
%gpu_checkpoint list                    checkpoints, newest first
%gpu_checkpoint help                    this text
Registered hooks: {hooks}. Checkpoints live in {root}.
In Python: from jupyter_gpu_gov import checkpoint; help(checkpoint)"""


def _human(n: float | None) -> str:
    n = float(n or 0)
    unit = "B"
    for bigger in ("kB", "MB", "GB"):
        if n < 1000:
            break
        n, unit = n / 1000, bigger
    return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"


def _describe(value: Any) -> str:
    if isinstance(value, Path):
        return f"files in {value}"
    kind = type(value).__name__
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{kind} {tuple(shape)} {dtype}"
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:6])) + (", ..." if len(value) > 6 else "")
        return f"dict ({keys})"
    if hasattr(value, "__len__"):
        return f"{kind} of {len(value)}"
    return kind


def _kernel_id() -> str:
    try:  # ipykernel's connection file is kernel-<id>.json
        from ipykernel import get_connection_file

        name = os.path.basename(get_connection_file())
        if name.startswith("kernel-") and name.endswith(".json"):
            return name[len("kernel-") : -len(".json")]
    except Exception:
        pass
    return f"pid-{os.getpid()}"


def _hook_error_line(hook: dict, kernel: str, notebook: str | None) -> str:
    where = f"kernel {kernel}" + (f", notebook {notebook}" if notebook else "")
    error = hook.get("error") or ""
    disk = "full disk: " if f"[Errno {errno.ENOSPC}]" in error else ""
    return f"{disk}hook {hook['name']!r} failed ({where}): {error}"


def _checkpoint_now(reason: str = "requested with %gpu_checkpoint now") -> tuple[Path, dict]:
    """Run the hooks into a new checkpoint directory under the root; return it and hooks.json.

    Only this kernel's hooks: the notebooks and terminals are saved by the server's checkpoints.
    The manifest is a minimal one in the server's format (source "user"), so listings show it.
    """
    if not _HOOKS:
        raise RuntimeError(
            "nothing to save: no hooks are registered "
            "(save_variables, save_torch, register, or %gpu_checkpoint save NAME)"
        )
    requested = clock.isoformat(clock.utcnow())
    _, path = new_checkpoint_dir(root_dir())
    kid = _kernel_id()
    record = _run_hooks(str(kernel_dir(path, kid)), reason)
    errors = [_hook_error_line(h, kid, record["notebook"]) for h in record["hooks"] if h["error"]]
    total = sum(h["bytes"] for h in record["hooks"])
    kernel = {
        "id": kid,
        "name": None,  # the kernel does not know its kernelspec name
        "notebook": record["notebook"],
        "status": FAILED if errors else DONE,
        "hooks": record["hooks"],
        "bytes": total,
        "error": "; ".join(errors) or None,
    }
    manifest = {
        "format": FORMAT,
        "id": path.name,
        "path": str(path.resolve()),
        "reason": reason,
        "cull_reason": None,
        "source": SOURCE_USER,
        "requested_at": requested,
        "completed_at": clock.isoformat(clock.utcnow()),
        "status": FAILED if errors else DONE,
        "saved_by_frontend_first": False,
        "notebooks": [],
        "skipped": [],
        "kernels": [kernel],
        "terminals": [],
        "errors": errors,
        "bytes": total,
    }
    write_json(path / MANIFEST, manifest)
    return path, record


def _print_list(root: Path) -> None:
    checkpoints = _checkpoints(root)
    if not checkpoints:
        print(f"No checkpoints in {root}.")
        return
    picked = _pick(checkpoints, os.environ.get("JPY_SESSION_NAME") or None)
    print(f"Checkpoints in {root}, newest first (* = what restore() picks):")
    for ck in checkpoints:
        manifest = read_json(ck / MANIFEST) or {}
        records = _kernel_records(ck)
        notebooks = sorted({str(r.get("notebook")) for _, r in records if r.get("notebook")})
        notebooks += [n for n in notebook_paths(manifest) if n not in notebooks]
        mark = "*" if picked and picked[0] == ck else " "
        size = manifest.get("bytes")
        if not isinstance(size, int | float) or isinstance(size, bool):
            # Files in the user's folder, read as possibly out of shape (edited, cut short).
            size = sum(
                h["bytes"]
                for _, r in records
                for h in r["hooks"]
                if isinstance(h, dict) and isinstance(h.get("bytes"), int | float)
            )
        fields = [
            f"{mark} {ck.name}",
            str(manifest.get("source") or "-"),
            str(manifest.get("cull_reason") or manifest.get("reason") or "-"),
            str(manifest.get("status") or ("in progress?" if records else "-")),
            _human(size),
            ", ".join(notebooks) or "(no saved kernel state)",
        ]
        print("  ".join(fields))


def _help() -> str:
    return _HELP.format(hooks=_names_or_none(), root=root_dir())


def _magic_torch(names: list[str]) -> None:
    ns = _namespace(None)
    missing = [n for n in names if n not in ns]
    if missing:
        raise NameError(f"{', '.join(map(repr, missing))} not defined in the notebook namespace")

    def lookup(var: str) -> Callable[[], Any]:
        def get():  # the variable's value when the checkpoint runs, not now
            if var not in ns:
                raise NameError(f"variable {var!r} is not defined in the notebook")
            return ns[var]

        return get

    _register_torch(
        {k: lookup(v) for k, v in zip(("model", "optimizer"), names, strict=False)}, "torch"
    )


def _magic_restore(checkpoint: str | None) -> None:
    saved = restore(checkpoint, into=_namespace(None))
    where = f" (notebook {saved.notebook})" if saved.notebook else ""
    print(f"Restored from checkpoint {saved.id}{where}, {saved.path}:")
    for key, value in saved.items():
        print(f"  {key}: {_describe(value)}")
    torch_hooks = [k for k, v in saved.items() if isinstance(v, dict) and "model" in v]
    if torch_hooks:
        print(
            "  state dicts are not loaded into models: saved = checkpoint.restore(); "
            f"model.load_state_dict(saved[{torch_hooks[0]!r}]['model'])"
        )
    for error in saved.errors:
        print(f"  NOT restored: {error}")


def _gpu_checkpoint(line: str) -> None:
    """Checkpoint hooks from the notebook; `%gpu_checkpoint help` lists the subcommands."""
    from IPython.core.error import UsageError

    args = shlex.split(line)
    command, rest = (args[0], args[1:]) if args else ("help", [])
    try:
        if command == "save" and rest:
            save_variables(*rest)
            print(f"Saving {', '.join(_HOOKS['variables'].variables)} at every checkpoint.")
        elif command == "torch" and 1 <= len(rest) <= 2:
            _magic_torch(rest)
            print(f"Saving the state_dict of {' and '.join(rest)} at every checkpoint.")
        elif command == "now" and not rest:
            path, record = _checkpoint_now()
            total = sum(h["bytes"] for h in record["hooks"])
            print(f"Checkpoint {path.name} saved to {path} ({_human(total)}).")
            for h in record["hooks"]:
                if h["status"] != DONE:
                    print(f"  hook {h['name']!r} FAILED: {h['error']}")
        elif command == "restore" and len(rest) <= 1:
            _magic_restore(rest[0] if rest else None)
        elif command == "list" and not rest:
            _print_list(root_dir())
        elif command == "help":
            print(_help())
        else:
            raise UsageError(f"%gpu_checkpoint {line.strip()}: not understood.\n\n{_help()}")
    except (NameError, ValueError, FileNotFoundError, RuntimeError) as e:
        # A clear one-line message instead of a traceback through this module.
        raise UsageError(str(e)) from e


def load_ipython_extension(ipython) -> None:
    """``%load_ext jupyter_gpu_gov.checkpoint`` (importing the module inside IPython does it too)."""
    ipython.register_magic_function(_gpu_checkpoint, "line", "gpu_checkpoint")


if _ipython() is not None:
    load_ipython_extension(_ipython())
