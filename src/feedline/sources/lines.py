"""Line-oriented reading with exact decoded byte positions, shared by line-based formats.

Positions are offsets into the *decoded* (decompressed) byte stream, so a key means the same
whether the file is plain or compressed. A plain file seeks straight to a position; a
compressed stream is read forward to it.
"""

from __future__ import annotations

from collections.abc import Iterator

from feedline.errors import SourceError
from feedline.sources.files import open_binary

__all__ = ["iter_lines"]

BOM = b"\xef\xbb\xbf"


def iter_lines(path: str, position: int, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(position, raw_line)`` from ``position`` until ``end`` (a line starting before ``end`` is read whole)."""
    try:
        f = open_binary(path)
    except SourceError:
        raise
    with f:
        try:
            if position:
                f.seek(position)
            pos = position
            for raw in f:
                if end is not None and pos >= end:
                    break
                start = pos
                pos += len(raw)
                if start == 0 and raw.startswith(BOM):
                    raw = raw[len(BOM):]
                yield start, raw
        except (OSError, EOFError, ValueError) as e:
            raise SourceError(f"{path}: stream broken near byte {position} ({e}); the file may be truncated") from e
