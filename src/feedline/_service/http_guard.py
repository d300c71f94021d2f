"""Admission of the HTTP gateway's connections: caps, header deadlines, the token before anything is held.

    guard = ConnectionGuard(runner.server, token=b"...", max_connections=512, max_pending=64,
                            header_timeout=10.0)
    server = await loop.create_server(guard, host, port)   # every connection goes through the guard

A connection is *pending* until its first request's headers have arrived and carry the token (or
no token is set, or it asks for ``/healthz``): only then is it handed to aiohttp, so a pending
connection holds a socket and a small buffer, never a task, a request or a batch. Pending
connections have ``header_timeout`` seconds to send their headers (a slow or silent one is
closed: ``408``), at most 16 KiB of them (``431``), and a wrong or missing token is answered
``401`` and closed on the spot. At most ``max_pending`` are pending: a new connection evicts the
oldest pending one (an honest client sends its headers within milliseconds). At most
``max_connections`` are open: beyond that a new one evicts the oldest pending one, or is closed
at once when all are admitted. So HTTP clients hold a bounded number of descriptors, and the
ZeroMQ clients of the same process never starve for them.

Once admitted, aiohttp sees the connection through :class:`_Lingering`, whose ``close`` does not
close at once while a response waits to be settled (:meth:`_Guarded.watch`): it half-closes (a
FIN after the response) and waits, at most ``header_timeout``, for the client's side: a client
that read everything closes cleanly (settled as read), one that closes with the response unread
sends a reset (settled as not read). So a ``Connection: close`` request is settled as surely as a
kept-alive one.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ConnectionGuard", "GuardCounters", "bearer_matches"]

MAX_HEAD = 16 << 10   # bytes of request line and headers a pending connection may send


@dataclass(slots=True)
class GuardCounters:
    """What the guard turned away (in the gateway's ``/stats``)."""

    admitted: int = 0
    peak_open: int = 0      # the most connections open at once
    refused: int = 0        # over max_connections with nobody pending to evict
    evicted: int = 0        # pending ones closed to make room
    timed_out: int = 0      # no complete headers within header_timeout
    unauthorized: int = 0   # headers without the token
    oversized: int = 0      # headers over MAX_HEAD


class ConnectionGuard:
    """A protocol factory for ``loop.create_server`` in front of aiohttp's; see the module docstring."""

    def __init__(self, factory: Callable[[], Any], *, token: bytes | None, max_connections: int, max_pending: int,
                 header_timeout: float) -> None:
        self.factory = factory
        self.token = token
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.header_timeout = header_timeout
        self.open = 0
        self.pending: OrderedDict[_Guarded, None] = OrderedDict()   # oldest first
        self.counters = GuardCounters()
        self.by_transport: dict[Any, _Guarded] = {}
        self.closing = False   # the gateway is shutting down: closes do not linger

    def connection(self, transport: Any) -> _Guarded | None:
        """The guarded connection of a request's transport (``None``: already gone)."""
        return self.by_transport.get(transport)

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self)

    def admit(self, conn: _Guarded) -> bool:
        """Count a new connection in; ``False`` when it must be closed at once."""
        if self.open >= self.max_connections or len(self.pending) >= self.max_pending:
            if self.pending:
                oldest = next(iter(self.pending))
                self.counters.evicted += 1
                oldest.drop()
            elif self.open >= self.max_connections:
                self.counters.refused += 1
                return False
        self.open += 1
        self.counters.peak_open = max(self.counters.peak_open, self.open)
        self.pending[conn] = None
        return True

    def close_pending(self) -> None:
        """Close every connection still pending (at shutdown; admitted ones are aiohttp's, and no
        longer linger)."""
        self.closing = True
        for conn in list(self.pending):
            conn.drop()

    def authorized(self, head: bytes) -> bool:
        """Whether a request head may be handed on: no token set, ``/healthz``, or the right bearer token."""
        if self.token is None:
            return True
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) >= 2 and parts[1].split(b"?", 1)[0] == b"/healthz":
            return True
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                return bearer_matches(value, self.token)
        return False


def bearer_matches(authorization: bytes | str, token: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer TOKEN`` (the scheme in any case), the token
    compared in constant time. The one check of the guard (raw headers) and the gateway (every later
    request of a kept-alive connection); a value that is not UTF-8 (aiohttp keeps its bytes as
    surrogates) is compared as its bytes, so it is refused, never an error.
    """
    raw = authorization.encode("utf-8", "surrogateescape") if isinstance(authorization, str) else authorization
    scheme, _, given = raw.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


_UNAUTHORIZED = json.dumps({"error": "unauthorized", "message": "send 'Authorization: Bearer TOKEN'"}).encode()


def _reply(status: str, body: bytes = b"", extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}"
            "Connection: close\r\n\r\n").encode() + body


class _Guarded(asyncio.Protocol):
    """One connection: buffered until its headers are complete and authorized, then aiohttp's."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.inner: Any = None
        self.head = bytearray()
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False
        self.watchers: list[Callable[[bool], None]] = []
        self.outcome: bool | None = None   # once lost: True closed cleanly, False reset or failed
        self.eof = False                   # the client closed its side
        self.linger_timer: asyncio.TimerHandle | None = None
        self.proxy: _Lingering | None = None   # the transport aiohttp sees, once admitted

    def watch(self, settle: Callable[[bool], None]) -> None:
        """Call ``settle(True)`` once the client shows it read the responses written so far (it sent
        another request, or the connection closed without an error), ``settle(False)`` if the
        connection fails first (a reset: a client closing with a response unread sends one)."""
        if self.outcome is not None:
            settle(self.outcome)
        else:
            self.watchers.append(settle)

    def _settle(self, ok: bool) -> None:
        watchers, self.watchers = self.watchers, []
        for settle in watchers:
            settle(ok)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport   # type: ignore[assignment]
        self.guard.by_transport[transport] = self
        if not self.guard.admit(self):
            transport.abort()   # type: ignore[attr-defined]
            return
        self.counted = True
        self.timer = asyncio.get_running_loop().call_later(self.guard.header_timeout, self._timed_out)

    def data_received(self, data: bytes) -> None:
        if self.linger_timer is not None:
            return   # closing: aiohttp takes nothing more
        if self.inner is not None:
            if self.watchers:   # the next request: the previous responses were read
                self._settle(True)
            self.inner.data_received(data)
            return
        if self.transport is None or self.transport.is_closing():
            return
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD:
                self.guard.counters.oversized += 1
                self._answer("431 Request Header Fields Too Large")
            return
        if not self.guard.authorized(bytes(self.head[:end])):
            self.guard.counters.unauthorized += 1
            self._answer("401 Unauthorized", _UNAUTHORIZED, 'WWW-Authenticate: Bearer realm="feedline"\r\n')
            return
        self._handover()

    def _handover(self) -> None:
        self._unpend()
        self.guard.counters.admitted += 1
        self.inner = self.guard.factory()
        proxy = _Lingering(self, self.transport)
        self.guard.by_transport[proxy] = self   # what aiohttp's request.transport is
        self.proxy = proxy
        self.inner.connection_made(proxy)
        data, self.head = bytes(self.head), bytearray()
        self.inner.data_received(data)

    def _timed_out(self) -> None:
        self.timer = None
        if self.inner is None:
            self.guard.counters.timed_out += 1
            self._answer("408 Request Timeout")

    def _answer(self, status: str, body: bytes = b"", extra: str = "") -> None:
        self._unpend()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_reply(status, body, extra))
            self.transport.close()

    def drop(self) -> None:
        """Close at once, without an answer (evicted, or the gateway is closing); its slot is free now."""
        self._unpend()
        if self.counted:
            self.counted = False
            self.guard.open -= 1
        if self.transport is not None:
            self.transport.abort()

    def _unpend(self) -> None:
        self.guard.pending.pop(self, None)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def linger(self) -> None:
        """aiohttp closes: at once when nothing waits to be settled, else half-close and wait for the
        client's FIN (read) or reset (not read), at most ``header_timeout`` (then: read)."""
        real = self.transport
        if real is None or real.is_closing():
            return
        if not self.watchers or self.eof or self.guard.closing:
            if self.eof:
                self._settle(True)
            real.close()
            return
        try:
            if real.can_write_eof():
                real.write_eof()
            if not real.is_reading():
                real.resume_reading()
        except (OSError, RuntimeError):   # the reset came first (not read by the loop yet): not read
            self._settle(False)
            real.close()
            return
        self.linger_timer = asyncio.get_running_loop().call_later(self.guard.header_timeout, self._lingered)

    def _lingered(self) -> None:
        self._settle(True)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._unpend()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        self.guard.by_transport.pop(self.transport, None)
        self.guard.by_transport.pop(self.proxy, None)
        self.outcome = exc is None
        self._settle(self.outcome)
        if self.counted:
            self.counted = False
            self.guard.open -= 1
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        self.eof = True
        if self.linger_timer is not None:   # the client closed after the whole response: it read it
            self._lingered()
            return None
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class _Lingering:
    """The transport aiohttp is given: the real one, except that ``close`` lingers (:meth:`_Guarded.linger`)."""

    def __init__(self, conn: _Guarded, real: Any) -> None:
        self._conn = conn
        self._real = real
        self._closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def is_closing(self) -> bool:
        return self._closing or bool(self._real.is_closing())

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._conn.linger()

    def abort(self) -> None:
        self._closing = True
        self._real.abort()
