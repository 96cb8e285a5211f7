"""The jupyter-server extension: sampler, routes, metrics (DESIGN §2)."""
