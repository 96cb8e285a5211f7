"""A report that sends only what the wire requires, on a real hub with the governor (attack 31).
Every field the wire leaves optional may be absent from a valid report (a target's ``sm`` and
``memory_mb``, its ``gpu.devices``, a device's ``activity``): the governor read some of them as
always there. Found by the Hypothesis fuzz of the pages (tests/test_fuzz_api.py failed now and
then on ``?all=1&sort=memory``).

erin     owns a server that reports nothing itself; she sends its reports with its own token,
         as anyone may from their server
govadmin lists every server and opens the dashboard

And a server relaying tokens the Hub does not know as the askers of its Extend.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import requests
from governor_harness import Gov, governed_hub, start_all, wait
from hub_harness import processes_with

from jupyter_gpu_gov.core.wire import ASKER_HEADER

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    harness = governed_hub(
        tmp_path_factory.mktemp("partial"),
        silent_users=("erin",),
        # Refused requests earn their budget back at 1 in 20 s, not 1 a second: a loaded
        # machine's Hub may take most of a second to refuse each made-up token, which refilled
        # the address's budget about as fast as the last test spends it.
        governor_config="c.GpuGovernor.refused_budget = 0.05\n",
    )
    with harness as hub:
        hub.create_user("govadmin")
        start_all(hub, {"erin": None})
        Gov(hub).wait_up()
        yield hub


def server_token(hub, user: str) -> str:
    """The server's own ``$JUPYTERHUB_API_TOKEN`` (its process's environment)."""
    for pid in set(processes_with("JUPYTERHUB_USER", user)) & set(hub.pids()):
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(b"JUPYTERHUB_API_TOKEN="):
                return entry.split(b"=", 1)[1].decode()
    raise AssertionError(f"no server process of {user}'s")


def test_a_report_of_only_the_required_fields_breaks_no_listing_and_is_decided(hub):
    """A kernel holding a context on the server's GPU, and nothing the wire leaves optional:
    every listing of the admin's (the API's, the dashboard) and the owner's page were a 500 for
    as long as the report was kept, and the server's every pass failed (``error`` in its audit):
    it was never decided, so no maximum age, reclaim or cull reached it."""
    gov = Gov(hub)
    erin = hub.token("erin")
    status = requests.get(
        hub.user_url("erin", "jupyter-gpu-gov/status?refresh=1"),
        headers={"Authorization": f"token {erin}"},
        timeout=60,
    ).json()
    device = status["devices"][0]["uuid"]
    report = {
        "schema": 1,
        "sampled_at": status["sampled_at"],
        "backend": status["backend"],
        "server": {"user": "erin", "name": "", "started": status["server"]["started"]},
        "devices": [{"uuid": device}],
        "targets": [
            {
                "id": str(uuid.uuid4()),
                "kind": "kernel",
                "gpu": {"holds_context": True, "confidence": "exact"},
            }
        ],
        "window": {"seconds": 60},
    }
    r = requests.post(
        f"{gov.base}/reports",
        headers={"Authorization": f"token {server_token(hub, 'erin')}"},
        json=report,
        timeout=30,
    )
    assert r.status_code == 200, r.text[:300]
    passes = gov.passes()
    wait(lambda: gov.passes() >= passes + 2, 60, "two passes over erin's report")

    r = gov.admin("GET", "servers")
    assert r.status_code == 200, r.text[:300]
    r = gov.admin("GET", "users/erin/server")
    assert r.status_code == 200, r.text[:300]
    assert r.json()["gpu"]["memory_mb"] == 0, r.json()["gpu"]
    # Activity the report does not give is unknown, never idle; and the server is decided.
    assert "no activity data" in r.json()["verdict"]["reason"], r.json()["verdict"]
    assert "error" not in gov.actions("erin/"), gov.audit("erin/")
    for user, path in (("govadmin", ""), ("erin", "me")):
        page = hub.get(f"{hub.url}/services/gpu-gov/{path}", token=hub.token(user))
        assert page.status_code == 200, (path, page.status_code, page.text[:300])


def test_a_server_relaying_tokens_the_hub_does_not_know_is_throttled(hub):
    """A server relays whoever asked its Extend or Stop (``Gpu-Gov-Asker``), each a Hub check;
    its owner could relay made-up tokens at her whole API budget (10 a second), each a check.
    Those the Hub knows no one by count against the address, as a request naming no caller
    does (``refused_burst`` at once, 30): then ``429`` with ``Retry-After``, the Hub not asked;
    a caller the service knows is not held back. Last in this module: it spends the address's
    budget for refusals."""
    gov = Gov(hub)
    wait(lambda: gov.admin("GET", "users/erin/server").status_code == 200, 90, "erin's governed")
    relay = {"Authorization": f"token {server_token(hub, 'erin')}"}
    answers = []
    for i in range(100):
        r = requests.post(
            f"{gov.base}/users/erin/server/extend",
            headers={**relay, ASKER_HEADER: f"token made-up-{i}"},
            json={"reason": "x"},
            timeout=30,
        )
        answers.append(r.status_code)
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1, r.headers
            break
    assert answers[-1] == 429 and set(answers[:-1]) == {403}, answers
    assert len(answers) > 20, answers  # the burst first
    assert gov.call("GET", "servers", hub.token("erin")).status_code == 200
    assert "extend" not in gov.actions("erin/")
