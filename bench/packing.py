"""Packing efficiency and speed: feedline's online packer vs the collate tool's greedy, TRL's BFD and global BFD.

    .venv/bin/python bench/packing.py                  # all inputs; table + bench/results/packing.json
    .venv/bin/python bench/packing.py --wiki-n 50000   # a quicker, smaller Wikipedia sample

Inputs (the same documents for every algorithm):

* ``wikipedia-512``: a seeded random sample (in random order) of the BERT Wikipedia phase-2
  length histogram (``../shared/reference/packing_sim/histograms.py``), capacity 512;
* ``squad-384``: every SQuAD 1.1 sequence of that file's histogram, shuffled, capacity 384;
* ``real-text-512``: real documents from ``../shared/data/prose`` (C4, Botchan paragraphs, KJV
  verses) tokenized with GPT-2 plus EOS, longer ones cut into 512-token pieces.

Algorithms: feedline's :class:`~feedline._batching.bestfit.BestFitPacker` at several windows (64
carried open bins, at most 64 documents per row, as the ``pack`` batcher's defaults), the same
without carried bins, the ``collate`` tool's greedy (sort by length, fill one bin, close it at the
first document that does not fit), TRL's ``pack_dataset(strategy="bfd")`` (its default map batch of
1000 rows; skipped if ``trl`` is not installed) and global best-fit-decreasing (the bound).
Speed counts documents per second including building the packed token rows.
Efficiency = real tokens / (rows x capacity).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from feedline._batching.bestfit import BestFitPacker

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
Rows = list[list[int]]


def load_histograms() -> Any:
    path = SHARED / "reference" / "packing_sim" / "histograms.py"
    spec = importlib.util.spec_from_file_location("histograms", path)
    if spec is None or spec.loader is None or not path.exists():
        sys.exit(f"histograms not found at {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def real_text_lengths(capacity: int) -> list[int]:
    from feedline._tokenize.load import load_tokenizer

    prose = SHARED / "data" / "prose"
    texts = [json.loads(line)["text"] for line in (prose / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()]
    texts += [p for p in (prose / "botchan.txt").read_text(encoding="utf-8-sig").split("\n\n") if p.strip()]
    import gzip

    with gzip.open(prose / "kjv_bible_verses.txt.gz", "rt", encoding="utf-8") as f:
        texts += [line for _, line in zip(range(20_000), f) if line.strip()]
    tok = load_tokenizer(str(SHARED / "data" / "tokenizers" / "gpt2"))
    lengths = []
    for ids in tok.encode_batch(texts):
        n = len(ids) + 1  # EOS
        lengths += [capacity] * (n // capacity) + ([n % capacity] if n % capacity else [])
    return [int(x) for x in np.random.default_rng(0).permutation(lengths)]


# --------------------------------------------------------------------------- algorithms
def feedline_packer(window: int, open_bins: int) -> Callable[[list[int], int], Rows]:
    def run(lengths: list[int], capacity: int) -> Rows:
        p: BestFitPacker[int] = BestFitPacker(capacity, window=window, open_bins=open_bins, max_items=64)
        for i, n in enumerate(lengths):
            p.push(n, i)
        p.flush()
        return list(p.ready)
    return run


def global_bfd(lengths: list[int], capacity: int) -> Rows:
    p: BestFitPacker[int] = BestFitPacker(capacity, window=len(lengths), open_bins=0)
    for i, n in enumerate(lengths):
        p.add(n, i)
    p.flush()
    return list(p.ready)


def collate_greedy(lengths: list[int], capacity: int) -> Rows:
    """The collate tool: sort by length (descending), fill a bin in order, close it at the first misfit."""
    rows: Rows = []
    row: list[int] = []
    room = capacity
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if lengths[i] > room:
            rows.append(row)
            row, room = [], capacity
        row.append(i)
        room -= lengths[i]
    if row:
        rows.append(row)
    return rows


def build_rows(rows: Rows, tokens: list[np.ndarray]) -> int:
    """Concatenate each row's documents (the work every packer's output needs); returns the token count."""
    return sum(len(np.concatenate([tokens[i] for i in row])) for row in rows)


def run_trl(lengths: list[int], capacity: int, map_batch: int) -> tuple[int, float] | None:
    try:
        import datasets
        import pyarrow as pa
        from trl.data_utils import pack_dataset
    except ImportError:
        return None
    datasets.disable_progress_bars()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.arange(offsets[-1], dtype=np.int32) % 50_000))
    ds = datasets.Dataset(pa.table({"input_ids": ids}))
    t = time.perf_counter()
    packed = pack_dataset(ds, capacity, strategy="bfd", map_kwargs={"batch_size": map_batch, "keep_in_memory": True})
    elapsed = time.perf_counter() - t
    return packed.num_rows, elapsed


# --------------------------------------------------------------------------- driver
def measure(name: str, lengths: list[int], capacity: int, windows: list[int]) -> list[dict[str, Any]]:
    total = sum(lengths)
    pool = np.arange(capacity, dtype=np.int32)
    tokens = [pool[:n] for n in lengths]
    algos: list[tuple[str, Callable[[list[int], int], Rows]]] = [
        (f"feedline window={w}", feedline_packer(w, 64)) for w in windows
    ]
    algos += [("feedline window=1000, no carried bins", feedline_packer(1000, 0)),
              ("collate greedy (sort, close at first misfit)", collate_greedy),
              ("global BFD (bound)", global_bfd)]
    results = []
    for label, fn in algos:
        t = time.perf_counter()
        rows = fn(lengths, capacity)
        assert build_rows(rows, tokens) == total
        elapsed = time.perf_counter() - t
        results.append({"input": name, "algorithm": label, "rows": len(rows), "efficiency": total / (len(rows) * capacity),
                        "docs_per_s": len(lengths) / elapsed, "seconds": elapsed})
    trl = run_trl(lengths, capacity, 1000)
    if trl is not None:
        rows_n, elapsed = trl
        results.append({"input": name, "algorithm": "TRL pack_dataset bfd (map batch 1000)", "rows": rows_n,
                        "efficiency": total / (rows_n * capacity), "docs_per_s": len(lengths) / elapsed, "seconds": elapsed})
    else:
        print("trl is not installed: TRL's pack_dataset is not measured (pip install trl)", file=sys.stderr)
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| input | algorithm | rows | efficiency | vs global BFD | docs/s | speed vs TRL |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r["input"] for r in results):
        group = [r for r in results if r["input"] == name]
        bound = next(r for r in group if r["algorithm"].startswith("global BFD"))
        trl = next((r for r in group if r["algorithm"].startswith("TRL")), None)
        for r in group:
            ratio = f"{r['docs_per_s'] / trl['docs_per_s']:.2f}x" if trl else "n/a"
            lines.append(f"| {name} | {r['algorithm']} | {r['rows']:,} | {r['efficiency']:.4%} | "
                         f"{(r['efficiency'] - bound['efficiency']) * 100:+.3f} pt | {r['docs_per_s']:,.0f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wiki-n", type=int, default=200_000, help="Wikipedia histogram sample size (default 200000)")
    ap.add_argument("--windows", type=int, nargs="+", default=[100, 1000, 10_000])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "packing.json"))
    args = ap.parse_args()
    h = load_histograms()
    rng = np.random.default_rng(0)
    wiki = h.wikipedia_histogram
    inputs = {
        "wikipedia-512": ([int(x) for x in rng.choice(np.arange(1, 513), size=args.wiki_n, p=wiki / wiki.sum())], 512),
        "squad-384": ([int(x) for x in rng.permutation(np.repeat(np.arange(1, 385), h.squad_1_1_histogram))], 384),
        "real-text-512": (real_text_lengths(512), 512),
    }
    results = []
    for name, (lengths, capacity) in inputs.items():
        print(f"{name}: {len(lengths):,} documents, {sum(lengths):,} tokens, capacity {capacity}", file=sys.stderr)
        results += measure(name, lengths, capacity, args.windows)
    print(table(results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "wiki_sample": args.wiki_n}
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
