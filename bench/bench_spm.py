"""SentencePiece ``.model`` files: feedline's conversion against running sentencepiece itself.

    python bench/bench_spm.py [--repeats 3]

For each real ``.model`` in ``../shared/data/tokenizers`` (Mistral v3 BPE with byte fallback, T5
Unigram), on the real prose in ``../shared/data/prose`` (Botchan lines, Wikipedia articles, C4
documents, the Big List of Naughty Strings as documents and as lines), prints:

* exactness: documents and tokens compared with ``SentencePieceProcessor.encode``, documents
  whose ids differ, for feedline's conversion and for transformers' own converter
  (``LlamaTokenizer`` / ``T5Tokenizer.from_pretrained`` on a directory holding only the model);
* throughput (MB/s, median of interleaved repeats) on the same text: feedline's
  ``encode_batch`` (Rust, all cores), sentencepiece ``encode(list, num_threads=cores)`` and
  sentencepiece on one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import zstandard

from feedline._tokenize.load import load_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MODELS = {"mistral-v3 (bpe)": "mistral-v3/tokenizer.model", "t5 (unigram)": "t5/spiece.model"}


def corpora() -> dict[str, list[str]]:
    prose = DATA / "prose"
    raw = zstandard.ZstdDecompressor().stream_reader((prose / "pile" / "lm_dataformat_blns.jsonl.zst").open("rb")).read()
    blns = [t for t in (json.loads(line)["text"] for line in raw.decode().splitlines()) if isinstance(t, str)]
    return {
        "botchan lines": [x for x in (prose / "botchan.txt").read_text(encoding="utf-8").split("\n") if x],
        "wiki articles": [x for x in (prose / "wiki_demo.txt").read_text(encoding="utf-8").split("\n") if x],
        "c4 documents": [json.loads(x)["text"] for x in (prose / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()],
        "blns documents": blns,
        "blns lines": blns[0].split("\n"),
    }


def _transformers_backend(model: str) -> object | None:
    try:
        from transformers import LlamaTokenizer, T5Tokenizer
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if model.endswith("spiece.model"):
            shutil.copy(model, os.path.join(d, "spiece.model"))
            return T5Tokenizer.from_pretrained(d, extra_ids=0).backend_tokenizer
        shutil.copy(model, os.path.join(d, "tokenizer.model"))
        return LlamaTokenizer.from_pretrained(d).backend_tokenizer


def _median_mbs(fn: Callable[[], object], size: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(size / (time.perf_counter() - t0) / 1e6)
    return out


def main() -> None:
    import sentencepiece as spm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    docs = corpora()
    cores = os.cpu_count() or 1
    for label, rel in MODELS.items():
        path = str(DATA / "tokenizers" / rel)
        sp = spm.SentencePieceProcessor(model_file=path)
        ours = load_tokenizer(path)
        theirs = _transformers_backend(path)
        print(f"\n{label}: {rel}")
        print(f"  {'text':16} {'docs':>6} {'tokens':>8} {'feedline: docs differing':>25} {'transformers: docs differing':>29}")
        for name, texts in docs.items():
            ref = sp.encode(texts)
            got = [x.tolist() for x in ours.encode_batch(texts)]
            bad = sum(a != b for a, b in zip(ref, got, strict=True))
            hf = "n/a"
            if theirs is not None:
                alt = [e.ids for e in theirs.encode_batch_fast(texts, add_special_tokens=False)]  # type: ignore[attr-defined]
                hf = str(sum(a != b for a, b in zip(ref, alt, strict=True)))
            print(f"  {name:16} {len(texts):6d} {sum(map(len, ref)):8d} {bad:25d} {hf:>29}")
        texts = [t for name, ts in docs.items() if name != "blns lines" for t in ts]
        size = sum(len(t.encode()) for t in texts)
        runs: dict[str, list[float]] = {"feedline encode_batch": [], f"sentencepiece {cores} threads": [], "sentencepiece 1 thread": []}
        fns: dict[str, Callable[[], object]] = {
            "feedline encode_batch": lambda tok=ours, ts=texts: tok.encode_batch(ts),
            f"sentencepiece {cores} threads": lambda sp=sp, ts=texts: sp.encode(ts, num_threads=cores),
            "sentencepiece 1 thread": lambda sp=sp, ts=texts: sp.encode(ts, num_threads=1),
        }
        for _ in range(args.repeats):  # interleaved, so machine load hits every contender alike
            for name, fn in fns.items():
                runs[name] += _median_mbs(fn, size, 1)
        print(f"  throughput on {size / 1e6:.2f} MB ({len(texts)} documents), median of {args.repeats}, {cores} cores:")
        for name, vals in runs.items():
            print(f"    {name:28} {statistics.median(vals):7.2f} MB/s   ({', '.join(f'{v:.2f}' for v in vals)})")


if __name__ == "__main__":
    main()
