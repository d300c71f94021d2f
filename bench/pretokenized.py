"""Pre-tokenized input -> CLM packed 1024, in-process: tokens/s for each layout.

    python bench/pretokenized.py                  # 20 M tokens, medians of 3 interleaved rounds
    python bench/pretokenized.py --mtok 5 --rounds 1

The documents are real text (the 300 C4 documents and 30 Wikipedia articles of
``../shared/data/prose``) tokenized once with the real GPT-2 tokenizer, each followed by EOS,
repeated (shuffled per repetition) to ``--mtok`` million tokens, and written under
``/tmp/feedline-bench`` as a Parquet ``input_ids`` column (row groups of 2,048 rows), a Megatron
``.bin/.idx`` pair and a nanoGPT flat ``uint16`` file. Each contender runs the whole file through
``feedline.Loader`` (``task: clm, max_length: 1024``, ``batching: pack, batch_size: 64``, no
tokenizer) and counts real tokens (``seq_lens``) reaching the consumer; ``pyarrow read`` is the
Parquet file read and flattened into one int32 array (a ceiling for the Parquet reader). Rounds
interleave the contenders; the table shows medians. Target (issue 15): Parquet >= 10 M tok/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import CORPORA, DATA, GPT2, machine, require_data, save_json, table

EOS = 50256
TARGET = 10e6


def documents() -> list[np.ndarray]:
    """The real documents as GPT-2 ids, each followed by EOS."""
    from feedline._tokenize.load import load_tokenizer

    texts = [json.loads(line)["text"] for line in (DATA / "prose" / "c4_demo.jsonl").open(encoding="utf-8")]
    texts += [line.strip() for line in (DATA / "prose" / "wiki_demo.txt").open(encoding="utf-8") if line.strip()]
    tok = load_tokenizer(str(GPT2))
    return [np.append(ids, EOS).astype(np.int32) for ids in tok.encode_batch(texts)]


def build(mtok: float) -> dict[str, Path]:
    """Write (once) the three layouts of ``mtok`` million tokens; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from feedline._sources.megatron import write_indexed_dataset

    out = CORPORA / f"pretokenized-{mtok:g}m"
    paths = {"parquet": out / "train.parquet", "megatron": out / "train_text_document.bin", "flat": out / "train.bin"}
    if (out / ".complete").exists():
        return paths
    out.mkdir(parents=True, exist_ok=True)
    base, docs, total, rng = documents(), [], 0, random.Random(0)
    while total < mtok * 1e6:
        order = list(range(len(base)))
        rng.shuffle(order)
        for i in order:
            docs.append(base[i])
            total += len(base[i])
            if total >= mtok * 1e6:
                break
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int32)
    flat = np.concatenate(docs)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    pq.write_table(pa.table({"input_ids": column}), paths["parquet"], row_group_size=2048)
    write_indexed_dataset(str(paths["megatron"])[:-4], docs, np.uint16)
    flat.astype(np.uint16).tofile(paths["flat"])
    (out / ".complete").touch()
    return paths


def spec(path: Path, layout: str) -> dict[str, Any]:
    source: dict[str, Any] = {"path": str(path)}
    if layout == "parquet":
        source["format"] = "tokens"
    if layout == "flat":
        source.update(format="flat", tokens={"dtype": "uint16", "eos": EOS})
    return {"sources": [source], "task": {"kind": "clm", "max_length": 1024},
            "batching": {"strategy": "pack", "batch_size": 64}}


def run_loader(path: Path, layout: str) -> dict[str, Any]:
    import feedline

    t0, c0 = time.perf_counter(), time.process_time()
    tokens = batches = 0
    first = None
    with feedline.Loader(spec(path, layout)) as loader:
        for batch in loader:
            tokens += int(batch["seq_lens"].sum())
            batches += 1
            if first is None:
                first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "batches": batches, "wall_s": wall, "cpu_s": time.process_time() - c0,
            "first_batch_s": first, "tokens_per_s": tokens / wall}


def run_pyarrow(path: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    t0, c0 = time.perf_counter(), time.process_time()
    pf = pq.ParquetFile(path)
    tokens = 0
    for g in range(pf.metadata.num_row_groups):
        col = pf.read_row_group(g, columns=["input_ids"]).column(0).combine_chunks()
        tokens += len(col.values.to_numpy().astype(np.int32))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "cpu_s": time.process_time() - c0, "tokens_per_s": tokens / wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtok", type=float, default=20, help="million tokens per layout (default 20)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the table shows medians (default 3)")
    args = ap.parse_args(argv)
    require_data()
    paths = build(args.mtok)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        runs.setdefault("pyarrow read (ceiling)", []).append(run_pyarrow(paths["parquet"]))
        for layout in ("parquet", "megatron", "flat"):
            runs.setdefault(f"feedline {layout} -> pack 1024", []).append(run_loader(paths[layout], layout))
    rows = []
    for name, rs in runs.items():
        med = statistics.median(r["tokens_per_s"] for r in rs)
        rows.append({"contender": name, "tokens_per_s": med, "tokens": rs[0]["tokens"],
                     "cpu_s_per_mtok": statistics.median(r["cpu_s"] / r["tokens"] * 1e6 for r in rs),
                     "first_batch_s": statistics.median(r["first_batch_s"] for r in rs) if "first_batch_s" in rs[0] else None,
                     "runs": ", ".join(f"{r['tokens_per_s'] / 1e6:.1f}M" for r in rs)})
    parquet = next(r for r in rows if r["contender"].startswith("feedline parquet"))
    info = machine()
    info["load_avg_before"], info["load_avg_after"] = load_before, os.getloadavg()
    print(f"# pre-tokenized -> CLM pack 1024, in-process ({args.mtok:g} M tokens, {args.rounds} rounds, medians)\n")
    print(table(rows, [("contender", "contender", ""), ("tokens_per_s", "tokens/s", ",.0f"),
                       ("cpu_s_per_mtok", "CPU s / M tok", ".3f"), ("first_batch_s", "first batch s", ".3f"),
                       ("runs", "runs", "")]))
    print(f"\nParquet target >= {TARGET / 1e6:.0f} M tok/s: {'met' if parquet['tokens_per_s'] >= TARGET else 'NOT met'} "
          f"({parquet['tokens_per_s'] / 1e6:.1f} M)")
    print(f"machine: {info['cpu']}, {info['cores']} cores; load average before {load_before[0]:.2f}, "
          f"after {info['load_avg_after'][0]:.2f} (1 min)")
    save_json("pretokenized", {"machine": info, "command": "python bench/pretokenized.py " + " ".join(argv or sys.argv[1:]),
                               "rows": rows, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
