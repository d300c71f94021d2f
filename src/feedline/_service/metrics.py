"""Service metrics: counters with rates, a latency histogram, and the Prometheus endpoint.

The server's event loop builds a stats snapshot (a plain dict, also what ``feedline stats``
prints) once a second; the Prometheus collector (:mod:`prometheus_client`) only ever reads the
latest snapshot, so scraping never touches live server state. Monotonic totals are counters
(``_total``), levels are gauges, and the time from a batch's production to its send is a
histogram::

    >>> text = render_prometheus({"streams": {"train": {"batches": 3, "tokens_per_s": 9.5}}, "clients": []})
    >>> for line in text.splitlines():
    ...     if "batches_total" in line:
    ...         print(line)
    # HELP feedline_batches_total Batches (rank slices or shared batches) sent to clients.
    # TYPE feedline_batches_total counter
    feedline_batches_total{stream="train"} 3.0
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from feedline._state import filtered_in, find_rejected, mixture_shares
from feedline.errors import TransportError

__all__ = ["LATENCY_BUCKETS", "LatencyHistogram", "MetricsEndpoint", "Rate", "SnapshotCollector", "StreamCounters",
           "find_rejected", "mixture_shares", "render_prometheus"]

#: Upper bounds (seconds) of the batch latency histogram.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


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


class LatencyHistogram:
    """Counts of latencies per bucket (cumulative on export), their sum and count.

        >>> h = LatencyHistogram(); h.observe(0.003); h.observe(0.2)
        >>> h.snapshot()["count"], h.snapshot()["buckets"][2]
        (2, [0.005, 1])
    """

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> dict[str, Any]:
        cumulative, total = [], 0
        for bound, n in zip(self.bounds, self.counts):
            total += n
            cumulative.append([bound, total])
        return {"buckets": cumulative, "count": total + self.counts[-1], "sum": round(self.sum, 6)}


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
        self.latency = LatencyHistogram()
        self.last_state: Mapping[str, Any] | None = None

    def record(self, rows: int, tokens: int, slots: int, nbytes: int, latency: float | None = None) -> None:
        """Count one batch sent; ``latency``: seconds from its production to its send."""
        if latency is not None:
            self.latency.observe(max(0.0, latency))
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
        out["filtered"] = filtered_in(self.last_state)  # dropped by the spec's filter transforms
        out["mixture"] = mixture_shares(self.last_state)
        out["latency"] = self.latency.snapshot()
        return out


_STREAM_COUNTERS = {
    "steps": "Highest global step sent to any client.",
    "batches": "Batches (rank slices or shared batches) sent to clients.",
    "rows": "Rows sent to clients.",
    "tokens": "Real (non-padding) tokens sent to clients.",
    "bytes": "Array bytes sent to clients.",
}
_STREAM_GAUGES = {
    "batches_per_s": "Batches sent per second over the last 5 seconds.",
    "tokens_per_s": "Real tokens sent per second over the last 5 seconds.",
    "bytes_per_s": "Array bytes sent per second over the last 5 seconds.",
    "efficiency": "Real tokens over token slots sent (padding or packing efficiency).",
}


class SnapshotCollector:
    """A :mod:`prometheus_client` collector over the server's latest stats snapshot."""

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]], window: int | None = None) -> None:
        self.snapshot = snapshot
        self.window = window

    def collect(self) -> Iterator[Metric]:
        stats = self.snapshot()
        streams: Mapping[str, Any] = stats.get("streams", {})
        for key, help_text in _STREAM_COUNTERS.items():
            fam = CounterMetricFamily(f"feedline_{key}", help_text, labels=["stream"])
            for name, st in streams.items():
                if _number(st.get(key)):
                    fam.add_metric([name], st[key])
            yield fam
        for key, help_text in _STREAM_GAUGES.items():
            g = GaugeMetricFamily(f"feedline_{key}", help_text, labels=["stream"])
            for name, st in streams.items():
                if _number(st.get(key)):
                    g.add_metric([name], st[key])
            yield g
        rejected = CounterMetricFamily("feedline_rejected_records", "Records skipped, by reason.",
                                       labels=["stream", "reason"])
        filtered = CounterMetricFamily("feedline_filtered_records", "Records dropped by the spec's filter transforms.",
                                       labels=["stream"])
        mixture = GaugeMetricFamily("feedline_mixture_share", "Realised share of records read from each source.",
                                    labels=["stream", "source"])
        latency = HistogramMetricFamily("feedline_batch_latency_seconds",
                                        "Seconds from a batch's production to its send to a client.", labels=["stream"])
        queued = GaugeMetricFamily("feedline_shared_queued", "Shared mode: batches produced and waiting for a client.",
                                   labels=["stream"])
        in_flight = GaugeMetricFamily("feedline_shared_in_flight", "Shared mode: batches sent and not yet acked.",
                                      labels=["stream"])
        redelivered = CounterMetricFamily("feedline_shared_redelivered",
                                          "Shared mode: batches re-queued after their client went away.",
                                          labels=["stream"])
        depth = GaugeMetricFamily("feedline_cursor_depth", "Ranked mode: global steps buffered in a cursor's window.",
                                  labels=["stream", "world_size"])
        fill = GaugeMetricFamily("feedline_window_fill", "Ranked mode: buffered steps over the window size (0-1).",
                                 labels=["stream", "world_size"])
        for name, st in streams.items():
            for reason, n in (st.get("rejected") or {}).items():
                rejected.add_metric([name, str(reason)], n)
            if st.get("filtered"):
                filtered.add_metric([name], st["filtered"])
            for i, share in enumerate(st.get("mixture") or []):
                mixture.add_metric([name, str(i)], share)
            lat = st.get("latency")
            if lat:
                buckets = [(_le(b), float(c)) for b, c in lat["buckets"]] + [("+Inf", float(lat["count"]))]
                latency.add_metric([name], buckets, lat["sum"])
            shared = st.get("shared")
            if shared:
                queued.add_metric([name], shared.get("queued", 0))
                in_flight.add_metric([name], shared.get("in_flight", 0))
                redelivered.add_metric([name], shared.get("redelivered", 0))
            for c in st.get("cursors") or []:
                labels = [name, str(c.get("world_size"))]
                depth.add_metric(labels, c.get("depth", 0))
                if self.window:
                    fill.add_metric(labels, min(1.0, c.get("depth", 0) / self.window))
        yield from (rejected, filtered, mixture, latency, queued, in_flight, redelivered, depth, fill)
        labels = ["client", "stream", "rank"]
        credit = GaugeMetricFamily("feedline_client_credit", "Batches a client may still receive.", labels=labels)
        lag = GaugeMetricFamily("feedline_client_lag", "Steps produced minus steps the client consumed.", labels=labels)
        sent = CounterMetricFamily("feedline_client_sent", "Batches sent to a client.", labels=labels)
        for c in stats.get("clients", []):
            lab = [str(c.get("id", "")), str(c.get("stream", "")), str(c.get("rank", ""))]
            credit.add_metric(lab, c.get("credit", 0))
            lag.add_metric(lab, c.get("lag", 0))
            sent.add_metric(lab, c.get("sent", 0))
        yield from (credit, lag, sent)
        connected = GaugeMetricFamily("feedline_clients_connected", "Clients connected now.")
        connected.add_metric([], stats.get("clients_connected", 0))
        uptime = GaugeMetricFamily("feedline_uptime_seconds", "Seconds since the server started.")
        uptime.add_metric([], stats.get("uptime_s", 0))
        malformed = CounterMetricFamily("feedline_malformed_messages", "Malformed messages received.")
        malformed.add_metric([], stats.get("malformed", 0))
        yield from (connected, uptime, malformed)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _le(bound: float) -> str:
    return repr(float(bound))


def render_prometheus(stats: Mapping[str, Any], window: int | None = None) -> str:
    """The Prometheus text exposition of a stats snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: stats, window))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


class MetricsEndpoint:
    """``GET /metrics`` on ``host:port`` (``prometheus_client``'s server, a daemon thread) over the latest snapshot."""

    def __init__(self, port: int, snapshot: Callable[[], Mapping[str, Any]], host: str = "127.0.0.1",
                 window: int | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(snapshot, window))  # type: ignore[arg-type]
        try:
            self.httpd, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise TransportError(f"--metrics-port {port}: cannot listen on {host}:{port} ({e.strerror or e}); "
                                 "choose another port, or 0 for any free one") from e
        self.port = int(self.httpd.server_address[1])

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
