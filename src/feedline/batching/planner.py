"""The global step planner: each global batch is split into ``world_size`` equal slices.

Every rank receives the same number of rows each step, so every rank runs the same number of
steps (no end-of-epoch hang). Rows are dealt so ranks get near-equal real tokens: rows are
taken longest first and each goes to the rank with the fewest tokens that still has room
(a deterministic function of the global batch, so all ranks agree without talking). Each
rank's rows keep their global order.

The last, short global batch follows ``remainder``: ``drop`` it, ``pad`` it with empty rows to
the full batch size (``attention_mask`` 0, ``labels`` -100), or ``keep`` it, padded only up to a
multiple of the world size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline.batching.base import Batch, real_tokens
from feedline.errors import SpecError

__all__ = ["assign_rows", "complete_batch", "slice_for_rank"]


def assign_rows(tokens: np.ndarray, world_size: int) -> list[np.ndarray]:
    """Row indices per rank: equal counts, near-equal token sums, original order within a rank.

        >>> [a.tolist() for a in assign_rows(np.array([10, 1, 9, 2]), 2)]
        [[0, 1], [2, 3]]
    """
    n = len(tokens)
    if n % world_size:
        raise SpecError(f"a global batch of {n} rows cannot be split over {world_size} ranks; make batching.batch_size a multiple of the world size")
    per = n // world_size
    if world_size == 1:
        return [np.arange(n)]
    order = np.argsort(-tokens, kind="stable")
    load = np.zeros(world_size, dtype=np.int64)
    count = np.zeros(world_size, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    for i in order:
        open_ranks = np.flatnonzero(count < per)
        r = open_ranks[np.argmin(load[open_ranks])]
        owner[i] = r
        load[r] += tokens[i]
        count[r] += 1
    return [np.flatnonzero(owner == r) for r in range(world_size)]


def slice_for_rank(batch: Batch, rank: int, world_size: int) -> Batch:
    """Rank ``rank``'s slice of a global batch."""
    if world_size == 1:
        return batch
    rows = assign_rows(real_tokens(batch), world_size)[rank]
    return {k: v[rows] for k, v in batch.items()}


def complete_batch(batch: Batch, batch_size: int, world_size: int, remainder: str, pad_values: dict[str, Any]) -> Batch | None:
    """Apply the remainder rule to a possibly short global batch (``None``: drop it)."""
    n = len(next(iter(batch.values())))
    if n == batch_size:
        return batch
    if remainder == "drop":
        return None
    target = batch_size if remainder == "pad" else -(-n // world_size) * world_size
    if target == n:
        return batch
    out: Batch = {}
    for k, v in batch.items():
        fill = pad_values.get(k, 0)
        pad = np.full((target - n, *v.shape[1:]), fill, dtype=v.dtype)
        out[k] = np.concatenate([v, pad])
    return out
