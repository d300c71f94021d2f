"""``feedline shard``: inputs in any format -> N shuffled ``.jsonl.zst`` shards, deterministic by seed."""

from __future__ import annotations

import argparse
import json

from feedline._cli._common import add_progress_argument, setup_progress

NAME = "shard"
HELP = "shuffle inputs (any format, codec, glob or directory) into N .jsonl.zst shards with bounded memory"
EXAMPLE = "feedline shard 'wiki/*.xml.bz2' books/ -o shards/ -n 64 --seed 1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_progress_argument(p)
    p.add_argument("inputs", nargs="+", help="input paths, globs, directories or URLs")
    p.add_argument("-o", "--output", required=True, help="output directory (must be empty unless --overwrite)")
    p.add_argument("-n", "--num-shards", type=int, required=True, help="number of shards to write")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default: 0)")
    p.add_argument("--format", default="auto", help="input format (default: detected from names)")
    p.add_argument("--text", default="text", help="field holding the text (default: text)")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default: shard)")
    p.add_argument("--on-error", choices=["skip", "raise"], default="skip", help="bad records: skip and count, or fail")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a previous output in a non-empty directory (its stale shards are removed)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    setup_progress(args)
    from feedline._tools.shard import shard

    report = shard(args.inputs, args.output, num_shards=args.num_shards, seed=args.seed, format=args.format,
                   text=args.text, prefix=args.prefix, on_error=args.on_error, overwrite=args.overwrite)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        rej = ", ".join(f"{k}={v}" for k, v in report.rejected.items()) or "none"
        print(f"wrote {sum(report.records)} records into {len(report.files)} shards in {args.output} (rejected: {rej})")
    return 0
