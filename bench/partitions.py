"""Partitions on this machine: K = 2 in worker processes against K = 1, same run, as ratios.

    .venv/bin/python bench/partitions.py                  # clm-1024-short and mlm-128, 2 rounds
    .venv/bin/python bench/partitions.py --k 1,2,4 --seconds 8

For each workload (``bench/contenders.py``: packed GPT-2 rows of 1024 on short records, padded
BERT rows of 128 on documents), each K runs an endless stream for ``--warmup`` seconds after its
first batch and then counts real tokens (``attention_mask``) for ``--seconds``; the Ks alternate
for ``--rounds`` rounds so that a busy machine's drift falls on both. K = 1 is the plain loader
(no composing stage); K > 1 runs ``parallel: {placement: processes}``. The curve over K and
placements, against the raw encoder, is ``bench/scaling.py``'s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, prose_corpus, require_data, short_corpus
from contenders import WORKLOADS, feedline_spec


def rate(spec: dict[str, Any], warmup: float, seconds: float) -> tuple[float, float]:
    """(real tokens per second in the window, seconds to the first batch)."""
    import feedline

    t0 = time.perf_counter()
    with feedline.Loader(spec) as loader:
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        start = time.perf_counter() + warmup
        while time.perf_counter() < start:
            next(it)
        tokens, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < seconds:
            tokens += int(np.asarray(next(it)["attention_mask"]).sum())
        return tokens / (time.perf_counter() - t1), first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="clm-1024-short,mlm-128")
    ap.add_argument("--k", default="1,2", help="partition counts (K > 1 in processes)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    require_data()
    print(machine())
    ks = [int(k) for k in args.k.split(",")]
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        corpus = short_corpus(16) if w.corpus == "short" else prose_corpus(16)
        base = {**feedline_spec(corpus, w), "epochs": None}
        rates: dict[int, list[float]] = {k: [] for k in ks}
        firsts: dict[int, list[float]] = {k: [] for k in ks}
        for _ in range(args.rounds):
            for k in ks:
                spec = base if k == 1 else {**base, "partitions": k, "parallel": {"placement": "processes"}}
                r, f = rate(spec, args.warmup, args.seconds)
                rates[k].append(r)
                firsts[k].append(f)
        one = float(np.mean(rates[ks[0]]))
        for k in ks:
            m = float(np.mean(rates[k]))
            print(f"{name:16s} K={k}: {m / 1e6:6.2f} M tok/s ({', '.join(f'{r / 1e6:.2f}' for r in rates[k])}), "
                  f"x{m / one:.2f} of K={ks[0]}; first batch {np.mean(firsts[k]):.2f} s", flush=True)


if __name__ == "__main__":
    main()
