"""The governor service stops on SIGTERM (how JupyterHub and Kubernetes stop it) at once and
quietly: exit status 0, and on stderr nothing but its own log lines: no asyncio complaint about
a task or future left behind (``_GatheringFuture exception was never retrieved``), no
traceback."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from hub_harness import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's benchmarks/

from benchmarks import ingest

pytestmark = pytest.mark.timeout(180)

NOISE = ("exception was never retrieved", "Task was destroyed", "Traceback")


def test_sigterm_ends_the_service_promptly_and_quietly(tmp_path):
    with (
        ingest.fake_hub(servers=5, seconds=1) as ready,
        open(tmp_path / "service.log", "w+") as log,
    ):
        port = free_port()
        # Passes every 0.2 s: the signal finds them, and the collections' timers, running.
        service = ingest.start_service(ready, str(tmp_path), port, log, cull_every=0.2)
        try:
            ingest.wait_until_reconciled(service, port, timeout_s=120)
            service.send_signal(signal.SIGTERM)
            code = service.wait(timeout=15)  # it takes well under a second
        finally:
            if service.poll() is None:
                service.kill()
                service.wait()
        log.seek(0)
        stderr = log.read()
    assert code == 0, stderr
    assert "governing" in stderr  # (its log: what the test reads is where it writes)
    for noise in NOISE:
        assert noise not in stderr, stderr
