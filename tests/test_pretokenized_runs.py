"""Pre-tokenized sources hand documents on as runs of arrays (TokenItems -> TokenRecords -> one
ExampleBlock per chunk), with the batches and states of the per-record path, resumed at every step."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import shared
from feedline import Loader
from feedline._core.dataset import Dataset, DatasetIterator
from feedline._core.documents import TokenRecords, chunk_steps, join_records
from feedline._core.record import Record
from feedline._pipeline import Pipeline
from feedline._sources.flat import LLMC_MAGIC, FlatReader
from feedline._sources.megatron import MegatronReader, write_indexed_dataset
from feedline._sources.tokens import TokensReader
from feedline._spec import Spec
from feedline._tasks.sizing import read_chunk
from feedline._tokenize.load import load_tokenizer
from feedline.testing import assert_resumes_exactly, collect

EOS = 50256
READERS = (FlatReader, MegatronReader, TokensReader)


@pytest.fixture(scope="module")
def docs() -> list[np.ndarray]:
    """The 300 C4 documents as GPT-2 ids with EOS, cut to 7-89 tokens (many documents a row), four times
    over (~58 K tokens: two splits of 64 KiB in the flat and Megatron files)."""
    texts = [json.loads(line)["text"] for line in shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()]
    tok = load_tokenizer(str(shared("tokenizers", "gpt2")))
    ids = tok.encode_batch(texts)
    return [np.append(ids[i % len(ids)][: 7 + i % 83], EOS).astype(np.int32) for i in range(4 * len(ids))]


@pytest.fixture(scope="module")
def sources(docs: list[np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    d = tmp_path_factory.mktemp("runs")
    ids = pa.array([x.tolist() for x in docs], pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": ids}), d / "t.parquet", row_group_size=300)
    table = pa.table({"input_ids": pa.array([x.tolist() for x in docs], pa.large_list(pa.int64()))})
    with pa.OSFile(str(d / "t.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table, max_chunksize=200)
    write_indexed_dataset(str(d / "m_text_document"), docs, np.uint16)
    np.concatenate(docs).astype(np.uint16).tofile(d / "train.bin")
    first = np.concatenate([np.insert(x[:-1], 0, EOS) for x in docs]).astype(np.uint16)
    header = np.zeros(256, np.int32)
    header[:3] = [LLMC_MAGIC, 1, len(first)]
    (d / "llmc.bin").write_bytes(header.tobytes() + first.tobytes())
    small = 1 << 16  # the least split
    return {"parquet": {"path": str(d / "t.parquet"), "format": "tokens"},
            "arrow": {"path": str(d / "t.arrow"), "format": "tokens"},
            "megatron": {"path": str(d / "m_text_document.bin"), "split_bytes": small},
            "flat": {"path": str(d / "train.bin"), "format": "flat", "split_bytes": small,
                     "tokens": {"dtype": "uint16", "eos": EOS}},
            "llmc": {"path": str(d / "llmc.bin"), "split_bytes": small, "tokens": {"eos": EOS}}}


def _spec(source: dict, strategy: str, **over: object) -> dict:
    spec = {"sources": [source], "task": {"kind": "clm", "max_length": 128}, "seed": 5,
            "batching": {"strategy": strategy, "batch_size": 8, "max_docs_per_row": 9}}
    spec.update(over)
    return spec


def _batches_and_states(spec: dict) -> tuple[list[dict], list[dict]]:
    with Loader(spec) as ld:
        return collect(ld, with_states=True)


@pytest.mark.parametrize("layout", ["parquet", "arrow", "megatron", "flat", "llmc"])
@pytest.mark.parametrize("strategy", ["pack", "concat"])
@pytest.mark.slow
def test_runs_give_the_batches_and_states_of_the_per_record_path(layout: str, strategy: str, sources: dict,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(sources[layout], strategy, epochs=2)
    batches, states = _batches_and_states(spec)
    assert len(batches) > 40
    with monkeypatch.context() as m:
        for cls in READERS:
            m.setattr(cls, "read_batches", lambda self, split, position, line: None)
        want, want_states = _batches_and_states(spec)
    assert len(batches) == len(want)
    for i, (a, b) in enumerate(zip(batches, want, strict=True)):
        assert sorted(a) == sorted(b), i
        for k in a:
            assert np.array_equal(a[k], b[k]), (i, k)
    assert [json.dumps(s, sort_keys=True) for s in states] == [json.dumps(s, sort_keys=True) for s in want_states]


@pytest.mark.parametrize("layout", ["parquet", "megatron", "flat"])
@pytest.mark.slow
def test_runs_resume_exactly_at_every_step(layout: str, sources: dict) -> None:
    assert assert_resumes_exactly(_spec(sources[layout], "pack"), every=1, check=2) > 40
    assert assert_resumes_exactly(_spec(sources[layout], "concat", shuffle={"buffer": 16}), every=1, check=2) > 40


@pytest.mark.parametrize("layout", ["parquet", "arrow", "megatron", "flat"])
def test_a_source_hands_on_runs_not_records(layout: str, sources: dict, docs: list[np.ndarray]) -> None:
    """One take of a pre-tokenized source is a TokenRecords over the reader's buffer (no record objects);
    indexed, it gives the records the per-record path gives."""
    it = iter(Pipeline(Spec.load(_spec(sources[layout], "pack"))).records())
    got = it.take(200)
    assert isinstance(got, TokenRecords) and len(got) == 200
    assert [r.data["input_ids"].tolist() for r in got[195:]] == [x.tolist() for x in docs[195:200]]
    assert all(r.data["input_ids"].dtype == np.int32 for r in got[:3])
    joined = join_records([got[:10], it.take(5)])
    assert isinstance(joined, TokenRecords) and len(joined) == 15
    assert joined[10].key[2] == got[-1].key[2] + (len(docs[199]) if layout == "flat" else 1)


def test_a_block_with_a_null_row_takes_the_per_record_path(tmp_path: Path, docs: list[np.ndarray]) -> None:
    """A row group holding a null row is read per record: the null is counted as a rejection, and the
    stream equals the per-record path's."""
    rows = [x.tolist() for x in docs[:120]]
    rows[75] = None
    pq.write_table(pa.table({"input_ids": pa.array(rows, pa.list_(pa.int32()))}), tmp_path / "n.parquet", row_group_size=50)
    spec = _spec({"path": str(tmp_path / "n.parquet"), "format": "tokens"}, "concat")
    with Loader(spec) as ld:
        batches = collect(ld)
        assert ld.stats()["rejected"] == {"null_ids": 1}
    stream = np.concatenate([b["input_ids"][b["attention_mask"] == 1] for b in batches])
    want = np.concatenate([np.asarray(r, np.int32) for r in rows if r is not None])
    assert len(want) - 8 * 128 < len(stream) <= len(want)  # (the last, partial batch is dropped)
    assert stream.tolist() == want[:len(stream)].tolist()


@pytest.mark.slow
def test_chunk_steps_is_read_chunk_on_the_sizes_ahead() -> None:
    """A chunk planned from a run's sizes (one take) holds the records read_chunk's doubling takes read."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        sizes = rng.integers(0, 4000, int(rng.integers(1, 400))) * 4
        most, budget = int(rng.integers(1, 300)), int(rng.choice([64, 4096, 1 << 16, 1 << 20]))
        recs = [Record((0, 0, i), 0, {"input_ids": np.zeros(s // 4, np.int32)}) for i, s in enumerate(sizes.tolist())]
        it = iter(_List(recs))
        got, _size, ended = read_chunk(it, most, budget)
        planned = chunk_steps(sizes, most, budget)
        assert (planned is None and ended) or planned == len(got), (sizes.tolist(), most, budget)


@pytest.mark.slow
def test_read_chunk_takes_the_rest_of_a_run_at_once() -> None:
    """A chunk that crosses the end of its parent's run (``run_sizes``: a Parquet row group's last
    records) takes the records inside the run in one take and goes on with the doubling takes from
    there: the same records and size as the doubling takes, in fewer takes."""
    rng = np.random.default_rng(2)
    fewer = 0
    for _ in range(300):
        sizes = rng.integers(0, 400, int(rng.integers(2, 400))) * 4
        most, budget = int(rng.integers(1, 300)), int(rng.choice([64, 4096, 1 << 16, 1 << 20]))
        run = int(rng.integers(1, len(sizes)))
        recs = [Record((0, 0, i), 0, {"input_ids": np.zeros(s // 4, np.int32)}) for i, s in enumerate(sizes.tolist())]
        plain, in_runs = _ListIterator(recs), _RunIterator(recs, run)
        want, got = read_chunk(plain, most, budget), read_chunk(in_runs, most, budget)
        assert [r.key for r in got[0]] == [r.key for r in want[0]] and got[1:] == want[1:]
        assert in_runs.takes <= plain.takes
        fewer += in_runs.takes < plain.takes
    assert fewer > 100


def test_read_chunk_takes_the_next_run_at_once_once_a_take_reaches_it() -> None:
    """A chunk across the end of a run (a Parquet row group) takes the rest of that run in one take,
    crosses with the next doubling take, and then takes what the next run holds of the chunk in one
    take: the bench's short documents (a chunk of 256 starting 8 records before a group of 2,048
    ends) in 3 takes where they were 6 (the run's 8, then doubling takes of 8, 16, 32, 64 and 128);
    the same records and size as the doubling takes, over random sizes, runs and budgets."""
    recs = [Record((0, 0, i), 0, {"input_ids": np.zeros(70, np.int32)}) for i in range(4096)]
    plain, one, in_runs = _ListIterator(recs), _RunIterator(recs, 2048), _RunsIterator(recs, [2048, 4096])
    plain.at = one.at = in_runs.at = 2040
    want, before, got = (read_chunk(it, 256, 1 << 20) for it in (plain, one, in_runs))
    assert [r.key for r in got[0]] == [r.key for r in want[0]] == [r.key for r in before[0]] == [(0, 0, i) for i in range(2040, 2296)]
    assert got[1:] == want[1:] == before[1:] and (one.takes, in_runs.takes) == (6, 3)
    rng = np.random.default_rng(5)
    fewer = 0
    for _ in range(300):
        sizes = rng.integers(0, 400, int(rng.integers(2, 400))) * 4
        most, budget = int(rng.integers(1, 300)), int(rng.choice([64, 4096, 1 << 16, 1 << 20]))
        ends = sorted(set(rng.integers(1, len(sizes) + 1, int(rng.integers(1, 6))).tolist()) | {len(sizes)})
        recs = [Record((0, 0, i), 0, {"input_ids": np.zeros(s // 4, np.int32)}) for i, s in enumerate(sizes.tolist())]
        one, runs = _RunIterator(recs, ends[0]), _RunsIterator(recs, ends)
        want, got = read_chunk(one, most, budget), read_chunk(runs, most, budget)
        assert [r.key for r in got[0]] == [r.key for r in want[0]] and got[1:] == want[1:]
        assert runs.takes <= one.takes
        fewer += runs.takes < one.takes
    assert fewer > 20


class _List(Dataset[Record]):
    def __init__(self, recs: list[Record]) -> None:
        self.recs = recs

    def __iter__(self) -> DatasetIterator[Record]:
        return _ListIterator(self.recs)


class _ListIterator(DatasetIterator[Record]):
    def __init__(self, recs: list[Record]) -> None:
        self.recs, self.at = recs, 0

    def __next__(self) -> Record:
        if self.at >= len(self.recs):
            raise StopIteration
        self.at += 1
        return self.recs[self.at - 1]

    def own_state(self) -> dict:
        return {"at": self.at}

    def restore(self, own: dict) -> None:
        self.at = own["at"]

    def take(self, n: int) -> list[Record]:
        self.takes = getattr(self, "takes", 0) + 1
        self.at += len(got := self.recs[self.at:self.at + n])
        return got


class _RunIterator(_ListIterator):
    """Records whose first ``run`` are a run: their sizes are known ahead."""

    def __init__(self, recs: list[Record], run: int) -> None:
        super().__init__(recs)
        self.run = run

    def run_sizes(self, most: int) -> np.ndarray | None:
        if self.at >= self.run:
            return None
        return np.array([len(r.data["input_ids"]) * 4 for r in self.recs[self.at:min(self.run, self.at + most)]])


def test_pickled_runs_carry_only_their_own_ids(sources: dict) -> None:
    """A run sent to another process (a Ray worker) pickles the ids its records use, not the memory map."""
    it = iter(Pipeline(Spec.load(_spec(sources["flat"], "pack"))).records())
    it.take(100)
    got = it.take(50)
    data = pickle.dumps(got)
    assert len(data) < 8 * sum(len(r.data["input_ids"]) for r in got) + 4096
    back = pickle.loads(data)
    assert [(r.key, r.data["input_ids"].tolist()) for r in back] == [(r.key, r.data["input_ids"].tolist()) for r in got]


@pytest.mark.parametrize("layout", ["parquet", "flat"])
def test_clm_processes_runs_in_the_reading_thread(layout: str, sources: dict) -> None:
    """A chunk of pre-tokenized runs is a copy for clm: no task thread is started for it (the hand-off
    cost more than the copy)."""
    import threading

    before = set(threading.enumerate())  # (earlier tests' task threads may still be ending)
    with Loader(_spec(sources[layout], "concat")) as ld:
        it = iter(ld)
        for _ in range(20):
            next(it)
        assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("feedline-task")]


def test_an_inline_run_raises_where_its_examples_are_taken(sources: dict) -> None:
    """The runner processes a run at submit but keeps its error for ``result``, as a thread's future does."""
    from feedline._tasks.map import ThreadRunner

    class Broken:
        inline_runs = True

        def process_block(self, records: object) -> None:
            raise ValueError("boom")

    it = iter(Pipeline(Spec.load(_spec(sources["flat"], "pack"))).records())
    runner = ThreadRunner(Broken(), 1)  # type: ignore[arg-type]
    handle = runner.submit(it.take(10))
    with pytest.raises(ValueError, match="boom"):
        runner.result(handle, {})
    assert runner.pool is None


@pytest.mark.parametrize(("dtype", "ids", "vocab", "ok"), [
    (np.uint16, [0, 65535], None, True), (np.uint16, [0, 50257], 50257, False), (np.uint16, [0, 65535], 70000, True),
    (np.int32, [-1, 5], None, False), (np.int32, [0, 5], 6, True), (np.int64, [0, 6], 6, False), (np.uint32, [9], 9, False)])
def test_clm_checks_only_the_bounds_the_stored_dtype_leaves_open(dtype: type, ids: list[int], vocab: int | None,
                                                                 ok: bool) -> None:
    from feedline._tasks.clm import _in_range

    stored = np.asarray(ids, dtype)
    assert _in_range(stored.dtype, stored.astype(np.int32) if dtype != np.int64 else stored, vocab) is ok


def test_a_run_with_an_id_past_the_vocabulary_is_rejected(tmp_path: Path, docs: list[np.ndarray]) -> None:
    """uint16 ids from a flat file are checked against a tokenizer's vocabulary (GPT-2's 50,257 < 65,536)."""
    flat = np.concatenate(docs[:200]).astype(np.uint16)
    flat[int(np.sum([len(d) for d in docs[:50]])) + 2] = 60000  # inside document 50
    flat.tofile(tmp_path / "bad.bin")
    spec = _spec({"path": str(tmp_path / "bad.bin"), "format": "flat", "tokens": {"dtype": "uint16", "eos": EOS}},
                 "concat", tokenizer=str(shared("tokenizers", "gpt2")))
    with Loader(spec) as ld:
        collect(ld)
        assert ld.stats()["rejected"] == {"token_out_of_range": 1}


@pytest.mark.parametrize("layout", ["megatron", "flat"])
def test_clm_keeps_a_runs_uint16_ids_as_a_view_of_the_map(layout: str, sources: dict, docs: list[np.ndarray]) -> None:
    """A run's block holds the stored uint16 ids, a plain ndarray view of the memory map (the batch or the
    pack pool converts them to int32 in its own copy); one example of it is an int32 copy."""
    pipeline = Pipeline(Spec.load(_spec(sources[layout], "concat")))
    recs = iter(pipeline.records()).take(200)
    block = pipeline.task.process_block(recs)
    ids = block.fields["input_ids"]
    assert type(ids) is np.ndarray and ids.dtype == np.uint16 and np.shares_memory(ids, recs.ids)
    assert block.fields["labels"] is ids
    ex = block[3]
    assert ex.fields["input_ids"].dtype == np.int32 and ex.fields["input_ids"].tolist() == docs[3].tolist()


@pytest.mark.parametrize("batch_rows", [600, 200])
def test_arrow_blocks_end_at_record_batches_and_view_the_file(batch_rows: int, docs: list[np.ndarray],
                                                              tmp_path: Path) -> None:
    """An Arrow file's blocks end where its record batches end (600 rows: no Arrow memory is allocated, the
    ids are views of the mapped file; batches of 200, under the 512 rows that make a block of their own,
    are joined up to 8,192 rows into one copy), and pack and concat give the per-record path's batches
    and states either way."""
    from feedline._sources.reader import Split

    table = pa.table({"input_ids": pa.array([x.tolist() for x in docs], pa.list_(pa.int32()))})
    path = tmp_path / "b.arrow"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table, max_chunksize=batch_rows)
    reader = TokensReader(Spec.load(_spec({"path": str(path), "format": "tokens"}, "pack")).sources[0])
    spans, allocated, held = [], [], pa.total_allocated_bytes()  # (the table written above)
    for items in reader.read_batches(Split(0, str(path)), 0, 0):
        spans.append((int(items.position[0]), int(items.position[-1]) + 1))
        allocated.append(pa.total_allocated_bytes() - held)
    assert spans[0][0] == 0 and spans[-1][1] == len(docs)
    if batch_rows == 600:
        assert spans == [(a, min(a + 600, len(docs))) for a in range(0, len(docs), 600)]
        assert max(allocated) == 0
    else:
        assert spans == [(0, len(docs))] and max(allocated) > 0
    for strategy in ("pack", "concat"):
        spec = _spec({"path": str(path), "format": "tokens"}, strategy, epochs=2)
        got, got_states = _batches_and_states(spec)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(TokensReader, "read_batches", lambda self, split, position, line: None)
            want, want_states = _batches_and_states(spec)
        assert len(got) == len(want) > 20
        for a, b in zip(got, want, strict=True):
            assert all(np.array_equal(a[k], b[k]) for k in b)
        assert got_states == want_states


class _RunsIterator(_ListIterator):
    """Records in runs that end at ``ends``: the sizes of the current run's next records are known ahead."""

    def __init__(self, recs: list[Record], ends: list[int]) -> None:
        super().__init__(recs)
        self.ends = ends

    def run_sizes(self, most: int) -> np.ndarray | None:
        end = next((e for e in self.ends if e > self.at), None)
        if end is None:
            return None
        return np.array([len(r.data["input_ids"]) * 4 for r in self.recs[self.at:min(end, self.at + most)]])
