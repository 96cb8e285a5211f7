"""The spawn queue from the profile layer to the governor's pass, without a real hub: the real
workstation spawner (``GpuSimpleLocalProcessSpawner`` on simulated H100s) decides over an
in-memory JupyterHub database, as the hub would; the governor's pass reads the servers it
recorded through the fake Hub API (tests/fake_hub_api.py), with their spawner state, and acts.

- A team within its guarantee that joins the line asks borrowed servers back: the borrowed
  server is warned, then stopped after ``reclaim_grace``, and the audit says why.
- A server started from the line that nobody opens is given back after the claim window and
  counted (``jupyter_gpu_gov_culls_total{reason="unclaimed"}``).
"""

from __future__ import annotations

import asyncio
import html
import json
import subprocess
import sys
import time
from datetime import datetime, timedelta

import pynvml
import pytest
from fake_hub_api import FakeHub as FakeHubApi
from fake_pynvml import FakeGpu, install
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import UserDict
from sqlalchemy import event
from test_governor import governor, report_for
from traitlets.config import Config

from jupyter_gpu_gov import simulate
from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core import queue as core_queue
from jupyter_gpu_gov.core.clock import parse
from jupyter_gpu_gov.core.grant import DEVICES_STATE, GRANT_STATE
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.vocabulary import STOP_SERVER
from jupyter_gpu_gov.hub import metrics
from jupyter_gpu_gov.hub.hubapi import HubApiError
from jupyter_gpu_gov.hub.queue import QueueSync, releases
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.profiles import local
from jupyter_gpu_gov.profiles import queue as profile_queue
from jupyter_gpu_gov.profiles.config import GpuProfiles
from jupyter_gpu_gov.profiles.local import GpuSimpleLocalProcessSpawner, LocalGpus
from jupyter_gpu_gov.profiles.queue_pages import _cards, _withdraw_reclaims, places
from jupyter_gpu_gov.profiles.quota import CAPACITY
from jupyter_gpu_gov.profiles.spawner import GpuRefused, waiting_requests

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
MINUTE = timedelta(minutes=1)


@pytest.fixture
def hub(monkeypatch):
    """Two simulated H100s; vision is guaranteed one, interns may borrow both; lab (ben and
    carol) is guaranteed one. The governor was heard from: the line is offered."""
    config = Config()
    config.LocalGpus.backend = "simulated"
    config.LocalGpus.simulated_devices = [H100, H100]
    config.GpuProfiles.tiers = [{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"}]
    config.GpuProfiles.quotas = {
        "vision": {"guaranteed": {"h100": 1}},
        "interns": {"borrowing_limit": {"h100": 2}, "tiers": ["h100"]},
        "lab": {"guaranteed": {"h100": 1}},
    }
    config.GpuProfiles.team_map = {
        "vera": "vision", "ivan": "interns", "ines": "interns", "iris": "interns", "ben": "lab",
        "carol": "lab",
    }  # fmt: skip
    config.GpuProfiles.require_project = False
    for singleton in (GpuProfiles, LocalGpus):
        singleton.clear_instance()
    monkeypatch.setattr(profile_queue.FORECAST, "at", clock.utcnow())
    monkeypatch.setattr(profile_queue.REFUSED, "_at", {})  # the hub process's, per test
    monkeypatch.setattr(profile_queue.REFUSED, "_of", {})
    world = InMemoryHub(config)
    yield world
    world.db.close()
    clock.reset()
    for singleton in (GpuProfiles, LocalGpus):
        singleton.clear_instance()


class InMemoryHub:
    """A JupyterHub database in memory, its users wrapped as the hub wraps them."""

    def __init__(self, config: Config):
        self.db = orm.new_session_factory("sqlite://")()
        self.settings = {
            "spawner_class": GpuSimpleLocalProcessSpawner,
            "config": config,
            "hub": Hub(base_url="/hub/"),
        }
        self.users = self.settings["users"] = UserDict(lambda: self.db, self.settings)

    def spawner(self, name: str, server: str = "") -> GpuSimpleLocalProcessSpawner:
        row = orm.User.find(self.db, name)
        if row is None:
            row = orm.User(name=name)
            self.db.add(row)
            self.db.commit()
        return self.users[row].get_or_create_spawner(server, server)

    async def start(
        self, name: str, options: dict, started: datetime | None = None, server: str = ""
    ):
        """What ``User.spawn`` does up to the spawner's start: admission, then the record of a
        started server (the process itself is not needed here)."""
        spawner = self.spawner(name, server)
        spawner.user_options = dict(options)
        teams = await spawner.gpu_teams()
        await spawner.gpu_refresh()
        spawner._gpu_admit(teams)
        spawner.orm_spawner.started = (started or clock.utcnow()).replace(tzinfo=None)
        spawner.orm_spawner.state = spawner.get_state()
        self.db.commit()
        return spawner

    def stop(self, name: str) -> None:
        """What the Hub does when a server stops: not started, its state cleared."""
        spawner = self.spawner(name)
        spawner.clear_state()
        spawner.orm_spawner.started = None
        spawner.orm_spawner.state = spawner.get_state()
        self.db.commit()

    def serve(self, api: FakeHubApi, name: str, **server) -> str:
        """The server as the Hub's REST API shows the governor: its state from the database."""
        row = self.spawner(name).orm_spawner
        started = row.started.replace(tzinfo=clock.utcnow().tzinfo)
        api.add_server(name, started=started, state=dict(row.state), **server)
        return row.state[DEVICES_STATE][0]  # the card the allocator gave it


def grant(hub: InMemoryHub, name: str) -> dict:
    return dict(hub.spawner(name).orm_spawner.state.get(GRANT_STATE) or {})


def audit(gov, key: str) -> list[tuple[str, str]]:
    return [(a.action, a.reason) for a in gov.store.audit_rows(key)]


def culls(reason: str) -> float:
    return metrics.CULLS.labels(reason, STOP_SERVER)._value.get()


async def test_on_a_workstation_a_class_server_on_an_h100_is_asked_back_for_an_h100_guarantee(
    hub, monkeypatch
):
    """interns borrow both H100s as "any 80 GB card" (a capability class), not as H100s. vera,
    within vision's guarantee of one H100, was refused ("There is no H100 80 GB card here")
    and nothing was asked back: a class's server may hold another model. The allocator knows
    the devices each server holds: both are H100s, and the newer is asked back."""
    tiers = [
        {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"},
        {"name": "big", "display_name": "Any 80 GB card", "min_memory_gb": 80},
    ]
    monkeypatch.setattr(GpuProfiles.instance(config=hub.settings["config"]), "tiers", tiers)
    quotas = {**GpuProfiles.instance().quotas}
    quotas["interns"] = {"borrowing_limit": {"big": 2}, "tiers": ["h100", "big"]}
    monkeypatch.setattr(GpuProfiles.instance(), "quotas", quotas)
    now = clock.utcnow()
    await hub.start("ivan", {"profile": "big"}, started=now - timedelta(hours=2))
    await hub.start("ines", {"profile": "big"}, started=now - timedelta(hours=1))
    assert grant(hub, "ines")["gpu-gov/borrowed"] == "true"
    with pytest.raises(GpuRefused, match="so 1 is being taken back from them") as refused:
        await hub.start("vera", {"profile": "h100"})
    assert "(2 by Any 80 GB card servers)" in str(refused.value), refused.value
    assert grant(hub, "ines")["gpu-gov/reclaim-for"] == "vision"
    assert "gpu-gov/reclaim" not in grant(hub, "ivan")  # one card is all vera needs


async def test_on_a_workstation_an_h100_requests_wait_counts_on_class_servers_on_its_cards(
    hub, monkeypatch
):
    """interns hold both H100s as "any 80 GB card", within their guarantee (nothing to ask
    back); ines's server is due to stop in 15 minutes. vera's place in line for an H100 read
    the H100 tier's servers alone (none): "any moment now". The allocator's devices say both
    class servers hold H100s: her wait is ines's stop."""
    tiers = [
        {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"},
        {"name": "big", "display_name": "Any 80 GB card", "min_memory_gb": 80},
    ]
    monkeypatch.setattr(GpuProfiles.instance(config=hub.settings["config"]), "tiers", tiers)
    quotas = {**GpuProfiles.instance().quotas}
    quotas["interns"] = {"guaranteed": {"big": 2}, "tiers": ["h100", "big"]}
    monkeypatch.setattr(GpuProfiles.instance(), "quotas", quotas)
    await hub.start("ivan", {"profile": "big"})
    await hub.start("ines", {"profile": "big"})
    assert grant(hub, "ines")["gpu-gov/borrowed"] == "false"
    vera = hub.spawner("vera")
    admission = await vera.gpu_enqueue({"profile": "h100"})
    assert not admission.allowed and not admission.reclaim, admission
    due = clock.utcnow() + timedelta(minutes=15)
    why = f"a server holding it is due to stop by {due:%H:%M} UTC"
    monkeypatch.setattr(profile_queue.FORECAST, "releases", {"ines/": core_queue.Release(due, why)})
    estimate = places(vera.user)["vera/"]["estimate"]
    assert estimate.startswith("about 1") and estimate.endswith(f"({why})"), estimate


async def test_a_team_within_its_guarantee_joining_the_line_asks_a_borrowed_gpu_back(hub, tmp_path):
    """interns borrow both H100s; vera (vision, within its guarantee) joins the line instead
    of retrying: the most recently started borrowed server is asked back (the other keeps its
    GPU), its owner is warned with the reason and the time, and it is stopped after the grace
    even though its GPU is busy; the audit says why at each step."""
    now = clock.utcnow()
    await hub.start("ivan", {"profile": "h100"}, started=now - timedelta(hours=2))
    await hub.start("ines", {"profile": "h100"}, started=now - timedelta(hours=1))
    assert (
        grant(hub, "ivan")["gpu-gov/borrowed"] == grant(hub, "ines")["gpu-gov/borrowed"] == "true"
    )

    admission = await hub.spawner("vera").gpu_enqueue({"profile": "h100"})
    assert not admission.allowed and admission.limit == CAPACITY
    assert "Team vision is within its guarantee" in admission.reason
    assert [(q.user, q.team) for q in waiting_requests(hub.db)] == [("vera", "vision")]
    asked = grant(hub, "ines")
    assert asked["gpu-gov/reclaim-for"] == "vision" and "gpu-gov/reclaim" in asked
    assert "gpu-gov/reclaim" not in grant(hub, "ivan")  # one card is all vera needs

    reclaimed = culls("reclaim")
    async with FakeHubApi() as api:
        cards = {user: hub.serve(api, user) for user in ("ivan", "ines")}
        gov = governor(api, tmp_path)
        gov.policies = load_policies([], {"checkpoint": False, "reclaim_grace": "15m"})

        async def governor_pass():
            for user, card in cards.items():  # both at work on their GPUs
                gov.ingest(report_for(user, card, sm=0.9))
            await gov.reconcile()

        await governor_pass()
        notice = "team vision, within its guarantee, needs this borrowed GPU back"
        (warning,) = [why for action, why in audit(gov, "ines/") if action == "reclaim-warn"]
        assert warning.startswith(f"{notice}: it will be given back at ")
        # Her JupyterLab's verdict: her work goes on, with the deadline and why.
        told = gov.verdict("ines/")
        due = now + timedelta(minutes=15)
        assert told["state"] == "active" and abs(parse(told["cull_at"]) - due) < MINUTE, told
        assert warning in told["reason"], told
        # vera's estimate in line counts on it.
        forecast = releases(gov.store.servers(running_only=True))
        assert forecast["ines/"].at == parse(told["cull_at"]) and forecast["ivan/"].at is None
        assert gov.verdict("ivan/")["state"] == "active"

        clock.advance(14 * 60)
        await governor_pass()
        assert api.running("ines")  # the grace is not over: her work goes on
        clock.advance(61)
        await governor_pass()
        assert not api.running("ines") and api.running("ivan")
    (cull,) = [why for action, why in audit(gov, "ines/") if action == "cull"]
    assert notice in cull, cull
    assert culls("reclaim") - reclaimed == 1
    assert "reclaim-warn" not in dict(audit(gov, "ivan/"))


class SyncHandler:
    """What the hub's queue sync handler offers ``_withdraw_reclaims``: its database and users."""

    def __init__(self, hub: InMemoryHub):
        self.db, self.users, self.settings = hub.db, hub.users, hub.settings

    def find_user(self, name: str):
        row = orm.User.find(self.db, name)
        return None if row is None else self.users[row]


async def test_a_reclaim_is_withdrawn_when_the_spawn_it_was_for_leaves_the_line(hub, tmp_path):
    """vera (vision, within its guarantee) joins the line and ines's borrowed server is asked
    back and warned; vera then cancels. At the next sync the hub lifts the reclaim (no spawn
    waiting needs the card), the governor puts it on record, ines's verdict carries no deadline
    and she keeps her GPU past the grace. While vera waits, the sync keeps it; a reclaim asked
    for a refused spawn (told to retry) is never lifted this way. Before: ines lost her server
    15 minutes after vera had gone."""
    now = clock.utcnow()
    await hub.start("ivan", {"profile": "h100"}, started=now - timedelta(hours=2))
    await hub.start("ines", {"profile": "h100"}, started=now - timedelta(hours=1))
    await hub.spawner("vera").gpu_enqueue({"profile": "h100"})
    assert grant(hub, "ines")["gpu-gov/reclaim-by"] == "vera/"
    handler = SyncHandler(hub)
    assert await _withdraw_reclaims(handler, clock.utcnow()) == []  # vera waits: it stands
    assert "gpu-gov/reclaim" in grant(hub, "ines")

    async with FakeHubApi() as api:
        cards = {user: hub.serve(api, user) for user in ("ivan", "ines")}
        gov = governor(api, tmp_path)
        gov.policies = load_policies([], {"checkpoint": False, "reclaim_grace": "15m"})
        standby = governor(api, tmp_path)  # up from the start: it takes over later
        standby.policies = gov.policies

        async def governor_pass():
            for user, card in cards.items():
                gov.ingest(report_for(user, card, sm=0.9))
            await gov.reconcile()

        await governor_pass()
        assert "reclaim-warn" in dict(audit(gov, "ines/")) and gov.verdict("ines/")["cull_at"]
        assert gov.verdict("ines/")["reclaim_withdrawn"] is None
        clock.advance(5 * 60)
        assert hub.spawner("vera").gpu_cancel()
        lifted = await _withdraw_reclaims(handler, clock.utcnow())
        assert [(w["server"], w["team"], w["by"]) for w in lifted] == [("ines/", "vision", "vera/")]
        left = grant(hub, "ines")
        assert not {"gpu-gov/reclaim", "gpu-gov/reclaim-for", "gpu-gov/reclaim-by"} & set(left)
        assert left["gpu-gov/borrowed"] == "true"
        withdrawn_at = clock.utcnow()
        gov.spawn_queue._withdrawn(lifted, withdrawn_at)
        hub.serve(api, "ines")  # the Hub API now shows her state without the request
        await governor_pass()
        told = gov.verdict("ines/")
        assert told.get("cull_at") is None
        # She was told of the deadline: her JupyterLab is told it is lifted, on the verdict
        # her server's report gets back as on the one it polls.
        assert told["reclaim_withdrawn"] == clock.isoformat(withdrawn_at)
        answered = json.loads(gov.answer("ines/"))["verdict"]
        assert answered["reclaim_withdrawn"] == told["reclaim_withdrawn"]
        assert gov.verdict("ivan/")["reclaim_withdrawn"] is None  # his was never asked back
        clock.advance(11 * 60)  # past the grace of the request withdrawn
        await governor_pass()
        assert api.running("ines")
        assert gov.verdict("ines/")["reclaim_withdrawn"] == told["reclaim_withdrawn"]
        # A restart in those 15 minutes (a governor new on the same store), or the standby
        # taking over, says it still, from the same time: the audit row is its record (it was
        # held in memory alone: ines's JupyterLab, which had not polled yet, never said it).
        restarted = governor(api, tmp_path)
        restarted.policies = gov.policies
        standby.take_over()
        for other in (restarted, standby):
            assert other.verdict("ines/")["reclaim_withdrawn"] == told["reclaim_withdrawn"]
            answered = json.loads(other.answer("ines/"))["verdict"]
            assert answered["reclaim_withdrawn"] == told["reclaim_withdrawn"]
            assert other.verdict("ivan/")["reclaim_withdrawn"] is None
        clock.advance(4 * 60)  # RECLAIM_WITHDRAWN_NOTICE after: said long enough
        await governor_pass()
        late = governor(api, tmp_path)  # ...and a restart after it does not bring it back
        late.policies = gov.policies
        for other in (gov, restarted, standby, late):
            assert other.verdict("ines/")["reclaim_withdrawn"] is None
            assert json.loads(other.answer("ines/"))["verdict"]["reclaim_withdrawn"] is None
        for other in (restarted, standby, late):
            await other.close()
    (why,) = [r for a, r in audit(gov, "ines/") if a == "reclaim-withdrawn"]
    assert "team vision" in why and "deadline is lifted" in why, why
    assert "cull" not in dict(audit(gov, "ines/"))

    # A reclaim asked for a spawn refused now (not waiting) stands: it was told to retry.
    hub.stop("ivan")
    await hub.start("iris", {"profile": "h100"})  # interns borrow both cards again
    with pytest.raises(GpuRefused, match="being taken back"):
        await hub.start("vera", {"profile": "h100"})
    assert "gpu-gov/reclaim" in grant(hub, "iris") and "gpu-gov/reclaim-by" not in grant(
        hub, "iris"
    )
    assert await _withdraw_reclaims(handler, clock.utcnow()) == []


async def test_the_workstations_hub_names_its_cards_at_the_sync(hub):
    """The queue sync names the physical cards the allocator reads (both simulated H100s,
    held or not): the governor's fragmentation figure counts a free one without DCGM. A hub
    whose spawner is not the workstation's names none (its capacity is per tier, not per
    card)."""
    handler = SyncHandler(hub)
    before = await _cards(handler)
    assert len(before) == 2 and all(card.startswith("GPU-") for card in before)
    await hub.start("ivan", {"profile": "h100"})
    assert await _cards(handler) == before
    handler.settings = {**hub.settings, "spawner_class": object}
    assert await _cards(handler) == []


async def test_a_server_started_from_the_line_that_nobody_opens_is_given_back_and_counted(
    hub, tmp_path
):
    """carol holds lab's card; ben waits in line. Her server stops, his starts from the line
    (admission records when he joined and how long he has to open it). Nobody opens it: the
    governor's pass gives it back once the claim window (15 minutes) is over, and counts it."""
    await hub.start("carol", {"profile": "h100"})
    await hub.start("ivan", {"profile": "h100"})  # the second card: borrowed
    refused = await hub.spawner("ben").gpu_enqueue({"profile": "h100"})
    assert not refused.allowed and [q.user for q in waiting_requests(hub.db)] == ["ben"]
    hub.stop("carol")
    ben = await hub.start("ben", hub.spawner("ben").gpu_queued.options)
    assert waiting_requests(hub.db) == [] and ben.gpu_grant["gpu-gov/claim-within"] == "900"
    assert "gpu-gov/queued-at" in ben.gpu_grant

    unclaimed = culls("unclaimed")
    async with FakeHubApi() as api:
        # The Hub stamps activity as the server starts; nobody uses it after that.
        card = hub.serve(api, "ben", last_activity=clock.utcnow())
        gov = governor(api, tmp_path)

        async def governor_pass():
            gov.ingest(report_for("ben", card, sm=0.0))  # no person's request in its report
            await gov.reconcile()

        await governor_pass()
        clock.advance(14 * 60)
        await governor_pass()
        assert api.running("ben") and culls("unclaimed") == unclaimed
        clock.advance(61)
        await governor_pass()
        assert not api.running("ben")
    (cull,) = [why for action, why in audit(gov, "ben/") if action == "cull"]
    assert "not opened within 15m: its GPU is given back to the line" in cull, cull
    assert culls("unclaimed") - unclaimed == 1


async def test_spawns_refused_for_want_of_a_card_are_counted_until_they_wait_in_line_or_start(hub):
    """What the hub sends the governor as ``refused`` (the cluster report's demand): servers
    the spawner refused for want of a free card, once each however often retried, until they
    join the line (counted there) or start; a refusal for a quota is not counted."""
    await hub.start("ivan", {"profile": "h100"})
    await hub.start("ines", {"profile": "h100"})  # interns borrow both cards

    def refused() -> int:
        return profile_queue.REFUSED.count(clock.utcnow())

    for _ in range(2):  # ben retries: one server, counted once
        with pytest.raises(GpuRefused, match="All 2 H100 80 GB"):
            await hub.start("ben", {"profile": "h100"})
    with pytest.raises(GpuRefused, match="All 2 H100 80 GB"):
        await hub.start("carol", {"profile": "h100"})
    assert refused() == 2
    with pytest.raises(GpuRefused, match="may borrow at most 2 "):  # a quota, not a card
        await hub.start("iris", {"profile": "h100"})
    assert refused() == 2
    await hub.spawner("ben").gpu_enqueue({"profile": "h100"})
    assert refused() == 1  # ben waits in line now: counted as queued, not refused
    hub.stop("ines")  # a card frees for lab's guarantee: ben is first in line for it
    with pytest.raises(GpuRefused, match="1 request is waiting in line for H100 80 GB before"):
        await hub.start("carol", {"profile": "h100"})
    assert refused() == 1  # carol, for want of a card the line takes first
    await hub.start("ben", hub.spawner("ben").gpu_queued.options)
    hub.stop("ben")
    await hub.start("carol", {"profile": "h100"})
    assert refused() == 0  # she started


async def test_one_user_asking_for_many_server_names_counts_as_the_servers_they_may_wait_with(
    hub, caplog
):
    """A server's name is its owner's choice: ben asking for a GPU under a new name each time
    (a loop over the REST API) counted one refused spawn each, the cluster's demand for cards
    that makes partly used ones fragmentation (3,600 an hour at one a second; past 100,000
    nobody else's refusals were counted). A user counts for as many servers as they may wait
    in line with (``queue_per_user``, 2), their newest refusals, said in the log; carol's own
    refusal still counts."""
    await hub.start("ivan", {"profile": "h100"})
    await hub.start("ines", {"profile": "h100"})  # interns borrow both cards
    with pytest.raises(GpuRefused, match="All 2 H100 80 GB"):
        await hub.start("carol", {"profile": "h100"})
    with caplog.at_level("INFO"):
        for i in range(30):
            with pytest.raises(GpuRefused, match="All 2 H100 80 GB"):
                await hub.start("ben", {"profile": "h100"}, server=f"gpu-{i}")
    now = clock.utcnow()
    assert profile_queue.REFUSED.count(now) == 3  # ben's two newest, and carol's
    assert profile_queue.REFUSED.tiers(now) == {"h100": 3}
    assert "gpu-gov: ben's refused spawns count for at most 2 servers" in caplog.text
    assert "ben/gpu-27 is no longer counted in the cluster's refused demand" in caplog.text
    await hub.spawner("ben", "gpu-29").gpu_enqueue({"profile": "h100"})
    assert profile_queue.REFUSED.count(now) == 2  # in line now: counted there


async def test_the_governor_forgets_a_refused_start_once_its_request_left_the_line(tmp_path):
    """The Hub refuses a start from the line (a named server past the Hub's own limit): the
    governor tries it again after a minute, not every pass. Ben joined the line under a new name
    each time, each start refused, then cancelled: every name was kept for the service's life.
    Now only while its request waits, or for the minute after."""

    class Hub:
        line: list = []

        async def request(self, method, path, body=None):
            if path == "gpu-gov/queue":
                return {"line": self.line, "left": [], "refused": 0}
            raise HubApiError(403, "ben has reached the limit of named servers", method=method)

    hub = Hub()
    spawn_queue = QueueSync(hub, Store(f"sqlite:///{tmp_path / 'gov.sqlite'}"))
    now = clock.utcnow()
    for i in range(30):
        asked = core_queue.QueuedRequest("ben", f"gpu-{i}", "lab", "h100", {}, now, now + MINUTE)
        hub.line = [core_queue.Waiting(asked, 1, True, "its turn", limit="").to_json()]
        await spawn_queue.sync(now)  # started, refused by the Hub
        hub.line = []  # ben cancels
        now += MINUTE / 2
    await spawn_queue.sync(now)
    assert list(spawn_queue._refused) == ["ben/gpu-29"]  # refused within the minute
    now += MINUTE
    await spawn_queue.sync(now)
    assert spawn_queue._refused == {}


async def test_a_server_that_starts_while_asking_to_wait_does_not_join_the_line(hub):
    """The join page checks that the server is not running, then asking to wait reads the cards
    (awaited): a start of the same server may begin meanwhile (another tab, the governor). It
    then joined the line as well: a request nobody can start stood ahead of the others on the
    tier until it expired, asked borrowed cards back for it, and rewrote the running server's
    options. It is refused instead, and nothing changes."""
    await hub.start("ivan", {"profile": "h100"})
    await hub.start("ines", {"profile": "h100"})  # interns borrow both cards
    ben = hub.spawner("ben")
    read = ben.gpu_refresh

    async def a_start_begins_meanwhile():
        await read()
        ben._spawn_pending = True  # JupyterHub's mark of a start under way

    ben.gpu_refresh = a_start_begins_meanwhile
    with pytest.raises(GpuRefused, match="is running or starting already"):
        await ben.gpu_enqueue({"profile": "h100"})

    assert waiting_requests(hub.db) == []
    assert not any("gpu-gov/reclaim" in grant(hub, user) for user in ("ivan", "ines"))
    assert ben.orm_spawner.user_options in (None, {})


async def test_a_card_a_leftover_run_works_on_is_handed_out_last(hub, tmp_path, monkeypatch):
    """Vera's `nohup python train.py &` outlives her server: the Hub's stop frees the card in
    the records, but the run still holds 20 GB and works at 90 %. The next server gets the
    other card while one is free (only when none is does it get the busy one)."""
    monkeypatch.setenv("JUPYTER_GPU_GOV_SIM_STATE", str(tmp_path / "sim.json"))
    card = (await hub.start("vera", {"profile": "h100"})).gpu_devices[0]
    hub.stop("vera")
    run = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from jupyter_gpu_gov import simulate; simulate.hold(20000, device={card!r}); "
            f"simulate.load(0.9, device={card!r}); import time; time.sleep(120)",
        ]
    )
    try:
        gpus = LocalGpus.instance()
        deadline = time.monotonic() + 60
        while not gpus._backend.sample().samples[card].processes:
            assert time.monotonic() < deadline, "the run never showed on its card"
            await asyncio.sleep(0.1)
        assert (await hub.start("ben", {"profile": "h100"})).gpu_devices[0] != card
        assert (await hub.start("ivan", {"profile": "h100"})).gpu_devices[0] == card
    finally:
        run.kill()
        run.wait()


async def test_cards_that_cannot_be_read_are_never_handed_out(hub, tmp_path, monkeypatch):
    """NVML fails (a driver in a bad state; one that hangs: tests/test_hung_driver_hub.py).
    The cards' state is unknown, and unknown is never free: the spawn is refused naming why,
    not offered a place in line (it would not say why, nor could it be ranked), and the form
    says it on each tier. The failure raised out of admission before: a 500 for the user.
    Once NVML answers, the cards are handed out again without a restart."""
    monkeypatch.setenv("JUPYTER_GPU_GOV_SIM_STATE", str(tmp_path / "sim.json"))
    await hub.start("vera", {"profile": "h100"})
    gpus = LocalGpus.instance()
    answer = gpus._backend.sample

    def failing():
        raise RuntimeError("NVML: Unknown Error")

    monkeypatch.setattr(gpus._backend, "sample", failing)
    why = (
        "GPU state unknown: the GPUs of this machine could not be read (RuntimeError: NVML: "
        "Unknown Error), so none is handed out until they answer. Try again in a few minutes."
    )
    with pytest.raises(GpuRefused) as refused:
        await hub.start("ben", {"profile": "h100"})
    assert refused.value.jupyterhub_message == why
    with pytest.raises(GpuRefused) as refused:
        await hub.spawner("ben").gpu_enqueue({"profile": "h100"})
    assert refused.value.jupyterhub_message == why
    assert waiting_requests(hub.db) == []
    assert why.replace("(", "").split(",")[0] in html.unescape(
        (await hub.spawner("ben").get_options_form()).replace("(", "")
    )
    assert DEVICES_STATE not in (hub.spawner("ben").orm_spawner.state or {})

    monkeypatch.setattr(gpus._backend, "sample", answer)
    assert len((await hub.start("ben", {"profile": "h100"})).gpu_devices) == 1


async def test_cards_nvml_fails_on_are_unknown_not_all_in_use(hub, monkeypatch):
    """NVML fails (the driver unloaded, the GPUs lost): the backend reads ``unavailable``,
    which is unknown, not no cards. The allocator counted no devices: 'All H100 80 GB cards are
    in use', and the line was offered for cards that may all be free once the driver is back
    (ben joined it). Now the spawn and the line are refused naming NVML's words; once NVML
    answers, the card is handed out."""
    fake = install(monkeypatch, FakeGpu("GPU-a", name=H100["name"], memory_total_mb=81559))
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    hub.spawner("ben").local_gpus.backend = "nvml"
    with pytest.raises(GpuRefused) as refused:
        await hub.start("ben", {"profile": "h100"})
    message = refused.value.jupyterhub_message
    assert message.startswith("GPU state unknown: the GPUs of this machine could not be read ("), (
        message
    )
    assert "Driver Not Loaded" in message, message
    with pytest.raises(GpuRefused) as refused:
        await hub.spawner("ben").gpu_enqueue({"profile": "h100"})
    assert refused.value.jupyterhub_message == message
    assert waiting_requests(hub.db) == []

    fake.init_error = None  # the driver is loaded again
    assert (await hub.start("ben", {"profile": "h100"})).gpu_devices == ("GPU-a",)


async def test_a_waiting_servers_place_never_reads_a_stale_reading_as_the_cards_now(
    hub, tmp_path, monkeypatch
):
    """The Hub's pages show a waiting server's place from the allocator's last reading of the
    cards, without reading them again (a page must not wait on the driver). That reading was
    used however old: ben's home page said "starting now" for a card that had failed since
    (the next read withholds it), and would as well for cards that no longer answer. Now a
    reading older than ``FRESH_FOR_S`` is unknown, and the page says so; once the cards are
    read again (every governor pass reads them for the line's sync) it is the cards' state."""
    monkeypatch.setenv("JUPYTER_GPU_GOV_SIM_STATE", str(tmp_path / "sim.json"))
    await hub.start("ivan", {"profile": "h100"})
    card = (await hub.start("ines", {"profile": "h100"})).gpu_devices[0]
    ben = hub.spawner("ben")
    await ben.gpu_enqueue({"profile": "h100"})
    hub.stop("ines")
    await ben.gpu_refresh()  # the governor's sync reads the cards: ines's card is free
    assert places(ben.user)["ben/"]["estimate"] == "starting now"

    simulate.fail(xid=79, device=card)  # meanwhile, unread: the free card fell off the bus
    gpus = LocalGpus.instance()
    gpus._read_at -= local.FRESH_FOR_S + 1  # and nobody read the cards for two minutes
    place = places(ben.user)["ben/"]
    assert place["estimate"] == "GPU state unknown now (the cards have not been read lately)"
    assert place["position"] == "1st" and place["sooner"] == ""
    assert ben.gpu_unknown().startswith("GPU state unknown: the GPUs of this machine were last")

    await ben.gpu_refresh()  # read again: the failed card is withheld, nothing is free
    assert ben.gpu_unknown() is None
    assert places(ben.user)["ben/"]["estimate"] not in ("starting now", "")
    simulate.heal()
    await ben.gpu_refresh()
    assert places(ben.user)["ben/"]["estimate"] == "starting now"


async def test_a_server_counts_gpus_by_index_as_nvml_does(hub):
    """The allocator names its cards by UUID, which CUDA takes whatever its order; a card named
    by index in the server (an admin's or the user's ``CUDA_VISIBLE_DEVICES=1``) must be the
    card NVML, nvidia-smi and the server's sampler call 1: CUDA counts fastest first unless
    told ``PCI_BUS_ID``, another card on a machine with mixed cards."""
    env = (await hub.start("vera", {"profile": "h100"})).get_env()
    card = hub.spawner("vera").gpu_devices[0]
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == (card, "PCI_BUS_ID")
    hub.spawner("vera").environment = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}  # an admin's word
    assert hub.spawner("vera").get_env()["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


async def test_a_workstation_spawn_reads_the_cards_held_from_the_kept_count(hub):
    """Which cards are taken was found by decoding every started server's state again at each
    spawn and form view (a second full count beside the kept one): now from the hub's kept
    count, which the same step brought up to date. The answer is the same; no statement runs;
    a stop frees the card at the next look."""
    await hub.start("ivan", {"profile": "h100"})
    card = hub.spawner("ivan").orm_spawner.state[DEVICES_STATE][0]
    vera = hub.spawner("vera")
    vera.gpu_held()  # the count, as the form and admission read it before the devices
    statements = []

    def counted(*_):
        statements.append(1)

    event.listen(hub.db.get_bind(), "before_cursor_execute", counted)
    try:
        assert vera._held() == {card: ["h100"]}
    finally:
        event.remove(hub.db.get_bind(), "before_cursor_execute", counted)
    assert statements == []

    # ivan's own spawner leaves his own row out; a second spawn takes the other card.
    assert hub.spawner("ivan")._held() == {}
    await hub.start("vera", {"profile": "h100"})
    other = hub.spawner("vera").orm_spawner.state[DEVICES_STATE][0]
    assert other != card
    hub.stop("ivan")
    ines = hub.spawner("ines")
    ines.gpu_held()
    assert ines._held() == {other: ["h100"]}


async def test_the_forms_total_is_the_machines_cards_whatever_tier_holds_them(hub):
    """Four H100s, a pair holding two, one H100 another: the form said "1 of 2 free" (the H100
    tier's server plus the free card), as if the machine had two. The free count stands; the
    total is the machine's cards, as the workstation admin counts them."""
    config = hub.settings["config"]
    config.LocalGpus.simulated_devices = [H100] * 4
    config.GpuProfiles.tiers = [
        {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"},
        {"name": "h100x2", "display_name": "Two H100s", "gpu": "H100-80GB", "count": 2},
    ]
    config.GpuProfiles.quotas = {
        **config.GpuProfiles.quotas,
        "interns": {"borrowing_limit": {"h100x2": 2}, "tiers": ["h100x2"]},
    }
    await hub.start("ivan", {"profile": "h100x2"})
    await hub.start("vera", {"profile": "h100"})
    form = html.unescape(await hub.spawner("ben").get_options_form())
    assert "lab: 1 of 1 guaranteed left · 1 of 4 free" in form, form
