"""JSON Lines and JSON arrays: the text field by dotted path, every other field kept.

    sources: [{path: "pile/*.jsonl.zst", text: text}]
    sources: [{path: "kto.json", text: null}]         # chat data: records kept as they are

``jsonl`` positions are byte offsets of lines. A ``.json`` file holding an array is parsed whole
(a JSON array cannot be streamed by line) and its positions and reported "lines" are element
indices (0-based) and numbers (1-based); a ``.json``
file that does not start with ``[`` is read as JSON Lines.

With ``text: null`` a record is any JSON object, kept as is (no text check): the way to read
chat data, whose conversation sits in ``messages``, ``conversation`` or ``conversations``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from feedline.core.record import Rejection
from feedline.errors import SourceError
from feedline.sources.lines import BOM, LineReader, open_decoded
from feedline.sources.reader import Item, Reader, Split, get_path

__all__ = ["JsonReader", "JsonlReader", "parse_json_line", "text_record"]


def text_record(obj: Any, field: str | None, path: str, line: int | None) -> dict[str, Any] | Rejection:
    """Check that ``obj`` is an object whose ``field`` holds non-empty text; put it under ``"text"``.

    With ``field=None`` any object is accepted unchanged.

        >>> text_record({"body": {"text": "hi"}, "id": 3}, "body.text", "f.jsonl", 1)["text"]
        'hi'
        >>> text_record({"id": 3}, "text", "f.jsonl", 7).reason
        'missing_field'
    """
    if not isinstance(obj, dict):
        return Rejection(path, line, "not_object", f"got {type(obj).__name__}")
    if field is None:
        return obj
    try:
        text = get_path(obj, field)
    except KeyError:
        return Rejection(path, line, "missing_field", f"no field {field!r}; set the source's text: to the field holding the text")
    if not isinstance(text, str):
        return Rejection(path, line, "not_string", f"field {field!r} is {type(text).__name__}")
    if not text.strip():
        return Rejection(path, line, "empty", f"field {field!r} is empty")
    if field != "text" or obj.get("text") is not text:
        obj = {**obj, "text": text}
    return obj


_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner json.loads uses
_JSON_SPACE = " \t\n\r"


def parse_json_line(raw: bytes, path: str, line: int | None) -> Any:
    """Parse one line; ``None`` for a blank line, a :class:`Rejection` for a bad one.

    A line that is one JSON value (optionally followed by JSON whitespace) is scanned directly
    (about 3x faster than ``json.loads`` on short records); anything else, errors included, goes
    through ``json.loads``, so results and error messages are exactly ``json.loads``'s.
    """
    try:
        text = raw.decode("utf-8", "surrogatepass")  # what json.loads does with UTF-8 bytes
        obj, end = _SCAN(text, 0)
        if end == len(text) or not text[end:].strip(_JSON_SPACE):
            return obj
    except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
        pass
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except UnicodeDecodeError as e:
        return Rejection(path, line, "bad_utf8", str(e))
    except json.JSONDecodeError as e:
        return Rejection(path, line, "bad_json", f"{e.msg} at column {e.colno}")


class JsonlReader(LineReader):
    """Reads ``.jsonl``/``.ndjson`` (plain or compressed)."""

    name = "jsonl"

    def parse(self, raw: bytes, path: str, line: int | None) -> dict[str, Any] | Rejection | None:
        obj = parse_json_line(raw, path, line)
        if obj is None or isinstance(obj, Rejection):
            return obj
        return text_record(obj, self.spec.text, path, line)


class JsonReader(JsonlReader):
    """Reads ``.json``: an array of objects (positions are indices), else JSON Lines."""

    name = "json"

    def splits(self, file: int, path: str) -> list[Split]:
        return [Split(file, path)] if _is_array(path) else super().splits(file, path)

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        if not _is_array(split.path):
            yield from super().read(split, position, line)
            return
        items = _load_array(split.path)
        if isinstance(items, Rejection):
            yield 0, 1 << 62, 0, items
            return
        for i in range(position, len(items)):
            yield i, i + 1, i + 1, text_record(items[i], self.spec.text, split.path, i + 1)

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        return Reader.fetch(self, path, positions) if _is_array(path) else super().fetch(path, positions)


def _is_array(path: str) -> bool:
    """True when the file's first non-blank character is ``[``."""
    f, _ = open_decoded(path)
    with f:
        head = f.read(4096).lstrip(BOM).lstrip()
        while not head:
            chunk = f.read(4096)
            if not chunk:
                return False
            head = chunk.lstrip()
    return head[:1] == b"["


def _load_array(path: str) -> list[Any] | Rejection:
    try:
        f, _ = open_decoded(path)
        with f:
            data = f.read()
    except (OSError, EOFError, ValueError) as e:
        return Rejection(path, None, "truncated", f"{type(e).__name__}: {e}")
    try:
        items = json.loads(data.decode("utf-8-sig") if isinstance(data, bytes) else data)
    except UnicodeDecodeError as e:
        return Rejection(path, None, "bad_utf8", str(e))
    except json.JSONDecodeError as e:
        return Rejection(path, e.lineno, "bad_json", f"{e.msg} at column {e.colno}; a JSON array is rejected whole")
    if not isinstance(items, list):
        raise SourceError(f"{path}: expected a JSON array of records, got {type(items).__name__}")
    return items
