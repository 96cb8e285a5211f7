"""Smoke test of ``benchmarks/memory_ledger.py``: the figure it prints is what the store keeps
of the ledger's rows day after day, and that stays level once a day's keys are dropped."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's benchmarks/

from benchmarks import memory_ledger


def test_what_the_store_keeps_of_the_ledger_levels_after_two_days():
    days = memory_ledger.run(servers=40, days=5, writes=2)
    assert [d["day"] for d in days] == [1, 2, 3, 4, 5]
    kept = [d["kept_mb"] for d in days]
    assert 0 < kept[0] <= kept[1]
    assert kept[2:] == [kept[1]] * 3  # the newest two days' keys and the open sessions, no more
    assert all(d["write_s"] > 0 for d in days)
