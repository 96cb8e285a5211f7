"""What the governor keeps of every server, kept small (issue 26: the service under 300 MB at
10,000 servers; docs/benchmarks-history.md, "Issue 26, wave 8"): the same values in fewer objects,
and every table that shares them bounded."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import sys
from collections.abc import Mapping
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


def _reads_as(kept, sent) -> bool:
    """``kept`` reads as ``sent``: the same fields (``[]``, ``get``, ``in``, iterating), values
    of the same types (its lists as tuples), zeros of the same sign."""
    if isinstance(sent, dict):
        return (
            isinstance(kept, Mapping)
            and set(kept) == set(sent)
            and len(kept) == len(sent)
            and all(k in kept and kept.get(k) is kept[k] for k in sent)
            and all(_reads_as(kept[k], sent[k]) for k in sent)
        )
    if isinstance(sent, list):
        return (
            type(kept) in (list, tuple)
            and len(kept) == len(sent)
            and all(map(_reads_as, kept, sent))
        )
    if type(kept) is not type(sent):
        return False
    if isinstance(sent, float):
        return sent == kept and math.copysign(1.0, sent) == math.copysign(1.0, kept)
    return sent == kept


def _objects(root) -> list:
    """Every object a kept report holds (not its classes)."""
    seen, out, todo = set(), [], [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        out.append(obj)
        todo.extend(gc.get_referents(obj))
    return out


def test_a_kept_report_reads_as_the_report_it_keeps():
    for index in range(8):  # whole cards and MIG slices, computing and idle, with a terminal
        report = _received(f"user{index}", index)
        kept = compact_report(report)
        assert _reads_as(kept, report)
        assert _identical(kept.to_json(), report)
    odd = {
        "window": {"gpu_active_fraction": -0.0, "seconds": 0.0},
        "targets": [{"gpu": {"history": [0.0, -0.0, 1, 1.0, True, "x", "x", None]}}],
        "devices": [{"uuid": "GPU-1", "health": {"status": "ok", "reasons": [{"a": [-0.0]}]}}],
    }
    kept = compact_report(odd)
    assert _reads_as(kept, odd) and _identical(kept.to_json(), odd)
    # What a report did not send reads as absent, not null, as in the JSON object.
    server = compact_report(_received("alice", 0))["server"]
    assert "name" in server and "shared" not in kept["devices"][0]
    assert kept["devices"][0].get("shared", False) is False
    with pytest.raises(KeyError):
        kept["devices"][0]["shared"]
    # Only the report's fields are keys: nothing else it was sent, no method's name.
    sent = {**_received("bob", 1), "colour": "red"}
    assert "colour" not in compact_report(sent) and compact_report(sent).get("colour") is None
    for name in ("get", "keys", "to_json", "__class__", "FIELDS"):
        assert name not in server and server.get(name) is None
        with pytest.raises(KeyError):
            server[name]


def test_a_kept_report_holds_no_dict_and_no_list():
    """Its objects are slotted sections, its lists tuples (``hub.ingest.Section``): a third of
    the memory of the decoded JSON (docs/benchmarks-history.md, "Issue 26, wave 14")."""
    for index in range(8):
        kept = _objects(compact_report(_received(f"user{index}", index)))
        assert not [o for o in kept if type(o) in (dict, list)]
    report = _received("carol", 3)
    assert sum(map(sys.getsizeof, _objects(compact_report(report)))) < 0.6 * sum(
        map(sys.getsizeof, _objects(report))
    )


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


def test_what_a_report_repeats_it_keeps_once():
    report = compact_report(_received("alice", 0))  # computing: twelve samples of 0.83
    holder = report["targets"][0]["gpu"]
    assert len({id(sample) for sample in holder["history"]}) == 1
    assert holder["devices"][0] is report["devices"][0]["uuid"]
    assert report["window"]["gpu_last_active"] is report["sampled_at"]
    idle = compact_report(_received("bob", 2))["targets"][0]["gpu"]
    assert idle["history"] == (0.0,) * 12 and len({id(s) for s in idle["history"]}) == 1
    # Across servers: the GPU's model and the kernel's name, one string each.
    other = compact_report(_received("carol", 5))
    assert other["devices"][0]["name"] is report["devices"][0]["name"]
    assert other["targets"][1]["name"] is report["targets"][1]["name"]


def test_the_strings_shared_across_reports_and_keys_stay_bounded(monkeypatch):
    monkeypatch.setattr(ingest, "FLEET_WORDS_KEPT", 3)
    monkeypatch.setattr(ingest, "_FLEET_WORDS", {})
    for n in range(10):
        kept = compact_report({"devices": [{"uuid": "GPU-1", "name": f"model {n}"}]})
        assert kept["devices"][0]["name"] == f"model {n}" and len(ingest._FLEET_WORDS) <= 3

    monkeypatch.setattr(vocabulary, "KEYS_SHARED", 3)
    monkeypatch.setattr(vocabulary, "_KEYS", {})
    for n in range(10):
        assert vocabulary.server_key(f"user{n}", "gpu") == f"user{n}/gpu"
        assert len(vocabulary._KEYS) <= 3
    assert vocabulary.server_key("user9", "gpu") is vocabulary.server_key("user9", "gpu")


def test_the_sections_servers_send_alike_are_kept_once_across_reports(monkeypatch):
    """A kernel without a GPU context sends the ``gpu`` object every other one does, an idle
    one often the same ``cpu``, most servers the same empty ``checkpoint``: one object each
    across reports (docs/benchmarks-history.md, "Issue 26, wave 27"), yet each report reads as sent,
    types and zeros' signs included, and the table that shares them stays bounded."""
    monkeypatch.setattr(ingest, "_FLEET_SECTIONS", {}, raising=False)
    alice, bob = compact_report(_received("alice", 0)), compact_report(_received("bob", 2))
    assert alice["targets"][1]["gpu"] is bob["targets"][1]["gpu"]  # idle, no GPU context
    assert alice["targets"][1]["cpu"] is bob["targets"][2]["cpu"]
    assert alice["checkpoint"] is bob["checkpoint"]
    # A GPU's UUID, a time: the server's own.
    assert (
        alice["targets"][0]["gpu"] is not compact_report(_received("alice", 0))["targets"][0]["gpu"]
    )
    # Equal in JSON's eyes is not the same JSON: 0, 0.0, -0.0 and false are each kept as sent.
    cpus = [
        {"cores": 0.0, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60},
        {"cores": 0, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60},
        {"cores": -0.0, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60},
        {"cores": False, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60},
        {"cores": 0.0, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60.0},
        {"cores": float("nan"), "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60},
        {"cores": 0.0, "iowait": 0.0, "read_mb_s": 0.0, "seconds": 60},
    ]
    for cpu in cpus * 2:
        sent = {"targets": [{"kind": "kernel", "cpu": cpu}]}
        kept = compact_report(sent)
        assert _identical(kept.to_json(), sent) or math.isnan(cpu["cores"])
        assert _reads_as(kept, sent) or math.isnan(cpu["cores"])
    monkeypatch.setattr(ingest, "FLEET_SECTIONS_KEPT", 3)
    for n in range(10):
        kept = compact_report({"targets": [{"cpu": {"cores": float(n), "seconds": 60}}]})
        assert kept["targets"][0]["cpu"]["cores"] == n and len(ingest._FLEET_SECTIONS) <= 3
        assert len(ingest._FLEET_TEXTS) <= 3  # and the texts that find them again


def test_the_lists_of_numbers_servers_send_alike_are_kept_once_across_reports(monkeypatch):
    """An idle kernel's twelve 0.0 samples, its GPU's pids: one tuple across reports, read as
    sent (types and zeros' signs apart); a list with a UUID, or longer than a window's, is
    the report's own, and the table that shares them stays bounded."""
    monkeypatch.setattr(ingest, "_FLEET_SECTIONS", {}, raising=False)
    bob, dave = compact_report(_received("bob", 2)), compact_report(_received("dave", 7))
    idle = bob["targets"][0]["gpu"]
    assert (
        idle["history"] == (0.0,) * 12 and idle["history"] is dave["targets"][0]["gpu"]["history"]
    )
    assert idle["pids"] == (4242,) and idle["pids"] is dave["targets"][0]["gpu"]["pids"]
    assert idle["devices"] is not dave["targets"][0]["gpu"]["devices"]  # a UUID: its own
    for history in ([0.0, 0.0], [0, 0.0], [-0.0, 0.0], [False, 0.0], [None, 0.0], [0.0, 0.0]):
        sent = {"targets": [{"kind": "kernel", "gpu": {"history": history, "pids": [1]}}]}
        kept = compact_report(sent)
        assert _identical(kept.to_json(), sent) and _reads_as(kept, sent)
    long = [0.0] * (ingest.FLEET_TUPLE_ITEMS + 1)
    one, two = (compact_report({"targets": [{"gpu": {"history": long}}]}) for _ in range(2))
    assert one["targets"][0]["gpu"]["history"] is not two["targets"][0]["gpu"]["history"]
    monkeypatch.setattr(ingest, "FLEET_SECTIONS_KEPT", 3)
    for n in range(10):
        kept = compact_report({"targets": [{"gpu": {"pids": [n, n]}}]})
        assert kept["targets"][0]["gpu"]["pids"] == (n, n) and len(ingest._FLEET_SECTIONS) <= 3


def test_a_report_keeps_the_texts_the_governor_holds_not_copies():
    """``held``: a GPU's UUID as DCGM's read has it, the pod's, the user's name as the row has
    it: the kept report holds those objects (equal, so read the same), not its own copies."""
    sent = _received("alice", 1)  # two MIG slices of one GPU
    parent = sent["devices"][0]["parent_uuid"]
    held = {text: "".join(text) for text in (parent, "alice", sent["server"]["pod"])}
    assert all(held[text] is not text for text in held)
    kept = compact_report(json.loads(json.dumps(sent)), held)
    assert kept == compact_report(sent) and _reads_as(kept, sent)
    assert all(device["parent_uuid"] is held[parent] for device in kept["devices"])
    assert kept["server"]["user"] is held["alice"]
    assert kept["server"]["pod"] is held[sent["server"]["pod"]]
    assert kept["devices"][0]["uuid"] is kept["targets"][0]["gpu"]["devices"][0]  # not held


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


def test_a_server_row_holds_its_records_values_once():
    """A row's policy-record columns are its record's, not a second copy beside it (issue 26,
    wave 44: ~190 bytes a server): the row alone is about the size of its other columns, every
    record column reads the record's value, and a column set on the row is what its record
    reads from then on (never a stale record beside a changed column)."""
    row = ServerRow(key="alice/gpu", user="alice", name="gpu", session_started=NOW)
    record = Record(state="warned", extension_s=1800.0, exempt_until=NOW, reason="idle")
    set_record(row, record)
    assert sys.getsizeof(row) < 250  # its 57 columns and caches in slots: 392 bytes
    assert all(getattr(row, f) is getattr(record, f) for f in ("state", "exempt_until", "reason"))
    row.warned_at = NOW
    assert record_of(row) == replace(record, warned_at=NOW)
    assert record is not record_of(row) and record.warned_at is None  # records stay as made
    assert row.warned_at == NOW and row.state == "warned"


def test_a_running_servers_metric_series_is_kept_small():
    """``jupyter_gpu_gov_server_gpu_equivalents`` has a series a running server: with the
    figures ``StateGauges`` keeps to publish it, under 600 bytes a server (a
    ``prometheus_client.Gauge`` kept a child a series, with its own value and lock: ~1.1 kB;
    docs/benchmarks-history.md, "Issue 26, wave 27"), and scraped with each server's labels and
    value until it stops."""
    import tracemalloc
    from types import SimpleNamespace

    from jupyter_gpu_gov.hub import metrics

    servers = 2000
    rows = [
        SimpleNamespace(user=f"sized{i:05d}", name="", team="vision", project="p", tier="h100")
        for i in range(servers)
    ]
    gauges = metrics.StateGauges()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n, state in enumerate(("idle", "active", "idle")):  # three passes
            for row in rows:
                seen = SimpleNamespace(**vars(row), state=state)
                gauges.set(f"{row.user}/", seen, 1.0 + n, ("jhub", f"jupyter-{row.user}"))
            gauges.publish()
        gc.collect()
        held = (tracemalloc.get_traced_memory()[0] - before) / servers
    finally:
        tracemalloc.stop()
    assert held < 600

    def scraped() -> dict:
        name = "jupyter_gpu_gov_server_gpu_equivalents"
        return {
            s.labels["user"]: (s.labels["pod"], s.value)
            for family in metrics.REGISTRY.collect()
            if family.name == name
            for s in family.samples
            if s.labels["user"].startswith("sized")
        }

    assert scraped() == {row.user: (f"jupyter-{row.user}", 3.0) for row in rows}
    for row in rows:
        gauges.drop(f"{row.user}/")
    gauges.publish()
    assert scraped() == {}


def test_the_servers_series_reads_as_a_prometheus_gauge():
    """The series the service serves (``metrics.ServerSeries``) scrape as a
    ``prometheus_client.Gauge`` of the same name and labels does after the same sets and
    removals: values, label values made text, and order."""
    import random

    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    from jupyter_gpu_gov.hub.metrics import ServerSeries

    gauge_registry, series_registry = CollectorRegistry(), CollectorRegistry()
    gauge = Gauge(
        ServerSeries.NAME, ServerSeries.DOCUMENTATION, ServerSeries.LABELS, registry=gauge_registry
    )
    series = ServerSeries()
    series_registry.register(series)
    assert generate_latest(series_registry) == generate_latest(gauge_registry)
    rng = random.Random(3)
    labels = [
        (f"u{i}", "" if i % 3 else "gpu", "team", "", None if i % 7 == 0 else "h100", f"p{i}", "ns")
        for i in range(50)
    ]
    for step in range(2000):
        chosen = rng.choice(labels)
        if rng.random() < 0.3:
            with contextlib.suppress(KeyError):
                gauge.remove(*chosen)
            series.remove(chosen)
        else:
            value = rng.choice([0, 1, 0.5, 2.25, 1e-9])
            gauge.labels(*chosen).set(value)
            series.set(chosen, value)
        if step % 50 == 0:
            assert generate_latest(series_registry) == generate_latest(gauge_registry)
    assert generate_latest(series_registry) == generate_latest(gauge_registry)


def _reached(*roots) -> int:
    """How many objects ``roots`` hold, themselves and all they refer to (each once)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) not in seen:
            seen.add(id(obj))
            stack.extend(gc.get_referents(obj))
    return len(seen)


def test_what_the_store_knows_of_the_ledgers_rows_stays_bounded_day_after_day(tmp_path):
    """A service runs for months: which of the ledger's rows exist, known so as to update them
    rather than insert, is the newest days' buckets and the open sessions, not every day's and
    every session's since it started (at 10,000 users, 10,000 keys a day and a session a server
    start, for as long as it ran). What is written is the same: a day's bucket written again
    after its keys were forgotten adds to its row, an ended session's row holds its end."""
    from jupyter_gpu_gov.core import ledger

    url = f"sqlite:///{tmp_path}/gov.sqlite"
    store, book = Store(url), ledger.Ledger(timedelta(minutes=10))
    users = [f"u{i}" for i in range(40)]
    billed: dict = {}  # (day, user) -> GPU-seconds written
    kept = []
    for day in range(12):  # each server started every morning, stopped every evening
        morning = NOW + timedelta(days=day)
        for hour in range(4):
            for user in users:
                at = morning + timedelta(hours=hour)
                obs = ledger.Observation(
                    f"{user}/", f"s{day}", at, ledger.Owner(user), 1.0, ledger.ACTIVE, morning
                )
                book.observe(obs)
            if hour == 3:
                for user in users:
                    book.close(f"{user}/", morning + timedelta(hours=3, minutes=30))
            deltas, sessions = book.drain()
            store.save_usage(deltas, sessions)
            for (date, owner), values in deltas.items():
                key = (date, owner.user)
                billed[key] = billed.get(key, 0.0) + sum(values.get(s, 0.0) for s in ledger.STATES)
        kept.append(_reached(store._usage_keys, store._usage_sessions))
    # A late delta for the first day, its keys long forgotten: added to its row.
    first = NOW.date()
    store.save_usage({(first, ledger.Owner("u0")): {ledger.ACTIVE: 60.0}}, [])
    billed[(first, "u0")] += 60.0

    assert kept[-1] <= kept[2], kept  # as after three days, not growing with every day
    buckets = {(b.day, b.owner.user): b.values for b in Store(url).usage()}
    assert buckets.keys() == billed.keys()
    for key, seconds in billed.items():
        assert sum(buckets[key].get(s, 0.0) for s in ledger.STATES) == pytest.approx(seconds)
    sessions = {(s.server, s.session): s for s in Store(url).usage_sessions()}
    assert len(sessions) == 12 * len(users)
    assert all(s.ended_at is not None for s in sessions.values())
