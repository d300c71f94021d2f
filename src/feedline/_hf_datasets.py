"""``feedline.load_dataset``: the ``datasets.load_dataset(..., streaming=True)`` call, with exact resume.

    >>> ds = feedline.load_dataset("json", data_files="corpus/*.jsonl", split="train")   # doctest: +SKIP
    >>> for row in ds: ...                    # the rows datasets yields: same fields, values, order
    >>> state = ds.state_dict()               # exact: a new dataset given it continues at the next row
    >>> ds.shuffle(seed=0, buffer_size=10_000).to_loader(tokenizer="gpt2", task={"kind": "clm", "max_length": 1024})

The packaged builders ``json``, ``text``, ``csv``, ``parquet`` and ``arrow`` are read by feedline's
own readers (no ``datasets`` needed); any other ``path`` (a hub name, a local script or folder)
goes through ``datasets`` (feedline's ``hf`` source). With ``split=None`` the result is an
:class:`IterableDatasetDict` keyed by split, as ``datasets`` returns.

Differences from ``datasets`` (documented in docs/huggingface.md): ``csv`` values are strings
(``datasets`` infers numeric columns with pandas), rows missing a JSON key lack it (``datasets``
fills ``None`` from the unified schema), and ``shuffle`` uses feedline's seeded buffer shuffle, so
its order differs from ``datasets``' for the same seed (it is exact on resume, which ``datasets``'
is not: that drops its shuffle buffer).
"""

from __future__ import annotations

import copy
import glob
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from feedline._spec import Spec
from feedline.errors import SpecError, StateError

__all__ = ["IterableDataset", "IterableDatasetDict", "load_dataset"]

STATE_VERSION = 1
NATIVE = {"json": "jsonl", "text": "text", "csv": "csv", "parquet": "parquet", "arrow": "arrow"}
_EXTENSIONS = {"json": (".json", ".jsonl"), "text": (".txt",), "csv": (".csv", ".tsv"),
               "parquet": (".parquet",), "arrow": (".arrow",)}
_BOM = b"\xef\xbb\xbf"


class IterableDataset:
    """One split: iterate its rows, checkpoint exactly, shuffle, or turn it into a :class:`~feedline.Loader`.

    As in ``datasets``, each iteration starts at the beginning, or at the state last given to
    :meth:`load_state_dict`; :meth:`state_dict` is the position after the last row returned.

    The state is ``{"version", "spec_hash", "records"}``: the record stage's nested state after the
    last row returned (files, positions, the shuffle buffer's keys), as for ``Loader``.
    """

    def __init__(self, sources: Sequence[Mapping[str, Any]], *, builder: str, split: str,
                 seed: int = 0, shuffle_buffer: int | None = None) -> None:
        self.builder, self.split = builder, split
        self.sources = [dict(s) for s in sources]
        self.seed, self.shuffle_buffer = seed, shuffle_buffer
        self._start: dict[str, Any] | None = None   # from load_state_dict: where every iteration starts
        self._state: dict[str, Any] | None = None   # after the last row returned
        self._it: Any = None
        self._boms: dict[tuple[int, int], bool] = {}

    def _spec(self, **extra: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {"sources": copy.deepcopy(self.sources), "seed": self.seed, **extra}
        if self.shuffle_buffer:
            spec["shuffle"] = {"buffer": self.shuffle_buffer}
        return spec

    @property
    def spec_hash(self) -> str:
        return Spec.load({**self._spec(), "task": {"kind": "clm"}}).hash()

    # --------------------------------------------------------------- reading
    def __iter__(self) -> Iterator[dict[str, Any]]:
        from feedline._pipeline import Pipeline

        pipeline = Pipeline({**self._spec(), "task": {"kind": "clm"}})
        it = iter(pipeline.records())
        if self._start is not None:
            it.set_state(self._start["records"])
        self._close()
        self._it = it
        try:
            while True:
                try:
                    rec = next(it)
                except StopIteration:
                    return
                row = dict(rec.data)
                if self.builder == "text" and rec.key[2] == len(_BOM) and self._has_bom(pipeline, rec.key):
                    row["text"] = "\ufeff" + row["text"]  # datasets keeps a file's byte-order mark (the record starts after it)
                yield row
        finally:
            if self._it is it:  # not an older iteration closed late
                self._state = {"version": STATE_VERSION, "spec_hash": self.spec_hash, "records": it.get_state()}
                self._it = None
                it.close()

    def _has_bom(self, pipeline: Any, key: tuple[int, int, int]) -> bool:
        found = self._boms.get(key[:2])
        if found is None:
            path = pipeline.sources[key[0]].files[key[1]]
            from feedline._sources.files import open_binary

            with open_binary(path) as f:
                found = self._boms[key[:2]] = f.read(3) == _BOM
        return found

    def _close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The exact position after the last row returned (JSON-serialisable)."""
        if self._it is not None:
            return {"version": STATE_VERSION, "spec_hash": self.spec_hash, "records": self._it.get_state()}
        if self._state is not None:
            return copy.deepcopy(self._state)
        if self._start is not None:
            return copy.deepcopy(self._start)
        from feedline._pipeline import Pipeline

        it = iter(Pipeline({**self._spec(), "task": {"kind": "clm"}}).records())
        try:
            return {"version": STATE_VERSION, "spec_hash": self.spec_hash, "records": it.get_state()}
        finally:
            it.close()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` on the next iteration (refused if it is another dataset's)."""
        if state.get("version") != STATE_VERSION or "records" not in state:
            raise StateError(f"not a feedline.load_dataset state (version {state.get('version')!r}); "
                             "pass what state_dict() returned")
        if state.get("spec_hash") != self.spec_hash:
            raise StateError(f"this state belongs to another dataset (spec hash {state.get('spec_hash')}, this one "
                             f"is {self.spec_hash}): same files, builder, split and shuffle are needed to resume")
        self._close()
        self._start, self._state = copy.deepcopy(dict(state)), None

    # ------------------------------------------------------------ transforms
    def shuffle(self, seed: int | None = None, buffer_size: int = 1000) -> IterableDataset:
        """A shuffled copy: a seeded buffer of ``buffer_size`` rows (restored exactly on resume)."""
        if buffer_size < 1:
            raise SpecError(f"buffer_size: {buffer_size} must be >= 1")
        return IterableDataset(self.sources, builder=self.builder, split=self.split,
                               seed=self.seed if seed is None else seed, shuffle_buffer=buffer_size)

    def to_loader(self, tokenizer: str | None = None, task: Mapping[str, Any] | str | None = None,
                  batching: Mapping[str, Any] | None = None, *, text: str | None = "text", rank: int = 0,
                  world_size: int = 1, **spec: Any) -> Any:
        """A :class:`~feedline.Loader` over these rows (no ``map``): tokenized, task-shaped, batched.

        ``text`` names the field holding the text (``None`` for chat rows, read whole).
        ``task`` is a task spec or just its kind; other keyword arguments are spec keys.
        """
        from feedline._loader import Loader

        sources = [{**s, "text": text} for s in self.sources]
        full: dict[str, Any] = {**self._spec(), "sources": sources, **spec}
        if tokenizer is not None:
            full["tokenizer"] = tokenizer
        if task is not None:
            full["task"] = {"kind": task} if isinstance(task, str) else dict(task)
        if batching is not None:
            full["batching"] = dict(batching)
        return Loader(full, rank=rank, world_size=world_size)

    def __repr__(self) -> str:
        shuffle = f", shuffle(seed={self.seed}, buffer_size={self.shuffle_buffer})" if self.shuffle_buffer else ""
        return f"IterableDataset(builder={self.builder!r}, split={self.split!r}{shuffle})"


class IterableDatasetDict(dict[str, IterableDataset]):
    """Splits by name, as ``datasets.IterableDatasetDict``."""

    def shuffle(self, seed: int | None = None, buffer_size: int = 1000) -> IterableDatasetDict:
        return IterableDatasetDict({k: v.shuffle(seed, buffer_size) for k, v in self.items()})


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
        return {"train": [str(data_files)]}
    if isinstance(data_files, Mapping):
        return {str(k): [str(v)] if isinstance(v, (str, os.PathLike)) else [str(x) for x in v]
                for k, v in data_files.items()}
    return {"train": [str(x) for x in data_files]}


def load_dataset(path: str, name: str | None = None, data_files: Any = None, split: str | None = None,
                 streaming: bool = True, *, data_dir: str | None = None,
                 **kwargs: Any) -> IterableDataset | IterableDatasetDict:
    """``datasets.load_dataset`` for streaming, with exact ``state_dict()`` resume.

    Args:
        path: a packaged builder (``json``, ``text``, ``csv``, ``parquet``, ``arrow``), read natively;
            anything else is passed to ``datasets`` (hub name, local folder or script).
        name: the configuration (hub datasets).
        data_files: a path or glob, a list of them, or ``{split: paths}``.
        split: the split to return; ``None`` returns every split as an :class:`IterableDatasetDict`.
        streaming: must be true (feedline streams; for an in-memory ``Dataset`` use ``datasets``).
        data_dir: a folder whose files of the builder's extensions form the ``train`` split.
        kwargs: ``sep``/``delimiter`` and ``column_names`` (csv); other keys go to ``datasets`` for
            hub names and are refused for native builders.
    """
    if not streaming:
        raise SpecError("feedline.load_dataset streams; streaming=False (an Arrow cache in memory) is "
                        "datasets.load_dataset's job")
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
            opts["unit"] = "line"
        if kwargs:
            raise SpecError(f"load_dataset({path!r}): unsupported options {sorted(kwargs)}; feedline reads "
                            "data_files, data_dir, sep/delimiter and column_names for packaged builders")
        splits = {s: [{"path": f, "format": NATIVE[path], "text": None, **opts} for f in files]
                  for s, files in _files(path, data_files, data_dir).items()}
    else:
        hf = {"hf": path, "text": None, **({"config": name} if name else {}),
              **({"data_files": data_files} if data_files is not None else {}),
              **({"data_dir": data_dir} if data_dir else {}), **kwargs}
        if split is None:
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
            splits = {split: [{**hf, "split": split}]}
    result = IterableDatasetDict({s: IterableDataset(src, builder=path, split=s) for s, src in splits.items()})
    if split is None:
        return result
    if split not in result:
        raise SpecError(f"split {split!r} not found; this dataset has {sorted(result)}")
    return result[split]
