"""The service's protocol logic, apart from sockets: who is connected, what each receives next.

    >>> d = Dispatcher(load_streams("train.yaml"), ServerOptions(), InProcTransport())  # doctest: +SKIP
    >>> d.receive(b"peer", [pack("hello", v=1, rank=0, world_size=1)], now=0.0)  # doctest: +SKIP
    >>> d.dispatch(now=0.1)     # moves produced steps in, sends what credit allows  # doctest: +SKIP
    >>> d.tick(now=1.0)         # timeouts, idle cursors, stall reports  # doctest: +SKIP

The :class:`~.server.Server` owns the ROUTER socket and the event loop and hands every inbound
message to :meth:`Dispatcher.receive`; everything goes out through a :mod:`.transport`. Both
delivery modes are driven through one interface (:class:`~.delivery.Delivery`): a ranked client
sits on a :class:`~.ranked.RankedCursor` chosen by rank and step, a shared client on its
stream's :class:`~.shared.SharedQueue`. Any exception while handling one message becomes an
``error`` reply to that peer, so one peer never affects the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from feedline._core import notices
from feedline._pipeline import Pipeline
from feedline._service.delivery import Delivery
from feedline._service.metrics import StreamCounters
from feedline._service.options import ServerOptions
from feedline._service.producer import End, Produced
from feedline._service.protocol import (
    BYE_REPLACED,
    BYE_SHUTDOWN,
    BYE_UNKNOWN,
    CLIENT_OPS,
    PROTOCOL_VERSION,
    encode_batch,
    encode_batches,
    error_fields,
    pack,
    state_as_json,
    unpack_header,
)
from feedline._service.ranked import RankedCursor
from feedline._service.session import MAX_PREFETCH, Client, validate_hello
from feedline._service.shared import SharedQueue
from feedline._service.transport import Transport
from feedline._service.trust import stream_limits
from feedline._state import state_json as state_json_of
from feedline.errors import FeedlineError, ProtocolError, SpecError, TransportError

__all__ = ["Dispatcher"]

log = logging.getLogger("feedline.service")
#: Payloads from this size are sent zero-copy. A smaller one is copied by ZeroMQ outside the GIL,
#: which costs less than tracking a zero-copy frame: pyzmq's collector thread takes the GIL once per
#: frame to release it (with compact batches most payloads are ~65 KB; measured 12.6 vs 11.7 M tok/s).
ZERO_COPY_FROM = 1 << 20
#: How long a send may wait to gather ``options.coalesce`` steps (up to the client's credit) when
#: fewer are ready, from the production of the first: every message costs both sides a fixed amount
#: (a wake-up, a poll, three frames, a header), which caps a fast pipeline when paid per step.
HOLD_S = 0.002
_STALL_LOG_AFTER = 3.0    # seconds a ranked window must be stalled before it is logged
_STALL_LOG_EVERY = 60.0   # and then how often while it lasts


class Dispatcher:
    """Clients, cursors and queues of one server; see the module docstring.

    Args:
        streams: the pipelines by stream name.
        options: limits and timeouts (``bind``/``keys`` are the server's business).
        transport: where messages go.
        initial: each stream's start state (computed once by the server).
        wake: called by producer threads after each produced step.
        stats: builds the snapshot a ``stats`` request is answered with (the server's).
        resume: start states of the streams' shared-mode queues (``serve --state``), used by the
            first queue of each stream unless its first hello names a state.
    """

    def __init__(self, streams: Mapping[str, Pipeline], options: ServerOptions, transport: Transport, *,
                 initial: Mapping[str, dict[str, Any]], wake: Callable[[], None] = lambda: None,
                 stats: Callable[[], dict[str, Any]] | None = None,
                 resume: Mapping[str, dict[str, Any]] | None = None) -> None:
        if not streams:
            raise SpecError("a server needs at least one stream")
        self.streams, self.options, self.transport = dict(streams), options, transport
        self.initial, self.wake = dict(initial), wake
        self.hashes = {name: p.spec.hash() for name, p in self.streams.items()}
        self.shapes = {name: stream_limits(p.spec) for name, p in self.streams.items()}   # a welcome's "batch"
        self.counters = {name: StreamCounters() for name in self.streams}
        self.clients: dict[bytes, Client] = {}
        self.cursors: dict[tuple[str, int], list[RankedCursor]] = {}
        self.queues: dict[str, SharedQueue] = {}
        self.stopping, self.malformed, self.internal_errors = False, 0, 0
        self.stats = stats or (lambda: {})
        self.resume = dict(resume or {})
        self.due: float | None = None   # when a held send is due (monotonic; None: none): the loop dispatches by then

    # ---------------------------------------------------------------- inbound
    def receive(self, ident: bytes, frames: Sequence[Any], now: float | None = None) -> None:
        """Handle one inbound message (its frames after the routing id)."""
        now = time.monotonic() if now is None else now
        op = "?"
        try:
            if len(frames) != 1:
                raise ProtocolError(f"expected one header frame, got {len(frames)}")
            frame = frames[0]
            header = unpack_header(frame.buffer if hasattr(frame, "buffer") else frame, self.options.max_message)
            op = str(header["op"])[:20]
            self._handle(ident, header, now)
        except FeedlineError as e:
            self._reject(ident, e)
        except Exception as e:  # a bug or an input nobody foresaw: that peer gets an error, others go on
            self.internal_errors += 1
            log.exception("client %s: handling %r failed", ident.hex(), op)
            self._reject(ident, TransportError(f"the server failed to handle {op!r}: {type(e).__name__}: {e}"))

    def _reject(self, ident: bytes, e: FeedlineError) -> None:
        self.malformed += isinstance(e, ProtocolError)
        if self.malformed <= 5 or self.malformed % 1000 == 0 or not isinstance(e, ProtocolError):
            log.warning("client %s: %.300s (%d malformed messages so far)", ident.hex(), e, self.malformed)
        self.transport.send(ident, [pack("error", **error_fields(e))])

    def _handle(self, ident: bytes, h: dict[str, Any], now: float) -> None:
        op = h["op"]
        if op not in CLIENT_OPS:
            raise ProtocolError(f"unknown op {op!r:.40}; expected one of {sorted(CLIENT_OPS)}")
        if (client := self.clients.get(ident)) is not None:
            client.last_seen = now
        if op == "ping" and client is not None:
            # a stalled stream (a full window, a silent worker) says why, so a waiting client can tell its user
            # (its own stream's notices only: another stream's silent worker is not why this one waits)
            why = client.delivery.stall_reason or notices.current(client.stream)
            self.transport.send(ident, [pack("pong", stall=why) if why else pack("pong")])
        elif op == "stats":
            self.transport.send(ident, [pack("stats", stats=self.stats())])
        elif op == "hello":
            self._hello(ident, h, now)
        elif client is None:
            if op != "bye":  # e.g. a client of a previous server process: it must say hello again
                self.transport.send(ident, [pack("bye", code=BYE_UNKNOWN, reason="unknown client; send hello first")])
        elif op == "credit":
            self._credit(client, h)
        elif op == "returned" and isinstance(client.delivery, SharedQueue):   # the answer to a revoke
            client.delivery.returned(client, h.get("steps"))   # no credit back: they go to a waiting client
        elif op == "returned":
            raise ProtocolError("returned: only a shared-mode client gives batches back")
        elif op == "bye":
            self.drop(client, "said bye")

    # ---------------------------------------------------------------- clients
    def _hello(self, ident: bytes, h: Mapping[str, Any], now: float) -> None:
        if self.stopping:
            raise ProtocolError("the server is shutting down; reconnect to its successor")
        if ident in self.clients:
            self.drop(self.clients[ident], "sent a new hello")
        hello = validate_hello(h, self.streams, self.hashes)
        name, w = hello.stream, hello.world_size
        delivery: Delivery
        if hello.mode == "shared":
            delivery = q = self._queue_for(name, hello.state)
            state_json = state_as_json(q.watermark_wire)
        else:
            step = int(hello.state["step"]) + 1 if hello.state else 1
            cursor = self._cursor_for(name, w, hello.rank, hello.session, step, hello.state)
            old = cursor.attach(hello.rank, ident, hello.session, step)
            if old is not None and old in self.clients:
                self._replace(self.clients[old])
            delivery = cursor
            state_json = state_json_of(self.hashes[name], hello.state or self.initial[name], w)
        client = Client(ident=ident, stream=name, mode=hello.mode, rank=hello.rank, world_size=w, delivery=delivery,
                        prefetch=min(hello.prefetch, self.options.max_prefetch), last_seen=now,
                        revocable=hello.revocable)
        self.clients[ident] = client
        delivery.join(client)
        # What the client can hold unacked: its capped prefetch, and in ranked mode no more than the
        # window the cursor produces ahead of the last ack (a client acking in larger groups would
        # wait for batches that are only produced after its ack).
        in_flight = client.prefetch if hello.mode == "shared" else min(client.prefetch, self.options.window)
        self.transport.send(ident, [pack("welcome", v=PROTOCOL_VERSION, stream=name, spec_hash=self.hashes[name],
                                         state=state_json, heartbeat=self.options.heartbeat,
                                         timeout=self.options.timeout, prefetch=in_flight, batch=self.shapes[name])])
        role = "shared" if hello.mode == "shared" else f"rank {hello.rank}/{hello.world_size}"
        log.info("client %s joined stream %r as %s", ident.hex(), name, role)

    def _queue_for(self, name: str, start: Mapping[str, Any] | None) -> SharedQueue:
        q = self.queues.get(name)
        if q is None or (q.ended_at is not None and not q.in_flight and not self.members(q)):
            if q is not None:
                q.close()
            saved = self.resume.pop(name, None)
            start = start if start is not None else saved
            q = SharedQueue(name, self.streams[name], start, window=self.options.window, wake=self.wake,
                            initial=self.initial[name], lease=self.options.lease)
            self.queues[name] = q
        return q

    def _cursor_for(self, name: str, w: int, rank: int, session: str, step: int,
                    start: Mapping[str, Any] | None) -> RankedCursor:
        """The cursor a rank joins: one where it fits, else the one whose rank it takes over, else a new one.

        A hello for a rank that another session holds (a trainer restarted from a checkpoint while
        its old connection still looks alive) *replaces* that holder, and its cursor when nobody
        else uses it, instead of adding a cursor: a crash-looping trainer cannot leak cursors.
        """
        cursors = self.cursors.setdefault((name, w), [])
        for c in cursors:
            if not c.taken_by_other(rank, session) and c.can_join(step):
                return c
        for c in cursors:
            if not c.taken_by_other(rank, session) and c.can_rewind(step):
                c.rewind(start)
                return c
        for c in cursors:
            if c.taken_by_other(rank, session):
                holder = c.ranks[rank].client
                if holder is not None and holder in self.clients:
                    self._replace(self.clients[holder])
                if c.can_join(step):
                    return c
                if c.can_rewind(step) or not c.clients():
                    c.rewind(start)   # nobody else reads it: restart it where the new hello starts
                    return c
        self._make_room(name)
        c = RankedCursor(name, self.streams[name], w, start, window=self.options.window, wake=self.wake,
                         initial=self.initial[name])
        cursors.append(c)
        return c

    def _replace(self, old: Client) -> None:
        self.transport.send(old.ident, [pack("bye", code=BYE_REPLACED, reason="replaced by a new connection of this rank")])
        self.drop(old, f"was replaced by a new connection of rank {old.rank}")

    def _make_room(self, name: str) -> None:
        """Close the longest-idle cursors of stream ``name`` until a new one fits under ``max_cursors``."""
        mine = [(key, c) for key, cs in self.cursors.items() if key[0] == name for c in cs]
        idle = sorted(((c.idle_since, key, c) for key, c in mine if not c.clients()), key=lambda t: t[0])
        excess = len(mine) + 1 - self.options.max_cursors
        for _since, key, c in idle[:max(0, excess)]:
            self._close_cursor(key, c, "to make room for a new job")
        if excess > len(idle):
            raise TransportError(
                f"stream {name!r} already has {self.options.max_cursors} cursors with connected clients "
                "(one per training job and world size); stop a job or start the server with a higher --max-cursors")

    def _close_cursor(self, key: tuple[str, int], c: RankedCursor, why: str) -> None:
        c.close()
        self.cursors[key].remove(c)
        log.info("closed the cursor of stream %r (world size %d) at step %d %s", key[0], key[1], c.low, why)

    def members(self, delivery: Delivery) -> list[Client]:
        return [c for c in self.clients.values() if c.delivery is delivery]

    def _credit(self, client: Client, h: Mapping[str, Any]) -> None:
        n, step = h.get("n", 0), h.get("step")
        if not isinstance(n, int) or not 0 <= n <= MAX_PREFETCH:
            raise ProtocolError(f"credit n={n!r:.20} must be an integer in [0, {MAX_PREFETCH}]")
        if step is not None:
            if not isinstance(step, int):
                raise ProtocolError(f"credit step={step!r:.20} must be an integer")
            client.delivery.ack(client, step)
            client.acked = max(client.acked, step)
        client.credit = min(client.credit + n, client.prefetch)   # the server's cap, not the client's wish

    def drop(self, client: Client, why: str) -> None:
        self.clients.pop(client.ident, None)
        n = client.delivery.release(client)
        if n:
            log.warning("client %s %s; %d unacked batches re-queued", client.ident.hex(), why, n)
        log.info("client %s %s", client.ident.hex(), why)

    # --------------------------------------------------------------- sending
    def deliveries(self) -> list[Delivery]:
        return [*(c for cs in self.cursors.values() for c in cs), *self.queues.values()]

    def dispatch(self, now: float | None = None) -> None:
        """Move produced steps into every delivery and send each client what its credit allows."""
        now = time.monotonic() if now is None else now
        self.drop_gone()
        for d in self.deliveries():
            d.pump(now)
        self.due = None
        for client in list(self.clients.values()):
            while client.credit > 0 and not client.ended and not client.unreachable and client.ident in self.clients:
                if not self._send_ready(client, now):
                    break

    def _hold(self, client: Client) -> bool:
        """Whether ``client``'s next send waits for more steps (``options.coalesce``, :data:`HOLD_S`).

        Never for a client's first batches, a credit of one, a delivery that cannot produce more
        until something is acked (ended, failed, or a full window), or once :data:`HOLD_S` passed
        since the oldest ready step was produced; the loop is told when that is (:attr:`due`).
        """
        want = min(client.credit, self.options.coalesce)
        if want <= 1 or client.sent == 0:
            return False
        ready, oldest, final = client.delivery.ready(client)
        if not ready or ready >= want or final:
            return False
        due = oldest + HOLD_S
        if time.monotonic() >= due:
            return False
        self.due = due if self.due is None else min(self.due, due)
        return True

    def _send_ready(self, client: Client, now: float) -> bool:
        """Send ``client`` the ready steps its credit allows (``options.coalesce`` at most) as one
        message, or the end or error that follows them; True when a full message left (more may)."""
        if self._hold(client):
            return False
        d = client.delivery
        items: list[Produced] = []
        last: Produced | End | None = None
        while len(items) < client.credit and len(items) < self.options.coalesce:
            last = d.take(client, now)
            if not isinstance(last, Produced):
                break
            d.sent(client, last)   # the next take gives the step after it (undone by giveback)
            items.append(last)
        if items and not self._send_items(client, items):
            return False
        if isinstance(last, End):
            client.ended = self.transport.send(client.ident, [pack("end", step=last.step)]) is not False
        elif last is None and d.error is not None:
            self.transport.send(client.ident, [pack("error", **error_fields(d.error))])
            client.ended = True
        return isinstance(last, Produced)

    def _send_items(self, client: Client, items: list[Produced]) -> bool:
        """One ``batch`` (or ``batches``) message of ``items``; False when it could not leave."""
        d = client.delivery
        part = d.part_for(client)
        if len(items) == 1:
            item = items[0]
            header, payload = encode_batch(item.slices[part], step=item.step, state=d.state_for(item))
        else:
            header, payload = encode_batches([(x.slices[part], x.step, d.state_for(x)) for x in items])
        sent = self.transport.send(client.ident, [header, payload], copy=len(payload) < ZERO_COPY_FROM)
        if sent is not True:
            for item in reversed(items):
                d.giveback(client, item)
            if sent is None:   # dropped at the next dispatch: its last acks and bye may be waiting to be read
                client.unreachable = True
            return False
        client.credit -= len(items)
        client.sent += len(items)
        counters = self.counters[client.stream]
        counters.steps = max(counters.steps, items[-1].step)
        counters.last_state = items[-1].state
        now = time.monotonic()
        share = len(payload) // len(items)
        for item in items:
            counters.record(item.slice_rows[part], item.slice_tokens[part], item.slice_slots[part], share,
                            now - item.produced_at)
        return True

    # --------------------------------------------------------------- periodic
    def tick(self, now: float | None = None) -> None:
        """Drop silent clients, report stalled windows, close idle cursors (once a second)."""
        now = time.monotonic() if now is None else now
        o = self.options
        for client in list(self.clients.values()):
            if now - client.last_seen > o.timeout:
                self.drop(client, f"was silent for {now - client.last_seen:.1f}s")
        for q in self.queues.values():   # at a shared stream's end: prefetched batches to the waiting clients
            for ident, steps in q.revocable(now, self.members(q)).items():
                self.transport.send(ident, [pack("revoke", steps=steps)])
        for key, cursors in self.cursors.items():
            for c in cursors:
                why = c.stall(now)
                if why and c.stalled_since is not None and now - c.stalled_since >= _STALL_LOG_AFTER \
                        and now - c.stall_reported >= _STALL_LOG_EVERY:
                    c.stall_reported = now
                    log.warning("%s", why)
            for c in [c for c in cursors if not c.clients() and now - c.idle_since > o.idle_close]:
                self._close_cursor(key, c, f"after {o.idle_close:.0f}s without clients")

    def drop_gone(self) -> None:
        """Drop the clients a send found gone (at the last dispatch): what they sent before they went
        (their last acks, their bye) has been read since."""
        for client in [c for c in self.clients.values() if c.unreachable]:
            self.drop(client, "is unreachable")

    def drained(self) -> bool:
        """No shared-mode batch is in flight (what a stopping server waits for)."""
        return not any(q.in_flight for q in self.queues.values())

    def say_goodbye(self) -> None:
        for ident in list(self.clients):
            self.transport.send(ident, [pack("bye", code=BYE_SHUTDOWN, reason="server shutting down")])

    def close(self) -> None:
        """Stop every producer. Idempotent."""
        for d in self.deliveries():
            d.close()
        self.cursors.clear()
        self.queues.clear()
