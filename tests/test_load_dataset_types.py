"""load_dataset row for row against datasets, values and types: JSON (schema from the first file, mixed
fields kept as written), JSON Lines gzip, Parquet and Arrow with every common column type, each resumed."""

from __future__ import annotations

import datetime
import decimal
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

import feedline
from conftest import shared
from heavy import lazy, needs
from hf_compare import check

datasets = lazy("datasets")
pa = pytest.importorskip("pyarrow")

# On one xdist worker with the other load_dataset modules (--dist loadgroup otherwise spreads the tests over
# every worker): datasets' builders and their imports (pandas for CSV) and the module data are set up once.
pytestmark = [needs("datasets"), pytest.mark.xdist_group("load_dataset")]

ROWS = [  # ints and floats in one column, missing keys, nested objects with varying keys, dates, big ints
    {"id": 1, "score": 1, "name": "a", "tags": ["x"], "meta": {"k": 1}, "when": "2020-01-02 03:04:05", "flag": True},
    {"id": 2, "score": 2.5, "tags": [], "meta": {"k": 2, "v": "s"}, "flag": False,
     "msgs": [{"role": "user"}, {"role": "assistant", "content": "hi"}]},
    {"id": 3, "score": None, "name": None, "tags": ["y", "z"], "meta": {}, "when": "2021-05-06 00:00:00",
     "big": 12345678901234},
    {"id": 4, "score": 1e300, "name": "ü\u2028", "nested": [[1, 2], [3]], "flag": None, "mixed": "x"},
    {"id": 5, "mixed": 7, "row": {"a": 1, "b": [1.5]}},
    {"id": 6, "mixed": [1], "row": {"a": 2, "b": []}},
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("types")
    lines = [json.dumps(r, ensure_ascii=False) for r in ROWS]
    (d / "a.jsonl").write_text("\n".join(lines) + "\n")
    (d / "b.jsonl").write_text('{"id": 7, "score": 3}\n{"id": 8, "name": "late", "flag": true}\n')
    with gzip.open(d / "a.jsonl.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    n = 120  # several Parquet row groups and Arrow batches
    table = pa.table({
        "i8": pa.array([i % 100 - 50 if i % 9 else None for i in range(n)], pa.int8()),
        "u32": pa.array(range(n), pa.uint32()),
        "f32": pa.array([i / 4 if i % 7 else None for i in range(n)], pa.float32()),
        "f64": [i / 3 for i in range(n)],
        "s": [None if i % 11 == 0 else f"ü{i}" for i in range(n)],
        "ls": pa.array([str(i) for i in range(n)], pa.large_string()),
        "b": pa.array([bytes([i % 256, 0]) if i % 5 else None for i in range(n)], pa.binary()),
        "ts": pa.array([datetime.datetime(2020, 1, 1) + datetime.timedelta(hours=i) if i % 6 else None
                        for i in range(n)], pa.timestamp("us")),
        "d": pa.array([datetime.date(1970, 1, 1) + datetime.timedelta(days=i) for i in range(n)], pa.date32()),
        "dec": pa.array([decimal.Decimal(i) / 4 if i % 8 else None for i in range(n)], pa.decimal128(6, 2)),
        "li": [list(range(i % 4)) if i % 10 else None for i in range(n)],
        "st": [{"a": i, "b": str(i)} if i % 3 else None for i in range(n)],
        "dict": pa.array([("p", "q", "r")[i % 3] for i in range(n)]).dictionary_encode(),
        "bool": [None if i % 13 == 0 else i % 2 == 0 for i in range(n)],
        "lst": [[{"r": "u", "k": j} for j in range(i % 3)] for i in range(n)],
    })
    pq.write_table(table, d / "t.parquet", row_group_size=25)
    with pa.OSFile(str(d / "t.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=30):
            w.write_batch(batch)
    return {k: str(d / k) for k in ("a.jsonl", "b.jsonl", "a.jsonl.gz", "t.parquet", "t.arrow")}


CASES = {
    "json": ("json", ["a.jsonl"]),
    "json-two-files": ("json", ["a.jsonl", "b.jsonl"]),  # the second file typed by the first's schema
    "jsonl.gz": ("json", ["a.jsonl.gz"]),
    "parquet": ("parquet", ["t.parquet"]),
    "arrow": ("arrow", ["t.arrow"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_values_types_and_features_equal_datasets(case: str, data: dict) -> None:
    builder, names = CASES[case]
    files = [data[n] for n in names]
    hf = datasets.load_dataset(builder, data_files=files, split="train", streaming=True)
    make = lambda: feedline.load_dataset(builder, data_files=files, split="train")  # noqa: E731
    check(make, hf, cuts=4)
    assert make().features == hf.features
    # datasets orders the columns it keeps as JSON by a set's iteration order (it varies between runs)
    assert sorted(make().column_names) == sorted(hf.column_names)


@pytest.mark.slow
def test_real_chat_and_prose_rows_equal_datasets_with_types() -> None:
    for path in (shared("chat", "oasst", "en_100_top_threads.messages.jsonl"), shared("prose", "c4_demo.jsonl")):
        hf = datasets.load_dataset("json", data_files=str(path), split="train", streaming=True)
        check(lambda p=path: feedline.load_dataset("json", data_files=str(p), split="train"), hf, cuts=2)


def test_a_second_split_is_typed_by_the_first_splits_file(data: dict, tmp_path: Path) -> None:
    files = {"train": data["a.jsonl"], "test": data["b.jsonl"]}
    ours = feedline.load_dataset("json", data_files=files)
    theirs = datasets.load_dataset("json", data_files=files, streaming=True)
    assert list(ours["test"]) == list(theirs["test"])
