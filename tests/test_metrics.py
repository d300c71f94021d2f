"""The Prometheus endpoint, scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import feedline
from feedline._service.server import Server, ServerOptions
from feedline._service.streams import load_streams
from feedline.testing import collect
from service_helpers import make_spec, tokenizer_path

pytestmark = pytest.mark.timeout(90)


def scrape(port: int) -> dict[str, Any]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(body)}


def _sent(fams: dict[str, Any]) -> float:
    """The batches sent, as the scraped snapshot counts them (0 before the first)."""
    family = fams.get("feedline_batches")
    return sum(s.value for s in family.samples if s.name == "feedline_batches_total") if family else 0.0


@pytest.mark.slow
def test_metrics_are_typed_documented_and_parse(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, tokenizer_path(tmp_path), docs=30)
    server = Server(load_streams(spec, {}), ServerOptions(bind="tcp://127.0.0.1:0", metrics_port=0, window=4))
    address = server.bind()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        assert server.metrics_port is not None
        with feedline.Loader(address, mode="shared") as shared, feedline.Loader(address) as ranked:
            n = len(collect(shared, limit=3)) + len(collect(ranked, limit=2))
            deadline = time.monotonic() + 10
            while True:   # the endpoint reads the snapshot taken once a second: the first one after these batches
                fams = scrape(server.metrics_port)
                if _sent(fams) >= n or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
    finally:
        server.stop()
        thread.join(timeout=30)
    assert all(f.documentation for f in fams.values())                        # every family has HELP
    batches = fams["feedline_batches"]
    assert batches.type == "counter"
    [sample] = [s for s in batches.samples if s.name == "feedline_batches_total"]
    assert sample.labels == {"stream": "train"} and sample.value >= n
    assert fams["feedline_tokens"].type == "counter" and fams["feedline_tokens_per_s"].type == "gauge"
    hist = fams["feedline_batch_latency_seconds"]
    assert hist.type == "histogram"
    count = next(s.value for s in hist.samples if s.name.endswith("_count"))
    inf = next(s.value for s in hist.samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf")
    assert count == inf == sample.value                                       # one observation per batch sent
    buckets = [s.value for s in hist.samples if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets)                                         # cumulative
    assert fams["feedline_shared_queued"].type == "gauge" and fams["feedline_shared_queued"].samples
    fill = fams["feedline_window_fill"]
    assert fill.type == "gauge" and all(0 <= s.value <= 1 for s in fill.samples) and fill.samples
    assert fams["feedline_clients_connected"].samples[0].value == 2
