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
from typing import Any

from feedline._core.dataset import Dataset
from feedline._core.record import Key, Record
from feedline._hf_datasets.stages import RowFix

__all__ = ["JsonTypes", "column_names_of", "features_of", "json_schema"]

CHUNK = 10 << 20  # datasets' json chunksize
_BOM = b"\xef\xbb\xbf"


def _stamp(path: str) -> tuple[str, float, int]:
    try:
        st = os.stat(path)
        return path, st.st_mtime, st.st_size
    except OSError:
        return path, 0.0, 0


def mixed_paths(values: list[Any], path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths (field names; ``0`` for list items) whose objects do not share one set of keys, or mix
    objects or lists with other values: what ``datasets`` keeps as JSON (its ``Json`` feature)."""
    values = [v for v in values if v is not None]
    if not values:
        return []
    if all(isinstance(v, dict) for v in values):
        keys = set(values[0])
        if path and (not keys or any(set(v) != keys for v in values)):
            return [path]
        fields = dict.fromkeys(k for v in values for k in v)
        return [p for k in fields for p in mixed_paths([v[k] for v in values if k in v], (*path, k))]
    if all(isinstance(v, list) for v in values):
        return mixed_paths([x for v in values for x in v], (*path, 0))
    if any(isinstance(v, (dict, list)) for v in values):
        return [path]
    return []


@functools.lru_cache(maxsize=64)
def _json_schema(stamp: tuple[str, float, int]) -> tuple[Any, tuple[tuple[Any, ...], ...]]:
    import json

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
        return None, ()  # a JSON array: datasets reads it whole (pandas); no schema is inferred here
    try:
        examples = [json.loads(line) for line in head.splitlines() if line.strip()]
    except ValueError:
        return None, ()
    paths = [p for p in mixed_paths(examples) if p]
    for _ in range(64):  # each round finds one more column of mixed types
        tops = {p[0] for p in paths}
        batch = b"\n".join(json.dumps({k: json.dumps(v) if k in tops and v is not None else v for k, v in e.items()})
                           .encode() if isinstance(e, dict) else json.dumps(e).encode() for e in examples)
        try:
            table = paj.read_json(io.BytesIO(batch), read_options=paj.ReadOptions(block_size=max(len(batch), 16 << 10)))
            return table.schema, tuple(paths)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            msg = str(e)
            if "Column(" not in msg or ") changed from" not in msg:
                return None, ()
            column = msg.split("Column(", 1)[1].rsplit(") changed from", 1)[0].strip("/").split("/")[0]
            if not column or column in tops:
                return None, ()
            paths.append((column,))
    return None, ()


def json_schema(path: str) -> tuple[Any, tuple[tuple[Any, ...], ...]]:
    """The ``pyarrow`` schema ``datasets`` infers for a JSON Lines file, and the paths it keeps as JSON
    (``(None, ())`` when it infers none)."""
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
    if not files or "://" in files[0] or getattr(root, "native", True) is False:
        return None  # remote, or read with a builder's options (BuilderRoot): known after reading only
    if builder == "json":
        return json_schema(root.schema_file or files[0])[0]
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
    features = dict(datasets.Features.from_arrow_schema(schema))
    if getattr(root, "builder", None) == "json":
        for path in json_schema(root.schema_file or root.files[0])[1]:
            if len(path) == 1:
                features[path[0]] = datasets.Json()
            elif len(path) == 2 and path[1] == 0:
                features[path[0]] = datasets.List(datasets.Json())
    return features


def column_names_of(root: Any) -> list[str] | None:
    if getattr(root, "builder", None) == "interleave":
        return list(root.columns())
    schema = _schema(root)
    return None if schema is None else list(schema.names)


def _keep(value: Any) -> Any:
    return value


def _converter(tp: Any) -> Any:
    """``value -> value as datasets gives it for the Arrow type tp``; plain values of the type pass at once."""
    import pyarrow as pa

    def through_arrow(value: Any) -> Any:
        try:
            return pa.array([value], type=tp).to_pylist()[0]
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            try:
                return pa.array([value]).cast(tp).to_pylist()[0]
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
                return value  # datasets would refuse the file; the row keeps its value

    if pa.types.is_string(tp) or pa.types.is_large_string(tp):
        ok: Any = str
    elif pa.types.is_boolean(tp):
        ok = bool
    elif pa.types.is_int64(tp):
        ok = int
    elif pa.types.is_float64(tp):
        def to_float(value: Any) -> Any:
            if value is None or type(value) is float:
                return value
            return float(value) if type(value) is int else through_arrow(value)
        return to_float
    elif pa.types.is_list(tp) and (pa.types.is_string(tp.value_type) or pa.types.is_int64(tp.value_type)):
        item = str if pa.types.is_string(tp.value_type) else int

        def to_list(value: Any) -> Any:
            if value is None or (type(value) is list and all(type(x) is item or x is None for x in value)):
                return value
            return through_arrow(value)
        return to_list
    else:
        return through_arrow

    def plain(value: Any) -> Any:
        return value if value is None or type(value) is ok else through_arrow(value)
    return plain


class JsonTypes(RowFix):
    """Cast JSON rows to the schema ``datasets`` infers for their split (see the module docstring)."""

    def __init__(self, parent: Dataset[Record], first_file: str) -> None:
        super().__init__(parent)
        self.first_file = first_file

    @functools.cached_property
    def _fields(self) -> tuple[list[Any] | None, set[str]]:
        schema, paths = json_schema(self.first_file)
        return (None if schema is None else list(schema)), {p[0] for p in paths}

    @functools.cached_property
    def _converters(self) -> list[tuple[str, Any]]:
        fields, raw = self._fields
        return [(f.name, _keep if f.name in raw else _converter(f.type)) for f in fields or []]

    def fix(self, key: Key, data: dict[str, Any]) -> dict[str, Any]:
        if self._fields[0] is None:
            return data
        out = {name: convert(data.get(name)) for name, convert in self._converters}
        for k, v in data.items():
            if k not in out:
                out[k] = v  # a key the schema lacks (datasets would refuse the file): kept as read
        return out
