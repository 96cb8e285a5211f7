"""``validate``'s and ``compact_report``'s answers to a corpus of reports, as before their speed-ups.

The corpus is made here: the ingest benchmark's reports (whole cards and MIG slices, kernels
busy and idle, terminals), one with a device's health, an older server's CPU section and a
checkpoint, and each of them with every field, at every depth, replaced by each of a list of
values a report should not carry (wrong types, bools for numbers, huge integers, out of range,
times in the future or before the server started, long strings, ...) or removed. For each:
``validate``'s error (its field and its words) or its result, and for those it accepts what
``compact_report`` keeps (its JSON, and which of its strings and numbers are one object). The
hashes in ``tests/data/report_answers.json`` are the code's at a7a0998 (docs/benchmarks-history.md,
"Issue 26, wave 24"), re-recorded when a target's ``pids``, ``history`` and ``active_fraction``
came to be checked (1,960 cases of those three fields, accepted before, refused since; every
other answer the same), and again when a checkpoint's ``manifest`` came to be an object or
refused (redteam35: 100 cases of that field, accepted before, refused since; every other answer
the same, compared case by case with c9b84ed); a faster path that names another field or keeps another value fails here.

    python tests/test_report_answers.py --record   # only to re-record on purpose
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ingest_load import report_for  # noqa: E402
from jupyter_gpu_gov.core.report import ReportError, validate  # noqa: E402
from jupyter_gpu_gov.hub import ingest  # noqa: E402
from jupyter_gpu_gov.hub.ingest import Section, compact_report  # noqa: E402

RECORDED = Path(__file__).parent / "data" / "report_answers.json"
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)
BAD = [
    None,
    True,
    False,
    0,
    -1,
    1,
    7,
    0.5,
    1.5,
    -0.0,
    -2.5,
    float("inf"),
    float("nan"),
    10**400,
    "",
    "x",
    "x" * 5000,
    "2026-12-05T11:59:00Z",
    "2026-12-05T12:30:00+00:00",
    "1999-01-01T00:00:00Z",
    "2026-12-05T11:00",
    "not a time",
    "0a1b2c3d-0000-4000-8000-00000000abcd",
    [],
    [1],
    ["a", "b"],
    {},
    {"a": 1},
    {"status": "unhealthy", "action": None},
]


def _reports() -> list[dict]:
    reports = [report_for(f"user{i}", i, NOW - timedelta(seconds=30)) for i in range(4)]
    odd = copy.deepcopy(reports[0])
    odd["devices"][0]["health"] = {"status": "healthy", "action": None, "reasons": []}
    odd["targets"][1]["cpu"] = {"percent": 12.5, "iowait": 1.0}
    odd["checkpoint"] = {"requested_at": odd["sampled_at"], "status": "done", "manifest": {}}
    odd["server"]["name"] = "gpu-1"
    return [*reports, odd]


def _paths(value, at=()):
    """Every place in a decoded report: (path, container, key)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*at, key)
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (*at, i)
            yield from _paths(item, (*at, i))


def _changed(report: dict, path: tuple, value, remove: bool = False) -> dict:
    out = copy.deepcopy(report)
    obj = out
    for step in path[:-1]:
        obj = obj[step]
    if remove:
        del obj[path[-1]]
    else:
        obj[path[-1]] = copy.deepcopy(value)
    return out


def _kept(kept: Section) -> list:
    """What ``compact_report`` keeps: its JSON, and its strings and floats by object (which
    of them are one object, in the order met)."""
    ids: dict[int, int] = {}
    shared = []

    def walk(value) -> None:
        if isinstance(value, Section):
            for name in value._names:
                walk(getattr(value, name))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, tuple | list):
            for item in value:
                walk(item)
        elif isinstance(value, str | float):
            shared.append(ids.setdefault(id(value), len(ids)))

    walk(kept)
    return [kept.to_json(), shared]


def answers() -> tuple[str, dict]:
    """The corpus's answers as canonical JSON's sha256, and how many were refused, accepted."""
    digest, counts = hashlib.sha256(), {"accepted": 0, "refused": 0}
    for base in _reports():
        cases = [base, "a report", [base], None]
        for path in _paths(base):
            cases.append(_changed(base, path, None, remove=True))
            cases.extend(_changed(base, path, value) for value in BAD)
        for case in cases:
            case = json.loads(json.dumps(case))  # as the route decodes it: its own objects
            try:
                report = validate(case, NOW)
            except ReportError as error:
                answer = ["refused", error.field, str(error)]
                counts["refused"] += 1
            else:
                # Which objects are one within the report: a section shared across reports
                # (``ingest._fleet_section``) would hold the objects of whichever report sent
                # it first in this process, so each report starts without them (nor the texts
                # that find them).
                ingest._forget_fleet()
                answer = ["accepted", report == case, _kept(compact_report(report))]
                counts["accepted"] += 1
            digest.update((json.dumps(answer, sort_keys=True, default=repr) + "\n").encode())
    return digest.hexdigest(), counts


def test_every_report_of_the_corpus_is_answered_as_before():
    recorded = json.loads(RECORDED.read_text())
    digest, counts = answers()
    assert counts == recorded["counts"]
    assert digest == recorded["sha256"], "validate or compact_report answered differently"


if __name__ == "__main__" and "--record" in sys.argv:
    digest, counts = answers()
    table = {"sha256": digest, "counts": counts}
    RECORDED.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(table)
