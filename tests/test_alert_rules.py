"""The shipped Prometheus alert rules (hub_config/prometheus/gpu-gov-alerts.yaml): they parse,
are well formed, and select the series the governor exports for a failed GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from jupyter_gpu_gov.core import health
from jupyter_gpu_gov.hub import metrics

RULES = Path(__file__).resolve().parent.parent / "hub_config" / "prometheus" / "gpu-gov-alerts.yaml"
# dcgm-exporter fields the rules read that the governor does not (etc/default-counters.csv)
DCGM_FIELDS = {"DCGM_FI_DEV_THERMAL_VIOLATION"}
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*=\s*"([^"]*)"')


def rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def governor_series() -> dict[str, set[str]]:
    """The governor's metric names and the labels of each."""
    return {
        metric.name: set(getattr(collector, "_labelnames", ()))
        for collector in metrics.REGISTRY._collector_to_names
        for metric in collector.describe()
    }


def test_the_rules_are_well_formed():
    found = rules()
    assert len({r["alert"] for r in found}) == len(found) >= 5
    for rule in found:
        assert re.fullmatch(r"[A-Z][A-Za-z]+", rule["alert"]), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")


def test_every_series_a_rule_reads_exists_with_those_labels():
    ours = governor_series()
    for rule in rules():
        expr = rule["expr"]
        names = [
            m for m in SELECTOR.finditer(expr) if m[1].startswith(("jupyter_gpu_gov_", "DCGM_"))
        ]
        assert names, rule["alert"]
        for match in names:
            name, selector = match[1], match[2] or ""
            if name.startswith("DCGM_"):
                assert name in DCGM_FIELDS, name
                continue
            assert name in ours, f"{rule['alert']}: the governor exports no {name}"
            grouped = re.findall(r"by \(([^)]*)\)", expr)
            used = {k for k, _ in MATCHER.findall(selector)}
            used |= {label.strip() for group in grouped for label in group.split(",")}
            assert used <= ours[name], f"{rule['alert']}: {used - ours[name]} not on {name}"
            for key, value in MATCHER.findall(selector):
                allowed = {
                    "status": health.STATUSES,
                    "action": health.ACTIONS,
                    "source": ("dcgm", "report"),
                }[key]
                assert value in allowed, (rule["alert"], key, value)


@pytest.mark.parametrize(
    ("reading", "alert"),
    [
        (health.Reading(xids=(79,)), "GpuGovGpuFailed"),
        (health.Reading(remapped_rows_pending=True), "GpuGovGpuNeedsDrain"),
    ],
)
def test_the_rule_selects_what_the_governor_exports_for_that_gpu(reading, alert):
    checked = health.assess(reading)
    metrics.observe_gpu_health([("gpu-node-7", "0", "GPU-a", checked, "dcgm")], 0)
    try:
        (rule,) = [r for r in rules() if r["alert"] == alert]
        wanted = dict(MATCHER.findall(re.search(r"\{[^}]*\}", rule["expr"])[0]))
        samples = metrics.GPU_UNHEALTHY.collect()[0].samples
        matching = [s for s in samples if wanted.items() <= s.labels.items() and s.value > 0]
        assert [s.labels["uuid"] for s in matching] == ["GPU-a"]
        others = [r for r in rules() if r["alert"].startswith("GpuGovGpu") and r["alert"] != alert]
        for other in others:  # and no other GPU rule fires for it
            theirs = dict(MATCHER.findall(re.search(r"\{[^}]*\}", other["expr"])[0]))
            assert not [s for s in samples if theirs.items() <= s.labels.items()], other["alert"]
    finally:
        metrics.observe_gpu_health([], 0)


def test_health_md_lists_every_rule_with_its_severity():
    """docs/health.md's table of the shipped alerts is the file's: an admin loading it reads
    there what each alert means and how loud it is (the lease's alert was missing)."""
    doc = (RULES.parents[2] / "docs" / "health.md").read_text()
    table = dict(re.findall(r"^\| `(\w+)` \| [^|]* \| (\w+) \|$", doc, re.M))
    assert table == {r["alert"]: r["labels"]["severity"] for r in rules()}
