"""What `pip install jupyter-gpu-gov` gets: the sdist and the wheel hatchling builds from this
checkout (in-process, in a few seconds; `make dist` builds them as a release does), with the
prebuilt JupyterLab extension (`make labextension`) in both and the server extension enabled by
the wheel's config file."""

from __future__ import annotations

import json
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

import pytest
from hatchling.builders.sdist import SdistBuilder
from hatchling.builders.wheel import WheelBuilder

from jupyter_gpu_gov import __version__

REPO = Path(__file__).resolve().parent.parent
LABEXTENSION = REPO / "jupyter_gpu_gov" / "labextension"
WHEEL_DATA = f"jupyter_gpu_gov-{__version__}.data/data/"


@dataclass
class Dists:
    sdist_files: set[str]  # relative to the sdist's top folder
    sdist_metadata: Message  # PKG-INFO
    wheel_files: set[str]
    wheel_metadata: Message  # METADATA
    server_configs: dict[str, dict]  # the wheel's jupyter_server_config.d files


def built_labextension() -> list[str]:
    """The built labextension's files, relative to its folder."""
    if not (LABEXTENSION / "static" / "style.js").exists():
        pytest.fail("the labextension is not built: run `make labextension`")
    return sorted(p.relative_to(LABEXTENSION).as_posix() for p in LABEXTENSION.rglob("*") if p.is_file())  # fmt: skip


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Dists:
    """Built without build hooks: the labextension is the one `make labextension` built."""
    out = tmp_path_factory.mktemp("dist")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HATCH_BUILD_NO_HOOKS", "true")
        env.chdir(REPO)
        (sdist,) = SdistBuilder(str(REPO)).build(directory=str(out), versions=["standard"])
        (wheel,) = WheelBuilder(str(REPO)).build(directory=str(out), versions=["standard"])
    with tarfile.open(sdist) as tar:
        top = Path(sdist).name.removesuffix(".tar.gz")
        sdist_files = {m.name.removeprefix(f"{top}/") for m in tar.getmembers() if m.isfile()}
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    with zipfile.ZipFile(wheel) as whl:
        wheel_files = set(whl.namelist())
        metadata = whl.read(f"jupyter_gpu_gov-{__version__}.dist-info/METADATA").decode()
        configs = {n: json.loads(whl.read(n)) for n in wheel_files if "_config.d/" in n}
    return Dists(
        sdist_files,
        HeaderParser().parsestr(pkg_info),
        wheel_files,
        HeaderParser().parsestr(metadata),
        configs,
    )


def test_the_sdist_carries_the_prebuilt_labextension(dists):
    for name in built_labextension():
        assert f"jupyter_gpu_gov/labextension/{name}" in dists.sdist_files
    # Nothing of a developer's machine: environments, node_modules, build output.
    stray = [
        f
        for f in dists.sdist_files
        if f.startswith((".venv", "node_modules/", "labextension/lib/", "dist/", ".demo/"))
        or "/node_modules/" in f
        or "__pycache__" in f
    ]
    assert stray == []


def test_the_sdist_has_every_tracked_file(dists):
    """The sdist lists what it ships (pyproject.toml: only-include): a new top-level folder must
    be added there."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    missing = [
        f
        for f in tracked.stdout.split("\0")
        if f and (REPO / f).is_file() and f not in dists.sdist_files
    ]
    assert missing == []


def test_the_wheel_installs_both_extensions_enabled(dists):
    labextension = f"{WHEEL_DATA}share/jupyter/labextensions/jupyter-gpu-gov/"
    for name in [*built_labextension(), "install.json"]:
        assert labextension + name in dists.wheel_files
    # The server extension is enabled by the config file the wheel drops into etc/jupyter.
    assert dists.server_configs == {
        f"{WHEEL_DATA}etc/jupyter/jupyter_server_config.d/jupyter_gpu_gov.json": {
            "ServerApp": {"jpserver_extensions": {"jupyter_gpu_gov": True}}
        }
    }
    assert "jupyter_gpu_gov/server/app.py" in dists.wheel_files
    assert not [f for f in dists.wheel_files if f.startswith("tests/")]


def test_the_metadata_names_the_license_and_installs_nvml_with_the_package(dists):
    for meta in (dists.sdist_metadata, dists.wheel_metadata):
        assert meta["License-Expression"] == "BSD-3-Clause"
        assert meta.get_all("License-File") == ["LICENSE"]
        assert any(r.startswith("nvidia-ml-py") for r in meta.get_all("Requires-Dist"))
    assert f"jupyter_gpu_gov-{__version__}.dist-info/licenses/LICENSE" in dists.wheel_files
