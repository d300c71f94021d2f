"""T5 span corruption on real text with the real T5 tokenizer: lengths, sentinels, reconstruction,
documents concatenated into full rows (the default) and per document."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import feedline
from conftest import shared
from feedline import Loader
from feedline._core.options import build
from feedline._core.record import Record
from feedline._tasks.base import TaskContext
from feedline._tasks.span import SpanCorruption, noise_mask, span_lengths
from feedline._tokenize.load import load_tokenizer
from feedline.testing import assert_resumes_exactly, collect

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("tasks_span")


@pytest.mark.parametrize(("inputs", "raw", "targets"), [(128, 141, 29), (256, 284, 58), (512, 568, 114), (1024, 1137, 229), (2048, 2274, 456)])
def test_lengths_match_the_reference_table(inputs: int, raw: int, targets: int) -> None:
    assert span_lengths(inputs) == (raw, targets)


def test_density_half_edge_case() -> None:
    assert span_lengths(512, 0.5) == (766, 512)


def test_noise_mask_counts_and_shape() -> None:
    g = np.random.default_rng(0)
    for length in (2, 3, 10, 141, 568):
        m = noise_mask(length, 0.15, 3.0, g)
        assert len(m) == length and not m[0] and m[-1]
        assert m.sum() == min(max(round(length * 0.15), 1), length - 1)


def _docs() -> list[str]:
    return [line for line in shared("prose", "wiki_demo.txt").read_text().splitlines() if line.strip()][:4]


@pytest.mark.parametrize("max_length", [128, 512, 1024])
@pytest.mark.slow
def test_per_document_rows(max_length: int) -> None:
    tok = load_tokenizer(str(shared("tokenizers", "t5")))
    opts = build(SpanCorruption.Options, {"max_length": max_length, "concat_documents": False}, "task")
    task = SpanCorruption(opts, TaskContext(tok, 7))
    raw, targets_len = span_lengths(max_length)
    docs = _docs()
    outs = task.process([Record((0, 0, i), 0, {"text": t}) for i, t in enumerate(docs)])
    assert task.sentinels[0] == tok.backend.token_to_id("<extra_id_0>") == 32099
    eos = tok.special("eos")
    for doc, exs in zip(docs, outs, strict=True):
        ids = tok.encode(doc)
        rebuilt = []
        for j, e in enumerate(exs):
            inp, lab, dec = e.fields["input_ids"], e.fields["labels"], e.fields["decoder_input_ids"]
            chunk = ids[j * raw:(j + 1) * raw]
            if len(chunk) == raw:
                assert len(inp) == max_length and len(lab) == targets_len
            assert inp[-1] == eos and lab[-1] == eos
            assert np.array_equal(dec, np.concatenate([[tok.pad_id], lab[:-1]]))
            in_sent, tg_sent = inp[inp >= 32000], lab[lab >= 32000]
            k = max(1, round(round(0.15 * len(chunk)) / 3))
            assert len(in_sent) == len(tg_sent) == k
            assert np.array_equal(in_sent, 32099 - np.arange(k)) and np.array_equal(tg_sent, in_sent)
            assert lab[0] == 32099 and inp[0] < 32000 and inp[-2] >= 32000
            assert (lab[:-1] < 32000).sum() == round(0.15 * len(chunk))
            # interleave the inputs' kept runs with the targets' noise runs: the raw chunk again
            kept = np.split(inp[:-1], np.flatnonzero(inp[:-1] >= 32000))
            noise = [r[1:] for r in np.split(lab[:-1], np.flatnonzero(lab[:-1] >= 32000))[1:]]
            parts = [kept[0]] + [x for pair in zip(noise, [r[1:] for r in kept[1:]], strict=True) for x in pair]
            rebuilt.append(np.concatenate(parts))
            assert np.array_equal(rebuilt[-1], chunk)
        assert np.array_equal(np.concatenate(rebuilt), ids[:len(np.concatenate(rebuilt))])
        assert len(ids) - len(np.concatenate(rebuilt)) <= 1  # only a 1-token tail can be dropped


def test_too_many_spans_for_the_sentinels() -> None:
    from feedline.errors import TaskError

    tok = load_tokenizer(str(shared("tokenizers", "t5")))
    task = SpanCorruption(build(SpanCorruption.Options, {"max_length": 4096}, "task"), TaskContext(tok, 0))
    with pytest.raises(TaskError, match="sentinels"):
        task.process([Record((0, 0, 0), 0, {"text": "hello world"})])


def _reference_counts(length: int, density: float = 0.15, mean: float = 3.0) -> tuple[int, int]:
    """Noise tokens and spans of T5's ``random_spans_noise_mask(length)`` (written from the reference)."""
    num_noise = int(np.round(float(length) * density))
    num_noise = min(max(num_noise, 1), length - 1)
    num_spans = max(int(np.round(float(num_noise) / mean)), 1)
    return num_noise, num_spans


def _rebuild(inp: np.ndarray, lab: np.ndarray, first: int = 32000) -> np.ndarray:
    """The raw piece again: the inputs' kept runs interleaved with the targets' noise runs."""
    kept = np.split(inp[:-1], np.flatnonzero(inp[:-1] >= first))
    noise = [r[1:] for r in np.split(lab[:-1], np.flatnonzero(lab[:-1] >= first))[1:]]
    return np.concatenate([kept[0]] + [x for pair in zip(noise, [r[1:] for r in kept[1:]], strict=True) for x in pair])


def _verses(tmp: Path, n: int) -> str:
    """The first ``n`` King James verses, one short document each (~30 tokens)."""
    with gzip.open(shared("prose", "kjv_bible_verses.txt.gz"), "rt") as f:
        lines = f.read().splitlines()
    verses = [ln.strip().split(" ", 1)[1] for ln in lines if ln.startswith("  ") and " " in ln.strip()][:n]
    (tmp / "verses.jsonl").write_text("".join(json.dumps({"text": v}) + "\n" for v in verses))
    return str(tmp / "verses.jsonl")


@pytest.mark.parametrize("max_length", [128, 512])
def test_concatenated_rows_are_full_on_short_documents(max_length: int, tmp_path: Path) -> None:
    tok_path = str(shared("tokenizers", "t5"))
    spec = {"sources": [{"path": _verses(tmp_path, 400)}], "tokenizer": tok_path, "seed": 5,
            "task": {"kind": "span", "max_length": max_length},
            "batching": {"strategy": "pad", "batch_size": 8, "remainder": "keep"}}
    tok = load_tokenizer(tok_path)
    eos = tok.special("eos")
    docs = [tok.encode(r["text"]) for r in feedline.records(spec)]
    assert np.mean([len(d) for d in docs]) < 45  # a short-document corpus
    stream = np.concatenate([np.append(d, eos) for d in docs])
    raw, targets_len = span_lengths(max_length)
    noise, spans = _reference_counts(raw)
    rows = [(b["input_ids"][i], b["labels"][i], b["attention_mask"][i]) for b in collect(Loader(spec))
            for i in range(len(b["input_ids"])) if b["attention_mask"][i].any()]
    assert len(rows) == -(-len(stream) // raw) and len(rows) > 10
    rebuilt = []
    for n, (inp, lab, att) in enumerate(rows):
        assert inp.shape == (max_length,) or (n == len(rows) - 1 and len(inp) < max_length)
        real_lab = lab[lab != -100]
        if n < len(rows) - 1:  # every row but the stream's last is full
            assert att.all() and len(real_lab) == targets_len
            assert (inp >= 32000).sum() == (real_lab >= 32000).sum() == spans
            assert (real_lab[:-1] < 32000).sum() == noise
        real_in = inp[att.astype(bool)]
        assert real_in[-1] == eos and real_lab[-1] == eos
        rebuilt.append(_rebuild(real_in, real_lab))
        assert len(rebuilt[-1]) == (raw if n < len(rows) - 1 else len(stream) - n * raw)
    assert np.array_equal(np.concatenate(rebuilt), stream)  # documents + EOS, in order, every token once


@pytest.mark.parametrize(("max_length", "docs"), [(128, 120), (32, 24)])
@pytest.mark.slow
def test_concatenated_rows_resume_exactly(max_length: int, docs: int, tmp_path: Path) -> None:
    """Rows of many short documents (128), and long documents cut over many rows (32)."""
    from feedline.testing import make_corpus

    make_corpus(tmp_path / "prose", files=2, docs=docs // 2, max_words=30 if max_length == 128 else 200)
    spec = {"sources": [{"path": str(tmp_path / "prose")}], "tokenizer": str(shared("tokenizers", "t5")), "seed": 3,
            "task": {"kind": "span", "max_length": max_length}, "shuffle": {"buffer": 8}, "epochs": 2,
            "batching": {"strategy": "pad", "batch_size": 4, "remainder": "keep"}}
    states = collect(Loader(spec), with_states=True)[1]
    carries = [s["pipeline"]["parent"]["carry"] for s in states]
    assert sum(c is not None for c in carries) > len(carries) // 2  # most boundaries fall inside a document
    assert assert_resumes_exactly(spec, every=2, check=2) >= 4


def test_concatenated_rows_refuse_bucketing(tmp_path: Path) -> None:
    from feedline.errors import SpecError

    spec = {"sources": [{"path": _verses(tmp_path, 10)}], "tokenizer": str(shared("tokenizers", "t5")),
            "task": {"kind": "span", "max_length": 64}, "batching": {"strategy": "bucket", "batch_size": 4}}
    with pytest.raises(SpecError, match="concat_documents"):
        collect(Loader(spec))
