"""``benchmarks/scale.py``'s verdicts on issue 26's targets, from figures it is given."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's benchmarks/

from benchmarks import scale


def row(servers, changed, changed_servers, governor_s, culler_s):
    return {
        "servers": servers,
        "changed": changed,
        "changed_servers": changed_servers,
        "governor_s_mean": governor_s,
        "idle_culler_s_mean": culler_s,
        "ratio": round(governor_s / culler_s, 2),
        "governor_us_per_server": 1e6 * governor_s / servers,
    }


def test_a_pass_that_costs_what_exists_misses_and_says_by_how_much():
    rows = [
        row(1000, 0.01, 8, 0.12, 0.13),
        row(10_000, 0.01, 85, 1.2, 1.3),
        row(10_000, 1.0, 8500, 1.3, 1.3),
    ]
    runs = {
        10_000: {
            "governor_rss_mb": 320.0,
            "ledger_mb_per_day": 1.4,
            "store_mb_per_day": 7.0,
            "ledger_rows_per_day": 1,
        }
    }
    verdicts = dict((t, v) for t, _, v in scale.targets(rows, runs, None, None))
    assert verdicts["pass at 10,000 servers ≤ 0.5 x jupyterhub-idle-culler's"] == (
        "missed by 2.0x (+0.5)"
    )
    assert verdicts["pass cost grows with the servers that changed (10,000 servers)"].startswith(
        "missed"
    )
    assert verdicts["service memory at 10,000 servers < 300 MB"] == "missed by 1.1x (+20 MB)"
    assert verdicts["store < 10 MB a day of ledger (10,000 servers)"] == "met"


def test_a_pass_that_costs_what_changed_meets_the_curve():
    rows = [row(10_000, 0.01, 85, 0.05, 1.3), row(10_000, 1.0, 8500, 2.6, 1.3)]
    verdicts = dict((t, v) for t, _, v in scale.targets(rows, {}, None, None))
    assert verdicts["pass cost grows with the servers that changed (10,000 servers)"] == "met"
    assert verdicts["pass at 10,000 servers ≤ 0.5 x jupyterhub-idle-culler's"].startswith("missed")
