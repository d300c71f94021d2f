"""MLM builds a chunk as one block, and the ``pad`` batcher collates blocks: both exactly as per example.

The references here are written one record / one example at a time (the way these stages worked
before): each row framed and masked on its own with the task's per-sample generator, and
:func:`collate_padded` over ``Example`` objects. Real text, the real BERT tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._batching.base import collate_blocks, collate_padded
from feedline._core.block import ExampleBlock
from feedline._core.options import build
from feedline._core.record import Example, Record
from feedline._pipeline import Pipeline
from feedline._spec import Spec
from feedline._tasks.base import TaskContext
from feedline._tasks.mlm import MaskedLM
from feedline._tokenize.load import load_tokenizer

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("mlm_blocks")


@pytest.fixture(scope="module")
def records() -> list[Record]:
    """C4 documents (long: several rows each), short prefixes, and an empty text."""
    lines = shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    texts = [json.loads(line)["text"] for line in lines]
    texts = [t if i % 4 else t[:90] for i, t in enumerate(texts)] + [""]
    return [Record((0, i % 3, 97 * i), i % 2, {"text": t}) for i, t in enumerate(texts)]


def _task(**opts: Any) -> MaskedLM:
    tok = load_tokenizer(str(shared("tokenizers", "bert-base-uncased")))
    return MaskedLM(build(MaskedLM.Options, opts, "task"), TaskContext(tok, 13))


def _reference(task: MaskedLM, rec: Record) -> list[Example]:
    """One record's rows, each framed and masked on its own (``Masker.__call__`` with ``Task.rng``)."""
    opts = task.options
    tok = task.tok
    ids = tok.encode(rec.data["text"])
    words = None
    if opts.whole_word_mask:
        enc = tok.backend.encode(rec.data["text"], add_special_tokens=False)
        words = np.asarray([-1 if w is None else w for w in enc.word_ids], dtype=np.int64)
    body = opts.max_length - 2
    n = 1 if opts.overflow == "truncate" else max(1, -(-len(ids) // body))
    out = []
    for j in range(n):
        row = np.concatenate([[tok.special("cls")], ids[j * body:(j + 1) * body], [tok.special("sep")]]).astype(np.int32)
        w = None if words is None else np.concatenate([[-1], words[j * body:(j + 1) * body], [-1]])
        inp, labels = task.masker(row, task.rng(rec, j), w)
        out.append(Example(rec.key, rec.epoch, j, {"input_ids": inp, "labels": labels,
                                                    "token_type_ids": np.zeros(len(row), np.int32)}))
    return out


@pytest.mark.parametrize("opts", [
    {"max_length": 128},
    {"max_length": 40, "overflow": "truncate"},
    {"max_length": 64, "whole_word_mask": True},
    {"max_length": 48, "masking": "exact", "max_predictions": 5},
])
@pytest.mark.slow
def test_mlm_block_equals_rows_built_one_at_a_time(records: list[Record], opts: dict[str, Any]) -> None:
    task = _task(**opts)
    block = task.process_block(records)
    assert isinstance(block, ExampleBlock) and not block.rejected
    want = [ex for rec in records for ex in _reference(task, rec)]
    assert len(block) == len(want)
    for i, w in enumerate(want):
        got = block[i]
        assert (got.key, got.epoch, got.sub) == (w.key, w.epoch, w.sub)
        assert list(got.fields) == list(w.fields)
        for name in w.fields:
            assert got.fields[name].dtype == w.fields[name].dtype and np.array_equal(got.fields[name], w.fields[name]), name
    assert [len(o) for o in task.process(records)] == [len(_reference(task, r)) for r in records]  # type: ignore[arg-type]


def test_mlm_pairs_and_plug_ins_keep_their_lists(records: list[Record]) -> None:
    """Pairs are built per record; a subclass overriding process() has its lists used."""
    assert isinstance(_task(max_length=64, text_pair="text").process_block(records), list)

    class Shorter(MaskedLM):
        def process(self, records: Any) -> Any:
            return [out[:1] for out in super().process(records)]

    plain = _task(max_length=64)
    sub = Shorter(plain.options, plain.ctx)
    got = sub.process_block(records)
    assert isinstance(got, list) and all(len(out) == 1 for out in got)  # type: ignore[arg-type]


@pytest.mark.parametrize("length, multiple_of, cuts", [
    (None, None, (64,)),
    (None, 8, (3, 50)),
    (40, None, (10, 11, 30)),   # rows longer than 40 are cut
    (None, None, (1,)),
])
def test_collate_blocks_equals_collate_padded(records: list[Record], length: int | None, multiple_of: int | None,
                                              cuts: tuple[int, ...]) -> None:
    task = _task(max_length=128)
    block = task.process_block(records)
    assert isinstance(block, ExampleBlock)
    # a batch taken from several blocks: consecutive slices of the chunk, then a second chunk's block
    other = task.process_block(records[::-1])
    assert isinstance(other, ExampleBlock)
    parts, at = [], 5
    for k in cuts:
        parts.append(block.slice(at, at + k))
        at += k
    parts.append(other.slice(0, 4))
    examples = [p[i] for p in parts for i in range(len(p))]
    pad = task.pad_values
    want = collate_padded(examples, pad, length, multiple_of)
    got = collate_blocks(parts, pad, length, multiple_of)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert np.array_equal(got[name], want[name]), name


def test_pad_batches_from_blocks_equal_one_example_at_a_time(tmp_path: Any) -> None:
    """Same batches and the same state after each, across chunk boundaries (7 rows a batch)."""
    src = tmp_path / "c4.jsonl"
    src.write_text("\n".join(shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:60]) + "\n")
    spec = Spec.load({"sources": [{"path": str(src)}], "tokenizer": str(shared("tokenizers", "bert-base-uncased")),
                      "task": {"kind": "mlm", "max_length": 96}, "seed": 3,
                      "batching": {"strategy": "pad", "batch_size": 7, "pad_to_multiple_of": 8}})
    a, b = iter(Pipeline(spec).batches()), iter(Pipeline(spec).batches())
    b.parent.peek_block = None  # type: ignore[attr-defined]  # the pad batcher then takes one example per next()
    n = 0
    try:
        for got in a:
            want = next(b)
            assert list(got) == list(want)
            for name in want:
                assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
            assert a.get_state() == b.get_state()
            n += 1
        assert next(b, None) is None
    finally:
        a.close()
        b.close()
    assert n > 20
