"""Packed rows: pieces of documents laid side by side in fixed-shape ``[B, max_length]`` arrays.

Shared by the ``pack`` and ``concat`` strategies. A :class:`Piece` is a slice ``[start, stop)`` of
one example's token fields; a row is a list of pieces. :func:`collate_rows` lays rows out as::

    row with pieces of 3 and 2 tokens, max_length 8, max_docs 4:
    input_ids      [a0 a1 a2 b0 b1 pd pd pd]
    labels         [-100 a1 a2 -100 b1 -100 -100 -100]   first token of each piece: no loss
    position_ids   [0  1  2  0  1  0  0  0]                 restart per piece
    attention_mask [1  1  1  1  1  0  0  0]                 (or [8, 8] block-diagonal, see below)
    seq_lens       [3  2  0  0]                              [B, max_docs], zeros after the last
    cu_seqlens     [0  3  5  5  5]                           [B, max_docs + 1], repeats the row total

Padding belongs to no piece: it lies after ``cu_seqlens[b, -1]``. :func:`flat_cu_seqlens` gives
the 1-D offsets of a flattened ``[B * max_length]`` batch for varlen attention kernels, with each
row's padding as one extra segment so the offsets cover every position.

A piece's state ref is ``[source, file, position, epoch, sub, start]``: the example's ref plus the
token offset where a longer document was cut; ``stop`` follows from the strategy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from feedline._batching.base import Batch, int_dtype
from feedline._core.block import exclusive_cumsum
from feedline._core.record import Example
from feedline.errors import TaskError

__all__ = ["COUNTING_UP_TO", "Attention", "Piece", "RowFill", "collate_flat", "collate_rows", "counting", "flat_cu_seqlens", "piece_of",
           "piece_positions", "row_counts", "token_fields"]

Attention = Literal["padding", "block_diagonal", "block_causal"]


@dataclass(slots=True)
class Piece:
    """Tokens ``[start, stop)`` of one example; ``fields`` are already sliced."""

    ref: tuple[int, ...]
    start: int
    fields: dict[str, np.ndarray]

    @property
    def length(self) -> int:
        return int(self.fields["input_ids"].shape[0])

    @property
    def state_ref(self) -> list[int]:
        return [*self.ref, self.start]


def token_fields(ex: Example, strategy: str) -> dict[str, np.ndarray]:
    """The example's per-token fields; per-example (0-D) fields cannot be packed.

    Raises:
        TaskError: naming the 0-D field and the strategies that keep it.
    """
    for name, arr in ex.fields.items():
        if arr.ndim == 0:
            raise TaskError(f"batching.strategy {strategy!r} lays several examples in one row, but field {name!r} "
                            f"has one value per example (record {ex.key}); use strategy 'pad' or 'bucket' for this task")
    return ex.fields


def piece_of(ex: Example, start: int, stop: int, strategy: str) -> Piece:
    """The piece ``[start, stop)`` of an example."""
    return Piece(ex.ref, start, {k: v[start:stop] for k, v in token_fields(ex, strategy).items()})


def collate_rows(rows: Sequence[Sequence[Piece]], max_length: int, max_docs: int, pad_values: Mapping[str, Any], *,
                 reset_positions: bool = True, mask_first: bool = True, attention: Attention = "padding") -> Batch:
    """Lay packed rows out as fixed-shape arrays; see the module docstring.

        >>> ids = lambda *v: {"input_ids": np.array(v, np.int32), "labels": np.array(v, np.int32)}
        >>> b = collate_rows([[Piece((0,), 0, ids(5, 6, 7)), Piece((1,), 0, ids(8, 9))]], 6, 3, {"labels": -100})
        >>> b["labels"].tolist(), b["position_ids"].tolist(), b["cu_seqlens"].tolist()
        ([[-100, 6, 7, -100, 9, -100]], [[0, 1, 2, 0, 1, 0]], [[0, 3, 5, 5]])
    """
    docs = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    pieces = [p for row in rows for p in row]
    lengths = np.fromiter((p.length for p in pieces), dtype=np.int64, count=len(pieces))
    first = rows[0][0].fields
    values = {name: np.concatenate([p.fields[name] for p in pieces]) for name in first}
    return collate_flat(docs, lengths, values, max_length, max_docs, pad_values, like=first,
                        reset_positions=reset_positions, mask_first=mask_first, attention=attention)


def collate_flat(docs: np.ndarray, lengths: np.ndarray, values: Mapping[str, np.ndarray], max_length: int,
                 max_docs: int, pad_values: Mapping[str, Any], *, like: Mapping[str, np.ndarray] | None = None,
                 reset_positions: bool = True, mask_first: bool = True, attention: Attention = "padding") -> Batch:
    """:func:`collate_rows` of rows given as arrays: ``docs`` pieces per row, each piece's length, and
    per token field every piece's tokens one after another (``like``: arrays whose dtype and trailing
    shape each field takes; default ``values``).

        >>> v = {"input_ids": np.array([5, 6, 7, 8, 9], np.int32)}
        >>> collate_flat(np.array([2]), np.array([3, 2]), v, 6, 3, {})["seq_lens"].tolist()
        [[3, 2, 0]]
    """
    like = values if like is None else like
    n = len(docs)
    seq_lens, cu, totals, first = row_counts(docs, lengths, max_length, max_docs)
    first = first[lengths > 0]   # an empty piece marks no token
    fill = RowFill(totals, max_length)
    batch: Batch = {}
    for name, arr in like.items():
        batch[name] = fill.lay(values[name], pad_values.get(name, 0), int_dtype(name, arr))
    if reset_positions:
        positions = fill.lay(piece_positions(lengths), 0, np.dtype(np.int32))
    else:
        positions = np.broadcast_to(np.arange(max_length, dtype=np.int32), (n, max_length)).copy()
    if "labels" in batch and mask_first:
        labels = batch["labels"]
        labels.reshape(n * max_length, *labels.shape[2:])[first] = -100
    batch["position_ids"] = positions
    batch["seq_lens"] = seq_lens
    batch["cu_seqlens"] = cu
    if attention == "padding":
        batch["attention_mask"] = fill.lay(None, 0, np.dtype(np.int32))
    else:
        real = np.arange(max_length)[None, :] < totals[:, None]
        starts = np.zeros((n, max_length), dtype=bool)
        starts.reshape(-1)[first] = True
        seg = np.cumsum(starts, axis=1) * real  # 1-based segment id, 0 on padding
        mask = (seg[:, :, None] == seg[:, None, :]) & real[:, :, None]
        if attention == "block_causal":
            mask &= np.tri(max_length, dtype=bool)[None]
        batch["attention_mask"] = mask
    return batch


#: Up to this many rows, a batch that is not full is laid out row by row (a slice per row and field:
#: ~1 us each) rather than through one boolean mask over every place of the batch.
_ROW_BY_ROW = 32


def row_counts(docs: np.ndarray, lengths: np.ndarray, max_length: int,
               max_docs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The counts of packed rows given as ``docs`` pieces per row and each piece's length: per row its
    ``seq_lens`` (``max_docs`` wide), ``cu_seqlens`` and tokens; per piece its first token's place in
    the laid-out rows (row * max_length + the row's tokens before it).

    Raises:
        TaskError: a row holds over ``max_docs`` pieces or over ``max_length`` tokens.
    """
    n = len(docs)
    if docs.max(initial=0) > max_docs:
        raise TaskError(f"a packed row holds {int(docs.max())} documents but max_docs_per_row is {max_docs}")
    # every piece at once, through flat indices (one store per array) and two cumulative sums over the
    # pieces, no reduction along the rows of ``[rows, max_docs]`` (numpy's sum and cumsum along a row of
    # 64 took ~150 us for 256 rows, the whole function ~80 us now)
    rows = np.arange(n, dtype=np.int64)
    bounds = np.zeros(n + 1, dtype=np.int64)   # each row's first piece (and the end)
    np.cumsum(docs, out=bounds[1:])
    cum = np.zeros(len(lengths) + 1, dtype=np.int64)   # the tokens before each piece (and all)
    np.cumsum(lengths, out=cum[1:])
    before = cum[bounds]   # the tokens before each row (and all)
    totals = before[1:] - before[:-1]
    if totals.max(initial=0) > max_length:
        raise TaskError(f"a packed row holds {int(totals.max())} tokens but max_length is {max_length}")
    lead = np.repeat(before[:-1], docs)   # per piece, the tokens before its row
    slot = np.arange(len(lengths)) + np.repeat(rows * max_docs - bounds[:-1], docs)   # row * max_docs + its index in the row
    seq_lens = np.zeros((n, max_docs), dtype=np.int32)
    seq_lens.reshape(-1)[slot] = lengths
    # cu_seqlens: 0, the row's tokens up to the end of each piece, then the row's total to the end
    cu = np.repeat(totals.astype(np.int32), max_docs + 1).reshape(n, max_docs + 1)
    cu[:, 0] = 0
    cu.reshape(-1)[slot + np.repeat(rows + 1, docs)] = cum[1:] - lead
    first = cum[:-1] - lead + np.repeat(rows * max_length, docs)
    return seq_lens, cu, totals, first


class RowFill:
    """Where a batch's tokens go. A row's pieces lie end to end from its start, rows in order, so
    the tokens, in order, fill exactly the first ``totals[r]`` places of each row ``r``: every row
    full is one reshape, a few rows a slice each, more rows one boolean mask over the batch."""

    __slots__ = ("full", "real", "rows", "shape")

    def __init__(self, totals: np.ndarray, max_length: int) -> None:
        n = len(totals)
        self.shape = (n, max_length)
        self.full = int(totals.min(initial=max_length)) == max_length
        self.rows: list[tuple[int, int, int]] | None = None   # (row, first token, tokens)
        self.real: np.ndarray | None = None
        if not self.full and n <= _ROW_BY_ROW:
            counts = totals.tolist()
            self.rows = list(zip(range(n), exclusive_cumsum(totals).tolist(), counts))
        elif not self.full:
            self.real = np.arange(max_length)[None, :] < totals[:, None]

    def lay(self, flat: np.ndarray | None, pad: Any, dtype: np.dtype[Any]) -> np.ndarray:
        """``flat`` (the batch's tokens end to end; ``None``: a 1 per token) laid out, ``pad`` elsewhere."""
        trailing = flat.shape[1:] if flat is not None else ()
        if self.full:
            if flat is None:
                return np.ones(self.shape, dtype=dtype)
            return flat.reshape(*self.shape, *trailing).astype(dtype, copy=True)
        out = np.full((*self.shape, *trailing), pad, dtype=dtype)
        value = 1 if flat is None else flat
        if self.rows is not None:
            for r, start, count in self.rows:
                out[r, :count] = value if flat is None else flat[start:start + count]
        else:
            out[self.real] = value
        return out


def piece_positions(lengths: np.ndarray) -> np.ndarray:
    """Each token's index in its piece, pieces end to end (int32): a slice of ``0, 1, 2, ...`` per
    piece for a few pieces; for many, each token's index in the batch less its piece's first
    (one arange and one repeat: ~35 us for 234 pieces of a 16 K-token batch, where a slice per piece
    cost ~85 us for 320 pieces and a cumulative sum of steps ~165 us on this 2-core machine).

        >>> piece_positions(np.array([3, 0, 2, 1])).tolist()
        [0, 1, 2, 0, 1, 0]
        >>> piece_positions(np.array([2, 0, 1] * 40)).tolist()[:6]
        [0, 1, 0, 0, 1, 0]
    """
    if len(lengths) <= _SLICES_UP_TO and int(lengths.max(initial=0)) <= len(_COUNTING):
        return np.concatenate([_COUNTING[:k] for k in lengths.tolist()]) if len(lengths) else _COUNTING[:0].copy()
    total = int(lengths.sum())
    kind = np.int32 if total < 1 << 31 else np.int64
    out = np.arange(total, dtype=kind)
    out -= np.repeat(exclusive_cumsum(lengths).astype(kind), lengths)
    return out.astype(np.int32, copy=False)


#: Up to this many pieces a batch's positions are slices of :data:`_COUNTING`.
_SLICES_UP_TO = 64
#: The longest piece whose positions are a slice of :data:`_COUNTING`.
COUNTING_UP_TO = 1 << 16
_COUNTS: dict[type, np.ndarray] = {}


def counting(n: int, kind: type = np.int32) -> np.ndarray:
    """``np.arange(n, dtype=kind)``, read-only: a view of one kept array per type, grown as needed
    (positions and gather indices are slices of it or differences from it, not a fresh arange a batch).

        >>> counting(4).tolist()
        [0, 1, 2, 3]
    """
    have = _COUNTS.get(kind)
    if have is None or len(have) < n:
        have = np.arange(max(n, 2 * len(have) if have is not None else 0), dtype=kind)
        have.flags.writeable = False
        _COUNTS[kind] = have
    return have[:n]


_COUNTING = counting(COUNTING_UP_TO)


def flat_cu_seqlens(batch: Mapping[str, np.ndarray]) -> np.ndarray:
    """Offsets of every segment of the flattened batch ``[B * max_length]`` (int32).

    Each row contributes its documents, then its padding as one segment (if any), so the offsets
    start at 0 and end at ``B * max_length``: the ``cu_seqlens`` argument of varlen kernels.

        >>> flat_cu_seqlens({"seq_lens": np.array([[3, 2, 0], [6, 0, 0]]), "input_ids": np.zeros((2, 6))}).tolist()
        [0, 3, 5, 6, 12]
    """
    seq_lens = np.asarray(batch["seq_lens"])
    width = int(batch["input_ids"].shape[1])
    out = [0]
    for r, lens in enumerate(seq_lens):
        base = r * width
        for length in lens[lens > 0]:
            out.append(out[-1] + int(length))
        if out[-1] < base + width:
            out.append(base + width)
    return np.asarray(out, dtype=np.int32)
