"""The JSON Lines fast path parses exactly as ``json.loads``: same values, same rejections."""

from __future__ import annotations

import json

import pytest

from conftest import shared
from feedline._core.record import Rejection
from feedline._sources.jsonl import parse_json_line


def _reference(raw: bytes):
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except UnicodeDecodeError as e:
        return Rejection("f", 1, "bad_utf8", str(e))
    except json.JSONDecodeError as e:
        return Rejection("f", 1, "bad_json", f"{e.msg} at column {e.colno}")


LINES = [
    b'{"text": "plain"}\n', b'{"text": "no newline"}', b'  {"text": "leading space"}\n', b'{"a": 1}  \t\r\n',
    b'{"a": 1}\x0b\n', b'{"a": 1} x\n', b'{"a": 1}{"b": 2}\n', b'{"a": NaN, "b": Infinity}\n', b'[1, 2]\n',
    b'"just a string"\n', b'12345678901234567890123456789\n', b'{"a": 1, "a": 2}\n', b'{"t": "\\ud83d\\ude00 \\u00e9"}\n',
    '{"t": "caf\u00e9 \u65e5\u672c"}\n'.encode(), b'{"t": "\xed\xa0\x80"}\n', b'{"t": "\xff"}\n', b'\xef\xbb\xbf{"t": "bom"}\n',
    b'{"t": "ctl \x01"}\n', b'{"t": \n', b'\n', b'   \t\n', b'{}\n', b'[' * 100_000 + b'\n', b'{"t": 1e400}\n', b'null\n',
]


@pytest.mark.parametrize("raw", LINES, ids=range(len(LINES)))
def test_each_line_parses_exactly_as_json_loads(raw: bytes) -> None:
    try:
        want = _reference(raw)
    except RecursionError:  # json.loads's own limit on nesting: the same error either way
        with pytest.raises(RecursionError):
            parse_json_line(raw, "f", 1)
        return
    got = parse_json_line(raw, "f", 1)
    if isinstance(want, Rejection):
        assert got == want
    else:
        assert type(got) is type(want) and json.dumps(got) == json.dumps(want)


def test_real_jsonl_parses_as_json_loads() -> None:
    for raw in shared("prose", "c4_demo.jsonl").read_bytes().splitlines(keepends=True):
        assert parse_json_line(raw, "f", 1) == json.loads(raw)


ORJSON_LINES = [
    *LINES,
    b'{"text": "x", "n": 18446744073709551615}', b'{"text": "x", "n": -9223372036854775809}',
    b'{"text": "x", "n": 123456789012345678901234567890}', b'{"text": "x", "f": 0.1}', b'{"text": "x", "m": {"a": 1}}',
    b'{"text": "x", "a": 1, "b": 2, "a": 3}', b'{"text": "a\\u0000b", "t": true, "u": null}', b'{"text": "\x7f"}',
    b'{"text": "x",}', b'{"text": "x"}\x0c', b'{"text": "\\ud800"}',
]


def test_the_orjson_fast_path_gives_json_values_or_misses() -> None:
    """With orjson installed the block path parses with it; every value it accepts is json's
    (64-bit overflow, floats and nested values go the json way)."""
    pytest.importorskip("orjson")
    from feedline._sources.jsonl import JsonlReader, _orjson_fast
    from feedline._sources.lines import MISS
    from feedline._spec import SourceSpec

    reader = JsonlReader(SourceSpec(path="x.jsonl"))
    assert reader.fast_parser() is _orjson_fast
    real = shared("prose", "c4_demo.jsonl").read_bytes().splitlines()
    accepted = 0
    for raw in ORJSON_LINES + real:
        got = _orjson_fast(raw.rstrip(b"\n"))
        if got is MISS:
            continue
        want = reader.parse(raw, "f", 1)
        assert type(got) is type(want) and json.dumps(got) == json.dumps(want), raw[:60]
        assert list(got) == list(want)  # the same keys in the same order
        accepted += 1
    assert accepted >= len(real)  # real records take the fast path
    assert _orjson_fast(b'{"text": "x", "n": -9223372036854775809}') is MISS  # orjson would give a float
