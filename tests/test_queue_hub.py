"""The spawn queue end to end: a real hub with the profile layer on a one-GPU workstation
(simulated), the governor service, real single-user servers, real HTTP.

carol holds the one H100 with a server that never reports: she works on it (its activity
reaches the Hub) until ben and erin wait in line, then leaves it, and the governor culls it by the
idle culler's rule 10 s after her last activity. ben asks for the H100, is offered a place in
line and takes it; when carol's server is culled, ben's starts by itself (the governor, through the Hub, with ben's
choices) and answers, and the verdict of ben's other server (no GPU) tells his JupyterLab there,
until he opens the new one (fay, with whom he shares that server, is not told). erin waits behind ben (exempt from culling: he keeps the GPU) and her
request expires; dave waits through a hub
restart and cancels. Queue time is metered (Prometheus) with how each request left the line.
The cluster report counts who waits for the card (in line, or refused and not waiting), not who
waits for a quota, and does not call the one whole card fragmented.
"""

from __future__ import annotations

import contextlib
import html
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
import requests
from browser import browser as chromium
from browser import log_in, requires_browser, screenshot_path
from governor_harness import Gov, governed_hub, join, queue_line, server_running, wait

from jupyter_gpu_gov import cli
from jupyter_gpu_gov.core.clock import parse

with contextlib.suppress(ImportError):  # without playwright, requires_browser skips
    from playwright.sync_api import expect

pytestmark = pytest.mark.timeout(300)

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}
PROFILES = f"""
from jupyter_gpu_gov.profiles.hubconfig import add_gpu_profiles

c.JupyterHub.cleanup_servers = False
c.JupyterHub.allow_named_servers = True
c.LocalGpus.backend = "simulated"
c.LocalGpus.simulated_devices = {[H100]!r}
c.LocalGpus.sim_state_path = HARNESS_ENV["JUPYTER_GPU_GOV_SIM_STATE"]
c.GpuProfiles.tiers = [
    {{"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB",
      "task_types": ["interactive", "batch"]}},
]
c.GpuProfiles.quotas = {{"lab": {{"guaranteed": {{"h100": 1}}, "user_cap": 1}}}}
c.GpuProfiles.team_map = {{u: "lab" for u in ("ben", "carol", "dave", "erin", "fay")}}
c.GpuProfiles.queue_expire_after = "40s"
add_gpu_profiles(c, spawner="simple")
# ben shares his "notes" server with fay (JupyterHub lets no one share unless granted this).
c.JupyterHub.load_roles.append(
    {{"name": "sharer", "users": ["ben"], "scopes": ["shares!user", "read:users:name"]}}
)
"""
SINGLEUSER = f"c.GpuGovApp.simulated_devices = {[H100]!r}\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with governed_hub(
        tmp_path_factory.mktemp("queue"),
        hub_config=PROFILES,
        singleuser_config=SINGLEUSER,
        # ben keeps the GPU once he has it: the others wait behind him.
        extra_policies=[{"name": "keep", "match": {"users": ["ben"]}, "exempt": True}],
    ) as hub:
        hub.create_user("govadmin")
        for user in ("ben", "carol", "dave", "erin", "fay"):
            hub.create_user(user)
        # ben works on a server without a GPU ("notes") meanwhile.
        r = hub.api("POST", "users/ben/servers/notes", json={})
        assert r.status_code in (201, 202), r.text
        Gov(hub).wait_up()
        hub.wait_for_server("ben", "notes")
        r = requests.post(
            f"{hub.hub_api_url.rstrip('/')}/shares/ben/notes",
            headers={"Authorization": f"token {hub.token('ben')}"},
            json={"user": "fay"},
            timeout=30,
        )
        assert r.status_code in (200, 201), r.text
        yield hub


@contextlib.contextmanager
def working(hub, user: str):
    """``user`` works on their default server meanwhile: its activity reaches the Hub every
    second, as jupyterhub-singleuser reports it (the idle culler's rule reads it), so the
    governor culls it only ``inactive_timeout`` after the block ends, however slow the
    machine is inside it."""
    stop = threading.Event()
    url = f"{hub.hub_api_url}/users/{user}/activity"
    auth = {"Authorization": f"token {hub.api_token}"}

    def beat():
        while not stop.is_set():
            body = {"servers": {"": {"last_activity": datetime.now(UTC).isoformat()}}}
            with contextlib.suppress(requests.RequestException):  # starting: not yet known
                requests.post(url, json=body, headers=auth, timeout=10)
            stop.wait(1)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def offer(hub, user: str) -> str:
    """The spawn form's line for the H100 (its css class and sentence)."""
    page = hub.login(user).get(hub.spawn_page_url(user), timeout=30).content.decode()
    found = re.search(r'<li class="(\w+)" data-team="lab">(.*?)</li>', page, re.S)
    return f"{found[1]}: {html.unescape(found[2])}" if found else page[:2000]


def queue_metric(hub, user_token: str, outcome: str) -> float:
    r = hub.get(f"{hub.url}/services/gpu-gov/metrics", token=user_token)
    assert r.status_code == 200, r.text[:500]
    pattern = (
        rf'jupyter_gpu_gov_queue_wait_seconds_count\{{[^}}]*outcome="{outcome}"[^}}]*\}} (\S+)'
    )
    return sum(float(v) for v in re.findall(pattern, r.text))


def verdict_on(hub, user: str, server: str) -> dict | None:
    """The verdict a server holds, as its JupyterLab reads it; None before the first."""
    status = hub.user_url(user, "jupyter-gpu-gov/status", server)
    return hub.get(status, token=hub.token(user)).json().get("verdict")


def told_on(hub, user: str, server: str) -> list[dict] | None:
    """What a server's verdict says of its owner's other servers started from the line."""
    return (verdict_on(hub, user, server) or {}).get("started_from_line")


def showback(gov: Gov) -> list[dict]:
    r = gov.admin("GET", "usage", params={"group_by": "team"})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_the_second_user_waits_in_line_and_starts_when_the_first_is_culled(hub):
    gov = Gov(hub)
    # carol works on her server until ben and erin wait in line: nothing culls it before.
    with working(hub, "carol"):
        r = hub.api("POST", "users/carol/server", json={"profile": "h100"})
        assert r.status_code in (201, 202), r.text
        hub.wait_for_server("carol")

        # ben's spawn form offers the line for the taken H100, once the governor syncs.
        sentence = wait(
            lambda: (o := offer(hub, "ben")).startswith("queue:") and o, 30, "the queue offer"
        )
        assert "Or wait in line: 1st for H100 80 GB" in sentence, sentence
        # Starting anyway is refused, and says the line is there.
        r = hub.spawn_form("ben", fields={"profile": "h100"})
        assert r.status_code == 403 and "Or wait in line for it" in html.unescape(r.text)

        r = join(hub, "ben", {"profile": "h100", "task_type": "batch", "expected_duration": "2h"})
        assert r.status_code == 302 and r.headers["Location"].endswith("/hub/gpu-gov/queue"), r.text
        r = join(hub, "erin", {"profile": "h100"})
        assert r.status_code == 302, r.text
        waiting = queue_line(hub)
        assert (waiting["ben"]["position"], waiting["erin"]["position"]) == (1, 2), waiting
        erin_expires = parse(waiting["erin"]["expires_at"])
        assert waiting["ben"]["options"]["task_type"] == "batch"
        # ben's page: his place, and the estimate from carol's planned cull (10 s after her
        # last activity).
        session = hub.login("ben")

        def place() -> str | None:
            page = session.get(f"{hub.url}/hub/gpu-gov/queue", timeout=30).text
            page = html.unescape(page.replace("'", '"'))
            estimate = re.search(r'class="estimate">([^<]*)<', page)
            due = "a server holding it is due to stop by"
            return due in (estimate[1] if estimate else "") and page

        page = wait(place, 30, "an estimate from carol's planned cull")
        assert 'data-server="ben/"' in page and 'class="position">1<' in page, page
        estimate = re.search(r'class="estimate">([^<]*)<', page)[1]
        due = r"\(a server holding it is due to stop by \d\d:\d\d UTC\)"
        assert re.fullmatch(rf"(about \d+s|any moment now) {due}", estimate), estimate
        assert "erin" not in page and "carol" not in page  # nor who else waits, nor who holds it
        r = hub.get(f"{hub.url}/hub/api/gpu-gov/queue", token=hub.token("ben"))
        assert r.status_code == 403  # the whole line is for admins
    # carol leaves: her silent server is culled for idleness; ben's starts by itself and answers.
    wait(lambda: not server_running(hub, "carol"), 90, "carol's idle server to be culled")
    wait(lambda: server_running(hub, "ben"), 90, "ben's server to start from the line")
    hub.wait_for_server("ben")
    # JupyterLab open on ben's other server is told, on the verdict that server gets anyway.
    (told,) = wait(lambda: told_on(hub, "ben", "notes"), 30, "ben's notes to be told")
    assert (told["name"], told["tier"]) == ("", "h100"), told
    assert told["url"] == urlsplit(hub.user_url("ben")).path
    assert parse(told["claim_by"]) - parse(told["started"]) == timedelta(minutes=15)
    # fay, whom ben shares his notes with, reads nothing of his other servers there: not in
    # the server's status, nor in the verdict an Extend answers (she read the new server's
    # name, tier and times, the Hub's path to it).
    notes_status = hub.user_url("ben", "jupyter-gpu-gov/status", "notes")
    seen = hub.get(notes_status, token=hub.token("fay")).json()["verdict"]
    assert seen["started_from_line"] == [] and seen["state"], seen
    r = requests.post(
        hub.user_url("ben", "jupyter-gpu-gov/extend", "notes"),
        headers={"Authorization": f"token {hub.token('fay')}"},
        json={"reason": "fay's"},
        timeout=60,
    )
    assert r.json()["verdict"]["started_from_line"] == [], r.text[:500]
    assert told_on(hub, "ben", "notes") == [told]  # still ben's to read
    own = wait(lambda: verdict_on(hub, "ben", ""), 30, "the new server's verdict")
    assert own["started_from_line"] == []  # its own tab needs no notice
    r = hub.get(hub.user_url("ben", "api/status"), token=hub.token("ben"))
    assert r.status_code == 200, r.text
    state = hub.api("GET", "users/ben").json()["servers"][""]["state"]
    grant = state["gpu_gov_grant"]
    assert (grant["gpu-gov/tier"], grant["gpu-gov/task-type"]) == ("h100", "batch"), grant
    assert grant["gpu-gov/expected-duration"] == "7200"
    assert grant["gpu-gov/claim-within"] == "900"  # the default 15m to open it
    assert parse(grant["gpu-gov/queued-at"]) is not None
    assert "gpu_gov_queue" not in state  # out of the line
    started = [a for a in gov.audit("ben/") if a["action"] == "queue-start"]
    assert started and "started on its owner's behalf" in started[0]["reason"], started
    # erin now waits for ben's GPU: still in line, unless her 40 s ran out meanwhile (from her
    # join, this test's cull and start took 40 s and more on a loaded machine); the expiry test
    # counts her either way.
    line = queue_line(hub)
    assert set(line) <= {"erin"}, line
    assert "erin" in line or datetime.now(UTC) >= erin_expires, (line, erin_expires)
    # ben opens it (runs a cell): his other server is no longer told.
    hub.execute("ben", hub.start_kernel("ben"), "1 + 1")
    wait(lambda: told_on(hub, "ben", "notes") == [], 30, "the notice to end")
    admin = hub.token("govadmin")
    assert queue_metric(hub, admin, "started") >= 1
    lab = {r["team"]: r for r in showback(gov)}["lab"]
    assert lab["queue_starts"] == 1 and lab["queue_hours"] > 0, lab


def test_a_request_waits_through_a_hub_restart_and_is_cancelled(hub):
    assert server_running(hub, "ben"), "needs ben's server from the previous test"
    r = join(hub, "dave", {"profile": "h100"})
    assert r.status_code == 302, r.text
    before = queue_line(hub)["dave"]
    hub.restart()
    Gov(hub).wait_up()
    after = queue_line(hub)["dave"]
    assert (after["queued_at"], after["expires_at"]) == (before["queued_at"], before["expires_at"])
    assert server_running(hub, "ben") and not server_running(hub, "dave")

    # JupyterHub's own pages say where dave's server stands: the server's URL (the Hub's "not
    # running" page, which its spawn-pending page shows too) and the home page, with Cancel.
    session = hub.login("dave")
    for path in ("user/dave/", "spawn-pending/dave"):
        page = html.unescape(session.get(f"{hub.url}/hub/{path}", timeout=30).text)
        assert "is waiting in line for" in page and "H100 80 GB" in page, (path, page[:3000])
        assert "Your server dave is not running" not in page
    page = session.get(f"{hub.url}/hub/home", timeout=30).text
    # erin's request (from the first test) may still wait ahead of dave's, or have expired.
    notice = page[page.find("gpu-gov-waiting") :][:3000]
    assert re.search(r'class="gpu-gov-position">(1st|2nd)<', notice), notice
    action = re.search(r'action="([^"]*/gpu-gov/queue/cancel/dave[^"]*)"', page)
    assert action, page[:3000]
    r = session.post(
        hub.url + html.unescape(action[1]),
        data={"next": "/hub/home"},
        allow_redirects=False,
        timeout=30,
    )
    assert r.status_code == 302 and r.headers["Location"] == "/hub/home", r.text
    assert "dave" not in queue_line(hub)
    # A page to go back to holding a line break (the form's field is the user's to edit) goes
    # to the queue page: tornado refuses it in a Location header, and the cancel was a 500.
    for back in ("/hub/home\r\nSet-Cookie: x=1", "/hub/\x0bhome", "/hub/\thome"):
        r = session.post(
            hub.url + html.unescape(action[1]),
            data={"next": back},
            allow_redirects=False,
            timeout=30,
        )
        assert r.status_code == 302, (back, r.status_code, r.text[:500])
        assert r.headers["Location"] == "/hub/gpu-gov/queue", (back, r.headers["Location"])
    assert "gpu-gov-waiting" not in session.get(f"{hub.url}/hub/home", timeout=30).text
    assert (
        "No server of yours waits in line"
        in session.get(f"{hub.url}/hub/gpu-gov/queue", timeout=30).text
    )


def test_a_request_expires_and_is_counted(hub):
    admin = hub.token("govadmin")
    deadline = time.monotonic() + 90
    while "erin" in queue_line(hub) and time.monotonic() < deadline:
        time.sleep(1)
    assert "erin" not in queue_line(hub), "erin's request (40 s) did not expire"
    assert not server_running(hub, "erin")
    wait(lambda: queue_metric(hub, admin, "expired") >= 1, 30, "the expiry to be counted")
    lab = {r["team"]: r for r in showback(Gov(hub))}["lab"]
    assert lab["queue_expired"] == 1 and lab["queue_starts"] == 1, lab


@requires_browser
def test_the_spawn_form_offers_the_line_and_the_page_shows_the_place(hub, tmp_path):
    """In a real browser: the H100 is taken (ben keeps it), so the form marks it "wait in line"
    with the place and estimate; picking it shows the button; it leads to the place in line,
    where Cancel takes the request back."""
    assert server_running(hub, "ben"), "needs ben's server from the first test"
    with chromium() as browser:
        page = browser.new_page()
        page.set_default_timeout(60_000)
        log_in(page, hub.url, "fay", "any", "/hub/spawn")
        form = page.locator(".gpu-gov-form")
        h100 = form.locator('label[data-tier="h100"]')
        offer = h100.locator('li[data-team="lab"]')
        expect(offer).to_have_class("queue")
        expect(offer).to_contain_text("Or wait in line: 1st for H100 80 GB")
        button = form.locator("#gpu-gov-queue-button")
        expect(button).to_be_hidden()  # "No GPU" is chosen: nothing to wait for
        h100.locator("input").check()
        expect(button).to_be_visible()
        # Enter in a field still means Start (refused: the card is taken), never the line.
        page.press("#gpu-gov-project", "Enter")
        expect(page.locator(".spawn-error-msg")).to_contain_text("Or wait in line for it")
        assert "fay" not in queue_line(hub)
        h100.locator("input").check()
        page.screenshot(path=str(screenshot_path("spawn-queue.png", tmp_path)), full_page=True)
        button.click()
        page.wait_for_url(f"{hub.url}/hub/gpu-gov/queue")
        row = page.locator('tr[data-server="fay/"]')
        expect(row.locator(".position")).to_have_text("1")
        assert "fay" in queue_line(hub)
        row.locator("button", has_text="Cancel").click()
        expect(page.locator(".empty")).to_have_text("No server of yours waits in line.")
    assert "fay" not in queue_line(hub)


def test_the_cluster_report_counts_spawns_waiting_for_a_gpu_not_for_a_quota(hub, capsys):
    """``GET api/diagnosis``'s demand, from the spawn queue's sync: fay waits in line for the
    H100 ben keeps (``queued``); dave's spawn is refused for want of it and he does not wait
    (``refused``); ben's second server waits for his own cap of one GPU (neither). The H100 is
    an exclusive whole card, allocated in full: not fragmented, however many wait. When dave
    joins the line after all, he counts once, in line."""
    assert server_running(hub, "ben"), "needs ben's server from the first test"
    gov = Gov(hub)
    assert join(hub, "fay", {"profile": "h100"}).status_code == 302
    # At his own cap, a card freeing elsewhere starts nothing: the refusal says what does.
    r = hub.spawn_form("ben", "more", fields={"profile": "h100"})
    said = " ".join(html.unescape(r.text).split())
    assert r.status_code == 403 and "when one of your own GPU servers stops" in said, said[:3000]
    assert "when the GPU frees" not in said
    assert join(hub, "ben", {"profile": "h100"}, server="more").status_code == 302
    page = hub.login("ben").get(hub.spawn_page_url("ben", "more"), timeout=30)
    said = " ".join(html.unescape(page.text).split())
    assert "This server is waiting in line for" in said and "GPU frees" not in said, said[:3000]
    r = hub.spawn_form("dave", fields={"profile": "h100"})
    said = " ".join(html.unescape(r.text).split())
    assert r.status_code == 403 and "Or wait in line for it" in said
    assert "starts by itself when the GPU frees" in said  # the cards are taken: that starts it
    waiting = queue_line(hub)
    assert (waiting["fay"]["limit"], waiting["ben"]["limit"]) == ("capacity", "user-cap")

    def demand(queued: int, refused: int):
        r = gov.admin("GET", "diagnosis")
        assert r.status_code == 200, r.text
        found = r.json()["fragmentation"]
        expected = {"pending": 0, "queued": queued, "refused": refused}
        return found["demand"] == expected and found

    found = wait(lambda: demand(1, 1), 30, "fay in line and dave refused, counted")
    assert found["spawns_waiting"] == 2 and found["flag"] is False, found
    assert (found["devices"], found["devices_partly_used"], found["devices_free"]) == (1, 0, 0)
    assert join(hub, "dave", {"profile": "h100"}).status_code == 302
    wait(lambda: demand(2, 0), 30, "dave counted in line, no longer as refused")
    # The dashboard's "Why GPUs are underused" and the command line say the same.
    dashboard = hub.login("govadmin").get(f"{hub.url}/services/gpu-gov/", timeout=30)
    assert dashboard.status_code == 200, dashboard.text[:500]
    said = re.search(r'id="fragmentation">(.*?)</p>', html.unescape(dashboard.text), re.S)
    assert said and "Not fragmented." in said[1], dashboard.text[:3000]
    words = "spawns waiting for a GPU: 2 (starting 0, in line 2, refused in the last hour 0)."
    assert words in " ".join(said[1].split()), said[1]
    url, token = f"{hub.url}/services/gpu-gov/", hub.token("govadmin")
    assert cli.main(["diagnose", "--cluster", "--url", url, "--token", token]) == 0
    text = capsys.readouterr().out
    assert "spawns waiting: 2 (starting 0, in line 2, refused in the last hour 0)" in text, text
    # A server's name is erin's choice: refused under four names, she counts as the servers
    # she may wait in line with (queue_per_user, 2), not as four (docs/security.md).
    for name in ("x1", "x2", "x3", "x4"):
        r = hub.spawn_form("erin", name, fields={"profile": "h100"})
        assert r.status_code == 403 and "Or wait in line for it" in html.unescape(r.text)
    wait(lambda: demand(2, 2), 30, "erin's refusals counted for two servers")
    passes = gov.passes()  # (a sync follows each pass: some syncs later, still two)
    wait(lambda: gov.passes() >= passes + 3, 60, "three passes and syncs")
    assert demand(2, 2), gov.admin("GET", "diagnosis").json()["fragmentation"]["demand"]
