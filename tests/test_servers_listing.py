"""``GET api/servers``: every server as before, and a page of them (``after``, ``limit``).

The real service (``test_report_budget.service``: its server, HubOAuth against a fake Hub over
HTTP, the SQLite store) with 25 more users' servers running.
"""

from __future__ import annotations

import hashlib
import json
from urllib.parse import quote

import pytest
from test_fuzz_api import ACCESS
from test_report_budget import ALICE, get, post, report_of, service

ADMIN = ("root", "root-token")


async def listed(url: str, query: str = "", token: str = ADMIN[1]) -> dict:
    answer = await get(url, f"api/servers{query}", token)
    assert answer.code == 200, answer.body
    return json.loads(answer.body)


async def test_an_admin_lists_every_server_as_the_governor_lists_each(tmp_path, monkeypatch):
    """Built from a snapshot in a worker, each server is what ``GET …/server`` and the
    governor's listing say of it, in key order, with nothing added to the answer."""
    async with service(tmp_path, monkeypatch) as (url, governor, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        hub.populate(25)
        await governor.reconcile()
        assert (await post(url, ALICE, report_of("alice"))).code == 200  # a report, a GPU
        answer = await listed(url)
        expected = [
            governor.listing(row)
            for row in sorted(governor.known_servers(), key=lambda row: row.key)
        ]
        assert list(answer) == ["servers"]
        assert answer["servers"] == json.loads(json.dumps(expected))
        assert len(answer["servers"]) == 27
        alice = answer["servers"][[s["user"] for s in answer["servers"]].index("alice")]
        assert alice["gpu"] is not None and alice["gpu"]["reported_at"]
        # A user: their own, the same way.
        own = await listed(url, token=ALICE)
        assert own == {"servers": [alice]}


async def test_pages_of_servers_are_every_server_once_in_order(tmp_path, monkeypatch):
    """``limit`` servers ``after`` a key; ``next``: the key to ask after for the next page,
    null on the last."""
    async with service(tmp_path, monkeypatch) as (url, governor, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        hub.populate(25)
        await governor.reconcile()
        everything = (await listed(url))["servers"]
        pages, after = [], ""
        while True:
            page = await listed(url, f"?limit=10{after}")
            assert set(page) == {"servers", "next"}
            pages.append(page["servers"])
            if page["next"] is None:
                break
            assert page["next"] == f"{page['servers'][-1]['user']}/{page['servers'][-1]['name']}"
            after = f"&after={page['next']}"
        assert [len(p) for p in pages] == [10, 10, 7]
        assert [s for p in pages for s in p] == everything
        exact = await listed(url, "?limit=27")
        assert exact == {"servers": everything, "next": None}
        # ``after`` alone: every server after that key.
        rest = await listed(url, f"?after={everything[-3]['user']}/")
        assert rest == {"servers": everything[-2:]}


@pytest.mark.parametrize(
    "query, named",
    [
        ("?limit=0", "'limit'"),
        ("?limit=10001", "'limit'"),
        ("?limit=-1", "'limit'"),
        ("?limit=ten", "'limit'"),
        ("?limit=1.5", "'limit'"),
        ("?limit=", "'limit'"),
        ("?limit=" + "9" * 5000, "'limit'"),
        ("?after=", "'after'"),
        ("?after=" + "a" * 1025, "'after'"),
    ],
)
async def test_a_bad_page_is_refused_naming_the_parameter(tmp_path, monkeypatch, query, named):
    async with service(tmp_path, monkeypatch) as (url, governor, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        await governor.reconcile()
        answer = await get(url, f"api/servers{query}", ADMIN[1])
        assert answer.code == 400, answer.body
        assert named in json.loads(answer.body)["message"]


async def test_an_unchanged_listing_is_not_sent_again(tmp_path, monkeypatch):
    """Its ETag, hashed in the worker now, is the one tornado gave it: a client that sends it
    back gets 304 while nothing changed."""
    async with service(tmp_path, monkeypatch) as (url, governor, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        await governor.reconcile()
        first = await get(url, "api/servers", ADMIN[1])
        etag = first.headers["Etag"]
        assert etag == f'"{hashlib.sha1(first.body).hexdigest()}"'
        again = await get(url, "api/servers", ADMIN[1], **{"If-None-Match": etag})
        assert again.code == 304 and not again.body


async def test_a_page_after_a_key_that_is_not_trimmed_goes_on_from_that_key(tmp_path, monkeypatch):
    """``after`` is the key ``next`` gave, as sent: a server named before JupyterHub 6's slugs
    (a trailing space) or a user named with a control character is neither listed twice nor
    skipped past (a cursor trimmed or with its control characters made spaces was another
    key: the page after ``carol/lab `` began at ``carol/lab `` again, for ever)."""
    async with service(tmp_path, monkeypatch) as (url, governor, hub):
        hub.add_user_token(*ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        hub.add_server("carol", "lab ")
        for user in ("eve\x01a", "eve\x01b", "eve a"):
            hub.add_server(user)
        await governor.reconcile()
        everything = (await listed(url))["servers"]
        keys = [f"{s['user']}/{s['name']}" for s in everything]
        assert {"carol/lab ", "eve\x01a/", "eve\x01b/", "eve a/"} <= set(keys)
        paged, after = [], ""
        for _ in range(len(keys) + 2):  # (a cursor that loops would never end)
            page = await listed(url, f"?limit=1{after}")
            paged += [f"{s['user']}/{s['name']}" for s in page["servers"]]
            if page["next"] is None:
                break
            after = "&after=" + quote(page["next"], safe="")
        assert paged == keys
