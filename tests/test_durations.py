"""Durations as people read them: the seconds stay below an hour, everywhere. The JupyterLab
extension's ``formatDuration`` (labextension/src/format.ts) is held to the same table: its jest
cases are read here and must give the same text in Python."""

import re
from datetime import timedelta
from pathlib import Path

import pytest

from jupyter_gpu_gov.core.durations import format_duration

SPEC = Path(__file__).resolve().parent.parent / "labextension" / "test" / "format.spec.ts"


def jest_cases() -> list[tuple[float, str]]:
    text = SPEC.read_text()
    block = text[text.index("describe('formatDuration") :]
    block = block[: block.index("});")]
    return [(float(n), out) for n, out in re.findall(r"\[(-?[\d.]+), '([^']*)'\]", block)]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (90, "1m 30s"), (600, "10m"), (3599, "59m 59s"), (3600, "1h"),
     (3661, "1h 1m"), (7500, "2h 5m"), (90061, "1d 1h 1m"), (timedelta(minutes=90), "1h 30m")],
)  # fmt: skip
def test_seconds_stay_below_an_hour(seconds, text):
    assert format_duration(seconds) == text


def test_the_labextension_reads_durations_the_same_way():
    cases = jest_cases()
    assert len(cases) >= 8, "the jest table of formatDuration was not found"
    for seconds, text in cases:
        assert format_duration(seconds) == text, seconds


def test_unknown_and_negative():
    assert format_duration(None) == "-"
    assert format_duration(-5) == "0s"
