"""The service's log lines: one record, one line, whatever a user named their server.

JupyterHub accepts a user name with a newline in it (its default ``validate_username``) and,
from 4.1 to 5.x, any server name: written as it is, such a name ends the service's line and
starts a fake one ("gpu-gov: culled ..."). The service's handler writes each control
character and bidi override of a record's message as its escape, and bounds each long string
argument. ``GpuGovernor`` (app.py) installs it for its own log and those of the package and the libraries it runs on.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from traitlets.config.application import LevelFormatter

from ..core.text import escape_table

# The loggers given the service's handler besides traitlets' ``self.log``: the package's
# modules, tornado's (the access log, HubAuth's app_log), traitlets' own (HubAuth's self.log)
# and asyncio's (an exception no task retrieved).
SERVICE_LOGGERS = ("jupyter_gpu_gov", "tornado", "traitlets", "asyncio")

MAX_ARG_CHARS = 2000  # one argument of a line (a server key, an error's words)

_ESCAPED = escape_table()  # every control character, newline and tab too


def escaped(text: str) -> str:
    """``text`` on one line: each control character written as ``repr`` writes it (``\\n``,
    ``\\x1b``, ``\\u202e``)."""
    return text.translate(_ESCAPED)


def _bounded(arg: object) -> object:
    if isinstance(arg, str) and len(arg) > MAX_ARG_CHARS:
        return f"{arg[:MAX_ARG_CHARS]}...(+{len(arg) - MAX_ARG_CHARS} chars)"
    return arg


class EscapingFormatter(LevelFormatter):
    """traitlets' formatter, on a copy of the record whose message is bounded and escaped:
    the record itself is left as logged (another handler, pytest's, sees it whole)."""

    def format(self, record: logging.LogRecord) -> str:
        shown = logging.makeLogRecord(record.__dict__)
        if isinstance(record.args, Mapping):
            shown.args = {key: _bounded(value) for key, value in record.args.items()}
        elif record.args:
            shown.args = tuple(_bounded(arg) for arg in record.args)
        shown.msg, shown.args = escaped(shown.getMessage()), None
        return super().format(shown)


class StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record comes, not as it was when logging was
    set up (a test's capture long closed)."""

    def __init__(self, level: int | str = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr
