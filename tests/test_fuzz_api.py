"""Fuzzing the governor's HTTP API (issue 18): every malformed report and every malformed API
parameter gets a 4xx that names what is wrong, and changes nothing — never a 500.

The real service web app (its handlers, HubOAuth against a fake Hub API over HTTP, the SQLite
store) runs on a thread's event loop; Hypothesis sends it requests over real HTTP.
"""

from __future__ import annotations

import asyncio
import copy
import csv
import hashlib
import html
import io
import json
import logging
import re
import threading
import time
from datetime import timedelta
from urllib.parse import quote

import pytest
import requests
from fake_hub_api import FakeHub
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_report import REPORT

from jupyter_gpu_gov.core import clock
from jupyter_gpu_gov.core.policy import load_policies
from jupyter_gpu_gov.core.wire import ASKER_HEADER
from jupyter_gpu_gov.hub import routes
from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.hubapi import HubApi
from jupyter_gpu_gov.hub.options import Options
from jupyter_gpu_gov.hub.reconcile import Governor
from jupyter_gpu_gov.hub.store import Store

PREFIX = "/services/gpu-gov/"
ACCESS = "access:services!service=gpu-gov"
OWNER, ADMIN = "owner-token", "admin-token"  # alice's server's own token; root's, an admin
ALICE = "alice-token"  # alice's own: any of her servers (access:servers!user=alice)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Service:
    """The governor's web app and a fake Hub, on their own thread's event loop."""

    def __init__(self, tmp_path, monkeypatch):
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(60)

    async def _start(self) -> None:
        from tornado.netutil import bind_sockets

        self.hub = FakeHub()
        self.hub.start()
        self.hub.add_server("alice", started=clock.utcnow() - timedelta(minutes=5))
        self.hub.add_user_token("alice", OWNER, extra_scopes=[ACCESS])
        self.hub.add_user_token("alice", ALICE, extra_scopes=[ACCESS, "access:servers!user=alice"])
        self.hub.add_user_token("root", ADMIN, extra_scopes=[ACCESS, "custom:gpu-gov:admin"])
        for key, value in {
            "JUPYTERHUB_API_URL": self.hub.api_url,
            "JUPYTERHUB_API_TOKEN": self.hub.token,
            "JUPYTERHUB_SERVICE_NAME": "gpu-gov",
            "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
            "JUPYTERHUB_CLIENT_ID": "service-gpu-gov",
            "JUPYTERHUB_BASE_URL": "/",
        }.items():
            self.monkeypatch.setenv(key, value)
        self.governor = Governor(
            Store(f"sqlite:///{self.tmp_path / 'gov.sqlite'}"),
            HubApi(self.hub.api_url, self.hub.token),
            load_policies([], {"warn_after": "1h", "cull_after": "2h"}),
            Options(),
        )
        await self.governor.reconcile()
        sockets = bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}{PREFIX}"
        # Hundreds of reports and API requests a second from one token: no budget, and every
        # refusal's log line written (tests/test_report_budget.py has both).
        self.monkeypatch.setattr(routes, "REFUSAL_LINES_EVERY_S", 0)
        self.server = GpuGovernor(report_budget=0, refused_budget=0, api_budget=0).make_server(
            self.governor
        )
        await self.server.add_sockets(sockets)

    def stop(self) -> None:
        async def stop():
            self.server.stop()
            self.hub.stop()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)

    def snapshot(self) -> tuple:
        """What a request could change: reports kept, each server's record, the audit trail,
        extension requests."""
        gov = self.governor
        rows = {k: (r.state, r.exempt_until, r.extensions_used) for k, r in gov.rows.items()}
        reports = {k: id(r) for k, r in gov.reports.items()}
        audit = [a.id for a in gov.store.audit_rows(limit=5000)]
        return reports, rows, audit, [e.id for e in gov.store.extensions()]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    service = Service(tmp_path_factory.mktemp("fuzz"), monkeypatch)
    yield service
    service.stop()
    monkeypatch.undo()


def call(service, method: str, path: str, token: str = ADMIN, **kwargs) -> requests.Response:
    headers = {"Authorization": f"token {token}", **kwargs.pop("headers", {})}
    kwargs.setdefault("timeout", 30)
    return requests.request(method, service.url + path, headers=headers, **kwargs)


def assert_refused_unchanged(service, response: requests.Response, before: tuple, *names: str):
    """A 4xx (never a 5xx) whose message names one of ``names``, and nothing changed."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    message = response.json()["message"]
    assert any(name in message for name in names), (names, message)
    assert service.snapshot() == before


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


def paths(node, prefix=()):
    """Every place in a report a value can be changed."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths(value, (*prefix, index))


def fresh_report() -> dict:
    report = copy.deepcopy(REPORT)
    now = clock.utcnow()
    report["sampled_at"] = clock.isoformat(now)
    report["server"]["started"] = clock.isoformat(now - timedelta(minutes=4))
    report["window"]["gpu_idle_since"] = clock.isoformat(now - timedelta(minutes=1))
    return report


REPORT_PATHS = [p for p in paths(REPORT) if p]


# Values that broke a governor before: huge numbers, the last second of year 9999, the first
# of year 1.
extremes = st.sampled_from(
    [10**400, -(10**400), 1e308, -1e308, -1, "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"]
)


@settings(FUZZ, max_examples=300)
@given(path=st.sampled_from(REPORT_PATHS), value=extremes | json_values, drop=st.booleans())
def test_a_malformed_report_is_a_4xx_naming_its_field_and_changes_nothing(
    service, path, value, drop
):
    report = fresh_report()
    node = report
    for part in path[:-1]:
        node = node[part]
    if drop and isinstance(node, dict):
        node.pop(path[-1])
    else:
        node[path[-1]] = value
    before = service.snapshot()
    r = call(service, "POST", "api/reports", OWNER, data=json.dumps(report))
    if r.status_code == 200:  # a change that is still a valid report
        return
    field = ".".join(str(p) for p in path if isinstance(p, str)).split(".")[0]
    assert_refused_unchanged(service, r, before, "invalid report", field)


@FUZZ
@given(body=st.binary(max_size=200) | json_values.map(json.dumps))
def test_a_report_that_is_not_a_report_is_a_4xx(service, body):
    before = service.snapshot()
    r = call(service, "POST", "api/reports", OWNER, data=body)
    assert_refused_unchanged(service, r, before, "body", "report", "schema")


# "²" is a digit to str.isdigit() that int() refuses: a limit of "²" once made a 500.
texts = st.text(max_size=30) | st.sampled_from(
    ["-1", "0", "5001", "1e999", "99999999d", "9" * 50, "²", "٣"]
)
PARAMETERS = {
    "api/audit": {"limit": texts, "server": texts, "user": texts, "before": texts},
    "api/usage": {"group_by": texts, "since": texts, "until": texts, "format": texts},
    "api/extensions": {"status": texts, "limit": texts, "before": texts},
    "api/history/trace": {"since": texts, "until": texts, "step": texts},
}


@FUZZ
@given(data=st.data())
def test_query_parameters_never_make_a_500(service, data):
    path = data.draw(st.sampled_from(sorted(PARAMETERS)))
    params = {k: data.draw(v) for k, v in PARAMETERS[path].items() if data.draw(st.booleans())}
    before = service.snapshot()
    r = call(service, "GET", path, params=params)
    if r.status_code == 200:
        return
    assert_refused_unchanged(service, r, before, *params)


@pytest.mark.parametrize("digit", ["²", "٣", "\uff11"])
def test_a_number_in_other_scripts_is_a_400_naming_it(service, digit):
    """str.isdigit() says yes to these; int() refuses "²" (it once made a 500)."""
    before = service.snapshot()
    r = call(service, "GET", "api/audit", params={"limit": digit})
    assert_refused_unchanged(service, r, before, "limit")


@pytest.mark.parametrize("path", ["api/audit", "api/extensions", "api/servers"])
@pytest.mark.parametrize("limit", ["9" * 5000, "0" * 4999 + "1"])
def test_a_limit_of_thousands_of_digits_is_a_400_naming_it(service, path, limit):
    """Python's int() refuses a string of over 4,300 digits with a ValueError: a limit of
    5,000 nines (one URL of 5 kB, any user's) was a 500 with a traceback in the log."""
    before = service.snapshot()
    r = call(service, "GET", path, params={"limit": limit})
    assert_refused_unchanged(service, r, before, "'limit'")


@pytest.mark.parametrize(
    ("method", "path", "named"),
    [
        ("GET", "api/servers?all=1&limt=1", "unknown parameter 'limt'"),  # every server's
        ("GET", "api/servers?all=on", "'all' must be 1, true or yes"),  # running only
        ("GET", "api/servers?limit=1&limit=500", "'limit' given 2 times"),
        ("GET", "api/audit?sever=alice/", "unknown parameter 'sever'"),  # every server's trail
        ("GET", "api/audit?server=", "'server' is empty"),  # an unset variable's: the same
        ("GET", "api/audit?user=", "'user' is empty"),
        ("GET", "api/audit?server=alice/&server=bob/", "'server' given 2 times"),
        ("GET", "api/extensions?stauts=pending", "unknown parameter 'stauts'"),  # every status
        ("GET", "api/diagnosis?dyas=30", "unknown parameter 'dyas'"),  # 7 days
        ("GET", "api/history/trace?since=1h&pseudonymize=1", "unknown parameter 'pseudonymize'"),
        ("GET", "api/history/trace?since=1h&pseudonymise=on", "'pseudonymise' must be 1, true"),
        ("GET", "api/history/trace?snice=30d", "unknown parameter 'snice'"),  # the last hour
        ("DELETE", "api/policy/dry-run?raeson=done", "unknown parameter 'raeson'"),
    ],
)  # fmt: skip
def test_a_misspelt_or_repeated_parameter_is_a_400_naming_it(service, method, path, named):
    """Every endpoint read a parameter it did not know as absent: ``pseudonymize=1`` (the
    American spelling) exported every user's name in a trace asked pseudonymised, ``limt=1``
    listed every server, ``sever=alice/`` every server's audit trail, and said nothing. Each
    is now a 400 naming it, as ``api/usage`` answers, with nothing done."""
    before = service.snapshot()
    r = call(service, method, path)
    assert_refused_unchanged(service, r, before, named)


TIGHT = {"policies": [{"name": "tight", "cull_after": "45m"}]}


@pytest.mark.parametrize(
    ("method", "path", "body", "named"),
    [
        ("POST", "api/policy/apply?dry_run=true", {"candidate": TIGHT, "reason": "try"},
         "unknown parameter 'dry_run'"),  # applied for real
        ("POST", "api/users/alice/server/extend?reason=deadline", None,
         "unknown parameter 'reason'"),  # extended, on record without its why
        ("POST", "api/users/alice/server/cull?immediately=true", {"reason": "stuck"},
         "unknown parameter 'immediately'"),  # culled after a notice
        ("POST", "api/users/alice/server/exempt?duration=1h", {"reason": "demo"},
         "unknown parameter 'duration'"),
        ("DELETE", "api/users/alice/server/exempt?reason=done", None,
         "unknown parameter 'reason'"),  # lifted, on record as 'lifted'
        ("POST", "api/policy/revert?reason=back", {}, "unknown parameter 'reason'"),
    ],
)  # fmt: skip
def test_a_write_takes_no_parameter_in_its_url(service, method, path, body, named):
    """A write reads its arguments from its body, and read none from its URL: one put there
    (``curl -X POST '…/apply?dry_run=true' -d @candidate.json``) was dropped unsaid and the
    write done without it: the candidate applied for real, an exemption for the default day.
    Now a 400 naming it, with nothing done, as a GET's unknown parameter is."""
    live, before = call(service, "GET", "api/policy").json(), service.snapshot()
    r = call(service, method, path, data=None if body is None else json.dumps(body))
    assert_refused_unchanged(service, r, before, named)
    assert "its arguments go in the body" in r.json()["message"]
    assert call(service, "GET", "api/policy").json() == live
    for path, form in (
        ("actions?confirm=yes", {"server": "alice/", "action": "cull", "reason": "stuck"}),
        ("policy?action=dry-run", {"action": "apply", "candidate": json.dumps(TIGHT),
                                   "reason": "try"}),
    ):  # fmt: skip
        r = call(service, "POST", path, data=form, allow_redirects=False)
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        assert "unknown parameter" in r.text, r.text[:300]
    assert call(service, "GET", "api/policy").json() == live
    assert service.snapshot() == before


def test_a_write_still_takes_the_token_and_xsrf_in_its_url(service):
    """HubAuth's ``token`` (where the Hub allows one in a URL) and tornado's ``_xsrf`` are
    not the write's arguments: a write with them is answered as without."""
    path = f"api/users/alice/server/exempt?token={ADMIN}&_xsrf=x"
    r = call(service, "DELETE", path, data=json.dumps({"reason": "checked"}))
    assert r.status_code == 200, r.text[:300]


def test_every_query_a_caller_sends_is_still_answered(service):
    """What the pages' links and forms, the CLI, the docs' examples and HubAuth (``token`` in
    the URL) send, each endpoint still answers: none of them is refused as unknown."""
    sent = [
        "api/servers?all=1&limit=2",
        "api/servers?all=1&after=alice/&limit=2",
        "api/servers?all=0",
        f"api/servers?token={ADMIN}",  # HubAuth's own (where the Hub allows it in URLs)
        "api/audit?server=alice/&limit=5",
        "api/audit?user=alice&before=99",
        "api/extensions?status=pending&limit=5&before=99",
        "api/diagnosis?days=7",  # jupyter-gpu-gov diagnose
        "api/history/trace?since=1h&until=&step=5m&pseudonymise=1",
        "?user=alice&team=&tier=&state=&all=1&sort=memory",  # the dashboard's filter form
        "?sort=team&desc=0",  # its column headers' links
        "showback?group_by=team&period=week&since=2026-11-01&until=2026-11-30",
    ]
    for path in sent:
        r = call(service, "GET", path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    # Every link a page writes to the service, followed.
    links = set()
    for page, token in (("", ADMIN), ("showback", ADMIN), ("policy", ADMIN), ("me", ALICE)):
        r = call(service, "GET", page, token)
        assert r.ok, (page, r.status_code)
        for href in re.findall(r'href="([^"]*\?[^"]*)"', r.text):
            href = html.unescape(href)
            if href.startswith(PREFIX):
                links.add(href[len(PREFIX) :])
            elif href.startswith("?"):
                links.add(href)
    for kind in ("showback?", "api/usage?", "api/history/trace?", "?sort="):
        assert any(link.startswith(kind) for link in links), (kind, links)
    for link in sorted(links):
        r = call(service, "GET", link, ALICE if link.startswith("me") else ADMIN)
        assert r.status_code == 200, (link, r.status_code, r.text[:300])
    assert call(service, "GET", "me?user=alice", ALICE).status_code == 200
    r = call(service, "DELETE", "api/policy/dry-run?reason=done")  # the docs' example
    assert r.status_code == 404 and "no dry run" in r.json()["message"], r.text


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"until": "9999-12-31"}, "'until'"),
        ({"since": "0001-01-01T00:00:00+14:00"}, "'since'"),
        ({"until": "9999-12-31T23:59:59-14:00", "format": "csv"}, "'until'"),
        ({"since": "2026-03-02", "until": "2026-03-01"}, "'until' is before 'since'"),
    ],
)
def test_a_usage_span_out_of_range_is_a_400_naming_it(service, params, named):
    """A day at the calendar's end (its next day, or its UTC time, is past year 9999) made a
    500; a ``since`` after its ``until`` answered an empty 200 (the trace's API says 400)."""
    before = service.snapshot()
    r = call(service, "GET", "api/usage", params=params)
    assert_refused_unchanged(service, r, before, named)


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (
            "showback?group_by=teams",
            "'group_by' must be one of user, team, project, tier; got 'teams'",
        ),
        ("showback?group_by=team,day", "'group_by'"),  # the API's form, not the page's
        ("showback?period=month", "'period' must be day or week; got 'month'"),
        ("showback?days=0", "'days' must be a whole number of days from 1 to 366; got '0'"),
        ("showback?days=367", "got '367'"),
        ("showback?days=two", "got 'two'"),
        ("showback?days=%D9%A3", "'days'"),  # "٣": int() takes it
        ("?tem=vision", "unknown parameter 'tem'"),  # every team's servers, as if vision's
        ("?sort=user&sort=team", "'sort' given 2 times"),
        ("me?usr=bob", "unknown parameter 'usr'"),  # an admin's own page, as if bob's
        ("showback?dyas=30", "unknown parameter 'dyas'"),  # 14 days, as if 30
        ("?sort=size", "'sort' must be one of user, team"),
        ("?all=yes", "'all' must be 0 or 1; got 'yes'"),
        ("?desc=true", "'desc' must be 0 or 1; got 'true'"),
    ],
)
def test_a_page_asked_for_what_it_cannot_show_is_a_400_page_naming_it(service, path, named):
    """The showback page and the dashboard put a default in place of a parameter they did not
    take (a year asked, 14 days shown; ``sort=size``, idle time), and showed that data as if it
    were what was asked; the usage API answers 400 naming the parameter. So do the pages now,
    as a page."""
    r = call(service, "GET", path, ALICE if path.startswith("me") else ADMIN)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.headers["Content-Type"].startswith("text/html")
    said = re.search(r'<p id="error-message">(.*?)</p>', r.text, re.S)
    assert said and named in html.unescape(said.group(1)), r.text[:500]


def test_the_pages_defaults_and_their_own_choices_still_show_them(service):
    for path in (
        "showback",
        "showback?group_by=&period=&days=",  # a form's empty fields: the defaults
        "showback?group_by=user&period=week&days=366",
        "?all=1&desc=0&sort=memory",
        "?all=0&desc=1&sort=",
    ):
        r = call(service, "GET", path)
        assert r.ok and "error-message" not in r.text, (path, r.status_code, r.text[:300])


def test_my_page_asked_for_another_user_is_refused_not_mine_instead(service):
    """Anyone's ``me?user=bob`` showed their own page as if it were bob's; only admins may look
    at another user's page."""
    r = call(service, "GET", "me?user=bob", ALICE)
    assert r.status_code == 403 and "only admins may see another user" in html.unescape(r.text)
    assert call(service, "GET", "me?user=alice", ALICE).ok


def test_usage_asked_for_another_user_is_refused_not_mine_instead(service):
    """A non-admin's ``api/usage?user=bob&group_by=team`` answered with their own rows, as if
    they were bob's (``user=`` was replaced by the caller's name); as ``me?user=``, it is a 403."""
    r = call(service, "GET", "api/usage?user=bob&group_by=team", ALICE)
    assert r.status_code == 403 and "'user': only 'bob' or a governor admin" in r.text
    assert call(service, "GET", "api/usage?user=alice&group_by=team", ALICE).ok
    assert call(service, "GET", "api/usage?group_by=team", ALICE).ok
    assert call(service, "GET", "api/usage?user=bob&group_by=team", ADMIN).ok
    # api/audit?user=bob likewise answered with alice's own trail.
    r = call(service, "GET", "api/audit?user=bob", ALICE)
    assert r.status_code == 403 and "'user': only 'bob' or a governor admin" in r.text
    assert call(service, "GET", "api/audit?user=alice", ALICE).ok


def test_a_teams_usage_asked_by_a_non_admin_is_refused_not_their_own_rows_as_the_teams(
    service,
):
    """A team lead's ``api/usage?team=vision&group_by=team`` (``jupyter-gpu-gov usage --team
    vision``) answered with their own rows in vision, one row named "vision" that read as the
    team's. Without the showback scope it is a 403 naming the scope a Hub admin would give, and
    saying how to ask for one's own; named so, it is answered."""
    needs = {
        "team": "the usage of team 'vision' needs the scope custom:gpu-gov:showback!group=vision",
        "project": "a project's usage needs the scope custom:gpu-gov:showback for its teams",
        "tier": "a tier's usage needs the scope custom:gpu-gov:showback for its teams",
    }
    for name in ("team", "project", "tier"):
        r = call(service, "GET", f"api/usage?{name}=vision&group_by=team", ALICE)
        assert r.status_code == 403, (name, r.text)
        assert r.json()["message"] == (
            f"'{name}': reading {needs[name]} (a team lead's or finance's, given by a Hub "
            "admin) or custom:gpu-gov:admin; for your own in it, add user=alice"
        )
    assert call(service, "GET", "api/usage?team=vision&user=alice&group_by=team", ALICE).ok
    assert call(service, "GET", "api/usage?team=vision&group_by=team", ADMIN).ok


def test_an_admin_on_another_users_page_is_not_told_it_is_their_own(service):
    """An admin reading ``me?user=alice`` saw "My GPU-hours per day" over alice's chart, the
    tab titled and the navigation marked "My GPU usage"."""
    service.hub.add_user_token(  # root's own, not a server's: the page is owner-wide
        "root",
        "root-token",
        extra_scopes=[ACCESS, "custom:gpu-gov:admin", "access:servers!user=root"],
    )
    r = call(service, "GET", "me?user=alice", "root-token")
    assert r.ok, r.text[:300]
    theirs = html.unescape(r.text)
    # An ordinary name is itself in the title (no U+2068/9: it reorders nothing), so a name
    # copied from there finds its user in a filter, which reads it as sent.
    copied = re.search(r"<title>GPU usage of (.*?) ·", theirs)[1]
    assert copied == "alice", ascii(copied)
    again = call(service, "GET", f"me?user={quote(copied, safe='')}", "root-token")
    assert again.ok and "<title>GPU usage of alice ·" in html.unescape(again.text)
    assert "GPU-hours of alice per day, last 30 days" in theirs
    assert "My GPU-hours" not in theirs and 'class="here">My GPU usage' not in theirs
    own = html.unescape(call(service, "GET", "me", ALICE).text)
    assert "<title>My GPU usage ·" in own and "My GPU-hours per day, last 30 days" in own
    assert 'class="here">My GPU usage' in own


VERBS = {
    "extend": {"reason": json_values},
    "exempt": {"reason": json_values, "duration": json_values},
    "approve": {"reason": json_values, "duration": json_values},
    "deny": {"reason": json_values},
    "cull": {"reason": json_values},
    "stop": {"reason": json_values},
}


bad_reasons = st.sampled_from([None, 7, 1.5, True, [], {}, ["x"], "x" * 2001])


@FUZZ
@given(data=st.data())
def test_action_bodies_never_make_a_500_and_refusals_change_nothing(service, data):
    verb = data.draw(st.sampled_from(sorted(VERBS)))
    body = {k: data.draw(v) for k, v in VERBS[verb].items() if data.draw(st.booleans())}
    if verb in ("extend", "stop", "cull"):
        body["reason"] = data.draw(bad_reasons)  # a valid one would act: only bad ones
    raw = data.draw(st.sampled_from([None, "[", "[1]", "{" * 50_000, "\xff", "1" + "0" * 400]))
    payload = json.dumps(body) if raw is None else raw
    before = service.snapshot()
    r = call(service, "POST", f"api/users/alice/server/{verb}", data=payload)
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code < 300 or r.status_code == 409:  # valid: it acted, or had nothing to do
        return
    assert_refused_unchanged(service, r, before, "reason", "duration", "body", "JSON")


@settings(FUZZ, max_examples=40)  # each example replays history: 120 took ~50 s under load
@given(candidate=json_values | st.text(max_size=60), days=json_values)
def test_a_candidate_policy_never_makes_a_500_and_changes_nothing(service, candidate, days):
    """Validate and what-if take any candidate: valid, or a 400 naming what is wrong; the
    live policies stay."""
    live = call(service, "GET", "api/policy").json()
    for path, body in (
        ("api/policy/validate", {"candidate": candidate}),
        ("api/policy/what-if", {"candidate": candidate, "days": days}),
        ("api/policy/apply", {"candidate": candidate}),  # no reason: never applied
    ):
        r = call(service, "POST", path, data=json.dumps(body))
        assert r.status_code in (200, 400), (path, r.status_code, r.text[:500])
        if r.status_code == 400:
            assert r.json()["message"]
    assert call(service, "GET", "api/policy").json() == live


def test_a_candidate_of_more_policies_than_the_limit_is_a_400_naming_it(service):
    """About 20,000 policies fit the 1 MiB body: checked twice on the event loop (seconds
    while reports and passes wait), then every server's decision tried them all."""
    many = [{"name": f"p{i}", "match": {"users": [f"u{i}"]}} for i in range(20_000)]
    live = call(service, "GET", "api/policy").json()
    for path in ("api/policy/validate", "api/policy/apply"):
        body = {"candidate": {"policies": many}, "reason": "every user their own"}
        r = call(service, "POST", path, data=json.dumps(body))
        assert r.status_code == 400, (path, r.status_code, r.text[:500])
        assert "at most 1000 policies, got 20000" in r.json()["message"]
    assert call(service, "GET", "api/policy").json() == live


def test_the_metrics_are_for_admins_and_read_metrics_tokens_only(service):
    """``/metrics`` names every running server's user, team, project and pod
    (docs/grafana.md): a governor admin's token or one with ``read:metrics`` reads it
    (Prometheus's), anyone else's is a 403 naming the scope."""
    service.hub.add_user_token("alice", "metrics-token", extra_scopes=[ACCESS, "read:metrics"])
    r = call(service, "GET", "metrics", token=ALICE)
    assert r.status_code == 403 and "read:metrics" in r.json()["message"], r.text[:300]
    for token in (ADMIN, "metrics-token"):
        r = call(service, "GET", "metrics", token=token)
        assert r.status_code == 200 and "jupyter_gpu_gov_servers" in r.text, r.text[:300]


def test_the_policy_routes_answer_as_the_api_reference_says(service):
    """docs/api.md's table of ``api/policy…``: each refusal with its status and words, and
    none of them changes the live policies or the audit trail."""
    candidate = {"policies": [{"name": "tight", "cull_after": "45m"}]}
    live, before = call(service, "GET", "api/policy").json(), service.snapshot()
    for method, path, body, status, words in (
        ("GET", "api/policy", None, 403, "admin"),  # alice: no governor admin
        ("GET", "api/policy/dry-run", None, 404, "no dry run is under way"),
        ("DELETE", "api/policy/dry-run?reason=x", None, 404, "no dry run is under way"),
        ("POST", "api/policy/apply", {"candidate": candidate}, 400, "say why"),
        ("POST", "api/policy/revert", {}, 400, "say why"),
        ("POST", "api/policy/revert", {"reason": "back"}, 409, "already"),
        ("POST", "api/policy/apply", {"candidate": candidate, "reason": "x", "over": "v0"}, 409,
         "the live policies changed since you read them"),
        ("POST", "api/policy/what-if", {"candidate": candidate, "over": "v0"}, 409,
         "the live policies changed since you read them"),
        ("POST", "api/policy/what-if", {"candidate": candidate, "days": 32}, 400, "at most 31"),
    ):  # fmt: skip
        token = ALICE if status == 403 else ADMIN
        data = None if body is None else json.dumps(body)
        r = call(service, method, path, token=token, data=data)
        assert r.status_code == status and words in r.json()["message"], (path, r.text[:300])
    assert call(service, "GET", "api/policy").json() == live
    assert service.snapshot() == before


def test_a_duration_past_100_years_is_a_400_naming_it(service):
    """Durations are at most 100 years (docs/security.md): an exemption a day longer is
    refused, naming it, and nothing changes; past the bound, date arithmetic overflows."""
    for duration in ("36501d", 100 * 365 * 86400 + 1):
        before = service.snapshot()
        body = json.dumps({"reason": "for good", "duration": duration})
        r = call(service, "POST", "api/users/alice/server/exempt", data=body)
        assert_refused_unchanged(service, r, before, "'duration'")
        assert r.status_code == 400 and "a duration from 0 to 100 years" in r.json()["message"], (
            r.text
        )


def test_a_reason_past_2000_characters_is_a_400_wherever_a_reason_is_taken(service):
    """Every reason is at most 2,000 characters, and one past it is refused, never kept cut
    short: the policy admin's apply, revert and ending of a dry run cut it unsaid, and the
    dashboard's and the policy page's forms kept a megabyte's in the audit row."""
    long = "r" * 2001
    candidate = {"policies": [{"name": "tight", "cull_after": "45m"}]}
    started = call(
        service,
        "POST",
        "api/policy/apply",
        data=json.dumps({"candidate": candidate, "reason": "try", "dry_run": True}),
    )
    assert started.status_code == 200, started.text[:500]
    live, before = call(service, "GET", "api/policy").json(), service.snapshot()
    for method, path, body in (
        ("POST", "api/policy/apply", json.dumps({"candidate": candidate, "reason": long})),
        ("POST", "api/policy/revert", json.dumps({"reason": long})),
        ("DELETE", f"api/policy/dry-run?reason={long}", None),
    ):
        r = call(service, method, path, data=body)
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        assert r.json()["message"] == "'reason' may be at most 2000 characters"
    for path, form in (
        ("actions", {"server": "alice/", "action": "extend", "reason": long}),
        ("policy", {"action": "apply", "candidate": json.dumps(candidate), "reason": long}),
        ("policy", {"action": "stop-dry-run", "reason": long}),
    ):
        r = call(service, "POST", path, data=form, allow_redirects=False)
        assert r.status_code == 400, (path, form["action"], r.status_code, r.text[:300])
        assert "reason&#39; may be at most 2000 characters" in r.text, r.text[:300]
    assert call(service, "GET", "api/policy").json() == live  # the dry run still under way
    assert service.snapshot() == before
    # 2,000 as sent is a reason (a browser's maxlength counts so): the form's and the API's alike.
    r = call(service, "DELETE", f"api/policy/dry-run?reason={long[1:]}")
    assert r.status_code == 200, r.text[:300]


def test_a_hub_slow_or_failing_to_check_a_token_gets_the_report_a_clear_answer(
    tmp_path, monkeypatch, caplog
):
    """A report whose token the Hub is asked about (a server's first report, then one in six)
    waited as long as JupyterHub's client does (5 minutes) for a Hub that does not answer,
    and a Hub that failed the check made a 500 and a traceback. Now the wait is bounded and
    the answer says what happened, with the status HubAuth gives it."""

    from fake_hub_api import _SelfHandler
    from tornado import web

    from jupyter_gpu_gov.hub import routes

    monkeypatch.setattr(routes, "HUB_CHECK_TIMEOUT_S", 0.5)
    service = Service(tmp_path, monkeypatch)
    try:
        service.hub.latency = 600  # the Hub answers no request for ten minutes
        slow = call(service, "POST", "api/reports", token=OWNER, json=fresh_report())
        assert service.hub.in_flight >= 1  # answered while the Hub still kept the check
        assert slow.status_code == 503, slow.text
        assert slow.json()["message"] == "the Hub did not say who this token is within 0.5 s"

        service.hub.latency = 0

        def fails(self):
            raise web.HTTPError(500)

        answers = _SelfHandler.get
        monkeypatch.setattr(_SelfHandler, "get", fails)
        with caplog.at_level("INFO"):
            failed = call(service, "POST", "api/reports", token=OWNER, json=fresh_report())
        assert failed.status_code == 502, failed.text
        assert failed.json()["message"] == "Failed to check authorization (upstream problem)"
        assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"

        monkeypatch.setattr(_SelfHandler, "get", answers)  # it answers again: report taken
        ok = call(service, "POST", "api/reports", token=OWNER, json=fresh_report())
        assert ok.status_code == 200 and "verdict" in ok.json(), ok.text
    finally:
        service.stop()


def _lone_surrogate_report(where: str) -> bytes:
    report = fresh_report()
    if where in ("escape", "nul"):  # as json.dumps writes it
        report["targets"][0]["name"] = "\ud800<b>" if where == "escape" else "a\0b"
        return json.dumps(report).encode()
    report["targets"][0]["name"] = "SURROGATE"  # its CESU-8 bytes, which json.loads takes
    return json.dumps(report).encode().replace(b"SURROGATE", b"\xed\xa0\x80")


@pytest.mark.parametrize(
    "token, path, body, where",
    [
        (OWNER, "api/reports", _lone_surrogate_report("escape"), "targets[0].name"),
        (OWNER, "api/reports", _lone_surrogate_report("bytes"), "targets[0].name"),
        (OWNER, "api/users/alice/server/stop", b'{"reason": "x\\ud800"}', "reason"),
        (OWNER, "api/users/alice/server/extend", b'{"reason": "x\\udfff"}', "reason"),
        (
            ADMIN,
            "api/users/alice/server/cull",
            b'{"reason": "x\\ud800", "immediately": true}',
            "reason",
        ),
        (ADMIN, "api/users/alice/server/cull", b'{"reason": "x", "\\udc80": 1}', "\\udc80"),
        # NUL: PostgreSQL refuses text holding it (a 503 after the Stop was taken in memory)
        (OWNER, "api/users/alice/server/stop", b'{"reason": "x\\u0000"}', "reason"),
        (OWNER, "api/reports", _lone_surrogate_report("nul"), "targets[0].name"),
    ],
)
def test_text_that_is_not_unicode_is_a_400_naming_where_and_changes_nothing(
    service, token, path, body, where
):
    """A lone surrogate (``\\ud800``: valid JSON, not text) reached the store: SQLite cannot
    write it, so the owner's Stop answered 500 with the server marked culled in memory only,
    and a report's text in an audit row made the pass's whole write fail, for every server."""
    before = service.snapshot()
    r = call(service, "POST", path, token, data=body)
    assert_refused_unchanged(service, r, before, "not text")
    assert f"'{where}'" in r.json()["message"]


def test_text_with_a_surrogate_pair_is_text(service):
    """A character beyond the BMP, as json.dumps escapes it (a pair), is a report's name."""
    report = fresh_report()
    report["targets"][0]["name"] = "\U0001f680 rocket.ipynb"
    r = call(service, "POST", "api/reports", OWNER, data=json.dumps(report))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "field, status", [("user", 403), ("name", 404)], ids=["another-user", "no-such-server"]
)
def test_a_refused_report_names_what_it_sent_on_one_log_line(service, caplog, field, status):
    """The report's user and server name are the sender's words: written as they came, a
    newline in one forged a line of the service's log."""
    forged = "x\n[W 2026-01-01 00:00:00.000 JupyterHub gpu-gov] forged line"
    report = fresh_report()
    report["server"][field] = forged
    with caplog.at_level(logging.WARNING, logger="jupyter_gpu_gov"):
        r = call(service, "POST", "api/reports", ALICE, data=json.dumps(report))
    assert r.status_code == status, r.text
    message = r.json()["message"]
    assert "x\\n[W 2026" in message and "\n" not in message
    (line,) = [m for m in caplog.messages if "api/reports refused" in m]
    assert "x\\n[W 2026" in line and "\n" not in line


def test_a_servers_own_token_acts_for_that_server_only(tmp_path, monkeypatch):
    """A server's ``$JUPYTERHUB_API_TOKEN`` reaches only that server on the Hub
    (``access:servers!server=alice/``), and whoever the server is shared with can read it. The
    governor took it for alice herself: it stopped, extended and reported for her other
    servers. Now such a token acts for its own server only; her own token, for any of hers."""
    service = Service(tmp_path, monkeypatch)
    try:
        service.hub.add_server("alice", "gpu", started=clock.utcnow() - timedelta(minutes=5))
        asyncio.run_coroutine_threadsafe(service.governor.reconcile(), service.loop).result(60)
        other = fresh_report()
        other["server"]["name"] = "gpu"
        r = call(service, "POST", "api/reports", token=OWNER, json=other)
        assert r.status_code == 403, r.text
        assert r.json()["message"] == "a token of server 'alice/' may not act for 'alice/gpu'"
        for action in ("stop", "extend"):
            r = call(service, "POST", f"api/users/alice/servers/gpu/{action}", token=OWNER, json={})
            assert r.status_code == 403, (action, r.text)
        assert service.hub.running("alice", "gpu")
        listed = call(service, "GET", "api/servers", token=OWNER).json()["servers"]
        assert [(s["user"], s["name"]) for s in listed] == [("alice", "")]

        assert call(service, "POST", "api/reports", token=OWNER, json=fresh_report()).ok
        assert call(service, "POST", "api/reports", token=ALICE, json=other).ok
        r = call(service, "POST", "api/users/alice/servers/gpu/stop", token=ALICE, json={})
        assert r.ok, r.text
    finally:
        service.stop()


def test_a_guests_token_relayed_for_another_server_of_the_owners_is_refused(tmp_path, monkeypatch):
    """Bob's token from alice's shared server (``access:servers!server=alice/``, what her
    server's login gives him) puts him on record for an Extend there (``ASKER_HEADER``). Her
    other server, relaying the same token for itself, names someone who may not use it: a
    403, nothing done, and bob on record for nothing there."""
    service = Service(tmp_path, monkeypatch)
    try:
        hub = service.hub
        hub.add_server("alice", "gpu", started=clock.utcnow() - timedelta(minutes=5))
        hub.add_user_token("alice", "gpu-server-token", server="gpu", extra_scopes=[ACCESS])
        hub.add_user("bob")
        hub.add_token("bob-share-token", {"access:servers!server=alice/"})
        hub.token_owners["bob-share-token"] = "bob"
        asyncio.run_coroutine_threadsafe(service.governor.reconcile(), service.loop).result(60)
        asker = {ASKER_HEADER: "token bob-share-token"}
        body = {"reason": "from the shared tab"}
        path = "api/users/alice/server/extend"
        r = call(service, "POST", path, token=OWNER, headers=asker, json=body)
        assert r.status_code in (200, 409), r.text
        before = service.snapshot()
        for verb in ("extend", "stop"):
            r = call(
                service,
                "POST",
                f"api/users/alice/servers/gpu/{verb}",
                token="gpu-server-token",
                headers=asker,
                json=body,
            )
            assert r.status_code == 403, (verb, r.text)
            assert r.json()["message"] == (
                "'bob' may not use the server 'alice/gpu': nothing was done"
            )
        assert service.snapshot() == before and hub.running("alice", "gpu")
        actors = {
            (a["server"], a["actor"]) for a in call(service, "GET", "api/audit").json()["audit"]
        }
        assert ("alice/", "user:bob") in actors and ("alice/gpu", "user:bob") not in actors
    finally:
        service.stop()


def test_a_servers_own_token_reads_that_servers_records_only(tmp_path, monkeypatch):
    """Whoever alice's server is shared with can read its ``$JUPYTERHUB_API_TOKEN``: it read
    her audit trail about her other servers (what they run, why they were warned, her reasons
    for extending them) and her usage and page, which show them all. Now it reads its own
    server's audit only; her own token still reads all of hers."""
    service = Service(tmp_path, monkeypatch)
    try:
        service.hub.add_server("alice", "gpu", started=clock.utcnow() - timedelta(minutes=5))
        asyncio.run_coroutine_threadsafe(service.governor.reconcile(), service.loop).result(60)
        for server in ("servers/gpu", "server"):  # refused (active), and audited
            r = call(
                service,
                "POST",
                f"api/users/alice/{server}/extend",
                token=ALICE,
                json={"reason": f"thesis run on {server}"},
            )
            assert r.status_code == 409, r.text

        mine = call(service, "GET", "api/audit", token=ALICE).json()["audit"]
        assert {a["server"] for a in mine} >= {"alice/", "alice/gpu"}
        seen = call(service, "GET", "api/audit", token=OWNER).json()["audit"]
        assert seen and {a["server"] for a in seen} == {"alice/"}, seen
        r = call(service, "GET", "api/audit?server=alice/gpu", token=OWNER)
        assert r.status_code == 403, r.text
        assert r.json()["message"] == "a token of server 'alice/' may not act for 'alice/gpu'"
        assert call(service, "GET", "api/audit?server=alice/", token=OWNER).ok
        for path in ("api/usage", "api/usage?format=csv", "me"):
            r = call(service, "GET", path, token=OWNER)
            assert r.status_code == 403, (path, r.status_code, r.text[:300])
            assert call(service, "GET", path, token=ALICE).ok, path
    finally:
        service.stop()


def test_the_audit_trail_is_read_page_by_page_past_its_newest_rows(tmp_path, monkeypatch):
    """`limit` stops at 5,000: nothing older than the newest 5,000 rows could be read. Each row
    now says its `id`, and `before=<id>` reads the page after it."""
    service = Service(tmp_path, monkeypatch)
    try:
        service.hub.add_server("alice", "gpu", started=clock.utcnow() - timedelta(minutes=5))
        asyncio.run_coroutine_threadsafe(service.governor.reconcile(), service.loop).result(60)
        for i in range(5):  # an admin's exemption, and its lifting: each audited
            path, reason = "api/users/alice/servers/gpu/exempt", {"reason": f"{i}"}
            if i % 2:
                call(service, "DELETE", path, token=ADMIN, json=reason)
            else:
                call(service, "POST", path, token=ADMIN, json={**reason, "duration": "1h"})
        whole = call(service, "GET", "api/audit", token=ALICE).json()["audit"]
        pages, before = [], None
        while True:
            params = {"limit": 2, **({"before": before} if before else {})}
            page = call(service, "GET", "api/audit", token=ALICE, params=params).json()["audit"]
            if not page:
                break
            pages += page
            before = page[-1]["id"]
        assert len(whole) >= 5 and pages == whole
        for bad in ("0", "-1", "x", "1" * 19):
            r = call(service, "GET", "api/audit", token=ALICE, params={"before": bad})
            assert r.status_code == 400 and "'before'" in r.json()["message"], r.text
    finally:
        service.stop()


def test_extension_requests_are_read_page_by_page_as_the_audit_is(tmp_path, monkeypatch):
    """The admin's ``GET api/extensions`` read every request ever made, whole, on the event
    loop. It is paged as ``api/audit`` is: ``limit`` (1 to 5,000, default 200), each row's
    ``id``, ``before=<id>`` for the next page, and a bad one is a 400 naming it."""
    service = Service(tmp_path, monkeypatch)
    try:
        for i in range(5):
            service.hub.add_server("alice", f"s{i}", started=clock.utcnow() - timedelta(minutes=5))
        asyncio.run_coroutine_threadsafe(service.governor.reconcile(), service.loop).result(60)
        for i in range(5):  # refused (nothing to extend): a request on record each
            path = f"api/users/alice/servers/s{i}/extend"
            assert (
                call(service, "POST", path, ALICE, json={"reason": f"run {i}"}).status_code == 409
            )
        whole = call(service, "GET", "api/extensions").json()["extensions"]
        assert len(whole) >= 5
        assert [e["id"] for e in whole] == sorted((e["id"] for e in whole), reverse=True)
        pages, before = [], None
        while True:
            params = {"limit": 2, **({"before": before} if before else {})}
            page = call(service, "GET", "api/extensions", params=params).json()["extensions"]
            assert len(page) <= 2
            if not page:
                break
            pages += page
            before = page[-1]["id"]
        assert pages == whole
        refused = call(service, "GET", "api/extensions", params={"status": "refused", "limit": 1})
        assert [e["server"] for e in refused.json()["extensions"]] == ["alice/s4"]
        for name, bad in [("before", b) for b in ("0", "-1", "x", "1" * 19)] + [
            ("limit", b) for b in ("0", "5001", "x", "²")
        ]:
            before_call = service.snapshot()
            r = call(service, "GET", "api/extensions", params={name: bad})
            assert_refused_unchanged(service, r, before_call, f"'{name}'")
    finally:
        service.stop()


def test_a_token_in_the_url_is_not_written_to_the_log(service, caplog):
    """tornado's access log wrote a request's whole URL: a client's `?token=` (HubAuth reads it
    in some cases) went into the service's log, which more people read than the token's owner."""

    from tornado.log import access_log

    def service_lines() -> list[str]:
        # tornado's access logger, by its name now: a jupyter_server started earlier in this
        # process (a test file before this one on the same xdist worker) renames it
        # "ServerApp"; the fake Hub's requests are logged there too.
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == access_log.name and "gpu-gov/api/" in r.getMessage()
        ]

    with caplog.at_level("INFO", logger="tornado.access"):
        # Every credential a URL may carry: HubAuth's token, OAuth's code and state, the form's
        # _xsrf (docs/security.md, "The access log").
        for path in (
            "api/nothing?token=SECRET-TOKEN-1&x=1",
            "api/?Token=SECRET-TOKEN-2",
            "api/?access_token=SECRET-TOKEN-3&_xsrf=SECRET-TOKEN-4&code=SECRET-TOKEN-5"
            "&state=SECRET-TOKEN-6",
        ):
            call(service, "GET", path)
        # tornado logs a request after it has sent the answer, in the service's thread.
        deadline = time.monotonic() + 30
        while len(service_lines()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = service_lines()
    assert any("/api/nothing?token=[secret]&x=1" in line for line in lines), lines
    assert "SECRET-TOKEN" not in caplog.text


def billed_server(service, project: str) -> None:
    """alice's server "gpu", started with ``project`` chosen at spawn, in the usage ledger."""
    service.hub.add_server(
        "alice",
        "gpu",
        started=clock.utcnow() - timedelta(minutes=5),
        user_options={"project": project, "profile": "a100"},
    )
    for _ in range(2):  # billed from the second look
        asyncio.run_coroutine_threadsafe(service.governor.reconcile(), service.loop).result(60)


# A project name that, printed raw, sets the admin's terminal title, writes their clipboard
# (OSC 52), hides the rest of the line and reorders it (a right-to-left override).
HOSTILE = "x\x1b]0;pwned\x07\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b[8mhidden\u202eevil\r\x9b2J"


def test_the_command_line_shows_names_not_terminal_controls(tmp_path, monkeypatch, capsys):
    """``jupyter-gpu-gov usage`` printed the names users chose (a project) raw to the admin's
    terminal: escape sequences in one ran there. Now every control character and bidi override
    is shown as its escape; the rest of the name, and every figure, as before."""
    from jupyter_gpu_gov import cli

    service = Service(tmp_path, monkeypatch)
    try:
        billed_server(service, HOSTILE)
        argv = ["usage", "--url", service.url, "--token", ADMIN, "--group-by", "project"]
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        assert "x\\x1b]0;pwned\\x07\\x1b]52;c;Y3VybCBldmlsfHNo\\x07\\x1b[8mhidden" in out, out
        assert "\\u202eevil\\r\\x9b2J" in out, out
        shown = "".join(c for c in out if c not in "\n")
        assert shown.isprintable(), repr(out)
        assert "\u202e" not in out
    finally:
        service.stop()


def test_the_cluster_report_shows_names_not_terminal_controls(capsys):
    """``diagnose --cluster`` printed server, team and node names raw: the same escapes. (The
    governor's answer, with such names, from a plain HTTP server.)"""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from jupyter_gpu_gov import cli

    report = {
        "cost": {"days": 7, "gpu_hours": 1.0, "teams": {HOSTILE: {}}, "nodes": {}},
        "servers": [{"server": f"alice/{HOSTILE}", "label": "zombie", "confident": True}],
    }

    class Governor(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(report).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Governor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/services/gpu-gov/"
        assert cli.main(["diagnose", "--cluster", "--url", url, "--token", "t"]) == 0
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert "  x\\x1b]0;pwned" in out and "alice/x\\x1b]0;pwned" in out, out
    assert "".join(c for c in out if c != "\n").isprintable(), repr(out)


def test_the_usage_csv_keeps_each_name_in_its_cell(tmp_path, monkeypatch):
    """A project name holding a carriage return was written unquoted (the CSV's lines end in
    LF): a spreadsheet, which ends a row at CR too, read what followed as a new row, its first
    cell a formula (DDE's ``=cmd|…``) that no leading-character check saw. Every name stays in its
    own cell now, and no cell begins a formula."""
    service = Service(tmp_path, monkeypatch)
    project = "Lab\r=cmd|' /C calc'!A0"  # no comma, quote or LF: those had it quoted
    try:
        billed_server(service, project)
        r = call(service, "GET", "api/usage?group_by=project&format=csv")
        assert r.ok, r.text
        # As a spreadsheet splits rows: at CR, LF or CRLF outside quotes (so does csv.reader).
        rows = list(csv.reader(io.StringIO(r.text, newline="")))
        assert [row[1] for row in rows[1:]] == [project], rows
        assert all(not cell.startswith(("=", "+", "-", "@")) for row in rows for cell in row)
    finally:
        service.stop()


@pytest.mark.parametrize(
    "path", ["api/usage?group_by=user,day&format=csv", "showback?group_by=user&days=366"]
)
def test_a_big_usage_export_does_not_stop_the_service(tmp_path, monkeypatch, path):
    """A year of a big hub's ledger read for one export or the showback page took seconds on
    the event loop (100,000 buckets: 2.5-3.8 s here), and every report, verdict and page waited
    for it. It is read in a worker now: the service answers meanwhile."""
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor
    from datetime import date

    service = Service(tmp_path, monkeypatch)
    try:
        with sqlite3.connect(tmp_path / "gov.sqlite") as db:
            db.executemany(
                "INSERT INTO usage (day, user, team, project, tier, active, idle_held, idle_free,"
                " unknown, unobserved, culls, extensions, right_size_freed)"
                " VALUES (?, ?, 'vision', 'p', 'a100', 3600, 60, 60, 0, 0, 0, 0, 0)",
                [
                    ((date.today() - timedelta(days=d)).isoformat(), f"user{u}")
                    for d in range(100)
                    for u in range(1000)
                ],
            )
        took = {}

        def get(name: str, path: str) -> None:
            sent = time.monotonic()
            # A year's export took 32 s beside a loaded machine's other tests (3 s alone): it
            # is waited for as long as the test waits for it.
            r = call(service, "GET", path, timeout=120)
            took[name] = time.monotonic() - sent
            assert r.ok, r.text

        def poll() -> float:
            """The longest a request to api/ waited while the export ran."""
            longest = 0.0
            while not export.done():
                sent = time.monotonic()
                assert call(service, "GET", "api/").ok
                longest = max(longest, time.monotonic() - sent)
                time.sleep(0.1)
            return longest

        with ThreadPoolExecutor(2) as pool:
            export = pool.submit(get, "export", path)
            took["info"] = pool.submit(poll).result(120)
            export.result(120)
        # On the event loop, a request waited for most of the export (api/usage: 3.7 s of 4.2).
        assert took["info"] < took["export"] / 4, took
    finally:
        service.stop()


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_usage_export_by_user_and_day_streams_in_bounded_memory(tmp_path, monkeypatch, fmt):
    """The export held every ledger bucket (ORM rows, and what was made of them) and every
    row and the body before a byte went out: 2.6 KB a bucket, 994 MB for a year of 1,000
    users by day, and 9.5 GB at the 10,000 servers the service is sized for (300 MB). It is
    read, summed and written a chunk at a time: a day's rows at most are held."""
    import tracemalloc

    service = Service(tmp_path, monkeypatch)
    try:
        days = ledger_of(tmp_path / "gov.sqlite", users=200, days=100)
        path = f"api/usage?group_by=user,day&since={days[-1]}&format={fmt}"
        call(service, "GET", path + "&user=user000")  # compiled, cached: not the export's
        tracemalloc.start()
        try:
            # Read as it comes (a finance tool saving it to a file): only the service holds it.
            with call(service, "GET", path, stream=True, timeout=120) as r:
                assert r.ok, r.text
                digest, size = hashlib.sha256(), 0
                for chunk in r.iter_content(1 << 16):
                    digest.update(chunk)
                    size += len(chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        body = call(service, "GET", path, timeout=120).content
        assert hashlib.sha256(body).digest() == digest.digest() and size == len(body)
    finally:
        service.stop()
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(body.decode(), newline="")))
    else:
        rows = json.loads(body)["usage"]
    assert len(rows) == 20_000
    assert [(r["period"], r["user"]) for r in rows[:2]] == [
        (days[-1], "user000"),
        (days[-1], "user001"),
    ]
    assert {float(r["gpu_hours_allocated"]) for r in rows} == {round(3720 / 3600, 4)}
    assert peak < 20_000_000, f"{peak / 1e6:.1f} MB"  # held whole: 43 MB (here 4-7)


def ledger_of(path, users: int, days: int) -> list[str]:
    """A ledger of ``users`` x ``days`` buckets (an hour and two idle minutes each); its days,
    newest first."""
    import sqlite3
    from datetime import date

    named = [(date.today() - timedelta(days=d)).isoformat() for d in range(days)]
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO usage (day, user, team, project, tier, active, idle_held, idle_free,"
            " unknown, unobserved, culls, extensions, right_size_freed)"
            " VALUES (?, ?, 'vision', 'p', 'a100', 3600, 60, 60, 0, 0, 0, 0, 0)",
            [(day, f"user{u:03d}") for day in named for u in range(users)],
        )
    return named


def test_a_usage_export_that_fails_part_way_is_cut_off_not_ended_short(tmp_path, monkeypatch):
    """The export streams; Tornado ends a body whose writing failed after its first bytes as
    if it were whole, and a finance team's CSV would have been a shorter file that looks
    right. The transfer is cut off instead: the client sees it incomplete."""
    from jupyter_gpu_gov.hub.store import Store

    service = Service(tmp_path, monkeypatch)
    read = Store.usage

    def failing(self, *args, **kwargs):  # the disk gone after 10,000 buckets
        for i, bucket in enumerate(read(self, *args, **kwargs)):
            if i == 10_000:
                raise OSError("disk I/O error")
            yield bucket

    try:
        ledger_of(tmp_path / "gov.sqlite", users=200, days=100)
        monkeypatch.setattr(Store, "usage", failing)
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            call(service, "GET", "api/usage?group_by=user,day&since=100d&format=csv", timeout=120)
        assert call(service, "GET", "api/").ok
    finally:
        service.stop()


def test_a_history_export_that_fails_part_way_is_cut_off_not_ended_short(tmp_path, monkeypatch):
    """As the usage export: a trace whose reading failed after its first lines ended as if
    whole, and what-if would have read a shorter fortnight as the whole of it."""
    from jupyter_gpu_gov.hub import policy_api
    from jupyter_gpu_gov.hub.history import HistoryLog, HistoryOptions, read_history
    from jupyter_gpu_gov.replay.history import HistoryRow

    service = Service(tmp_path, monkeypatch)

    def failing(*args):  # the disk gone after 10,000 rows
        for i, row in enumerate(read_history(*args)):
            if i == 10_000:
                raise OSError("disk I/O error")
            yield row

    try:
        now = clock.utcnow().timestamp()
        log = HistoryLog(service.governor.store.engine, HistoryOptions())
        for minute in range(60):  # 200 servers working: a row each a minute
            t = now - 3600 + 60 * minute
            log.append(
                HistoryRow(t, f"u{i}/", now - 3600, gpu_sm=0.1 + minute % 2 / 2) for i in range(200)
            )
        path = "api/history/trace?since=1h&step=1m"
        whole = call(service, "GET", path, timeout=120)
        assert whole.ok and whole.text.count("\n") > 10_000
        monkeypatch.setattr(policy_api, "read_history", failing)
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            call(service, "GET", path, timeout=120)
        assert call(service, "GET", "api/").ok
    finally:
        service.stop()


def test_the_showback_page_past_its_row_cap_lists_totals_and_says_how_to_narrow(
    tmp_path, monkeypatch
):
    """The page held, charted and rendered every row by group and period: 1,000 users x 100
    days took 416 MB before its 100,000-row table was rendered, and a year of 10,000 users
    gigabytes, from one click. Past ``PAGE_ROWS`` it lists the totals and says what to do."""
    service = Service(tmp_path, monkeypatch)
    try:
        ledger_of(tmp_path / "gov.sqlite", users=200, days=30)  # 6,000 rows by user per day
        page = call(service, "GET", "showback?group_by=user&days=30", timeout=120)
        assert page.ok, page.text
        assert "More than 5,000 rows by user per day: too many for this page" in page.text
        assert page.text.count("<tr>") == 1 + 200  # the totals: their head, a row a user
        assert 'id="rows"' not in page.text and "Idle GPU-hours by" not in page.text
        weekly = call(service, "GET", "showback?group_by=user&days=30&period=week", timeout=120)
        assert weekly.ok and 'id="rows"' in weekly.text and "too many" not in weekly.text
    finally:
        service.stop()


def test_a_usage_export_of_many_queue_departures_streams_in_bounded_memory(tmp_path, monkeypatch):
    """The queue's columns came from every departure in the span read as ORM audit rows, all
    held: 200,000 took 620 MB. They stream in time order beside the ledger now."""
    import sqlite3
    import tracemalloc
    from datetime import datetime, timezone

    service = Service(tmp_path, monkeypatch)
    start = datetime(2026, 8, 1, tzinfo=timezone.utc)
    departure = {"team": "vision", "tier": "a100", "task_type": "", "outcome": "started"}
    try:
        with sqlite3.connect(tmp_path / "gov.sqlite") as db:  # 20,000 over 20 days
            db.executemany(
                "INSERT INTO audit (at, server_key, user, action, reason, actor, dry_run, details)"
                " VALUES (?, ?, ?, 'queue-started', '', 'governor', 0, ?)",
                [
                    (
                        (start + timedelta(seconds=86.4 * i)).strftime("%Y-%m-%d %H:%M:%S.%f"),
                        f"u{i % 1000}/",
                        f"u{i % 1000}",
                        json.dumps({**departure, "server": f"u{i % 1000}/", "waited_s": 90.0}),
                    )
                    for i in range(20_000)
                ],
            )
        path = "api/usage?group_by=team&since=2026-08-01&until=2026-08-20&format=csv"
        call(service, "GET", path)  # compiled, cached: not the export's
        tracemalloc.start()
        try:
            r = call(service, "GET", path, timeout=120)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        service.stop()
    assert r.ok, r.text
    (row,) = csv.DictReader(io.StringIO(r.text, newline=""))
    assert (row["team"], row["queue_starts"], row["queue_hours"]) == ("vision", "20000", "500.0")
    assert peak < 15_000_000, f"{peak / 1e6:.1f} MB"  # held whole: 51 MB (here 2)


def test_a_token_without_the_services_access_scope_is_told_which_it_lacks(service):
    """docs/kubernetes.md's Prometheus token: one given ``read:metrics`` alone was answered
    "authenticate with a JupyterHub token", the token it had just sent; the answer names the
    scope it lacks. With it, the metrics are read."""
    service.hub.add_user_token("prometheus", "metrics-only", extra_scopes=["read:metrics"])
    service.hub.add_user_token("prometheus", "metrics-token", extra_scopes=["read:metrics", ACCESS])

    refused = call(service, "GET", "metrics", "metrics-only")
    assert refused.status_code == 403
    assert "token that has the scope access:services!service=gpu-gov" in refused.json()["message"]
    read = call(service, "GET", "metrics", "metrics-token")
    assert read.ok and "jupyter_gpu_gov_servers" in read.text
