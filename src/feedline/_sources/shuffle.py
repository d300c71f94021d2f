"""A seeded shuffle buffer whose contents survive a resume.

The buffer fills to ``size`` records; each output is drawn at index
``floor(uniform(seed, salt, counter) * len(buffer))`` and its slot refilled from upstream.
The state holds the buffered records' *keys* (never their text); on resume they are re-read
through the parent (``parent.fetch(keys)``) so the buffer is restored exactly, unlike HF
streaming, which drops it.

State: ``{"parent": ..., "counter": n, "buffer": keys}``, the keys ``[source, file, position, epoch]``
of the buffered records in buffer order as a packed table (:func:`feedline._core.packed.pack_ints`:
~5 bytes a record instead of ~20 of JSON; the list of lists of older states still loads). The
iterator keeps the keys in an array beside the records, so the state costs one pack per batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.packed import pack_ints, unpack_ints
from feedline._core.record import Record
from feedline._core.rng import uniform
from feedline.errors import StateError

__all__ = ["ShuffleBuffer"]

_SALT = 0x5B0F

class ShuffleBuffer(Dataset[Record]):
    """Shuffle ``parent`` through a buffer of ``size`` records (restored by ``parent.fetch``)."""

    def __init__(self, parent: Dataset[Record], size: int, *, seed: int) -> None:
        self.parent = parent
        self.size = size
        self.seed = seed

    def __iter__(self) -> ShuffleBufferIterator:
        return ShuffleBufferIterator(self)


class ShuffleBufferIterator(DatasetIterator[Record]):
    """Cursor over a :class:`ShuffleBuffer`."""

    NAME = "shuffle buffer"
    STATE_KEYS = ("counter", "exhausted", "buffer")

    def __init__(self, ds: ShuffleBuffer) -> None:
        self.ds = ds
        self.parent = iter(ds.parent)
        self.buffer: list[Record] = []
        self.keys = np.zeros((max(1, ds.size), 4), dtype=np.int64)  # [source, file, position, epoch] per slot
        self.counter = 0
        self.exhausted = False

    def __next__(self) -> Record:
        while not self.exhausted and len(self.buffer) < self.ds.size:
            rec = next(self.parent, None)
            if rec is None:
                self.exhausted = True
            else:
                self.keys[len(self.buffer)] = (*rec.key, rec.epoch)
                self.buffer.append(rec)
        if not self.buffer:
            raise StopIteration
        j = int(uniform(self.ds.seed, _SALT, self.counter) * len(self.buffer))
        self.counter += 1
        out = self.buffer[j]
        nxt = None if self.exhausted else next(self.parent, None)
        if nxt is None:
            self.exhausted = True
            last = self.buffer.pop()
            if j < len(self.buffer):
                self.buffer[j] = last
                self.keys[j] = self.keys[len(self.buffer)]
        else:
            self.buffer[j] = nxt
            self.keys[j] = (*nxt.key, nxt.epoch)
        return out

    def own_state(self) -> State:
        return {"counter": self.counter, "exhausted": self.exhausted, "buffer": pack_ints(self.keys[:len(self.buffer)], 4)}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.counter = int(own["counter"])
        self.exhausted = bool(own["exhausted"])
        table = unpack_ints(own["buffer"], 4, "shuffle buffer")
        entries = [(s, f, p, e) for s, f, p, e in table.tolist()]
        if len(entries) > len(self.keys):
            raise StateError(f"shuffle buffer: the state holds {len(entries)} records, more than shuffle.buffer {self.ds.size}")
        self.keys[:len(entries)] = table
        found = self.ds.parent.fetch([(s, f, p) for s, f, p, _ in entries])
        self.buffer = [Record((s, f, p), e, found[(s, f, p)]) for s, f, p, e in entries]
