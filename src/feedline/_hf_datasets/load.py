"""``feedline.load_dataset``: the ``datasets.load_dataset(..., streaming=True)`` call, with exact resume.

    >>> ds = feedline.load_dataset("json", data_files="corpus/*.jsonl", split="train")   # doctest: +SKIP
    >>> for row in ds: ...                    # the rows datasets yields: same fields, values, types, order
    >>> state = ds.state_dict()               # exact: a new dataset given it continues at the next row
    >>> ds.shuffle(seed=0, buffer_size=10_000).map(clean).filter(keep).take(1000)   # datasets' methods

The packaged builders ``json``, ``text``, ``csv``, ``parquet`` and ``arrow`` are read by feedline's
own readers (no ``datasets`` needed); any other ``path`` (a hub name, a local script or folder)
goes through ``datasets`` (feedline's ``hf`` source). With ``split=None`` the result is an
:class:`IterableDatasetDict` keyed by split, as ``datasets`` returns. ``split`` may slice:
``train[:100]``, ``train[100:]``, ``train[10%:20%]``, ``train[-50:]`` (percentages and negative
bounds count the split's rows first, one pass over it; rounding as ``datasets``: to the closest row).

What still differs from ``datasets`` is listed in docs/huggingface.md.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from typing import Any

from feedline._core.options import close_match
from feedline._hf_datasets.builders import BuilderRoot, split_options
from feedline._hf_datasets.dataset import IterableDataset
from feedline._hf_datasets.roots import FileRoot
from feedline.errors import SpecError

__all__ = ["IterableDatasetDict", "load_dataset"]

NATIVE = {"json": "json", "text": "text", "csv": "csv", "parquet": "parquet", "arrow": "arrow"}
_EXTENSIONS = {"json": (".json", ".jsonl"), "text": (".txt",), "csv": (".csv", ".tsv"),
               "parquet": (".parquet",), "arrow": (".arrow",)}
_SPLIT = re.compile(r"^(?P<split>[\w.-]+)(\[(?:(?P<from>-?[\d_]+)(?P<from_pct>%)?)?:(?:(?P<to>-?[\d_]+)(?P<to_pct>%)?)?\])?$")


class IterableDatasetDict(dict[str, IterableDataset]):
    """Splits by name, as ``datasets.IterableDatasetDict``: its methods apply to every split."""

    def _each(self, method: str, *args: Any, **kwargs: Any) -> IterableDatasetDict:
        return IterableDatasetDict({k: getattr(v, method)(*args, **kwargs) for k, v in self.items()})

    def shuffle(self, seed: int | None = None, buffer_size: int = 1000) -> IterableDatasetDict:
        return self._each("shuffle", seed, buffer_size)

    def map(self, *args: Any, **kwargs: Any) -> IterableDatasetDict:
        return self._each("map", *args, **kwargs)

    def filter(self, *args: Any, **kwargs: Any) -> IterableDatasetDict:
        return self._each("filter", *args, **kwargs)

    def select_columns(self, column_names: Any) -> IterableDatasetDict:
        return self._each("select_columns", column_names)

    def remove_columns(self, column_names: Any) -> IterableDatasetDict:
        return self._each("remove_columns", column_names)

    def rename_column(self, original_column_name: str, new_column_name: str) -> IterableDatasetDict:
        return self._each("rename_column", original_column_name, new_column_name)

    def rename_columns(self, column_mapping: Mapping[str, str]) -> IterableDatasetDict:
        return self._each("rename_columns", column_mapping)

    def with_format(self, type: str | None = None) -> IterableDatasetDict:
        return self._each("with_format", type)

    @property
    def column_names(self) -> dict[str, list[str] | None]:
        return {k: v.column_names for k, v in self.items()}


def _expand(pattern: str) -> list[str]:
    """A path or glob as the sorted files it names (URLs and plain paths as they are)."""
    if "://" in pattern or not glob.has_magic(pattern):
        return [pattern]
    found = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not found:
        raise SpecError(f"{pattern}: no files match")
    return found


def _files(builder: str, data_files: Any, data_dir: str | None) -> dict[str, list[str]]:
    if data_files is None:
        if data_dir is None:
            raise SpecError(f"load_dataset({builder!r}) needs data_files (a path, a list, or {{split: paths}}) "
                            "or data_dir")
        found = sorted(p for p in glob.glob(os.path.join(data_dir, "**", "*"), recursive=True)
                       if p.endswith(_EXTENSIONS[builder]) and os.path.isfile(p))
        if not found:
            raise SpecError(f"{data_dir}: no {'/'.join(_EXTENSIONS[builder])} files for the {builder} builder")
        return {"train": found}
    if isinstance(data_files, (str, os.PathLike)):
        data_files = {"train": [data_files]}
    elif not isinstance(data_files, Mapping):
        data_files = {"train": list(data_files)}
    return {str(k): [f for p in ([v] if isinstance(v, (str, os.PathLike)) else v) for f in _expand(str(p))]
            for k, v in data_files.items()}


# Builders datasets packages besides NATIVE: a name close to a native one but not among these is a typo.
_PACKAGED = {"pandas", "sql", "xml", "imagefolder", "audiofolder", "videofolder", "webdataset", "spark",
             "generator", "cache", "text", "json", "csv", "parquet", "arrow"}


def _check_builder(path: str, data_files: Any, data_dir: str | None) -> None:
    """Refuse a misspelt packaged builder (``jsonl``, ``txt``) at once, instead of asking the hub for it."""
    if (data_files is None and data_dir is None) or path in _PACKAGED or "/" in path or os.path.exists(path):
        return
    hint = close_match(path, sorted(NATIVE))
    if hint:
        raise SpecError(f"load_dataset({path!r}): not a packaged builder{hint} (builders for data_files: "
                        f"{', '.join(sorted(NATIVE))}; json reads .json and .jsonl, csv reads .tsv with sep='\\t')")


def _sliced(ds: IterableDataset, spec: str) -> IterableDataset:
    """``train[a:b]`` (rows or percentages) as a first ``take``/``skip`` of the split."""
    m = _SPLIT.match(spec)
    assert m is not None
    if m.group(0) == m.group("split"):
        return ds
    pct = bool(m.group("from_pct") or m.group("to_pct"))
    lo = None if m.group("from") is None else int(m.group("from").replace("_", ""))
    hi = None if m.group("to") is None else int(m.group("to").replace("_", ""))
    n = None
    if pct or (lo is not None and lo < 0) or (hi is not None and hi < 0):
        n = sum(1 for _ in ds)  # the split's size: one pass
        if pct:
            lo = None if lo is None else round(lo * n / 100.0)
            hi = None if hi is None else round(hi * n / 100.0)
        lo = None if lo is None else min(max(n + lo, 0) if lo < 0 else lo, n)
        hi = None if hi is None else min(max(n + hi, 0) if hi < 0 else hi, n)
    start = lo or 0
    out = ds.skip(start) if start else ds
    return out.take(max(0, hi - start)) if hi is not None else out


def load_dataset(path: str, name: str | None = None, data_files: Any = None, split: str | None = None,
                 streaming: bool = True, *, data_dir: str | None = None,
                 **kwargs: Any) -> IterableDataset | IterableDatasetDict:
    """``datasets.load_dataset`` for streaming, with exact ``state_dict()`` resume.

    Args:
        path: a packaged builder (``json``, ``text``, ``csv``, ``parquet``, ``arrow``), read natively;
            anything else is passed to ``datasets`` (hub name, local folder or script).
        name: the configuration (hub datasets).
        data_files: a path or glob, a list of them, or ``{split: paths}``.
        split: the split to return, optionally sliced (``train[:10%]``); ``None`` returns every
            split as an :class:`IterableDatasetDict`.
        streaming: must be true (feedline streams; for an in-memory ``Dataset`` use ``datasets``).
        data_dir: a folder whose files of the builder's extensions form the ``train`` split.
        kwargs: the builder's options, as ``datasets`` takes them: ``sep``/``delimiter`` and
            ``column_names`` (csv, read natively); text ``sample_by``/``keep_linebreaks``/``encoding``,
            csv ``pandas.read_csv`` options (``na_filter``, ``skiprows``...), json ``field`` (read as
            the builder reads, :mod:`~feedline._hf_datasets.builders`); other keys go to ``datasets``
            for hub names and are refused for packaged builders.
    """
    if not streaming:
        raise SpecError("feedline.load_dataset streams; streaming=False (an Arrow cache in memory) is "
                        "datasets.load_dataset's job")
    wanted = None
    if split is not None:
        m = _SPLIT.match(split)
        if m is None:
            raise SpecError(f"split {split!r}: expected a name, optionally sliced: 'train', 'train[:100]', "
                            "'train[10%:20%]', 'train[-50:]' (one split; combine splits with interleave_datasets)")
        wanted = m.group("split")
    schema_file = None
    builder_opts = split_options(path, kwargs) if path in NATIVE else {}
    if path in NATIVE and builder_opts:  # options feedline's readers lack: read as the builder reads
        if path == "csv":
            sep = kwargs.pop("sep", kwargs.pop("delimiter", None))
            builder_opts.update({"sep": sep} if sep is not None else {})
            if "column_names" in kwargs:
                builder_opts["names"] = list(kwargs.pop("column_names"))
        if kwargs:
            raise SpecError(f"load_dataset({path!r}): unsupported options {sorted(kwargs)}; {_ACCEPTED[path]}")
        result = IterableDatasetDict({s: IterableDataset(BuilderRoot(tuple(files), path, s, tuple(builder_opts.items())))
                                      for s, files in _files(path, data_files, data_dir).items()})
        return _pick(result, split, wanted, path, data_files)
    if path in NATIVE:
        opts: dict[str, Any] = {}
        sep = kwargs.pop("sep", kwargs.pop("delimiter", None))
        if sep is not None:
            if path != "csv":
                raise SpecError(f"sep is a csv option, not a {path} one")
            opts["delimiter"] = sep
        if "column_names" in kwargs:
            opts["columns"], opts["header"] = list(kwargs.pop("column_names")), False
        if path == "text":
            opts["unit"], opts["keep_blank"] = "line", True  # every line a row, blank ones too, as datasets
        if path == "csv":
            opts["infer_types"] = True  # int/float/bool columns and None for missing values, as datasets
        if kwargs:
            raise SpecError(f"load_dataset({path!r}): unsupported options {sorted(kwargs)}; {_ACCEPTED[path]}")
        found = _files(path, data_files, data_dir)
        splits = {s: [{"path": f, "format": NATIVE[path], "text": None, **opts} for f in files]
                  for s, files in found.items()}
        if path == "json":
            schema_file = next(iter(found.values()))[0]  # datasets types every split as its first file's
    else:
        _check_builder(path, data_files, data_dir)
        hf = {"hf": path, "text": None, **({"config": name} if name else {}),
              **({"data_files": data_files} if data_files is not None else {}),
              **({"data_dir": data_dir} if data_dir else {}), **kwargs}
        if wanted is None:
            try:
                from datasets import get_dataset_split_names
            except ImportError as e:
                from feedline.errors import MissingDependency

                raise MissingDependency(f"{path!r} is not a packaged builder, so it needs datasets: "
                                        "pip install 'feedline[hf]'") from e
            names = get_dataset_split_names(path, name, data_files=data_files) if data_files is not None else \
                get_dataset_split_names(path, name)
            splits = {s: [{**hf, "split": s}] for s in names}
        else:
            splits = {wanted: [{**hf, "split": wanted}]}
    result = IterableDatasetDict({s: IterableDataset(FileRoot(tuple(src), path, s, schema_file=schema_file))
                                  for s, src in splits.items()})
    return _pick(result, split, wanted, path, data_files)


def _pick(result: IterableDatasetDict, split: str | None, wanted: str | None, path: str,
          data_files: Any) -> IterableDataset | IterableDatasetDict:
    """The split asked for (sliced), or every split."""
    if split is None:
        return result
    if wanted not in result:
        hint = ("; data_files given as a path or a list are the 'train' split: give {split: paths} to name others"
                if path in NATIVE and not isinstance(data_files, Mapping) else "")
        raise SpecError(f"split {wanted!r} not found{close_match(str(wanted), sorted(result))}; this dataset has "
                        f"{sorted(result)}{hint}")
    return _sliced(result[str(wanted)], split)


_ACCEPTED = {
    "text": "the text builder takes sample_by, keep_linebreaks, encoding and encoding_errors",
    "csv": "the csv builder takes sep/delimiter, column_names and pandas.read_csv's na_filter, skiprows, header, "
           "names, usecols, nrows, na_values, keep_default_na, true_values, false_values, quotechar, quoting, "
           "escapechar, comment, thousands, decimal, skipinitialspace, skip_blank_lines, skipfooter, doublequote, "
           "lineterminator, date_format, index_col, encoding, encoding_errors",
    "json": "the json builder takes field, encoding and encoding_errors",
    "parquet": "the parquet builder takes data_files and data_dir",
    "arrow": "the arrow builder takes data_files and data_dir",
}
