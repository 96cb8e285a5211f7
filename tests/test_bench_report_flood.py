"""``benchmarks.report_flood`` runs and prints both runs' figures (docs/benchmarks-history.md)."""

from benchmarks import report_flood


def test_the_report_flood_benchmark_prints_its_figures(capsys):
    report_flood.main(["--reports", "70", "--targets", "20"])
    out = capsys.readouterr().out
    assert "no budget: 70 reports" in out and "answers {200: 70}" in out, out
    assert "default budget: 70 reports" in out and "429:" in out, out
