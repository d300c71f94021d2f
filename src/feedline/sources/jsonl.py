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

from feedline.core.record import Rejection, text_record
from feedline.errors import SourceError
from feedline.sources.lines import BOM, LineReader, open_decoded
from feedline.sources.reader import Item, Reader, Split

__all__ = ["JsonReader", "JsonlReader", "parse_json_line", "text_record"]


def parse_json_line(raw: bytes, path: str, line: int | None) -> Any:
    """Parse one line; ``None`` for a blank line, a :class:`Rejection` for a bad one."""
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
