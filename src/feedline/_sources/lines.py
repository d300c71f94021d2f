"""Line-oriented reading with exact byte positions, shared by the line-based formats.

Positions are offsets into the *decoded* byte stream (decompressed; UTF-16 transcoded to UTF-8),
so a key means the same whether a file is plain or compressed. A plain local file seeks straight
to a position; other streams are read forward to it.

:class:`LineReader` is the base of ``text``, ``bert``, ``jsonl`` and ``cirrus``: it splits a
large plain file into byte ranges, aligns each range to the first line starting inside it (a
record belongs to the split holding its first byte), turns a broken compressed stream into a
``truncated`` rejection after delivering every good line before it, and re-reads single
records by seeking.

Lines are read with a bound (the source's ``max_record_bytes``): a longer line is skipped in
chunks, never held whole, and becomes a ``too_large`` rejection. A plain file that ends before
the size it had when its splits were planned (truncated by another process) yields a
``truncated`` rejection after its last line.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.files import codec_of, is_url, open_binary, size_of
from feedline._sources.linestream import (
    BOM,
    Oversized,
    _bounded,
    is_broken,
    iter_lines,
    line_size,
    lines_from,
    open_decoded,
)
from feedline._sources.linestream import is_utf16 as _is_utf16
from feedline._sources.reader import Item, Reader, Split
from feedline.errors import SourceError

__all__ = ["BOM", "MISS", "LineReader", "Oversized", "is_broken", "iter_lines", "open_decoded"]

#: What :meth:`LineReader.fast_parser` returns for a line it leaves to :meth:`LineReader.parse`.
MISS: Any = object()


class LineReader(Reader):
    """Base of line-based formats: subclasses implement :meth:`parse` (or override :meth:`records`).

    ``parse(raw, path, line)`` returns a record, a :class:`Rejection`, or ``None`` for lines
    that are not records (blank lines, bulk action lines).
    """

    splittable = True

    def parse(self, raw: bytes, path: str, line: int | None) -> dict[str, Any] | Rejection | None:
        raise NotImplementedError

    def splits(self, file: int, path: str) -> list[Split]:
        size = size_of(path) if codec_of(path) is None else None
        step = self.spec.split_bytes
        if size is None or _is_utf16(path):
            return [Split(file, path)]
        if not self.splittable or size <= step:
            return [Split(file, path, size=size)]
        return [Split(file, path, s, min(s + step, size), size) for s in range(0, size, step)]

    def extent(self, split: Split) -> tuple[int, int] | None:
        """Byte ranges of a plain file cut anywhere (a record belongs to the piece holding its first byte)."""
        if not self.splittable or split.size is None:
            return None
        return split.start, split.size if split.end is None else split.end

    def records(self, lines: Iterator[tuple[int, bytes]], path: str, line: int, known: bool,
                end: int | None) -> Iterator[Item]:
        """Turn ``(position, raw)`` lines into items; lines starting at or after ``end`` are not read."""
        for pos, raw in lines:
            if end is not None and pos >= end:
                return
            line += 1
            if isinstance(raw, Oversized):
                yield pos, pos + raw.size, line, _locate(self.too_large(path, line if known else None, raw.size), pos, known)
                continue
            rec = self.parse(raw, path, line if known else None)
            if rec is not None:
                yield pos, pos + len(raw), line, _locate(rec, pos, known)

    def too_large(self, path: str, line: int | None, size: int) -> Rejection:
        """The rejection of a record of ``size`` bytes, over the source's ``max_record_bytes``."""
        return Rejection(path, line, "too_large",
                         f"{size:,} bytes, over max_record_bytes ({self.max_bytes:,}); raise the source's max_record_bytes to keep it")

    @property
    def max_bytes(self) -> int:
        return int(getattr(self.spec, "max_record_bytes", 32 << 20))

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        batches = self.read_batches(split, position, line)
        return self._read_lines(split, position, line) if batches is None else _flatten(batches)

    def fast_parser(self) -> Callable[[bytes], Any] | None:
        """A parser of the common record (a line without its newline) for the block path, or ``None``.

        It returns the record, or :data:`MISS` for any line it does not settle (blank, bad, a field to
        check): :meth:`parse` then gets the line with its newline, so results are :meth:`parse`'s.
        """
        return None

    def read_batches(self, split: Split, position: int, line: int) -> Iterator[list[Item]] | None:
        """The items of :meth:`read` a block of lines at a time (uncompressed files and URLs), else ``None``."""
        if type(self).records is LineReader.records and codec_of(split.path) is None and not _is_utf16(split.path):
            return self._plain_batches(split, position, line)
        return None

    def _read_plain(self, split: Split, position: int, line: int) -> Iterator[Item]:
        """The items of a plain local file, from :meth:`_plain_batches`."""
        return _flatten(self._plain_batches(split, position, line))

    def _plain_batches(self, split: Split, position: int, line: int) -> Generator[list[Item], None, None]:
        """:meth:`_read_lines` for a plain local file, read in blocks and handed on a block of items at a time.

        Same items, positions, line numbers and rejections; a line longer than :data:`_LONG` (or the
        record bound) is handed to :meth:`_read_lines` with the rest of the split, which skips it in
        bounded memory.
        """
        path, end, limit, parse, fast = split.path, split.end, self.max_bytes, self.parse, self.fast_parser()
        known = split.start == 0
        last_start, last_end = position, position  # the last line read: where it starts and ends
        last_line = line  # the line number of the last item
        try:
            with open_binary(path) as f:  # a local file, or an uncompressed URL (seeks are ranged requests)
                pos = position
                if position == split.start and position > 0:  # aligned: start at the first line starting at or after it
                    f.seek(position - 1)
                    pos = position - 1 + line_size(next(_bounded(f, 1 << 20), b""))  # (a long line: its real size)
                else:
                    f.seek(position)
                tail = b""  # the start of a line the last block cut
                block = _FIRST_BLOCK  # small first (the first records wait for a whole block), then _BLOCK
                while True:
                    if end is not None and pos >= end:
                        return
                    chunk = f.read(block)
                    block = min(2 * block, _BLOCK)
                    if chunk:
                        buf = tail + chunk if tail else chunk
                        cut = buf.rfind(b"\n")
                        if cut < 0:
                            tail = buf
                            if len(buf) > min(limit, _LONG):  # a very long line
                                yield from ([item] for item in self._read_lines(split, pos, line))
                                return
                            continue
                        lines, tail = buf[:cut].split(b"\n"), buf[cut + 1:]
                        nl = 1
                    elif tail:  # the last line, without a newline
                        lines, tail, nl = [tail], b"", 0
                    else:
                        break
                    items: list[Item] = []
                    add = items.append
                    for raw in lines:
                        if end is not None and pos >= end:
                            break
                        start = pos
                        pos += len(raw) + nl
                        last_start, last_end = start, pos
                        line += 1
                        if len(raw) > limit:
                            last_line = line
                            add((start, pos, line, _locate(self.too_large(path, line if known else None, len(raw) + nl), start, known)))
                            continue
                        if start == 0 and raw.startswith(BOM):
                            raw, start = raw[len(BOM):], len(BOM)  # the record starts after the BOM
                            last_start = start
                        rec = fast(raw) if fast is not None else MISS
                        if rec is MISS:
                            rec = parse(raw + b"\n" if nl else raw, path, line if known else None)
                            if rec is None:
                                continue
                            if type(rec) is Rejection:
                                rec = _locate(rec, start, known)
                        last_line = line
                        add((start, start + len(raw) + nl, line, rec))
                    if items:
                        yield items
            if _shrank(path, last_end, split):
                yield [(last_end, last_end, last_line, _shrunk(path, last_end, split))]
        except SourceError:
            raise
        except Exception as e:
            if not is_broken(e):
                raise
            yield [(last_start, last_start, last_line, _broken(path, last_start, e))]

    def _read_lines(self, split: Split, position: int, line: int) -> Iterator[Item]:
        align = position == split.start and split.start > 0
        known = split.start == 0
        lines = iter_lines(split.path, position, align=align, max_bytes=self.max_bytes)
        last = [position, line, position]  # position of the last line read, its line number, where it ends

        def tracked() -> Iterator[tuple[int, bytes]]:
            for pos, raw in lines:
                last[0], last[2] = pos, pos + line_size(raw)
                yield pos, raw
            last[0] = -1

        try:
            for item in self.records(tracked(), split.path, line, known, split.end):
                last[1] = item[2]
                yield item
            if last[0] == -1 and _shrank(split.path, last[2], split):
                yield last[2], last[2], last[1], _shrunk(split.path, last[2], split)
        except SourceError:
            raise
        except Exception as e:
            if not is_broken(e):
                raise
            where = last[0] if last[0] >= 0 else position
            yield where, where, last[1], _broken(split.path, where, e)
        finally:
            lines.close()

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Seek one open plain local file to each position (a restore fetches thousands of short
        records: opening the file for each was most of it); one forward pass otherwise."""
        if codec_of(path) is not None or is_url(path) or _is_utf16(path):
            return super().fetch(path, positions)
        found: dict[int, dict[str, Any]] = {}
        f, _ = open_decoded(path)
        with f:
            for p in sorted(set(positions)):
                f.seek(p)
                items = self.records(lines_from(f, p, self.max_bytes), path, 0, True, None)  # one record
                try:
                    item = next(items, None)
                except Exception as e:
                    if not is_broken(e):
                        raise
                    item = None
                finally:
                    items.close()  # type: ignore[attr-defined]
                found[p] = self._fetched(path, p, item)
        return found

    @staticmethod
    def _fetched(path: str, p: int, item: Item | None) -> dict[str, Any]:
        """The record of the item read at byte ``p``, or the :class:`SourceError` saying the file changed."""
        if item is not None and p == 0 and item[0] == len(BOM):
            item = (0, *item[1:])  # a state saved before records of BOM files started after the BOM
        if item is None or item[0] != p or isinstance(item[3], Rejection):
            raise SourceError(f"{path}: no record at byte {p}; the file changed since the state was saved")
        return item[3]  # type: ignore[no-any-return]


#: Bytes read at a time by the plain-file path (from ``_FIRST_BLOCK``, doubling); lines longer than
#: ``_LONG`` go the bounded way.
_BLOCK = 1 << 20
_FIRST_BLOCK = 1 << 16


def _flatten(batches: Iterator[list[Item]]) -> Generator[Item, None, None]:
    """The items of lists of items; closing it closes ``batches`` (its file)."""
    try:
        for batch in batches:
            yield from batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
_LONG = 4 << 20


def _shrank(path: str, at: int, split: Split) -> bool:
    """Whether a split whose reading ended at byte ``at`` (its file's end) lost bytes it was planned with.

    The file must be shorter now than the split's planned end: the last line of an unchanged file
    may end past a split that holds no record (a long line across splits), which is no loss.
    """
    planned = split.end if split.end is not None else split.size
    if planned is None or at >= planned:
        return False
    now = size_of(path)
    return now is None or now < planned


def _shrunk(path: str, at: int, split: Split) -> Rejection:
    planned = split.end if split.end is not None else split.size
    return Rejection(path, None, "truncated",
                     f"the file ended at byte {at} but held {planned} bytes when reading was planned (now {size_of(path)}): "
                     "it shrank while being read; records before the end were delivered")


def _broken(path: str, where: int, e: BaseException) -> Rejection:
    return Rejection(path, None, "truncated",
                     f"stream broken after byte {where} ({type(e).__name__}: {e}); records before it were delivered")


def _locate(rec: dict[str, Any] | Rejection, pos: int, known: bool) -> dict[str, Any] | Rejection:
    """Rejections far into a split have no known line number: name the byte offset instead."""
    if isinstance(rec, Rejection) and not known:
        detail = f"at byte {pos}" + (f"; {rec.detail}" if rec.detail else "")
        return Rejection(rec.path, None, rec.reason, detail)
    return rec
