"""Smoke test of ``benchmarks/reconcile.py``: a small fleet, both passes see every server."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's benchmarks/

from benchmarks import reconcile


def test_the_fake_hubs_servers_are_found_in_dcgm_by_their_pod_as_on_zero_to_jupyterhub():
    """KubeSpawner's state names each server's pod and namespace, which DCGM's labels name too:
    the governor finds every GPU server's GPU by its pod (hub/trusted.py), and no CPU-only one
    has a GPU (before wave 38 the fake's states named no namespace, and a third no pod)."""
    from jupyter_gpu_gov.hub.dcgm import index_by_pod, index_by_uuid, parse_exposition
    from jupyter_gpu_gov.hub.trusted import Granted

    fleet = reconcile.plan(60)
    evidence = parse_exposition(reconcile.exposition([p for p in fleet if p.gpu_uuid], node=0))
    by_uuid, by_pod = index_by_uuid(evidence), index_by_pod(evidence)
    for p in fleet:
        granted = Granted.of(reconcile.kubespawner_state(p))
        assert granted.pod == (reconcile.NAMESPACE, p.pod)
        found = granted.evidence(by_uuid, by_pod)
        assert [e.uuid for e in found] == ([p.gpu_uuid] if p.gpu_uuid else []), p.user


def test_the_fake_exporters_answers_stay_within_the_services_dcgm_bound():
    """One exporter serves every GPU while its answer stays within the service's
    ``dcgm_max_bytes``; past it, shards that each do (at 50,000 servers one answer was ~193 MB,
    which a deployment's 64 MiB default refuses: every GPU unknown)."""
    gpus = [p for p in reconcile.plan(300) if p.gpu_uuid]
    whole = len(reconcile.exposition(gpus, 0).encode())
    assert reconcile.exporter_share(gpus, 10 * whole) == len(gpus)
    bound = whole // 3
    size = reconcile.exporter_share(gpus, bound)
    shards = [gpus[k : k + size] for k in range(0, len(gpus), size)]
    assert 3 <= len(shards) <= 5
    for k, shard in enumerate(shards):
        for scrape in range(3):
            assert len(reconcile.exposition(shard, k, scrape=scrape).encode()) <= bound


def test_reconcile_benchmark_runs_both_passes_over_every_server():
    figures = reconcile.run(servers=50, passes=1)
    assert figures["governor_seen"] == 50
    assert figures["first_pass_seen"] == 50
    assert figures["idle_culler_seen"] == 50
    for name in ("governor_s_median", "idle_culler_s_median", "ratio", "first_pass_s", "rss_mb"):
        assert figures[name] > 0, name
    assert figures["db_mb"] > 0 and figures["dcgm_s"] > 0 and figures["decide_s"] > 0
    # Reports and DCGM series matched the Hub's servers: nothing is left unknown, and idle GPUs
    # were seen as such (the zombies among them warned, checkpointed and culled by the day's end).
    assert "unknown" not in figures["states"]
    assert {"idle", "warned", "checkpointing"} & {
        s.split(":")[0] for s in figures["states"].split(",")
    }
    assert figures["first_pass_rows_written"] >= 50
    # A day later every server holding a GPU opens a ledger bucket for the new day.
    assert 0 < figures["ledger_rows_per_day"] <= 50 * 2
    assert 0 < figures["ledger_mb_per_day"] <= figures["store_mb_per_day"]


def test_reconcile_benchmark_changes_the_share_of_servers_asked_and_prints_the_curve():
    # Three passes of each share: a GPU's change is in its report at once and in DCGM's read
    # (a cycle old) from the next pass, and DCGM's word is final for a server found by its pod.
    # In the first pass after the change the servers whose DCGM still reads them busy change
    # nothing yet (9 of 36 here, wave 38); every pass after it moves every row.
    figures = reconcile.run(servers=40, passes=3, changed=[0.0, 1.0])
    none, every = figures["by_changed"]
    gpu_servers = sum(1 for p in reconcile.plan(40) if p.gpu_uuid)
    assert (none["changed"], none["changed_servers"]) == (0.0, 0)
    assert (every["changed"], every["changed_servers"]) == (1.0, gpu_servers)
    # Every GPU server flipped between active and idle: their rows are written again (median).
    assert every["rows_written"] >= gpu_servers > 0
    assert none["governor_ms_per_changed"] is None and every["governor_ms_per_changed"] > 0
    table = reconcile.curve([{"servers": 40, **share} for share in (none, every)])
    assert "| 40 | 0% (0) |" in table and f"| 40 | 100% ({gpu_servers}) |" in table
    # The culler per server beside the governor's, and whether the ledger's write (one pass in
    # five, the largest part of a mean) fell in the measured passes, with the mean without it.
    for share in (none, every):
        assert share["idle_culler_us_per_server"] > 0
        assert 0 <= share["ledger_passes"] <= share["measured_passes"] == 3
        if share["ledger_passes"] < 3:
            assert share["governor_s_mean_no_ledger"] > 0
    assert every["idle_culler_ms_per_changed"] > 0 and none["idle_culler_ms_per_changed"] is None
    assert f"| {every['ledger_passes']} of 3 |" in table.splitlines()[-1]
    assert figures["governor_rss_mb"] > 0 and figures["hub_list_alone_s"] > 0
