"""A Parquet id column is checked for values outside int32 only where its type can hold them: an
int64 column with an id of 2^31 is refused naming the file and column; int8/16/32 and uint8/16
columns (nothing to find, so no pass over their values) read as the same int32 ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feedline import Loader
from feedline.errors import SourceError


def _spec(path: str) -> dict:
    return {"sources": [{"path": path, "format": "tokens"}], "task": {"kind": "clm", "max_length": 16}, "epochs": 1,
            "batching": {"strategy": "pack", "batch_size": 1}}


def _write(path: str, docs: list[list[int]], value_type: pa.DataType) -> str:
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(value_type))}), path)
    return path


DOCS = [[5, 6, 7, 8, 9], [1, 2, 3], [100, 101, 102, 103, 104, 105, 106], [40, 41], [7] * 12, [9, 9, 9]]


def test_an_id_outside_int32_is_refused_naming_file_and_column(tmp_path) -> None:
    path = _write(str(tmp_path / "big.parquet"), [*DOCS, [3, 1 << 31, 4]], pa.int64())
    with pytest.raises(SourceError, match=r"big\.parquet: column 'input_ids' holds values outside int32"), Loader(_spec(path)) as ld:
        list(ld)


@pytest.mark.parametrize("value_type", [pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.int64()])
def test_narrow_id_columns_give_the_int32_ids(tmp_path, value_type: pa.DataType) -> None:
    path = _write(str(tmp_path / "ids.parquet"), DOCS, value_type)
    with Loader(_spec(path)) as ld:
        batches = list(ld)
    ids = np.concatenate([b["input_ids"][b["attention_mask"] == 1] for b in batches])
    assert ids.dtype == np.int32
    assert sorted(ids.tolist()) == sorted(x for d in DOCS for x in d)
