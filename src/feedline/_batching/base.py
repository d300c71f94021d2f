"""The batcher protocol and collation helpers shared by every strategy.

A batcher is a recipe over a stream of :class:`~feedline._core.record.Example` that yields
*global* batches: ``dict[str, np.ndarray]`` with ``batch_size`` rows (the last may be short;
the planner applies the remainder rule). A batcher that holds examples across batches (a
packer's open bins, a bucket window) keeps their refs in its state and rebuilds them on resume
by asking its parent: ``self.parent.rebuild(refs)`` (the task map below re-processes them).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from feedline._core.block import ExampleBlock, spans
from feedline._core.dataset import Dataset
from feedline._core.record import Example
from feedline._tasks.base import Task

__all__ = ["Batch", "BatchContext", "Batcher", "FillStats", "collate_blocks", "collate_padded", "real_tokens"]

Batch = dict[str, np.ndarray]


class BatchContext:
    """What a batcher is built with."""

    def __init__(self, *, batch_size: int, task: Task, seed: int) -> None:
        self.batch_size = batch_size
        self.task = task
        self.seed = seed


class Batcher(Dataset[Batch]):
    """Base class of batching strategies; subclasses set ``strategy`` and ``Options``."""

    strategy: ClassVar[str]
    Options: ClassVar[type]
    #: True for strategies that put several examples in one row (pack, concat).
    joins_examples: ClassVar[bool] = False

    def __init__(self, parent: Dataset[Example], options: Any, ctx: BatchContext) -> None:
        task = ctx.task
        if self.joins_examples and not task.packable:
            from feedline.errors import SpecError

            raise SpecError(
                f"batching.strategy: {self.strategy!r} puts several examples in one row, which task {task.kind!r} "
                "does not allow (its rows carry per-example labels or keys); use strategy 'pad'"
            )
        self.parent = parent
        self.options = options
        self.ctx = ctx


@dataclass(slots=True)
class FillStats:
    """How well a batcher fills its rows; iterators of ``pack``/``concat``/``bucket`` expose one as ``stats``.

    ``efficiency`` is real tokens over token slots (rows times padded length): 1.0 means no padding.
    Counters are part of the batcher's state, so they survive a resume.

        >>> s = FillStats(rows=2, tokens=900, slots=1024); round(s.efficiency, 4), round(s.padding, 4)
        (0.8789, 0.1211)
    """

    rows: int = 0
    tokens: int = 0
    slots: int = 0
    documents: int = 0
    split_documents: int = 0
    truncated_tokens: int = 0

    @property
    def efficiency(self) -> float:
        return self.tokens / self.slots if self.slots else 0.0

    @property
    def padding(self) -> float:
        return 1.0 - self.efficiency if self.slots else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "efficiency": self.efficiency}

    def get_state(self) -> list[int]:
        return [self.rows, self.tokens, self.slots, self.documents, self.split_documents, self.truncated_tokens]

    @classmethod
    def from_state(cls, state: Sequence[int] | Mapping[str, int] | None) -> FillStats:
        if not state:
            return cls()
        if isinstance(state, Mapping):
            return cls(**{k: int(v) for k, v in state.items() if k != "efficiency"})
        return cls(*(int(x) for x in state))


def int_dtype(field: str, arr: np.ndarray) -> np.dtype[Any]:
    return arr.dtype if arr.dtype.kind in "fb" else np.dtype(np.int64 if arr.dtype == np.int64 else np.int32)


def collate_padded(examples: Sequence[Example], pad_values: dict[str, Any], length: int | None = None,
                   multiple_of: int | None = None, *, vector_fields: Collection[str] = (),
                   target_fields: Collection[str] = ()) -> Batch:
    """Stack examples into a batch, right-padding token fields to the longest (or ``length``).

    Adds ``attention_mask`` (1 on real tokens). 0-D fields are stacked to shape ``[B]`` and
    ``vector_fields`` to ``[B, n]``; ``target_fields`` are padded to their own longest row.

        >>> import numpy as np
        >>> from feedline._core.record import Example
        >>> ex = [Example((0, 0, i), 0, 0, {"input_ids": np.arange(n, dtype=np.int32)}) for i, n in enumerate((2, 3))]
        >>> collate_padded(ex, {"input_ids": 0})["attention_mask"].tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    lengths = np.array([ex.length for ex in examples], dtype=np.int64)
    t = int(length if length is not None else (lengths.max() if len(lengths) else 0))
    if multiple_of:
        t = -(-t // multiple_of) * multiple_of
    first = examples[0].fields
    batch: Batch = {}
    for name, arr in first.items():
        if arr.ndim == 0 or name in vector_fields:  # per-example scalars and fixed-size vectors
            batch[name] = np.stack([ex.fields[name] for ex in examples])
            continue
        pad = pad_values.get(name, 0)
        width = t
        if name in target_fields:  # own length (decoder side of encoder-decoder tasks)
            width = max(len(ex.fields[name]) for ex in examples)
            if multiple_of:
                width = -(-width // multiple_of) * multiple_of
        out = np.full((len(examples), width, *arr.shape[1:]), pad, dtype=int_dtype(name, arr))
        for i, ex in enumerate(examples):
            a = ex.fields[name][:width]
            out[i, : len(a)] = a
        batch[name] = out
    if "attention_mask" not in batch:
        batch["attention_mask"] = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    return batch


def collate_blocks(parts: Sequence[ExampleBlock], pad_values: dict[str, Any], length: int | None = None,
                   multiple_of: int | None = None) -> Batch:
    """:func:`collate_padded` of the examples of ``parts`` (blocks, in order), one gather per field.

    Blocks hold token fields only (every field spans each example's tokens), so this is exactly
    ``collate_padded([ex for p in parts for ex in p], ...)`` without an object per example.

        >>> b = ExampleBlock.from_examples([Example((0, 0, i), 0, 0, {"input_ids": np.arange(n, dtype=np.int32)})
        ...                                 for i, n in enumerate((2, 3))])
        >>> collate_blocks([b], {"input_ids": 0})["input_ids"].tolist()
        [[0, 1, 0], [0, 1, 2]]
    """
    lengths = np.concatenate([p.lengths for p in parts]).astype(np.int64, copy=False)
    n = len(lengths)
    t = int(length if length is not None else lengths.max(initial=0))
    if multiple_of:
        t = -(-t // multiple_of) * multiple_of
    # Every token each row keeps: where it comes from in its part's flat fields, where it goes.
    row0 = np.cumsum([0] + [len(p) for p in parts])[:-1]
    taken = [np.minimum(p.lengths, t) for p in parts]
    src = [spans(p.starts, k) for p, k in zip(parts, taken, strict=True)]
    dst = [spans(np.arange(r, r + len(p), dtype=np.int64) * t, k) for p, r, k in zip(parts, row0.tolist(), taken, strict=True)]
    batch: Batch = {}
    for name, arr in parts[0].fields.items():
        out = np.full((n, t, *arr.shape[1:]), pad_values.get(name, 0), dtype=int_dtype(name, arr))
        flat = out.reshape(n * t, *arr.shape[1:])
        for p, s, d in zip(parts, src, dst, strict=True):
            flat[d] = p.fields[name][s]
        batch[name] = out
    if "attention_mask" not in batch:
        batch["attention_mask"] = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    return batch


def real_tokens(batch: Batch) -> np.ndarray:
    """Real (non-padding) tokens per row."""
    if "attention_mask" in batch:
        m = batch["attention_mask"]
        if m.ndim == 3:  # [B, T, T] block mask: a position is real when it attends to anything
            return np.asarray(m.astype(bool).any(axis=2).sum(axis=1))
        return np.asarray(m.astype(bool).sum(axis=1))
    return np.full(len(next(iter(batch.values()))), batch["input_ids"].shape[1])
