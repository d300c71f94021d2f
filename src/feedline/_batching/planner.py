"""The global step planner: each global batch is split into ``world_size`` equal slices.

Every rank receives the same number of rows each step, so every rank runs the same number of
steps (no end-of-epoch hang). Rows are dealt so ranks get near-equal real tokens: rows are
taken longest first and each goes to the rank with the fewest tokens that still has room
(a deterministic function of the global batch, so all ranks agree without talking). Each
rank's rows keep their global order.

The last, short global batch follows ``remainder``: ``drop`` it, ``pad`` it with empty rows to
the full batch size (``attention_mask`` 0, ``labels`` -100), or ``keep`` it, padded only up to a
multiple of the world size.

:class:`RankSlice` is the stage that applies the split to a global stream for one rank;
:func:`rank_slices` is the one function that cuts a batch (the service calls it once per step
for all ranks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

import numpy as np

from feedline._batching.base import Batch, real_tokens
from feedline._batching.compact import CompactBatch
from feedline._core.dataset import DatasetIterator, State
from feedline._core.deferred import materialize
from feedline.errors import SpecError

__all__ = ["RankSlice", "assign_rows", "complete_batch", "rank_rows", "rank_slices", "slice_for_rank"]


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


def rank_rows(batch: Batch, world_size: int) -> list[np.ndarray]:
    """Each rank's row indices in a global batch (:func:`assign_rows` over its real tokens)."""
    if world_size == 1:
        return [np.arange(len(next(iter(batch.values()))))]
    return assign_rows(real_tokens(batch), world_size)


@overload
def rank_slices(batch: Batch, world_size: int) -> list[Batch]: ...
@overload
def rank_slices(batch: CompactBatch, world_size: int) -> list[CompactBatch]: ...
def rank_slices(batch: Batch | CompactBatch, world_size: int) -> list[Batch] | list[CompactBatch]:
    """Every rank's slice of a global batch, in rank order (the only place a batch is cut).

    A :class:`~feedline._batching.compact.CompactBatch` is cut into compact slices: the same rows,
    chosen from the same real-token counts, as cutting it laid out.
    """
    if isinstance(batch, CompactBatch):
        if world_size == 1:
            return [batch]
        return [batch.take(rows) for rows in assign_rows(batch.row_tokens(), world_size)]
    if world_size == 1:
        return [batch]
    return [{k: v[rows] for k, v in batch.items()} for rows in rank_rows(batch, world_size)]


def slice_for_rank(batch: Batch, rank: int, world_size: int) -> Batch:
    """Rank ``rank``'s slice of a global batch."""
    return rank_slices(batch, world_size)[rank]


class RankSlice(DatasetIterator[Batch]):
    """The stage after the global stream: rank ``rank``'s slice of each global step.

    Its parent yields ``(step, global_batch, state)`` (a
    :class:`~feedline._pipeline.GlobalStreamIterator`); its state is the parent's, unchanged, so
    any rank's state resumes every rank at any world size.
    """

    def __init__(self, parent: DatasetIterator[tuple[int, Batch, State]], rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise SpecError(f"rank {rank} is not in [0, world_size={world_size})")
        self.parent = parent
        self.rank, self.world_size = rank, world_size
        self._state: State | None = None  # the parent's state after the last step, as it reported it

    def __next__(self) -> Batch:
        step = getattr(self.parent, "next_deferred", None)  # the global stream's snapshot: cheap every step
        _step, batch, self._state = step() if step is not None else next(self.parent)
        return slice_for_rank(batch, self.rank, self.world_size)

    def get_state(self) -> State:
        return materialize(self.snapshot())  # type: ignore[no-any-return]

    def snapshot(self) -> State:
        return self._state if self._state is not None else self.parent.snapshot()

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._state = None
        self.parent.set_state(state)


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
