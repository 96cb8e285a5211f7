"""The report and the verdict have one definition (core/wire.py): the JSON Schema, the
labextension's wire types and the docs' field tables are generated from it and fail here when
they drift; reports and verdicts as the parts send them match it."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import jsonschema
import pytest
from test_report import REPORT

from jupyter_gpu_gov.core import policy
from jupyter_gpu_gov.core.clock import parse
from jupyter_gpu_gov.core.report import ReportError
from jupyter_gpu_gov.core.wire import Report, Verdict
from jupyter_gpu_gov.events import wire as generated

ROOT = Path(__file__).parents[1]
NOW = parse("2026-01-05T09:00:10Z")
REGENERATE = "run `python -m jupyter_gpu_gov.events.wire` and commit what it writes"


def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = generated.json_schema()
    return jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{name}"})


def test_the_schema_file_is_generated_from_the_dataclasses():
    assert generated.WIRE_SCHEMA.read_text() == generated.schema_text(), REGENERATE
    jsonschema.Draft202012Validator.check_schema(generated.json_schema())


def test_the_docs_field_tables_are_generated_from_the_dataclasses():
    doc = generated.API_DOC.read_text(encoding="utf-8")
    assert generated.with_tables(doc) == doc, REGENERATE
    assert "| `targets[].gpu.sm` |" in doc and "| `requests` |" in doc


def test_the_typescript_wire_types_are_generated_from_the_schema():
    script = ROOT / "labextension" / "scripts" / "wire-types.js"
    made = subprocess.run(
        ["node", str(script), "--print"], capture_output=True, text=True, check=True
    ).stdout
    assert (ROOT / "labextension" / "src" / "wire.ts").read_text() == made, REGENERATE


def test_a_report_is_the_schema_and_comes_back_whole():
    _validator("Report").validate(REPORT)
    report = Report.from_json(REPORT, NOW)
    assert report.targets[0].gpu.sm == 0.0 and report.devices[0].uuid == "GPU-a"
    assert Report.from_json(report.to_json(), NOW) == report
    with pytest.raises(AttributeError):
        report.backend = "none"  # frozen: one report, read by many


def test_an_older_servers_cpu_section_is_read_as_unknown():
    old = copy.deepcopy(REPORT)
    old["targets"][0]["cpu"] = {"percent": 250.0, "iowait": 35.0}
    assert Report.from_json(old, NOW).targets[0].cpu is None
    new = copy.deepcopy(REPORT)
    new["targets"][0]["cpu"] = {"cores": 1.0, "iowait": 0.2, "read_mb_s": 0, "seconds": 60}
    assert Report.from_json(new, NOW).targets[0].cpu.cores == 1.0


def test_from_json_is_the_validator_and_names_the_bad_field():
    bad = copy.deepcopy(REPORT)
    bad["targets"][0]["gpu"]["sm"] = 2
    with pytest.raises(ReportError, match=r"targets\[0\]\.gpu\.sm: must be in \[0, 1\], got 2"):
        Report.from_json(bad, NOW)
    # The schema says the same.
    assert not _validator("Report").is_valid(bad)


def test_the_verdict_is_the_schema_and_has_no_field_that_is_always_null():
    decision = policy.Decision(policy.Record(state="idle", reason="GPU idle"))
    made = policy.verdict(decision, policy.Policy(name="default"))
    assert isinstance(made, Verdict)
    sent = made.to_json()
    _validator("Verdict").validate(sent)
    assert list(sent) == list(generated.json_schema()["$defs"]["Verdict"]["properties"])
    assert "max_age_at" not in sent and sent["requests"] == {}
    assert Verdict.from_json(sent) == made
