"""Pre-tokenized concat a batch at a time: the task map reads several chunks of a run at once
(tasks/runahead.py) and concat cuts a whole batch as one slice of the run (batching/concatrun.py).
Batches, states and statistics are those of the chunk-by-chunk, row-by-row path, over random
document lengths, two epochs, rows closed at max_docs_per_row and documents split by clm; resume
is exact at every step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import feedline._batching.concat as concat_mod
import feedline._tasks.map as map_mod
from feedline import Loader
from feedline._batching.concatrun import cut_values, lay_rows, run_rows
from feedline._batching.cuts import cut_rows
from feedline._batching.rows import collate_flat
from feedline._core.block import ExampleBlock
from feedline._tasks.map import TaskMapIterator
from feedline.testing import assert_batches_equal, assert_resumes_exactly, collect

EOS = 50256


def _flat(path: Path, seed: int, n_docs: int, long_share: float) -> list[int]:
    """A flat uint16 file of ``n_docs`` random documents (random ids, EOS last): mostly 1-120 tokens, a
    share of 100-400 (split by clm's max_length); returns their lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(n_docs) < long_share, rng.integers(100, 400, n_docs), rng.integers(1, 120, n_docs))
    ids = rng.integers(0, EOS, int(lengths.sum()), dtype=np.uint16)
    ends = np.cumsum(lengths)
    ids[ends - 1] = EOS
    ids.tofile(path)
    return lengths.tolist()


def _spec(path: Path, *, docs: int, max_length: int = 96, batch: int = 4, epochs: int = 2, split: int = 1 << 17,
          **batching: Any) -> dict:
    return {"sources": [{"path": str(path), "format": "flat", "split_bytes": split, "tokens": {"dtype": "uint16", "eos": EOS}}],
            "task": {"kind": "clm", "max_length": max_length}, "epochs": epochs, "seed": 3,
            "batching": {"strategy": "concat", "batch_size": batch, "max_docs_per_row": docs, **batching}}


def _row_by_row(m: pytest.MonkeyPatch) -> None:
    """The path before runs: a chunk read and processed at a time, a batch cut row by row from it."""
    m.setattr(map_mod, "read_run", lambda it, state: False)
    m.delattr(TaskMapIterator, "peek_run")
    m.setattr(concat_mod.ConcatIterator, "_run_batch", lambda self: None)


def _assert_row_by_row_gives(spec: dict, got: list, states: list, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The row-by-row path gives ``got`` and ``states`` (stats too) for ``spec``."""
    with monkeypatch.context() as m:
        _row_by_row(m)
        with Loader(spec) as ld:
            want, want_states = collect(ld, with_states=True)
    assert_batches_equal(got, want, where)
    assert [json.dumps(s, sort_keys=True) for s in states] == [json.dumps(s, sort_keys=True) for s in want_states]


def _count_runs(m: pytest.MonkeyPatch) -> dict[str, int]:
    seen = {"runs": 0, "whole": 0, "across": 0}
    read_run, cut = map_mod.read_run, concat_mod.run_rows

    def counted_read(it: Any, state: Any) -> bool:
        got = read_run(it, state)
        seen["runs"] += got
        return got

    def counted_cut(*a: Any) -> Any:
        got = cut(*a)
        seen["whole"] += got is not None
        seen["across"] += got is not None and len(got.src) > 1  # after the rest of the previous block's document
        return got

    m.setattr(map_mod, "read_run", counted_read)
    m.setattr(concat_mod, "run_rows", counted_cut)
    return seen


LAYOUTS = [{}, {"attention": "block_causal", "reset_positions": False}, {"mask_first_token": False}]


@pytest.mark.parametrize(("seed", "docs", "long_share", "max_length", "batch", "layout"), [
    (0, 64, 0.0, 96, 4, 0), (1, 3, 0.05, 96, 4, 1), (2, 6, 0.2, 64, 3, 0), (3, 64, 0.5, 128, 2, 2), (4, 2, 0.0, 32, 5, 0)])
def test_runs_give_the_batches_states_and_stats_of_the_row_by_row_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       seed: int, docs: int, long_share: float,
                                                                       max_length: int, batch: int, layout: int) -> None:
    _flat(tmp_path / "t.bin", seed, 3000, long_share)
    spec = _spec(tmp_path / "t.bin", docs=docs, max_length=max_length, batch=batch, **LAYOUTS[layout])
    with monkeypatch.context() as m:
        seen = _count_runs(m)
        with Loader(spec) as ld:
            got, states = collect(ld, with_states=True)
    assert seen["runs"] >= 1 and seen["whole"] > 10, seen  # both ran (batches with a row over the cap fall back)
    assert seen["across"] or docs == 2, seen  # a batch began with the rest of another block's document
    assert len(got) > 50
    _assert_row_by_row_gives(spec, got, states, monkeypatch, f"seed {seed}")


@pytest.mark.parametrize("seed", [5, 6])
def test_runs_resume_exactly_at_every_step(tmp_path: Path, seed: int) -> None:
    _flat(tmp_path / "t.bin", seed, 600, 0.1)
    assert assert_resumes_exactly(_spec(tmp_path / "t.bin", docs=8, max_length=64, epochs=2), every=1, check=2) > 40


def test_today_states_resume_into_the_run_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """States saved by the row-by-row path, resumed with runs, continue exactly as that path does."""
    _flat(tmp_path / "t.bin", 7, 800, 0.1)
    spec = _spec(tmp_path / "t.bin", docs=8, max_length=64)
    with monkeypatch.context() as m:
        _row_by_row(m)
        with Loader(spec) as ld:
            want, states = collect(ld, with_states=True)
    for at in range(0, len(states) - 1, 7):
        with Loader(spec, state=states[at]) as ld:
            got = collect(ld, limit=5)
        assert_batches_equal(got, want[at + 1:at + 6], f"resumed at {at}")


@pytest.mark.parametrize(("seed", "docs", "group", "long_share"), [(8, 64, 300, 0.0), (9, 64, 41, 0.2), (10, 3, 250, 0.05)])
def test_a_batch_across_row_groups_is_one_slice_of_the_joined_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    seed: int, docs: int, group: int,
                                                                    long_share: float) -> None:
    """A batch that runs past its block's end (a Parquet row group's, a run's) is cut from the block's
    examples left and the next block's first, joined into one (concatrun.join_blocks), instead of row
    by row; rows over max_docs_per_row still fall back. Batches, states and stats are the row-by-row
    path's, over two epochs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = _flat(tmp_path / "t.bin", seed, 2500, long_share)
    ids = np.fromfile(tmp_path / "t.bin", dtype=np.uint16).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
    pq.write_table(pa.table({"input_ids": column}), tmp_path / "t.parquet", row_group_size=group)
    spec = _spec(tmp_path / "t.bin", docs=docs)
    spec["sources"] = [{"path": str(tmp_path / "t.parquet"), "format": "tokens"}]
    seen = {"joined": 0, "row by row": 0}
    join, rows = concat_mod.join_blocks, concat_mod.ConcatIterator._rows

    def counted_join(*a: Any) -> Any:
        seen["joined"] += 1
        return join(*a)

    def counted_rows(self: Any, *a: Any) -> Any:
        seen["row by row"] += 1
        return rows(self, *a)

    with monkeypatch.context() as m:
        m.setattr(concat_mod, "join_blocks", counted_join)
        m.setattr(concat_mod.ConcatIterator, "_rows", counted_rows)
        with Loader(spec) as ld:
            got, states = collect(ld, with_states=True)
    assert seen["joined"] > (10 if docs == 64 else 0), seen
    # (row by row: the stream's last batch, a next block shorter than the batch's rest; at 3 pieces a
    # row, rows that reach the cap too)
    assert seen["row by row"] * 4 < seen["joined"] if docs == 64 else seen["row by row"] > 0, seen
    assert len(got) > 100
    _assert_row_by_row_gives(spec, got, states, monkeypatch, f"seed {seed}")


def _ragged(rng: np.random.Generator) -> np.ndarray:
    return np.where(rng.random(400) < 0.1, rng.integers(20, 90, 400), rng.integers(1, 12, 400))


@pytest.mark.parametrize("seed", range(40))
def test_run_rows_is_cut_rows_on_a_contiguous_block(seed: int) -> None:
    """Without a carry, the whole-batch cut equals cut_rows' rows (pieces, per-row counts, split documents,
    the rest), or declines exactly where cut_rows would make fewer rows (a row over the cap)."""
    rng = np.random.default_rng(seed)
    lengths = _ragged(rng)
    ends = np.cumsum(lengths)
    blk = ExampleBlock(np.zeros((len(lengths), 5), np.int64), np.arange(len(lengths)), ends - lengths, lengths,
                       {"input_ids": np.arange(int(ends[-1]))})
    rows, width, cap = int(rng.integers(1, 6)), int(rng.integers(8, 40)), int(rng.integers(2, 9))
    got, want = run_rows(blk, ends, 0, None, rows, width, cap), cut_rows(ends, rows, width, cap)
    if want is None or want.rows < rows:
        assert got is None
        return
    assert got is not None
    assert got.docs.tolist() == want.docs.tolist()
    assert got.lengths.tolist() == (want.stop - want.start).tolist()
    assert (got.taken, got.split, got.rest, got.src) == (want.used, int(want.split.sum()), want.rest, [(blk.fields, 0, rows * width)])


@pytest.mark.parametrize("seed", range(12))
def test_lay_rows_is_collate_flat_on_full_rows(seed: int) -> None:
    """The whole batch's layout equals the general one: fields, dtypes, key order."""
    rng = np.random.default_rng(seed)
    lengths = _ragged(rng)
    ends = np.cumsum(lengths)
    dtype = (np.int32, np.int64, np.uint16)[seed % 3]
    ids = rng.integers(0, 5000, int(ends[-1])).astype(dtype)
    fields = {"input_ids": ids, "labels": ids}
    blk = ExampleBlock(np.zeros((len(lengths), 5), np.int64), np.arange(len(lengths)), ends - lengths, lengths, fields)
    rows, width, cap = int(rng.integers(1, 6)), int(rng.integers(8, 40)), 64
    start = int(rng.integers(1, 20))
    carry = (blk.slice(start - 1, start), int(rng.integers(0, lengths[start - 1])))
    cut = run_rows(blk, ends, start, carry, rows, width, cap)
    assert cut is not None
    values = cut_values(cut)
    for reset, mask in ((True, True), (False, True), (True, False)):
        got = lay_rows(cut, values, fields, width, cap, reset_positions=reset, mask_first=mask)
        want = collate_flat(cut.docs, cut.lengths, values, width, cap, {}, like=fields, reset_positions=reset,
                            mask_first=mask, attention="padding")
        assert list(got) == list(want)
        assert_batches_equal([got], [want], f"seed {seed}")


@pytest.mark.parametrize("seed", range(20))
def test_run_rows_continues_another_blocks_document(seed: int) -> None:
    """A carry from the block before (another array): its rest, then the block, as cut_rows cuts the
    stream of both; the tokens are the two slices end to end."""
    rng = np.random.default_rng(seed)
    before, lengths = _ragged(rng)[:30], _ragged(rng)
    ids_a, ids_b = np.arange(int(before.sum())) + 10_000, np.arange(int(lengths.sum()))
    a = ExampleBlock(np.zeros((30, 5), np.int64), np.arange(30), np.cumsum(before) - before, before, {"input_ids": ids_a})
    ends = np.cumsum(lengths)
    b = ExampleBlock(np.zeros((len(lengths), 5), np.int64), np.arange(len(lengths)), ends - lengths, lengths,
                     {"input_ids": ids_b})
    rows, width = int(rng.integers(1, 5)), int(rng.integers(16, 40))
    rest = int(rng.integers(1, before[-1])) if before[-1] > 1 else 0
    cut = run_rows(b, ends, 0, (a.slice(29, 30), rest), rows, width, 64)
    head = int(before[-1]) - rest
    want = cut_rows(np.concatenate([[head], ends + head]), rows, width, 64)
    if head >= rows * width:
        assert cut is None
        return
    assert cut is not None and want is not None and want.rows == rows
    assert cut.docs.tolist() == want.docs.tolist() and cut.lengths.tolist() == (want.stop - want.start).tolist()
    assert (cut.taken, cut.split, cut.rest) == (want.used - 1, int(want.split[1:].sum()), want.rest)
    tokens = cut_values(cut)["input_ids"]
    assert tokens.tolist() == np.concatenate([ids_a[len(ids_a) - head:], ids_b])[:rows * width].tolist()
