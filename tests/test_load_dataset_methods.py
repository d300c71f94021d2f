"""feedline.load_dataset's datasets methods against datasets' own, row for row (values and types), each resuming exactly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import feedline
from conftest import shared
from feedline.errors import RecordError, SpecError, StateError
from feedline.testing import assert_stage_resumes
from heavy import lazy, needs
from hf_compare import check

datasets = lazy("datasets")

# On one xdist worker with the other load_dataset modules (--dist loadgroup otherwise spreads the tests over
# every worker): datasets' builders and their imports (pandas for CSV) and the module data are set up once.
pytestmark = [needs("datasets"), pytest.mark.xdist_group("load_dataset")]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """C4 in three JSON Lines files (so file order and shards matter), and C4 with labels as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("methods")
    lines = shared("prose", "c4_demo.jsonl").read_text().splitlines()
    parts = []
    for i, (a, b) in enumerate([(0, 90), (90, 200), (200, 300)]):
        p = d / f"c4-{i}.jsonl"
        p.write_text("\n".join(lines[a:b]) + "\n")
        parts.append(str(p))
    rows = [{"text": json.loads(x)["text"], "label": i % 7, "score": i / 3, "ok": i % 2 == 0, "ids": list(range(i % 5))}
            for i, x in enumerate(lines)]
    pq_path = d / "c4.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pq_path, row_group_size=41)
    return {"jsonl": parts, "parquet": str(pq_path)}


def both(builder: str, data_files: Any, **kw: Any) -> tuple[Callable[[], Any], Any]:
    make = lambda: feedline.load_dataset(builder, data_files=data_files, split="train", **kw)  # noqa: E731
    return make, datasets.load_dataset(builder, data_files=data_files, split="train", streaming=True, **kw)


def _chunks(batch: dict) -> dict:
    out = [t[i:i + 300] for t in batch["text"] for i in range(0, len(t), 300)]
    return {"chunk": out}


METHODS: dict[str, Callable[[Any], Any]] = {
    "map": lambda d: d.map(lambda r: {"n": len(r["text"]), "text": r["text"][:20]}),
    "map-remove": lambda d: d.map(lambda r: {"first": r["text"].split()[0]}, remove_columns=["text"]),
    "map-batched-rows-change": lambda d: d.map(_chunks, batched=True, batch_size=7, remove_columns=["text"]),
    "map-batched-drop-last": lambda d: d.map(lambda b: {"m": [len(t) for t in b["text"]]}, batched=True,
                                             batch_size=16, drop_last_batch=True),
    "map-indices-input-columns": lambda d: d.map(lambda t, i: {"key": f"{i}:{t[:5]}"}, with_indices=True,
                                                 input_columns="text", fn_kwargs={}),
    "map-fn-kwargs": lambda d: d.map(lambda r, k: {"k": k}, fn_kwargs={"k": 3}),
    "filter": lambda d: d.filter(lambda r: len(r["text"]) % 3 == 0),
    "filter-batched-indices": lambda d: d.filter(lambda b, idx: [i % 4 != 1 for i in idx], with_indices=True,
                                                 batched=True, batch_size=10),
    "take": lambda d: d.take(37),
    "skip": lambda d: d.skip(250),
    "skip-take": lambda d: d.skip(85).take(20),
    "select-columns": lambda d: d.map(lambda r: {"n": 1}).select_columns(["n"]),
    "remove-columns": lambda d: d.map(lambda r: {"n": 1}).remove_columns("text"),
    "rename-column": lambda d: d.rename_column("text", "body"),
    "rename-columns": lambda d: d.map(lambda r: {"n": 1}).rename_columns({"text": "t", "n": "m"}),
    "batch": lambda d: d.batch(32),
    "batch-drop-last": lambda d: d.batch(32, drop_last_batch=True),
    "filter-map-take-batch": lambda d: d.filter(lambda r: "the" in r["text"]).map(lambda r: {"n": len(r["text"])})
                                        .take(50).batch(8),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_methods_equal_datasets_row_for_row_and_resume(method: str, files: dict) -> None:
    make, hf = both("json", files["jsonl"])
    expected = check(lambda: METHODS[method](make()), METHODS[method](hf))
    assert expected


@pytest.mark.parametrize("contiguous", [True, False])
def test_shard_splits_data_files_as_datasets(contiguous: bool, files: dict) -> None:
    make, hf = both("json", files["jsonl"])
    for index in range(2):
        check(lambda i=index: make().shard(2, i, contiguous=contiguous), hf.shard(2, index, contiguous=contiguous),
              cuts=1)
    assert make().n_shards == hf.n_shards == 3
    with pytest.raises(SpecError, match="has 3 data file"):
        make().shard(4, 3)


def test_set_epoch_and_formats(files: dict) -> None:
    make, hf = both("parquet", files["parquet"])
    ds = make()
    ds.set_epoch(3)
    hf.set_epoch(3)
    check(lambda: ds, hf, cuts=1)
    for fmt in ("numpy", "torch"):
        pytest.importorskip(fmt)
        check(lambda fmt=fmt: make().take(30).with_format(fmt), hf.take(30).with_format(fmt), cuts=1)


def test_set_epoch_reshuffles_and_a_state_resumes_in_its_epoch(files: dict) -> None:
    def make(epoch: int) -> Any:
        ds = feedline.load_dataset("json", data_files=files["jsonl"], split="train").shuffle(seed=4, buffer_size=32)
        ds = ds.map(lambda r: {"n": len(r["text"])}).shuffle(seed=9, buffer_size=8)
        ds.set_epoch(epoch)
        return ds

    orders = [[r["text"] for r in make(e)] for e in (0, 1, 2)]
    assert orders[0] != orders[1] != orders[2] and sorted(orders[0]) == sorted(orders[2])
    ds = make(2)
    it = iter(ds)
    head = [next(it)["text"] for _ in range(111)]
    state = json.loads(json.dumps(ds.state_dict()))
    it.close()
    resumed = make(0)
    resumed.load_state_dict(state)  # the state carries its epoch
    assert resumed.epoch == 2 and head + [r["text"] for r in resumed] == orders[2]


def test_features_and_column_names_follow_the_methods(files: dict) -> None:
    for builder, data in (("json", files["jsonl"]), ("parquet", files["parquet"])):
        make, hf = both(builder, data)
        for name, method in METHODS.items():
            if name in ("filter-batched-indices",):
                continue
            ours, theirs = method(make()), method(hf)
            assert ours.column_names == theirs.column_names, (builder, name)
            assert ours.features == theirs.features, (builder, name)
        assert make().features == hf.features is not None


@pytest.mark.parametrize("split", ["train[:10]", "train[100:]", "train[:10%]", "train[33%:50%]", "train[-25:]",
                                   "train[5:-250]"])
def test_split_slices_equal_datasets(split: str, files: dict, tmp_path: Path) -> None:
    expected = list(datasets.load_dataset("json", data_files=files["jsonl"], split=split, cache_dir=str(tmp_path)))
    make = lambda: feedline.load_dataset("json", data_files=files["jsonl"], split=split)  # noqa: E731
    assert list(make()) == expected
    check(make, expected, cuts=1)


@pytest.mark.parametrize("probabilities,seed,stopping", [
    (None, None, "first_exhausted"),
    (None, None, "all_exhausted"),
    ([0.2, 0.5, 0.3], 42, "first_exhausted"),
    ([0.2, 0.5, 0.3], 7, "all_exhausted"),
    ([0.6, 0.1, 0.3], 1, "all_exhausted_without_replacement"),
])
def test_interleave_datasets_equals_datasets(probabilities: list | None, seed: int | None, stopping: str,
                                             files: dict) -> None:
    parts = files["jsonl"]

    def ours() -> Any:
        dss = [feedline.load_dataset("json", data_files=p, split="train") for p in parts]
        dss[1] = dss[1].map(lambda r: {"n": 1})  # a dataset with a method called on it
        return feedline.interleave_datasets(dss, probabilities=probabilities, seed=seed, stopping_strategy=stopping)

    hfs = [datasets.load_dataset("json", data_files=p, split="train", streaming=True) for p in parts]
    hfs[1] = hfs[1].map(lambda r: {"n": 1})
    theirs = datasets.interleave_datasets(hfs, probabilities=probabilities, seed=seed, stopping_strategy=stopping)
    check(ours, theirs)


@pytest.mark.slow
def test_every_stage_resumes_exactly_at_every_row(files: dict) -> None:
    """The stage tree behind chained methods, restored before and after every row (shuffle buffers included)."""
    parts = files["jsonl"]
    a = feedline.load_dataset("json", data_files=parts[:2], split="train").shuffle(seed=3, buffer_size=20)
    b = feedline.load_dataset("parquet", data_files=files["parquet"], split="train").select_columns(["text"])
    mixed = feedline.interleave_datasets([a.filter(lambda r: len(r["text"]) > 500), b], probabilities=[0.5, 0.5],
                                         seed=5, stopping_strategy="all_exhausted")
    chained = mixed.map(lambda r: {"n": len(r["text"])}).shuffle(seed=1, buffer_size=16).map(
        lambda b: {"n": [sum(b["n"])]}, batched=True, batch_size=5, remove_columns=["text"])
    assert assert_stage_resumes(chained.stage(), every=3, check=3) > 40
    nested = feedline.interleave_datasets([mixed, a.take(40)], seed=2, probabilities=[0.7, 0.3],
                                          stopping_strategy="all_exhausted").shuffle(seed=3, buffer_size=25)
    assert assert_stage_resumes(nested.stage(), every=5, check=3) > 40


def test_refusals(files: dict) -> None:
    ds = feedline.load_dataset("json", data_files=files["jsonl"], split="train")
    with pytest.raises(SpecError, match="shuffle after batch"):
        ds.batch(4).shuffle(seed=0)
    with pytest.raises(SpecError, match=r"select_columns: column\(s\) \['nope'\] not in the dataset"):
        ds.select_columns(["nope"])
    with pytest.raises(SpecError, match="split 'train\\[x\\]'"):
        feedline.load_dataset("json", data_files=files["jsonl"], split="train[x]")
    with pytest.raises(StateError, match="another dataset"):
        ds.filter(lambda r: True).load_state_dict(ds.state_dict())
    with pytest.raises(SpecError, match="to_loader: take\\(\\) has no counterpart"):
        ds.take(3).to_loader()
    with pytest.raises(SpecError, match="stopping_strategy"):
        feedline.interleave_datasets([ds], stopping_strategy="longest")


def test_to_loader_runs_map_and_filter_as_spec_transforms(files: dict, gpt2_path: str) -> None:
    ds = feedline.load_dataset("json", data_files=files["jsonl"], split="train")
    ds = ds.filter(lambda r: len(r["text"]) < 1500).rename_column("text", "body").map(lambda r: {"body": r["body"][:200]})
    with ds.to_loader(tokenizer=gpt2_path, task={"kind": "clm", "max_length": 256}, text="body",
                      batching={"strategy": "pad", "batch_size": 4, "remainder": "keep"}) as loader:
        batches = list(loader)
        stats = loader.stats()
    rows = list(ds)
    assert stats["filtered"] == 300 - len(rows) and stats["rejected"] == {}
    assert sum(len(b["input_ids"]) for b in batches) == len(rows)


def test_to_loader_names_a_missing_text_field_in_one_line_with_or_without_functions(files: dict,
                                                                                      gpt2_path: str) -> None:
    """Rows whose text is under another field: the same one-line RecordError whatever methods came before
    (it was a bare KeyError('text') from the task after map/filter)."""
    ds = feedline.load_dataset("json", data_files=files["jsonl"], split="train").rename_column("text", "body")
    opts: dict[str, Any] = {"tokenizer": gpt2_path, "task": {"kind": "clm", "max_length": 64},
                            "batching": {"strategy": "pad", "batch_size": 4}}
    messages = set()
    for variant in (ds, ds.filter(lambda r: len(r["body"]) < 1500), ds.map(lambda r: {"body": r["body"][:200]}),
                    ds.filter(lambda r: True).select_columns(["body"])):
        with pytest.raises(RecordError) as e:
            variant.to_loader(**opts)
        messages.add(str(e.value))
    assert messages == {"to_loader: the rows have no field 'text'; they have: body; pass text= naming "
                        "the field holding the text, e.g. to_loader(text='body') (text=None keeps rows whole, for chat)"}
    assert e.value.reason == "missing_field" and e.value.path == files["jsonl"][0]
    with ds.filter(lambda r: True).to_loader(text="body", **opts) as loader:    # the fix it names works
        assert next(iter(loader))["input_ids"].shape[0] == 4


def test_to_loader_suggests_the_field_holding_the_longest_text(files: dict, gpt2_path: str) -> None:
    """With a short label beside the text (banking77 as JSON Lines), the hint names the text, not the first field."""
    ds = (feedline.load_dataset("json", data_files=files["jsonl"], split="train").rename_column("text", "utterance")
          .map(lambda r: {"label": "card_arrival"}))
    with pytest.raises(RecordError, match=r"they have: label, utterance; .* e\.g\. to_loader\(text='utterance'\)"):
        ds.to_loader(tokenizer=gpt2_path, task={"kind": "clm", "max_length": 64},
                     batching={"strategy": "pad", "batch_size": 4})
