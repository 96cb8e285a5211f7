"""The governor on a real hub, shared by the end-to-end tests (tests/test_governor_hub.py,
tests/test_labextension_browser.py): ``governed_hub`` adds the governor service with short test
timers, ``Gov`` calls its API through the hub's proxy, and a few waiting helpers."""

from __future__ import annotations

import html
import os
import re
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import ports
import requests
import websocket
from hub_harness import HubHarness

from jupyter_gpu_gov.core.clock import parse

GOVERNOR_CONFIG = """
c = get_config()  # noqa: F821
c.GpuGovernor.db_url = "sqlite:///{db}"
c.GpuGovernor.cull_every = 0.5
c.GpuGovernor.report_stale_after = 60
c.GpuGovernor.dry_run = {dry_run}
c.GpuGovernor.diagnose_zombie_idle = 2  # seconds, like the policies' timers below
c.GpuGovernor.policy_defaults = {{
    "warn_after": "3s", "cull_after": "7s", "user_activity_grace": "1s", "busy_grace": "5s",
    "extension_step": "60s", "max_extensions": 1, "checkpoint_timeout": "20s",
}}
c.GpuGovernor.policies = {extra_policies!r} + [
    {{"name": "patient", "match": {{"users": ["dave"]}}, "warn_after": "2s", "cull_after": "60s"}},
    {{"name": "impatient", "match": {{"users": ["carol"]}}, "inactive_timeout": "10s"}},
]
"""

SINGLEUSER_CONFIG = """
c.GpuGovApp.sample_interval = 0.5
c.GpuGovApp.report_interval = 1
c.GpuGovApp.frontend_checkpoint_grace = 2  # a test tab never saves; do not wait long
"""


def free_port() -> int:
    return ports.free_port()


def governed_hub(
    workdir: Path,
    *,
    dry_run: bool = False,
    extra_policies: Iterable[Mapping] = (),
    silent_users: Iterable[str] = ("carol",),
    governor_args: Iterable[str] = (),
    governor_config: str = "",
    hub_config: str = "",
    governor_environment: Mapping[str, str] | None = None,
    singleuser_config: str = "",
    **kwargs,
) -> HubHarness:
    """A :class:`HubHarness` with the governor service (test timers; ``extra_policies`` go
    before the module's own, so they win for the users they match). The servers of
    ``silent_users`` never report; ``governor_args``, ``governor_config`` (Python for its
    config file), ``governor_environment``, ``hub_config`` (for the hub's) and
    ``singleuser_config`` (for the servers') add to it."""
    port = free_port()
    config = workdir / "gpu_gov_config.py"
    config.write_text(
        GOVERNOR_CONFIG.format(
            db=workdir / "gpu-gov.sqlite",
            dry_run=dry_run,
            extra_policies=[dict(p) for p in extra_policies],
        )
        + governor_config
    )
    args = ["--config=" + str(config), "--timeout=600", *governor_args]
    # The admin's own hook, set before add_governor (which chains its guard of user_options
    # with it, as the docs say).
    extra = f"""
        def _silent(spawner):
            # These servers run without a governor URL: they never report.
            if spawner.user.name in {sorted(silent_users)!r}:
                spawner.environment["JUPYTER_GPU_GOV_URL"] = ""

        c.Spawner.pre_spawn_hook = _silent

        from jupyter_gpu_gov.hub.hubconfig import add_governor
        add_governor(
            c,
            url="http://127.0.0.1:{port}",
            args={args!r},
            environment={dict(governor_environment or {})!r},
            admin_users=["govadmin"],
        )

        # JupyterHub starts a managed service again once its poll finds the process gone:
        # every 30 s (its _ServiceSpawner takes no config). Every second here, so that a test
        # that kills the governor waits for the restart, not ~15 s for the poll.
        from jupyterhub.services import service as _hub_services
        from traitlets import default as _default

        class _PolledServiceSpawner(_hub_services._ServiceSpawner):
            @_default("poll_interval")
            def _every_second(self):
                return 1

        _hub_services._ServiceSpawner = _PolledServiceSpawner
    """
    return HubHarness(
        workdir=workdir,
        extra_config=textwrap.dedent(extra) + "\n" + textwrap.dedent(hub_config),
        singleuser_config=SINGLEUSER_CONFIG + textwrap.dedent(singleuser_config),
        **kwargs,
    )


class Gov:
    """The governor's API through the hub's proxy."""

    def __init__(self, hub: HubHarness):
        self.hub = hub
        self.base = f"{hub.url.rstrip('/')}/services/gpu-gov/api"

    def call(self, method: str, path: str, token: str | None, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {token}"} if token else {}
        return requests.request(
            method, f"{self.base}/{path}", headers=headers, timeout=30, **kwargs
        )

    def admin(self, method: str, path: str, **kwargs) -> requests.Response:
        return self.call(method, path, self.hub.token("govadmin"), **kwargs)

    def audit(self, key: str) -> list[dict]:
        r = self.admin("GET", "audit", params={"server": key, "limit": 500})
        assert r.status_code == 200, r.text
        return r.json()["audit"][::-1]  # oldest first

    def actions(self, key: str) -> list[str]:
        return [a["action"] for a in self.audit(key) if a["action"] != "state"]

    def carried_out_cull(self, key: str, timeout: float = 30) -> tuple[list[dict], dict]:
        """The audit of ``key`` once its cull's outcome is on record. A cull is audited before
        it is carried out and its outcome joins that row after the Hub answered, which a loaded
        machine may report after the server is already gone."""

        def done():
            rows = self.audit(key)
            cull = next((a for a in reversed(rows) if a["action"] == "cull"), None)
            return cull and "outcome" in cull["details"] and (rows, cull)

        return wait(done, timeout, f"the outcome of {key}'s cull on its audit row")

    def verdict(self, user: str) -> dict:
        r = self.admin("GET", f"users/{user}/server")
        assert r.status_code == 200, r.text
        return r.json()["verdict"]

    def passes(self) -> int:
        """How many passes the governor has finished (its metrics)."""
        r = self.hub.get(
            f"{self.hub.url.rstrip('/')}/services/gpu-gov/metrics", token=self.hub.token("govadmin")
        )
        assert r.status_code == 200, r.text
        found = re.search(r"^jupyter_gpu_gov_reconcile_duration_seconds_count (\S+)$", r.text, re.M)
        assert found, "no pass count in the governor's metrics"
        return int(float(found[1]))

    def judged_after(self, user: str, seconds: float, timeout: float = 90) -> None:
        """Wait until the governor has judged ``user``'s server on a report made ``seconds``
        after this call: that report on record, then two passes over it. A test that asserts
        something did not happen has thereby given it its chance, on a machine however
        loaded, and waits no longer than that on an idle one."""
        since = time.time() + seconds

        def reported() -> bool:
            r = self.admin("GET", f"users/{user}/server")
            gpu = r.status_code == 200 and r.json().get("gpu")
            return bool(gpu) and parse(gpu["reported_at"]).timestamp() >= since

        wait(reported, seconds + timeout, f"a report of {user}'s made {seconds:g} s from now")
        passes = self.passes()
        wait(lambda: self.passes() >= passes + 2, timeout, "two passes over that report")

    def wait_up(self, timeout: float = 60) -> None:
        wait(lambda: self.admin("GET", "").status_code == 200, timeout, "the governor to answer")


def wait(check, timeout: float, what: str, explain: Callable[[], str] | None = None):
    """``check()``'s first true value within ``timeout`` seconds; an AssertionError naming
    ``what`` (and quoting ``explain()``, e.g. a hub's ``spawn_evidence``) when none came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (requests.ConnectionError, AssertionError):
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{explain()}" if explain else ""))


def kernel_with(hub: HubHarness, user: str, code: str) -> websocket.WebSocket:
    """Start a kernel, run ``code``, and keep its websocket open (a browser tab)."""
    kernel = hub.start_kernel(user)
    hub.execute(user, kernel, code)
    url = hub.user_url(user, f"api/kernels/{kernel}/channels")
    return websocket.create_connection(
        "ws" + url[len("http") :], header=[f"Authorization: token {hub.token(user)}"], timeout=30
    )


def start_all(hub: HubHarness, servers: Mapping[str, Mapping | None]) -> None:
    """Start these users' default servers (through the REST API, with these user_options) all
    at once, then wait for each: on a loaded machine much sooner than one after another."""
    for user, options in servers.items():
        hub.create_user(user)
        r = hub.api("POST", f"users/{user}/server", json=dict(options) if options else None)
        if r.status_code not in (201, 202):
            raise AssertionError(f"starting {user}'s server: {r.status_code} {r.text}")
    for user in servers:
        hub.started[(user, "")] = hub.wait_for_server(user)


def server_running(hub: HubHarness, user: str) -> bool:
    return "" in (hub.api("GET", f"users/{user}").json().get("servers") or {})


def service_pid(hub: HubHarness) -> int | None:
    """The governor's process (the one started with this hub's config file)."""
    needle = str(hub.workdir / "gpu_gov_config.py").encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"jupyter_gpu_gov.hub" in cmdline and needle in cmdline:
                return int(entry)
    return None


def join(
    hub: HubHarness, user: str, fields: Mapping[str, str], password: str = "", server: str = ""
):
    """Post the spawn form's choices to "Wait in line" (with the XSRF token the spawn form's
    action carries), as the button does, for ``user``'s default or named ``server``; the
    answer, redirects not followed."""
    session = hub.login(user, password)
    page = session.get(hub.spawn_page_url(user, server), timeout=30)
    xsrf = re.search(r"_xsrf=([^&\"']+)", page.text)
    assert xsrf, page.text[:2000]
    path = f"{user}/{server}" if server else user
    url = f"{hub.url}/hub/gpu-gov/queue/join/{path}?_xsrf={html.unescape(xsrf[1])}"
    return session.post(url, data=dict(fields), allow_redirects=False, timeout=60)


def cancel(hub: HubHarness, user: str) -> None:
    """``user`` leaves the line through the queue page's Cancel button (its form, as posted)."""
    cancel_button(hub, user)()


def cancel_button(hub: HubHarness, user: str) -> Callable[[], None]:
    """``user``'s Cancel button on the queue page, logged in and the page read: pressing it
    (the call) is one request, for a test racing a deadline."""
    session = hub.login(user)
    page = session.get(f"{hub.url}/hub/gpu-gov/queue", timeout=30).text
    action = re.search(rf"action='([^']*/gpu-gov/queue/cancel/{user}[^']*)'", page)
    assert action, page[:3000]

    def press() -> None:
        r = session.post(
            hub.url + html.unescape(action[1]),
            data={"next": "/hub/home"},
            allow_redirects=False,
            timeout=30,
        )
        assert r.status_code == 302 and user not in queue_line(hub), r.text

    return press


def queue_line(hub: HubHarness) -> dict[str, dict]:
    """The spawn queue as an admin lists it (the harness's token reads every server's state),
    by user."""
    r = hub.api("GET", "gpu-gov/queue")
    assert r.status_code == 200, r.text
    return {w["user"]: w for w in r.json()["line"]}
