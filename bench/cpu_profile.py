"""Where feedline's CPU goes: CPU seconds per million tokens by thread, in-process.

    .venv/bin/python bench/cpu_profile.py                      # clm-1024, 12 s on the 128 MB corpus
    .venv/bin/python bench/cpu_profile.py --workload mlm-128 --seconds 8

Runs ``feedline.Loader`` in this (fresh) process and reads each thread's CPU time at the end. Threads
with a Python name are feedline's (``feedline-loader``: reading, batching, state;
``feedline-task_*``: the task's Python around the tokenizer call; ``MainThread``: the consumer,
plus imports). Unnamed native threads are the tokenizer's Rayon pool: the irreducible work. On a
machine where Rayon already uses every core, every Python CPU second is taken from it, so the
Python share bounds feedline / raw. For stacks, run ``py-spy record --threads`` on this script.
Results go to ``bench/results/profile.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, save_json, table
from contenders import WORKLOADS, feedline_spec

NATIVE = "native (tokenizer's Rayon pool)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=128)
    ap.add_argument("--workload", default="clm-1024")
    ap.add_argument("--seconds", type=float, default=12.0)
    args = ap.parse_args(argv)

    import feedline

    w = WORKLOADS[args.workload]
    spec = feedline_spec(w.make_corpus(args.mb), w)
    names: dict[int, str] = {}
    tokens, t0 = 0, time.perf_counter()
    with feedline.Loader(spec) as loader:
        for batch in loader:
            tokens += int(batch["attention_mask"].sum())
            names.update((t.native_id, t.name) for t in threading.enumerate() if t.native_id is not None)
            if time.perf_counter() - t0 > args.seconds:
                break
        wall = time.perf_counter() - t0
        by: dict[str, float] = {}
        for th in psutil.Process().threads():
            name = names.get(th.id, NATIVE)
            name = "feedline-task" if name.startswith("feedline-task") else name
            by[name] = by.get(name, 0.0) + th.user_time + th.system_time
    total = sum(by.values())
    rows: list[dict[str, Any]] = [{"thread": k, "cpu_s": v, "s_per_mtok": v / tokens * 1e6, "share": v / total}
                                  for k, v in sorted(by.items(), key=lambda kv: -kv[1])]
    rows.append({"thread": "total", "cpu_s": total, "s_per_mtok": total / tokens * 1e6, "share": 1.0})
    print(f"{args.workload}: {tokens:,} tokens in {wall:.1f} s = {tokens / wall:,.0f} tokens/s "
          f"(load average {os.getloadavg()[0]:.2f}; CPU includes start-up)")
    print(table(rows, [("thread", "thread", ""), ("cpu_s", "CPU s", ".2f"), ("s_per_mtok", "CPU s / M tok", ".3f"),
                       ("share", "share", ".1%")]))
    save_json(f"profile-{args.workload}", {"machine": machine(), "workload": args.workload, "tokens": tokens, "wall_s": wall, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
