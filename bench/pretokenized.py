"""Pre-tokenized input -> CLM rows of 1024, in one process: feedline beside LitData on the same tokens.

    python bench/pretokenized.py                          # short and long documents, 3 rounds, 8 s windows
    python bench/pretokenized.py --docs short --seconds 4 --rounds 1 --only litdata flat-concat
    python bench/pretokenized.py --quick                  # one round of 3 s windows

The documents are real text tokenized once with the real GPT-2 tokenizer, each followed by EOS:
``long``: the 300 C4 documents and 30 Wikipedia articles of ``../shared/data/prose``;
``short``: the same text and the KJV verses cut at sentence ends into paragraphs of 200-500
characters. They are repeated (shuffled per repetition) to ``--mtok`` million tokens and written
under ``/tmp/feedline-bench`` as a Parquet ``input_ids`` column (row groups of 2,048 rows), an
Arrow IPC file, a Megatron ``.bin/.idx`` pair, a nanoGPT flat ``uint16`` file and LitData
``optimize``d chunks (``TokensLoader``; the conversion is not timed).

Each contender runs in a fresh process, reads its file endlessly (``epochs: null``; LitData's
loader is re-iterated) and delivers rows of 1024, 16 a batch: feedline ``task: clm, max_length:
1024`` with ``batching: concat`` or ``pack`` (tokens counted from ``seq_lens``), by default with
``Loader(spec, prefetch=0)``, each batch made in the caller's thread as LitData's in-process loader
does (``--prefetch 4``: the default loader, which hands batches over from a thread); LitData
``StreamingDataset(TokensLoader(block_size=1025))`` + ``StreamingDataLoader(batch_size=16)``,
``num_workers`` 0 (in-process) and 2 (1024 tokens counted per row: the 1,025th is the shifted
label). The measure is the issue's steady state: tokens delivered from 1 s after the first batch,
for ``--seconds``, over that window's wall time, and over the CPU seconds of the process tree in
it (the machine is shared: CPU-based rates are less disturbed). Rounds interleave the
contenders; the tables show medians and the ratio to LitData in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import CORPORA, DATA, GPT2, machine, require_data, save_json, table, tree_cpu

EOS = 50256
ROW, BATCH = 1024, 16
FEEDLINE = {  # name -> (layout, strategy)
    "flat-concat": ("flat", "concat"), "flat-pack": ("flat", "pack"),
    "megatron-concat": ("megatron", "concat"), "megatron-pack": ("megatron", "pack"),
    "parquet-concat": ("parquet", "concat"), "parquet-pack": ("parquet", "pack"),
    "arrow-pack": ("arrow", "pack"),
}
CONTENDERS = ("litdata", "litdata-w2", *FEEDLINE)


def _texts(docs: str) -> list[str]:
    texts = [json.loads(line)["text"] for line in (DATA / "prose" / "c4_demo.jsonl").open(encoding="utf-8")]
    texts += [line.strip() for line in (DATA / "prose" / "wiki_demo.txt").open(encoding="utf-8") if line.strip()]
    if docs == "long":
        return texts
    import gzip

    with gzip.open(DATA / "prose" / "kjv_bible_verses.txt.gz", "rt", encoding="utf-8") as fh:
        verses = [m.group(1).strip() for m in (re.match(r"\s+\d+ (.+)", line) for line in fh) if m]
    out, cur = [], ""
    for text in [*texts, " ".join(verses)]:
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            cur = f"{cur} {sentence}".strip()
            if len(cur) >= 200:
                out.append(cur[:500])
                cur = ""
    return out


def documents(docs: str = "long") -> list[np.ndarray]:
    """The real documents as GPT-2 ids, each followed by EOS."""
    from feedline._tokenize.load import load_tokenizer

    tok = load_tokenizer(str(GPT2))
    return [np.append(ids, EOS).astype(np.int32) for ids in tok.encode_batch(_texts(docs))]


def build(mtok: float, docs: str = "long", extras: bool = False) -> dict[str, Path]:
    """Write (once) the layouts of ``mtok`` million tokens of ``docs`` (``extras``: the Arrow file and
    LitData's chunks too); returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from feedline._sources.megatron import write_indexed_dataset

    out = CORPORA / (f"pretokenized-{mtok:g}m" if docs == "long" else f"pretokenized-{docs}-{mtok:g}m")
    paths = {"parquet": out / "train.parquet", "megatron": out / "train_text_document.bin", "flat": out / "train.bin",
             "arrow": out / "train.arrow", "litdata": out / "litdata"}
    if not (out / ".complete").exists():
        out.mkdir(parents=True, exist_ok=True)
        base, chosen, total, rng = documents(docs), [], 0, random.Random(0)
        while total < mtok * 1e6:
            order = list(range(len(base)))
            rng.shuffle(order)
            for i in order:
                chosen.append(base[i])
                total += len(base[i])
                if total >= mtok * 1e6:
                    break
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in chosen])]).astype(np.int32)
        flat = np.concatenate(chosen)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
        pq.write_table(pa.table({"input_ids": column}), paths["parquet"], row_group_size=2048)
        write_indexed_dataset(str(paths["megatron"])[:-4], chosen, np.uint16)
        flat.astype(np.uint16).tofile(paths["flat"])
        (out / ".complete").touch()
    if extras and not paths["arrow"].exists():  # the same table as an Arrow IPC file (batches of 8,192 rows)
        table_ = pq.read_table(paths["parquet"])
        with pa.OSFile(str(paths["arrow"]) + ".part", "wb") as sink, pa.ipc.new_file(sink, table_.schema) as writer:
            writer.write_table(table_, max_chunksize=8192)
        os.replace(str(paths["arrow"]) + ".part", paths["arrow"])
    if extras and not (paths["litdata"] / "index.json").exists():
        try:
            _litdata_chunks(paths["flat"], paths["litdata"])
        except ImportError:
            print("litdata is not installed (pip install --no-deps litdata lightning-utilities boto3): no LitData rows")
    return paths


def _litdata_doc(args: tuple[str, int, int]) -> Any:
    import torch

    path, start, stop = args
    ids = np.fromfile(path, dtype=np.uint16)[start:stop].astype(np.int32)
    yield torch.from_numpy(ids)


def _litdata_chunks(src: Path, out: Path) -> None:
    """The flat file's token stream as LitData chunks (``optimize`` with ``TokensLoader``, the LitGPT recipe)."""
    from litdata import TokensLoader, optimize

    n, step = os.path.getsize(src) // 2, 1 << 20
    inputs = [(str(src), a, min(a + step, n)) for a in range(0, n, step)]
    optimize(fn=_litdata_doc, inputs=inputs, output_dir=str(out), chunk_bytes="64MB", item_loader=TokensLoader(),
             num_workers=2, mode="overwrite")


def spec(path: Path, layout: str, strategy: str) -> dict[str, Any]:
    source: dict[str, Any] = {"path": str(path)}
    if layout in ("parquet", "arrow"):
        source["format"] = "tokens"
    if layout == "flat":
        source.update(format="flat", tokens={"dtype": "uint16", "eos": EOS})
    return {"sources": [source], "task": {"kind": "clm", "max_length": ROW}, "epochs": None,
            "batching": {"strategy": strategy, "batch_size": BATCH}}


def _batches(name: str, paths: dict[str, Path], prefetch: int = 0) -> Any:
    """The contender's endless stream of tokens per batch."""
    if name.startswith("litdata"):
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

        ds = StreamingDataset(str(paths["litdata"]), item_loader=TokensLoader(block_size=ROW + 1), shuffle=False)
        loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=2 if name.endswith("w2") else 0)
        while True:
            for batch in loader:
                yield batch.shape[0] * ROW
    import feedline

    layout, strategy = FEEDLINE[name]
    with feedline.Loader(spec(paths[layout], layout, strategy), prefetch=prefetch) as loader:
        for batch in loader:
            yield int(batch["seq_lens"].sum())


def measure(name: str, paths: dict[str, Path], seconds: float, warmup: float = 1.0, prefetch: int = 0) -> dict[str, Any]:
    """One contender in this process: first batch, then the steady window's tokens per wall and CPU second."""
    t0 = time.perf_counter()
    first = w0 = c0 = None
    tokens = 0
    for n in _batches(name, paths, prefetch):
        now = time.perf_counter()
        if first is None:
            first = now - t0
        elif w0 is None and now - t0 - first >= warmup:
            w0, c0, tokens = now, tree_cpu(), 0
        elif w0 is not None:
            tokens += n
            if now - w0 >= seconds:
                wall, cpu = now - w0, tree_cpu() - c0
                return {"first_batch_s": first, "tokens": tokens, "wall_s": wall, "cpu_s": cpu,
                        "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu}
    raise RuntimeError(f"{name}: the stream ended")


def run_one(name: str, docs: str, mtok: float, seconds: float, prefetch: int = 0) -> dict[str, Any]:
    """:func:`measure` in a fresh process."""
    cmd = [sys.executable, __file__, "--one", name, "--docs", docs, "--mtok", str(mtok), "--seconds", str(seconds),
           "--prefetch", str(prefetch)]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if got.returncode:
        return {"error": (got.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(got.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", choices=("short", "long", "both"), default="both")
    ap.add_argument("--mtok", type=float, default=14, help="million tokens per layout (default 14)")
    ap.add_argument("--seconds", type=float, default=8, help="the steady window per run (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the tables show medians (default 3)")
    ap.add_argument("--only", nargs="*", choices=CONTENDERS, help="contenders to run (default: all)")
    ap.add_argument("--prefetch", type=int, default=0, help="feedline's Loader(prefetch=...): 0 (default) makes "
                    "each batch in the caller's thread, as LitData in-process; 4 is the default loader's thread")
    ap.add_argument("--quick", action="store_true", help="one round of 3 s windows (bench/run.py --quick)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    require_data()
    if args.quick:
        args.rounds, args.seconds = 1, 3.0
    if args.one:
        print(json.dumps(measure(args.one, build(args.mtok, args.docs, extras=True), args.seconds, prefetch=args.prefetch)))
        return 0
    kinds = ("short", "long") if args.docs == "both" else (args.docs,)
    names = args.only or list(CONTENDERS)
    load_before = os.getloadavg()
    result: dict[str, Any] = {"machine": machine(), "command": "python bench/pretokenized.py " + " ".join(argv or sys.argv[1:])}
    for kind in kinds:
        paths = build(args.mtok, kind, extras=True)
        lengths = np.diff(np.asarray(__import__("pyarrow.parquet").parquet.read_table(paths["parquet"])
                                     .column(0).combine_chunks().offsets))
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for _ in range(args.rounds):
            for n in names:
                runs[n].append(run_one(n, kind, args.mtok, args.seconds, args.prefetch))
        rows = []
        for n, rs in runs.items():
            ok = [r for r in rs if "error" not in r]
            if not ok:
                rows.append({"contender": n, "runs": rs[0]["error"][:60]})
                continue
            rows.append({"contender": n, **{k: statistics.median(r[k] for r in ok) for k in
                                            ("tokens_per_s", "tokens_per_cpu_s", "first_batch_s")},
                         "runs": ", ".join(f"{r['tokens_per_s'] / 1e6:.1f}" for r in ok)})
        base = next((r for r in rows if r["contender"] == "litdata" and "tokens_per_s" in r), None)
        for r in rows:
            if base and "tokens_per_s" in r:
                r["ratio"] = r["tokens_per_s"] / base["tokens_per_s"]
                r["cpu_ratio"] = r["tokens_per_cpu_s"] / base["tokens_per_cpu_s"]
        for r in rows:
            for k in ("tokens_per_s", "tokens_per_cpu_s"):
                if k in r:
                    r[k] /= 1e6
        print(f"\n# {kind} documents (mean {lengths.mean():.0f} tokens with EOS), {args.mtok:g} M tokens, rows of "
              f"{ROW}, {BATCH} a batch, {args.seconds:g} s windows, medians of {args.rounds} rounds, feedline "
              f"prefetch={args.prefetch}\n")
        print(table(rows, [("contender", "contender", ""), ("tokens_per_s", "M tok/s", ".1f"),
                           ("ratio", "vs LitData", ".2f"), ("tokens_per_cpu_s", "M tok/CPU s", ".1f"),
                           ("cpu_ratio", "vs LitData (CPU)", ".2f"), ("first_batch_s", "first batch s", ".3f"),
                           ("runs", "runs (M tok/s)", "")]))
        result[kind] = {"mean_tokens": float(lengths.mean()), "rows": rows, "runs": runs}
    print(f"\nload average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1 min)")
    save_json("pretokenized", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
