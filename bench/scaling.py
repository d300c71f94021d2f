"""How feedline's rate grows with what it is given: the curve over ``workers`` (and over ``partitions``
and their placement, where the spec has them), as a ratio to the raw encoder on all cores.

    python bench/scaling.py                                   # 4 workloads x workers 0,1,2,4,8,14
    python bench/scaling.py --workloads mlm-128 --workers 1,14 --seconds 3 --rounds 2
    python bench/scaling.py --partitions 1,2 --placements threads,processes
    PYTHONPATH=/other/checkout/src python bench/scaling.py --tag before   # another checkout, same corpora

Workloads: ``clm-short`` (GPT-2, clm pack 1024 x 16 rows, short records ~145 characters),
``clm-docs`` (GPT-2, the same on C4 documents and Wikipedia articles), ``mlm-128`` (BERT, mlm 128,
pad 64 rows, Wikipedia articles) and ``parquet`` (pre-tokenized GPT-2 ids in Parquet, clm pack
1024 x 16). Every setting runs in a fresh process: it builds the loader, takes the first batch
(``first batch s``, from the loader's construction), then counts real tokens (``attention_mask``)
for ``--seconds`` (from ``--warmup`` seconds after the first batch; 0, the default, measures the first
window, where a stall shows), and the CPU that process spent per step in that window (all its
threads; with partitions in worker processes, the composing process alone: the cap it sets is
about 1000 / that many steps a second), and the cores that process and its workers kept busy
(their CPU seconds per second of the window: K partitions on K free cores should keep ~K busy;
fewer, with a rate below K times one partition's, says the composing process or the transport
holds them back). ``raw`` is ``tokenizers``' ``encode_batch_fast`` on the workload's texts (in
memory, calls of ~1 MiB from one thread, Rayon on every core), run in the same rounds: each rate is
also shown as a ratio to it, and to ``workers: 1``. Rounds interleave the settings, so load from
other work hits all of them alike; the table shows medians.

Text never repeats in a measured window: the corpora are the real texts of ``../shared/data/prose``
once (pass 0), then again with their letters permuted (vowels among vowels, consonants among
consonants, a new permutation each pass, each pass reshuffled): no text, and almost no word,
recurs, so the word cache meets new words as on fresh data; the tokenizer meets unfamiliar words
(more tokens per character than English), the same for feedline and for ``raw``.

``--partitions`` and ``--placements`` use the spec's ``partitions`` and ``parallel: {placement}``
fields when this checkout has them; otherwise they are skipped with a message. Results go to
``bench/results/scaling[-tag].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BERT,
    CORPORA,
    DATA,
    GPT2,
    _documents,
    _short_paragraphs,
    machine,
    require_data,
    save_json,
    table,
    tree_cpu,
)

VOWELS, CONSONANTS = "aeiou", "bcdfghjklmnpqrstvwxyz"
WORKLOADS: dict[str, dict[str, Any]] = {
    "clm-short": {"text": "short", "tokenizer": GPT2, "task": {"kind": "clm", "max_length": 1024},
                  "batching": {"strategy": "pack", "batch_size": 16}},
    "clm-docs": {"text": "docs", "tokenizer": GPT2, "task": {"kind": "clm", "max_length": 1024},
                 "batching": {"strategy": "pack", "batch_size": 16}},
    "mlm-128": {"text": "wiki", "tokenizer": BERT, "task": {"kind": "mlm", "max_length": 128, "mlm_probability": 0.15},
                "batching": {"strategy": "pad", "batch_size": 64}},
    "parquet": {"text": "docs", "tokenizer": GPT2, "pretokenized": True, "task": {"kind": "clm", "max_length": 1024},
                "batching": {"strategy": "pack", "batch_size": 16}},
}


# ------------------------------------------------------------------------------- corpora
def _texts(kind: str) -> list[str]:
    if kind == "short":
        return _short_paragraphs()
    if kind == "wiki":
        return [line.strip() for line in (DATA / "prose" / "wiki_demo.txt").open(encoding="utf-8") if line.strip()]
    return _documents()


def _permutation(rng: random.Random) -> dict[int, str]:
    table_: dict[int, str] = {}
    for group in (VOWELS, CONSONANTS):
        shuffled = list(group)
        rng.shuffle(shuffled)
        for a, b in zip(group, shuffled, strict=True):
            table_[ord(a)], table_[ord(a.upper())] = b, b.upper()
    return table_


def unique_corpus(kind: str, mb: float) -> Path:
    """A directory of two JSONL files (cached) holding ``mb`` MB of ``kind`` text, no text twice."""
    require_data()
    out = CORPORA / f"unique-{kind}-{mb:g}mb"
    if (out / ".complete").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    base, rng = _texts(kind), random.Random(0)
    per_file, passes = int(mb * (1 << 20) / 2), 0
    for f in range(2):
        written = 0
        with (out / f"part-{f}.jsonl").open("w", encoding="utf-8") as fh:
            while written < per_file:
                trans = _permutation(rng) if passes else {}
                passes += 1
                texts = [t.translate(trans) for t in base]
                rng.shuffle(texts)
                for t in texts:
                    line = json.dumps({"text": t}, ensure_ascii=False) + "\n"
                    fh.write(line)
                    written += len(line.encode("utf-8"))
                    if written >= per_file:
                        break
    (out / ".complete").touch()
    return out


def parquet_corpus(mb: float) -> Path:
    """The ``docs`` corpus of ``mb`` MB as GPT-2 ids (each text + EOS) in one Parquet file (cached)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tokenizers

    out = CORPORA / f"unique-docs-{mb:g}mb.parquet"
    if out.exists():
        return out
    tok = tokenizers.Tokenizer.from_file(str(GPT2 / "tokenizer.json"))
    rows: list[Any] = []
    for path in sorted(unique_corpus("docs", mb).glob("*.jsonl")):
        texts = [json.loads(line)["text"] for line in path.open(encoding="utf-8")]
        for i in range(0, len(texts), 512):
            rows += [np.append(np.asarray(e.ids, dtype=np.int32), 50256) for e in tok.encode_batch(texts[i:i + 512])]
    tmp = out.with_suffix(".tmp")
    pq.write_table(pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))}), tmp, row_group_size=2048)
    tmp.rename(out)
    return out


def spec_for(name: str, mb: float, workers: int, partitions: int = 1, placement: str | None = None) -> dict[str, Any]:
    w = WORKLOADS[name]
    if w.get("pretokenized"):
        sources = [{"path": str(parquet_corpus(mb)), "format": "tokens"}]
        tokenizer: Any = None
    else:
        sources = [{"path": str(unique_corpus(w["text"], mb)), "format": "jsonl"}]
        tokenizer = str(w["tokenizer"] / "tokenizer.json")
    spec: dict[str, Any] = {"sources": sources, "task": w["task"], "batching": w["batching"], "seed": 0,
                            "workers": workers, "epochs": None}
    if tokenizer:
        spec["tokenizer"] = tokenizer
    if partitions != 1:
        spec["partitions"] = partitions
    if placement:
        spec["parallel"] = {"placement": placement}
    return spec


def spec_fields() -> set[str]:
    """The fields this checkout's spec knows (``partitions``, ``parallel`` come with issue 25)."""
    import dataclasses

    from feedline._spec.spec import Spec

    return {f.name for f in dataclasses.fields(Spec)}


# ------------------------------------------------------------------------------- measurements
def measure_loader(spec: Any, seconds: float, warmup: float = 0.0,
                   cpu: Callable[[], float] | None = None, tree: Callable[[], float] | None = None) -> dict[str, Any]:
    """First-batch time and real tokens/s over ``seconds`` from ``warmup`` seconds after it (this
    process); with ``cpu`` (CPU seconds so far, e.g. of a process tree) also steps/s and CPU ms per step;
    with ``tree`` (CPU seconds of this process and its workers) also the cores they kept busy."""
    import feedline

    t0 = time.perf_counter()
    with feedline.Loader(spec) as loader:
        it = iter(loader)
        next(it)
        t_first = time.perf_counter()
        while time.perf_counter() - t_first < warmup:
            next(it)
        t1, c1, n, steps = time.perf_counter(), cpu() if cpu else 0.0, 0, 0
        w1 = tree() if tree else 0.0
        while time.perf_counter() - t1 < seconds:
            n += int(next(it)["attention_mask"].sum())
            steps += 1
        dt = time.perf_counter() - t1
        used = cpu() - c1 if cpu else None
        busy = (tree() - w1) / dt if tree else None
    out: dict[str, Any] = {"first_batch_s": t_first - t0, "tokens_per_s": n / dt}
    if used is not None:
        out.update(steps_per_s=steps / dt, cpu_ms_per_step=used / steps * 1e3)
    if busy is not None:
        out["busy_cores"] = busy
    return out


def measure_raw(name: str, mb: float, seconds: float) -> dict[str, Any]:
    """``encode_batch_fast`` on the workload's texts in memory, ~1 MiB a call, Rayon on every core."""
    import tokenizers

    w = WORKLOADS[name]
    tok = tokenizers.Tokenizer.from_file(str(w["tokenizer"] / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    texts: list[str] = []
    for path in sorted(unique_corpus(w["text"], mb).glob("*.jsonl")):
        texts += [json.loads(line)["text"] for line in path.open(encoding="utf-8")]
    calls, cur, size = [], [], 0
    for t in texts:
        cur.append(t)
        size += len(t)
        if size >= 1 << 20:
            calls.append(cur)
            cur, size = [], 0
    t0, n, i = time.perf_counter(), 0, 0
    while time.perf_counter() - t0 < seconds and i < len(calls):
        n += sum(len(e) for e in tok.encode_batch_fast(calls[i], add_special_tokens=False))
        i += 1
    return {"tokens_per_s": n / (time.perf_counter() - t0), "first_batch_s": None}


def child(setting: dict[str, Any], mb: float, seconds: float, warmup: float) -> dict[str, Any]:
    if setting["kind"] == "raw":
        return measure_raw(setting["workload"], mb, seconds)
    spec = spec_for(setting["workload"], mb, setting["workers"], setting.get("partitions", 1), setting.get("placement"))
    # this process's CPU (with workers, the composer's), and the cores it and its workers kept busy
    return measure_loader(spec, seconds, warmup, cpu=time.process_time, tree=tree_cpu)


def settings_for(args: argparse.Namespace) -> list[dict[str, Any]]:
    fields = spec_fields()
    parts = [int(k) for k in args.partitions.split(",")] if args.partitions else [1]
    places = args.placements.split(",") if args.placements else [None]
    if parts != [1] and "partitions" not in fields:
        print("partitions: this checkout's spec has no `partitions` field (issue 25, item 2): the K curve is skipped")
        parts = [1]
    if places != [None] and "parallel" not in fields:
        print("placements: this checkout's spec has no `parallel` field (issue 25, item 3): placements are skipped")
        places = [None]
    out: list[dict[str, Any]] = []
    for name in args.workloads.split(","):
        out.append({"kind": "raw", "workload": name})
        for w in map(int, args.workers.split(",")):
            out.append({"kind": "feedline", "workload": name, "workers": w})
        for k in parts:
            for place in places:
                if k != 1 or place is not None:
                    out.append({"kind": "feedline", "workload": name, "workers": 0, "partitions": k, "placement": place})
    return out


def label(s: dict[str, Any]) -> str:
    if s["kind"] == "raw":
        return "raw encode_batch_fast, all cores"
    extra = f", K={s['partitions']}" if s.get("partitions", 1) != 1 else ""
    extra += f", {s['placement']}" if s.get("placement") else ""
    return f"workers={s['workers']}{extra}"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every setting in a fresh process, ``rounds`` times interleaved; the rows of the table."""
    settings = settings_for(args)
    for name in args.workloads.split(","):  # corpora are written before any clock starts
        spec_for(name, args.mb, 0)
    runs: list[list[dict[str, Any]]] = [[] for _ in settings]
    for _ in range(args.rounds):
        for i, s in enumerate(settings):
            cmd = [sys.executable, __file__, "--child", json.dumps(s), "--mb", str(args.mb), "--seconds", str(args.seconds),
                   "--warmup", str(args.warmup)]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=args.timeout).stdout
                runs[i].append(json.loads(out.strip().splitlines()[-1]))
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                tail = (getattr(e, "stderr", "") or "").strip().splitlines()[-1:] or [type(e).__name__]
                print(f"{label(s)} ({s['workload']}): failed: {tail[0]}")
    rows: list[dict[str, Any]] = []
    for s, rs in zip(settings, runs, strict=True):
        rate = statistics.median(r["tokens_per_s"] for r in rs) if rs else float("nan")
        firsts = [r["first_batch_s"] for r in rs if r["first_batch_s"] is not None]
        cpus = [r["cpu_ms_per_step"] for r in rs if r.get("cpu_ms_per_step") is not None]
        busy = [r["busy_cores"] for r in rs if r.get("busy_cores") is not None]
        rows.append({"workload": s["workload"], "setting": label(s), **s, "tokens_per_s": rate,
                     "first_batch_s": statistics.median(firsts) if firsts else None,
                     "cpu_ms_per_step": statistics.median(cpus) if cpus else None,
                     "busy_cores": statistics.median(busy) if busy else None,
                     "runs": [round(r["tokens_per_s"]) for r in rs]})
    for r in rows:
        same = [x for x in rows if x["workload"] == r["workload"]]
        raw = next(x["tokens_per_s"] for x in same if x["kind"] == "raw")
        one = next((x["tokens_per_s"] for x in same if x.get("workers") == 1 and "partitions" not in x), None)
        r["vs_raw"] = r["tokens_per_s"] / raw if raw else None
        r["vs_workers_1"] = r["tokens_per_s"] / one if one and r["kind"] != "raw" else None
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(table(rows, [("workload", "workload", ""), ("setting", "setting", ""), ("tokens_per_s", "median tok/s", ",.0f"),
                       ("vs_raw", "/ raw", ".2f"), ("vs_workers_1", "/ workers=1", ".2f"),
                       ("first_batch_s", "first batch s", ".2f"), ("cpu_ms_per_step", "this process's CPU ms/step", ".2f"),
                       ("busy_cores", "busy cores (with workers)", ".2f"), ("runs", "each run", "")]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--workers", default="0,1,2,4,8,14")
    ap.add_argument("--partitions", default="", help="K values, e.g. 1,2,4 (needs the spec's `partitions`)")
    ap.add_argument("--placements", default="", help="e.g. threads,processes (needs the spec's `parallel`)")
    ap.add_argument("--mb", type=float, default=48, help="corpus size per workload (no text twice)")
    ap.add_argument("--seconds", type=float, default=4.0, help="measured window after the first batch")
    ap.add_argument("--warmup", type=float, default=0.0,
                    help="seconds between the first batch and the window (0: the first window, stalls included)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per measurement process")
    ap.add_argument("--tag", default="")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child), args.mb, args.seconds, args.warmup)))
        return 0
    load0 = os.getloadavg()[0]
    rows = run(args)
    print(f"{os.cpu_count()} cores; load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after; {args.seconds:g} s windows {args.warmup:g} s after the first batch, "
          f"medians of {args.rounds} interleaved rounds")
    print_rows(rows)
    name = "scaling" + (f"-{args.tag}" if args.tag else "")
    print(f"saved {save_json(name, {'machine': machine(), 'load_avg': [load0, os.getloadavg()[0]], 'rows': rows})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
