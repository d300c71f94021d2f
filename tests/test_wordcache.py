"""The word cache (``backend: wordcache``): ``tokenizers``' ids per distinct word, exact by construction
and by check, on real BERT, on WordPiece tokenizers trained here, and refused where it cannot be exact."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import models, normalizers, pre_tokenizers, trainers

from conftest import shared
from feedline import Loader
from feedline._tokenize import backends, check, wordcache
from feedline._tokenize.backends import HfEncoder, VerifiedEncoder, with_backend
from feedline._tokenize.load import load_tokenizer
from feedline._tokenize.verification import verification_corpus
from feedline._tokenize.wordcache import WordCacheEncoder, wordcache_refusal
from feedline.errors import TokenizerDivergence, TokenizerError
from feedline.testing import assert_batches_equal, collect

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("wordcache")

# Texts where splitting at whitespace could go wrong, beside real prose.
EDGE = [
    "", "   ", "\n\t\r\n", "Hello, world! It's 3.14 (or so)...", "UPPER lower MiXeD Ünïcödé naïve café",
    "a\x0bb c\x0cd e\x1cf g\x1dh i\x1ej k\x1fl m\x85n", "o\x00p q\x7fr s\x9ft u\ufffdv", "zero\u200bwidth soft\u00adhyphen",
    "nbsp\u00a0here ideographic\u3000space thin\u2009space line\u2028sep", "e \u0301x combining \u0301\u0302 marks",
    "中文分词没有空格 日本語 한국어", "emoji 😀👍🏽 👨‍👩‍👧", "x" * 150 + " " + "long" * 40,
    "[MASK] glued[MASK]to [CLS]words[SEP] [mask] [ MASK ] [PAD][UNK]", "ﬁ ﬂ ① ½ ¨ ⑵",
]


def _prose(n: int = 300) -> list[str]:
    texts = [json.loads(line)["text"] for line in shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()]
    return texts[:n] + shared("prose", "wiki_demo.txt").read_text(encoding="utf-8").split("\n\n")[:n]


def _same(enc: WordCacheEncoder, hf: HfEncoder, texts: list[str], special: bool = False) -> None:
    flat, bounds = enc.encode_flat(texts, special)
    want = hf.encode_batch(texts, special)
    assert len(bounds) == len(texts) + 1 and flat.dtype == np.int32
    for i, w in enumerate(want):
        assert flat[bounds[i]:bounds[i + 1]].tolist() == w.tolist(), repr(texts[i][:80])


@pytest.mark.slow
def test_bert_ids_are_those_of_tokenizers_on_real_prose_and_edge_text(bert_path: str) -> None:
    tok = load_tokenizer(bert_path)
    enc, hf = WordCacheEncoder(tok.backend), HfEncoder(tok.backend)
    texts = EDGE + _prose()
    for start in range(0, len(texts), 37):  # cold, then ever warmer: misses and hits mixed in one call
        _same(enc, hf, texts[start:start + 37])
    assert len(enc) > 5_000
    _same(enc, hf, texts)  # all warm
    _same(enc, hf, EDGE, special=True)  # [CLS] ... [SEP]: the post-processor, through tokenizers
    ids = enc.encode_batch(["Hello world!"])[0]
    ids[0] = 0  # arrays are writable, like the other encoders'


def test_without_its_whole_text_rules_it_would_differ(bert_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The characters str.split treats as whitespace and BERT deletes, and literal special tokens, are
    what the whole-text fallback is for: without it the verification corpus catches the difference."""
    tok = load_tokenizer(bert_path)
    hf = HfEncoder(tok.backend)
    assert check._compare(tok, WordCacheEncoder(tok.backend)).fast is not None
    monkeypatch.setattr(wordcache, "SPLIT_ONLY_IN_PYTHON", ())
    assert WordCacheEncoder(tok.backend).encode_batch(["a\x0bb"])[0].tolist() != hf.encode_batch(["a\x0bb"])[0].tolist()
    assert "verification failed" in check._compare(tok, WordCacheEncoder(tok.backend)).reason


def test_an_added_token_across_words_sends_its_texts_to_tokenizers_whole(tmp_path: Path) -> None:
    """tokenizers matches added tokens in the raw text first, across whitespace ('new york' is one
    token): a text holding one is encoded whole; a cache blind to them would split it."""
    path = _wordpiece(tmp_path, normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer(),
                      [tokenizers.AddedToken("new york", normalized=False)])
    tok = load_tokenizer(path)
    hf = HfEncoder(tok.backend)
    text = ["we flew to new york, then home"]
    assert WordCacheEncoder(tok.backend).encode_batch(text)[0].tolist() == hf.encode_batch(text)[0].tolist()
    blind = WordCacheEncoder(tok.backend, added=[])
    assert blind.encode_batch(text)[0].tolist() != hf.encode_batch(text)[0].tolist()
    assert "verification failed" in check._compare(tok, blind).reason
    assert with_backend(tok, "wordcache").encoder.name == "wordcache"


@pytest.mark.parametrize(("name", "why"), [
    ("bert-base-uncased", None),
    ("gpt2", "pre-tokenizer ByteLevel"),
    ("t5", "normalizer Precompiled"),
    ("qwen2.5", "pre-tokenizer Split"),  # NFC is allowed; the Split regex may cross whitespace
])
@pytest.mark.slow
def test_refusal_names_what_stands_in_the_way(name: str, why: str | None) -> None:
    path = shared("tokenizers", name, "tokenizer.json")
    got = wordcache_refusal(path.read_text(encoding="utf-8"))
    if why is None:
        assert got is None
    else:
        assert got is not None and why.split()[-1] in got, got


def test_refusal_of_shapes_it_cannot_keep_exact() -> None:
    base = {"normalizer": {"type": "BertNormalizer"}, "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {"type": "WordPiece"}, "added_tokens": []}
    assert wordcache_refusal(base) is None
    seq = {**base, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Digits"}]}}
    assert wordcache_refusal(seq) is None
    assert "does not split at whitespace" in str(wordcache_refusal({**base, "pre_tokenizer": {"type": "Digits"}}))
    assert "Metaspace" in str(wordcache_refusal({**base, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Metaspace"}]}}))
    assert "dropout" in str(wordcache_refusal({**base, "model": {"type": "BPE", "dropout": 0.1}}))
    late = {**base, "added_tokens": [{"content": "<ent>", "normalized": True}]}
    assert "'<ent>' is matched after normalization" in str(wordcache_refusal(late))


def _wordpiece(tmp: Path, normalizer: normalizers.Normalizer, pre: pre_tokenizers.PreTokenizer,
               added: list[tokenizers.AddedToken]) -> str:
    """A WordPiece tokenizer trained here on real prose (or generated text), saved as a directory."""
    from feedline.testing import make_corpus

    make_corpus(tmp / "c", files=1, docs=300)
    texts = [json.loads(line)["text"] for f in sorted((tmp / "c").iterdir()) for line in f.read_text().splitlines()]
    tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=600, special_tokens=[
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    tok.add_tokens(added)
    out = tmp / "tok"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    return str(out)


def _mlm(tok: object, corpus: str, backend: str) -> dict:
    return {"sources": [{"path": corpus}], "tokenizer": {"path": tok, "backend": backend},
            "task": {"kind": "mlm", "max_length": 64}, "batching": {"strategy": "pad", "batch_size": 8},
            "shuffle": {"buffer": 32}, "seed": 5}


def test_auto_takes_a_trained_wordpiece_and_gives_the_batches_of_hf(tmp_path: Path, corpus: str,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    path = _wordpiece(tmp_path, normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()]),
                      pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]),
                      [tokenizers.AddedToken("<ent>", normalized=False)])
    monkeypatch.setattr(backends, "WINDOW_CHARS", 2_000)  # most ids from the cache, spot checks every call
    monkeypatch.setattr(backends, "SPOT_EVERY", 1)
    assert check.verdict_future(load_tokenizer(path), "auto").result().fast is not None
    want = collect(Loader(_mlm(path, corpus, "hf")))
    with caplog.at_level(logging.INFO, logger="feedline.tokenize"):
        loader = Loader(_mlm(path, corpus, "auto"))
        got = collect(loader)
    assert loader.pipeline.tokenizer.encoder.name == "wordcache"
    assert "encoding with wordcache" in caplog.text
    assert len(want) > 5
    assert_batches_equal(want, got, where="trained wordpiece: auto vs hf")


def test_a_tokenizer_it_cannot_take_falls_back_or_is_refused(tmp_path: Path) -> None:
    path = _wordpiece(tmp_path, normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer(),
                      [tokenizers.AddedToken("<ent>", normalized=True)])
    tok = load_tokenizer(path)
    assert with_backend(tok, "auto").encoder.name == "hf"
    with pytest.raises(TokenizerError, match="backend: wordcache: not for this tokenizer: its added token '<ent>'"):
        with_backend(tok, "wordcache")


@pytest.mark.slow
def test_mlm_batches_on_real_prose_are_those_of_hf_and_resume_exactly(bert_path: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "prose.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _prose(120) + EDGE), encoding="utf-8")
    monkeypatch.setattr(backends, "WINDOW_CHARS", 10_000)
    monkeypatch.setattr(backends, "SPOT_EVERY", 2)
    want = collect(Loader(_mlm(bert_path, str(path), "hf")))
    loader = Loader(_mlm(bert_path, str(path), "wordcache"))
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    state = loader.state_dict()
    loader.close()
    again = Loader(_mlm(bert_path, str(path), "wordcache"))
    again.load_state_dict(state)
    tail = collect(again)
    assert again.pipeline.tokenizer.encoder.name == "wordcache"
    assert_batches_equal(want, head + tail, where="bert mlm: wordcache (resumed at 7) vs hf")


@pytest.mark.slow
def test_the_cache_stays_bounded(bert_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wordcache, "CACHE_WORDS", 500)
    tok = load_tokenizer(bert_path)
    enc, hf = WordCacheEncoder(tok.backend), HfEncoder(tok.backend)
    texts = _prose(80)
    sizes = []
    for start in range(0, len(texts), 10):
        _same(enc, hf, texts[start:start + 10])
        sizes.append(len(enc))
    assert max(sizes) <= 500
    assert len({w for t in texts for w in t.split()}) > 5 * 500  # it had to start over, and stayed exact


def test_a_wrong_cached_word_is_caught_at_run_time(bert_path: str) -> None:
    """A cache that went wrong (here: poisoned on purpose) is a divergence: inside the data window
    auto falls back with tokenizers' ids, a required wordcache raises, and a spot check raises."""
    tok = load_tokenizer(bert_path)
    hf = HfEncoder(tok.backend)

    def poisoned() -> WordCacheEncoder:
        enc = WordCacheEncoder(tok.backend)
        enc.encode_batch(["the river"])
        river = hf.encode_batch(["river"])[0]
        enc._cache["river"] = (river + 1).tobytes()  # the next word of the vocabulary
        return enc

    auto = VerifiedEncoder(hf, poisoned(), strict=False, label="bert", window=1_000)
    assert [a.tolist() for a in auto.encode_batch(["over the river"])] == [hf.encode_batch(["over the river"])[0].tolist()]
    assert auto.name == "hf"
    strict = VerifiedEncoder(hf, poisoned(), strict=True, label="bert", window=1_000)
    with pytest.raises(TokenizerDivergence, match="wordcache and tokenizers encode 'over the river' differently"):
        strict.encode_batch(["over the river"])
    late = VerifiedEncoder(hf, poisoned(), strict=False, label="bert", window=0, spot_every=1)
    with pytest.raises(TokenizerDivergence, match="batches already delivered may hold wordcache ids"):
        late.encode_batch(["over the river"])


def test_the_verification_corpus_holds_the_characters_the_cache_must_not_split_at(bert_path: str) -> None:
    joined = "".join(verification_corpus(load_tokenizer(bert_path)))
    assert all(c in joined for c in wordcache.SPLIT_ONLY_IN_PYTHON)


@pytest.mark.slow
def test_streams_share_one_cache_from_several_threads(bert_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stream of a process encodes through the one verified cache: threads filling and
    restarting it at once still get tokenizers' ids."""
    import concurrent.futures as cf

    monkeypatch.setattr(wordcache, "CACHE_WORDS", 2_000)  # restarts while the others read
    tok = load_tokenizer(bert_path)
    enc, hf = WordCacheEncoder(tok.backend), HfEncoder(tok.backend)
    texts = _prose(150) + EDGE
    chunks = [texts[i:i + 7] for i in range(0, len(texts), 7)]
    with cf.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda c: [a.tolist() for a in enc.encode_batch(c)], chunks * 3))
    want = [[a.tolist() for a in hf.encode_batch(c)] for c in chunks] * 3
    assert got == want
