"""One caller cannot slow the governor service for everyone with requests it accepts: past its
budget a report is answered 429 with ``Retry-After`` and not taken, an address whose requests
keep being refused costs no more Hub checks, a flood costs the log one line a minute, and the
server's reporter waits as it is told (``hub/budget.py``, docs/security.md "Report budget").

The real service (its ``make_server``: the report route, HubOAuth against a fake Hub over
HTTP, the SQLite store) serves on the test's event loop; reports go over real HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
from datetime import timedelta

import pytest
from fake_hub_api import FakeHub
from test_fuzz_api import ACCESS, PREFIX, fresh_report
from tornado.httpclient import AsyncHTTPClient
from tornado.log import access_log
from tornado.netutil import bind_sockets
from traitlets import TraitError

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.hub import metrics, routes
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.prepared_auth import PreparedHubOAuth
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.server.reporter import GovernorError, Held, Reporter

ALICE, BOB = "alice-server-token", "bob-server-token"
SLOW = 0.01  # units a second: nothing comes back within a test, so no timing is assumed


@contextlib.asynccontextmanager
async def service(tmp_path, monkeypatch, latency: float = 0.0, **settings):
    """The governor's server with ``settings`` (``GpuGovernor``'s), alice and bob each running
    a server, the Hub answering after ``latency`` s; yields (url, governor, hub)."""
    hub = FakeHub(latency=latency)
    hub.start()
    for user, token in (("alice", ALICE), ("bob", BOB)):
        hub.add_server(user, started=clock.utcnow() - timedelta(minutes=5))
        hub.add_user_token(user, token, extra_scopes=[ACCESS])
    for key, value in {
        "JUPYTERHUB_API_URL": hub.api_url,
        "JUPYTERHUB_API_TOKEN": hub.token,
        "JUPYTERHUB_SERVICE_NAME": "gpu-gov",
        "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
        "JUPYTERHUB_CLIENT_ID": "service-gpu-gov",
        "JUPYTERHUB_BASE_URL": "/",
    }.items():
        monkeypatch.setenv(key, value)
    governor = Governor(
        Store(f"sqlite:///{tmp_path / 'gov.sqlite'}"),
        HubApi(hub.api_url, hub.token),
        load_policies([], {"warn_after": "1h", "cull_after": "2h"}),
        Options(),
    )
    await governor.reconcile()
    PreparedHubOAuth.clear_instance()  # HubAuth for this test's Hub
    sockets = bind_sockets(0, "127.0.0.1")
    server = GpuGovernor(**settings).make_server(governor)
    await server.add_sockets(sockets)
    try:
        yield f"http://127.0.0.1:{sockets[0].getsockname()[1]}{PREFIX}", governor, hub
    finally:
        server.stop()
        await server.close_all_connections()
        hub.stop()
        PreparedHubOAuth.clear_instance()


def report_of(user: str, padding: int = 0) -> bytes:
    report = fresh_report()
    report["server"]["user"] = user
    return json.dumps(report).encode() + b" " * padding  # spaces: still the same report


async def post(url: str, token: str, body: bytes):
    return await AsyncHTTPClient().fetch(
        url + "api/reports",
        method="POST",
        body=body,
        headers={"Authorization": f"token {token}"},
        raise_error=False,
        request_timeout=60,
    )


def throttled() -> float:
    return metrics.REPORTS.labels("throttled")._value.get()


async def test_a_caller_past_its_budget_gets_429_and_its_report_is_not_taken(tmp_path, monkeypatch):
    async with service(tmp_path, monkeypatch, report_budget=SLOW, report_burst=20) as (
        url,
        governor,
        _,
    ):
        # A report of 180 kB counts 12 (one and one a 16 KiB), the usual ones 1 each: 20 in all.
        assert (await post(url, ALICE, report_of("alice", 180_000))).code == 200
        for _ in range(8):
            assert (await post(url, ALICE, report_of("alice"))).code == 200
        kept, verdict = governor.reports["alice/"], governor.verdict("alice/")
        before = throttled()
        answer = await post(url, ALICE, report_of("alice"))
        assert answer.code == 429, answer.body
        assert 90 <= int(answer.headers["Retry-After"]) <= 101  # a unit at 0.01 a second
        assert "too many reports from 'alice'" in json.loads(answer.body)["message"]
        assert throttled() == before + 1
        # Not taken: the governor keeps the last report it took, and its verdict.
        assert governor.reports["alice/"] is kept and governor.verdict("alice/") == verdict
        # Another caller is not held back by alice's budget.
        assert (await post(url, BOB, report_of("bob"))).code == 200


async def test_a_body_over_the_report_limit_costs_what_the_largest_report_costs(
    tmp_path, monkeypatch
):
    """Refused 413 unparsed, it counts as the largest report taken (17), not by its size (a
    1 MiB body: 65, the whole burst, and the owner's other servers then waited)."""
    async with service(tmp_path, monkeypatch, report_budget=SLOW, report_burst=20) as (
        url,
        _,
        _,
    ):
        assert (await post(url, ALICE, report_of("alice", 300_000))).code == 413
        for _ in range(3):
            assert (await post(url, ALICE, report_of("alice"))).code == 200
        assert (await post(url, ALICE, report_of("alice"))).code == 429


async def test_an_address_whose_requests_keep_being_refused_waits_without_hub_checks(
    tmp_path, monkeypatch
):
    async with service(tmp_path, monkeypatch, refused_budget=SLOW, refused_burst=5) as (
        url,
        _,
        hub,
    ):
        assert (await post(url, ALICE, report_of("alice"))).code == 200  # alice's token cached
        for n in range(5):
            assert (await post(url, f"bogus-{n}", report_of("alice"))).code == 403
        checks = hub.counters["GET /user"]
        answer = await post(url, "bogus-5", report_of("alice"))
        assert answer.code == 429 and int(answer.headers["Retry-After"]) >= 90
        assert (await post(url, "", report_of("alice"))).code == 429  # no token at all
        assert hub.counters["GET /user"] == checks  # the Hub was not asked
        # A known caller from the same address is not held back.
        assert (await post(url, ALICE, report_of("alice"))).code == 200


async def test_a_flood_of_refusals_costs_the_log_a_line_then_a_count(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(routes, "REFUSAL_LINES_EVERY_S", 0.5)
    caplog.set_level(logging.WARNING, "jupyter_gpu_gov.hub")
    async with service(tmp_path, monkeypatch, refused_budget=0) as (url, _, _):
        for _ in range(30):
            assert (await post(url, "", report_of("alice"))).code == 403
        lines = [r.getMessage() for r in caplog.records if r.name == "jupyter_gpu_gov.hub"]
        assert lines == [
            "gpu-gov: POST api/reports refused (403): authenticate with a JupyterHub token"
        ]
        summary = "gpu-gov: 29 more refused from 127.0.0.1 in the last minute"
        deadline = time.monotonic() + 30
        while summary not in [r.getMessage() for r in caplog.records]:
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            await asyncio.sleep(0.05)
        # A minute on, the address's first refusal is written in full again.
        assert (await post(url, "bogus", report_of("alice"))).code == 403
        assert "refused (403)" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("report_interval", [5.0, 600.0], ids=["kept", "per-report"])
async def test_the_reporter_sends_nothing_before_the_retry_after(
    tmp_path, monkeypatch, report_interval
):
    async with service(tmp_path, monkeypatch, report_budget=SLOW, report_burst=1) as (
        url,
        governor,
        _,
    ):
        reporter = Reporter(url, ALICE, logging.getLogger("test"), report_interval=report_interval)
        try:
            verdict = await reporter.send(json.loads(report_of("alice")))
            assert verdict == governor.verdict("alice/")
            with pytest.raises(GovernorError) as refused:
                await reporter.send(json.loads(report_of("alice")))
            assert refused.value.status == 429 and refused.value.retry_after >= 90
            before = throttled()
            with pytest.raises(Held) as held:
                await reporter.send(json.loads(report_of("alice")))
            assert held.value.status == 429 and held.value.retry_after > 80
            assert throttled() == before  # nothing was sent
            reporter.held_until = 0.0  # as if the Retry-After had passed: it sends again
            with pytest.raises(GovernorError) as again:
                await reporter.send(json.loads(report_of("alice")))
            assert again.value.status == 429 and throttled() == before + 1
        finally:
            reporter.close()


def test_the_buckets_kept_stay_bounded_and_one_being_drawn_on_is_kept(monkeypatch):
    """Addresses are many (IPv6): past ``MAX_KEYS`` buckets the full ones are forgotten (a
    full bucket is what an unknown key gets) and, where most are being drawn on, all; below
    that, a drained bucket stays drained."""
    from jupyter_gpu_gov.hub import budget

    monkeypatch.setattr(budget, "MAX_KEYS", 100)
    refusals = budget.Budget(SLOW, 3)
    for _ in range(3):
        assert refusals.take("flood") == 0.0
    for n in range(40):
        refusals.take(f"other-{n}")
    assert refusals.take("flood") > 0  # 41 buckets: none forgotten
    for n in range(1000):
        refusals.take(f"address-{n}")
        assert len(refusals._buckets) <= 100
    fast = budget.Budget(1e6, 3)  # each bucket full again at once: forgotten, not cleared
    for n in range(1000):
        fast.take(f"address-{n}")
    assert len(fast._buckets) < 100


async def get(url: str, path: str, token: str, **headers):
    return await AsyncHTTPClient().fetch(
        url + path,
        headers={"Authorization": f"token {token}", **headers},
        raise_error=False,
        follow_redirects=False,
        request_timeout=60,
    )


async def test_a_caller_looping_over_the_api_and_pages_gets_429_and_one_log_line(
    tmp_path, monkeypatch, caplog
):
    """The API and the pages have a budget per caller (``api_budget``): all the caller's tokens
    share it, a header the client sets gains nothing, admins have one too, other callers are
    not held back, and the 429s cost the log one line (``RefusalLog``), not one each."""
    caplog.set_level(logging.INFO)
    # A burst of 9 units: her page ("me") costs 5 (built from every server), a read 1.
    async with service(tmp_path, monkeypatch, api_budget=SLOW, api_burst=9) as (url, _, hub):
        other = "alice-own-token"  # hers, not her server's: it reads her page too
        hub.add_user_token("alice", other, extra_scopes=[ACCESS, "access:servers!user=alice"])
        hub.add_user_token("root", "root-token", extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        for path, token in [("api/servers", ALICE), ("api/", ALICE), ("me", other)] + [
            ("api/servers", ALICE)
        ] * 2:
            assert (await get(url, path, token)).code == 200, path
        answer = await get(url, "api/servers", ALICE)
        assert answer.code == 429, answer.body
        assert 90 <= int(answer.headers["Retry-After"]) <= 101  # a unit at 0.01 a second
        assert json.loads(answer.body)["message"].startswith("too many requests from 'alice'")
        # Her other token (all hers share the budget) on a page: 429, said as a page.
        page = await get(url, "me", other)
        assert page.code == 429 and b"too many requests from" in page.body
        assert page.headers["Content-Type"].startswith("text/html")
        assert "Retry-After" in page.headers
        assert (await get(url, "api/", ALICE, **{"X-Forwarded-For": "10.9.8.7"})).code == 429
        # Another address in a header she sets gains nothing; bob is not held back; an admin
        # has a budget of its own, as big.
        assert (await get(url, "api/servers", BOB)).code == 200
        # An admin's listing of every server costs 5: one of 9, then 429.
        assert (await get(url, "api/servers", "root-token")).code == 200
        assert (await get(url, "api/servers", "root-token")).code == 429
        # The report route has a budget of its own: alice still reports.
        assert (await post(url, ALICE, report_of("alice"))).code == 200
        refused = [r.getMessage() for r in caplog.records if "(429)" in r.getMessage()]
        assert refused == [
            "gpu-gov: GET /services/gpu-gov/api/servers refused (429): too many requests from "
            "'alice': send again in 100 s",
            "gpu-gov: GET /services/gpu-gov/api/servers refused (429): too many requests from "
            "'root': send again in 100 s",
        ], refused
        assert not [r for r in caplog.records if r.getMessage().startswith("429 ")]  # access log


async def test_an_export_costs_the_api_budget_more_than_a_status_read(tmp_path, monkeypatch):
    """A year's usage export or a what-if costs the service hundreds of times a status read;
    counted 1 each, a loop of them went through a budget sized for reads. Exports count
    ``COST_EXPORT`` (10), listings of every server ``COST_LISTING`` (5), the rest 1."""
    async with service(tmp_path, monkeypatch, api_budget=SLOW, api_burst=25) as (url, _, hub):
        own = "alice-own-token"  # hers (her server's own may not read her usage)
        hub.add_user_token("alice", own, extra_scopes=[ACCESS, "access:servers!user=alice"])
        for _ in range(2):
            assert (await get(url, "api/usage?since=365d&group_by=day", own)).code == 200
        for _ in range(5):
            assert (await get(url, "api/", own)).code == 200
        answer = await get(url, "api/", own)
        assert answer.code == 429, answer.body  # 2 x 10 + 5: the burst of 25 is spent


async def test_an_admin_clicking_through_the_dashboard_stays_within_the_api_budget(
    tmp_path, monkeypatch
):
    """The default budget (10 a second, 100 at once) with costs: ten loads of the dashboard
    (a listing), a showback page (an export) and three listings of every server in a row are
    all answered."""
    async with service(tmp_path, monkeypatch) as (url, _, hub):
        hub.add_user_token("root", "root-token", extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        for path in [""] * 10 + ["showback"] + ["api/servers"] * 3:
            assert (await get(url, path, "root-token")).code == 200, path


async def test_an_api_flood_is_counted_per_caller_in_the_log(tmp_path, monkeypatch, caplog):
    """The 429s' count line names the caller (every browser's request comes from the proxy's
    address, so an address would lump everyone together), its name escaped and bounded."""
    monkeypatch.setattr(routes, "REFUSAL_LINES_EVERY_S", 0.5)
    caplog.set_level(logging.WARNING, "jupyter_gpu_gov.hub")
    async with service(tmp_path, monkeypatch, api_budget=SLOW, api_burst=1) as (url, _, _):
        for token in (ALICE, BOB):
            assert (await get(url, "api/", token)).code == 200
            for _ in range(3):
                assert (await get(url, "api/", token)).code == 429
        summaries = {
            "gpu-gov: 2 more refused from user:'alice' in the last minute",
            "gpu-gov: 2 more refused from user:'bob' in the last minute",
        }
        deadline = time.monotonic() + 30
        while not summaries <= {r.getMessage() for r in caplog.records}:
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            await asyncio.sleep(0.05)


async def test_an_address_whose_api_requests_name_no_caller_waits_without_hub_checks_or_lines(
    tmp_path, monkeypatch, caplog
):
    """Requests to the API and the pages that name no caller the Hub knows (no token, bogus
    ones: each new one a Hub check) count against their address as the report route's do: past
    ``refused_burst`` the next one is 429 without a Hub check, and the flood costs the log its
    address's first line and then a count, not a WARNING each. A cached caller from the same
    address is not held back, and a browser not logged in is still sent to the login."""
    monkeypatch.setattr(routes, "REFUSAL_LINES_EVERY_S", 0.5)
    caplog.set_level(logging.INFO)
    async with service(tmp_path, monkeypatch, refused_budget=SLOW, refused_burst=5) as (
        url,
        _,
        hub,
    ):
        assert (await get(url, "api/servers", ALICE)).code == 200  # alice's token cached
        for n in range(4):
            assert (await get(url, "api/servers", f"bogus-{n}")).code == 403
        assert (await get(url, "api/nowhere", "")).code == 404  # no route: logged, not counted
        assert (await get(url, "api/audit", "")).code == 403  # no token at all: the 5th
        checks = hub.counters["GET /user"]
        answer = await get(url, "api/servers", "bogus-5")
        assert answer.code == 429 and int(answer.headers["Retry-After"]) >= 90
        assert "too many requests refused from this address" in json.loads(answer.body)["message"]
        assert (await get(url, "api/servers", "")).code == 429
        assert hub.counters["GET /user"] == checks  # the Hub was not asked
        assert (await get(url, "api/servers", ALICE)).code == 200
        login = await get(url, "me", "")
        assert login.code == 302 and "/hub/api/oauth2/authorize" in login.headers["Location"]
        assert (await post(url, "bogus-6", report_of("alice"))).code == 429  # one budget
        warned = [
            (r.name, r.getMessage())
            for r in caplog.records
            if r.levelno >= logging.WARNING and "/services/gpu-gov/" in r.getMessage()
        ]  # not tornado's access line nor its HTTPError line for each: the address's first
        # tornado's access logger by its name now: a jupyter_server started earlier on the same
        # xdist worker renames it "ServerApp".
        access = access_log.name
        assert [name for name, _ in warned] == [access, "jupyter_gpu_gov.hub"], warned
        assert warned[0][1].startswith("403 GET /services/gpu-gov/api/servers (127.0.0.1)")
        assert warned[1][1].startswith("gpu-gov: GET /services/gpu-gov/api/servers refused (429)")
        summaries = {
            (access, "gpu-gov: 5 more refused from 127.0.0.1 in the last minute"),
            ("jupyter_gpu_gov.hub", "gpu-gov: 1 more refused from 127.0.0.1 in the last minute"),
        }
        deadline = time.monotonic() + 30
        while not summaries <= {(r.name, r.getMessage()) for r in caplog.records}:
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            await asyncio.sleep(0.05)


# -- Where every server reaches the service from one address (a service mesh's sidecar, which
# proxies from 127.0.0.1; SNAT on a node): the per-address caps are settings.


async def test_servers_behind_one_address_keep_their_connections_as_the_setting_says(
    tmp_path, monkeypatch
):
    """600 servers' kept connections from one address: with ``max_connections_per_address``
    raised none is let go (at the default 512 the oldest were, and their reports churned)."""
    async with service(tmp_path, monkeypatch, max_connections_per_address=600) as (url, _, _):
        port = urllib.parse.urlsplit(url).port
        streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(600)]
        try:
            # The last one answered first: every connection before it was taken by then.
            for reader, writer in (streams[-1], streams[0]):
                writer.write(
                    f"GET {PREFIX}api/ HTTP/1.1\r\nHost: gov\r\n"
                    f"Authorization: token {ALICE}\r\n\r\n".encode()
                )
                line = await asyncio.wait_for(reader.readline(), 30)
                assert line.startswith(b"HTTP/1.1 200"), line
        finally:
            for _, writer in streams:
                writer.close()


async def test_servers_behind_one_address_are_checked_as_many_at_once_as_the_setting_says(
    tmp_path, monkeypatch
):
    """After a restart every server's token is checked with the Hub once; from one address
    they took turns 8 at a time (10,000 servers: seconds of queue, reports past 10 s 503).
    ``hub_checks_per_address`` sets how many."""
    async with service(tmp_path, monkeypatch, latency=0.5, hub_checks_per_address=40) as (
        url,
        _,
        hub,
    ):
        tokens = [f"alice-token-{n}" for n in range(40)]
        for token in tokens:
            hub.add_user_token("alice", token, extra_scopes=[ACCESS])
        hub.max_in_flight = 0
        client = AsyncHTTPClient(force_instance=True, max_clients=len(tokens))
        try:
            answers = await asyncio.gather(
                *(
                    client.fetch(
                        url + "api/",
                        headers={"Authorization": f"token {token}"},
                        raise_error=False,
                        request_timeout=60,
                    )
                    for token in tokens
                )
            )
        finally:
            client.close()
        assert [a.code for a in answers] == [200] * len(tokens)
        assert hub.max_in_flight >= 20, hub.max_in_flight  # 8 at most before


def test_a_bad_per_address_cap_stops_the_service_naming_it():
    for name, value in (("max_connections_per_address", -1), ("hub_checks_per_address", 0)):
        with pytest.raises(TraitError, match=rf"GpuGovernor\.{name} must be .*, got {value}$"):
            GpuGovernor(**{name: value})


async def test_a_caller_without_the_access_scope_costs_the_log_a_line_and_a_count(
    tmp_path, monkeypatch, caplog
):
    """A caller the Hub knows without the service's access scope (a user's token of another
    service, a script with the wrong scopes) is refused 403 at every request: its token is
    cached and its budget allows 10 a second, and each 403 wrote HubAuth's WARNING ("Not
    allowing Hub user ..."), tornado's line for the HTTPError and the access log's: a loop of
    them flooded the log. Now the caller's first refusal in a minute is a line, then a count,
    and every one counts in ``jupyter_gpu_gov_callers_refused_total``."""
    caplog.set_level(logging.INFO)
    before = metrics.CALLERS_REFUSED._value.get()
    async with service(tmp_path, monkeypatch) as (url, _, hub):
        hub.add_user_token("carol", "carol-token")  # a server's scopes, not the service's
        for path in ["api/servers", "api/", "me", "api/servers", "api/audit"]:
            assert (await get(url, path, "carol-token")).code == 403, path
        assert (await get(url, "api/servers", ALICE)).code == 200  # others are not held back
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "carol" in r.getMessage() + str(r.args)
    ]
    assert len(warned) == 1, warned  # the caller's first refusal; then a count a minute on
    assert warned[0].startswith("gpu-gov: Hub user 'carol' refused (403): without the service")
    access = [r.getMessage() for r in caplog.records if r.name == access_log.name]
    assert len([m for m in access if m.startswith("403 ")]) == 1, access
    assert metrics.CALLERS_REFUSED._value.get() - before == 5


async def test_failed_logins_count_against_their_address_as_refused_requests_do(
    tmp_path, monkeypatch
):
    """The login callback (a state cookie replays for weeks, each code a Hub check) was outside
    the per-address budget of refused requests: an address could fail logins as fast as it
    liked. Its failures now count against its address in ``refused_budget``, with the API's
    and the reports' refusals: past it, 429 with ``Retry-After`` and no Hub check."""
    async with service(tmp_path, monkeypatch, refused_budget=SLOW, refused_burst=3) as (
        url,
        _,
        hub,
    ):
        assert (await get(url, "api/servers", ALICE)).code == 200  # alice's token cached
        callback = "oauth_callback?code=bogus&state=forged"
        for _ in range(3):
            assert (await get(url, callback, "")).code == 403  # the state matches no cookie
        answer = await get(url, callback, "")
        assert answer.code == 429 and int(answer.headers["Retry-After"]) >= 90
        checks = hub.counters["GET /user"]
        assert (await get(url, "api/servers", "bogus-token")).code == 429  # one budget
        assert hub.counters["GET /user"] == checks
        assert (await get(url, "api/servers", ALICE)).code == 200  # a cached caller is served
