"""Wikipedia CirrusSearch dumps (``*-cirrussearch-content.json.gz``).

    sources: [{path: "enwiki-20240101-cirrussearch-content.json.gz"}]     # format detected
    sources: [{path: "dump.json.gz", format: cirrus, namespaces: [0, 14]}]

A dump is Elasticsearch bulk input: an action line (``{"index": {"_type": "page", "_id": "12"}}``)
then a document line (``{"namespace": 0, "title": ..., "text": ..., "opening_text": ...}``).
A record is ``{"text", "title", "namespace", "id"}`` (``id`` from the action line) for pages
in ``namespaces`` (articles, namespace 0, by default); its position is the action line's offset.
Update actions (``{"doc": {...}}``) and search hits (``{"_source": {...}}``) are unwrapped;
``text: null`` keeps the whole document.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.jsonl import parse_json_line, text_record
from feedline._sources.lines import LineReader
from feedline._sources.reader import Item

__all__ = ["CirrusReader"]

_ACTIONS = frozenset({"index", "create", "update", "delete"})


def _action_id(obj: dict[str, Any]) -> str | None:
    """The ``_id`` of a bulk action line, or ``None`` when ``obj`` is not an action."""
    if len(obj) != 1 or next(iter(obj)) not in _ACTIONS:
        return None
    meta = next(iter(obj.values()))
    return str(meta.get("_id", "")) if isinstance(meta, dict) else ""


class CirrusReader(LineReader):
    """Reads CirrusSearch bulk dumps; a record spans an action line and its document line."""

    name = "cirrus"
    splittable = False  # a cut could separate an action line from its document

    def records(self, lines: Iterator[tuple[int, bytes]], path: str, line: int, known: bool,
                end: int | None) -> Iterator[Item]:
        pending: tuple[int, int, str] | None = None  # action line: position, line, page id
        for pos, raw in lines:
            line += 1
            obj = parse_json_line(raw, path, line)
            if obj is None:
                continue
            if isinstance(obj, Rejection) or not isinstance(obj, dict):
                pending = None
                yield pos, pos + len(raw), line, obj if isinstance(obj, Rejection) else Rejection(path, line, "not_object")
                continue
            action = _action_id(obj)
            if action is not None:
                pending = (pos, line, action)
                continue
            start, _first_line, page_id = pending or (pos, line, None)
            pending = None
            rec = self._document(obj, path, line, page_id)
            if rec is not None:
                yield start, pos + len(raw), line, rec

    def _document(self, obj: dict[str, Any], path: str, line: int, page_id: str | None) -> dict[str, Any] | Rejection | None:
        doc = obj.get("doc", obj.get("_source", obj)) if "text" not in obj else obj
        if not isinstance(doc, dict):
            return Rejection(path, line, "not_object", "document is not an object")
        if doc.get("namespace", 0) not in self.spec.namespaces:
            return None
        if self.spec.text is None:
            return doc
        rec = text_record(doc, self.spec.text, path, line)
        if isinstance(rec, Rejection):
            return rec
        return {"text": rec["text"], "title": doc.get("title"), "namespace": doc.get("namespace", 0),
                "id": page_id if page_id else doc.get("page_id")}
