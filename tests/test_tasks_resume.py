"""Every task resumes exactly and gives the same batches with 1 and 2 worker threads; infer delivers each record once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import shared
from feedline import Loader
from feedline._tools.predictions import join_predictions
from feedline.errors import SpecError
from feedline.testing import assert_batches_equal, assert_resumes_exactly, collect, make_corpus

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("tasks_resume")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _prose(tmp: Path) -> str:
    make_corpus(tmp / "prose", files=2, docs=12, max_words=200)
    return str(tmp / "prose")


def _chat(tmp: Path) -> str:
    rows = shared("chat", "oasst", "en_100_top_threads.messages.jsonl").read_text().splitlines()[:24]
    (tmp / "chat.jsonl").write_text("\n".join(rows) + "\n")
    return str(tmp / "chat.jsonl")


def _labelled(tmp: Path) -> str:
    lines = []
    for i, line in enumerate((tmp / "prose" / "part-000.jsonl").read_text().splitlines()):
        lines.append(json.dumps({**json.loads(line), "label": ["river", "stone", "garden"][i % 3]}))
    (tmp / "labelled.jsonl").write_text("\n".join(lines) + "\n")
    return str(tmp / "labelled.jsonl")


CASES = {
    "clm": ("gpt2", {"kind": "clm", "max_length": 48, "bos": True, "frame": "piece"}),
    "mlm": ("bert-base-uncased", {"kind": "mlm", "max_length": 48, "whole_word_mask": True}),
    "sop": ("bert-base-uncased", {"kind": "sop", "max_length": 48, "segmenter": "lines"}),
    "span": ("t5", {"kind": "span", "max_length": 64}),
    "classify": ("bert-base-uncased", {"kind": "classify", "max_length": 32}),
    "chat": ("qwen2.5", {"kind": "chat", "max_length": 512}),
    "infer": ("bert-base-uncased", {"kind": "infer", "max_length": 32}),
    "plugin": ("gpt2", {"kind": "plugin_task:ShuffledWords", "max_length": 32}),
}


def _spec(tmp: Path, name: str) -> dict:
    tok, task = CASES[name]
    prose = _prose(tmp)
    source: dict = {"path": prose}
    if name == "chat":
        source = {"path": _chat(tmp), "text": None}
    elif name == "classify":
        source = {"path": _labelled(tmp)}
    spec = {"sources": [source], "tokenizer": str(shared("tokenizers", tok)), "task": task, "seed": 3,
            "batching": {"strategy": "pad", "batch_size": 4, "remainder": "keep"}, "workers": 1}
    if name != "infer":
        spec.update(shuffle={"buffer": 8}, epochs=2)
    return spec


@pytest.fixture
def plugin_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    sys.modules.pop("plugin_task", None)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_resumes_exactly_and_thread_count_does_not_matter(name: str, tmp_path: Path, plugin_path: None) -> None:
    spec = _spec(tmp_path, name)
    assert assert_resumes_exactly(spec, every=3, check=2) >= 3
    one, two = Loader(spec), Loader({**spec, "workers": 2})
    try:
        a, b = collect(one), collect(two)
    finally:
        one.close()
        two.close()
    assert_batches_equal(a, b, where=f"{name}: workers 1 vs 2")
    assert a and "input_ids" in a[0]


def test_infer_every_record_once_in_order_and_joined(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "infer")
    spec["batching"]["batch_size"] = 5  # 24 records: the last batch is short and kept
    loader = Loader(spec)
    batches = collect(loader)
    loader.close()
    keys = np.concatenate([b["key"] for b in batches])
    assert keys.dtype == np.int64 and keys.shape == (24, 3)
    assert [tuple(k) for k in keys] == sorted(tuple(k) for k in keys) and len({tuple(k) for k in keys}) == 24
    assert len(batches[-1]["key"]) == 4
    preds = np.arange(24)
    joined = join_predictions(spec, keys, preds)
    texts = [json.loads(line)["text"] for f in sorted((tmp_path / "prose").glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert [j["record"]["text"] for j in joined] == texts and [j["prediction"] for j in joined] == list(range(24))
    # a padded last batch (remainder: pad) has key -1 rows, which the join skips
    padded = {**spec, "batching": {**spec["batching"], "remainder": "pad"}}
    loader = Loader(padded)
    last = collect(loader)[-1]
    loader.close()
    assert last["key"].shape == (5, 3) and (last["key"][-1] == -1).all()
    assert len(join_predictions(padded, last["key"], np.zeros(5))) == 4


@pytest.mark.parametrize(("change", "match"), [({"shuffle": {"buffer": 4}}, "shuffle"), ({"epochs": 2}, "epochs"),
                                                ({"batching": {"strategy": "pad", "batch_size": 4, "remainder": "drop"}}, "remainder")])
def test_infer_refuses_specs_that_lose_or_reorder_records(tmp_path: Path, change: dict, match: str) -> None:
    from feedline._pipeline import Pipeline

    with pytest.raises(SpecError, match=match):
        _ = Pipeline({**_spec(tmp_path, "infer"), **change}).task
