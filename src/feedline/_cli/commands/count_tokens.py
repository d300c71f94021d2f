"""``feedline count-tokens``: whitespace word (or, with ``--tokenizer``, token) counts of any inputs to TSV."""

from __future__ import annotations

import argparse
import sys

from feedline._cli._common import add_progress_argument, setup_progress

NAME = "count-tokens"
HELP = ("count the whitespace-separated words of any inputs (or, with --tokenizer, that tokenizer's tokens) into "
        "word<TAB>count TSV; count TSV inputs are merged")
EXAMPLE = ("feedline count-tokens shards/shard-0000*.jsonl.zst -o counts.tsv   (then: feedline count-tokens c1.tsv c2.tsv -o all.tsv)\n"
           "  feedline count-tokens corpus.jsonl --tokenizer gpt2/ -o gpt2-tokens.tsv   (tokens as a run reads them)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_progress_argument(p)
    p.add_argument("inputs", nargs="+", help="input paths, globs, directories, or word<TAB>count TSV files to merge")
    p.add_argument("-o", "--output", default="-", help="output TSV (default: standard output)")
    p.add_argument("--lower", action="store_true", help="lower-case words before counting")
    p.add_argument("--min-count", type=int, default=1, help="drop words seen fewer times (default: 1)")
    p.add_argument("--format", default="auto", help="input format (default: detected from names)")
    p.add_argument("--text", default="text", help="field holding the text (default: text)")
    p.add_argument("--tokenizer", help="count this tokenizer's tokens (a path or hub name; no special tokens) instead "
                                       "of whitespace-separated words; the TSV then holds token strings (Ġthe, ##ing)")


def run(args: argparse.Namespace) -> int:
    setup_progress(args)
    from feedline._core.report import Rejections
    from feedline._tools.count_tokens import count_tokens, write_counts

    rejections = Rejections()
    counts = count_tokens(args.inputs, lowercase=args.lower, format=args.format, text=args.text, rejections=rejections,
                          tokenizer=args.tokenizer)
    n = write_counts(counts, args.output, min_count=args.min_count)
    what = f"tokens of {args.tokenizer}" if args.tokenizer else "whitespace-separated words"
    rej = ", ".join(f"{k}={v}" for k, v in sorted(rejections.counts.items())) or "none"
    print(f"counted {what}: {sum(counts.values())} in all, {n} distinct written to "
          f"{'standard output' if args.output == '-' else args.output} (rejected: {rej})", file=sys.stderr)
    return 0
