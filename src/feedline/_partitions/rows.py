"""Joining and cutting batches by rows: what the composing stage does to partition batches.

Partition batches may differ in their padded lengths (``pad_to: longest``); joining pads every
field to the longest with the task's pad values, as one batcher padding all the rows would.
Compact ``pack`` batches (:class:`~feedline._batching.compact.CompactBatch`, what partitions send
when the consumer lays batches out itself: the service's clients) are cut and joined as their
rows' pieces; laid out, they are the rows the laid-out batches would give (each row is laid out
on its own).

    >>> a = {"input_ids": np.array([[1, 2]]), "labels": np.array([[1, 2]])}
    >>> b = {"input_ids": np.array([[3, 4, 5]]), "labels": np.array([[3, 4, 5]])}
    >>> join_rows([a, b], {"labels": -100})["labels"].tolist()
    [[1, 2, -100], [3, 4, 5]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedline._batching.base import Batch
from feedline._batching.compact import CompactBatch

__all__ = ["join_compact", "join_rows", "row_count", "take_rows"]


def row_count(batch: Batch | CompactBatch) -> int:
    if isinstance(batch, CompactBatch):
        return len(batch)
    return len(next(iter(batch.values()))) if batch else 0


def take_rows(batch: Batch | CompactBatch, start: int, stop: int) -> Batch | CompactBatch:
    """Rows ``[start, stop)`` of a batch (views of a laid-out one)."""
    if isinstance(batch, CompactBatch):
        return batch.take(np.arange(start, stop))
    return {k: v[start:stop] for k, v in batch.items()}


def join_rows(parts: Sequence[Batch | CompactBatch], pad_values: Mapping[str, Any]) -> Batch | CompactBatch:
    """The rows of ``parts`` in order, as one batch (trailing dimensions padded to the largest);
    compact parts join compact (:func:`join_compact`), or are laid out to join laid-out ones."""
    if all(isinstance(p, CompactBatch) for p in parts):
        return join_compact(parts)  # type: ignore[arg-type]
    laid = [p.expand() if isinstance(p, CompactBatch) else p for p in parts]
    if len(laid) == 1:
        return dict(laid[0])
    out: Batch = {}
    for k in laid[0]:
        arrays = [p[k] for p in laid]
        shape = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
        if any(a.shape[1:] != shape for a in arrays):
            fill = pad_values.get(k, 0)
            arrays = [_pad_to(a, shape, fill) for a in arrays]
        out[k] = np.concatenate(arrays)
    return out


def join_compact(parts: Sequence[CompactBatch]) -> CompactBatch:
    """The rows of compact batches of one stream in order, as one (fields that share an array in
    every part still share one).

        >>> a = CompactBatch(np.array([1]), np.array([2]), {"input_ids": np.array([5, 6])}, max_length=4, max_docs=2,
        ...                  pad_values={})
        >>> join_compact([a, a.take(np.array([0]))]).expand()["input_ids"].tolist()
        [[5, 6, 0, 0], [5, 6, 0, 0]]
    """
    first = parts[0]
    if len(parts) == 1:
        return first
    groups = [_sharing(p) for p in parts]
    same = all(g == groups[0] for g in groups)
    joined: dict[int | str, np.ndarray] = {}
    values: dict[str, np.ndarray] = {}
    for name in first.values:
        source: int | str = groups[0][name] if same else name
        if source not in joined:
            joined[source] = np.concatenate([p.values[name] for p in parts])
        values[name] = joined[source]
    return CompactBatch(np.concatenate([p.docs for p in parts]), np.concatenate([p.lengths for p in parts]), values,
                        first.max_length, first.max_docs, first.pad_values, first.mask_first, first.attention)


def _sharing(batch: CompactBatch) -> dict[str, int]:
    """Each field's group: the index of the first field with the same array."""
    seen: dict[int, int] = {}
    return {name: seen.setdefault(id(v), i) for i, (name, v) in enumerate(batch.values.items())}


def _pad_to(a: np.ndarray, shape: tuple[int, ...], fill: Any) -> np.ndarray:
    if a.shape[1:] == shape:
        return a
    out = np.full((len(a), *shape), fill, dtype=a.dtype)
    out[tuple([slice(None), *(slice(0, n) for n in a.shape[1:])])] = a
    return out
