"""The pack batcher gathers its ready rows several batches at a time and lays batches of full rows
out straight from their tokens (:mod:`feedline._batching.readyrows`): the batches, compact batches
and states are those of gathering each batch's rows alone and laying it out with collate_flat, on
real documents in a flat token file, to the end of the data and across a resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import shared
from feedline import Loader
from feedline._batching import pack, readyrows
from feedline._batching.compact import CompactBatch
from feedline._pipeline import Pipeline
from feedline._spec import Spec
from feedline._testing import assert_resumes_exactly, collect
from feedline._tokenize.load import load_tokenizer

EOS = 50256


@pytest.fixture(scope="module")
def flat_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The 300 C4 documents as GPT-2 ids with EOS, cut to 5-150 tokens, three times over, as a uint16 file."""
    texts = [json.loads(line)["text"] for line in shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()]
    ids = load_tokenizer(str(shared("tokenizers", "gpt2"))).encode_batch(texts)
    docs = [np.append(ids[i % len(ids)][: 5 + i * 7 % 146], EOS) for i in range(3 * len(ids))]
    path = tmp_path_factory.mktemp("ready") / "train.bin"
    np.concatenate(docs).astype(np.uint16).tofile(path)
    return str(path)


def _spec(path: str, max_length: int = 64, **batching: object) -> dict:
    return {"sources": [{"path": path, "format": "flat", "tokens": {"dtype": "uint16", "eos": EOS}}],
            "task": {"kind": "clm", "max_length": max_length}, "epochs": 1,
            "batching": {"strategy": "pack", "batch_size": 6, "window": 200, **batching}}


def _one_batch_at_a_time(m: pytest.MonkeyPatch) -> None:
    """Gather each batch's rows alone and lay them out with collate_flat (the path before)."""
    def expand(self: readyrows.ReadyRows, rows: int) -> tuple[dict, int]:
        compact = self.next_compact(rows)
        return compact.expand(), compact.tokens()

    m.setattr(pack, "rows_to_gather", lambda ready, batch_rows, max_length: min(ready, batch_rows))
    m.setattr(readyrows.ReadyRows, "next_batch", expand)


@pytest.mark.parametrize(("attention", "max_length"), [("padding", 64), ("padding", 12), ("block_causal", 64)])
def test_gathered_rows_give_the_batches_and_states_of_one_batch_at_a_time(flat_file: str, attention: str, max_length: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of 64 hold several documents (few batches of full rows); rows of 12 are mostly one piece
    of a longer document (most batches full: laid out by lay_rows)."""
    spec = _spec(flat_file, max_length, attention=attention)
    gathered = []
    real = readyrows.ReadyRows.__init__

    def counting(self: readyrows.ReadyRows, *args: object, **kw: object) -> None:
        real(self, *args, **kw)  # type: ignore[arg-type]
        gathered.append(len(self))

    with monkeypatch.context() as m:
        m.setattr(readyrows.ReadyRows, "__init__", counting)
        with Loader(spec) as ld:
            batches, states = collect(ld, with_states=True)
    assert max(gathered) > 6 and len(batches) > 20   # several batches gathered at once, to the end
    with monkeypatch.context() as m:
        _one_batch_at_a_time(m)
        with Loader(spec) as ld:
            want, want_states = collect(ld, with_states=True)
    assert len(batches) == len(want)
    full = sum(int((b["seq_lens"].sum(axis=1) == max_length).all()) for b in batches)   # batches of full rows
    assert full > len(batches) // 2 if max_length == 12 else 0 < full < len(batches) - 5, (full, len(batches))
    for i, (a, b) in enumerate(zip(batches, want, strict=True)):
        assert list(a) == list(b), i
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (i, k)
    assert states == want_states


def test_compact_batches_are_views_that_lay_out_to_the_batches(flat_file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """next_compact (the service's path) hands out slices of the gathered rows, fields that share an
    array still sharing one; laid out, they are the in-process batches. A laid-out batch owns its arrays."""
    spec = Spec.load(_spec(flat_file))
    with Loader(spec) as ld:
        want = collect(ld)
    it = iter(Pipeline(spec).batches())
    got = []
    while True:
        try:
            compact = it.next_compact()
        except StopIteration:
            break
        assert compact.values["labels"] is compact.values["input_ids"]
        got.append(compact.expand())
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        for k in b:
            assert np.array_equal(a[k], b[k]), k
    it = iter(Pipeline(spec).batches())
    first, second = next(it), next(it)
    for k, v in first.items():
        assert v.base is None or not np.shares_memory(v, second[k]), k
    first["input_ids"][:] = -1   # a consumer writing into a batch changes no other
    assert (next(it)["input_ids"] >= 0).all()


@pytest.mark.slow
def test_gathered_rows_resume_exactly_at_every_step(flat_file: str) -> None:
    assert assert_resumes_exactly(_spec(flat_file, first_window=8), every=1, check=3) > 20


@pytest.mark.parametrize(("attention", "compacted"), [("padding", False), ("block_causal", True)])
def test_short_pieces_are_laid_out_from_the_arena_without_a_gathered_copy(flat_file: str, attention: str, compacted: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of ~80 tokens in rows of 64 (padding masks): each gathered set of ready rows is laid out
    straight from the pool's arena, no compact batch (a gathered copy of the tokens) built in between;
    block masks still expand compact batches (the counter counts). The batches are checked against
    the one-batch-at-a-time path by the tests above."""
    made = []
    real = CompactBatch.__init__

    def counting(self: CompactBatch, *args: object) -> None:
        made.append(1)
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(CompactBatch, "__init__", counting)
    with Loader(_spec(flat_file, attention=attention)) as ld:
        batches = collect(ld)
    assert len(batches) > 20
    assert bool(made) is compacted, len(made)


def test_a_batch_of_laid_out_short_pieces_is_rows_of_the_gathered_layout(flat_file: str) -> None:
    """Short pieces laid out several batches at a time are handed out as those rows (views, no copy per
    batch): consecutive batches share the gathered layout but no memory, and a consumer writing into
    one batch changes no other."""
    with Loader(_spec(flat_file)) as ld:
        it = iter(ld)
        first, second = next(it), next(it)
        views = [k for k, v in first.items() if v.base is not None and np.shares_memory(v.base, second[k])]
        assert sorted(views) == sorted(first), sorted(first.keys() - set(views))
        assert not any(np.shares_memory(v, second[k]) for k, v in first.items())
        want = {k: v.copy() for k, v in second.items()}
        for v in first.values():
            v[...] = -7
        assert all(np.array_equal(second[k], want[k]) for k in want)


def test_rows_gathered_after_a_window_are_located_from_the_ids_the_window_kept(flat_file: str,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The ready rows' ids, flattened once a window to keep them in the pool, also locate the first
    rows gathered after it (no second pass over the rows); a later gather of the same window reads
    its own rows. The ids handed on are the rows' own, and the batches those of reading the rows."""
    real = pack.PiecePool.locate
    handed: list[bool] = []

    def locate(self: pack.PiecePool, rows: list, flat: tuple | None = None) -> object:
        if flat is not None:
            assert flat[0].tolist() == [len(r) for r in rows] and flat[1].tolist() == [i for r in rows for i in r]
        handed.append(flat is not None)
        return real(self, rows, flat)

    spec = _spec(flat_file, 64)
    monkeypatch.setattr(pack, "rows_to_gather", lambda ready, batch_rows, max_length: min(ready, batch_rows))  # a gather a batch
    with monkeypatch.context() as m:
        m.setattr(pack.PiecePool, "locate", locate)
        with Loader(spec, prefetch=0) as loader:
            got = collect(loader, limit=80)
    assert 0 < sum(handed) < len(handed)   # the first gather after each window, not the others
    with monkeypatch.context() as m:
        m.setattr(pack.PiecePool, "locate", lambda self, rows, flat=None: real(self, rows))
        with Loader(spec, prefetch=0) as loader:
            want = collect(loader, limit=80)
    assert len(got) == len(want) == 80
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def long_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Long documents (the C4 ones of 150 tokens or more, twice over) as a uint16 flat file, and as a
    Parquet file with a labels column of its own (each document's first 3 tokens -100, the rest its ids)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [json.loads(line)["text"] for line in shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()]
    ids = [x for x in load_tokenizer(str(shared("tokenizers", "gpt2"))).encode_batch(texts) if len(x) >= 150]
    docs = [np.append(x, EOS).astype(np.int32) for x in ids * 2]
    d = tmp_path_factory.mktemp("long")
    np.concatenate(docs).astype(np.uint16).tofile(d / "train.bin")
    labels = [np.concatenate([np.full(3, -100, np.int32), x[3:]]) for x in docs]
    pq.write_table(pa.table({"input_ids": pa.array([x.tolist() for x in docs], pa.list_(pa.int32())),
                             "labels": pa.array([x.tolist() for x in labels], pa.list_(pa.int32()))}),
                   d / "train.parquet", row_group_size=64)
    flat = _spec(str(d / "train.bin"))["sources"]
    return {"flat": {"sources": flat}, "parquet": {"sources": [{"path": str(d / "train.parquet"), "format": "tokens"}]}}


@pytest.mark.parametrize(("source", "max_length", "mask_first"),
                         [("flat", 256, True), ("flat", 512, False), ("parquet", 256, True), ("parquet", 384, False),
                          ("flat", 1024, True)])
def test_long_pieces_are_laid_out_from_the_arena_a_slice_a_piece(long_files: dict[str, dict], source: str,
                                                                max_length: int, mask_first: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of about a row each (documents of 150-1,000+ tokens in rows of 256-512; in rows of 1,024,
    2-4 of them) are laid out
    several batches at a time straight from the arena, a slice a piece, no compact batch (a gathered
    copy) built in between: the batches (rows full and padded, first tokens masked or not, labels
    that share the ids' tokens or have their own) and states are those of gathering each batch's
    rows alone and laying them out with collate_flat."""
    spec = {**_spec("", max_length, mask_first_token=mask_first, window=64), **long_files[source]}
    made = []
    real = CompactBatch.__init__

    def counting(self: CompactBatch, *args: object) -> None:
        made.append(1)
        real(self, *args)  # type: ignore[arg-type]

    pieces = []   # each gather's pieces a row
    gather = readyrows.ReadyRows.__init__

    def gathering(self: readyrows.ReadyRows, *args: object, **kw: object) -> None:
        gather(self, *args, **kw)  # type: ignore[arg-type]
        pieces.append(len(self._loc.lengths) / len(self))

    with monkeypatch.context() as m:
        m.setattr(CompactBatch, "__init__", counting)
        m.setattr(readyrows.ReadyRows, "__init__", gathering)
        with Loader(spec) as ld:
            batches, states = collect(ld, with_states=True)
    assert not made and len(batches) > 20
    with monkeypatch.context() as m:
        _one_batch_at_a_time(m)
        with Loader(spec) as ld:
            want, want_states = collect(ld, with_states=True)
    full = sum(int((b["seq_lens"].sum(axis=1) == max_length).all()) for b in want)
    assert 0 < full < len(want) - 3, (full, len(want))   # batches of full rows and padded ones
    docs = np.concatenate([(b["seq_lens"] > 0).sum(axis=1) for b in want])
    assert docs.max() > 1 and (max_length < 1024 or max(pieces) > 2), max(pieces)   # rows of 1024: gathers of 2-4 a row
    assert len(batches) == len(want)
    for i, (a, b) in enumerate(zip(batches, want, strict=True)):
        assert list(a) == list(b), i
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (i, k)
    assert states == want_states


@pytest.mark.parametrize("max_length", [64, 12])
def test_no_ready_row_is_laid_out_twice(flat_file: str, max_length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ready rows are gathered in whole batches (all of them only at the data's end): the rows a window
    leaves after its last whole batch wait for the next window's, so every row delivered is gathered
    (and laid out) once, where those rows were gathered again after each window."""
    gathered, taken = [], []
    real, take = readyrows.ReadyRows.__init__, readyrows.ReadyRows._take

    def counting(self: readyrows.ReadyRows, *args: object, **kw: object) -> None:
        real(self, *args, **kw)  # type: ignore[arg-type]
        gathered.append(len(self))

    def taking(self: readyrows.ReadyRows, rows: int) -> tuple[int, int]:
        taken.append(rows)
        return take(self, rows)

    monkeypatch.setattr(readyrows.ReadyRows, "__init__", counting)
    monkeypatch.setattr(readyrows.ReadyRows, "_take", taking)
    with Loader(_spec(flat_file, max_length, first_window=8)) as ld:
        batches = collect(ld)
    assert len(gathered) > 10 and len(batches) > 20
    assert sum(gathered) == sum(taken) >= sum(len(b["input_ids"]) for b in batches)
    assert all(n % 6 == 0 for n in gathered[:-1])
