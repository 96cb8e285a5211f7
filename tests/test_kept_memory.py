"""What the governor keeps of every server, kept small (issue 26: the service under 300 MB at
10,000 servers; docs/benchmarks.md, "Issue 26, wave 8"): the same values in fewer objects, and
every table that shares them bounded."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from benchmarks.ingest_load import encode, report_for
from jupyter_gpu_gov.core import vocabulary
from jupyter_gpu_gov.core.policy import Record
from jupyter_gpu_gov.core.report import validate
from jupyter_gpu_gov.hub import ingest
from jupyter_gpu_gov.hub.ingest import compact_report
from jupyter_gpu_gov.hub.store import Store
from jupyter_gpu_gov.hub.tables import SERVER_COLUMNS, ServerRow, record_of, set_record

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)


def _received(user: str, index: int) -> dict:
    """A report as the governor receives it: sent as JSON, decoded and validated."""
    return validate(json.loads(encode(report_for(user, index, NOW))))


def _identical(a, b) -> bool:
    """Equal, of the same types, zeros of the same sign."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_identical(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_identical, a, b))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


def test_a_kept_report_is_the_report_it_keeps():
    for index in range(8):  # whole cards and MIG slices, computing and idle, with a terminal
        report = _received(f"user{index}", index)
        assert _identical(compact_report(report), report)
    odd = {"a": -0.0, "b": 0.0, "c": [0.0, -0.0, 1, 1.0, True, "x", "x"], "d": 1, "e": 1.0}
    assert _identical(compact_report(odd), odd)


def test_what_a_report_repeats_it_keeps_once():
    report = compact_report(_received("alice", 0))  # computing: twelve samples of 0.83
    holder = report["targets"][0]["gpu"]
    assert len({id(sample) for sample in holder["history"]}) == 1
    assert holder["devices"][0] is report["devices"][0]["uuid"]
    assert report["window"]["gpu_last_active"] is report["sampled_at"]
    idle = compact_report(_received("bob", 2))["targets"][0]["gpu"]
    assert idle["history"] == [0.0] * 12 and len({id(s) for s in idle["history"]}) == 1
    # Across servers: the GPU's model and the kernel's name, one string each.
    other = compact_report(_received("carol", 5))
    assert other["devices"][0]["name"] is report["devices"][0]["name"]
    assert other["targets"][1]["name"] is report["targets"][1]["name"]


def test_the_strings_shared_across_reports_and_keys_stay_bounded(monkeypatch):
    monkeypatch.setattr(ingest, "FLEET_WORDS_KEPT", 3)
    monkeypatch.setattr(ingest, "_FLEET_WORDS", {})
    for n in range(10):
        kept = compact_report({"name": f"model {n}"})
        assert kept == {"name": f"model {n}"} and len(ingest._FLEET_WORDS) <= 3

    monkeypatch.setattr(vocabulary, "KEYS_SHARED", 3)
    monkeypatch.setattr(vocabulary, "_KEYS", {})
    for n in range(10):
        assert vocabulary.server_key(f"user{n}", "gpu") == f"user{n}/gpu"
        assert len(vocabulary._KEYS) <= 3
    assert vocabulary.server_key("user9", "gpu") is vocabulary.server_key("user9", "gpu")


def test_a_server_row_reads_back_as_it_was_saved(tmp_path):
    """The governor's rows are plain objects the store writes and reads with Core statements:
    every column back as it was written, and a new row's unset columns take their defaults."""
    url = f"sqlite:///{tmp_path / 'gov.sqlite'}"
    store = Store(url)
    fresh = ServerRow(key="carol/", user="carol")
    assert fresh.state is None and fresh.labels is None  # unset until stored, as before
    row = ServerRow(key="alice/gpu", user="alice", name="gpu", session_started=NOW)
    set_record(row, Record(state="warned", extension_s=1800.0, exempt_until=NOW))
    row.team, row.labels = "vision", {"gpu-gov/tier": "h100"}
    row.checkpoint_manifest = {"files": ["a.ipynb"]}
    row.cull_at = NOW + timedelta(hours=1)
    store.save_servers([fresh, row])  # new rows that leave different columns unset
    assert (fresh.state, fresh.reports, fresh.name) == ("active", False, "")
    assert Store(url).server("carol/").labels == {}  # a callable default, in the store
    set_record(row, replace(record_of(row), warned_at=NOW))  # an update of a stored row
    store.save_servers([row])

    again = Store(url)
    back = again.server("alice/gpu")
    assert {c: getattr(back, c) for c in SERVER_COLUMNS} == {
        c: getattr(row, c) for c in SERVER_COLUMNS
    }
    assert record_of(back) == record_of(row)
    assert again.servers().keys() == {"alice/gpu", "carol/"}
    assert again.server("nobody/") is None
    with pytest.raises(TypeError, match="no column"):
        ServerRow(key="x/", colour="red")
