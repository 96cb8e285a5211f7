"""The server side of a checkpoint before a cull (formats: docs/api.md, "What a checkpoint does").

One checkpoint is one directory ``<checkpoint_dir>/<id>/``, laid out as ``checkpoint_layout``
says (the kernels write their part through ``jupyter_gpu_gov.checkpoint``).

:func:`take_checkpoint` runs the kernel hooks of every kernel on a GPU (in parallel, one silent
execute request each, with a timeout that interrupts the kernel), takes a contents-manager
checkpoint of every open notebook, saves terminal scrollback, writes the manifest and prunes old
checkpoints. Every failure becomes one readable line in the manifest's ``errors``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import errno
import json
import os
import queue
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jupyter_core.utils import ensure_async

from ..checkpoint_layout import (
    DONE,
    FAILED,
    FORMAT,
    HOOKS_FILE,
    MANIFEST,
    MANIFEST_REPORTED_BYTES,
    NO_HOOKS,
    RESTORE_HINT,
    RUNNING,
    SOURCE_FRONTEND,
    TERMINALS_DIR,
    TIMEOUT,
    abridged,
    id_key,
    is_checkpoint_id,
    kernel_dir,
    new_checkpoint_dir,
    notebook_paths,
    write_json,
)
from ..core import clock

# Seconds to wait for a kernel's answer after interrupting a hook that ran past its timeout.
INTERRUPT_GRACE = 10.0
# A directory without a manifest may be a checkpoint in progress (another server of the same
# user shares the directory); only this old is it a crashed leftover that pruning may remove.
UNFINISHED_AGE_S = 24 * 3600

# What a kernel on a GPU is asked, as a user expression of a silent, empty execute request, so
# that it binds no name in the user's namespace and its answer (the hooks.json record, as JSON)
# comes back in the execute_reply. A kernel that never imported the module has no hooks (None);
# a request that waited in the kernel's queue past the server's deadline does nothing (the
# server has already recorded a timeout and written the manifest).
HOOKS_EXPRESSION = (
    "(lambda m, t, j: None if m is None or t.time() >= {deadline!r} "
    "else j.dumps(m._run_hooks({directory!r}, {reason!r}), default=str))"
    "(__import__('sys').modules.get('jupyter_gpu_gov.checkpoint'), "
    "__import__('time'), __import__('json'))"
)


def _no_space(text: str | None) -> bool:
    text = text or ""
    return "No space left" in text or f"Errno {errno.ENOSPC}]" in text or "ENOSPC" in text


def _describe_error(error: str) -> str:
    """The error as one line, saying "disk full, no space left on device" for a full disk."""
    error = " ".join(str(error).split())
    if not _no_space(error):
        return error
    if "no space left on device" in error.lower():
        return f"disk full: {error}"
    return f"disk full, no space left on device: {error}"


def _exception_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return f"disk full, no space left on device: {type(error).__name__}: {error}"
    return _describe_error(f"{type(error).__name__}: {error}")


def _where(kernel_id: str, notebook: str | None) -> str:
    return f"kernel {kernel_id}, notebook {notebook}" if notebook else f"kernel {kernel_id}"


def du(path: Path) -> int:
    """Bytes of every regular file under ``path`` (0 when it does not exist)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file removed meanwhile
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


# -- kernels ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuKernel:
    id: str
    name: str | None
    notebook: str | None


def holds_gpu(gpu: dict | None) -> bool:
    """A target holds a GPU: memory on one, a context, or GPU processes (unknown memory counts)."""
    if not gpu:
        return False
    return bool((gpu.get("memory_mb") or 0) > 0 or gpu.get("holds_context") or gpu.get("pids"))


def gpu_kernels(report: dict | None) -> list[GpuKernel]:
    """The kernels of a report (docs/api.md, "The report") that hold a GPU."""
    return [
        GpuKernel(t["id"], t.get("name"), t.get("path"))
        for t in (report or {}).get("targets", [])
        if t.get("kind") == "kernel" and t.get("id") and holds_gpu(t.get("gpu"))
    ]


def _read_hooks(directory: Path) -> dict | None:
    try:
        data = json.loads((directory / HOOKS_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        return {"hooks": [], "unreadable": f"{type(error).__name__}: {error}"}
    return data if isinstance(data, dict) else {"hooks": [], "unreadable": "not a JSON object"}


async def _await_reply(client, msg_id: str, timeout: float) -> dict | None:
    """The execute_reply to ``msg_id`` on the shell channel, or None after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            msg = await client.get_shell_msg(timeout=left)
        except queue.Empty:
            return None
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return msg


async def _progress(client, msg_id: str) -> tuple[bool, bool]:
    """Whether the kernel's IOPub said it began our request, and ended it (drains what is
    buffered)."""
    began = ended = False
    while True:
        try:
            msg = await client.get_iopub_msg(timeout=0)
        except queue.Empty:
            return began, ended
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg.get("msg_type") == "status":
            state = msg.get("content", {}).get("execution_state")
            began = began or state == "busy"
            ended = ended or state == "idle"


def _own_session(session):
    """A copy of the kernel manager's Session with its own id. ``km.client()`` shares the
    manager's Session, whose id is the zmq identity of the client's shell socket: a second
    client with the same identity takes the kernel's replies away from the first (any other
    client made by ``client()``, e.g. in another extension or a test, would stop being answered)."""
    own = session.clone()
    own.session = str(uuid.uuid4())
    return own


def _answer(reply: dict) -> tuple[dict | None, str | None]:
    """(the kernel's hooks record or None, what went wrong or None) from an execute_reply."""
    content = reply.get("content", {})
    if content.get("status") != "ok":
        if content.get("status") == "error":
            return None, _describe_error(f"{content.get('ename')}: {content.get('evalue')}")
        return None, f"the kernel answered {content.get('status')!r}"
    value = (content.get("user_expressions") or {}).get("hooks") or {}
    if value.get("status") != "ok":
        return None, _describe_error(f"{value.get('ename')}: {value.get('evalue')}")
    try:
        answer = ast.literal_eval((value.get("data") or {}).get("text/plain", "None"))
        record = json.loads(answer) if isinstance(answer, str) else None
    except (ValueError, SyntaxError) as error:
        return None, f"unreadable answer ({type(error).__name__}: {error})"
    return (record if isinstance(record, dict) else None), None


async def run_kernel_hooks(
    serverapp,
    kernel: GpuKernel,
    directory: Path,
    reason: str,
    timeout: float,
    log,
    own_request: Callable[[str], None] | None = None,
) -> tuple[dict | None, list[str]]:
    """Run one kernel's hooks into ``directory``; answer (its manifest entry, error lines).

    The entry is None when the kernel is gone. A request that runs past ``timeout`` seconds is
    interrupted (so a postponed cull leaves a usable kernel), but only when the kernel is seen
    running it (its hooks.json written, or IOPub saying it began it) and not finishing it: a
    request that never started waits behind a cell of the user's — perhaps one submitted a
    moment before, which Jupyter Server does not show busy yet — and an interrupt would stop
    that cell. It is left alone, and the queued request does nothing when its turn comes (it
    carries the deadline).
    """
    km = serverapp.kernel_manager
    try:
        managed = km.get_kernel(kernel.id)
    except KeyError:
        return None, []
    name = kernel.name or getattr(managed, "kernel_name", None)
    where = _where(kernel.id, kernel.notebook)
    entry = {
        "id": kernel.id,
        "name": name,
        "notebook": kernel.notebook,
        "status": NO_HOOKS,
        "hooks": [],
        "bytes": 0,
        "error": None,
        "note": None,
        "path": str(directory),
    }
    errors: list[str] = []

    def fail(status: str, line: str) -> None:
        entry["status"] = status
        entry["error"] = entry["error"] or line
        errors.append(line)

    try:
        language = getattr(managed.kernel_spec, "language", None) or "python"
    except Exception:  # its kernelspec is gone: try anyway
        language = "python"
    if language.lower() != "python":
        entry["note"] = f"a {language} kernel: checkpoint hooks are Python only"
        return entry, errors
    expression = HOOKS_EXPRESSION.format(
        deadline=time.time() + timeout, directory=str(directory), reason=reason
    )
    client = None
    try:
        client = managed.client(session=_own_session(managed.session))
        # Shell for the reply, IOPub for "started": no heartbeat thread, stdin or control
        # socket to start and stop again for every checkpoint of every GPU kernel.
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        msg_id = client.execute(
            "",
            silent=True,
            store_history=False,
            user_expressions={"hooks": expression},
            allow_stdin=False,
            stop_on_error=False,
        )
        if own_request is not None:  # before its busy status can be read: no await between
            own_request(msg_id)
        reply = await _await_reply(client, msg_id, timeout)
        hooks, running, started, finishing = None, [], False, False
        if reply is None:
            hooks = _read_hooks(directory)
            running = [
                h.get("name") for h in (hooks or {}).get("hooks", []) if h.get("status") == RUNNING
            ]
            # Jupyter Server's execution state cannot tell whether our request runs: it lags
            # the kernel (a cell submitted a moment before shows busy only once its status
            # arrives). Only the request's own traces can.
            began, ended = await _progress(client, msg_id)
            started = began or hooks is not None
            finishing = ended or (hooks is not None and not running)
            if finishing:
                # Its reply is on the way: an interrupt now would land on whatever the
                # kernel runs next (a cell of the owner's waiting behind it).
                reply = await _await_reply(client, msg_id, INTERRUPT_GRACE)
        if reply is None:
            if not started:
                fail(
                    TIMEOUT,
                    f"timeout: {where} was busy running a cell; its checkpoint hooks did not "
                    f"start within {timeout:g} s (the cell was not interrupted)",
                )
            elif finishing:
                fail(
                    TIMEOUT,
                    f"timeout: the checkpoint hooks ({where}) ended but gave no answer within "
                    f"{timeout + INTERRUPT_GRACE:g} s (the kernel was not interrupted)",
                )
            else:
                entry["running_hook"] = running[0] if running else None
                what = f"hook {running[0]!r}" if running else "the checkpoint hooks"
                try:
                    await ensure_async(km.interrupt_kernel(kernel.id))
                    after = await _await_reply(client, msg_id, INTERRUPT_GRACE)
                    outcome = (
                        "kernel interrupted"
                        if after is not None
                        else f"kernel interrupted, and still busy {INTERRUPT_GRACE:g} s later"
                    )
                except Exception as error:
                    outcome = f"the kernel could not be interrupted: {_exception_line(error)}"
                fail(TIMEOUT, f"timeout: {what} ({where}) ran past {timeout:g} s; {outcome}")
            record = _read_hooks(directory) or hooks
        else:
            record, problem = _answer(reply)
            if problem:
                fail(FAILED, f"checkpoint hooks could not run ({where}): {problem}")
            elif record and record.get("hooks"):
                entry["status"] = DONE
                if not (directory / HOOKS_FILE).exists():
                    # The kernel could not write it (a full disk?): restore() needs it.
                    try:
                        write_json(directory / HOOKS_FILE, record)
                    except OSError as error:
                        fail(
                            FAILED,
                            f"hooks.json not written ({where}), restore() will not find these "
                            f"hooks: {_exception_line(error)}",
                        )
        if record and record.get("unreadable"):
            fail(entry["status"], f"hooks.json unreadable ({where}): {record['unreadable']}")
        if record and record.get("hooks"):
            entry["hooks"] = record.get("hooks", [])
            entry["notebook"] = entry["notebook"] or record.get("notebook")
            for hook in entry["hooks"]:
                if hook.get("status") == FAILED:
                    error = _describe_error(hook.get("error") or "failed")
                    at = _where(kernel.id, entry["notebook"])
                    fail(FAILED, f"hook {hook.get('name')!r} failed ({at}): {error}")
    except Exception as error:
        log.warning("jupyter-gpu-gov: checkpoint hooks of kernel %s", kernel.id, exc_info=True)
        fail(FAILED, f"checkpoint hooks could not run ({where}): {_exception_line(error)}")
    finally:
        if client is not None:
            client.stop_channels()
    if entry["status"] == DONE and errors:
        entry["status"] = FAILED
    entry["bytes"] = await asyncio.to_thread(du, directory)
    return entry, errors


# -- notebooks and terminals -----------------------------------------------------------------


async def checkpoint_notebooks(serverapp) -> tuple[list[dict], list[dict], list[str]]:
    """A contents-manager checkpoint of every notebook that has a session: (saved, skipped,
    error lines)."""
    saved, skipped, errors = [], [], []
    sessions = await ensure_async(serverapp.session_manager.list_sessions())
    paths = sorted(
        {s["path"] for s in sessions if s.get("path") and s.get("type", "notebook") == "notebook"}
    )
    contents = serverapp.contents_manager
    for path in paths:
        try:
            if not await ensure_async(contents.file_exists(path)):
                skipped.append({"path": path, "why": "not saved to disk yet"})
                continue
            checkpoint = await ensure_async(contents.create_checkpoint(path))
            saved.append({"path": path, "checkpoint_id": checkpoint["id"]})
        except Exception as error:  # one notebook failing must not hide the others
            errors.append(f"notebook {path}: checkpoint failed: {_exception_line(error)}")
    return saved, skipped, errors


_ANSI = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC … BEL/ST (window titles)
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor movement)
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def scrollback_text(chunks) -> str:
    """A terminal's output as plain text: escape sequences and control characters removed."""
    text = _ANSI.sub("", "".join(chunks))
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def _terminal_file_name(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(name)).lstrip(".") or "terminal"
    return f"{safe}.txt"


def save_terminals(serverapp, directory: Path) -> tuple[list[dict], list[str]]:
    """Each terminal's scrollback into ``directory/terminals/<name>.txt``."""
    manager = serverapp.web_app.settings.get("terminal_manager")
    terminals = dict(getattr(manager, "terminals", None) or {})
    saved, errors = [], []
    for name in sorted(terminals, key=str):
        relative = f"{TERMINALS_DIR}/{_terminal_file_name(name)}"
        try:
            text = scrollback_text(list(getattr(terminals[name], "read_buffer", ())))
            target = directory / relative
            target.parent.mkdir(exist_ok=True)
            data = text.encode("utf-8", errors="replace")
            target.write_bytes(data)
            saved.append({"name": str(name), "path": relative, "bytes": len(data)})
        except Exception as error:
            errors.append(f"terminal {name}: scrollback not saved: {_exception_line(error)}")
    return saved, errors


# -- listing and pruning ---------------------------------------------------------------------


def checkpoint_ids(root: Path) -> list[str]:
    """The checkpoint ids under ``root``, oldest first."""
    try:
        names = [p.name for p in root.iterdir() if p.is_dir() and is_checkpoint_id(p.name)]
    except FileNotFoundError:
        return []
    return sorted(names, key=id_key)


def read_manifest(root: Path, checkpoint_id: str) -> dict | None:
    """The manifest of one checkpoint; None when there is none (unknown or unfinished)."""
    if not is_checkpoint_id(checkpoint_id):
        raise ValueError(f"{checkpoint_id!r} is not a checkpoint id (YYYYMMDDTHHMMSSZ[-n])")
    try:
        data = json.loads((root / checkpoint_id / MANIFEST).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    return data if isinstance(data, dict) else None


def summary(manifest: dict) -> dict:
    """One line of ``GET /jupyter-gpu-gov/checkpoints``."""
    # A manifest is a file in the user's folder, read as possibly out of shape (edited, or
    # cut short by a full disk): one such made the whole listing a 500.
    errors = manifest.get("errors")
    size = manifest.get("bytes")
    return {
        "id": manifest.get("id"),
        "reason": manifest.get("reason"),
        "cull_reason": manifest.get("cull_reason"),
        "source": manifest.get("source"),
        "status": manifest.get("status"),
        "completed_at": manifest.get("completed_at"),
        "notebooks": notebook_paths(manifest),
        "bytes": size if isinstance(size, int) and not isinstance(size, bool) else None,
        "errors": len(errors) if isinstance(errors, list) else 0,
        "restore": RESTORE_HINT,
    }


def list_checkpoints(root: Path) -> list[dict]:
    """Summaries of the finished checkpoints under ``root``, newest first."""
    summaries = []
    for checkpoint_id in reversed(checkpoint_ids(root)):
        try:
            manifest = read_manifest(root, checkpoint_id)
        except (OSError, ValueError):
            continue
        if manifest is not None:
            summaries.append(summary({**manifest, "id": manifest.get("id") or checkpoint_id}))
    return summaries


def plan_prune(
    root: Path,
    newest: str,
    newest_bytes: int,
    keep: int,
    max_bytes: int,
    newest_failed: bool = False,
) -> list[str]:
    """The checkpoint ids to delete so that at most ``keep`` checkpoints of at most
    ``max_bytes`` in all remain: the newest ones, always including ``newest`` (the one just
    written, ``newest_bytes``). Once one is dropped, every older one goes too; but when
    ``newest`` failed (a hook's error, a disk full mid-save: part of the state at best), the
    last checkpoint that ended ``done`` stays too, whatever the limits."""
    now = time.time()
    count, total, dropping, doomed = 1, newest_bytes, False, []
    last_whole_wanted = newest_failed
    for checkpoint_id in reversed(checkpoint_ids(root)):
        if checkpoint_id == newest:
            continue
        path = root / checkpoint_id
        if not (path / MANIFEST).exists():
            try:
                unfinished_age = now - path.stat().st_mtime
            except OSError:
                continue
            if unfinished_age < UNFINISHED_AGE_S:
                continue  # perhaps in progress elsewhere: neither counted nor removed
        size = du(path)
        if last_whole_wanted and _ended_done(root, checkpoint_id):
            last_whole_wanted = False
            count, total = count + 1, total + size
        elif not dropping and count + 1 <= keep and total + size <= max_bytes:
            count, total = count + 1, total + size
        else:
            dropping = True
            doomed.append(checkpoint_id)
    return doomed


def _ended_done(root: Path, checkpoint_id: str) -> bool:
    try:
        manifest = read_manifest(root, checkpoint_id)
    except (OSError, ValueError):
        return False
    return manifest is not None and manifest.get("status") == DONE


# -- in the report ----------------------------------------------------------------------------


def for_report(state: dict | None) -> dict | None:
    """The last checkpoint (``{"requested_at", "status", "manifest"}``) as a report carries it:
    its manifest within ``MANIFEST_REPORTED_BYTES`` (``checkpoint_layout.abridged``); the whole
    one stays on disk and in the server's own status."""
    manifest = state.get("manifest") if isinstance(state, dict) else None
    if not isinstance(manifest, dict):
        return state
    short = abridged(manifest, MANIFEST_REPORTED_BYTES)
    return state if short is manifest else {**state, "manifest": short}


# -- the whole checkpoint ----------------------------------------------------------------------


async def take_checkpoint(
    serverapp,
    *,
    root: Path,
    reason: str,
    source: str,
    cull_reason: str | None,
    report: dict | None,
    hook_timeout: float,
    keep: int,
    max_bytes: int,
    log,
    own_request: Callable[[str], None] | None = None,
) -> dict:
    """One checkpoint (contract steps 1 to 4); answers its manifest. ``own_request`` hears
    the id of each request sent to a kernel (a person's requests are told from ours by it)."""
    requested = clock.utcnow()
    errors: list[str] = []
    manifest: dict = {
        "format": FORMAT,
        "id": None,
        "path": None,
        "reason": reason,
        "cull_reason": cull_reason,
        "source": source,
        "requested_at": clock.isoformat(requested),
        "completed_at": None,
        "status": RUNNING,
        "saved_by_frontend_first": source == SOURCE_FRONTEND,
        "notebooks": [],
        "skipped": [],
        "kernels": [],
        "terminals": [],
        "errors": errors,
        "bytes": 0,
        "pruned": [],
    }
    try:
        checkpoint_id, directory = await asyncio.to_thread(new_checkpoint_dir, root)
    except Exception as error:
        # Nowhere to write: notebooks still get their checkpoint, the rest is recorded.
        errors.append(f"checkpoint directory {root}: not created: {_exception_line(error)}")
        checkpoint_id, directory = None, None
    manifest["id"] = checkpoint_id
    manifest["path"] = str(directory) if directory is not None else None

    if directory is not None:
        runs = [
            run_kernel_hooks(
                serverapp, k, kernel_dir(directory, k.id), reason, hook_timeout, log, own_request
            )
            for k in gpu_kernels(report)
        ]
        for entry, lines in await asyncio.gather(*runs):
            if entry is not None:
                manifest["kernels"].append(entry)
            errors.extend(lines)

    saved, skipped, lines = await checkpoint_notebooks(serverapp)
    manifest["notebooks"], manifest["skipped"] = saved, skipped
    errors.extend(lines)

    if directory is not None:
        manifest["terminals"], lines = save_terminals(serverapp, directory)
        errors.extend(lines)
        manifest["bytes"] = await asyncio.to_thread(du, directory)
        try:
            manifest["pruned"] = await asyncio.to_thread(
                plan_prune, root, checkpoint_id, manifest["bytes"], keep, max_bytes, bool(errors)
            )
        except Exception as error:
            log.warning("jupyter-gpu-gov: checkpoint pruning not planned: %s", error)

    manifest["status"] = FAILED if errors else DONE
    manifest["completed_at"] = clock.isoformat(clock.utcnow())
    if directory is not None:
        try:
            await asyncio.to_thread(write_json, directory / MANIFEST, manifest)
        except Exception as error:
            manifest["pruned"] = []  # keep the old ones when this one has no manifest
            errors.append(f"manifest {directory / MANIFEST}: not written: {_exception_line(error)}")
            manifest["status"] = FAILED
    for old in manifest["pruned"]:
        try:
            await asyncio.to_thread(shutil.rmtree, root / old)
        except OSError as error:
            log.warning("jupyter-gpu-gov: old checkpoint %s not removed: %s", old, error)
    return manifest
