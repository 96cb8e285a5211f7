# Single-user server settings for the demo hub (hub_config/jupyterhub_config.py points
# $JUPYTER_CONFIG_PATH at this folder). The backend itself is chosen by the spawner through
# $JUPYTER_GPU_GOV_BACKEND=simulated, which overrides c.GpuGovApp.backend.
import json
from pathlib import Path

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

# Two whole H100s and one H100 split into MIG slices, like a small shared workstation; the hub's
# allocator reads the same list (hub_config/demo_gpus.json), so both agree on the UUIDs.
c.GpuGovApp.simulated_devices = json.loads(
    (Path(__file__).parent.parent / "demo_gpus.json").read_text()
)
c.GpuGovApp.sample_interval = 2  # seconds
c.GpuGovApp.report_interval = 5  # seconds; the governor URL comes from $JUPYTER_GPU_GOV_URL
