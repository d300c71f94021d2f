"""Cost of sentence segmentation for the ``sop`` task, against tokenizing the same text.

    python bench/bench_segment.py [--mb 0.3]

Prints MB/s for blingfire and pysbd (per paragraph, as the task does), the ``lines`` splitter and the BERT
tokenizer's batch encoding on the same Wikipedia text, and the ratio segmentation/tokenization.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from feedline._tasks.segment import split_sentences
from feedline._tokenize.load import load_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=0.3, help="megabytes of text to segment")
    args = ap.parse_args()
    text = (DATA / "prose" / "wiki_demo.txt").read_text(encoding="utf-8")
    docs, size = [], 0
    for line in text.splitlines():
        if line.strip():
            docs.append(line)
            size += len(line.encode())
            if size >= args.mb * 1e6:
                break
    tok = load_tokenizer(str(DATA / "tokenizers" / "bert-base-uncased"))
    rows = []
    for name, fn in (("blingfire", lambda: [split_sentences(d, "blingfire") for d in docs]),
                     ("pysbd (per paragraph)", lambda: [split_sentences(d, "pysbd") for d in docs]),
                     ("lines", lambda: [split_sentences(d, "lines") for d in docs]),
                     ("bert encode_batch", lambda: tok.encode_batch(docs))):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        rows.append((name, size / dt / 1e6))
    print(f"{'stage':24} {'MB/s':>10}   ({size / 1e6:.2f} MB of Wikipedia text, {len(docs)} documents)")
    for name, mbs in rows:
        print(f"{name:24} {mbs:10.3f}")
    tok_mbs = rows[-1][1]
    for name, mbs in rows[:2]:
        print(f"{name} / tokenizer throughput ratio: {mbs / tok_mbs:.4f}")


if __name__ == "__main__":
    main()
