"""A seeded shuffle buffer whose contents survive a resume.

The buffer fills to ``size`` records; each output is drawn at index
``floor(uniform(seed, salt, counter) * len(buffer))`` and its slot refilled from upstream.
The state holds the buffered records' *keys* (never their text); on resume they are re-read
through the parent (``parent.fetch(keys)``) so the buffer is restored exactly, unlike HF
streaming, which drops it.

State: ``{"parent": ..., "counter": n, "buffer": [[source, file, position, epoch], ...]}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from feedline.core.dataset import Dataset, DatasetIterator, State
from feedline.core.record import Record
from feedline.core.rng import uniform

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
        self.counter = 0
        self.exhausted = False

    def __next__(self) -> Record:
        while not self.exhausted and len(self.buffer) < self.ds.size:
            rec = next(self.parent, None)
            if rec is None:
                self.exhausted = True
            else:
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
        else:
            self.buffer[j] = nxt
        return out

    def own_state(self) -> State:
        return {"counter": self.counter, "exhausted": self.exhausted, "buffer": [[*r.key, r.epoch] for r in self.buffer]}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.counter = int(own["counter"])
        self.exhausted = bool(own["exhausted"])
        entries = [(int(s), int(f), int(p), int(e)) for s, f, p, e in own["buffer"]]
        found = self.ds.parent.fetch([(s, f, p) for s, f, p, _ in entries])
        self.buffer = [Record((s, f, p), e, found[(s, f, p)]) for s, f, p, e in entries]
