"""feedline.load_dataset against datasets.load_dataset(streaming=True) on real files, with exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import feedline
from conftest import shared
from feedline.errors import SpecError, StateError
from heavy import lazy, needs

datasets = lazy("datasets")

# On one xdist worker with the other load_dataset modules (--dist loadgroup otherwise spreads the tests over
# every worker): datasets' builders and their imports (pandas for CSV) and the module data are set up once.
pytestmark = [needs("datasets"), pytest.mark.xdist_group("load_dataset")]


def hf_rows(builder: str, files: list[str], **kw: object) -> list[dict]:
    return list(datasets.load_dataset(builder, data_files=files, split="train", streaming=True, **kw))


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """C4 rows written to Parquet in small row groups (so resume crosses row groups)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in shared("prose", "c4_demo.jsonl").read_text().splitlines()]
    path = tmp_path_factory.mktemp("lds") / "c4.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=37)
    return str(path)


def cases(parquet_file: str) -> list[tuple[str, list[str], dict]]:
    return [
        ("json", [str(shared("prose", "c4_demo.jsonl"))], {}),
        ("json", [str(shared("chat", "oasst", "en_100_top_threads.messages.jsonl"))], {}),  # nested lists
        ("csv", [str(shared("classification", "banking77", "train.tsv"))], {"sep": "\t"}),
        ("parquet", [parquet_file], {}),
        ("text", [str(shared("prose", "botchan.txt"))], {}),
    ]


@pytest.mark.parametrize("case", range(5))
@pytest.mark.slow
def test_rows_equal_datasets_and_resume_exactly(case: int, parquet_file: str) -> None:
    builder, files, kw = cases(parquet_file)[case]
    expected = hf_rows(builder, files, **kw)
    ds = feedline.load_dataset(builder, data_files=files, split="train", **kw)
    assert list(ds) == expected                                      # fields, values and order
    assert list(ds) == expected                                      # a new iteration starts again
    cut = len(expected) // 3 + 1
    ds = feedline.load_dataset(builder, data_files=files, split="train", **kw)
    head = []
    for row in ds:
        head.append(row)
        if len(head) == cut:
            break
    state = json.loads(json.dumps(ds.state_dict()))                  # JSON round trip
    resumed = feedline.load_dataset(builder, data_files=files, split="train", **kw)
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected


def test_shuffle_is_a_permutation_and_resumes_with_its_buffer(parquet_file: str) -> None:
    files = [str(shared("prose", "c4_demo.jsonl")), parquet_file.replace(".parquet", ".jsonl")]
    Path(files[1]).write_text(shared("prose", "c4_demo.jsonl").read_text())
    rows = list(feedline.load_dataset("json", data_files=files, split="train"))
    ds = feedline.load_dataset("json", data_files=files, split="train").shuffle(seed=7, buffer_size=50)
    full = list(ds)
    assert full != rows and sorted(map(json.dumps, full)) == sorted(map(json.dumps, rows))
    assert list(feedline.load_dataset("json", data_files=files, split="train").shuffle(seed=7, buffer_size=50)) == full
    part = feedline.load_dataset("json", data_files=files, split="train").shuffle(seed=7, buffer_size=50)
    it = iter(part)
    head = [next(it) for _ in range(120)]
    state = part.state_dict()
    it.close()
    resumed = feedline.load_dataset("json", data_files=files, split="train").shuffle(seed=7, buffer_size=50)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full                               # the shuffle buffer was restored
    other = feedline.load_dataset("json", data_files=files, split="train")
    with pytest.raises(StateError, match="another dataset"):
        other.load_state_dict(state)


def test_split_none_gives_a_dict_and_to_loader_batches(tmp_path: Path, gpt2_path: str) -> None:
    train, test = shared("classification", "banking77", "train.tsv"), shared("classification", "banking77", "test.tsv")
    dd = feedline.load_dataset("csv", data_files={"train": str(train), "test": str(test)}, sep="\t")
    assert sorted(dd) == ["test", "train"]
    assert next(iter(dd["test"])) == next(iter(datasets.load_dataset(
        "csv", data_files={"test": str(test)}, sep="\t", split="test", streaming=True)))
    loader = dd["train"].to_loader(tokenizer=gpt2_path, task={"kind": "clm", "max_length": 32},
                                   batching={"strategy": "pad", "batch_size": 4})
    batch = next(iter(loader))
    assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].shape[1] <= 32
    loader.close()
    with pytest.raises(SpecError, match="streaming=False"):
        feedline.load_dataset("json", data_files=str(train), streaming=False)
    with pytest.raises(SpecError, match="split 'validation' not found"):
        feedline.load_dataset("csv", data_files=str(train), split="validation", sep="\t")
