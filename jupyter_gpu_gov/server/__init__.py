"""The jupyter-server extension: sampler, routes, metrics (docs/architecture.md, "The parts")."""
