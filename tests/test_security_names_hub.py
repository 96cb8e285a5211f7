"""Server names no store holds as they are, on a real hub (names36): a real JupyterHub on
SQLite, configurable-http-proxy, the governor as its managed service, real single-user servers
and kernels.

JupyterHub 4.1 to 5.x take any server name, and a Hub on SQLite keeps it whatever its length
(``Unicode(255)`` is not enforced there); JupyterHub 6 refuses a new one that is not a short
slug, but starts one made before it (``allow_existing_invalid_named_servers = "allow-start"``,
its default). Such a server once was left out of the governor's pass: it held its GPU
ungoverned, never warned, never culled.

bob       a GPU server named with 300 characters, made under JupyterHub 5 (written into the
          Hub's database as it kept it): warned and culled as any other, on record under its
          kept form, its name on the dashboard escaped and bounded
bob       a server named ``a\\0b``, made the same way: the Hub itself cannot start it (NUL
          cannot go into its environment), so it never holds a GPU
govadmin  reads the dashboard
"""

from __future__ import annotations

import html
import sqlite3
from urllib.parse import quote

import pytest
from governor_harness import Gov, governed_hub, wait

pytestmark = pytest.mark.timeout(300)

HOLD = "from jupyter_gpu_gov import simulate; simulate.hold(2048)"
LONG = "n" * 300  # JupyterHub's database column holds 255; SQLite keeps any length
NUL = "a\0b"
QUICK = {"warn_after": "1s", "cull_after": "20s", "checkpoint": False}
POLICIES = [{"name": "quick", "match": {"users": ["bob"]}, **QUICK}]


def made_under_jupyterhub_5(hub, user: str, *names: str) -> None:
    """Each server named as JupyterHub 5 on SQLite kept it: a spawner row of that name and no
    display name, which JupyterHub 6 added (the Hub started again to read it, as after an
    upgrade)."""
    db = sqlite3.connect(hub.workdir / "jupyterhub.sqlite", timeout=30)
    try:
        (user_id,) = db.execute("SELECT id FROM users WHERE name = ?", (user,)).fetchone()
        for name in names:
            db.execute("INSERT INTO spawners (user_id, name) VALUES (?, ?)", (user_id, name))
        db.commit()
    finally:
        db.close()
    hub.restart()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    harness = governed_hub(
        tmp_path_factory.mktemp("security-names"),
        extra_policies=POLICIES,
        hub_config="c.JupyterHub.allow_named_servers = True\n",
    )
    with harness as hub:
        hub.create_user("govadmin")
        hub.create_user("bob")
        yield hub


def test_jupyterhub_6_refuses_such_a_name_for_a_new_server(hub):
    for name in (LONG, "a%00b"):
        r = hub.api("POST", f"users/bob/servers/{name}")
        assert r.status_code == 400 and "Invalid server_name" in r.text, r.text[:300]


def test_a_server_named_longer_than_jupyterhub_keeps_is_governed(hub):
    made_under_jupyterhub_5(hub, "bob", LONG, NUL)
    gov = Gov(hub)
    gov.wait_up()
    hub.start_server("bob", LONG)
    # The Hub lists it, named as it is.
    assert LONG in hub.api("GET", "users/bob").json()["servers"]
    tab = kernel_with_on(hub, "bob", LONG)
    try:
        key = wait(lambda: kept_key(gov, "bob", LONG), 90, "the governor to know bob's server")
        kept = key.partition("/")[2]
        assert len(kept) <= 255 and kept.startswith("n" * 100)
        # The dashboard names it escaped and bounded: never the 300 characters; the API
        # answers for it by the name the pages give it, and by its name.
        # (A server holding a GPU, once its first report is in.) Each name is its own <bdi>:
        # none reorders the text around it (docs/security.md).
        owner = f'<td class="owner"><bdi>bob</bdi><span class="muted">/<bdi>{html.escape(kept)}'
        page = wait(lambda: owner in (p := dashboard(hub)) and p, 60, "bob's row on the page")
        assert LONG not in page
        for name in (kept, LONG):
            r = gov.admin("GET", f"users/bob/servers/{quote(name, safe='')}")
            assert r.status_code == 200 and r.json()["name"] == kept, r.text[:300]
        rows, cull = gov.carried_out_cull(key, timeout=120)
        assert "warn" in [a["action"] for a in rows]
        # On its own reports (its token reaches only this server, named as the Hub names it).
        assert "GPU idle for" in cull["reason"], cull["reason"]
        assert cull["details"]["outcome"] in ("stopped", "stopping")
        wait(lambda: LONG not in running(hub, "bob"), 60, "the Hub to stop bob's server")
    finally:
        tab.close()


def test_a_server_named_with_nul_is_never_started_by_the_hub(hub):
    """The Hub lists such a server (made under JupyterHub 5, kept by SQLite) but cannot start
    it: its name goes into the server's environment (``JUPYTERHUB_SERVER_NAME``), which holds
    no NUL. It never runs, so never holds a GPU."""
    listed = hub.api("GET", "users/bob", params={"include_stopped_servers": "1"}).json()
    assert NUL in listed["servers"], listed
    r = hub.api("POST", "users/bob/servers/a%00b")
    assert r.status_code == 500, r.text[:300]
    assert "Unhandled error starting bob's server: embedded null byte" in hub.log_tail(200_000)
    assert NUL not in running(hub, "bob")


def dashboard(hub) -> str:
    return hub.get(f"{hub.url}/services/gpu-gov/", token=hub.token("govadmin")).text


def running(hub, user: str) -> dict:
    servers = hub.api("GET", f"users/{user}").json().get("servers") or {}
    return {n: s for n, s in servers.items() if s.get("ready") or s.get("pending") == "spawn"}


def kernel_with_on(hub, user: str, server: str):
    """``kernel_with`` on a named server: a kernel holding a GPU idle, its tab open."""
    import websocket

    kernel = hub.start_kernel(user, server_name=server)
    hub.execute(user, kernel, HOLD, server_name=server)
    url = hub.user_url(user, f"api/kernels/{kernel}/channels", server)
    return websocket.create_connection(
        "ws" + url[len("http") :], header=[f"Authorization: token {hub.token(user)}"], timeout=30
    )


def kept_key(gov: Gov, user: str, name: str) -> str | None:
    """The key the governor lists this server under (admin listing), or None."""
    r = gov.admin("GET", "servers")
    if r.status_code != 200:
        return None
    for server in r.json()["servers"]:
        if server["user"] == user and server["name"].startswith(name[:100]):
            return f"{user}/{server['name']}"
    return None
