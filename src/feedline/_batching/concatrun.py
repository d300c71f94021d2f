"""A whole ``concat`` batch cut from one contiguous block at once: a slice of its tokens.

Where the examples of a block lie back to back in its fields (a pre-tokenized run: the task map's
:meth:`~feedline._tasks.map.TaskMapIterator.peek_run`) and the block holds the batch's
``rows * width`` tokens from where the stream stands (inside the carried document or at the next
example), the batch is those tokens: one slice per field. Its pieces start at each document start
and each row start inside it; no row may hold more than ``max_docs`` of them (else the per-row path
closes rows early and this one does not apply)::

    tokens   p0 ......................................... p0 + rows * width
    starts      |d1     |d2   |d3          |d4 ...              (the documents' first tokens)
    rows     |row 0          |row 1            |row 2 ...
    pieces   every boundary of either kind, in order; lengths their differences

:func:`run_rows` gives the pieces and what the per-row path would count and carry, or ``None``
where it does not apply (:class:`~feedline._batching.concat.ConcatIterator` then cuts as before);
:func:`lay_rows` lays full rows out as :func:`~feedline._batching.rows.collate_flat` does, with
fewer passes (every row is full and the pieces' starts are known). A batch that runs past a block's
end is cut from :func:`join_blocks` of its examples left and the next block's first (one copy of
about a batch of tokens), where :func:`rows_fit_before` says every example left goes into it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from feedline._batching.base import Batch, int_dtype
from feedline._core.block import ExampleBlock

__all__ = ["RunCut", "cut_values", "join_blocks", "lay_rows", "rows_fit_before", "run_rows"]


@dataclass(frozen=True, slots=True)
class RunCut:
    """A batch of ``len(docs)`` full rows: ``docs`` pieces per row (``row_first``: the index of each
    row's first), the pieces' ``lengths`` and ``starts`` (in the batch's tokens), which are the
    slices ``src`` (fields, start, stop) end to end: the block's, after the carried document's rest
    when that lies in another block; ``taken`` examples taken from the
    block's ``i``-th on, ``split`` of them cut by a row's end, and the last one's ``rest`` (where
    the next batch continues it; ``None``: it ended with the batch)."""

    docs: np.ndarray
    row_first: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    src: list[tuple[dict[str, np.ndarray], int, int]]
    taken: int
    split: int
    rest: int | None


def run_rows(blk: ExampleBlock, ends: np.ndarray, i: int, carry: tuple[ExampleBlock, int] | None, rows: int,
             width: int, max_docs: int) -> RunCut | None:
    """The next ``rows`` rows of ``width`` tokens from example ``i`` of ``blk`` (``ends``: its examples'
    cumulative lengths; its examples lie back to back in its fields), after the rest of ``carry``
    (the document being cut: in the block, ending where example ``i`` starts, or another block's last
    when ``i`` is 0); ``None`` where the block ends first, the carry fills the batch, or a row would
    hold over ``max_docs`` pieces."""
    s0 = int(blk.starts[0])
    at = int(ends[i - 1]) if i else 0  # example i's first token, from s0
    p0 = at
    n = rows * width
    head: list[tuple[dict[str, np.ndarray], int, int]] = []
    if carry is not None:
        c, rest = carry
        c0, cn = int(c.starts[0]), int(c.lengths[0])
        if c.fields is blk.fields and c0 - s0 + cn == at:
            p0 = c0 - s0 + rest
        elif i == 0 and cn - rest < n:  # the last document of the block before: its rest comes first
            head = [(c.fields, c0 + rest, c0 + cn)]
            p0 = at - (cn - rest)
        else:
            return None
    p1 = p0 + n
    if p1 <= at or p1 > int(ends[-1]):  # the carry fills the batch, or the block ends before it
        return None
    last = int(np.searchsorted(ends, p1, side="left"))  # the example holding the batch's last token
    e = ends[i:last + 1]
    b = np.empty(len(e), dtype=np.int64)
    b[0] = at
    b[1:] = e[:-1]
    b -= p0  # the new documents' starts in the batch (0 for the first when nothing is carried)
    bounds = _grid(rows, width, max_docs)[2]  # each row's first token, and the batch's end
    firsts = np.concatenate([b, bounds[:-1]])  # pieces start at documents' and rows' starts
    firsts.sort()
    keep = np.empty(len(firsts), dtype=bool)
    keep[0] = True
    np.not_equal(firsts[1:], firsts[:-1], out=keep[1:])
    firsts = firsts[keep]  # (np.union1d: the same, ~6 times slower on ~250 values)
    lengths = np.empty(len(firsts), dtype=np.int64)
    np.subtract(firsts[1:], firsts[:-1], out=lengths[:-1])
    lengths[-1] = n - firsts[-1]
    row_first = np.searchsorted(firsts, bounds)  # each row's first piece (and the end)
    docs = row_first[1:] - row_first[:-1]
    if int(docs.max()) > max_docs:
        return None
    split = int(np.count_nonzero(e - p0 > (b // width + 1) * width))
    end = int(e[-1])
    src = [*head, (blk.fields, s0 + max(p0, at), s0 + p1)] if head else [(blk.fields, s0 + p0, s0 + p1)]
    return RunCut(docs, row_first[:-1], lengths, firsts, src, len(e), split, p1 - int(b[-1] + p0) if end > p1 else None)


def lay_rows(cut: RunCut, values: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray], width: int, max_docs: int,
             *, reset_positions: bool, mask_first: bool) -> Batch:
    """:func:`~feedline._batching.rows.collate_flat` of a cut's full rows (``attention: padding``): each
    field's slice reshaped, positions, ``seq_lens`` and ``cu_seqlens`` from the pieces' starts."""
    rows = len(cut.docs)
    n = rows * width
    count, slot0, _ = _grid(rows, width, max_docs)
    batch: Batch = {}
    for name, arr in like.items():
        v = values[name]
        batch[name] = v.reshape(rows, width, *v.shape[1:]).astype(int_dtype(name, arr), copy=True)
    positions: np.ndarray
    if reset_positions:  # each token's index in the batch less its piece's first (computed in place)
        positions = np.repeat(cut.starts.astype(np.int32), cut.lengths)
        np.subtract(count, positions, out=positions)
        positions = positions.reshape(rows, width)
    else:
        positions = np.broadcast_to(count[:width], (rows, width)).copy()
    if "labels" in batch and mask_first:
        labels = batch["labels"]
        labels.reshape(n, *labels.shape[2:])[cut.starts] = -100
    batch["position_ids"] = positions
    slot = np.repeat(slot0 - cut.row_first, cut.docs)  # each piece's place in seq_lens: its row's, plus
    slot += count[:len(cut.lengths)]                     # its index among the row's pieces
    seq_lens = np.zeros((rows, max_docs), dtype=np.int32)
    seq_lens.reshape(-1)[slot] = cut.lengths
    cu = np.zeros((rows, max_docs + 1), dtype=np.int32)
    np.cumsum(seq_lens, axis=1, out=cu[:, 1:])
    batch["seq_lens"] = seq_lens
    batch["cu_seqlens"] = cu
    batch["attention_mask"] = np.ones((rows, width), dtype=np.int32)
    return batch


@functools.lru_cache(maxsize=8)
def _grid(rows: int, width: int, max_docs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's ``0, 1, ..., rows * width - 1`` (int32), each row's first place in ``seq_lens`` and
    each row's first token and the batch's end (read-only; made once per shape, not per batch)."""
    count = np.arange(rows * width, dtype=np.int32)
    slot0 = np.arange(rows, dtype=np.int64) * max_docs
    bounds = np.arange(0, rows * width + 1, width, dtype=np.int64)
    count.flags.writeable = slot0.flags.writeable = bounds.flags.writeable = False
    return count, slot0, bounds


def cut_values(cut: RunCut) -> dict[str, np.ndarray]:
    """Each field's tokens of the cut, end to end: views of one block, or one copy across two."""
    if len(cut.src) == 1:
        fields, lo, hi = cut.src[0]
        return {name: arr[lo:hi] for name, arr in fields.items()}
    return {name: np.concatenate([f[name][lo:hi] for f, lo, hi in cut.src]) for name in cut.src[0][0]}


def rows_fit_before(head: int, lengths: np.ndarray, width: int, max_docs: int) -> bool:
    """Whether rows of ``width`` laid over a carried rest of ``head`` tokens and then documents of
    ``lengths`` hold fewer than ``max_docs`` pieces each, up to those documents' end: no row closes
    early there, so a batch that needs more tokens takes every one of them."""
    starts = np.empty(len(lengths), dtype=np.int64)
    starts[0] = head
    np.cumsum(lengths[:-1], out=starts[1:])
    starts[1:] += head
    inside = starts[starts % width != 0]   # a piece starting a row is that row's first, counted below
    per_row = np.bincount(inside // width) if len(inside) else np.zeros(1, np.int64)
    return int(per_row.max()) + 1 < max_docs


def join_blocks(a: ExampleBlock, i: int, b: ExampleBlock, k: int) -> ExampleBlock:
    """Examples ``i:`` of ``a`` and the first ``k`` of ``b`` (each block's lying back to back) as one
    block whose tokens are one copy, so a batch across the two is one slice of them (fields that
    share an array in both blocks still share one)."""
    lengths = np.concatenate([a.lengths[i:], b.lengths[:k]])
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    a0, a1 = int(a.starts[i]), int(a.starts[-1] + a.lengths[-1])
    b0 = int(b.starts[0])
    b1 = b0 + int(b.lengths[:k].sum())
    made: dict[tuple[int, int], np.ndarray] = {}
    fields = {}
    for name, arr in a.fields.items():
        other = b.fields[name]
        key = (id(arr), id(other))
        if key not in made:
            made[key] = np.concatenate([arr[a0:a1], other[b0:b1]])
        fields[name] = made[key]
    return ExampleBlock(np.concatenate([a.refs[i:], b.refs[:k]]), np.arange(len(lengths), dtype=np.int64), starts,
                        lengths, fields)
