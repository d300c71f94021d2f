"""The transport seam between the dispatcher and the network.

The dispatcher (:mod:`.dispatch`) never touches a socket: it calls ``transport.send(ident,
frames)`` and is handed what arrives. :class:`RouterTransport` is the ZeroMQ ROUTER of
``feedline serve``; :class:`InProcTransport` keeps what was sent in memory, so the protocol
logic (hello, credit, replacement, leases, errors) is testable without sockets::

    >>> from feedline._service.protocol import pack
    >>> t = InProcTransport()
    >>> t.send(b"c1", [pack("pong")])
    True
    >>> [h["op"] for h, _ in t.take(b"c1")]
    ['pong']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import zmq

from feedline._service.protocol import split_batches, unpack_header

__all__ = ["InProcTransport", "RouterTransport", "Transport"]

_MORE, _LAST = int(zmq.NOBLOCK | zmq.SNDMORE), int(zmq.NOBLOCK)


class Transport(Protocol):
    """Sends one multipart message to one peer, never blocking."""

    def send(self, ident: bytes, frames: Sequence[Any], copy: bool = True) -> bool | None:
        """True: sent; False: the peer is busy (retry later); None: the peer is gone."""


class RouterTransport:
    """A ZeroMQ ROUTER socket with ``ROUTER_MANDATORY``: sends are non-blocking and report gone peers."""

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self.sock = sock

    def send(self, ident: bytes, frames: Sequence[Any], copy: bool = True) -> bool | None:
        sock = self.sock
        try:   # send_multipart's checks and enum flag arithmetic cost more than the sends themselves
            sock.send(ident, _MORE)   # with ROUTER_MANDATORY only this first part can fail
            for frame in frames[:-1]:
                sock.send(frame, _MORE, copy=copy)
            sock.send(frames[-1], _LAST, copy=copy)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                return None
            raise


class InProcTransport:
    """Keeps sent messages per peer as ``(header, [buffer bytes])``; peers can be made busy or gone.

    A ``batches`` message is kept as one ``batch`` record per step (its item's header and bytes), so
    what a peer was sent reads step by step however the dispatcher grouped the steps; ``messages``
    counts the messages themselves.
    """

    def __init__(self) -> None:
        self.outbox: dict[bytes, list[tuple[dict[str, Any], list[bytes]]]] = {}
        self.busy: set[bytes] = set()
        self.gone: set[bytes] = set()
        self.messages = 0

    def send(self, ident: bytes, frames: Sequence[Any], copy: bool = True) -> bool | None:
        if ident in self.gone:
            return None
        if ident in self.busy:
            return False
        header = unpack_header(bytes(frames[0]))
        buffers = [np.ascontiguousarray(f).tobytes() if isinstance(f, np.ndarray) else bytes(f) for f in frames[1:]]
        box = self.outbox.setdefault(ident, [])
        self.messages += 1
        if header["op"] == "batches":
            box.extend(({"op": "batch", **item}, [bytes(buf)]) for item, buf in split_batches(header, buffers[0]))
        else:
            box.append((header, buffers))
        return True

    def take(self, ident: bytes) -> list[tuple[dict[str, Any], list[bytes]]]:
        """What was sent to ``ident`` since the last call."""
        return self.outbox.pop(ident, [])
