"""A Parquet file with fewer row groups than partitions (issue 34 item 3): each partition reads only its rows.

The deal cuts a row group into row ranges, the same on every placement; a partition reading its
piece decodes the group a block at a time and stops after its last row (it used to decode the whole
group in every partition and drop the others' rows). On a real 1-row-group file (C4 text, and the
same text's GPT-2 ids as a token column), at K = 1, 2 and 4: every row delivered exactly once, the
batches the same on threads and processes, and resume exact.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline import Loader, Spec
from feedline._pipeline import Pipeline
from feedline._sources.parquet import PIECE_ROWS
from feedline.testing import assert_batches_equal, assert_resumes_exactly, collect

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 2 * PIECE_ROWS + 123   # one row group; more than one block for a partition at K = 2


@pytest.fixture(scope="module")
def one_group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """C4 documents (cycled to ROWS rows, each numbered) and their GPT-2 ids, in one row group."""
    from tokenizers import Tokenizer

    # 100 characters of each: every Loader tokenizes hundreds of records ahead in each partition, and the
    # slow test below makes 8 a kind (300 characters: ~40 % more CPU in this file for the same batches)
    docs = [json.loads(line)["text"][:100] for line in shared("prose", "c4_demo.jsonl").open(encoding="utf-8")]
    texts = [f"{i}: {docs[i % len(docs)]}" for i in range(ROWS)]
    tok = Tokenizer.from_file(str(shared("tokenizers", "gpt2", "tokenizer.json")))
    # each of the 300 documents encoded once (not 55 times): GPT-2 never merges across "12:" and " The",
    # so a row's ids are those of its number and colon, then those of its document with the space
    heads = [e.ids for e in tok.encode_batch([f"{i}:" for i in range(ROWS)], add_special_tokens=False)]
    bodies = [e.ids for e in tok.encode_batch([f" {d}" for d in docs], add_special_tokens=False)]
    ids = [heads[i] + bodies[i % len(docs)] for i in range(ROWS)]
    sample = [0, 1, len(docs) + 7, ROWS - 1]
    assert [e.ids for e in tok.encode_batch([texts[i] for i in sample], add_special_tokens=False)] == [ids[i] for i in sample]
    path = tmp_path_factory.mktemp("one-group") / "one.parquet"
    pq.write_table(pa.table({"text": texts, "ids": pa.array(ids, pa.list_(pa.int32()))}), path, row_group_size=ROWS)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    return path


def spec_for(path: Path, kind: str, k: int, placement: str = "threads", gpt2: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"path": str(path)}
    if kind == "tokens":
        source.update(format="tokens", tokens={"ids": "ids"})
    else:
        source.update(format="parquet", text="text", columns=["text"])
    spec: dict[str, Any] = {"sources": [source], "seed": 5, "shuffle": {"buffer": 256},
                            "task": {"kind": "clm", "max_length": 128}, "batching": {"strategy": "pack", "batch_size": 8},
                            "partitions": k, "parallel": {"placement": placement, "processes": 2}}
    if kind == "text":
        spec["tokenizer"] = gpt2
    return spec


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Rows decoded from Parquet in this process (whole row groups and streamed blocks)."""
    count: Counter[str] = Counter()
    read_group, batches = pq.ParquetFile.read_row_group, pq.ParquetFile.iter_batches

    def read_row_group(self: Any, i: int, *a: Any, **kw: Any) -> Any:
        table = read_group(self, i, *a, **kw)
        count["rows"] += table.num_rows
        return table

    def iter_batches(self: Any, *a: Any, **kw: Any) -> Iterator[Any]:
        for b in batches(self, *a, **kw):
            count["rows"] += b.num_rows
            yield b

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", read_row_group)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    return count


@pytest.mark.parametrize("kind", ["text", "tokens"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_each_partition_reads_its_rows_once_and_decodes_nothing_past_them(
        one_group: Path, gpt2_path: str, decoded: Counter[str], kind: str, k: int) -> None:
    spec = Spec.load({**spec_for(one_group, kind, k, gpt2=gpt2_path), "shuffle": None})
    rows: list[int] = []
    for p in range(k):
        decoded.clear()
        got = [r.key[2] for r in Pipeline(spec, partition=p if k > 1 else None).records()]
        share_end = (p + 1) * ROWS // k
        assert got == list(range(p * ROWS // k, share_end)), f"partition {p} of {k} read rows outside its share"
        assert decoded["rows"] <= min(ROWS, share_end + PIECE_ROWS), \
            f"partition {p} of {k} decoded {decoded['rows']} rows for its {len(got)} (the whole group?)"
        rows += got
    assert sorted(rows) == list(range(ROWS))   # every row exactly once


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["text", "tokens"])
def test_pieces_give_the_same_batches_on_threads_and_processes_and_resume_exactly(
        one_group: Path, gpt2_path: str, kind: str) -> None:
    for k in (2, 4):
        with Loader(spec_for(one_group, kind, k, gpt2=gpt2_path)) as threads:
            want = collect(threads, limit=30)
        with Loader(spec_for(one_group, kind, k, "processes", gpt2=gpt2_path)) as processes:
            got = collect(processes, limit=30)
        assert_batches_equal(want, got, where=f"{kind} K={k}: threads vs processes")
        assert sum(int(np.asarray(b["attention_mask"]).sum()) for b in want) > 30 * 8 * 64
    # restored at 0, 50 and 99 (each restore a Loader of its own, reading ahead like the first)
    assert assert_resumes_exactly(spec_for(one_group, kind, 4, gpt2=gpt2_path), every=50, check=3, limit=100) >= 3
