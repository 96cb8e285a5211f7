"""An admin's or a user's read never makes the servers' reports wait for it
(docs/benchmarks-history.md, "Routes at 10,000 servers (wave 27)"): a Prometheus scrape and the
dashboard are written in a worker while reports are answered; a user's own page reads their servers,
not every one.

The real service (``test_report_budget.service``: its server, HubOAuth against a fake Hub over
HTTP, the SQLite store) on the test's event loop, so a route that held the loop would hold the
test too: each test holds the route's work at a point (a collector of the real registry, the
real template's render) until a report has been answered, and would fail, not hang, without it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

from test_fuzz_api import ACCESS
from test_report_budget import ALICE, get, post, report_of, service

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.hub import listings, metrics, page_handler, views

ADMIN = ("root", "root-token")
HELD_AT_MOST_S = 20.0  # how long the held work waits for the report: only when it would fail


class Held:
    """Where a route's work waits until told to go on (``go``), once it has got there
    (``reached``); at most ``HELD_AT_MOST_S``."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()

    def hold(self) -> None:
        self.reached.set()
        self.released.wait(HELD_AT_MOST_S)

    async def until_reached(self) -> None:
        deadline = time.monotonic() + 2 * HELD_AT_MOST_S
        while not self.reached.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert self.reached.is_set(), "the route's work never began"


async def report_answered_while_held(url: str, held: Held, read) -> None:
    """``read`` (a request, begun) reaches ``held``; a report sent then is answered while the
    read still waits there, and the read is answered after."""
    try:
        await held.until_reached()
        answer = await post(url, ALICE, report_of("alice"))
        read_was_waiting = not read.done()
    finally:
        held.released.set()
    assert answer.code == 200, answer.body
    assert read_was_waiting, "the report was answered only once the read was done"
    assert (await read).code == 200


class HeldCollector:
    """A collector of the governor's registry whose collection waits at ``held``."""

    def __init__(self, held: Held) -> None:
        self.held = held

    def describe(self):
        return []

    def collect(self):
        self.held.hold()
        return []


async def test_a_report_is_answered_while_prometheus_scrapes_the_metrics(tmp_path, monkeypatch):
    """A scrape writes a series per server (1.4 MB at 10,000): on the event loop it held every
    report for hundreds of milliseconds each scrape."""
    async with service(tmp_path, monkeypatch) as (url, _, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        held = Held()
        collector = HeldCollector(held)
        metrics.REGISTRY.register(collector)
        try:
            scrape = asyncio.ensure_future(get(url, "metrics", ADMIN[1]))
            await report_answered_while_held(url, held, scrape)
        finally:
            metrics.REGISTRY.unregister(collector)


async def test_a_report_is_answered_while_an_admin_loads_the_dashboard(tmp_path, monkeypatch):
    """The dashboard's table is a row per GPU server (16 MB at 10,000): rendered on the event
    loop, it held every report for over a second."""
    held = Held()
    get_template = page_handler.env.get_template

    class HeldTemplate:
        """The dashboard's template, as it is, waiting at ``held`` before it renders."""

        def __init__(self, template) -> None:
            self.template = template

        def render(self, **context):
            held.hold()
            return self.template.render(**context)

    def held_dashboard(name, *args, **kwargs):
        template = get_template(name, *args, **kwargs)
        return HeldTemplate(template) if name == "dashboard.html" else template

    monkeypatch.setattr(page_handler.env, "get_template", held_dashboard)
    async with service(tmp_path, monkeypatch) as (url, _, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        page = asyncio.ensure_future(get(url, "", ADMIN[1]))
        await report_answered_while_held(url, held, page)
        assert b'id="servers-count"' in (await page).body


async def test_a_users_own_page_reads_their_servers_not_everyones(tmp_path, monkeypatch):
    """ "My GPU usage" built every running server's line to keep its user's: at 10,000 servers
    each load held the event loop ~300 ms for one user's one server."""
    async with service(tmp_path, monkeypatch) as (url, governor, hub):
        hub.populate(40)
        await governor.reconcile()
        assert len(governor.known_servers()) > 40
        own = "alice-own-token"  # hers, not her server's (which may not read her page)
        hub.add_user_token("alice", own, extra_scopes=[ACCESS, "access:servers!user=alice"])
        listed = []
        snapshot = listings.snapshot

        def snapshot_of(gov, rows, now):
            listed.extend(row.key for row in rows)
            return snapshot(gov, rows, now)

        monkeypatch.setattr(listings, "snapshot", snapshot_of)
        answer = await get(url, "me", own)
        assert answer.code == 200, answer.body
        assert b"alice" in answer.body
        assert listed == ["alice/"]


class HeldRowView:
    """``views.row_view`` (a server's listing, as the API and the dashboard build it), waiting
    at ``held`` before the first server's."""

    def __init__(self, held: Held) -> None:
        self.held, self.row_view = held, views.row_view

    def __call__(self, *args, **kwargs):
        self.held.hold()
        return self.row_view(*args, **kwargs)


async def admins_read_held_at_a_listing(tmp_path, monkeypatch, path: str) -> bytes:
    """An admin's GET ``path``, held where it builds its first server's listing: a report sent
    then is answered while it waits (``report_answered_while_held``). Its answer's body."""
    held = Held()
    monkeypatch.setattr(views, "row_view", HeldRowView(held))
    async with service(tmp_path, monkeypatch) as (url, governor, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        await governor.reconcile()
        read = asyncio.ensure_future(get(url, path, ADMIN[1]))
        await report_answered_while_held(url, held, read)
        return (await read).body


async def test_a_report_is_answered_while_an_admin_lists_every_server(tmp_path, monkeypatch):
    """An admin's ``api/servers`` is 10.4 MB at 10,000 servers: its listings built and encoded
    on the event loop held every report for 0.6-0.7 s."""
    listed = json.loads(await admins_read_held_at_a_listing(tmp_path, monkeypatch, "api/servers"))
    assert [(s["user"], s["name"]) for s in listed["servers"]] == [("alice", ""), ("bob", "")]


async def test_a_report_is_answered_while_the_dashboards_lines_are_built(tmp_path, monkeypatch):
    """The dashboard's lines (a listing each): built on the event loop, they held every report
    for ~0.85 s at 10,000 servers, after the render had moved to a worker."""
    body = await admins_read_held_at_a_listing(tmp_path, monkeypatch, "?all=1")
    assert b'id="servers-count"' in body and b"alice/" in body and b"bob/" in body


async def test_a_listing_asked_while_a_pass_decides_is_of_that_pass(tmp_path, monkeypatch):
    """A listing is one pass's state: asked while a pass is deciding (its servers half decided
    by it, half by the one before), it waits for the pass's decisions and lists them."""
    async with service(tmp_path, monkeypatch) as (url, governor, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        await governor.reconcile()
        deciding, go_on, waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
        decide = governor._decide_listed

        async def paused(*args):
            deciding.set()
            await go_on.wait()
            return await decide(*args)

        monkeypatch.setattr(governor, "_decide_listed", paused)
        between = getattr(governor, "between_passes", None)

        async def between_passes():
            waiting.set()
            await between()

        monkeypatch.setattr(governor, "between_passes", between_passes, raising=False)
        bob = hub.users["bob"]  # bob stops his server (what this pass finds)
        bob.servers.pop("", None)
        bob.last_activity = clock.utcnow()
        hub._reindex(bob)
        passing = asyncio.ensure_future(governor.reconcile())
        try:
            await asyncio.wait_for(deciding.wait(), HELD_AT_MOST_S)
            listing = asyncio.ensure_future(get(url, "api/servers", ADMIN[1]))
            await asyncio.wait(
                [listing, asyncio.ensure_future(waiting.wait())],
                timeout=HELD_AT_MOST_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
            answered_mid_pass = listing.done()
        finally:
            go_on.set()
        await passing
        assert not answered_mid_pass, "a listing was answered in the middle of a pass"
        listed = json.loads((await listing).body)["servers"]
        assert [s["user"] for s in listed] == ["alice"]  # the pass's: bob's server stopped
