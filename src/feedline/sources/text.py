"""Plain text: one record per line (``unit: line``), paragraph, or file.

    sources: [{path: "books/*.txt.gz", unit: line}]
"""

from __future__ import annotations

from collections.abc import Iterator

from feedline.core.record import Rejection
from feedline.sources.lines import iter_lines
from feedline.sources.reader import Item, Reader, Split

__all__ = ["TextReader"]


class TextReader(Reader):
    """Reads text files; blank lines are not records in ``line`` mode."""

    name = "text"

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        for pos, raw in iter_lines(split.path, position, split.end):
            line += 1
            nxt = pos + len(raw)
            try:
                text = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                yield pos, nxt, line, Rejection(split.path, line, "bad_utf8", str(e))
                continue
            if text.strip():
                yield pos, nxt, line, {"text": text}
