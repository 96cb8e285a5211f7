"""jupyter_events schemas, one YAML per event and version."""

from pathlib import Path

SCHEMA_DIR = Path(__file__).parent

GPU_STATE_SCHEMA_ID = "https://events.jupyter-gpu-gov.org/server/gpu-state"
GPU_STATE_SCHEMA = SCHEMA_DIR / "gpu-state.v1.yaml"

VERDICT_SCHEMA_ID = "https://events.jupyter-gpu-gov.org/server/verdict"
VERDICT_SCHEMA = SCHEMA_DIR / "verdict.v1.yaml"
