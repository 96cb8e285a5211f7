"""Every server's listing (an admin's ``GET api/servers``, the dashboard's lines) from a
snapshot of the governor's state: taken on the event loop between two passes, references only
(``Listed``), and built into rows and encoded in a worker thread, so that a listing of 10,000
servers holds the reports for milliseconds, not the ~0.6-0.9 s that building and encoding them
on the loop did (docs/benchmarks-history.md, "Routes at 10,000 servers (wave 28)").

What a snapshot references is never changed in place once taken: a row's columns are copied
(a tuple of their values: a row changes by having them set again), a server's report
(``Received``) and diagnosis (``Scored``) are replaced, not changed, by the next report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from operator import attrgetter
from typing import NamedTuple, TypeVar

from ..core import browser_json, clock
from . import views
from .evidence import Received
from .incremental import let_reports_in
from .page_handler import ago, until
from .tables import SERVER_COLUMNS, ServerRow

MAX_PAGE = 10_000  # ``GET api/servers?limit=``: the most servers a page lists
MAX_CURSOR_CHARS = 1024  # ``after=``: a server's key is at most 511 (``user/name``)
SLICE_S = 0.005  # a snapshot's longest run between two turns of the event loop, as a pass's
SLICE_ROWS = 100  # rows between two looks at the clock
# A worker hands the interpreter to the event loop this often (servers built): else a report
# waiting for it waits out the interpreter's switch interval (5 ms) at each system call.
HAND_OVER_EVERY = 16

T = TypeVar("T")
_columns_of: Callable[[ServerRow], tuple] = attrgetter(*SERVER_COLUMNS)


class Listed(NamedTuple):
    """One server as of a snapshot: its row's columns (``SERVER_COLUMNS``' order), its last
    report, what its diagnosis says (``None``: no cause, or stale), its ``right_size``, and what
    the ledger bills it (GPU-equivalents, state) — nothing formatted yet."""

    columns: tuple
    report: Received | None
    scored: object | None  # a ``diagnosis.Scored`` naming a cause, fresh at the snapshot
    right_size: dict | None
    gpus: float
    ledger_state: str


async def snapshot(governor, rows: Sequence[ServerRow], now: datetime) -> list[Listed]:
    """``rows`` as ``Listed``, on the event loop: a slice of ``SLICE_S`` at a time (copying the
    columns of 10,000 rows is ~50-100 ms), reports answered between two. Each server's entry is
    what it was at one moment; read under ``Views.of_one_pass``, every entry is of the same
    pass."""
    reports = governor.reports
    results = governor.diagnosis.results
    stale_after = governor.options.report_stale_after
    sizes = governor.options.tier_sizes
    right_size = governor.right_size
    sessions = governor.ledger.open
    out: list[Listed] = []
    until = time.perf_counter() + SLICE_S
    for start in range(0, len(rows), SLICE_ROWS):
        if time.perf_counter() >= until:
            await let_reports_in()
            until = time.perf_counter() + SLICE_S
        for row in rows[start : start + SLICE_ROWS]:
            key = row.key
            scored = results.get(key)
            if scored is not None and (
                scored.cause is None or (stale_after is not None and now - scored.at > stale_after)
            ):
                scored = None  # as ``Diagnosis.root_cause`` reads it
            session = sessions.get(key)
            out.append(
                Listed(
                    _columns_of(row),
                    reports.get(key),
                    scored,
                    right_size(row) if sizes else None,
                    session.gpus if session else 0.0,
                    session.state if session else "",
                )
            )
    return out


def handing_over(items: Iterable[T]) -> Iterator[T]:
    """``items``, the interpreter let go (``time.sleep(0)``) every ``HAND_OVER_EVERY``."""
    for count, item in enumerate(items, 1):
        if not count % HAND_OVER_EVERY:
            time.sleep(0)
        yield item


class HandingOver(list):
    """A list read ``handing_over`` (a page's rows, as its template renders them in a
    worker)."""

    def __iter__(self) -> Iterator:
        return handing_over(super().__iter__())


def detached(columns: tuple) -> ServerRow:
    """A row of its own, with the snapshot's columns (the governor's may change meanwhile)."""
    return ServerRow.of_columns(columns)


def listing(listed: Listed) -> dict:
    """A server as the admin API lists it (``views.row_view``), from its snapshot."""
    root_cause = listed.scored.root_cause() if listed.scored is not None else None
    return views.row_view(detached(listed.columns), listed.report, root_cause, listed.right_size)


_KEY = SERVER_COLUMNS.index("key")


def by_key(snap: Sequence[Listed]) -> list[Listed]:
    return sorted(snap, key=lambda listed: listed.columns[_KEY])


def encoded_servers(snap: Sequence[Listed], more: dict | None = None) -> bytes:
    """``{"servers": [...], **more}`` as ``json.dumps`` writes it, in key order, for a worker:
    a server at a time (one ``json.dumps`` of 10 MB holds the interpreter, and so the event
    loop, for its whole length)."""
    items = ", ".join(browser_json.dumps(listing(listed)) for listed in handing_over(by_key(snap)))
    tail = "".join(
        f", {browser_json.dumps(k)}: {browser_json.dumps(v)}" for k, v in (more or {}).items()
    )
    return f'{{"servers": [{items}]{tail}}}'.encode()


def server_lines(snap: Iterable[Listed], now: datetime, pending: set[str]) -> list[dict]:
    """The running servers as the dashboard and "My GPU usage" show them, for a worker;
    ``pending``: the servers with an extension waiting for an admin."""
    lines = []
    for listed in handing_over(snap):
        view = listing(listed)
        row = detached(listed.columns)
        gpu = view["gpu"] or {}
        devices = [
            d.get("mig_profile") or d.get("name") or d.get("uuid") for d in gpu.get("devices", ())
        ]
        idle_for = (now - row.idle_since).total_seconds() if row.idle_since else None
        lines.append(
            {
                "key": row.key,
                "session": clock.isoformat(row.session_started) or "",  # the session shown
                "user": row.user,
                "name": row.name,
                "team": row.team or "",
                "project": row.project or "",
                "tier": row.tier or "",
                "gpus": listed.gpus,
                "devices": ", ".join(str(d) for d in devices),
                "state": row.state,
                "reason": row.reason,
                "idle_for": idle_for,
                "idle_for_text": ago(row.idle_since, now),
                "memory": (gpu.get("memory_mb") or 0) / 1024 if gpu else None,
                "activity": gpu.get("active_fraction"),
                "root_cause": (view["root_cause"] or {}).get("label", ""),
                "root_cause_hint": (view["root_cause"] or {}).get("hint", ""),
                "right_size": view["right_size"],
                "deadline": row.cull_at,
                "deadline_text": until(row.cull_at, now),
                "warn_text": until(row.warn_at, now),
                "extensions_used": row.extensions_used,
                "approval_pending": row.approval_pending or row.key in pending,
                "exempt_until": row.exempt_until,
                "policy": row.policy or "",
                "ledger_state": listed.ledger_state,
            }
        )
    return lines
