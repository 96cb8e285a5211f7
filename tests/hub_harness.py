"""Start a real JupyterHub in a subprocess for tests.

The hub runs from this interpreter's environment with its own temporary directory, random free
ports (public proxy, proxy API, hub), configurable-http-proxy from the repository's
node_modules, SimpleLocalProcessSpawner (with --allow-root, no user switching) and
DummyAuthenticator. A managed-by-nobody service named ``harness`` holds an admin-ish API token
(see ``HARNESS_SCOPES``) that the helper uses to create users, tokens and servers.

Usage as a context manager::

    from hub_harness import HubHarness

    with HubHarness(users=["alice"], servers=["alice"]) as hub:
        token = hub.token("alice")
        r = hub.get(hub.user_url("alice", "api/status"), token=token)

or as a pytest fixture (the module attribute name becomes the fixture name)::

    from hub_harness import hub_fixture

    hub = hub_fixture(servers=["alice"])              # module-scoped by default

    def test_it(hub):
        r = hub.get(hub.user_url("alice", "api/status"), token=hub.token("alice"))

Later tests add the governor service with ``extra_config`` (Python appended to the generated
jupyterhub_config.py, where ``c``, ``HARNESS_DIR`` and ``HARNESS_ENV`` are defined),
``singleuser_env`` (extra environment for single-user servers) and ``singleuser_config``
(Python for the servers' jupyter_server_config.py, e.g. ``c.GpuGovApp.simulated_devices``).
``start_kernel`` and ``execute`` run code in a user's kernel (e.g. ``simulate.hold(20480)``);
to drive the simulated GPUs from the test process instead, point ``$JUPYTER_GPU_GOV_SIM_STATE``
at ``hub.sim_state``.

Browser-like use: ``login(user)`` gives a ``requests.Session`` logged in through /hub/login,
``spawn_form(user, server_name, fields)`` posts the spawn form as that user, and
``wait_for_server`` waits until a server started that way answers; when it does not (the
server stopped, or the wait timed out) the error quotes ``spawn_evidence``: the hub log's lines
about the user (the whole log is ``hub.log`` in the work directory), and what the parts in
``evidence_from`` add (tests/test_kubernetes_hub.py adds the fake Kubernetes API's record of the
user's pod and the pod's output). ``restart()`` stops only the
hub process and starts it again on the same ports and directory (with
``c.JupyterHub.cleanup_servers = False`` the servers keep running).

Teardown ends, all at once (SIGTERM, then SIGKILL), every process carrying this harness's marker
in its environment: the hub and its proxy, the managed services and the servers with their
kernels (the harness puts the marker in the services' and the servers' environments, which the
Hub does not pass on by itself): no orphans, even on failure or when the hub died first.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import ports
import pytest
import requests
import websocket  # websocket-client, a jupyter_server dependency

REPO = Path(__file__).resolve().parent.parent
CHP = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
# Seconds a kernel has to answer before code is sent to it: Jupyter Server drops a websocket
# to a kernel that has not answered after twice its kernel_info_timeout (60 s); two of those.
KERNEL_ANSWERS_WITHIN = 240
MARKER_ENV = "JUPYTER_GPU_GOV_HARNESS_ID"
# Set by conftest for the whole test run; passed on to every server and kernel the hubs start,
# so the run can check at its end that none is left.
RUN_MARKER = "JUPYTER_GPU_GOV_TEST_RUN"
SERVICE_NAME = "harness"
# What the harness's own service token may do: manage users, their servers and tokens, groups
# (teams), and reach user servers through the proxy.
HARNESS_SCOPES = [
    "admin:users",
    "admin:servers",
    "admin:groups",
    "tokens",
    "access:servers",
]


class HubHarnessError(RuntimeError):
    """The hub or a server did not come up; the message carries the end of the hub log."""


@dataclass
class UserServer:
    user: str
    name: str  # "" for the default server
    url: str  # public URL, ends with "/"
    token: str  # an API token owned by the user


def free_port() -> int:
    return ports.free_port()


class HubHarness:
    """A real ``jupyterhub`` subprocess, usable as a context manager.

    Parameters
    ----------
    users: created on start (servers listed in ``servers`` are created too).
    servers: users whose default server is started on start (waits until it answers).
    extra_config: Python appended to the hub config file.
    singleuser_env: extra environment for single-user servers (wins over the defaults:
        ``JUPYTER_GPU_GOV_BACKEND=simulated`` and ``JUPYTER_GPU_GOV_SIM_STATE=<dir>/sim-gpus.json``).
    singleuser_config: Python for the servers' ``jupyter_server_config.py``.
    sim_state: path of the shared simulated-GPU state file (default: in the hub directory).
    workdir: directory for everything (default: a fresh temporary one, removed afterwards).
    timeout: seconds to wait for the hub, and for each server, to come up.
    spawner_config: False leaves the spawner to ``extra_config`` (or to the config file
        ``launch`` makes): the harness then sets only ports, proxy, database and its service.
    hub_env: extra environment of the hub process.
    launch: given the harness's config text, writes the config file the hub is started with and
        returns its path (e.g. a Helm chart's own jupyterhub_config.py that runs this text as a
        ``hub.extraConfig`` entry, see tests/z2jh_harness.py).
    """

    def __init__(
        self,
        *,
        users: Iterable[str] = (),
        servers: Iterable[str] = (),
        extra_config: str = "",
        singleuser_env: Mapping[str, str] | None = None,
        singleuser_config: str = "",
        sim_state: str | os.PathLike[str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        timeout: float = 90,
        log_level: str = "INFO",
        spawner_config: bool = True,
        launch: Any = None,
        hub_env: Mapping[str, str] | None = None,
    ):
        self.users = list(users)
        self.servers_to_start = list(servers)
        self.extra_config = extra_config
        self.singleuser_env = dict(singleuser_env or {})
        self.singleuser_config = singleuser_config
        self.timeout = timeout
        self.log_level = log_level
        self.spawner_config = spawner_config
        self.launch = launch
        self.hub_env = dict(hub_env or {})
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gpu-gov-hub-"))
        self.sim_state = Path(sim_state) if sim_state else self.workdir / "sim-gpus.json"
        self.log_path = self.workdir / "hub.log"
        self.config_path = self.workdir / "jupyterhub_config.py"
        self.marker = uuid.uuid4().hex
        self.api_token = uuid.uuid4().hex + uuid.uuid4().hex
        self.proc: subprocess.Popen[bytes] | None = None
        self.started: dict[tuple[str, str], UserServer] = {}
        self._tokens: dict[str, str] = {}
        self._sessions: dict[str, requests.Session] = {}
        self._log_file: Any = None
        self.session = requests.Session()
        self.session.trust_env = False  # never send 127.0.0.1 through an HTTP(S)_PROXY
        self.port = self.api_port = self.hub_port = 0
        # What else a failed spawn's message quotes: (user, server name) -> text.
        self.evidence_from: list[Callable[[str, str], str]] = []

    # --- URLs --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Public base URL (through the proxy), without a trailing slash."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def hub_api_url(self) -> str:
        return f"{self.url}/hub/api"

    def user_url(self, user: str, path: str = "", server_name: str = "") -> str:
        base = f"{self.url}/user/{user}/" + (f"{server_name}/" if server_name else "")
        return base + path.lstrip("/")

    # --- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> HubHarness:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if not CHP.exists():
            raise HubHarnessError(f"{CHP} is missing: run `make node_modules`")
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port())
        self.port, self.api_port, self.hub_port = ports
        self.config_path.write_text(self._config_text())
        if self.launch is not None:
            self.config_path = Path(self.launch(self._config_text()))
        if self.singleuser_config:
            su = self.workdir / "singleuser-config"
            su.mkdir(exist_ok=True)
            (su / "jupyter_server_config.py").write_text(textwrap.dedent(self.singleuser_config))

        self._launch()
        for user in dict.fromkeys(self.users + self.servers_to_start):
            self.create_user(user)
        for user in self.servers_to_start:
            self.start_server(user)

    def restart(self) -> None:
        """Stop only the hub process (SIGTERM, which also stops its proxy) and start it again with
        the same config, ports and directory. Servers keep running when the config has
        ``c.JupyterHub.cleanup_servers = False``; tokens and login cookies stay valid."""
        proxy = self._proxy_pid()
        self._stop_hub()
        # The Hub signals its proxy and exits without waiting for it: on a loaded machine the
        # old proxy still holds the ports when the new Hub starts its own, which cannot bind
        # them (the new Hub exits, or answers through the old proxy until that one ends).
        if proxy is not None:
            self._wait_ended(proxy)
        self._launch()

    def _proxy_pid(self) -> int | None:
        """The hub's proxy, from the pid file the hub writes (and removes when it stops)."""
        try:
            pid = int((self.workdir / "proxy.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid in self.pids() else None  # this harness's, not a reused pid

    def _wait_ended(self, pid: int, timeout: float = 30) -> None:
        """Wait until ``pid`` ended (gone, or a zombie); SIGKILL it past ``timeout``."""
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def _launch(self) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("JUPYTERHUB_", "CONFIGPROXY_")) and k != MARKER_ENV
        }
        env.update(self.hub_env)
        env[MARKER_ENV] = self.marker
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', os.defpath)}"
        if self._log_file is None:
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.config_path)],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait(self._hub_up, "the hub API to answer")

    def _stop_hub(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def stop(self) -> None:
        """End the hub, its proxy and services, the servers and their kernels all at once
        (SIGTERM, then SIGKILL for any left after a grace): the test is over, and stopping each
        server in turn through the Hub costs seconds each (a server waits for its busy kernels).
        Idempotent."""
        self._kill_leftovers()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)  # reaped
        self.started.clear()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self.session.close()
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._own_workdir = False  # only once

    # --- REST helpers ------------------------------------------------------------------------
    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Call the hub REST API (``path`` relative to /hub/api) with the harness's token."""
        headers = {"Authorization": f"token {self.api_token}", **kwargs.pop("headers", {})}
        kwargs.setdefault("timeout", 30)
        return self.session.request(
            method, f"{self.hub_api_url}/{path.lstrip('/')}", headers=headers, **kwargs
        )

    def get(self, url: str, token: str | None = None, **kwargs: Any) -> requests.Response:
        """GET any URL; with ``token`` as ``Authorization: token …``; no redirects followed."""
        headers = dict(kwargs.pop("headers", {}))
        if token:
            headers["Authorization"] = f"token {token}"
        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("allow_redirects", False)
        return self.session.get(url, headers=headers, **kwargs)

    def create_user(self, user: str, admin: bool = False) -> dict[str, Any]:
        """Create ``user`` unless it exists; return the user model."""
        r = self.api("GET", f"users/{user}")
        if r.status_code == 200:
            return r.json()
        r = self.api("POST", f"users/{user}", json={"admin": admin} if admin else None)
        if r.status_code not in (201, 409):  # 409: exists already
            raise HubHarnessError(f"creating user {user}: {r.status_code} {r.text}")
        return self.api("GET", f"users/{user}").json()

    def token(self, user: str, scopes: list[str] | None = None, expires_in: int = 3600) -> str:
        """An API token owned by ``user`` (default scopes: everything the user may do).

        Tokens without explicit scopes are cached per user.
        """
        if scopes is None and user in self._tokens:
            return self._tokens[user]
        self.create_user(user)
        body: dict[str, Any] = {"note": "hub_harness", "expires_in": expires_in}
        if scopes is not None:
            body["scopes"] = scopes
        r = self.api("POST", f"users/{user}/tokens", json=body)
        if r.status_code != 201:
            raise HubHarnessError(f"token for {user}: {r.status_code} {r.text}")
        token = r.json()["token"]
        if scopes is None:
            self._tokens[user] = token
        return token

    def start_server(
        self,
        user: str,
        server_name: str = "",
        options: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> UserServer:
        """Start ``user``'s server through the API and wait until it answers through the proxy."""
        self.create_user(user)
        path = f"users/{user}/servers/{server_name}" if server_name else f"users/{user}/server"
        r = self.api("POST", path, json=options or None)
        if r.status_code not in (201, 202, 400) or (
            r.status_code == 400 and "already running" not in r.text
        ):
            raise HubHarnessError(f"starting {user}/{server_name}: {r.status_code} {r.text}")
        server = self.wait_for_server(user, server_name, timeout)
        self.started[(user, server_name)] = server
        return server

    def wait_for_server(
        self, user: str, server_name: str = "", timeout: float | None = None
    ) -> UserServer:
        """Wait until a server being started (e.g. through the spawn form) answers through the
        proxy; raise :class:`HubHarnessError` if it stops instead. Not registered for teardown's
        explicit stop (the hub, or the final sweep of processes, ends it)."""
        token = self.token(user)
        server = UserServer(user, server_name, self.user_url(user, "", server_name), token)

        def ready() -> bool:
            model = self.api("GET", f"users/{user}").json()
            spawner = (model.get("servers") or {}).get(server_name)
            if not spawner or not spawner.get("ready"):
                if spawner is None and not model.get("pending"):
                    raise HubHarnessError(
                        f"server {user}/{server_name} stopped while starting\n"
                        + self.spawn_evidence(user, server_name)
                    )
                return False
            return self.get(server.url + "api/status", token=token).status_code == 200

        self._wait(
            ready,
            f"the server of {user}/{server_name} to answer",
            timeout,
            explain=lambda: self.spawn_evidence(user, server_name),
        )
        return server

    def stop_server(self, user: str, server_name: str = "", timeout: float | None = None) -> None:
        path = f"users/{user}/servers/{server_name}" if server_name else f"users/{user}/server"
        r = self.api("DELETE", path)
        if r.status_code not in (202, 204, 400, 404):
            raise HubHarnessError(f"stopping {user}/{server_name}: {r.status_code} {r.text}")

        def stopped() -> bool:
            model = self.api("GET", f"users/{user}").json()
            return server_name not in (model.get("servers") or {})

        self._wait(stopped, f"the server of {user}/{server_name} to stop", timeout)
        self.started.pop((user, server_name), None)

    def login(self, user: str, password: str = "", fresh: bool = False) -> requests.Session:
        """A ``requests.Session`` logged in as ``user`` through /hub/login (the login form, with
        its ``_xsrf``), as a browser would be; cached per user unless ``fresh``."""
        if not fresh and user in self._sessions:
            return self._sessions[user]
        session = requests.Session()
        session.trust_env = False
        r = session.get(f"{self.url}/hub/login", timeout=30)
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', r.text)
        if r.status_code != 200 or xsrf is None:
            raise HubHarnessError(f"login page: {r.status_code} {r.text[:500]}")
        r = session.post(
            f"{self.url}/hub/login",
            data={"username": user, "password": password, "_xsrf": html.unescape(xsrf[1])},
            allow_redirects=False,
            timeout=30,
        )
        if r.status_code != 302:
            raise HubHarnessError(f"logging in {user}: {r.status_code} {r.text[:500]}")
        if not fresh:
            self._sessions[user] = session
        return session

    def spawn_page_url(self, user: str, server_name: str = "") -> str:
        return f"{self.url}/hub/spawn/{user}" + (f"/{server_name}" if server_name else "")

    def spawn_form(
        self,
        user: str,
        server_name: str = "",
        fields: Mapping[str, str] | None = None,
        session: requests.Session | None = None,
    ) -> requests.Response:
        """Post the spawn form as ``user`` (logged in with :meth:`login` unless ``session``):
        GET /hub/spawn/<user>[/<name>], take the form's action URL (which carries ``_xsrf``),
        POST ``fields``; return the answer, redirects not followed (302 to the pending page
        when the spawn was accepted, the spawn page with ``spawn-error-msg`` when refused)."""
        session = session or self.login(user)
        page_url = self.spawn_page_url(user, server_name)
        r = session.get(page_url, allow_redirects=False, timeout=30)
        form = re.search(r'<form\s[^>]*\bid="spawn_form"[^>]*>', r.text)
        action = form and re.search(r'\saction="([^"]*)"', form[0])
        if r.status_code != 200 or not action:
            raise HubHarnessError(f"spawn page of {user}: {r.status_code} {r.text[:500]}")
        r = session.post(
            urljoin(page_url, html.unescape(action[1])),
            data=dict(fields or {}),
            allow_redirects=False,
            timeout=60,
        )
        if "charset" not in r.headers.get("Content-Type", ""):
            r.encoding = "utf-8"  # the hub's pages say so in <meta charset>, not in the header
        return r

    def start_kernel(self, user: str, kernel_name: str = "python3", server_name: str = "") -> str:
        """Start a kernel on ``user``'s running server; return its id."""
        r = self.session.post(
            self.user_url(user, "api/kernels", server_name),
            headers={"Authorization": f"token {self.token(user)}"},
            json={"name": kernel_name},
            timeout=60,
        )
        if r.status_code != 201:
            raise HubHarnessError(f"starting a kernel for {user}: {r.status_code} {r.text}")
        return r.json()["id"]

    def execute(
        self, user: str, kernel_id: str, code: str, server_name: str = "", timeout: float = 60
    ) -> str:
        """Run ``code`` in a kernel through the proxy (websocket); return its stdout.

        The kernel answers first (``_kernel_channels``), then the code is sent. Raises
        :class:`HubHarnessError` when the code raises, or when the connection is dropped.
        """
        ws = self._kernel_channels(user, kernel_id, server_name)
        ws.settimeout(timeout)
        msg_id, msg = _kernel_request(user, "execute_request", code=code)
        out: list[str] = []
        # Output arrives on iopub, the reply on shell: their order is not guaranteed, so wait
        # for both the reply and iopub's "idle" for this request.
        replied = idle = False
        try:
            ws.send(json.dumps(msg))
            while not (replied and idle):
                reply = json.loads(ws.recv())
                if reply.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, body = reply["msg_type"], reply["content"]
                if kind == "stream" and body.get("name") == "stdout":
                    out.append(body["text"])
                elif kind == "error":
                    raise HubHarnessError(f"{body['ename']}: {body['evalue']}")
                elif kind == "execute_reply":
                    replied = True
                elif kind == "status" and body.get("execution_state") == "idle":
                    idle = True
            return "".join(out)
        except (websocket.WebSocketConnectionClosedException, ConnectionError) as error:
            raise HubHarnessError(
                f"the websocket to kernel {kernel_id} of {user} was dropped running {code!r}:"
                f" {error!r}\n{self._kernel_evidence(kernel_id)}"
            ) from error
        finally:
            ws.close()

    def _kernel_channels(self, user: str, kernel_id: str, server_name: str = ""):
        """A websocket to the kernel once it answered (``kernel_info_reply``), as a frontend
        waits for it before it runs a cell.

        Jupyter Server holds a new websocket until the kernel answers, for its
        ``kernel_info_timeout`` (60 s) at most, then again while it checks the kernel's
        channels, and when the kernel has not answered by then it drops the connection
        without a close frame (the error escapes its ``open``, and tornado aborts). A kernel
        just started on a loaded machine can take that long: the code sent on that connection
        was never read, and ``execute`` failed with ``WebSocketConnectionClosedException``.
        Here only a ``kernel_info_request`` (which changes nothing) is sent before the kernel
        answers, so a dropped connection is made again, for ``KERNEL_ANSWERS_WITHIN`` at most."""
        url = self.user_url(user, f"api/kernels/{kernel_id}/channels", server_name)
        deadline = time.monotonic() + max(self.timeout, KERNEL_ANSWERS_WITHIN)
        while True:
            left = max(deadline - time.monotonic(), 1.0)
            # Jupyter Server answers the handshake once the kernel answered, or after 60 s.
            ws = websocket.create_connection(
                "ws" + url[len("http") :],
                header=[f"Authorization: token {self.token(user)}"],
                timeout=max(left, 90),
            )
            msg_id, msg = _kernel_request(user, "kernel_info_request")
            try:
                ws.send(json.dumps(msg))
                while True:
                    reply = json.loads(ws.recv())
                    answers = reply.get("parent_header", {}).get("msg_id") == msg_id
                    if answers and reply.get("msg_type") == "kernel_info_reply":
                        return ws
            except (websocket.WebSocketConnectionClosedException, ConnectionError) as error:
                ws.close()
                if time.monotonic() >= deadline:
                    raise HubHarnessError(
                        f"kernel {kernel_id} of {user} never answered: {error!r}\n"
                        f"{self._kernel_evidence(kernel_id)}"
                    ) from error
            except BaseException:
                ws.close()
                raise

    def _kernel_evidence(self, kernel_id: str) -> str:
        """The hub log's lines on a kernel (its servers log there): why a connection ended."""
        lines = self.log_tail(400_000).splitlines()
        named = [n for n, line in enumerate(lines) if kernel_id in line]
        keep = sorted({i for n in named for i in range(n, min(n + 25, len(lines)))})
        return "\n".join(lines[i] for i in keep[-120:])

    # --- diagnostics -------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """PIDs of every live process started for this harness (hub, proxy, servers, kernels)."""
        return processes_with(MARKER_ENV, self.marker)

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def spawn_evidence(self, user: str, server_name: str = "", lines: int = 200) -> str:
        """What a failed spawn's message quotes: the hub log's lines that name ``user`` (but
        the harness's own polls of the user's model) and its warnings and errors, the last
        ``lines`` of them, then what each of ``evidence_from`` adds. The files named are kept
        with the work directory (pytest's basetemp keeps the last runs')."""
        try:
            log = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            log = []
        # the harness's own polls of the user's model, and its probes for users to create
        polled = re.compile(
            rf"\] (200 GET /hub/api/users/{re.escape(user)}|404 GET /hub/api/users/\S+) "
        )
        mine = [
            line
            for line in log
            if (user in line or line.startswith(("[W", "[E", "[C"))) and not polled.search(line)
        ]
        parts = [
            f"hub log: {self.log_path} ({len(log)} lines); the last {min(lines, len(mine))} of "
            f"the {len(mine)} naming {user} or a warning or error (not the harness's polls):",
            *mine[-lines:],
        ]
        for source in self.evidence_from:
            try:
                parts.append(source(user, server_name))
            except Exception as error:  # the evidence never hides the failure it explains
                parts.append(f"({source!r} failed: {error!r})")
        return "\n".join(parts)

    # --- internals ---------------------------------------------------------------------------
    def _config_text(self) -> str:
        markers = {
            MARKER_ENV: self.marker,
            **({RUN_MARKER: os.environ[RUN_MARKER]} if RUN_MARKER in os.environ else {}),
        }
        su_env = {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            **markers,
            "JUPYTER_GPU_GOV_BACKEND": "simulated",
            "JUPYTER_GPU_GOV_SIM_STATE": str(self.sim_state),
        }
        if self.singleuser_config:
            su_env["JUPYTER_CONFIG_PATH"] = str(self.workdir / "singleuser-config")
        su_env.update(self.singleuser_env)
        d = self.workdir
        text = f"""\
            # Generated by tests/hub_harness.py
            import sys

            # A single-user server's port below the ephemeral range (tests/ports.py): one the
            # Hub picked there could be taken by any outgoing connection before the server bound
            # it ("port ... is not available", the spawn failed).
            sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
            import jupyterhub.spawner
            from ports import free_port as _free_port
            jupyterhub.spawner.random_port = _free_port

            # The Hub (and KubeSpawner) wait for a server to answer, a pod to run and a stopped
            # process to end by polling with back-off up to 5 s a wait, at random within it:
            # a spawn or a stop was seen ~1-2 s after it happened. At most 0.5 s here, so tests
            # wait for the server rather than for the Hub's next look (what is polled, and when
            # the wait gives up, are JupyterHub's own).
            import jupyterhub.utils as _hub_utils
            _backoff = _hub_utils.exponential_backoff

            async def _sooner(check, message, start_wait=0.2, scale_factor=2, max_wait=5, *a, **k):
                return await _backoff(check, message, start_wait, scale_factor, min(max_wait, 0.5), *a, **k)

            for _module in list(sys.modules.values()):  # those that took it by name, and later ones
                if getattr(_module, "exponential_backoff", None) is _backoff:
                    _module.exponential_backoff = _sooner

            c = get_config()  # noqa: F821
            HARNESS_DIR = {str(d)!r}
            HARNESS_ENV = {su_env!r}

            c.JupyterHub.bind_url = "http://127.0.0.1:{self.port}"
            c.JupyterHub.hub_bind_url = "http://127.0.0.1:{self.hub_port}"
            c.JupyterHub.hub_connect_url = "http://127.0.0.1:{self.hub_port}"
            c.JupyterHub.db_url = {"sqlite:///" + str(d / "jupyterhub.sqlite")!r}
            c.JupyterHub.cookie_secret_file = {str(d / "jupyterhub_cookie_secret")!r}
            c.JupyterHub.log_level = {self.log_level!r}
            c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.api_port}"
            c.ConfigurableHTTPProxy.pid_file = {str(d / "proxy.pid")!r}
            c.ConfigurableHTTPProxy.should_start = True
            c.JupyterHub.authenticator_class = "dummy"
            """
        spawner = f"""\
            c.JupyterHub.spawner_class = "simple"
            c.SimpleLocalProcessSpawner.home_dir_template = {str(d / "home" / "{username}")!r}
            c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
            c.Spawner.args = ["--allow-root"]
            c.Spawner.environment = dict(HARNESS_ENV)
            c.Spawner.start_timeout = {int(self.timeout)}
            c.Spawner.http_timeout = {int(self.timeout)}
            """
        service = f"""\
            # Added to what the config above may have set (the z2jh chart's), as plain lists, so
            # that later lines (tests' own) can extend them with += or list().
            for _key in ("services", "load_roles"):
                if not isinstance(c.JupyterHub[_key], list):
                    c.JupyterHub[_key] = []
            c.JupyterHub.services.append({{"name": {SERVICE_NAME!r}, "api_token": {self.api_token!r}}})
            c.JupyterHub.load_roles.append(
                {{"name": "harness", "scopes": {HARNESS_SCOPES!r}, "services": [{SERVICE_NAME!r}]}}
            )

            # --- extra_config ---
            """
        # Last, after every line that adds services (extra_config's, a chart's): the Hub starts
        # a managed service with only its entry's environment (plus a few kept variables such
        # as PATH), so without this a service would carry no marker, and a hub killed before
        # it stopped its services (teardown's sweep kills it after a second) left them running.
        marked = f"""\

            # --- every managed service carries the harness's markers (added by the harness) ---
            _markers = {markers!r}
            for _service in c.JupyterHub.services:
                if _service.get("command"):
                    _service["environment"] = {{**(_service.get("environment") or {{}}), **_markers}}
            """
        parts = [text, spawner if self.spawner_config else "", service, self.extra_config, marked]
        return "".join(map(textwrap.dedent, parts)) + "\n"

    def _hub_up(self) -> bool:
        try:
            return self.get(f"{self.hub_api_url}/", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    def _wait(
        self,
        check: Any,
        what: str,
        timeout: float | None = None,
        explain: Callable[[], str] | None = None,
    ) -> None:
        """Wait until ``check()``; an error quotes ``explain()`` (the hub log's tail unless
        given) when the hub exits or the wait times out."""
        explain = explain or self.log_tail
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise HubHarnessError(
                    f"jupyterhub exited ({code}) while waiting for {what}\n{explain()}"
                )
            try:
                if check():
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise HubHarnessError(f"timed out waiting for {what}\n{explain()}")
            time.sleep(0.2)

    def _kill_leftovers(self) -> None:
        # A second to end by themselves; then killed, and killed again while any appears for
        # a few seconds more: a hub dying under load may restart its proxy in its last moment
        # (seen once as an orphaned configurable-http-proxy outliving the run).
        pids = self.pids()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 1.0
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = self.pids()
        deadline, quiet_since = time.monotonic() + 10.0, None
        while time.monotonic() < deadline:
            if pids:
                quiet_since = None
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= 0.3:
                return
            time.sleep(0.1)
            pids = self.pids()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its reaping is left)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def processes_with(name: str, value: str) -> list[int]:
    """PIDs of the live processes (not zombies) whose environment has ``name=value``."""
    found = []
    needle = f"{name}={value}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry))
    return sorted(found)


def hub_fixture(*, scope: str = "module", name: str | None = None, **harness_kwargs: Any):
    """Make a pytest fixture that yields a running :class:`HubHarness`.

    Assign it to a module attribute; that name is the fixture's name (or pass ``name``)::

        hub = hub_fixture(servers=["alice"], extra_config="c.JupyterHub.services += [...]")
    """

    @pytest.fixture(scope=scope, name=name)
    def _hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubHarness]:
        with HubHarness(workdir=tmp_path_factory.mktemp("hub"), **harness_kwargs) as hub:
            yield hub

    return _hub


def _kernel_request(user: str, msg_type: str, **content: Any) -> tuple[str, dict]:
    """A request to a kernel on its shell channel, as Jupyter's websocket protocol has it."""
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": msg_type, "username": user}
    header |= {"session": uuid.uuid4().hex, "version": "5.3"}
    if msg_type == "execute_request":
        content = {"code": content["code"], "silent": False, "store_history": False}
        content |= {"user_expressions": {}, "allow_stdin": False}
    msg = {"header": header, "parent_header": {}, "metadata": {}}
    return msg_id, msg | {"channel": "shell", "content": content}
