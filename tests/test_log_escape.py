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


def test_an_exception_quoting_a_name_keeps_its_traceback_lines(capsys):
    """A traceback is Python's lines, but an exception's message quotes what it failed on (a
    server key, a report's text): its newline began a line below the record's escaped one."""
    app = GpuGovernor()
    app.initialize([])
    try:
        try:
            raise KeyError(MALLORY)
        except KeyError as error:
            error.add_note(f"while reading {MALLORY}")
            raise ValueError(f"no report for {MALLORY}") from error
    except ValueError:
        logging.getLogger("jupyter_gpu_gov.hub").exception("gpu-gov: deciding %s failed", MALLORY)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert not [line for line in lines if line.startswith(PLANTED)], err
    assert "\u202e" not in err, err
    # Still Python's traceback, frame by frame, with both exceptions' words escaped.
    assert lines[0].startswith("[jupyter_gpu_gov.hub] ERROR | gpu-gov: deciding mallory\\n")
    assert lines.count("Traceback (most recent call last):") == 2, err
    escaped = "mallory\\n" + PLANTED + "\\u202e"
    assert f"ValueError: no report for {escaped}" in lines, err
    assert f"while reading {escaped}" in lines, err
    assert [line for line in lines if line.startswith("KeyError: ") and escaped in line], err


def test_a_librarys_logger_writes_through_the_escape(capsys):
    """Not only the package's, tornado's, traitlets' and asyncio's loggers: any library the
    service runs (SQLAlchemy, ``concurrent.futures``' failed callbacks) had Python's
    last-resort handler, which wrote a name's newline as it is."""
    app = GpuGovernor()
    app.initialize([])
    logging.getLogger("concurrent.futures").warning("callback for %s failed", MALLORY)
    logging.getLogger("sqlalchemy.engine").warning("row of %s not written", MALLORY)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert not [line for line in lines if line.startswith(PLANTED)], err
    assert len(lines) == 2 and "\u202e" not in err, err
    assert (
        lines[0] == f"[concurrent.futures] WARNING | callback for mallory\\n{PLANTED}\\u202e failed"
    )
