"""What ``feedline stats`` and the metrics endpoint show: a JSON snapshot of a dispatcher.

    >>> snapshot(dispatcher, address="tcp://127.0.0.1:5555", uptime=12.5)["clients_connected"]  # doctest: +SKIP
    2
    >>> progress_line({"clients": [], "streams": {}})
    'feedline serve: 0 clients'
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from feedline._service.protocol import PROTOCOL_VERSION

if TYPE_CHECKING:
    from feedline._service.dispatch import Dispatcher

__all__ = ["progress_line", "snapshot"]


def snapshot(d: Dispatcher, *, address: str | None, uptime: float, unauthenticated: int = 0) -> dict[str, Any]:
    """Per-stream rates and efficiency, cursors, shared queues and clients, as plain JSON values."""
    now = time.monotonic()
    streams: dict[str, Any] = {}
    for name, counters in d.counters.items():
        st = counters.snapshot(now)
        st["spec_hash"] = d.hashes[name]
        st["cursors"] = [{"world_size": c.world_size, "low": c.low, "produced": c.produced, "depth": c.depth,
                          "ended_at": c.ended_at, "ranks_connected": len(c.clients())}
                         for (s, _w), cs in d.cursors.items() if s == name for c in cs]
        q = d.queues.get(name)
        st["shared"] = None if q is None else {
            "watermark": q.watermark, "queued": q.depth, "in_flight": q.in_flight,
            "redelivered": q.redelivered, "lease_expired": q.lease_expired, "ended_at": q.ended_at}
        streams[name] = st
    clients = [{"id": c.ident.hex(), "stream": c.stream, "mode": c.mode, "rank": c.rank,
                "world_size": c.world_size, "credit": c.credit, "sent": c.sent,
                "lag": max(0, c.delivery.produced - c.acked), "idle_s": round(now - c.last_seen, 2)}
               for c in d.clients.values()]
    return {"version": PROTOCOL_VERSION, "address": address, "uptime_s": round(uptime, 1),
            "draining": d.stopping, "clients_connected": len(clients), "malformed": d.malformed,
            "internal_errors": d.internal_errors, "unauthenticated": unauthenticated,
            "streams": streams, "clients": clients}


def progress_line(s: dict[str, Any]) -> str:
    """The one-line progress display of ``feedline serve``."""
    parts = [f"{len(s['clients'])} clients"] + [
        f"{name}: step {st['steps']}, {st['batches_per_s']:.1f} batches/s, {st['tokens_per_s']:,.0f} tok/s"
        for name, st in s["streams"].items() if st["batches"]
    ]
    return "feedline serve: " + " | ".join(parts)
