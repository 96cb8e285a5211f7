"""``benchmarks.queue_line`` runs and prints its three figures (docs/benchmarks.md), and the
cluster's room at the queue sync with ``--room``; ``python -m benchmarks`` runs both."""

import benchmarks.__main__ as bench
from benchmarks import queue_line


def test_the_queue_line_benchmark_prints_its_figures(capsys):
    queue_line.main(["--held", "6", "--waiting", "12", "--repeat", "1"])
    printed = capsys.readouterr().out
    assert "held=6 waiting=12" in printed
    for figure in ("sync_s", "waiting_users_page_s", "spawn_form_offer_s"):
        value = float(printed.split(f"{figure}: ")[1].split()[0])
        assert 0 < value < 5, (figure, printed)


def test_the_room_benchmark_prints_its_figures(capsys):
    queue_line.main(["--room", "--servers", "40", "--nodes", "8", "--waiting", "6"])
    printed = capsys.readouterr().out
    assert "room: servers=40 nodes=8 waiting=6" in printed
    for figure in ("hub_new_reading_ms", "answer_bytes", "governor_placement_ms"):
        assert f"  {figure}: " in printed, printed


def test_python_m_benchmarks_runs_the_line_and_the_room_in_both_sets(monkeypatch):
    """``python -m benchmarks`` (``make bench``) and ``--full`` never ran ``queue_line``: the
    line's cost and the room's at the queue sync, figures docs/benchmarks.md reports, were
    measured by hand only, and a regression went unseen by the benchmark run."""
    ran = []
    for module, _ in [*bench.QUICK, *bench.FULL]:
        monkeypatch.setattr(module, "main", lambda argv, m=module: ran.append((m, argv)))
    for argv in ([], ["--full"]):
        ran.clear()
        bench.main(argv)
        lines = [args for module, args in ran if module is queue_line]
        assert [a for a in lines if "--room" not in a], argv  # the line
        assert [a for a in lines if "--room" in a], argv  # the room
    # The full set runs the sizes docs/benchmarks.md reports.
    assert ["--held=500", "--waiting=1000"] in lines
    assert ["--room", "--servers=10000", "--nodes=1000", "--waiting=100"] in lines
