"""When a person last asked a kernel for something, read from the kernels' IOPub.

Jupyter Server's kernel activity (``last_kernel_activity``) moves on every message of a running
cell and on every output of a cell's background thread: a training loop that prints progress
looks like someone at the notebook for as long as it runs, and the moment it ends like the
moment they left. A person shows differently: each request a kernel handles is announced on
IOPub by ``status: busy`` with that request as parent. The requests people make (running a
cell, completing, inspecting, moving a widget) count; those a frontend sends by itself
(``kernel_info_request`` on every reconnect of an open tab, ``comm_info_request``, history)
and the extension's own checkpoint hooks do not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from jupyter_client.session import Session

from ..core import clock
from .own_activity import OwnActivity

log = logging.getLogger("jupyter_gpu_gov.server")

PERSON_REQUESTS = frozenset({"execute_request", "complete_request", "inspect_request", "comm_msg"})


class PersonActivity:
    """Watches every kernel's IOPub; ``latest`` is when a person's request last started, and
    ``cells`` when a person's cell last started, by kernel id."""

    def __init__(self, own: OwnActivity) -> None:
        self._own = own  # what the extension did itself (a checkpoint's hooks)
        self._streams: dict[str, Any] = {}  # kernel id -> its IOPub stream
        self.latest: datetime | None = None
        self.cells: dict[str, datetime] = {}

    def watch(self, kernels: Mapping[str, Any]) -> None:
        """Follow the kernels now running (id -> Jupyter Server's kernel manager): start on new
        ones, close the streams of those gone."""
        for kernel_id in self._streams.keys() - kernels.keys():
            self._close(kernel_id)
            self.cells.pop(kernel_id, None)
        for kernel_id in kernels.keys() - self._streams.keys():
            kernel = kernels[kernel_id]
            try:
                self._streams[kernel_id] = self._subscribe(kernel_id, kernel)
            except Exception:  # a kernel still starting has no connection yet: next tick
                log.debug("jupyter-gpu-gov: cannot watch kernel %s yet", kernel_id, exc_info=True)
                continue
            # Someone started it a moment ago (a tick at most): what it did until now is theirs.
            self._person_at(getattr(kernel, "last_activity", None))

    def close(self) -> None:
        for kernel_id in list(self._streams):
            self._close(kernel_id)

    def _subscribe(self, kernel_id: str, kernel: Any) -> Any:
        stream = kernel.connect_iopub()
        session = Session(config=kernel.session.config, key=kernel.session.key)

        def on_iopub(parts: list) -> None:
            _, parts = session.feed_identities(parts)
            header = session.deserialize(parts, content=False)
            if header["header"]["msg_type"] != "status":
                return  # most traffic: read no further
            parent = header.get("parent_header") or {}
            kind = parent.get("msg_type")
            if kind not in PERSON_REQUESTS or self._own.is_own_request(parent.get("msg_id")):
                return
            if session.deserialize(parts)["content"].get("execution_state") != "busy":
                return
            # By its request, not its time: a person's cell started while a checkpoint's
            # hooks run (or a moment after) is theirs.
            now = clock.utcnow()
            self.latest = now if self.latest is None else max(self.latest, now)
            if kind == "execute_request":
                self.cells[kernel_id] = now

        stream.on_recv(on_iopub)
        return stream

    def _person_at(self, at: datetime | None) -> None:
        if at is not None and not self._own.ours(at):
            self.latest = at if self.latest is None else max(self.latest, at)

    def _close(self, kernel_id: str) -> None:
        stream = self._streams.pop(kernel_id)
        if not stream.socket.closed:
            stream.close()
