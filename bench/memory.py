"""Peak RSS of the loader against corpus size: 100 MB vs 1 GB, the same delivery budget on each.

    .venv/bin/python bench/memory.py                    # feedline in-process, service, HF streaming
    .venv/bin/python bench/memory.py --small-mb 16 --large-mb 64 --seconds 5

Each contender reads each corpus in a fresh process for ``--seconds`` of delivery (the same
amount of work whatever the corpus size); the peak is the summed RSS of the whole process tree
(DataLoader workers and the feedline server included), sampled every 50 ms. A loader whose memory
grows with the corpus shows it here; one that is flat shows the same peak on both. Results go to
``bench/results/memory.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CORPUS_NOTE, add_note, corpus_bytes, machine, prose_corpus, save_json, table
from throughput import measure

COLUMNS = [("label", "contender", ""), ("small_mb", "RSS @ small MB", ",.0f"), ("large_mb", "RSS @ large MB", ",.0f"),
           ("delta_mb", "difference MB", "+,.0f"), ("note", "note", "")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small-mb", type=float, default=100)
    ap.add_argument("--large-mb", type=float, default=1024)
    ap.add_argument("--seconds", type=float, default=10.0, help="delivery per run (default 10)")
    ap.add_argument("--workload", default="clm-1024")
    ap.add_argument("--contenders", default="feedline,feedline-service,hf-stream")
    args = ap.parse_args(argv)

    small, large = prose_corpus(args.small_mb), prose_corpus(args.large_mb)
    sizes = {"small": corpus_bytes(small) / 2**20, "large": corpus_bytes(large) / 2**20}
    print(f"corpora: {sizes['small']:.0f} MB and {sizes['large']:.0f} MB: {CORPUS_NOTE}")
    rows: list[dict[str, Any]] = []
    for name in args.contenders.split(","):
        row: dict[str, Any] = {"contender": name}
        for which, corpus in (("small", small), ("large", large)):
            print(f"  {name} on {sizes[which]:.0f} MB ...", flush=True)
            r = measure(name, corpus, args.workload, seconds=args.seconds, timeout=300)
            row["label"] = r["label"]
            row[f"{which}_mb"] = r["peak_rss_mb"] if "error" not in r else None
            row[f"{which}_tokens"] = r.get("tokens")
            if "error" in r:
                row["note"] = "failed: " + r["error"][:120]
            elif "exited" in r:
                add_note(row, f"{which}: {r['exited']}")
        if row.get("small_mb") and row.get("large_mb"):
            row["delta_mb"] = row["large_mb"] - row["small_mb"]
        rows.append(row)
    print(f"\npeak RSS of the process tree, {args.seconds:g} s of delivery on each corpus\n" + table(rows, COLUMNS) + "\n")
    payload = {"machine": machine(), "workload": args.workload, "seconds": args.seconds, "corpus_mb": sizes,
               "corpus_note": CORPUS_NOTE, "rows": rows, "load_avg_after": os.getloadavg()[0]}
    print(f"saved {save_json('memory', payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
