"""Very long texts are encoded in checked pieces: the ids of the whole text, in bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import shared
from feedline._tokenize import longtext
from feedline._tokenize.load import load_tokenizer


def _prose(chars: int) -> str:
    """Real text (C4 documents and Wikipedia, with newlines, digits, punctuation, non-ASCII), repeated."""
    docs = [json.loads(line)["text"] for line in shared("prose", "c4_demo.jsonl").read_text().splitlines()]
    block = "\n".join(docs) + "\n\n" + shared("prose", "wiki_demo.txt").read_text()
    return (block * (chars // len(block) + 1))[:chars]


@pytest.mark.parametrize("name, cut", [("gpt2", True), ("bert-base-uncased", True), ("llama3-r1-distill", True),
                                       ("qwen2.5", True), ("t5", True), ("mistral-v3", False)])
@pytest.mark.slow
def test_a_long_text_in_pieces_gives_the_ids_of_the_whole(name: str, cut: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte-level BPE (GPT-2, Llama 3, Qwen), WordPiece (BERT) and Unigram (T5) are cut; Mistral's
    (a normalizer prepends '▁' to every text) passes no check and is encoded whole. With and without
    special tokens, beside short texts in one batch."""
    monkeypatch.setattr(longtext, "LONG_CHARS", 100_000)  # the same code on a text 10x shorter than in use
    monkeypatch.setattr(longtext, "PIECE_CHARS", 8_000)
    monkeypatch.setattr(longtext, "GROUP_CHARS", 8_000)
    tok = load_tokenizer(str(shared("tokenizers", name)))
    text = _prose(160_000)
    assert bool(longtext.LongTexts(tok._encode_flat).cuts(text)) == cut
    encode, longest = tok._encode_flat, [0]

    def seen(texts: list[str], specials: bool) -> tuple[np.ndarray, np.ndarray]:
        longest[0] = max(longest[0], *map(len, texts))
        return encode(texts, specials)

    monkeypatch.setattr(tok, "_encode_flat", seen)
    for specials in (False, True):
        texts = ["A short one.", text, "and another"]
        want = [encode([t], specials)[0] for t in texts]
        flat, bounds = tok.encode_batch_flat(texts, add_special_tokens=specials)
        assert (longest[0] <= 32_000) == cut, longest  # the encoder never saw the whole text (where cut)
        got = [flat[bounds[i]:bounds[i + 1]] for i in range(3)]
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (name, specials)
        assert all(np.array_equal(g, w) for g, w in zip(tok.encode_batch(texts, add_special_tokens=specials), want,
                                                        strict=True))


_CHILD = r"""
import json, resource, sys
import feedline
spec = {"sources": [sys.argv[1]], "tokenizer": {"path": sys.argv[2], "backend": sys.argv[3]},
        "task": {"kind": "clm", "max_length": 1024}, "batching": {"strategy": "pack", "batch_size": 8}}
with feedline.Loader(spec) as loader:
    tokens = sum(int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].size for b in loader)
# VmHWM: this program's own peak (ru_maxrss keeps the parent's RSS at the fork across exec on Linux, so a
# test worker grown to 2.4 GB made the child report 2.4 GB whatever it used)
hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
peak_kb = int(hwm[0]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"tokens": tokens, "peak_mb": peak_kb / 1024}))
"""


@pytest.mark.slow  # a 4 MB record through the whole pipeline: ~4-5 CPU s a backend (make test runs it)
@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_one_4_mb_record_stays_under_400_mb(backend: str, tmp_path: Path, gpt2_path: str) -> None:
    """4 MB peaked at 581 MB, 6 MB at 864 MB, 20 MB at 2.7 GB (tokenizers' alignments and tokens for the
    whole text); now ~150-160 MB, ~190 MB and ~0.3-0.4 GB. 4 MB under 400 MB fails the old code by as wide a
    margin as 6 MB under 480 MB did, for two thirds of the CPU (3 MB peaked at 460 MB: too close)."""
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps({"text": _prose(4 << 20)}) + "\n")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), gpt2_path, backend], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["tokens"] > 880_000 and got["peak_mb"] < 400, got
