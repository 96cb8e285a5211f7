"""Team leads and finance reading showback on a real hub, without being Hub admins: the Hub
admin gives a role the governor's custom scope (``custom:gpu-gov:showback``, which
``add_governor`` defines), filtered ``!group=vision`` for vision's lead, unfiltered for finance.

lena   vision's lead (and herself a member of nlp): reads vision's usage (JSON, CSV, the page),
       her own as anyone does; not nlp's, and nothing else (no Extend, Stop, cull, audit, dashboard)
vic    lead of the group cv-lab, whose gpu-gov/team property names the team vision
fiona  finance: every team's usage
alice  in vision, bob in nlp: users with usage on record; bob holds no scope and is refused a
       team's usage as before, now told which scope it needs

The ledger is written into the governor's store before the hub starts, as its passes write it.
"""

from __future__ import annotations

import csv
import html
import io
import re
from datetime import timedelta

import pytest
from governor_harness import Gov, governed_hub, wait

from jupyter_gpu_gov.core import clock, ledger
from jupyter_gpu_gov.hub.store import Store

pytestmark = pytest.mark.timeout(300)

HOUR = 3600.0
ROLES = """
c.JupyterHub.load_groups = {
    "vision": {"users": ["alice"], "properties": {"gpu-gov/team": True}},
    "nlp": {"users": ["bob", "lena"], "properties": {"gpu-gov/team": True}},
    "cv-lab": {"users": [], "properties": {"gpu-gov/team": "vision"}},
}
c.JupyterHub.load_roles.extend([
    {"name": "vision-leads", "users": ["lena"], "scopes": ["custom:gpu-gov:showback!group=vision"]},
    {"name": "cv-leads", "users": ["vic"], "scopes": ["custom:gpu-gov:showback!group=cv-lab"]},
    {"name": "finance", "users": ["fiona"], "scopes": ["custom:gpu-gov:showback"]},
])
"""
OWNERS = {
    "alice": ledger.Owner("alice", "vision", "seg", "h100"),
    "bob": ledger.Owner("bob", "nlp", "chat", "a100"),
    "lena": ledger.Owner("lena", "nlp", "chat", "a100"),
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("showback-readers")
    store = Store(f"sqlite:///{workdir / 'gpu-gov.sqlite'}")
    day = clock.utcnow().date() - timedelta(days=1)
    store.save_usage({(day, owner): {ledger.IDLE_HELD: 2 * HOUR} for owner in OWNERS.values()}, [])
    store.engine.dispose()
    # Each test reads a dozen exports (10 units each): more than the default burst of 100.
    with governed_hub(
        workdir, hub_config=ROLES, governor_config="c.GpuGovernor.api_burst = 5000\n"
    ) as hub:
        for user in ("govadmin", "lena", "vic", "fiona", "alice", "bob"):
            hub.create_user(user)
        gov = Gov(hub)
        gov.wait_up()
        wait(lambda: gov.passes() >= 1, 60, "a pass: the Hub's groups and their teams read")
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def usage(gov, user: str, query: str):
    return gov.call("GET", f"usage?since=7d&{query}", gov.hub.token(user))


def rows(gov, user: str, query: str) -> set[tuple[str, str]]:
    r = usage(gov, user, f"group_by=team,user&{query}")
    assert r.status_code == 200, r.text
    return {(row["team"], row["user"]) for row in r.json()["usage"]}


def teams(gov, user: str, query: str) -> list[str] | None:
    r = usage(gov, user, query)
    assert r.status_code == 200, r.text
    return r.json()["teams"]


def page_text(response) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", response.text)))


def test_a_team_lead_reads_her_teams_usage_and_nothing_else(hub, gov):
    """lena, vision's lead, was refused ``team=vision`` (only Hub or governor admins read a
    team's usage, and a Hub admin may cull anyone's server). Her role's scope, filtered to the
    group vision, reads vision's rows, as JSON and CSV, narrowed by user, project or tier; never
    nlp's, which she is told needs the scope for nlp; and gives her no action on anyone's server."""
    assert rows(gov, "lena", "") == {("vision", "alice")}  # her teams' rows, not her own
    assert rows(gov, "lena", "team=vision") == {("vision", "alice")}
    for narrowed in ("user=alice", "project=seg", "tier=h100"):
        assert rows(gov, "lena", narrowed) == {("vision", "alice")}, narrowed
    assert rows(gov, "lena", "user=bob") == set()  # bob, inside her teams: none
    assert rows(gov, "lena", "tier=a100") == set()
    assert rows(gov, "lena", "user=lena") == {("nlp", "lena")}  # her own, as anyone's
    # The JSON says which teams it covers, as the page does (it did not: her script could not
    # tell her teams' rows from everyone's).
    assert teams(gov, "lena", "") == ["vision"]
    assert teams(gov, "lena", "team=vision") == ["vision"]
    assert teams(gov, "lena", "user=lena") is None  # her own usage: no team's limit
    r = usage(gov, "lena", "group_by=team,user&format=csv")
    assert r.status_code == 200, r.text
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert [(line["team"], line["user"], line["gpu_hours_idle"]) for line in table] == [
        ("vision", "alice", "2.0")
    ]

    r = usage(gov, "lena", "team=nlp")
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert "team 'nlp'" in message and "custom:gpu-gov:showback!group=nlp" in message, message
    assert "yours covers 'vision'" in message
    assert "add user=lena" in message  # her own rows in nlp she reads as anyone does

    token = hub.token("lena")
    for method, path in (
        ("POST", "users/alice/server/extend"),
        ("POST", "users/alice/server/stop"),
        ("POST", "users/alice/server/cull"),
        ("POST", "users/alice/server/exempt"),
        ("GET", "users/alice/server"),
        ("GET", "audit?server=alice/"),
        ("GET", "audit?user=alice"),
        ("GET", "policies"),
        ("GET", "extensions"),
    ):
        r = gov.call(method, path, token, json={"reason": "a lead tries"})
        assert r.status_code == 403, (method, path, r.text)
    assert gov.call("GET", "servers?all=1", token).json()["servers"] == []  # her own: none
    dashboard = hub.get(f"{hub.url}/services/gpu-gov/", token=token)
    assert dashboard.status_code == 403


def test_a_leads_group_reads_as_the_team_its_property_names(gov):
    """vic's scope is filtered to the group cv-lab, whose ``gpu-gov/team`` is "vision" (as the
    governor reads a server's team from it): he reads vision's usage, and a refusal names the
    group the team is read from."""
    assert rows(gov, "vic", "") == {("vision", "alice")}
    assert teams(gov, "vic", "") == ["vision"]  # the team, not the group cv-lab
    r = usage(gov, "vic", "team=cv-lab")
    assert r.status_code == 403, r.text
    assert "yours covers 'vision'" in r.json()["message"]


def test_the_showback_page_shows_a_lead_her_teams_only(hub):
    """The showback page, opened through the Hub's login (the service's OAuth: the token it
    gets carries the scope with its filter), lists vision's rows and no other team's, says
    which teams it shows, and its CSV link answers the same."""
    session = hub.login("lena")
    r = session.get(f"{hub.url}/services/gpu-gov/showback?group_by=user", timeout=60)
    assert r.status_code == 200, r.text[:2000]
    page = page_text(r)
    assert "Your teams' usage: vision" in page
    totals = page[page.index("By user") : page.index("Per day")]
    assert "alice" in totals and "bob" not in totals and "lena" not in totals, totals
    assert 'href="/services/gpu-gov/showback"' in r.text  # in her navigation
    assert "Dashboard" not in page and "Policy" not in page
    csv_url = html.unescape(re.search(r'id="csv" href="([^"]+)"', r.text)[1])
    r = session.get(f"{hub.url}{csv_url}", timeout=60)
    assert r.status_code == 200, r.text[:500]
    assert [line["user"] for line in csv.DictReader(io.StringIO(r.text))] == ["alice"]

    # The Hub's Services menu leads to the dashboard: refused, it points her to Showback.
    r = session.get(f"{hub.url}/services/gpu-gov/", timeout=60)
    assert r.status_code == 403
    assert "your teams' usage is on “Showback”" in page_text(r)
    assert 'href="/services/gpu-gov/showback"' in r.text


def test_finance_reads_every_teams_usage_and_acts_on_nothing(hub, gov):
    """fiona holds the showback scope unfiltered: every team's rows, by the API and the page;
    no action, no dashboard."""
    everyone = {("vision", "alice"), ("nlp", "bob"), ("nlp", "lena")}
    assert rows(gov, "fiona", "") == everyone
    assert rows(gov, "fiona", "team=nlp") == {("nlp", "bob"), ("nlp", "lena")}
    assert teams(gov, "fiona", "") is None and teams(gov, "fiona", "team=nlp") == ["nlp"]
    page = page_text(
        hub.login("fiona").get(f"{hub.url}/services/gpu-gov/showback?group_by=team", timeout=60)
    )
    totals = page[page.index("By team") : page.index("Per day")]
    assert "vision" in totals and "nlp" in totals, totals
    assert "Your teams' usage" not in page
    token = hub.token("fiona")
    r = gov.call("POST", "users/alice/server/cull", token, json={"reason": "finance"})
    assert r.status_code == 403, r.text
    assert hub.get(f"{hub.url}/services/gpu-gov/", token=token).status_code == 403


def test_a_user_without_the_scope_reads_only_their_own_and_is_told_which_scope(hub, gov):
    """bob holds no showback scope: a team's usage and the showback page stay refused, as
    before, and now say which scope a Hub admin would give him; his own usage reads as ever."""
    r = usage(gov, "bob", "team=vision")
    assert r.status_code == 403, r.text
    assert "custom:gpu-gov:showback!group=vision" in r.json()["message"]
    assert "add user=bob" in r.json()["message"]
    assert rows(gov, "bob", "") == {("nlp", "bob")}
    session = hub.login("bob")
    r = session.get(f"{hub.url}/services/gpu-gov/showback", timeout=60)
    assert r.status_code == 403
    assert "custom:gpu-gov:showback" in page_text(r)
    assert "Log out of the Hub and in again" in page_text(r)  # a role given since his login
    r = session.get(f"{hub.url}/services/gpu-gov/", timeout=60)
    assert r.status_code == 403
    assert "Showback" not in page_text(r) and "showback" not in r.text


def test_a_misspelt_empty_or_repeated_parameter_is_refused_naming_it(gov):
    """fiona, finance, asks for a month: a misspelt ``sinse=`` was ignored, and the CSV had
    every day on record in place of the month's (a CSV says nothing of its window); an empty
    ``since=`` (an unset variable in her script) read as no bound, and a repeated one as its
    last. Each is a ``400`` naming the parameter; spelt right, the same read answers."""
    month = "group_by=team&format=csv"
    for query, named in (
        (f"sinse=30d&{month}", "'sinse'"),
        (f"since=&{month}", "'since' is empty"),
        (f"until=&{month}", "'until' is empty"),
        (f"since=30d&since=2d&{month}", "'since' given 2 times"),
        ("since=30d&group-by=user", "'group-by'"),
    ):
        r = gov.call("GET", f"usage?{query}", gov.hub.token("fiona"))
        assert r.status_code == 400, (query, r.text)
        assert named in r.json()["message"], (query, r.json())
    r = gov.call("GET", f"usage?since=30d&{month}", gov.hub.token("fiona"))
    assert r.status_code == 200, r.text
    assert {line["team"] for line in csv.DictReader(io.StringIO(r.text))} == {"vision", "nlp"}
