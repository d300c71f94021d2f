"""Packing batcher: several documents per fixed-length row, never attending or predicting across them.

    batching: {strategy: pack, batch_size: 64, max_length: 2048, window: 1000, open_bins: 64,
               max_docs_per_row: 64, overflow: split, attention: padding}

Examples are cut into pieces of at most ``max_length`` tokens (``overflow: split``: every piece is
kept, each packed as its own document; ``truncate``: only the first is kept and the rest
counted), then packed online by :class:`~feedline._batching.bestfit.BestFitPacker`: best fit
decreasing over windows of ``window`` pieces, carrying up to ``open_bins`` partly filled rows to
the next window. Rows carry ``position_ids`` restarting per document, ``seq_lens``,
``cu_seqlens``, ``labels`` -100 on each document's first token, and an ``attention_mask`` that is
either 1/0 per token or an explicit ``[max_length, max_length]`` block-diagonal (or block-causal)
mask; :mod:`feedline._batching.rows` describes the layout.

State: ``{"parent", "ready": rows not yet delivered, "open": open rows, "stats"}``, each row a list
of piece refs ``[source, file, position, epoch, sub, start]``, packed (:func:`feedline._core.packed.pack_ragged`;
``[]`` when there is no row; older states' nested lists still load). The refs of the ready and
open rows are collected once per window, not per batch: a batch only moves the ready rows' start. Buffered examples are rebuilt from
their records on resume; the window itself is always empty at a batch boundary (windows are read
whole, between batches). The iterator's :attr:`stats` reports the packing efficiency.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from feedline._batching.base import Batch, Batcher, FillStats
from feedline._batching.bestfit import BestFitPacker
from feedline._batching.rows import Attention, Piece, collate_rows, piece_of, token_fields
from feedline._core.dataset import DatasetIterator, State
from feedline._core.packed import pack_ragged_array, unpack_ragged
from feedline._core.record import Example
from feedline.errors import SpecError, StateError

__all__ = ["PackBatcher", "PackOptions", "restore_pieces", "row_length"]


@dataclass(frozen=True, kw_only=True)
class PackOptions:
    """Options of the ``pack`` strategy.

    Attributes:
        max_length: tokens per row (default: the task's ``max_length``).
        window: pieces sorted and placed together; larger packs tighter and buffers more
            (1000 reaches 99.88 % on the Wikipedia-512 histogram; see ``docs/benchmarks.md``).
        first_window: the first window's size; each next window holds as many pieces as were
            read so far, up to ``window`` (a geometric ramp, so the first batch comes after
            ``first_window`` documents are tokenized, not ``window``). ``null`` starts at ``window``.
        open_bins: partly filled rows carried across windows (a bound on buffered rows).
        max_docs_per_row: at most this many documents per row (the width of ``seq_lens``).
        overflow: documents longer than a row are ``split`` into several pieces or ``truncate``d.
        attention: ``padding`` (``attention_mask`` [B, T] of 1/0), ``block_diagonal`` or
            ``block_causal`` (``attention_mask`` [B, T, T] bool, True where attention is allowed).
        mask_first_token: ``labels`` -100 on each document's first token (no loss across a boundary).
    """

    max_length: int | None = None
    window: int = 1000
    first_window: int | None = 128
    open_bins: int = 64
    max_docs_per_row: int = 64
    overflow: Literal["split", "truncate"] = "split"
    attention: Attention = "padding"
    mask_first_token: bool = True

    def __post_init__(self) -> None:
        for name in ("window", "max_docs_per_row", "first_window"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise SpecError(f"batching.{name}: {getattr(self, name)} must be >= 1")
        if self.open_bins < 0:
            raise SpecError(f"batching.open_bins: {self.open_bins} must be >= 0")
        if self.max_length is not None and self.max_length < 1:
            raise SpecError(f"batching.max_length: {self.max_length} must be >= 1")


def row_length(options: Any, task_max_length: int | None, strategy: str) -> int:
    """The row length: the batcher's ``max_length``, else the task's."""
    n = options.max_length or task_max_length
    if not n:
        raise SpecError(f"batching.strategy {strategy!r} needs a row length: set batching.max_length or task.max_length")
    return int(n)


def restore_pieces(rows: Sequence[Sequence[Sequence[int]]], materialize: Any, stop: Any, strategy: str) -> list[list[Piece]]:
    """Rebuild rows of pieces from their state refs; ``stop(example, start)`` gives each piece's end.

    Raises:
        StateError: when a ref is malformed.
    """
    try:
        refs = {tuple(int(x) for x in r[:5]) for row in rows for r in row}
    except (TypeError, ValueError) as e:
        raise StateError(f"{strategy}: malformed piece ref in state ({e})") from e
    order = sorted(refs)
    found: dict[tuple[int, ...], Example] = dict(zip(order, materialize(order)))
    out = []
    for row in rows:
        pieces = []
        for r in row:
            ex = found[tuple(int(x) for x in r[:5])]
            start = int(r[5])
            pieces.append(piece_of(ex, start, stop(ex, start), strategy))
        out.append(pieces)
    return out


class PackBatcher(Batcher):
    """The ``pack`` strategy."""

    strategy = "pack"
    Options = PackOptions
    joins_examples = True

    def __iter__(self) -> PackIterator:
        return PackIterator(self)


class PackIterator(DatasetIterator[Batch]):
    """Cursor over a :class:`PackBatcher`; :attr:`stats` reports rows, tokens and efficiency."""

    NAME = "pack"
    STATE_KEYS = ("ready", "open", "stats")

    def __init__(self, ds: PackBatcher) -> None:
        self.ds = ds
        self.opts: PackOptions = ds.options
        self.parent = iter(ds.parent)
        self.max_length = row_length(self.opts, ds.ctx.task.max_length, "pack")
        self.packer: BestFitPacker[Piece] = self._new_packer()
        self.exhausted = False
        self.stats = FillStats()
        self._refs: tuple[np.ndarray, np.ndarray, np.ndarray, Any] | None = None  # see _row_refs
        self._taken = 0  # ready rows delivered since _refs was built
        self._ref_tables = _RefTables()

    def _new_packer(self) -> BestFitPacker[Piece]:
        o = self.opts
        return BestFitPacker(self.max_length, window=o.window, open_bins=o.open_bins, max_items=o.max_docs_per_row)

    def _stop(self, ex: Example, start: int) -> int:
        return min(start + self.max_length, ex.length)

    def _window_size(self) -> int:
        """This window's size: a ramp from ``first_window`` to ``window`` (a function of the state)."""
        o = self.opts
        if o.first_window is None:
            return o.window
        return min(o.window, max(o.first_window, self.stats.documents))

    def _read_window(self) -> None:
        size = self._window_size()
        while self.packer.pending < size:
            ex = next(self.parent, None)
            if ex is None:
                self.exhausted = True
                self.packer.flush()
                self._refs = None
                return
            self._add(ex)
        self.packer.pack()
        self._refs = None

    def _add(self, ex: Example) -> None:
        n = ex.length
        self.stats.documents += 1
        if n == 0:
            return
        if n <= self.max_length:  # the common case: the whole example is one piece (no slicing)
            self.packer.add(n, Piece(ex.ref, 0, token_fields(ex, "pack")))
            return
        starts = range(0, n, self.max_length)
        if len(starts) > 1:
            if self.opts.overflow == "truncate":
                self.stats.truncated_tokens += n - self.max_length
                starts = range(0, 1)
            else:
                self.stats.split_documents += 1
        for s in starts:
            piece = piece_of(ex, s, self._stop(ex, s), "pack")
            self.packer.add(piece.length, piece)

    def __next__(self) -> Batch:
        want = self.ds.ctx.batch_size
        while len(self.packer.ready) < want and not self.exhausted:
            self._read_window()
        if not self.packer.ready:
            raise StopIteration
        rows = [self.packer.ready.popleft() for _ in range(min(want, len(self.packer.ready)))]
        self._taken += len(rows)
        self.stats.rows += len(rows)
        self.stats.tokens += sum(p.length for row in rows for p in row)
        self.stats.slots += len(rows) * self.max_length
        o = self.opts
        return collate_rows(rows, self.max_length, o.max_docs_per_row, self.ds.ctx.task.pad_values,
                            mask_first=o.mask_first_token, attention=o.attention)

    def _row_refs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        """Lengths, row starts and refs of the ready rows, and the packed open rows, as of the last window."""
        if self._refs is None:
            ready, open_rows = list(self.packer.ready), self.packer.open_contents()
            lengths = np.fromiter((len(row) for row in ready), dtype=np.int64, count=len(ready))
            starts = np.zeros(len(ready) + 1, dtype=np.int64)
            np.cumsum(lengths, out=starts[1:])
            open_lengths = np.fromiter((len(r) for r in open_rows), dtype=np.int64, count=len(open_rows))
            tables = self._ref_tables.tables([*ready, *open_rows])
            open_state = pack_ragged_array(open_lengths, _stack(tables[len(ready):]))
            self._refs, self._taken = (lengths, starts, _stack(tables[:len(ready)]), open_state), 0
        return self._refs

    def own_state(self) -> State:
        lengths, starts, refs, open_state = self._row_refs()
        t = self._taken
        return {
            "ready": pack_ragged_array(lengths[t:], refs[starts[t]:]),
            "open": open_state,
            "stats": self.stats.get_state(),
        }

    def restore(self, own: Mapping[str, Any]) -> None:
        stats = own["stats"]
        ready, open_rows = unpack_ragged(own["ready"], 6, "pack: ready rows"), unpack_ragged(own["open"], 6, "pack: open rows")
        self._refs = None
        rows = restore_pieces([*ready, *open_rows], self.ds.parent.rebuild, self._stop, "pack")
        self.packer = self._new_packer()
        self.packer.restore(rows[:len(ready)], [[(p.length, p) for p in row] for row in rows[len(ready):]])
        self.exhausted = False
        self.stats = FillStats.from_state(stats)

class _RefTables:
    """The ``[pieces, 6]`` state refs of each row, kept between windows.

    Rows only grow (a window adds pieces to open rows; closed rows move to ``ready`` unchanged), so
    a row's table is extended by its new pieces instead of rebuilt: a window costs its new pieces.
    Each entry holds its row, so a row's ``id`` is not reused while it is cached.
    """

    def __init__(self) -> None:
        self.cache: dict[int, tuple[list[Piece], int, np.ndarray]] = {}

    def tables(self, rows: Sequence[list[Piece]]) -> list[np.ndarray]:
        out, fresh = [], {}
        for row in rows:
            hit = self.cache.get(id(row))
            if hit is not None and hit[0] is row and hit[1] == len(row):
                table = hit[2]
            else:
                done = hit[1] if hit is not None and hit[0] is row and hit[1] < len(row) else 0
                new = np.fromiter(itertools.chain.from_iterable((*p.ref, p.start) for p in row[done:]), dtype=np.int64)
                table = np.concatenate([hit[2], new.reshape(-1, 6)]) if done and hit is not None else new.reshape(-1, 6)
            fresh[id(row)] = (row, len(row), table)
            out.append(table)
        self.cache = fresh
        return out


def _stack(tables: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(tables) if tables else np.zeros((0, 6), dtype=np.int64)
