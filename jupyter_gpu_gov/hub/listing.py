"""Listing the Hub incrementally (issue 26; docs/benchmarks-history.md, "Scale").

A full listing (``GET /users?state=active``, every page) costs what jupyterhub-idle-culler's
whole pass costs. Between two full listings the governor asks only for the users whose
``last_activity`` moved since the last listing: ``GET /users?state=active&sort=-last_activity``
(JupyterHub 5 and later), page by page, stopping at the first user older than that, then the
same with ``state=inactive``. The Hub moves a user's ``last_activity`` when a server starts,
when it stops (``User.stop``), and with every activity its proxy or servers post, so a change
of a server's model that a decision reads shows up there. Activity arrives late: a
single-user server posts its last activity every few minutes, and the proxy's is gathered
every ``last_activity_interval`` (5 min), so the cut-off of users with a server is the last
listing's start less ``ACTIVITY_LAG``. A user without one (their last server stopped) has
nothing left to post: a stop stamps the user's activity as it is committed, with the Hub's
clock, so the cut-off of those is the last listing's start less ``STOP_LAG`` (clock skew and a
listing in flight). The users of the servers a pass culled are so read once, not at every pass
for ``ACTIVITY_LAG``; one who starts a server again is active, read back ``ACTIVITY_LAG``.

What ``last_activity`` does not show is caught otherwise:

- a server that becomes ready long after its spawn began: users with a server starting or
  stopping at the last listing are asked for again (``GET /users/{name}``);
- a change of groups (which team a server bills to): the groups are read every pass; any
  change lists everything;
- a server decided on a model its user's listing did not bring this pass (its report or DCGM
  changed, or a deadline fell due): a warning, a checkpoint request or an interrupt rests on
  the model last read, which the listing of users active since then would have replaced had it
  moved; a cull, which takes a GPU away, rests on a model read this pass: its user is asked
  for (``GET /users/{name}``) just before it is carried out, and the cull is skipped if the
  server changed (``hub/incremental.py``), at most ``fresh_reads(...)`` users a pass;
- anything else: a full listing every ``full_every`` passes (``full_pass_every``), and
  whenever the Hub cannot sort by activity.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection, Sequence
from datetime import datetime, timedelta

from ..core import clock
from ..core.policy import HUB_ACTIVITY_LAG
from .hubapi import HubApi, HubServer, is_user_model, servers_of

log = logging.getLogger("jupyter_gpu_gov.hub")

# How late an activity may reach the Hub's ``last_activity`` (one figure, core.policy's).
ACTIVITY_LAG = HUB_ACTIVITY_LAG
# How late a stop may reach the listing of users without a server: ``User.stop`` stamps the
# activity and removes the server in one commit, so only a skew between the Hub's clock and the
# governor's, and the listing's own pages, are covered.
STOP_LAG = timedelta(minutes=2)
# Asking for one user costs a request; a page carries many users. Measured against the
# benchmark's fake Hub at 10,000 users, a page of 200 cost this client 6.7 times a lookup's CPU
# (3.2 ms against 0.48 ms) and 13 times its wall time (10 requests in flight): the users a pass
# asks for one by one before its culls are bounded by what a full listing would cost, this
# many a page, and at least ``FRESH_READS_LEAST`` (a small Hub's burst of culls).
LOOKUPS_PER_PAGE = 6
FRESH_READS_LEAST = 100


def fresh_reads(servers: int, page_size: int) -> int:
    """The most users a pass asks for one by one before a cull (``LOOKUPS_PER_PAGE`` a page a
    full listing of ``servers`` would take, at least ``FRESH_READS_LEAST``); the culls past
    it wait for the next pass."""
    pages = -(-servers // max(page_size or 200, 1))
    return max(FRESH_READS_LEAST, LOOKUPS_PER_PAGE * pages)


class HubListing:
    """Which servers a pass reads from the Hub, and the reading."""

    def __init__(
        self, full_every: int = 1, lag: timedelta = ACTIVITY_LAG, stop_lag: timedelta = STOP_LAG
    ):
        self.full_every = max(1, int(full_every))
        self.lag = lag
        self.stop_lag = min(stop_lag, lag)
        self.sorts: bool | None = None  # the Hub sorts users by activity (None: not asked)
        self._since: datetime | None = None  # the last listing's start: the next one's cut-offs
        self._groups: Sequence[dict] | None = None
        self.waiting: set[str] = set()  # users with a server starting or stopping
        self.listed: set[str] = set()  # users this pass's listing returned (their whole model)
        self.full = True

    async def plan(self, hub: HubApi, full_pass: bool, groups: Sequence[dict]) -> None:
        """Before a pass's listing: list everything (a full decision pass, the first listing,
        a change of groups, a Hub that cannot sort), or only what moved."""
        changed = groups != self._groups
        self._groups = groups
        self.full = full_pass or changed or self._since is None or self.full_every == 1
        if not self.full and self.sorts is None:
            self.sorts = await _sorts_by_activity(hub)
        self.full = self.full or not self.sorts

    async def servers(self, hub: HubApi) -> AsyncIterator[HubServer]:
        """This pass's servers: every active one (a full listing), or those of the users
        active since the last listing and of users waiting on a spawn or stop."""
        started = clock.utcnow()
        self.listed = set()
        waiting: set[str] = set()
        users = None
        if not self.full:
            try:  # a few pages at most: read whole, so an order the Hub ignored lists all
                since = self._since
                users = [u async for u in self._moved_since(hub, "active", since - self.lag)]
                stopped = self._moved_since(hub, "inactive", since - self.stop_lag)
                users += [user async for user in stopped]
            except UnsortedListing:
                self.full = True
        async for user in _each(users) if users is not None else hub.iter_users("active"):
            self.listed.add(user["name"])
            for server in _servers_of(user, waiting):
                yield server
        if not self.full:
            for user in await _ask(hub, self.waiting - self.listed):
                self.listed.add(user["name"])
                for server in _servers_of(user, waiting):
                    yield server
            waiting |= self.waiting - self.listed  # asked for, gone: nothing waits
        self.waiting = waiting
        self._since = started

    async def _moved_since(self, hub: HubApi, state: str, since: datetime) -> AsyncIterator[dict]:
        # Inactive users too: a user whose last server stopped is no longer "active", and is
        # listed so (no servers) when their activity moved.
        params = {"state": state, "sort": "-last_activity"}
        newest: datetime | None = None
        async for user in hub.paginate("/users", params):
            if not is_user_model(user):
                continue
            try:
                when = clock.parse(user.get("last_activity"))
            except (TypeError, ValueError, AttributeError):  # no order to trust: list all
                log.warning(
                    "gpu-gov: user %.80r: activity %.60r unread",
                    user["name"],
                    user["last_activity"],
                )
                raise UnsortedListing from None
            if when is not None and newest is not None and when > newest:
                # Not in the order asked for: never stop early on a listing out of order.
                log.warning("gpu-gov: the Hub does not sort users by activity: listing all")
                self.sorts = False
                raise UnsortedListing
            if when is None or when < since:
                return
            newest = when
            yield user


async def _each(items: Sequence[dict]) -> AsyncIterator[dict]:
    for item in items:
        yield item


class UnsortedListing(Exception):
    """The Hub ignored ``sort``: the pass lists everything instead."""


def _servers_of(user: dict, waiting: set[str]) -> list[HubServer]:
    servers = servers_of(user)
    waiting.update(server.user for server in servers if server.pending or not server.ready)
    return servers


async def _ask(hub: HubApi, users: Collection[str]) -> list[dict]:
    """The models of these users (the Hub client bounds the requests in flight); a user the
    Hub no longer has is left out (their servers are gone)."""
    models = await asyncio.gather(*(hub.get_user(name) for name in sorted(users)))
    return [model for model in models if model and is_user_model(model)]


async def _sorts_by_activity(hub: HubApi) -> bool:
    """JupyterHub 5 and later sort ``/users`` by ``last_activity``; earlier ones ignore it."""
    try:
        info = await hub.request("GET", "/")
        major = int(str((info or {}).get("version", "0")).split(".")[0])
    except Exception as error:  # an unknown Hub lists everything, as before
        log.warning("gpu-gov: cannot read the Hub's version (%s): listing every pass", error)
        return False
    return major >= 5
