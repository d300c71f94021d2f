"""``partitions: 1`` on processes, per process: the worker's and the parent's CPU per batch.

    taskset -c 0 .venv/bin/python bench/partition_split.py clm-docs     # one CPU: no process slows the other
    PYTHONPATH=../base/src taskset -c 0 .venv/bin/python bench/partition_split.py clm-docs   # another checkout

The tree's CPU per token (``bench/partitions.py --cpu``) on 2 cores also carries what two busy
processes cost each other, and this box's speed drifts between runs; this splits one loader's
steady state (``--seconds`` from ``--warmup`` seconds after the first batch, text that does not
repeat: ``bench/scaling.py``'s corpora) into the worker's CPU (from ``/proc``, all its threads) and
this process's (``process_time``), per batch. Alternate checkouts run after run; compare pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid``, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload", choices=["clm-short", "clm-docs"])
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    import scaling

    import feedline

    spec = scaling.spec_for(args.workload, 48, 0, 1, "processes")
    with feedline.Loader(spec) as loader:
        it = iter(loader)
        t = time.perf_counter()
        while time.perf_counter() - t < args.warmup:
            next(it)
        worker = loader._stage._parent.parent.parent.runner.pids()[0]   # (Inline -> RankSlice -> stream -> placement)
        w0, p0, t0, n = cpu_of(worker), time.process_time(), time.perf_counter(), 0
        while time.perf_counter() - t0 < args.seconds:
            next(it)
            n += 1
        w1, p1 = cpu_of(worker), time.process_time()
    print(json.dumps({"workload": args.workload, "batches": n, "worker_us_per_batch": round((w1 - w0) / n * 1e6, 1),
                      "parent_us_per_batch": round((p1 - p0) / n * 1e6, 1)}))


if __name__ == "__main__":
    main()
