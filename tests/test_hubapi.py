"""HubApi against the fake Hub over real HTTP, and against a real JupyterHub."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from types import MappingProxyType

import pytest
from fake_hub_api import ADMIN_SCOPES, FakeHub
from hub_harness import hub_fixture
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.log import app_log
from tornado.netutil import bind_sockets

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core import grant as grant_
from jupyter_gpu_gov.core.grant import GRANT_STATE
from jupyter_gpu_gov.core.text import stored_name
from jupyter_gpu_gov.hub import hubapi
from jupyter_gpu_gov.hub.hubapi import NO_RESPONSE, HubApi, HubApiError, HubServer, NotSent
from jupyter_gpu_gov.hub.listing import STOP_LAG, HubListing
from jupyter_gpu_gov.hub.ownership import resolve
from jupyter_gpu_gov.hub.proc_cpu import spawner_pid
from jupyter_gpu_gov.hub.trusted import Granted


def client(hub: FakeHub, **kwargs) -> HubApi:
    return HubApi(hub.api_url, kwargs.pop("token", hub.token), **kwargs)


def scripted_hub(routes: list) -> tuple[HTTPServer, HubApi]:
    """A Hub API answering as ``routes`` (tornado handlers under ``/hub/api``) script it, and a
    client of it."""
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(web.Application(routes))
    server.add_sockets(sockets)
    return server, HubApi(f"http://127.0.0.1:{sockets[0].getsockname()[1]}/hub/api", "t")


# --- listing -----------------------------------------------------------------------------------
async def test_servers_listed_across_pages():
    now = clock.utcnow().replace(microsecond=0)
    async with FakeHub() as hub:
        for i in range(7):
            hub.add_user(f"u{i}", admin=i == 0, groups=["physics"])
            hub.add_server(
                f"u{i}",
                last_activity=now - timedelta(minutes=i),
                started=now - timedelta(hours=1),
                user_options={"profile": "a100"},
                state={"pod_name": f"jupyter-u{i}"},
            )
        for i in range(3):  # no servers: not listed with state=ready
            hub.add_user(f"idle{i}")
        hub.add_server("u3", "gpu", user_options={"profile": "mig"})
        api = client(hub, page_size=3)
        servers = await api.list_servers()
    assert hub.counters["GET /users"] == 3  # 7 active users, 3 a page
    assert api.request_count == 3
    assert len(servers) == 8
    by_key = {s.key: s for s in servers}
    u0 = by_key["u0/"]
    assert u0 == HubServer(
        user="u0",
        name="",
        admin=True,
        groups=("physics",),
        url="/user/u0/",
        started=now - timedelta(hours=1),
        last_activity=now,
        user_options={"profile": "a100"},
        pending=None,
        ready=True,
        spawner_state={"pod_name": "jupyter-u0"},
    )
    assert u0.last_activity.tzinfo is not None
    assert by_key["u3/gpu"].name == "gpu"
    assert by_key["u3/gpu"].url == "/user/u3/gpu/"
    assert by_key["u3/gpu"].last_activity is None


async def test_ready_filter_leaves_short_pages_and_pending_servers():
    async with FakeHub() as hub:
        for i in range(6):
            hub.add_server(f"u{i}", ready=i % 2 == 0)  # odd users are still spawning
        hub.add_server("u0", "starting", ready=False)
        api = client(hub, page_size=2)
        ready = await api.list_servers()
        active = await api.list_servers(state="active")
    # The Hub filters 'ready' after slicing: every page has one user, and all three are found.
    assert sorted(s.key for s in ready) == ["u0/", "u2/", "u4/"]
    assert len(active) == 7
    assert {s.pending for s in active if not s.ready} == {"spawn"}


async def test_hub_default_page_size():
    async with FakeHub(page_default=50) as hub:
        hub.populate(120)
        api = client(hub)  # page_size=0: no limit asked
        servers = await api.list_servers()
    assert len(servers) == 120
    assert hub.counters["GET /users"] == 3


async def test_plain_list_from_old_hub():
    async with FakeHub(paginate=False) as hub:
        hub.populate(300, running=0.5, seed=1)
        api = client(hub, page_size=10)
        servers = await api.list_servers()
        everyone = [u async for u in api.iter_users(state=None)]
    assert hub.counters["GET /users"] == 2  # one request each, the whole list
    assert len(servers) == len(hub._active_ids)
    assert len(everyone) == 300


async def test_without_pagination_header_hub_truncates_lists():
    """Why the Accept header matters: a Hub 2+ cuts plain lists at api_page_max_limit."""
    async with FakeHub(page_max=200) as hub:
        hub.populate(250)
        api = client(hub)
        plain = await api.request("GET", "/users", params={"state": "ready"})
        paged = await api.list_servers()
    assert len(plain) == 200
    assert len(paged) == 250


async def test_ten_thousand_users():
    async with FakeHub(page_max=200) as hub:
        hub.populate(10_000, running=0.8, named=1)
        api = client(hub, page_size=200)
        servers = await api.list_servers()  # how fast: benchmarks/reconcile.py, at 10,000
    running_users = len(hub._active_ids)
    assert len(servers) == 2 * running_users
    assert hub.counters["GET /users"] == -(-running_users // 200)
    assert len({s.key for s in servers}) == len(servers)


async def test_leaving_a_listing_early_cancels_the_prefetch():
    async with FakeHub(latency=0.05) as hub:
        hub.populate(30)
        api = client(hub, page_size=5)
        users = api.iter_users()
        first = await anext(users)
        await users.aclose()
        await asyncio.sleep(0.1)
    assert first["name"] == "user00"
    assert hub.counters["GET /users"] <= 2  # the page we read and at most the prefetched one


async def test_groups_paginated_with_properties():
    async with FakeHub() as hub:
        for i in range(5):
            hub.add_group(f"team{i}", users=[f"u{i}"], properties={"gpu_quota": i})
        api = client(hub, page_size=2)
        groups = await api.get_groups()
    assert [g["name"] for g in groups] == [f"team{i}" for i in range(5)]
    assert groups[3]["properties"] == {"gpu_quota": 3}
    assert groups[3]["users"] == ["u3"]
    assert hub.counters["GET /groups"] == 3


async def test_spawner_state_needs_its_scope():
    async with FakeHub() as hub:
        hub.add_server("alice", state={"pid": 42})
        hub.add_token("limited", ADMIN_SCOPES - {"admin:server_state"})
        full = await client(hub).list_servers()
        limited = await client(hub, token="limited").list_servers()
    assert full[0].spawner_state == {"pid": 42}
    assert limited[0].spawner_state is None


async def test_a_listed_server_keeps_what_the_governor_reads_of_its_model_not_the_rest():
    """At 10,000 servers each server's model, kept whole as the Hub's JSON decoded it, was
    ~1 kB of the service's memory: KubeSpawner's DNS name and version, its namespace and every
    choice again for each server. A server now keeps what decisions read (its grant, devices,
    pod, pid; the profile and project chosen), each decision the same as on the whole model;
    servers that chose the same share one read-only copy; the rest (a user's 100 kB option
    too) is not kept."""
    grant = {"gpu-gov/team": "physics", "gpu-gov/tier": "a100"}
    gpus = [{"uuid": "MIG-1", "parent_uuid": "GPU-1", "mig_profile": "1g.10gb"}]
    states = [
        {
            "kubespawner_version": "7.1.0",
            "pod_name": f"jupyter-u{i}",
            "namespace": "jhub",
            "dns_name": f"jupyter-u{i}.jhub.svc.cluster.local",
            "gpu_gov_grant": dict(grant),
            "gpu_gov_gpus": gpus,
        }
        for i in range(2)
    ] + [{"pid": 4242, "gpu_gov_grant": {}, "gpu_gov_devices": ["GPU-2"]}]
    options = {"profile": "a100", "project": "lhc", "image": "x" * 100_000}
    async with FakeHub() as hub:
        for i, state in enumerate(states):
            hub.add_server(f"u{i}", state=state, user_options=dict(options))
        listed = {s.user: s for s in await client(hub).list_servers()}
    assert sorted(listed) == ["u0", "u1", "u2"]
    for i, state in enumerate(states):
        kept = listed[f"u{i}"]
        assert "dns_name" not in kept.spawner_state
        assert "kubespawner_version" not in kept.spawner_state
        assert dict(kept.user_options) == {"profile": "a100", "project": "lhc"}
        # every decision the same as on the whole model
        for read in (grant_.labels, grant_.devices, grant_.pod, grant_.no_gpu, spawner_pid):
            assert read(kept.spawner_state) == read(state)
        assert Granted.of(kept.spawner_state) == Granted.of(state)
        assert resolve(kept.user, kept.user_options, kept.spawner_state, (), {}, {}) == resolve(
            kept.user, options, state, (), {}, {}
        )
    u0, u1 = listed["u0"], listed["u1"]
    assert u0.user_options is u1.user_options  # one copy for the servers that chose the same
    assert u0.spawner_state["namespace"] is u1.spawner_state["namespace"]
    # and the servers granted the same, one copy of the grant (an empty one too: no GPU)
    assert u0.spawner_state["gpu_gov_grant"] is u1.spawner_state["gpu_gov_grant"]
    with pytest.raises(TypeError):
        u0.user_options["profile"] = "h100"  # shared: nobody's to change
    with pytest.raises(TypeError):
        u0.spawner_state["gpu_gov_grant"]["gpu-gov/tier"] = "h100"


def test_what_listed_servers_share_of_their_models_cannot_be_changed_through_one():
    """Servers that chose the same options, or were granted the same, hold one mapping between
    them (``hubapi.kept_options``, ``kept_state``): an edit through one server would change
    every other's choices or grant, and so the decisions on them. Every mapping more than one
    server holds of its model is read-only; what is not shared (a choice too long, a grant too
    large) is a server's own."""
    big_grant = {f"gpu-gov/l{i}": "x" for i in range(hubapi.SHARED_GRANT_KEYS + 1)}
    long_choice = "x" * (hubapi.SHARED_CHOICE_MAX + 1)
    servers = []
    for i in range(60):
        grant = {"gpu-gov/team": f"team{i % 3}", "gpu-gov/tier": "a100"} if i % 4 else {}
        state = {"pod_name": f"jupyter-u{i}", "namespace": "jhub", GRANT_STATE: grant}
        if i % 10 == 9:
            state[GRANT_STATE] = big_grant
        options = [{}, {"profile": "a100"}, {"profile": long_choice}, {"project": "lhc"}][i % 4]
        model = {"state": state, "user_options": {**options, "image": f"img{i}"}}
        # each server's model decoded on its own, as the Hub's JSON is
        servers.append(HubServer.from_models({"name": f"u{i}"}, "", json.loads(json.dumps(model))))

    holders: dict[int, tuple[object, set[str]]] = {}

    def hold(value, user: str) -> None:
        if isinstance(value, Mapping | list):
            holders.setdefault(id(value), (value, set()))[1].add(user)
            for inner in value.values() if isinstance(value, Mapping) else value:
                hold(inner, user)

    for server in servers:
        hold(server.user_options, server.user)
        hold(server.spawner_state, server.user)
    shared = [value for value, users in holders.values() if len(users) > 1]
    # the empty options, each choice, the empty grant and each team's grant
    assert len(shared) >= 1 + 2 + 1 + 3, shared
    for value in shared:
        assert isinstance(value, MappingProxyType), value
        with pytest.raises(TypeError):
            value["gpu-gov/tier"] = "h100"
    large = [s.spawner_state[GRANT_STATE] for s in servers if len(s.spawner_state[GRANT_STATE]) > 2]
    assert len({id(grant) for grant in large}) == len(large) > 1  # each its own
    own = [s.user_options for s in servers if s.user_options.get("profile") == long_choice]
    assert len({id(options) for options in own}) == len(own) > 1


async def test_concurrency_bound_is_respected():
    async with FakeHub(latency=0.03) as hub:
        for i in range(20):
            hub.add_server(f"u{i}")
        api = client(hub, concurrency=3)
        users = await asyncio.gather(*(api.get_user(f"u{i}") for i in range(20)))
        assert hub.max_in_flight == 3
        results = await asyncio.gather(*(api.stop_server(f"u{i}") for i in range(20)))
    assert all(u is not None for u in users)
    assert results == ["stopped"] * 20
    assert hub.max_in_flight == 3
    assert hub.counters["stops"] == 20


# --- stopping ----------------------------------------------------------------------------------
async def test_slow_stop_answers_stopping_then_server_goes():
    async with FakeHub() as hub:
        # Every DELETE and every listing that reaches alice counts as a poll.
        hub.add_server("alice", slow_stop=4)
        hub.add_server("bob")
        api = client(hub)
        assert await api.stop_server("alice") == "stopping"
        assert await api.stop_server("alice") == "stopping"  # asking again: still stopping
        # Stopping is not ready: the next cycle does not see it as a running server.
        assert [s.user for s in await api.list_servers()] == ["bob"]
        assert [(s.user, s.pending) for s in await api.list_servers(state="active")] == [
            ("alice", "stop"),
            ("bob", None),
        ]
        for _ in range(2):
            user = await api.get_user("alice")
            if not user["servers"]:
                break
        assert user["servers"] == {}
        assert not hub.running("alice")
    assert hub.counters["stops"] == 1
    assert hub.counters["slow_stops"] == 1


async def test_stopping_what_is_not_there():
    async with FakeHub() as hub:
        hub.add_user("alice")
        api = client(hub)
        assert await api.stop_server("nobody") == "gone"  # 404
        assert await api.stop_server("alice", "gpu") == "gone"  # 404: no such named server
        assert await api.stop_server("alice") == "stopped"  # 204: the Hub's answer, idempotent
    async with FakeHub(named_servers=False) as hub:
        hub.add_server("alice")
        assert await client(hub).stop_server("alice", "gpu") == "gone"  # 400: not enabled
    assert hub.counters["stops"] == 0


async def test_named_server_stopped_or_removed():
    async with FakeHub() as hub:
        hub.add_server("alice", "keep")
        hub.add_server("alice", "drop")
        hub.add_server("alice")
        api = client(hub)
        assert await api.stop_server("alice", "keep") == "stopped"
        assert await api.stop_server("alice", "drop", remove=True) == "stopped"
        assert await api.stop_server("alice", remove=True) == "stopped"  # default: stop only
        servers = hub.users["alice"].servers
        assert "keep" in servers and not servers["keep"].active
        assert "drop" not in servers
        assert hub.counters["removed"] == 1
        # A stopped named server can still be removed.
        assert await api.stop_server("alice", "keep", remove=True) == "stopped"
        assert "keep" not in servers
        assert (await api.get_user("alice"))["servers"] == {}


async def test_slow_stop_with_remove_removes_when_done():
    async with FakeHub() as hub:
        hub.add_server("alice", "gpu", slow_stop=1)
        api = client(hub)
        assert await api.stop_server("alice", "gpu", remove=True) == "stopping"
        await api.get_user("alice")
    assert "gpu" not in hub.users["alice"].servers
    assert hub.counters["removed"] == 1


async def test_names_are_quoted():
    async with FakeHub() as hub:
        hub.add_server("ana.b@example.org", "my gpu")
        hub.add_server("ana.b@example.org")
        api = client(hub)
        assert await api.stop_server("ana.b@example.org", "my gpu", remove=True) == "stopped"
        assert await api.stop_server("ana.b@example.org") == "stopped"
        assert (await api.get_user("ana.b@example.org"))["servers"] == {}


async def test_a_server_named_a_dot_segment_is_stopped_as_itself():
    """JupyterHub 4.1 to 5.x take any server name (``POST …/servers/%2E%2E``), and libcurl,
    the client the governor uses where pycurl is installed (z2jh's hub image), takes ``.`` and
    ``..`` out of a URL's path: the cull of ``alice/..`` went to ``/users/alice/`` (a 404, read
    as a server gone, while it ran on with its GPU), and that of ``alice/.`` stopped her
    default server instead. Each is quoted so that it reaches the Hub as its name."""
    async with FakeHub() as hub:
        for name in ("", "..", ".", "..."):
            hub.add_server("alice", name)
        api = client(hub)
        assert await api.stop_server("alice", "..") == "stopped"
        assert await api.stop_server("alice", ".") == "stopped"
        assert [n for n in ("", "..", ".", "...") if hub.running("alice", n)] == ["", "..."]


async def test_delete_user():
    async with FakeHub() as hub:
        hub.add_server("alice", slow_stop=5)
        hub.add_user("bob", groups=["physics"])
        api = client(hub)
        assert await api.delete_user("bob") is True
        assert await api.delete_user("bob") is False
        assert await api.get_user("bob") is None
        assert await api.stop_server("alice") == "stopping"
        with pytest.raises(HubApiError) as e:
            await api.delete_user("alice")
    assert e.value.status == 400
    assert "stopping" in e.value.message
    assert hub.groups["physics"]["users"] == []


# --- errors and transport ----------------------------------------------------------------------
async def test_bad_token_is_a_403():
    async with FakeHub() as hub:
        hub.add_server("alice")
        api = client(hub, token="wrong")
        with pytest.raises(HubApiError) as e:
            await api.list_servers()
        with pytest.raises(HubApiError) as e2:
            await api.stop_server("alice")
    assert e.value.status == 403
    assert "403" in str(e.value)
    assert "not authorized" in e.value.message
    assert e2.value.status == 403
    assert hub.running("alice")


async def test_fake_hub_identifies_tokens_as_a_services_hubauth_sees_them():
    from jupyterhub.services.auth import HubAuth

    async with FakeHub(service_name="gpu-gov") as hub:
        hub.add_user("alice", groups=["physics"], last_activity=clock.utcnow())
        hub.add_user_token(
            "alice", "alice-server", extra_scopes=["access:services!service=gpu-gov"]
        )
        hub.add_user_token("alice", "alice-bare")
        auth = HubAuth(api_url=hub.api_url, api_token=hub.token, cache_max_age=300)
        alice = await auth.user_for_token("alice-server", sync=False)
        bare = await auth.user_for_token("alice-bare", sync=False)
        service = await auth.user_for_token(hub.token, sync=False)
        nobody = await auth.user_for_token("wrong", sync=False)
        await auth.user_for_token("alice-server", sync=False)  # answered from HubAuth's cache
    assert (alice["kind"], alice["name"], alice["groups"]) == ("user", "alice", ["physics"])
    assert alice["scopes"] == [
        "access:servers!server=alice/",
        "access:services!service=gpu-gov",
        "read:users:activity!user=alice",
        "users:activity!user=alice",
    ]
    assert alice["last_activity"] and alice["token_id"] and alice["session_id"] is None
    assert "servers" not in alice and "roles" not in alice  # beyond what the token may read
    assert auth.check_scopes({"access:services!service=gpu-gov"}, alice)
    assert not auth.check_scopes({"access:services!service=gpu-gov"}, bare)
    assert (service["kind"], service["name"]) == ("service", "gpu-gov")
    assert nobody is None  # the Hub's 403: no such token
    assert hub.counters["GET /user"] == 4


async def test_request_returns_json_and_errors_carry_the_hubs_message():
    async with FakeHub() as hub:
        api = client(hub)
        assert (await api.request("GET", "/"))["version"].startswith("6.")
        with pytest.raises(HubApiError) as e:
            await api.request("GET", "/users", params={"state": "sleepy"})
    assert e.value.status == 400
    assert e.value.message == "Unrecognized state filter: 'sleepy'"
    assert e.value.method == "GET"
    assert "state=sleepy" in e.value.url


async def test_connections_to_the_hub_are_kept_between_requests(monkeypatch):
    """A pass's requests (a page, a user read and a stop per cull) reuse the client's
    connections: not one new TCP connection (and DNS lookup) per request."""
    accepted = []
    handle_stream = HTTPServer.handle_stream

    def counted(self, stream, address):
        accepted.append(address)
        return handle_stream(self, stream, address)

    monkeypatch.setattr(HTTPServer, "handle_stream", counted)
    async with FakeHub() as hub:
        hub.add_user("alice")
        api = client(hub, concurrency=4)
        for _ in range(20):
            await api.get_user("alice")
        await asyncio.gather(*(api.get_user("alice") for _ in range(20)))
        api.close()
    assert api.request_count == 40
    assert 1 <= len(accepted) <= 4  # at most one a request in flight


async def test_closing_with_a_request_in_flight_leaves_nothing_to_fire(caplog):
    """The service stops mid-pass: closing the client while a request to the Hub is in flight
    leaves no timer behind to fire on the closed client (with libcurl: a traceback at exit)."""

    class Slow(web.RequestHandler):
        async def get(self, *_):
            await asyncio.sleep(1)
            self.finish("{}")

    server, api = scripted_hub([(r"/hub/api/(.*)", Slow)])
    try:
        for _ in range(3):
            request = asyncio.ensure_future(api.request("GET", "users"))
            await asyncio.sleep(0.05)  # sent, not answered
            api.close()
            await asyncio.sleep(0.3)  # where the left timer fired
            request.cancel()
    finally:
        server.stop()
    # tornado's logger by its name now: a jupyter_server started earlier in this process (a
    # test file before this one on the same xdist worker) renames it "ServerApp", and a check
    # by the old name found nothing, whatever was logged.
    errors = [r for r in caplog.records if r.name == app_log.name and r.levelno >= logging.WARNING]
    assert errors == [], errors[0].getMessage()


curl_only = pytest.mark.skipif(
    not hasattr(hubapi._Client, "abandon"), reason="pycurl is not installed: tornado's own client"
)


@curl_only
async def test_a_request_whose_timer_libcurl_lost_is_still_driven(monkeypatch):
    """libcurl does not always report a timer it needs (tornado 6.6 stopped driving its
    transfers each second against that): the request a lost timer left is answered all the
    same, not waited on for ever (seen: a pass stuck on a request the Hub never received)."""
    monkeypatch.setattr(hubapi._Client, "_set_timeout", lambda self, msecs: None)
    async with FakeHub() as hub:
        api = client(hub)
        answer = await asyncio.wait_for(api.request("GET", "/"), 30)
        api.close()
    assert answer["version"].startswith("6.")


@curl_only
async def test_a_request_the_client_never_ends_is_given_up_and_its_slot_freed(monkeypatch):
    """A transfer libcurl has lost for good (tornado still waits on it, libcurl knows nothing of
    it): given up soon after its own timeout with an error that says so, and the one slot it
    held serves the next request (kept, every later request queued behind it for ever)."""
    monkeypatch.setattr(hubapi, "ABANDON_AFTER_TIMEOUT", 0.5)
    start = hubapi._Client.fetch_impl

    def lost(self, request, callback):
        start(self, request, callback)
        for curl in self._curls:
            if getattr(curl, "info", None) and curl.info["request"] is request:
                self._multi.remove_handle(curl)

    async with FakeHub() as hub:
        hub.add_user("alice")
        api = client(hub, concurrency=1, request_timeout=1)
        with monkeypatch.context() as losing:
            losing.setattr(hubapi._Client, "fetch_impl", lost)
            with pytest.raises(HubApiError) as e:
                await asyncio.wait_for(api.get_user("alice"), 30)
        assert await asyncio.wait_for(api.get_user("alice"), 30) is not None
        api.close()
    assert e.value.status == NO_RESPONSE
    assert "no answer 1.5 s after it was sent (its timeout is 1 s)" in str(e.value)
    assert e.value.url.endswith("/users/alice")
    assert hub.counters["GET /users/{name}"] == 1  # the lost one never reached the Hub


async def test_a_page_that_is_not_json_is_an_error_naming_what_came():
    """A proxy in front of the Hub answers its own HTML page (a login, a maintenance page)
    with 200: each read is a HubApiError that says so, as for a Hub that does not answer;
    once an AttributeError ('str' object has no attribute 'get') from deep in a pass, and
    a 500 to the report that asked whether the Hub runs its server."""

    class Page(web.RequestHandler):
        def get(self, *_):
            self.set_header("Content-Type", "text/html")
            self.finish("<html><title>Sign in</title></html>")

    server, api = scripted_hub([(r"/hub/api/(.*)", Page)])
    try:
        for read in (api.list_servers, lambda: api.get_user("alice"), api.get_groups):
            with pytest.raises(HubApiError) as e:
                await read()
            assert e.value.status == 200
            assert "not JSON" in str(e.value) and "<title>Sign in</title>" in str(e.value)
    finally:
        api.close()
        server.stop()


async def test_a_model_that_cannot_be_read_leaves_out_that_server_not_the_others(caplog):
    """One odd model in the Hub's listing (a time that is not ISO 8601, groups that are not a
    list, a user without a name, servers that are not an object) once stopped the whole pass
    with a ValueError or TypeError: no server was governed. Now that server is left out of the
    pass, named in the log, and every other server is listed as before; an activity the
    incremental listing cannot read lists everything rather than stopping early. A name no
    store holds as it is is no odd model: that server is listed (it was once left out, and
    held its GPU ungoverned)."""
    now = clock.utcnow().replace(microsecond=0)
    good = {"name": "", "ready": True, "url": "/user/ann/", "started": clock.isoformat(now)}
    users = [
        {"name": "ann", "last_activity": clock.isoformat(now), "groups": [], "servers": {"": good}},
        {"name": "bob", "last_activity": "yesterday", "servers": {"": good | {"started": "x1"}}},
        {"name": "cy", "groups": 5, "servers": {"": good}},
        {"name": "dee", "servers": ["not", "an", "object"]},
        {"name": "eve", "servers": {"": good, "gpu": good | {"user_options": "a100"}}},
        # Longer than JupyterHub keeps (a Hub on SQLite lets it be), and NUL, which PostgreSQL
        # refuses in text (JupyterHub 4.1-5.x take any server name): listed, as they run, each
        # as the Hub names it; their keys hold the kept form (core.text.stored_name).
        {"name": "fay", "servers": {"n" * 256: good}},
        {"name": "gus", "servers": {"a\0b": good}},
        {"servers": {"": good}},
        "a string",
    ]

    class Users(web.RequestHandler):
        def get(self):
            self.finish(json.dumps(users))

    class Root(web.RequestHandler):
        def get(self):
            self.finish({"version": "5.2.1"})

    server, api = scripted_hub([(r"/hub/api/users", Users), (r"/hub/api/?", Root)])
    try:
        with caplog.at_level("WARNING"):
            listed = {s.key: s for s in await api.list_servers()}
        fay, gus = "fay/" + stored_name("n" * 256), "gus/" + stored_name("a\0b")
        assert sorted(listed) == ["ann/", "eve/", fay, gus]
        assert (listed[fay].name, listed[gus].name) == ("n" * 256, "a\0b")
        said = caplog.text
        assert "'started' is not an ISO 8601 time: 'x1'" in said and "'bob'" in said
        assert "'groups' is not a list of names" in said and "'cy'" in said
        assert "'servers' is not an object" in said and "'dee'" in said
        assert "'user_options' is a str" in said and "'gpu'" in said
        assert "'fay'" not in said and "'gus'" not in said
        assert said.count("a user without a name") == 2

        listing = HubListing(full_every=100)
        await listing.plan(api, False, [])
        assert sorted([s.key async for s in listing.servers(api)]) == sorted(listed)
        await listing.plan(api, False, [])
        assert not listing.full  # between full listings: what moved, sorted by activity
        keys = [s.key async for s in listing.servers(api)]
        assert listing.full and sorted(keys) == sorted(listed)  # bob's activity: list all
        assert listing.sorts  # only this pass: the Hub still sorts
    finally:
        api.close()
        server.stop()


async def test_unreachable_hub():
    async with FakeHub() as hub:
        url = hub.api_url
    api = HubApi(url, "t", connect_timeout=2)
    with pytest.raises(HubApiError) as e:
        await api.list_servers()
    assert e.value.status == NO_RESPONSE


def test_configuration_from_environment(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://hub:8081/hub/api/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret")
    api = HubApi()
    assert (api.api_url, api.token) == ("http://hub:8081/hub/api", "secret")
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN")
    with pytest.raises(ValueError, match="JUPYTERHUB_API_TOKEN"):
        HubApi()
    with pytest.raises(ValueError, match="concurrency"):
        HubApi("http://hub/hub/api", "t", concurrency=0)


def test_tls_options(monkeypatch, tmp_path):
    url = "https://hub:8081/hub/api"
    assert HubApi(url, "t").ssl_kwargs == {"validate_cert": True}
    api = HubApi(url, "t", ssl_enabled=True, internal_certs_location=tmp_path)
    assert api.ssl_kwargs == {
        "validate_cert": True,
        "ca_certs": str(tmp_path / "hub-ca" / "hub-ca.crt"),
        "client_cert": str(tmp_path / "hub-internal" / "hub-internal.crt"),
        "client_key": str(tmp_path / "hub-internal" / "hub-internal.key"),
    }
    # An explicit file wins over the layout.
    api = HubApi(url, "t", ssl_enabled=True, internal_certs_location=tmp_path, ca_certs="/ca")
    assert api.ssl_kwargs["ca_certs"] == "/ca"
    assert api.ssl_kwargs["client_key"].endswith("hub-internal.key")
    # Without a location: what the Hub hands its managed services under internal_ssl.
    monkeypatch.setenv("JUPYTERHUB_SSL_CLIENT_CA", "/env/ca.crt")
    monkeypatch.setenv("JUPYTERHUB_SSL_CERTFILE", "/env/svc.crt")
    monkeypatch.setenv("JUPYTERHUB_SSL_KEYFILE", "/env/svc.key")
    api = HubApi(url, "t", ssl_enabled=True, validate_cert=False)
    assert api.ssl_kwargs == {
        "validate_cert": False,
        "ca_certs": "/env/ca.crt",
        "client_cert": "/env/svc.crt",
        "client_key": "/env/svc.key",
    }
    monkeypatch.delenv("JUPYTERHUB_SSL_KEYFILE")
    with pytest.raises(ValueError, match="ssl_enabled"):
        HubApi(url, "t", ssl_enabled=True)
    # Explicit files work without ssl_enabled too (a Hub behind TLS with a private CA).
    assert HubApi(url, "t", ca_certs="/ca").ssl_kwargs == {"validate_cert": True, "ca_certs": "/ca"}


async def test_tls_kwargs_reach_the_request(monkeypatch, tmp_path):
    seen = []

    async def fake_fetch(self, request, raise_error=True):
        seen.append(request)
        raise OSError("no TLS server here")

    monkeypatch.setattr("tornado.httpclient.AsyncHTTPClient.fetch", fake_fetch)
    api = HubApi(
        "https://127.0.0.1:1/hub/api", "t", ssl_enabled=True, internal_certs_location=tmp_path
    )
    with pytest.raises(HubApiError) as e:
        await api.get_user("alice")
    assert e.value.status == NO_RESPONSE
    assert seen[0].ca_certs == str(tmp_path / "hub-ca" / "hub-ca.crt")
    assert seen[0].client_cert.endswith("hub-internal/hub-internal.crt")
    assert seen[0].client_key.endswith("hub-internal/hub-internal.key")
    assert seen[0].headers["Authorization"] == "token t"


# --- a real JupyterHub -------------------------------------------------------------------------
hub = hub_fixture(
    users=["carol", "dan"],
    servers=["alice", "bob"],
    # The servers outlive a restart of the Hub (test_a_cull_reaches_a_hub_that_restarted).
    extra_config="c.JupyterHub.allow_named_servers = True\nc.JupyterHub.cleanup_servers = False\n",
)


async def wait_until_gone(api: HubApi, user: str, name: str = "", timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while name in ((await api.get_user(user)) or {}).get("servers", {}):
        assert time.monotonic() < deadline, f"{user}/{name} did not stop"
        await asyncio.sleep(0.2)


async def test_real_hub_list_paginated_and_stop(hub):
    api = HubApi(hub.hub_api_url, hub.api_token, page_size=1)
    servers = await api.list_servers()
    assert sorted(s.key for s in servers) == ["alice/", "bob/"]
    assert api.request_count == 2  # two users with active servers, one a page
    for s in servers:
        assert s.ready and s.pending is None
        assert s.url == f"/user/{s.user}/"
        assert s.started is not None and s.started.tzinfo is not None
        assert "pid" in s.spawner_state  # the harness token has admin:servers

    result = await api.stop_server("bob")
    assert result in ("stopped", "stopping")
    await wait_until_gone(api, "bob")
    assert [s.key for s in await api.list_servers()] == ["alice/"]
    assert await api.stop_server("bob") in ("stopped", "gone")  # idempotent
    assert await api.stop_server("nobody") == "gone"

    bad = HubApi(hub.hub_api_url, "not-a-token")
    with pytest.raises(HubApiError) as e:
        await bad.list_servers()
    assert e.value.status == 403


async def test_real_hub_named_server_removed(hub):
    hub.start_server("carol", "gpu", options={"profile": "a100"})
    api = HubApi(hub.hub_api_url, hub.api_token, page_size=1)
    carol = [s for s in await api.list_servers() if s.user == "carol"]
    assert [(s.name, s.key) for s in carol] == [("gpu", "carol/gpu")]
    assert carol[0].user_options == {"profile": "a100"}

    assert await api.stop_server("carol", "gpu", remove=True) in ("stopped", "stopping")
    await wait_until_gone(api, "carol", "gpu")
    remembered = await api.request("GET", "/users/carol", params={"include_stopped_servers": "1"})
    assert "gpu" not in remembered["servers"]
    assert await api.stop_server("carol", "gpu") == "gone"


async def test_a_cull_reaches_a_hub_that_restarted(hub):
    """The client keeps its connections to the Hub between requests: after the Hub restarted,
    the one it kept is closed, and the next request (a cull) still reaches the new Hub."""
    hub.start_server("dan")
    api = HubApi(hub.hub_api_url, hub.api_token)
    assert "" in (await api.get_user("dan"))["servers"]  # a connection to the Hub, kept
    hub.restart()  # the same address, a new process: the kept connection is dead
    assert await api.stop_server("dan") in ("stopped", "stopping")
    await wait_until_gone(api, "dan")
    assert api.request_count >= 3


async def test_real_hub_incremental_listing_reads_a_stopped_server_s_user_once(hub, monkeypatch):
    """Between full listings only the users whose activity moved are listed (hub/listing.py):
    on a real JupyterHub (5 and later sort ``/users`` by ``last_activity``, with ``state``) a
    user whose server stopped is listed by the next listing, without a server, and not by one
    that starts past ``STOP_LAG`` after it, although the stop is within the activity lag."""
    hub.start_server("carol")
    api = HubApi(hub.hub_api_url, hub.api_token, page_size=1)
    listing = HubListing(full_every=100)
    await listing.plan(api, False, [])
    assert listing.full  # the first listing: everything
    assert "carol/" in [s.key async for s in listing.servers(api)]
    assert await api.stop_server("carol") in ("stopped", "stopping")
    await wait_until_gone(api, "carol")

    await listing.plan(api, False, [])
    assert not listing.full and listing.sorts
    assert "carol/" not in [s.key async for s in listing.servers(api)]
    assert "carol" in listing.listed  # found without a server: it stopped

    later = clock.utcnow() + STOP_LAG + timedelta(seconds=30)
    monkeypatch.setattr(clock, "utcnow", lambda: later)
    await listing.plan(api, False, [])
    [s async for s in listing.servers(api)]  # starts past STOP_LAG after the stop
    assert "carol" in listing.listed  # (the last listing began just after the stop)
    await listing.plan(api, False, [])
    [s async for s in listing.servers(api)]
    assert not listing.full
    assert "carol" not in listing.listed


async def test_a_stop_for_a_session_its_owner_restarted_is_not_sent(hub):
    """The Hub's DELETE names no session. A cull's stop, given the session it was decided for
    (``session``: the listing's ``started``), reads the Hub's own model once it holds its slot:
    a server its owner stopped and started again since is left running, whether or not its new
    process has reported anything; the session it was decided for is stopped."""
    hub.create_user("erin")
    hub.start_server("erin")
    api = HubApi(hub.hub_api_url, hub.api_token)
    (old,) = [s for s in await api.list_servers() if s.user == "erin"]
    hub.stop_server("erin")  # by its owner, then started again
    hub.start_server("erin")
    with pytest.raises(NotSent, match="the server restarted since it was decided"):
        await api.stop_server("erin", session=old.started)
    (new,) = [s for s in await api.list_servers() if s.user == "erin"]
    assert new.started != old.started and new.ready, "the new session was stopped"
    assert await api.stop_server("erin", session=new.started) in ("stopped", "stopping")
    await wait_until_gone(api, "erin")
    with pytest.raises(NotSent, match="the server stopped since it was decided"):
        await api.stop_server("erin", session=new.started)
