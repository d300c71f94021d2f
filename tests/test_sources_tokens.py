"""Pre-tokenized sources: Parquet/Arrow id columns, Megatron .bin/.idx, flat token files (nanoGPT,
llm.c). Fixtures are real text (C4 documents) tokenized with the real GPT-2 tokenizer."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import shared
from feedline import Loader
from feedline._records import records
from feedline._sources.flat import LLMC_MAGIC
from feedline._sources.megatron import MegatronIndex, write_indexed_dataset
from feedline._sources.reader import detect_format
from feedline._tokenize.load import load_tokenizer
from feedline.errors import SourceError, SpecError
from feedline.testing import assert_batches_equal, assert_resumes_exactly, collect

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("sources_tokens")

EOS = 50256


@pytest.fixture(scope="module")
def docs() -> list[np.ndarray]:
    """The 300 C4 documents as GPT-2 ids (no EOS)."""
    c4 = shared("prose", "c4_demo.jsonl")
    texts = [json.loads(line)["text"] for line in c4.read_text(encoding="utf-8").splitlines()]
    tok = load_tokenizer(str(shared("tokenizers", "gpt2")))
    return tok.encode_batch(texts)


@pytest.fixture(scope="module")
def layouts(docs: list[np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """One source spec per layout, and the documents it must deliver, in file order."""
    d = tmp_path_factory.mktemp("tokens")
    out: dict[str, dict] = {}
    # Parquet: list<int32>, row groups of 40 rows (8 splits); labels with the first 4 tokens masked.
    labels = [np.concatenate([np.full(min(4, len(x)), -100, np.int32), x[4:]]) for x in docs]
    table = pa.table({"input_ids": pa.array([x.tolist() for x in docs], pa.list_(pa.int32())),
                      "labels": pa.array([x.tolist() for x in labels], pa.list_(pa.int32())),
                      "url": [f"doc{i}" for i in range(len(docs))]})
    pq.write_table(table, d / "tok.parquet", row_group_size=40)
    out["parquet"] = {"source": {"path": str(d / "tok.parquet"), "format": "tokens"}, "docs": docs, "labels": labels}
    # Arrow IPC stream (what datasets writes), large_list<int64>, no labels column.
    arrow_table = pa.table({"input_ids": pa.array([x.tolist() for x in docs], pa.large_list(pa.int64()))})
    with pa.OSFile(str(d / "tok.arrow"), "wb") as f, pa.ipc.new_stream(f, arrow_table.schema) as w:
        w.write_table(arrow_table, max_chunksize=64)
    out["arrow"] = {"source": {"path": str(d / "tok.arrow"), "format": "tokens"}, "docs": docs}
    # Megatron: documents with EOD appended (preprocess_data.py --append-eod), uint16.
    with_eod = [np.append(x, EOS).astype(np.int32) for x in docs]
    write_indexed_dataset(str(d / "c4_text_document"), with_eod, np.uint16)
    out["megatron"] = {"source": {"path": str(d / "c4_text_document.bin"), "split_bytes": 1 << 16}, "docs": with_eod}
    # nanoGPT flat file: raw uint16, EOS after each document.
    np.concatenate(with_eod).astype(np.uint16).tofile(d / "train.bin")
    out["nanogpt"] = {"source": {"path": str(d / "train.bin"), "format": "flat", "split_bytes": 1 << 16,
                                 "tokens": {"dtype": "uint16", "eos": EOS}}, "docs": with_eod}
    # llm.c: 256-int32 header (magic, version 1 = uint16, token count), EOS before each document.
    eod_first = [np.insert(x, 0, EOS).astype(np.int32) for x in docs]
    flat = np.concatenate(eod_first).astype(np.uint16)
    header = np.zeros(256, np.int32)
    header[:3] = [LLMC_MAGIC, 1, len(flat)]
    (d / "fineweb_train_000001.bin").write_bytes(header.tobytes() + flat.tobytes())
    out["llmc"] = {"source": {"path": str(d / "fineweb_train_000001.bin"), "split_bytes": 1 << 16,
                              "tokens": {"eos": EOS}}, "docs": eod_first}
    return out


LAYOUTS = ["parquet", "arrow", "megatron", "nanogpt", "llmc"]


def _pack(source: dict, **over: object) -> dict:
    spec = {"sources": [source], "task": {"kind": "clm", "max_length": 1024},
            "batching": {"strategy": "pack", "batch_size": 4}, "seed": 11}
    spec.update(over)
    return spec


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.slow
def test_each_layout_delivers_its_documents_in_order(layout: str, layouts: dict[str, dict]) -> None:
    case = layouts[layout]
    recs = list(records({"sources": [case["source"]], "task": {"kind": "clm"}}))
    assert len(recs) == len(case["docs"])
    for rec, want in zip(recs, case["docs"]):
        assert rec["input_ids"].dtype == np.int32
        assert rec["input_ids"].tolist() == want.tolist()
    if "labels" in case:
        assert [r["labels"].tolist() for r in recs[:5]] == [x.tolist() for x in case["labels"][:5]]


def test_parquet_row_groups_are_decoded_ahead_each_once(layouts: dict[str, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row group but the first two is decoded on a read-ahead thread while the group before it
    is read (the next epoch's first included; the first batch has the cores to itself), each exactly
    once, and the records are those of the file."""
    reads: list[tuple[int, str]] = []
    read_row_group = pq.ParquetFile.read_row_group

    def spy(self: pq.ParquetFile, i: int, *args: object, **kwargs: object) -> pa.Table:
        reads.append((i, threading.current_thread().name))
        return read_row_group(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    case = layouts["parquet"]
    recs = list(records({"sources": [case["source"]], "task": {"kind": "clm"}, "epochs": 2}))
    assert [r["input_ids"].tolist() for r in recs] == [x.tolist() for x in case["docs"]] * 2
    groups = pq.ParquetFile(case["source"]["path"]).metadata.num_row_groups
    assert sorted(i for i, _ in reads) == sorted(list(range(groups)) * 2)  # (threads append in any order)
    assert [i for i, name in reads if not name.startswith("feedline-read-ahead")] == [0, 1]


def test_the_read_ahead_thread_only_decodes(layouts: dict[str, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-ahead thread decodes row groups and opens no file: the reading thread opens the file
    and lists its groups once for it (opened there for every group, that Python work held the GIL
    while the batches waited)."""
    opened: list[str] = []
    init = pq.ParquetFile.__init__

    def spy(self: pq.ParquetFile, *args: object, **kwargs: object) -> None:
        opened.append(threading.current_thread().name)
        init(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "__init__", spy)
    case = layouts["parquet"]
    recs = list(records({"sources": [case["source"]], "task": {"kind": "clm"}, "epochs": 3}))
    assert [r["input_ids"].tolist() for r in recs] == [x.tolist() for x in case["docs"]] * 3
    assert pq.ParquetFile(case["source"]["path"]).metadata.num_row_groups > 2
    assert opened and not [name for name in opened if name.startswith("feedline-read-ahead")]


def test_a_token_files_format_is_told_once(layouts: dict[str, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a token file is Parquet is told once per path and reader: asked again for every row
    group (its extent, its read-ahead, its blocks), detect_format ran a few times a group."""
    from feedline._sources import tokens

    asked: list[str] = []

    def spy(path: str) -> str:
        asked.append(path)
        return detect_format(path)

    monkeypatch.setattr(tokens, "detect_format", spy)
    case = layouts["parquet"]
    recs = list(records({"sources": [case["source"]], "task": {"kind": "clm"}, "epochs": 3}))
    assert [r["input_ids"].tolist() for r in recs] == [x.tolist() for x in case["docs"]] * 3
    assert pq.ParquetFile(case["source"]["path"]).metadata.num_row_groups > 2
    assert asked == [case["source"]["path"]]


def test_detection(layouts: dict[str, dict]) -> None:
    assert detect_format(layouts["megatron"]["source"]["path"]) == "megatron"
    assert detect_format(layouts["megatron"]["source"]["path"][:-4] + ".idx") == "megatron"
    assert detect_format(layouts["nanogpt"]["source"]["path"]) == "flat"


@pytest.mark.slow
def test_megatron_pack_equals_the_text_path(layouts: dict[str, dict]) -> None:
    """Megatron documents (GPT-2 ids + EOD) through clm/pack give the batches that the same C4 text
    gives through the GPT-2 tokenizer (clm appends EOS): bit for bit when the spec names the
    tokenizer (its pad id pads); without one, padding is 0 and everything else is the same."""
    gpt2 = str(shared("tokenizers", "gpt2"))
    want = collect(Loader(_pack({"path": str(shared("prose", "c4_demo.jsonl"))}, tokenizer=gpt2)))
    assert len(want) > 20
    assert_batches_equal(want, collect(Loader(_pack(layouts["megatron"]["source"], tokenizer=gpt2))), where="megatron")
    bare = collect(Loader(_pack(layouts["megatron"]["source"])))
    assert len(bare) == len(want)
    for a, b in zip(want, bare):
        assert sorted(a) == sorted(b)
        real = np.zeros(a["input_ids"].shape, bool)
        for r, lens in enumerate(a["seq_lens"]):
            real[r, :int(lens.sum())] = True
        assert np.array_equal(a["input_ids"][real], b["input_ids"][real])
        assert (b["input_ids"][~real] == 0).all() and (a["input_ids"][~real] == EOS).all()
        for k in a:
            if k != "input_ids":
                assert np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.slow
def test_shuffled_stream_resumes_exactly(layout: str, layouts: dict[str, dict]) -> None:
    spec = _pack(layouts[layout]["source"], shuffle={"buffer": 32}, epochs=2)
    assert assert_resumes_exactly(spec, every=9, check=2) >= 5
    again = collect(Loader(spec))
    first = collect(Loader({**spec, "shuffle": None}))
    assert not all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(again, first))


def test_concat_reproduces_the_flat_token_stream(layouts: dict[str, dict]) -> None:
    case = layouts["nanogpt"]
    spec = {"sources": [case["source"]], "task": {"kind": "clm", "max_length": None},
            "batching": {"strategy": "concat", "batch_size": 2, "max_length": 256}}
    rows = np.concatenate([b["input_ids"] for b in collect(Loader(spec))])
    stream = np.concatenate(case["docs"])
    assert rows.reshape(-1).tolist() == stream[:rows.size].tolist()
    assert stream.size - rows.size < 2 * 256


@pytest.mark.slow
def test_mixture_with_a_text_source_resumes_exactly(layouts: dict[str, dict]) -> None:
    spec = {"sources": [{**layouts["parquet"]["source"], "weight": 2},
                        {"path": str(shared("prose", "botchan.txt")), "weight": 1}],
            "tokenizer": str(shared("tokenizers", "gpt2")), "shuffle": {"buffer": 16}, "seed": 5,
            "task": {"kind": "clm", "max_length": 512}, "batching": {"strategy": "pack", "batch_size": 4}}
    assert assert_resumes_exactly(spec, every=6, check=2, limit=40) >= 5
    loader = Loader(spec)
    batches = collect(loader, limit=40)
    shares = loader.stats()["mixture"]
    assert len(shares) == 2 and all(0.2 < v < 0.8 for v in shares), shares
    # parquet labels mask the first 4 tokens of each document: -100 inside rows, not only padding
    labels = np.concatenate([b["labels"].reshape(-1) for b in batches])
    assert (labels == -100).sum() > 4 * 100


def test_tasks_that_need_text_refuse_token_sources(layouts: dict[str, dict]) -> None:
    spec = {**_pack(layouts["megatron"]["source"]), "task": {"kind": "mlm", "max_length": 128},
            "tokenizer": str(shared("tokenizers", "bert-base-uncased"))}
    with pytest.raises(SpecError, match="holds token ids"):
        collect(Loader(spec))


def test_ids_outside_the_vocabulary_are_rejected(tmp_path: Path) -> None:
    rows = [[1, 2, 3], [5, 60000, 7], [], [8, -1]] + [[9, 10, 11]] * 600  # counted once their chunk is behind
    pq.write_table(pa.table({"input_ids": rows}), tmp_path / "t.parquet")
    spec = _pack({"path": str(tmp_path / "t.parquet"), "format": "tokens"}, tokenizer=str(shared("tokenizers", "gpt2")),
                 batching={"strategy": "pack", "batch_size": 8})
    loader = Loader(spec)
    collect(loader)
    assert loader.stats()["rejected"] == {"token_out_of_range": 2, "empty_document": 1}


def test_flat_dtype_inference_and_errors(tmp_path: Path, docs: list[np.ndarray]) -> None:
    stream = np.concatenate([np.append(x, EOS) for x in docs[:40]])
    stream.astype(np.uint32).tofile(tmp_path / "u32.bin")
    stream.astype(np.uint16).tofile(tmp_path / "u16.bin")
    for name in ("u32.bin", "u16.bin"):
        recs = list(records({"sources": [{"path": str(tmp_path / name), "tokens": {"eos": EOS}}]}))
        assert [r["input_ids"].tolist() for r in recs] == [np.append(x, EOS).tolist() for x in docs[:40]], name
    stream[:100].astype(np.uint16).tofile(tmp_path / "tiny.bin")
    with pytest.raises(SourceError, match="too short"):
        list(records({"sources": [{"path": str(tmp_path / "tiny.bin"), "tokens": {"eos": EOS}}], "on_error": "raise"}))
    with pytest.raises(SpecError, match="needs tokens: {eos: ID}"):
        list(records({"sources": [{"path": str(tmp_path / "u16.bin")}]}))


def test_broken_megatron_index_is_a_clear_error(layouts: dict[str, dict], tmp_path: Path) -> None:
    src = Path(layouts["megatron"]["source"]["path"][:-4])
    (tmp_path / "x.bin").write_bytes(src.with_suffix(".bin").read_bytes())
    idx = src.with_suffix(".idx").read_bytes()
    (tmp_path / "x.idx").write_bytes(b"NOTANIDX!" + idx[9:])
    with pytest.raises(SourceError, match="bad magic"):
        MegatronIndex(str(tmp_path / "x"))
    (tmp_path / "x.idx").write_bytes(idx[:len(idx) // 2])
    with pytest.raises(SourceError, match="truncated"):
        MegatronIndex(str(tmp_path / "x"))
    (tmp_path / "x.idx").write_bytes(idx)
    (tmp_path / "x.bin").write_bytes(src.with_suffix(".bin").read_bytes()[:1000])
    with pytest.raises(SourceError, match="does not match"):
        MegatronIndex(str(tmp_path / "x"))


def test_a_directory_with_both_files_reads_each_document_once(layouts: dict[str, dict]) -> None:
    folder = str(Path(layouts["megatron"]["source"]["path"]).parent / "c4_text_document.*")
    recs = list(records({"sources": [{"path": folder, "format": "megatron"}]}))
    assert len(recs) == len(layouts["megatron"]["docs"])


def test_a_datasets_save_to_disk_folder(docs: list[np.ndarray], tmp_path: Path) -> None:
    """What ``datasets.map(tokenize).save_to_disk`` writes reads as a tokens source (labels dropped here)."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [x.tolist() for x in docs[:60]],
                                     "attention_mask": [[1] * len(x) for x in docs[:60]]})
    ds.save_to_disk(str(tmp_path / "saved"))
    recs = list(records({"sources": [{"path": str(tmp_path / "saved"), "format": "tokens", "tokens": {"labels": None}}]}))
    assert [r["input_ids"].tolist() for r in recs] == [x.tolist() for x in docs[:60]]
    assert all("labels" not in r for r in recs)


def test_writing_an_indexed_dataset_makes_its_folder_and_never_leaves_half_a_pair(tmp_path: Path) -> None:
    prefix = tmp_path / "not" / "yet" / "docs"
    assert write_indexed_dataset(str(prefix), [[1, 2, 3], [4]], np.uint16) == 2
    index = MegatronIndex(str(prefix))
    assert [index.document(i).tolist() for i in range(2)] == [[1, 2, 3], [4]]
    with pytest.raises(ValueError, match=r"document 1: token ids 0\.\.70000 do not fit uint16"):
        write_indexed_dataset(str(tmp_path / "big"), [[1], [0, 70000]], np.uint16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not"]   # no big.bin without its .idx, no temporaries


def test_a_forked_child_decodes_the_group_itself() -> None:
    """A child forked while a row group is decoded ahead in the parent finds no thread to finish it
    there: it decodes the group itself (it used to wait forever on the parent's future)."""
    import os
    import signal
    import time

    from feedline._sources.ahead import Ahead

    gate = threading.Event()
    ahead = Ahead(gate.wait)  # held on the read-ahead thread until the gate opens
    pid = os.fork()
    if pid == 0:  # the child: the future's thread is not here
        os._exit(0 if ahead.result() is None else 1)
    try:
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child waited on the parent's read-ahead for 20 s")
    finally:
        gate.set()
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert ahead.result() is True
