"""Arrow IPC files and streams, and ``datasets`` ``save_to_disk`` folders, memory-mapped.

    sources: [{path: "tokenized/train", format: arrow}]          # a save_to_disk folder
    sources: [{path: "cache-*.arrow", columns: [text, label]}]   # HF cache files (IPC streams)

A local file is memory-mapped and read zero-copy (only the rows converted to Python objects
are materialised); the IPC *file* format and the *stream* format (what ``datasets`` writes)
are both accepted. Positions are row indices, so any row can be re-read directly.
A ``save_to_disk`` folder is recognised by its ``state.json``; its data files are read in the
order that file lists them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.files import is_url, open_raw
from feedline._sources.jsonl import text_record
from feedline._sources.reader import Item, Reader, Split
from feedline.errors import SourceError

__all__ = ["ArrowReader", "open_table", "rows", "saved_dataset_files"]

_BATCH = 1024


def saved_dataset_files(path: str) -> list[str] | None:
    """The data files of a ``datasets`` ``save_to_disk`` folder, or ``None`` if ``path`` is not one."""
    state = os.path.join(path, "state.json")
    if is_url(path) or not os.path.isfile(state):
        return None
    try:
        with open(state, encoding="utf-8") as f:
            names = [d["filename"] for d in json.load(f)["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SourceError(f"{state}: not a readable datasets state.json ({e})") from e
    return [os.path.join(path, n) for n in names]


def open_table(path: str, columns: Sequence[str] | None = None) -> Any:
    """A ``pyarrow.Table`` over the file, memory-mapped when local (IPC file or stream)."""
    import pyarrow as pa

    try:
        source = open_raw(path) if is_url(path) else pa.memory_map(path)
    except FileNotFoundError:
        raise SourceError(f"{path}: file not found") from None
    except OSError as e:
        raise SourceError(f"{path}: cannot open ({e})") from e
    try:
        try:
            table = pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            table = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise SourceError(f"{path}: not an Arrow IPC file or stream ({e})") from e
    return table.select(list(columns)) if columns else table


def rows(table: Any, start: int, path: str, field: str | None, offset: int = 0) -> Iterator[Item]:
    """Items of ``table`` rows from ``start`` (positions shifted by ``offset``), a batch at a time."""
    for batch in table.slice(start).to_batches(max_chunksize=_BATCH):
        for i, row in enumerate(batch.to_pylist()):
            pos = offset + start + i
            yield pos, pos + 1, pos + 1, text_record(row, field, path, pos + 1)
        start += batch.num_rows


class ArrowReader(Reader):
    """Reads Arrow IPC files and streams (zero-copy memory maps); positions are row indices."""

    name = "arrow"

    def _table(self, path: str) -> Any:
        cols = self.spec.columns
        if cols and self.spec.text and self.spec.text.split(".")[0] not in cols:
            cols = (*cols, self.spec.text.split(".")[0])
        try:
            return open_table(path, cols)
        except KeyError as e:
            raise SourceError(f"{path}: no column {e}; columns: must name existing columns") from e

    def extent(self, split: Split) -> tuple[int, int]:
        return split.start, self._table(split.path).num_rows if split.end is None else split.end

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        table = self._table(split.path)
        if split.end is not None and split.end < table.num_rows:  # a piece of the file (partitions)
            table = table.slice(0, split.end)
        yield from rows(table, position, split.path, self.spec.text)

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        table = self._table(path)
        found: dict[int, dict[str, Any]] = {}
        for p in set(positions):
            if not 0 <= p < table.num_rows:
                raise SourceError(f"{path}: no row {p} (the table has {table.num_rows}); the data changed since the state was saved")
            rec = text_record(table.slice(p, 1).to_pylist()[0], self.spec.text, path, p + 1)
            if isinstance(rec, Rejection):
                raise SourceError(f"{path}: row {p} is now rejected ({rec.reason}); the data changed since the state was saved")
            found[p] = rec
        return found
