# Single-user server settings for the demo hub (hub_config/jupyterhub_config.py points
# $JUPYTER_CONFIG_PATH at this folder). The backend itself is chosen by the spawner through
# $JUPYTER_GPU_GOV_BACKEND=simulated, which overrides c.GpuGovApp.backend.
c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

# One whole H100 and one H100 split into MIG slices, like a small shared workstation.
c.GpuGovApp.simulated_devices = [
    {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559},
    {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mb": 81559,
        "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    },
]
c.GpuGovApp.sample_interval = 2  # seconds
c.GpuGovApp.report_interval = 5  # seconds; the governor URL comes from $JUPYTER_GPU_GOV_URL
