"""Length-bucketed batcher: batches of similar lengths, cut from length-sorted windows, in shuffled order.

    batching: {strategy: bucket, batch_size: 64, window_batches: 50, pad_to_multiple_of: 8}

Examples are read ``window_batches * batch_size`` at a time, sorted by length (ties keep stream
order), and cut into consecutive batches of ``batch_size`` rows, each padded to its longest row,
so little padding remains (HF's ``group_by_length`` mega-batches, fairseq's sorted batches). The
batches of a window are delivered in an order shuffled by ``(seed, window number)``, so lengths
do not drift within an epoch and the order is a pure function of the spec. With ``max_tokens``,
a batch whose padded size ``rows * longest`` would exceed the budget is refused with an error
naming the settings (fairseq's rule applied as a check, since the global batch has fixed rows).

State: ``{"parent", "window": n, "pending": [[refs of one batch], ...] not yet delivered, "stats"}``.
The iterator's :attr:`stats` reports the padding ratio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from feedline._batching.base import Batch, Batcher, FillStats, collate_padded
from feedline._core.dataset import DatasetIterator, State
from feedline._core.record import Example, ExampleRef
from feedline._core.rng import permutation
from feedline.errors import SpecError

__all__ = ["BucketBatcher", "BucketOptions"]


@dataclass(frozen=True, kw_only=True)
class BucketOptions:
    """Options of the ``bucket`` strategy.

    Attributes:
        window_batches: batches cut from each length-sorted window (the window holds this many
            times ``batch_size`` examples); larger means less padding and more buffering.
        pad_to_multiple_of: round each batch's padded length up to a multiple of this.
        max_tokens: refuse a batch whose padded tokens (rows times padded length) exceed this.
    """

    window_batches: int = 50
    pad_to_multiple_of: int | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.window_batches < 1:
            raise SpecError(f"batching.window_batches: {self.window_batches} must be >= 1")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise SpecError(f"batching.pad_to_multiple_of: {self.pad_to_multiple_of} must be >= 1")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise SpecError(f"batching.max_tokens: {self.max_tokens} must be >= 1")


def _ref(r: Any) -> ExampleRef:
    s, f, p, e, sub = (int(x) for x in r)
    return (s, f, p, e, sub)


class BucketBatcher(Batcher):
    """The ``bucket`` strategy."""

    strategy = "bucket"
    Options = BucketOptions

    def __iter__(self) -> BucketIterator:
        return BucketIterator(self)


class BucketIterator(DatasetIterator[Batch]):
    """Cursor over a :class:`BucketBatcher`; :attr:`stats` reports padding."""

    NAME = "bucket"
    STATE_KEYS = ("window", "pending", "stats")

    def __init__(self, ds: BucketBatcher) -> None:
        self.ds = ds
        self.opts: BucketOptions = ds.options
        self.parent = iter(ds.parent)
        self.pending: list[list[Example]] = []
        self.window = 0
        self.stats = FillStats()

    def _read_window(self) -> None:
        size = self.ds.ctx.batch_size
        examples: list[Example] = []
        for ex in self.parent:
            examples.append(ex)
            if len(examples) == size * self.opts.window_batches:
                break
        if not examples:
            return
        examples.sort(key=lambda e: e.length)
        batches = [examples[i:i + size] for i in range(0, len(examples), size)]
        order = permutation(len(batches), self.ds.ctx.seed, 0xB0C7, self.window)
        self.window += 1
        full = [i for i in order if len(batches[i]) == size]
        self.pending = [batches[i] for i in full] + [b for b in batches if len(b) < size]  # a short one goes last

    def __next__(self) -> Batch:
        if not self.pending:
            self._read_window()
            if not self.pending:
                raise StopIteration
        rows = self.pending.pop(0)
        o = self.opts
        task = self.ds.ctx.task
        batch = collate_padded(rows, task.pad_values, None, o.pad_to_multiple_of,
                               vector_fields=task.vector_fields, target_fields=task.target_fields)
        width = int(batch["input_ids"].shape[1])
        if o.max_tokens is not None and len(rows) * width > o.max_tokens:
            raise SpecError(f"batching.max_tokens: a batch of {len(rows)} rows padded to {width} tokens holds "
                            f"{len(rows) * width} > {o.max_tokens} tokens; lower batching.batch_size, raise "
                            "max_tokens, or shorten task.max_length")
        self.stats.rows += len(rows)
        self.stats.documents += len(rows)
        self.stats.tokens += sum(ex.length for ex in rows)
        self.stats.slots += len(rows) * width
        return batch

    def own_state(self) -> State:
        return {"window": self.window, "pending": [[list(ex.ref) for ex in b] for b in self.pending],
                "stats": self.stats.get_state()}

    def restore(self, own: Mapping[str, Any]) -> None:
        window, stats = int(own["window"]), own["stats"]
        refs: list[list[ExampleRef]] = [[_ref(r) for r in b] for b in own["pending"]]
        flat = self.ds.parent.rebuild([r for b in refs for r in b])
        self.pending, at = [], 0
        for b in refs:
            self.pending.append(flat[at:at + len(b)])
            at += len(b)
        self.window = window
        self.stats = FillStats.from_state(stats)

