"""``feedline.IterableDataset``: one split's rows with ``datasets``' methods, resumable exactly.

A dataset is a recipe: a root (files, or interleaved datasets) and the methods called on it,
in order (``ops``). Each method returns a new dataset, as in ``datasets``; iterating builds the
stages (:mod:`~feedline._hf_datasets.stages`, a shuffle buffer, the root's pipeline) and
:meth:`IterableDataset.state_dict` is their nested state after the last row returned.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from feedline._core.dataset import Dataset
from feedline._core.record import Record
from feedline._hf_datasets import functions as fns
from feedline._hf_datasets.calls import rebuilt, recorded
from feedline._hf_datasets.formats import formatter
from feedline._hf_datasets.roots import FileRoot
from feedline._hf_datasets.stages import RowOp, Slice
from feedline._hf_datasets.workers import split_number, too_many_workers, torch_available, torch_worker
from feedline._sources.shuffle import ShuffleBuffer
from feedline.errors import SpecError, StateError

__all__ = ["IterableDataset", "Op"]

STATE_VERSION = 2


@dataclass(frozen=True)
class Op:
    """One method call: how it builds its stage, and what it does to the columns.

    ``columns(mapping, wrap)`` maps ``{name: type}`` (features, or names only) to the columns
    after the method (``None``: unknown, as after a ``map``); ``wrap`` makes a type a list of it.
    """

    kind: str
    describe: str
    build: Callable[[Dataset[Record], int], Dataset[Record]]
    keyed: bool = True
    row_fn: fns.RowsFn | None = None   # one-row-to-at-most-one functions (what to_loader can run)
    count: int | None = None           # take/skip: the rows (split among DataLoader workers)
    call: tuple[str, tuple[Any, ...], tuple[tuple[str, Any], ...]] | None = None  # the method call (pickling)
    columns: Callable[[dict[str, Any], Callable[[Any], Any]], dict[str, Any] | None] = lambda d, wrap: d


def _same(d: dict[str, Any], wrap: Callable[[Any], Any]) -> dict[str, Any]:
    return d


class IterableDataset:
    """Rows of one split, as ``datasets.IterableDataset`` yields them, with an exact ``state_dict``.

    As in ``datasets``, each iteration starts at the beginning, or at the state last given to
    :meth:`load_state_dict`; :meth:`state_dict` is the position after the last row returned.
    The state is ``{"version", "fingerprint", "epoch", "records"}``: ``records`` the stages'
    nested state (files, positions, a shuffle buffer's keys, rows into a batch).

    Where torch is importable it is a ``torch.utils.data.IterableDataset`` too, and in
    ``DataLoader`` workers each worker reads its share of the files (:mod:`~feedline._hf_datasets.workers`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> IterableDataset:
        kind: type[IterableDataset] = cls
        if cls is IterableDataset and torch_available():
            kind = _torch_kind()
        return object.__new__(kind)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the root and the calls that built it (its functions must pickle, as with ``datasets``),
        so ``DataLoader(multiprocessing_context="spawn" | "forkserver")`` can send it to its workers."""
        return (rebuilt, (IterableDataset, self.root, tuple(op.call for op in self.ops), self.format, self.epoch, self._start))

    def __init__(self, root: Any, ops: Sequence[Op] = (), *, format: str | None = None, epoch: int = 0) -> None:
        self.root = root
        self.ops = tuple(ops)
        self.format = format
        self.epoch = epoch
        self._start: dict[str, Any] | None = None
        self._state: dict[str, Any] | None = None
        self._it: Any = None

    # ----------------------------------------------------------------- recipe
    @property
    def builder(self) -> str:
        return getattr(self.root, "builder", "interleave")

    @property
    def split(self) -> str:
        return getattr(self.root, "split", "train")

    @property
    def fingerprint(self) -> str:
        """A digest of the root and the methods called (what a state must match to resume)."""
        blob = json.dumps([self.root.describe(), [op.describe for op in self.ops]])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"dataset({self.fingerprint})"

    def stage(self, epoch: int | None = None) -> Dataset[Record]:
        """The record stage of this dataset for ``epoch`` (default: the one set)."""
        e = self.epoch if epoch is None else epoch
        stage = self.root.stage(e)
        for op in self.ops:
            stage = op.build(stage, e)
        return stage

    def keyed(self) -> bool:
        """Whether every row comes from one record by key (so a shuffle buffer can follow)."""
        return self.root.keyed() and all(op.keyed for op in self.ops)

    def _with(self, op: Op) -> IterableDataset:
        return IterableDataset(self.root, (*self.ops, op), format=self.format, epoch=self.epoch)

    def _worker_share(self, index: int, workers: int) -> IterableDataset | None:
        """What DataLoader worker ``index`` of ``workers`` reads (``None``: nothing), as ``datasets`` shares it."""
        n = self.n_shards
        if index == 0 and n < workers:
            too_many_workers(n, workers)
        if index >= n:
            return None
        parts = min(n, workers)
        ops = tuple(op if op.count is None else _slice_op(op.kind, split_number(op.count, parts)[index])
                    for op in self.ops)
        root = self.root.shard(parts, index, False)
        root = root.in_worker(index) if hasattr(root, "in_worker") else root
        return IterableDataset(root, ops, format=self.format, epoch=self.epoch)

    # ---------------------------------------------------------------- reading
    def __iter__(self) -> Iterator[Any]:
        worker = torch_worker()
        if worker is None:
            return self._rows()
        share = self._worker_share(*worker)
        return iter(()) if share is None else share._rows()

    def _rows(self) -> Iterator[Any]:
        it = iter(self.stage())
        if self._start is not None:
            it.set_state(self._start["records"])
        self._close()
        self._it = it
        fmt = formatter(self.format)
        try:
            while True:
                try:
                    rec = next(it)
                except StopIteration:
                    return
                yield fmt(rec.data)
        finally:
            if self._it is it:  # not an older iteration closed late
                self._state = self._state_of(it)
                self._it = None
                it.close()

    def _state_of(self, it: Any) -> dict[str, Any]:
        return {"version": STATE_VERSION, "fingerprint": self.fingerprint, "epoch": self.epoch, "records": it.get_state()}

    def _close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None

    def state_dict(self) -> dict[str, Any]:
        """The exact position after the last row returned (JSON-serialisable)."""
        if self._it is not None:
            return self._state_of(self._it)
        if self._state is not None:
            return copy.deepcopy(self._state)
        if self._start is not None:
            return copy.deepcopy(self._start)
        it = iter(self.stage())
        try:
            return self._state_of(it)
        finally:
            it.close()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` on the next iteration, in its epoch (refused if it is another dataset's)."""
        if state.get("version") != STATE_VERSION or "records" not in state:
            raise StateError(f"not a feedline.load_dataset state of version {STATE_VERSION} (got "
                             f"{state.get('version')!r}); pass what state_dict() returned")
        if state.get("fingerprint") != self.fingerprint:
            raise StateError(f"this state belongs to another dataset (fingerprint {state.get('fingerprint')}, this one "
                             f"is {self.fingerprint}): the same files, split and methods (map, filter, shuffle...) "
                             "are needed to resume")
        self._close()
        self.epoch = int(state.get("epoch", 0))
        self._start, self._state = copy.deepcopy(dict(state)), None

    # ---------------------------------------------------------------- columns
    def _columns(self, start: dict[str, Any] | None, wrap: Callable[[Any], Any]) -> dict[str, Any] | None:
        cols = start
        for op in self.ops:
            if cols is None:
                return None
            cols = op.columns(dict(cols), wrap)
        return cols

    @property
    def features(self) -> Any:
        """``datasets.Features`` where known (read from the files: json, parquet, arrow), else ``None``.

        As in ``datasets``, a ``map`` makes them unknown (``None``); column methods follow them.
        """
        from feedline._hf_datasets.features import features_of

        start = features_of(self.root)
        if start is None:
            return None
        import datasets

        cols = self._columns(dict(start), lambda t: datasets.List(t))
        return None if cols is None else datasets.Features(cols)

    @property
    def column_names(self) -> list[str] | None:
        """The columns where known (see :attr:`features`), else ``None``."""
        from feedline._hf_datasets.features import column_names_of

        names = column_names_of(self.root)
        cols = self._columns(None if names is None else dict.fromkeys(names), lambda t: t)
        return None if cols is None else list(cols)

    @property
    def n_shards(self) -> int:
        """Data files (what :meth:`shard` splits)."""
        return int(self.root.n_shards()) if hasattr(self.root, "n_shards") else len(self.root.sources)

    # ---------------------------------------------------------------- methods
    @recorded
    def map(self, function: Callable[..., Any] | None = None, with_indices: bool = False,
            input_columns: str | Sequence[str] | None = None, batched: bool = False, batch_size: int | None = 1000,
            drop_last_batch: bool = False, remove_columns: str | Sequence[str] | None = None,
            features: Any = None, fn_kwargs: Mapping[str, Any] | None = None) -> IterableDataset:
        """``datasets``' ``map``: the function's dict merged into each row (or batch), ``remove_columns`` dropped."""
        inputs = _names(input_columns)
        removed = _names(remove_columns) or ()
        fn = fns.map_rows(function, with_indices=with_indices, input_columns=inputs, batched=batched,
                          remove_columns=removed, fn_kwargs=fn_kwargs)
        desc = fn.__qualname__ + (f", batch_size={batch_size}, drop_last={drop_last_batch}" if batched else "")
        given = dict(features) if features is not None else None
        return self._with(Op("map", desc, lambda p, e: RowOp(p, fn, batched=batched, batch_size=batch_size,
                                                             drop_last=drop_last_batch, indexed=with_indices),
                             keyed=not batched and not with_indices, row_fn=None if batched or with_indices else fn,
                             columns=lambda d, wrap: given))

    @recorded
    def filter(self, function: Callable[..., Any] | None = None, with_indices: bool = False,
               input_columns: str | Sequence[str] | None = None, batched: bool = False, batch_size: int | None = 1000,
               fn_kwargs: Mapping[str, Any] | None = None) -> IterableDataset:
        """``datasets``' ``filter``: the rows whose predicate is true (a list of them when ``batched``)."""
        fn = fns.filter_rows(function, with_indices=with_indices, input_columns=_names(input_columns),
                             batched=batched, fn_kwargs=fn_kwargs)
        desc = fn.__qualname__ + (f", batch_size={batch_size}" if batched else "")
        return self._with(Op("filter", desc, lambda p, e: RowOp(p, fn, batched=batched, batch_size=batch_size,
                                                                indexed=with_indices),
                             keyed=not batched and not with_indices,
                             row_fn=None if batched or with_indices else fn, columns=_same))

    @recorded
    def select_columns(self, column_names: str | Sequence[str]) -> IterableDataset:
        names = list(_names(column_names) or ())
        fn = fns.columns_op("select", names, self.column_names)
        return self._with(Op("select", fn.__qualname__, lambda p, e: RowOp(p, fn), row_fn=fn,
                             columns=lambda d, wrap: {k: d[k] for k in names if k in d}))

    @recorded
    def remove_columns(self, column_names: str | Sequence[str]) -> IterableDataset:
        names = list(_names(column_names) or ())
        fn = fns.columns_op("remove", names, self.column_names)
        return self._with(Op("remove", fn.__qualname__, lambda p, e: RowOp(p, fn), row_fn=fn,
                             columns=lambda d, wrap: {k: v for k, v in d.items() if k not in names}))

    @recorded
    def rename_columns(self, column_mapping: Mapping[str, str]) -> IterableDataset:
        mapping = dict(column_mapping)
        fn = fns.columns_op("rename", mapping, self.column_names)
        return self._with(Op("rename", fn.__qualname__, lambda p, e: RowOp(p, fn), row_fn=fn,
                             columns=lambda d, wrap: {mapping.get(k, k): v for k, v in d.items()}))

    def rename_column(self, original_column_name: str, new_column_name: str) -> IterableDataset:
        return self.rename_columns({original_column_name: new_column_name})

    @recorded
    def take(self, n: int) -> IterableDataset:
        """The first ``n`` rows."""
        return self._with(_slice_op("take", int(n)))

    @recorded
    def skip(self, n: int) -> IterableDataset:
        """Every row after the first ``n``."""
        return self._with(_slice_op("skip", int(n)))

    @recorded
    def batch(self, batch_size: int, drop_last_batch: bool = False) -> IterableDataset:
        """Rows grouped into dicts of lists of ``batch_size`` rows (the last may be short)."""
        if batch_size < 1:
            raise SpecError(f"batch_size: {batch_size} must be >= 1")
        def fn(rows: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
            return [fns.rows_to_batch(rows)]

        return self._with(Op("batch", f"batch({batch_size}, drop_last={drop_last_batch})",
                             lambda p, e: RowOp(p, fn, batched=True, batch_size=batch_size, drop_last=drop_last_batch),
                             keyed=False, columns=lambda d, wrap: {k: wrap(v) for k, v in d.items()}))

    @recorded
    def shuffle(self, seed: int | None = None, buffer_size: int = 1000) -> IterableDataset:
        """A seeded buffer of ``buffer_size`` rows, restored exactly on resume (another order than ``datasets``').

        Called on files directly, the files' order is shuffled too (as ``datasets`` does); the seed
        is ``seed + epoch`` (:meth:`set_epoch`).
        """
        if buffer_size < 1:
            raise SpecError(f"buffer_size: {buffer_size} must be >= 1")
        s = 0 if seed is None else int(seed)
        if not self.ops and isinstance(self.root, FileRoot) and self.root.shuffle_buffer is None:
            root = dataclasses.replace(self.root, seed=s, shuffle_buffer=buffer_size)
            return IterableDataset(root, format=self.format, epoch=self.epoch)
        if not self.keyed():
            raise SpecError("shuffle after batch(), a batched map/filter or with_indices: feedline restores a "
                            "shuffle buffer by re-reading its rows' records, which those rows do not map to one to "
                            "one; shuffle before them (ds.shuffle(...).map(..., batched=True))")
        return self._with(Op("shuffle", f"shuffle({s}, {buffer_size})",
                             lambda p, e: ShuffleBuffer(p, buffer_size, seed=s + e), columns=_same))

    def shard(self, num_shards: int, index: int, contiguous: bool = True) -> IterableDataset:
        """Shard ``index`` of ``num_shards``: a part of the data files, as ``datasets`` shards (not rows)."""
        return IterableDataset(self.root.shard(num_shards, index, contiguous), self.ops, format=self.format,
                               epoch=self.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Shuffles use ``seed + epoch`` from the next iteration on (in place, as ``datasets``)."""
        self.epoch = int(epoch)

    def with_format(self, type: str | None = None) -> IterableDataset:
        """Rows as ``numpy`` or ``torch`` values (see :mod:`~feedline._hf_datasets.formats`); ``None``: Python."""
        formatter(type)  # refuse an unknown format now
        return IterableDataset(self.root, self.ops, format=type, epoch=self.epoch)

    # --------------------------------------------------------------- training
    def to_loader(self, tokenizer: str | None = None, task: Mapping[str, Any] | str | None = None,
                  batching: Mapping[str, Any] | None = None, *, text: str | None = "text", rank: int = 0,
                  world_size: int = 1, **spec: Any) -> Any:
        """A :class:`~feedline.Loader` over these rows: tokenized, task-shaped, batched.

        ``map``, ``filter`` and column methods become the spec's record transforms (in-process);
        ``take``/``skip``/``batch``, batched or indexed functions and interleaving stay
        ``datasets``-side only. ``text`` names the field holding the text (``None`` for chat rows);
        a field the first row lacks is refused at once (:mod:`~feedline._hf_datasets.to_loader`).
        """
        from feedline._hf_datasets.to_loader import to_loader

        return to_loader(self, tokenizer, task, batching, text=text, rank=rank, world_size=world_size, **spec)

    def __repr__(self) -> str:
        ops = "".join(f".{op.describe}" for op in self.ops)
        return f"IterableDataset({self.root.describe()}{ops})"


def _slice_op(kind: str, n: int) -> Op:
    """``take(n)`` or ``skip(n)``."""
    return Op(kind, f"{kind}({n})", lambda p, e: Slice(p, 0, n) if kind == "take" else Slice(p, n, None),
              columns=_same, count=n, call=(kind, (n,), ()))


def _names(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


@functools.cache
def _torch_kind() -> type[IterableDataset]:
    """The :class:`IterableDataset` that is a ``torch.utils.data.IterableDataset`` too, built once where torch
    is importable, so ``DataLoader(ds, batch_size=8)`` iterates the rows rather than asking for a length
    (it pickles through ``__reduce__``, as its root and calls)."""
    import torch.utils.data

    class TorchIterableDataset(IterableDataset, torch.utils.data.IterableDataset):  # type: ignore[misc]
        """A :class:`feedline.IterableDataset` that torch's ``DataLoader`` reads as an iterable dataset."""

    TorchIterableDataset.__qualname__ = "TorchIterableDataset"
    return TorchIterableDataset

