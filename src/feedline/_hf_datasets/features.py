"""The columns ``datasets`` knows before reading (its ``features``), and JSON rows typed as it types them.

``datasets`` (5.x) takes the features of a ``json`` split from the first 10 MB of its first file,
parsed by ``pyarrow.json``, and casts every row to them: a key missing from a row is ``None``,
an integer in a float column is a float, a nested object lacking a field has it as ``None``,
an ISO date string in a timestamp column is a ``datetime``. :class:`JsonTypes` does the same to
feedline's rows (a key the features lack is kept as read). ``parquet`` and ``arrow`` features
are the first file's schema; ``text`` and ``csv`` have none until read (``None``, as there).
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Sequence
from typing import Any

from feedline._core.dataset import Dataset, DatasetIterator
from feedline._core.record import Key, Record

__all__ = ["JsonTypes", "column_names_of", "features_of", "json_schema"]

CHUNK = 10 << 20  # datasets' json chunksize
_BOM = b"\xef\xbb\xbf"


def _stamp(path: str) -> tuple[str, float, int]:
    try:
        st = os.stat(path)
        return path, st.st_mtime, st.st_size
    except OSError:
        return path, 0.0, 0


@functools.lru_cache(maxsize=64)
def _json_schema(stamp: tuple[str, float, int]) -> Any:
    import pyarrow as pa
    import pyarrow.json as paj

    from feedline._sources.files import open_binary

    with open_binary(stamp[0]) as f:
        head = f.read(CHUNK)
        if head:
            head += f.readline()
    if head.startswith(_BOM):
        head = head[len(_BOM):]
    if not head.strip() or head.lstrip().startswith(b"["):
        return None  # a JSON array: datasets reads it whole (pandas); no schema is inferred here
    try:
        return paj.read_json(io.BytesIO(head), read_options=paj.ReadOptions(block_size=max(CHUNK // 32, 16 << 10))).schema
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None  # mixed types: datasets falls back to JSON-encoded strings; rows are given as read


def json_schema(path: str) -> Any:
    """The ``pyarrow`` schema ``datasets`` infers for a JSON Lines file (``None`` when it infers none)."""
    return _json_schema(_stamp(path))


@functools.lru_cache(maxsize=64)
def _file_schema(stamp: tuple[str, float, int], builder: str) -> Any:
    if builder == "parquet":
        import pyarrow.parquet as pq

        return pq.read_schema(stamp[0])
    from feedline._sources.arrow import open_table

    return open_table(stamp[0]).schema


def _schema(root: Any) -> Any:
    builder = getattr(root, "builder", None)
    files = getattr(root, "files", None)
    if builder == "interleave":
        schemas = [_schema(c.root) if not c.ops else None for c in root.children]
        return schemas[0] if schemas and all(s is not None and s.equals(schemas[0]) for s in schemas) else None
    if not files or "://" in files[0]:
        return None
    if builder == "json":
        return json_schema(root.schema_file or files[0])
    if builder in ("parquet", "arrow"):
        return _file_schema(_stamp(files[0]), builder)
    return None


def features_of(root: Any) -> dict[str, Any] | None:
    """``datasets.Features`` of a root's rows, or ``None`` where ``datasets`` knows none before reading."""
    schema = _schema(root)
    if schema is None:
        return None
    from feedline._core.optional import require

    datasets: Any = require("datasets", "hf")
    return dict(datasets.Features.from_arrow_schema(schema))


def column_names_of(root: Any) -> list[str] | None:
    if getattr(root, "builder", None) == "interleave":
        return list(root.columns())
    schema = _schema(root)
    return None if schema is None else list(schema.names)


class JsonTypes(Dataset[Record]):
    """Cast JSON rows to the schema ``datasets`` infers for their split (see the module docstring)."""

    def __init__(self, parent: Dataset[Record], first_file: str) -> None:
        self.parent = parent
        self.first_file = first_file

    @functools.cached_property
    def _fields(self) -> list[Any] | None:
        schema = json_schema(self.first_file)
        return None if schema is None else list(schema)

    def cast(self, data: dict[str, Any]) -> dict[str, Any]:
        fields = self._fields
        if fields is None:
            return data
        import pyarrow as pa

        out: dict[str, Any] = {}
        for f in fields:
            value = data.get(f.name)
            try:
                arr = pa.array([value], type=f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                try:
                    arr = pa.array([value]).cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
                    out[f.name] = value  # datasets would refuse the file; the row keeps its value
                    continue
            out[f.name] = arr.to_pylist()[0]
        for k, v in data.items():
            if k not in out:
                out[k] = v
        return out

    def fetch(self, keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
        return {k: self.cast(d) for k, d in self.parent.fetch(keys).items()}

    def __iter__(self) -> _JsonTypesIterator:
        return _JsonTypesIterator(self)


class _JsonTypesIterator(DatasetIterator[Record]):
    NAME = "json types"

    def __init__(self, ds: JsonTypes) -> None:
        self.ds = ds
        self.parent: DatasetIterator[Record] = iter(ds.parent)

    def __next__(self) -> Record:
        rec = next(self.parent)
        return Record(rec.key, rec.epoch, self.ds.cast(rec.data))


