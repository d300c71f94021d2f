"""Shared mode: a work queue of whole global batches for inference or asynchronous consumers.

Any client takes the next batch; a client *acks* a batch when it asks for the one after it (or
closes cleanly). Every batch sent is *leased* to its client for ``lease`` seconds: the batches a
client holds unacked are re-delivered to others, oldest first, when it disappears (heartbeat
timeout, or a new connection of its process) or when their lease runs out (a consumer that is
alive but stuck). Delivery is therefore at-least-once: a batch whose lease expired may be
processed twice, by its slow first consumer and by the next one. A late ack of an expired lease
is ignored.

The resume state handed out with each batch is the *watermark*: the state after the highest step
``h`` such that steps ``1..h`` are all acked. Restarting a shared stream from it re-delivers the
batches after ``h`` that were already acked (at-least-once across a server restart).
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
from feedline._service.protocol import pack_state
from feedline._state import make_state

if TYPE_CHECKING:
    from feedline._service.session import Client

log = logging.getLogger("feedline.service")

__all__ = ["Lease", "SharedQueue"]


@dataclass(eq=False, slots=True)
class Lease:
    """One batch in flight to one client, until ``deadline`` (monotonic seconds)."""

    item: Produced
    client: bytes
    deadline: float


class SharedQueue:
    """The work queue of one stream in shared mode (a :class:`~.delivery.Delivery`).

    It pre-produces at most ``window`` batches plus the (server-capped) prefetch of its clients.
    """

    def __init__(self, stream: str, pipeline: Pipeline, start: Mapping[str, Any] | None, *,
                 window: int, wake: Callable[[], None], initial: Mapping[str, Any] | None = None,
                 lease: float = 60.0) -> None:
        self.stream = stream
        self.spec_hash = pipeline.spec.hash()
        self.window = window
        self.lease = lease
        self.producer = Producer(pipeline, world_size=1, start=start, depth=2, wake=wake, initial=initial,
                                 name=f"feedline-{stream}-shared")
        first = self.producer.initial_state()
        self.watermark = int(first["step"])
        self.watermark_wire = pack_state(make_state(self.spec_hash, first, 1))
        self.fresh: deque[Produced] = deque()
        self.redeliver: deque[Produced] = deque()
        self.inflight: dict[bytes, dict[int, Lease]] = {}
        self.leases: deque[Lease] = deque()   # in the order taken, so deadlines are ascending
        self.held: dict[int, Produced] = {}   # produced and not yet below the watermark
        self.acked: set[int] = set()          # acked steps above the watermark
        self.ended_at: int | None = None
        self.error: BaseException | None = None
        self.stall_reason: str | None = None   # a shared queue never stalls on a peer
        self.redelivered = 0
        self.lease_expired = 0
        self.budget = window     # batches held at most: window + the members' prefetch
        self.idle_since = time.monotonic()
        self.producer.start()

    # ------------------------------------------------------------- production
    def join(self, client: Client) -> None:
        self.budget += client.prefetch

    def pump(self, now: float) -> None:
        """Expire leases, then produce while fewer than ``budget`` batches are held."""
        for ident, n in self.expire(now).items():
            log.warning("stream %r: client %s held %d batches unacked for over %gs (lease); re-queued for others",
                        self.stream, ident.hex(), n, self.lease)
        while self.ended_at is None and self.error is None and len(self.held) < self.budget:
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

    def take(self, client: Client, now: float) -> Produced | End | None:
        """The next batch for ``client`` (now leased to it), ``End``, or ``None`` to wait."""
        queue = self.redeliver if self.redeliver else self.fresh
        if queue:
            item = queue.popleft()
            lease = Lease(item, client.ident, now + self.lease)
            self.inflight.setdefault(client.ident, {})[item.step] = lease
            self.leases.append(lease)
            return item
        if self.ended_at is not None and not any(self.inflight.values()):
            return End(self.ended_at)
        return None

    def part_for(self, client: Client) -> int:
        return 0   # whole global batches

    def state_for(self, item: Produced) -> bytes | str:
        return self.watermark_wire

    def sent(self, client: Client, item: Produced) -> None:
        """Nothing to do: the lease started at :meth:`take`."""

    def giveback(self, client: Client, item: Produced) -> None:
        """Undo a :meth:`take` whose send failed."""
        self.inflight.get(client.ident, {}).pop(item.step, None)
        self.redeliver.appendleft(item)

    def expire(self, now: float) -> dict[bytes, int]:
        """Re-queue (oldest first) the batches whose lease ran out; returns how many, per client."""
        expired: list[Lease] = []
        while self.leases and self.leases[0].deadline <= now:
            lease = self.leases.popleft()
            held = self.inflight.get(lease.client, {})
            if held.get(lease.item.step) is lease:
                del held[lease.item.step]
                expired.append(lease)
        for lease in sorted(expired, key=lambda x: x.item.step, reverse=True):
            self.redeliver.appendleft(lease.item)
        self.lease_expired += len(expired)
        self.redelivered += len(expired)
        counts: dict[bytes, int] = {}
        for lease in expired:
            counts[lease.client] = counts.get(lease.client, 0) + 1
        return counts

    def ack(self, client: Client, step: int) -> None:
        if self.inflight.get(client.ident, {}).pop(step, None) is None:
            return   # not in flight to this client (its lease expired): the re-delivery's ack counts
        self.acked.add(step)
        while self.watermark + 1 in self.acked:
            self.watermark += 1
            self.acked.discard(self.watermark)
            item = self.held.pop(self.watermark)
            self.watermark_wire = item.state_wire

    def release(self, client: Client) -> int:
        """Put a departed client's unacked batches back at the front of the queue; returns how many."""
        self.budget -= client.prefetch
        items = sorted((lease.item for lease in self.inflight.pop(client.ident, {}).values()),
                       key=lambda p: p.step, reverse=True)
        for item in items:
            self.redeliver.appendleft(item)
        self.redelivered += len(items)
        if not self.inflight:
            self.idle_since = time.monotonic()
        return len(items)

    @property
    def in_flight(self) -> int:
        return sum(len(v) for v in self.inflight.values())

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
        self.leases.clear()
