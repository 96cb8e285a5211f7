"""What a person may ask of the governor again and again, on a real hub with the governor
(attack 30): each request is a user's to send, as often as their API budget lets them. Each
attack worked before the fix.

bob      loops Extend while his server has nothing to extend, and Stop once it is stopping
eve      sends a dozen Extends at once while her GPU sits idle: no more are granted than her
         policy's max_extensions
bobsvc   a Hub service an admin set up (a monitoring job with the governor's access scope) whose
         name is a user's: ``bob``
govadmin reads the extension requests and the audit trail
ursula   spawns with user_options too large to keep, on a hub without the profile layer; the
         admin's own pre_spawn_hook (the harness's: her server never reports) still runs, and
         a spawn JupyterHub's own apply_user_options refuses first keeps none of them either
"""

from __future__ import annotations

import json
import threading

import pytest
import requests
from governor_harness import Gov, governed_hub, kernel_with, start_all, wait

pytestmark = pytest.mark.timeout(300)

SERVICE_TOKEN = "bob-service-token-0123456789abcdef"
# A service of the admin's named as a user is: Hub services and users are named apart.
HUB = f"""
c.JupyterHub.services.append({{"name": "bob", "api_token": {SERVICE_TOKEN!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "bob-monitor", "services": ["bob"], "scopes": ["access:services!service=gpu-gov"]}}
)
# JupyterHub's own apply_user_options (a dict: option -> trait), which runs before the hooks
c.Spawner.apply_user_options = {{"mem": "mem_limit"}}
"""
LOOPS = 25  # within the API burst (100): every request is answered, none throttled
# eve's GPU is warned about at once; Extend gives her two steps, then an admin decides.
EVE = {
    "name": "eve",
    "match": {"users": ["eve"]},
    "warn_after": "1s",
    "cull_after": "30m",
    "max_extensions": 2,
    "extension_step": "10m",
}
HOLD = "from jupyter_gpu_gov import simulate; simulate.hold(2048)"  # an idle GPU context


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    harness = governed_hub(
        tmp_path_factory.mktemp("asks"),
        silent_users=("ursula",),
        hub_config=HUB,
        extra_policies=[EVE],
    )
    with harness as hub:
        hub.create_user("govadmin")
        start_all(hub, {"bob": None, "eve": None})
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def test_a_loop_of_refused_extensions_is_answered_but_recorded_once(hub, gov):
    """A refused Extend changes nothing and is on record; a script asking again and again wrote
    an audit row and an extension request for each (a reason of up to 2,000 characters each:
    10 a second is ~1.7 GB a day from one user), and the admin's ``GET api/extensions`` read
    every one of them, whole, on the service's event loop."""
    bob = hub.token("bob")

    def active():
        r = gov.call("GET", "users/bob/server", bob)
        return r.status_code == 200 and r.json()["state"] == "active"

    wait(active, 90, "bob's server governed (it holds no GPU: nothing to extend)")
    answers = [
        gov.call("POST", "users/bob/server/extend", bob, json={"reason": "x" * 2000})
        for _ in range(LOOPS)
    ]
    for r in answers:  # every one answered as before: refused, saying why
        assert r.status_code == 409, r.text[:300]
        assert r.json()["status"] == "refused", r.text[:300]
        assert "nothing to extend" in r.json()["message"], r.text[:300]
    r = gov.admin("GET", "extensions", params={"status": "refused"})
    assert r.status_code == 200, r.text[:300]
    refused = [e for e in r.json()["extensions"] if e["server"] == "bob/"]
    assert len(refused) == 1, f"{len(refused)} refused requests on record for {LOOPS} asks"
    extends = [a for a in gov.audit("bob/") if a["action"] == "extend"]
    assert len(extends) == 1, f"{len(extends)} extend rows in the audit for {LOOPS} asks"
    # The metric counts the requests on record, as the admins' list does.
    scrape = hub.get(f"{hub.url.rstrip('/')}/services/gpu-gov/metrics", hub.token("govadmin"))
    assert scrape.status_code == 200, scrape.text[:300]
    assert 'jupyter_gpu_gov_extensions_total{status="refused"} 1.0' in scrape.text


def test_extends_sent_at_once_are_granted_no_more_than_max_extensions(hub, gov):
    """The count of extensions is read and written with nothing awaited in between: a dozen
    asks raced from the owner's token are two granted (``max_extensions``) and the rest wait
    for an admin, one request on their list (attack 33)."""
    tab = kernel_with(hub, "eve", HOLD)
    try:
        wait(lambda: gov.verdict("eve")["state"] in ("idle", "warned"), 90, "eve's GPU idle")
        token, codes = hub.token("eve"), []
        start = threading.Barrier(12)

        def extend() -> None:
            with requests.Session() as session:
                session.trust_env = False
                start.wait()
                r = session.post(
                    f"{gov.base}/users/eve/server/extend",
                    headers={"Authorization": f"token {token}"},
                    json={"reason": "a race"},
                    timeout=60,
                )
                codes.append(r.status_code)

        threads = [threading.Thread(target=extend) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
    finally:
        tab.close()
    assert sorted(codes) == [200] * 2 + [202] * 10, codes
    assert gov.verdict("eve")["extensions_left"] == 0
    r = gov.admin("GET", "extensions")
    assert r.status_code == 200, r.text[:300]
    statuses = sorted(e["status"] for e in r.json()["extensions"] if e["server"] == "eve/")
    assert statuses == ["granted", "granted", "pending"], statuses


def test_a_service_named_as_a_user_reads_nothing_of_that_users(hub, gov):
    """A Hub service is no user: a service named ``bob`` (the admin's monitoring job, with the
    service's access scope only) read bob's servers, audit trail and usage as if it were
    him, since the owner was told by name alone."""
    for path, params in (
        ("servers", {}),
        ("audit", {}),
        ("audit", {"server": "bob/"}),
        ("usage", {}),
    ):
        r = gov.call("GET", path, SERVICE_TOKEN, params=params)
        assert r.status_code == 403, (path, params, r.status_code, r.text[:300])
        assert "service" in r.json()["message"], r.text[:300]
    page = hub.get(f"{hub.url.rstrip('/')}/services/gpu-gov/me", token=SERVICE_TOKEN)
    assert page.status_code == 403, page.text[:300]
    # bob himself still reads his own.
    bob = hub.token("bob")
    r = gov.call("GET", "servers", bob)
    assert r.status_code == 200 and [s["user"] for s in r.json()["servers"]] == ["bob"], r.text
    for path in ("audit", "usage"):
        assert gov.call("GET", path, bob, params={"user": "bob"}).status_code == 200
        # Another user's, named: a 403 saying so, not bob's own answered as if it were theirs.
        r = gov.call("GET", path, bob, params={"user": "govadmin"})
        assert r.status_code == 403 and "'user'" in r.json()["message"], r.text[:300]


def test_a_loop_of_stops_stops_once(hub, gov):
    """The owner's Stop is on record and sends the Hub a stop; asked again while that stop is
    under way, it wrote a row and sent the Hub another stop, with the governor's token, for
    each request."""
    bob = hub.token("bob")
    answers = [
        gov.call("POST", "users/bob/server/stop", bob, json={"reason": "done"}) for _ in range(10)
    ]
    for r in answers:
        assert r.status_code == 200, r.text[:300]
        assert r.json()["status"] == "stopping", r.text[:300]
    wait(lambda: not hub.api("GET", "users/bob").json()["servers"], 60, "bob's server stopped")
    stops = [a for a in gov.audit("bob/") if a["action"] == "stop"]
    assert len(stops) == 1, f"{len(stops)} stop rows in the audit for 10 asks"
    sent = [
        line
        for line in hub.log_path.read_text().splitlines()
        if "DELETE /hub/api/users/bob/server" in line
    ]
    assert len(sent) == 1, sent


def test_user_options_too_large_to_keep_are_refused_without_the_profile_layer(hub):
    """The Hub sends a server's ``user_options`` in every listing of its users, which the
    governor reads at each pass; the profile layer bounds them, but on a hub without it (this
    one: add_governor alone) the REST API kept any JSON a user sent, of any size and number.
    add_governor's guard refuses such a spawn naming the choice, keeps none of it, and the
    admin's own pre_spawn_hook, set before add_governor, still runs."""
    hub.create_user("ursula")

    def kept() -> str:
        model = hub.api("GET", "users/ursula", params={"include_stopped_servers": "1"}).json()
        return json.dumps((model["servers"].get("") or {}).get("user_options"))

    for big, named in (
        ({"image": "y" * 100_000}, "'image'"),
        ({"k" * 5000: "v"}, "'kkkk"),
        ({f"o{i}": "v" for i in range(100)}, "100 choices"),
    ):
        r = hub.api("POST", "users/ursula/server", json=big)
        assert r.status_code == 400, f"{r.status_code} {r.text[:300]}"
        message = r.json()["message"]
        assert named in message and "at most" in message, message
        assert not hub.api("GET", "users/ursula").json()["servers"]
        assert len(kept()) < 2000, kept()[:300]
    # Refused before the guard: JupyterHub's trait refuses the value ("Invalid user options")
    # and stops the spawn; what the Hub saved as sent kept a megabyte (attack 33).
    r = hub.api("POST", "users/ursula/server", json={"mem": "lots", "image": "y" * 1_000_000})
    assert r.status_code == 400, f"{r.status_code} {r.text[:300]}"
    assert not hub.api("GET", "users/ursula").json()["servers"]
    assert json.loads(kept()) == {"mem": "lots"}
    hub.start_server("ursula", options={"image": "usual", "o1": "v"})  # usual ones as before
    assert json.loads(kept()) == {"image": "usual", "o1": "v"}
    kernel = hub.start_kernel("ursula")
    code = "import os; print(repr(os.environ.get('JUPYTER_GPU_GOV_URL')))"
    assert hub.execute("ursula", kernel, code).strip() == "''"  # the admin's hook ran
    hub.stop_server("ursula")
