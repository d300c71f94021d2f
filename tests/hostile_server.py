"""A fake loader server that speaks the protocol and lies: crafted welcomes, frames and floods.

A real ZeroMQ ROUTER socket (CurveZMQ when given keys) in a thread. It answers a hello with a
welcome (the defaults below, overridden per test), pongs pings, and sends what the test scripts:

    with HostileServer(welcome={"heartbeat": -1}) as srv:
        loader = feedline.Loader(srv.address, timeout=3)

    with HostileServer(batches=lambda: [compact_frames(max_length=1 << 26)]) as srv: ...

``batches`` gives the messages (``[header, payload]``, or several steps in one: ``joined``) sent
right after the welcome, credit or not. Run as a script, it floods every client with ``--batches`` batches of ``--mb`` megabytes
(ignoring credit) and prints ``ADDRESS <address>``, for measuring a client's memory in another
process: ``python tests/hostile_server.py --batches 60 --mb 40``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import numpy as np
import zmq

from feedline._batching.compact import CompactBatch
from feedline._service.protocol import PROTOCOL_VERSION, encode_batch, pack, unpack_header

DROP = object()   # a welcome override that removes the field
STATE = {"format": 1, "spec_hash": "hostile", "world_size": 1, "step": 0, "stream": {}}
LIMITS = {"rows": 4, "max_length": 16, "max_docs": 4}   # the batch shape hostile welcomes announce


def welcome_fields(hello: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A well-formed welcome for ``hello`` with ``overrides`` applied (``DROP`` removes a field)."""
    fields: dict[str, Any] = {"v": PROTOCOL_VERSION, "stream": hello.get("stream"),
                              "spec_hash": hello.get("spec_hash") or "hostile", "state": json.dumps(STATE),
                              "heartbeat": 1.0, "timeout": 10.0, "prefetch": hello.get("prefetch", 2),
                              "batch": dict(LIMITS)}
    for key, value in overrides.items():
        if value is DROP:
            fields.pop(key, None)
        else:
            fields[key] = value
    return fields


def compact_frames(step: int = 1, *, docs: Any = (2, 1), lengths: Any = (3, 2, 4), values: Any = None,
                   layout: dict[str, Any] | None = None) -> list[bytes]:
    """A compact pack batch (valid by default: 2 rows of 16 tokens), with parts replaced."""
    docs_a = np.asarray(docs, dtype=np.int64) if not isinstance(docs, np.ndarray) else docs
    lengths_a = np.asarray(lengths, dtype=np.int64) if not isinstance(lengths, np.ndarray) else lengths
    ids = values if values is not None else np.arange(9, dtype=np.int32)
    b = CompactBatch(docs_a, lengths_a, {"input_ids": ids, "labels": ids}, max_length=16, max_docs=4,
                     pad_values={"input_ids": 0, "labels": -100})
    header, payload = encode_batch(b, step=step, state=msgpack.packb({**STATE, "step": step}))
    if layout:
        h = unpack_header(header)
        h["layout"].update(layout)
        header = msgpack.packb(h, use_bin_type=True)
    return [header, payload]


def plain_frames(step: int = 1, **arrays: np.ndarray) -> list[bytes]:
    """A laid-out batch of ``arrays``."""
    header, payload = encode_batch(arrays, step=step, state=msgpack.packb({**STATE, "step": step}))
    return [header, payload]


def joined(*messages: list[bytes]) -> list[bytes]:
    """Single-batch messages (``compact_frames``, ``plain_frames``: broken or not) as one ``batches`` message."""
    items, parts, offset = [], [], 0
    for header, payload in messages:
        pad = -offset % 8
        parts.append(bytes(pad))
        offset += pad
        item = unpack_header(header)
        del item["op"]
        item["at"] = [offset, len(payload)]
        items.append(item)
        parts.append(payload)
        offset += len(payload)
    return [pack("batches", items=items), b"".join(parts)]


class HostileServer:
    """See the module docstring.

    Args:
        welcome: overrides of the welcome's fields.
        batches: the messages sent right after each welcome (called once per hello).
        keys: ``(public, secret)`` to serve CurveZMQ (every client key accepted: no ZAP handler).
        silent: never answer at all (not even a welcome).
    """

    def __init__(self, *, welcome: dict[str, Any] | None = None,
                 batches: Callable[[], Iterable[list[bytes]]] | None = None,
                 keys: tuple[bytes, bytes] | None = None, silent: bool = False) -> None:
        self.overrides = welcome or {}
        self.batches = batches
        self.silent = silent
        self.hellos = 0
        self.credits = 0
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)   # queue whatever it sends: credit is the client's to enforce
        if keys is not None:
            self._sock.curve_publickey, self._sock.curve_secretkey = keys
            self._sock.curve_server = True
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-server", daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sock.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(50):
                continue
            ident, frame, *_ = self._sock.recv_multipart()
            h = unpack_header(frame)
            if self.silent:
                continue
            if h["op"] == "hello":
                self.hellos += 1
                self._sock.send_multipart([ident, pack("welcome", **welcome_fields(h, self.overrides))])
                for message in (self.batches() if self.batches else ()):
                    self._sock.send_multipart([ident, *message], copy=False)
            elif h["op"] == "credit":
                self.credits += int(h.get("n", 0))
            elif h["op"] == "ping":
                self._sock.send_multipart([ident, pack("pong")])


def main(argv: list[str]) -> None:
    """Flood every client (see the module docstring) until killed."""
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--mb", type=float, default=40)
    args = p.parse_args(argv)
    ids = np.ones((4, int(args.mb * (1 << 20)) // 16), dtype=np.int32)   # 4 rows: args.mb megabytes
    message = plain_frames(1, input_ids=ids)
    frames = [[plain_frames(step, input_ids=ids[:, :1])[0], message[1]] for step in range(1, args.batches + 1)]
    for f in frames:   # every batch is the same big payload; each header says its step and real shape
        h = unpack_header(f[0])
        h["fields"][0][2] = list(ids.shape)
        f[0] = msgpack.packb(h, use_bin_type=True)
    srv = HostileServer(welcome={"batch": {"rows": 4, "max_length": None, "max_docs": None}},
                        batches=lambda: frames)
    with srv:
        print(f"ADDRESS {srv.address}", flush=True)
        sys.stdin.read()   # until the parent closes our stdin (or kills us)


if __name__ == "__main__":
    main(sys.argv[1:])
