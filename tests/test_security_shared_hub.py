"""Who may act on another person's server, on a real hub with the governor and alice's real
single-user server (attack 31). A shared server (JupyterHub 5's ``access:servers!server=alice/``
granted to bob): bob's Extend and Stop reach the governor through alice's server, with alice's
server's token, and were on record as alice's. A person allowed to look at the Hub's admin page
(``admin-ui``, which JupyterHub grants apart from any power to act) was a governor admin.

alice    owns the server and shares it with bob
bob      may use alice's server (a share); asks Checkpoint, Extend and Stop there, as
         JupyterLab's buttons do
carol    has no share: her token, relayed by alice's server, names no one who may use it
helen    a help desk's role: the Hub's admin page, to look (admin-ui, list and read users)
root     a Hub admin, who uses alice's server and logs in to the governor's dashboard
alice    (a service) the admin's, named as she is, which may use her server
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
import requests
from governor_harness import Gov, governed_hub, start_all, wait
from hub_harness import processes_with

from jupyter_gpu_gov.core.wire import ASKER_HEADER

pytestmark = pytest.mark.timeout(300)
# JupyterHub lets no user share a server unless granted ``shares``.
HUB = """
c.JupyterHub.load_roles.append({"name": "sharer", "users": ["alice"], "scopes": ["shares!user", "read:users:name"]})
c.JupyterHub.load_roles.append(
    {"name": "helpdesk", "users": ["helen"], "scopes": ["admin-ui", "list:users", "read:users"]}
)
c.Authenticator.admin_users = {"root"}
c.JupyterHub.services.append({"name": "alice", "api_token": "%s"})
c.JupyterHub.load_roles.append(
    {"name": "alices-helper", "services": ["alice"], "scopes": ["access:servers!server=alice/"]}
)
""" % (SERVICE_TOKEN := "service-named-alice-" + "7" * 24)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    harness = governed_hub(tmp_path_factory.mktemp("shared"), silent_users=(), hub_config=HUB)
    with harness as hub:
        for user in ("govadmin", "bob", "carol", "helen", "root"):
            hub.create_user(user)
        start_all(hub, {"alice": None})
        r = requests.post(
            f"{hub.hub_api_url.rstrip('/')}/shares/alice/",
            headers={"Authorization": f"token {hub.token('alice')}"},
            json={"user": "bob"},
            timeout=30,
        )
        assert r.status_code in (200, 201), r.text
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def server_token(hub, user: str) -> str:
    """The server's own ``$JUPYTERHUB_API_TOKEN`` (its process's environment): what its owner
    holds, and relays for whoever asks there."""
    for pid in set(processes_with("JUPYTERHUB_USER", user)) & set(hub.pids()):
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(b"JUPYTERHUB_API_TOKEN="):
                return entry.split(b"=", 1)[1].decode()
    raise AssertionError(f"no server process of {user}'s")


def on_alices_server(hub, verb: str, token: str) -> requests.Response:
    """The extension's Extend or Stop on alice's server, with a token (a script's)."""
    return requests.post(
        hub.user_url("alice", f"jupyter-gpu-gov/{verb}"),
        headers={"Authorization": f"token {token}"},
        json={"reason": f"{verb} from the shared tab"},
        timeout=60,
    )


def in_the_browser(hub, user: str, verb: str) -> requests.Response:
    """``user``'s Extend or Stop on alice's server as JupyterLab's button sends it: their Hub
    login, the Hub's page that has them authorize alice's server (JupyterHub asks a guest),
    then the server's own login cookie and its XSRF token."""
    session = hub.login(user)
    page = session.get(hub.user_url("alice", "lab"), timeout=60)
    if "/oauth2/authorize" in page.url:  # the consent form: its _xsrf and scopes, posted back
        fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text)
        data = [(name, html.unescape(value)) for name, value in fields]
        page = session.post(page.url, data=data, timeout=60)
    assert page.status_code == 200 and page.url.endswith("/user/alice/lab"), page.url
    xsrf = next(c.value for c in session.cookies if c.name == "_xsrf" and "alice" in c.path)
    return session.post(
        hub.user_url("alice", f"jupyter-gpu-gov/{verb}"),
        headers={"X-XSRFToken": xsrf},
        json={"reason": f"{verb} from the shared tab"},
        timeout=60,
    )


def test_a_guests_checkpoint_on_a_shared_server_is_on_record_as_the_guests(hub, gov):
    """Bob presses Checkpoint on alice's server: the server takes it, and the governor's audit
    trail says bob asked (it said nothing: a checkpoint asked of a server was no one's act on
    record). The same trust as Extend's: the Hub says whose the relayed token is."""
    alice = hub.token("alice")
    wait(lambda: gov.call("GET", "users/alice/server", alice).status_code == 200, 90, "governed")

    def asked() -> list[tuple[str, str]]:
        rows = [a for a in gov.audit("alice/") if a["action"] == "checkpoint-asked"]
        return [(a["actor"], a["details"]["source"]) for a in rows]

    r = in_the_browser(hub, "bob", "checkpoint")
    assert r.status_code == 200 and r.json()["status"] == "done", r.text[:300]
    assert asked() == [("user:bob", "user")]
    # Whatever source the asker claims, it is his ask on record.
    r = requests.post(
        hub.user_url("alice", "jupyter-gpu-gov/checkpoint"),
        headers={"Authorization": f"token {hub.token('bob')}"},
        json={"reason": "not me", "source": "governor"},
        timeout=60,
    )
    assert r.status_code == 200, r.text[:300]
    assert asked() == [("user:bob", "user"), ("user:bob", "governor")]
    r = on_alices_server(hub, "checkpoint", alice)  # the owner's own, by her token
    assert r.status_code == 200, r.text[:300]
    assert asked()[-1] == ("user:alice", "user")
    # Only the server's own token tells the governor of its checkpoints; a relayed token the
    # Hub says may not use the server is refused, nothing on record.
    r = gov.call("POST", "users/alice/server/checkpoint", hub.token("bob"), json={})
    assert r.status_code == 403, r.text[:300]
    r = requests.post(
        f"{gov.base}/users/alice/server/checkpoint",
        headers={
            "Authorization": f"token {server_token(hub, 'alice')}",
            ASKER_HEADER: f"token {hub.token('carol')}",
        },
        json={"reason": "carol did it"},
        timeout=30,
    )
    assert r.status_code == 403 and "'carol' may not use" in r.json()["message"], r.text[:300]
    assert len(asked()) == 3


def test_a_guests_asks_on_a_shared_server_are_on_record_as_the_guests(hub, gov):
    """Bob presses Extend then Stop on alice's server: the audit rows name bob, and alice (the
    owner) reads them in her own audit trail."""
    bob, alice = hub.token("bob"), hub.token("alice")

    def governed():
        r = gov.call("GET", "users/alice/server", alice)
        return r.status_code == 200 and r.json()["state"] == "active"

    wait(governed, 90, "alice's server governed")
    # Bob's own token does not reach the governor's API for alice's server: only her server.
    r = gov.call("POST", "users/alice/server/extend", bob, json={"reason": "mine now"})
    assert r.status_code == 403, r.text[:300]

    r = in_the_browser(hub, "bob", "extend")
    assert r.status_code == 409 and r.json()["status"] == "refused", r.text[:300]
    extends = [a for a in gov.audit("alice/") if a["action"] == "extend"]
    assert [a["actor"] for a in extends] == ["user:bob"], extends
    # The owner's own ask in her browser is hers, as before (her server's token says so).
    r = in_the_browser(hub, "alice", "extend")
    assert r.status_code == 409, r.text[:300]
    extends = [a for a in gov.audit("alice/") if a["action"] == "extend"]
    assert [a["actor"] for a in extends] == ["user:bob", "user:alice"], extends
    # A Hub admin in alice's JupyterLab (admins may use every server) is on record as himself.
    r = in_the_browser(hub, "root", "extend")
    assert r.status_code == 409, r.text[:300]
    extends = [a for a in gov.audit("alice/") if a["action"] == "extend"]
    assert [a["actor"] for a in extends] == ["user:bob", "user:alice", "user:root"], extends
    # A service of the admin's named alice is not alice (the Hub names them apart).
    r = on_alices_server(hub, "extend", SERVICE_TOKEN)
    assert r.status_code == 409, r.text[:300]
    extends = [a for a in gov.audit("alice/") if a["action"] == "extend"]
    assert [a["actor"] for a in extends][3:] == ["service:alice"], extends
    # Only a server's own token relays: alice's own token with the header is a 400.
    r = requests.post(
        f"{gov.base}/users/alice/server/stop",
        headers={"Authorization": f"token {alice}", ASKER_HEADER: f"token {bob}"},
        json={"reason": "bob did it"},
        timeout=30,
    )
    assert r.status_code == 400 and "server's own token" in r.json()["message"], r.text[:300]
    # A forged asker: alice's server relaying carol's token (carol may not use the server),
    # or a token the Hub does not know. Refused, naming why, and nothing is on record.
    relay = {"Authorization": f"token {server_token(hub, 'alice')}"}
    for asker, why in (
        (hub.token("carol"), "'carol' may not use"),
        ("no-such-token", "knows no one"),
    ):
        r = requests.post(
            f"{gov.base}/users/alice/server/stop",
            headers={**relay, ASKER_HEADER: f"token {asker}"},
            json={"reason": "carol did it"},
            timeout=30,
        )
        assert r.status_code == 403 and why in r.json()["message"], r.text[:300]
    assert hub.api("GET", "users/alice").json()["servers"], "a refused stop stopped alice"

    r = on_alices_server(hub, "stop", bob)
    assert r.status_code == 200 and r.json()["status"] == "stopping", r.text[:300]
    rows = {a["action"]: a for a in gov.audit("alice/") if a["action"] in ("extend", "stop")}
    assert rows["stop"]["actor"] == "user:bob", rows["stop"]
    assert "stopped by user:bob" in rows["stop"]["reason"], rows["stop"]
    assert not any("carol" in a["reason"] for a in gov.audit("alice/"))
    # The owner sees what was done to her server, and by whom.
    r = gov.call("GET", "audit", alice, params={"user": "alice"})
    assert r.status_code == 200, r.text[:300]
    mine = {(a["action"], a["actor"]) for a in r.json()["audit"]}
    assert {("extend", "user:bob"), ("stop", "user:bob")} <= mine, mine
    wait(lambda: not hub.api("GET", "users/alice").json()["servers"], 60, "alice's server stopped")


def test_who_may_look_at_the_hubs_admin_page_is_no_governor_admin(hub, gov):
    """``admin-ui`` is JupyterHub's "access the admin page; permission to take actions granted
    separately": a help desk given it, to look, could exempt, cull or change the policy of
    anyone's GPU server through the governor. A Hub admin's dashboard login (which carries
    ``admin-ui`` and nothing stronger) still is a governor admin."""
    helen = hub.token("helen")
    wait(lambda: gov.admin("GET", "users/alice/server").status_code == 200, 90, "alice's governed")
    for method, path, body in (
        ("POST", "users/alice/server/exempt", {"reason": "vip", "duration": "30d"}),
        ("POST", "users/alice/server/cull", {"reason": "make room"}),
        ("POST", "policy/apply", {"candidate": [], "reason": "mine"}),
        ("GET", "audit?user=alice", None),
    ):
        r = gov.call(method, path, helen, json=body)
        assert r.status_code == 403, (path, r.status_code, r.text[:300])
    for who, may in (("helen", False), ("root", True)):
        page = hub.login(who).get(f"{hub.url}/services/gpu-gov/", timeout=60)
        assert (page.status_code == 200) is may, (who, page.status_code, page.text[:300])
    assert not [a for a in gov.audit("alice/") if a["actor"] == "user:helen"]
