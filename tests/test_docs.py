"""The documents name only what a clone of the repository holds: every relative markdown link
(and its #anchor) in README.md and docs/ resolves, every repository path they name in backticks
exists, and no tracked file refers to a place outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jupyter_gpu_gov"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
# A backticked name is a repository path when it starts at a folder the repository has (the
# top level or a subpackage, which the docs name without the `jupyter_gpu_gov/` prefix) and
# ends like a file or a folder; `<placeholders>` and generated folders (dist/, .demo/) are not.
FILE_LIKE = re.compile(r"\.(py|md|ts|tsx|json|ya?ml|toml|css|html|sh|txt|cfg|jsonl)$|/$")


def _tops() -> set[str]:
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    tops |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")}
    return tops - {"node_modules", "dist"}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_code = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _exists(name: str, doc: Path) -> bool:
    roots = [ROOT, doc.parent, PACKAGE, ROOT / "labextension"]
    return any(any(root.glob(name.rstrip("/"))) for root in roots)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    bad = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z+.-]*:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            bad.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            bad.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not bad, f"{doc.relative_to(ROOT)}: dangling links: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(doc):
    tops = _tops()
    missing = [
        name
        for name in CODE.findall(doc.read_text(encoding="utf-8"))
        if "/" in name
        and "<" not in name
        and name.split("/")[0] in tops
        and FILE_LIKE.search(name)
        and not _exists(name, doc)
    ]
    assert not missing, f"{doc.relative_to(ROOT)} names paths the repository lacks: {missing}"


def test_no_reference_outside_the_repository():
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    outside = re.compile(rb"\.\./shared|/work/|DESIGN\.md")
    bad = []
    for name in filter(None, tracked):
        path = ROOT / name.decode()
        if path.is_file() and path.name != "test_docs.py":
            for n, line in enumerate(path.read_bytes().splitlines(), 1):
                if outside.search(line):
                    bad.append(f"{name.decode()}:{n}")
    assert not bad, f"references to files outside the repository: {bad}"
