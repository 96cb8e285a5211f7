"""Hub side: the governor, a JupyterHub managed service (DESIGN §2)."""
