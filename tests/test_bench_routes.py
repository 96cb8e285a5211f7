"""``benchmarks.routes`` runs and prints a line per route, each answered 200
(docs/benchmarks-history.md, "Routes at 10,000 servers (wave 27)")."""

import pytest

from benchmarks import routes

pytestmark = pytest.mark.timeout(300)


def test_the_routes_benchmark_prints_every_route_answered(capsys):
    routes.main(["--servers", "30", "--calls", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("routes:")]
    assert len(lines) == len(routes.routes(["someone"])), lines
    assert all("status=200 " in line and "hold_ms=" in line for line in lines), lines
