"""The hub harness itself, where the hub tests lean on it holding on a loaded machine."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from hub_harness import HubHarness, _alive


def test_a_restart_waits_for_the_old_proxy_to_let_go_of_the_ports(tmp_path):
    """The Hub signals its proxy and exits without waiting for it to end: on a loaded machine
    the old proxy still holds the public and API ports when the new Hub starts its own, which
    cannot bind them (and the Hub starts one again only at its next check, seconds later,
    while the old proxy, or none, answers). Here the old proxy is held (SIGSTOP) until a new Hub has tried to start
    its own (at once if the restart launches no new Hub while the old proxy lives): the
    restarted hub answers, through a proxy of its own."""
    with HubHarness(workdir=tmp_path / "hub", users=["alice"], timeout=60) as hub:
        old_proxy, old_hub = int((hub.workdir / "proxy.pid").read_text()), hub.proc.pid
        started = hub.log_tail(10**9).count("Starting proxy @")

        def resume_when_tried():
            while _alive(old_hub):
                time.sleep(0.05)
            launched = time.monotonic() + 3  # a restart that does not wait launches at once
            while time.monotonic() < launched and hub.proc.pid == old_hub:
                time.sleep(0.05)
            if hub.proc.pid != old_hub:  # a new Hub while the old proxy lives: let it try
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    if hub.log_tail(10**9).count("Starting proxy @") > started:
                        time.sleep(1)  # the new proxy meets the ports held
                        break
                    time.sleep(0.05)
            os.kill(old_proxy, signal.SIGCONT)

        os.kill(old_proxy, signal.SIGSTOP)
        resumer = threading.Thread(target=resume_when_tried, daemon=True)
        resumer.start()
        try:
            hub.restart()
        finally:
            resumer.join(30)
            with contextlib.suppress(ProcessLookupError):
                os.kill(old_proxy, signal.SIGCONT)
        assert hub.api("GET", "users/alice").status_code == 200
        # Its own proxy, started once: not one that met the ports held and was started again
        # by the Hub's check seconds later (meanwhile the old proxy, or none, answered).
        log = hub.log_tail(10**9)
        assert log.count("Starting proxy @") == started + 1, log[-3000:]
        assert "EADDRINUSE" not in log, log[-3000:]
        assert not _alive(old_proxy)


def test_a_failed_spawns_evidence_quotes_the_users_lines_and_names_the_files(tmp_path):
    """What a failed spawn's message quotes (no hub needed: its log as a hub writes it): the
    hub log's file, its lines naming the user and its warnings and errors, not the harness's
    own polls of the user's model nor its probes for users; then each of ``evidence_from``,
    one that fails named in its place."""
    hub = HubHarness(workdir=tmp_path)
    hub.log_path.write_text(
        "[I 2026-12-06 22:47:33.036 JupyterHub log:192] 202 POST /hub/api/users/vera/server "
        "(harness@127.0.0.1) 203.84ms\n"
        "[I 2026-12-06 22:47:33.100 JupyterHub log:192] 200 GET /hub/api/users/vera "
        "(harness@127.0.0.1) 3.10ms\n"
        "[W 2026-12-06 22:47:33.101 JupyterHub log:192] 404 GET /hub/api/users/vic "
        "(harness@127.0.0.1) 7.47ms\n"
        "[I 2026-12-06 22:47:34.000 JupyterHub spawner:2998] something of alice\n"
        "[E 2026-12-06 22:47:35.000 JupyterHub reflector:414] Initial list of pods failed\n"
        "[W 2026-12-06 22:49:33.000 JupyterHub user:1058] vera's server failed to start in "
        "120 seconds, giving up.\n"
    )
    hub.evidence_from.append(lambda user, server: f"the pod of {user}/{server}: its record")
    hub.evidence_from.append(lambda user, server: 1 / 0)

    evidence = hub.spawn_evidence("vera").splitlines()

    assert evidence[0].startswith(f"hub log: {hub.log_path} (6 lines); the last 3 of the 3")
    assert [line.split("] ", 1)[1] for line in evidence[1:4]] == [
        "202 POST /hub/api/users/vera/server (harness@127.0.0.1) 203.84ms",
        "Initial list of pods failed",
        "vera's server failed to start in 120 seconds, giving up.",
    ]
    assert evidence[4] == "the pod of vera/: its record"
    assert "ZeroDivisionError" in evidence[5]
