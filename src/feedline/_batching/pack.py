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

State: ``{"parent", "ready": {"rows": the last window's ready rows, "skip": how many of them were
delivered since}, "open": open rows, "stats"}``, each row a list of piece refs ``[source, file,
position, epoch, sub, start]``, packed (:func:`feedline._core.packed.pack_ragged`; older states'
ready rows as the undelivered rows only, packed or as nested lists, still load). The refs of the
ready and open rows are collected and packed once per window, not per batch (a batch only moves
``skip``: a state every batch, the service's batch header, costs no repacking), and the
prefetching loader's :meth:`PackIterator.snapshot` defers even that until a state is read.
Pieces are arrays in a :class:`~feedline._batching.pieces.PiecePool`; the packer places their ids.
Buffered examples are rebuilt from their records on resume; the window itself is always empty at a
batch boundary (windows are read whole, between batches). The iterator's :attr:`stats` reports the packing efficiency.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from feedline._batching.base import Batch, Batcher, FillStats
from feedline._batching.bestfit import BestFitPacker
from feedline._batching.compact import CompactBatch
from feedline._batching.packwindow import WindowRows
from feedline._batching.pieces import PiecePool
from feedline._batching.readyrows import ReadyRows, rows_to_gather
from feedline._batching.rows import Attention, Piece, piece_of, token_fields
from feedline._core.block import ExampleBlock, exclusive_cumsum
from feedline._core.dataset import DatasetIterator, State
from feedline._core.deferred import Deferred, materialize
from feedline._core.packed import unpack_ragged
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
    first_window: int | None = 32
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
    """Cursor over a :class:`PackBatcher`; :attr:`stats` reports rows, tokens and efficiency.

    Pieces live in a :class:`~feedline._batching.pieces.PiecePool` (arrays) and the packer places
    their integer ids; examples are read a chunk (or a pre-tokenized run of chunks) at a time from
    a parent that offers blocks (the task map's ``peek_run`` or ``peek_block``, and ``consume``),
    one at a time from any other.
    """

    NAME = "pack"
    STATE_KEYS = ("ready", "open", "stats")

    def __init__(self, ds: PackBatcher) -> None:
        self.ds = ds
        self.opts: PackOptions = ds.options
        self.parent = iter(ds.parent)
        self.max_length = row_length(self.opts, ds.ctx.task.max_length, "pack")
        self.packer: BestFitPacker[int] = self._new_packer()
        self.pool = PiecePool()
        self.exhausted = False
        self.stats = FillStats()
        self._window: WindowRows | None = None  # the rows as of the last window (see _window_rows)
        self._taken = 0  # ready rows delivered since _window was taken
        self._gathered: ReadyRows | None = None  # the next ready rows, gathered (dropped at each window)
        # the ready rows' pieces a row and ids, as the last _keep flattened them (None once a row is taken)
        self._ready_ids: tuple[np.ndarray, np.ndarray] | None = None

    def _new_packer(self) -> BestFitPacker[int]:
        o = self.opts
        return BestFitPacker(self.max_length, window=o.window, open_bins=o.open_bins, max_items=o.max_docs_per_row)

    def _window_size(self) -> int:
        """This window's size: a ramp from ``first_window`` to ``window`` (a function of the state)."""
        o = self.opts
        if o.first_window is None:
            return o.window
        return min(o.window, max(o.first_window, self.stats.documents))

    def _read_window(self) -> None:
        size = self._window_size()
        read = False
        while self.packer.pending < size:
            if not self._read(size - self.packer.pending):
                self.exhausted = True
                if not read and not self.packer.pending and not self.packer.open_contents():
                    return  # nothing added, nothing to flush: the rows and the state's window stay as they are
                self.packer.flush()   # (a batcher restored after its end finds the end again: same states)
                break
            read = True
        else:
            self.packer.pack()
        self._keep()

    def _keep(self) -> None:
        """Drop the tokens of delivered pieces: keep those of the ready and open rows. The ready rows'
        ids, flattened here, also locate the first rows gathered (:attr:`_ready_ids`)."""
        ready = self.packer.ready
        flat: list[int] = []
        for row in ready:   # (a list extended row by row, then one counted fromiter: ~3x faster than
            flat += row     # fromiter over a chain of the rows, which grows its array as it goes)
        n = len(flat)
        for row in self.packer.open_contents():
            flat += row
        ids = np.fromiter(flat, dtype=np.int64, count=len(flat))
        self.pool.keep(ids)
        self._ready_ids = (np.fromiter(map(len, ready), dtype=np.int64, count=len(ready)), ids[:n])
        self._window = None
        self._gathered = None

    def _counts(self, lengths: np.ndarray) -> np.ndarray:
        """Pieces per example: none for an empty one, one up to a row, a row's worth each beyond (``split``)."""
        if self.opts.overflow == "truncate":
            return (lengths > 0).astype(np.int64)
        return -(-lengths // self.max_length)

    def _read(self, room: int) -> bool:
        """Add examples until ``room`` more pieces are pending (or the chunk ends); False at the end."""
        peek = getattr(self.parent, "peek_run", None) or getattr(self.parent, "peek_block", None)
        if peek is None:  # a parent without blocks (a task's own stream stage): one example at a time
            ex = next(self.parent, None)
            if ex is None:
                return False
            self._add(_block_of([ex]))
            return True
        got = peek()
        if got is None:
            return False
        block = got if isinstance(got, ExampleBlock) else _block_of(got)
        cum = self._pieces_upto(block.lengths, room)
        # one example at a time while fewer than ``room`` pieces are added (count_nonzero, unlike
        # searchsorted, keeps the GIL: handing it to the task thread costs up to a switch interval)
        k = min(int(np.count_nonzero(cum < room)) + 1, len(block))
        self.parent.consume(k)  # type: ignore[attr-defined]
        self._add(block.slice(0, k))
        return True

    def _pieces_upto(self, lengths: np.ndarray, room: int) -> np.ndarray:
        """The cumulative pieces of the examples, as far as needed to tell which first reach ``room``
        (a run's block holds up to ~60 K short documents; a window needs ~1,000 of them)."""
        if len(lengths) > room:  # each example gives at least a piece, unless it is empty
            head = np.cumsum(self._counts(lengths[:room]))
            if head[-1] >= room:
                return head
        return np.cumsum(self._counts(lengths))

    def _add(self, block: ExampleBlock) -> None:
        """Cut the block's examples into pieces of at most a row and hand them to the packer."""
        n, cap = block.lengths, self.max_length
        counts = self._counts(n)
        self.stats.documents += len(block)
        long = n > cap
        if self.opts.overflow == "truncate":
            self.stats.truncated_tokens += int((n[long] - cap).sum())
        else:
            self.stats.split_documents += int(long.sum())
        if len(n) and int(n.min()) > 0 and not long.any():   # one piece an example (short documents)
            refs = np.zeros((len(n), 6), dtype=np.int64)
            refs[:, :5] = block.refs
            lengths, at = n.astype(np.int64), block.starts   # (a copy: the pool keeps it)
        else:
            ex = np.repeat(np.arange(len(block)), counts)
            start = (np.arange(len(ex)) - np.repeat(exclusive_cumsum(counts), counts)) * cap
            lengths = np.minimum(cap, n[ex] - start)
            refs = np.concatenate([block.refs[ex], start[:, None]], axis=1)
            at = block.starts[ex] + start
        ids = self.pool.add(refs, lengths, at, block.fields)
        self.packer.add_many(lengths, ids)

    def __next__(self) -> Batch:
        gathered, rows = self._next_rows()
        batch, tokens = gathered.next_batch(rows)
        self.stats.tokens += tokens
        return batch

    def next_compact(self) -> CompactBatch:
        """The next batch before layout (:meth:`__next__` lays it out; the service's clients do)."""
        gathered, rows = self._next_rows()
        batch = gathered.next_compact(rows)
        self.stats.tokens += batch.tokens()
        return batch

    def _next_rows(self) -> tuple[ReadyRows, int]:
        """Take the next batch's rows off the ready queue; returns the gathered rows that hold them
        next (:mod:`~feedline._batching.readyrows`) and how many."""
        want = self.ds.ctx.batch_size
        ready = self.packer.ready
        while len(ready) < want and not self.exhausted:
            self._read_window()
            ready = self.packer.ready
        if not ready:
            raise StopIteration
        rows = min(want, len(ready))
        if self._gathered is None or self._gathered.left() < rows:
            o = self.opts
            gather = rows_to_gather(len(ready), want, self.max_length)
            flat = self._ready_ids   # the ready rows' ids as _keep flattened them (none taken since)
            if flat is not None:
                docs = flat[0][:gather]
                flat = (docs, flat[1][:int(docs.sum())])
            self._gathered = ReadyRows(self.pool, list(itertools.islice(ready, gather)), self.max_length,
                                       o.max_docs_per_row, self.ds.ctx.task.pad_values, mask_first=o.mask_first_token,
                                       attention=o.attention, flat=flat)
        self._ready_ids = None
        for _ in range(rows):
            ready.popleft()
        self._taken += rows
        self.stats.rows += rows
        self.stats.slots += rows * self.max_length
        return self._gathered, rows

    def _window_rows(self) -> WindowRows:
        """The ready and open rows as of the last window (taken at the first state after it)."""
        if self._window is None:
            self._window, self._taken = WindowRows(self.packer.ready, self.packer.open_contents(), self.pool), 0
        return self._window

    def own_state(self) -> State:
        return materialize(self._own_snapshot())  # type: ignore[no-any-return]

    def snapshot(self) -> State:
        """The state with its rows deferred: after every batch this costs a few list copies per
        window; the refs are looked up and packed only if the state is read."""
        return {self.PARENT: self.parent.get_state(), **self._own_snapshot()}

    def _own_snapshot(self) -> State:
        window, taken = self._window_rows(), self._taken
        return {"ready": Deferred(functools.partial(window.ready_state, taken), ship=True),
                "open": Deferred(window.open_state, ship=True),
                "stats": self.stats.get_state()}

    def restore(self, own: Mapping[str, Any]) -> None:
        stats = own["stats"]
        ready, open_rows = _ready_rows(own["ready"]), unpack_ragged(own["open"], 6, "pack: open rows")
        rows = [*ready, *open_rows]
        try:
            refs = np.asarray([r[:6] for row in rows for r in row], dtype=np.int64).reshape(-1, 6)
        except (TypeError, ValueError) as e:
            raise StateError(f"pack: malformed piece ref in state ({e})") from e
        wanted = sorted({tuple(r) for r in refs[:, :5].tolist()})
        block = _block_of(self.ds.parent.rebuild(wanted) if wanted else [])
        where = {ref: i for i, ref in enumerate(wanted)}
        ex = np.fromiter((where[tuple(r)] for r in refs[:, :5].tolist()), dtype=np.int64, count=len(refs))
        start = refs[:, 5]
        lengths = np.minimum(start + self.max_length, block.lengths[ex]) - start
        if len(refs) and (lengths.min() < 1 or start.min() < 0):
            raise StateError("pack: a piece ref in the state names tokens its example does not have; the data or "
                             "the tokenizer changed since the state was saved")
        ids = list(self.pool.add(refs, lengths, block.starts[ex] + start, block.fields))
        self.packer = self._new_packer()
        at = 0
        restored: list[list[int]] = []
        for row in rows:
            restored.append(ids[at:at + len(row)])
            at += len(row)
        n = lengths.tolist()
        self.packer.restore(restored[:len(ready)], [[(n[i], i) for i in row] for row in restored[len(ready):]])
        self.exhausted = False
        self.stats = FillStats.from_state(stats)
        self._keep()
        if isinstance(own["ready"], dict) and "skip" in own["ready"]:  # the saved window: the same states follow
            self._window, self._taken = WindowRows.restored(own["ready"]["rows"], own["open"]), own["ready"]["skip"]


def _ready_rows(obj: Any) -> list[list[list[int]]]:
    """The ready rows of a state: ``{"rows": the window's ready rows, "skip": delivered since}``, or
    (older states) the rows not yet delivered, packed or as lists."""
    if isinstance(obj, dict) and "skip" in obj:
        skip = obj["skip"]
        rows = unpack_ragged(obj.get("rows"), 6, "pack: ready rows")
        if type(skip) is not int or not 0 <= skip <= len(rows):
            raise StateError(f"pack: ready rows: skip {skip!r} is not in [0, {len(rows)}]")
        return rows[skip:]
    return unpack_ragged(obj, 6, "pack: ready rows")


def _block_of(examples: Sequence[Example]) -> ExampleBlock:
    """Examples (not from a block) as one; a field with one value per example cannot be packed."""
    for ex in examples:
        token_fields(ex, "pack")
    return ExampleBlock.from_examples(examples)
