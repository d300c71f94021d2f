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
where it does not apply (:class:`~feedline._batching.concat.ConcatIterator` then cuts as before).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from feedline._core.block import ExampleBlock

__all__ = ["RunCut", "run_rows"]


@dataclass(frozen=True, slots=True)
class RunCut:
    """A batch of ``len(docs)`` full rows: ``docs`` pieces per row, their ``lengths``, tokens
    ``[first, first + sum(lengths))`` of the block's fields; ``taken`` examples taken from the
    block's ``i``-th on, ``split`` of them cut by a row's end, and the last one's ``rest`` (where
    the next batch continues it; ``None``: it ended with the batch)."""

    docs: np.ndarray
    lengths: np.ndarray
    first: int
    taken: int
    split: int
    rest: int | None


def run_rows(blk: ExampleBlock, ends: np.ndarray, i: int, carry: tuple[ExampleBlock, int] | None, rows: int,
             width: int, max_docs: int) -> RunCut | None:
    """The next ``rows`` rows of ``width`` tokens from example ``i`` of ``blk`` (``ends``: its examples'
    cumulative lengths; its examples lie back to back in its fields), after the rest of ``carry``
    (the document being cut, ending where example ``i`` starts); ``None`` where the block ends
    first, the carry lies elsewhere or fills the batch, or a row would hold over ``max_docs`` pieces."""
    s0 = int(blk.starts[0])
    at = int(ends[i - 1]) if i else 0  # example i's first token, from s0
    p0 = at
    if carry is not None:
        c, rest = carry
        cs = int(c.starts[0]) - s0
        if c.fields is not blk.fields or cs + int(c.lengths[0]) != at:
            return None
        p0 = cs + rest
    n = rows * width
    p1 = p0 + n
    if p1 <= at or p1 > int(ends[-1]):  # the carry fills the batch, or the block ends before it
        return None
    last = int(np.searchsorted(ends, p1, side="left"))  # the example holding the batch's last token
    e = ends[i:last + 1]
    b = np.empty(len(e), dtype=np.int64)
    b[0] = at
    b[1:] = e[:-1]
    b -= p0  # the new documents' starts in the batch (0 for the first when nothing is carried)
    firsts = np.concatenate([b, np.arange(0, n, width)])  # pieces start at documents' and rows' starts
    firsts.sort()
    keep = np.empty(len(firsts), dtype=bool)
    keep[0] = True
    np.not_equal(firsts[1:], firsts[:-1], out=keep[1:])
    firsts = firsts[keep]  # (np.union1d: the same, ~6 times slower on ~250 values)
    lengths = np.diff(firsts, append=n)
    docs = np.diff(np.searchsorted(firsts, np.arange(0, n + 1, width)))
    if int(docs.max()) > max_docs:
        return None
    split = int(np.count_nonzero(e - p0 > (b // width + 1) * width))
    end = int(e[-1])
    return RunCut(docs, lengths, s0 + p0, len(e), split, p1 - int(b[-1] + p0) if end > p1 else None)
