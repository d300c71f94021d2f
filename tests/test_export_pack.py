"""``feedline export`` and ``feedline pack``: shards, manifests, and output that ``datasets`` reads back."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._cli.__main__ import main
from feedline._pipeline import Pipeline
from feedline._tools.export import export
from feedline._tools.pack import pack


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two JSONL files of real OpenAssistant threads (30 and 20 conversations)."""
    lines = shared("chat", "oasst", "en_100_top_threads.messages.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    d = tmp_path_factory.mktemp("chats")
    (d / "first.jsonl").write_text("".join(lines[:30]), encoding="utf-8")
    (d / "second.jsonl").write_text("".join(lines[30:50]), encoding="utf-8")
    return d


def clm_spec(corpus: str, tokenizer: str, **batching: Any) -> dict[str, Any]:
    return {"sources": [{"path": corpus}], "tokenizer": tokenizer, "task": {"kind": "clm", "max_length": 64},
            "batching": {"strategy": "pack", "batch_size": 4, "remainder": "keep", **batching}}


def read_rows(directory: Path, fmt: str) -> list[dict[str, Any]]:
    manifest = json.loads((directory / "manifest.json").read_text())
    rows: list[dict[str, Any]] = []
    for shard in manifest["shards"]:
        path = directory / shard["path"]
        if fmt == "jsonl":
            got = [json.loads(line) for line in path.read_text().splitlines()]
        elif fmt == "msgpack":
            import msgpack

            with open(path, "rb") as fh:
                got = list(msgpack.Unpacker(fh, raw=False))
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            got = pq.read_table(path).to_pylist()
        else:
            import pyarrow as pa

            got = pa.ipc.open_stream(str(path)).read_all().to_pylist()
        assert len(got) == shard["rows"]
        rows.extend(got)
    assert len(rows) == manifest["rows"]
    return rows


@pytest.mark.parametrize("fmt", ["arrow", "parquet", "jsonl", "msgpack"])
def test_export_examples_round_trip(tmp_path: Path, corpus: str, small_tokenizer: str, fmt: str) -> None:
    s = clm_spec(corpus, small_tokenizer)
    manifest = export(s, str(tmp_path / "out"), fmt, shard_rows=50, flush_rows=16)
    assert len(manifest["shards"]) > 1 and all(sh["rows"] <= 50 for sh in manifest["shards"])
    rows = read_rows(tmp_path / "out", fmt)
    it = iter(Pipeline(s).examples())
    want = list(it)
    it.close()
    assert len(rows) == len(want)
    for row, ex in zip(rows, want):
        assert (row["source"], row["file"], row["position"], row["epoch"], row["sub"]) == (*ex.key, ex.epoch, ex.sub)
        assert row["input_ids"] == ex.fields["input_ids"].tolist()
    assert manifest["tokens"] == sum(ex.length for ex in want)


def test_export_batches_through_the_cli(tmp_path: Path, corpus: str, small_tokenizer: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(clm_spec(corpus, small_tokenizer)))
    out = tmp_path / "out"
    assert main(["export", str(spec_path), "-o", str(out), "-f", "parquet", "--what", "batches"]) == 0
    said = capsys.readouterr().out   # its report counts in words that agree with the numbers
    assert re.search(r"^wrote \d+ batch rows \(\d+ real tokens\) into 1 parquet shard in ", said), said
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=str(out / "*.parquet"), split="train")
    manifest = json.loads((out / "manifest.json").read_text())
    assert ds.num_rows == manifest["rows"] and len(ds[0]["input_ids"]) == 64
    assert {"step", "input_ids", "labels", "position_ids", "seq_lens", "cu_seqlens"} <= set(ds.column_names)
    assert manifest["batcher_stats"]["efficiency"] > 0.9


def test_export_refuses_unknown_format(tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    from feedline.errors import SpecError

    with pytest.raises(SystemExit) as exit_info:
        main(["export", "spec.yaml", "-o", str(tmp_path), "-f", "csv"])
    assert exit_info.value.code == 2

    with pytest.raises(SpecError, match="csv"):
        export(clm_spec(corpus, small_tokenizer), str(tmp_path), "csv")  # type: ignore[arg-type]


def check_packed_rows(rows: list[dict[str, Any]], max_length: int) -> None:
    for row in rows:
        ids, labels, pos, lens = (np.asarray(row[k]) for k in ("input_ids", "labels", "position_ids", "seq_lens"))
        assert len(ids) == len(labels) == len(pos) == int(lens.sum()) <= max_length
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        assert (labels[starts] == -100).all()
        assert np.flatnonzero(pos == 0).tolist() == starts.tolist()


@pytest.mark.slow
def test_pack_cli_writes_one_arrow_file_per_input_read_by_datasets(tmp_path: Path, chats: Path) -> None:
    datasets = pytest.importorskip("datasets")
    qwen = str(shared("tokenizers", "qwen2.5"))
    out = tmp_path / "packed"
    assert main(["pack", "-i", str(chats), "-o", str(out), "-t", qwen, "-m", "1024", "-w", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["first.arrow", "second.arrow"]
    rows = []
    for name in ("first.arrow", "second.arrow"):
        ds = datasets.Dataset.from_file(str(out / name))
        assert ds.column_names == ["input_ids", "labels", "position_ids", "seq_lens"]
        rows.extend(ds.to_list())
    check_packed_rows(rows, 1024)
    # the packed conversations are exactly the chat task's examples, assistant-only labels included
    spec = {"sources": [{"path": str(chats), "text": None}], "tokenizer": qwen, "task": {"kind": "chat", "max_length": 1024},
            "batching": {"strategy": "pad", "batch_size": 1}}
    it = iter(Pipeline(spec).examples())
    examples = list(it)
    it.close()
    want = sorted(ex.fields["input_ids"].tobytes() for ex in examples)
    got = []
    for row in rows:
        at = 0
        for n in row["seq_lens"]:
            got.append(np.asarray(row["input_ids"][at:at + n], dtype=np.int32).tobytes())
            at += n
    assert sorted(got) == want
    supervised = sum(int((ex.fields["labels"][1:] != -100).sum()) for ex in examples)
    assert sum(int((np.asarray(r["labels"]) != -100).sum()) for r in rows) == supervised


@pytest.mark.slow
def test_pack_parquet_in_parallel_opens_with_load_dataset(tmp_path: Path, chats: Path) -> None:
    datasets = pytest.importorskip("datasets")
    report = pack(str(chats), str(tmp_path), str(shared("tokenizers", "qwen2.5")), 768, "parquet", workers=2)
    assert report["processes"] == 2 and report["rows"] > 0
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "*.parquet"), split="train")
    assert ds.num_rows == report["rows"]
    check_packed_rows(ds.to_list(), 768)


@pytest.mark.slow
def test_pack_single_file_to_named_output_and_bad_input(tmp_path: Path, chats: Path) -> None:
    qwen = str(shared("tokenizers", "qwen2.5"))
    target = tmp_path / "one.jsonl"
    report = pack(str(chats / "second.jsonl"), str(target), qwen, 1024, "jsonl")
    assert target.exists() and len(target.read_text().splitlines()) == report["rows"]
    assert main(["pack", "-i", str(tmp_path / "missing"), "-o", str(tmp_path / "o"), "-t", qwen, "-m", "512"]) == 1
