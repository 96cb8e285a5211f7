"""``hub.fast_json.loads`` (orjson where installed) gives ``json.loads``'s answer for every body:
the same object (types, floats to the bit, key order) or the same error (docs/benchmarks-history.md,
"Issue 26, wave 25")."""

from __future__ import annotations

import json
import random
import struct

import pytest
from test_report_answers import BAD, _changed, _paths, _reports  # the same corpus

from jupyter_gpu_gov.hub import fast_json
from jupyter_gpu_gov.hub.api_handler import json_object


def _typed(value):
    """``value`` with every type said and floats by their repr (-0.0 is not 0.0, 1 not 1.0)."""
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, dict):
        return ["dict", [[_typed(k), _typed(v)] for k, v in value.items()]]
    if isinstance(value, list):
        return ["list", [_typed(v) for v in value]]
    return [type(value).__name__, value]


def _answer(loads, body: bytes):
    try:
        return ["object", json.dumps(_typed(loads(body)))]
    except (ValueError, RecursionError) as error:
        return ["error", type(error).__name__, str(error)]


def _same(bodies) -> None:
    wrong = [b[:80] for b in bodies if _answer(fast_json.loads, b) != _answer(json.loads, b)]
    assert not wrong, f"{len(wrong)} bodies read otherwise than by json.loads: {wrong[:5]}"


def test_every_report_of_the_corpus_decodes_as_json_loads_decodes_it():
    bodies = []
    for base in _reports():
        cases = [base, "a report", [base], None]
        for path in _paths(base):
            cases.append(_changed(base, path, None, remove=True))
            cases.extend(_changed(base, path, value) for value in BAD)
        bodies += [json.dumps(case).encode() for case in cases]
    assert len(bodies) > 18_000
    _same(bodies)


ODD = [
    b'{"a": 1, "b": 2, "a": 3}',  # duplicate keys: the last value, in the first's place
    b"-0.0",
    b"-0",
    b"[-0.0e5, 1.5e-0, -0e0]",
    b"1e400",  # past a double: inf for json.loads, refused by orjson
    b"-1e400",
    b"1E-400",
    b"5e-324",
    b"2e-324",
    b"1.7976931348623157e308",
    b"1.7976931348623159e308",
    b"0.30000000000000004441",
    b"2.2250738585072011e-308",
    b"9223372036854775807",
    b"9223372036854775808",
    b"18446744073709551615",
    b"18446744073709551616",  # past 64 bits: orjson would say a float
    b"-9223372036854775809",
    b'{"connections": 100000000000000000000000000000}',
    b"1" + b"0" * 17 + b".5",
    b"1.00000000000000000001",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b'"\\ud800"',  # a lone surrogate: json.loads takes it (json_object then refuses it)
    b'"\\udc00x"',
    b'"\\ud83d\\ude00"',
    b'"\\u0000"',
    b'"\xed\xa0\x80"',
    b'"\xff"',
    b'"\xc0\x80"',
    b'"\xf4\x90\x80\x80"',
    b'"\x01"',
    b'"\x7f"',
    b'"\t"',
    b"\xef\xbb\xbf{}",  # a BOM
    '{"a": 1}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-32"),
    b"[" * 255 + b"]" * 255,
    b"[" * 256 + b"]" * 256,
    b"[" * 1023 + b"]" * 1023,
    b"[" * 1024 + b"]" * 1024,
    b"[" * 1025 + b"]" * 1025,
    b"[" * 3000 + b"]" * 3000,
    b" {} ",
    b"\r\n{}\r\n",
    b"\x0c{}",
    b"{}\x0b",
    b"\xe2\x80\x80{}",
    b"{}\x00",
    b"",
    b"  ",
    b"[1,]",
    b'{"a":1,}',
    b'{"a":1 "b":2}',
    b"{'a':1}",
    b"{1:2}",
    b"1.",
    b".5",
    b"01",
    b"-01",
    b"+1",
    b"1e",
    b"-",
    b"tru",
    b"True",
    b"0x10",
    b"1_000",
    b'{"a":1}x',
    b'"\\/"',
    b'"\\x"',
    b'"\\u00"',
    b'{"\\u00e9": "\xc3\xa9"}',
    b"[true, false, null]",
]


def test_odd_bodies_decode_or_fail_as_with_json_loads():
    _same(ODD)


def test_numbers_decode_to_the_same_float_or_int():
    rng = random.Random(26)
    bodies = []
    for _ in range(20_000):
        kind = rng.random()
        if kind < 0.4:  # any double, as Python writes it
            number = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
            text = repr(number) if number == number and abs(number) != float("inf") else "1"
        elif kind < 0.8:  # digits and exponents as anything may write them
            whole = str(rng.randint(0, 10 ** rng.randint(1, 22)))
            fraction = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 25)))
            exponent = f"e{rng.choice(['', '+', '-'])}{rng.randint(0, 400)}"
            text = (
                rng.choice(["", "-"])
                + whole
                + (f".{fraction}" if fraction else "")
                + (exponent if rng.random() < 0.5 else "")
            )
        else:
            text = str(rng.randint(-(10 ** rng.randint(1, 22)), 10 ** rng.randint(1, 22)))
        bodies.append(f'{{"sm": {text}}}'.encode())
    _same(bodies)


def test_without_orjson_json_loads_answers(monkeypatch):
    monkeypatch.setattr(fast_json, "orjson", None)
    _same(ODD[:30])
    assert json_object(b'{"a": -0.0}') == {"a": -0.0}


@pytest.mark.parametrize(
    "body, words",
    [
        (b"[1]", "the body must be a JSON object"),
        (b"{", "the body is not JSON"),
        (b'{"a": "\\ud800"}', "the body is not text at 'a'"),
        (b"[" * 3000 + b"]" * 3000, "nested too deeply"),
    ],
)
def test_a_body_that_is_no_object_is_refused_in_the_same_words(body, words):
    with pytest.raises(ValueError, match=words):
        json_object(body)
