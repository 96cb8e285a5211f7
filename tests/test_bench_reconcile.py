"""Smoke test of ``benchmarks/reconcile.py``: a small fleet, both passes see every server."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's benchmarks/

from benchmarks import reconcile


def test_reconcile_benchmark_runs_both_passes_over_every_server():
    figures = reconcile.run(servers=50, passes=1)
    assert figures["governor_seen"] == 50
    assert figures["first_pass_seen"] == 50
    assert figures["idle_culler_seen"] == 50
    for name in ("governor_s_median", "idle_culler_s_median", "ratio", "first_pass_s", "rss_mb"):
        assert figures[name] > 0, name
    assert figures["db_mb"] > 0 and figures["dcgm_s"] > 0 and figures["decide_s"] > 0
    # Reports and DCGM series matched the Hub's servers: nothing is left unknown.
    assert "unknown" not in figures["states"] and "idle" in figures["states"]
    assert figures["first_pass_rows_written"] >= 50
    # A day later every server holding a GPU opens a ledger bucket for the new day.
    assert 0 < figures["ledger_rows_per_day"] <= 50 * 2
