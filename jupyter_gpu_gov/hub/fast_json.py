"""Request bodies decoded by orjson where it is installed (the ``hub`` extra installs it): the
object ``json.loads`` gives, in about 40 % of its time (a report's body: ~25 µs of a steady
report's ~600 µs of CPU; docs/benchmarks-history.md, "Issue 26, wave 25").

Same answer, whatever the body: orjson's object is ``json.loads``'s (the same types, the same
floats to the bit, -0.0 too, a duplicate key's last value in its first place), except where
orjson says otherwise, and those bodies are read by ``json.loads`` itself, object or error:

- orjson refuses what ``json.loads`` may take: ``NaN``/``Infinity``, a number past a double's
  range (``1e400``), a lone surrogate (``"\\ud800"``), a body not in UTF-8 (UTF-16, a BOM),
  nesting past 1024;
- orjson reads an integer past 64 bits as a float, where ``json.loads`` keeps the integer: a
  body with 19 digits in a row goes to ``json.loads`` (its digits made one and searched, in C;
  a float's repr has at most 17 significant digits, so only some below 0.01, with their
  leading zeros, take the slower path, to the same answer);
- orjson reads nesting up to 1024 deep, ``json.loads`` as deep as the stack lets it (the
  recursion limit, 1000, less the frames below the call), and refuses deeper: a body with
  ``MAX_BRACKETS`` or more ``[`` and ``{`` in all (strings included: a C count) goes to
  ``json.loads``. A steady report has about 20; the largest valid one (1,000 targets) ~3,000,
  read as before.

``tests/test_fast_json.py`` holds the two to the same answer on the report corpus of
``tests/test_report_answers.py``, odd bodies and random numbers.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # an install without the hub extra: json.loads alone
    orjson = None

# An integer orjson would read as a float (past 64 bits: 20 digits, or 19 with a sign): 19
# digits in a row, found as "0" * 19 once every digit is "0" (3 µs for a report's 2 kB; the
# regular expression [0-9]{19} took 60-70).
_DIGIT_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGITS = b"0" * 19
# Fewer brackets than this nest less deep than json.loads reads from any stack under ~700
# frames (the service's is under 100), so it would not refuse what orjson reads.
MAX_BRACKETS = 256


def loads(body: bytes) -> Any:
    """``json.loads(body)``: the same object, or the same error."""
    if (
        orjson is not None
        and body.count(b"[") + body.count(b"{") < MAX_BRACKETS
        and _LONG_DIGITS not in body.translate(_DIGIT_AS_ZERO)
    ):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # json.loads's own answer: an object (NaN, ...) or its error
    return json.loads(body)
