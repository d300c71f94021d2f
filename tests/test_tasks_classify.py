"""Classification on real data: GoEmotions multi-label rows, BANKING77 names with a collected vocabulary."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import shared
from feedline._core.options import build
from feedline._core.record import Record
from feedline._tasks.base import TaskContext
from feedline._tasks.classify import Classify
from feedline._tokenize.load import load_tokenizer
from feedline._tools.labels import label_vocabulary
from feedline.errors import SpecError
from feedline.testing import collect


def _goemotions_spec(path: Path, **task: object) -> dict:
    return {"sources": [{"path": str(path), "format": "tsv", "header": False, "columns": ["text", "labels", "id"]}],
            "tokenizer": str(shared("tokenizers", "bert-base-uncased")),
            "task": {"kind": "classify", "label": "labels", "multi_label": True, "num_labels": 28, "label_type": "id",
                     "label_separator": ",", "max_length": 64, **task},
            "batching": {"strategy": "pad", "batch_size": 64, "remainder": "keep"}}


@pytest.mark.slow
def test_goemotions_multi_hot_labels_match_the_rows(tmp_path: Path) -> None:
    dev = shared("classification", "goemotions", "dev.tsv")
    with open(dev, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    from feedline import Loader

    loader = Loader(_goemotions_spec(dev))
    batches = collect(loader)
    loader.close()
    labels = np.concatenate([b["labels"] for b in batches])
    assert labels.dtype == np.float32 and labels.shape == (len(rows), 28)
    want = np.zeros((len(rows), 28), np.float32)
    for i, r in enumerate(rows):
        want[i, [int(x) for x in r[1].split(",")]] = 1.0
    assert np.array_equal(labels, want)
    assert (labels.sum(axis=1) > 1).sum() > 500  # rows with several labels are there
    assert batches[0]["input_ids"].shape[0] == 64 and batches[0]["input_ids"].shape[1] <= 64


def test_banking77_names_collected_in_a_first_pass(tmp_path: Path) -> None:
    src = shared("classification", "banking77", "dev.tsv")
    vocab_file = tmp_path / "labels.json"
    spec = {"sources": [{"path": str(src)}], "tokenizer": str(shared("tokenizers", "bert-base-uncased")),
            "task": {"kind": "classify", "label": "label", "max_length": 48, "label_vocab": str(vocab_file)},
            "shuffle": {"buffer": 64}, "batching": {"strategy": "pad", "batch_size": 32, "remainder": "keep"}}
    with open(src, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    names = sorted({r["label"] for r in rows})
    assert label_vocabulary(spec) == names and len(names) == 77
    assert json.loads(vocab_file.read_text()) == names
    from feedline import Loader

    loader = Loader(spec)
    batches = collect(loader)
    loader.close()
    labels = np.concatenate([b["labels"] for b in batches])
    assert labels.dtype == np.int64 and labels.ndim == 1 and len(labels) == len(rows)
    counts = {n: 0 for n in names}
    for r in rows:
        counts[r["label"]] += 1
    assert np.array_equal(np.bincount(labels, minlength=77), [counts[n] for n in names])
    # a saved vocabulary wins over the data (a resumed run keeps its ids even if data changed)
    vocab_file.write_text(json.dumps(list(reversed(names))))
    assert label_vocabulary(spec) == list(reversed(names))


def _task(**opts: object) -> Classify:
    tok = load_tokenizer(str(shared("tokenizers", "bert-base-uncased")))
    return Classify(build(Classify.Options, opts, "task"), TaskContext(tok, 0))


def test_pairs_regression_and_rejections() -> None:
    pair = _task(labels=["no", "yes"], text_pair="q", max_length=12)
    out = pair.process([Record((0, 0, 0), 0, {"text": "a fairly long premise sentence here", "q": "is it long?", "label": "yes"})])
    ex = out[0][0]
    ids, tt = ex.fields["input_ids"], ex.fields["token_type_ids"]
    assert len(ids) == 12 and ids[0] == 101 and (ids == 102).sum() == 2
    assert tt[0] == 0 and tt[-1] == 1 and ex.fields["labels"].dtype == np.int64 and int(ex.fields["labels"]) == 1
    reg = _task(problem_type="regression")
    ex = reg.process([Record((0, 0, 0), 0, {"text": "x", "label": "0.25"})])[0][0]
    assert ex.fields["labels"].dtype == np.float32 and ex.fields["labels"].ndim == 0 and float(ex.fields["labels"]) == 0.25
    single = _task(labels=["a", "b"])
    res = single.process([Record((0, 0, i), 0, d) for i, d in enumerate(
        [{"text": "x", "label": "zzz"}, {"text": "x"}, {"text": "x", "label": ["a", "b"]}, {"text": "x", "label": 1}])])
    assert [getattr(r, "reason", None) for r in res] == ["unknown_label", "missing_label", "bad_label", None]
    assert int(res[3][0].fields["labels"]) == 1
    multi = _task(labels=["a", "b", "c"], multi_label=True)
    ex = multi.process([Record((0, 0, 0), 0, {"text": "x", "label": ["c", "a"]})])[0][0]
    assert ex.fields["labels"].tolist() == [1.0, 0.0, 1.0] and Classify.packable is False
    assert multi.vector_fields == frozenset({"labels"})


def test_option_errors() -> None:
    with pytest.raises(SpecError, match="num_labels"):
        build(Classify.Options, {"labels": ["a"], "num_labels": 3}, "task")
    with pytest.raises(SpecError, match="problem_type"):
        build(Classify.Options, {"problem_type": "regresion"}, "task")
