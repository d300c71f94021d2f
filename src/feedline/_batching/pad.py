"""Padding batcher: ``batch_size`` examples per global batch, padded to the longest or to ``max_length``.

    batching: {strategy: pad, batch_size: 32, pad_to: longest, pad_to_multiple_of: 8}

It holds nothing between batches, so its state is its parent's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from feedline._batching.base import Batch, Batcher, collate_padded
from feedline._core.dataset import DatasetIterator
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
            self.length = opts.max_length or ds.ctx.task.max_length
            if self.length is None:
                raise SpecError("batching.pad_to: max_length needs batching.max_length or task.max_length")
        self.pad_values = ds.ctx.task.pad_values

    def __next__(self) -> Batch:
        rows = []
        for ex in self.parent:
            rows.append(ex)
            if len(rows) == self.ds.ctx.batch_size:
                break
        if not rows:
            raise StopIteration
        task = self.ds.ctx.task
        return collate_padded(rows, self.pad_values, self.length, self.ds.options.pad_to_multiple_of,
                              vector_fields=task.vector_fields, target_fields=task.target_fields)

