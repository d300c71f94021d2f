"""Shared mode: a work queue of whole global batches for inference or asynchronous consumers.

Any client takes the next batch; a client *acks* a batch when it asks for the one after it (or
closes cleanly). Every batch sent is *leased* to its client for ``lease`` seconds: the batches a
client holds unacked are re-delivered to others, oldest first, when it disappears (heartbeat
timeout, or a new connection of its process) or when their lease runs out (a consumer that is
alive but stuck). Delivery is therefore at-least-once: a batch whose lease expired may be
processed twice, by its slow first consumer and by the next one. A late ack of an expired lease
counts while the batch still waits for re-delivery, and is ignored once it was re-sent.

At the stream's end a client that waits with nothing to take would otherwise wait for the
batches other clients hold, up to a whole lease when one of them is stuck. So once every batch is
produced and none is queued, a client that has held batches for :data:`REVOKE_AFTER_S` while
another waits is sent ``revoke`` with their steps; it gives back, with ``returned``, those still
queued in its connection (never one handed to its caller), and they go to the waiting client at
once: each still goes to exactly one client. The batch a stuck client is working on stays leased
to it (its lease is what bounds the wait for it). Only clients whose hello says they answer
``revoke`` are asked.

The resume state handed out with each batch is the *watermark*: the state after the highest step
``h`` such that steps ``1..h`` are all acked. Restarting a shared stream from it re-delivers the
batches after ``h`` that were already acked (at-least-once across a server restart).

Memory is bounded by the batches *outstanding* (produced and not acked: queued or in flight), at
most ``window`` plus the members' prefetch: an acked batch is released at its ack, whatever its
lease, and of the acked steps above the watermark only the states the watermark may stop at are
kept (the last acked step of each run, one per gap). A batch stuck with one consumer therefore
holds one slot of the window, not the window: the others go on at full speed until its lease ends.
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

__all__ = ["REVOKE_AFTER_S", "Lease", "SharedQueue"]

#: A client holding batches this long (at most: an eighth of the lease) at the stream's end, while
#: another waits, is asked to give back those it has not handed on.
REVOKE_AFTER_S = 1.0


@dataclass(eq=False, slots=True)
class Lease:
    """One batch in flight to one client, until ``deadline`` (monotonic seconds); ``item`` is
    ``None`` once the lease is over (acked, expired, given back or released)."""

    step: int
    item: Produced | None
    client: bytes
    deadline: float
    revoked: bool = False   # asked back once (at the stream's end), answered or not


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
                                 name=f"feedline-{stream}-shared", stream=stream)
        first = self.producer.initial_state()
        self.watermark = int(first["step"])
        self.watermark_wire = pack_state(make_state(self.spec_hash, first, 1))
        self.fresh: deque[Produced] = deque()
        self.redeliver: deque[Produced] = deque()
        self.inflight: dict[bytes, dict[int, Lease]] = {}
        self.leases: deque[Lease] = deque()   # in the order taken, so deadlines are ascending
        self.live = 0                         # leases not over (the rest of ``leases`` is compacted away)
        self.outstanding: dict[int, Produced] = {}   # produced and not acked: queued or in flight
        self.marks: dict[int, bytes | str] = {}      # states of acked steps the watermark may stop at
        self.last = self.watermark            # the last step produced
        self.ended_at: int | None = None
        self.error: BaseException | None = None
        self.stall_reason: str | None = None   # a shared queue never stalls on a peer
        self.redelivered = 0
        self.lease_expired = 0
        self.budget = window     # outstanding batches at most: window + the members' prefetch
        self.idle_since = time.monotonic()
        self.producer.start()

    # ------------------------------------------------------------- production
    def join(self, client: Client) -> None:
        self.budget += client.prefetch

    def pump(self, now: float) -> None:
        """Expire leases, then produce while fewer than ``budget`` batches are outstanding."""
        for ident, n in self.expire(now).items():
            log.warning("stream %r: client %s held %d batches unacked for over %gs (lease); re-queued for others",
                        self.stream, ident.hex(), n, self.lease)
        while self.ended_at is None and self.error is None and len(self.outstanding) < self.budget:
            item = self.producer.poll()
            if item is None:
                return
            if isinstance(item, Produced):
                self.fresh.append(item)
                self.outstanding[item.step] = item
                self.last = item.step
            elif isinstance(item, End):
                self.ended_at = item.step
            else:
                self.error = item

    def take(self, client: Client, now: float) -> Produced | End | None:
        """The next batch for ``client`` (now leased to it), ``End``, or ``None`` to wait."""
        queue = self.redeliver if self.redeliver else self.fresh
        if queue:
            item = queue.popleft()
            lease = Lease(item.step, item, client.ident, now + self.lease)
            self.inflight.setdefault(client.ident, {})[item.step] = lease
            self.leases.append(lease)
            self.live += 1
            return item
        if self.ended_at is not None and not self.live:
            return End(self.ended_at)
        return None

    def part_for(self, client: Client) -> int:
        return 0   # whole global batches

    def ready(self, client: Client) -> tuple[int, float, bool]:
        """Batches a client could take now, when the first was produced, and whether no more can come
        before an ack (the stream ended or failed, or the window of outstanding batches is full)."""
        queue = self.redeliver or self.fresh
        final = self.ended_at is not None or self.error is not None or len(self.outstanding) >= self.budget
        return len(self.redeliver) + len(self.fresh), queue[0].produced_at if queue else 0.0, final

    def state_for(self, item: Produced) -> bytes | str:
        return self.watermark_wire

    def sent(self, client: Client, item: Produced) -> None:
        """Nothing to do: the lease started at :meth:`take`."""

    def giveback(self, client: Client, item: Produced) -> None:
        """Undo a :meth:`take` whose send failed (several: the last taken first)."""
        lease = self.inflight.get(client.ident, {}).pop(item.step, None)
        if lease is not None:
            self._over(lease)
        self.redeliver.appendleft(item)

    def expire(self, now: float) -> dict[bytes, int]:
        """Re-queue (oldest first) the batches whose lease ran out; returns how many, per client."""
        expired: list[Produced] = []
        counts: dict[bytes, int] = {}
        while self.leases and self.leases[0].deadline <= now:
            lease = self.leases.popleft()
            if lease.item is None:
                continue   # over already
            del self.inflight[lease.client][lease.step]
            expired.append(lease.item)
            counts[lease.client] = counts.get(lease.client, 0) + 1
            self._over(lease)
        for item in sorted(expired, key=lambda x: x.step, reverse=True):
            self.redeliver.appendleft(item)
        self.lease_expired += len(expired)
        self.redelivered += len(expired)
        return counts

    def ack(self, client: Client, step: int) -> None:
        """``client`` consumed ``step``: release the batch now and move the watermark.

        A late ack (its lease expired) still counts while the batch waits for re-delivery (nobody
        else has it, so nobody processes it twice); once re-sent, the new holder's ack counts.
        """
        lease = self.inflight.get(client.ident, {}).pop(step, None)
        if lease is not None:
            item = lease.item
            self._over(lease)
        else:
            waiting = [i for i, x in enumerate(self.redeliver) if x.step == step]
            if not waiting:
                return
            item = self.redeliver[waiting[0]]
            del self.redeliver[waiting[0]]
        assert item is not None
        del self.outstanding[step]
        self.marks.pop(step - 1, None)   # its successor is acked: the watermark never stops there
        if step == self.last or step + 1 in self.outstanding:
            self.marks[step] = item.state_wire
        if step == self.watermark + 1:
            low = min(self.outstanding, default=self.last + 1) - 1
            self.watermark, self.watermark_wire = low, self.marks.pop(low)
            for s in [s for s in self.marks if s < low]:
                del self.marks[s]

    def revocable(self, now: float, members: list[Client]) -> dict[bytes, list[int]]:
        """At the stream's end (all produced, none queued), with a member waiting for a batch: per other
        member that answers ``revoke``, the steps it has held for :data:`REVOKE_AFTER_S` (at most an
        eighth of the lease), not asked back yet; each is asked once."""
        if self.ended_at is None or self.fresh or self.redeliver or not self.live:
            return {}
        waiting = {c.ident for c in members if c.credit > 0 and not c.ended}
        after = min(REVOKE_AFTER_S, self.lease / 8)
        out: dict[bytes, list[int]] = {}
        for c in members:
            if not c.revocable or not waiting - {c.ident}:
                continue
            leases = [x for x in self.inflight.get(c.ident, {}).values()
                      if x.item is not None and not x.revoked and now - (x.deadline - self.lease) >= after]
            for x in leases:
                x.revoked = True
            if leases:
                out[c.ident] = sorted(x.step for x in leases)
        return out

    def returned(self, client: Client, steps: Any) -> int:
        """``client`` gave back these revoked steps (still queued on its side): to the front of the
        queue, in order; returns how many. Its credit for them is not restored (nor on its side), so
        they go to a client that waits, not back to it.

        Raises:
            ProtocolError: ``steps`` is not a list of at most 1024 integers.
        """
        from feedline.errors import ProtocolError

        if not isinstance(steps, list) or len(steps) > 1024 or \
                not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
            raise ProtocolError(f"returned steps={str(steps)!r:.40} must be a list of at most 1024 integers")
        leases = self.inflight.get(client.ident, {})
        items = []
        for step in steps:
            lease = leases.get(step)
            if lease is not None and lease.revoked and lease.item is not None:
                del leases[step]
                items.append(lease.item)
                self._over(lease)
        for item in sorted(items, key=lambda x: x.step, reverse=True):
            self.redeliver.appendleft(item)
        self.redelivered += len(items)
        if items:
            log.info("stream %r: client %s gave back %d prefetched batches for the clients waiting at the end",
                     self.stream, client.ident.hex(), len(items))
        return len(items)

    def _over(self, lease: Lease) -> None:
        """A lease ended (its batch acked, re-queued or given back): drop its reference now."""
        lease.item = None
        self.live -= 1
        if len(self.leases) > 2 * self.live + 64:   # amortised: the deque never grows with throughput x lease
            self.leases = deque(x for x in self.leases if x.item is not None)

    def release(self, client: Client) -> int:
        """Put a departed client's unacked batches back at the front of the queue; returns how many."""
        self.budget -= client.prefetch
        leases = self.inflight.pop(client.ident, {}).values()
        items = sorted((lease.item for lease in leases if lease.item is not None), key=lambda p: p.step, reverse=True)
        for lease in leases:
            self._over(lease)
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
        return self.last

    @property
    def holding(self) -> int:
        """Batches this queue references: every outstanding one, none acked."""
        return len(self.outstanding)

    def close(self) -> None:
        self.producer.close()
        self.fresh.clear()
        self.redeliver.clear()
        self.leases.clear()
        self.outstanding.clear()
