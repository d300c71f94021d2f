"""Ranked mode: one global cursor shared by the ``world_size`` ranks of a training job.

A :class:`RankedCursor` runs one global stream (a :class:`~.producer.Producer`) and keeps the
global steps that some rank still needs in a window::

    step:     41   42   43   44   45   46        (window = 6)
    rank 0:             ▲ next                 acked 42
    rank 1:                       ▲ next       acked 44
    production stops at acked_min + window = 48; steps <= acked_min (42) are dropped

Every rank gets its slice of the same global steps, so slices reassemble the global stream. A
slow or absent rank holds production back (at most ``window`` steps ahead of it), and memory
stays bounded. A step is dropped only when every rank has *consumed* it (the client reports its
consumed step with each credit), so a rank that reconnects with the state of the last batch it
received finds the next step still there.

Joining: a rank arriving with the state after step ``s`` joins a cursor of the same stream and
world size when step ``s + 1`` is in (or just ahead of) the window; when ``s`` is a little behind
the window (ranks of a job restarted after a server crash carry slightly different states), the
cursor is *rewound* to the earliest state, and ranks that are ahead simply wait for production to
reach them; otherwise it gets a cursor of its own.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from feedline._pipeline import Pipeline
from feedline._service.producer import End, Produced, Producer

if TYPE_CHECKING:
    from feedline._service.session import Client

__all__ = ["RankSlot", "RankedCursor"]

log = logging.getLogger("feedline.service")


@dataclass(slots=True)
class RankSlot:
    """One rank's position in a cursor: the next step to send and the last step consumed."""

    next: int
    acked: int
    client: bytes | None = None
    session: str = ""


class RankedCursor:
    """The shared global position of one (stream, world size) training job (a :class:`~.delivery.Delivery`)."""

    def __init__(self, stream: str, pipeline: Pipeline, world_size: int, start: Mapping[str, Any] | None,
                 *, window: int, wake: Callable[[], None], initial: Mapping[str, Any] | None = None) -> None:
        self.stream = stream
        self.pipeline = pipeline
        self.world_size = world_size
        self.window = window
        self._wake = wake
        self._initial = initial
        self.buffer: deque[Produced] = deque()
        self.ended_at: int | None = None
        self.error: BaseException | None = None
        self.idle_since = time.monotonic()
        self.stalled_since: float | None = None   # window full while a rank waits for production
        self.stall_reason: str | None = None   # why, as of the last stall() (told to waiting clients)
        self.stall_reported = 0.0
        self.producer = self._start(start)
        s = self.low - 1
        self.ranks = [RankSlot(next=s + 1, acked=s) for _ in range(world_size)]

    def _start(self, start: Mapping[str, Any] | None) -> Producer:
        producer = Producer(self.pipeline, world_size=self.world_size, start=start, depth=2, wake=self._wake,
                            initial=self._initial, name=f"feedline-{self.stream}-w{self.world_size}",
                            stream=self.stream)
        self.start_state = producer.initial_state()
        self.low = int(self.start_state["step"]) + 1  # first step in (or next into) the buffer
        self.produced = self.low - 1                  # last step moved into the buffer
        self.buffer.clear()
        self.ended_at = None
        self.error = None
        producer.start()
        return producer

    # ---------------------------------------------------------------- joining
    def can_join(self, step: int) -> bool:
        """Whether a rank whose next step is ``step`` can be served from this cursor as it is."""
        return self.error is None and self.low <= step <= self.produced + 1 + self.window

    def can_rewind(self, step: int) -> bool:
        """Whether rewinding to serve ``step`` is cheap (within a window or two behind)."""
        return self.error is None and step < self.low and self.low - step <= 2 * self.window

    def rewind(self, start: Mapping[str, Any] | None) -> None:
        """Restart production from ``start``; connected ranks ahead of it wait for production."""
        log.info("stream %r (world size %d): rewinding from step %d to %d", self.stream, self.world_size,
                 self.low, int(start["step"]) + 1 if start else 1)
        self.producer.close()
        self.producer = self._start(start)
        for slot in self.ranks:
            if slot.client is None:   # its next hello names its own position
                slot.acked, slot.next = self.low - 1, self.low
            else:
                slot.acked = min(slot.acked, self.low - 1)
                slot.next = max(slot.next, self.low)

    def taken_by_other(self, rank: int, session: str) -> bool:
        """Whether another job's live client holds ``rank`` (a reconnect reuses its session)."""
        slot = self.ranks[rank]
        return slot.client is not None and slot.session != session

    def attach(self, rank: int, client: bytes, session: str, step: int) -> bytes | None:
        """Seat ``client`` as ``rank`` with ``step`` next; returns the client it replaced."""
        slot = self.ranks[rank]
        old = slot.client if slot.client != client else None
        slot.client, slot.session, slot.next, slot.acked = client, session, step, step - 1
        return old

    def detach(self, rank: int, client: bytes) -> None:
        if self.ranks[rank].client == client:
            self.ranks[rank].client = None
        if not self.clients():
            self.idle_since = time.monotonic()

    def clients(self) -> list[bytes]:
        return [s.client for s in self.ranks if s.client is not None]

    # ------------------------------------------------------------- production
    def join(self, client: Client) -> None:
        """Seating happens in :meth:`attach` (the dispatcher picks the cursor by rank and step)."""

    def ack(self, client: Client, step: int) -> None:
        slot = self.ranks[client.rank]
        if slot.client == client.ident and slot.acked < step < slot.next:
            slot.acked = step

    def release(self, client: Client) -> int:
        self.detach(client.rank, client.ident)
        return 0   # its steps stay in the window until the rank (reconnected) consumes them

    def pump(self, now: float = 0.0) -> None:
        """Move produced steps into the window while it has room; drop steps every rank consumed."""
        floor = min(s.acked for s in self.ranks)
        while self.buffer and self.buffer[0].step <= floor:
            self.buffer.popleft()
            self.low = self.buffer[0].step if self.buffer else self.produced + 1
        while self.ended_at is None and self.error is None and self.produced - floor < self.window:
            item = self.producer.poll()
            if item is None:
                break
            if isinstance(item, Produced):
                self.buffer.append(item)
                self.produced = item.step
            elif isinstance(item, End):
                self.ended_at = item.step
            else:
                self.error = item

    def stall(self, now: float) -> str | None:
        """Who holds production back, while the window is full and a rank is waiting; else ``None``.

        ``stalled_since`` is updated, so the caller can decide how long a stall is worth a log line.
        """
        floor = min(s.acked for s in self.ranks)
        full = self.ended_at is None and self.error is None and self.produced - floor >= self.window
        waiting = [r for r, s in enumerate(self.ranks) if s.client is not None and s.next > self.produced]
        if not (full and waiting):
            self.stalled_since = self.stall_reason = None
            return None
        if self.stalled_since is None:
            self.stalled_since = now
        behind = [f"rank {r} (consumed up to step {s.acked}, {'connected' if s.client else 'not connected'})"
                  for r, s in enumerate(self.ranks) if s.acked == floor]
        self.stall_reason = (
            f"stream {self.stream!r} (world size {self.world_size}): window full (steps {floor + 1}-{self.produced}) "
            f"for {now - self.stalled_since:.0f}s; waiting for {', '.join(behind)}; "
            f"rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} wait{'' if len(waiting) > 1 else 's'} "
            "for the next step. Every rank must consume its batches (a trainer that reads only on rank 0, "
            "e.g. accelerate's dispatcher, stalls here)")
        return self.stall_reason

    def take(self, client: Client, now: float = 0.0) -> Produced | End | None:
        """What ``client``'s rank should receive next, or ``None`` when it must wait."""
        want = self.ranks[client.rank].next
        if self.buffer and self.buffer[0].step <= want <= self.produced:
            return self.buffer[want - self.buffer[0].step]
        if self.ended_at is not None and want > self.ended_at:
            return End(self.ended_at)
        return None

    def part_for(self, client: Client) -> int:
        return client.rank

    def state_for(self, item: Produced) -> bytes | str:
        return item.state_wire

    def ready(self, client: Client) -> tuple[int, float, bool]:
        """Steps ``client``'s rank could take now, when the first of them was produced, and whether
        no more can come before an ack (the stream ended or failed, or the window is full)."""
        want = self.ranks[client.rank].next
        n = self.produced - want + 1 if self.buffer and self.buffer[0].step <= want else 0
        oldest = self.buffer[want - self.buffer[0].step].produced_at if n > 0 else 0.0
        floor = min(s.acked for s in self.ranks)
        final = self.ended_at is not None or self.error is not None or self.produced - floor >= self.window
        return max(0, n), oldest, final

    def sent(self, client: Client, item: Produced) -> None:
        self.ranks[client.rank].next = item.step + 1

    def giveback(self, client: Client, item: Produced) -> None:
        """The rank's next step goes back to ``item``'s."""
        slot = self.ranks[client.rank]
        slot.next = min(slot.next, item.step)

    @property
    def depth(self) -> int:
        return len(self.buffer)

    def close(self) -> None:
        self.producer.close()
        self.buffer.clear()
