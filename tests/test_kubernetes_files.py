"""The Kubernetes files an admin applies (hub_config/kubernetes/): valid objects, a Grafana
dashboard ConfigMap in step with the dashboard, panels on metrics that exist."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import tomllib
import yaml
from fake_k8s_api import KUBERNETES_VERSION
from prometheus_client import REGISTRY as SERVER_REGISTRY

from jupyter_gpu_gov.hub import metrics as hub_metrics
from jupyter_gpu_gov.server import metrics as server_metrics  # noqa: F401  (registers them)

REPO = Path(__file__).resolve().parent.parent
KUBERNETES = REPO / "hub_config" / "kubernetes"
sys.path.insert(0, str(KUBERNETES))
import grafana_configmap  # noqa: E402


def test_the_dashboard_configmap_is_the_dashboard_for_grafanas_sidecar():
    assert (
        KUBERNETES / "grafana-dashboard-configmap.yaml"
    ).read_text() == grafana_configmap.render(), (
        "run python hub_config/kubernetes/grafana_configmap.py"
    )
    configmap = yaml.safe_load((KUBERNETES / "grafana-dashboard-configmap.yaml").read_text())
    kubernetes_validate.validate(configmap, KUBERNETES_VERSION, strict=True)
    assert configmap["metadata"]["labels"] == {"grafana_dashboard": "1"}
    (text,) = configmap["data"].values()
    assert json.loads(text) == json.loads(grafana_configmap.DASHBOARD.read_text())


def test_every_governor_metric_on_the_dashboard_exists():
    dashboard = json.loads(grafana_configmap.DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"jupyter_gpu_gov_[a-z_]+", e)}
    known = {
        name
        for registry in (hub_metrics.REGISTRY, SERVER_REGISTRY)
        for family in registry.collect()
        for name in (family.name, f"{family.name}_total", *(s.name for s in family.samples))
    }
    assert used and used <= known, used - known
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for panel in ("culls", "warnings", "extension", "reclaimed", "reconcile", "dcgm"):
        assert panel in titles
    units = {
        p["title"]: p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        for p in dashboard["panels"]
    }
    assert "decmbytes" not in units.values()  # DCGM's framebuffer is in MiB: "mbytes"


@pytest.mark.parametrize("name", ["rbac-nodes.yaml"])
def test_manifests_are_valid_kubernetes_objects(name):
    for document in yaml.safe_load_all((KUBERNETES / name).read_text()):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_servicemonitor_keeps_the_workloads_pod_labels():
    monitors = list(yaml.safe_load_all((KUBERNETES / "dcgm-servicemonitor.yaml").read_text()))
    dcgm = next(m for m in monitors if m["metadata"]["name"] == "nvidia-dcgm-exporter")
    assert all(e["honorLabels"] is True for e in dcgm["spec"]["endpoints"])


def test_the_dockerfiles_install_extras_the_package_has():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for name, wanted in (
        ("Dockerfile.hub", {"hub", "kubespawner"}),
        ("Dockerfile.singleuser", {"server"}),
    ):
        text = (KUBERNETES / name).read_text()
        (asked,) = re.findall(r"\.whl\)\[([a-z,]+)\]", text)
        assert set(asked.split(",")) == wanted <= set(extras)


def test_what_the_dockerfiles_copy_is_in_the_repository():
    """A `docker build` from the repository root finds every file a Dockerfile copies (dist/ is
    what `make dist` writes)."""
    for dockerfile in KUBERNETES.glob("Dockerfile.*"):
        for source in re.findall(
            r"^COPY\s+(?:--\S+\s+)*(\S+)\s+\S+$", dockerfile.read_text(), re.M
        ):
            assert source == "dist/" or (REPO / source).is_file(), (dockerfile.name, source)


def _chart_schema() -> dict:
    return yaml.safe_load((REPO / "tests" / "data" / "z2jh" / "values.schema.yaml").read_text())


def test_the_documented_values_pass_the_charts_schema():
    """helm checks values against the chart's values.schema.json before it renders anything: a
    key the chart does not know, or a value of the wrong type, stops the install. The values of
    docs/kubernetes.md's command (values.yaml over the chart's defaults, the config file set
    with --set-file) pass; without the --set-file, the file's entry has no content and helm
    refuses it."""
    import jsonschema
    import z2jh_harness as z2jh

    validator = jsonschema.Draft7Validator(_chart_schema())
    values = z2jh.load_values(KUBERNETES / "values.yaml")
    unset = [list(e.path) for e in validator.iter_errors(values)]
    assert unset == [["hub", "extraFiles", "gpu-gov"]]
    z2jh.set_file(values, "hub.extraFiles.gpu-gov.stringData", KUBERNETES / "jupyterhub_config.py")
    errors = [
        f"{'.'.join(map(str, e.path))}: {e.message:.200}" for e in validator.iter_errors(values)
    ]
    assert errors == []
    assert values["singleuser"]["profileList"] == [] and values["cull"]["enabled"] is False


def test_every_chart_value_the_documents_name_is_one_the_chart_has():
    """`singleuser.startTimeout`, `hub.networkPolicy.egressAllowRules.privateIPs`...: each chart
    key the documents tell an admin to set is in the chart's schema (a misspelt one stops helm,
    or, under a map that takes any key, is silently ignored)."""
    schema = _chart_schema()
    modules = {p.stem for p in (REPO / "jupyter_gpu_gov" / "hub").glob("*.py")}
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), KUBERNETES / "README.md"]
    named = {
        path
        for doc in docs
        for path in re.findall(
            r"`((?:hub|singleuser|cull|proxy|scheduling)\.[\w.-]+)", doc.read_text()
        )
        if path.split(".")[1] not in modules and not path.startswith("hub.jupyter.org")
    }
    assert "singleuser.startTimeout" in named and "hub.extraFiles.gpu-gov" in named
    missing = []
    for path in sorted(named):
        node = schema
        for part in path.split("."):
            if node == {}:  # under a map that takes anything
                break
            if part in node.get("properties", {}):
                node = node["properties"][part]
            elif node.get("patternProperties"):  # a map of the admin's own names
                node = next(iter(node["patternProperties"].values()))
            elif node.get("additionalProperties") not in (None, False):
                node = {}
            else:
                missing.append(path)
                break
    assert missing == []


def test_the_governors_servicemonitor_reads_the_token_the_values_make():
    """The second ServiceMonitor's token is the one the chart makes for values.yaml's metrics
    service, in the chart's Secret "hub" of the hub's namespace (a ServiceMonitor reads Secrets
    of its own), with a role that reaches the governor and reads its metrics."""
    values = yaml.safe_load((KUBERNETES / "values.yaml").read_text())["hub"]
    monitors = list(yaml.safe_load_all((KUBERNETES / "dcgm-servicemonitor.yaml").read_text()))
    governor = next(m for m in monitors if m["metadata"]["name"] == "jupyter-gpu-gov")
    (endpoint,) = governor["spec"]["endpoints"]
    secret = endpoint["authorization"]["credentials"]
    service = secret["key"].removeprefix("hub.services.").removesuffix(".apiToken")
    assert secret["name"] == "hub" and service in values["services"]
    assert (
        governor["metadata"]["namespace"] == governor["spec"]["namespaceSelector"]["matchNames"][0]
    )
    roles = [r for r in values["loadRoles"].values() if service in r.get("services", [])]
    scopes = {scope for role in roles for scope in role["scopes"]}
    assert {"read:metrics", "access:services!service=gpu-gov"} <= scopes
