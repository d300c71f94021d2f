"""How much work a chunk of records holds: the task map cuts chunks by size, not by count alone.

A record's size is the characters of its strings plus the bytes of its arrays (token ids of a
pre-tokenized source), nested lists and mappings included (chat messages): what the task will
encode or copy, near enough to balance chunks. :func:`read_chunk` reads one chunk: at most
``most`` records, ending at the first record that brings the chunk to ``budget``. It reads in
takes that at most double (1, 1, 2, 4, ... records, fewer where the records so far say fewer
reach the budget) and measures each, so a chunk overshoots the budget by less than its last take
(and usually by about one record), and where it ends depends only on the records from its start (never on
timing or on earlier chunks), which keeps resumed streams cutting the same chunks.

    >>> recs, size, exhausted = read_chunk(iter(records), most=256, budget=CHUNK_BYTES)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedline._core.dataset import DatasetIterator
from feedline._core.documents import TokenRecords, chunk_progress, chunk_steps, join_records, next_take
from feedline._core.record import Record

__all__ = ["CHUNK_BYTES", "INFLIGHT_BYTES", "chunk_steps", "read_chunk", "record_size", "records_size"]

#: A chunk ends once it holds this much text (characters) or token-id bytes: ~250 k BERT tokens of
#: Wikipedia, a few hundredths of a second of the tokenizer on 16 cores.
CHUNK_BYTES = 1 << 20
#: Chunks in flight hold at most this much (the chunk that crosses it is the last submitted), so
#: more threads never queue more work ahead of the chunk the stream waits for: its wait is bounded
#: by this much text, not by ``workers`` chunks.
INFLIGHT_BYTES = 2 << 20
#: What any other value (a number, ``None``) counts for.
SCALAR = 8


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return SCALAR


def record_size(record: Record) -> int:
    """Characters of ``record``'s strings plus bytes of its arrays (nested values included)."""
    n = 0
    for v in record.data.values():
        n += len(v) if type(v) is str else _size(v)
    return n


def records_size(records: Sequence[Record]) -> int:
    """:func:`record_size` summed (the common one-string record without a call per record)."""
    if isinstance(records, TokenRecords):
        return records.size()
    n = 0
    for r in records:
        for v in r.data.values():
            n += len(v) if type(v) is str else _size(v)
    return n


def read_chunk(parent: DatasetIterator[Record], most: int, budget: int) -> tuple[Sequence[Record], int, bool]:
    """Read one chunk from ``parent``: ``(records, their size, whether parent ended)``.

    At most ``most`` records; the chunk ends after the record that brings its size to ``budget``
    or past it (so it holds at least one record unless ``parent`` is exhausted). Runs of
    :class:`~feedline._core.documents.TokenRecords` are joined into one; a parent that knows the sizes
    ahead (``run_sizes``, or else ``chunk_plan(most, budget)``: :func:`chunk_steps`) is read in one take
    where its run holds the chunk; where its run ends first, the takes inside it are one (a Parquet
    row group's last records), and so are those inside the next run once a take reaches it (the doubling takes into
    the next group: 8, 16, 32, 64 and 128 records were five takes there, now two). The same
    records, size and states as the doubling takes one by one.
    """
    sizes_of = getattr(parent, "run_sizes", None)
    sizes = sizes_of(most) if sizes_of is not None else None
    if sizes is None:
        plan = getattr(parent, "chunk_plan", None)
        k = plan(most, budget) if plan is not None else None
        if k:  # the parent knows the sizes ahead: the same records in one take
            got = parent.take(k)
            return got, records_size(got), len(got) < k
    parts: list[Sequence[Record]] = []
    n = size = 0
    step = 1

    def take(k: int) -> bool:
        """Take ``k`` more records into the chunk; True where ``parent`` ended first."""
        nonlocal n, size, step
        got = parent.take(k)
        parts.append(got)
        n += len(got)
        size += records_size(got)
        if len(got) < k:
            return True
        step = next_take(n, size, budget)
        return False

    if sizes is not None and len(sizes):  # the takes that stay in the parent's run, as one
        k, _size, _step, done = chunk_progress(sizes, most, budget)
        if done:  # the run holds the whole chunk (what chunk_plan tells from the same sizes)
            got = parent.take(k)
            return got, records_size(got), len(got) < k
        if take(k):
            return join_records(parts), size, True
    while n < most and size < budget:
        if take(min(step, most - n)):
            return join_records(parts), size, True
        sizes = sizes_of(most - n) if sizes_of is not None and n < most and size < budget else None
        if sizes is not None and len(sizes):  # now inside the next run: the takes it holds, as one
            k = chunk_progress(sizes, most, budget, start=(n, size, step))[0] - n
            if k and take(k):
                return join_records(parts), size, True
    return join_records(parts), size, False
