"""A background thread that runs one global stream and hands out its steps, sliced per rank.

    producer = Producer(pipeline, world_size=4, start=state, depth=2, wake=server.wake, stream="train")
    producer.start()
    item = producer.poll()     # Produced | End | an exception | None (nothing ready yet)

A :class:`~feedline._core.prefetch.Prefetch` stage runs :class:`~feedline._pipeline.GlobalStream`
from a start state; on its thread each global batch is cut into the ranks' slices once
(:func:`~feedline._batching.planner.rank_slices`) and the resume state after the step is
serialised once (:func:`~.protocol.pack_state`, straight from the step's snapshot: the state is
never deep-copied on the way). Each step is computed inside :func:`~feedline._core.notices.scope`
of the producer's ``stream``, so what its stages post (a silent worker) is told to that stream's
clients only. A ``pack`` batch stays compact
(:class:`~feedline._batching.compact.CompactBatch`): the clients lay it out. Production runs at
most ``depth`` steps ahead of whoever drains it. ``wake`` is called after every put so the
server's event loop never has to spin.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedline._batching.base import Batch, real_tokens
from feedline._batching.compact import CompactBatch
from feedline._batching.planner import rank_slices
from feedline._core import notices
from feedline._core.dataset import State
from feedline._core.prefetch import Prefetch
from feedline._pipeline import GlobalStream, GlobalStreamIterator, Pipeline
from feedline._service.protocol import pack_state
from feedline._state import make_state

__all__ = ["End", "Produced", "Producer"]

log = logging.getLogger("feedline.service")


@dataclass(frozen=True, slots=True)
class Produced:
    """One global step: the ranks' slices (laid out, or compact where the batcher can: the client
    lays them out) and the state after the step (``state``: a snapshot, whose deferred parts
    :func:`~feedline._core.deferred.materialize` computes; ``state_wire``: as batches carry it)."""

    step: int
    state: dict[str, Any]
    state_wire: bytes | str
    slices: Sequence[Batch | CompactBatch]
    slice_rows: list[int]
    slice_tokens: list[int]
    slice_slots: list[int]
    produced_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class End:
    """The stream is over after ``step`` global steps."""

    step: int


class Producer:
    """Runs a global stream in a thread; see the module docstring."""

    def __init__(self, pipeline: Pipeline, *, world_size: int, start: Mapping[str, Any] | None, depth: int,
                 wake: Callable[[], None], initial: Mapping[str, Any] | None = None,
                 stream: str, name: str = "feedline-producer") -> None:
        self.pipeline = pipeline
        self.world_size = world_size
        self.start_state = dict(start) if start is not None else None
        self.spec_hash = pipeline.spec.hash()
        self._stage = Prefetch(lambda: _CompactSteps(iter(GlobalStream(pipeline, world_size)), stream), max(1, depth),
                               map=self._produce, wake=wake, name=name, detach=True)
        if start is not None:
            self._stage.set_state(start)
        first = start if start is not None else initial
        self._initial: dict[str, Any] | None = dict(first) if first is not None else None
        self._over = False

    def start(self) -> None:
        """Start producing (the thread runs ``depth`` steps ahead of :meth:`poll`)."""
        self.initial_state()
        self._stage.start()

    def initial_state(self) -> dict[str, Any]:
        """The global state at the start position (computed without producing anything)."""
        if self._initial is None:
            self._initial = dict(self._stage.get_state())
        return self._initial

    def poll(self) -> Produced | End | BaseException | None:
        """The next produced item, or ``None`` when none is ready (and after the end or an error)."""
        if self._over:
            return None
        try:
            item = self._stage.poll()
        except StopIteration:
            self._over = True
            return End(int(self._stage.get_state()["step"]))
        except BaseException as e:  # forwarded to the server, which reports it to clients
            log.error("stream production failed: %s", e)
            self._over = True
            return e
        return None if item is None else item[0]  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the thread and close the stream, without waiting for a step in progress (the event
        loop calls this): a thread inside a step finishes it in the background. Idempotent."""
        self._stage.close()

    def _produce(self, element: tuple[int, Batch | CompactBatch, dict[str, Any]]) -> Produced:
        """Runs on the thread: cut the step into the ranks' slices and serialise its state, once."""
        step, batch, state = element
        w = self.world_size
        slices = rank_slices(batch, w)
        counts = [_counts(s) for s in slices]
        return Produced(step, state, pack_state(make_state(self.spec_hash, state, w)), slices,
                        [c[0] for c in counts], [c[1] for c in counts], [c[2] for c in counts])


class _CompactSteps:
    """The global stream as the producer runs it: :meth:`~feedline._pipeline.GlobalStreamIterator.next_compact`
    steps (compact batches where the batcher can, the state as a snapshot), the stream's state otherwise;
    a step's notices concern ``stream``."""

    def __init__(self, it: GlobalStreamIterator, stream: str) -> None:
        self.it = it
        self.stream = stream

    def __next__(self) -> tuple[int, Batch | CompactBatch, State]:
        with notices.scope(self.stream):
            return self.it.next_compact()

    def get_state(self) -> State:
        return self.it.get_state()

    def snapshot(self) -> State:
        return self.it.snapshot()

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.it.set_state(state)

    def close(self) -> None:
        self.it.close()


def _counts(batch: Batch | CompactBatch) -> tuple[int, int, int]:
    """Rows, real tokens and token slots of a slice (a 2-D mask is counted without the per-row sums
    of ``real_tokens``)."""
    if isinstance(batch, CompactBatch):
        return len(batch), batch.tokens(), len(batch) * batch.max_length
    ids = batch.get("input_ids")
    rows = len(ids) if ids is not None else len(next(iter(batch.values())))
    mask = batch.get("attention_mask")
    tokens = int(np.count_nonzero(mask)) if mask is not None and mask.ndim == 2 else int(real_tokens(batch).sum())
    return rows, tokens, int(ids.size) if ids is not None else tokens
