"""The client's I/O thread: one connection to a server that survives the server's restarts.

    conn = Connection(address, hello={...}, resume=state, prefetch=8, ...)
    conn.start()
    item = conn.items.get()     # Welcome(state) | Delivered(step, state, arrays) | Ended(step) | Failed(error)
    # a Delivered state is as the batch carried it (msgpack bytes or JSON): protocol.unpack_state reads it
    conn.consumed(step)         # acks ``step`` and grants credit (ranked: prefetch // 2 at a time)

The caller's thread and the connection thread exchange small typed messages: items on
``conn.items``, and commands (:class:`Consumed`, :class:`Close`) on a queue whose arrival is
signalled through an in-process ZeroMQ pipe, so the thread's poller wakes for them.

The thread owns the DEALER socket: it sends the hello, grants credit (``prefetch`` minus what is
already queued locally, then one per consumed batch; in ranked mode ``prefetch // 2`` at a time, as
an ack covers the steps before it: half the messages and wake-ups on both sides; ``prefetch`` is
lowered to what the welcome says the server allows, so a group never exceeds what the server
sends unacked; a batch beyond the credit granted is a ``ProtocolError``, so what the client holds is
bounded by its ``prefetch``), checks the welcome and every batch (:mod:`.trust`), pings every
heartbeat (a pong may carry the server's reason for a stall), and when the server is silent for
``timeout`` (or says it is shutting down) it reconnects with exponential backoff, sending the
state after the last batch it *received*: batches already queued stay valid, so the caller sees
an unbroken stream. It gives up after ``reconnect`` seconds without a server.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from feedline._service.auth import ClientKeys
from feedline._service.handshake import MONITORED, HandshakeWatch
from feedline._service.items import Close, Consumed, Delivered, Ended, Failed, Item, Welcome
from feedline._service.protocol import (
    BYE_REPLACED,
    error_from_header,
    pack,
    split_batches,
    state_as_json,
    unpack_header,
)
from feedline._service.trust import BatchGuard, check_welcome
from feedline.errors import FeedlineError, ProtocolError, TransportError, TransportTimeout

log = logging.getLogger("feedline.service")

__all__ = ["Close", "Connection", "Consumed", "Delivered", "Ended", "Failed", "Item", "Welcome"]

#: A keyed client whose handshakes keep failing for this long (or its ``timeout``, if shorter) gives
#: up with ``AuthError`` (:mod:`.handshake`).
HANDSHAKE_BOUND_S = 5.0
_MIN_POLL_MS = 10   # the poller never spins, whatever a welcome said
#: How long a closing connection's last ack and ``bye`` may take to leave (at 0 they were lost: a step acked re-queued).
_LAST_WORDS_MS = 1000

_LIVE: weakref.WeakSet[Connection] = weakref.WeakSet()
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


@atexit.register
def _close_all() -> None:
    """Close connections a script never closed while their threads can still run (before finalization)."""
    for conn in list(_LIVE):
        conn.close(wait=1.0)


class Connection:
    """A reconnecting connection run by a daemon thread; see the module docstring.

    A connection left open when the interpreter exits is closed by an ``atexit`` hook (it says bye,
    so shared-mode batches are re-delivered at once); :meth:`close` never blocks for more than its
    ``wait``, even when the thread cannot stop.
    """

    def __init__(self, address: str, *, hello: Mapping[str, Any], resume: bytes | str | None, prefetch: int,
                 keys: ClientKeys | None, timeout: float, reconnect: float, max_message: int,
                 limits: Mapping[str, int | None] | None = None) -> None:
        self.address = address
        self.hello = {**hello, "revoke": True}   # it answers a shared queue's revoke (see _revoke)
        self.resume = resume          # the state after the last batch received (as it arrived)
        self.prefetch = prefetch
        self.keys = keys
        self.timeout = timeout
        self.reconnect = reconnect
        self.max_message = max_message
        self.items: queue.SimpleQueue[Item] = queue.SimpleQueue()   # C-level: cheaper per batch than Queue
        self._commands: queue.SimpleQueue[Consumed | Close] = queue.SimpleQueue()
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._pipe_addr = f"inproc://feedline-client-{id(self)}"
        self._pipe_in = self._ctx.socket(zmq.PAIR)
        self._pipe_in.bind(self._pipe_addr)
        self._pipe_out = self._ctx.socket(zmq.PAIR)   # used by the caller's thread only
        self._pipe_out.connect(self._pipe_addr)
        self._thread = threading.Thread(target=self._run, name="feedline-client", daemon=True)
        self._sock: zmq.Socket[Any] | None = None
        self._monitor: zmq.Socket[Any] | None = None
        self._queued = 0
        # ranked acks are cumulative, so credit goes back in groups; shared mode acks every batch
        self._grant_every = max(1, prefetch // 2) if self.hello.get("mode", "ranked") == "ranked" else 1
        self._unreported = 0   # batches consumed since the last Consumed command (caller's thread)
        self._heartbeat, self._welcomed_once = 1.0, False
        self._handshakes = HandshakeWatch(address, keys, min(HANDSHAKE_BOUND_S, timeout))
        self._guard = BatchGuard(limits, max_message)   # what batches may hold
        self._credit = 0   # batches the server may still send on this connection (granted, not yet received)
        self.connected = False   # welcomed on the current connection (read by the caller's thread)
        self._handed = threading.Lock()      # whether a queued batch is handed to the caller or given back
        self._unhanded: Counter[int] = Counter()   # steps queued for the caller, not yet taken by it
        self._revoked: Counter[int] = Counter()    # steps given back while still queued: the caller skips them
        self.server_note: str | None = None   # the server's last word on why no batch comes (a stall)

    def start(self) -> None:
        self._thread.start()
        _LIVE.add(self)

    # ------------------------------------------------------- caller's thread
    def consumed(self, step: int | None) -> None:
        """Report that the caller finished the batch of ``step``; acks it and grants credit.

        Ranked mode reports every ``prefetch // 2`` batches (at least ``prefetch - prefetch // 2 + 1``
        credits stay granted or queued, so the stream never waits on it).
        """
        self._unreported += 1
        if self._unreported >= self._grant_every:
            n, self._unreported = self._unreported, 0
            self._command(Consumed(step, n))

    def _command(self, command: Consumed | Close, flags: int = 0) -> None:
        self._commands.put(command)
        self._pipe_out.send(b"", flags)   # wakes the thread's poller

    def next_item(self, timeout: float) -> Item | None:
        """The thread's next item, or ``None`` after ``timeout`` seconds.

        Raises:
            TransportError: the thread is gone and left nothing queued (it cannot answer any more).
        """
        try:
            while True:
                item = self.items.get(timeout=timeout)
                if not isinstance(item, Delivered):
                    return item
                with self._handed:
                    if not self._revoked[item.step]:
                        _take_one(self._unhanded, item.step)
                        return item
                    _take_one(self._revoked, item.step)   # given back to the server: another client has it
        except queue.Empty:
            if not self._thread.is_alive() and self.items.empty():
                raise TransportError(f"the connection to the loader service at {self.address} stopped unexpectedly "
                                     "(its thread ended without a reason); reconnect with a new Loader") from None
            return None

    def close(self, ack: int | None = None, wait: float = 5.0) -> None:
        """Ack ``ack`` (if given), say bye, stop the thread and free the sockets. Idempotent.

        Waits at most ``wait`` seconds for the thread (and :data:`_LAST_WORDS_MS` for the bye to leave); one
        that does not stop (it cannot run during interpreter shutdown) keeps its socket, and the context is
        left to the process's exit instead of blocking in ``zmq_ctx_term``.
        """
        if self._ctx.closed or self._pipe_out.closed:
            return
        _LIVE.discard(self)
        if self._thread.is_alive():
            try:
                self._command(Close(ack), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self._thread.join(timeout=wait)
        self._pipe_out.close(linger=0)
        if self._thread.is_alive():
            return
        self._pipe_in.close(linger=0)
        self._ctx.term()

    # ---------------------------------------------------------------- thread
    def _run(self) -> None:
        try:
            self._loop()
        except FeedlineError as e:
            self.items.put(Failed(e))
        except Exception as e:  # a bug or an OS failure: surface it to the caller
            self.items.put(Failed(TransportError(f"client connection failed: {type(e).__name__}: {e}")))
        finally:
            self._disconnect()

    def _connect(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message)
        # credit bounds what a server sends (more is refused); the queue bounds what ZeroMQ reads
        # ahead of this thread meanwhile (a full queue stops reading: TCP pushes back, nothing is lost)
        sock.setsockopt(zmq.RCVHWM, self.prefetch + 8)
        if self.keys is not None:
            self.keys.apply(sock)
        self._monitor = sock.get_monitor_socket(MONITORED)
        sock.connect(self.address)
        self._sock = sock
        self._send(pack("hello", **self.hello, state=None if self.resume is None else state_as_json(self.resume)))

    def _disconnect(self, bye: bool = False) -> None:
        """Close the socket; with ``bye``, say it first and give it :data:`_LAST_WORDS_MS` to leave."""
        if bye:
            self._send(pack("bye"))
        if self._monitor is not None and self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        if self._sock is not None:
            self._sock.close(linger=_LAST_WORDS_MS if bye else 0)
            self._sock = None

    def _loop(self) -> None:
        lost_at = time.monotonic()       # when we last had no server (initially: not connected yet)
        backoff = 0.1
        welcomed = False
        self._connect()
        last_heard = last_sent = time.monotonic()
        poller = zmq.Poller()
        poller.register(self._pipe_in, zmq.POLLIN)
        while True:
            assert self._sock is not None and self._monitor is not None
            poller.register(self._sock, zmq.POLLIN)
            poller.register(self._monitor, zmq.POLLIN)
            wait = min(self._heartbeat, backoff if not welcomed else 1.0, self.timeout)
            events = dict(poller.poll(max(_MIN_POLL_MS, int(wait * 1000))))
            now = time.monotonic()
            if self._monitor in events:
                self._handshakes.event(recv_monitor_message(self._monitor), now)
            self._handshakes.check(now)
            if self._pipe_in in events:
                self._pipe_in.recv()
                command = self._commands.get_nowait()
                if isinstance(command, Close):
                    if welcomed and command.ack is not None:
                        self._send(pack("credit", n=0, step=command.ack))
                    self._disconnect(bye=True)
                    return
                self._queued -= command.n
                if welcomed:
                    self._grant(command.n, command.step)
                    last_sent = now
            if self._sock in events:
                last_heard = now
                for frames in self._drain():
                    outcome = self._handle(frames, welcomed)
                    if outcome == "welcome":
                        welcomed, backoff = True, 0.1
                        self.connected = True
                        self._credit = 0
                        self._grant(max(0, self.prefetch - self._queued))
                    elif outcome == "end":
                        self._disconnect(bye=True)
                        return
                    elif outcome == "lost":
                        last_heard = 0.0
            if welcomed and now - last_sent >= self._heartbeat:
                self._send(pack("ping"))
                last_sent = now
            silent = now - last_heard > (self.timeout if welcomed else min(self.timeout, 2.0 + backoff))
            if silent:
                if welcomed:
                    lost_at, welcomed = now, False
                    self.connected = False
                if now - lost_at > self.reconnect:
                    raise TransportTimeout(
                        f"no answer from the loader service at {self.address} for {self.reconnect:.0f}s; "
                        "is 'feedline serve' running there?" + ("" if self.keys else " If it uses keys, pass keys=DIR.")
                        + (f" Last handshake failure: {self._handshakes.last_failure}."
                           if self._handshakes.last_failure else ""))
                poller.unregister(self._sock)
                poller.unregister(self._monitor)
                self._disconnect()
                backoff = min(backoff * 2, 5.0)
                self._connect()
                last_heard = last_sent = time.monotonic()

    def _adopt_prefetch(self, granted: int) -> None:
        """Use the server's cap on in-flight batches when it is below the declared ``prefetch``.

        Credit is granted in groups of ``prefetch // 2``; against a smaller cap the server would
        stop sending before a group was complete, and both sides would wait for good.
        """
        if granted < self.prefetch:
            log.info("the loader service caps prefetch at %d batches (asked for %d)", granted, self.prefetch)
            self.prefetch = granted
            if self._grant_every > 1:
                self._grant_every = max(1, granted // 2)

    def _grant(self, n: int, step: int | None = None) -> None:
        self._credit += n
        self._send(pack("credit", n=n) if step is None else pack("credit", n=n, step=step))

    def _send(self, frame: bytes) -> None:
        assert self._sock is not None
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # not connected and the queue is full: the reconnect logic takes over
            pass

    def _drain(self) -> list[list[zmq.Frame]]:
        out = []
        assert self._sock is not None
        while int(self._sock.getsockopt(_EVENTS)) & _POLLIN:   # no zmq.Again raised at the end of every drain
            out.append(self._sock.recv_multipart(zmq.NOBLOCK, copy=False))
        return out

    def _deliver(self, h: dict[str, Any], payload: list[Any]) -> None:
        """Check and decode one batch (laid out here, on this thread) and queue it for the caller."""
        state = h.get("state")
        step = h.get("step")
        if not isinstance(state, (bytes, str)) or not isinstance(step, int) or isinstance(step, bool):
            raise ProtocolError("batch header lacks its step or state")
        self._credit -= 1
        arrays = self._guard.decode(h, payload)
        self.resume = state
        self._queued += 1
        with self._handed:
            self._unhanded[step] += 1
        self.items.put(Delivered(step, state, arrays))

    def _revoke(self, h: dict[str, Any]) -> None:
        """A shared queue at its end asks for batches back: those the caller has not taken (skipped when it
        reaches them), never one it took. No credit comes back: the batches must go to a client that waits."""
        steps = h.get("steps")
        if not isinstance(steps, list):
            raise ProtocolError("revoke without a list of steps")
        with self._handed:
            back = sorted({s for s in steps if isinstance(s, int) and self._unhanded[s] > 0})
            for s in back:
                _take_one(self._unhanded, s)
                self._revoked[s] += 1
        self._queued -= len(back)
        self._send(pack("returned", steps=back))

    def _handle(self, frames: list[zmq.Frame], welcomed: bool) -> str | None:
        h = unpack_header(frames[0].buffer, self.max_message)
        op = h["op"]
        if op in ("batch", "batches"):
            if not welcomed:
                return None  # left over from a connection we gave up on
            if op == "batch":
                items: list[tuple[dict[str, Any], Any]] = [(h, frames[1:])]
            elif len(frames) != 2:
                raise ProtocolError(f"a batches message is a header and one payload frame, got {len(frames) - 1} "
                                    "frames after the header")
            else:
                items = [(item, [buf]) for item, buf in split_batches(h, frames[1])]
            if self._credit < len(items):
                raise ProtocolError(f"the loader service at {self.address} sent {len(items)} batches beyond the credit "
                                    f"this client granted ({self._credit} left of prefetch {self.prefetch}, {self._queued} "
                                    "queued): a server that ignores credit would fill this process's memory")
            for item, payload in items:
                self._deliver(item, payload)
        elif op == "welcome":
            info = check_welcome(h, stream=str(self.hello.get("stream")), spec_hash=self.hello.get("spec_hash"),
                                 timeout=self.timeout, max_bytes=self.max_message)
            self._heartbeat = info.heartbeat
            self._adopt_prefetch(info.prefetch)
            self._guard.welcome(info.limits)
            if not self._welcomed_once:
                self._welcomed_once = True
                self.resume = self.resume or info.state
                self.items.put(Welcome(info.state))
            return "welcome"
        elif op == "end":
            step = h.get("step")
            self.items.put(Ended(step if isinstance(step, int) else None))
            return "end"
        elif op == "error":
            raise error_from_header(h)
        elif op == "bye":
            if h.get("code") == BYE_REPLACED:
                raise TransportError(f"loader service: {h.get('reason')} (two loaders share this rank?)")
            return "lost"
        elif op == "revoke":
            if welcomed:
                self._revoke(h)
        elif op == "pong":
            stall = h.get("stall")
            self.server_note = stall[:2000] if isinstance(stall, str) else None
        elif op != "stats":
            raise ProtocolError(f"unexpected message {op!r:.20} from the server")
        return None


def _take_one(counts: Counter[int], step: int) -> None:
    """One fewer of ``step`` (its key removed at zero: the counters stay as small as the queue)."""
    if counts[step] <= 1:
        counts.pop(step, None)
    else:
        counts[step] -= 1
