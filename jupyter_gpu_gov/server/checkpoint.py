"""The server side of a checkpoint before a cull: every open notebook gets a contents-manager
checkpoint (the frontend saves dirty documents first; kernel state hooks come with the
checkpoint work)."""

from __future__ import annotations

from jupyter_core.utils import ensure_async

from ..core import clock


async def checkpoint_notebooks(serverapp, reason: str) -> dict:
    """Checkpoint every notebook that has a session; return the manifest."""
    started = clock.utcnow()
    saved, skipped, errors = [], [], []
    sessions = await ensure_async(serverapp.session_manager.list_sessions())
    paths = sorted(
        {s["path"] for s in sessions if s.get("path") and s.get("type", "notebook") == "notebook"}
    )
    for path in paths:
        if not await ensure_async(serverapp.contents_manager.file_exists(path)):
            skipped.append({"path": path, "why": "not saved to disk yet"})
            continue
        try:
            checkpoint = await ensure_async(serverapp.contents_manager.create_checkpoint(path))
            saved.append({"path": path, "checkpoint_id": checkpoint["id"]})
        except Exception as error:  # one notebook failing must not hide the others
            errors.append({"path": path, "error": f"{type(error).__name__}: {error}"})
    return {
        "status": "failed" if errors else "done",
        "reason": reason,
        "requested_at": clock.isoformat(started),
        "completed_at": clock.isoformat(clock.utcnow()),
        "notebooks": saved,
        "skipped": skipped,
        "errors": errors,
    }
