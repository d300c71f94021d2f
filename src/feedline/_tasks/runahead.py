"""Several chunks of one pre-tokenized run read and processed at once, each still a chunk of its own.

Where the task map's parent is in a run of documents (:class:`~feedline._core.documents.TokenItems`:
it tells the sizes of its next records and its states after taking them without reading them), the
next chunks are planned on those sizes exactly as :func:`~feedline._tasks.sizing.read_chunk` would
cut them one by one (:func:`~feedline._core.documents.chunk_steps`, the size ramp included), read
in one take and processed in one task call (tasks are pure per record: the same examples). Each
chunk then enters the queue as before: its own start state, size, examples (a view of the run's
block, :attr:`~feedline._core.block.ExampleBlock.base` naming the run), rejections and end
state, so the task map's states are those of reading the chunks one at a time::

    run sizes   | 8 records | 16 | 32 | ... | 256 | 256 |     one take, one clm call
    queue       (start0, 8, block[0:8], end0) (start1, 16, block[8:24], end1) ...

A consumer that takes examples a run at a time (``concat``: :meth:`TaskMapIterator.peek_run`)
sees the examples of every queued chunk of the run as one block.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from feedline._core.block import ExampleBlock
from feedline._core.documents import chunk_steps
from feedline._core.report import add_counts, sum_rejected

__all__ = ["RUN_CHUNKS", "read_run", "run_end"]

#: At most this many chunks are read as one run ...
RUN_CHUNKS = 256
#: ... and at most this many bytes of ids (as chunks count them: 4 a token; 4 M tokens). A run's
#: block holds views of the stored ids (no copy of them), so its size is mostly ~64 bytes of
#: columns a document; a ``concat`` batch that crosses a run's end is cut row by row (~3 times a
#: batch's CPU), so longer runs make those rarer: 1 M-token runs, ~3 % of the short-document
#: batches; 4 M, ~1 %.
RUN_BYTES = 16 << 20


def read_run(it: Any, state: dict[str, Any]) -> bool:
    """Queue the next chunks of the task map iterator ``it`` (parent state ``state``) from its parent's
    current run; False (nothing read) where the run holds fewer than two whole chunks."""
    sizes_of = getattr(it.parent, "run_sizes", None)
    sizes = sizes_of(RUN_CHUNKS * it.ds.chunk) if sizes_of is not None else None
    if sizes is None or (len(sizes) < it.chunk and int(sizes.sum()) < it.ds.chunk_bytes):
        return False  # not even one whole chunk in the run (a Parquet row group's last records)
    plan: list[int] = []
    at = total = 0
    most, budget = it.chunk, it.ds.chunk_bytes
    ends = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    while len(plan) < RUN_CHUNKS and total < RUN_BYTES:
        if at + most < len(ends) and ends[at + most] - ends[at] < budget:
            k = most  # the doubling takes reach ``most`` records before the budget: all of them
        else:
            k = chunk_steps(sizes[at:at + most], most, budget)  # type: ignore[assignment]
            if k is None:
                break
        plan.append(k)
        total += ends[at + k] - ends[at]
        at += k
        most = min(2 * k, it.ds.chunk)
    if len(plan) < 2:
        return False
    bounds = np.concatenate([[0], np.cumsum(plan)])
    states = [state, *it.parent.run_states(bounds[1:-1].tolist())]
    recs = it.parent.take(at)
    if len(recs) != at:
        raise RuntimeError(f"task map: a run announced {at} records and gave {len(recs)}")
    end = it.parent.get_state()
    handles = _process(it.runner, recs, bounds)
    for j, k in enumerate(plan):
        last = j == len(plan) - 1
        start, stop = states[j], end if last else states[j + 1]
        # a run moves only positions: rejections read come only with the last take's end
        read = add_counts(sum_rejected(stop), sum_rejected(start), -1) if last else {}
        size = ends[bounds[j + 1]] - ends[bounds[j]]
        it.inflight.append((start, k, handles[j], read, stop, size))
        it.inflight_size += size
    it.chunk = min(2 * plan[-1], it.ds.chunk)
    it._next_start = end
    return True


def _process(runner: Any, recs: Any, bounds: np.ndarray) -> list[Any]:
    """Each chunk's handle: a view of the run's block, or where the run's call failed or gave
    per-record lists, the chunk's own call (its error, if any, then raised where its examples are taken)."""
    try:
        out = runner.result(runner.submit(recs), {})
    except Exception:
        out = None
    edges = bounds.tolist()
    if not isinstance(out, ExampleBlock):
        return [runner.submit(recs[a:b]) for a, b in itertools.pairwise(edges)]
    x = np.searchsorted(out.record, bounds).tolist()
    handles = []
    for j, (a, b) in enumerate(itertools.pairwise(edges)):
        lo, hi = x[j], x[j + 1]
        rejected = [(r - a, rej) for r, rej in out.rejected if a <= r < b]
        handles.append(ExampleBlock(out.refs[lo:hi], out.record[lo:hi] - a, out.starts[lo:hi], out.lengths[lo:hi],
                                    out.fields, rejected, base=(out, lo)))
    return handles


def run_end(it: Any) -> int:
    """Where the run of the task map iterator ``it``'s current chunk (which has one) ends in the run's
    block, over the chunks queued after it: the block's end, as a run's chunks are queued together
    and in order and cover its block (:func:`_process`), and a restore or release drops the queue
    with the current chunk. (Walking the queued chunks to their end cost ~9 us a batch.)"""
    return len(it.current.base[0])
