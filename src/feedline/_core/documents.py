"""Pre-tokenized records as columns: a run of documents without an object per document.

A reader of token ids (flat, Megatron, Parquet/Arrow id columns) hands a split on as
:class:`TokenItems`: one flat id array (a view of the memory map or of the Arrow buffer where the
format allows) plus each document's start, length, position, next position and line. The source
turns a run of them into :class:`TokenRecords`, a ``Sequence[Record]`` that the ``clm`` task reads
as arrays (one copy of the ids per chunk, no list of records) and that any other consumer indexes
or iterates as the records the reader's per-document path would give::

    ids        a a a b b | c c c c          (one flat array, any integer dtype)
    keys       [s f 0 e] [s f 3 e] ...      (source, file, position, epoch)
    starts     0 3 5 ...    lengths 3 2 4 ...
    records[1] == Record((s, f, 3), e, {"input_ids": ids[3:5] as int32})

    >>> r = TokenRecords(np.array([[0, 0, 0, 0], [0, 0, 3, 0]]), np.array([0, 3]), np.array([3, 2]),
    ...                  np.arange(5, dtype=np.uint16))
    >>> len(r), r[1].key, r[1].data["input_ids"].tolist(), r.size()
    (2, (0, 0, 3), [3, 4], 20)
    >>> (r[:1] + r[1:]).keys[:, 2].tolist()
    [0, 3]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from feedline._core.record import Record

__all__ = ["ID_BYTES", "TokenItems", "TokenRecords", "chunk_progress", "chunk_steps", "join_records", "next_take"]

#: Bytes a record's ids count for in a chunk's size (:mod:`feedline._tasks.sizing`): int32 ids.
ID_BYTES = 4


@dataclass(frozen=True, slots=True)
class TokenItems:
    """A reader's run of documents of one split, as arrays (what ``Reader.read_batches`` may yield
    instead of a list of items): item ``i`` is ``(position[i], next[i], line[i], {"input_ids":
    ids[starts[i]:starts[i] + lengths[i]] as int32})``."""

    position: np.ndarray
    next: np.ndarray
    line: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.position)


class TokenRecords(Sequence[Record]):
    """Records of token ids as columns; see the module docstring.

    Args:
        keys: ``[n, 4]`` int64, each record's source, file, position and epoch.
        starts, lengths: each record's ids ``ids[starts[i]:starts[i] + lengths[i]]``.
        ids: the flat ids (any integer dtype; records hold them as int32).
    """

    __slots__ = ("ids", "keys", "lengths", "starts")

    def __init__(self, keys: np.ndarray, starts: np.ndarray, lengths: np.ndarray, ids: np.ndarray) -> None:
        self.keys, self.starts, self.lengths, self.ids = keys, starts, lengths, ids

    @classmethod
    def of(cls, items: TokenItems, lo: int, hi: int, source: int, file: int, epoch: int) -> TokenRecords:
        """Items ``[lo, hi)`` of a reader's run as the records of ``file`` of ``source`` in ``epoch``."""
        keys = np.empty((hi - lo, 4), dtype=np.int64)
        keys[:, 0], keys[:, 1], keys[:, 3] = source, file, epoch
        keys[:, 2] = items.position[lo:hi]
        return cls(keys, items.starts[lo:hi], items.lengths[lo:hi], items.ids)

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> TokenRecords: ...

    def __getitem__(self, i: int | slice) -> Record | TokenRecords:
        if isinstance(i, slice):
            return TokenRecords(self.keys[i], self.starts[i], self.lengths[i], self.ids)
        k = self.keys[i]
        a = int(self.starts[i])
        b = a + int(self.lengths[i])
        return Record((int(k[0]), int(k[1]), int(k[2])), int(k[3]), {"input_ids": self.ids[a:b].astype(np.int32)})

    def __iter__(self) -> Iterator[Record]:
        for i in range(len(self)):
            yield self[i]

    def __add__(self, other: Sequence[Record]) -> Sequence[Record]:
        if isinstance(other, TokenRecords):
            return join_records([self, other])
        return [*self, *other]

    def __radd__(self, other: Sequence[Record]) -> Sequence[Record]:
        return [*other, *self]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with the ids the records use only (never a whole memory map)."""
        if not len(self):
            return TokenRecords, (self.keys, self.starts, self.lengths, np.zeros(0, self.ids.dtype))
        lo, hi = int(self.starts.min()), int((self.starts + self.lengths).max())
        return TokenRecords, (self.keys, self.starts - lo, self.lengths, np.array(self.ids[lo:hi]))

    def size(self) -> int:
        """Bytes of the records' arrays, as :func:`~feedline._tasks.sizing.records_size` counts them."""
        return int(self.lengths.sum()) * ID_BYTES

    def span(self) -> tuple[int, int] | None:
        """``(first, end)`` when the records' ids lie back to back in ``ids[first:end]``, else ``None``."""
        n = len(self)
        if not n:
            return 0, 0
        first = int(self.starts[0])
        if n > 1 and not np.array_equal(self.starts[1:], self.starts[:-1] + self.lengths[:-1]):
            return None
        return first, int(self.starts[-1] + self.lengths[-1])


def join_records(parts: Sequence[Sequence[Record]]) -> Sequence[Record]:
    """Runs of records one after another: :class:`TokenRecords` when every run is one (their ids
    then share one array), else a list of records."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return []
    if len(parts) == 1:
        return parts[0]
    if not all(isinstance(p, TokenRecords) for p in parts):
        return [r for p in parts for r in p]
    runs: list[TokenRecords] = parts  # type: ignore[assignment]
    first = runs[0]
    keys = np.concatenate([p.keys for p in runs])
    lengths = np.concatenate([p.lengths for p in runs])
    if all(p.ids is first.ids for p in runs):
        return TokenRecords(keys, np.concatenate([p.starts for p in runs]), lengths, first.ids)
    ids, starts, at = [], [], 0
    for p in runs:  # each run's ids copied once, back to back
        lo = int(p.starts.min())
        hi = int((p.starts + p.lengths).max())
        ids.append(p.ids[lo:hi].astype(np.int32))
        starts.append(p.starts - lo + at)
        at += hi - lo
    return TokenRecords(keys, np.concatenate(starts), lengths, np.concatenate(ids))


def chunk_steps(sizes: np.ndarray, most: int, budget: int) -> int | None:
    """How many records :func:`~feedline._tasks.sizing.read_chunk` takes (at most ``most``, ending
    at the take that brings them to ``budget``) when the next records have ``sizes``; ``None``
    where it would read past them.

        >>> chunk_steps(np.full(100, 4), 256, 1 << 20), chunk_steps(np.full(300, 4), 256, 1 << 20)
        (None, 256)
        >>> chunk_steps(np.array([1, 1, 10, 10, 10, 10]), 8, 12)
        4
    """
    n, _size, _step, done = chunk_progress(sizes, most, budget)
    return n if done else None


def chunk_progress(sizes: np.ndarray, most: int, budget: int, start: tuple[int, int, int] = (0, 0, 1)
                   ) -> tuple[int, int, int, bool]:
    """:func:`chunk_steps`' takes over ``sizes`` as far as they go: ``(records, their size, the next
    take, whether the chunk is complete)``; where it is not, the takes go on past ``sizes`` from there.
    ``start``: a chunk already under way, ``(records, their size, the next take)``, whose next
    records have ``sizes``.

        >>> chunk_progress(np.full(100, 4), 256, 1 << 20)
        (64, 256, 64, False)
        >>> chunk_progress(np.full(100, 4), 256, 1 << 20, start=(16, 64, 16)), chunk_progress(np.full(300, 4), 256, 1 << 20, start=(8, 32, 8))
        ((64, 256, 64, False), (256, 1024, 256, True))
    """
    ends = np.cumsum(sizes)
    n0, size0, step = start
    n, size = n0, size0
    while n < most and size < budget:
        want = min(step, most - n)
        if n - n0 + want > len(ends):
            return n, size, step, False
        n += want
        size = size0 + int(ends[n - n0 - 1])
        step = next_take(n, size, budget)
    return n, size, step, True


def next_take(n: int, size: int, budget: int) -> int:
    """The next take of a chunk holding ``n`` records of ``size``: at most double (the overshoot stays
    below the last take), at least what the records so far say reaches ``budget``."""
    return n if size == 0 else max(1, min(n, -(-(budget - size) * n // size)))
