"""``feedline count-tokens``: whitespace word counts of any inputs to ``word<TAB>count`` TSV."""

from __future__ import annotations

import argparse
import sys

from feedline._cli._common import add_progress_argument, setup_progress

NAME = "count-tokens"
HELP = "count whitespace-separated words of any inputs into word<TAB>count TSV; count TSV inputs are merged"
EXAMPLE = "feedline count-tokens shards/shard-0000*.jsonl.zst -o counts.tsv   (then: feedline count-tokens c1.tsv c2.tsv -o all.tsv)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_progress_argument(p)
    p.add_argument("inputs", nargs="+", help="input paths, globs, directories, or word<TAB>count TSV files to merge")
    p.add_argument("-o", "--output", default="-", help="output TSV (default: standard output)")
    p.add_argument("--lower", action="store_true", help="lower-case words before counting")
    p.add_argument("--min-count", type=int, default=1, help="drop words seen fewer times (default: 1)")
    p.add_argument("--format", default="auto", help="input format (default: detected from names)")
    p.add_argument("--text", default="text", help="field holding the text (default: text)")


def run(args: argparse.Namespace) -> int:
    setup_progress(args)
    from feedline._core.report import Rejections
    from feedline._tools.count_tokens import count_tokens, write_counts

    rejections = Rejections()
    counts = count_tokens(args.inputs, lowercase=args.lower, format=args.format, text=args.text, rejections=rejections)
    n = write_counts(counts, args.output, min_count=args.min_count)
    if args.output != "-":
        rej = ", ".join(f"{k}={v}" for k, v in sorted(rejections.counts.items())) or "none"
        print(f"wrote {n} words ({sum(counts.values())} occurrences) to {args.output} (rejected: {rej})", file=sys.stderr)
    return 0
