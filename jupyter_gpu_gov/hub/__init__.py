"""Hub side: the governor, a JupyterHub managed service (docs/architecture.md, "The parts")."""
