import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture(autouse=True)
def _isolated_sim_state(tmp_path, monkeypatch):
    """Every test gets its own simulated-GPU state file, never the user's runtime dir."""
    monkeypatch.setenv("JUPYTER_GPU_GOV_SIM_STATE", str(tmp_path / "sim-gpus.json"))
