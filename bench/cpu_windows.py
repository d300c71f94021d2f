"""CPU per token of several settings alive in one process, consumed in alternating short windows.

``bench/partitions.py --cpu --windows N`` runs this. The fresh-process rounds of ``--cpu`` compare
settings measured minutes apart; on a shared machine whose speed moves by +-15 % from one second to
the next (its neighbours), their ratios scatter as much. Here every setting's loader is built and
warmed up in one process (K = 0: the plain loader in it; K >= 1: ``partitions: K`` in worker
processes), then they are consumed in turn for ``window`` seconds each, ``windows`` times, in an
order that rotates every round, so two settings' windows lie a second apart. Each window counts
real tokens (``attention_mask``) and reads the CPU seconds (user + system) of the whole process
tree and of this process alone; a setting whose turn it is not sits idle (its prefetched batches
made, its pipelines waiting). Before a window starts, 8 batches are taken unmeasured: those the
setting made ahead while another was measured.

Per run (a fresh process): each setting's median CPU seconds per million tokens, and the *paired*
ratios, the median of each window's ratio to the windows of K = 0 and K = 1 next to it. Runs are
repeated ``rounds`` times (fresh processes: a process's own speed differs a little from the next
one's), and the ratios pooled over every window of every run.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

TAKEN_FIRST = 8   # batches taken before each window: those made ahead while another setting was measured


def windows_child(name: str, ks: list[int], parallel: dict[str, Any], mb: float, window: float, windows: int,
                  warmup: float) -> dict[str, Any]:
    """Every setting's CPU per token (tree, and this process alone) in each of its ``windows`` windows
    (K >= 1 under ``parallel``, e.g. ``{"placement": "processes"}``)."""
    import scaling
    from common import tree_cpu

    import feedline

    specs = {k: scaling.spec_for(name, mb, 0, max(k, 1)) for k in ks}
    for k, spec in specs.items():
        if k:
            spec["parallel"] = dict(parallel)
    loaders = {k: feedline.Loader(spec) for k, spec in specs.items()}
    try:
        its = {k: iter(loader) for k, loader in loaders.items()}
        for it in its.values():   # each warmed up alone, to its steady state
            t = time.perf_counter()
            while time.perf_counter() - t < warmup:
                next(it)
        tree: dict[int, list[float]] = {k: [] for k in ks}
        own: dict[int, list[float]] = {k: [] for k in ks}
        tokens: dict[int, list[int]] = {k: [] for k in ks}
        for r in range(windows):
            order = ks[r % len(ks):] + ks[:r % len(ks)]
            for k in (order if r % 2 == 0 else order[::-1]):
                it = its[k]
                for _ in range(TAKEN_FIRST):
                    next(it)
                n, c, s, t = 0, tree_cpu(), time.process_time(), time.perf_counter()
                while time.perf_counter() - t < window:
                    n += int(next(it)["attention_mask"].sum())
                tree[k].append((tree_cpu() - c) / n * 1e6)
                own[k].append((time.process_time() - s) / n * 1e6)
                tokens[k].append(n)
    finally:
        for loader in loaders.values():
            loader.close()
    return {"tree": tree, "own": own, "tokens": tokens}


def _paired(runs: list[dict[str, Any]], k: int, j: int) -> list[float]:
    return [a / b for run in runs for a, b in zip(run["tree"][str(k)], run["tree"][str(j)])]


def report(name: str, ks: list[int], runs: list[dict[str, Any]], window: float, windows: int, mb: float) -> None:
    """One table: per setting, the median over runs of each run's median, and the paired ratios pooled."""
    print(f"\n{name}: tree CPU s per M tokens in alternating {window:g}-s windows, {windows} per setting in each of "
          f"{len(runs)} fresh processes ({mb:g} MB of text, none twice in it; K = 0: in-process, K >= 1: processes)")
    print("| K | tree CPU s / M tok | this process | x K=0, paired | x K=1, paired | each run's x K=0, paired | "
          "M tok a window |\n|---|---:|---:|---:|---:|---|---:|")
    for k in ks:
        tree = statistics.median(statistics.median(run["tree"][str(k)]) for run in runs)
        own = statistics.median(statistics.median(run["own"][str(k)]) for run in runs)
        cols = []
        for j in (0, 1):
            ratios = sorted(_paired(runs, k, j)) if j in ks else []
            cols.append(f"{statistics.median(ratios):.3f} ({ratios[0]:.2f}-{ratios[-1]:.2f})" if ratios else "")
        each = ", ".join(f"{statistics.median(_paired([run], k, 0)):.3f}" for run in runs) if 0 in ks else ""
        per_window = statistics.median(n for run in runs for n in run["tokens"][str(k)]) / 1e6
        print(f"| {k} | {tree:.4f} | {own:.4f} | {cols[0]} | {cols[1]} | {each} | {per_window:.1f} |", flush=True)


def cpu_windows(args: Any, ks: list[int], parallel: dict[str, Any], in_fresh_process: Any) -> None:
    """``--cpu --windows N``: ``--rounds`` fresh processes, each running :func:`windows_child`."""
    import scaling

    names = [n for n in args.workloads.split(",") if n in scaling.WORKLOADS] or ["clm-short", "clm-docs"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}   # this checkout's
    for name in names:
        scaling.spec_for(name, args.mb, 0)  # the corpus written before any clock starts
        runs = []
        for _ in range(args.rounds):
            got = in_fresh_process("windows", name, ",".join(map(str, ks)), json.dumps(parallel), str(args.mb),
                                   str(args.window), str(args.windows), str(args.warmup),
                                   timeout=120 + len(ks) * (args.warmup + 2 * args.windows * (args.window + 0.5)), env=env)
            if got:
                runs.append(got)
        if runs:
            report(name, ks, runs, args.window, args.windows, args.mb)


def main_child(argv: list[str]) -> None:
    name, ks, parallel, mb, window, windows, warmup = argv
    got = windows_child(name, [int(k) for k in ks.split(",")], json.loads(parallel), float(mb), float(window),
                        int(windows), float(warmup))
    print(json.dumps(got))
