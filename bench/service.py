"""Service throughput: in-process vs one service client vs eight, as ratios from one run.

    python bench/service.py [--epochs 2] [--max-length 256] [--batch-size 32]

Runs one spec (real C4 and Wikipedia text from ../shared/data when present, else a generated
corpus; GPT-2 tokenizer) three ways and prints tokens/s:

  in-process   feedline.Loader(spec) in this process
  service x1   `feedline serve` in its own process, one client process (ranked, W=1)
  service x8   the same server, eight client processes (ranked, W=8, lockstep slices)

Every client counts the real tokens it receives. Client processes import feedline first, then
all start iterating at the same agreed moment; a service run's time goes from that moment to the
last batch any client received (connection and time to first batch included, as in-process). The x8 run also checks that the ranks' rows add up to
the x1 run's (no duplicates, no losses).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import feedline
from feedline.service import serve_process
from feedline.testing import make_corpus

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

CLIENT = """
import json, sys, time, feedline
address, rank, world, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
loader = feedline.Loader(address, rank, world, prefetch=8)
time.sleep(max(0.0, go - time.time()))  # every client starts at the same moment, after its imports
t0 = time.time(); tokens = rows = steps = 0
for b in loader:
    tokens += int(b["attention_mask"].sum()); rows += len(b["input_ids"]); steps += 1
print(json.dumps({"tokens": tokens, "rows": rows, "steps": steps, "start": t0, "end": time.time()}))
"""


def make_spec(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    if (SHARED / "prose" / "c4_demo.jsonl").is_file():
        sources = [{"path": str(SHARED / "prose" / "c4_demo.jsonl")},
                   {"path": str(SHARED / "prose" / "wiki_demo.txt"), "format": "text"}]
        tokenizer = str(SHARED / "tokenizers" / "gpt2")
    else:
        make_corpus(tmp / "corpus", files=4, docs=500, max_words=400)
        sources, tokenizer = [{"path": str(tmp / "corpus")}], "gpt2"
    return {"sources": sources, "tokenizer": tokenizer, "epochs": args.epochs, "seed": 1,
            "task": {"kind": "clm", "max_length": args.max_length}, "shuffle": {"buffer": 1000},
            "batching": {"strategy": "pad", "batch_size": args.batch_size}}


def in_process(spec: dict[str, Any]) -> dict[str, float]:
    t0 = time.perf_counter()
    tokens = rows = 0
    with feedline.Loader(spec) as loader:
        for b in loader:
            tokens += int(b["attention_mask"].sum())
            rows += len(b["input_ids"])
    return {"tokens": tokens, "rows": rows, "seconds": time.perf_counter() - t0}


def service(address: str, world: int) -> dict[str, float]:
    go = str(time.time() + 2.0 + 0.5 * world)
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, address, str(r), str(world), go], stdout=subprocess.PIPE,
                              text=True) for r in range(world)]
    results = [json.loads(p.communicate()[0]) for p in procs]
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    if len({r["steps"] for r in results}) != 1:
        raise AssertionError(f"ranks ran different numbers of steps: {[r['steps'] for r in results]}")
    return {"tokens": sum(r["tokens"] for r in results), "rows": sum(r["rows"] for r in results), "seconds": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = make_spec(args, Path(tmp))
        rows: dict[str, dict[str, float]] = {}
        in_process(spec)  # warm the page cache and the tokenizer load
        rows["in-process"] = in_process(spec)
        with serve_process(spec, args=["--window", "16"]) as address:
            rows["service x1"] = service(address, 1)
        with serve_process(spec, args=["--window", "16"]) as address:
            rows["service x8"] = service(address, 8)
    if rows["service x8"]["rows"] != rows["service x1"]["rows"] or rows["service x8"]["tokens"] != rows["service x1"]["tokens"]:
        raise AssertionError("eight clients did not receive exactly what one client received")
    base = rows["in-process"]["tokens"] / rows["in-process"]["seconds"]
    one = rows["service x1"]["tokens"] / rows["service x1"]["seconds"]
    print(f"{'placement':14} {'tokens':>10} {'rows':>7} {'seconds':>8} {'tokens/s':>10} {'vs in-process':>14} {'vs x1':>6}")
    for name, r in rows.items():
        rate = r["tokens"] / r["seconds"]
        print(f"{name:14} {r['tokens']:>10,} {r['rows']:>7,} {r['seconds']:>8.2f} {rate:>10,.0f} "
              f"{rate / base:>13.2f}x {rate / one:>5.2f}x")


if __name__ == "__main__":
    main()
