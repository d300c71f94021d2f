"""HTTP endpoint vs ZeroMQ for one shared-mode client: per-batch latency and throughput, one run.

    python bench/http_endpoint.py [--batches 200] [--max-length 256] [--batch-size 32]

One ``feedline serve SPEC --http`` process serves three streams with the same spec (``zmq``,
``msgpack``, ``json``), so every transport reads, tokenizes and batches the same way. Each client
takes one batch (joining its stream's work queue), then the bench waits until the server holds
``--batches`` produced batches for every stream (so latency measures the transport, not
tokenization), and each transport in turn takes ``--batches`` batches:

  zeromq            feedline.Loader(address, mode="shared", stream="zmq")
  http msgpack      GET /?stream=msgpack, Accept: application/x-msgpack (keep-alive), decoded to numpy
  http json         GET /?stream=json, Accept: application/json, decoded with json.loads to numpy

It prints, per transport, the median and p99 latency of one batch and batches/s and MB/s. The
data on the wire is the same arrays (int32, batch_size x max_length per field).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

import feedline
from feedline._service.launch import READY_PREFIX
from feedline.testing import make_corpus

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def make_spec(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    if (SHARED / "prose" / "c4_demo.jsonl").is_file():
        sources, tok = [{"path": str(SHARED / "prose" / "c4_demo.jsonl")}], str(SHARED / "tokenizers" / "gpt2")
    else:
        make_corpus(tmp / "corpus", files=4, docs=500, max_words=400)
        sources, tok = [{"path": str(tmp / "corpus")}], "gpt2"
    return {"sources": sources, "tokenizer": tok, "epochs": 20, "seed": 1,
            "task": {"kind": "clm", "max_length": args.max_length},
            "batching": {"strategy": "pad", "batch_size": args.batch_size}}


def summarise(name: str, lat: list[float], nbytes: int, wall: float) -> dict[str, Any]:
    lat_ms = sorted(x * 1e3 for x in lat)
    return {"transport": name, "batches": len(lat), "p50_ms": round(statistics.median(lat_ms), 3),
            "p99_ms": round(lat_ms[int(0.99 * (len(lat_ms) - 1))], 3), "batches_per_s": round(len(lat) / wall, 1),
            "MB_per_s": round(nbytes / wall / 1e6, 1)}


def measure(name: str, take: Any, n: int) -> dict[str, Any]:
    lat, nbytes = [], 0
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        b = take()
        lat.append(time.perf_counter() - t)
        nbytes += sum(a.nbytes for a in b.values())
    return summarise(name, lat, nbytes, time.perf_counter() - t0)


def http_client(url: str, stream: str, accept: str) -> Any:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def get() -> dict[str, Any]:
        conn.request("GET", f"/?stream={stream}", headers={"Accept": accept})
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")
        if accept == "application/json":
            return {k: np.asarray(v, dtype=np.int32) for k, v in json.loads(body).items()
                    if isinstance(v, list)}
        out = msgpack.unpackb(body)
        return {k: np.frombuffer(v["data"], v["dtype"]).reshape(v["shape"]) for k, v in out.items()
                if isinstance(v, dict) and "data" in v}

    return get


def wait_for_queues(url: str, n: int, timeout: float = 300.0) -> None:
    """Until every stream's shared queue holds ``n`` produced batches (from GET /stats)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/stats", timeout=10) as r:
            streams = json.loads(r.read())["server"]["streams"]
        queued = [(st.get("shared") or {}).get("queued", 0) for name, st in streams.items() if name != "train"]
        if min(queued) >= n:
            return
        time.sleep(1.0)
    raise SystemExit(f"the server did not produce {n} batches per stream in {timeout:.0f}s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        spec = tmp / "spec.json"
        spec.write_text(json.dumps(make_spec(args, tmp)))
        proc = subprocess.Popen([sys.executable, "-m", "feedline", "serve", str(spec), "--bind",
                                 "tcp://127.0.0.1:0", "--http", "127.0.0.1:0", "--window", str(args.batches + 16),
                                 "--stream", f"zmq={spec}", "--stream", f"msgpack={spec}", "--stream", f"json={spec}"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        address = url = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                address = line[len(READY_PREFIX):].strip()
            elif "HTTP on " in line:
                url = line.split("HTTP on ", 1)[1].split("/ ", 1)[0]
                break
        try:
            if address is None or url is None:
                raise SystemExit("feedline serve did not start")
            with feedline.Loader(address, mode="shared", stream="zmq", prefetch=4) as loader:
                it = iter(loader)
                takers = {"zeromq": lambda: next(it), "http msgpack": http_client(url, "msgpack", "application/x-msgpack"),
                          "http json": http_client(url, "json", "application/json")}
                for take in takers.values():
                    take()
                wait_for_queues(url, args.batches)
                results = [measure(name, take, args.batches) for name, take in takers.items()]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            proc.stdout.close()
    if args.json:
        print(json.dumps(results))
        return
    print(f"{'transport':<14} {'p50 ms':>8} {'p99 ms':>8} {'batches/s':>10} {'MB/s':>8}")
    for r in results:
        print(f"{r['transport']:<14} {r['p50_ms']:>8} {r['p99_ms']:>8} {r['batches_per_s']:>10} {r['MB_per_s']:>8}")


if __name__ == "__main__":
    main()
