"""Parquet: row groups are splits, columns are projected, positions are row indices.

    sources: [{path: "data/train-*.parquet", columns: [text, url]}]

A file with many row groups spreads over workers and shuffles by row group. Only the columns
named in ``columns`` (plus the text column) are read when ``columns`` is given. A record is
re-read by decoding just its row group.

With fewer row groups than partitions, the deal cuts a group into row ranges
(:mod:`feedline._sources.deal`), the same on every placement. A partition reading a piece of a
group decodes it :data:`PIECE_ROWS` rows at a time from the group's start (Parquet cannot seek
inside a column chunk's pages), drops the blocks before its first row unconverted, and stops after
its last (:func:`parquet_blocks`): it holds one block, not the whole group, and converts and
decodes nothing past its share, where it used to decode the whole group into memory in every
partition and drop the rows of the others.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.arrow import rows
from feedline._sources.files import is_url
from feedline._sources.reader import Item, Reader, Split
from feedline.errors import SourceError

__all__ = ["PIECE_ROWS", "ParquetReader", "open_parquet", "parquet_blocks", "row_group_splits"]

#: Rows decoded at a time from a row group that partitions share (a split that is a piece of it).
PIECE_ROWS = 8192


def open_parquet(path: str) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` for a local path or URL; a :class:`SourceError` naming it if unreadable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if is_url(path):
            import fsspec

            return pq.ParquetFile(fsspec.open(path, "rb").open())
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise SourceError(f"{path}: file not found") from None
    except (OSError, pa.ArrowInvalid) as e:
        raise SourceError(f"{path}: not a readable Parquet file ({e})") from e


def row_group_splits(file: int, path: str) -> list[Split]:
    """One split per row group of a Parquet file (rows ``[start, end)``)."""
    meta = open_parquet(path).metadata
    out, start = [], 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        out.append(Split(file, path, start, start + n))
        start += n
    return out or [Split(file, path, 0, 0)]


def parquet_blocks(pf: Any, position: int, end: int, columns: list[str] | None) -> Iterator[tuple[int, Any]]:
    """``(first row, table)`` blocks of ``pf`` covering rows ``[position, end)``: a row group that lies
    inside them whole, read at once; one cut by them (a partition's piece), :data:`PIECE_ROWS` rows
    at a time, none after ``end`` and none yielded before ``position`` (see the module docstring).

    Raises:
        KeyError: a column in ``columns`` is not in the file.
    """
    first = 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if first >= end:
            return
        if first + n > position:
            if position <= first and first + n <= end:
                yield first, pf.read_row_group(g, columns=columns)
            else:
                yield from _piece(pf, g, first, position, end, columns)
        first += n


def _piece(pf: Any, g: int, first: int, position: int, end: int, columns: list[str] | None) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa

    at = first
    for batch in pf.iter_batches(batch_size=PIECE_ROWS, row_groups=[g], columns=columns, use_threads=False):
        if at + batch.num_rows > position:
            yield at, pa.Table.from_batches([batch])
        at += batch.num_rows
        if at >= end:
            return


class ParquetReader(Reader):
    """Reads Parquet files, one split per row group."""

    name = "parquet"

    def _columns(self) -> list[str] | None:
        cols = self.spec.columns
        if not cols:
            return None
        top = self.spec.text.split(".")[0] if self.spec.text else None
        return [*cols, top] if top and top not in cols else list(cols)

    def splits(self, file: int, path: str) -> list[Split]:
        return row_group_splits(file, path)

    def extent(self, split: Split) -> tuple[int, int] | None:
        return None if split.end is None else (split.start, split.end)

    def _group(self, pf: Any, position: int) -> tuple[int, int]:
        """The row group holding ``position`` and the group's first row."""
        start = 0
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if position < start + n:
                return g, start
            start += n
        raise SourceError(f"{pf}: no row {position}; the file changed since the state was saved")

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        pf = open_parquet(split.path)
        end = split.end if split.end is not None else pf.metadata.num_rows
        if position < end and end > pf.metadata.num_rows:   # a file that shrank since it was split: named
            self._group(pf, max(position, pf.metadata.num_rows))
        blocks = parquet_blocks(pf, position, end, self._columns())
        while True:
            try:
                first, table = next(blocks)
            except StopIteration:
                return
            except KeyError as e:
                raise SourceError(f"{split.path}: no column {e}; check the source's columns:") from e
            if end < first + table.num_rows:  # a piece of a row group (partitions)
                table = table.slice(0, end - first)
            yield from rows(table, max(0, position - first), split.path, self.spec.text, first)

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        pf = open_parquet(path)
        groups: dict[int, list[int]] = {}
        for p in set(positions):
            g, first = self._group(pf, p)
            groups.setdefault(g, []).append(p)
        found: dict[int, dict[str, Any]] = {}
        for g, ps in groups.items():
            _, first = self._group(pf, ps[0])
            table = pf.read_row_group(g, columns=self._columns())
            for p in ps:
                rec = next(rows(table.slice(p - first, 1), 0, path, self.spec.text, p))[3]
                if isinstance(rec, Rejection):
                    raise SourceError(f"{path}: row {p} is now rejected ({rec.reason}); the data changed since the state was saved")
                found[p] = rec
        return found
