"""The pieces a packer holds, as arrays: no object per piece, no per-piece work per batch.

A piece is a slice of one example's tokens. :class:`PiecePool` gives each piece an integer id
(in arrival order) and keeps, for the pieces still held (the window being placed, open rows,
rows not yet delivered), their state refs ``[source, file, position, epoch, sub, start]``,
lengths and tokens. The packer moves ids; a batch gathers its rows' tokens with one index
computation (:meth:`PiecePool.collate`), and the state's refs are one lookup
(:meth:`PiecePool.refs`)::

    add(block pieces)          -> ids 0..4 (tokens stay in the block's arrays)
    packer places ids          -> ready [[0, 3]], open [[1, 2, 4]]
    keep([0, 3, 1, 2, 4])      -> tokens of those ids copied into one array; the block is freed
    collate([[0, 3]])          -> the batch
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedline.batching.base import Batch
from feedline.batching.rows import Attention, collate_flat
from feedline.core.block import spans

__all__ = ["PiecePool"]


class _Part:
    """Pieces ``first..first + n`` whose tokens are ``fields[name][at[i]:at[i] + lengths[i]]``."""

    __slots__ = ("at", "fields", "first", "lengths", "refs")

    def __init__(self, first: int, refs: np.ndarray, lengths: np.ndarray, at: np.ndarray, fields: Mapping[str, np.ndarray]):
        self.first, self.refs, self.lengths, self.at, self.fields = first, refs, lengths, at, dict(fields)


class PiecePool:
    """Pieces by id; see the module docstring."""

    def __init__(self) -> None:
        self.next_id = 0
        self.ids = np.zeros(0, dtype=np.int64)  # sorted ids of the kept pieces
        self.kept: _Part | None = None  # their refs, lengths and tokens (rows in the order of ``ids``)
        self.parts: list[_Part] = []  # pieces added since the last keep

    def add(self, refs: np.ndarray, lengths: np.ndarray, at: np.ndarray, fields: Mapping[str, np.ndarray]) -> range:
        """Add pieces (their tokens are ``fields[name][at:at + length]``); returns their ids."""
        ids = range(self.next_id, self.next_id + len(lengths))
        if len(lengths):
            self.parts.append(_Part(self.next_id, np.asarray(refs, dtype=np.int64).reshape(-1, 6),
                                    np.asarray(lengths, dtype=np.int64), np.asarray(at, dtype=np.int64), fields))
            self.next_id += len(lengths)
        return ids

    def keep(self, ids: np.ndarray) -> None:
        """Keep only the pieces ``ids`` (every other is dropped), their tokens in one array per field."""
        want = np.unique(np.asarray(ids, dtype=np.int64))
        parts = ([self.kept] if self.kept is not None else []) + self.parts
        refs, lengths, gathered = [], [], []
        names: list[str] = []
        for part in parts:
            rows = self._rows(part, want)
            if not len(rows):
                continue
            names = names or list(part.fields)
            refs.append(part.refs[rows])
            lengths.append(part.lengths[rows])
            src = spans(part.at[rows], part.lengths[rows])
            gathered.append({name: part.fields[name][src] for name in part.fields})
        self.parts = []
        if sum(len(x) for x in lengths) != len(want):
            raise KeyError(f"piece pool: {len(want) - sum(len(x) for x in lengths)} piece ids to keep are not held")
        if not refs:
            self.ids, self.kept = want[:0], None
            return
        n = np.concatenate(lengths)
        fields = {name: np.concatenate([g[name] for g in gathered]) for name in names}
        at = np.zeros(len(n), dtype=np.int64)
        np.cumsum(n[:-1], out=at[1:])
        self.ids = want
        self.kept = _Part(0, np.concatenate(refs), n, at, fields)

    def _rows(self, part: _Part, want: np.ndarray) -> np.ndarray:
        """The rows of ``part`` holding the pieces of ``want`` (sorted), in id order."""
        if part is self.kept:
            return np.searchsorted(self.ids, want[np.isin(want, self.ids, assume_unique=True)])
        lo, hi = np.searchsorted(want, [part.first, part.first + len(part.lengths)])
        return want[lo:hi] - part.first

    def _kept_rows(self, ids: np.ndarray) -> np.ndarray:
        if self.parts:
            raise RuntimeError("piece pool: keep() the live pieces before reading them")
        rows = np.searchsorted(self.ids, ids)
        if len(ids) and (rows.max() >= len(self.ids) or not np.array_equal(self.ids[rows], ids)):
            raise KeyError("piece pool: a piece id is not kept")
        return rows

    def refs(self, ids: np.ndarray) -> np.ndarray:
        """``[len(ids), 6]`` state refs of kept pieces."""
        if self.kept is None:
            return np.zeros((0, 6), dtype=np.int64)
        return self.kept.refs[self._kept_rows(np.asarray(ids, dtype=np.int64))]

    def lengths(self, ids: np.ndarray) -> np.ndarray:
        if self.kept is None:
            return np.zeros(0, dtype=np.int64)
        return self.kept.lengths[self._kept_rows(np.asarray(ids, dtype=np.int64))]

    def collate(self, rows: Sequence[Sequence[int]], max_length: int, max_docs: int, pad_values: Mapping[str, Any], *,
                mask_first: bool, attention: Attention) -> tuple[Batch, int]:
        """Rows of kept piece ids laid out as a batch (:func:`~feedline.batching.rows.collate_flat`);
        also returns the number of real tokens."""
        if self.kept is None:
            raise RuntimeError("piece pool: no piece is kept")
        docs = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        ids = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(docs.sum()))
        k = self._kept_rows(ids)
        lengths = self.kept.lengths[k]
        src = spans(self.kept.at[k], lengths)
        values = {name: arr[src] for name, arr in self.kept.fields.items()}
        batch = collate_flat(docs, lengths, values, max_length, max_docs, pad_values, mask_first=mask_first,
                             attention=attention)
        return batch, int(lengths.sum())
