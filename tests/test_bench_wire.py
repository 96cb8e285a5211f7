"""``benchmarks/wire.py`` still runs and measures what docs/benchmarks.md says it measures: the
ingest benchmark's reports validated as dicts, converted to the typed report, and sent back."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's benchmarks/

from benchmarks import wire


def test_the_typed_report_benchmark_prints_its_three_figures(capsys):
    wire.main(["--reports=20", "--repeat=1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "typed report, 20 reports, median of 1:"
    figures = {
        line.rsplit(None, 1)[0].strip(): float(line.rsplit(None, 1)[1]) for line in lines[1:]
    }
    assert set(figures) == {
        "validate (dict), µs",
        "Report.from_json (typed), µs",
        "Report.to_json, µs",
    }
    assert all(value > 0 for value in figures.values())
