"""Attacks on a real hub with the governor (issue 18), each run the way it was found: a real
JupyterHub, configurable-http-proxy, the governor as its managed service, real single-user
servers and kernels. Every one of these worked before the fix.

erin, kim  their own ~/.jupyter config logs every request header their server receives: no
           credential the governor sends them reaches anyone else's server (item 1); kim's idle
           kernel is shut down by her own server, as the verdict asks (shutdown-kernels)
mallory    reports for her silent server with a kernel "id" that walks up to bob's server
           (item 2), and floods the governor with reports for servers that do not exist (item 6)
oscar      reports a cell busy since 9999-12-31: the pass goes on for victor after him (item 4)
bob        everyone's neighbour: his server, kernels and files are what the attacks aim at
govadmin   logged in, tricked into a cross-site form post with a bogus token (item 3); odd API
           parameters (item 10)
victor     extends while the Hub is slow to list servers (item 10)
"""

from __future__ import annotations

import asyncio
import copy
import html
import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from governor_harness import (
    Gov,
    free_port,
    governed_hub,
    kernel_with,
    server_running,
    start_all,
    wait,
)
from governor_harness import service_pid as governor_pid
from hub_harness import HubHarness

pytestmark = pytest.mark.timeout(300)

# Each user's own ~/.jupyter/jupyter_server_config.py: what a user may put in their server.
CAPTURE = """
import os

def _capture(handler):
    auth = handler.request.headers.get("Authorization")
    if auth:
        with open(os.path.expanduser("~/captured-headers.txt"), "a") as f:
            f.write(f"{handler.request.method} {handler.request.path} {auth}\\n")

c.ServerApp.tornado_settings = {"log_function": _capture}
"""
ATTACKERS = ("oscar", "mallory")  # created first: the Hub lists users in that order
USERS = (*ATTACKERS, "erin", "kim", "bob", "victor")
HOLD = "from jupyter_gpu_gov import simulate; simulate.hold(2048)"


class SlowHub:
    """A TCP relay between the governor and the Hub's API that can hold the Hub's user listing
    (what a pass waits for) for a while, as a Hub under load does."""

    def __init__(self, hub: HubHarness):
        self.hub = hub
        self.port = free_port()
        self.delay = 0.0  # the longest a listing is held
        self.holding = threading.Event()  # a listing is being held
        self.let_go = threading.Event()  # held listings go on now
        self.passed = threading.Event()  # a held listing went on to the Hub
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._relay, "127.0.0.1", self.port)
        )
        ready.set()
        self.loop.run_forever()
        server.close()
        # Its relays end before its loop does: a relay left in its sleep would be finalised
        # later, on a closed loop, in the middle of whatever the test process does then.
        relays = asyncio.all_tasks(self.loop)
        for relay in relays:
            relay.cancel()
        self.loop.run_until_complete(asyncio.gather(*relays, return_exceptions=True))

    async def _relay(self, client_r, client_w) -> None:
        try:
            hub_r, hub_w = await asyncio.open_connection("127.0.0.1", self.hub.hub_port)
        except OSError:
            client_w.close()
            return

        async def pipe(reader, writer, hold: bool = False):
            try:
                while data := await reader.read(65536):
                    # Every request on the connection, not its first alone: the governor keeps
                    # its connections to the Hub (with pycurl), so a listing may be the tenth.
                    if hold and self.delay and data.startswith(b"GET /hub/api/users?"):
                        self.holding.set()
                        deadline = self.loop.time() + self.delay
                        while not self.let_go.is_set() and self.loop.time() < deadline:
                            await asyncio.sleep(0.05)
                        self.passed.set()
                    writer.write(data)
                    await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()

        await asyncio.gather(pipe(client_r, hub_w, hold=True), pipe(hub_r, client_w))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("security")
    relay = SlowHub(None)  # its Hub port is known once the hub runs
    harness = governed_hub(
        workdir,
        silent_users=ATTACKERS,
        extra_policies=[
            {
                "name": "kernels",
                "match": {"users": ["mallory", "kim"]},
                "cull_action": "shutdown-kernels",
                "warn_after": "1s",
                "cull_after": "3s",
                "checkpoint": False,
            },
            {"name": "long-notice", "match": {"users": ["victor"]}, "cull_after": "10m"},
        ],
        governor_args=[f"--url=http://127.0.0.1:{relay.port}/hub/api"],
    )
    relay.hub = harness
    for user in ("erin", "kim"):
        (workdir / "home" / user / ".jupyter").mkdir(parents=True)
        (workdir / "home" / user / ".jupyter" / "jupyter_server_config.py").write_text(CAPTURE)
    with harness as hub:
        hub.create_user("govadmin")
        start_all(hub, dict.fromkeys(USERS))  # in this order: the Hub lists them so
        hub.relay = relay
        Gov(hub).wait_up()
        yield hub
    relay.stop()


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def own_report(hub: HubHarness, user: str) -> dict:
    """The report the user's own server makes (its status page), to forge from."""
    r = hub.get(hub.user_url(user, "jupyter-gpu-gov/status"), token=hub.token(user))
    assert r.status_code == 200, r.text
    report = r.json()
    report.pop("verdict", None)
    return report


def idle_kernel_target(kernel_id: str, device: str, **changes) -> dict:
    target = {
        "kind": "kernel",
        "id": kernel_id,
        "name": "python3",
        "execution_state": "idle",
        "connections": 0,
        "gpu": {
            "devices": [device],
            "memory_mb": 2048,
            "sm": 0.0,
            "holds_context": True,
            "confidence": "exact",
        },
    }
    target.update(changes)
    return target


def forge(hub: HubHarness, user: str, **target_changes) -> dict:
    report = own_report(hub, user)
    device = report["devices"][0]["uuid"]
    report["targets"] = [
        idle_kernel_target(**{"kernel_id": str(uuid.uuid4()), **target_changes, "device": device})
    ]
    report["window"].update(gpu_active_fraction=0.0, gpu_idle_since=report["sampled_at"])
    return report


def tokens_seen(hub: HubHarness, user: str) -> set[str]:
    path = hub.workdir / "home" / user / "captured-headers.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return {line.rsplit(" ", 1)[-1] for line in lines}


def test_no_credential_sent_to_a_users_server_reaches_anyone_else(hub, gov):
    """Item 1: the governor checkpoints erin's idle kernel and shuts kim's down; whatever their
    servers saw in request headers is worth nothing outside their own server."""
    erin = kernel_with(hub, "erin", HOLD)
    kim_kernel = hub.start_kernel("kim")
    hub.execute("kim", kim_kernel, HOLD)
    try:
        wait(lambda: not server_running(hub, "erin"), 90, "erin's idle server to be culled")
        wait(lambda: "cull" in gov.actions("kim/"), 60, "kim's idle kernel to be shut down")
        kernels = wait(
            lambda: (
                (
                    r := hub.get(hub.user_url("kim", "api/kernels"), token=hub.token("kim"))
                ).status_code
                == 200
                and kim_kernel not in {k["id"] for k in r.json()}
                and r
            ),
            60,
            "kim's server to shut its GPU kernel down",
        )
    finally:
        erin.close()
    seen = tokens_seen(hub, "erin") | tokens_seen(hub, "kim")
    assert seen  # the capture works: the test's own requests are there
    bob_status = hub.user_url("bob", "api/status")
    for token in seen:
        assert hub.get(bob_status, token=token).status_code != 200, "a token reached bob"
        who = hub.get(f"{hub.hub_api_url}/user", token=token).json()
        assert who.get("kind") == "user" and who.get("name") in ("erin", "kim"), who

    assert kernels is not None and server_running(hub, "kim")  # only the kernel went
    erin_audit = gov.audit("erin/")
    assert [a["action"] for a in erin_audit if a["action"] in ("checkpoint-done", "cull")] == [
        "checkpoint-done",
        "cull",
    ], erin_audit
    _, kim_cull = gov.carried_out_cull("kim/")
    assert kim_cull["details"]["outcome"] == "asked the server to shut down 1 kernel(s)"


def test_a_kernel_id_never_walks_to_another_server(hub, gov):
    """Item 2: a report of mallory's names kernels whose "ids" lead to bob's server and files;
    they are refused, and bob's server is never touched."""
    notes = hub.session.put(
        hub.user_url("bob", "api/contents/notes.txt"),
        json={"type": "file", "format": "text", "content": "keep me"},
        headers={"Authorization": f"token {hub.token('bob')}"},
        timeout=30,
    )
    assert notes.status_code in (200, 201), notes.text
    mallory = hub.token("mallory")
    for walk in ("../../../../hub/api/users/bob/server", "../../../bob/api/contents/notes.txt"):
        r = gov.call("POST", "reports", mallory, json=forge(hub, "mallory", kernel_id=walk))
        assert r.status_code == 400 and "targets[0].id" in r.json()["message"], r.text
    # A real kernel id of bob's, in mallory's report: accepted (it is a kernel id), culled
    # by asking mallory's own server, which runs no such kernel.
    bobs_kernel = hub.start_kernel("bob")
    # Until the cull's request is in mallory's verdict (a loaded machine: minutes, not 30 s).
    # The verdict that carries it is the one read: a later pass may already have moved on.
    deadline = time.monotonic() + 180
    while "shutdown_kernels" not in (asks := gov.verdict("mallory").get("requests") or {}):
        assert time.monotonic() < deadline, gov.actions("mallory/")
        r = gov.call("POST", "reports", mallory, json=forge(hub, "mallory", kernel_id=bobs_kernel))
        assert r.status_code == 200, r.text
        time.sleep(0.5)
    assert "cull" in gov.actions("mallory/")
    asked = asks["shutdown_kernels"]
    assert asked["kernels"] == [bobs_kernel]
    assert server_running(hub, "bob")
    kernels = hub.get(hub.user_url("bob", "api/kernels"), token=hub.token("bob")).json()
    assert bobs_kernel in {k["id"] for k in kernels}
    r = hub.get(hub.user_url("bob", "api/contents/notes.txt"), token=hub.token("bob"))
    assert r.status_code == 200 and r.json()["content"] == "keep me"


def test_a_far_future_time_stops_nobody_else_from_being_governed(hub, gov):
    """Item 4: oscar reports a cell busy since 9999-12-31; victor, listed after him, is still
    warned about his idle GPU."""
    far = "9999-12-31T23:59:59Z"
    for changes in ({"execution_state": "busy", "busy_since": far}, {"last_activity": far}):
        r = gov.call("POST", "reports", hub.token("oscar"), json=forge(hub, "oscar", **changes))
        assert r.status_code == 400 and "future" in r.json()["message"], r.text
    report = forge(hub, "oscar")
    report["server"]["last_activity"] = far
    r = gov.call("POST", "reports", hub.token("oscar"), json=report)
    assert r.status_code == 400 and "server.last_activity" in r.json()["message"], r.text

    tab = kernel_with(hub, "victor", HOLD)
    try:
        wait(lambda: gov.verdict("victor")["state"] == "warned", 45, "victor to be warned")
    finally:
        tab.close()
    assert not [a for a in gov.audit("oscar/") if a["action"] == "error"]


def test_a_bogus_token_does_not_skip_the_xsrf_check(hub, gov):
    """Item 3: an admin's login cookie plus ``Authorization: token bogus`` (a cross-site form
    cannot set the header, but a misconfigured proxy or a script can) is still a cookie request:
    without ``_xsrf`` it is refused."""
    admin = hub.login("govadmin", fresh=True)
    assert admin.get(f"{hub.url}/services/gpu-gov/me", timeout=30).status_code == 200
    bogus = {"Authorization": "token bogus"}
    for action, extra in (("exempt", {"duration": "1d"}), ("unexempt", {}), ("cull", {})):
        r = admin.post(
            f"{hub.url}/services/gpu-gov/actions",
            data={"server": "bob/", "action": action, "reason": "csrf", **extra},
            headers=bogus,
            allow_redirects=False,
            timeout=30,
        )
        assert r.status_code == 403, (action, r.status_code, r.text[:300])
    for verb, body in (("exempt", {"duration": "1d", "reason": "csrf"}), ("cull", {"reason": "x"})):
        r = admin.post(
            f"{hub.url}/services/gpu-gov/api/users/bob/server/{verb}",
            json=body,
            headers=bogus,
            timeout=30,
        )
        assert r.status_code == 403, (verb, r.status_code, r.text[:300])
    assert server_running(hub, "bob")
    assert not [a for a in gov.audit("bob/") if a["action"] in ("exempt", "cull")]


def test_a_report_rides_on_a_token_never_on_the_login_cookie(hub, gov):
    """The report's route reads the ``Authorization`` token and no cookie (docs/security.md,
    "Who is asking"): a page bob opens could have his browser post a report with his login
    (a cross-site form carries the cookie, never a header), and it would hold his GPU."""
    bob = hub.login("bob", fresh=True)
    assert bob.get(f"{hub.url}/services/gpu-gov/me", timeout=30).status_code == 200
    # HubOAuth's login cookie, named for the service's OAuth client
    assert "service-gpu-gov" in {c.name for c in bob.cookies}, {c.name for c in bob.cookies}
    report = json.dumps(own_report(hub, "bob"))
    r = bob.post(f"{gov.base}/reports", data=report, timeout=30)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    assert "authenticate with a JupyterHub token" in r.json()["message"]
    # The same report with his token is taken: the refusal was the cookie's.
    headers = {"Authorization": f"token {hub.token('bob')}"}
    r = requests.post(f"{gov.base}/reports", data=report, headers=headers, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text[:300])


def test_reports_for_servers_that_do_not_exist_are_refused_and_kept_nowhere(hub, gov):
    """Item 6: any user token could post big reports under made-up server names, each kept."""
    pid = governor_pid(hub)
    before = rss_mb(pid)
    mallory = hub.token("mallory")
    big = forge(hub, "mallory")
    big["targets"] = [
        idle_kernel_target(str(uuid.uuid4()), big["devices"][0]["uuid"], name="n" * 1000)
        for _ in range(200)
    ]  # about 240 kB: under the size bound, as large as it lets one be
    session = requests.Session()
    huge = copy.deepcopy(big)
    huge["targets"] *= 2
    r = session.post(
        f"{gov.base}/reports",
        data=json.dumps(huge),
        headers={"Authorization": f"token {mallory}"},
        timeout=30,
    )
    assert r.status_code == 413 and "at most" in r.json()["message"]
    answers = {}
    for i in range(80):
        big["server"]["name"] = f"made-up-{i}"
        r = session.post(
            f"{gov.base}/reports",
            data=json.dumps(big),
            headers={"Authorization": f"token {mallory}"},
            timeout=30,
        )
        answers.setdefault(r.status_code, r.json()["message"])
    # Refused, or past mallory's report budget not even read (hub/budget.py).
    assert set(answers) == {404, 429}, answers
    assert "runs no server 'mallory/made-up-" in answers[404]
    assert rss_mb(pid) - before < 60  # kept, 80 big reports would be about 100 MB
    servers = {s["name"] for s in gov.admin("GET", "servers?all=1").json()["servers"]}
    assert not any(name.startswith("made-up") for name in servers)


def test_owner_actions_answer_while_a_pass_waits_on_a_slow_hub(hub, gov):
    """Item 10: victor, warned, extends while the pass waits for the Hub's listing: his
    request is granted and answered at once, not a 502 after the server's 20 s timeout."""
    tab = kernel_with(hub, "victor", HOLD)
    wait(lambda: gov.verdict("victor")["state"] == "warned", 45, "victor to be warned")
    relay = hub.relay
    relay.holding.clear()
    relay.let_go.clear()
    relay.passed.clear()
    relay.delay = 120  # held until the test lets it go (a ceiling, should the test fail)
    try:
        assert relay.holding.wait(30), "no pass listed the Hub's servers"
        r = requests.post(
            hub.user_url("victor", "jupyter-gpu-gov/extend"),
            json={"reason": "one more figure"},
            headers={"Authorization": f"token {hub.token('victor')}"},
            timeout=60,
        )
        waited = relay.passed.is_set()
    finally:
        relay.delay = 0
        relay.let_go.set()
        tab.close()
    assert r.status_code == 200 and r.json()["status"] == "granted", r.text
    assert not waited, "the extension was answered only once the pass had the Hub's listing"


def test_bad_api_parameters_are_400s_naming_the_parameter(hub, gov):
    """Item 10: no parameter makes a 500, returns every row, or writes to the dashboard."""
    for path, words in (
        ("audit?limit=-1", "'limit'"),
        ("audit?limit=999999", "'limit'"),
        ("usage?since=99999999d", "'since'"),
        ("usage?until=99999999999999d", "'until'"),
        ("extensions?status=everything", "'status'"),
    ):
        r = gov.admin("GET", path)
        assert r.status_code == 400 and words in r.json()["message"], (path, r.text)
    for body, words in (
        ('{"reason": "x", "duration": 1' + "0" * 400 + "}", "'duration'"),
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ('{"reason": "' + "r" * 5000 + '", "duration": "1d"}', "'reason'"),
    ):
        r = gov.admin("POST", "users/bob/server/exempt", data=body)
        assert r.status_code == 400 and words in r.json()["message"], (body[:40], r.text)
    assert not [a for a in gov.audit("bob/") if a["action"] == "exempt"]

    admin = hub.login("govadmin")
    admin.get(f"{hub.url}/services/gpu-gov/me", timeout=30)
    page = admin.get(f"{hub.url}/services/gpu-gov/?msg=Call+the+helpdesk+on+555-0100", timeout=30)
    # Not a parameter the dashboard takes: a 400 page naming it, never saying its text.
    assert page.status_code == 400 and "'msg'" in html.unescape(page.text), page.text[:300]
    assert "555-0100" not in page.text


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")
