"""Mixtures, shuffling and bad input through the whole loader: exact resume, exactly once."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from feedline._pipeline import Pipeline
from feedline._records import records
from feedline.errors import RecordError
from feedline.testing import assert_resumes_exactly, make_corpus


@pytest.fixture()
def corpus(tmp_path: Path) -> dict[str, str]:
    """Two sources (JSONL.gz with a bad line, bert text split in byte ranges) and a word-level tokenizer."""
    make_corpus(tmp_path / "a", files=3, docs=30, fmt="jsonl.gz", seed=1)
    bad = tmp_path / "a" / "part-009.jsonl"
    bad.write_bytes(b'{"text": "good one"}\n{broken\n\xff\xfe\n{"text": 5}\n{"other": 1}\n{"text": "  "}\n{"text": "good two"}\n')
    sents = "\n\n".join("\n".join(f"Sentence {d} {k} of the river." for k in range(d % 3 + 1)) for d in range(400))
    (tmp_path / "b.txt").write_text(sents + "\n")
    words = set(sents.split()) | {"good", "one", "two"}
    for p in (tmp_path / "a").glob("*.gz"):
        words |= {w for ln in gzip.decompress(p.read_bytes()).splitlines() for w in json.loads(ln)["text"].split()}
    vocab = {w: i for i, w in enumerate(["[UNK]", "<pad>", "</s>", *sorted(words)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "</s>"])
    tok.save(str(tmp_path / "tok.json"))
    return {"a": str(tmp_path / "a"), "b": str(tmp_path / "b.txt"), "tok": str(tmp_path / "tok.json")}


def _spec(c: dict[str, str], **over: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "seed": 7, "tokenizer": c["tok"],
        "sources": [{"path": c["a"], "weight": 3}, {"path": c["b"], "format": "bert", "weight": 1, "split_bytes": 1 << 16}],
        "shuffle": {"buffer": 64}, "task": {"kind": "clm", "max_length": 32},
        "batching": {"strategy": "pad", "batch_size": 8}, "workers": 1,
    }
    spec.update(over)
    return spec


@pytest.mark.slow
def test_resume_with_shuffle_and_weighted_mixture_is_bit_exact(corpus: dict[str, str]) -> None:
    assert assert_resumes_exactly(_spec(corpus), every=7, check=3) >= 5


@pytest.mark.slow
def test_resume_with_cycle_stopping_and_two_epochs(corpus: dict[str, str]) -> None:
    spec = _spec(corpus, epochs=2, mix={"stopping": "cycle"}, shuffle={"buffer": 16})
    assert assert_resumes_exactly(spec, every=12, check=2, limit=70) >= 5


def test_each_record_is_delivered_exactly_once_and_bad_lines_are_counted(corpus: dict[str, str]) -> None:
    recs = list(records(_spec(corpus)))
    keys = [tuple(r["__key__"]) for r in recs]
    assert len(keys) == len(set(keys))
    assert len(recs) == 90 + 2 + 400  # 3x30 docs, 2 good lines around the bad ones, 400 documents
    assert {"good one", "good two"} <= {r["text"] for r in recs}
    it = iter(Pipeline(_spec(corpus)).mixture)
    list(it)
    assert it.rejected == {"bad_json": 1, "bad_utf8": 1, "not_string": 1, "missing_field": 1, "empty": 1}
    assert it.mix.sources[0].files[-1].endswith("part-009.jsonl")


def test_shuffle_changes_order_but_not_content_and_depends_on_seed(corpus: dict[str, str]) -> None:
    plain = [r["text"] for r in records(_spec(corpus, shuffle=None))]
    a = [r["text"] for r in records(_spec(corpus))]
    b = [r["text"] for r in records(_spec(corpus, seed=8))]
    assert a != plain and a != b
    assert collections.Counter(a) == collections.Counter(plain) == collections.Counter(b)
    assert a == [r["text"] for r in records(_spec(corpus))]


def test_mixture_proportions_follow_weights(corpus: dict[str, str]) -> None:
    spec = _spec(corpus, mix={"stopping": "first_exhausted"}, shuffle=None)
    it = iter(Pipeline(spec).mixture)
    first = [next(it).key[0] for _ in range(80)]
    assert 0.6 < first.count(0) / 80 < 0.9  # weights 3:1
    assert it.proportions[0] == pytest.approx(first.count(0) / 80)


def test_on_error_raise_names_file_line_and_reason(corpus: dict[str, str]) -> None:
    with pytest.raises(RecordError) as e:
        list(records(_spec(corpus, on_error="raise", shuffle=None)))
    assert e.value.reason == "bad_json" and e.value.line == 2 and e.value.path.endswith("part-009.jsonl")
