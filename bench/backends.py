"""Encoder backends: ``tokenizers`` vs fastokens vs the word cache vs ``auto``, alone and inside feedline.

    python bench/backends.py                 # 8 MB of real text, GPT-2 and BERT, 3 interleaved rounds
    python bench/backends.py --mb 2 --rounds 1 --tokenizer ../shared/data/tokenizers/qwen2.5

Text: the 300 C4 documents and 30 Wikipedia articles of ``../shared/data/prose`` repeated to
``--mb`` (``bench/common.py: prose_corpus``). Every contender runs over all of it, one after the
other within a round, rounds interleaved; the table shows the median of the rounds and each figure
as a ratio to the raw ``tokenizers`` encoder of the same run. Per tokenizer, the backends are
``hf``, each fast encoder that passes its load-time verification for it (fastokens loads GPT-2,
the word cache takes BERT), and ``auto``:

* ``raw tokenizers``: ``encode_batch_fast`` on 1,000 texts a call (ids never leave Rust: the limit
  issue 15 measures against).
* ``raw fastokens``: ``encode_batch_flat`` on the same calls (where fastokens loads the tokenizer).
* ``encoder <backend>``: feedline's ``Tokenizer.encode_batch`` under each backend (int32 arrays
  per text; the fast ones include the run-time verification: the first 256K characters encoded
  by both, then a spot check every 16th call; the word cache starts empty each run).
* ``feedline <backend>``: ``feedline.Loader`` in-process, real tokens per second of the whole
  run, first batch included (so is fastokens' one-time load, cached per process after the first
  round): ``clm`` ``max_length: 1024`` ``pack`` ``batch_size: 64``, or for a tokenizer with a mask
  token ``mlm`` ``max_length: 128`` ``pad`` ``batch_size: 64``. Every batch's arrays are digested:
  the backends must give identical batches.

The corpus repeats ~1.7 MB of text, which flatters a word cache: after the first pass every word
is a hit. For a tokenizer the word cache takes, a second table encodes **unique** text, each text
once (the C4 and Wikipedia samples, the King James Bible in 40-verse pieces and *Botchan*, ~6.3 M
characters, shuffled): ``tokenizers`` against the word cache starting empty, so every distinct
word is a miss once, as on the first pass over a real corpus; and the loader (``mlm`` 128, ``pad``
64, the cache emptied before each run) under ``hf`` and ``auto``, against ``tokenizers`` on the
same texts.

SentencePiece ``.model`` files (every one in ``../shared/data/tokenizers``: Mistral v3 BPE, T5
Unigram) get a table of their own on the same texts: the converted ``tokenizers`` pipeline
(``encoder hf``) against ``encoder sentencepiece`` (sentencepiece's own batch encode, all cores),
as tokens per second and the ratio to the converted pipeline, with the documents whose ids differ
from ``sentencepiece.encode`` (0 for the sentencepiece backend by construction).

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

from common import BERT, DATA, GPT2, corpus_files, machine, prose_corpus, require_data, save_json, table

CHUNK = 1000


def load_texts(corpus: Path) -> list[str]:
    texts: list[str] = []
    for path in corpus_files(corpus):
        with open(path, encoding="utf-8") as fh:
            texts += [json.loads(line)["text"] for line in fh]
    return texts


def unique_texts() -> list[str]:
    """~6.3 M characters of distinct real text, each text once, shuffled (seed 0)."""
    import gzip
    import random

    prose = DATA / "prose"
    texts = [json.loads(line)["text"] for line in (prose / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()]
    texts += [line for line in (prose / "wiki_demo.txt").read_text(encoding="utf-8").split("\n") if line.strip()]
    with gzip.open(prose / "kjv_bible_verses.txt.gz", "rt", encoding="utf-8") as fh:
        verses = fh.read().split("\n")
    texts += ["\n".join(verses[i:i + 40]) for i in range(0, len(verses), 40)]
    parts = (prose / "botchan.txt").read_text(encoding="utf-8-sig").split("\n\n")
    texts += ["\n\n".join(parts[i:i + 10]) for i in range(0, len(parts), 10)]
    random.Random(0).shuffle(texts)
    return texts


def bench_unique(tokenizer: str, rounds: int) -> list[dict[str, object]]:
    """``tokenizers`` against the word cache (empty at each run) on :func:`unique_texts`, 64 texts a call."""
    from feedline._tokenize.encoder import HfEncoder
    from feedline._tokenize.load import load_tokenizer
    from feedline._tokenize.wordcache import WordCacheEncoder

    texts = unique_texts()
    tok = load_tokenizer(tokenizer)
    corpus = Path(os.environ.get("FEEDLINE_BENCH_DIR", "/tmp/feedline-bench")) / "unique-text.jsonl"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    encoders: dict[str, object] = {"tokenizers (hf encoder)": HfEncoder(tok.backend),
                                   "word cache, starting empty": WordCacheEncoder(tok.backend)}
    for backend in ("hf", "auto"):
        encoders[f"feedline {backend} (mlm 128), cache empty"] = _LoaderRun(loader_spec(tokenizer, corpus, backend))
    runs: dict[str, list[float]] = {name: [] for name in encoders}
    cpu: dict[str, list[float]] = {name: [] for name in encoders}
    counts: dict[str, int] = {}
    for _ in range(rounds):
        for name, enc in encoders.items():
            clear = getattr(enc, "clear", None)
            if clear is not None:
                clear()
            t0, c0, tokens = time.perf_counter(), time.process_time(), 0
            if isinstance(enc, _LoaderRun):
                tokens = enc()
            else:
                for i in range(0, len(texts), 64):
                    tokens += len(enc.encode_flat(texts[i:i + 64])[0])  # type: ignore[attr-defined]
            runs[name].append(tokens / (time.perf_counter() - t0))
            counts[name] = tokens
            cpu[name].append((time.process_time() - c0) / tokens * 1e6)
    base = statistics.median(runs["tokenizers (hf encoder)"])
    return [{"contender": name, "tokens_per_s": statistics.median(rs), "ratio": statistics.median(rs) / base,
             "cpu_s_per_mtok": statistics.median(cpu[name]), "tokens": counts[name], "chars": sum(map(len, texts)),
             "runs": ", ".join(f"{r / 1e6:.2f}M" for r in rs)} for name, rs in runs.items()]


class _LoaderRun:
    """One loader pass over a spec's corpus, its word cache (if any) emptied first; returns real tokens."""

    def __init__(self, spec: dict[str, object]) -> None:
        self.spec = spec

    def __call__(self) -> int:
        import feedline

        tokens = 0
        with feedline.Loader(self.spec) as loader:
            clear = getattr(getattr(loader.pipeline.tokenizer.encoder, "fast", None), "clear", None)
            if clear is not None:
                clear()
            for batch in loader:
                tokens += int(batch["attention_mask"].sum())
        return tokens


def fast_backends(tokenizer: str) -> list[str]:
    """The fast encoders that pass their load-time verification for ``tokenizer``."""
    from feedline._tokenize.check import verdict_future
    from feedline._tokenize.load import load_tokenizer

    tok = load_tokenizer(tokenizer)
    return [kind for kind in ("fastokens", "wordcache") if verdict_future(tok, kind).result().fast is not None]  # type: ignore[arg-type]


def encoder_contenders(tokenizer: str, texts: list[str], backends: list[str]) -> dict[str, Callable[[], int]]:
    import tokenizers

    from feedline._tokenize.backends import with_backend
    from feedline._tokenize.load import load_tokenizer

    raw = tokenizers.Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    raw.no_padding()
    raw.no_truncation()
    chunks = [texts[i:i + CHUNK] for i in range(0, len(texts), CHUNK)]
    tok = load_tokenizer(tokenizer)

    def raw_tokenizers() -> int:
        return sum(len(e) for c in chunks for e in raw.encode_batch_fast(c, add_special_tokens=False))

    def encoder(backend: str) -> Callable[[], int]:
        def run() -> int:
            view = with_backend(tok, backend)  # a fresh verification window per run, as per pipeline
            clear = getattr(getattr(view.encoder, "fast", None), "clear", None)
            if clear is not None:  # and an empty word cache: every run pays for its misses
                clear()
            return sum(len(ids) for c in chunks for ids in view.encode_batch(c))
        return run

    out: dict[str, Callable[[], int]] = {"raw tokenizers": raw_tokenizers}
    if "fastokens" in backends:
        import fastokens

        fast = fastokens.Tokenizer.from_json_str(raw.to_str())

        def raw_fastokens() -> int:
            return sum(len(fast.encode_batch_flat(c, add_special_tokens=False)[0]) // 4 for c in chunks)

        out["raw fastokens"] = raw_fastokens
    out.update({f"encoder {b}": encoder(b) for b in backends})
    return out


def loader_spec(tokenizer: str, corpus: Path, backend: str) -> dict[str, object]:
    """CLM packed 1024 rows, or MLM padded 128 rows for a tokenizer with a mask token (BERT)."""
    with open(Path(tokenizer) / "tokenizer.json", encoding="utf-8") as f:
        masked = any(t.get("content") in ("[MASK]", "<mask>") for t in json.load(f).get("added_tokens", []))
    task, batching = (({"kind": "mlm", "max_length": 128}, {"strategy": "pad", "batch_size": 64}) if masked else
                      ({"kind": "clm", "max_length": 1024}, {"strategy": "pack", "batch_size": 64}))
    return {"sources": [{"path": str(corpus)}], "tokenizer": {"path": tokenizer, "backend": backend},
            "task": task, "batching": batching}


def loader_contender(spec: dict[str, object], digests: dict[str, str], key: str) -> Callable[[], int]:
    """The loader on ``spec``; records a digest of every batch's arrays in ``digests[key]``."""
    def run() -> int:
        import feedline

        tokens, h = 0, hashlib.sha256()
        with feedline.Loader(spec) as loader:
            for batch in loader:
                tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(batch["seq_lens"].sum())
                for name in sorted(batch):
                    h.update(name.encode())
                    h.update(np.ascontiguousarray(batch[name]).tobytes())
        digests[key] = h.hexdigest()
        return tokens
    return run


def bench_tokenizer(tokenizer: str, corpus: Path, texts: list[str], rounds: int) -> dict[str, object]:
    """Every contender of one tokenizer, ``rounds`` interleaved rounds; rows of medians and digests."""
    backends = ["hf", *fast_backends(tokenizer), "auto"]
    contenders = encoder_contenders(tokenizer, texts, backends)
    digests: dict[str, str] = {}
    for backend in backends:
        spec = loader_spec(tokenizer, corpus, backend)
        task = spec["task"]
        label = f"{task['kind']} {task['max_length']}"  # type: ignore[index]
        contenders[f"feedline {backend} ({label})"] = loader_contender(spec, digests, backend)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for _ in range(rounds):
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
    unique = bench_unique(tokenizer, rounds) if "wordcache" in backends else None
    return {"tokenizer": Path(tokenizer).name, "backends": backends, "rows": rows, "runs": runs, "digests": digests,
            "identical": len(set(digests.values())) == 1, "unique": unique}


def bench_sentencepiece(texts: list[str], rounds: int) -> list[dict[str, object]]:
    """Per ``.model`` file: the converted pipeline (``hf``) vs ``backend: sentencepiece``, interleaved rounds."""
    import sentencepiece

    from feedline._tokenize.backends import with_backend
    from feedline._tokenize.load import load_tokenizer

    chunks = [texts[i:i + CHUNK] for i in range(0, len(texts), CHUNK)]
    rows: list[dict[str, object]] = []
    for model in sorted((DATA / "tokenizers").glob("*/*.model")):
        tok = load_tokenizer(str(model))
        ref = sentencepiece.SentencePieceProcessor(model_file=str(model))
        views = {b: with_backend(tok, b) for b in ("hf", "sentencepiece")}
        runs: dict[str, list[float]] = {b: [] for b in views}
        differ: dict[str, int] = {b: 0 for b in views}
        for r in range(rounds):
            for b, view in views.items():
                t0, tokens = time.perf_counter(), 0
                for c in chunks:
                    got = view.encode_batch(c)
                    tokens += sum(map(len, got))
                    if r == 0:
                        differ[b] += sum(g.tolist() != w for g, w in zip(got, ref.encode(c), strict=True))
                runs[b].append(tokens / (time.perf_counter() - t0))
        base = statistics.median(runs["hf"])
        for b, rs in runs.items():
            rows.append({"model": model.parent.name, "contender": f"encoder {b}", "tokens_per_s": statistics.median(rs),
                         "ratio": statistics.median(rs) / base, "differ": differ[b],
                         "runs": ", ".join(f"{x / 1e6:.2f}M" for x in rs)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=8, help="megabytes of real text (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are shown (default 3)")
    ap.add_argument("--tokenizer", action="append", help="a tokenizer directory, repeatable (default: GPT-2 and BERT)")
    args = ap.parse_args(argv)
    require_data()
    corpus = prose_corpus(args.mb)
    texts = load_texts(corpus)
    load_before = os.getloadavg()
    results = [bench_tokenizer(t, corpus, texts, args.rounds) for t in args.tokenizer or [str(GPT2), str(BERT)]]
    info = machine()
    info["load_avg_before"], info["load_avg_after"] = load_before, os.getloadavg()
    for res in results:
        print(f"# encoder backends, {res['tokenizer']}, {args.mb:g} MB of real text ({len(texts):,} texts), "
              f"{args.rounds} interleaved rounds, medians\n")
        print(table(res["rows"], [("contender", "contender", ""), ("tokens_per_s", "tokens/s", ",.0f"),  # type: ignore[arg-type]
                                  ("ratio", "/ raw tokenizers", ".2f"), ("cpu_s_per_mtok", "CPU s / M tok", ".3f"),
                                  ("tokens", "tokens", ","), ("runs", "runs", "")]))
        print(f"\nbatches (every array of every batch): {', '.join(res['backends'])} are "  # type: ignore[arg-type]
              f"{'identical' if res['identical'] else 'DIFFERENT: ' + str(res['digests'])}\n")
        if res["unique"]:
            rows = res["unique"]
            print(f"unique text, each once ({rows[0]['chars']:,} characters, {rows[0]['tokens']:,} tokens), "  # type: ignore[index]
                  f"{res['tokenizer']}, medians of {args.rounds}:\n")
            print(table(rows, [("contender", "encoder", ""), ("tokens_per_s", "tokens/s", ",.0f"),  # type: ignore[arg-type]
                               ("ratio", "/ tokenizers", ".2f"), ("cpu_s_per_mtok", "CPU s / M tok", ".3f"),
                               ("tokens", "tokens", ","), ("runs", "runs", "")]))
            print()
    spm_rows = bench_sentencepiece(texts, args.rounds) if (DATA / "tokenizers").is_dir() else []
    if spm_rows:
        print(f"# SentencePiece .model files, {len(texts):,} texts, medians of {args.rounds}: converted pipeline (hf) "
              "vs sentencepiece\n")
        print(table(spm_rows, [("model", "model", ""), ("contender", "contender", ""),  # type: ignore[arg-type]
                               ("tokens_per_s", "tokens/s", ",.0f"), ("ratio", "/ converted", ".2f"),
                               ("differ", "texts != sentencepiece", ","), ("runs", "runs", "")]))
        print()
    print(f"machine: {info['cpu']}, {info['cores']} cores; load average before {load_before[0]:.2f}, "
          f"after {info['load_avg_after'][0]:.2f} (1 min)")
    identical = all(res["identical"] for res in results)
    save_json("backends", {"machine": info, "command": "python bench/backends.py " + " ".join(argv or sys.argv[1:]),
                           "tokenizers": results, "identical": identical,
                           "rows": results[0]["rows"], "digests": results[0]["digests"], "sentencepiece": spm_rows})
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
