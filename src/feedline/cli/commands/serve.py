"""``feedline serve SPEC``: run the loader service (see docs/service.md)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from feedline.cli._common import add_spec_argument
from feedline.service.auth import ServerKeys
from feedline.service.launch import READY_PREFIX
from feedline.service.server import Server, ServerOptions
from feedline.service.streams import load_streams, parse_stream_option
from feedline.spec import Spec, read_spec_file

NAME = "serve"
HELP = "serve a spec's batches to trainers over ZeroMQ (loopback unless keys or --insecure)"
EXAMPLE = "feedline serve train.yaml --bind tcp://127.0.0.1:5555 --stream validation=val.yaml --metrics-port 9100"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_argument(parser)
    parser.add_argument("--bind", default="tcp://127.0.0.1:5555",
                        help="address to bind: tcp://HOST:PORT (port 0: any free port) or ipc://PATH")
    parser.add_argument("--stream", action="append", default=[], metavar="NAME=SPEC",
                        help="serve another named stream from a spec file (repeatable), e.g. validation=val.yaml")
    parser.add_argument("--keys", metavar="DIR", help="CurveZMQ keys from 'feedline keys generate DIR'")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a plaintext bind outside loopback (trusted networks only)")
    parser.add_argument("--window", type=int, default=8, help="global steps buffered ahead of the slowest rank")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="seconds between client heartbeats")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds of client silence before it is dropped (shared mode: re-delivered)")
    parser.add_argument("--max-message", type=int, default=16 << 20, help="largest inbound message, bytes")
    parser.add_argument("--drain-timeout", type=float, default=10.0,
                        help="on SIGTERM, seconds to wait for shared-mode acks")
    parser.add_argument("--max-prefetch", type=int, default=16,
                        help="the most batches one client may have in flight (caps its declared prefetch)")
    parser.add_argument("--lease", type=float, default=60.0,
                        help="shared mode: seconds a client may hold a batch unacked before it goes to another client")
    parser.add_argument("--max-cursors", type=int, default=8,
                        help="ranked cursors (pipeline + producer thread) per stream; the longest-idle one is closed "
                             "to make room, and with none idle a new job is refused")
    parser.add_argument("--idle-close", type=float, default=60.0,
                        help="seconds a cursor without clients is kept for reconnects before it is closed")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="address of the metrics endpoint (off loopback with --keys: needs --metrics-insecure)")
    parser.add_argument("--metrics-insecure", action="store_true",
                        help="allow the unauthenticated metrics endpoint off loopback although the service uses keys")


def run(args: argparse.Namespace) -> int:
    extra = dict(parse_stream_option(s) for s in args.stream)
    extra = {name: os.path.abspath(path) for name, path in extra.items()}
    spec: object = args.spec
    if args.spec == "-":
        spec = Spec.from_mapping(read_spec_file("-"))
    streams = load_streams(spec, extra)  # type: ignore[arg-type]
    options = ServerOptions(
        bind=args.bind, window=args.window, heartbeat=args.heartbeat, timeout=args.timeout,
        max_message=args.max_message, keys=ServerKeys.load(args.keys) if args.keys else None,
        insecure=args.insecure, drain_timeout=args.drain_timeout, max_cursors=args.max_cursors,
        max_prefetch=args.max_prefetch, lease=args.lease,
        idle_close=args.idle_close, metrics_port=args.metrics_port,
        metrics_host=args.metrics_host, metrics_insecure=args.metrics_insecure, progress=True,
    )
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
