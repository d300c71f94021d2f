"""``feedline demo``: stream the embedded corpus into a tiny model's training and show the loss falling."""

from __future__ import annotations

import argparse

NAME = "demo"
HELP = "train a tiny model from a streaming loader on the embedded corpus (what `make demo` runs)"
EXAMPLE = "feedline demo --steps 300 --task clm"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from feedline.demo.run import DEMO_TASKS

    p.add_argument("--task", default="clm", choices=sorted(DEMO_TASKS), help="task to train (default: clm)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default: 300, about a minute)")
    p.add_argument("--source", default=None, help="a path, glob or URL to read instead of the embedded corpus")
    p.add_argument("--tokenizer", default=None, help="a tokenizer to use instead of the embedded one")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per row (default: 128)")
    p.add_argument("--batch-size", type=int, default=16, help="rows per step (default: 16)")
    p.add_argument("--in-process", action="store_true", help="run the loader in the trainer's process instead of a service")


def run(args: argparse.Namespace) -> int:
    import math

    from feedline.errors import require

    require("torch", "torch")  # the demo trains tiny torch models: say so in one line when it is missing
    from feedline.demo.run import run_demo

    summary = run_demo(task=args.task, steps=args.steps, source=args.source, tokenizer=args.tokenizer,
                       seq_len=args.seq_len, batch_size=args.batch_size, in_process=args.in_process)
    if summary.steps == 0 or math.isnan(summary.last_loss):
        print("feedline demo: error: no batches were produced", flush=True)
        return 1
    return 0
