"""What is generated from the report and the verdict of ``core/wire.py``: the JSON Schema beside
the event schemas, and the field tables of docs/api.md.

    python -m jupyter_gpu_gov.events.wire          # rewrite both (tests/test_wire.py: on drift)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

from ..core import wire

WIRE_SCHEMA = Path(__file__).parent / f"wire.v{wire.REPORT_FORMAT}.schema.json"
WIRE_SCHEMA_ID = f"https://events.jupyter-gpu-gov.org/wire/v{wire.REPORT_FORMAT}"
API_DOC = Path(__file__).parents[2] / "docs" / "api.md"
# The report's and the verdict's tables in docs/api.md sit between these markers.
TABLES = {"Report": "report", "Verdict": "verdict"}
# JSON Schema keywords a field may carry; for the labextension, tsType names its own type of an
# open object (labextension/src/types.ts), as json-schema-to-typescript reads it, and tsName the
# type its enumeration gets (labextension/src/wire.ts).
_KEYWORDS = (
    "enum",
    "const",
    "minimum",
    "maximum",
    "maxLength",
    "maxItems",
    "format",
    "tsType",
    "tsName",
)


def _type(hint: Any, defs: dict) -> dict:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if type(None) in typing.get_args(hint):  # X | None
        inner = _type(args[0], defs)
        if "$ref" in inner:
            return {"anyOf": [inner, {"type": "null"}]}
        return {**inner, "type": [inner["type"], "null"]}
    if isinstance(hint, type) and issubclass(hint, wire.Wire):
        _define(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    if origin is tuple:
        return {"type": "array", "items": _type(args[0], defs)}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}
    return {"type": simple[hint]}


def _define(cls: type, defs: dict) -> None:
    if cls.__name__ in defs:
        return
    defs[cls.__name__] = {}  # taken, for the recursion
    hints = typing.get_type_hints(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        prop = {"description": f.metadata["doc"], **_type(hints[f.name], defs)}
        for keyword in _KEYWORDS:
            if keyword in f.metadata:
                value = f.metadata[keyword]
                prop[keyword] = list(value) if isinstance(value, tuple | frozenset) else value
        if "enum" in prop and "null" in prop.get("type", ()):
            prop["enum"] = [*prop["enum"], None]
        properties[f.name] = prop
        if f.metadata.get("required"):
            required.append(f.name)
    defs[cls.__name__] = {
        "type": "object",
        "description": (cls.__doc__ or cls.__name__).strip().splitlines()[0],
        "properties": properties,
        "required": required,
    }


def json_schema() -> dict:
    """The report and the verdict as JSON Schema (2020-12); unknown keys are allowed (newer
    servers and governors add fields)."""
    defs: dict = {}
    for cls in (wire.Report, wire.Verdict):
        _define(cls, defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": WIRE_SCHEMA_ID,
        "title": "jupyter-gpu-gov report and verdict",
        "description": "Generated from jupyter_gpu_gov/core/wire.py: do not edit.",
        "version": wire.REPORT_FORMAT,
        "$defs": dict(sorted(defs.items())),
    }


def schema_text() -> str:
    return json.dumps(json_schema(), indent=1) + "\n"


def _rows(schema: dict, name: str, prefix: str = "") -> list[tuple[str, str]]:
    rows = []
    for field, prop in schema["$defs"][name]["properties"].items():
        rows.append((f"{prefix}{field}", prop["description"]))
        ref = prop.get("$ref") or next(
            (a["$ref"] for a in prop.get("anyOf", ()) if "$ref" in a), None
        )
        items = prop.get("items", {}).get("$ref")
        if ref:
            rows += _rows(schema, ref.rsplit("/", 1)[1], f"{prefix}{field}.")
        elif items:
            rows += _rows(schema, items.rsplit("/", 1)[1], f"{prefix}{field}[].")
    return rows


def markdown_table(name: str) -> str:
    lines = ["| field | meaning |", "|---|---|"]
    lines += [
        f"| `{field}` | {doc.replace('|', chr(92) + '|')} |"
        for field, doc in _rows(json_schema(), name)
    ]
    return "\n".join(lines)


def _markers(kind: str) -> tuple[str, str]:
    return (
        f"<!-- generated: the {kind} table (python -m jupyter_gpu_gov.events.wire) -->",
        f"<!-- end of the generated {kind} table -->",
    )


def with_tables(doc: str) -> str:
    """docs/api.md with its report and verdict tables as generated."""
    for name, kind in TABLES.items():
        begin, end = _markers(kind)
        head, found, rest = doc.partition(begin)
        _, found_end, tail = rest.partition(end)
        if not (found and found_end):
            raise ValueError(f"docs/api.md has no {begin!r} ... {end!r}")
        doc = f"{head}{begin}\n{markdown_table(name)}\n{end}{tail}"
    return doc


def main() -> None:
    WIRE_SCHEMA.write_text(schema_text())
    API_DOC.write_text(with_tables(API_DOC.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {WIRE_SCHEMA} and the tables of {API_DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
