"""A Python iterable or generator as a source, for users who already have one.

    >>> spec = {"sources": [{"iterable": ["first document", "second document"]}]}
    >>> def docs():
    ...     yield {"text": "hello", "label": 1}
    >>> spec = {"sources": [{"iterable": docs}]}        # a callable returning a fresh iterator

Items are strings (becoming ``{"text": s}``) or mappings (checked like JSON records).
Positions are indices. A resume, or re-reading buffered records, iterates again from the start:
that needs a re-iterable object (a list, or a callable returning a new iterator). A one-shot
iterator (a generator object) can be read once from the start; anything else raises
:class:`~feedline.errors.SourceError`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.jsonl import text_record
from feedline._sources.reader import Item, Reader, Split
from feedline.errors import SourceError

__all__ = ["IterableReader"]


class IterableReader(Reader):
    """Reads the source's ``iterable``."""

    name = "iterable"

    def _iterate(self) -> Iterator[Any]:
        obj = self.spec.iterable
        if callable(obj) and not hasattr(obj, "__iter__"):
            return iter(obj())
        it = iter(obj)
        if it is obj:  # a one-shot iterator
            if self.__dict__.get("_used"):
                raise SourceError("iterable: a generator or iterator can be read only once; "
                                  "pass a list or a function returning a new iterator to resume or re-read")
            self.__dict__["_used"] = True
        return it

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        for i, item in enumerate(itertools.islice(self._iterate(), position, None), start=position):
            if isinstance(item, str):
                rec: dict[str, Any] | Rejection = {"text": item} if item.strip() else Rejection("<iterable>", i + 1, "empty")
            else:
                rec = text_record(dict(item) if hasattr(item, "keys") else item, self.spec.text, "<iterable>", i + 1)
            yield i, i + 1, i + 1, rec
