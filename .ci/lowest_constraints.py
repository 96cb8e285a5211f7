"""Print pip constraints pinning each floor the package metadata claims to that release series.

``name>=X.Y`` in the dependencies of the base package and of the runtime extras (server, hub,
kubespawner), and JupyterLab's, becomes ``name==X.Y.*``: the lowest minor release we claim, with its latest bug
fixes (pip has no "lowest" resolution of its own). `make test-lowest` installs with them.
"""

import re
from pathlib import Path

import tomllib

project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
wanted = [*project["dependencies"]]
for extra in ("server", "hub", "kubespawner"):
    wanted += project["optional-dependencies"][extra]
# JupyterLab is not a runtime dependency (the labextension is prebuilt) but its floor is claimed.
wanted += [r for r in project["optional-dependencies"]["test"] if r.startswith("jupyterlab>=")]
for requirement in wanted:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", requirement.split(";")[0].strip())
    if match:
        print(f"{match[1]}=={match[2]}.*")
