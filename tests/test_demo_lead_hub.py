"""The README's team lead on the demo's own configuration (hub_config/): lena logs in with the
demo's password and reads team vision's showback, and nothing else of anyone's, as the README's
step 6 says; the demo's role gives her the governor's scope filtered to the group vision."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from demo_harness import PASSWORD, demo_hub

pytestmark = pytest.mark.timeout(300)


def test_the_demos_team_lead_reads_her_teams_showback_and_nothing_else(tmp_path: Path) -> None:
    """The demo had teams and no one to show a lead with: its visitors never saw the feature."""
    with demo_hub(tmp_path, "") as hub:
        session = hub.login("lena", PASSWORD)
        showback = f"{hub.url}/services/gpu-gov/showback?group_by=user"
        r = session.get(showback, timeout=60)  # through the service's OAuth login
        assert r.status_code == 200, r.text[:2000]
        page = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", r.text))
        assert "Your teams' usage: vision " in page, page[:2000]
        usage = f"{hub.url}/services/gpu-gov/api/usage"
        token = {"Authorization": f"token {hub.token('lena')}"}
        r = session.get(usage, headers=token, timeout=60)
        assert r.status_code == 200 and r.json()["teams"] == ["vision"], r.text[:500]
        r = session.get(f"{usage}?team=nlp", headers=token, timeout=60)
        assert r.status_code == 403, r.text[:500]
        cull = f"{hub.url}/services/gpu-gov/api/users/alice/server/cull"
        r = session.post(cull, headers=token, json={"reason": "a lead tries"}, timeout=60)
        assert r.status_code == 403 and "admin" in r.json()["message"], r.text[:500]
