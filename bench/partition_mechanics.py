"""One partition worker's mechanics, for ``bench/partitions.py --breakdown`` and ``--transport``.

``--breakdown``: a worker's start, phase by phase, with ``spawn`` and with ``forkserver`` (the
factory's module preloaded), each in a fresh process: ``start()`` returning in the parent, the
child's entry (interpreter, main module, arguments), importing the pipeline, loading the tokenizer,
listing and dealing its partitions' splits, and the first batch of each of its partitions.

``--transport``: a real batch (pack 1024 x 16 rows, mlm 128 x 128 rows) with its state, sent 400
times over a duplex ``multiprocessing`` pipe from another process, pickled through the
``Connection`` and as the workers send it (``_partitions/frames.py``: the arrays out of band),
alternating over 3 rounds; per batch (medians): the wall time, the receiver's and the sender's CPU.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import statistics
import time
from typing import Any

from partitions import base_spec, in_fresh_process


# ------------------------------------------------------------------------------- --breakdown
def _probe(conn: Any, spec: dict[str, Any], owned: list[int], t_start: float) -> None:
    """A worker's start, timed (monotonic clock, shared with the parent): runs in the child."""
    marks = {"entered": time.monotonic() - t_start}
    from feedline._pipeline import PartitionStreams, Pipeline
    from feedline._spec import Spec

    marks["imported"] = time.monotonic() - t_start
    s = Spec.load(spec)
    PartitionStreams(s).warm()
    marks["tokenizer"] = time.monotonic() - t_start
    pipes = [Pipeline(s, partition=p) for p in owned]
    for pl in pipes:
        for src in pl.sources:
            _ = src.splits
    marks["listed"] = time.monotonic() - t_start
    for pl in pipes:
        it = iter(pl.batches())
        next(it)
        it.close()
    marks["first batches"] = time.monotonic() - t_start
    conn.send(marks)


def breakdown_child(name: str, k: int, method: str) -> dict[str, Any]:
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["feedline._partitions.worker", "feedline._pipeline"])
    spec = {**base_spec(name), "partitions": k}
    workers = min(k, len(os.sched_getaffinity(0)))
    t0 = time.monotonic()
    conns, procs, started = [], [], []
    for w in range(workers):
        a, b = ctx.Pipe()
        pr = ctx.Process(target=_probe, args=(b, spec, list(range(w, k, workers)), t0), daemon=True)
        pr.start()
        started.append(time.monotonic() - t0)
        b.close()
        conns.append(a)
        procs.append(pr)
    marks = [c.recv() for c in conns]
    for pr in procs:
        pr.join()
    out: dict[str, Any] = {"start() returned": max(started)}
    for key in marks[0]:
        out[key] = max(m[key] for m in marks)
    return out


def breakdowns(args: argparse.Namespace, ks: list[int]) -> None:
    for name in args.workloads.split(","):
        base_spec(name)
        for k in ks:
            for method in ("spawn", "forkserver"):
                rs = [r for r in (in_fresh_process("breakdown", name, str(k), method) for _ in range(args.rounds)) if r]
                if not rs:
                    continue
                med = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
                print(f"{name} K={k} {method:10s} " + ", ".join(f"{key} {v:.2f}" for key, v in med.items()) +
                      f"  (seconds since the first start(), the slowest worker, medians of {len(rs)})", flush=True)


# ------------------------------------------------------------------------------- --transport
def _sender(conn: Any, msg: Any, n: int, framed: bool) -> None:
    from feedline._partitions.frames import FrameWriter

    out = FrameWriter(conn) if framed else conn
    cpu = time.process_time()
    for _ in range(n):
        out.send(msg)
    out.send(("cpu", time.process_time() - cpu))


def _pipe_cost(msg: Any, n: int, framed: bool) -> tuple[float, float, float]:
    """Wall time per batch, the receiver's and the sender's CPU per batch, for ``n`` batches from another process."""
    from feedline._partitions.frames import FrameReader

    ctx = multiprocessing.get_context("spawn")
    a, b = ctx.Pipe(duplex=True)
    pr = ctx.Process(target=_sender, args=(b, msg, n, framed))
    pr.start()
    b.close()
    inbox = FrameReader(a) if framed else a
    inbox.recv()
    t, cpu, got = time.perf_counter(), time.process_time(), 1
    while (m := inbox.recv())[0] != "cpu":
        got += 1
    wall, recv = (time.perf_counter() - t) / (got - 1), (time.process_time() - cpu) / (got - 1)
    pr.join()
    a.close()
    return wall, recv, m[1] / n


def transport(args: argparse.Namespace) -> None:
    from feedline._pipeline import Pipeline

    for name, rows in (("clm-1024-short", 16), ("mlm-128", 128)):
        spec = base_spec(name)
        spec["batching"] = {**spec["batching"], "batch_size": rows}
        it = iter(Pipeline(spec).batches())
        for _ in range(3):
            batch = next(it)
        state = it.get_state()
        t, produced = time.perf_counter(), 0
        while time.perf_counter() - t < 3:
            next(it)
            produced += 1
        per_batch = (time.perf_counter() - t) / produced
        it.close()
        msg = ("batch", 0, 3, batch, state)
        nbytes = sum(v.nbytes for v in batch.values())
        print(f"{name} {rows} rows: {nbytes / 1e3:.0f} KB of arrays (state {len(pickle.dumps(state)) / 1e3:.1f} KB); "
              f"making the batch in one process (K = 1) {per_batch * 1e3:.1f} ms", flush=True)
        costs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        for r in range(3):   # the two transports alternate
            for framed in ((False, True) if r % 2 == 0 else (True, False)):
                costs[framed].append(_pipe_cost(msg, 400, framed))
        for framed, runs in costs.items():
            wall, recv, send = (statistics.median(x[i] for x in runs) for i in range(3))
            print(f"  {'frames (arrays out of band)' if framed else 'pickled (Connection)':28s} pipe {wall * 1e3:.3f} ms/batch "
                  f"wall, receiver CPU {recv * 1e3:.3f}, sender CPU {send * 1e3:.3f} ms/batch "
                  f"({(recv + send) / per_batch:.1%} of making it)", flush=True)
