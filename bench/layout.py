"""CPU cost per step of what a service client does with a compact batch: lay it out, and check it.

    .venv/bin/python bench/layout.py                     # clm-docs and clm-short, 200 batches each
    .venv/bin/python bench/layout.py --workloads clm-short --batches 400

Real pack batches (``bench/scaling.py``'s workloads: GPT-2, clm pack 1024 x 16 rows, on C4 and
Wikipedia documents, or on short records) are taken as the service's producer takes them
(``next_compact``) after the first 50. Three measures run on the same batches, interleaved over
``--rounds`` rounds (medians; CPU time of this thread):

  copy     copying the laid-out arrays once (``ndarray.copy`` of each): the floor of any layout
  layout   :meth:`CompactBatch.expand`: what the ``pack`` batcher does in-process and a client
           does on its connection thread
  client   the whole of a client's work on a batch once the bytes are in: the ``batches`` message
           (4 steps) unpacked and split, each step's arrays checked (``CompactBatch.from_wire``),
           laid out and held to the stream's limits (``BatchGuard.decode``)

``layout / copy`` is the price of the layout against moving its bytes once; ``client - layout``
is what the wire checks and decoding cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, save_json, table
from scaling import spec_for


def batches(workload: str, n: int) -> list[Any]:
    from feedline._pipeline import GlobalStream, Pipeline

    it = iter(GlobalStream(Pipeline(spec_for(workload, 48, 0))))
    out = []
    for i in range(n + 50):
        _step, batch, _state = it.next_compact()
        if i >= 50:
            out.append(batch)
    it.close()
    return out


def measures(compact: list[Any]) -> dict[str, Callable[[], None]]:
    from feedline._batching.compact import BatchLimits
    from feedline._service.protocol import encode_batches, split_batches, unpack_header
    from feedline._service.trust import BatchGuard

    laid = [b.expand() for b in compact]
    state = b"\x81\xa4step\x01" * 400   # ~3.6 KB of state bytes, a pack stream's size (a client keeps them undecoded)
    messages = [encode_batches([(b, i + j, state) for j, b in enumerate(compact[i:i + 4])])
                for i in range(0, len(compact), 4)]
    guard = BatchGuard(None, 1 << 30)
    first = compact[0]
    guard.welcome(BatchLimits(rows=len(first), max_length=first.max_length, max_docs=first.max_docs))

    def copy() -> None:
        for batch in laid:
            for a in batch.values():
                a.copy()

    def layout() -> None:
        for b in compact:
            b.expand()

    def client() -> None:
        for header, payload in messages:
            for item, buf in split_batches(unpack_header(header), payload):
                guard.decode(item, [buf])

    return {"copy": copy, "layout": layout, "client": client}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="clm-docs,clm-short")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    rows = []
    for workload in args.workloads.split(","):
        compact = batches(workload, args.batches)
        fns = measures(compact)
        times: dict[str, list[float]] = {name: [] for name in fns}
        for r in range(args.rounds):
            for name, fn in (fns.items() if r % 2 == 0 else reversed(fns.items())):
                t = time.thread_time()
                fn()
                times[name].append((time.thread_time() - t) / len(compact) * 1e6)
        us = {name: statistics.median(v) for name, v in times.items()}
        pieces = statistics.mean(len(b.lengths) for b in compact)
        rows.append({"workload": workload, "pieces": pieces, **{f"{k}_us": v for k, v in us.items()},
                     "layout_per_copy": us["layout"] / us["copy"], "checks_us": us["client"] - us["layout"]})
        print(f"{workload}: {pieces:.0f} pieces a batch; copy {us['copy']:.1f}, layout {us['layout']:.1f}, "
              f"client {us['client']:.1f} CPU us per batch", flush=True)
    print(table(rows, [("workload", "workload", ""), ("pieces", "pieces/batch", ".0f"), ("copy_us", "copy us", ".1f"),
                       ("layout_us", "layout us", ".1f"), ("layout_per_copy", "layout / copy", ".2f"),
                       ("client_us", "client us", ".1f"), ("checks_us", "client - layout us", ".1f")]))
    print(f"saved {save_json('layout', {'machine': machine(), 'args': vars(args), 'rows': rows})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
