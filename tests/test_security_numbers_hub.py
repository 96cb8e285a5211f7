"""What a user's report carries into what admins read, on a real hub with the governor
(review 15): a report is the user's to write. Each attack worked before the fix.

mallory  her server sends no report of its own (silent); she posts reports holding 10^308 MiB
         of GPU memory at 5 % SM on her H100 (right-sizing measures it) and two kernels of
         1e308 MiB each (their sum is infinite); reports naming bob's pod as hers; reports
         claiming 64 failed GPUs (the shipped alert rules would page the on-call admin); and
         reports naming her card as she likes (the diagnosis's cost ledger filed her GPU time
         under that name, as a node)
bob      her neighbour, whose server the admin lists beside hers
govadmin lists every server, as JSON and on the dashboard, and reads the metrics
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
import yaml
from governor_harness import Gov, governed_hub, start_all, wait
from hub_harness import HubHarness

from jupyter_gpu_gov.cli import cluster_text
from jupyter_gpu_gov.core import health

pytestmark = pytest.mark.timeout(300)

TIERS = [
    {"name": "h100", "display_name": "H100 80 GB", "gpu": "H100-80GB"},
    {"name": "h100-1g", "display_name": "Small H100 slice", "gpu": "H100-80GB", "mig": "1g.10gb"},
]
GOVERNOR = f"""
from jupyter_gpu_gov.profiles.estimate import tier_sizes
c.GpuGovernor.right_size_tiers = tier_sizes({TIERS!r})
c.GpuGovernor.right_size_after = 1  # seconds of reports (real hubs: an hour)
"""
PATIENT = {"name": "unhurried", "match": {"users": ["mallory", "bob"]}, "warn_after": "10m"}
PATIENT["cull_after"] = "20m"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    harness = governed_hub(
        tmp_path_factory.mktemp("numbers"),
        silent_users=("mallory",),
        extra_policies=[PATIENT],
        governor_config=GOVERNOR,
    )
    with harness as hub:
        hub.create_user("govadmin")
        # Without the profile layer the tier is the spawn's ``profile`` (docs/security.md).
        start_all(hub, {"mallory": {"profile": "h100"}, "bob": None})
        Gov(hub).wait_up()
        yield hub


@pytest.fixture(scope="module")
def gov(hub):
    return Gov(hub)


def report_holding(hub: HubHarness, user: str, *memory_mb) -> dict:
    """The user's own server's report (its status page), its kernels holding ``memory_mb``
    each, at 5 % SM."""
    r = hub.get(hub.user_url(user, "jupyter-gpu-gov/status"), token=hub.token(user))
    assert r.status_code == 200, r.text
    report = r.json()
    report.pop("verdict", None)
    device = report["devices"][0]["uuid"]
    report["targets"] = [
        {
            "kind": "kernel",
            "id": str(uuid.uuid4()),
            "name": "python3",
            "execution_state": "idle",
            "connections": 1,
            "gpu": {
                "devices": [device],
                "memory_mb": memory,
                "sm": 0.05,
                "holds_context": True,
                "confidence": "exact",
            },
        }
        for memory in memory_mb
    ]
    report["window"].update(gpu_active_fraction=0.05, gpu_idle_since=None)
    return report


def strict_json(text: str):
    """JSON as a browser's ``JSON.parse`` reads it: no ``Infinity`` or ``NaN``."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def admin_listing(hub: HubHarness, gov: Gov) -> list[dict]:
    r = gov.admin("GET", "servers")
    assert r.status_code == 200, r.text[:500]
    return strict_json(r.text)["servers"]


def test_an_unbounded_memory_figure_is_refused_and_every_page_still_lists(hub, gov):
    mallory = hub.token("mallory")
    # 10^308 MiB as an integer (JSON's digits: it passes as a finite float): right-sizing
    # multiplied it by a float, which raised, and the admin's listing and dashboard answered
    # 500 for everyone's servers. Two kernels of 1e308 MiB: their sum was infinite, and the
    # listing said "memory_mb": Infinity, which no browser's JSON.parse reads.
    for memory in ([10**308], [1e308, 1e308]):
        answers = []
        for _ in range(3):  # over ``right_size_after``, so a peak would be measured
            report = report_holding(hub, "mallory", *memory)
            answers.append(gov.call("POST", "reports", mallory, json=report))
            time.sleep(0.6)
        listed = {s["user"]: s for s in admin_listing(hub, gov)}
        assert {"mallory", "bob"} <= listed.keys(), listed
        page = hub.login("govadmin").get(f"{hub.url}/services/gpu-gov/", timeout=30)
        assert page.status_code == 200, page.text[:500]
        for r in answers:
            assert r.status_code == 400, r.text[:500]
            assert "targets[0].gpu.memory_mb" in r.json()["message"], r.text[:500]

    # An honest figure is taken, and right-sized: 4 GiB on a whole H100 fits a slice.
    def hinted():
        r = gov.call("POST", "reports", mallory, json=report_holding(hub, "mallory", 4096))
        assert r.status_code == 200, r.text[:500]
        return strict_json(r.text)["verdict"]["right_size"]

    assert wait(hinted, 60, "a right-sizing hint for 4 GiB")["tier"] == "h100-1g"
    listed = {s["user"]: s for s in admin_listing(hub, gov)}
    assert listed["mallory"]["gpu"]["memory_mb"] == 4096, listed["mallory"]


def server_series(hub: HubHarness, name: str = "jupyter_gpu_gov_server_gpu_equivalents") -> list:
    """The labels of the governor's series ``name``, as Prometheus reads them."""
    from prometheus_client.parser import text_string_to_metric_families

    r = hub.get(f"{hub.url.rstrip('/')}/services/gpu-gov/metrics", token=hub.token("govadmin"))
    assert r.status_code == 200, r.text[:500]
    return [
        s.labels
        for family in text_string_to_metric_families(r.text)
        if family.name == name
        for s in family.samples
    ]


def test_a_report_naming_anothers_pod_is_not_the_metrics_pod(hub, gov):
    """PromQL joins DCGM's series with the per-server series on (namespace, pod)
    (docs/grafana.md): mallory's series named bob's pod, so bob's GPU read as hers, and two
    series of one pod broke the join for every server. The pod is the Hub's records' (none
    here: a local spawner), never a report's."""
    mallory = hub.token("mallory")
    report = report_holding(hub, "mallory", 2048)
    report["server"].update(pod="jupyter-bob", namespace="jhub")
    r = gov.call("POST", "reports", mallory, json=report)
    assert r.status_code == 200, r.text[:500]
    passes = gov.passes()
    wait(lambda: gov.passes() >= passes + 2, 90, "two passes over mallory's report")
    series = {s["user"]: s for s in server_series(hub)}
    assert "mallory" in series, series
    assert (series["mallory"]["namespace"], series["mallory"]["pod"]) == ("", ""), series


def test_a_server_started_in_year_one_is_a_400_naming_it(hub, gov):
    """The time a report says its server started bounds its others (5 minutes before it): in
    year 1 that bound raised past every handler, a 500 and a traceback in the log for each
    report."""
    report = report_holding(hub, "mallory", 2048)
    report["server"]["started"] = "0001-01-01T00:00:00Z"
    r = gov.call("POST", "reports", hub.token("mallory"), json=report)
    assert r.status_code == 400, r.text[:500]
    assert "server.started" in r.json()["message"], r.text[:500]


RULES = Path(__file__).resolve().parent.parent / "hub_config" / "prometheus" / "gpu-gov-alerts.yaml"
LOST = health.assess(health.Reading(xids=(79,), lost="simulated")).as_dict()


def alerted(series: list[dict]) -> dict[str, int]:
    """How many of ``series`` (``jupyter_gpu_gov_gpu_unhealthy``'s labels) each shipped rule on
    that metric selects (its label matchers: each rule compares the series' value, 1, > 0)."""
    found = {}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            selector = re.search(r"jupyter_gpu_gov_gpu_unhealthy\{([^}]*)\}", rule["expr"])
            if selector:
                wanted = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', selector[1]))
                found[rule["alert"]] = sum(wanted.items() <= s.items() for s in series)
    return found


def test_a_servers_own_claim_of_64_failed_gpus_pages_nobody(hub, gov):
    """mallory's server has no records behind it (a local spawner): her report named 64 GPUs
    that fell off the bus, each a jupyter_gpu_gov_gpu_unhealthy series that GpuGovGpuFailed
    (critical, after a minute) selected: she could page the on-call admin at will. Her claim
    is shown as her server's own word, and no shipped rule selects it."""
    mallory = hub.token("mallory")
    report = report_holding(hub, "mallory", 2048)
    card = report["devices"][0]
    report["devices"] = [
        {**card, "uuid": f"GPU-{i:08d}-0000-4000-8000-{i:012d}", "health": LOST} for i in range(64)
    ]
    report["targets"] = []
    try:
        r = gov.call("POST", "reports", mallory, json=report)
        assert r.status_code == 200, r.text[:500]

        def claimed():
            listed = gov.admin("GET", "health").json()["gpus"]
            return len(listed) == 64 and listed

        listed = wait(claimed, 90, "mallory's 64 claims listed")
        assert {(g["source"], g["server"]) for g in listed} == {("report", "mallory/")}
        series = wait(
            lambda: len(s := server_series(hub, "jupyter_gpu_gov_gpu_unhealthy")) == 64 and s,
            90,
            "the 64 claims in the metric",
        )
        assert {s["source"] for s in series} == {"report"}
        rules = alerted(series)
        assert {"GpuGovGpuFailed", "GpuGovGpuNeedsDrain"} <= rules.keys(), rules
        assert set(rules.values()) == {0}, rules
        # What DCGM would say of one of those cards is still selected.
        dcgm = {**series[0], "source": "dcgm"}
        assert alerted([dcgm])["GpuGovGpuFailed"] == 1
    finally:  # her card is fine again: the claims go with the report
        r = gov.call("POST", "reports", mallory, json=report_holding(hub, "mallory", 2048))
        assert r.status_code == 200, r.text[:500]
        wait(lambda: gov.admin("GET", "health").json()["gpus"] == [], 90, "the claims gone")


def test_a_server_no_record_places_books_its_time_unplaced_not_under_its_cards_name(hub, gov):
    """The diagnosis's cost ledger (api/diagnosis's cost.nodes, `diagnose --cluster`'s "by
    node") filed mallory's GPU time under the card her first report of the session named:
    a node of her choosing (one a session). Nothing she cannot write places her server, so it
    goes under "(unplaced)", which the cluster report says."""
    mallory = hub.token("mallory")
    name = "mallory-was-here"

    def named() -> dict:
        report = report_holding(hub, "mallory", 2048)
        for device in report["devices"]:
            device["name"] = name
        return report

    def booked():
        r = gov.call("POST", "reports", mallory, json=named())
        assert r.status_code == 200, r.text[:500]
        time.sleep(1)  # booked: the time since her previous report
        answer = gov.admin("GET", "diagnosis").json()
        return answer["cost"]["nodes"] and answer

    answer = wait(booked, 90, "mallory's GPU time in the cost ledger")
    nodes = answer["cost"]["nodes"]
    assert list(nodes) == ["(unplaced)"], nodes
    text = cluster_text(answer)
    assert name not in text
    assert "(unplaced): servers no Hub record or DCGM reading places on a node" in text
    page = hub.login("govadmin").get(f"{hub.url}/services/gpu-gov/", timeout=30)
    assert page.status_code == 200, page.text[:500]
    by_node = page.text.split('id="causes-by-node"', 1)[1].split("</details>", 1)[0]
    assert "<td>(unplaced)</td>" in by_node and "NVIDIA" not in by_node, by_node
    assert "servers no Hub record or DCGM reading places on a node" in by_node
