"""``feedline serve SPEC --http HOST:PORT``: the next batch of a stream for ``GET /``, from any language.

    $ curl -s -H 'Accept: application/json' 'http://127.0.0.1:8080/?stream=train'
    {"step": 1, "stream": "train", "state": {...}, "input_ids": [[...]], "attention_mask": [[...]], ...}

The gateway is a shared-mode consumer of the ZeroMQ server in the same process (one
:class:`StreamFeed` per stream, its small interface to the server's work queue), served by
``aiohttp.web`` on its own event-loop thread. Routes:

    GET /  and  GET /batch   ?stream=NAME   the next batch (200), or 204 once the stream has ended
    GET /ack                 ?stream=NAME&step=N   ack a step served with confirm=1 (at least once)
    GET /state               ?stream=NAME   the stream's resume state (the shared-mode watermark)
    GET /stats                              the server's stats snapshot plus the gateway's counters
    GET /healthz                            ``ok`` (no token needed)

Encodings (``Accept``): ``application/json`` gives arrays as nested lists;
``application/x-msgpack`` (the default) gives each array as ``{"dtype": "<i4", "shape": [..],
"data": <raw bytes>}``. Rows of tasks that carry record keys (``infer``) add ``idxs`` (the key
per row, ``null`` for fill rows) and ``texts`` (the records' text, re-read by key).

Delivery: each batch goes to exactly one GET, whatever the concurrency (one thread per stream
takes batches in order) and however long the pauses between GETs (a feed gives what it holds
back to the server before its lease could run out: :mod:`.http_feed`). A batch is *acked* to the
server once its response has been written to the socket; a response that cannot be written (the
client hung up) puts the batch back at the front for the next GET. Batches taken but not acked
stay in flight to the gateway, so if the whole process dies they are re-delivered by the
server's successor from the watermark (or from ``serve --state``), as for any shared-mode
client. A written response is kept until its connection shows the client read it (the next
request, or a clean close); a reset first serves it again (:mod:`.http_feed`). ``confirm=1``
asks for at least once instead: the batch is served again unless ``/ack?step=N`` (or ``&ack=N``
on the next GET) comes within half the lease.

Security: a bind outside loopback needs a bearer token (``--http-token-file``); every route but
``/healthz`` then requires ``Authorization: Bearer TOKEN``. Every connection passes a
:class:`~.http_guard.ConnectionGuard` first (caps on open and pending connections, a header
deadline, the token checked on the raw headers), so aiohttp only ever sees admitted ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import msgpack
import numpy as np

from feedline._pipeline import Pipeline
from feedline._service.auth import ClientKeys
from feedline._service.http_feed import Delivery, StreamFeed
from feedline._service.http_guard import ConnectionGuard, bearer_matches
from feedline._service.http_options import HttpOptions
from feedline.errors import FeedlineError, SpecError, TransportError

__all__ = ["Delivery", "HttpGateway", "StreamFeed"]

log = logging.getLogger("feedline.service.http")

JSON = "application/json"
MSGPACK = "application/x-msgpack"


class HttpGateway:
    """Serves the streams' batches over HTTP (see the module docstring).

        >>> gw = HttpGateway(server.bind(), streams, HttpOptions(port=0), stats=lambda: server.snapshot)  # doctest: +SKIP
        >>> gw.start()     # returns "http://127.0.0.1:PORT"                                   # doctest: +SKIP
    """

    def __init__(self, address: str, streams: Mapping[str, Pipeline], options: HttpOptions, *,
                 keys: ClientKeys | None = None, stats: Callable[[], Mapping[str, Any]] | None = None,
                 lease: float = 60.0) -> None:
        self.options = options
        self.streams = dict(streams)
        self.feeds = {name: StreamFeed(address, name, keys=keys, prefetch=options.prefetch, timeout=options.timeout,
                                       hold=lease / 2) for name in self.streams}
        self._check_every = min(1.0, lease / 8)
        self._checks: dict[str, Future[bool]] = {}
        self._stats = stats or dict
        self._token = options.token.encode() if options.token else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: Any = None
        self._server: asyncio.AbstractServer | None = None
        self.guard: ConnectionGuard | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self.url: str | None = None
        self.requests = 0
        self.unauthorized = 0

    # --------------------------------------------------------------- lifecycle
    def start(self) -> str:
        """Listen (in a daemon thread with its own event loop); returns the base URL."""
        try:
            from aiohttp import web
        except ImportError as e:  # pragma: no cover - aiohttp is a base dependency
            raise SpecError("the HTTP endpoint needs aiohttp: pip install 'aiohttp>=3.9'") from e
        if self.url is not None:
            return self.url
        app = web.Application(middlewares=[self._auth_middleware(web)], client_max_size=1 << 16)
        app.router.add_get("/", self._batch)
        app.router.add_get("/batch", self._batch)
        app.router.add_get("/ack", self._ack)
        app.router.add_post("/ack", self._ack)
        app.router.add_get("/state", self._state)
        app.router.add_get("/stats", self._stats_route)
        app.router.add_get("/healthz", self._healthz)
        o = self.options
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=o.header_timeout)
        loop.run_until_complete(runner.setup())
        cap = connection_cap(o.max_connections)
        assert runner.server is not None
        self.guard = ConnectionGuard(runner.server, token=self._token, max_connections=cap,
                                     max_pending=min(o.max_pending, cap - 1), header_timeout=o.header_timeout)
        try:
            # asyncio accepts up to ``backlog`` sockets per loop turn before the guard sees any: a small
            # backlog keeps a burst of connections in the kernel's queue, not in this process's descriptors
            server = loop.run_until_complete(loop.create_server(self.guard, o.host, o.port, reuse_address=True,
                                                                backlog=min(128, max(8, cap // 4))))
        except OSError as e:
            loop.run_until_complete(runner.cleanup())
            loop.close()
            raise SpecError(f"cannot listen for HTTP on {o.host}:{o.port}: {e.strerror}") from e
        host, port = server.sockets[0].getsockname()[:2]
        self._loop, self._runner, self._server = loop, runner, server
        self._thread = threading.Thread(target=loop.run_forever, name="feedline-http", daemon=True)
        loop.call_soon_threadsafe(self._release_stale)
        self._thread.start()
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        return self.url

    @property
    def port(self) -> int:
        if self.url is None:
            raise TransportError("the HTTP gateway is not listening; call start() first")
        return int(self.url.rsplit(":", 1)[1])

    def close(self) -> None:
        """Stop listening and release every stream's connection (held batches are re-queued). Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._close()

    def _close(self) -> None:
        if self._loop is not None and self._thread is not None:
            fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            try:
                fut.result(timeout=10)
            except Exception as e:  # a stuck request: shut down anyway
                log.warning("HTTP gateway: cleanup did not finish cleanly (%s)", e)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()
        for feed in self.feeds.values():
            feed.executor.submit(feed.close).result(timeout=10)
            feed.executor.shutdown(wait=True)

    async def _shutdown(self) -> None:
        """Stop listening, close pending connections, then let aiohttp finish the admitted ones."""
        if self._server is not None:
            self._server.close()
        if self.guard is not None:
            self.guard.close_pending()
        await self._runner.cleanup()

    def _release_stale(self) -> None:
        """On the loop, every ``lease / 8`` s (at most 1 s): each idle feed gives back what it held too long."""
        if self._closed or self._loop is None:
            return
        for name, feed in self.feeds.items():
            pending = self._checks.get(name)
            if pending is None or pending.done():   # one at a time, however long a take waits
                try:
                    self._checks[name] = feed.executor.submit(feed.release_stale)
                except RuntimeError:   # closing: the executor was shut down
                    return
        self._loop.call_later(self._check_every, self._release_stale)

    def __enter__(self) -> HttpGateway:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- routes
    def _auth_middleware(self, web: Any) -> Any:
        token = self._token

        @web.middleware
        async def auth(request: Any, handler: Any) -> Any:
            self.requests += 1
            if token is not None and request.path != "/healthz" \
                    and not bearer_matches(request.headers.get("Authorization", ""), token):
                self.unauthorized += 1
                return _json_response(web, 401, {"error": "unauthorized", "message": "send 'Authorization: Bearer TOKEN'"},
                                      headers={"WWW-Authenticate": 'Bearer realm="feedline"'})
            return await handler(request)

        return auth

    def _feed(self, request: Any) -> StreamFeed:
        from aiohttp import web

        name = request.query.get("stream")
        if name is None:
            name = "train" if "train" in self.feeds or len(self.feeds) != 1 else next(iter(self.feeds))
        feed = self.feeds.get(name)
        if feed is None:
            raise web.HTTPNotFound(text=json.dumps({"error": "unknown stream", "message":
                                                    f"no stream {name!r}; this server has {sorted(self.feeds)}"}),
                                   content_type=JSON)
        return feed

    async def _batch(self, request: Any) -> Any:
        from aiohttp import web

        feed = self._feed(request)
        fmt = _negotiate(request.headers.get("Accept", ""))
        confirm = _flag(request.query.get("confirm"))
        if "ack" in request.query:
            feed.client_ack(_step_param(request, "ack"))
        conn = self.guard.connection(request.transport) if self.guard is not None else None
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(feed.executor, self._take, feed, fmt)
        try:
            delivery, body = await asyncio.shield(fut)
        except asyncio.CancelledError:  # the client went away while waiting: keep what was taken
            fut.add_done_callback(lambda f: _giveback_later(feed, f))
            raise
        except FeedlineError as e:
            return _json_response(web, 500, {"error": type(e).__name__, "message": str(e)})
        if delivery is None:
            return web.Response(status=204, headers={"X-Feedline-End": str(feed.ended_at)})
        if body is None:  # JSON, or rows whose texts are re-read: not on the stream's thread
            try:
                body = await loop.run_in_executor(None, self._encode, feed.stream, delivery, fmt)
            except Exception:
                feed.giveback(delivery)
                raise
        # a Response sends its headers with the body (one segment: no Nagle/delayed-ACK stall);
        # preparing and finishing it here, not after the handler returns, lets a failed write give the batch back
        headers = {"Content-Type": fmt, "X-Feedline-Step": str(delivery.step)}
        if confirm:
            headers["X-Feedline-Ack-Within"] = f"{feed.hold:g}"
        resp = web.Response(body=body, headers=headers)
        try:
            await resp.prepare(request)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            feed.giveback(delivery)
            raise
        feed.ack(delivery)
        if confirm:
            feed.await_ack(delivery, feed.hold)
        settle = feed.unsettled(delivery, awaits_ack=confirm)
        if conn is not None:
            conn.watch(settle)   # a reset before the client shows it read the response: resent
        else:
            settle(True)
        return resp

    async def _ack(self, request: Any) -> Any:
        """``/ack?stream=NAME&step=N``: the client read step N in full (the at-least-once mode)."""
        from aiohttp import web

        feed = self._feed(request)
        step = _step_param(request, "step")
        if feed.client_ack(step):
            return _json_response(web, 200, {"acked": step})
        return _json_response(web, 409, {"error": "not awaiting an ack", "message": (
            f"step {step} of stream {feed.stream!r} is not awaiting an ack: acked already, not asked for with "
            f"confirm=1, or resent after {feed.hold:g} s without one")})

    def _take(self, feed: StreamFeed, fmt: str) -> tuple[Delivery | None, bytes | None]:
        """The next batch and, when cheap (msgpack without texts), its body: one thread hop per GET."""
        d = feed.take()
        if d is None or fmt == JSON or "key" in d.arrays:
            return d, None
        try:
            return d, self._encode(feed.stream, d, fmt)
        except Exception:
            feed.giveback(d)
            raise

    def _encode(self, stream: str, d: Delivery, fmt: str) -> bytes:
        out: dict[str, Any] = {"step": d.step, "stream": stream, "state": json.loads(d.state_json)}
        keys = d.arrays.get("key")
        if keys is not None and keys.ndim == 2 and keys.shape[1] == 3:
            idxs: list[tuple[int, int, int] | None] = [
                None if int(k[0]) < 0 else (int(k[0]), int(k[1]), int(k[2])) for k in keys]
            found = self.streams[stream].fetch([k for k in idxs if k is not None])
            out["idxs"] = [None if k is None else list(k) for k in idxs]
            out["texts"] = [None if k is None else found[k].get("text") for k in idxs]
        if fmt == JSON:
            for name, a in d.arrays.items():
                out[name] = a.tolist()
            return json.dumps(out, separators=(",", ":")).encode()
        for name, a in d.arrays.items():
            a = np.ascontiguousarray(a)
            out[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}
        return msgpack.packb(out, use_bin_type=True)  # type: ignore[no-any-return]

    async def _state(self, request: Any) -> Any:
        from aiohttp import web

        feed = self._feed(request)
        try:
            state = await asyncio.get_running_loop().run_in_executor(feed.executor, feed.state)
        except FeedlineError as e:
            return _json_response(web, 500, {"error": type(e).__name__, "message": str(e)})
        return web.Response(text=state, content_type=JSON)

    async def _stats_route(self, request: Any) -> Any:
        from aiohttp import web

        guard = self.guard
        http = {"requests": self.requests, "unauthorized": self.unauthorized,
                "connections": {"open": guard.open, "pending": len(guard.pending), "max": guard.max_connections,
                                **dataclasses.asdict(guard.counters)} if guard is not None else {},
                "streams": {n: {"served": f.served, "returned": f.returned, "resent": f.resent,
                                "ended_at": f.ended_at}
                            for n, f in self.feeds.items()}}
        return _json_response(web, 200, {"http": http, "server": self._stats()})

    async def _healthz(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text="ok\n")


def _negotiate(accept: str) -> str:
    """JSON when the client asks for it (and not for msgpack first); msgpack otherwise."""
    a = accept.lower()
    j, m = a.find(JSON), a.find("msgpack")
    return JSON if j >= 0 and (m < 0 or j < m) else MSGPACK


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


def _step_param(request: Any, name: str) -> int:
    from aiohttp import web

    text = request.query.get(name, "")
    if not text.isdigit() or len(text) > 18:
        raise web.HTTPBadRequest(text=json.dumps({"error": "bad step", "message": (
            f"{name}={text[:40]!r}: expected a step number, as the X-Feedline-Step header gave it")}),
            content_type=JSON)
    return int(text)


def _giveback_later(feed: StreamFeed, fut: Any) -> None:
    if not fut.cancelled() and fut.exception() is None and fut.result()[0] is not None:
        feed.giveback(fut.result()[0])


def _json_response(web: Any, status: int, body: Any, headers: Mapping[str, str] | None = None) -> Any:
    return web.Response(status=status, text=json.dumps(body), content_type=JSON, headers=headers)


def connection_cap(wanted: int) -> int:
    """``wanted``, or a quarter of the process's file-descriptor limit when that is smaller (the rest is
    left to ZeroMQ clients, files and threads)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):   # not on this platform
        return wanted
    if soft == resource.RLIM_INFINITY or soft // 4 >= wanted:
        return wanted
    cap = max(2, soft // 4)
    log.warning("HTTP: at most %d connections (a quarter of the file-descriptor limit %d), not %d", cap, soft, wanted)
    return cap
