"""The scope check's short path (``hub/prepared_auth.py``) allows and refuses exactly whom
JupyterHub's own ``HubOAuthenticated.check_hub_user`` allows and refuses."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import types

import pytest
from jupyterhub.services.auth import HubOAuth, HubOAuthenticated, UserNotAllowed

from jupyter_gpu_gov.core.vocabulary import server_key
from jupyter_gpu_gov.hub.prepared_auth import (
    ADMIN_SCOPE,
    TESTED_SCOPES,
    PreparedHubAuthenticated,
    PreparedHubOAuth,
    bound_servers,
    out_of_reach,
    reaches,
)

SERVICE_ACCESS = "access:services!service=gpu-gov"
LEAD = "custom:gpu-gov:showback!group=vision"  # vision's team lead (hub/readers.py)
ACCESS = {"access:services", SERVICE_ACCESS}  # what the Hub sets for us

CALLERS = {
    "a server's token": ["access:services!service=gpu-gov", "users:activity!user=ann"],
    "any service's access": ["access:services", "read:users!user=ann"],
    "another service's access": ["access:services!service=other", "access:servers!user=ann"],
    "a filter the check must expand": ["access:services!user=ann"],
    "a look-alike": ["access:services!service=gpu-gov-x", "access:services!service=gpu"],
    "no scopes": [],
    "a governor admin": ["custom:gpu-gov:admin", SERVICE_ACCESS, "read:users!user=ann"],
    "a Hub admin's login": ["admin-ui", "admin:users", "admin:servers", "access:services"],
    "a filtered admin scope": ["admin:users!group=x", "admin-ui!user=ann", SERVICE_ACCESS],
    "a metrics reader": ["read:metrics", "access:services!service=gpu-gov-x"],
}
ALLOWED = {
    "a server's token",
    "any service's access",
    "a governor admin",
    "a Hub admin's login",
    "a filtered admin scope",  # by its access scope (not an admin: admin:users as it is written)
}


def _check(handler_class: type, model: dict) -> dict | str:
    handler = handler_class.__new__(handler_class)
    handler.hub_auth = HubOAuth(
        api_token="secret", api_url="http://127.0.0.1:9/hub/api", access_scopes=ACCESS
    )
    try:
        return handler.check_hub_user(model)
    except UserNotAllowed:
        return "refused"


@pytest.mark.parametrize("caller", CALLERS)
def test_the_short_path_answers_as_hub_oauthenticated_does(caller):
    model = {"name": "ann", "scopes": CALLERS[caller]}
    plain = _check(HubOAuthenticated, dict(model))
    short = _check(PreparedHubAuthenticated, dict(model))
    assert short == plain
    expected = "allowed" if caller in ALLOWED else "refused"
    assert ("refused" if plain == "refused" else "allowed") == expected
    if plain != "refused":
        assert short["kind"] == "user"


@pytest.mark.parametrize("caller", CALLERS)
def test_what_is_kept_of_a_token_decides_as_the_whole_answer(caller):
    """HubAuth keeps of the Hub's answer the scopes the service tests: allowed, refused, an admin
    or a metrics reader with them exactly as with the Hub's whole answer."""
    whole = {
        "kind": "user",
        "name": "ann",
        "admin": False,
        "groups": ["x"],
        "scopes": CALLERS[caller],
    }
    kept = _hub_answering({}, []).kept(whole)
    assert set(kept["scopes"]) <= set(whole["scopes"]) and kept["name"] == "ann"
    for handler_class in (HubOAuthenticated, PreparedHubAuthenticated):
        verdicts = [_check(handler_class, dict(m)) != "refused" for m in (whole, kept)]
        assert verdicts == [caller in ALLOWED] * 2
    assert set(kept["scopes"]) & TESTED_SCOPES == set(whole["scopes"]) & TESTED_SCOPES


def _deep_size(root: object) -> int:
    """Bytes of ``root`` and everything it holds (``sys.getsizeof``, each object once)."""
    seen, stack, total = set(), [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def _hub_answering(models: dict[str, dict | None], asked: list[str]) -> PreparedHubOAuth:
    """The service's HubAuth, the Hub's ``GET /user`` answering ``models`` by token."""
    auth = PreparedHubOAuth(
        api_token="secret", api_url="http://127.0.0.1:9/hub/api", access_scopes=ACCESS
    )

    async def api_request(method, url, /, headers, allow_403):
        token = headers["Authorization"].split()[1]
        asked.append(token)
        return json.loads(json.dumps(models[token]))  # as HubAuth decodes it

    auth._api_request = api_request
    return auth


def test_a_token_is_kept_small_whatever_the_hub_says_of_its_user():
    """HubAuth keeps each token's answer for ``cache_max_age``: a user whose model is huge (many
    servers with large ``user_options``, many groups) costs the service no more memory per
    token than any other, and is allowed and refused exactly as before."""
    user_options = {"profile": "a100", "notes": "x" * 100_000}
    huge = {
        "kind": "user",
        "name": "ann",
        "admin": False,
        "groups": [f"group-{i}" for i in range(1000)],
        "servers": {f"s{i}": {"user_options": user_options} for i in range(100)},
        "last_activity": "2026-12-03T18:00:00.000000Z",
        "scopes": [SERVICE_ACCESS, "users:activity!user=ann", "read:users:activity!user=ann"],
        "session_id": None,
        "token_id": "a1",
    }
    asked: list[str] = []
    auth = _hub_answering({"huge": huge, "bogus": None}, asked)
    first = asyncio.run(auth.user_for_token("huge", sync=False))
    again = asyncio.run(auth.user_for_token("huge", sync=False))
    refused = [asyncio.run(auth.user_for_token("bogus", sync=False)) for _ in range(2)]
    assert asked == ["huge", "bogus"]  # each asked once: the answer, and a refusal, are kept
    assert refused == [None, None]
    assert _deep_size(auth.cache) < 3000  # both tokens; the Hub's answer was over 10 MB
    kept = {"kind": "user", "name": "ann", "admin": False, "scopes": (SERVICE_ACCESS,)}
    assert first == again == kept
    for handler_class in (HubOAuthenticated, PreparedHubAuthenticated):
        assert _check(handler_class, again) is again  # allowed, as with the whole model
        assert _check(handler_class, dict(huge)) == dict(huge, kind="user")


def test_a_kept_token_expires_as_hubauth_s_cache_does(monkeypatch):
    """The kept answers live in HubAuth's own cache: asked again once ``cache_max_age`` has
    passed, and purged; ``use_cache=False`` asks the Hub and keeps nothing."""
    now = [1000.0]
    monkeypatch.setattr("jupyterhub.services.auth.time.monotonic", lambda: now[0])
    model = {"kind": "user", "name": "ann", "scopes": ["access:services!service=gpu-gov"]}
    asked: list[str] = []
    auth = _hub_answering({"ann": model, "bob": dict(model, name="bob")}, asked)
    assert asyncio.run(auth.user_for_token("ann", sync=False))["name"] == "ann"
    now[0] += auth.cache_max_age + 1
    assert asyncio.run(auth.user_for_token("bob", sync=False))["name"] == "bob"  # purges ann's
    assert len(auth.cache) == 1
    assert asyncio.run(auth.user_for_token("ann", sync=False))["name"] == "ann"
    assert asyncio.run(auth.user_for_token("ann", use_cache=False, sync=False))["name"] == "ann"
    assert asked == ["ann", "bob", "ann", "ann"] and len(auth.cache) == 2


async def test_a_flood_of_unknown_tokens_from_one_address_does_not_hold_up_anothers_check():
    """Each token no one sent before costs a check with the Hub: a process sending thousands
    held up every other server's first check behind its whole flood (aiohttp asks 100 at a
    time; the report then got a 503 after 10 s). An address's checks now take turns, at most
    ``MAX_CHECKS_PER_ADDRESS`` at a time; nothing is refused or cached for it."""
    from fake_hub_api import FakeHub

    from jupyter_gpu_gov.hub.prepared_auth import ASKING, MAX_CHECKS_PER_ADDRESS

    async def asking(address: str, token: str):
        ASKING.set(address)  # as the report route and every handler's prepare set it
        return await auth.user_for_token(token, sync=False)

    async with FakeHub(latency=0.1) as hub:
        hub.add_user_token("ann", "ann-token", extra_scopes=[SERVICE_ACCESS])
        auth = PreparedHubOAuth(api_token=hub.token, api_url=hub.api_url, access_scopes=ACCESS)
        flood = [asyncio.ensure_future(asking("10.0.0.9", f"bogus-{i}")) for i in range(300)]
        await asyncio.sleep(0.05)  # the flood is being asked
        model = await asyncio.wait_for(asking("10.0.0.2", "ann-token"), 30)
        done = sum(f.done() for f in flood)
        assert model["name"] == "ann"
        # Answered while most of the flood still waits (behind it, at least 200 were done).
        assert done < 150
        assert await asyncio.wait_for(asyncio.gather(*flood), 60) == [None] * 300
        assert hub.max_in_flight <= MAX_CHECKS_PER_ADDRESS + 1
        # The flood's tokens are refused as the Hub said; ann's is kept as the Hub said.
        assert (
            auth.cached_user("bogus-0") is None and auth.cached_user("ann-token")["name"] == "ann"
        )
        assert not auth._turns  # nothing kept for an address once its checks are answered


class _TokenEndpoint:
    """The Hub's ``POST /hub/api/oauth2/token`` refusing every code, 0.1 s each, and ``GET
    /hub/api/user`` knowing one token: a real HTTP server, counting what it is asked at once."""

    def __init__(self) -> None:
        from tornado import web

        self.in_flight = self.max_in_flight = 0
        endpoint = self

        class Counted(web.RequestHandler):
            async def prepare(self):
                endpoint.in_flight += 1
                endpoint.max_in_flight = max(endpoint.max_in_flight, endpoint.in_flight)
                await asyncio.sleep(0.1)

            def on_finish(self):
                endpoint.in_flight -= 1

        class Token(Counted):
            def post(self):
                self.set_status(400)
                self.finish({"error": "invalid_grant", "error_description": "no such code"})

        class User(Counted):
            def get(self):
                if self.request.headers.get("Authorization") != "token ann-token":
                    raise web.HTTPError(403)
                self.finish({"kind": "user", "name": "ann", "scopes": [SERVICE_ACCESS]})

        self.app = web.Application([(r"/hub/api/oauth2/token", Token), (r"/hub/api/user", User)])


async def test_a_replayed_login_callback_takes_its_turns_with_the_hub():
    """A login's state cookie replays for weeks, and each callback with a bogus code asks the
    Hub: a flood of them held up every server's first token check as bogus tokens did."""
    from tornado import web
    from tornado.httpclient import AsyncHTTPClient
    from tornado.netutil import bind_sockets

    from jupyter_gpu_gov.hub.app import OAuthCallbackHandler
    from jupyter_gpu_gov.hub.prepared_auth import ASKING, MAX_CHECKS_PER_ADDRESS
    from jupyter_gpu_gov.hub.protocol_server import ProtocolHTTPServer

    hub = _TokenEndpoint()
    hub_server = ProtocolHTTPServer(hub.app, max_body_size=1 << 20)
    sockets = bind_sockets(0, "127.0.0.1")
    await hub_server.add_sockets(sockets)
    api_url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/hub/api"
    auth = PreparedHubOAuth.instance(
        api_token="service-token",
        api_url=api_url,
        access_scopes=ACCESS,
        oauth_client_id="service-gpu-gov",
        base_url="/services/gpu-gov/",
    )
    secret = b"s" * 32
    service = ProtocolHTTPServer(
        web.Application(
            [(r"/services/gpu-gov/oauth_callback", OAuthCallbackHandler)], cookie_secret=secret
        ),
        max_body_size=1 << 20,
    )
    sockets = bind_sockets(0, "127.0.0.1")
    await service.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    state = auth.generate_state("/services/gpu-gov/")  # one login's state, kept by the client
    cookie = web.create_signed_value(secret, auth.get_state_cookie_name(state), state).decode()
    client = AsyncHTTPClient(force_instance=True, max_clients=300)
    try:
        flood = [
            asyncio.ensure_future(
                client.fetch(
                    f"http://127.0.0.1:{port}/services/gpu-gov/oauth_callback"
                    f"?code=bogus-{i}&state={state}",
                    headers={"Cookie": f"{auth.get_state_cookie_name(state)}={cookie}"},
                    raise_error=False,
                    request_timeout=60,
                )
            )
            for i in range(300)
        ]
        while hub.in_flight == 0:
            await asyncio.sleep(0.01)

        async def ann():
            ASKING.set("10.0.0.2")  # another address's first report
            return await auth.user_for_token("ann-token", sync=False)

        assert (await asyncio.wait_for(ann(), 30))["name"] == "ann"
        assert sum(f.done() for f in flood) < 150  # not behind the whole flood
        answers = await asyncio.wait_for(asyncio.gather(*flood), 60)
        assert {a.code for a in answers} == {500}  # HubAuth's answer for a refused code
        assert hub.max_in_flight <= MAX_CHECKS_PER_ADDRESS + 1
    finally:
        client.close()
        for server in (service, hub_server):
            server.stop()
            await server.close_all_connections()


async def test_admin_rights_taken_away_at_the_hub_end_here_soon(monkeypatch):
    """HubAuth keeps the Hub's answer for a token 300 s: a governor admin whose token was
    revoked (or who left the admins' group) could cull anyone's server for five minutes more.
    An admin's answer is kept ``ADMIN_KEPT_S``, as is a showback reader's (a team lead's scope
    kept with its filter, which says the team); anyone else's as HubAuth keeps it."""
    from fake_hub_api import FakeHub

    from jupyter_gpu_gov.hub import prepared_auth

    async with FakeHub() as hub:
        hub.add_user_token("root", "admin-token", extra_scopes=[SERVICE_ACCESS, ADMIN_SCOPE])
        hub.add_user_token("ann", "ann-token", extra_scopes=[SERVICE_ACCESS])
        hub.add_user_token("lena", "lead-token", extra_scopes=[SERVICE_ACCESS, LEAD])
        auth = PreparedHubOAuth(api_token=hub.token, api_url=hub.api_url, access_scopes=ACCESS)
        admin = await auth.user_for_token("admin-token", sync=False)
        assert ADMIN_SCOPE in admin["scopes"]
        lead = await auth.user_for_token("lead-token", sync=False)
        assert LEAD in lead["scopes"]
        assert (await auth.user_for_token("ann-token", sync=False))["name"] == "ann"
        for token in ("admin-token", "ann-token", "lead-token"):
            del hub.tokens[token]  # revoked at the Hub
        assert await auth.user_for_token("admin-token", sync=False) == admin  # kept a while
        assert await auth.user_for_token("lead-token", sync=False) == lead
        # Kept ADMIN_KEPT_S (30 s) from the answer; here 0.3 s, then past it. (Shortened only
        # now: a loaded machine could take 0.3 s over the checks above.)
        monkeypatch.setattr(prepared_auth, "ADMIN_KEPT_S", 0.3)
        await asyncio.sleep(0.4)
        assert await auth.user_for_token("admin-token", sync=False) is None  # asked again
        assert await auth.user_for_token("lead-token", sync=False) is None
        assert (await auth.user_for_token("ann-token", sync=False))["name"] == "ann"  # 300 s


async def test_under_internal_ssl_the_checks_with_the_hub_share_one_ssl_context(
    tmp_path, monkeypatch
):
    """With the Hub's ``internal_ssl`` HubAuth made an SSL context for every request to the
    Hub: its key, certificate and CA read and parsed again, ~28 ms of the event loop each token
    check (every server's, every 5 minutes). Certificates made as JupyterHub makes its
    internal ones (certipy), a Hub API over real TLS that asks for the service's certificate:
    five checks are answered and one context is made (a changed certificate makes another)."""
    import os
    import ssl

    from certipy import Certipy
    from tornado import web
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    certs = Certipy(store_dir=str(tmp_path))
    ca = certs.create_ca("hub-ca")["files"]["cert"]
    names = ["IP:127.0.0.1", "DNS:localhost"]
    hub_pair = certs.create_signed_pair("hub-internal", "hub-ca", alt_names=names)["files"]
    gov_pair = certs.create_signed_pair("gpu-gov", "hub-ca", alt_names=names)["files"]

    class User(web.RequestHandler):
        def get(self):
            token = self.request.headers.get("Authorization", "").removeprefix("token ")
            self.finish({"kind": "user", "name": token, "scopes": [SERVICE_ACCESS]})

    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    server_side.load_cert_chain(hub_pair["cert"], hub_pair["key"])
    server_side.verify_mode = ssl.CERT_REQUIRED  # the service's certificate, as the Hub asks
    sock, port = bind_unused_port()
    hub = HTTPServer(web.Application([(r"/hub/api/user", User)]), ssl_options=server_side)
    hub.add_sockets([sock])
    from jupyterhub.services import auth as hub_auth_module

    # What the service sets on HubAuth's module for its process is undone after this test.
    monkeypatch.setattr(hub_auth_module, "make_ssl_context", hub_auth_module.make_ssl_context)
    made = []
    load = ssl.SSLContext.load_cert_chain
    monkeypatch.setattr(
        ssl.SSLContext,
        "load_cert_chain",
        lambda self, *a, **k: made.append(a) or load(self, *a, **k),
    )
    try:
        auth = PreparedHubOAuth(
            api_token="secret",
            api_url=f"https://127.0.0.1:{port}/hub/api",
            access_scopes=ACCESS,
            certfile=gov_pair["cert"],
            keyfile=gov_pair["key"],
            client_ca=ca,
        )
        for name in ("ann", "bob", "cy", "dee", "eve"):
            model = await auth.user_for_token(name, sync=False)
            assert model["name"] == name
        assert len(made) == 1, made
        # A certificate renewed on disk (a new mtime) is read again, once.
        os.utime(gov_pair["cert"], (1, 1))
        assert (await auth.user_for_token("fay", sync=False))["name"] == "fay"
        assert (await auth.user_for_token("gus", sync=False))["name"] == "gus"
        assert len(made) == 2, made
    finally:
        hub.stop()


def test_a_token_bound_to_a_server_whose_name_no_store_holds_reaches_that_server():
    """The Hub binds a server's own token to it by its name (``access:servers!server=bob/a\0b``),
    while the governor knows it by the kept form of a name no store holds as it is
    (``core.text.stored_name``): its reports and Extend were refused with a 403, so it could
    be governed only as a server without the extension. The scope's names are read as a key."""
    nul, long = server_key("bob", "a\0b"), server_key("u" * 300, "gpu")
    scopes = ["access:servers!server=bob/a\0b", f"access:servers!server={'u' * 300}/gpu"]
    assert bound_servers(scopes) == tuple(sorted((nul, long)))
    assert out_of_reach({"servers": bound_servers(scopes)}, nul) is None
    assert out_of_reach({"servers": bound_servers(scopes)}, server_key("bob", "other"))
    assert reaches(scopes, nul) and reaches(scopes, long)
    assert not reaches(scopes, server_key("bob", "a"))
    assert reaches([f"access:servers!user={'u' * 300}"], server_key("u" * 300, ""))
    assert not reaches([f"access:servers!user={'u' * 299}"], server_key("u" * 300, ""))
