"""Padding batcher: ``batch_size`` examples per global batch, padded to the longest or to ``max_length``.

    batching: {strategy: pad, batch_size: 32, pad_to: longest, pad_to_multiple_of: 8}

It holds nothing between batches, so its state is its parent's. From a parent that hands out
blocks (the task map: ``peek_block``/``consume``), a batch is taken and collated a chunk at a
time (:func:`~feedline._batching.base.collate_blocks`); the batches and states are those of
taking one example at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from feedline._batching.base import Batch, Batcher, collate_blocks, collate_padded
from feedline._batching.pack import row_length
from feedline._core.block import ExampleBlock
from feedline._core.dataset import DatasetIterator
from feedline._core.record import Example
from feedline.errors import SpecError

__all__ = ["PadBatcher", "PadOptions"]


@dataclass(frozen=True, kw_only=True)
class PadOptions:
    """Options of the ``pad`` strategy.

    Attributes:
        pad_to: ``longest`` in the batch, or ``max_length`` (the task's, unless given here).
        max_length: the fixed length for ``pad_to: max_length``.
        pad_to_multiple_of: round the padded length up to a multiple of this (8 for tensor cores).
    """

    pad_to: Literal["longest", "max_length"] = "longest"
    max_length: int | None = None
    pad_to_multiple_of: int | None = None

    def __post_init__(self) -> None:
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise SpecError(f"batching.pad_to_multiple_of: {self.pad_to_multiple_of} must be >= 1")


class PadBatcher(Batcher):
    """The ``pad`` strategy."""

    strategy = "pad"
    Options = PadOptions

    def __iter__(self) -> _PadIterator:
        return _PadIterator(self)


class _PadIterator(DatasetIterator[Batch]):
    NAME = "pad"  # state: {"parent": ...}, nothing of its own

    def __init__(self, ds: PadBatcher) -> None:
        self.ds = ds
        self.parent = iter(ds.parent)
        opts: PadOptions = ds.options
        self.length = None
        if opts.pad_to == "max_length":
            self.length = row_length(opts, ds.ctx.task.max_length, "pad")
        self.pad_values = ds.ctx.task.pad_values

    def __next__(self) -> Batch:
        want = self.ds.ctx.batch_size
        task = self.ds.ctx.task
        peek = getattr(self.parent, "peek_block", None)
        if peek is None:  # one example at a time
            rows = []
            for ex in self.parent:
                rows.append(ex)
                if len(rows) == want:
                    break
            parts: list[ExampleBlock | list[Example]] = [rows] if rows else []
        else:
            parts = []
            while want:
                got = peek()
                if got is None:
                    break
                k = min(want, len(got))
                self.parent.consume(k)  # type: ignore[attr-defined]
                parts.append(got.slice(0, k) if isinstance(got, ExampleBlock) else got[:k])
                want -= k
        if not parts:
            raise StopIteration
        opts: PadOptions = self.ds.options
        blocks = [p for p in parts if isinstance(p, ExampleBlock)]
        if len(blocks) == len(parts) and not set(blocks[0].fields) & (task.vector_fields | task.target_fields):
            return collate_blocks(blocks, self.pad_values, self.length, opts.pad_to_multiple_of)
        examples = [ex for p in parts for ex in (p if isinstance(p, list) else (p[i] for i in range(len(p))))]
        return collate_padded(examples, self.pad_values, self.length, opts.pad_to_multiple_of,
                              vector_fields=task.vector_fields, target_fields=task.target_fields)
