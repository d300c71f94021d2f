"""Concatenated T5 span corruption: documents end to end, cut into full raw pieces, then corrupted.

The ``span`` task (``concat_documents: true``, the default) turns each record into one example
holding the document's tokens and EOS; :class:`SpanStream` reads those in order, lays them end to
end and cuts the stream every ``raw_length`` tokens (568 for ``max_length`` 512), so every
corrupted row has exactly ``max_length`` inputs and ``targets_length`` targets, except the last
row of the stream::

    documents   [a a a </s>] [b b </s>] [c c c c c </s>] ...
    raw pieces  |a a a </s> b b| |</s> c c c c c| ...       (raw_length 6 here)
    rows        corrupt(piece) -> input_ids, labels, decoder_input_ids

A row's noise mask comes from ``sample_rng(seed, epoch, key, start)`` of the document the row
starts in (``start``: the token offset there), so it depends on the data, never on chunking,
threads or resume. The row's example is named by that document (``sub`` = ``start``).

State: ``{"parent": <task map>, "carry": null or [source, file, position, epoch, sub, start]}``:
between rows the only held tokens are the rest of the document being cut, restored by
re-reading its record through the parent (``rebuild``), as the ``concat`` batcher does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.record import Example, ExampleRef
from feedline._core.rng import sample_rng
from feedline.errors import StateError

__all__ = ["Corrupter", "SpanStream"]


class Corrupter(Protocol):
    """What the stage needs of the span task (:class:`~feedline._tasks.span.SpanCorruption`)."""

    @property
    def seed(self) -> int: ...

    @property
    def raw_length(self) -> int: ...

    def corrupt(self, chunk: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]: ...


class SpanStream(Dataset[Example]):
    """Full span-corruption rows over a stream of per-document token examples."""

    def __init__(self, parent: Dataset[Example], task: Corrupter) -> None:
        self.parent = parent
        self.task = task

    def rebuild(self, refs: Sequence[ExampleRef]) -> list[Example]:
        """Refused: a row joins several documents, so no ref names it (no batcher buffers span rows)."""
        raise StateError("span rows join several documents and cannot be rebuilt from refs; "
                         "use batching: pad with task: span")

    def __iter__(self) -> SpanStreamIterator:
        return SpanStreamIterator(self)

    def __repr__(self) -> str:
        return f"SpanStream({self.task!r})"


class SpanStreamIterator(DatasetIterator[Example]):
    """Cursor over a :class:`SpanStream`."""

    NAME = "span"
    STATE_KEYS = ("carry",)

    def __init__(self, ds: SpanStream) -> None:
        self.ds = ds
        self.parent = iter(ds.parent)
        self.raw = ds.task.raw_length
        self.carry: tuple[Example, int] | None = None  # the document being cut, and where its rest starts

    def __next__(self) -> Example:
        pieces: list[np.ndarray] = []
        head: tuple[Example, int] | None = None
        room = self.raw
        while room:
            if self.carry is None:
                ex = next(self.parent, None)
                if ex is None:
                    break
                if ex.length == 0:
                    continue
                self.carry = (ex, 0)
            ex, start = self.carry
            if head is None:
                head = (ex, start)
            stop = min(ex.length, start + room)
            pieces.append(ex.fields["input_ids"][start:stop])
            room -= stop - start
            self.carry = None if stop == ex.length else (ex, stop)
        if head is None or self.raw - room < 2:  # end of stream (a 1-token tail cannot be corrupted)
            raise StopIteration
        first, offset = head
        rng = sample_rng(self.ds.task.seed, first.epoch, first.key, offset, 0)
        return Example(first.key, first.epoch, offset, self.ds.task.corrupt(np.concatenate(pieces), rng))

    def own_state(self) -> State:
        return {"carry": None if self.carry is None else [*self.carry[0].ref, self.carry[1]]}

    def restore(self, own: Mapping[str, Any]) -> None:
        carry = own["carry"]
        self.carry = None
        if carry is not None:
            try:
                src, fi, pos, ep, sub, start = (int(x) for x in carry[:6])
            except (TypeError, ValueError, IndexError) as e:
                raise StateError(f"span: malformed carry {carry!r} in state ({e})") from e
            ex = self.ds.parent.rebuild([(src, fi, pos, ep, sub)])[0]
            if not 0 < start < ex.length:
                raise StateError(f"span: carry offset {start} is outside document {(src, fi, pos)} of {ex.length} "
                                 "tokens; the data changed since the state was saved")
            self.carry = (ex, start)

    @property
    def rejected(self) -> dict[str, int]:
        """The task map's rejected records by reason."""
        return dict(getattr(self.parent, "rejected", {}) or {})
