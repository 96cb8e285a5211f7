"""The import rules of docs/architecture.md ("Modules"), checked on the source: a module that
breaks one fails here with the line that does."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from python_source import parse

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_gpu_gov"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _imports(path: Path, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved;
    ``top_level_only``: those that run on import (not inside a function)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[:-1]
    tree = parse(path)
    found = []
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join((*base, node.module) if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def _modules(*subpackages: str) -> list[Path]:
    paths = []
    for sub in subpackages:
        target = PACKAGE / sub
        paths += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return paths


def _violations(paths, allowed, top_level_only: bool = False) -> list[str]:
    bad = []
    for path in paths:
        for line, name in _imports(path, top_level_only):
            top = name.split(".")[0]
            if not allowed(name, top):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {name}")
    return bad


def _ours(name: str, *packages: str) -> bool:
    return any(
        name == f"jupyter_gpu_gov.{p}" or name.startswith(f"jupyter_gpu_gov.{p}.") for p in packages
    )


def test_core_is_pure():
    """core/ imports the standard library, traitlets and itself only."""
    bad = _violations(
        _modules("core"),
        lambda name, top: top in STDLIB or top == "traitlets" or _ours(name, "core"),
    )
    assert not bad, "\n".join(bad)


def test_replay_imports_only_core():
    bad = _violations(
        _modules("replay"),
        lambda name, top: (
            top in STDLIB
            or top == "traitlets"
            or _ours(name, "core", "replay")
            or name == "jupyter_gpu_gov"
        ),
    )
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("server", ("hub", "profiles")),
        ("hub", ("server", "profiles")),
        ("profiles", ("server", "hub")),
    ],
)
def test_server_hub_and_profiles_never_import_each_other(package, forbidden):
    bad = _violations(_modules(package), lambda name, top: not _ours(name, *forbidden))
    assert not bad, "\n".join(bad)


def test_the_service_imports_jupyterhub_in_hub_auth_only():
    """hub/hub_auth.py loads ``jupyterhub.orm`` lazily, without a lock (its comment says why
    none is needed): that holds while no other module of the service, and so no worker thread
    of it, imports JupyterHub. ``hubconfig.py`` runs in the Hub's config, not the service."""
    bad = _violations(
        [p for p in _modules("hub") if p.name not in ("hub_auth.py", "hubconfig.py")],
        lambda name, top: top != "jupyterhub",
    )
    assert not bad, "\n".join(bad)


def test_the_hub_process_adapter_loads_no_jupyterhub():
    """hub_process.py finds JupyterHub's application and ORM where the Hub loaded them: the
    governor service loads it through ``hub/hubconfig.py`` and so would load JupyterHub's ORM
    (its tables, alembic) for nothing, were it imported there."""
    bad = _violations(
        _modules("hub_process.py"),
        lambda name, top: top in STDLIB or _ours(name, "core"),
    )
    assert not bad, "\n".join(bad)


LIGHT_MODULES = ("__init__.py", "checkpoint.py", "checkpoint_layout.py", "simulate.py")


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_modules_loaded_in_kernels_and_both_images_stay_light(module):
    """They run inside users' kernels, or land in both images: on import, the standard library
    and the pure core only (a kernel imports IPython or torch itself, when a hook needs it)."""
    bad = _violations(
        _modules(module),
        lambda name, top: (
            top in STDLIB
            or name in ("jupyter_gpu_gov", "jupyter_gpu_gov._version")
            or f"{name.removeprefix('jupyter_gpu_gov.')}.py" in LIGHT_MODULES
            or _ours(name, "core")
        ),
        top_level_only=True,
    )
    assert not bad, "\n".join(bad)


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string constant in a file that is not a docstring."""
    tree = parse(path)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_shared_words_are_defined_once():
    """Label keys, the governor's states, cull reasons and cull actions are spelled in
    core/vocabulary.py only; every other module imports them (a copy drifts: the metrics once
    listed states the policy no longer had)."""
    from jupyter_gpu_gov.core import vocabulary as v

    words = {
        value
        for name, value in vars(v).items()
        if name.isupper() and isinstance(value, str) and value.startswith(v.LABEL_PREFIX)
    }
    words |= {v.GPU_FAILED, v.BUSY_LIMIT, v.GPU_IDLE, *v.CULL_ACTIONS, v.LABEL_PREFIX}
    home = PACKAGE / "core" / "vocabulary.py"
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: spells {value!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != home
        for line, value in _string_constants(path)
        if value in words
    ]
    assert not bad, "\n".join(bad)


# Spelled in two halves so this file does not name them itself.
_OUTSIDE = ("DESIGN" + ".md", "DESIGN" + " §", "../" + "shared")


def _repository_files() -> list[Path]:
    """The repository's files as a clone has them (git's list, or a walk without build output)."""
    root = PACKAGE.parent
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        check=False,
    )
    if listed.returncode == 0:
        return [root / name for name in listed.stdout.decode().split("\0") if name]
    skip = {".git", ".venv", "node_modules", "__pycache__", "lib", "dist", ".demo"}
    return [p for p in root.rglob("*") if p.is_file() and not skip & set(p.parts)]


def test_no_file_names_a_document_outside_the_repository():
    """A user who clones the repository finds every document it names: nothing refers to a
    design file or a sibling folder that only the authors had (docs/architecture.md and
    docs/api.md hold what they said)."""
    bad = []
    for path in _repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files, and files a checkout lists but a sparse one lacks
        for number, line in enumerate(text.splitlines(), 1):
            bad += [f"{path}:{number}: {word!r}" for word in _OUTSIDE if word in line]
    assert not bad, "\n".join(bad)


def test_routes_and_pages_talk_to_the_governor_not_its_internals():
    """The REST API and the pages read what the governor shows (``hub/views.py``), never its
    store, its reports or its ledger: those may change without touching the web layer."""
    bad = []
    web = ("routes.py", "pages.py", "api_handler.py", "page_handler.py")
    for path in (PACKAGE / "hub" / name for name in web):
        for node in ast.walk(parse(path)):
            if not isinstance(node, ast.Attribute) or node.attr not in (
                "store",
                "reports",
                "ledger",
            ):
                continue
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("governor", "gov"):
                bad.append(f"{path.name}:{node.lineno}: governor.{node.attr}")
    assert not bad, "\n".join(bad)


def test_every_module_is_named_in_the_architecture_doc():
    """docs/architecture.md, "Modules", says what every module of the package owns: a module
    added without a word there fails here."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc[doc.index("## 6. Modules") : doc.index("\n## 7.")]
    unnamed = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.stem not in ("__init__", "_version")
        and "labextension" not in path.parts
        and not re.search(rf"\b{re.escape(path.stem)}\b", section)
    ]
    assert not unnamed, f"modules docs/architecture.md does not name: {unnamed}"
