"""Partitions on this machine: K in worker processes against K = 1, same run, as ratios.

    .venv/bin/python bench/partitions.py                  # rates: clm-1024-short and mlm-128, 2 rounds
    .venv/bin/python bench/partitions.py --k 1,2,4 --seconds 8
    .venv/bin/python bench/partitions.py --first --k 1,2,4,8,14          # first-batch times
    .venv/bin/python bench/partitions.py --breakdown --k 14              # where a worker's start goes
    .venv/bin/python bench/partitions.py --transport                     # a batch's cost on the pipe
    .venv/bin/python bench/partitions.py --one-core --k 1,14             # a partition's rate on one core
    .venv/bin/python bench/partitions.py --cpu --k 0,1,8,14              # CPU per token and per step
    .venv/bin/python bench/partitions.py --cpu --k 0,1,8 --base ../main  # the same, A/B against another checkout

Rates: for each workload (``bench/contenders.py``: packed GPT-2 rows of 1024 on short records,
padded BERT rows of 128 on documents), each K runs an endless stream for ``--warmup`` seconds after
its first batch and then counts real tokens (``attention_mask``) for ``--seconds``; the Ks alternate
for ``--rounds`` rounds so that a busy machine's drift falls on both. K = 1 is the plain loader
(no composing stage); K > 1 runs ``parallel: {placement: --placement}``.

``--first``: the seconds from the loader's construction to its first batch and to its 6th, and the
real tokens delivered by 3 s and by 8 s from it, each in a fresh process, K = 1 against each K > 1
under ``processes-warm`` (partitions on threads here until their worker is ready),
``processes-cold`` (``warm_start: false``), ``processes`` (``auto``: warm only with a core per
worker beside two for the parent) and ``threads``.

``--breakdown`` (a worker's start, phase by phase) and ``--transport`` (a batch's cost on the
pipe): ``bench/partition_mechanics.py``.

``--one-core``: what one partition of K delivers on one core, the way a worker on a node with a
core per partition runs it (pinned to one CPU, the tokenizer's pool one thread): partition 0's
stream (K = 1: the plain pipeline), each batch's state materialized and the pair pickled, tokens
counted for ``--seconds`` after ``--warmup``. K partitions on K free cores give at most K times
that, if the composing process keeps up (its CPU per step: ``bench/scaling.py``). The curve over
K and placements, against the raw encoder, is ``bench/scaling.py``'s.

``--cpu``: what a token costs, whoever spends it. Each setting runs in a fresh process on text that
never repeats (``bench/scaling.py``'s ``clm-short`` and ``clm-docs`` corpora, ``--mb`` MB, GPT-2,
clm pack 1024 x 16); from ``--warmup`` seconds after the first batch it counts ``--seconds`` of
real tokens and reads the CPU seconds (user + system) of the whole process tree (this process,
the fork server, the workers) and of this process alone. K = 0 is the plain loader in this
process; K = 1 is ``partitions: 1`` in a worker process (``--placement``); K > 1 as for rates.
Per setting, medians of ``--rounds`` interleaved rounds: tree CPU seconds per million tokens (and
as a ratio to K = 0 and to K = 1: of the medians, and *paired*, the median and range of each
round's ratio, which a box whose speed drifts within the hour does not move) and the composing
process's CPU ms per step. ``--base CHECKOUT``
runs every setting under that checkout's ``src`` too, in the same rounds in alternating order (on a
shared machine only such same-run ratios mean anything), and prints this one's ratios to it. On 2 cores K = 14
needs ``--warmup 12``: with less, the window still holds its 14 pipelines' start (0.1 M tok/s).
``--cpu --windows N`` builds every K's loader in one process and consumes them in alternating
``--window``-second windows, N each, in ``--rounds`` fresh processes (``bench/cpu_windows.py``): two
settings are measured a second apart, not minutes, and their ratios pair window by window.
``--pin CPUS`` (``--cpu``: e.g. ``0``) runs every setting's process tree on those CPUs only: with
one, no two threads of a setting run at once, so what K = 1 spends above K = 0 is work it does
(its pipe, its second process, their wake-ups), not the cost of running in parallel on a shared
machine (two busy cores each run slower than one). Fewer cores also change the settings
(``auto`` sizes the tokenizer's pool and warm start by the usable cores).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, prose_corpus, require_data, short_corpus
from contenders import WORKLOADS, feedline_spec

PLACEMENTS = {"processes": {"placement": "processes"},   # warm_start: auto
              "processes-warm": {"placement": "processes", "warm_start": True},
              "processes-cold": {"placement": "processes", "warm_start": False},
              "threads": {"placement": "threads"}}


def base_spec(name: str) -> dict[str, Any]:
    w = WORKLOADS[name]
    corpus = short_corpus(16) if w.corpus == "short" else prose_corpus(16)
    return {**feedline_spec(corpus, w), "epochs": None}


def with_k(spec: dict[str, Any], k: int, placement: str) -> dict[str, Any]:
    return spec if k == 1 else {**spec, "partitions": k, "parallel": PLACEMENTS[placement]}


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


def rates(args: argparse.Namespace, ks: list[int]) -> None:
    for name in args.workloads.split(","):
        base = base_spec(name)
        got: dict[int, list[float]] = {k: [] for k in ks}
        firsts: dict[int, list[float]] = {k: [] for k in ks}
        for _ in range(args.rounds):
            for k in ks:
                r, f = rate(with_k(base, k, args.placement), args.warmup, args.seconds)
                got[k].append(r)
                firsts[k].append(f)
        one = float(np.mean(got[ks[0]]))
        for k in ks:
            m = float(np.mean(got[k]))
            print(f"{name:16s} K={k}: {m / 1e6:6.2f} M tok/s ({', '.join(f'{r / 1e6:.2f}' for r in got[k])}), "
                  f"x{m / one:.2f} of K={ks[0]}; first batch {np.mean(firsts[k]):.2f} s", flush=True)


# ------------------------------------------------------------------------------- --cpu
PIN_ENV = "FEEDLINE_BENCH_PIN"   # --pin, for the child (its CPUs)


def cpu_child(name: str, k: int, placement: str, mb: float, seconds: float, warmup: float) -> dict[str, float]:
    pin = os.environ.get(PIN_ENV)
    if pin:   # before anything starts a thread or a process: they inherit it
        os.sched_setaffinity(0, {int(c) for c in pin.split(",")})
    import scaling
    from common import tree_cpu

    spec = scaling.spec_for(name, mb, 0, max(k, 1), None if k == 0 else PLACEMENTS[placement]["placement"])
    if k and placement != "processes":
        spec["parallel"] = PLACEMENTS[placement]
    got = scaling.measure_loader(spec, seconds, warmup, cpu=time.process_time, tree=tree_cpu)
    return {"tokens_per_s": got["tokens_per_s"], "cpu_s_per_m": got["busy_cores"] / got["tokens_per_s"] * 1e6,
            "ms_per_step": got["cpu_ms_per_step"]}


def paired(runs: dict[tuple[str, int], list[dict[str, float]]], t: str, k: int, j: int) -> str:
    """K's CPU per token over K = ``j``'s, round by round (the two ran minutes apart at most, so a box
    whose speed drifts over an hour drifts out of each ratio): the median and the range; blank where a
    run of either failed (the rounds no longer pair up)."""
    a, b = runs.get((t, k), []), runs.get((t, j), [])
    if not a or len(a) != len(b):
        return ""
    ratios = sorted(x["cpu_s_per_m"] / y["cpu_s_per_m"] for x, y in zip(a, b))
    return f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def cpu_costs(args: argparse.Namespace, ks: list[int]) -> None:
    """``--cpu``; with ``--base``, each setting runs under both checkouts in the same rounds (this one
    and the base, in alternating order), and a table per checkout is printed, then this one's ratios to the base's."""
    import scaling

    names = [n for n in args.workloads.split(",") if n in scaling.WORKLOADS] or ["clm-short", "clm-docs"]
    here = str(Path(__file__).resolve().parent.parent / "src")
    trees = {"this": here, **({"base": str(Path(args.base).resolve() / "src")} if args.base else {})}
    for name in names:
        scaling.spec_for(name, args.mb, 0)  # corpora written before any clock starts
        runs: dict[tuple[str, int], list[dict[str, float]]] = {(t, k): [] for t in trees for k in ks}
        for r in range(args.rounds):
            for k in ks:
                for t in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                    env = {**os.environ, "PYTHONPATH": trees[t], **({PIN_ENV: args.pin} if args.pin else {})}
                    got = in_fresh_process("cpu", name, str(k), args.placement, str(args.mb), str(args.seconds),
                                           str(args.warmup), env=env)
                    if got:
                        runs[(t, k)].append(got)
        med = {key: {f: statistics.median(r[f] for r in rs) for f in rs[0]} for key, rs in runs.items() if rs}
        for t in trees:
            print(f"\n{name} ({t}: {trees[t]}): tree CPU s per M tokens and this process's CPU ms per step, "
                  f"{args.seconds:g} s from {args.warmup:g} s after the first batch, medians of {args.rounds} "
                  f"interleaved fresh processes (K = 0: in-process; K >= 1: {args.placement})"
                  + (f", every process on CPUs {args.pin}" if args.pin else ""))
            print("| K | M tok/s | tree CPU s / M tok | x K=0 | x K=1 | x K=0, paired | x K=1, paired | composer CPU ms/step "
                  "| each run (CPU s / M) |\n|---|---:|---:|---:|---:|---:|---:|---:|---|")
            for k in ks:
                if (t, k) not in med:
                    continue
                m = med[(t, k)]
                r0, r1 = (med[(t, j)]["cpu_s_per_m"] if (t, j) in med else float("nan") for j in (0, 1))
                print(f"| {k} | {m['tokens_per_s'] / 1e6:.2f} | {m['cpu_s_per_m']:.3f} | {m['cpu_s_per_m'] / r0:.2f} | "
                      f"{m['cpu_s_per_m'] / r1:.2f} | {paired(runs, t, k, 0)} | {paired(runs, t, k, 1)} | {m['ms_per_step']:.3f} | "
                      f"{', '.join(format(r['cpu_s_per_m'], '.3f') for r in runs[(t, k)])} |", flush=True)
        if args.base:
            print(f"{name}: this / base, tree CPU per token (composer CPU per step): " + ", ".join(
                f"K={k} {med[('this', k)]['cpu_s_per_m'] / med[('base', k)]['cpu_s_per_m']:.2f} "
                f"({med[('this', k)]['ms_per_step'] / med[('base', k)]['ms_per_step']:.2f})"
                for k in ks if ("this", k) in med and ("base", k) in med), flush=True)


# ------------------------------------------------------------------------------- --first
def first_child(name: str, k: int, placement: str) -> dict[str, float]:
    import feedline

    t0 = time.perf_counter()
    with feedline.Loader(with_k(base_spec(name), k, placement)) as loader:
        out: dict[str, float] = {}
        tokens = 0
        for n, batch in enumerate(loader, 1):
            now = time.perf_counter() - t0
            if n == 1:
                out["first_s"] = now
            elif n == 6:
                out["sixth_s"] = now
            if now >= 3 and "by_3s" not in out:
                out["by_3s"] = tokens
            if now >= 8:
                out["by_8s"] = tokens
                return out
            tokens += int(batch["attention_mask"].sum())
    return out


def in_fresh_process(*child_args: str, timeout: float = 300, env: dict[str, str] | None = None) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--child", *child_args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=timeout, env=env).stdout
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        tail = (getattr(e, "stderr", "") or "").strip().splitlines()[-1:] or [type(e).__name__]
        print(f"{child_args}: failed: {tail[0]}")
        return None


def first_batches(args: argparse.Namespace, ks: list[int]) -> None:
    settings = [(k, p) for k in ks for p in (["plain"] if k == 1 else args.placements.split(","))]
    for name in args.workloads.split(","):
        base_spec(name)  # corpora written before any clock starts
        runs: dict[tuple[int, str], list[dict[str, float]]] = {s: [] for s in settings}
        for _ in range(args.rounds):
            for k, p in settings:
                got = in_fresh_process("first", name, str(k), p)
                if got:
                    runs[(k, p)].append(got)
        one = statistics.median(r["first_s"] for r in runs[settings[0]])
        print(f"\n{name}: seconds from Loader(...) to the first batch and to the 6th, medians of {args.rounds} fresh processes")
        print("| K | placement | first batch s | x K=1 | 6th batch s | M tokens by 3 s | by 8 s | each run (first) |\n"
              "|---|---|---:|---:|---:|---:|---:|---|")
        for (k, p), rs in runs.items():
            if rs:
                f = statistics.median(r["first_s"] for r in rs)
                print(f"| {k} | {p} | {f:.2f} | {f / one:.1f} | {statistics.median(r['sixth_s'] for r in rs):.2f} | "
                      f"{statistics.median(r['by_3s'] for r in rs) / 1e6:.1f} | {statistics.median(r['by_8s'] for r in rs) / 1e6:.1f} | "
                      f"{', '.join(format(r['first_s'], '.2f') for r in rs)} |", flush=True)


# ------------------------------------------------------------------------------- --one-core
def one_core_child(name: str, k: int, cpu: str) -> dict[str, float]:
    from feedline import Spec
    from feedline._core.deferred import materialize
    from feedline._pipeline import Pipeline

    os.sched_setaffinity(0, {int(cpu)})
    spec = Spec.load(with_k(base_spec(name), k, "threads"))
    it = iter(Pipeline(spec, partition=0 if k > 1 else None).batches())
    t0 = time.perf_counter()
    batch = next(it)
    first = time.perf_counter() - t0
    start = time.perf_counter() + float(os.environ["FEEDLINE_BENCH_WARMUP"])
    while time.perf_counter() < start:
        next(it)
    window = float(os.environ["FEEDLINE_BENCH_SECONDS"])
    tokens = batches = rows = 0
    state_s = pickle_s = 0.0
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < window:
        batch = next(it)
        t = time.perf_counter()
        state = materialize(it.snapshot())
        t2 = time.perf_counter()
        pickle.dumps((batch, state), protocol=pickle.HIGHEST_PROTOCOL)
        state_s, pickle_s = state_s + t2 - t, pickle_s + time.perf_counter() - t2
        tokens += int(np.asarray(batch["attention_mask"]).sum())
        rows += len(batch["attention_mask"])
        batches += 1
    wall = time.perf_counter() - t1
    it.close()
    return {"tok_s": tokens / wall, "ms_per_batch": wall / batches * 1e3, "rows_per_batch": rows / batches,
            "state_ms": state_s / batches * 1e3, "pickle_ms": pickle_s / batches * 1e3, "first_s": first}


def one_core(args: argparse.Namespace, ks: list[int]) -> None:
    os.environ.update(RAYON_NUM_THREADS="1", FEEDLINE_BENCH_WARMUP=str(args.warmup), FEEDLINE_BENCH_SECONDS=str(args.seconds))
    cpu = str(max(os.sched_getaffinity(0)))
    for name in args.workloads.split(","):
        base_spec(name)  # corpora written before any clock starts
        runs: dict[int, list[dict[str, float]]] = {k: [] for k in ks}
        for _ in range(args.rounds):
            for k in ks:
                got = in_fresh_process("one-core", name, str(k), cpu)
                if got is not None:
                    runs[k].append(got)
        one = statistics.median(r["tok_s"] for r in runs[ks[0]]) if runs[ks[0]] else float("nan")
        for k in ks:
            if not runs[k]:
                continue
            med = {key: statistics.median(r[key] for r in runs[k]) for key in runs[k][0]}
            each = ", ".join(f"{r['tok_s'] / 1e6:.2f}" for r in runs[k])
            print(f"{name:16s} K={k:<3d} one partition on one core: {med['tok_s'] / 1e6:6.2f} M tok/s "
                  f"({each}), x{med['tok_s'] / one:.2f} of K={ks[0]}; "
                  f"{med['rows_per_batch']:.1f} rows, {med['ms_per_batch']:.2f} ms a batch (its state "
                  f"{med['state_ms']:.2f} ms, pickling {med['pickle_ms']:.2f} ms); first batch {med['first_s']:.2f} s",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="clm-1024-short,mlm-128")
    ap.add_argument("--k", default="1,2", help="partition counts (K > 1 in processes)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--placement", default="processes", choices=sorted(PLACEMENTS), help="rates: where K > 1 runs")
    ap.add_argument("--placements", default="processes-warm,processes-cold,processes,threads",
                    help="--first: the placements of K > 1")
    ap.add_argument("--first", action="store_true", help="first-batch times, each in a fresh process")
    ap.add_argument("--breakdown", action="store_true", help="a worker's start, phase by phase (spawn, forkserver)")
    ap.add_argument("--transport", action="store_true", help="a batch's cost on a multiprocessing pipe")
    ap.add_argument("--one-core", action="store_true", help="one partition's rate on one pinned core")
    ap.add_argument("--cpu", action="store_true", help="tree CPU per M tokens and the composer's CPU per step")
    ap.add_argument("--mb", type=float, default=48, help="--cpu: corpus size per workload (no text twice)")
    ap.add_argument("--pin", help="--cpu: the CPUs (e.g. 0 or 0,1) every setting's process tree runs on")
    ap.add_argument("--windows", type=int, default=0,
                    help="--cpu: every K alive in one process, in N alternating windows each (bench/cpu_windows.py)")
    ap.add_argument("--window", type=float, default=1.0, help="--windows: seconds a window")
    ap.add_argument("--base", help="--cpu: another checkout (its root) run in the same interleaved rounds, for A/B ratios")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.child[0] == "cpu":
            _, name, k, placement, mb, seconds, warmup = args.child
            print(json.dumps(cpu_child(name, int(k), placement, float(mb), float(seconds), float(warmup))))
            return
        if args.child[0] == "windows":
            from cpu_windows import main_child

            main_child(args.child[1:])
            return
        kind, name, k, extra = args.child
        if kind == "breakdown":
            from partition_mechanics import breakdown_child

            print(json.dumps(breakdown_child(name, int(k), extra)))
        else:
            print(json.dumps({"first": first_child, "one-core": one_core_child}[kind](name, int(k), extra)))
        return
    require_data()
    print(machine())
    print(f"{len(os.sched_getaffinity(0))} usable cores; load average {os.getloadavg()[0]:.2f} at the start")
    ks = [int(k) for k in args.k.split(",")]
    if args.first:
        first_batches(args, ks)
    elif args.breakdown:
        from partition_mechanics import breakdowns

        breakdowns(args, ks)
    elif args.transport:
        from partition_mechanics import transport

        transport(args)
    elif args.one_core:
        one_core(args, ks)
    elif args.cpu and args.windows:
        from cpu_windows import cpu_windows

        cpu_windows(args, ks, PLACEMENTS[args.placement], in_fresh_process)
    elif args.cpu:
        cpu_costs(args, ks)
    else:
        rates(args, ks)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
