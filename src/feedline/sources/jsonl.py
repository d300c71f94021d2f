"""JSON Lines: one JSON object per line; the text field by dotted path, other fields kept.

    sources: [{path: "pile/*.jsonl.zst", text: text}]
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from feedline.core.record import Rejection
from feedline.sources.lines import iter_lines
from feedline.sources.reader import Item, Reader, Split, get_path

__all__ = ["JsonlReader", "text_record"]


def text_record(obj: Any, field: str, path: str, line: int | None) -> dict[str, Any] | Rejection:
    """Check that ``obj`` is an object whose ``field`` holds non-empty text; put it under ``"text"``."""
    if not isinstance(obj, dict):
        return Rejection(path, line, "not_object", f"got {type(obj).__name__}")
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


class JsonlReader(Reader):
    """Reads ``.jsonl``/``.ndjson`` (plain or compressed)."""

    name = "jsonl"

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        field = self.spec.text
        for pos, raw in iter_lines(split.path, position, split.end):
            line += 1
            nxt = pos + len(raw)
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError as e:
                yield pos, nxt, line, Rejection(split.path, line, "bad_utf8", str(e))
                continue
            except json.JSONDecodeError as e:
                yield pos, nxt, line, Rejection(split.path, line, "bad_json", e.msg)
                continue
            yield pos, nxt, line, text_record(obj, field, split.path, line)
