"""The service's log lines: one record, one line, whatever a user named their server.

JupyterHub accepts a user name with a newline in it (its default ``validate_username``) and,
from 4.1 to 5.x, any server name: written as it is, such a name ends the service's line and
starts a fake one ("gpu-gov: culled ..."). The service's handler writes each control
character and bidi override of a record's message as its escape, and bounds each long string
argument; in a traceback, each exception's own words too (its message, notes, a SyntaxError's
text), which may quote a name. ``GpuGovernor`` (app.py) installs it on the root logger: its own
log's, the package's and every library's lines (propagated to the root) pass through it.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator, Mapping

from traitlets.config.application import LevelFormatter

from ..core.text import escaped

MAX_ARG_CHARS = 2000  # one argument of a line (a server key, an error's words)


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
        # A handler before this one (pytest's, an admin's) may have cached its traceback on
        # the record, unescaped: this one writes its own.
        shown.exc_text = None
        return super().format(shown)

    def formatException(self, ei) -> str:
        """The traceback as Python writes it, each exception's words on their line: a
        ``KeyError`` of a server key, a message quoting a report's text, held a newline that
        began a line of its own below the record's escaped one."""
        try:
            shown = traceback.TracebackException(*ei[:3], compact=True)
            for each in _chain(shown):
                each._str = _bounded(escaped(each._str))
                notes = getattr(each, "__notes__", None)
                if isinstance(notes, list):
                    each.__notes__ = [_bounded(escaped(str(n))) for n in notes]
                for name in ("msg", "text", "filename"):  # a SyntaxError's, shown apart
                    value = getattr(each, name, None)
                    if isinstance(value, str):
                        setattr(each, name, _bounded(escaped(value)))
            text = "".join(shown.format())
        except Exception:  # another Python's TracebackException: all of it on one line
            return escaped(super().formatException(ei))
        return text[:-1] if text.endswith("\n") else text


def _chain(shown: traceback.TracebackException) -> Iterator[traceback.TracebackException]:
    """Every exception a traceback shows: its causes, contexts and a group's members."""
    todo, seen = [shown], set()
    while todo:
        each = todo.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        yield each
        todo += [e for e in (each.__cause__, each.__context__) if e is not None]
        todo += getattr(each, "exceptions", None) or ()


class StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record comes, not as it was when logging was
    set up (a test's capture long closed)."""

    def __init__(self, level: int | str = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr
