"""benchmarks.admission times admission against the servers it builds: a smoke test that it
counts them (it once wrote grants where the count no longer reads them and timed an empty hub)."""

from benchmarks import admission


def test_the_admission_benchmark_counts_the_servers_it_builds():
    figures = admission.run(servers=50, teams=3, repeat=1)
    assert figures["servers"] == 50, figures
    assert figures["tiers"] >= 2 and figures["count_ms"] > 0
