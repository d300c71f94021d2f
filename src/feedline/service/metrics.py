"""Service metrics: counters with rates, the Prometheus text format, and its HTTP endpoint.

The server's event loop builds a stats snapshot (a plain dict, also what ``feedline stats``
prints) once a second; the HTTP endpoint only ever reads the latest snapshot, so scraping
never touches live server state::

    >>> print(render_prometheus({"streams": {"train": {"steps": 3, "tokens_per_s": 9.5}}, "clients": []}))
    # TYPE feedline_steps gauge
    feedline_steps{stream="train"} 3
    # TYPE feedline_tokens_per_s gauge
    feedline_tokens_per_s{stream="train"} 9.5
    <BLANKLINE>
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from feedline.state import find_rejected, mixture_shares

__all__ = ["MetricsEndpoint", "Rate", "StreamCounters", "find_rejected", "mixture_shares", "render_prometheus"]


class Rate:
    """Per-second rate of a growing counter over the last ``span`` seconds."""

    def __init__(self, span: float = 5.0) -> None:
        self.span = span
        self.samples: deque[tuple[float, float]] = deque()

    def update(self, value: float, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self.samples.append((now, value))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.span:
            self.samples.popleft()
        (t0, v0), (t1, v1) = self.samples[0], self.samples[-1]
        return (v1 - v0) / (t1 - t0) if t1 > t0 else 0.0


class StreamCounters:
    """What one stream has delivered: rows, real tokens, token slots, bytes, global steps."""

    def __init__(self) -> None:
        self.steps = 0
        self.batches = 0
        self.rows = 0
        self.tokens = 0
        self.slots = 0
        self.bytes = 0
        self.rates = {name: Rate() for name in ("batches", "tokens", "bytes")}
        self.last_state: Mapping[str, Any] | None = None

    def record(self, rows: int, tokens: int, slots: int, nbytes: int) -> None:
        self.batches += 1
        self.rows += rows
        self.tokens += tokens
        self.slots += slots
        self.bytes += nbytes

    def snapshot(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"steps": self.steps, "batches": self.batches, "rows": self.rows,
                               "tokens": self.tokens, "bytes": self.bytes,
                               "efficiency": round(self.tokens / self.slots, 4) if self.slots else None}
        for name, rate in self.rates.items():
            out[f"{name}_per_s"] = round(rate.update(getattr(self, name), now), 2)
        rejected: dict[str, int] = {}
        find_rejected(self.last_state, rejected)
        out["rejected"] = rejected
        out["mixture"] = mixture_shares(self.last_state)
        return out


def render_prometheus(stats: Mapping[str, Any]) -> str:
    """The Prometheus text exposition of a stats snapshot (numeric values only)."""
    series: dict[str, list[str]] = {}

    def add(name: str, labels: Mapping[str, Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        lab = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        series.setdefault(f"feedline_{name}", []).append(f"feedline_{name}{{{lab}}} {value}")

    for stream, st in stats.get("streams", {}).items():
        for key, value in st.items():
            if key == "rejected":
                for reason, n in value.items():
                    add("rejected_records", {"stream": stream, "reason": reason}, n)
            elif key == "mixture" and value:
                for i, share in enumerate(value):
                    add("mixture_share", {"stream": stream, "source": i}, share)
            else:
                add(key, {"stream": stream}, value)
    for c in stats.get("clients", []):
        labels = {"client": c.get("id", ""), "stream": c.get("stream", ""), "rank": c.get("rank", "")}
        for key in ("credit", "lag", "sent"):
            add(f"client_{key}", labels, c.get(key))
    for key in ("clients_connected", "uptime_s"):
        add(key, {}, stats.get(key))
    lines = []
    for name, rows in series.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(rows)
    return "\n".join(lines) + "\n"


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsEndpoint:
    """``GET /metrics`` on ``host:port`` serving the latest snapshot; runs in a daemon thread."""

    def __init__(self, port: int, snapshot: Callable[[], Mapping[str, Any]], host: str = "127.0.0.1") -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = render_prometheus(snapshot()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="feedline-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
