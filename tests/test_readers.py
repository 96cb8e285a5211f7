"""Who reads which teams' usage (``hub/readers.py``) before and after the governor's pass read
the Hub's groups, against a fake Hub API."""

from __future__ import annotations

import pytest
from fake_hub_api import FakeHub
from test_governor import governor
from tornado import web

from jupyter_gpu_gov.hub.hubapi import HubApiError
from jupyter_gpu_gov.hub.readers import readable_teams, reads_showback, usage_filters

SCOPE = "custom:gpu-gov:showback"
LEAD = {"kind": "user", "name": "lena", "scopes": [f"{SCOPE}!group=cv-lab"]}
FINANCE = {"kind": "user", "name": "fiona", "scopes": [SCOPE]}
BOB = {"kind": "user", "name": "bob", "scopes": []}


async def test_a_leads_team_is_not_guessed_before_the_hubs_groups_are_read(tmp_path):
    async with FakeHub() as hub:
        # cv-lab's lead reads vision; a team literally named cv-lab is someone else's.
        hub.add_group("cv-lab", users=["lena"], properties={"gpu-gov/team": "vision"})
        gov = governor(hub, tmp_path)
        before = gov.teams_by_group  # a fresh governor, or a standby that made no pass
        with pytest.raises(web.HTTPError) as refused:
            readable_teams(LEAD, before)
        assert refused.value.status_code == 503 and "try again shortly" in refused.value.log_message
        with pytest.raises(web.HTTPError) as refused:
            usage_filters(LEAD, {"team": "cv-lab"}, before)
        assert refused.value.status_code == 503
        # Nobody else waits for the groups: finance, their own usage, the navigation's link.
        assert readable_teams(FINANCE, before) is None
        assert usage_filters(BOB, {"user": None}, before)["user"] == "bob"
        assert reads_showback(LEAD) and not reads_showback(BOB)

        await gov.reconcile()
        assert readable_teams(LEAD, gov.teams_by_group) == {"vision"}
        assert usage_filters(LEAD, {"team": None}, gov.teams_by_group)["team"] == {"vision"}


async def test_a_hub_that_fails_to_list_groups_leaves_the_last_passs_teams(tmp_path):
    async with FakeHub() as hub:
        hub.add_group("cv-lab", users=["lena"], properties={"gpu-gov/team": "vision"})
        gov = governor(hub, tmp_path)
        await gov.reconcile()
        assert readable_teams(LEAD, gov.teams_by_group) == {"vision"}

        async def hub_error():
            raise HubApiError(500, "Internal Server Error", method="GET", url="/groups")

        gov.hub.get_groups = hub_error  # the Hub's hiccup, one pass
        await gov.reconcile()
        # Not the team literally named cv-lab, someone else's: the groups read last stand.
        assert readable_teams(LEAD, gov.teams_by_group) == {"vision"}


@pytest.mark.parametrize(
    ("team", "named"),
    [("nlp", "'nlp'"), ("it's", '"it\'s"'), ("x" * 200, "'" + "x" * 79)],
)
def test_a_leads_refusal_for_another_team_reads_well_whatever_its_name(team, named):
    """A lead asking for another team's usage read ``reading team 'nlp''s usage``: the quoted
    name, then the possessive. The team is named after "the usage of", quoted as Python
    quotes it (escaped) and cut at 80 characters (bounded)."""
    with pytest.raises(web.HTTPError) as refused:
        usage_filters(LEAD, {"team": team}, {"cv-lab": "vision"})
    assert refused.value.status_code == 403
    assert refused.value.log_message == (
        f"'team': reading the usage of team {named} needs the scope "
        f"{SCOPE}!group={team[:80]} (or custom:gpu-gov:admin); yours covers 'vision'; "
        "for your own in it, add user=lena"
    )
