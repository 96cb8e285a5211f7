"""How the governor starts as a service (issue 18, item 10), with real processes: a service
entry without a URL (as jupyterhub-idle-culler's in zero-to-jupyterhub), a port someone else
holds, and a damaged database file.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from governor_harness import wait
from hub_harness import MARKER_ENV, HubHarness

from jupyter_gpu_gov.hub.hubconfig import SERVICE_SCOPES
from jupyter_gpu_gov.hub.store import SCHEMA_VERSION

pytestmark = pytest.mark.timeout(300)

ENTRIES = """
import sys
command = [sys.executable, "-m", "jupyter_gpu_gov.hub", "--cull-every=0.5"]
c.JupyterHub.services += [
    # Like jupyterhub-idle-culler's entry in zero-to-jupyterhub: no URL.
    {{"name": "gov-culler", "command": [*command, "--timeout=6",
      "--db-url=sqlite:///{culler_db}"]}},
    # A URL whose port another program holds; a dry run, so the two never cull twice.
    {{"name": "gov-blocked", "url": "http://127.0.0.1:{taken}", "command": [*command,
      "--timeout=3", "--dry-run", "--db-url=sqlite:///{blocked_db}"]}},
]
c.JupyterHub.load_roles += [
    {{"name": "govs", "services": ["gov-culler", "gov-blocked"], "scopes": {scopes!r}}},
]
"""


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on (its sockets' inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def pid_of(hub: HubHarness, name: str) -> int | None:
    needle = f"JUPYTERHUB_SERVICE_NAME={name}".encode()
    marker = f"{MARKER_ENV}={hub.marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in environ and marker in environ and b"jupyter_gpu_gov.hub" in cmdline:
            return int(entry.name)
    return None


class Squatter(BaseHTTPRequestHandler):
    """Another program on the service's port, answering everything with a 404."""

    def do_GET(self):
        self.send_error(404)

    def log_message(self, *args):
        pass


def test_no_url_means_no_port_and_a_taken_port_means_no_crash_loop(tmp_path):
    holder = ThreadingHTTPServer(("127.0.0.1", 0), Squatter)
    threading.Thread(target=holder.serve_forever, daemon=True).start()
    taken = holder.server_address[1]
    culler_db, blocked_db = tmp_path / "culler.sqlite", tmp_path / "blocked.sqlite"
    extra = ENTRIES.format(
        culler_db=culler_db,
        blocked_db=blocked_db,
        taken=taken,
        scopes=SERVICE_SCOPES,
    )
    try:
        with HubHarness(workdir=tmp_path / "hub", extra_config=extra, servers=["carol"]) as hub:
            culler = wait(lambda: pid_of(hub, "gov-culler"), 60, "the culler service to start")
            blocked = wait(lambda: pid_of(hub, "gov-blocked"), 60, "the blocked service to start")
            # carol's server sends no report; the Hub's rule (--timeout) culls it.
            wait(
                lambda: "" not in hub.api("GET", "users/carol").json()["servers"],
                90,
                "the culler without a URL to cull carol's idle server",
            )
            assert listening_ports(culler) == set()  # it took no port (10101 or any)
            assert pid_of(hub, "gov-blocked") == blocked  # the same process: no crash loop
            log = hub.log_tail(100_000)
    finally:
        holder.shutdown()
        holder.server_close()
    with sqlite3.connect(blocked_db) as db:
        recorded = db.execute(
            "SELECT action, dry_run FROM audit WHERE server_key = 'carol/' AND action = 'cull'"
        ).fetchall()
    assert recorded and all(dry for _, dry in recorded)  # it governed, though it could not listen
    assert f"cannot listen on 127.0.0.1:{taken}" in log
    assert "its service entry has no URL" in log


def start_on(db) -> subprocess.CompletedProcess:
    """The service started on the SQLite file ``db`` (it stops before reaching the Hub)."""
    return subprocess.run(
        [sys.executable, "-m", "jupyter_gpu_gov.hub", f"--db-url=sqlite:///{db}"],
        env={"PATH": "/usr/bin:/bin", "JUPYTERHUB_API_TOKEN": "unused"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_damaged_database_says_what_is_wrong_and_how_to_recover(tmp_path):
    db = tmp_path / "gpu-gov.sqlite"
    db.write_bytes(b"SQLite format 3\x00" + b"\x17" * 4096)  # a header, then garbage
    done = start_on(db)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert f"cannot use its database sqlite:///{db}" in done.stderr
    assert "move it aside" in done.stderr and "creates a new, empty database" in done.stderr


def test_a_database_of_a_newer_version_says_so_without_a_traceback(tmp_path):
    """A service rolled back to an older version (a Helm rollback), on the database a newer
    one migrated: an exit naming both versions and what to do, not a traceback at every
    restart (a crash loop). Nothing is written first: the tables this version would create
    are ones the newer one dropped or renamed (they were created before the refusal)."""
    db = tmp_path / "gpu-gov.sqlite"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE meta (key VARCHAR(64) PRIMARY KEY, value TEXT)")
        connection.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    done = start_on(db)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert f"cannot use its database sqlite:///{db}" in done.stderr
    assert (
        f"schema version 99, newer than this jupyter-gpu-gov understands ({SCHEMA_VERSION})"
        in done.stderr
    )
    assert "Upgrade the service again to that release" in done.stderr
    assert "restore the database from a backup taken before that upgrade" in done.stderr
    with sqlite3.connect(db) as connection:  # left as it was
        assert connection.execute("SELECT value FROM meta").fetchall() == [("99",)]
        tables = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        assert [name for (name,) in tables] == ["meta"]
