"""What a partition's pipeline spends in Python's cyclic garbage collector, with a worker's settings and without.

    .venv/bin/python bench/gc_cost.py clm-short             # CPython's defaults, then a worker's (one process each)

Partition 0's pipeline runs alone on this thread, as a worker runs it (``Inline``), keeping the
last 64 batches' states as a worker does (``worker.KEEP``), on text that does not repeat
(``bench/scaling.py``'s corpora). After ``--warmup`` batches it times ``--batches`` more: this
thread's CPU per batch, and the CPU of every collection (``gc.callbacks``) by generation. Each
setting runs in a fresh process: ``defaults`` (700, 10, 10, nothing frozen) and ``worker`` (the
young generation at ``worker.GC_YOUNG``, what lives after the warm-up frozen: what
``feedline._partitions.worker`` does).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(name: str, setting: str, warmup: int, batches: int) -> dict[str, Any]:
    import scaling

    from feedline._core.inline import Inline
    from feedline._partitions.worker import GC_YOUNG, KEEP
    from feedline._pipeline import Pipeline
    from feedline._spec import Spec

    pipeline = Pipeline(Spec.load(scaling.spec_for(name, 192, 0)), partition=0)
    stage = Inline(lambda: iter(pipeline.batches()))
    kept: collections.deque[Any] = collections.deque(maxlen=KEEP)
    for _ in range(warmup):
        kept.append(next(stage)[1])
    if setting == "worker":
        gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
        gc.freeze()
    spent: collections.Counter[str] = collections.Counter()
    began = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.thread_time()
        else:
            spent[f"gen {info['generation']}"] += time.thread_time() - began[0]
            spent[f"gen {info['generation']} passes"] += 1

    gc.callbacks.append(timed)
    t = time.thread_time()
    for _ in range(batches):
        kept.append(next(stage)[1])
    total = time.thread_time() - t
    gc.callbacks.remove(timed)
    per = {k: (v / batches * 1e6 if "passes" not in k else v) for k, v in spent.items()}
    collected = sum(v for k, v in spent.items() if "passes" not in k)
    return {"thread_us_per_batch": total / batches * 1e6, "gc_us_per_batch": collected / batches * 1e6, **per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", default=["clm-short", "clm-docs"])
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], args.child[1], args.warmup, args.batches)))
        return
    for name in args.workloads:
        for r in range(args.rounds):
            for setting in (("defaults", "worker") if r % 2 == 0 else ("worker", "defaults")):
                out = subprocess.run([sys.executable, __file__, "--child", name, setting, "--warmup", str(args.warmup),
                                      "--batches", str(args.batches)], capture_output=True, text=True, check=True).stdout
                got = json.loads(out.strip().splitlines()[-1])
                detail = ", ".join(f"{k} {v:.1f}" if "passes" not in k else f"{k} {v:.0f}"
                                   for k, v in sorted(got.items()) if k.startswith("gen"))
                print(f"{name} {setting:8s}: thread {got['thread_us_per_batch']:.0f} us a batch, of it in the collector "
                      f"{got['gc_us_per_batch']:.1f} us ({detail})", flush=True)


if __name__ == "__main__":
    main()
