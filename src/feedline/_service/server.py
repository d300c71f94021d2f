"""The loader service: one process owns the pipelines and serves batches to trainers over ZeroMQ.

    >>> server = Server(load_streams("train.yaml"), ServerOptions(bind="tcp://127.0.0.1:5555"))  # doctest: +SKIP
    >>> server.bind()            # returns the bound address   # doctest: +SKIP
    >>> server.serve()           # until stop(): drains, says bye, closes   # doctest: +SKIP

This module is the event loop: one ROUTER socket talks to every client (protocol in
:mod:`.protocol`), producer threads wake the loop after each produced step (a send the dispatcher
holds back to gather several steps sets the poll's timeout), and a tick once a second refreshes the stats snapshot and writes the
``--state`` file (when a watermark moved; once more before the goodbye). What a message means and
what each client receives is the
:class:`~.dispatch.Dispatcher`'s business (no sockets there: it sends through a
:mod:`.transport`); the snapshot is built by :mod:`.stats`. Sends never block
(``ROUTER_MANDATORY`` plus ``NOBLOCK``): a peer that stops reading keeps its batch queued
server-side, a peer that vanished is dropped. With keys, only messages that ZeroMQ's
authentication (ZAP) vouched for are handed on.
"""

from __future__ import annotations

import logging
import math
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import zmq

from feedline._pipeline import GlobalStream, Pipeline
from feedline._service.dispatch import Dispatcher
from feedline._service.metrics import MetricsEndpoint
from feedline._service.options import ServerOptions
from feedline._service.statefile import StateFile
from feedline._service.stats import progress_line, snapshot
from feedline._service.transport import RouterTransport
from feedline._sources.files import codec_of, size_of
from feedline._tokenize.backends import START_AFTER_CHARS
from feedline.errors import FeedlineError, SpecError

__all__ = ["Server", "ServerOptions"]

log = logging.getLogger("feedline.service")
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)   # plain ints: pyzmq's enum operators cost more than the call


class Server:
    """Serves the named streams' batches; see the module docstring."""

    def __init__(self, streams: Mapping[str, Pipeline], options: ServerOptions | None = None) -> None:
        if not streams:
            raise SpecError("a server needs at least one stream")
        self.streams = dict(streams)
        self.options = options or ServerOptions()
        self.hashes = {name: p.spec.hash() for name, p in self.streams.items()}
        self.dispatcher: Dispatcher | None = None
        self.address: str | None = None
        self.unauthenticated = 0
        self.started = time.monotonic()
        self.snapshot: dict[str, Any] = {}
        self._stopping = threading.Event()
        self._wake_r: socket.socket | None = None   # a socket pair: producers write a byte, the loop polls
        self._wake_w: socket.socket | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._auth: Any = None
        self._metrics: MetricsEndpoint | None = None
        accepted = {name: p.spec.accepted_hashes() for name, p in self.streams.items()}
        self._statefile = StateFile(self.options.state, accepted) if self.options.state else None
        self._saved: dict[str, tuple[int, int]] = {}   # stream -> (queue id, watermark) last written
        self._save_failed_at = -1e9

    # ------------------------------------------------------------------ setup
    def bind(self) -> str:
        """Open the pipelines' start states, bind the socket; returns the bound address."""
        if self.address is not None:
            return self.address
        o = self.options
        resume = self._statefile.load() if self._statefile is not None else {}
        for name, state in resume.items():
            log.info("stream %r: shared mode resumes after step %d (%s)", name, state["step"], o.state)
        initial: dict[str, dict[str, Any]] = {}
        for name, pipeline in self.streams.items():
            initial[name] = GlobalStream(pipeline, 1).initial_state()
            _settle_backend(pipeline)
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
        self._sock.setsockopt(zmq.SNDHWM, 4 * o.max_prefetch)
        self._sock.setsockopt(zmq.RCVHWM, 10_000)
        if o.keys is not None:
            o.keys.apply(self._sock)
        try:
            self._sock.bind(o.bind)
        except zmq.ZMQError as e:
            self.close()
            raise SpecError(f"cannot bind {o.bind}: {e}") from e
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.dispatcher = Dispatcher(self.streams, o, RouterTransport(self._sock), initial=initial, wake=self.wake,
                                     stats=self.stats, resume=resume)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._wake_r.fileno(), zmq.POLLIN)
        if o.metrics_port is not None:
            self._metrics = MetricsEndpoint(o.metrics_port, lambda: self.snapshot, o.metrics_host, window=o.window)
        self.snapshot = self.stats()
        return self.address

    @property
    def metrics_port(self) -> int | None:
        return self._metrics.port if self._metrics else None

    def wake(self) -> None:
        """Wake the event loop (called by producer threads when a produced step is ready).

        A byte on a socket pair: one system call, safe from any thread, and the loop reads every
        pending wake-up at once (an inproc ZeroMQ pipe cost a message, a frame and a poll per wake).
        """
        w = self._wake_w
        if w is not None:
            try:
                w.send(b"\0")
            except OSError:  # full (a wake-up is pending anyway) or closing
                pass

    def stop(self) -> None:
        """Ask the loop to drain and exit (safe from a signal handler or another thread)."""
        self._stopping.set()

    # ------------------------------------------------------------------- loop
    def serve(self) -> None:
        """Run until :meth:`stop`; then drain shared-mode acks, say bye to every client and close."""
        self.bind()
        d = self.dispatcher
        assert d is not None
        o = self.options
        poll_ms = int(min(100, o.heartbeat * 500))
        next_tick = time.monotonic() + 1.0
        deadline: float | None = None
        try:
            while True:
                now = time.monotonic()
                if self._stopping.is_set() and deadline is None:
                    d.stopping = True
                    log.warning("draining: no new batches; waiting up to %.0fs for acks", o.drain_timeout)
                    deadline = now + o.drain_timeout
                if deadline is not None and (now >= deadline or d.drained()):
                    break
                wait = poll_ms if d.due is None or deadline is not None else \
                    min(poll_ms, max(0, math.ceil((d.due - now) * 1000)))   # a held send is due then
                events = dict(self._poller.poll(wait))
                if self._wake_r is not None and self._wake_r.fileno() in events:
                    _drain(self._wake_r)
                if self._sock in events:
                    self._receive()
                if deadline is None:
                    d.dispatch()
                else:   # (draining: what a gone client held is re-queued, not waited for)
                    d.drop_gone()
                if now >= next_tick:
                    next_tick = now + 1.0
                    d.tick(now)
                    self._save_state()
                    self._refresh()
            self._save_state()   # where the drain left the watermarks, before clients go to a successor
            d.say_goodbye()
        finally:
            self.close()

    def _receive(self) -> None:
        assert self.dispatcher is not None
        sock = self._sock
        for _ in range(1000):   # asking for EVENTS is cheaper than the zmq.Again raised by an empty recv
            if not int(sock.getsockopt(_EVENTS)) & _POLLIN:
                return
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            if self.options.keys is not None and not _authenticated(frames[-1]):
                self.unauthenticated += 1   # no ZAP user id: never answered, not even stats
                continue
            self.dispatcher.receive(frames[0].bytes, frames[1:])

    def _save_state(self) -> None:
        """Rewrite the ``--state`` file if a stream's watermark moved since it was last written (called
        once per tick and before the goodbye: never per ack, which held the event loop for a file write
        per batch)."""
        assert self.dispatcher is not None
        if self._statefile is None:
            return
        moved = {name: q.watermark_wire for name, q in self.dispatcher.queues.items()
                 if self._saved.get(name) != (id(q), q.watermark)}
        if not moved:
            return
        try:
            self._statefile.save(moved)
        except FeedlineError as e:   # a full disk must not stop the service: say so, once a minute
            now = time.monotonic()
            if now - self._save_failed_at >= 60:
                self._save_failed_at = now
                log.error("%s; serving on, but a restart would resume from the last state written", e)
            return
        for name, q in self.dispatcher.queues.items():
            if name in moved:
                self._saved[name] = (id(q), q.watermark)

    def _refresh(self) -> None:
        self.snapshot = self.stats()
        if self.options.progress and sys.stderr.isatty():
            sys.stderr.write("\r\033[K" + progress_line(self.snapshot))
            sys.stderr.flush()

    def stats(self) -> dict[str, Any]:
        """A JSON-able snapshot: per-stream rates and efficiency, cursors, queues and clients."""
        if self.dispatcher is None:
            return {}
        return snapshot(self.dispatcher, address=self.address, uptime=time.monotonic() - self.started,
                        unauthenticated=self.unauthenticated)

    # ----------------------------------------------------------------- close
    def close(self) -> None:
        """Stop producers, close sockets and the metrics endpoint. Idempotent."""
        if self.dispatcher is not None:
            self.dispatcher.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            for name in ("_wake_w", "_wake_r"):
                pair = getattr(self, name)
                setattr(self, name, None)
                if pair is not None:
                    pair.close()
            sock = getattr(self, "_sock", None)
            if sock is not None:
                sock.close()
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> Server:
        self.bind()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drain(sock: socket.socket) -> None:
    """Read every wake-up byte queued on ``sock`` (one call for all of them)."""
    try:
        sock.recv(1 << 16)
    except (BlockingIOError, InterruptedError):
        pass


def _settle_backend(pipeline: Pipeline) -> None:
    """Run ``backend: auto``'s fast-encoder check (fastokens, the word cache) now, before the server listens.

    In-process, the check starts after the first batch and the stream waits for it (loading
    fastokens takes 0.3-2 s of one core). A server is long-lived: it settles the backend before it
    listens, so its clients neither wait for it nor start at ``tokenizers`` speed. A stream
    too small for the check ever to start in-process (less local text than
    :data:`~feedline._tokenize.backends.START_AFTER_CHARS` over all its epochs) skips it, as
    in-process. The verdict is cached per tokenizer in the process; batches do not depend on it.
    Partitions placed in worker processes or Ray actors settle their own, where they encode.
    """
    spec = pipeline.spec
    if pipeline.composed and spec.parallel.resolve(spec.partitions) != "threads":
        return   # the partitions encode in their workers or actors: this process never loads the tokenizer for it
    encoder = getattr(pipeline.tokenizer, "encoder", None)
    wait = getattr(encoder, "wait", None)
    if wait is not None and _encodes_at_least(pipeline, START_AFTER_CHARS):
        log.info("stream tokenizer backend: %s", wait())


def _encodes_at_least(pipeline: Pipeline, chars: int) -> bool:
    """Whether the stream may encode ``chars`` characters: its plain local files' bytes times its
    epochs reach it (a byte holds at most one character), it is endless, or a file's text size is
    unknown (a URL, an unreadable path, a compressed file)."""
    epochs = pipeline.spec.epochs
    if epochs is None:
        return True
    total = 0
    for source in pipeline.sources:
        for path in source.files:
            size = size_of(path) if codec_of(path) is None else None
            if size is None:   # cannot tell, so assume it is large
                return True
            total += size
            if total * epochs >= chars:
                return True
    return False


def _authenticated(frame: zmq.Frame) -> bool:
    """Whether ZeroMQ's authentication (ZAP) accepted the peer that sent ``frame``."""
    try:
        return bool(frame.get("User-Id"))
    except zmq.ZMQError:   # the property is absent: no ZAP handler vouched for this peer
        return False
