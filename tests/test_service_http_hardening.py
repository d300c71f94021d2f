"""The HTTP gateway across pauses, restarts and hostile connections: real `feedline serve --http` processes."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from service_helpers import http_get, make_spec, start_http, stop_http, tokenizer_path, write_spec

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("http-hard")
    spec = make_spec(tmp, tokenizer_path(tmp), docs=60)
    return {"tmp": tmp, "spec": spec, "path": write_spec(tmp / "train.json", spec)}


def _steps(url: str, n: int | None = None, **kw: Any) -> list[int]:
    """The steps of the next ``n`` GETs (all of them until 204 when ``n`` is None)."""
    out: list[int] = []
    while n is None or len(out) < n:
        status, headers, body = http_get(f"{url}/?stream=train", **kw)
        if status == 204:
            break
        assert status == 200, body[:300]
        out.append(int(headers["X-Feedline-Step"]))
    return out


@pytest.mark.slow
def test_a_pause_longer_than_the_lease_repeats_no_batch(env: dict[str, Any]) -> None:
    proc, url = start_http(env["path"], "--http", "127.0.0.1:0", "--lease", "2")
    try:
        first = _steps(url, 1)
        time.sleep(4.5)   # the gateway held the next 4 batches; their 2 s leases would have run out
        rest = _steps(url)
        stats = json.loads(http_get(f"{url}/stats")[2])
    finally:
        stop_http(proc)
    steps = first + rest
    assert steps == list(range(1, len(steps) + 1)), f"repeated or lost: {steps}"
    assert len(steps) >= 8 and stats["server"]["streams"]["train"]["shared"]["lease_expired"] == 0
