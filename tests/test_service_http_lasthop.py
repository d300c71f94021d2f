"""The HTTP last hop: a response the client did not read in full is served again (the default mode), and
the opt-in at-least-once mode (``confirm=1``, then an ack of the step). Real ``feedline serve`` processes,
real sockets on loopback, clients that reset mid-response."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from feedline.testing import make_corpus
from service_helpers import http_get, start_http, stop_http, tokenizer_path, write_spec

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A spec whose JSON batches are about 200 KB each (128 rows of up to 128 tokens)."""
    tmp = tmp_path_factory.mktemp("lasthop")
    make_corpus(tmp / "corpus", files=2, docs=1500, seed=5, min_words=100, max_words=140)
    spec = {"sources": [{"path": str(tmp / "corpus" / "*.jsonl")}], "tokenizer": tokenizer_path(tmp), "seed": 5,
            "task": {"kind": "clm", "max_length": 128}, "batching": {"strategy": "pad", "batch_size": 128}}
    return write_spec(tmp / "big.json", spec)


def _reset_after(url: str, nbytes: int, query: str = "stream=train", close: bool = False) -> int:
    """GET a batch on a raw socket (asking ``Connection: close`` when ``close``), read ``nbytes`` of the
    response, then reset the connection (``SO_LINGER`` 0: an RST, as a client killed mid-read sends).
    Returns the bytes read."""
    host, port = urllib.parse.urlsplit(url).netloc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        extra = "Connection: close\r\n" if close else ""
        s.sendall(f"GET /?{query} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n{extra}\r\n".encode())
        got = b""
        while len(got) < nbytes:
            chunk = s.recv(nbytes - len(got))
            if not chunk:
                break
            got += chunk
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return len(got)


def _drain(url: str, steps: list[int], lock: threading.Lock, query: str = "stream=train") -> int:
    """GET batches until 204 (each read in full), recording their steps; returns the end step."""
    while True:
        status, headers, body = http_get(f"{url}/?{query}")
        if status == 204:
            return int(headers["X-Feedline-End"])
        assert status == 200, body[:300]
        doc = json.loads(body)
        assert doc["step"] == int(headers["X-Feedline-Step"])
        with lock:
            steps.append(doc["step"])


@pytest.mark.slow
def test_20_clients_that_reset_mid_response_lose_no_step(big: str) -> None:
    proc, url = start_http(big, "--http", "127.0.0.1:0")
    steps: list[int] = []
    ends: list[int] = []
    lock = threading.Lock()
    read: list[int] = []

    def client(close: bool) -> None:
        read.append(_reset_after(url, 1024, close=close))   # 1 KB read of a ~230 KB response, then a reset
        ends.append(_drain(url, steps, lock))                # then each response read in full (urllib)

    try:   # half kept alive, half asking Connection: close (the server closes first: it must linger)
        threads = [threading.Thread(target=client, args=(i % 2 == 1,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=150)
        stats = json.loads(http_get(f"{url}/stats")[2])["http"]["streams"]["train"]
    finally:
        stop_http(proc)
    assert read == [1024] * 20
    end = ends[0]
    assert set(ends) == {end} and end >= 23, ends
    twice = sorted(s for s, n in Counter(steps).items() if n > 1)
    lost = sorted(set(range(1, end + 1)) - set(steps))
    assert not lost and not twice, f"lost {lost}, delivered twice {twice} of {end} steps"
    assert stats["resent"] >= 20, stats


@pytest.mark.slow
def test_confirm_mode_resends_what_was_not_acked(big: str) -> None:
    """``confirm=1``: a step read in full but never acked is served again after its time (at least
    once); an acked one is not; a reset one is served again at once."""
    proc, url = start_http(big, "--http", "127.0.0.1:0", "--lease", "2")
    try:
        status, headers, body = http_get(f"{url}/?stream=train&confirm=1")
        first = int(headers["X-Feedline-Step"])
        assert status == 200 and first == 1 and headers["X-Feedline-Ack-Within"] == "1"
        status, headers, _ = http_get(f"{url}/?stream=train&confirm=1&ack={first}")   # acks 1 on the way
        second = int(headers["X-Feedline-Step"])
        assert second == 2
        assert _reset_after(url, 1024, "stream=train&confirm=1") == 1024             # step 3, reset
        status, headers, _ = http_get(f"{url}/?stream=train&confirm=1")
        assert int(headers["X-Feedline-Step"]) == 3                                  # served again at once
        assert http_get(f"{url}/ack?stream=train&step=3")[0] == 200
        time.sleep(1.3)                                                              # step 2 never acked
        status, headers, _ = http_get(f"{url}/?stream=train")
        assert int(headers["X-Feedline-Step"]) == 2                                  # served again
        status, headers, _ = http_get(f"{url}/?stream=train")
        assert int(headers["X-Feedline-Step"]) == 4                                  # then the stream goes on
        status, _, body = http_get(f"{url}/ack?stream=train&step=1")
        assert status == 409 and "not awaiting an ack" in json.loads(body)["message"]
        assert http_get(f"{url}/ack?stream=train&step=x")[0] == 400
    finally:
        stop_http(proc)


@pytest.mark.slow
def test_a_client_that_reads_everything_gets_each_step_once(big: str, tmp_path: Path) -> None:
    """The default mode on a kept-alive connection: the next request settles the previous response."""
    import http.client

    proc, url = start_http(big, "--http", "127.0.0.1:0")
    try:
        host, port = urllib.parse.urlsplit(url).netloc.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        got: list[int] = []
        while True:
            conn.request("GET", "/?stream=train", headers={"Accept": "application/x-msgpack"})
            r = conn.getresponse()
            r.read()
            if r.status == 204:
                break
            got.append(int(r.headers["X-Feedline-Step"]))
        conn.close()
        stats: dict[str, Any] = json.loads(http_get(f"{url}/stats")[2])["http"]["streams"]["train"]
    finally:
        stop_http(proc)
    assert got == list(range(1, len(got) + 1)) and stats["resent"] == 0
