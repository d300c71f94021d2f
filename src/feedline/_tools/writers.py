"""Row writers for offline output: Arrow, Parquet, JSON Lines and msgpack, in bounded memory.

A row is a ``dict[str, np.ndarray | int | float | str]``; 1-D arrays become lists. Rows are
buffered ``flush_rows`` at a time and written as one record batch (Arrow, Parquet) or streamed
(JSONL, msgpack), so memory holds one buffer whatever the file size::

    >>> with open_writer("out.arrow", "arrow") as w:                 # doctest: +SKIP
    ...     w.write({"input_ids": np.arange(4, dtype=np.int32)})

Arrow files use the IPC *stream* format that ``datasets.Dataset.from_file`` opens; Parquet files
open with ``datasets.load_dataset("parquet", data_files=...)``; msgpack files hold one map per
row (arrays as lists), readable with ``msgpack.Unpacker``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any, Literal

import numpy as np

from feedline.errors import MissingDependency, SpecError

__all__ = ["FORMATS", "Format", "RowWriter", "open_writer"]

Format = Literal["arrow", "parquet", "jsonl", "msgpack"]
FORMATS: dict[str, str] = {"arrow": ".arrow", "parquet": ".parquet", "jsonl": ".jsonl", "msgpack": ".msgpack"}


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


class RowWriter:
    """Write rows to one file in ``fmt``; a context manager. ``rows`` counts rows written."""

    def __init__(self, path: str, fmt: Format, *, flush_rows: int = 1000) -> None:
        if fmt not in FORMATS:
            raise SpecError(f"format {fmt!r} is not supported; choose one of {', '.join(FORMATS)}")
        self.path = path
        self.fmt = fmt
        self.flush_rows = flush_rows
        self.rows = 0
        self._buffer: list[Mapping[str, Any]] = []
        self._file: IO[bytes] | None = None
        self._arrow: Any = None  # pyarrow writer, opened with the first batch's schema
        self._schema: Any = None
        self._packer: Any = None

    def write(self, row: Mapping[str, Any]) -> None:
        """Add one row (flushed to disk every ``flush_rows`` rows)."""
        self._buffer.append(row)
        self.rows += 1
        if len(self._buffer) >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows."""
        rows, self._buffer = self._buffer, []
        if not rows:
            return
        if self.fmt in ("arrow", "parquet"):
            self._write_arrow(rows)
            return
        if self._file is None:
            self._file = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        if self.fmt == "jsonl":
            self._file.write("".join(json.dumps({k: _plain(v) for k, v in r.items()}) + "\n" for r in rows).encode())
        else:
            if self._packer is None:
                try:
                    import msgpack
                except ImportError as e:
                    raise MissingDependency("msgpack output needs msgpack: pip install msgpack") from e
                self._packer = msgpack.Packer()
            for r in rows:
                self._file.write(self._packer.pack({k: _plain(v) for k, v in r.items()}))

    def _write_arrow(self, rows: list[Mapping[str, Any]]) -> None:
        try:
            import pyarrow as pa
        except ImportError as e:
            raise MissingDependency("arrow/parquet output needs pyarrow: pip install pyarrow") from e
        columns = {name: _column(pa, [r[name] for r in rows]) for name in rows[0]}
        table = pa.table(columns)
        if self._schema is None:
            self._schema = table.schema
            if self.fmt == "arrow":
                self._arrow = pa.ipc.new_stream(self.path, self._schema)
            else:
                import pyarrow.parquet as pq

                self._arrow = pq.ParquetWriter(self.path, self._schema)
        self._arrow.write_table(table.cast(self._schema))

    def close(self) -> None:
        """Flush and close the file. Idempotent; a writer that got no rows writes an empty file."""
        self.flush()
        if self._arrow is not None:
            self._arrow.close()
            self._arrow = None
        if self._file is not None:
            self._file.close()
            self._file = None
        elif self.rows == 0 and self.fmt in ("jsonl", "msgpack"):
            open(self.path, "wb").close()

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _column(pa: Any, values: list[Any]) -> Any:
    """An Arrow array from one column's values: 1-D arrays become list arrays without Python loops."""
    first = values[0]
    if isinstance(first, np.ndarray) and first.ndim == 1:
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        np.cumsum([len(v) for v in values], out=offsets[1:])
        flat = np.concatenate(values) if values else np.array([], dtype=first.dtype)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    if isinstance(first, np.ndarray) and first.ndim > 1:
        return pa.array([v.tolist() for v in values])
    return pa.array([_plain(v) for v in values])


def open_writer(path: str, fmt: Format, *, flush_rows: int = 1000) -> RowWriter:
    """A :class:`RowWriter` for ``path``."""
    return RowWriter(path, fmt, flush_rows=flush_rows)
