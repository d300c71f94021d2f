"""``feedline demo``: stream the embedded corpus into a tiny model's training and show the loss falling.

``--all`` runs every task's demo in turn, prints one result line per task and a final table, and
exits 1 if any task's loss did not fall.
"""

from __future__ import annotations

import argparse

from feedline._cli._common import add_progress_argument, setup_progress
from feedline.errors import SpecError

NAME = "demo"
HELP = "train a tiny model from a streaming loader on the embedded corpus (what `make demo` runs)"
EXAMPLE = "feedline demo --steps 300 --task clm   (every task in turn: feedline demo --all --steps 200)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_progress_argument(p)
    from feedline._demo.run import DEMO_TASKS

    p.add_argument("--task", default="clm", choices=sorted(DEMO_TASKS), help="task to train (default: clm)")
    p.add_argument("--all", action="store_true",
                   help="train every task's demo in turn, with a summary table; exit 1 if a loss did not fall")
    p.add_argument("--tasks", default=None, metavar="A,B",
                   help=f"with --all: only these tasks, in this order (default: {','.join(sorted(DEMO_TASKS))})")
    p.add_argument("--steps", type=int, default=300, help="training steps (default: 300, about a minute)")
    p.add_argument("--source", default=None, help="a path, glob or URL to read instead of the embedded corpus")
    p.add_argument("--tokenizer", default=None, help="a tokenizer to use instead of the embedded one")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per row (default: 128)")
    p.add_argument("--batch-size", type=int, default=16, help="rows per step (default: 16)")
    p.add_argument("--in-process", action="store_true", help="run the loader in the trainer's process instead of a service")


def run(args: argparse.Namespace) -> int:
    setup_progress(args)
    import math

    from feedline._core.optional import require

    require("torch", "torch")  # the demo trains tiny torch models: say so in one line when it is missing
    from feedline._demo.run import run_demo

    if args.all:
        return _run_all(args)
    if args.tasks:
        raise SpecError("--tasks chooses the tasks of --all; for one task use --task NAME")
    summary = run_demo(task=args.task, steps=args.steps, source=args.source, tokenizer=args.tokenizer,
                       seq_len=args.seq_len, batch_size=args.batch_size, in_process=args.in_process)
    if summary.steps == 0 or math.isnan(summary.last_loss):
        print("feedline demo: error: no batches were produced", flush=True)
        return 1
    return 0


def _run_all(args: argparse.Namespace) -> int:
    import sys

    from feedline._demo.run import DEMO_TASKS, run_demo

    names = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else sorted(DEMO_TASKS)
    unknown = [t for t in names if t not in DEMO_TASKS]
    if unknown or not names:
        raise SpecError(f"--tasks: {', '.join(unknown) or '(none)'} not a demo task; choose from "
                        f"{', '.join(sorted(DEMO_TASKS))}")
    rows = []
    for name in names:
        s = run_demo(task=name, steps=args.steps, source=args.source, tokenizer=args.tokenizer, seq_len=args.seq_len,
                     batch_size=args.batch_size, in_process=args.in_process)
        falls = s.steps > 0 and s.last_loss < s.first_loss
        rows.append((name, s, falls))
        print(f"{name}: {s.steps} steps, loss {s.first_loss:.3f} -> {s.last_loss:.3f}, {s.tokens_per_s:,.0f} tokens/s, "
              f"data wait {100 * s.wait_share:.1f}%  {'ok' if falls else 'LOSS DID NOT FALL'}", flush=True)
    print(f"\n{'task':<10} {'steps':>6} {'first':>8} {'last':>8} {'tokens/s':>10} {'data wait':>10}  result")
    for name, s, falls in rows:
        print(f"{name:<10} {s.steps:>6} {s.first_loss:>8.3f} {s.last_loss:>8.3f} {s.tokens_per_s:>10,.0f} "
              f"{100 * s.wait_share:>9.1f}%  {'ok' if falls else 'FAILED'}")
    failed = [name for name, _s, falls in rows if not falls]
    if failed:
        print(f"feedline demo: the loss did not fall for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
