"""The units that flow through a pipeline: records, rejections and examples.

Every record has a stable **key** ``(source, file, position)`` of three integers: the index of
the source in the spec, the index of the file in that source's sorted file list, and the
reader's position of the record in the file (a byte offset into the decoded stream, or a row
number). Keys are what resume states hold: never text.

Examples (task outputs) add the record's epoch and ``sub``, the index among the examples that
one record produced. ``ExampleRef = [source, file, position, epoch, sub]`` names an example in
a state, so a buffered example can be rebuilt by re-reading its record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["TEXT_FIELD_ADVICE", "Example", "ExampleRef", "Key", "Record", "Rejection", "get_path", "text_record"]

Key = tuple[int, int, int]
ExampleRef = tuple[int, int, int, int, int]


@dataclass(slots=True)
class Record:
    """One raw record: its key, the epoch it was read in, and its fields (text under ``"text"``)."""

    key: Key
    epoch: int
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record was not delivered: file, 1-based line (or row), reason code, detail.

    A stage past the reader (a task) knows only the record's ``key``; the accounting
    (:class:`~feedline._core.report.Rejections`) turns it into file and line before reporting.
    """

    path: str
    line: int | None
    reason: str
    detail: str = ""
    key: Key | None = None

    def describe(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


@dataclass(slots=True)
class Example:
    """A task's output for one record (or one piece of it): 1-D arrays per field."""

    key: Key
    epoch: int
    sub: int
    fields: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def ref(self) -> ExampleRef:
        return (*self.key, self.epoch, self.sub)

    @property
    def length(self) -> int:
        """Number of tokens (length of ``input_ids``)."""
        return int(self.fields["input_ids"].shape[0])


def get_path(data: Any, dotted: str) -> Any:
    """Look up ``a.b.c`` in nested mappings; ``KeyError`` when absent.

        >>> get_path({"body": {"text": "hi"}}, "body.text")
        'hi'
    """
    cur = data
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise KeyError(dotted)
    return cur


#: The advice of a ``missing_field`` rejection (a whole-record task's error replaces it: :mod:`~feedline._core.report`).
TEXT_FIELD_ADVICE = "; set the source's text: to the field holding the text"


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
        have = ", ".join(sorted(obj)[:12]) or "no fields"
        return Rejection(path, line, "missing_field",
                         f"no field {field!r}; records have: {have}{TEXT_FIELD_ADVICE}")
    if not isinstance(text, str):
        return Rejection(path, line, "not_string", f"field {field!r} is {type(text).__name__}")
    if not text.strip():  # before any tokenizer: the same records for every tokenizer (docs/sources.md, 'empty')
        what = "is empty" if not text else "holds only whitespace, which is read as empty"
        return Rejection(path, line, "empty", f"field {field!r} {what}")
    if field != "text" or obj.get("text") is not text:
        obj = {**obj, "text": text}
    return obj
