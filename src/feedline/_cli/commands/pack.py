"""``feedline pack``: chat JSONL -> packed files (the ``collate`` tool's interface), one output per input file."""

from __future__ import annotations

import argparse
import json

from feedline._cli._common import add_progress_argument, counted, setup_progress

NAME = "pack"
HELP = ("render chat JSONL with the chat template (loss on assistant tokens only) and pack it into rows of "
        "MAX_LENGTH tokens; one output file per input file, files in parallel, bounded memory")
EXAMPLE = "feedline pack -i chats/ -o packed/ -t ../tokenizers/qwen2.5 -m 4096 -f arrow"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_progress_argument(p)
    p.add_argument("-i", "--input", required=True, help="a .jsonl file, or a folder of them")
    p.add_argument("-o", "--output", required=True,
                   help="output folder (one <name>.<format> per input); for one input, a file name ending in the format")
    p.add_argument("-t", "--tokenizer", required=True, help="tokenizer with a chat template: path or hub name")
    p.add_argument("-m", "--max-length", type=int, required=True, help="tokens per packed row")
    p.add_argument("-f", "--format", choices=["arrow", "parquet", "jsonl", "msgpack"], default="arrow",
                   help="output format (default: arrow, readable with datasets.Dataset.from_file)")
    p.add_argument("-w", "--workers", type=int, default=None, help="processes (default: one per core, at most one per file)")
    p.add_argument("--window", type=int, default=1000, help="conversations sorted and packed together (default: 1000)")
    p.add_argument("--system", default=None, help="system prompt for conversations that have none")
    p.add_argument("--truncation", choices=["turns", "reject", "cut"], default=None,
                   help="conversations longer than MAX_LENGTH: keep whole turns (default), reject, or cut")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing output (an output folder loses its other files of the format); never an input")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    setup_progress(args)
    from feedline._tools.pack import pack

    task = {k: v for k, v in (("system", args.system), ("truncation", args.truncation)) if v is not None}
    report = pack(args.input, args.output, args.tokenizer, args.max_length, args.format, workers=args.workers,
                  window=args.window, task=task, overwrite=args.overwrite)
    if args.json:
        print(json.dumps(report))
    else:
        rej = ", ".join(f"{k}={v}" for k, v in report["rejected"].items()) or "none"
        print(f"packed {report['conversations']} conversations into {report['rows']} rows of {args.max_length} tokens "
              f"({report['efficiency']:.2%} real tokens) in {counted(len(report['files']), args.format + ' file')} "
              f"using {counted(report['processes'], 'process', 'processes')} (rejected: {rej})")
    return 0

