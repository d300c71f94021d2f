"""``feedline stats ADDRESS``: what a running loader service is doing."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import zmq

from feedline._service.auth import ClientKeys
from feedline._service.protocol import error_from_header, pack, unpack_header
from feedline.errors import TransportTimeout

NAME = "stats"
HELP = "show a loader service's throughput, efficiency, queues and clients"
EXAMPLE = "feedline stats tcp://127.0.0.1:5555 --json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", help="the service address, e.g. tcp://127.0.0.1:5555")
    parser.add_argument("--json", action="store_true", help="print the raw stats as JSON")
    parser.add_argument("--keys", metavar="DIR", default=os.environ.get("FEEDLINE_KEYS"),
                        help="CurveZMQ keys folder (default: $FEEDLINE_KEYS)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")


def fetch_stats(address: str, keys: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """Ask a server for its stats snapshot."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        if keys:
            ClientKeys.load(keys).apply(sock)
        sock.connect(address)
        sock.send(pack("stats"))
        if not sock.poll(int(timeout * 1000)):
            hint = ("is 'feedline serve' running there, with these keys?" if keys else
                    "is 'feedline serve' running there? A server started with --keys answers only clients "
                    "that pass --keys DIR (or set FEEDLINE_KEYS)")
            raise TransportTimeout(f"no answer from {address} within {timeout:.0f}s; {hint}")
        h = unpack_header(sock.recv())
        if h["op"] == "error":
            raise error_from_header(h)
        return dict(h.get("stats") or {})
    finally:
        sock.close()
        ctx.term()


def run(args: argparse.Namespace) -> int:
    stats = fetch_stats(args.address, args.keys, args.timeout)
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    print(f"{stats['address']}  up {stats['uptime_s']}s  clients {stats['clients_connected']}"
          f"  malformed messages {stats['malformed']}{'  DRAINING' if stats['draining'] else ''}")
    for name, st in stats["streams"].items():
        eff = "-" if st["efficiency"] is None else f"{100 * st['efficiency']:.1f}%"
        print(f"stream {name} ({st['spec_hash']}): step {st['steps']}  {st['batches_per_s']} batches/s  "
              f"{st['tokens_per_s']:,.0f} tokens/s  efficiency {eff}  rejected {sum(st['rejected'].values())}"
              + (f"  mixture {st['mixture']}" if st["mixture"] else ""))
        for c in st["cursors"]:
            print(f"  ranked W={c['world_size']}: window {c['low']}..{c['produced']} ({c['depth']} buffered), "
                  f"{c['ranks_connected']} ranks connected" + (f", ended at {c['ended_at']}" if c["ended_at"] else ""))
        if st["shared"]:
            s = st["shared"]
            print(f"  shared: acked through {s['watermark']}, {s['queued']} queued, {s['in_flight']} in flight, "
                  f"{s['redelivered']} re-delivered")
    if stats["clients"]:
        print(f"{'client':10} {'stream':12} {'mode':7} {'rank':>6} {'credit':>6} {'sent':>8} {'lag':>5} {'idle s':>7}")
        for c in stats["clients"]:
            print(f"{c['id']:10} {c['stream']:12} {c['mode']:7} {c['rank']:>3}/{c['world_size']:<2} {c['credit']:>6} "
                  f"{c['sent']:>8} {c['lag']:>5} {c['idle_s']:>7}")
    return 0
