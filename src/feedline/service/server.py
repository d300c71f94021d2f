"""The loader service: one process owns the pipelines and serves batches to trainers over ZeroMQ.

    >>> server = Server(load_streams("train.yaml"), ServerOptions(bind="tcp://127.0.0.1:5555"))  # doctest: +SKIP
    >>> server.bind()            # returns the bound address   # doctest: +SKIP
    >>> server.serve()           # until stop(): drains, says bye, closes   # doctest: +SKIP

One ROUTER socket talks to every client (protocol in :mod:`.protocol`). The event loop is a
single thread: it reads control messages, moves produced steps from the producer threads into
ranked cursors (:mod:`.ranked`) and shared queues (:mod:`.shared`), and sends each client as many
batches as it has credit for. Sends never block (``ROUTER_MANDATORY`` plus ``NOBLOCK``): a peer
that stops reading keeps its batch queued server-side, a peer that vanished is dropped. Bad input
is answered with an ``error`` where possible, counted, logged (rate-limited) and otherwise
ignored, so one broken peer never affects the others.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from feedline.errors import FeedlineError, ProtocolError, SpecError
from feedline.pipeline import GlobalStream, Pipeline
from feedline.service.auth import ServerKeys, check_bind
from feedline.service.metrics import MetricsEndpoint, StreamCounters
from feedline.service.producer import End, Produced
from feedline.service.protocol import CLIENT_OPS, PROTOCOL_VERSION, encode_batch, pack, unpack_header
from feedline.service.ranked import RankedCursor
from feedline.service.session import Client, validate_hello
from feedline.service.shared import SharedQueue
from feedline.state import state_json as _state_json

__all__ = ["Server", "ServerOptions"]

log = logging.getLogger("feedline.service")


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerOptions:
    """How a server binds, buffers and polices its clients.

    Attributes:
        bind: ``tcp://host:port`` (port 0 picks a free one) or ``ipc://path``; loopback by default.
        window: global steps buffered ahead of the slowest rank (bounds memory and lead).
        max_credit: the most batches any client may have in flight.
        heartbeat: seconds between client pings (told to clients in the welcome).
        timeout: seconds of silence after which a client is dropped (shared mode: re-delivered).
        max_message: largest inbound message in bytes; bigger ones drop the connection.
        keys: CurveZMQ server keys; ``None`` for plaintext (loopback or ``insecure`` only).
        insecure: allow a plaintext bind outside loopback.
        drain_timeout: on stop, seconds to wait for shared-mode clients to ack their batches.
        idle_close: seconds a cursor without clients is kept for reconnects before it is closed.
        metrics_port: serve Prometheus metrics on this port (``None``: off; 0: any free port).
        metrics_host: the address the metrics endpoint binds.
        progress: print a one-line progress display on standard error when it is a terminal.
    """

    bind: str = "tcp://127.0.0.1:5555"
    window: int = 8
    max_credit: int = 64
    heartbeat: float = 1.0
    timeout: float = 10.0
    max_message: int = 16 << 20
    keys: ServerKeys | None = None
    insecure: bool = False
    drain_timeout: float = 10.0
    idle_close: float = 600.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    progress: bool = False

    def __post_init__(self) -> None:
        if self.window < 1 or self.max_credit < 1:
            raise SpecError(f"window ({self.window}) and max_credit ({self.max_credit}) must be >= 1")
        if not 0 < self.heartbeat < self.timeout:
            raise SpecError(f"heartbeat ({self.heartbeat}s) must be > 0 and below timeout ({self.timeout}s)")
        check_bind(self.bind, self.keys, self.insecure)


class Server:
    """Serves the named streams' batches; see the module docstring."""

    def __init__(self, streams: Mapping[str, Pipeline], options: ServerOptions | None = None) -> None:
        if not streams:
            raise SpecError("a server needs at least one stream")
        self.streams = dict(streams)
        self.options = options or ServerOptions()
        self.hashes = {name: p.spec.hash() for name, p in self.streams.items()}
        self.initial: dict[str, dict[str, Any]] = {}
        self.counters = {name: StreamCounters() for name in self.streams}
        self.clients: dict[bytes, Client] = {}
        self.cursors: dict[tuple[str, int], list[RankedCursor]] = {}
        self.queues: dict[str, SharedQueue] = {}
        self.address: str | None = None
        self.malformed = 0
        self.started = time.monotonic()
        self.snapshot: dict[str, Any] = {}
        self._stopping = threading.Event()
        self._local = threading.local()
        self._pushers: list[zmq.Socket[Any]] = []
        self._pushers_lock = threading.Lock()
        self._ctx: zmq.Context[Any] | None = None
        self._auth: Any = None
        self._metrics: MetricsEndpoint | None = None

    # ------------------------------------------------------------------ setup
    def bind(self) -> str:
        """Open the pipelines' start states, bind the socket; returns the bound address."""
        if self.address is not None:
            return self.address
        o = self.options
        for name, pipeline in self.streams.items():
            self.initial[name] = GlobalStream(pipeline, 1).initial_state()
        self._ctx = zmq.Context()
        if o.keys is not None:
            from zmq.auth.thread import ThreadAuthenticator

            self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("feedline.service.auth"))
            self._auth.start()
            self._auth.configure_curve(domain="*", location=str(o.keys.authorized))
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.MAXMSGSIZE, o.max_message)
        self._sock.setsockopt(zmq.LINGER, 500)
        self._sock.setsockopt(zmq.SNDHWM, 4 * o.max_credit)
        self._sock.setsockopt(zmq.RCVHWM, 10_000)
        if o.keys is not None:
            o.keys.apply(self._sock)
        try:
            self._sock.bind(o.bind)
        except zmq.ZMQError as e:
            self.close()
            raise SpecError(f"cannot bind {o.bind}: {e}") from e
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._wake_addr = f"inproc://feedline-wake-{id(self)}"
        self._wake_sock = self._ctx.socket(zmq.PULL)
        self._wake_sock.bind(self._wake_addr)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._wake_sock, zmq.POLLIN)
        if o.metrics_port is not None:
            self._metrics = MetricsEndpoint(o.metrics_port, lambda: self.snapshot, o.metrics_host)
        self.snapshot = self.stats()
        return self.address

    @property
    def metrics_port(self) -> int | None:
        return self._metrics.port if self._metrics else None

    def wake(self) -> None:
        """Wake the event loop (called by producer threads after each produced step)."""
        sock = getattr(self._local, "push", None)
        if sock is None:
            assert self._ctx is not None
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 2)
            sock.connect(self._wake_addr)
            self._local.push = sock
            with self._pushers_lock:
                self._pushers.append(sock)
        try:
            sock.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:  # full (a wake-up is pending anyway) or closing
            pass

    def stop(self) -> None:
        """Ask the loop to drain and exit (safe from a signal handler or another thread)."""
        self._stopping.set()

    # ------------------------------------------------------------------- loop
    def serve(self) -> None:
        """Run until :meth:`stop`; then drain shared-mode acks, say bye to every client and close."""
        self.bind()
        o = self.options
        poll_ms = int(min(100, o.heartbeat * 500))
        next_tick = time.monotonic() + 1.0
        deadline: float | None = None
        try:
            while True:
                now = time.monotonic()
                if self._stopping.is_set() and deadline is None:
                    log.warning("draining: no new batches; waiting up to %.0fs for acks", o.drain_timeout)
                    deadline = now + o.drain_timeout
                if deadline is not None and (now >= deadline or self._drained()):
                    break
                events = dict(self._poller.poll(poll_ms))
                if self._wake_sock in events:
                    while self._poll_once(self._wake_sock):
                        pass
                if self._sock in events:
                    self._receive()
                if deadline is None:
                    self._dispatch()
                if now >= next_tick:
                    next_tick = now + 1.0
                    self._tick(now)
            self._say_goodbye()
        finally:
            self.close()

    @staticmethod
    def _poll_once(sock: zmq.Socket[Any]) -> bool:
        try:
            sock.recv(zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _drained(self) -> bool:
        return not any(any(q.inflight.values()) for q in self.queues.values())

    def _receive(self) -> None:
        for _ in range(1000):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            ident = frames[0].bytes
            try:
                if len(frames) != 2:
                    raise ProtocolError(f"expected one header frame, got {len(frames) - 1}")
                header = unpack_header(frames[1].buffer, self.options.max_message)
                self._handle(ident, header)
            except FeedlineError as e:
                self._reject(ident, e)

    def _reject(self, ident: bytes, e: FeedlineError) -> None:
        self.malformed += isinstance(e, ProtocolError)
        if self.malformed <= 5 or self.malformed % 1000 == 0 or not isinstance(e, ProtocolError):
            log.warning("client %s: %s (%d malformed messages so far)", ident.hex()[:8], e, self.malformed)
        self._send(ident, [pack("error", kind=type(e).__name__, message=str(e))])

    def _handle(self, ident: bytes, h: dict[str, Any]) -> None:
        op = h["op"]
        if op not in CLIENT_OPS:
            raise ProtocolError(f"unknown op {op!r:.40}; expected one of {sorted(CLIENT_OPS)}")
        client = self.clients.get(ident)
        if client is not None:
            client.last_seen = time.monotonic()
        if op == "ping" and client is not None:
            self._send(ident, [pack("pong")])
        elif op == "stats":
            self._send(ident, [pack("stats", stats=self.stats())])
        elif op == "hello":
            self._hello(ident, h)
        elif client is None:
            if op != "bye":  # e.g. a client of a previous server process: it must say hello again
                self._send(ident, [pack("bye", reason="unknown client; send hello first")])
        elif op == "credit":
            self._credit(client, h)
        elif op == "bye":
            self._drop(client, "said bye")

    # ---------------------------------------------------------------- clients
    def _hello(self, ident: bytes, h: Mapping[str, Any]) -> None:
        if self._stopping.is_set():
            raise ProtocolError("the server is shutting down; reconnect to its successor")
        if ident in self.clients:
            self._drop(self.clients[ident], "sent a new hello")
        hello = validate_hello(h, self.streams, self.hashes)
        name, w = hello.stream, hello.world_size
        start = hello.state
        if hello.mode == "shared":
            q = self.queues.get(name)
            if q is None or (q.ended_at is not None and not q.inflight and not self._members(q)):
                if q is not None:
                    q.close()
                q = SharedQueue(name, self.streams[name], start, window=self.options.window, wake=self.wake,
                                initial=self.initial[name])
                self.queues[name] = q
            target: RankedCursor | SharedQueue = q
            state_json = q.watermark_json
        else:
            step = int(start["step"]) + 1 if start else 1
            target = self._cursor_for(name, w, hello.rank, hello.session, step, start)
            old = target.attach(hello.rank, ident, hello.session, step)
            if old is not None and old in self.clients:
                self._send(old, [pack("bye", reason="replaced by a new connection of this rank")])
                self._drop(self.clients[old], "was replaced")
            state_json = _state_json(self.hashes[name], start or self.initial[name], w)
        self.clients[ident] = Client(ident=ident, stream=name, mode=hello.mode, rank=hello.rank, world_size=w,
                                     target=target, prefetch=hello.prefetch, last_seen=time.monotonic())
        self._send(ident, [pack("welcome", v=PROTOCOL_VERSION, stream=name, spec_hash=self.hashes[name],
                                state=state_json, heartbeat=self.options.heartbeat, timeout=self.options.timeout)])
        log.info("client %s joined stream %r as %s", ident.hex()[:8], name,
                 "shared" if hello.mode == "shared" else f"rank {hello.rank}/{w}")

    def _cursor_for(self, name: str, w: int, rank: int, session: str, step: int,
                    start: Mapping[str, Any] | None) -> RankedCursor:
        cursors = self.cursors.setdefault((name, w), [])
        for c in cursors:
            if not c.taken_by_other(rank, session) and c.can_join(step):
                return c
        for c in cursors:
            if not c.taken_by_other(rank, session) and c.can_rewind(step):
                c.rewind(start)
                return c
        c = RankedCursor(name, self.streams[name], w, start, window=self.options.window, wake=self.wake,
                         initial=self.initial[name])
        cursors.append(c)
        return c

    def _members(self, target: RankedCursor | SharedQueue) -> list[Client]:
        return [c for c in self.clients.values() if c.target is target]

    def _credit(self, client: Client, h: Mapping[str, Any]) -> None:
        n, step = h.get("n", 0), h.get("step")
        if not isinstance(n, int) or not 0 <= n <= self.options.max_credit:
            raise ProtocolError(f"credit n={n!r:.20} must be an integer in [0, {self.options.max_credit}]")
        if step is not None:
            if not isinstance(step, int):
                raise ProtocolError(f"credit step={step!r:.20} must be an integer")
            if isinstance(client.target, SharedQueue):
                client.target.ack(client.ident, step)
            else:
                client.target.ack(client.rank, step)
            client.acked = max(client.acked, step)
        client.credit = min(client.credit + n, self.options.max_credit)

    def _drop(self, client: Client, why: str) -> None:
        self.clients.pop(client.ident, None)
        if isinstance(client.target, SharedQueue):
            n = client.target.release(client.ident)
            if n:
                log.warning("client %s %s; %d unacked batches re-queued", client.ident.hex()[:8], why, n)
        else:
            client.target.detach(client.rank, client.ident)
        log.info("client %s %s", client.ident.hex()[:8], why)

    # --------------------------------------------------------------- sending
    def _send(self, ident: bytes, frames: list[Any], copy: bool = True) -> bool | None:
        """Send without blocking: True sent, False peer busy (retry later), None peer gone."""
        try:
            self._sock.send_multipart([ident, *frames], zmq.NOBLOCK, copy=copy)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                return None
            raise

    def _dispatch(self) -> None:
        for cursors in self.cursors.values():
            for c in cursors:
                c.pump()
        for q in self.queues.values():
            q.pump(self.options.window + sum(m.prefetch for m in self._members(q)))
        for client in list(self.clients.values()):
            while client.credit > 0 and not client.ended and client.ident in self.clients:
                if not self._send_next(client):
                    break

    def _send_next(self, client: Client) -> bool:
        target = client.target
        shared = isinstance(target, SharedQueue)
        item = target.take(client.ident) if isinstance(target, SharedQueue) else target.next_for(client.rank)
        if item is None:
            if target.error is not None:
                self._send(client.ident, [pack("error", kind="TransportError",
                                               message=f"stream {client.stream!r} failed: {target.error}")])
                client.ended = True
            return False
        if isinstance(item, End):
            client.ended = self._send(client.ident, [pack("end", step=item.step)]) is not False
            return False
        assert isinstance(item, Produced)
        part = 0 if shared else client.rank
        state = target.watermark_json if isinstance(target, SharedQueue) else item.state_json
        header, arrays = encode_batch(item.slices[part], step=item.step, state=state)
        sent = self._send(client.ident, [header, *arrays], copy=False)
        if sent is not True:
            if isinstance(target, SharedQueue):
                target.giveback(client.ident, item)
            if sent is None:
                self._drop(client, "is unreachable")
            return False
        if not isinstance(target, SharedQueue):
            target.sent(client.rank, item.step)
        client.credit -= 1
        client.sent += 1
        counters = self.counters[client.stream]
        counters.steps = max(counters.steps, item.step)
        counters.last_state = item.state
        counters.record(len(next(iter(item.slices[part].values()))), item.slice_tokens[part],
                        item.slice_slots[part], sum(a.nbytes for a in arrays))
        return True

    # --------------------------------------------------------------- periodic
    def _tick(self, now: float) -> None:
        o = self.options
        for client in list(self.clients.values()):
            if now - client.last_seen > o.timeout:
                self._drop(client, f"was silent for {now - client.last_seen:.1f}s")
        for key, cursors in self.cursors.items():
            for c in [c for c in cursors if not c.clients() and now - c.idle_since > o.idle_close]:
                c.close()
                cursors.remove(c)
                log.info("closed idle cursor of stream %r (world size %d)", *key)
        self.snapshot = self.stats()
        if o.progress and sys.stderr.isatty():
            s = self.snapshot
            parts = [f"{len(self.clients)} clients"] + [
                f"{name}: step {st['steps']}, {st['batches_per_s']:.1f} batches/s, {st['tokens_per_s']:,.0f} tok/s"
                for name, st in s["streams"].items() if st["batches"]
            ]
            sys.stderr.write("\r\033[Kfeedline serve: " + " | ".join(parts))
            sys.stderr.flush()

    def stats(self) -> dict[str, Any]:
        """A JSON-able snapshot: per-stream rates and efficiency, cursors, queues and clients."""
        now = time.monotonic()
        streams: dict[str, Any] = {}
        for name, counters in self.counters.items():
            st = counters.snapshot(now)
            st["spec_hash"] = self.hashes[name]
            st["cursors"] = [{"world_size": c.world_size, "low": c.low, "produced": c.produced, "depth": c.depth,
                              "ended_at": c.ended_at, "ranks_connected": len(c.clients())}
                             for (s, _w), cs in self.cursors.items() if s == name for c in cs]
            q = self.queues.get(name)
            st["shared"] = None if q is None else {
                "watermark": q.watermark, "queued": q.depth, "in_flight": sum(len(v) for v in q.inflight.values()),
                "redelivered": q.redelivered, "ended_at": q.ended_at}
            streams[name] = st
        clients = []
        for c in self.clients.values():
            produced = c.target.produced
            clients.append({"id": c.ident.hex()[:8], "stream": c.stream, "mode": c.mode, "rank": c.rank,
                            "world_size": c.world_size, "credit": c.credit, "sent": c.sent,
                            "lag": max(0, produced - c.acked), "idle_s": round(now - c.last_seen, 2)})
        return {"version": PROTOCOL_VERSION, "address": self.address, "uptime_s": round(now - self.started, 1),
                "draining": self._stopping.is_set(), "clients_connected": len(clients), "malformed": self.malformed,
                "streams": streams, "clients": clients}

    # ----------------------------------------------------------------- close
    def _say_goodbye(self) -> None:
        for ident in list(self.clients):
            self._send(ident, [pack("bye", reason="server shutting down")])

    def close(self) -> None:
        """Stop producers, close sockets and the metrics endpoint. Idempotent."""
        for cursors in self.cursors.values():
            for c in cursors:
                c.close()
        for q in self.queues.values():
            q.close()
        self.cursors.clear()
        self.queues.clear()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            with self._pushers_lock:
                for s in self._pushers:
                    s.close(linger=0)
                self._pushers.clear()
            for name in ("_sock", "_wake_sock"):
                sock = getattr(self, name, None)
                if sock is not None:
                    sock.close()
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> Server:
        self.bind()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

