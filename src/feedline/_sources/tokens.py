"""Pre-tokenized Parquet and Arrow files: a column of token-id lists (and optionally labels).

    sources: [{path: "tokenized/*.parquet", format: tokens}]
    sources: [{path: "cache.arrow", format: tokens, tokens: {ids: input_ids, labels: null}}]

What ``datasets.map(tokenize)`` writes (``save_to_disk`` folders included) reads here without a
tokenizer: each row is a record ``{"input_ids": int32 array}`` plus ``"labels"`` when the labels
column exists (same length; ``-100`` marks tokens without loss). ``list<int32|int64|uint16|uint32>``
and ``large_list`` columns are accepted. Positions are row indices; Parquet row groups are splits.
A whole row group (or Arrow batch) is converted to one numpy buffer at a time, and each record's
ids are a view into it, so no per-token Python objects are made.

Rows whose ids are null or hold nulls are rejected (``null_ids``); a labels column of another
length per row is rejected by the task (``labels_length``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from feedline._core.documents import TokenItems
from feedline._core.record import Rejection
from feedline._sources.ahead import Ahead
from feedline._sources.arrow import open_table
from feedline._sources.parquet import open_parquet, parquet_blocks, row_group_splits
from feedline._sources.reader import Item, Reader, Split, detect_format
from feedline._spec import TokensSpec
from feedline.errors import SourceError

__all__ = ["TokensReader", "id_lists"]

#: An Arrow block holds at most this many rows ...
_ARROW_ROWS = 8192
#: ... and ends at its record batch's end where at least this many rows of it are left: its values
#: are then a view of the memory map. Rows of smaller batches are joined into one block (a copy).
_ARROW_MIN_ROWS = 512


def _numpy(arr: Any) -> np.ndarray:
    """A null-free integer Arrow array as numpy, read from its buffer (``to_numpy`` imports pandas: 0.6 s)."""
    dtype = np.dtype(str(arr.type))
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def id_lists(table: Any, column: str, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, offsets, null_rows)`` of a list column: row ``i`` is ``values[offsets[i]:offsets[i+1]]``.

    Values are int32 in one buffer; ``null_rows`` marks rows that are null or hold a null.
    """
    import pyarrow as pa

    if column not in table.column_names:
        raise SourceError(f"{path}: no column {column!r} (columns: {', '.join(table.column_names)}); "
                          "set the source's tokens: {{ids: ...}}")
    col = table.column(column)
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or not pa.types.is_integer(col.type.value_type):
        raise SourceError(f"{path}: column {column!r} holds {col.type}, not lists of integer token ids")
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    offsets = _numpy(col.offsets).astype(np.int64)
    child = col.values
    # pyarrow.compute (0.3 s to import) only where there are nulls to find
    nulls = col.is_null().to_numpy(zero_copy_only=False).astype(bool) if col.null_count else np.zeros(len(col), bool)
    if child.null_count:
        import pyarrow.compute as pc

        bad = np.concatenate([[0], np.cumsum(pc.is_null(child).to_numpy(zero_copy_only=False).astype(np.int64))])
        nulls |= bad[offsets[1:]] != bad[offsets[:-1]]
        child = pc.fill_null(child, 0)
    values = _numpy(child)
    # (a column of int32 or narrower holds nothing outside int32: no pass over its values to find out)
    if values.size and not np.can_cast(values.dtype, np.int32) and (
            values.max() > np.iinfo(np.int32).max or values.min() < np.iinfo(np.int32).min):
        raise SourceError(f"{path}: column {column!r} holds values outside int32 ({values.min()}..{values.max()}); "
                          "these are not token ids")
    return values.astype(np.int32, copy=False), offsets, nulls


def _arrow_blocks(table: Any, position: int, stop: int) -> Iterator[tuple[int, Any]]:
    """``(first row, table)`` blocks of ``table``'s rows ``[position, stop)``: at most :data:`_ARROW_ROWS`
    rows each, ending where a record batch ends unless fewer than :data:`_ARROW_MIN_ROWS` of its rows
    are left. A block inside one record batch is a view of the file; one across several is copied
    into one buffer (:func:`id_lists`), which for the bench's batches of 2,048 long documents was
    ~12 ms of the reading thread per 8,192 rows (9.4 M ids)."""
    ends = np.cumsum([len(c) for c in table.column(0).chunks]) if table.num_columns else np.zeros(0, np.int64)
    first = position
    while first < stop:
        last = min(stop, first + _ARROW_ROWS)
        k = int(np.searchsorted(ends, first, side="right"))
        if k < len(ends) and ends[k] - first >= _ARROW_MIN_ROWS:
            last = min(last, int(ends[k]))
        yield first, table.slice(first, last - first)
        first = last


def _read_group(first: int, pf: Any, group: int, columns: list[str]) -> tuple[int, Any]:
    """Row group ``group`` of ``pf`` (its first row ``first``) as one block, decoded on the calling
    thread alone (Arrow's pool would take the core the batches are made on; there is time enough)."""
    return first, pf.read_row_group(group, columns=columns, use_threads=False)


class TokensReader(Reader):
    """Reads token-id columns of Parquet (row groups are splits) and Arrow files."""

    name = "tokens"
    pretokenized: ClassVar[bool] = True

    @property
    def options(self) -> TokensSpec:
        return self.spec.tokens or TokensSpec()

    def _parquet(self, path: str) -> bool:
        """Whether ``path`` is a Parquet file (told once per path: asked a few times a row group)."""
        known = self.__dict__.setdefault("_formats", {})
        if path not in known:
            try:
                known[path] = detect_format(path) == "parquet"
            except SourceError:
                known[path] = False
        return known[path]  # type: ignore[no-any-return]

    def _columns(self, available: Sequence[str]) -> list[str]:
        o = self.options
        return [o.ids] + ([o.labels] if o.labels and o.labels in available and o.labels != o.ids else [])

    def splits(self, file: int, path: str) -> list[Split]:
        if not self._parquet(path):
            return [Split(file, path)]
        return row_group_splits(file, path)

    def extent(self, split: Split) -> tuple[int, int] | None:
        if split.end is not None:
            return split.start, split.end
        return None if self._parquet(split.path) else (split.start, open_table(split.path).num_rows)

    def read_ahead(self, split: Split) -> None:
        """Decode ``split`` (a whole Parquet row group) on a thread while the split before it is read
        (:class:`~feedline._sources.ahead.Ahead`): Arrow's decoding, ~12 ns a token, then overlaps the
        batches made of the split before, where it used to stop them. Asked when the split before
        is opened, it starts once that split's first block is decoded; the reader's first hint is
        not taken (the first batch and the decoding of its group have the cores to themselves: on
        the loaded 2-core box the first batch took 0.6-1.5 s beside the next group's decoding,
        0.1-1.1 s without)."""
        if not self.__dict__.get("_hinted"):
            self.__dict__["_hinted"] = True
        elif split.end is not None and self._parquet(split.path):
            self.__dict__["_next"] = split

    def _start_next(self) -> None:
        """Start decoding the split :meth:`read_ahead` named, if any (at most two wait at once), where it
        is a whole row group."""
        split = self.__dict__.pop("_next", None)
        group = self._group(split) if split is not None else None
        if split is not None and group is not None:
            ahead = self.__dict__.setdefault("_ahead", {})
            ahead[(split.path, split.start, split.end)] = Ahead(_read_group, split.start, *group)
            while len(ahead) > 2:
                del ahead[next(iter(ahead))]

    def _group(self, split: Split) -> tuple[Any, int, list[str]] | None:
        """``(file, row group, columns)`` where ``split`` is a whole row group of its file, for the
        read-ahead thread; ``None`` otherwise, or where the file cannot be read (reading the split
        then meets the error as before). The file is opened and its groups listed once (the last
        two files are kept, per process): done per group on the read-ahead thread, that Python work
        (~0.3 ms) held the GIL while the batches waited for it."""
        files = self.__dict__.setdefault("_files", {})
        key = (os.getpid(), split.path)
        if key not in files:
            try:
                pf = open_parquet(split.path)
                groups, first = {}, 0
                for g in range(pf.metadata.num_row_groups):
                    n = pf.metadata.row_group(g).num_rows
                    groups[(first, first + n)] = g
                    first += n
                files[key] = (pf, groups, self._columns(pf.schema_arrow.names))
            except Exception:  # met again where the split is read
                files[key] = None
            while len(files) > 2:
                del files[next(iter(files))]
        got = files[key]
        at = None if got is None else got[1].get((split.start, split.end))
        return None if at is None else (got[0], at, got[2])

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_ahead", "_next", "_files")}

    def _blocks(self, path: str, position: int, end: int | None) -> Iterator[tuple[int, Any]]:
        """``(first row, table)`` blocks covering rows from ``position`` (to ``end``)."""
        if self._parquet(path):
            ahead = self.__dict__.get("_ahead", {}).pop((path, position, end), None)
            got = ahead.result() if ahead is not None else None
            if got is not None:  # decoded ahead (a failure there is met again below, and raised)
                self._start_next()
                yield got
                return
            pf = open_parquet(path)
            stop = pf.metadata.num_rows if end is None else end
            for block in parquet_blocks(pf, position, stop, self._columns(pf.schema_arrow.names)):
                self._start_next()
                yield block
            return
        table = open_table(path)
        table = table.select(self._columns(table.column_names)) if self.options.ids in table.column_names else table
        stop = table.num_rows if end is None else min(end, table.num_rows)
        yield from _arrow_blocks(table, position, stop)

    def _rows(self, path: str, first: int, table: Any) -> Iterator[tuple[int, dict[str, Any] | Rejection]]:
        o = self.options
        values, offsets, nulls = id_lists(table, o.ids, path)
        labels = None
        if o.labels and o.labels in table.column_names and o.labels != o.ids:
            labels = id_lists(table, o.labels, path)
        for i in range(table.num_rows):
            if nulls[i] or (labels is not None and labels[2][i]):
                yield first + i, Rejection(path, first + i + 1, "null_ids", f"row {first + i} has null token ids or labels")
                continue
            rec: dict[str, Any] = {"input_ids": values[offsets[i]:offsets[i + 1]]}
            if labels is not None:
                rec["labels"] = labels[0][labels[1][i]:labels[1][i + 1]]
            yield first + i, rec

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        for first, table in self._blocks(split.path, position, split.end):
            for row, rec in self._rows(split.path, first, table):
                if row < position:
                    continue
                if split.end is not None and row >= split.end:
                    return
                yield row, row + 1, row + 1, rec

    def read_batches(self, split: Split, position: int, line: int) -> Iterator[list[Item] | TokenItems]:
        """:meth:`read` a block at a time: a block without nulls or labels as a run of documents
        (views of its values buffer), any other as a list of items."""
        o = self.options
        for first, table in self._blocks(split.path, position, split.end):
            lo = max(0, position - first)
            hi = table.num_rows if split.end is None else min(table.num_rows, split.end - first)
            if hi <= lo:
                continue
            if o.labels and o.labels in table.column_names and o.labels != o.ids:
                yield [(row, row + 1, row + 1, rec) for row, rec in self._rows(split.path, first, table)
                       if first + lo <= row < first + hi]
                continue
            values, offsets, nulls = id_lists(table, o.ids, split.path)
            if nulls[lo:hi].any():
                yield [(row, row + 1, row + 1, rec) for row, rec in self._rows(split.path, first, table)
                       if first + lo <= row < first + hi]
                continue
            rows = np.arange(first + lo, first + hi, dtype=np.int64)
            yield TokenItems(rows, rows + 1, rows + 1, offsets[lo:hi], np.diff(offsets[lo:hi + 1]), values)

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        wanted = set(positions)
        found: dict[int, dict[str, Any]] = {}
        if not wanted:
            return found
        for first, table in self._blocks(path, min(wanted), max(wanted) + 1):
            if not any(first <= p < first + table.num_rows for p in wanted):
                continue
            for row, rec in self._rows(path, first, table):
                if row in wanted:
                    if isinstance(rec, Rejection):
                        raise SourceError(f"{path}: row {row} is now rejected ({rec.reason}); the data changed since the state was saved")
                    found[row] = rec
        missing = wanted - found.keys()
        if missing:
            raise SourceError(f"{path}: no rows {sorted(missing)[:5]}; the data changed since the state was saved")
        return found
