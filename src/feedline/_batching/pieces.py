"""The pieces a packer holds, as arrays: no object per piece, no per-piece work per batch.

A piece is a slice of one example's tokens. :class:`PiecePool` gives each piece an integer id
(in arrival order) and keeps, for the pieces still held (the window being placed, open rows,
rows not yet delivered), their state refs ``[source, file, position, epoch, sub, start]``,
lengths and where their tokens are. Tokens are appended to one growing array per field (the
*arena*: one copy per chunk of examples, not per piece; typed as the batches, so ids stored as
uint16 are converted in that copy); when delivered pieces make up most of
it, the live tokens are copied to a fresh arena. The packer moves ids; a batch gathers its rows'
tokens with one index computation (:meth:`PiecePool.collate`), and the state's refs are one
lookup (:func:`lookup_refs`)::

    add(block pieces)          -> ids 0..4, tokens appended to the arena
    packer places ids          -> ready [[0, 3]], open [[1, 2, 4]]
    keep([0, 3, 1, 2, 4])      -> every other piece forgotten (its tokens freed at the next compaction)
    collate([[0, 3]])          -> the batch (compact([[0, 3]]): the same before layout)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline._batching.base import Batch, int_dtype
from feedline._batching.compact import CompactBatch
from feedline._batching.rows import Attention
from feedline._core.block import gather_spans

__all__ = ["Located", "PiecePool", "lookup_refs"]

#: The arena is compacted when it holds more than this many times the live tokens (plus a slack).
_GROWTH = 3
_SLACK = 1 << 16


@dataclass(frozen=True, slots=True)
class Located:
    """Rows of pieces in the arena: ``docs`` pieces per row; per piece its ``lengths`` and where its
    tokens start (``at``) in ``arena`` (own fields); ``fields`` maps each field to its arena field."""

    docs: np.ndarray
    lengths: np.ndarray
    at: np.ndarray
    arena: dict[str, np.ndarray]
    fields: dict[str, str]

    def values(self) -> dict[str, np.ndarray]:
        """Per field, every piece's tokens end to end (fields sharing tokens share one array)."""
        own = {name: gather_spans(buf, self.at, self.lengths) for name, buf in self.arena.items()}
        return {name: own[kept] for name, kept in self.fields.items()}


class PiecePool:
    """Pieces by id; see the module docstring."""

    def __init__(self) -> None:
        self.next_id = 0
        # the held pieces, in id order: ids, refs [n, 6], lengths, token offsets into the arena
        self.ids = np.zeros(0, dtype=np.int64)
        self._refs = np.zeros((0, 6), dtype=np.int64)
        self._lengths = np.zeros(0, dtype=np.int64)
        self._at = np.zeros(0, dtype=np.int64)
        self._new: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # added since the last keep
        self.arena: dict[str, np.ndarray] = {}
        self.alias: dict[str, str] = {}  # field -> the field whose tokens it shares (clm: labels -> input_ids)
        self.order: list[str] = []  # the fields, in the examples' order
        self.used = 0
        self._kept = 0  # ``used`` after the last keep

    def add(self, refs: np.ndarray, lengths: np.ndarray, at: np.ndarray, fields: Mapping[str, np.ndarray]) -> range:
        """Add pieces (their tokens are ``fields[name][at:at + length]``); returns their ids."""
        ids = range(self.next_id, self.next_id + len(lengths))
        if not len(lengths):
            return ids
        lengths = np.asarray(lengths, dtype=np.int64)
        at = np.asarray(at, dtype=np.int64)
        lo, hi = int(at.min()), int((at + lengths).max())
        base = self._append(fields, lo, hi)
        self._new.append((np.asarray(refs, dtype=np.int64).reshape(-1, 6), lengths, at - lo + base))
        self.next_id += len(lengths)
        return ids

    def _append(self, fields: Mapping[str, np.ndarray], lo: int, hi: int) -> int:
        """Copy tokens ``[lo, hi)`` to the end of the arena; returns where they start. A field that is
        the same array as an earlier one (``labels`` of ``clm``) is stored once while every block shares it."""
        n = hi - lo
        if not self.arena and not self.alias:
            self.order = list(fields)
            first: dict[int, str] = {}
            for name, arr in fields.items():
                if id(arr) in first:
                    self.alias[name] = first[id(arr)]
                else:
                    first[id(arr)] = name
            self.arena = {name: np.empty((max(n, _SLACK), *arr.shape[1:]), dtype=int_dtype(name, arr))
                          for name, arr in fields.items() if name not in self.alias}
        if self.arena.keys() | self.alias.keys() != fields.keys():
            raise ValueError(f"pack: examples with fields {sorted(fields)} after examples with {sorted(self.arena)}")
        for name, other in list(self.alias.items()):
            if fields[name] is not fields[other]:  # no longer shared: give the field its own tokens
                self.arena[name] = self.arena[other].copy()
                del self.alias[name]
        fields = {name: arr[lo:hi] for name, arr in fields.items() if name not in self.alias}
        if self.used + n > len(next(iter(self.arena.values()))):
            size = max(2 * len(next(iter(self.arena.values()))), self.used + n)
            for name, buf in self.arena.items():
                grown = np.empty((size, *buf.shape[1:]), dtype=np.result_type(buf, int_dtype(name, fields[name])))
                grown[:self.used] = buf[:self.used]
                self.arena[name] = grown
        base = self.used
        for name, arr in fields.items():
            self.arena[name][base:base + n] = arr
        self.used += n
        return base

    def keep(self, ids: np.ndarray) -> None:
        """Keep only the pieces ``ids`` (every other is forgotten); compacts the arena when mostly dead."""
        want = np.asarray(ids, dtype=np.int64)
        if self._new:
            first = self.next_id - sum(len(n[1]) for n in self._new)
            ids_all = np.concatenate([self.ids, np.arange(first, self.next_id, dtype=np.int64)])
            refs = np.concatenate([self._refs, *(n[0] for n in self._new)])
            lengths = np.concatenate([self._lengths, *(n[1] for n in self._new)])
            at = np.concatenate([self._at, *(n[2] for n in self._new)])
            self._new = []
        else:
            ids_all, refs, lengths, at = self.ids, self._refs, self._lengths, self._at
        rows = _held_rows(ids_all, want)
        self.ids, self._refs, self._lengths, self._at = ids_all[rows], refs.take(rows, axis=0), lengths[rows], at[rows]
        live = int(self._lengths.sum())
        if self.used > _GROWTH * live + _SLACK:
            starts, lengths = _merged(self._at, self._lengths)  # live pieces next to each other: one span
            # room for the tokens added until the next compaction: it comes at the first keep past the
            # bound, up to a keep's worth of blocks later (twice what came since the last keep)
            room = _GROWTH * live + _SLACK + 2 * (self.used - self._kept)
            self.arena = {name: _with_room(gather_spans(buf, starts, lengths), room) for name, buf in self.arena.items()}
            self._at = np.zeros(len(want), dtype=np.int64)
            if len(want) > 1:
                np.cumsum(self._lengths[:-1], out=self._at[1:])
            self.used = live
        self._kept = self.used

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        if self._new:
            raise RuntimeError("piece pool: keep() the live pieces before reading them")
        return _find(self.ids, ids)

    def ref_table(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept pieces' ids and refs (for :func:`lookup_refs`); the pool replaces these arrays,
        never writes into them, so they stay valid after later calls."""
        if self._new:
            raise RuntimeError("piece pool: keep() the live pieces before reading them")
        return self.ids, self._refs

    def locate(self, rows: Sequence[Sequence[int]], flat: tuple[np.ndarray, np.ndarray] | None = None) -> Located:
        """Where the tokens of rows of kept piece ids lie (valid until the pool is compacted: it
        replaces its arena, never writes over held tokens); ``flat``: the rows' pieces a row and
        their ids end to end, where the caller has them (else taken from ``rows``)."""
        if flat is not None:
            docs, ids = flat
            if len(docs) != len(rows):
                raise ValueError(f"piece pool: {len(docs)} rows' ids for {len(rows)} rows")
        else:
            docs = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(docs.sum()))
        k = self._rows(ids)
        return Located(docs, self._lengths[k], self._at[k], dict(self.arena),
                       {name: self.alias.get(name, name) for name in self.order})

    def compact(self, rows: Sequence[Sequence[int]], max_length: int, max_docs: int, pad_values: Mapping[str, Any], *,
                mask_first: bool, attention: Attention) -> CompactBatch:
        """Rows of kept piece ids as a :class:`~feedline._batching.compact.CompactBatch` (their
        tokens gathered, not yet laid out)."""
        loc = self.locate(rows)
        return CompactBatch(loc.docs, loc.lengths, loc.values(), max_length, max_docs, pad_values, mask_first, attention)

    def collate(self, rows: Sequence[Sequence[int]], max_length: int, max_docs: int, pad_values: Mapping[str, Any], *,
                mask_first: bool, attention: Attention) -> tuple[Batch, int]:
        """Rows of kept piece ids laid out as a batch (:func:`~feedline._batching.rows.collate_flat`);
        also returns the number of real tokens."""
        compact = self.compact(rows, max_length, max_docs, pad_values, mask_first=mask_first, attention=attention)
        return compact.expand(), compact.tokens()


#: :func:`_held_rows` marks ids over the table's range up to this many times its length (a bool each).
_MARKED_SPAN = 64


def _held_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rows of ``ids`` (any order) in the sorted id ``table``, ascending: ``table[rows]`` is
    ``ids`` sorted. Where the table spans up to :data:`_MARKED_SPAN` times as many ids as it holds
    (the pool's pieces: ids given in arrival order; on ~70-token documents an open row's old piece
    makes it ~16), one mark per id of its range instead of a sort and a search (~60 against ~20 us
    for 2,000 of 3,000 ids); otherwise, and for ids held twice, sorted and searched.

    Raises:
        KeyError: an id is not in ``table``.
    """
    n = len(table)
    if n and len(ids) and int(table[-1]) - int(table[0]) < _MARKED_SPAN * n:
        lo, hi = int(table[0]), int(table[-1])
        if lo <= int(ids.min()) and int(ids.max()) <= hi:
            marked = np.zeros(hi - lo + 1, dtype=bool)
            marked[ids - lo] = True
            rows = np.flatnonzero(marked[table - lo])
            if len(rows) == len(ids):
                return rows
    want = np.sort(ids)
    rows = np.searchsorted(table, want)
    if len(want) and (rows.max() >= n or not np.array_equal(table[rows], want)):
        raise KeyError("piece pool: a piece id to keep is not held")
    return rows


def _with_room(live: np.ndarray, room: int) -> np.ndarray:
    """An arena of ``room`` tokens (at least ``live``'s) starting with ``live``. Compacted to the live
    tokens alone, the arena grew again at the next blocks (doubling: each time a copy of what it
    held and a new buffer): on ~70-token documents 1.7 times the tokens added were copied again."""
    if room <= len(live):
        return live
    arena = np.empty((room, *live.shape[1:]), dtype=live.dtype)
    arena[:len(live)] = live
    return arena


def _merged(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spans ``[starts[i], starts[i] + lengths[i])`` in order, each run of them that lie end to end
    joined into one (the same tokens, in the same order). The live pieces at a compaction lie in
    arrival order with the delivered ones between: ~2,000 pieces of ~70 tokens join into ~300-600
    spans, which :func:`~feedline._core.block.gather_spans` copies as slices (no index of one int64
    per token).

        >>> [a.tolist() for a in _merged(np.array([0, 3, 9, 11]), np.array([3, 2, 2, 4]))]
        [[0, 9], [5, 6]]
    """
    if len(starts) < 2:
        return starts, lengths
    ends = starts + lengths
    first = np.flatnonzero(starts[1:] != ends[:-1]) + 1  # where a new span starts
    heads = np.concatenate([[0], first])
    tails = np.concatenate([first - 1, [len(starts) - 1]])
    return starts[heads], ends[tails] - starts[heads]


def _find(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rows of ``ids`` in the sorted id ``table``."""
    rows = np.searchsorted(table, ids)
    if len(ids) and (rows.max() >= len(table) or not np.array_equal(table[rows], ids)):
        raise KeyError("piece pool: a piece id is not kept")
    return rows


def lookup_refs(ids_table: np.ndarray, refs_table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``[len(ids), 6]`` refs of ``ids`` in a :meth:`PiecePool.ref_table`."""
    return refs_table[_find(ids_table, np.asarray(ids, dtype=np.int64))]
