"""T5 span corruption on real text with the real T5 tokenizer: lengths, sentinels, reconstruction."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import shared
from feedline.core.options import build
from feedline.core.record import Record
from feedline.tasks.base import TaskContext
from feedline.tasks.span import SpanCorruption, noise_mask, span_lengths
from feedline.tokenize.load import load_tokenizer


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
def test_real_text_rows(max_length: int) -> None:
    tok = load_tokenizer(str(shared("tokenizers", "t5")))
    task = SpanCorruption(build(SpanCorruption.Options, {"max_length": max_length}, "task"), TaskContext(tok, 7))
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
