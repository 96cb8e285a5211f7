"""Prometheus's two formats, read into samples ``(name, labels, value)``: the text exposition
(an exporter's ``/metrics``) and an instant query's vector (``/api/v1/query``). Pure; what the
samples mean for a GPU is ``hub/dcgm.py``'s business."""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Container, Iterable, Iterator, Mapping
from typing import Any

Sample = tuple[str, Mapping[str, str], float]  # metric name, labels, value

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


# The text exposition format (0.0.4), read by hand: prometheus_client's parser (the plain path,
# tests/test_dcgm.py reads every fixture with both) spends most of its time on series the table
# never reads (the figures: docs/benchmarks-history.md, "Governor reconcile pass"). Names are read
# as written, as Prometheus does; prometheus_client would rename a counter's samples to
# ``<name>_total``.
# One label and its separator. A value escapes only \\, \" and \n (any other escape is an error,
# as in Prometheus); unrolled as runs between escapes, which ``re`` scans faster than a char
# alternation.
_LABEL = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\[\\"n][^"\\]*)*)"[ \t]*(?:,|\Z)'
)
_LABELS = re.compile(f"(?:{_LABEL.pattern})*")  # labels one after another, as the loop reads them
_VALUE = re.compile(r"[ \t]+(\S+)(?:[ \t]+[-+]?[0-9]+)?")  # then an optional timestamp (ms)
_ESCAPE = re.compile(r'\\[\\"n]')
_UNESCAPED = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _label_set(raw: str) -> dict[str, str]:
    """The labels between ``{`` and ``}``; each label must follow the last, or it is malformed."""
    raw = raw.strip(" \t")
    # Checked and split by two C scans; any fault is named by the label-by-label reader.
    pairs = _LABEL.findall(raw) if _LABELS.fullmatch(raw) else None
    if pairs is None or len({name for name, _ in pairs}) != len(pairs):
        return _label_set_named_fault(raw)
    if "\\" not in raw:
        return dict(pairs)
    return {
        name: _ESCAPE.sub(lambda m: _UNESCAPED[m[0]], value) if "\\" in value else value
        for name, value in pairs
    }


def _label_set_named_fault(raw: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(raw):
        label = _LABEL.match(raw, pos)
        if label is None:
            raise ValueError(f"malformed label at {raw[pos : pos + 40]!r}")
        name, value = label.groups()
        if name in labels:
            raise ValueError(f"duplicate label {name!r}")
        labels[name] = _ESCAPE.sub(lambda m: _UNESCAPED[m[0]], value) if "\\" in value else value
        pos = label.end()
    return labels


def _sample(
    line: str, start: int, label_sets: dict[str, dict[str, str]]
) -> tuple[dict[str, str], float]:
    """The labels and value of a sample line whose metric name ends at ``start``."""
    labels: dict[str, str] = {}
    brace = line.find("{", start)
    if brace != -1 and not line[start:brace].strip(" \t"):
        # The last "}" closes the set: a value may hold "}", but what follows the set may not.
        close = line.rfind("}")
        if close < brace:
            raise ValueError("unclosed label set")
        raw = line[brace + 1 : close]
        # A GPU's label set repeats once per metric: parse each distinct one once, share the dict.
        cached = label_sets.get(raw)
        if cached is None:
            cached = label_sets[raw] = _label_set(raw)
        labels, start = cached, close + 1
    value = _VALUE.fullmatch(line, start)
    if value is None:
        raise ValueError("expected a value and an optional timestamp")
    if "_" in value[1]:  # float() takes "1_000"; the format does not
        raise ValueError(f"invalid value {value[1]!r}")
    return labels, float(value[1])


def _line_samples(
    lines: Iterable[tuple[int, str]], metrics: Container[str], label_sets: dict[str, dict]
) -> Iterator[Sample]:
    """The reference reader: line by line, in Python (the scanner below falls back to it)."""
    for number, line in lines:
        line = line.strip()  # the A100 MIG fixture's lines are indented
        if not line or line[0] == "#":
            continue
        name = METRIC_NAME.match(line)
        if name is None:
            raise ValueError(f"line {number}: no metric name: {line[:200]!r}")
        if name[0] not in metrics:
            continue
        try:
            labels, value = _sample(line, name.end(), label_sets)
        except ValueError as e:
            raise ValueError(f"line {number}: {e}: {line[:200]!r}") from None
        yield name[0], labels, value


@functools.lru_cache(maxsize=16)
def _scanner(names: frozenset[str]) -> re.Pattern[str]:
    """One pattern that finds, in C, every line after the first whose metric is in ``names``.

    It starts with a literal "\\n", so ``re`` jumps from line to line without looking at the
    other lines' text. A line in the common form (labels up to the line's *last* "}", a value
    with neither "_" nor "}", an optional timestamp, blanks) gives its raw labels and value
    (groups 2, 3); any other line of a wanted metric gives group 4 (the rest of the line), and
    the caller hands the whole text to the reference reader, which reads odd forms or names the
    error. A wanted line is one whose longest metric-name prefix is in ``names``, as there.
    """
    alternation = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    common = r"(?:[ \t]*\{(.*)\})?[ \t]+([^\s}_]+)(?:[ \t]+[-+]?[0-9]+)?[^\S\n]*(?=\n|\Z)"
    return re.compile(
        rf"\n[^\S\n]*({alternation})(?![a-zA-Z0-9_:])(?:{common}|([^\n]*))" if names else r"(?!)"
    )


# A line (after the first) that is neither blank, a comment nor starts with a metric name.
_NAMELESS = re.compile(r"\n[^\S\n]*[^\s#a-zA-Z_:]")


def exposition_samples(text: str, metrics: Collection[str]) -> Iterator[Sample]:
    """(name, labels, value) for each sample of a metric in ``metrics``; other lines unparsed.

    Samples, their order, shared label dicts and errors are those of ``_line_samples`` over
    every line: the exposition is scanned in C and only wanted lines reach Python; an
    exposition with any line the scanner does not read plainly is read by ``_line_samples``
    instead (tests/test_dcgm.py checks both read alike).
    """
    label_sets: dict[str, dict[str, str]] = {}
    first_end = text.find("\n")
    if first_end == -1 or _NAMELESS.search(text, first_end):
        yield from _line_samples(enumerate(text.split("\n"), 1), metrics, label_sets)
        return
    samples = list(_line_samples([(1, text[:first_end])], metrics, label_sets))
    for match in _scanner(frozenset(metrics)).finditer(text, first_end):
        name, raw, value, other = match.groups()
        if other is not None:
            samples = None
            break
        if raw is None:
            labels = {}
        else:
            labels = label_sets.get(raw)
            if labels is None:
                try:
                    labels = label_sets[raw] = _label_set(raw)
                except ValueError:
                    samples = None
                    break
        try:
            samples.append((name, labels, float(value)))
        except ValueError:
            samples = None
            break
    if samples is None:  # a line in another form: the reference reader reads it, or says why
        yield from _line_samples(enumerate(text.split("\n"), 1), metrics, {})
        return
    yield from samples


def vector_samples(result: Iterable[Any]) -> Iterator[Sample]:
    for series in result:
        try:
            labels = series["metric"]
            # Prometheus sends values as strings ("0", "NaN", "+Inf").
            yield labels.get("__name__", ""), labels, float(series["value"][1])
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"malformed vector sample {series!r:.200}: {e!r}") from None


def not_text_label(result: Iterable[Any]) -> Any:
    """The first series of a vector with a label's value that is not text (None: none): what
    a read that failed on one names (looked for only then: 150,000 series checked first cost
    each read of a 10,000-GPU fleet 0.06 s)."""
    for series in result:
        labels = series.get("metric") if isinstance(series, Mapping) else None
        if isinstance(labels, Mapping) and not all(isinstance(v, str) for v in labels.values()):
            return series
    return None
