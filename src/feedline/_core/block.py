"""Examples of one chunk as columns: a task's output without an object per example.

A task that can build a whole chunk at once returns an :class:`ExampleBlock` instead of a list
of :class:`~feedline._core.record.Example` per record: every example's ref in one ``[n, 5]``
table, its token span in ``starts``/``lengths``, and each token field as one flat array shared
by all examples of the chunk (``input_ids`` and ``labels`` may be the same array)::

    records   r0 (3 tokens)         r1 (rejected)     r2 (5 tokens, cut at 4)
    refs      [s f p0 e 0]                            [s f p2 e 0]  [s f p2 e 1]
    record    0                                       2             2
    starts    0                                       3             7
    lengths   3                                       4             1
    input_ids a a a | c c c c c                       (one flat array)
    rejected  [(1, Rejection(...))]

Consumers that work per example index it (``block[i]`` is an ``Example`` holding copies);
the task map hands blocks on whole and the ``pack`` batcher places their pieces as arrays.
:meth:`ExampleBlock.outputs` turns a block back into the per-record list of ``Task.process``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from feedline._core.record import Example, Record, Rejection

__all__ = ["ExampleBlock", "exclusive_cumsum", "gather_spans", "record_keys", "spans"]


def exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    """Where each of consecutive runs of ``counts`` starts (int64).

        >>> exclusive_cumsum(np.array([2, 0, 3])).tolist()
        [0, 2, 2]
    """
    out = np.zeros(len(counts), dtype=np.int64)
    if len(counts) > 1:
        np.cumsum(counts[:-1], out=out[1:])
    return out


def record_keys(records: Sequence[Record]) -> np.ndarray:
    """``[n, 4]`` int64: each record's key (source, file, position) and epoch, the first columns of
    the refs of the examples a task builds from them."""
    return np.array([(*r.key, r.epoch) for r in records], dtype=np.int64).reshape(-1, 4)


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The flat indices of every span ``[starts[i], starts[i] + lengths[i])``, in order.

        >>> spans(np.array([5, 0]), np.array([2, 3])).tolist()
        [5, 6, 0, 1, 2]
        >>> spans(np.array([4, 9, 1]), np.array([0, 2, 1])).tolist()
        [9, 10, 1]
    """
    lengths, starts = np.asarray(lengths, dtype=np.int64), np.asarray(starts, dtype=np.int64)
    # Each place's index in the batch plus its span's shift (an empty span repeats nothing): numpy's
    # repeat and arange run at memory speed where a cumulative sum does not (numpy 2.4, 16 K
    # indices in spans of ~70: ~45 us against ~145 us for one cumulative sum of steps).
    out = np.arange(int(lengths.sum()), dtype=np.int64)
    out += np.repeat(starts - exclusive_cumsum(lengths), lengths)
    return out


#: Average span length from which :func:`gather_spans` copies slices instead of building an index
#: (16 K tokens of int32 from a 16 MB buffer: spans of ~70, slices 97 us, index 46 us; ~200: 37 and
#: 43 us; ~1,000: 12 and 46 us).
_SLICE_FROM = 160


def gather_spans(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``buf[spans(starts, lengths)]``: a few long spans are copied as slices (no index array of one
    int64 per token), many short ones through :func:`spans`.

        >>> gather_spans(np.arange(10) * 10, np.array([5, 0]), np.array([2, 3])).tolist()
        [50, 60, 0, 10, 20]
    """
    total = int(np.sum(lengths))
    if len(lengths) and total >= _SLICE_FROM * len(lengths):
        return np.concatenate([buf[a:a + n] for a, n in zip(np.asarray(starts).tolist(), np.asarray(lengths).tolist())])
    return buf[spans(starts, lengths)]


#: Signed integer types an example's ids are widened from (unsigned ones always are).
_NARROW = (np.dtype(np.int8), np.dtype(np.int16))


@dataclass(slots=True)
class ExampleBlock:
    """The examples of one chunk of records, as columns; see the module docstring.

    Attributes:
        refs: ``[n, 5]`` int64, each example's ``[source, file, position, epoch, sub]``.
        record: ``[n]`` the index of each example's record in the chunk (ascending).
        starts: ``[n]`` where each example's tokens start in the flat fields.
        lengths: ``[n]`` each example's number of tokens.
        fields: per token field, one flat array holding every example's tokens.
        rejected: ``(record index, Rejection)`` of the records that gave no example, in order.
        base: ``(run, at)`` when these examples are ``run[at:at + n]`` of a block processed for
            several chunks at once (the task map's runs; :meth:`slice` keeps it).
    """

    refs: np.ndarray
    record: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    fields: dict[str, np.ndarray]
    rejected: list[tuple[int, Rejection]] = field(default_factory=list)
    base: tuple[ExampleBlock, int] | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> Example:
        """Example ``i`` (its fields are copies, so a buffered example never holds the chunk; ids
        stored narrower, such as a memory map's uint16, are int32 copies)."""
        s = int(self.starts[i])
        e = s + int(self.lengths[i])
        made: dict[int, np.ndarray] = {}
        fields = {}
        for name, arr in self.fields.items():
            if id(arr) not in made:
                made[id(arr)] = arr[s:e].astype(np.int32) if arr.dtype.kind == "u" or arr.dtype in _NARROW else arr[s:e].copy()
            fields[name] = made[id(arr)]
        r = self.refs[i]
        return Example((int(r[0]), int(r[1]), int(r[2])), int(r[3]), int(r[4]), fields)

    def slice(self, start: int, stop: int) -> ExampleBlock:
        """Examples ``[start, stop)`` (views; the rejections stay with the whole block)."""
        base = None if self.base is None else (self.base[0], self.base[1] + start)
        return ExampleBlock(self.refs[start:stop], self.record[start:stop], self.starts[start:stop],
                            self.lengths[start:stop], self.fields, base=base)

    def examples_before(self, record: int) -> int:
        """How many examples come from records before ``record``."""
        return int(np.searchsorted(self.record, record, side="left"))

    def outputs(self, n_records: int) -> list[list[Example] | Rejection]:
        """The per-record list ``Task.process`` returns: each record's examples, or its rejection."""
        out: list[list[Example] | Rejection] = [[] for _ in range(n_records)]
        for i, r in enumerate(self.record.tolist()):
            out[r].append(self[i])  # type: ignore[union-attr]
        for r, rej in self.rejected:
            out[r] = rej
        return out

    @classmethod
    def empty(cls, rejected: Sequence[tuple[int, Rejection]] = ()) -> ExampleBlock:
        z = np.zeros(0, dtype=np.int64)
        return cls(np.zeros((0, 5), dtype=np.int64), z, z, z, {}, list(rejected))

    @classmethod
    def from_examples(cls, examples: Sequence[Example]) -> ExampleBlock:
        """One block of ``examples`` (their fields concatenated; every example must have the same fields)."""
        if not examples:
            return cls.empty()
        lengths = np.fromiter((ex.length for ex in examples), dtype=np.int64, count=len(examples))
        refs = np.array([ex.ref for ex in examples], dtype=np.int64).reshape(-1, 5)
        names = list(examples[0].fields)
        fields = {name: np.concatenate([ex.fields[name] for ex in examples]) for name in names}
        return cls(refs, np.arange(len(examples), dtype=np.int64), exclusive_cumsum(lengths), lengths, fields)

    @classmethod
    def merge(cls, parts: Sequence[ExampleBlock]) -> ExampleBlock:
        """Blocks of disjoint records of one chunk merged into one, in record order (fields by name)."""
        parts = [p for p in parts if len(p) or p.rejected]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        names = next((list(p.fields) for p in parts if p.fields), [])
        sizes = [len(p.fields[names[0]]) if names and p.fields else 0 for p in parts]
        base = exclusive_cumsum(np.array(sizes, dtype=np.int64))
        record = np.concatenate([p.record for p in parts])
        order = np.argsort(record, kind="stable")
        fields = {name: np.concatenate([p.fields[name] for p in parts if p.fields]) for name in names}
        starts = np.concatenate([p.starts + b for p, b in zip(parts, base.tolist(), strict=True)])
        rejected = sorted((r for p in parts for r in p.rejected), key=lambda x: x[0])
        return cls(np.concatenate([p.refs for p in parts])[order], record[order], starts[order],
                   np.concatenate([p.lengths for p in parts])[order], fields, rejected)
