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
