"""A user or server whose name no store holds as it is (longer than JupyterHub's 255
characters, NUL: a Hub on SQLite keeps such a user, JupyterHub 4.1-5.x such a server) is kept
under its kept form (``core.text.stored_name``). Here, over real HTTP to the service's web app
(its handlers, HubOAuth against the fake Hub API, the SQLite store): such a name is never a way
around a reader's filter, nor a server's reports lost before the Hub's listing."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from urllib.parse import quote

from fake_hub_api import FakeHub
from sqlalchemy import text
from test_report import REPORT
from tornado.httpclient import AsyncHTTPClient
from tornado.netutil import bind_sockets

from jupyter_gpu_gov.core import clock, vocabulary
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.text import not_text_at, stored_name
from jupyter_gpu_gov.core.vocabulary import server_key
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store

PREFIX = "/services/gpu-gov/"
ACCESS = "access:services!service=gpu-gov"
LONG = "l" * 300  # a user longer than JupyterHub keeps (a Hub on SQLite lets an admin make one)
NUL = "c\0arol"  # a user holding NUL, which PostgreSQL refuses in text
ADMIN, ALICE = "admin-token", "alice-token"
TOKENS = {LONG: "long-token", NUL: "nul-token"}


class Service:
    """The governor's web app on this loop, against a fake Hub; ``get``: a request to it."""

    def __init__(self, hub: FakeHub, governor: Governor, url: str, server) -> None:
        self.hub, self.governor, self.url, self.server = hub, governor, url, server

    async def get(self, path: str, token: str = ADMIN) -> tuple[int, dict | str]:
        response = await AsyncHTTPClient().fetch(
            self.url + path, headers={"Authorization": f"token {token}"}, raise_error=False
        )
        body = response.body.decode()
        kind = response.headers.get("Content-Type", "")
        return response.code, json.loads(body) if kind.startswith("application/json") else body

    async def post(self, path: str, body: dict, token: str) -> tuple[int, dict]:
        response = await AsyncHTTPClient().fetch(
            self.url + path,
            method="POST",
            body=json.dumps(body),
            headers={"Authorization": f"token {token}"},
            raise_error=False,
        )
        return response.code, json.loads(response.body)


@asynccontextmanager
async def running(tmp_path, monkeypatch) -> AsyncIterator[Service]:
    """The service against a fake Hub running alice's server, with the tokens above."""
    async with FakeHub() as hub:
        hub.add_server("alice")
        hub.add_user_token("alice", ALICE, extra_scopes=[ACCESS, "access:servers!user=alice"])
        hub.add_user_token("root", ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        for user, token in TOKENS.items():
            hub.add_user_token(user, token, extra_scopes=[ACCESS, f"access:servers!user={user}"])
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
        sockets = bind_sockets(0, "127.0.0.1")
        url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}{PREFIX}"
        server = GpuGovernor(report_budget=0, refused_budget=0, api_budget=0).make_server(governor)
        await server.add_sockets(sockets)
        try:
            yield Service(hub, governor, url, server)
        finally:
            server.stop()


async def cull_both(service: Service) -> None:
    """Each of the two users' servers idle for 5 h: warned and culled by the passes."""
    long_ago = clock.utcnow() - timedelta(hours=5)
    service.hub.add_server(LONG, "gpu", started=long_ago, last_activity=long_ago)
    service.hub.add_server(NUL, started=long_ago, last_activity=long_ago)
    for _ in range(3):
        assert (await service.governor.reconcile()).errors == ()
    assert not service.hub.running(LONG, "gpu") and not service.hub.running(NUL)
    service.governor.flush_usage()


def audit_keys(answer: dict) -> set[str]:
    return {row["server"] for row in answer["audit"]}


async def test_an_admin_finds_such_a_users_audit_and_usage_by_their_hub_name(tmp_path, monkeypatch):
    """An admin's ``api/audit?user=<the Hub's name>`` and ``api/usage?user=…`` of a user the
    store keeps under a kept form found nothing (the filter compared the name as asked with the
    kept form), so the cull of their server could not be read by their name; NUL in the query
    was read as a space. Both the Hub's name and the kept form, as the API shows it, find them."""
    async with running(tmp_path, monkeypatch) as service:
        await cull_both(service)
        for user, key in ((LONG, server_key(LONG, "gpu")), (NUL, server_key(NUL))):
            for asked in (user, stored_name(user)):
                code, answer = await service.get(f"api/audit?user={quote(asked, safe='')}")
                assert code == 200 and audit_keys(answer) == {key}, (code, str(answer)[:300])
                assert "cull" in {row["action"] for row in answer["audit"]}
                code, answer = await service.get(
                    f"api/usage?user={quote(asked, safe='')}&group_by=user"
                )
                assert code == 200 and [r["user"] for r in answer["usage"]] == [stored_name(user)]
                assert answer["usage"][0]["culls"] == 1
            for asked in (f"{LONG}/gpu" if user == LONG else f"{NUL}/", key):
                code, answer = await service.get(f"api/audit?server={quote(asked, safe='')}")
                assert code == 200 and audit_keys(answer) == {key}, (code, str(answer)[:300])


async def test_such_a_user_reads_their_own_audit_and_usage_and_no_one_elses(tmp_path, monkeypatch):
    """The user's own ``api/audit`` and ``api/usage`` (their name from the Hub's answer for
    their token) read the kept form's rows, whichever of their two names they ask by; no one
    else reads them by naming the kept form."""
    async with running(tmp_path, monkeypatch) as service:
        await cull_both(service)
        key = server_key(LONG, "gpu")
        token = TOKENS[LONG]
        for query in ("", f"?user={quote(LONG)}", f"?user={quote(stored_name(LONG), safe='')}"):
            code, answer = await service.get(f"api/audit{query}", token)
            assert code == 200 and audit_keys(answer) == {key}, (query, code, str(answer)[:300])
            code, answer = await service.get(
                f"api/usage{query}{'&' if query else '?'}group_by=user", token
            )
            assert code == 200 and [r["user"] for r in answer["usage"]] == [stored_name(LONG)]
        code, answer = await service.get(f"api/audit?server={quote(key, safe='')}", token)
        assert code == 200 and audit_keys(answer) == {key}
        code, page = await service.get("me", token)  # "My GPU usage": their session, by name
        assert code == 200 and "<td><bdi>gpu</bdi></td>" in page
        for asked in (LONG, stored_name(LONG)):
            for path in ("api/audit?user=", "api/usage?user=", "me?user="):
                code, answer = await service.get(path + quote(asked, safe=""), ALICE)
                assert code == 403, (path, code)
            code, answer = await service.get(f"api/audit?server={quote(key, safe='')}", ALICE)
            assert code == 403


async def test_a_report_of_such_a_server_before_the_hubs_listing_is_taken(tmp_path, monkeypatch):
    """A server the Hub started since the last pass reports before any pass listed it: the
    governor asks the Hub whether it runs it. For a user whose name is kept under a kept
    form it asked the Hub about the kept form, a user the Hub does not know: the report was
    refused (404) until the pass's listing. It now asks by the names the report gives (the
    token's owner's, checked), and the report is taken at once; the pass then knows it."""
    async with running(tmp_path, monkeypatch) as service:
        await service.governor.reconcile()
        service.hub.add_server(LONG, "gpu")  # started after the pass
        report = json.loads(json.dumps(REPORT))
        report["server"] |= {"user": LONG, "name": "gpu"}
        code, answer = await service.post("api/reports", report, TOKENS[LONG])
        assert code == 200, (code, answer)
        key = server_key(LONG, "gpu")
        assert key in service.governor.reports
        await service.governor.reconcile()
        assert service.governor.row(key) is not None and service.governor.hub_ran(key)
        # The dashboard's user box finds it by the Hub's name too, as by a part of its kept
        # form.
        for asked in (LONG, stored_name(LONG), "lll"):
            code, page = await service.get(f"?all=1&user={quote(asked, safe='')}")
            assert code == 200 and f'data-server="{key}"' in page, asked[:10]
        # A server the Hub does not run is still refused, with a reason the reporter reads.
        report["server"]["name"] = "made-up"
        code, answer = await service.post("api/reports", report, TOKENS[LONG])
        assert code == 404 and "the Hub runs no server" in answer["message"]


def unisolated(page: str) -> str:
    """The page a reader sees less what is isolated: each ``<bdi>`` and each U+2068 ... U+2069
    (a tooltip's, an ``<option>``'s, the ``<title>``'s, and a name inside a reason); attributes
    that are not shown (a form's values, a row's ``data-server``) left out."""
    page = re.sub(r' (?:value|data-[a-z-]+|href)="[^"]*"', "", page)
    for alone in (r"<bdi>.*?</bdi>", "\u2068[^\u2069]*\u2069"):
        page = re.sub(alone, "", page, flags=re.S)
    return page


async def test_a_reason_naming_a_team_with_a_bidi_override_reorders_nothing_around_it(
    tmp_path, monkeypatch
):
    """A borrowed GPU asked back for a team whose name holds U+202E: the reason ("team …,
    within its guarantee, needs this borrowed GPU back") was shown as it is in the dashboard's
    state tooltip and on the owner's page, and the override turned the rest of the reason, and
    the page's text after it on that line, right to left. The name is its own isolate inside
    the reason, and the reason its own where it is shown; the page has no override outside one."""
    rlo = "\u202e"
    async with running(tmp_path, monkeypatch) as service:
        grant = {
            "gpu-gov/team": f"vis{rlo}ion",
            "gpu-gov/tier": "h100",
            "gpu-gov/weight": "1",
            "gpu-gov/borrowed": "true",
            "gpu-gov/reclaim": clock.isoformat(clock.utcnow()),
            "gpu-gov/reclaim-for": f"{rlo}evil",
        }
        service.hub.add_server("bob", state={"gpu_gov_grant": grant})
        service.hub.add_user_token(
            "bob", "bob-token", extra_scopes=[ACCESS, "access:servers!user=bob"]
        )
        await service.governor.reconcile()
        reason = service.governor.verdict("bob/")["reason"]
        assert f"team \u2068{rlo}evil\u2069, within its guarantee" in reason, reason
        for path, token in (("", ADMIN), ("?all=1&team=" + quote(f"vis{rlo}ion"), ADMIN)):
            code, page = await service.get(path, token)
            assert code == 200 and 'data-server="bob/"' in page
            assert rlo not in unisolated(page), path
        code, page = await service.get("me", "bob-token")
        assert code == 200 and "needs this borrowed GPU back" in page
        assert rlo not in unisolated(page)


async def test_a_name_holding_the_kept_forms_mark_keeps_one_key_across_restarts(tmp_path):
    """A user or server whose name already holds U+FFFD (the mark of a kept form) is kept as a
    kept form too: the same name always maps to the same key, so each restart of the governor
    finds the row, the record and the open ledger session it left, never a new one."""
    names = [("bob", "a\ufffdb"), ("\ufffdcy", ""), ("dee", stored_name("n" * 300))]
    database = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    async with FakeHub() as hub:
        for user, name in names:
            hub.add_server(user, name)
        keys = {server_key(u, n) for u, n in names}
        assert len(keys) == len(names) and all("\ufffd" in k for k in keys)
        for _ in range(3):  # a start and two restarts on the same store
            governor = Governor(
                Store(database),
                HubApi(hub.api_url, hub.token),
                load_policies([], {"warn_after": "1h", "cull_after": "2h"}),
                Options(),
            )
            for _ in range(2):
                assert (await governor.reconcile()).errors == ()
            governor.flush_usage()
            store = governor.store
            assert set(governor.rows) == keys
            assert set(store.servers()) == keys
            assert {s.server for s in store.usage_sessions(open_only=True)} == keys
            assert len(store.usage_sessions()) == len(names)


def as_kept_before_kept_forms(name: str) -> str:
    """``stored_name`` as earlier releases kept a name: as it is wherever the store
    could hold it, U+FFFD and all."""
    if len(name) <= 255 and "\0" not in name and not_text_at(name) is None:
        return name
    return stored_name(name)


async def test_an_upgrade_keeps_the_row_and_history_of_a_name_kept_as_it_was(tmp_path, monkeypatch):
    """An earlier release kept a name holding U+FFFD as it is (``bob/a\\ufffdb``); this
    one keeps it in its kept form. Upgraded on the same store, the governor made a second row
    under the new key: the running server's record and open ledger session were left under the
    old key, and its history split in two; a culled user's trail and usage could be read only
    by a name no filter finds. The upgrade moves what was kept under such a name to its kept
    form, once: one row, one session, one trail."""
    busy, idle = ("bob", "a\ufffdb"), ("\ufffdcy", "")
    database = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    now, long_ago = clock.utcnow(), clock.utcnow() - timedelta(hours=5)
    async with FakeHub() as hub:
        hub.add_server(*busy, started=now - timedelta(hours=1), last_activity=now)
        hub.add_server(*idle, started=long_ago, last_activity=long_ago)  # culled by the old

        def governor() -> Governor:
            return Governor(
                Store(database),
                HubApi(hub.api_url, hub.token),
                load_policies([], {"warn_after": "1h", "cull_after": "2h"}),
                Options(),
            )

        with monkeypatch.context() as old:  # the release before, on this store
            for module in list(sys.modules.values()):
                if getattr(module, "__name__", "").startswith("jupyter_gpu_gov") and (
                    getattr(module, "stored_name", None) is stored_name
                ):
                    old.setattr(module, "stored_name", as_kept_before_kept_forms)
            vocabulary._KEYS.clear()
            before = governor()
            for _ in range(3):
                assert (await before.reconcile()).errors == ()
            before.flush_usage()
            assert not hub.running(*idle)
            assert set(before.store.servers()) == {"bob/a\ufffdb", "\ufffdcy/"}
            assert {r.server_key for r in before.store.audit_rows(user="\ufffdcy")} == {"\ufffdcy/"}
            with before.store.engine.begin() as db:  # as that release left its version
                db.execute(text("UPDATE meta SET value = '10' WHERE key = 'schema_version'"))
        vocabulary._KEYS.clear()  # (a new process)
        sessions = {s.session for s in before.store.usage_sessions(user="bob")}
        assert len(sessions) == 1
        culls = sum(b.values["culls"] for b in before.store.usage())
        assert culls == 1

        after = governor()
        for _ in range(2):
            assert (await after.reconcile()).errors == ()
        after.flush_usage()
        store = after.store
        busy_key, idle_key = server_key(*busy), server_key(*idle)
        assert busy_key != "bob/a\ufffdb" and idle_key != "\ufffdcy/"
        assert set(after.rows) == {busy_key, idle_key}
        assert set(store.servers()) == {busy_key, idle_key}  # none left under the old key
        assert {s.session for s in store.usage_sessions(open_only=True)} == sessions
        assert {s.server for s in store.usage_sessions()} == {busy_key, idle_key}
        trail = store.audit_rows(user=stored_name(idle[0]))
        assert {r.server_key for r in trail} == {idle_key} and "cull" in {r.action for r in trail}
        assert not store.audit_rows(user="\ufffdcy")
        users = {b.owner.user for b in store.usage()}
        assert stored_name(idle[0]) in users and "\ufffdcy" not in users
        assert sum(b.values["culls"] for b in store.usage()) == culls
