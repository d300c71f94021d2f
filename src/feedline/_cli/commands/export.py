"""``feedline export``: run a spec offline and write its examples (or batches) as shards with a manifest."""

from __future__ import annotations

import argparse
import json

from feedline._cli._common import add_progress_argument, add_spec_argument, counted, load_spec, setup_progress

NAME = "export"
HELP = "run a spec and write its examples (or global batches) to arrow/parquet/jsonl/msgpack shards with a manifest"
EXAMPLE = "feedline export spec.yaml -o out/ -f parquet --what batches --shard-rows 50000"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_progress_argument(p)
    add_spec_argument(p)
    p.add_argument("-o", "--output", required=True, help="output directory (created if needed; must be empty unless --overwrite)")
    p.add_argument("-f", "--format", choices=["arrow", "parquet", "jsonl", "msgpack"], default="arrow",
                   help="output format (default: arrow, readable with datasets.Dataset.from_file)")
    p.add_argument("--what", choices=["examples", "batches"], default="examples",
                   help="write task examples (default) or the rows of each global batch")
    p.add_argument("--shard-rows", type=int, default=100_000, help="rows per shard (default: 100000)")
    p.add_argument("--limit", type=int, default=None, help="stop after this many examples (or steps)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a previous output in a non-empty directory (its stale shards are removed)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")


def run(args: argparse.Namespace) -> int:
    setup_progress(args)
    from feedline._tools.export import export

    manifest = export(load_spec(args.spec), args.output, args.format, what=args.what, shard_rows=args.shard_rows,
                      limit=args.limit, overwrite=args.overwrite)
    if args.json:
        print(json.dumps({k: v for k, v in manifest.items() if k != "spec"}, default=str))
    else:
        rej = ", ".join(f"{k}={v}" for k, v in (manifest.get("rejected") or {}).items()) or "none"
        what = "example" if args.what == "examples" else "batch row"
        print(f"wrote {counted(manifest['rows'], what)} ({manifest['tokens']} real tokens) into "
              f"{counted(len(manifest['shards']), args.format + ' shard')} in {args.output} (rejected: {rej})")
    return 0

