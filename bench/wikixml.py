"""Wikipedia XML: time to the first MLM batch and cleaning throughput, by parse processes (a script, not a test).

    python bench/wikixml.py [--dump tests/data/enwiki-206-pages.xml.bz2] [--workers 0 1 2 4] [--repeat 3] [--copies 10]

For each ``FEEDLINE_PARSE_WORKERS`` value, in a fresh process (so the parse pool's start-up is
counted): *first batch* is the wall time from building ``feedline.Loader(spec)`` to its first
batch over the dump, for ``{task: mlm, max_length: 128}``, ``bert-base-uncased``,
``batch_size: 32``; *records/s* and *MB/s* (clean text) come from ``feedline.records`` reading
``--copies`` copies of the dump's pages in one plain XML file under /tmp (enough pages for the
parse pool, which starts after 256, to matter).
Workers ``0`` cleans pages in the reader's thread. The median of ``--repeat`` runs is shown, with
the machine's load average (the figures only compare within one run).

To measure another checkout (e.g. the code before a change), put its ``src`` first:
``PYTHONPATH=/path/to/other/src python bench/wikixml.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"

_CHILD = r"""
import json, sys, time
import feedline
dump, tok = sys.argv[1], sys.argv[2]
spec = {"sources": [dump], "tokenizer": tok, "seed": 1,
        "task": {"kind": "mlm", "max_length": 128}, "batching": {"strategy": "pad", "batch_size": 32}}
t0 = time.perf_counter()
loader = feedline.Loader(spec)
batch = next(iter(loader))
first = time.perf_counter() - t0
loader.close()
t0 = time.perf_counter()
n = chars = 0
for rec in feedline.records({"sources": [sys.argv[3]]}):
    n += 1
    chars += len(rec["text"].encode())
full = time.perf_counter() - t0
print(json.dumps({"first_batch_s": first, "records": n, "records_s": n / full, "mb_s": chars / full / 1e6,
                  "rows": int(batch["input_ids"].shape[0])}))
"""


def copies(dump: str, n: int) -> str:
    """A plain XML file with the dump's pages ``n`` times (written once)."""
    import bz2

    path = f"/tmp/feedline_bench_{Path(dump).name.split('.')[0]}_x{n}.xml"
    if not os.path.exists(path):
        with bz2.open(dump) if dump.endswith(".bz2") else open(dump, "rb") as f:
            xml = f.read()
        head, rest = xml.split(b"  <page>", 1)
        pages, tail = (b"  <page>" + rest).rsplit(b"</page>", 1)
        with open(path + ".tmp", "wb") as out:
            out.write(head + (pages + b"</page>\n") * n + tail.split(b"\n", 1)[-1])
        os.replace(path + ".tmp", path)
    return path


def run(dump: str, tok: str, many: str, workers: int) -> dict[str, float]:
    env = {**os.environ, "FEEDLINE_PARSE_WORKERS": str(workers)}
    out = subprocess.run([sys.executable, "-c", _CHILD, dump, tok, many], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"workers={workers}: child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dump", default=str(ROOT / "tests" / "data" / "enwiki-206-pages.xml.bz2"))
    p.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "bert-base-uncased"))
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, os.cpu_count() or 1])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--copies", type=int, default=10, help="copies of the dump's pages for the records/s pass")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args()
    many = copies(args.dump, args.copies)
    rows = []
    for w in dict.fromkeys(args.workers):
        runs = [run(args.dump, args.tokenizer, many, w) for _ in range(args.repeat)]
        rows.append({"workers": w, "records": runs[0]["records"],
                     **{k: statistics.median(r[k] for r in runs) for k in ("first_batch_s", "records_s", "mb_s")},
                     "load": round(os.getloadavg()[0], 1)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"dump: {args.dump} (records/s: {args.copies} copies)  cpus: {os.cpu_count()}  repeat: {args.repeat} (median)")
    print(f"{'workers':>7} {'records':>7} {'first batch s':>13} {'records/s':>9} {'MB/s':>6} {'load':>5}")
    for r in rows:
        print(f"{r['workers']:>7} {r['records']:>7} {r['first_batch_s']:>13.2f} {r['records_s']:>9.1f} "
              f"{r['mb_s']:>6.2f} {r['load']:>5}")


if __name__ == "__main__":
    main()
