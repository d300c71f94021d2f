"""How big the tokenizer's batches are and how many threads call it: TaskMap settings measured.

    .venv/bin/python bench/tuning.py                     # chunk x workers grid, clm-1024, 128 MB corpus
    .venv/bin/python bench/tuning.py --chunks 256 --workers 1,2 --seconds 5 --rounds 3

Runs the task stage alone (records -> tokenized clm examples, ``feedline._tasks.map.TaskMap``) for
``--seconds`` per setting, in a fresh process each, interleaving settings over ``--rounds`` so that
load from other work hits every setting alike, and reports the median tokens/s and the cores the
process kept busy. ``raw`` is the same text through ``encode_batch_fast`` from as many threads,
already in memory. Results go to ``bench/results/tuning-<workload>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CORPUS_NOTE, machine, prose_corpus, save_json, table, tree_cpu
from contenders import WORKLOADS, feedline_spec


class _Pooled:
    def __init__(self, task: Any, workers: int) -> None:
        import concurrent.futures as cf

        self.task, self.ahead = task, workers + 2
        self.pool = cf.ThreadPoolExecutor(workers, thread_name_prefix="feedline-task")

    def submit(self, records: Any) -> Any:
        return self.pool.submit(self.task.process, records)

    def result(self, handle: Any, state: Any) -> Any:
        return handle.result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _pooled_taskmap() -> type:
    from feedline._tasks.map import TaskMap

    class PooledTaskMap(TaskMap):
        def runner(self) -> Any:
            return _Pooled(self.task, self.workers)

    return PooledTaskMap


def child(corpus: Path, workload: str, chunk: int, workers: int, seconds: float) -> dict[str, Any]:
    from feedline._pipeline import Pipeline
    from feedline._tasks.map import TaskMap

    PooledTaskMap = _pooled_taskmap()
    p = Pipeline(feedline_spec(corpus, WORKLOADS[workload]))
    p.task  # load the tokenizer before the clock  # noqa: B018
    if chunk == 0:  # raw: encode_batch_fast from `workers` threads on texts in memory
        import concurrent.futures as cf

        texts = [r.data["text"] for _, r in zip(range(20000), iter(p.records()), strict=False)]
        backend = p.tokenizer.backend  # type: ignore[union-attr]
        chunks = [texts[i:i + 256] for i in range(0, len(texts), 256)]
        pool = cf.ThreadPoolExecutor(workers)
        items: Any = pool.map(lambda c: sum(len(e) for e in backend.encode_batch_fast(c)), chunks)

        def count(n: int) -> int:
            return n
    else:  # -n: n pool threads even for n = 1 (ThreadRunner runs 1 inline), n + 2 chunks ahead
        cls = PooledTaskMap if workers < 0 else TaskMap
        items = iter(cls(p.records(), p.task, chunk=chunk, workers=abs(workers)))

        def count(ex: Any) -> int:
            return len(ex.fields["input_ids"])
    t0, c0, n = time.perf_counter(), tree_cpu(), 0
    for x in items:
        n += count(x)
        if time.perf_counter() - t0 > seconds:
            break
    dt = time.perf_counter() - t0
    return {"tokens_per_s": n / dt, "cores_busy": (tree_cpu() - c0) / dt}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=128)
    ap.add_argument("--workload", default="clm-1024")
    ap.add_argument("--chunks", default="64,256,1024", help="records per tokenizer call")
    ap.add_argument("--workers", default="1,2,4,-1", help="threads calling the tokenizer (-n: n pooled threads, also for 1)")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    corpus = prose_corpus(args.mb)
    if args.child:
        chunk, workers = (int(x) for x in args.child.split(","))
        print(json.dumps(child(corpus, args.workload, chunk, workers, args.seconds)))
        return 0
    settings = [(0, w) for w in sorted({abs(int(w)) for w in args.workers.split(",")})]
    settings += [(c, w) for c in map(int, args.chunks.split(",")) for w in map(int, args.workers.split(","))]
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {s: [] for s in settings}
    print(f"corpus {corpus}: {CORPUS_NOTE}; load average {os.getloadavg()[0]:.2f}")
    for _ in range(args.rounds):
        for s in settings:
            cmd = [sys.executable, __file__, "--child", f"{s[0]},{s[1]}", "--mb", str(args.mb),
                   "--workload", args.workload, "--seconds", str(args.seconds)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[s].append(json.loads(out.strip().splitlines()[-1]))
    rows = []
    for (chunk, workers), rs in runs.items():
        name = f"{-workers} pooled thread(s)" if workers < 0 else f"workers={workers}"
        rows.append({"setting": f"raw, {abs(workers)} threads" if chunk == 0 else f"TaskMap chunk={chunk}, {name}",
                     "chunk": chunk, "workers": workers,
                     "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                     "cores_busy": statistics.median(r["cores_busy"] for r in rs),
                     "runs": [round(r["tokens_per_s"]) for r in rs]})
    print(table(rows, [("setting", "setting", ""), ("tokens_per_s", "median tokens/s", ",.0f"),
                       ("cores_busy", "cores busy", ".2f"), ("runs", "each run", "")]))
    print(f"saved {save_json(f'tuning-{args.workload}', {'machine': machine(), 'workload': args.workload, 'rows': rows, 'load_avg_after': os.getloadavg()[0]})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
