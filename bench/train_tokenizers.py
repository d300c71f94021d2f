"""Tokenizer trainers compared: ``tokenizers`` vs ``sentencepiece``, Unigram and BPE, on a word-count TSV.

    python bench/train_tokenizers.py [--mb 40] [--vocab-size 32000] [--limit 900] [--only spm-unigram,...]

Builds a ~40 MB English corpus from ../shared/data/prose (KJV, Wikipedia, C4, Botchan), repeated
with varied word forms (deterministic prefixes/suffixes on most words of each later copy, so
the vocabulary grows as in a real 40 MB crawl: ~720k distinct words), counts its words into a
``word<TAB>count`` TSV (``feedline count-tokens``), and times each trainer on that TSV through
``feedline train-tokenizer``:

  tok-unigram / tok-bpe   --format tokenizers (counts expanded to text, as that trainer needs)
  spm-unigram / spm-bpe   --format sentencepiece (counts passed as weights, input_format=tsv)

Each run is a subprocess timed by wall clock and killed after ``--limit`` seconds (reported as
">limit"). Run it on an idle machine; the trainers use every core.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "prose"
PREFIXES = ("un", "re", "pre", "over", "counter", "mis", "out", "sub", "inter", "non")
SUFFIXES = ("s", "ed", "ing", "er", "ly", "ness", "ful", "less", "ish", "able", "ment", "ism", "ist", "ward")


def base_text() -> str:
    with gzip.open(SHARED / "kjv_bible_verses.txt.gz", "rt", encoding="utf-8") as f:
        kjv = f.read()
    parts = [kjv, (SHARED / "wiki_demo.txt").read_text(encoding="utf-8"),
             (SHARED / "botchan.txt").read_text(encoding="utf-8")]
    with open(SHARED / "c4_demo.jsonl", encoding="utf-8") as f:
        parts.append("\n".join(json.loads(line)["text"] for line in f))
    return "\n".join(parts)


def vary(word: str, copy: int, salt: int = 0) -> str:
    """A deterministic variant of ``word`` in ``copy`` (copy 0, short words and ~15% of words stay)."""
    if copy == 0 or len(word) < 3:
        return word
    h = zlib.crc32(f"{copy}:{salt}:{word}".encode())
    if h % 100 < 15:
        return word
    pre = PREFIXES[(h >> 8) % len(PREFIXES)] if h & 0x10 else ""
    suf = SUFFIXES[(h >> 12) % len(SUFFIXES)] if h & 0x20 or not pre else ""
    if h & 0x40:
        suf += SUFFIXES[(h >> 20) % len(SUFFIXES)]
    return pre + word + suf


def build_corpus(path: Path, mb: int) -> None:
    text = base_text()
    lines = text.splitlines()
    written, copy = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < mb << 20:
            for i, line in enumerate(lines):
                out = " ".join(vary(w, copy, i % 31) for w in line.split()) + "\n"
                f.write(out)
                written += len(out.encode())
                if written >= mb << 20:
                    break
            copy += 1


def train(kind: str, fmt: str, tsv: Path, out: Path, vocab: int, limit: float) -> float | None:
    cmd = [sys.executable, "-m", "feedline", "train-tokenizer", str(tsv), "-o", str(out), "--kind", kind,
           "--format", fmt, "--vocab-size", str(vocab), "--no-progress"]
    t0 = time.perf_counter()
    try:
        subprocess.run(cmd, check=True, timeout=limit, capture_output=True)
    except subprocess.TimeoutExpired:
        return None
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=40)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--limit", type=float, default=900.0, help="seconds before a trainer run is killed")
    p.add_argument("--only", default="spm-unigram,spm-bpe,tok-bpe,tok-unigram")
    p.add_argument("--keep", help="keep the corpus and TSV in this directory")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.keep or d)
        tmp.mkdir(parents=True, exist_ok=True)
        corpus, tsv = tmp / "corpus.txt", tmp / "counts.tsv"
        if not tsv.exists():
            build_corpus(corpus, args.mb)
            subprocess.run([sys.executable, "-m", "feedline", "count-tokens", str(corpus), "--format", "text",
                            "-o", str(tsv), "--no-progress"], check=True, capture_output=True)
        with open(tsv, encoding="utf-8") as f:
            words = sum(1 for _ in f)
        size = corpus.stat().st_size / 1e6 if corpus.exists() else float("nan")
        print(f"corpus {size:.1f} MB, {words:,} distinct words in {tsv.name}")
        for name in args.only.split(","):
            lib, kind = name.split("-")
            fmt = "sentencepiece" if lib == "spm" else "tokenizers"
            secs = train(kind, fmt, tsv, tmp / name, args.vocab_size, args.limit)
            print(f"{name:<12} {'>' + str(int(args.limit)) if secs is None else f'{secs:.1f}':>8} s", flush=True)


if __name__ == "__main__":
    main()
