"""CSV and TSV with real CSV quoting (quoted fields may span lines); columns become fields.

    sources: [{path: "banking77/train.tsv", text: text}]                       # header row
    sources: [{path: "goemotions/train.tsv", columns: [text, labels, id]}]     # no header

A header row names the columns unless ``columns`` is given (then ``header: true`` skips the
file's own header, and ``header: false`` says there is none). Positions are byte offsets of a
row's first line, so a row is re-read by seeking. A row with the wrong number of fields is
rejected as ``bad_row``; a field that is not UTF-8 as ``bad_utf8``. Files are not byte-split: a
cut could fall inside a quoted multi-line field.

Quoting is RFC 4180's, strictly: a closing quote followed by anything but the delimiter or the
line end is malformed (``bad_csv`` on one line). An unbalanced quote must not swallow the rows
after it: a quoted field still open at the end of the file, or "closed" on a later line by a quote
followed by text, is rejected as ``unbalanced_quote``, one running over ``max_record_bytes`` (or
:data:`MAX_ROW_LINES` lines) as ``too_large``, and a multi-line row with the wrong number of
fields as ``bad_row``; each rejects only the row's first line (file:line), and reading resumes
on the line after it, so the good rows below are kept.
"""

from __future__ import annotations

import bisect
import csv
import itertools
from collections.abc import Iterator
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.csv_types import CHUNK_ROWS, ColumnKinds, convert, pandas_names
from feedline._sources.jsonl import text_record
from feedline._sources.lines import LineReader, Oversized, is_broken, iter_lines, line_size
from feedline._sources.reader import Item, Split
from feedline.errors import SourceError

__all__ = ["MAX_ROW_LINES", "CsvReader", "TsvReader"]

#: A quoted field may span this many lines; a row running longer is taken for an unbalanced quote.
MAX_ROW_LINES = 10_000


class _Overflow(Exception):
    """The row being read passed the size or line bound."""

# Quoted fields can be long (whole documents); the csv module's default cap is 128 KiB.
csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))


class _Cursor:
    """Feeds decoded lines to ``csv.reader``; remembers where the last line handed out ends and
    the lines of the row being read (bounded by ``max_bytes`` and :data:`MAX_ROW_LINES`)."""

    def __init__(self, lines: Iterator[tuple[int, bytes]], position: int, line: int, max_bytes: int = 1 << 62) -> None:
        self.lines = lines
        self.end = position
        self.line = line
        self.max_bytes = max_bytes
        self.taken: list[tuple[int, bytes]] = []
        self.size = 0
        self.eof = False

    def start_row(self) -> None:
        self.taken, self.size, self.eof = [], 0, False

    def __iter__(self) -> _Cursor:
        return self

    def __next__(self) -> str:
        try:
            pos, raw = next(self.lines)
        except StopIteration:
            self.eof = True
            raise
        self.end = pos + line_size(raw)
        self.line += 1
        self.taken.append((pos, raw))
        self.size += line_size(raw)
        if isinstance(raw, Oversized) or self.size > self.max_bytes or len(self.taken) > MAX_ROW_LINES:
            raise _Overflow
        return raw.decode("utf-8", errors="surrogateescape")


class CsvReader(LineReader):
    """Reads delimited text; ``delimiter`` defaults to ``,`` (``\\t`` for ``tsv``)."""

    name = "csv"
    splittable = False
    default_delimiter = ","

    def _reader(self, cursor: _Cursor) -> Any:
        # strict: a closing quote followed by anything but a delimiter or a line end is an error
        # (RFC 4180), not text glued to the field, so a stray quote cannot swallow the rows below it.
        return csv.reader(cursor, delimiter=self.spec.delimiter or self.default_delimiter, strict=True)

    def _header(self, path: str) -> tuple[list[str] | None, int]:
        """The column names and the byte offset where data rows start (cached per file)."""
        cache: dict[str, tuple[list[str] | None, int]] = self.__dict__.setdefault("_headers", {})
        if path not in cache:
            cache[path] = self._read_header(path)
        return cache[path]

    def _read_header(self, path: str) -> tuple[list[str] | None, int]:
        if not self.spec.header:
            if not self.spec.columns:
                raise SourceError(f"{path}: header: false needs columns: naming the columns")
            return list(self.spec.columns), 0
        lines = iter_lines(path, 0)
        try:
            cursor = _Cursor(lines, 0, 0)
            first = next(self._reader(cursor), None)
        finally:
            lines.close()  # type: ignore[attr-defined]
        if first is None:
            return None, 0
        if self.spec.columns:
            return list(self.spec.columns), cursor.end
        return (pandas_names(first) if self.spec.infer_types else [c.strip() for c in first]), cursor.end

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        columns, data_start = self._header(split.path)
        if columns is None:
            return
        if position < data_start:
            position, line = data_start, 1 if self.spec.header else 0
        yield from super().read(Split(split.file, split.path, 0, None, split.size), position, line)

    def records(self, lines: Iterator[tuple[int, bytes]], path: str, line: int, known: bool,
                end: int | None) -> Iterator[Item]:
        text = self.spec.text
        if not self.spec.infer_types:
            for start, nxt, ln, rec in self._rows(lines, path, line):
                yield start, nxt, ln, text_record(rec, text, path, ln) if type(rec) is dict else rec
            return
        starts, kinds = self._chunk_kinds(path)
        for start, nxt, ln, rec in self._rows(lines, path, line):
            if type(rec) is dict:
                chunk = kinds[max(0, bisect.bisect_right(starts, start) - 1)] if kinds else []
                rec = text_record({k: convert(v, kind) for (k, v), kind in zip(rec.items(), chunk, strict=True)},
                                  text, path, ln)
            yield start, nxt, ln, rec

    def _chunk_kinds(self, path: str) -> tuple[list[int], list[list[str]]]:
        """``infer_types``: where each chunk of :data:`CHUNK_ROWS` rows starts, and its column types.

        One pass over the file before its first row (cached per file): a row's types are those of
        its chunk, so any row, read from the start or after a resume, gets the same values.
        """
        cache: dict[str, tuple[list[int], list[list[str]]]] = self.__dict__.setdefault("_kinds", {})
        if path in cache:
            return cache[path]
        columns, data_start = self._header(path)
        width = len(columns or ())
        starts: list[int] = []
        kinds: list[list[str]] = []
        acc = ColumnKinds(width)
        lines = iter_lines(path, data_start, max_bytes=self.max_bytes)
        try:
            for n, (start, _nxt, _ln, rec) in enumerate(self._rows(lines, path, 1 if self.spec.header else 0)):
                if n % CHUNK_ROWS == 0:
                    if starts:
                        kinds.append(acc.kinds())
                        acc = ColumnKinds(width)
                    starts.append(start)
                if type(rec) is dict:
                    acc.add(list(rec.values()))
        except Exception as e:  # a broken stream: the rows before the break are typed; reading reports it
            if isinstance(e, SourceError) or not is_broken(e):
                raise
        finally:
            lines.close()  # type: ignore[attr-defined]
        if starts:
            kinds.append(acc.kinds())
        cache[path] = starts, kinds
        return starts, kinds

    def _rows(self, lines: Iterator[tuple[int, bytes]], path: str, line: int) -> Iterator[Item]:
        """Rows as ``{column: cell}`` (cells as written) or rejections."""
        columns, _ = self._header(path)
        infer = self.spec.infer_types
        first = next(lines, None)
        if first is None or columns is None:
            return
        cursor = _Cursor(_chain(first, lines), first[0], line, self.max_bytes)
        reader = self._reader(cursor)
        while True:
            start, start_line = cursor.end, cursor.line + 1
            cursor.start_row()
            bad: Rejection | None = None
            try:
                row = next(reader, None)
            except _Overflow:
                bad = self.too_large(path, start_line, cursor.size)
                if len(cursor.taken) > MAX_ROW_LINES:
                    bad = Rejection(path, start_line, "unbalanced_quote",
                                    f"a quoted field opened here runs over {MAX_ROW_LINES:,} lines")
                row = None
            except csv.Error as e:
                bad, row = self._malformed(path, start_line, cursor, e), None
            multi = len(cursor.taken) > 1
            if bad is None and row is not None and multi and cursor.eof:
                bad = Rejection(path, start_line, "unbalanced_quote",
                                f"a quoted field opened here is still open at the end of the file ({len(cursor.taken)} lines)")
            if bad is None and row is not None and multi and (len(row) > len(columns) if infer else len(row) != len(columns)):
                bad = Rejection(path, start_line, "bad_row",
                                f"{len(row)} fields over {len(cursor.taken)} lines, expected {len(columns)}; "
                                "an unbalanced quote on this line?")
            if bad is not None:
                # Reject the row's first line only and read on from the line after it.
                first_pos, first_raw = cursor.taken[0]
                yield first_pos, first_pos + line_size(first_raw), start_line, bad
                rest = cursor.taken[1:]
                cursor = _Cursor(itertools.chain(rest, cursor.lines), first_pos + line_size(first_raw), start_line,
                                 self.max_bytes)
                reader = self._reader(cursor)
                continue
            if row is None:
                return
            if not row or row == [""]:
                continue
            if infer and len(cursor.taken) == 1 and not cursor.taken[0][1].strip():
                continue  # a line of blanks is no row for pandas
            yield start, cursor.end, cursor.line, self._record(row, columns, path, start_line)

    @staticmethod
    def _malformed(path: str, line: int, cursor: _Cursor, e: csv.Error) -> Rejection:
        """The rejection of a row ``csv`` refused: a quote left open at the end of the file, one that
        closes on a later line followed by text (an unbalanced quote), or bad quoting on one line."""
        lines = len(cursor.taken)
        if cursor.eof:
            return Rejection(path, line, "unbalanced_quote",
                             f"a quoted field opened here is still open at the end of the file ({lines} lines)")
        if lines > 1:
            return Rejection(path, line, "unbalanced_quote",
                             f"a quoted field opened here closes on line {cursor.line} followed by text ({e}); "
                             'a quote inside a quoted field is written twice ("")')
        return Rejection(path, line, "bad_csv", f'{e}: a closing quote must end the field; write a quote inside a quoted field twice ("")')

    def _record(self, row: list[str], columns: list[str], path: str, line: int) -> dict[str, Any] | Rejection:
        """The row as ``{column: cell}``; with ``infer_types`` a short row's missing cells are ``None``."""
        cells: list[str | None] = list(row)
        if len(row) < len(columns) and self.spec.infer_types:
            cells += [None] * (len(columns) - len(row))
        elif len(row) != len(columns):
            return Rejection(path, line, "bad_row", f"{len(row)} fields, expected {len(columns)} ({', '.join(columns)})")
        try:
            for v in row:
                v.encode("utf-8")
        except UnicodeEncodeError as e:
            return Rejection(path, line, "bad_utf8", str(e))
        return dict(zip(columns, cells, strict=True))


def _chain(first: tuple[int, bytes], rest: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    yield first
    yield from rest


class TsvReader(CsvReader):
    """Tab-separated values, with CSV quoting."""

    name = "tsv"
    default_delimiter = "\t"
