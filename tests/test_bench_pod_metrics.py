"""Smoke test of ``benchmarks/pod_metrics.py``: the fake metrics-server's list is one the
governor reads whole (every pod, its CPU), and the benchmark measures a read over HTTP."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's benchmarks/

from benchmarks import pod_metrics
from jupyter_gpu_gov.hub.pod_cpu import pod_readings


def test_the_fake_list_is_read_whole_as_metrics_server_writes_it():
    users = pod_metrics.users_of(30)
    now = datetime(2026, 12, 6, 12, tzinfo=timezone.utc)
    body = pod_metrics.pod_metrics_list(users, "jhub", now)
    document = json.loads(body)
    assert document["kind"] == "PodMetricsList" and b" " not in body[:200]  # compact, as Go's
    item = document["items"][-1]
    assert item["metadata"]["labels"]["component"] == "singleuser-server"
    assert item["containers"][0]["usage"]["memory"].endswith("Ki")
    found = pod_readings(document, "jhub")
    assert len(found) == 30 + len(pod_metrics.CHART_PODS)
    for _, _, pod in users:
        at, cores = found[("jhub", pod)]
        assert at == now and cores == pytest.approx(pod_metrics.cores_of(pod), abs=1e-9)


def test_the_benchmark_reads_the_list_over_http():
    figures = pod_metrics.run(50, passes=2)
    assert figures["items"] == 50 + len(pod_metrics.CHART_PODS)
    assert figures["runs_kept"] == figures["items"]
    assert figures["answer_mb"] > 0 and figures["parse_cpu_ms"] > 0 and figures["held_mb"] > 0
