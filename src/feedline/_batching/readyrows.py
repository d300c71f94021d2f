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

Short pieces (under :data:`_LAID_BELOW` tokens on average) are not gathered into a compact copy
at all: every gathered row is laid out at once straight from the pool's arena (:func:`_lay_rows`:
one index of each laid-out place's arena token, its padding written after), and a batch is a copy
of its rows (flat pack of ~59-token documents, 16 x 1024: ~100 us a batch less in-thread CPU than
gathering, then laying out each batch a row slice at a time). Pieces of about a row each (long
documents: up to :data:`_SLICED_PIECES` a row on average) are laid out at once too, a slice a piece
copied from the arena (:func:`_lay_slices`). Pieces in between are gathered as slices and laid out
a batch at a time. The batches are the ones the per-batch path gives, array for array.
Block masks (``attention: block_diagonal``/``block_causal``) are laid out a batch at a time, from
the compact rows (gathered at the first :meth:`ReadyRows.next_compact`).

Rows laid out at once are made in the arena the thread was given, where it has one
(:mod:`feedline._core.memory`: a partition worker's shared memory, which its parent reads the
batches from in place), with their counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedline._batching.base import Batch, int_dtype
from feedline._batching.compact import CompactBatch
from feedline._batching.pieces import Located, PiecePool
from feedline._batching.rows import (
    COUNTING_UP_TO,
    Attention,
    RowFill,
    counting,
    piece_positions,
    row_counts,
)
from feedline._core import memory
from feedline._core.block import spans

__all__ = ["ReadyRows", "rows_to_gather"]

#: Ready rows are gathered together up to about this many slots (whole batches; at least one).
_GATHER_SLOTS = 1 << 18
#: Pieces shorter than this on average are laid out straight from the arena (:func:`_lay_rows`);
#: longer ones are gathered as slices (:func:`~feedline._core.block.gather_spans`) and laid out a batch at a time ...
_LAID_BELOW = 160
#: ... unless there are at most this many a row on average: then laid out from the arena a slice a piece (:func:`_lay_slices`;
#: bench/pretokenized.py long, flat pack: the gathers of ~3.2 pieces of ~300 tokens a row, 17 % of the rows, laid
#: out so too, -5.7 % instructions a batch against laying out those a batch at a time)
_SLICED_PIECES = 4


def rows_to_gather(ready: int, batch_rows: int, max_length: int) -> int:
    """How many of ``ready`` rows to gather at once: whole batches up to :data:`_GATHER_SLOTS` slots
    (at least one batch), all of them only where fewer than a batch are ready (the data's end). The
    rows after the last whole batch wait for the next window's: gathered with the ready rows before
    it, they were laid out twice (the gathered rows are dropped at each window), ~10 % of the rows
    laid out on ~70-token documents (a window makes ~80 rows, 5 batches of 16 and 0-15 left).

        >>> rows_to_gather(83, 16, 1024), rows_to_gather(700, 16, 1024), rows_to_gather(5, 16, 1024)
        (80, 256, 5)
    """
    batches = max(1, _GATHER_SLOTS // max(1, batch_rows * max_length))
    whole = ready - ready % batch_rows
    return min(whole or ready, batch_rows * batches)


class ReadyRows:
    """Rows of kept piece ids gathered as one compact batch, handed out a batch at a time."""

    __slots__ = ("_args", "_compact", "_cu", "_first", "_laid", "_loc", "_piece_at", "_positions", "_seq_lens",
                 "_token_at", "_totals", "taken")
    _positions: np.ndarray
    _compact: CompactBatch | None
    _laid: dict[str, np.ndarray] | None

    def __init__(self, pool: PiecePool, rows: Sequence[Sequence[int]], max_length: int, max_docs: int,
                 pad_values: Mapping[str, Any], *, mask_first: bool, attention: Attention,
                 flat: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """``flat``: the rows' pieces a row and their ids end to end, where the caller has them."""
        loc = self._loc = pool.locate(rows, flat)
        self._args = (max_length, max_docs, pad_values, mask_first, attention)
        self._compact = self._laid = None
        n, docs, lengths = len(rows), loc.docs, loc.lengths
        self._piece_at = np.zeros(n + 1, dtype=np.int64)   # each row's first piece (and the end)
        np.cumsum(docs, out=self._piece_at[1:])
        self._token_at = np.zeros(len(lengths) + 1, dtype=np.int64)   # each piece's first token
        np.cumsum(lengths, out=self._token_at[1:])
        self.taken = 0
        if attention != "padding":   # laid out a batch at a time (CompactBatch.expand)
            return
        # the layout's counts (what collate_flat computes for a batch), for every gathered row at once
        self._seq_lens, self._cu, self._totals, self._first = row_counts(docs, lengths, max_length, max_docs)
        short = len(lengths) and int(self._token_at[-1]) < _LAID_BELOW * len(lengths)
        if short or (len(lengths) <= _SLICED_PIECES * n and max_length <= COUNTING_UP_TO):
            where = memory.arena(_laid_bytes(loc, n * max_length) + self._seq_lens.nbytes + self._cu.nbytes)
            if where is not None:   # the counts beside the rows: a batch lies wholly in the arena
                self._seq_lens, self._cu = _into(where, self._seq_lens), _into(where, self._cu)
            if short:   # short pieces: every gathered row laid out at once, straight from the arena (one index)
                self._laid = _lay_rows(loc, self._piece_at, self._first, self._totals, max_length, pad_values,
                                       mask_first, where)
            else:   # few pieces a row (long documents): every gathered row laid out at once, a slice a piece
                self._laid = _lay_slices(loc, self._first, self._totals, max_length, pad_values, mask_first, where)
            return
        self._positions = piece_positions(lengths)

    @property
    def compact(self) -> CompactBatch:
        """Every gathered row as one compact batch (its tokens gathered at the first call)."""
        if self._compact is None:
            loc, (max_length, max_docs, pad_values, mask_first, attention) = self._loc, self._args
            self._compact = CompactBatch(loc.docs, loc.lengths, loc.values(), max_length, max_docs, pad_values,
                                         mask_first, attention)
        return self._compact

    def __len__(self) -> int:
        return len(self._loc.docs)

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
        if self._args[4] != "padding":
            compact = self.next_compact(rows)
            return compact.expand(), compact.tokens()
        if self._laid is not None:
            a, b = self._take(rows)
            # (rows of the gathered layout, not copies: no two batches share a row, so a consumer
            # writing into one changes no other)
            out: Batch = {name: laid[a:b] for name, laid in self._laid.items()}
            out["seq_lens"] = self._seq_lens[a:b]
            out["cu_seqlens"] = self._cu[a:b]
            out["attention_mask"] = out.pop("attention_mask")   # the layout's key order
            t0, t1 = int(self._token_at[self._piece_at[a]]), int(self._token_at[self._piece_at[b]])
            return out, t1 - t0
        c = self.compact
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
        batch["position_ids"] = fill.lay(self._positions[t0:t1], 0, np.dtype(np.int32))
        batch["seq_lens"] = self._seq_lens[a:b].copy()
        batch["cu_seqlens"] = self._cu[a:b].copy()
        batch["attention_mask"] = fill.lay(None, 0, np.dtype(np.int32))
        return batch, t1 - t0


def _laid_bytes(loc: Located, places: int) -> int:
    """At most the bytes :func:`_lay_rows` or :func:`_lay_slices` makes for ``places`` places (with alignment)."""
    per = 8   # position_ids, attention_mask
    for name, kept in loc.fields.items():
        buf, want = loc.arena[kept], int_dtype(name, loc.arena[kept])
        wide = int(np.prod(buf.shape[1:], dtype=np.int64))
        per += wide * (want.itemsize + (buf.dtype.itemsize if buf.dtype != want else 0))   # (taken, then cast)
    return places * per + 64 * (2 * len(loc.fields) + 6)


def _into(where: memory.Arena, arr: np.ndarray) -> np.ndarray:
    """``arr`` copied into ``where`` (itself where it does not fit)."""
    out = where.empty(arr.shape, arr.dtype)
    if out is None:
        return arr
    out[...] = arr
    return out


def _lay_rows(loc: Located, piece_at: np.ndarray, first: np.ndarray, totals: np.ndarray, width: int,
              pad_values: Mapping[str, Any], mask_first: bool, where: memory.Arena | None = None) -> dict[str, np.ndarray]:
    """Every row of ``loc`` laid out ``[rows, width]``: its token fields, ``position_ids`` and
    ``attention_mask`` (what :func:`~feedline._batching.rows.collate_flat` gives). Each row is its
    pieces then its padding; one index over the laid-out places (each place's arena token: its
    segment's shift added to an arange) gathers the tokens straight into the layout, with no
    gathered copy to lay out again, and the padding (~1 % of the places) is written after."""
    n, lengths = len(loc.docs), loc.lengths
    rows = np.arange(n, dtype=np.int64)
    slot = np.arange(len(lengths), dtype=np.int64) + np.repeat(rows, loc.docs)   # piece p of row r: slot p + r
    pad_slot = piece_at[1:] + rows                                                # row r's padding: after its pieces
    pad_first = rows * width + totals
    seg_len = np.empty(len(lengths) + n, dtype=np.int64)
    seg_len[slot], seg_len[pad_slot] = lengths, width - totals
    dest = np.empty_like(seg_len)
    dest[slot], dest[pad_slot] = first, pad_first
    src = np.zeros_like(seg_len)
    src[slot] = loc.at
    kind = np.int32 if n * width < 1 << 31 else np.int64
    # each place's index in its segment, and its arena token (padding: any, overwritten)
    # (in place in the repeats' outputs: no further array of a place each)
    starts = np.repeat(dest.astype(kind), seg_len)
    positions = starts if where is None else memory.empty(where, (n * width,), np.dtype(kind))
    np.subtract(counting(n * width, kind), starts, out=positions)
    index = np.repeat(src - dest, seg_len)
    index += counting(n * width, np.int64)
    taken: dict[str, np.ndarray] = {}   # each arena field's tokens, in its own dtype
    fields: dict[str, np.ndarray] = {}
    for name, kept in loc.fields.items():
        buf = loc.arena[kept]
        if kept not in taken:
            taken[kept] = np.take(buf, index, axis=0, mode="clip",
                                  out=memory.empty(where, (len(index), *buf.shape[1:]), buf.dtype))
            fields[name] = taken[kept] if buf.dtype == int_dtype(name, buf) else _copy(where, taken[kept], int_dtype(name, buf))
        else:   # a field sharing another's tokens (clm: labels): a copy, padded its own way
            fields[name] = _copy(where, taken[kept], int_dtype(name, buf))
    if positions.dtype != np.int32:
        positions = positions.astype(np.int32)
    return _finish(fields, positions, spans(pad_first, width - totals), first, n, width, pad_values, mask_first, where)



def _lay_slices(loc: Located, first: np.ndarray, totals: np.ndarray, width: int, pad_values: Mapping[str, Any],
                mask_first: bool, where: memory.Arena | None = None) -> dict[str, np.ndarray]:
    """What :func:`_lay_rows` gives, for pieces of about a row each (long documents): each piece's
    tokens are copied as one slice from the arena straight to its place in the layout, and its
    positions as one slice of ``0, 1, 2, ...`` (pieces of at most :data:`COUNTING_UP_TO` tokens);
    the padding is written after. No gathered copy of the tokens, no index of a place each, and no
    numpy calls a batch: a batch is rows of the layout."""
    n = len(loc.docs)
    places = n * width
    pads = spans(np.arange(n, dtype=np.int64) * width + totals, width - totals)
    used = set(loc.fields.values())
    laid = {kept: memory.empty(where, (places, *buf.shape[1:]), int_dtype(kept, buf))
            for kept, buf in loc.arena.items() if kept in used}
    positions = memory.empty(where, (places,), np.dtype(np.int32))
    count = counting(COUNTING_UP_TO)
    pieces = zip(first.tolist(), loc.at.tolist(), loc.lengths.tolist(), strict=True)
    if len(laid) == 1:
        (kept, dst), = laid.items()
        buf = loc.arena[kept]
        for f, a, k in pieces:
            dst[f:f + k] = buf[a:a + k]
            positions[f:f + k] = count[:k]
    else:
        pairs = [(dst, loc.arena[kept]) for kept, dst in laid.items()]
        for f, a, k in pieces:
            for dst, buf in pairs:
                dst[f:f + k] = buf[a:a + k]
            positions[f:f + k] = count[:k]
    fields: dict[str, np.ndarray] = {}
    taken: set[str] = set()
    for name, kept in loc.fields.items():
        # a field sharing another's tokens (clm: labels): a copy, padded its own way
        fields[name] = _copy(where, laid[kept]) if kept in taken else laid[kept]
        taken.add(kept)
    return _finish(fields, positions, pads, first, n, width, pad_values, mask_first, where)


def _copy(where: memory.Arena | None, arr: np.ndarray, dtype: np.dtype[Any] | None = None) -> np.ndarray:
    """``arr`` copied (as ``dtype``), into ``where`` where it fits."""
    out = memory.empty(where, arr.shape, arr.dtype if dtype is None else dtype)
    out[...] = arr
    return out


def _finish(fields: dict[str, np.ndarray], positions: np.ndarray, pads: np.ndarray, first: np.ndarray, n: int,
            width: int, pad_values: Mapping[str, Any], mask_first: bool,
            where: memory.Arena | None = None) -> dict[str, np.ndarray]:
    """The layout's fields (flat, a place each, every field its own array), ``position_ids`` and
    ``attention_mask`` as ``[n, width]`` rows: the padding places ``pads`` written, and the first
    token of each piece (flat places ``first``) left out of the labels with ``mask_first``."""
    out: dict[str, np.ndarray] = {}
    for name, arr in fields.items():
        arr[pads] = pad_values.get(name, 0)
        out[name] = arr.reshape(n, width, *arr.shape[1:])
    if "labels" in out and mask_first:
        out["labels"].reshape(n * width, *out["labels"].shape[2:])[first] = -100
    positions[pads] = 0
    out["position_ids"] = positions.reshape(n, width)
    mask = memory.empty(where, (n * width,), np.dtype(np.int32))
    mask.fill(1)
    mask[pads] = 0
    out["attention_mask"] = mask.reshape(n, width)
    return out
