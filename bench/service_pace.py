"""Does the service keep pace with the pipeline? Service / in-process on unique long documents, K = 1 and 2.

    python bench/service_pace.py                          # K 1,2; 3 rounds; 2.5 s warm-up, 3 s window
    python bench/service_pace.py --k 1 --rounds 5 --seconds 4
    python bench/service_pace.py --checkouts before=/other/checkout/src,after=src   # both, interleaved

The workload is ``bench/scaling.py``'s ``clm-docs``: GPT-2, clm pack 1024 x 16 rows, on C4 and
Wikipedia documents whose letters are permuted anew each pass (no text twice in the corpus;
``--mb`` of it, read again from the start when a run outlasts it). For each K (``partitions``; K > 1
with ``parallel: {placement: processes}``) two settings run, each in fresh processes:

  in-process   ``feedline.Loader(spec)`` in a child process
  service      ``feedline serve`` (its own process, started and listening before the clock starts)
               and one client process, ``feedline.Loader(address)``; with ``--coalesce 1,4`` one
               service setting per ``feedline serve --coalesce N`` (steps per message)

Every setting builds its loader, takes the first batch (``first batch s``: cold start, from the
loader's construction; for the service the server is already listening, so this is the client's
connection and the first steps of a stream the server starts on that hello), runs on for
``--warmup`` seconds, then counts real tokens (``attention_mask``) for ``--seconds``: the steady
rate, and the CPU time of every process involved (loader, partition workers, server) per step.
Rounds interleave the settings (and the ``--checkouts``, whose ``src`` folders are put first
on the path of every process of their settings) so that a busy machine's load falls on all of them;
the table shows medians and each round's ratio service / in-process of the same K, checkout and round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from common import machine, save_json, table, tree_cpu
from scaling import measure_loader, spec_for


def measure(source: Any, seconds: float, warmup: float, server: int | None = None) -> dict[str, Any]:
    """First-batch time, steady real tokens/s and CPU time per step (this process and its workers,
    plus the ``server`` process and its workers) of ``feedline.Loader(source)`` in this process."""
    def cpu() -> float:
        return tree_cpu() + (tree_cpu(server) if server else 0.0)

    return measure_loader(source, seconds, warmup, cpu)


def run_child(setting: dict[str, Any], args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(setting), "--seconds", str(args.seconds),
           "--warmup", str(args.warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=args.timeout, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def one(k: str, kind: str, src: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement: ``kind`` is ``in-process`` or ``service`` (``service c<N>``: ``--coalesce N``)."""
    n = int(k.rstrip("p"))  # "1p": one partition, its pipeline in a worker process
    spec = spec_for("clm-docs", args.mb, 0, n, "processes" if n > 1 or k.endswith("p") else None)
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")])
    if kind == "in-process":
        return run_child({"source": spec}, args, env)
    from feedline.service import serve_process  # the server runs `python -m feedline` under env's path

    serve_args = ["--coalesce", kind.split(" c")[1]] if " c" in kind else []
    with serve_process(spec, env=env, args=serve_args) as address:
        server = [p.pid for p in psutil.Process().children() if "serve" in p.cmdline()]
        return run_child({"source": address, "server": server[0] if server else None}, args, env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", default="1,2", help="partition counts (K > 1 in worker processes; 1p: K = 1 in one)")
    ap.add_argument("--mb", type=float, default=48, help="corpus size (no text twice)")
    ap.add_argument("--seconds", type=float, default=3.0, help="measured window")
    ap.add_argument("--warmup", type=float, default=2.5, help="seconds between the first batch and the window")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180, help="seconds per measurement process")
    ap.add_argument("--checkouts", default="", help="NAME=SRC,... : run every setting under each src folder")
    ap.add_argument("--coalesce", default="", help="e.g. 1,4: a service setting per `feedline serve --coalesce N`")
    ap.add_argument("--tag", default="")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        setting = json.loads(args.child)
        print(json.dumps(measure(setting["source"], args.seconds, args.warmup, setting.get("server"))))
        return 0
    ks = args.k.split(",")
    checkouts = dict(c.split("=", 1) for c in args.checkouts.split(",")) if args.checkouts else {"": ""}
    kinds = ["in-process", *([f"service c{n}" for n in args.coalesce.split(",")] if args.coalesce else ["service"])]
    spec_for("clm-docs", args.mb, 0)  # the corpus is written before any clock starts
    load0 = os.getloadavg()[0]
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {(c, k, kind): [] for c in checkouts for k in ks for kind in kinds}
    for r in range(args.rounds):
        for k in ks:
            for c, src in checkouts.items():
                for kind in kinds if r % 2 == 0 else kinds[::-1]:
                    got = one(k, kind, src, args)
                    runs[(c, k, kind)].append(got)
                    print(f"round {r + 1} {c} K={k} {kind:12s} {got['tokens_per_s'] / 1e6:6.2f} M tok/s "
                          f"({got['steps_per_s']:.0f} steps/s, {got['cpu_ms_per_step']:.2f} CPU ms/step), "
                          f"first batch {got['first_batch_s']:.2f} s", flush=True)
    rows = []
    for (c, k, kind), rs in runs.items():
        base = runs[(c, k, "in-process")]
        ratios = [x["tokens_per_s"] / b["tokens_per_s"] for x, b in zip(rs, base, strict=True)]
        rows.append({"checkout": c, "K": k, "setting": kind,
                     "tokens_per_s": statistics.median(x["tokens_per_s"] for x in rs),
                     "steps_per_s": statistics.median(x["steps_per_s"] for x in rs),
                     "first_batch_s": statistics.median(x["first_batch_s"] for x in rs),
                     "cpu_ms_per_step": statistics.median(x["cpu_ms_per_step"] for x in rs),
                     "ratio": statistics.median(ratios),
                     "ratios": [round(x, 2) for x in ratios], "runs": [round(x["tokens_per_s"] / 1e6, 2) for x in rs]})
    load1 = os.getloadavg()[0]
    print(f"{len(os.sched_getaffinity(0))} usable cores ({os.cpu_count()} in the machine); load average {load0:.2f} "
          f"before, {load1:.2f} after; {args.seconds:g} s windows {args.warmup:g} s after the first batch; "
          f"medians of {args.rounds} interleaved rounds")
    print(table(rows, [("checkout", "checkout", ""), ("K", "K", ""), ("setting", "setting", ""),
                       ("tokens_per_s", "median tok/s", ",.0f"), ("steps_per_s", "steps/s", ",.0f"),
                       ("ratio", "service / in-process", ".2f"), ("ratios", "each round", ""),
                       ("cpu_ms_per_step", "CPU ms/step", ".3f"), ("first_batch_s", "first batch s", ".2f"),
                       ("runs", "each run M tok/s", "")]))
    name = "service-pace" + (f"-{args.tag}" if args.tag else "")
    print(f"saved {save_json(name, {'machine': machine(), 'load_avg': [load0, load1], 'args': vars(args), 'rows': rows})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
