"""The diagnosis's answers to recorded report streams, as the code before its speed-ups gave them.

Each stream is made here, seeded: the ingest benchmark's fleet (moving, idle servers repeating),
and the same reports varied field by field (unknown and odd numbers, missing CPU sections,
shared and MIG devices, terminals, no backend, repeats, DCGM evidence, reports not believed, a
site's own zombie time, a model trained from the history mid-stream). What ``observe`` answers
for each report, and what it keeps (the costs, the history, the model's nodes and tasks), is
written as canonical JSON and hashed; ``tests/data/diagnosis_answers.json`` holds the hashes the
code gave at a7a0998, before ``observe`` was made cheaper (docs/benchmarks-history.md, "Issue 26,
wave 24"); re-recorded once on purpose in issue 23's round thirteen, when ``cpu_serial``'s
confidence was capped (three streams' hashes moved, every label count the same; with the cap
lifted, ``Params(residual=1.0)``, the a7a0998 hashes hold); and again when the cost ledger
filed the time of servers nothing trusted places under ``(unplaced)``, not the card kind
their reports named (every stream's hash moved; with the costs' ``nodes`` left out, every
answer and everything kept hashed as before). One stream was added later, recorded by the code
at 99b5662 before wave 36's cuts (docs/benchmarks-history.md, "Issue 26, wave 36"): the node
from the Hub's records (or none) and reports not believed, as the governor passes them. A
faster path that answers anything differently fails here, naming the stream.

    python tests/test_diagnosis_answers.py --record   # only to re-record on purpose
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.ingest_load import report_for  # noqa: E402
from jupyter_gpu_gov.core import clock  # noqa: E402
from jupyter_gpu_gov.core.report import ReportError, validate  # noqa: E402
from jupyter_gpu_gov.diagnose.features import COLUMNS  # noqa: E402
from jupyter_gpu_gov.hub.dcgm import GpuEvidence  # noqa: E402
from jupyter_gpu_gov.hub.diagnosis import DiagnosisOptions, DiagnosisService  # noqa: E402
from jupyter_gpu_gov.hub.diagnosis_windows import stamped, unpack  # noqa: E402

RECORDED = Path(__file__).parent / "data" / "diagnosis_answers.json"
SERVERS, ROUNDS = 60, 12
START = datetime(2026, 12, 5, 23, 50, tzinfo=timezone.utc)  # the streams cross a UTC day


def _odd(rng: random.Random):
    """A number a sampler may send: unknown, zero of either sign, an int, out of range, tiny."""
    return rng.choice([None, 0.0, -0.0, 0, 1, 1.0, 0.5, 1.7, 1e-9, rng.random(), rng.random()])


def _vary(report: dict, rng: random.Random) -> dict:
    """The report with a few fields changed as real servers' differ (kept valid, mostly)."""
    r = copy.deepcopy(report)
    for _ in range(rng.randint(0, 4)):
        what = rng.randrange(16)
        targets, devices = r["targets"], r["devices"]
        target = rng.choice(targets) if targets else None
        if what == 0 and target:
            target["gpu"]["sm"] = _odd(rng)
        elif what == 1 and target:
            target["gpu"]["memory_mb"] = rng.choice([None, 0, 512, 20480, 90000])
        elif what == 2 and target:
            if rng.random() < 0.5 or not isinstance(target.get("cpu"), dict):
                target.pop("cpu", None)
            else:
                target["cpu"].pop("cores", None)
        elif what == 3 and target and isinstance(target.get("cpu"), dict):
            cpu = target["cpu"]
            key = rng.choice(["cores", "iowait", "read_mb_s", "top_thread"])
            cpu[key] = _odd(rng) if key != "read_mb_s" else rng.choice([None, 0.0, 3.5, 900.0])
        elif what == 4 and target:
            target["execution_state"] = rng.choice(["busy", "idle", "starting", None])
        elif what == 5 and target:
            target["gpu"]["holds_context"] = not target["gpu"]["holds_context"]
            if target["gpu"]["holds_context"] and devices:
                target["gpu"]["devices"] = [devices[0]["uuid"]]
        elif what == 6 and devices:
            rng.choice(devices)["shared"] = rng.random() < 0.5
        elif what == 7 and devices:
            rng.choice(devices)["memory_activity"] = _odd(rng)
        elif what == 8 and devices:
            rng.choice(devices)["activity"] = _odd(rng)
        elif what == 9:
            r["backend"] = rng.choice(["unavailable", "none", "simulated", "nvml"])
        elif what == 10:
            r["server"]["gpu_allocated"] = rng.random() < 0.5
        elif what == 11:
            r["server"]["last_activity"] = rng.choice(
                [None, r["sampled_at"], "2026-01-01T00:00:00Z", "2026-01-01T00:00:00+01:00"]
            )
        elif what == 12 and targets:
            del targets[rng.randrange(len(targets))]
        elif what == 13 and target:
            target["kind"] = rng.choice(["kernel", "terminal", "other"])
        elif what == 14 and devices:
            d = rng.choice(devices)
            d["memory_total_mb"] = rng.choice([None, 0, 40192, 81559])
            d["memory_used_mb"] = rng.choice([None, 0, 1024, 81559])
        elif what == 15 and devices:
            rng.choice(devices)["name"] = rng.choice(["NVIDIA L4", "NVIDIA A100 MIG 1g.5gb", ""])
    return r


def _evidence(report: dict, rng: random.Random) -> list[GpuEvidence]:
    """DCGM's word on the report's GPUs, for some servers: some of it unknown."""
    return [
        GpuEvidence(
            uuid=d["uuid"],
            hostname=rng.choice(["node-a", "node-b", None]),
            sm_active=_odd(rng),
            gr_active=_odd(rng),
            dram_active=_odd(rng),
            tensor_active=_odd(rng),
            pcie_bytes_per_s=rng.choice([None, 0.0, 2.5e9, 1e6]),
        )
        for d in report["devices"]
    ]


def _streams() -> dict[str, dict]:
    return {
        "fleet-moving": dict(idle=False, vary=False, dcgm=False),
        "fleet-idle-repeat": dict(idle=True, vary=False, dcgm=False),
        "varied": dict(idle=False, vary=True, dcgm=False),
        "varied-dcgm": dict(idle=True, vary=True, dcgm=True),
        "varied-site-zombie-time": dict(
            idle=False, vary=True, dcgm=False, zombie_idle=timedelta(minutes=3)
        ),
        # the Hub's records name the node (or not), and some reports are not believed
        "varied-dcgm-trusted-node": dict(idle=True, vary=True, dcgm=True, trusted=True),
    }


def answers(name: str) -> tuple[str, dict]:
    """The stream's answers as canonical JSON text's sha256, and its labels counted."""
    how = _streams()[name]
    rng = random.Random(name)
    service = DiagnosisService(
        DiagnosisOptions(sample_every=timedelta(seconds=90), zombie_idle=how.get("zombie_idle"))
    )
    users = [f"user{i}" for i in range(SERVERS)]
    out, labels = hashlib.sha256(), {}
    idle_as_of = START if how["idle"] else None
    for k in range(ROUNDS):
        now = START + timedelta(minutes=k + 1)
        if k == ROUNDS // 2:  # a model trained from the history, as the worker does
            service.model = service._fit(unpack(service.history.snapshot()))
        for i, user in enumerate(users):
            report = report_for(user, i, now, idle_as_of)
            if how["vary"]:
                report = _vary(report, rng)
                if rng.random() < 0.05:
                    report["sampled_at"] = clock.isoformat(now - timedelta(seconds=60))
            try:
                report = validate(report, now + timedelta(minutes=1))
            except ReportError as error:
                out.update(f"invalid {error}\n".encode())
                continue
            evidence = _evidence(report, rng) if how["dcgm"] and rng.random() < 0.5 else ()
            key = f"{user}/"
            trusted = {}
            if how.get("trusted"):
                trusted = dict(
                    node=rng.choice([None, "node-a", "profile a100"]), believed=rng.random() < 0.8
                )
            scored = service.observe(
                key,
                report,
                evidence,
                now + timedelta(seconds=rng.random() * 30),
                team=rng.choice(["vision", "nlp", None]),
                gpus=rng.choice([1.0, 0.5, None]),
                learn=rng.random() < 0.9,
                **trusted,
            )
            row = None
            if scored is not None:
                labels[scored.label] = labels.get(scored.label, 0) + 1
                row = [scored.label, scored.node, scored.server, scored.at.isoformat()]
                row.append(service.root_cause(key))
            out.update(_canonical([key, row]))
            if rng.random() < 0.02:
                service.forget(key)
    since = START.date() - timedelta(days=2)
    model = service.model
    kept = {
        "costs": service.costs.report(since),
        "history": _as_recorded(service.history.snapshot()),
        "nodes": sorted([repr(k), _plain(v)] for k, v in model.nodes.items()),
        "tasks": sorted([repr(k), _plain(v)] for k, v in model.tasks.items()),
        "trained_on": model.trained_on,
        "recent": {k: list(s.recent or ()) for k, s in sorted(service._servers.items())},
    }
    out.update(_canonical(kept))
    return out.hexdigest(), dict(sorted(labels.items()))


def _as_recorded(snapshot) -> list:
    """The history as it was packed when these answers were recorded, whatever its packing
    now: each server's windows as one list (when added, then every number, ``nan`` where
    missing, ``kernel_busy`` 1.0 or 0.0), and their labels."""
    out = []
    for packed in snapshot:
        numbers, labels_ = [], []
        for added, window in stamped([packed]):
            numbers.append(added)
            for column in COLUMNS[2:]:
                value = getattr(window, column)
                numbers.append(math.nan if value is None else float(value))
            labels_.append((window.node, window.server))
        out.append([numbers, labels_])
    return out


def _plain(obj):
    """An object's state as JSON's values (the model's references are objects with slots)."""
    if isinstance(obj, dict):
        return {repr(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, set | frozenset):
        return sorted(map(repr, obj))
    if hasattr(obj, "__dict__"):
        return {"__dict__": _plain(vars(obj))}
    if hasattr(obj, "__slots__"):
        return {name: _plain(getattr(obj, name)) for name in obj.__slots__}
    return obj


def _canonical(value) -> bytes:
    # repr of every float (json's), -0.0 and nan included: equal answers, equal bytes.
    return (json.dumps(value, sort_keys=True, default=repr) + "\n").encode()


@pytest.mark.parametrize("name", sorted(_streams()))
def test_the_diagnosis_answers_every_recorded_stream_as_before(name):
    recorded = json.loads(RECORDED.read_text())[name]
    digest, labels = answers(name)
    assert labels == recorded["labels"]  # what the stream covers, readable
    assert digest == recorded["sha256"], f"stream {name}: an answer or what is kept changed"


def test_the_streams_reach_every_path_worth_checking():
    """The streams are worth their hashes: causes named, not only healthy servers."""
    recorded = json.loads(RECORDED.read_text())
    seen = {label for stream in recorded.values() for label in stream["labels"]}
    assert {"healthy", "zombie", "uncertain"} <= seen
    assert len(seen) >= 5


if __name__ == "__main__" and "--record" in sys.argv:
    table = {}
    for stream in sorted(_streams()):
        digest, labels = answers(stream)
        table[stream] = {"sha256": digest, "labels": labels}
    RECORDED.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(json.dumps(table, indent=1))
