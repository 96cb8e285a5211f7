"""``benchmarks.cluster_read`` runs and prints its figures (docs/benchmarks.md)."""

from benchmarks import cluster_read


def test_the_cluster_read_benchmark_prints_its_figures(capsys):
    argv = ["--nodes", "10", "--pods", "60", "--gpu-pods", "30", "--repeat", "1", "--page", "25"]
    cluster_read.main(argv)
    out = capsys.readouterr().out
    assert "nodes=10 pods=60 gpu_pods=30" in out and "page=25 requests=3" in out
    for figure in ("read_ms", "first_room_ms", "held_ms", "idle_held_ms", "capacity_ms"):
        assert f"  {figure}: " in out
    for figure in ("peak_mb", "kept_mb"):
        assert f"  {figure}: " in out
