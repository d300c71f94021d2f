"""How a loader server binds, buffers and polices its clients: :class:`ServerOptions`.

    >>> ServerOptions(bind="tcp://127.0.0.1:0", window=16).max_cursors
    8
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from feedline._service.auth import ServerKeys, check_bind, check_metrics_host
from feedline.errors import SpecError

__all__ = ["ServerOptions"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerOptions:
    """How a server binds, buffers and polices its clients.

    Attributes:
        bind: ``tcp://host:port`` (port 0 picks a free one) or ``ipc://path``; loopback by default.
        window: global steps buffered ahead of the slowest rank (bounds memory and lead).
        max_prefetch: the most batches one client may have in flight; a client's declared
            ``prefetch`` is capped to it, and so is what the server pre-produces for it (shared).
        lease: shared mode: seconds a client may hold a batch unacked before it is re-delivered
            to another consumer (at-least-once); keep it above the time a consumer needs for
            ``prefetch + 1`` batches.
        heartbeat: seconds between client pings (told to clients in the welcome; 0.01 to 3600, the
            range a client accepts).
        timeout: seconds of silence after which a client is dropped (shared mode: re-delivered).
        max_message: largest inbound message in bytes; bigger ones drop the connection.
        keys: CurveZMQ server keys; ``None`` for plaintext (loopback or ``insecure`` only).
        insecure: allow a plaintext bind outside loopback.
        drain_timeout: on stop, seconds to wait for shared-mode clients to ack their batches.
        idle_close: seconds a cursor without clients is kept for reconnects before it is closed.
        max_cursors: ranked cursors (each a pipeline and a producer thread) per stream; when full,
            the longest-idle cursor is closed, and with none idle a new job's hello is refused.
        metrics_port: serve Prometheus metrics on this port (``None``: off; 0: any free port).
        metrics_host: the address the metrics endpoint binds; off loopback with ``keys`` it is
            refused unless ``metrics_insecure``.
        metrics_insecure: allow an unauthenticated metrics endpoint off loopback for a keyed service.
        progress: print a one-line progress display on standard error when it is a terminal.
        state: a file to resume each stream's shared-mode queue (and so the HTTP gateway) from
            when it exists, rewritten atomically at most once a second when a watermark moved and
            once at shutdown: a restart with the same file continues after the last step written
            (docs/service.md, HTTP).
        coalesce: steps one message may carry; with fewer ready (and credit for more) a send
            waits up to 2 ms to gather them, which a fast pipeline needs (each message costs both
            sides a fixed amount); 1 sends every step alone, at once.
    """

    bind: str = "tcp://127.0.0.1:5555"
    window: int = 16
    max_prefetch: int = 16
    lease: float = 60.0
    heartbeat: float = 1.0
    timeout: float = 10.0
    max_message: int = 16 << 20
    keys: ServerKeys | None = None
    insecure: bool = False
    drain_timeout: float = 10.0
    idle_close: float = 60.0
    max_cursors: int = 8
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_insecure: bool = False
    progress: bool = False
    state: str | None = None
    coalesce: int = 4

    def __post_init__(self) -> None:
        if self.window < 1 or self.max_prefetch < 1 or self.max_cursors < 1 or self.coalesce < 1:
            raise SpecError(f"window ({self.window}), max_prefetch ({self.max_prefetch}), max_cursors "
                            f"({self.max_cursors}) and coalesce ({self.coalesce}) must be >= 1")
        if not (math.isfinite(self.lease) and self.lease > 0):
            raise SpecError(f"lease ({self.lease}s) must be a finite number > 0")
        if not (math.isfinite(self.idle_close) and self.idle_close >= 0):
            raise SpecError(f"idle_close ({self.idle_close}s) must be a finite number >= 0")
        if not (0.01 <= self.heartbeat <= 3600 and self.heartbeat < self.timeout):
            raise SpecError(f"heartbeat ({self.heartbeat}s) must be in [0.01, 3600] (what clients accept) and below "
                            f"timeout ({self.timeout}s)")
        check_bind(self.bind, self.keys, self.insecure)
        if self.metrics_port is not None:
            check_metrics_host(self.metrics_host, self.keys, self.metrics_insecure)
