"""``feedline spec``: the spec reference (Markdown), its JSON Schema, or a check of a spec file."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

NAME = "spec"
HELP = "print the spec reference (every key, type, default, meaning), its JSON Schema, or check a spec file"
EXAMPLE = "feedline spec --schema > feedline.schema.json      feedline spec --check train.yaml [--no-data]"


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--schema", action="store_true", help="print a JSON Schema (draft 2020-12) for editors")
    what.add_argument("--markdown", action="store_true", help="print docs/spec.md (the default)")
    what.add_argument("--check", metavar="SPEC",
                      help="validate a spec file and check it against its data (paths match files, the first records "
                           "have the text field and suit the task, the tokenizer loads, a small corpus fills a batch, "
                           "unless transforms name modules); print its hash, or one line per problem and exit 1. "
                           "Import paths are checked from the modules' source without running them where Python "
                           "allows it (a note says when one was imported)")
    p.add_argument("--no-data", action="store_true",
                   help="with --check: do not list or read the sources (the spec and its tokenizer only)")


def registries() -> tuple[dict[str, Any], dict[str, Any]]:
    """The built-in task kinds' and batching strategies' options classes."""
    from feedline._batching.registry import STRATEGIES, batcher_options
    from feedline._tasks.registry import TASKS, task_options

    return {k: task_options(k) for k in TASKS}, {k: batcher_options(k) for k in STRATEGIES}


def run(args: argparse.Namespace) -> int:
    from feedline._spec.reference import json_schema, markdown

    if args.check:
        from feedline._cli._common import load_spec
        from feedline._core.static_imports import without_imports
        from feedline._service.streams import DEFAULT_STREAM, load_streams
        from feedline._tools.preflight import preflight

        with without_imports() as notes:   # import paths are checked from the modules' source, not run
            spec = load_spec(args.check)
            streams = load_streams(spec if args.check == "-" else args.check)  # streams: overrides checked too
            # the first batch would run the transforms' modules: --check skips it for a spec naming some
            code = {name: any(isinstance(t.fn, str) for t in p.spec.transforms) for name, p in streams.items()}
            problems = [(f"stream {name}: " if name != DEFAULT_STREAM else "") + line
                        for name, pipeline in streams.items()
                        for line in preflight(pipeline.spec, data=not args.no_data,
                                              **({"small_bytes": -1} if code[name] else {}))]
        if any(code.values()) and not args.no_data:
            notes.append("the spec was not run to its first batch: its transforms name modules, and that runs "
                         "them (load it in Python to try it)")
        for note in dict.fromkeys(notes):
            print(f"note: {note}", file=sys.stderr)
        for line in problems:
            print(f"{args.check}: {line}", file=sys.stderr)
        if problems:
            return 1
        others = sorted(streams)[1:]
        print(f"{args.check}: valid; task {spec.task.kind}, batching {spec.batching.strategy}, hash {spec.hash()}"
              + (f"; streams {', '.join(others)}" if others else ""))
        return 0
    tasks, batchers = registries()
    if args.schema:
        from feedline._sources.reader import FORMATS

        print(json.dumps(json_schema(tasks, batchers, sorted(FORMATS)), indent=1))
    else:
        print(markdown(tasks, batchers), end="")
    return 0
