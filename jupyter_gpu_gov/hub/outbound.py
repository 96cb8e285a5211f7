"""What the governor asks of a user's server — and why it never sends the server a request.

A user owns their server process: its configuration, its logs, whatever answers on its port.
Any credential sent to it is the user's to keep (a ``log_function`` in their own
``jupyter_server_config.py`` prints request headers), and any URL the governor builds from what
the server reported points wherever the user wants (a kernel "id" of ``../../hub/api/…``). So
the governor sends user servers nothing. What it wants of one rides back on the verdict the
server fetches itself, with its own token, each time it reports (``verdict["requests"]``):

- ``checkpoint``: save a checkpoint before the cull (``requested_at`` identifies the request;
  the server's next report carries the result with that time, which is how the governor knows
  it answers this request and not an earlier one);
- ``interrupt_kernels``: interrupt the cells these kernels run (the busy limit), before the
  checkpoint asked with it;
- ``shutdown_kernels``: shut down these kernels (the ``shutdown-kernels`` cull action).

Kernel ids are the ones the server's own report listed, each a UUID (``core.report``), and the
server acts only on kernels its own kernel manager runs.

Nothing the governor holds is worth anything to the server, and nothing the server says is used
to address anything: a server that ignores a request only delays its own cull (a checkpoint
request times out, and a server whose kernels are still there is warned and culled again).
See docs/security.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..core import clock

SHUTDOWN, INTERRUPT = "shutdown_kernels", "interrupt_kernels"


@dataclass(frozen=True)
class KernelRequest:
    """The governor asked the server to shut these kernels down (they held an idle GPU), or to
    interrupt their cells (the busy limit)."""

    kind: str  # SHUTDOWN | INTERRUPT
    kernels: tuple[str, ...]
    requested_at: datetime
    reason: str

    def answered_by(self, report: Mapping) -> bool:
        """The server's report shows it done: none of these kernels is listed any more (a
        shutdown), or none of them is executing (an interrupt)."""
        left = {
            t["id"]
            for t in report["targets"]
            if t["kind"] == "kernel"
            and (self.kind == SHUTDOWN or t.get("execution_state") == "busy")
        }
        return not left.intersection(self.kernels)

    def expired(self, now: datetime, after: timedelta) -> bool:
        return now - self.requested_at > after

    def view(self) -> dict:
        return {
            "requested_at": clock.isoformat(self.requested_at),
            "kernels": list(self.kernels),
            "reason": self.reason,
        }


def kernels_on_gpu(report: Mapping) -> tuple[str, ...]:
    """The kernels a (validated) report lists as holding a GPU context."""
    return tuple(
        t["id"] for t in report["targets"] if t["kind"] == "kernel" and t["gpu"]["holds_context"]
    )


def requests(
    checkpoint_status: str | None,
    checkpoint_requested_at: datetime | None,
    reason: str,
    cull_reason: str | None,
    kernel_requests: Iterable[KernelRequest | None] = (),
) -> dict:
    """``verdict["requests"]``: what the server is asked to do now (empty: nothing)."""
    asked: dict = {}
    if checkpoint_status == "requested" and checkpoint_requested_at is not None:
        asked["checkpoint"] = {
            "requested_at": clock.isoformat(checkpoint_requested_at),
            "reason": reason,
            "cull_reason": cull_reason,
        }
    for request in kernel_requests:
        if request is not None:
            asked[request.kind] = request.view()
    return asked


def forget_answered(
    pending: dict[str, KernelRequest], reports: Mapping, now: datetime, after: timedelta
) -> None:
    """Drop the kernel requests the servers answered (or never will: stopped, or silent for
    longer than ``after``)."""
    for key in list(pending):
        received = reports.get(key)
        if pending[key].expired(now, after) or (
            received is not None
            and received.at > pending[key].requested_at
            and pending[key].answered_by(received.report)
        ):
            del pending[key]


def dropped(keys: Iterable[str], pending: dict[str, KernelRequest]) -> None:
    for key in keys:
        pending.pop(key, None)
