"""``feedline scan``: records, bytes, tokens and rejected lines by reason, per source."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from feedline._cli._common import add_spec_argument, load_spec

NAME = "scan"
HELP = ("read every source of a spec once: records, text bytes, tokens (--tokens), rejected records by reason "
        "(--task: also those the task rejects), global steps of an epoch (--steps)")
EXAMPLE = ("feedline scan spec.yaml --tokens --json      (exit 1 with --strict when any record was rejected)\n"
           "  feedline scan spec.yaml --steps             (the exact global steps of one epoch: for max_steps)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    p.add_argument("--tokens", action="store_true", help="also count tokens with the spec's tokenizer")
    p.add_argument("--tokenizer", help="tokenizer to count with (overrides the spec's)")
    p.add_argument("--task", action="store_true",
                   help="also run the spec's task over every record and count what it rejects, by reason")
    p.add_argument("--steps", action="store_true",
                   help="also count the global steps one epoch yields (and all epochs, where the spec has several), "
                        "exactly: the whole pipeline runs once, tokenizing and batching (feedline.epoch_steps)")
    p.add_argument("--limit", type=int, help="stop after this many records")
    p.add_argument("--strict", action="store_true", help="exit with code 1 when any record was rejected")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when standard error is a terminal)")


def run(args: argparse.Namespace) -> int:
    from feedline._sources.scan import scan

    if args.steps and args.limit is not None:
        from feedline.errors import SpecError

        raise SpecError("--steps counts whole epochs; drop --limit")
    spec = load_spec(args.spec)
    if args.tokenizer:
        spec = dataclasses.replace(spec, tokenizer=args.tokenizer)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar: Any = None
    if show:
        from tqdm import tqdm

        bar = tqdm(unit=" records", file=sys.stderr, mininterval=0.5)
    try:
        report = scan(spec, tokens=args.tokens or bool(args.tokenizer), limit=args.limit,
                      progress=(lambda n: bar.update(n - bar.n)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    if args.task:
        _add_task_rejections(report, spec, args.limit)
    if args.steps:
        from feedline._tools.steps import epoch_steps

        report["steps"] = epoch_steps(spec)
        if spec.epochs is not None and spec.epochs > 1:
            report["run_steps"], report["run_epochs"] = epoch_steps(spec, epochs=spec.epochs), spec.epochs
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        _print_table(report)
    return 1 if args.strict and report["rejected"] else 0


def _add_task_rejections(report: dict[str, Any], spec: Any, limit: int | None) -> None:
    """Count the task's rejections into the report's (per source and total), with their samples."""
    from feedline._tools.task_scan import task_rejections

    for entry, found in zip(report["sources"], task_rejections(spec, limit=limit), strict=True):
        entry["examples"] = found["examples"]
        for reason, n in found["rejected"].items():
            entry["rejected"][reason] = entry["rejected"].get(reason, 0) + n
            report["rejected"][reason] = report["rejected"].get(reason, 0) + n
        entry["rejected_samples"] += found["rejected_samples"]
        report["rejected_samples"] += found["rejected_samples"]
    report["examples"] = sum(e["examples"] for e in report["sources"])


def _print_table(report: dict[str, Any]) -> None:
    has_tokens = "tokens" in report
    head = f"{'source':40} {'format':8} {'files':>6} {'records':>10} {'MB':>9}" + (f" {'tokens':>12}" if has_tokens else "") + "  rejected"
    print(head)
    for s in report["sources"] + [{"name": "total", "format": "", "files": sum(x["files"] for x in report["sources"]), **report}]:
        rej = ", ".join(f"{k}={v}" for k, v in s["rejected"].items()) or "-"
        name = s["name"] if len(s["name"]) <= 40 else "..." + s["name"][-37:]
        row = f"{name:40} {s['format']:8} {s['files']:>6} {s['records']:>10} {s['bytes'] / 1e6:>9.2f}"
        print(row + (f" {s['tokens']:>12}" if has_tokens else "") + f"  {rej}")
    for sample in report["rejected_samples"][:10]:
        print(f"  rejected: {sample}")
    if "steps" in report:
        print(f"global steps: {report['steps']} per epoch"
              + (f", {report['run_steps']} in all {report['run_epochs']} epochs" if "run_steps" in report else ""))
    print(f"scanned in {report['seconds']:.2f}s")
