"""CPU cost of the loader thread's work on short records, without the prefetch thread.

    .venv/bin/python bench/loader_stages.py read       # reading only: CPU us per record (FileSource.take + state)
    .venv/bin/python bench/loader_stages.py batches    # the whole stream in this thread: CPU s per million tokens

``read`` takes records from the clm-1024-short corpus (24 MB, ~37 GPT-2 tokens a record) in chunks
of 4,096 with the state after each, the way the task map reads them. ``batches`` iterates the
global stream (reading, task map, pack batcher, state per batch) in the main thread, so the main
thread's CPU time is what the loader thread spends (the encoder runs on the task thread); the
first 50 batches are left out. CPU time, not wall time: steadier on a shared machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from contenders import WORKLOADS, feedline_spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["read", "batches"])
    ap.add_argument("--records", type=int, default=100_000, help="records read (read)")
    ap.add_argument("--tokens", type=int, default=8_000_000, help="tokens batched (batches)")
    args = ap.parse_args(argv)

    from feedline._pipeline import GlobalStream, Pipeline

    w = WORKLOADS["clm-1024-short"]
    pipeline = Pipeline(feedline_spec(w.make_corpus(24), w))
    if args.stage == "read":
        it = iter(pipeline.records())
        t, n = time.process_time(), 0
        while n < args.records:
            got = it.take(4096)
            if not got:
                break
            n += len(got)
            it.get_state()
        print(f"read: {(time.process_time() - t) / n * 1e6:.2f} CPU us per record ({n:,} records)")
        return 0
    n, t, tt = 0, 0.0, 0.0
    for i, (_rank, batch, _state) in enumerate(GlobalStream(pipeline)):
        if i == 50:
            t, tt, n = time.process_time(), time.thread_time(), 0
        n += int(batch["attention_mask"].sum())
        if i >= 50 and n > args.tokens:
            break
    print(f"batches: {(time.process_time() - t) / n * 1e6:.3f} CPU s / M tok in the process, "
          f"{(time.thread_time() - tt) / n * 1e6:.3f} in this (the loader's) thread ({n:,} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
