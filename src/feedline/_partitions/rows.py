"""Joining and cutting batches by rows: what the composing stage does to partition batches.

Partition batches may differ in their padded lengths (``pad_to: longest``); joining pads every
field to the longest with the task's pad values, as one batcher padding all the rows would.

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

__all__ = ["join_rows", "row_count", "take_rows"]


def row_count(batch: Batch) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def take_rows(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``[start, stop)`` of a batch (views)."""
    return {k: v[start:stop] for k, v in batch.items()}


def join_rows(parts: Sequence[Batch], pad_values: Mapping[str, Any]) -> Batch:
    """The rows of ``parts`` in order, as one batch (trailing dimensions padded to the largest)."""
    if len(parts) == 1:
        return dict(parts[0])
    out: Batch = {}
    for k in parts[0]:
        arrays = [p[k] for p in parts]
        shape = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
        if any(a.shape[1:] != shape for a in arrays):
            fill = pad_values.get(k, 0)
            arrays = [_pad_to(a, shape, fill) for a in arrays]
        out[k] = np.concatenate(arrays)
    return out


def _pad_to(a: np.ndarray, shape: tuple[int, ...], fill: Any) -> np.ndarray:
    if a.shape[1:] == shape:
        return a
    out = np.full((len(a), *shape), fill, dtype=a.dtype)
    out[tuple([slice(None), *(slice(0, n) for n in a.shape[1:])])] = a
    return out
