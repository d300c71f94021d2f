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
