"""Reading through an S3-compatible server vs the same files on local disk, with and without the cache.

    .venv/bin/python bench/object_store.py [--mb 32] [--objects 8]

Starts moto's S3 server in its own process on loopback (so it does not share this process's
GIL), uploads the corpus as ``--objects`` JSONL objects, and times the same pass three ways in
one run: the files on local disk, the ``s3://`` prefix read directly, and the prefix with
``cache: {dir, max_bytes}`` (the first pass fills the cache, the second is timed). Two measures:
records per second (the storage path alone) and GPT-2 tokens per second of a ``clm`` loader
packing 1024-token rows (what training sees). The text is real (C4 + Wikipedia from
``../shared/data/prose``) repeated to size, the same bytes for every contender.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GPT2, prose_corpus

import feedline


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(port: int, timeout: float = 60.0) -> None:
    import socket

    end = time.time() + timeout
    while time.time() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"moto server did not start on port {port}")


def _time(spec: dict, what: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    if what == "records":
        n = sum(1 for _ in feedline.records(spec))
    else:
        n = 0
        for b in feedline.Loader(spec):
            n += int(b["attention_mask"].sum())
    return time.perf_counter() - t0, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=32, help="corpus size in MB")
    ap.add_argument("--objects", type=int, default=8, help="objects (files) the corpus is cut into")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="feedline-objstore-"))
    local = work / "local"
    local.mkdir()
    src = prose_corpus(args.mb)
    lines = [line for f in sorted(Path(src).glob("*.jsonl")) for line in f.read_bytes().splitlines(keepends=True)]
    per = -(-len(lines) // args.objects)
    for i in range(args.objects):
        (local / f"part-{i:03d}.jsonl").write_bytes(b"".join(lines[i * per:(i + 1) * per]))
    size = sum(p.stat().st_size for p in local.iterdir())

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(port)
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                          AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{port}", AWS_EC2_METADATA_DISABLED="true")
        import boto3

        client = boto3.client("s3")
        client.create_bucket(Bucket="feedline-bench")
        for p in sorted(local.iterdir()):
            client.upload_file(str(p), "feedline-bench", f"corpus/{p.name}")
        remote = "s3://feedline-bench/corpus/"
        cache = {"dir": str(work / "cache"), "max_bytes": 2 * size}
        task = {"tokenizer": str(GPT2), "task": {"kind": "clm", "max_length": 1024},
                "batching": {"strategy": "pack", "batch_size": 16}}
        rows = []
        for what in ("records", "tokens"):
            base = {"sources": [{"path": str(local)}]} if what == "records" else {"sources": [{"path": str(local)}], **task}
            s3 = {**base, "sources": [{"path": remote}]}
            cached = {**base, "sources": [{"path": remote, "cache": cache}]}
            _time(base, what)  # warm the page cache and the tokenizer once
            t_local, n = _time(base, what)
            t_s3, n_s3 = _time(s3, what)
            shutil.rmtree(work / "cache", ignore_errors=True)
            _time(cached, what)  # fills the cache
            t_cached, n_c = _time(cached, what)
            assert n == n_s3 == n_c, (n, n_s3, n_c)
            rows.append((what, n, t_local, t_s3, t_cached))
        print(f"corpus: {size / 1e6:.1f} MB in {args.objects} objects; moto S3 server in its own process on loopback; "
              f"{os.cpu_count()} cores")
        print(f"{'measure':10} {'local /s':>12} {'s3 /s':>12} {'s3 cached /s':>14} {'s3/local':>9} {'cached/local':>13}")
        for what, n, t_local, t_s3, t_cached in rows:
            print(f"{what:10} {n / t_local:12,.0f} {n / t_s3:12,.0f} {n / t_cached:14,.0f} "
                  f"{t_local / t_s3:9.2f} {t_local / t_cached:13.2f}")
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
