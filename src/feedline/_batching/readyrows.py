"""The pack batcher's next ready rows, gathered together: a batch is slices of them.

Gathering a batch's tokens from the pool (:meth:`~feedline._batching.pieces.PiecePool.compact`)
and laying it out (:func:`~feedline._batching.rows.collate_flat`) cost a few dozen numpy calls
whatever the batch holds. Every part of a packed row depends on that row's pieces only, so the
rows that wait in the packer's ``ready`` queue are gathered in one call (whole batches, up to
~256 K tokens), their counts (``seq_lens``, ``cu_seqlens``, tokens per row, where each piece
starts) and their tokens' positions computed once, and each batch is the next rows' slices::

    ready rows (queue)   r0 r1 ... r15 | r16 ... r31 | r32 ...   gathered, counted once
    batch 1              rows [0, 16)   tokens and positions laid out, counts copied
    batch 2                              rows [16, 32)

The batches are the ones the per-batch path gives, array for array (laying every gathered row
out at once and copying each batch's rows out measured no faster: that part is bound by memory).
Block masks (``attention: block_diagonal``/``block_causal``) are laid out a batch at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedline._batching.base import Batch, int_dtype
from feedline._batching.compact import CompactBatch
from feedline._batching.pieces import PiecePool
from feedline._batching.rows import COUNTING_UP_TO, Attention, RowFill, lay_positions, piece_positions, row_counts

__all__ = ["ReadyRows", "rows_to_gather"]

#: Ready rows are gathered together up to about this many slots (whole batches; at least one).
_GATHER_SLOTS = 1 << 18
#: Up to this many pieces a row on average, a batch's positions are laid a slice a piece.
_SLICED_PIECES = 2


def rows_to_gather(ready: int, batch_rows: int, max_length: int) -> int:
    """How many of ``ready`` rows to gather at once: whole batches up to :data:`_GATHER_SLOTS` slots
    (at least one batch, at most every ready row)."""
    batches = max(1, _GATHER_SLOTS // max(1, batch_rows * max_length))
    return min(ready, batch_rows * batches)


class ReadyRows:
    """Rows of kept piece ids gathered as one compact batch, handed out a batch at a time."""

    __slots__ = ("_cu", "_first", "_piece_at", "_positions", "_seq_lens", "_token_at", "_totals", "compact", "taken")
    _positions: np.ndarray | None

    def __init__(self, pool: PiecePool, rows: Sequence[Sequence[int]], max_length: int, max_docs: int,
                 pad_values: Mapping[str, Any], *, mask_first: bool, attention: Attention) -> None:
        c = self.compact = pool.compact(rows, max_length, max_docs, pad_values, mask_first=mask_first, attention=attention)
        n, docs, lengths = len(rows), c.docs, c.lengths
        self._piece_at = np.zeros(n + 1, dtype=np.int64)   # each row's first piece (and the end)
        np.cumsum(docs, out=self._piece_at[1:])
        self._token_at = np.zeros(len(lengths) + 1, dtype=np.int64)   # each piece's first token
        np.cumsum(lengths, out=self._token_at[1:])
        self.taken = 0
        if attention != "padding":   # laid out a batch at a time (CompactBatch.expand)
            return
        # the layout's counts (what collate_flat computes for a batch), for every gathered row at once
        self._seq_lens, self._cu, self._totals, self._first = row_counts(docs, lengths, max_length, max_docs)
        # few pieces a row (long documents): each batch's positions are laid a slice a piece (~0.6 us
        # each) instead of computed for every gathered token and laid out again (~30 us a batch of 16 K)
        few = len(lengths) <= _SLICED_PIECES * n and max_length <= COUNTING_UP_TO
        self._positions = None if few else piece_positions(lengths)

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
        """The next ``rows`` rows laid out (what :meth:`CompactBatch.expand` gives), and their real
        tokens: their tokens (and positions) laid out as collate_flat lays them, their counts sliced
        from the gathered rows'."""
        c = self.compact
        if c.attention != "padding":
            compact = self.next_compact(rows)
            return compact.expand(), compact.tokens()
        a, b = self._take(rows)
        p0, p1 = int(self._piece_at[a]), int(self._piece_at[b])
        t0, t1 = int(self._token_at[p0]), int(self._token_at[p1])
        width = c.max_length
        fill = RowFill(self._totals[a:b], width)
        batch: Batch = {}
        for name, v in c.values.items():
            batch[name] = fill.lay(v[t0:t1], c.pad_values.get(name, 0), int_dtype(name, v))
        if "labels" in batch and c.mask_first:
            labels = batch["labels"]
            labels.reshape(rows * width, *labels.shape[2:])[self._first[p0:p1] - a * width] = -100
        if self._positions is None:
            batch["position_ids"] = lay_positions(self._first[p0:p1] - a * width, c.lengths[p0:p1], rows, width)
        else:
            batch["position_ids"] = fill.lay(self._positions[t0:t1], 0, np.dtype(np.int32))
        batch["seq_lens"] = self._seq_lens[a:b].copy()
        batch["cu_seqlens"] = self._cu[a:b].copy()
        batch["attention_mask"] = fill.lay(None, 0, np.dtype(np.int32))
        return batch, t1 - t0
