"""Plain text: one record per line, per paragraph or per file; and the ``bert`` layout.

    sources: [{path: "books/*.txt.gz", unit: paragraph}]
    sources: [{path: "wiki_sentences.txt", format: bert}]

``unit: line`` (default) makes each non-blank line a record; with ``keep_blank`` every line is one,
blank ones too (``""``), and a lone ``\\r`` ends a line as ``\\n`` does: the rows of ``datasets``'
text builder (Python's universal newlines). A line's pieces between lone ``\\r``s are records at
their own byte offsets (a resume can start inside the line). ``unit: paragraph`` makes each run
of non-blank lines a record (its lines joined by ``"\\n"``). ``unit: file`` makes the whole file
one record (position 0). The ``bert`` format has one sentence per line and a blank line between
documents; a record is ``{"text": "<sentences joined by a space>", "sentences": [...]}``, which
is what sentence-order (SOP/NSP) tasks read.

A paragraph or document belongs to the byte-range split holding its first byte; its position is
the offset of its first line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.lines import LineReader, Oversized, _locate, line_size, open_decoded
from feedline._sources.reader import Item, Split
from feedline.errors import SourceError

__all__ = ["BertReader", "TextReader"]


def _decode(raw: bytes, path: str, line: int | None) -> str | Rejection:
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        return Rejection(path, line, "bad_utf8", str(e))


class _BlockReader(LineReader):
    """Groups runs of non-blank lines into one record each (see :meth:`make`)."""

    def make(self, lines: list[str]) -> dict[str, Any]:
        raise NotImplementedError

    def records(self, lines: Iterator[tuple[int, bytes]], path: str, line: int, known: bool,
                end: int | None) -> Iterator[Item]:
        block: list[str] = []
        start = first_line = size = 0
        bad: Rejection | None = None
        nxt = 0
        for pos, raw in lines:
            big = isinstance(raw, Oversized)
            if not big and not raw.strip():
                if block or bad:
                    yield start, pos + len(raw), line + 1, _locate(bad or self.make(block), start, known)
                    block, bad, size = [], None, 0
                line += 1
                continue
            if not block and bad is None:
                if end is not None and pos >= end:
                    return
                start, first_line = pos, line + 1
            line += 1
            nxt = pos + line_size(raw)
            size += line_size(raw)
            if size > self.max_bytes:  # the block is dropped as it is read: memory stays bounded
                bad = bad or self.too_large(path, first_line if known else None, size)
                block = []
                continue
            text = _decode(raw, path, line if known else None)
            if isinstance(text, Rejection):
                bad = bad or Rejection(path, first_line if known else None, text.reason, f"line {line}: {text.detail}")
            else:
                block.append(text)
        if block or bad:
            yield start, nxt, line, _locate(bad or self.make(block), start, known)

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        if position == split.start and split.start > 0:
            position = _block_start(split.path, position)
        return super().read(split, position, line)


def _line_starts_at(path: str, position: int) -> bool:
    """Whether a line of a plain file starts at ``position`` (the byte before it ends a line)."""
    with open(path, "rb") as f:
        f.seek(position - 1)
        return f.read(1) == b"\n"


def _block_start(path: str, start: int) -> int:
    """The first offset ``>= start`` where a block begins: a non-blank line after a blank one.

    Byte ranges are cut at arbitrary offsets; a block belongs to the range holding its first
    byte, so the next range starts at the first block beginning at or after the cut.
    """
    with open(path, "rb") as f:
        back = max(0, start - (1 << 16))
        f.seek(back)
        before = f.read(start - back)
        # The line holding byte start-1: its head (up to start-1) and the rest of it.
        head = before[before.rfind(b"\n", 0, len(before) - 1) + 1:]
        tail = b"" if before.endswith(b"\n") else f.readline()
        prev_blank = not (head + tail).strip()
        pos = start + len(tail)
        for raw in f:
            blank = not raw.strip()
            if prev_blank and not blank:
                return pos
            prev_blank = blank
            pos += len(raw)
        return pos


class TextReader(_BlockReader):
    """Reads text files by ``unit``: ``line``, ``paragraph`` or ``file``."""

    name = "text"

    @property
    def splittable(self) -> bool:  # type: ignore[override]
        return self.spec.unit != "file"

    def make(self, lines: list[str]) -> dict[str, Any]:
        return {"text": "\n".join(lines)}

    def parse(self, raw: bytes, path: str, line: int | None) -> dict[str, Any] | Rejection | None:
        text = _decode(raw, path, line)
        if isinstance(text, Rejection):
            return text
        return {"text": text} if text.strip() else None

    def records(self, lines: Iterator[tuple[int, bytes]], path: str, line: int, known: bool,
                end: int | None) -> Iterator[Item]:
        if self.spec.unit == "paragraph":
            return super().records(lines, path, line, known, end)
        if self.spec.keep_blank:
            return self._every_line(lines, path, line, known, end)
        return LineReader.records(self, lines, path, line, known, end)

    def _every_line(self, lines: Iterator[tuple[int, bytes]], path: str, line: int, known: bool,
                    end: int | None) -> Iterator[Item]:
        """``keep_blank``: each line a record, split at lone ``\\r`` too; pieces keep their byte offsets."""
        for pos, raw in lines:
            if end is not None and pos >= end:
                return
            line += 1
            size = line_size(raw)
            if isinstance(raw, Oversized):
                yield pos, pos + size, line, _locate(self.too_large(path, line if known else None, size), pos, known)
                continue
            body = raw[:-1] if raw.endswith(b"\n") else raw
            if body.endswith(b"\r"):
                body = body[:-1]
            at = pos
            pieces = body.split(b"\r")  # (a byte never inside a UTF-8 sequence)
            for i, piece in enumerate(pieces):
                nxt = pos + size if i == len(pieces) - 1 else at + len(piece) + 1
                try:
                    rec: dict[str, Any] | Rejection = {"text": piece.decode("utf-8")}
                except UnicodeDecodeError as e:
                    rec = _locate(Rejection(path, line if known else None, "bad_utf8", str(e)), at, known)
                yield at, nxt, line, rec
                at = nxt

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        if self.spec.unit == "file":
            return self._whole(split, position)
        if self.spec.unit == "line":
            if self.spec.keep_blank and split.end is not None and position >= split.end \
                    and not _line_starts_at(split.path, position):
                # resuming inside a line that began in this split: read the rest of that line only
                split = Split(split.file, split.path, split.start, position + 1, split.size)
            return LineReader.read(self, split, position, line)
        return super().read(split, position, line)

    def _whole(self, split: Split, position: int) -> Iterator[Item]:
        if position > 0:
            return
        f, _ = open_decoded(split.path)
        try:
            with f:
                data = f.read(self.max_bytes + 1)
        except SourceError:
            raise
        except (OSError, EOFError, ValueError) as e:
            yield 0, 0, 0, Rejection(split.path, None, "truncated", f"{type(e).__name__}: {e}")
            return
        if len(data) > self.max_bytes:
            yield 0, 1, 0, self.too_large(split.path, None, split.size or len(data))
            return
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        text = _decode(data, split.path, None)
        if isinstance(text, Rejection):
            yield 0, 1, 0, text
        elif text.strip():
            yield 0, 1, data.count(b"\n"), {"text": text}
        else:
            yield 0, 1, 0, Rejection(split.path, None, "empty", "the file holds no text")


class BertReader(_BlockReader):
    """One sentence per line, blank lines between documents (BERT pre-training layout)."""

    name = "bert"

    def make(self, lines: list[str]) -> dict[str, Any]:
        sentences = [s.strip() for s in lines if s.strip()]
        return {"text": " ".join(sentences), "sentences": sentences}
