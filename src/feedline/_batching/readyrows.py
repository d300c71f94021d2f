"""The pack batcher's next ready rows, gathered together: a batch's tokens are a slice of them.

Gathering a batch's tokens from the pool (:meth:`~feedline._batching.pieces.PiecePool.compact`)
costs a dozen numpy calls and an index of the batch's tokens, whatever the batch holds. The rows
that wait in the packer's ``ready`` queue are gathered in one call instead (whole batches, up to
~256 K tokens), and each batch is the next rows' slices of them::

    ready rows (queue)   r0 r1 ... r15 | r16 ... r31 | r32 ...   gathered once
    batch 1              rows [0, 16)   (a slice of each field, of the pieces' lengths)
    batch 2                              rows [16, 32)

A batch of full rows (long documents: most rows are one piece) is laid out straight from its
tokens (:func:`~feedline._batching.concatrun.lay_rows`), others as before
(:meth:`~feedline._batching.compact.CompactBatch.expand`). The batches are the ones the per-batch
path gives, array for array.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline._batching.base import Batch
from feedline._batching.compact import CompactBatch
from feedline._batching.concatrun import lay_rows
from feedline._batching.pieces import PiecePool
from feedline._batching.rows import Attention

__all__ = ["ReadyRows", "rows_to_gather"]

#: Ready rows are gathered together up to about this many slots (whole batches; at least one).
_GATHER_SLOTS = 1 << 18


def rows_to_gather(ready: int, batch_rows: int, max_length: int) -> int:
    """How many of ``ready`` rows to gather at once: whole batches up to :data:`_GATHER_SLOTS` slots
    (at least one batch, at most every ready row)."""
    batches = max(1, _GATHER_SLOTS // max(1, batch_rows * max_length))
    return min(ready, batch_rows * batches)


class ReadyRows:
    """Rows of kept piece ids gathered as one compact batch, handed out a batch at a time."""

    __slots__ = ("_piece_at", "_token_at", "compact", "taken")

    def __init__(self, pool: PiecePool, rows: Sequence[Sequence[int]], max_length: int, max_docs: int,
                 pad_values: Mapping[str, Any], *, mask_first: bool, attention: Attention) -> None:
        self.compact = pool.compact(rows, max_length, max_docs, pad_values, mask_first=mask_first, attention=attention)
        self._piece_at = np.zeros(len(rows) + 1, dtype=np.int64)   # each row's first piece (and the end)
        np.cumsum(self.compact.docs, out=self._piece_at[1:])
        self._token_at = np.zeros(len(self.compact.lengths) + 1, dtype=np.int64)   # each piece's first token
        np.cumsum(self.compact.lengths, out=self._token_at[1:])
        self.taken = 0

    def __len__(self) -> int:
        return len(self.compact.docs)

    def left(self) -> int:
        """Rows not handed out yet."""
        return len(self) - self.taken

    def _take(self, rows: int) -> tuple[int, int]:
        if rows > self.left():
            raise ValueError(f"ready rows: {rows} rows asked, {self.left()} left")
        a = self.taken
        self.taken += rows
        return a, a + rows

    def next_compact(self, rows: int) -> CompactBatch:
        """The next ``rows`` rows as a compact batch (its arrays are views of the gathered ones)."""
        a, b = self._take(rows)
        c = self.compact
        p0, p1 = int(self._piece_at[a]), int(self._piece_at[b])
        t0, t1 = int(self._token_at[p0]), int(self._token_at[p1])
        cut: dict[int, np.ndarray] = {}   # fields sharing an array still share one
        values = {name: cut[id(v)] if id(v) in cut else cut.setdefault(id(v), v[t0:t1]) for name, v in c.values.items()}
        return CompactBatch(c.docs[a:b], c.lengths[p0:p1], values, c.max_length, c.max_docs, c.pad_values,
                            c.mask_first, c.attention)

    def next_batch(self, rows: int) -> tuple[Batch, int]:
        """The next ``rows`` rows laid out, and their real tokens: full rows straight from their
        tokens (:func:`~feedline._batching.concatrun.lay_rows`: one copy per field and fewer passes),
        others by :meth:`CompactBatch.expand` (laying every gathered row out at once and copying each
        batch's rows out of it measured no faster: the layout is bound by memory, not calls)."""
        c = self.compact
        compact = self.next_compact(rows)
        tokens = compact.tokens()
        if c.attention != "padding" or tokens != rows * c.max_length:
            return compact.expand(), tokens
        a = self.taken - rows
        p0 = int(self._piece_at[a])
        starts = self._token_at[p0:p0 + len(compact.lengths)] - self._token_at[p0]
        full = _Full(compact.docs, self._piece_at[a:a + rows] - p0, compact.lengths, starts)
        return lay_rows(full, compact.values, c.values, c.max_length, c.max_docs, reset_positions=True,
                        mask_first=c.mask_first), tokens


@dataclass(frozen=True, slots=True)
class _Full:
    """Full rows as :func:`~feedline._batching.concatrun.lay_rows` takes them."""

    docs: np.ndarray
    row_first: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
