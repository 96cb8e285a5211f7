"""Parse the project's Python files for the tests that read its structure."""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """``ast.parse`` of a file, with no garbage collection while it runs. CPython 3.11 keeps
    one AST recursion counter per interpreter: a finalizer run by a collection mid-parse (a
    tornado client an earlier test left behind, whose "Event loop is closed" traceback is
    formatted with ``ast.parse``) resets it, and the outer parse fails with "SystemError: AST
    constructor recursion depth mismatch" (seen once, test files on two xdist workers)."""
    source = path.read_text(encoding="utf-8")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if was_enabled:
            gc.enable()
