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

from feedline._batching.base import Batch, Batcher, FillStats
from feedline._batching.pack import row_length
from feedline._batching.rows import Attention, Piece, collate_rows, piece_of
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


class ConcatIterator(DatasetIterator[Batch]):
    """Cursor over a :class:`ConcatBatcher`; :attr:`stats` counts rows and tokens."""

    NAME = "concat"
    STATE_KEYS = ("carry", "stats")

    def __init__(self, ds: ConcatBatcher) -> None:
        self.ds = ds
        self.opts: ConcatOptions = ds.options
        self.parent = iter(ds.parent)
        self.max_length = row_length(self.opts, ds.ctx.task.max_length, "concat")
        self.carry: tuple[Example, int] | None = None  # the document being cut, and where its rest starts
        self.stats = FillStats()

    def _next_row(self) -> list[Piece] | None:
        row: list[Piece] = []
        room = self.max_length
        while room and len(row) < self.opts.max_docs_per_row:
            if self.carry is None:
                ex = next(self.parent, None)
                if ex is None:
                    break
                self.stats.documents += 1
                if ex.length == 0:
                    continue
                self.carry = (ex, 0)
            ex, start = self.carry
            stop = min(ex.length, start + room)
            row.append(piece_of(ex, start, stop, "concat"))
            room -= stop - start
            if stop == ex.length:
                self.carry = None
            else:
                self.carry = (ex, stop)
                if start == 0:
                    self.stats.split_documents += 1
        return row or None

    def __next__(self) -> Batch:
        rows: list[list[Piece]] = []
        while len(rows) < self.ds.ctx.batch_size:
            row = self._next_row()
            if row is None:
                break
            rows.append(row)
        if not rows:
            raise StopIteration
        self.stats.rows += len(rows)
        self.stats.tokens += sum(p.length for row in rows for p in row)
        self.stats.slots += len(rows) * self.max_length
        o = self.opts
        return collate_rows(rows, self.max_length, o.max_docs_per_row, self.ds.ctx.task.pad_values,
                            reset_positions=o.reset_positions, mask_first=o.mask_first_token, attention=o.attention)

    def own_state(self) -> State:
        carry = None if self.carry is None else [*self.carry[0].ref, self.carry[1]]
        return {"carry": carry, "stats": self.stats.get_state()}

    def restore(self, own: Mapping[str, Any]) -> None:
        carry, stats = own["carry"], own["stats"]
        self.carry = None
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
            self.carry = (ex, start)
        self.stats = FillStats.from_state(stats)
