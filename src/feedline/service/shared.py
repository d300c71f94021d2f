"""Shared mode: a work queue of whole global batches for inference or asynchronous consumers.

Any client takes the next batch; a client *acks* a batch when it asks for the one after it (or
closes cleanly). The batches a client holds unacked are re-delivered to others, oldest first,
when it disappears (heartbeat timeout, or a new connection of its process). With acking clients,
every batch is consumed exactly once.

The resume state handed out with each batch is the *watermark*: the state after the highest step
``h`` such that steps ``1..h`` are all acked. Restarting a shared stream from it re-delivers the
batches after ``h`` that were already acked (at-least-once across a server restart).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from feedline.pipeline import Pipeline
from feedline.service.producer import End, Produced, Producer
from feedline.state import state_json

__all__ = ["SharedQueue"]


class SharedQueue:
    """The work queue of one stream in shared mode."""

    def __init__(self, stream: str, pipeline: Pipeline, start: Mapping[str, Any] | None, *,
                 window: int, wake: Callable[[], None], initial: Mapping[str, Any] | None = None) -> None:
        self.stream = stream
        self.spec_hash = pipeline.spec.hash()
        self.window = window
        self.producer = Producer(pipeline, world_size=1, start=start, depth=2, wake=wake, initial=initial,
                                 name=f"feedline-{stream}-shared")
        first = self.producer.initial_state()
        self.watermark = int(first["step"])
        self.watermark_json = state_json(self.spec_hash, first, 1)
        self.fresh: deque[Produced] = deque()
        self.redeliver: deque[Produced] = deque()
        self.inflight: dict[bytes, dict[int, Produced]] = {}
        self.held: dict[int, Produced] = {}   # produced and not yet below the watermark
        self.acked: set[int] = set()          # acked steps above the watermark
        self.ended_at: int | None = None
        self.error: BaseException | None = None
        self.redelivered = 0
        self.idle_since = time.monotonic()
        self.producer.start()

    # ------------------------------------------------------------- production
    def pump(self, limit: int) -> None:
        """Produce while fewer than ``limit`` batches are held (queued, in flight or acked early)."""
        while self.ended_at is None and self.error is None and len(self.held) < limit:
            item = self.producer.poll()
            if item is None:
                return
            if isinstance(item, Produced):
                self.fresh.append(item)
                self.held[item.step] = item
            elif isinstance(item, End):
                self.ended_at = item.step
            else:
                self.error = item

    def take(self, client: bytes) -> Produced | End | None:
        """The next batch for ``client`` (now in flight to it), ``End``, or ``None`` to wait."""
        queue = self.redeliver if self.redeliver else self.fresh
        if queue:
            item = queue.popleft()
            self.inflight.setdefault(client, {})[item.step] = item
            return item
        if self.ended_at is not None and not any(self.inflight.values()):
            return End(self.ended_at)
        return None

    def giveback(self, client: bytes, item: Produced) -> None:
        """Undo a :meth:`take` whose send failed."""
        self.inflight.get(client, {}).pop(item.step, None)
        self.redeliver.appendleft(item)

    def ack(self, client: bytes, step: int) -> None:
        if self.inflight.get(client, {}).pop(step, None) is None:
            return
        self.acked.add(step)
        while self.watermark + 1 in self.acked:
            self.watermark += 1
            self.acked.discard(self.watermark)
            item = self.held.pop(self.watermark)
            self.watermark_json = item.state_json

    def release(self, client: bytes) -> int:
        """Put a departed client's unacked batches back at the front of the queue; returns how many."""
        items = sorted(self.inflight.pop(client, {}).values(), key=lambda p: p.step, reverse=True)
        for item in items:
            self.redeliver.appendleft(item)
        self.redelivered += len(items)
        if not self.inflight:
            self.idle_since = time.monotonic()
        return len(items)

    @property
    def depth(self) -> int:
        return len(self.fresh) + len(self.redeliver)

    @property
    def produced(self) -> int:
        return max(self.held, default=self.watermark)

    def close(self) -> None:
        self.producer.close()
        self.fresh.clear()
        self.redeliver.clear()
