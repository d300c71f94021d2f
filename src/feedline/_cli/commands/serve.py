"""``feedline serve SPEC``: run the loader service (see docs/service.md)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from feedline._cli._common import add_spec_argument
from feedline._cli.options import add_option_arguments, options_from_args
from feedline._pipeline import Pipeline
from feedline._service.auth import ClientKeys, ServerKeys
from feedline._service.http import HttpGateway
from feedline._service.http_options import HttpOptions, parse_http_bind, read_token
from feedline._service.launch import READY_PREFIX
from feedline._service.lograte import limit_log_rate
from feedline._service.server import Server, ServerOptions
from feedline._service.streams import DEFAULT_STREAM, load_streams, parse_stream_option
from feedline._spec import Spec, read_spec_file
from feedline.errors import SpecError, StateError

NAME = "serve"
DEFAULT_BIND = "tcp://127.0.0.1:5555"
HELP = "serve a spec's batches to trainers over ZeroMQ and/or HTTP (loopback unless keys/token or --insecure)"
EXAMPLE = ("feedline serve train.yaml --bind tcp://127.0.0.1:5555 --stream validation=val.yaml --metrics-port 9100\n"
           "  feedline serve infer.yaml --http 127.0.0.1:8080   # then: curl -H 'Accept: application/json' "
           "'http://127.0.0.1:8080/?stream=train'")


# Every simple ServerOptions field is a flag (--bind, --window, --timeout, ...), generated with its
# default and help from the dataclass; these are the ones the command sets itself.
# where a flood of connections or messages could log without bound (each record is created there)
_FLOODABLE = ("asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal", "feedline",
              "feedline.service", "feedline.service.http", "feedline.service.auth", "zmq.auth")
_HTTP_DEFAULTS = {f.name: f.default for f in dataclasses.fields(HttpOptions)}
_OWN = frozenset({"bind", "keys", "progress"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_argument(parser)
    parser.add_argument("--bind", default=None,
                        help="address to bind: tcp://HOST:PORT (port 0: any free port) or ipc://PATH "
                             f"(default: {DEFAULT_BIND}, or a free loopback port when only --http is given)")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="also answer GET / with the next batch over HTTP (shared mode; see docs/service.md)")
    parser.add_argument("--http-token-file", metavar="FILE",
                        help="bearer token clients must send (required for --http outside loopback)")
    parser.add_argument("--http-max-connections", type=int, default=_HTTP_DEFAULTS['max_connections'], metavar="N",
                        help="open HTTP connections at most (default: %(default)s, or a quarter of the "
                             "file-descriptor limit when smaller); a new one evicts the oldest pending one")
    parser.add_argument("--http-max-pending", type=int, default=_HTTP_DEFAULTS['max_pending'], metavar="N",
                        help="HTTP connections at most that have not sent complete, authorized headers yet "
                             "(default: %(default)s); a new one evicts the oldest")
    parser.add_argument("--http-header-timeout", type=float, default=_HTTP_DEFAULTS['header_timeout'], metavar="S",
                        help="seconds an HTTP connection has to send its headers, and may stay idle between "
                             "requests (default: %(default)s)")
    parser.add_argument("--stream", action="append", default=[], metavar="NAME=SPEC",
                        help="serve another named stream from a spec file (repeatable), e.g. validation=val.yaml")
    parser.add_argument("--keys", metavar="DIR", help="CurveZMQ keys from 'feedline keys generate DIR'")
    parser.add_argument("--no-data-check", action="store_true",
                        help="skip the preflight's look at the data (paths, first records, a small corpus's first batch; "
                             "see feedline spec --check); the spec and tokenizer are still checked before listening")
    parser.add_argument("--stop-with-stdin", action="store_true",
                        help="stop (draining, as on SIGTERM) when standard input ends: a parent holding the pipe "
                             "takes the server with it however it exits (feedline.service.serve_process uses this)")
    add_option_arguments(parser, ServerOptions, skip=_OWN)


def run(args: argparse.Namespace) -> int:
    extra = dict(parse_stream_option(s) for s in args.stream)
    extra = {name: os.path.abspath(path) for name, path in extra.items()}
    spec: object = args.spec
    if args.spec == "-":
        if args.stop_with_stdin:
            raise SpecError("--stop-with-stdin needs standard input for itself; give the spec as a file, not '-'")
        spec = Spec.from_mapping(read_spec_file("-"))
    http = None
    if args.http:
        host, port = parse_http_bind(args.http)
        token = read_token(args.http_token_file) if args.http_token_file else None
        http = HttpOptions(host=host, port=port, token=token, max_connections=args.http_max_connections,
                           max_pending=args.http_max_pending, header_timeout=args.http_header_timeout)
    elif args.http_token_file:
        raise SpecError("--http-token-file is only used with --http HOST:PORT")
    bind = args.bind or ("tcp://127.0.0.1:0" if http is not None else DEFAULT_BIND)
    streams = load_streams(spec, extra)  # type: ignore[arg-type]
    if not _preflight(streams, data=not args.no_data_check):
        return 1
    options = options_from_args(ServerOptions, args, skip=_OWN, bind=bind,
                                keys=ServerKeys.load(args.keys) if args.keys else None, progress=True)
    server = Server(streams, options)
    logging.getLogger("feedline").setLevel(min(logging.getLogger().level, logging.INFO))
    limit_log_rate(_FLOODABLE)
    raise_fd_limit()
    try:
        address = server.bind()
    except StateError as e:   # a --state file this server cannot resume from: a usage error (exit 2)
        server.close()
        raise SpecError(str(e)) from None
    gateway = None
    if http is not None:
        keys = ClientKeys.load(args.keys) if args.keys else None
        gateway = HttpGateway(address, streams, http, keys=keys, stats=lambda: server.snapshot, lease=options.lease)
        try:
            url = gateway.start()
        except BaseException:
            server.close()
            raise
    interrupts = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupts
        interrupts += 1
        if signum == signal.SIGINT and interrupts > 1:
            sys.stderr.write("\nfeedline serve: interrupted twice, exiting now\n")
            os._exit(130)
        server.stop()
        if gateway is not None:  # release the gateway's held batches so the drain need not wait for them
            threading.Thread(target=gateway.close, name="feedline-http-close", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.stop_with_stdin:
        threading.Thread(target=_stop_at_end_of_stdin, args=(lambda: on_signal(signal.SIGTERM, None),),
                         name="feedline-stdin-watch", daemon=True).start()
    print(READY_PREFIX + address, flush=True)
    if server.metrics_port is not None:
        print(f"feedline serve: metrics on http://{args.metrics_host}:{server.metrics_port}/metrics", flush=True)
    if gateway is not None:
        print(f"feedline serve: HTTP on {url}/ (GET /?stream=NAME, /state, /stats, /healthz)", flush=True)
    print(f"feedline serve: streams {', '.join(f'{n} ({h})' for n, h in server.hashes.items())}", flush=True)
    try:
        server.serve()
    finally:
        if gateway is not None:
            gateway.close()
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print("feedline serve: stopped", flush=True)
    return 0


def _preflight(streams: dict[str, Pipeline], *, data: bool) -> bool:
    """Check every stream's spec against its data before listening; print each problem on one line."""
    from feedline._tools.preflight import preflight

    problems = [(f"stream {name}: " if name != DEFAULT_STREAM else "") + line
                for name, pipeline in streams.items() for line in preflight(pipeline.spec, data=data)]
    for line in problems:
        print(f"feedline serve: error: {line}", file=sys.stderr, flush=True)
    if all(_encodes_elsewhere(p) for p in streams.values()):
        from feedline._tokenize.load import load_tokenizer

        load_tokenizer.cache_clear()   # the check's tokenizer: this process never encodes (pad values load their own)
    return not problems


def _encodes_elsewhere(pipeline: Pipeline) -> bool:
    """Whether a stream's partitions encode in worker processes or Ray actors, never in this process."""
    spec = pipeline.spec
    return pipeline.composed and spec.parallel.resolve(spec.partitions) != "threads"


def raise_fd_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit (clients each hold one)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, OSError, ValueError) as e:   # not on this platform, or not allowed: keep the limit
        logging.getLogger("feedline.service").info("could not raise the open-file limit: %s", e)


def _stop_at_end_of_stdin(stop: Callable[[], None]) -> None:
    """Read standard input to its end (the parent closed the pipe or exited), then ``stop``.

    It reads the descriptor, not ``sys.stdin``: a thread blocked inside the buffered reader holds its
    lock, and the interpreter's exit then waits a second for that lock (and reports a fatal error)."""
    try:
        fd = sys.stdin.fileno()
        while os.read(fd, 1 << 16):
            pass
    except (OSError, ValueError):  # closed or not readable: the parent is gone as far as we can tell
        pass
    try:   # said, so a server given an input already at its end (</dev/null, a detached job) does not stop unexplained
        print("feedline serve: standard input ended (--stop-with-stdin): stopping", file=sys.stderr, flush=True)
    except (OSError, ValueError):   # its error output went with the parent (a broken pipe): stop all the same
        pass
    stop()
