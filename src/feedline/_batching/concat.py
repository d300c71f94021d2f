"""Concatenate-and-chunk batcher: documents laid end to end and cut every ``max_length`` tokens.

    batching: {strategy: concat, batch_size: 64, max_length: 2048, reset_positions: true}

Every row is full (no padding) except the last row of the stream, and except a row closed early
because it reached ``max_docs_per_row`` documents (the width of ``seq_lens``). A document that
does not fit the rest of a row continues at the start of the next one. The clm task already ends
each document with EOS, which separates documents. The boundary options are those of ``pack``:
``reset_positions`` restarts ``position_ids`` at each document (off: 0..max_length-1 per row, the
Megatron/``run_clm`` layout), ``mask_first_token`` puts -100 on the label of each piece's first
token, ``attention`` picks a 1/0 or a block mask; ``seq_lens``/``cu_seqlens`` always describe the
pieces (see :mod:`feedline._batching.rows`).

State: ``{"parent", "carry": null or [source, file, position, epoch, sub, start], "stats"}``: at a
batch boundary the only buffered tokens are the rest of the document being cut.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline._batching.base import Batch, Batcher, FillStats
from feedline._batching.concatrun import cut_values, join_blocks, lay_rows, rows_fit_before, run_rows
from feedline._batching.cuts import Pieces, cut_rows
from feedline._batching.pack import _block_of, row_length
from feedline._batching.rows import Attention, collate_flat
from feedline._core.block import ExampleBlock
from feedline._core.dataset import DatasetIterator, State
from feedline._core.record import Example
from feedline.errors import SpecError, StateError

__all__ = ["ConcatBatcher", "ConcatOptions"]


@dataclass(frozen=True, kw_only=True)
class ConcatOptions:
    """Options of the ``concat`` strategy.

    Attributes:
        max_length: tokens per row (default: the task's ``max_length``).
        max_docs_per_row: at most this many document pieces per row (the width of ``seq_lens``).
        reset_positions: ``position_ids`` restart at each document.
        mask_first_token: ``labels`` -100 on each piece's first token.
        attention: ``padding``, ``block_diagonal`` or ``block_causal`` (as for ``pack``).
    """

    max_length: int | None = None
    max_docs_per_row: int = 64
    reset_positions: bool = True
    mask_first_token: bool = True
    attention: Attention = "padding"

    def __post_init__(self) -> None:
        if self.max_docs_per_row < 1:
            raise SpecError(f"batching.max_docs_per_row: {self.max_docs_per_row} must be >= 1")
        if self.max_length is not None and self.max_length < 1:
            raise SpecError(f"batching.max_length: {self.max_length} must be >= 1")


class ConcatBatcher(Batcher):
    """The ``concat`` strategy."""

    strategy = "concat"
    Options = ConcatOptions
    joins_examples = True

    def __iter__(self) -> ConcatIterator:
        return ConcatIterator(self)


def _back_to_back(blk: ExampleBlock) -> bool:
    """Whether ``blk``'s examples lie back to back in their fields (a run can then be sliced)."""
    return len(blk) < 2 or bool(np.array_equal(blk.starts[1:], blk.starts[:-1] + blk.lengths[:-1]))


class ConcatIterator(DatasetIterator[Batch]):
    """Cursor over a :class:`ConcatBatcher`; :attr:`stats` counts rows and tokens.

    Examples come a block at a time from a parent that offers them (the task map's ``peek_run`` or
    ``peek_block``, and ``consume``). Where the block's examples lie back to back and hold the whole
    batch, the batch is one slice of them (:func:`~.concatrun.run_rows`, a pre-tokenized run), or
    where it runs past the block's end, of the block's examples left and the next block's first
    joined into one (:meth:`_join_next`); otherwise whole rows are cut from a block at once
    (:func:`~.cuts.cut_rows`), and a row that crosses a block's end, reaches ``max_docs_per_row`` or
    meets an empty example is made one example at a time. Either way an example is taken when a row first needs it, so the states are
    those of taking them one by one.
    """

    NAME = "concat"
    STATE_KEYS = ("carry", "stats")

    def __init__(self, ds: ConcatBatcher) -> None:
        self.ds = ds
        self.opts: ConcatOptions = ds.options
        self.parent = iter(ds.parent)
        self.max_length = row_length(self.opts, ds.ctx.task.max_length, "concat")
        self.carry: tuple[ExampleBlock, int] | None = None  # the document being cut (one example), where its rest starts
        self.stats = FillStats()
        self._peek = getattr(self.parent, "peek_run", None) or getattr(self.parent, "peek_block", None)
        self._blk: ExampleBlock | None = None  # the parent's examples as last peeked
        self._ends = np.zeros(0, np.int64)  # their cumulative lengths
        self._empty = False  # whether one of them is empty
        self._contig = False  # whether they lie back to back in their fields
        self._used = 0  # how many of them rows took (consumed from the parent when the batch is made)
        self._taken = 0  # how many of them were consumed from the parent

    def _block(self) -> ExampleBlock | None:
        """The block the next example comes from; ``None`` at the end of the stream."""
        if self._blk is not None and self._used < len(self._blk):
            return self._blk
        self._settle()
        if self._peek is None:  # a parent without blocks: one example at a time, taken now
            ex = next(self.parent, None)
            got: ExampleBlock | list[Example] | None = None if ex is None else [ex]
        else:
            got = self._peek()
        if got is None:
            return None
        blk = got if isinstance(got, ExampleBlock) else _block_of(got[:_LISTED])
        self._blk, self._ends, self._used, self._taken = blk, np.cumsum(blk.lengths), 0, 0
        self._empty = not blk.lengths.all()
        self._contig = _back_to_back(blk)
        return blk

    def _settle(self, keep: bool = False) -> None:
        """Take the examples rows used from the parent; ``keep``: the rest of the block stays peeked
        (the parent's chunk is the same until the next peek)."""
        blk, used = self._blk, self._used
        if blk is not None and self._peek is not None and used > self._taken:
            self.parent.consume(used - self._taken)  # type: ignore[attr-defined]
        if keep and blk is not None and self._peek is not None and used < len(blk):
            self._taken = used
        else:
            self._blk, self._used, self._taken = None, 0, 0

    def _row(self, pieces: Pieces) -> int:
        """One row across blocks: the whole examples that fit taken at once, the others one at a
        time; its number of pieces (0: the stream has ended)."""
        room, count, cap = self.max_length, 0, self.opts.max_docs_per_row
        while room and count < cap:
            if self.carry is not None:
                blk, start = self.carry
                n = int(blk.lengths[0])
                stop = min(n, start + room)
                pieces.add(blk, 0, start, stop)
                room, count = room - (stop - start), count + 1
                self.carry = None if stop == n else (blk, stop)
                continue
            blk = self._block()  # type: ignore[assignment]
            if blk is None:
                break
            i = self._used
            if not self._empty:  # the examples that fit whole, at once
                base = int(self._ends[i - 1]) if i else 0
                k = min(int(np.searchsorted(self._ends, base + room, side="right")) - i, cap - count)
                if k > 0:
                    pieces.add_many(blk, np.arange(i, i + k), np.zeros(k, np.int64), blk.lengths[i:i + k])
                    self._used += k
                    self.stats.documents += k
                    room, count = room - (int(self._ends[i + k - 1]) - base), count + k
                    continue
            self._used += 1
            self.stats.documents += 1
            n = int(blk.lengths[i])
            if n == 0:
                continue
            stop = min(n, room)
            pieces.add(blk, i, 0, stop)
            room, count = room - stop, count + 1
            if stop < n:
                self.carry = (blk.slice(i, i + 1), stop)
                self.stats.split_documents += 1
        return count

    def _rows(self, pieces: Pieces, docs: list[np.ndarray], want: int) -> int:
        """Whole rows cut from the carry and the current block at once; how many (0: none can be)."""
        if self._peek is None:
            return 0
        blk = self._blk
        if blk is None or self._used >= len(blk):  # peek a new block only where a row needs an example now
            blk = self._block() if self.carry is None else None
        if blk is None or self._empty:
            return 0
        i = self._used
        base = int(self._ends[i - 1]) if i else 0
        c = self.carry
        head = 0 if c is None else int(c[0].lengths[0]) - c[1]
        # the examples up to the one holding the ``want`` rows' last token (a run's block may hold ~60 K more)
        stop = int(np.searchsorted(self._ends, base + want * self.max_length - head, side="left")) + 1
        ends = self._ends[i:stop] - base
        if c is not None:
            ends = np.concatenate([[head], ends + head])
        cut = cut_rows(ends, want, self.max_length, self.opts.max_docs_per_row)
        if cut is None:
            return 0
        k = 0 if c is None else 1  # stream document d is the block's example i + d - k
        if c is not None:
            own = cut.doc == 0
            pieces.add_many(c[0], np.zeros(int(own.sum()), np.int64), cut.start[own] + c[1], cut.stop[own] + c[1])
            self.carry = None
        mine = cut.doc >= k
        pieces.add_many(blk, cut.doc[mine] + (i - k), cut.start[mine], cut.stop[mine])
        taken = cut.used - k
        self._used += taken
        self.stats.documents += taken
        self.stats.split_documents += int(cut.split[k:].sum())
        if cut.rest is not None:
            last = cut.used - 1
            self.carry = (c[0], c[1] + cut.rest) if last < k else (blk.slice(i + last - k, i + last - k + 1), cut.rest)  # type: ignore[index]
        docs.append(cut.docs)
        return cut.rows

    def _run_batch(self) -> Batch | None:
        """The whole batch as a slice of the current block where it holds it (:func:`~.concatrun.run_rows`):
        the batch, stats, carry and examples taken of the per-row path; ``None`` where that path must cut it."""
        if self._peek is None:
            return None
        rows, width, o = self.ds.ctx.batch_size, self.max_length, self.opts
        blk, c = self._blk, self.carry
        if blk is None or self._used >= len(blk):
            # peek where the rows need an example now (the carried document's rest does not fill them)
            if c is not None and int(c[0].lengths[0]) - c[1] >= rows * width:
                return None
            blk = self._block()
        if blk is None or self._empty or not self._contig:
            return None
        cut = run_rows(blk, self._ends, self._used, self.carry, rows, width, o.max_docs_per_row)
        if cut is None:
            blk = self._join_next(rows * width)  # type: ignore[assignment]
            if blk is None:
                return None
            cut = run_rows(blk, self._ends, self._used, self.carry, rows, width, o.max_docs_per_row)
            if cut is None:
                return None
        last = self._used + cut.taken - 1
        self.carry = None if cut.rest is None else (blk.slice(last, last + 1), cut.rest)
        self._used += cut.taken
        n = rows * width
        st = self.stats
        st.documents, st.split_documents = st.documents + cut.taken, st.split_documents + cut.split
        st.rows, st.tokens, st.slots = st.rows + rows, st.tokens + n, st.slots + n
        values, like = cut_values(cut), cut.src[0][0]
        self._settle(keep=True)
        if o.attention == "padding":
            return lay_rows(cut, values, like, width, o.max_docs_per_row, reset_positions=o.reset_positions,
                            mask_first=o.mask_first_token)
        return collate_flat(cut.docs, cut.lengths, values, width, o.max_docs_per_row, self.ds.ctx.task.pad_values,
                            like=like, reset_positions=o.reset_positions, mask_first=o.mask_first_token,
                            attention=o.attention)

    def _join_next(self, n: int) -> ExampleBlock | None:
        """Where the batch's ``n`` tokens run past the current block's end (a run's or a Parquet row
        group's), the block's examples left and the next block's first that the batch needs, joined
        into one block (:func:`~.concatrun.join_blocks`: a copy of ~a batch of tokens) that becomes
        the current block; ``None`` where not (the per-row path then cuts the batch, as before).
        Taking the next block takes every example left in this one from the parent first: only where
        the batch takes each of them whatever path cuts it (it needs more tokens, and no row over
        them reaches ``max_docs_per_row``)."""
        blk, i, c = self._blk, self._used, self.carry
        if blk is None or i >= len(blk) or self._peek is None:
            return None
        head = 0 if c is None else int(c[0].lengths[0]) - c[1]
        lengths = blk.lengths[i:]
        if head + int(self._ends[-1]) - (int(self._ends[i - 1]) if i else 0) >= n or \
                not rows_fit_before(head, lengths, self.max_length, self.opts.max_docs_per_row):
            return None
        self.parent.consume(len(blk) - self._taken)  # type: ignore[attr-defined]
        self._taken = len(blk)
        got = self._peek()
        if not isinstance(got, ExampleBlock) or not len(got) or not got.lengths.all() or not _back_to_back(got):
            return None  # (this block stays the current one, every example of it taken from the parent)
        need = n - head - int(lengths.sum())
        k = min(len(got), int(np.searchsorted(np.cumsum(got.lengths), need, side="left")) + 1)
        joined = join_blocks(blk, i, got, k)
        self._blk, self._ends, self._used, self._taken = joined, np.cumsum(joined.lengths), 0, len(lengths)
        self._empty, self._contig = False, True
        return joined

    def __next__(self) -> Batch:
        whole = self._run_batch()
        if whole is not None:
            return whole
        pieces, docs, rows = Pieces(), list[np.ndarray](), 0
        while rows < self.ds.ctx.batch_size:
            made = self._rows(pieces, docs, self.ds.ctx.batch_size - rows)
            if not made:
                made = self._row(pieces)
                if not made:
                    break
                docs.append(np.array([made], np.int64))
                made = 1
            rows += made
        self._settle(keep=True)
        if not rows:
            raise StopIteration
        lengths, values, like = pieces.layout()
        self.stats.rows += rows
        self.stats.tokens += int(lengths.sum())
        self.stats.slots += rows * self.max_length
        o = self.opts
        return collate_flat(np.concatenate(docs), lengths, values, self.max_length, o.max_docs_per_row,
                            self.ds.ctx.task.pad_values, like=like, reset_positions=o.reset_positions,
                            mask_first=o.mask_first_token, attention=o.attention)

    def own_state(self) -> State:
        carry = None if self.carry is None else [*self.carry[0].refs[0].tolist(), self.carry[1]]
        return {"carry": carry, "stats": self.stats.get_state()}

    def restore(self, own: Mapping[str, Any]) -> None:
        carry, stats = own["carry"], own["stats"]
        self.carry, self._blk, self._used, self._taken = None, None, 0, 0
        if carry is not None:
            try:
                src, fi, pos, ep, sub, start = (int(x) for x in carry[:6])
                ref = (src, fi, pos, ep, sub)
            except (TypeError, ValueError, IndexError) as e:
                raise StateError(f"concat: malformed carry {carry!r} in state ({e})") from e
            ex = self.ds.parent.rebuild([ref])[0]
            if not 0 < start < ex.length:
                raise StateError(f"concat: carry offset {start} is outside example {ref} of {ex.length} tokens; "
                                 "the data changed since the state was saved")
            self.carry = (_block_of([ex]), start)
        self.stats = FillStats.from_state(stats)


#: A parent that hands examples on as lists: at most this many of them are made one block at a time.
_LISTED = 64
