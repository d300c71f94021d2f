"""A background thread that runs one global stream and hands out its steps, sliced per rank.

    producer = Producer(pipeline, world_size=4, start=state, wake=server.wake)
    producer.start()
    item = producer.poll()     # Produced | End | an exception | None (nothing ready yet)

The thread runs :class:`~feedline.pipeline.GlobalStream` from a start state, splits each global
batch into the ranks' slices once (:func:`~feedline.batching.planner.assign_rows`), serialises
the resume state after the step once, and puts the result in a bounded queue: production runs at
most ``depth`` steps ahead of whoever drains it. ``wake`` is called after every put so the
server's event loop never has to spin.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedline.batching.base import Batch, real_tokens
from feedline.batching.planner import assign_rows
from feedline.pipeline import GlobalStream, Pipeline
from feedline.state import make_state

__all__ = ["End", "Produced", "Producer"]

log = logging.getLogger("feedline.service")


@dataclass(frozen=True, slots=True)
class Produced:
    """One global step: the ranks' slices and the state after the step."""

    step: int
    state: dict[str, Any]
    state_json: str
    slices: list[Batch]
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
                 name: str = "feedline-producer") -> None:
        self.pipeline = pipeline
        self.world_size = world_size
        self.start_state = dict(start) if start is not None else None
        self._initial = dict(initial) if initial is not None else None
        self.spec_hash = pipeline.spec.hash()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._wake = wake
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def initial_state(self) -> dict[str, Any]:
        """The global state at the start position (computed without producing anything)."""
        if self.start_state is not None:
            return self.start_state
        if self._initial is not None:
            return self._initial
        it = iter(GlobalStream(self.pipeline, self.world_size))
        try:
            return it.get_state()
        finally:
            it.close()

    def poll(self) -> Produced | End | BaseException | None:
        """The next produced item, or ``None`` when none is ready."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        """Stop the thread (it exits at its next step boundary). Idempotent."""
        self._stop.set()
        try:  # unblock a put on a full queue
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ thread
    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
            except queue.Full:
                continue
            self._wake()
            return True
        return False

    def _run(self) -> None:
        try:
            it = iter(GlobalStream(self.pipeline, self.world_size))
            try:
                if self.start_state is not None:
                    it.set_state(self.start_state)
                step = it.step
                for step, batch, state in it:
                    if not self._put(self._produce(step, batch, state)):
                        return
                    if self._stop.is_set():
                        return
            finally:
                it.close()
            self._put(End(step))
        except BaseException as e:  # forwarded to the server, which reports it to clients
            log.error("stream production failed: %s", e)
            self._put(e)

    def _produce(self, step: int, batch: Batch, state: dict[str, Any]) -> Produced:
        w = self.world_size
        tokens = real_tokens(batch)
        parts = [np.arange(len(tokens))] if w == 1 else assign_rows(tokens, w)
        slices = [batch] if w == 1 else [{k: v[rows] for k, v in batch.items()} for rows in parts]
        ids = batch.get("input_ids")
        width = int(ids.size // max(1, len(ids))) if ids is not None else 0
        slice_tokens = [int(tokens[rows].sum()) for rows in parts]
        slice_slots = [len(rows) * width if width else t for rows, t in zip(parts, slice_tokens)]
        state_json = json.dumps(make_state(self.spec_hash, state, w), separators=(",", ":"))
        return Produced(step, state, state_json, slices, slice_tokens, slice_slots)
