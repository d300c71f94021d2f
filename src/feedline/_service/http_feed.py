"""One stream's shared-mode connection from the HTTP gateway to its server: :class:`StreamFeed`.

    feed = StreamFeed(address, "train", keys=None, prefetch=4, timeout=30.0, hold=30.0)
    d = feed.take()            # on feed.executor's one thread: the next batch (None once ended)
    feed.ack(d)                # its response was written: ack it (grants the next credit)
    feed.giveback(d)           # or: it could not be written, the next take returns it
    settle = feed.unsettled(d) # after ack: settle(False) if the client did not read it all (resent)
    feed.await_ack(d, 30.0)    # or, asked by the client: resent unless client_ack(d.step) comes in time
    feed.release_stale()       # periodically: give back to the server what no GET took in time

The gateway holds up to ``prefetch`` batches it has not served, each leased to it by the server.
Lease time runs while no client asks, so a feed never holds one longer than ``hold`` seconds
(half the server's lease): once the oldest batch it holds may be that old and no batch is being
served, it says bye (the server re-queues what it held, in order) and the next GET reconnects.
A batch's age counts from the grant of the credit it came on (its lease began no earlier), and a
batch given back keeps it (:attr:`Delivery.granted`). Each step therefore goes to exactly one GET
however long the pauses between GETs, hung-up clients included.

A response written is not yet a response read: the client may reset the connection with most of
it unread. So a written batch is acked to the server at once (its credit and lease are not held
by a slow client) but kept here, *unsettled*, until its connection shows the client read it (the
next request, or a clean close): if the connection is reset first, the batch is *resent*: the
next ``take`` returns it, before anything new. In the opt-in at-least-once mode the batch is kept
until the client acks its step (:meth:`StreamFeed.client_ack`), and resent when no ack comes
within its time. A resent batch lives only in the gateway (the server's watermark has passed
it): a ``kill -9`` of the process loses it.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice

import numpy as np

from feedline._service.auth import ClientKeys
from feedline._service.connection import Connection, Delivered, Ended, Failed, Item, Welcome
from feedline._service.protocol import PROTOCOL_VERSION, state_as_json
from feedline.errors import TransportError

__all__ = ["Delivery", "StreamFeed"]

log = logging.getLogger("feedline.service.http")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One batch taken from the server: its step, the state JSON after it, its arrays, and when the
    credit it came on was granted (monotonic seconds: its lease on the server began no earlier)."""

    step: int
    state_json: str
    arrays: Mapping[str, np.ndarray]
    granted: float
    acked: bool = False   # the server has its ack already (a batch being resent)


class StreamFeed:
    """One stream's shared-mode connection to the server: ``take`` a batch, ``ack`` or ``giveback`` it.

    :meth:`take`, :meth:`state` and :meth:`release_stale` run on :attr:`executor`'s single thread,
    which serialises them: no batch is taken twice. :meth:`ack` and :meth:`giveback` may come from
    any thread (the connection's caller socket is guarded by a lock).
    """

    def __init__(self, address: str, stream: str, *, keys: ClientKeys | None, prefetch: int, timeout: float,
                 hold: float = 30.0) -> None:
        self.address, self.stream = address, stream
        self.keys, self.prefetch, self.timeout, self.hold = keys, prefetch, timeout, hold
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"feedline-http-{stream}")
        self.state_json: str | None = None
        self.ended_at: int | None = None
        self.served = 0
        self.returned = 0
        self.released = 0   # times the held batches went back to the server after a pause
        self.resent = 0     # written responses the client did not read (reset, or no ack in time)
        self._resend: deque[Delivery] = deque()         # acked to the server, to be written again
        self._awaiting: dict[int, tuple[Delivery, float]] = {}   # step -> (batch, deadline) for a client ack
        self._unsettled = 0                              # written, its connection not yet settled
        self._conn: Connection | None = None
        self._redo: deque[Delivery] = deque()
        self._granted: deque[float] = deque()   # when each credit not yet used was granted, oldest first
        self._serving = 0                        # taken and neither acked nor given back
        self._lock = threading.Lock()

    def _connect(self) -> Connection:
        with self._lock:
            if self._conn is None:
                hello = {"v": PROTOCOL_VERSION, "stream": self.stream, "mode": "shared", "rank": 0, "world_size": 1,
                         "prefetch": self.prefetch, "session": secrets.token_hex(8), "spec_hash": None}
                self._conn = Connection(self.address, hello=hello, resume=None, prefetch=self.prefetch,
                                        keys=self.keys, timeout=self.timeout, reconnect=max(60.0, self.timeout),
                                        max_message=1 << 30)
                self._granted = deque([time.monotonic()] * self.prefetch)
                self._conn.start()
            return self._conn

    def _next_item(self) -> Item | None:
        """The connection's next item, or ``None`` after a short wait (so given-back batches are seen)."""
        return self._connect().next_item(timeout=0.05)

    def take(self) -> Delivery | None:
        """The next batch (a given-back one first), or ``None`` once the stream has ended."""
        settle_by = None
        while True:
            with self._lock:
                self._expire()
                queue = self._resend or self._redo
                if queue:
                    self._serving += 1
                    return queue.popleft()
                settling = self._unsettled or self._awaiting
            if self.ended_at is not None:
                # the end waits for the written batches that may yet be resent (at most ``hold`` seconds:
                # one resent later still goes to the next GET)
                settle_by = settle_by or time.monotonic() + self.hold
                if not settling or time.monotonic() >= settle_by:
                    return None
                time.sleep(0.02)
                continue
            item = self._next_item()
            if item is None:
                continue
            if isinstance(item, Welcome):
                self.state_json = self.state_json or state_as_json(item.state)
            elif isinstance(item, Delivered):
                self.state_json = state_as_json(item.state)
                with self._lock:
                    self._serving += 1
                    granted = self._granted.popleft() if self._granted else time.monotonic()
                return Delivery(item.step, self.state_json, item.arrays, granted)
            elif isinstance(item, Ended):
                self.ended_at = int(item.step or 0)
            else:
                raise item.error

    def ack(self, delivery: Delivery) -> None:
        """The batch was written to its client: ack it (and ask the server for another), unless it
        is a resent one, acked already.

        Safe from any thread (while :meth:`take` waits for the credit this grants).
        """
        with self._lock:
            self.served += 1
            self._serving -= 1
            if self._conn is not None and not delivery.acked:
                self._conn.consumed(delivery.step)
                self._granted.append(time.monotonic())

    def unsettled(self, delivery: Delivery, *, awaits_ack: bool = False) -> Callable[[bool], None]:
        """After :meth:`ack` (and :meth:`await_ack` when ``awaits_ack``): the batch waits for its
        connection to settle; call the function returned with ``True`` (the client read it) or
        ``False`` (it did not: resend it, unless its client acked it already). Any thread; once."""
        with self._lock:
            self._unsettled += 1
        done = False

        def settle(read: bool) -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
                self._unsettled -= 1
                if not read and (not awaits_ack or self._awaiting.pop(delivery.step, None) is not None):
                    self._resend_locked(delivery)
        return settle

    def await_ack(self, delivery: Delivery, within: float) -> None:
        """After :meth:`ack`: keep the batch until :meth:`client_ack` of its step, and resend it if
        none comes within ``within`` seconds (the opt-in at-least-once mode). Any thread."""
        with self._lock:
            self._awaiting[delivery.step] = (delivery, time.monotonic() + within)

    def client_ack(self, step: int) -> bool:
        """The client read ``step`` in full; ``False`` when it was not awaiting an ack (acked twice,
        never asked for, or resent already after its time ran out). Any thread."""
        with self._lock:
            return self._awaiting.pop(step, None) is not None

    def _expire(self) -> None:
        """Resend each batch whose client ack is overdue (the lock held)."""
        now = time.monotonic()
        for step, (d, deadline) in list(self._awaiting.items()):
            if now >= deadline:
                del self._awaiting[step]
                self._resend_locked(d)

    def _resend_locked(self, delivery: Delivery) -> None:
        self.resent += 1
        self._resend.append(dataclasses.replace(delivery, acked=True))

    def giveback(self, delivery: Delivery) -> None:
        """A batch whose response could not be written: the next ``take`` returns it (its age kept,
        for :meth:`release_stale`). Any thread."""
        with self._lock:
            self.returned += 1
            self._serving -= 1
            self._redo.appendleft(delivery)

    def release_stale(self) -> bool:
        """Give every held batch back to the server when the oldest (a given-back one included) may
        have waited ``hold`` seconds for a GET (its lease would run out here, and the server would
        send it again); returns whether it did. Runs on :attr:`executor`, between takes."""
        with self._lock:
            self._expire()
            conn, oldest = self._conn, min([*(d.granted for d in self._redo), *islice(self._granted, 1)], default=None)
            if conn is None or self._serving or oldest is None or self.ended_at is not None \
                    or time.monotonic() - oldest < self.hold:
                return False
            self._conn = None
            self._redo.clear()   # in flight to the closed connection: the server re-queues them
            self._granted.clear()
            self.released += 1
        conn.close()
        log.info("stream %r: no GET for %.0fs; the gateway's held batches went back to the server", self.stream,
                 self.hold)
        return True

    def state(self) -> str:
        """The stream's state JSON (the watermark after the last batch received)."""
        while self.state_json is None:
            item = self._next_item()
            if item is None:
                continue
            if isinstance(item, Welcome):
                self.state_json = state_as_json(item.state)
            elif isinstance(item, Failed):
                raise item.error
            else:  # cannot happen: the welcome comes first
                raise TransportError(f"expected a welcome from the server, got {type(item).__name__}")
        return self.state_json

    def close(self) -> None:
        """Say bye without acking what is held (the server re-queues it). Idempotent."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
