"""Ray engine scaling: the local engine vs 1 and 2 local Ray workers, on the same text.

    .venv/bin/python bench/ray_scaling.py                 # ~15 MB of C4 text, clm on GPT-2
    .venv/bin/python bench/ray_scaling.py --mb 4 --json

Measures the task stage (tokenize + clm: what the Ray engine distributes) in tokens/s, plus
the two costs that stay in the driver and bound the speed-up: reading records, and receiving
the examples back (the driver loop with a no-op task). Prints a table and the ratios quoted in
``docs/ray.md``. Each Ray configuration gets a fresh local instance with that many CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from feedline._core.record import Record
from feedline._pipeline import Pipeline
from feedline._ray.map import RayTaskMap
from feedline._spec import ParallelSpec
from feedline._tasks.base import TaskOutput
from feedline._tasks.clm import CausalLM
from feedline._tasks.map import TaskMap

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


class Echo(CausalLM):
    """A task that does no tokenization: one tiny example per record (measures transport only)."""

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        import numpy as np

        ids = np.arange(len(records[0].data["text"]) // 4, dtype=np.int32)
        return [[self.example(r, 0, input_ids=ids, labels=ids)] for r in records]


def make_text(directory: Path, mb: float) -> Path:
    """Repeat the C4 demo documents into ``mb`` megabytes of JSONL (2 files)."""
    src = (DATA / "prose" / "c4_demo.jsonl").read_bytes()
    reps = max(1, int(mb * (1 << 20) / len(src) / 2))
    for i in range(2):
        (directory / f"c4-{i}.jsonl").write_bytes(src * reps)
    return directory


def timed(items: Iterable[Any], count: Any) -> tuple[float, int]:
    t0, n = time.perf_counter(), 0
    for x in items:
        n += count(x)
    return time.perf_counter() - t0, n


def cpu_timed(items: Iterable[Any], count: Any) -> tuple[float, float, int]:
    """Wall seconds, this process's CPU seconds (all its threads), and the count."""
    c0 = time.process_time()
    t, n = timed(items, count)
    return t, time.process_time() - c0, n


def one_core_rate(spec: dict[str, Any], chunk: int) -> float:
    """Tokens per CPU-second of the task on one thread, measured in a child process.

    The child runs with ``TOKENIZERS_PARALLELISM=false`` (as Ray workers do), so its CPU time is
    one core's, whatever else the machine is doing: the ``r`` of the model in docs/ray.md.
    """
    code = ("import json,sys,time; from feedline._pipeline import Pipeline; from feedline._tasks.map import TaskMap\n"
            "p=Pipeline(json.loads(sys.argv[1])); c=time.process_time(); n=0\n"
            "for e in TaskMap(p.records(), p.task, chunk=int(sys.argv[2]), workers=1): n+=len(e.fields['input_ids'])\n"
            "print(n/(time.process_time()-c))")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(spec), str(chunk)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def tokens(ex: Any) -> int:
    return int(ex.fields["input_ids"].shape[0])


def run(mb: float, chunk: int) -> dict[str, Any]:
    import ray

    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="feedline-ray-bench-"))
    try:
        spec = {"sources": [{"path": str(make_text(tmp, mb))}], "tokenizer": str(DATA / "tokenizers" / "gpt2"),
                "task": {"kind": "clm", "max_length": 1024}, "batching": {"strategy": "pad", "batch_size": 8}}
        p = Pipeline(spec)
        rows: dict[str, Any] = {}
        model: dict[str, float] = {"r_tokens_per_core_s": one_core_rate(spec, chunk)}
        t, n = timed(iter(p.records()), lambda r: 1)
        rows["driver: read records"] = {"seconds": t, "records": n, "records_per_s": n / t}
        t, n = timed(iter(TaskMap(p.records(), p.task, chunk=chunk, workers=1)), tokens)
        rows["local engine, 1 thread"] = {"seconds": t, "tokens": n, "tokens_per_s": n / t}
        t, n = timed(iter(TaskMap(p.records(), p.task, chunk=chunk, workers=2)), tokens)
        rows["local engine, 2 threads"] = {"seconds": t, "tokens": n, "tokens_per_s": n / t}
        for cpus in (1, 2):
            ray.init(num_cpus=cpus, include_dashboard=False, configure_logging=False)
            try:
                engine = ParallelSpec(map="ray", address="auto")
                warm = RayTaskMap(p.records(), p.task, engine, chunk=chunk)
                timed(zip(range(4 * chunk * cpus), iter(warm)), lambda x: 0)  # start workers, ship the task
                t, cpu, n = cpu_timed(iter(RayTaskMap(p.records(), p.task, engine, chunk=chunk)), tokens)
                rows[f"ray engine, {cpus} worker{'s' if cpus > 1 else ''}"] = {"seconds": t, "tokens": n, "tokens_per_s": n / t}
                if cpus == 2:
                    model["D_driver_tokens_per_cpu_s"] = n / cpu
                if cpus == 2:
                    echo = Echo(p.task.options, p.task.ctx)
                    t, n = timed(iter(RayTaskMap(p.records(), echo, engine, chunk=chunk)), lambda x: 1)
                    rows["ray driver loop, no-op task"] = {"seconds": t, "records": n, "records_per_s": n / t}
            finally:
                ray.shutdown()
        return {"mb": mb, "chunk": chunk, "cpus": os.cpu_count(), "rows": rows, "model": model, "load": load0, "load_after": os.getloadavg()[0]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=15.0, help="megabytes of text (default 15)")
    ap.add_argument("--chunk", type=int, default=256, help="records per Ray task (default 256)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    if not (DATA / "prose" / "c4_demo.jsonl").exists():
        print(f"needs the shared test data at {DATA}", file=sys.stderr)
        return 1
    res = run(args.mb, args.chunk)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    rows = res["rows"]
    base = rows["local engine, 1 thread"]["tokens_per_s"]
    print(f"{res['mb']:.0f} MB of C4 text, clm/GPT-2, chunk {res['chunk']}, {res['cpus']} cores, "
          f"load average {res['load']:.1f} before / {res['load_after']:.1f} after (other work on the machine skews every row)")
    print(f"{'configuration':32} {'seconds':>8} {'rate':>16} {'vs local 1 thread':>18}")
    for name, r in rows.items():
        if "tokens_per_s" in r:
            print(f"{name:32} {r['seconds']:8.2f} {r['tokens_per_s'] / 1e6:11.2f} Mtok/s {r['tokens_per_s'] / base:17.2f}x")
        else:
            print(f"{name:32} {r['seconds']:8.2f} {r['records_per_s'] / 1e3:11.1f} krec/s {'':>18}")
    two, one = rows["ray engine, 2 workers"]["tokens_per_s"], rows["ray engine, 1 worker"]["tokens_per_s"]
    print(f"ray 2 workers / 1 worker: {two / one:.2f}x;  ray 2 workers / local 2 threads: "
          f"{two / rows['local engine, 2 threads']['tokens_per_s']:.2f}x")
    m = res["model"]
    r, d = m["r_tokens_per_core_s"], m["D_driver_tokens_per_cpu_s"]
    print(f"model inputs (CPU time, robust to load): r = {r / 1e6:.2f} Mtok/s per worker core; "
          f"D = {d / 1e6:.2f} Mtok/s per driver core; D / r = {d / r:.1f} worker cores per driver core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
