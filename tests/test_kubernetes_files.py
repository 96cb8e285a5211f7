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
