"""Where the HTTP gateway listens and who may use it: options, ``--http`` parsing, the token rule."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from pathlib import Path

from feedline.errors import SpecError

__all__ = ["HttpOptions", "check_http_bind", "parse_http_bind", "read_token"]


@dataclass(frozen=True, kw_only=True, slots=True)
class HttpOptions:
    """Where the HTTP gateway listens and who may use it.

    Attributes:
        host, port: the listening address (port 0 picks a free one).
        token: the bearer token; required outside loopback.
        prefetch: batches each stream keeps in flight from the server.
        timeout: seconds of server silence before the gateway's connection reconnects.
        max_connections: open HTTP connections at most (lowered to a quarter of the process's
            file-descriptor limit when that is smaller); see :mod:`.http_guard`.
        max_pending: connections at most that have not yet sent complete, authorized headers;
            a new one evicts the oldest.
        header_timeout: seconds a connection has to send its request headers; an admitted one
            idle for this long between requests (keep-alive) is closed too.

        >>> HttpOptions(host="0.0.0.0", port=8080)
        Traceback (most recent call last):
        ...
        feedline.errors.SpecError: refusing to serve HTTP on 0.0.0.0 without a token: ...
    """

    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    prefetch: int = 4
    timeout: float = 30.0
    max_connections: int = 512
    max_pending: int = 64
    header_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.max_connections < 2 or not 1 <= self.max_pending < self.max_connections:
            raise SpecError(f"HTTP max_connections ({self.max_connections}) must be >= 2 and max_pending "
                            f"({self.max_pending}) in [1, max_connections)")
        if not (math.isfinite(self.header_timeout) and self.header_timeout > 0):
            raise SpecError(f"HTTP header_timeout ({self.header_timeout}s) must be a finite number > 0")
        if not 0 <= self.port < 65536:
            raise SpecError(f"HTTP port {self.port} is not in [0, 65535]")
        if self.prefetch < 1:
            raise SpecError(f"HTTP prefetch ({self.prefetch}) must be >= 1")
        check_http_bind(self.host, self.token)


def parse_http_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[v6]:PORT``, or ``:PORT`` for loopback) to ``(host, port)``.

        >>> parse_http_bind("127.0.0.1:8080"), parse_http_bind(":0"), parse_http_bind("[::1]:80")
        (('127.0.0.1', 8080), ('127.0.0.1', 0), ('::1', 80))
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise SpecError(f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_http_bind(host: str, token: str | None) -> None:
    """Refuse to listen outside loopback without a bearer token (the ZeroMQ rule without keys)."""
    if token is None and not _loopback(host):
        raise SpecError(
            f"refusing to serve HTTP on {host} without a token: anyone on the network could take the data. "
            "Write a secret to a file and pass --http-token-file FILE (clients send 'Authorization: Bearer "
            "SECRET'), or listen on 127.0.0.1")


def read_token(path: str | Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped); refuses an empty file."""
    p = Path(path)
    try:
        token = p.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise SpecError(f"{p}: cannot read the HTTP token file ({e.strerror})") from e
    if len(token) < 16:
        raise SpecError(f"{p}: the HTTP token must be at least 16 characters (e.g. "
                        f"python -c 'import secrets; print(secrets.token_urlsafe(32))' > {p})")
    return token
