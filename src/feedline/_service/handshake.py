"""The client's watch on its connection handshakes: a key problem is an ``AuthError`` within seconds.

ZeroMQ reports each handshake through a socket monitor. A refused client key (ZAP) or a
mechanism mismatch fails with a clear code; a *wrong server key* does not: the server cannot
decrypt the client's hello and closes the connection, which the client sees as a handshake
failure with no detail, again on every retry. Such failures are also what a server restarting
under a client looks like, so one is retried; failures that go on for ``bound`` seconds while
TCP connects fine, with no handshake completing, are the key problem they almost surely are::

    watch = HandshakeWatch(address, keys=keys, bound=5.0)
    monitor = sock.get_monitor_socket(MONITORED)
    watch.event(recv_monitor_message(monitor), now)    # raises AuthError when it is time
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import zmq

from feedline._service.auth import ClientKeys
from feedline.errors import AuthError

__all__ = ["MONITORED", "HandshakeWatch"]

_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
MONITORED = _FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED
# handshake failures that mean wrong or missing credentials; any other one (a peer closing during
# the handshake, e.g. a server shutting down while a successor starts) is retried like a lost server
_KEY_ERRORS: dict[int, str] = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "one side uses CurveZMQ keys and the other does not",
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "the CurveZMQ handshake failed (wrong server.key?)",
    zmq.PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE: "the CurveZMQ key exchange failed (wrong server.key?)"}


class HandshakeWatch:
    """Turns a connection's handshake events into ``AuthError`` (see the module docstring).

    Args:
        address: the server's address (for messages).
        keys: the client's keys (``None``: plaintext).
        bound: seconds of failing handshakes, none completing, after which a keyed client gives up.
    """

    def __init__(self, address: str, keys: ClientKeys | None, bound: float) -> None:
        self.address, self.keys, self.bound = address, keys, bound
        self.last_failure = ""              # for the TransportTimeout message
        self._failing_since: float | None = None
        self._failures = 0

    def event(self, event: Mapping[str, Any], now: float) -> None:
        """Take one monitor event.

        Raises:
            AuthError: the server refused this client's key, one side uses keys and the other does
                not, or (keyed) no handshake completed for ``bound`` seconds of failures.
        """
        kind, value = event.get("event"), int(event.get("value") or 0)
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._failing_since, self._failures, self.last_failure = None, 0, ""
            return
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH or (kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                                        and value in _KEY_ERRORS):
            why = _KEY_ERRORS.get(value, f"the server refused this client's key (ZAP status {value})")
            raise AuthError(f"{self.address} refused the connection handshake: {why}; "
                            + ("check the keys (server.key and client.key_secret) and that the server authorizes "
                               "this client" if self.keys else "the server requires CurveZMQ keys; pass keys=DIR"))
        name = "no detail" if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL else f"protocol error {value:#x}"
        self.last_failure = f"{name} (the peer closed or broke the handshake)"
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = now
        self.check(now)

    def check(self, now: float) -> None:
        """Raise ``AuthError`` when a keyed client's handshakes have failed for ``bound`` seconds."""
        if self.keys is None or self._failing_since is None or self._failures < 2:
            return
        if now - self._failing_since >= self.bound:
            raise AuthError(
                f"the CurveZMQ handshake with {self.address} never completed: {self._failures} attempts in "
                f"{now - self._failing_since:.1f}s reached the server and were closed during the handshake. The "
                "likely cause is a wrong server.key in this client's keys folder: it must be the server.key of the "
                "folder the server runs with ('feedline serve --keys DIR'); copy it again")
