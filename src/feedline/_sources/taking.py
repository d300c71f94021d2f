"""How a source's cursor takes records from a split read in lists of items or in runs of documents.

:meth:`~feedline._sources.source.FileSourceIterator.take` hands a split read by ``read_batches``
here: lists of items become records one by one (rejections counted as they come), a
:class:`~feedline._core.documents.TokenItems` run becomes one
:class:`~feedline._core.documents.TokenRecords` slice. Either way the cursor's position, line and
counts end as after taking the records one at a time. :func:`chunk_plan` tells the task map how
many records its next chunk holds, from the sizes of the current run, so a chunk is one take.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from feedline._core.dataset import State
from feedline._core.documents import ID_BYTES, TokenItems, TokenRecords, chunk_steps
from feedline._core.record import Record, Rejection
from feedline._core.report import Rejections
from feedline._sources.reader import Item, Split


class _Source(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def splits(self) -> list[Split]: ...
    epochs: int | None

    def order(self, epoch: int) -> list[int]: ...


class FileSourceIterator(Protocol):
    """What these functions read and move of the calling
    :class:`~feedline._sources.source.FileSourceIterator` (a protocol: importing that class here
    would make an import cycle): its split, position and line, the list of items (or run) being
    taken from ``_at`` on, and its rejection bookkeeping."""

    @property
    def src(self) -> _Source: ...
    rejections: Rejections
    split: int
    epoch: int
    pos: int | None
    line: int
    _items: Any
    _order: list[int] | None
    _pending: list[Item] | TokenItems
    _at: int
    _delivered: int
    _watch: bool

    def get_state(self) -> State: ...
    def _next_item(self, items: Iterator[Any]) -> Any: ...
    def _check_nothing(self, *, at_end: bool) -> None: ...

__all__ = ["chunk_plan", "following_split", "run_sizes", "run_states", "take_batched"]


def following_split(it: FileSourceIterator) -> Split | None:
    """The split the cursor reads after its current one (the next epoch's first after the last);
    ``None`` after the last epoch's last (a hint for :meth:`~feedline._sources.reader.Reader.read_ahead`)."""
    order, n = it._order or [], it.split + 1
    if n < len(order):
        return it.src.splits[order[n]]
    if it.src.epochs is not None and it.epoch + 1 >= it.src.epochs:
        return None
    return it.src.splits[it.src.order(it.epoch + 1)[0]]


def chunk_plan(it: FileSourceIterator, most: int, budget: int) -> int | None:
    """The records of the task map's next chunk (:func:`~feedline._core.documents.chunk_steps`),
    where the current run holds them; ``None`` otherwise."""
    pend = it._pending
    if it._items is None or not isinstance(pend, TokenItems):
        return None
    return chunk_steps(pend.lengths[it._at:it._at + most] * ID_BYTES, most, budget)


def run_sizes(it: FileSourceIterator, most: int) -> np.ndarray | None:
    """The sizes (as a chunk counts them) of up to ``most`` next records, those the current run holds;
    ``None`` outside a run."""
    pend = it._pending
    if it._items is None or not isinstance(pend, TokenItems):
        return None
    return pend.lengths[it._at:it._at + most] * ID_BYTES  # type: ignore[no-any-return]


def run_states(it: FileSourceIterator, counts: Sequence[int]) -> list[dict[str, Any]]:
    """The cursor's state after taking each of ``counts`` more records (each at most what
    :func:`run_sizes` gave), without taking them: a run moves only the position and line."""
    pend, at = it._pending, it._at
    assert isinstance(pend, TokenItems), "run_states is asked only inside a run (after run_sizes)"
    base = it.get_state()
    out = []
    for k in counts:
        if not k:
            out.append(base)
            continue
        out.append({**base, "pos": int(pend.next[at + k - 1]), "line": int(pend.line[at + k - 1]),
                    "rejected": dict(base["rejected"])})
    return out


def take_batched(it: FileSourceIterator, n: int, parts: list[Sequence[Record]], items: Iterator[Any], epoch: int,
                 file: int) -> int:
    """:meth:`FileSourceIterator.take` from a split read in lists of items or :class:`TokenItems` runs: the same records,
    rejections and state; appends runs of records to ``parts`` and returns how many."""
    index = it.src.index
    out: list[Record] = []
    add, taken = out.append, 0
    while taken + len(out) < n:
        pend, at = it._pending, it._at
        if at >= len(pend):
            batch = it._next_item(items)
            if batch is None:
                it._items, it.split, it.pos = None, it.split + 1, None
                it._pending, it._at = [], 0
                break
            it._pending, it._at = pend, at = batch, 0
        stop = min(len(pend), at + n - taken - len(out))
        if isinstance(pend, TokenItems):  # a run of documents: one slice of arrays
            parts += [out, TokenRecords.of(pend, at, stop, index, file, epoch)]
            taken, out = taken + len(out), []
            add = out.append
            taken += stop - at
            it._delivered += stop - at
            it._watch = False
            it._at = stop
            it.pos, it.line = int(pend.next[stop - 1]), int(pend.line[stop - 1])
            continue
        before, watch = len(out), it._watch
        for pos, _next, _line, rec in pend[at:stop]:
            if isinstance(rec, Rejection):
                it.rejections.add(rec)
                if watch:
                    it._check_nothing(at_end=False)
                continue
            add(Record((index, file, pos), epoch, rec))
            watch = False
        it._watch = watch
        it._delivered += len(out) - before
        it._at = stop
        _pos, it.pos, it.line, _rec = pend[stop - 1]
    parts.append(out)
    return taken + len(out)
