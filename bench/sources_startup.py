"""Time to first record and memory while scanning a large generated JSONL (a script, not a test).

    .venv/bin/python bench/sources_startup.py --size-gb 1 [--path /tmp/feedline_bench_1g.jsonl]

Writes (once, reused afterwards) a JSONL of ~1 KB documents under /tmp, then:

1. *first record*: wall time from building ``feedline.records(spec)`` (spec parsing, file
   listing, byte-range splits, opening the file) to receiving the first record, with shard
   shuffling and a 10,000-record shuffle buffer, in a fresh process so nothing is cached in
   Python (the OS page cache is warm after generation; see the cold-start note in docs).
2. *memory*: the resident set size (psutil ``memory_info().rss``) of this process sampled every
   50,000 records while one source iterator reads the whole file; the table shows RSS after the
   first 50,000 records, the maximum, and the last sample. Flat means max - first is small and
   does not grow with the file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_FIRST = r"""
import time, sys
t0 = time.perf_counter()
import feedline
from feedline._records import records
t1 = time.perf_counter()
it = records({"sources": [{"path": sys.argv[1]}], "shuffle": {"buffer": int(sys.argv[2])}, "seed": 1})
rec = next(it)
t2 = time.perf_counter()
print(f"{t1 - t0:.4f} {t2 - t1:.4f} {len(rec['text'])}")
"""


def generate(path: str, size: int) -> None:
    if os.path.exists(path) and os.path.getsize(path) >= size:
        return
    words = ("the of and to in is was for on that with as by at from his her an which were are this be "
             "river stone garden letter window morning music paper island winter engine forest market").split()
    i = 0
    with open(path, "w", encoding="utf-8") as f:
        written = 0
        while written < size:
            lines = []
            for _ in range(1000):
                text = " ".join(words[(i * 7 + k * 13) % len(words)] for k in range(150 + i % 50))
                lines.append(json.dumps({"text": f"doc {i}: {text}", "id": i}))
                i += 1
            chunk = "\n".join(lines) + "\n"
            f.write(chunk)
            written += len(chunk)


def first_record(path: str, buffer: int) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", _FIRST, path, str(buffer)], capture_output=True, text=True, check=True)
    imp, first, _ = out.stdout.split()
    return float(imp), float(first)


def scan_memory(path: str, every: int = 50_000) -> dict[str, float]:
    import psutil

    from feedline._sources.source import FileSource
    from feedline._spec import SourceSpec

    proc = psutil.Process()
    samples = []
    t0 = time.perf_counter()
    n = 0
    it = iter(FileSource(SourceSpec(path=path), 0, seed=0, shuffle_splits=True, epochs=1))
    for _ in it:
        n += 1
        if n % every == 0:
            samples.append(proc.memory_info().rss / 2**20)
    secs = time.perf_counter() - t0
    return {"records": n, "seconds": secs, "rss_first_mb": samples[0], "rss_max_mb": max(samples),
            "rss_last_mb": samples[-1], "mb_per_s": os.path.getsize(path) / 2**20 / secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--path", default=None, help="where to write the corpus (default: /tmp/feedline_bench_<size>g.jsonl)")
    ap.add_argument("--no-scan", action="store_true", help="only measure the first record")
    args = ap.parse_args()
    path = args.path or f"/tmp/feedline_bench_{args.size_gb:g}g.jsonl"
    generate(path, int(args.size_gb * 2**30))
    print(f"corpus: {path} ({os.path.getsize(path) / 2**30:.2f} GiB)")
    print(f"{'measure':38} {'value':>12}")
    for buffer in (0, 10_000):
        runs = [first_record(path, buffer) for _ in range(3)]
        best = min(r[1] for r in runs)
        print(f"{f'first record, shuffle buffer {buffer} (s)':38} {best:>12.3f}   (import feedline: {runs[0][0]:.2f}s, not counted)")
    if not args.no_scan:
        m = scan_memory(path)
        print(f"{'records scanned':38} {m['records']:>12}")
        print(f"{'scan throughput (MB/s)':38} {m['mb_per_s']:>12.1f}")
        for k in ("rss_first_mb", "rss_max_mb", "rss_last_mb"):
            print(f"{k:38} {m[k]:>12.1f}")
        print(f"{'rss growth max - first (MB)':38} {m['rss_max_mb'] - m['rss_first_mb']:>12.1f}")


if __name__ == "__main__":
    main()
