"""Encoder backends: ``tokenizers`` vs fastokens vs ``auto``, alone and inside feedline (CLM pack 1024).

    python bench/backends.py                 # 8 MB of real text, GPT-2, 3 interleaved rounds
    python bench/backends.py --mb 2 --rounds 1 --tokenizer ../shared/data/tokenizers/qwen2.5

Text: the 300 C4 documents and 30 Wikipedia articles of ``../shared/data/prose`` repeated to
``--mb`` (``bench/common.py: prose_corpus``). Every contender runs over all of it, one after the
other within a round, rounds interleaved; the table shows the median of the rounds and each figure
as a ratio to the raw ``tokenizers`` encoder of the same run:

* ``raw tokenizers``: ``encode_batch_fast`` on 1,000 texts a call (ids never leave Rust: the limit
  issue 15 measures against).
* ``raw fastokens``: ``encode_batch_flat`` on the same calls.
* ``encoder hf | fastokens | auto``: feedline's ``Tokenizer.encode_batch`` under each backend
  (int32 arrays per text; ``auto``/``fastokens`` include the run-time verification: the first
  256K characters encoded by both, then a spot check every 16th call).
* ``feedline hf | fastokens | auto``: ``feedline.Loader`` in-process, ``clm`` ``max_length: 1024``,
  ``pack`` ``batch_size: 64``, real tokens (``seq_lens``) per second of the whole run, first batch
  included (so is fastokens' one-time load, cached per process after the first round).

The load average of the machine is printed before and after: on a shared machine the ratios,
measured in one run, are the figures to compare.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import GPT2, corpus_files, machine, prose_corpus, require_data, save_json, table

CHUNK = 1000


def load_texts(corpus: Path) -> list[str]:
    texts: list[str] = []
    for path in corpus_files(corpus):
        with open(path, encoding="utf-8") as fh:
            texts += [json.loads(line)["text"] for line in fh]
    return texts


def encoder_contenders(tokenizer: str, texts: list[str]) -> dict[str, Callable[[], int]]:
    import fastokens
    import tokenizers

    from feedline._tokenize.backends import with_backend
    from feedline._tokenize.load import load_tokenizer

    raw = tokenizers.Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    raw.no_padding()
    raw.no_truncation()
    fast = fastokens.Tokenizer.from_json_str(raw.to_str())
    chunks = [texts[i:i + CHUNK] for i in range(0, len(texts), CHUNK)]
    tok = load_tokenizer(tokenizer)

    def raw_tokenizers() -> int:
        return sum(len(e) for c in chunks for e in raw.encode_batch_fast(c, add_special_tokens=False))

    def raw_fastokens() -> int:
        return sum(len(fast.encode_batch_flat(c, add_special_tokens=False)[0]) // 4 for c in chunks)

    def encoder(backend: str) -> Callable[[], int]:
        def run() -> int:
            view = with_backend(tok, backend)  # a fresh verification window per run, as per pipeline
            return sum(len(ids) for c in chunks for ids in view.encode_batch(c))
        return run

    return {"raw tokenizers": raw_tokenizers, "raw fastokens": raw_fastokens,
            "encoder hf": encoder("hf"), "encoder fastokens": encoder("fastokens"), "encoder auto": encoder("auto")}


def loader_contender(tokenizer: str, corpus: Path, backend: str, digests: dict[str, str]) -> Callable[[], int]:
    """The loader on ``backend``; records a digest of every batch's ids and labels in ``digests``."""
    def run() -> int:
        import feedline

        spec = {"sources": [{"path": str(corpus)}], "tokenizer": {"path": tokenizer, "backend": backend},
                "task": {"kind": "clm", "max_length": 1024}, "batching": {"strategy": "pack", "batch_size": 64}}
        tokens, h = 0, hashlib.sha256()
        with feedline.Loader(spec) as loader:
            for batch in loader:
                tokens += int(batch["seq_lens"].sum())
                for key in ("input_ids", "labels", "position_ids"):
                    h.update(np.ascontiguousarray(batch[key]).tobytes())
        digests[backend] = h.hexdigest()
        return tokens
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=8, help="megabytes of real text (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are shown (default 3)")
    ap.add_argument("--tokenizer", default=str(GPT2), help="a tokenizer directory (default: GPT-2)")
    args = ap.parse_args(argv)
    require_data()
    corpus = prose_corpus(args.mb)
    texts = load_texts(corpus)
    contenders = encoder_contenders(args.tokenizer, texts)
    digests: dict[str, str] = {}
    for backend in ("hf", "fastokens", "auto"):
        contenders[f"feedline {backend} (clm pack 1024)"] = loader_contender(args.tokenizer, corpus, backend, digests)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            t0, c0 = time.perf_counter(), time.process_time()
            tokens = fn()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            runs[name].append({"tokens": tokens, "wall_s": wall, "cpu_s": cpu, "tokens_per_s": tokens / wall})
    limit = statistics.median(r["tokens_per_s"] for r in runs["raw tokenizers"])
    rows = []
    for name, rs in runs.items():
        med = statistics.median(r["tokens_per_s"] for r in rs)
        rows.append({"contender": name, "tokens_per_s": med, "ratio": med / limit, "tokens": rs[0]["tokens"],
                     "cpu_s_per_mtok": statistics.median(r["cpu_s"] / r["tokens"] * 1e6 for r in rs),
                     "runs": ", ".join(f"{r['tokens_per_s'] / 1e6:.2f}M" for r in rs)})
    info = machine()
    info["load_avg_before"], info["load_avg_after"] = load_before, os.getloadavg()
    print(f"# encoder backends, {Path(args.tokenizer).name}, {args.mb:g} MB of real text "
          f"({len(texts):,} texts), {args.rounds} interleaved rounds, medians\n")
    print(table(rows, [("contender", "contender", ""), ("tokens_per_s", "tokens/s", ",.0f"),
                       ("ratio", "/ raw tokenizers", ".2f"), ("cpu_s_per_mtok", "CPU s / M tok", ".3f"),
                       ("tokens", "tokens", ","), ("runs", "runs", "")]))
    print(f"\nmachine: {info['cpu']}, {info['cores']} cores; load average before {load_before[0]:.2f}, "
          f"after {info['load_avg_after'][0]:.2f} (1 min)")
    identical = len(set(digests.values())) == 1
    print(f"batches (ids, labels, positions of every batch): hf, fastokens and auto are "
          f"{'identical' if identical else 'DIFFERENT: ' + str(digests)}")
    save_json("backends", {"machine": info, "command": "python bench/backends.py " + " ".join(argv or sys.argv[1:]),
                           "rows": rows, "runs": runs, "digests": digests, "identical": identical})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
