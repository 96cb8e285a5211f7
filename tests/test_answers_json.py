"""Every answer's JSON as a browser's ``JSON.parse`` reads it (``core/browser_json.py``): a
float NaN or infinity that reaches an answer is written as ``null``, not as ``NaN`` (which
``json.dumps`` writes and ``JSON.parse`` refuses, the whole answer with it). The server
extension's routes are tested with a real server in ``tests/test_checkpoint_server.py``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from jupyter_gpu_gov.core import browser_json

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_gpu_gov"

# The json.dumps that write no answer a browser reads: a key or digest, a request to the Hub,
# Kubernetes or the governor, an environment variable, text a page shows in a text area or as
# diff lines, a log's or an error's words.
NOT_ANSWERS = {
    "hub/applied_policy.py": {"_digest", "fingerprint", "version"},
    "hub/hubapi.py": {"_send"},
    "hub/health.py": {"_patch_node"},
    "hub/hubconfig.py": {"add_governor"},
    "hub/policy_admin.py": {"text"},
    "hub/policy_page.py": {"_pretty"},
    "profiles/cluster.py": {"_fit_key"},
    "server/reporter.py": {"_send", "_call"},
    "server/routes.py": {"post"},  # the governor's stand-in's words, cut, in a 502's message
}


def strict(text: str):
    """``text`` as ``JSON.parse`` reads it: ``NaN``, ``Infinity`` and ``-Infinity`` refused."""

    def refuse(word):
        raise ValueError(f"{word} is no JSON: JSON.parse refuses the whole answer")

    return json.loads(text, parse_constant=refuse)


def test_a_nan_or_an_infinity_anywhere_in_an_answer_is_null_and_the_rest_as_it_was():
    nan, inf = float("nan"), float("inf")
    answer = {
        "servers": [{"user": "a", "gpu": {"sm_active": nan, "memory": [1.5, inf, -inf]}}],
        "totals": (2, 0.25),
        nan: "a key",
    }
    with pytest.raises(ValueError, match="NaN is no JSON"):
        strict(json.dumps(answer))  # what the answers were written with
    assert strict(browser_json.dumps(answer)) == {
        "servers": [{"user": "a", "gpu": {"sm_active": None, "memory": [1.5, None, None]}}],
        "totals": [2, 0.25],
        "null": "a key",
    }
    clean = {"servers": [{"user": "a", "weight": 0.5, "name": "\\u2028"}], "next": None}
    assert browser_json.dumps(clean) == json.dumps(clean)  # byte for byte
    assert browser_json.dumps(clean, sort_keys=True) == json.dumps(clean, sort_keys=True)


def _dumps_calls(tree: ast.AST):
    """(the enclosing function's name, line) of each ``json.dumps(...)`` call."""
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == "dumps"
                and isinstance(child.func.value, ast.Name)
                and child.func.value.id == "json"
            ):
                found.append((function, child.lineno))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_every_answer_of_the_governor_the_profile_layer_and_the_server_is_written_for_a_browser():
    """An answer written by ``json.dumps`` itself (the API's, a listing's, showback's, a
    verdict's, the line's, a checkpoint's manifest) wrote a NaN as ``NaN``: each goes through
    ``browser_json.dumps``; only the uses named in ``NOT_ANSWERS`` write no answer."""
    unexpected, seen = [], set()
    for layer in ("hub", "profiles", "server"):
        for path in sorted((PACKAGE / layer).glob("*.py")):
            relative = f"{layer}/{path.name}"
            for function, line in _dumps_calls(ast.parse(path.read_text(encoding="utf-8"))):
                if function in NOT_ANSWERS.get(relative, ()):
                    seen.add((relative, function))
                else:
                    unexpected.append(f"{relative}:{line} ({function})")
    assert not unexpected, f"json.dumps writing what may be an answer: {unexpected}"
    named = {(path, f) for path, functions in NOT_ANSWERS.items() for f in functions}
    assert seen == named, f"named in NOT_ANSWERS, no longer there: {sorted(named - seen)}"
