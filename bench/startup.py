"""Time to first batch on a 1 GB corpus, from nothing (fresh process, no cache) to a batch in hand.

    .venv/bin/python bench/startup.py                   # 1 GB streaming contenders, 100 MB offline ones
    .venv/bin/python bench/startup.py --mb 64 --offline-mb 16

Streaming contenders (feedline in-process and through the service, HF streaming, Ray Data) run
on the ``--mb`` corpus and stop at their first batch. Contenders that must preprocess the whole
corpus first (HF non-streaming ``map``, LitData ``optimize``) run on the smaller ``--offline-mb``
corpus, and their time is also scaled linearly to the large corpus (said so in the table): running
them on 1 GB would take many minutes on this machine, which is the point. Imports are included
(each contender starts in a fresh process; the clock starts after its imports). Results go to
``bench/results/startup.json``.
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

STREAMING = ["feedline", "feedline-window100", "feedline-service", "hf-stream", "ray-data"]
OFFLINE = ["hf-offline", "litdata"]
COLUMNS = [("label", "contender", ""), ("corpus_mb", "corpus MB", ",.0f"), ("first_batch_s", "first batch s", ".2f"),
           ("at_1gb_s", "at the large corpus s", ",.1f"), ("note", "note", "")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=1024, help="streaming contenders' corpus, MB (default 1024)")
    ap.add_argument("--offline-mb", type=float, default=100, help="offline contenders' corpus, MB (default 100)")
    ap.add_argument("--workload", default="clm-1024")
    ap.add_argument("--contenders", default=",".join(STREAMING + OFFLINE))
    args = ap.parse_args(argv)

    big, small = prose_corpus(args.mb), prose_corpus(args.offline_mb)
    big_mb, small_mb = corpus_bytes(big) / 2**20, corpus_bytes(small) / 2**20
    print(f"corpora: {big} ({big_mb:.0f} MB), {small} ({small_mb:.0f} MB): {CORPUS_NOTE}")
    rows: list[dict[str, Any]] = []
    for name in args.contenders.split(","):
        offline = name in OFFLINE
        print(f"  {name} ...", flush=True)
        r = measure(name, small if offline else big, args.workload, batches=1, timeout=600)
        r["corpus_mb"] = small_mb if offline else big_mb
        if r.get("first_batch_s") is not None:
            r["at_1gb_s"] = r["first_batch_s"] * (big_mb / small_mb if offline else 1.0)
        if "error" in r:
            r["note"] = "failed: " + r["error"][:200]
        elif offline:
            parts = [f"{k.removesuffix('_s')} {r[k]:.1f} s" for k in ("arrow_convert_s", "map_s", "convert_s") if k in r]
            add_note(r, f"measured on {small_mb:.0f} MB ({', '.join(parts)}); large corpus scaled linearly")
        elif "server_ready_s" in r:
            add_note(r, f"server process ready after {r['server_ready_s']:.2f} s (included)")
        rows.append(r)
    print("\n" + table(rows, COLUMNS) + "\n")
    payload = {"machine": machine(), "workload": args.workload, "corpus_mb": big_mb, "offline_corpus_mb": small_mb,
               "corpus_note": CORPUS_NOTE, "rows": rows, "load_avg_after": os.getloadavg()[0]}
    print(f"saved {save_json('startup', payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
