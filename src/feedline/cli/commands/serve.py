"""``feedline serve SPEC``: run the loader service (see docs/service.md)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from feedline.cli._common import add_spec_argument
from feedline.cli.options import add_option_arguments, options_from_args
from feedline.service.auth import ServerKeys
from feedline.service.launch import READY_PREFIX
from feedline.service.server import Server, ServerOptions
from feedline.service.streams import load_streams, parse_stream_option
from feedline.spec import Spec, read_spec_file

NAME = "serve"
HELP = "serve a spec's batches to trainers over ZeroMQ (loopback unless keys or --insecure)"
EXAMPLE = "feedline serve train.yaml --bind tcp://127.0.0.1:5555 --stream validation=val.yaml --metrics-port 9100"


# Every simple ServerOptions field is a flag (--bind, --window, --timeout, ...), generated with its
# default and help from the dataclass; these are the ones the command sets itself.
_OWN = frozenset({"keys", "progress"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_argument(parser)
    parser.add_argument("--stream", action="append", default=[], metavar="NAME=SPEC",
                        help="serve another named stream from a spec file (repeatable), e.g. validation=val.yaml")
    parser.add_argument("--keys", metavar="DIR", help="CurveZMQ keys from 'feedline keys generate DIR'")
    add_option_arguments(parser, ServerOptions, skip=_OWN)


def run(args: argparse.Namespace) -> int:
    extra = dict(parse_stream_option(s) for s in args.stream)
    extra = {name: os.path.abspath(path) for name, path in extra.items()}
    spec: object = args.spec
    if args.spec == "-":
        spec = Spec.from_mapping(read_spec_file("-"))
    streams = load_streams(spec, extra)  # type: ignore[arg-type]
    options = options_from_args(ServerOptions, args, skip=_OWN, keys=ServerKeys.load(args.keys) if args.keys else None,
                                progress=True)
    server = Server(streams, options)
    logging.getLogger("feedline").setLevel(min(logging.getLogger().level, logging.INFO))
    address = server.bind()
    interrupts = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupts
        interrupts += 1
        if signum == signal.SIGINT and interrupts > 1:
            sys.stderr.write("\nfeedline serve: interrupted twice, exiting now\n")
            os._exit(130)
        server.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(READY_PREFIX + address, flush=True)
    if server.metrics_port is not None:
        print(f"feedline serve: metrics on http://{args.metrics_host}:{server.metrics_port}/metrics", flush=True)
    print(f"feedline serve: streams {', '.join(f'{n} ({h})' for n, h in server.hashes.items())}", flush=True)
    server.serve()
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print("feedline serve: stopped", flush=True)
    return 0
