"""The packaged builders' options feedline's readers do not have, read as ``datasets`` reads them.

    text  sample_by ("line" | "paragraph" | "document"), keep_linebreaks, encoding, encoding_errors
    csv   the pandas.read_csv options datasets passes on: na_filter, skiprows, header, names,
          usecols, nrows, na_values, keep_default_na, quotechar, comment, thousands, decimal, ...
    json  field (the rows are the list under one key of a JSON document), encoding

Without them the files go through feedline's own readers (:class:`~feedline._hf_datasets.roots.FileRoot`,
the fast path). With them, :class:`BuilderRoot` reads each file the way the builder does: text
opened with the encoding and universal newlines, lines split at ``"\\n"``, paragraphs at
``"\\n\\n"``; csv through ``pandas.read_csv`` in 10,000-row chunks; json through pandas'
``read_json``, as ``datasets`` 5.x does.

State: ``{"file": i, "row": n}``, the file being read and its rows returned. A restore re-reads
that file up to the row (one pass over its head); keys are ``(file, 0, row)``, so a shuffle
buffer re-reads its rows the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.record import Key, Record
from feedline.errors import SourceError, SpecError

__all__ = ["BuilderRoot", "split_options"]

# The builders' own options, with the value that means "as feedline's reader reads it".
_TEXT = {"sample_by": "line", "keep_linebreaks": False, "encoding": "utf-8", "encoding_errors": None}
_JSON = {"field": None, "encoding": "utf-8", "encoding_errors": None}
_CSV = {"na_filter": True, "skiprows": None, "header": "infer", "names": None, "usecols": None, "nrows": None,
        "na_values": None, "keep_default_na": True, "true_values": None, "false_values": None,
        "skipinitialspace": False, "skip_blank_lines": True, "thousands": None, "decimal": ".", "quotechar": '"',
        "quoting": 0, "escapechar": None, "comment": None, "encoding": None, "encoding_errors": "strict",
        "doublequote": True, "lineterminator": None, "skipfooter": 0, "date_format": None, "index_col": None}
OPTIONS: dict[str, dict[str, Any]] = {"text": _TEXT, "json": _JSON, "csv": _CSV}
_SAMPLE_BY = ("line", "paragraph", "document")
_CHUNK = 10_000  # datasets' csv chunksize


def split_options(builder: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the builder's options from ``kwargs``; those that differ from the reader's defaults are returned."""
    known: dict[str, Any] = OPTIONS.get(builder, {})
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in known}
    if builder == "text" and given.get("sample_by", "line") not in _SAMPLE_BY:
        raise SpecError(f"sample_by: {given['sample_by']!r} is not one of {', '.join(map(repr, _SAMPLE_BY))} "
                        "(one row per line, per paragraph split at blank lines, or per file)")
    if builder == "json" and given.get("encoding") not in (None, "utf-8", "utf8") and given.get("field") is None:
        raise SpecError(f"encoding={given['encoding']!r}: feedline reads JSON Lines as UTF-8; re-encode the files "
                        "(iconv -t utf-8), or read a JSON document's list with field=")
    return {k: v for k, v in given.items()
            if v != known[k] and not (k == "encoding" and str(v).lower().replace("_", "-") in ("utf-8", "utf8"))}


@dataclass(frozen=True)
class BuilderRoot:
    """A split's files read with a builder's options, one file after another (see the module docstring)."""

    files: tuple[str, ...]
    builder: str
    split: str
    options: tuple[tuple[str, Any], ...]
    native = False  # features: unknown before reading, as for datasets' csv and text

    def describe(self) -> str:
        blob = json.dumps([self.builder, self.files, self.options], default=str)
        return f"{self.builder}({hashlib.sha256(blob.encode()).hexdigest()[:16]})"

    def stage(self, epoch: int) -> Dataset[Record]:
        return BuilderRows(self, epoch)

    def shard(self, num_shards: int, index: int, contiguous: bool) -> BuilderRoot:
        from feedline._hf_datasets.roots import shard_indices

        keep = shard_indices(len(self.files), num_shards, index, contiguous)
        if not keep:
            raise SpecError(f"shard({num_shards}, {index}): this split has {len(self.files)} data file(s), so shard "
                            f"{index} would be empty (datasets shards files, not rows)")
        return dataclasses.replace(self, files=tuple(self.files[i] for i in keep))

    def keyed(self) -> bool:
        return True

    def n_shards(self) -> int:
        return len(self.files)

    def rows(self, i: int) -> Iterator[dict[str, Any]]:
        """The rows of file ``i``, as the builder gives them."""
        path, opts = self.files[i], dict(self.options)
        try:
            if self.builder == "text":
                yield from _text_rows(path, opts)
            elif self.builder == "csv":
                yield from _csv_rows(path, opts)
            else:
                yield from _json_rows(path, opts)
        except (SourceError, SpecError):
            raise
        except FileNotFoundError:
            raise SourceError(f"{path}: file not found") from None
        except UnicodeError as e:
            raise SourceError(f"{path}: not {opts.get('encoding') or 'utf-8'} text ({e}); pass the files' encoding= "
                              "or encoding_errors='replace'") from e
        except Exception as e:  # pandas' and json's parse errors
            raise SourceError(f"{path}: the {self.builder} builder with {dict(self.options)} cannot read it: "
                              f"{type(e).__name__}: {e}") from e


def _open_text(path: str, opts: Mapping[str, Any]) -> io.TextIOWrapper:
    from feedline._sources.files import open_binary

    return io.TextIOWrapper(open_binary(path), encoding=opts.get("encoding") or "utf-8",
                            errors=opts.get("encoding_errors"), newline=None)  # "\r\n" and "\r" read as "\n"


def _text_rows(path: str, opts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    by = opts.get("sample_by", "line")
    with _open_text(path, opts) as f:
        if by == "document":
            yield {"text": f.read()}
        elif by == "line":
            keep = bool(opts.get("keep_linebreaks"))
            for line in iter(f.readline, ""):
                yield {"text": line if keep or not line.endswith("\n") else line[:-1]}
        else:  # paragraphs: the text split at "\n\n", empty pieces dropped; a line adds at most one split
            piece = ""
            for line in iter(f.readline, ""):
                piece += line
                if piece.endswith("\n\n"):  # only a line "\n" after a line break completes a separator
                    if piece[:-2]:
                        yield {"text": piece[:-2]}
                    piece = ""
            if piece:
                yield {"text": piece}


def _csv_rows(path: str, opts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    import pyarrow as pa

    from feedline._core.optional import require
    from feedline._sources.files import open_binary

    pd: Any = require("pandas", "hf")
    with open_binary(path) as f:
        reader = pd.read_csv(f, iterator=True, chunksize=_CHUNK, **opts)
        try:
            for df in reader:
                yield from pa.Table.from_pandas(df).to_pylist()
        finally:
            reader.close()


def _json_rows(path: str, opts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    import pyarrow as pa

    from feedline._core.optional import require

    pd: Any = require("pandas", "hf")
    pj = pd.io.json  # pandas' ujson, as datasets parses and re-dumps (its floats keep 10 digits)
    loads: Any = getattr(pj, "ujson_loads", None) or pj.loads  # pandas < 2.2: loads/dumps
    dumps: Any = getattr(pj, "ujson_dumps", None) or pj.dumps
    with _open_text(path, opts) as f:
        doc = loads(f.read())
    field = opts.get("field")
    if not isinstance(doc, dict) or field not in doc:
        have = ", ".join(sorted(doc)[:12]) if isinstance(doc, dict) else f"a JSON {type(doc).__name__}"
        raise SourceError(f"{path}: field={field!r} is not a key of the document (it has: {have})")
    df = pd.read_json(io.StringIO(dumps(doc[field])), dtype_backend="pyarrow")
    if df.columns.tolist() == [0]:
        df.columns = ["text"]
    yield from pa.Table.from_pandas(df, preserve_index=False).to_pylist()


class BuilderRows(Dataset[Record]):
    """The rows of a :class:`BuilderRoot`'s files, in order."""

    def __init__(self, root: BuilderRoot, epoch: int = 0) -> None:
        self.root = root
        self.epoch = epoch

    def fetch(self, keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
        """Re-read rows by key: one pass over each file's head, up to its last row asked for."""
        out: dict[Key, dict[str, Any]] = {}
        by_file: dict[int, set[int]] = {}
        for k in keys:
            by_file.setdefault(k[0], set()).add(k[2])
        for i, wanted in by_file.items():
            for n, row in enumerate(itertools.islice(self.root.rows(i), max(wanted) + 1)):
                if n in wanted:
                    out[(i, 0, n)] = row
        return out

    def __iter__(self) -> BuilderRowsIterator:
        return BuilderRowsIterator(self)


class BuilderRowsIterator(DatasetIterator[Record]):
    """Cursor over :class:`BuilderRows`: the file being read and the rows of it returned."""

    NAME = "builder rows"
    STATE_KEYS = ("file", "row")

    def __init__(self, ds: BuilderRows) -> None:
        self.ds = ds
        self.file = 0
        self.row = 0
        self._rows: Iterator[dict[str, Any]] | None = None

    def __next__(self) -> Record:
        files = self.ds.root.files
        while self.file < len(files):
            if self._rows is None:
                self._rows = self.ds.root.rows(self.file)
                for _ in itertools.islice(self._rows, self.row):  # a restore: the rows already returned
                    pass
            row = next(self._rows, None)
            if row is not None:
                self.row += 1
                return Record((self.file, 0, self.row - 1), self.ds.epoch, row)
            self.release()
            self.file, self.row = self.file + 1, 0
        raise StopIteration

    def own_state(self) -> State:
        return {"file": self.file, "row": self.row}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.release()
        self.file, self.row = int(own["file"]), int(own["row"])

    def release(self) -> None:
        rows, self._rows = self._rows, None
        if rows is not None and hasattr(rows, "close"):
            rows.close()
