"""``python -m jupyter_gpu_gov.hub``: run the governor service. JupyterHub starts it (see
``add_governor`` in ``jupyter_gpu_gov.hub.hubconfig``); started by hand it says what is missing
instead of failing with a traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from .app import main

PROG = "python -m jupyter_gpu_gov.hub"


def startup_problem(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why the service cannot start with these arguments and this environment, in words, or
    None. Help and version always work."""
    if any(arg in ("-h", "--help", "--help-all", "--version") for arg in argv):
        return None
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        else:
            continue
        if not os.path.isfile(path):
            return f"--config {path}: no such file"
    if not env.get("JUPYTERHUB_API_TOKEN"):
        return (
            "$JUPYTERHUB_API_TOKEN is not set: this is a JupyterHub service, started by the hub "
            "with its own token. Register it in jupyterhub_config.py with "
            "jupyter_gpu_gov.hub.hubconfig.add_governor(c, ...) (see the README); "
            f"`{PROG} --help-all` lists its settings."
        )
    return None


if __name__ == "__main__":
    problem = startup_problem(sys.argv[1:], os.environ)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    main()
