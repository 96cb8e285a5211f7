"""A warning beside a tab nobody uses, on a real hub: the Hub's own activity, a tab's polling,
the governor's lag read from its settings (issue 21, reclaim34's rule end to end).

Both owners set a model on the GPU with a cell, leave a JupyterLab-like tab open (a kernel's
websocket, and the API polled every 2 s as JupyterLab's tab does), and go away (``away_after``):
the warning goes out at once, beside that tab.

gail  never comes back. The tab's polling keeps the Hub's activity of her server fresh after
      the warning (the test reads it from the Hub), so gap21's "the Hub saw nobody" cannot tell;
      the governor reads the tab's polling as nobody, and her server is checkpointed and stopped
      after the Hub's lag (``hub_activity_lag``, 12 s here), long before the warning's full
      notice (10 min).
hank  runs a cell after the warning (a person's action, which a tab's polling never is): his
      warning is read, its full notice stands, and his server runs past the lag.

The Hub gathers activity every 3 s here (``last_activity_interval``, the servers'
``JUPYTERHUB_ACTIVITY_INTERVAL``, ``activity_resolution`` 1 s), so a 12 s lag is true of it.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta

import pytest
import requests
import websocket
from governor_harness import Gov, governed_hub, server_running, wait
from hub_harness import HubHarness

from jupyter_gpu_gov.core.clock import parse

pytestmark = pytest.mark.timeout(480)

LAG = 12  # seconds: the governor's hub_activity_lag, twice the Hub's 3 s interval and 6 s
NOTICE = timedelta(minutes=10)  # cull_after - warn_after: what an owner who reads it gets
AWAY = {
    "name": "away-owners",
    "match": {"users": ["gail", "hank"]},
    "warn_after": "60s",
    "cull_after": f"{60 + int(NOTICE.total_seconds())}s",
    "away_after": "8s",
}
HUB = """
c.JupyterHub.last_activity_interval = 3
c.JupyterHub.activity_resolution = 1
"""
SETUP = """
from jupyter_gpu_gov import checkpoint, simulate
weights = list(range(12))
checkpoint.save_variables("weights")
simulate.hold(2048)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with governed_hub(
        tmp_path_factory.mktemp("unread-warning"),
        extra_policies=[AWAY],
        hub_config=HUB,
        # The away rule alone: a zombie diagnosis (2 s in the harness) would warn before
        # away_after, a warning given to someone who may be there, which keeps its notice.
        governor_config=f"c.GpuGovernor.hub_activity_lag = {LAG}\n"
        "c.GpuGovernor.diagnose_zombie_idle = 3600\n",
        singleuser_env={"JUPYTERHUB_ACTIVITY_INTERVAL": "3"},
    ) as hub:
        hub.create_user("govadmin")
        for user in ("gail", "hank"):
            hub.start_server(user)
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


class Tab:
    """What an open JupyterLab tab does with nobody at it: a kernel's websocket held open, and
    the server's API polled (kernels, sessions) every 2 s."""

    def __init__(self, hub: HubHarness, user: str, kernel: str):
        self.hub, self.user = hub, user
        url = hub.user_url(user, f"api/kernels/{kernel}/channels")
        self.socket = websocket.create_connection(
            "ws" + url[len("http") :], header=[f"Authorization: token {hub.token(user)}"]
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        session = requests.Session()
        session.trust_env = False
        headers = {"Authorization": f"token {self.hub.token(self.user)}"}
        while not self.stop.wait(2):
            for path in ("api/kernels", "api/sessions"):
                # Once the server is stopped there is nothing to poll.
                with contextlib.suppress(requests.RequestException):
                    session.get(self.hub.user_url(self.user, path), headers=headers, timeout=10)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=15)
        self.socket.close()


def open_notebook(hub: HubHarness, user: str) -> tuple[str, Tab]:
    """A kernel with a model on the GPU (the owner's last action), and a tab left open on it."""
    kernel = hub.start_kernel(user)
    hub.execute(user, kernel, SETUP)
    return kernel, Tab(hub, user, kernel)


def hub_activity(hub: HubHarness, user: str):
    """The Hub's last activity of ``user``'s server, None once it is gone."""
    server = (hub.api("GET", f"users/{user}").json().get("servers") or {}).get("")
    return server and server.get("last_activity") and parse(server["last_activity"])


def warned(gov: Gov, user: str) -> dict:
    return wait(
        lambda: next((a for a in gov.audit(f"{user}/") if a["action"] == "warn"), None),
        120,
        f"{user}'s warning",
    )


def test_an_owner_away_beside_an_open_tab_is_stopped_after_the_hubs_lag(hub, gov):
    _, tab = open_notebook(hub, "gail")
    try:
        warning = warned(gov, "gail")
        warned_at = parse(warning["at"])
        # The Hub sees the tab's polling after the warning, while the server runs.
        seen = []

        def stopped() -> bool:
            last = hub_activity(hub, "gail")
            if last:
                seen.append(last)
            return not server_running(hub, "gail")

        # Well before the full notice: the lag, the checkpoint, a loaded machine's passes.
        wait(stopped, 240, "gail's server to be stopped")
    finally:
        tab.close()
    assert seen and max(seen) > warned_at, (seen, warned_at)

    rows, cull = gov.carried_out_cull("gail/")
    actions = [a["action"] for a in rows if a["action"] != "state"]
    assert actions == ["warn", "checkpoint", "checkpoint-done", "cull"], rows
    assert "a tab open polls whether or not anyone is at it" in cull["reason"], cull
    checkpoint = next(a for a in rows if a["action"] == "checkpoint")
    assert parse(checkpoint["at"]) - warned_at < NOTICE / 2, (checkpoint, warning)
    manifest = cull["details"]["checkpoint"]
    assert manifest["status"] == "done" and manifest["cull_reason"] == "gpu-idle", manifest


def test_a_cell_after_the_warning_keeps_its_full_notice(hub, gov):
    kernel, tab = open_notebook(hub, "hank")
    try:
        warned_at = parse(warned(gov, "hank")["at"])
        hub.execute("hank", kernel, "weights.append(12)")  # hank is back: he read it
        # Past the lag that stopped gail, judged on reports made after it.
        gov.judged_after("hank", LAG + 10)
        assert server_running(hub, "hank")
        assert not {"checkpoint", "cull"} & set(gov.actions("hank/")), gov.audit("hank/")
        verdict = gov.verdict("hank")
        assert parse(verdict["cull_at"]) - warned_at >= NOTICE - timedelta(seconds=30), verdict
        assert "a tab open polls" not in verdict["reason"], verdict
    finally:
        tab.close()
