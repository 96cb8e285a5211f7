"""The service's log with names users chose: one record, one line (hub/logs.py)."""

from __future__ import annotations

import logging

from fake_hub_api import FakeHub
from test_governor import H100_IDLE_GPU, T4_BUSY_GPU, governor, held, report_for

from jupyter_gpu_gov.hub.app import GpuGovernor
from jupyter_gpu_gov.hub.logs import MAX_ARG_CHARS

# JupyterHub's default validate_username accepts an inner newline: a name that plants a line
# an admin or a log pipeline reads as the governor's own, and one that reverses what follows.
PLANTED = "[W 2026-01-01 00:00:00.000 GpuGovernor] gpu-gov: culled bob/"
MALLORY = f"mallory\n{PLANTED}\u202e"


async def test_a_user_name_with_a_newline_makes_one_escaped_line(tmp_path, capsys):
    app = GpuGovernor()
    app.initialize([])  # the service's own logging set-up, as `python -m jupyter_gpu_gov.hub`
    app.log.warning("gpu-gov: %s", MALLORY)  # traitlets' self.log
    async with FakeHub() as hub:
        # The allocator gave mallory the H100; her report names another GPU: not believed,
        # and said so in the service's log with her server's key (hub/evidence.py).
        hub.add_server(MALLORY, state={"gpu_gov_devices": [H100_IDLE_GPU]})
        gov = governor(hub, tmp_path)
        gov.ingest(held(report_for(MALLORY, T4_BUSY_GPU, sm=0.9), T4_BUSY_GPU))
        await gov.reconcile()
        await gov.close()
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert not [line for line in lines if PLANTED in line and "mallory" not in line], err
    (own,) = [line for line in lines if line.startswith("[GpuGovernor]") and "mallory" in line]
    (distrusted,) = [line for line in lines if "report not believed" in line]
    escaped = "mallory\\n" + PLANTED + "\\u202e"
    for line in (own, distrusted):
        assert escaped in line and "\u202e" not in line, line
    assert distrusted.startswith("[jupyter_gpu_gov.hub] WARNING | gpu-gov: mallory\\n"), err


def test_a_long_argument_is_cut_and_says_by_how_much(capsys):
    app = GpuGovernor()
    app.initialize([])
    logging.getLogger("jupyter_gpu_gov.hub").warning("gpu-gov: %s: %d", "x" * 5000, 7)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("x" * 10 + f"...(+{5000 - MAX_ARG_CHARS} chars): 7"), line
    assert line.count("x") == MAX_ARG_CHARS
