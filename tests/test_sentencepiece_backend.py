"""``backend: sentencepiece``: every ``.model`` in ``../shared/data/tokenizers`` encodes exactly like
``sentencepiece.encode`` on real prose and adversarial text (0 differences), and ``auto`` picks it."""

from __future__ import annotations

import gzip
import itertools
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import zstandard

from conftest import shared
from feedline import MissingDependency, TokenizerError, load_tokenizer
from feedline._tokenize.backends import with_backend
from heavy import lazy, needs

spm = lazy("sentencepiece")
pytestmark = needs("sentencepiece")

# A Bulgarian paragraph (written for this test); repeated past 7,900 characters below.
_BG = ("Григорианският календар е въведен от папа Григорий XIII през 1582 година. В България той "
       "влиза в сила през 1916 година, когато след 31 март следва 14 април. Преходът засяга "
       "църковните празници, данъците и сроковете на договорите, а вестниците обясняват промяната. ")


def _models() -> list[Path]:
    found = sorted(shared("tokenizers").glob("*/*.model"))
    assert found, "no .model files under ../shared/data/tokenizers"
    return found


def _real() -> list[str]:
    """The prose corpora: Botchan lines, the Wikipedia articles, C4, the first 100 40-verse pieces of
    the KJV, the naughty strings as documents and as lines (~2.3 MB)."""
    prose = shared("prose")
    docs = [x for x in (prose / "botchan.txt").read_text(encoding="utf-8-sig").split("\n") if x]
    docs += [x for x in (prose / "wiki_demo.txt").read_text(encoding="utf-8").split("\n") if x]
    docs += [json.loads(x)["text"] for x in (prose / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()]
    with gzip.open(prose / "kjv_bible_verses.txt.gz", "rt", encoding="utf-8") as fh:
        verses = fh.read().split("\n")
    docs += ["\n".join(verses[i:i + 40]) for i in range(0, 4000, 40)]
    raw = zstandard.ZstdDecompressor().stream_reader((prose / "pile" / "lm_dataformat_blns.jsonl.zst").open("rb")).read()
    blns = [t for t in (json.loads(x)["text"] for x in raw.decode().splitlines()) if isinstance(t, str)]
    return docs + blns + blns[0].split("\n")


def _adversarial() -> list[str]:
    """Combining marks, ties, control characters, empty and blank texts, spelled control pieces,
    long paragraphs (> 7,900 characters) and 2,000 seeded random strings over mixed scripts."""
    fixed = ["", " ", "   ", "\n", "\t\t", "a\u0301\u0301b", "e\u0301\u0302\u0303", "\u0301", "x\u20dd\u20dd",
             "Hotta.......", ".......", "!!!!!!!", "------", "\x00\x01a\x02", "\x7f\x1b[0m", "a\u200bb\u200d",
             "<s>[INST] Hi [/INST]</s>", "<unk><pad>", "\ufeffBOM", "ǅ ﬁ ｆｕｌｌ ①", "\U0001f916\U0001f3fd", "日本語の文",
             _BG * 30, ("Lorem ipsum dolor sit amet. " * 300), ("Ab" * 4000), _BG.replace(" ", "") * 20]
    rng = random.Random(27)
    alphabet = ("abcdeéñ ABCZ 0189 .,;!?-'\"()[]<>/ \t\n" "аеиоуБГДЖЗ" "αβγΩ" "אבג" "ابت" "中文字日本" "한국"
                "\u0301\u0308\u0327\u20dd" "\u200b\u00a0\u3000" "\x00\x07\x1f" "🤖👍🏽")
    rand = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(2000)]
    return fixed + rand


def _differences(got: list[np.ndarray], want: list[list[int]]) -> list[int]:
    assert len(got) == len(want)
    return [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if len(a) != len(b) or not np.array_equal(a, b)]


@pytest.mark.parametrize("corpus", [pytest.param("real", marks=pytest.mark.slow), "adversarial"])
def test_every_model_encodes_exactly_like_sentencepiece(corpus: str) -> None:
    texts = _real() if corpus == "real" else _adversarial()
    assert any(len(t) > 7900 for t in texts)
    for model in _models():
        sp = spm.SentencePieceProcessor(model_file=str(model))
        tok = with_backend(load_tokenizer(str(model)), "sentencepiece")
        assert tok.encoder.name == "sentencepiece"
        bos = sp.bos_id() >= 0
        want = sp.encode(texts)
        assert _differences(tok.encode_batch(texts), want) == [], model
        flat, bounds = tok.encode_batch_flat(texts)
        assert flat.dtype == np.int32 and bounds.tolist() == np.cumsum([0] + [len(x) for x in want]).tolist()
        assert np.array_equal(flat, np.fromiter((i for ids in want for i in ids), dtype=np.int32))
        some = texts[::10]  # framed: BOS in front (Mistral) or EOS at the end (T5)
        framed = sp.encode(some, add_bos=bos, add_eos=not bos)
        assert _differences(tok.encode_batch(some, add_special_tokens=True), framed) == [], model


def test_converted_pipeline_differs_where_sentencepiece_backend_does_not() -> None:
    """The reason for the backend: T5's converted Unigram drops repeated combining marks."""
    path = str(shared("tokenizers", "t5", "spiece.model"))
    sp = spm.SentencePieceProcessor(model_file=path)
    tok = load_tokenizer(path)
    assert sp.encode("a\u0301\u0301b") == [3, 2975, 2, 115]
    assert with_backend(tok, "hf").encode("a\u0301\u0301b").tolist() == [3, 2975, 115]
    assert with_backend(tok, "sentencepiece").encode("a\u0301\u0301b").tolist() == [3, 2975, 2, 115]


def test_auto_picks_sentencepiece_for_model_files_only() -> None:
    t5 = load_tokenizer(str(shared("tokenizers", "t5", "spiece.model")))
    assert with_backend(t5, "auto").encoder.name == "sentencepiece"
    assert with_backend(t5, "hf").encoder.name == "hf"
    gpt2 = load_tokenizer(str(shared("tokenizers", "gpt2")))
    assert with_backend(gpt2, "auto").encoder.name != "sentencepiece"
    with pytest.raises(TokenizerError, match=r"backend: sentencepiece needs a SentencePiece \.model file"):
        with_backend(gpt2, "sentencepiece")


def test_sentencepiece_backend_survives_pickling() -> None:
    """How a tokenizer travels to Ray workers and processes: the model's bytes go with it."""
    tok = with_backend(load_tokenizer(str(shared("tokenizers", "mistral-v3", "tokenizer.model"))), "sentencepiece")
    again = pickle.loads(pickle.dumps(tok))
    assert again.encoder.name == "sentencepiece" and again.backend_request == "sentencepiece"
    text = "Héllo  wörld 🤖 <s> a\u0301\u0301b"
    assert again.encode(text).tolist() == tok.encode(text).tolist()


def test_missing_sentencepiece_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    tok = load_tokenizer(str(shared("tokenizers", "t5", "spiece.model")))
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import fails
    with pytest.raises(MissingDependency, match=r"pip install 'feedline\[hf\]'"):
        with_backend(tok, "sentencepiece")
    assert with_backend(tok, "auto").encoder.name != "sentencepiece"


def test_loader_with_sentencepiece_backend_packs_sentencepiece_ids(tmp_path: Path) -> None:
    import feedline

    model = str(shared("tokenizers", "t5", "spiece.model"))
    texts = ["a\u0301\u0301b and more", "Слово за словото. " * 3, "The cat walks in the park."]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    spec = {"sources": [{"path": str(corpus)}], "tokenizer": {"path": model, "backend": "sentencepiece"},
            "task": {"kind": "clm", "max_length": 64},
            "batching": {"strategy": "pack", "batch_size": 4, "remainder": "keep"}}
    got = []
    with feedline.Loader(spec) as loader:
        for b in loader:
            for row, cu in zip(b["input_ids"], b["cu_seqlens"], strict=True):
                got += [tuple(row[s:e].tolist()) for s, e in itertools.pairwise(cu) if e > s]
    sp = spm.SentencePieceProcessor(model_file=model)
    assert sorted(got) == sorted(tuple(sp.encode(t, add_eos=True)) for t in texts)


def test_sentencepiece_threads_keep_to_the_process_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call's num_threads is the share a partition worker sets (RAYON_NUM_THREADS, as the
    ``tokenizers`` pool reads it), 1 where TOKENIZERS_PARALLELISM turns pools off, else every usable
    core: 2 worker processes on 8 cores encode on 4 threads each, not 8 (they used every CPU)."""
    import os

    from feedline._core import cores

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    tok = with_backend(load_tokenizer(str(shared("tokenizers", "t5", "spiece.model"))), "sentencepiece")
    asked: list[int] = []
    real = tok.encoder.sp.encode

    def spy(*args: object, **kw: object) -> object:
        asked.append(int(kw["num_threads"]))  # type: ignore[call-overload]
        return real(*args, **kw)

    monkeypatch.setattr(tok.encoder.sp, "encode", spy)
    want = spm.SentencePieceProcessor(model_file=str(shared("tokenizers", "t5", "spiece.model"))).encode("The cat walks.")
    assert tok.encode("The cat walks.", add_special_tokens=False).tolist() == want
    monkeypatch.setenv("RAYON_NUM_THREADS", str(cores.usable_cores() // 2))  # what processes: 2 gives each worker
    tok.encode("The cat walks.")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    tok.encode("The cat walks.")
    assert asked == [8, 4, 1]
