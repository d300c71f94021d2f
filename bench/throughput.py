"""Throughput: tokens/s delivered to the consumer, and CPU seconds per million tokens, per contender.

    .venv/bin/python bench/throughput.py                       # clm-1024 and mlm-128 on 512 MB
    .venv/bin/python bench/throughput.py --mb 8 --workloads clm-1024 --contenders raw,feedline

Each contender runs in a fresh child process on the same corpus (real text repeated to size) and
is stopped after ``--seconds`` of delivery after its first batch (the corpus is large enough that
nobody reaches its end, so bounded prefetch buffers do not inflate the rate). The steady rate
counts tokens after the first batch over the time after it; the end-to-end rate counts all tokens
from the start (conversion and start-up included); CPU seconds are the whole process tree's
(workers, servers and Ray daemons included), also after the first batch. Ratios are against
``raw`` in the same run. With ``--rounds N`` the contenders run N times, interleaved, and each
keeps its median run (``rounds`` lists every run's rate). Results go to ``bench/results/throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CORPUS_NOTE, SHORT_NOTE, Meter, RssSampler, add_note, corpus_bytes, machine, save_json, table
from contenders import CONTENDERS, LABELS, WORKLOADS, run

DEFAULT_CONTENDERS = {
    "clm-1024": ["raw", "feedline", "feedline-service", "hf-stream", "ray-data", "litdata"],
    "clm-1024-short": ["raw", "feedline", "feedline-service"],
    "clm-2048": ["raw", "feedline"],
    "mlm-128": ["raw", "feedline", "feedline-hf", "hf-stream"],
}
SINGLE = {"ray-data", "litdata", "hf-offline", "hf-stream"}  # one round only: peers far from the limit
COLUMNS = [("label", "contender", ""), ("tokens_per_s", "tokens/s", ",.0f"), ("vs_raw", "x raw", ".2f"),
           ("e2e_tokens_per_s", "end-to-end tokens/s", ",.0f"), ("first_batch_s", "first batch s", ".2f"), ("cpu_s_per_mtok", "CPU s / M tok", ".2f"),
           ("peak_rss_mb", "peak RSS MB", ",.0f"), ("tokens", "tokens", ",d"), ("rounds", "each round, tokens/s", ""),
           ("note", "note", "")]


def child_env() -> dict[str, str]:
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0",
               TOKENIZERS_PARALLELISM="true", PYTHONWARNINGS="ignore")
    env.pop("RAYON_NUM_THREADS", None)
    return env


def measure(name: str, corpus: Path, workload: str, *, seconds: float | None = None, batches: int | None = None,
            timeout: float = 300.0) -> dict[str, Any]:
    """Run one contender in a child process; its meter's figures plus the tree's peak RSS."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, __file__, "--child", name, "--corpus", str(corpus), "--workloads", workload, "--out", out]
    if seconds:
        cmd += ["--seconds", str(seconds)]
    if batches:
        cmd += ["--batches", str(batches)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with RssSampler(proc.pid) as rss:
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
            log += f"\n[timed out after {timeout:.0f} s]"
    try:
        res: dict[str, Any] = json.loads(Path(out).read_text())
    except (OSError, ValueError):
        res = {}
    finally:
        Path(out).unlink(missing_ok=True)
    tail = " / ".join(line for line in (log or "").strip().splitlines()[-3:])
    if not res.get("batches"):
        why = f"exit {proc.returncode}" if proc.returncode else "no batch delivered"
        res = {"error": f"{why}: {tail[-300:]}"}
    elif proc.returncode != 0:  # the measurement was written; the process failed on its way out
        res["exited"] = f"exit {proc.returncode} after writing its measurement (kept): {tail[-160:]}"
        add_note(res, res["exited"])
    res.update(contender=name, label=LABELS[name], workload=workload, wall_s=time.perf_counter() - t0,
               peak_rss_mb=rss.peak / 2**20)
    return res


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median steady rate (the lower middle one for an even count); all rates kept."""
    ok = sorted((r for r in runs if r.get("tokens_per_s")), key=lambda r: r["tokens_per_s"])
    best = dict(ok[(len(ok) - 1) // 2] if ok else runs[0])
    best["rounds"] = [round(r["tokens_per_s"]) if r.get("tokens_per_s") else None for r in runs]
    return best


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = next((r.get("tokens_per_s") for r in rows if r["contender"] == "raw"), None)
    for r in rows:
        tps = r.get("tokens_per_s")
        r["vs_raw"] = tps / base if tps and base else None
        if "error" in r:
            r["note"] = "failed: " + r["error"][:200]
        elif "convert_s" in r:
            add_note(r, f"conversion {r['convert_s']:.1f} s before the first batch")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=512, help="corpus size in MB (default 512: in-process at 10 M tok/s reads ~80 M tokens, 350 MB of prose, in 8 s)")
    ap.add_argument("--workloads", default="clm-1024,mlm-128", help=f"comma-separated, of {sorted(WORKLOADS)}")
    ap.add_argument("--contenders", default="", help=f"comma-separated, of {sorted(CONTENDERS)} (default: per workload)")
    ap.add_argument("--seconds", type=float, default=15.0, help="stop each contender after this much delivery")
    ap.add_argument("--batches", type=int, help="stop each contender after this many batches")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the contenders this many times, interleaved, and keep each one's median run "
                         f"(not {sorted(SINGLE)}: slow to start and far from the limit)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:  # one contender, in this fresh process
        meter = Meter(max_seconds=args.seconds, max_batches=args.batches)
        res = run(args.child, Path(args.corpus), WORKLOADS[args.workloads], meter)
        Path(args.out).write_text(json.dumps(res, default=str))
        return 0

    print(f"load average before: {os.getloadavg()[0]:.2f}")
    results: dict[str, Any] = {"machine": machine(), "corpus": {"mb": args.mb, "note": CORPUS_NOTE},
                               "seconds_cap": args.seconds, "rounds": args.rounds, "workloads": {}, "corpora": {}}
    for wl in args.workloads.split(","):
        corpus = WORKLOADS[wl].make_corpus(args.mb)
        note = SHORT_NOTE if WORKLOADS[wl].corpus == "short" else CORPUS_NOTE
        results["corpora"][wl] = {"path": str(corpus), "mb": args.mb, "note": note}
        print(f"corpus of {wl}: {corpus} ({corpus_bytes(corpus) / 2**20:.0f} MB): {note}")
        names = args.contenders.split(",") if args.contenders else DEFAULT_CONTENDERS[wl]
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for rnd in range(args.rounds):  # interleaved, so load from other work hits every contender alike
            for name in names:
                if rnd and name in SINGLE:
                    continue
                print(f"  {wl}: {name} (round {rnd + 1}) ...", flush=True)
                runs[name].append(measure(name, corpus, wl, seconds=args.seconds, batches=args.batches))
        rows = [median_run(rs) for rs in runs.values()]
        add_ratios(rows)
        results["workloads"][wl] = rows
        print(f"\n{wl} ({WORKLOADS[wl].batch_size} rows of {WORKLOADS[wl].length} a batch)\n" + table(rows, COLUMNS) + "\n")
    results["load_avg_after"] = os.getloadavg()[0]
    print(f"saved {save_json('throughput', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
