"""The README's "Wait in line" step on the demo's own configuration (hub_config/, with the
governor's timers in seconds): alice and bob hold both H100s; erin's spawn form offers the line,
with her place and what would start her sooner; she waits in line, and her home page says so; bob's borrowed server, left
idle, is culled, and erin's server starts by itself and answers. Then the README's "When a GPU
fails": erin fails her GPU from a notebook (``simulate.fail(xid=79)``), her server says so and
the admin sees the GPU."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from demo_harness import PASSWORD, demo_hub
from governor_harness import join, queue_line, server_running, start_all, wait
from hub_harness import REPO

pytestmark = pytest.mark.timeout(300)

# Seconds for the demo's minutes; a start from the line is tried again soon after a refusal
# (erin's, were the Hub to refuse it while bob's card is still being freed: a minute by default).
GOVERNOR_CONFIG = """
c.GpuGovernor.cull_every = 1
c.GpuGovernor.queue_retry_after = 3
c.GpuGovernor.policy_defaults = dict(
    c.GpuGovernor.policy_defaults,
    warn_after="3s",
    cull_after="20s",
    user_activity_grace="1s",
    checkpoint_timeout="20s",
)
c.GpuGovernor.policies = [
    dict(p, warn_after="3s", cull_after="15s") for p in c.GpuGovernor.policies
]
"""


# The README's "When a GPU fails" cell, as a reader would paste it.
_FAILS = (REPO / "README.md").read_text().split("## When a GPU fails", 1)[1]
README_FAIL = re.search(r"```python\n(.*?)```", _FAILS, re.S)[1]
GPU_FAILED = (
    "Your GPU failed (XID 79: the GPU fell off the bus); your work was checkpointed; "
    "restart your server to get another GPU"
)


@pytest.fixture
def hub(tmp_path: Path):
    with demo_hub(tmp_path, GOVERNOR_CONFIG) as harness:
        yield harness


def exempt(hub, user: str, on: bool) -> None:
    """The demo admin's exemption from culling (holds a server until the test is ready)."""
    url = f"{hub.url}/services/gpu-gov/api/users/{user}/server/exempt"
    body = {"reason": "the test sets up", "duration": "1h"} if on else {"reason": "go"}
    r = requests.request(
        "POST" if on else "DELETE",
        url,
        headers={"Authorization": f"token {hub.token('admin')}"},
        json=body,
        timeout=30,
    )
    return r.ok


def test_a_queued_spawn_starts_by_itself_in_the_demo(hub) -> None:
    start_all(hub, {"alice": {"profile": "h100"}, "bob": {"profile": "h100"}})
    # Idle from their start: held until erin waits (an admin's exemption), then bob's goes.
    for user in ("alice", "bob"):
        wait(lambda user=user: exempt(hub, user, True), 60, f"the governor to know {user}")

    session = hub.login("erin", PASSWORD)

    def offered() -> str | None:
        page = html.unescape(session.get(hub.spawn_page_url("erin"), timeout=30).text)
        found = re.search(
            r'<label [^>]*data-tier="h100".*?<li class="queue"[^>]*>(.*?)</li>', page, re.S
        )
        return found and found[1]

    sentence = wait(offered, 60, "erin's spawn form to offer the line")
    assert "none is free to borrow" in sentence, sentence  # why not now, then the offer
    assert "Or wait in line: 1st for H100 80 GB, " in sentence, sentence
    assert "Sooner: Small H100 slice (MIG 1g.10gb) is free now." in sentence, sentence

    r = join(hub, "erin", {"profile": "h100"}, password=PASSWORD)
    assert r.status_code == 302 and r.headers["Location"].endswith("/hub/gpu-gov/queue"), r.text
    place = html.unescape(session.get(f"{hub.url}/hub/gpu-gov/queue", timeout=30).text)
    assert re.search(r"data-server=.erin/.*class=.position.>1<", place, re.S), place[:3000]
    assert "Small H100 slice (MIG 1g.10gb)" in place  # what would start it sooner
    assert queue_line(hub)["erin"]["tier"] == "h100"
    # JupyterHub's own home page says so too: place, estimate, Cancel.
    home = session.get(f"{hub.url}/hub/home", timeout=30)
    notice = re.search(r'<div class="alert alert-info gpu-gov-waiting".*?</div>', home.text, re.S)
    assert notice, home.text[:3000]
    words = " ".join(re.sub(r"<[^>]+>", "", html.unescape(notice[0])).split())
    assert "waiting in line for H100 80 GB: 1st in line, " in words, words
    assert "Cancel" in words and "Sooner: Small H100 slice (MIG 1g.10gb) is free now." in words

    assert exempt(hub, "bob", False)
    wait(lambda: not server_running(hub, "bob"), 120, "bob's idle borrowed server to be culled")
    wait(lambda: server_running(hub, "erin"), 120, "erin's server to start from the line")
    erin = hub.wait_for_server("erin")
    assert hub.get(erin.url + "api/status", token=hub.token("erin")).status_code == 200
    assert server_running(hub, "alice") and "erin" not in queue_line(hub)

    # "When a GPU fails": the README's cell in erin's notebook, as a researcher would run it.
    hub.execute("erin", hub.start_kernel("erin"), README_FAIL)
    status = erin.url + "jupyter-gpu-gov/status"
    failed = wait(
        lambda: (
            (v := hub.get(status, token=hub.token("erin")).json().get("verdict"))
            and v["reason"] == GPU_FAILED
            and v
        ),
        60,
        "erin's verdict to say her GPU failed",
    )
    assert failed["state"] == "gpu-failed"
    # A failed GPU is not culled for it, and keeps the H100 tier's max-age (8 h) deadline.
    left = datetime.fromisoformat(failed["cull_at"].replace("Z", "+00:00")) - datetime.now(UTC)
    assert timedelta(hours=7) < left <= timedelta(hours=8), failed
    r = requests.get(
        f"{hub.url}/services/gpu-gov/api/health",
        headers={"Authorization": f"token {hub.token('admin')}"},
        timeout=30,
    )
    (gpu,) = [g for g in r.json()["gpus"] if g["server"] == "erin/"]
    assert gpu["reasons"][0] == "XID 79: the GPU fell off the bus", gpu
