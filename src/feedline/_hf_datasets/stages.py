"""The stages behind ``feedline.load_dataset``'s row methods: rows in, rows out, exact state.

Rows travel as :class:`~feedline._core.record.Record` (the row in ``data``), so the keys of the
records they come from stay with them and a shuffle buffer above a one-to-one stage restores
itself by re-reading its rows' records (``fetch``) and running the stage's function again.

- :class:`RowOp`: a function over each row, or over batches of ``batch_size`` rows (``map``,
  ``filter``, column methods, ``batch``). State ``{"parent", "index", "skip"}``: per row, the
  parent's state and the rows seen (``with_indices``); batched, the parent's state at the start
  of the current batch and the outputs of it already returned (a restore re-reads that batch).
- :class:`Slice`: rows ``[start, stop)`` of the parent (``skip``, ``take``, ``train[10:20]``).
  State ``{"parent", "seen"}``.
- :class:`RowFix`: a pure function of each record's key and row, on reads and re-reads alike (the
  JSON types ``datasets`` gives a split, a text file's byte-order mark). State: the parent's.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.record import Key, Record
from feedline._hf_datasets.functions import RowsFn
from feedline.errors import StateError

__all__ = ["RowFix", "RowOp", "Slice"]


class RowOp(Dataset[Record]):
    """Run ``fn(rows, index_of_first)`` on each row, or on batches of ``batch_size`` rows when ``batched``.

    Args:
        parent: the rows.
        fn: see :mod:`feedline._hf_datasets.functions`.
        batched: hand ``fn`` batches (their outputs may be any number of rows).
        batch_size: rows per batch (``None`` or ``<= 0``: the whole stream, as ``datasets``).
        drop_last: drop a last batch shorter than ``batch_size``.
        indexed: ``fn`` uses the rows' indices (so a row cannot be re-made from its key alone).
    """

    def __init__(self, parent: Dataset[Record], fn: RowsFn, *, batched: bool = False, batch_size: int | None = 1000,
                 drop_last: bool = False, indexed: bool = False) -> None:
        self.parent = parent
        self.fn = fn
        self.batched = batched
        self.batch_size = batch_size if batch_size and batch_size > 0 else None
        self.drop_last = drop_last
        self.indexed = indexed

    @property
    def keyed(self) -> bool:
        """Whether each output row is one input row's (so ``fetch`` can re-make it from its key)."""
        return not self.batched and not self.indexed

    def fetch(self, keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
        if not self.keyed:
            raise StateError("a batched or indexed map/filter cannot re-make a row from its key; shuffle before it")
        out: dict[Key, dict[str, Any]] = {}
        for k, data in self.parent.fetch(keys).items():
            rows = self.fn([data], 0)
            if not rows:
                raise StateError(f"record {tuple(k)} is now filtered out; the data or a function changed since the "
                                 "state was saved (functions must be pure)")
            out[k] = rows[0]
        return out

    def __iter__(self) -> RowOpIterator:
        return RowOpIterator(self)


class RowOpIterator(DatasetIterator[Record]):
    """Cursor over a :class:`RowOp`."""

    NAME = "row function"
    STATE_KEYS = ("index", "skip")

    def __init__(self, ds: RowOp) -> None:
        self.ds = ds
        self.parent: DatasetIterator[Record] = iter(ds.parent)
        self.index = 0          # rows read from the parent so far (the next row's index)
        self.out: list[Record] = []  # outputs of the current batch
        self.pos = 0            # outputs of it returned
        self.start: State | None = None  # the parent's state at the current batch's start
        self.start_index = 0
        self.done = False

    def _batch(self) -> bool:
        """Read and run the next batch (rows, or one row); False at the end."""
        if self.done:
            return False
        ds = self.ds
        self.start = self.parent.get_state() if ds.batched else None
        self.start_index = self.index
        if ds.batched:
            recs = self.parent.take(ds.batch_size) if ds.batch_size else list(self.parent)
        else:
            rec = next(self.parent, None)
            recs = [] if rec is None else [rec]
        if not recs or (ds.drop_last and ds.batch_size and len(recs) < ds.batch_size):
            self.done, self.out, self.pos = True, [], 0
            return False
        self.index += len(recs)
        try:
            rows = ds.fn([r.data for r in recs], self.start_index)
        except Exception as e:  # the caller's own exception, as datasets raises it, told where it happened
            at = f"rows {self.start_index}-{self.index - 1}" if len(recs) > 1 else f"row {self.start_index}"
            note = getattr(e, "add_note", None)  # Python 3.11+
            if note is not None:
                note(f"feedline: raised by {getattr(ds.fn, '__qualname__', ds.fn)} on {at} of its input "
                     f"(record {tuple(recs[0].key)})")
            raise
        self.out = [Record(recs[0].key, recs[0].epoch, row) for row in rows]  # batched: the batch's first key
        self.pos = 0
        return True

    def __next__(self) -> Record:
        while self.pos >= len(self.out):
            if not self._batch():
                raise StopIteration
        rec = self.out[self.pos]
        self.pos += 1
        return rec

    def get_state(self) -> State:
        if self.ds.batched and self.pos < len(self.out):  # inside a batch: its start, and how far
            return {"parent": self.start, "index": self.start_index, "skip": self.pos}
        return {"parent": self.parent.get_state(), "index": self.index, "skip": 0}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.parent.set_state(state["parent"])
        self.index, skip = int(state["index"]), int(state["skip"])
        self.out, self.pos, self.done = [], 0, False
        if skip:
            if not self._batch() or skip > len(self.out):
                raise StateError(f"row function: the batch at this state gives fewer than {skip} rows now; the data "
                                 "or the function changed since the state was saved")
            self.pos = skip


class Slice(Dataset[Record]):
    """Rows ``[start, stop)`` of ``parent`` (``stop=None``: to the end)."""

    def __init__(self, parent: Dataset[Record], start: int = 0, stop: int | None = None) -> None:
        self.parent = parent
        self.start = max(0, start)
        self.stop = stop

    def __iter__(self) -> SliceIterator:
        return SliceIterator(self)


class SliceIterator(DatasetIterator[Record]):
    """Cursor over a :class:`Slice`."""

    NAME = "slice"
    STATE_KEYS = ("seen",)

    def __init__(self, ds: Slice) -> None:
        self.ds = ds
        self.parent: DatasetIterator[Record] = iter(ds.parent)
        self.seen = 0  # rows read from the parent

    def __next__(self) -> Record:
        ds = self.ds
        while self.seen < ds.start:
            next(self.parent)
            self.seen += 1
        if ds.stop is not None and self.seen >= ds.stop:
            raise StopIteration
        rec = next(self.parent)
        self.seen += 1
        return rec

    def own_state(self) -> State:
        return {"seen": self.seen}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.seen = int(own["seen"])


class RowFix(Dataset[Record]):
    """One row out for each record of ``parent``: :meth:`fix` of its key and row, on reads and on
    re-reads (:meth:`fetch`) alike. Keys pass through and ``fix`` is pure, so the state is the parent's."""

    def __init__(self, parent: Dataset[Record]) -> None:
        self.parent = parent

    @abstractmethod
    def fix(self, key: Key, data: dict[str, Any]) -> dict[str, Any]:
        """The row of the record ``key`` as this stage gives it."""

    def fetch(self, keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
        return {k: self.fix(k, d) for k, d in self.parent.fetch(keys).items()}

    def __iter__(self) -> _RowFixIterator:
        return _RowFixIterator(self)


class _RowFixIterator(DatasetIterator[Record]):
    NAME = "row fix"

    def __init__(self, ds: RowFix) -> None:
        self.ds = ds
        self.parent: DatasetIterator[Record] = iter(ds.parent)

    def __next__(self) -> Record:
        rec = next(self.parent)
        return Record(rec.key, rec.epoch, self.ds.fix(rec.key, rec.data))

    def take(self, n: int) -> list[Record]:
        fix = self.ds.fix
        return [Record(r.key, r.epoch, fix(r.key, r.data)) for r in self.parent.take(n)]
