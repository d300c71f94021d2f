"""The HTTP endpoint of `feedline serve --http`: real server processes, real HTTP clients on loopback."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

import feedline
from feedline._service.http_options import HttpOptions, parse_http_bind
from feedline.errors import SpecError
from feedline.testing import collect
from service_helpers import http_get as get
from service_helpers import make_spec, start_http, tokenizer_path, write_spec
from service_helpers import stop_http as stop

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# served stream (a feedline serve process, its tokenizer and first batches) and fixtures start once, not once a worker.
pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("service_http")]


def from_msgpack(body: bytes) -> dict[str, Any]:
    out = msgpack.unpackb(body, raw=False)
    for k, v in out.items():
        if isinstance(v, dict) and set(v) == {"dtype", "shape", "data"}:
            out[k] = np.frombuffer(v["data"], dtype=np.dtype(v["dtype"])).reshape(v["shape"])
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("http")
    tok = tokenizer_path(tmp)
    spec, val = make_spec(tmp, tok), make_spec(tmp, tok, name="val", docs=48, seed=9)
    return {"tmp": tmp, "tok": tok, "spec": spec, "val": val, "path": write_spec(tmp / "train.json", spec),
            "val_path": write_spec(tmp / "val.json", val)}


@pytest.fixture(scope="module")
def server(env: dict[str, Any]) -> Any:
    proc, url = start_http(env["path"], "--http", "127.0.0.1:0", "--stream", f"validation={env['val_path']}")
    yield proc, url
    stop(proc)


@pytest.mark.slow
def test_json_batches_are_the_in_process_batches_then_204(env: dict, server: Any) -> None:
    _, url = server
    ref = collect(feedline.Loader(env["spec"]))
    got = []
    while True:
        status, headers, body = get(f"{url}/?stream=train")
        if status == 204:
            assert headers["X-Feedline-End"] == str(len(ref))
            break
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        got.append(json.loads(body))
    assert [g["step"] for g in got] == list(range(1, len(ref) + 1))
    for g, r in zip(got, ref, strict=True):
        assert set(r) <= set(g)
        for k, v in r.items():
            assert g[k] == v.tolist(), k
    marks = [g["state"]["step"] for g in got]  # the shared-mode watermark when the batch was sent
    assert marks == sorted(marks) and all(m < g["step"] for m, g in zip(marks, got)) and marks[-1] > 0
    assert get(f"{url}/batch?stream=train")[0] == 204  # stays ended


def test_concurrent_gets_deliver_every_batch_once(env: dict, server: Any) -> None:
    _, url = server
    ref = collect(feedline.Loader(env["val"]))
    got: dict[int, list[dict[str, Any]]] = {}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            status, _, body = get(f"{url}/batch?stream=validation", accept="application/x-msgpack")
            if status == 204:
                return
            assert status == 200
            b = from_msgpack(body)
            with lock:
                got.setdefault(b["step"], []).append(b)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert sorted(got) == list(range(1, len(ref) + 1))          # none lost
    assert all(len(v) == 1 for v in got.values())               # none twice
    for step, (b,) in got.items():
        for k, v in ref[step - 1].items():
            np.testing.assert_array_equal(b[k], v)
            assert b[k].dtype == v.dtype


def test_state_stats_healthz_and_unknown_stream(server: Any) -> None:
    _, url = server
    status, _, body = get(f"{url}/state?stream=train")
    assert status == 200 and "spec_hash" in json.loads(body)
    status, _, body = get(f"{url}/stats")
    stats = json.loads(body)
    assert status == 200 and stats["http"]["requests"] >= 1 and "streams" in stats["http"]
    assert get(f"{url}/healthz")[:1] == (200,)
    status, _, body = get(f"{url}/?stream=nope")
    assert status == 404 and "validation" in json.loads(body)["message"]


@pytest.mark.slow
def test_token_is_required_and_checked(env: dict, tmp_path: Path) -> None:
    token = "s3cret-token-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    infer = {**env["spec"], "task": {"kind": "infer", "max_length": 32}, "shuffle": None,
             "batching": {"strategy": "pad", "batch_size": 8, "remainder": "keep"}}
    infer.pop("shuffle")
    proc, url = start_http(write_spec(tmp_path / "infer.json", infer), "--http", "127.0.0.1:0",
                           "--http-token-file", str(tmp_path / "token"))
    try:
        assert get(f"{url}/")[0] == 401
        assert get(f"{url}/", token="wrong-token-0123456789")[0] == 401
        assert get(f"{url}/healthz")[0] == 200
        status, _, body = get(f"{url}/", token=token)
        assert status == 200
        b = json.loads(body)
        # the infer task carries record keys: the endpoint maps them back to their texts
        records = list(feedline.records(infer))
        assert b["idxs"][0] == [0, 0, 0] and len(b["texts"]) == len(b["input_ids"])
        assert b["texts"][:3] == [r["text"] for r in records[:3]]
        # later requests of a kept-alive connection pass the gateway's check, not the guard's: the same
        # rule, so a token that is not UTF-8 is refused there too (it was a 500: a str that cannot encode)
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
        try:
            answers = []
            for value in (f"Bearer {token}".encode(), b"Bearer \xff\xfe-not-utf8", b"bearer  " + token.encode()):
                conn.request("GET", "/stats", headers={"Authorization": value})
                r = conn.getresponse()
                r.read()
                answers.append(r.status)
            assert answers == [200, 401, 200]
        finally:
            conn.close()
    finally:
        stop(proc)


@pytest.mark.slow
def test_non_loopback_http_without_token_is_refused(env: dict) -> None:
    with pytest.raises(SpecError, match="--http-token-file"):
        HttpOptions(host="0.0.0.0", port=0)
    assert parse_http_bind("[::1]:81") == ("::1", 81)
    out = subprocess.run([sys.executable, "-m", "feedline", "serve", env["path"], "--http", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "without a token" in out.stderr
