"""``benchmarks.queue_line`` runs and prints its three figures (docs/benchmarks.md)."""

from benchmarks import queue_line


def test_the_queue_line_benchmark_prints_its_figures(capsys):
    queue_line.main(["--held", "6", "--waiting", "12", "--repeat", "1"])
    printed = capsys.readouterr().out
    assert "held=6 waiting=12" in printed
    for figure in ("sync_s", "waiting_users_page_s", "spawn_form_offer_s"):
        value = float(printed.split(f"{figure}: ")[1].split()[0])
        assert 0 < value < 5, (figure, printed)
