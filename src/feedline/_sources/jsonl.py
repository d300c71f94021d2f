"""JSON Lines and JSON arrays: the text field by dotted path, every other field kept.

    sources: [{path: "pile/*.jsonl.zst", text: text}]
    sources: [{path: "kto.json", text: null}]         # chat data: records kept as they are

``jsonl`` positions are byte offsets of lines. A ``.json`` file holding an array is parsed whole
(a JSON array cannot be streamed by line) and its positions and reported "lines" are element
indices (0-based) and numbers (1-based). A ``.json`` file holding one object (pretty-printed,
or alone on its line) is one record, or, when the object lacks the text field and has exactly
one field holding a list of objects (``{"version": 1, "data": [...]}``), the records of that
list. Any other ``.json`` file is read as JSON Lines. Whole documents are bounded by
``max_record_bytes``.

With ``text: null`` a record is any JSON object, kept as is (no text check): the way to read
chat data, whose conversation sits in ``messages``, ``conversation`` or ``conversations``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from feedline._core.record import Rejection, get_path, text_record
from feedline._sources.lines import BOM, MISS, LineReader, open_decoded
from feedline._sources.reader import Item, Reader, Split

__all__ = ["JsonReader", "JsonlReader", "parse_json_line", "text_record"]


_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner json.loads uses
_JSON_SPACE = " \t\n\r"

try:  # optional (feedline[fast]): parses a short line ~2x faster than the C scanner
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - the json scanner does the same work
    _orjson_loads = None  # type: ignore[assignment]


def _orjson_fast(raw: bytes) -> Any:
    """The block path's fast parse with orjson: json's value for every line it accepts.

    orjson rejects what json rejects or reads differently (lone surrogates, NaN, overflowing
    floats, invalid UTF-8), and reads an integer beyond 64 bits as a float where json keeps an int:
    so a record with a float, or with a nested value it would take a walk to check, is :data:`MISS`
    too, and json parses it.
    """
    try:
        obj = _orjson_loads(raw)  # type: ignore[misc]
    except ValueError:
        return MISS
    if type(obj) is not dict:
        return MISS
    for v in obj.values():
        kind = type(v)
        if kind is float or kind is dict or kind is list:
            return MISS
    value = obj.get("text")
    if type(value) is str and value and not value.isspace():
        return obj
    return MISS


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
        if self.spec.text == "text" and type(obj) is dict:  # the common case, as text_record decides it
            text = obj.get("text")
            if type(text) is str and text and not text.isspace():
                return obj
        return text_record(obj, self.spec.text, path, line)

    def fast_parser(self) -> Callable[[bytes], Any] | None:
        """With ``text: text``: a line that is one object with a non-blank string ``text`` (orjson
        when installed, else the C scanner; anything else is :data:`MISS`)."""
        if self.spec.text != "text":
            return None
        if _orjson_loads is not None:
            return _orjson_fast
        scan, space = _SCAN, _JSON_SPACE

        def fast(raw: bytes) -> Any:
            try:
                text = raw.decode("utf-8", "surrogatepass")
                obj, end = scan(text, 0)
            except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
                return MISS
            if (end == len(text) or not text[end:].strip(space)) and type(obj) is dict:
                value = obj.get("text")
                if type(value) is str and value and not value.isspace():
                    return obj
            return MISS

        return fast


class JsonReader(JsonlReader):
    """Reads ``.json``: an array of objects (positions are indices), else JSON Lines."""

    name = "json"

    def _whole(self, path: str) -> bool:
        """True when the file is one JSON document (an array or a single object), not JSON Lines."""
        cache: dict[str, bool] = self.__dict__.setdefault("_layouts", {})
        if path not in cache:
            cache[path] = _is_document(path)
        return cache[path]

    def splits(self, file: int, path: str) -> list[Split]:
        return [Split(file, path)] if self._whole(path) else super().splits(file, path)

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        if not self._whole(split.path):
            yield from super().read(split, position, line)
            return
        items = self._load(split.path)
        if isinstance(items, Rejection):
            yield 0, 1 << 62, 0, items
            return
        for i in range(position, len(items)):
            yield i, i + 1, i + 1, text_record(items[i], self.spec.text, split.path, i + 1)

    def read_batches(self, split: Split, position: int, line: int) -> Iterator[list[Item]] | None:
        return None if self._whole(split.path) else super().read_batches(split, position, line)

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        return Reader.fetch(self, path, positions) if self._whole(path) else super().fetch(path, positions)

    def _load(self, path: str) -> list[Any] | Rejection:
        """The records of a whole-document file: the array, the object's list field, or the object."""
        limit = self.max_bytes
        try:
            f, _ = open_decoded(path)
            with f:
                data = f.read(limit + 1)
        except (OSError, EOFError, ValueError) as e:
            return Rejection(path, None, "truncated", f"{type(e).__name__}: {e}")
        if len(data) > limit:
            return self.too_large(path, None, len(data))
        try:
            doc = json.loads(data.decode("utf-8-sig"))
        except UnicodeDecodeError as e:
            return Rejection(path, None, "bad_utf8", str(e))
        except json.JSONDecodeError as e:
            return Rejection(path, e.lineno, "bad_json", f"{e.msg} at column {e.colno}; a JSON document is rejected whole")
        if isinstance(doc, list):
            return doc
        if isinstance(doc, dict) and self.spec.text is not None:
            try:
                get_path(doc, self.spec.text)
            except KeyError:
                lists = [k for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v[:16])]
                if len(lists) == 1:
                    return list(doc[lists[0]])
        return [doc]


def _is_document(path: str) -> bool:
    """True for an array, a pretty-printed object, or a file holding one object alone.

    JSON Lines (a first line that is a whole JSON value, and more lines after it) is not.
    """
    f, _ = open_decoded(path)
    with f:
        head = f.read(1 << 16).lstrip(BOM).lstrip()
        while not head:
            chunk = f.read(1 << 16)
            if not chunk:
                return False
            head = chunk.lstrip()
        if head[:1] == b"[":
            return True
        if head[:1] != b"{":
            return False
        first, nl, rest = head.partition(b"\n")
        while not nl:  # a long first line: read on to its end (bounded: a huge line is JSON Lines)
            chunk = f.read(1 << 16)
            if not chunk:
                break
            if len(first) > 1 << 26:
                return False
            more, nl, rest = chunk.partition(b"\n")
            first += more
        try:
            json.loads(first)
        except ValueError:
            return True  # the object runs over several lines: pretty-printed
        while not rest.strip():
            rest = f.read(1 << 16)
            if not rest:
                return True  # one object alone
        return False
