"""Unit tests of the packing algorithm, the planner and the bucket batcher; doctests of the batching modules."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline import Loader
from feedline._batching.bestfit import BestFitPacker
from feedline._batching.planner import assign_rows, complete_batch, slice_for_rank
from feedline._batching.rows import collate_flat
from feedline._pipeline import GlobalStream, Pipeline
from feedline.errors import SpecError
from feedline.testing import assert_resumes_exactly, collect

HISTOGRAMS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "packing_sim" / "histograms.py"


@pytest.mark.parametrize("module", ["base", "bestfit", "rows", "planner"])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"feedline._batching.{module}"))
    assert result.failed == 0


def layout_reference(docs: list[int], lengths: list[int], values: dict[str, np.ndarray], max_length: int, max_docs: int,
                     pads: dict[str, int], mask_first: bool, attention: str) -> dict[str, np.ndarray]:
    """The packed layout of rows module's docstring, written token by token."""
    n, out = len(docs), {}
    for name, v in values.items():
        out[name] = np.full((n, max_length, *v.shape[1:]), pads.get(name, 0), dtype=v.dtype)
    out["position_ids"] = np.zeros((n, max_length), np.int32)
    out["seq_lens"] = np.zeros((n, max_docs), np.int32)
    out["cu_seqlens"] = np.zeros((n, max_docs + 1), np.int32)
    segment = np.zeros((n, max_length), np.int64)
    at = piece = 0
    for r, d in enumerate(docs):
        col = 0
        for j in range(d):
            length = lengths[piece]
            for name, v in values.items():
                out[name][r, col:col + length] = v[at:at + length]
            out["position_ids"][r, col:col + length] = np.arange(length)
            if length and mask_first and "labels" in values:
                out["labels"][r, col] = -100
            segment[r, col:col + length] = j + 1
            out["seq_lens"][r, j] = length
            out["cu_seqlens"][r, j + 1:] += length
            col, at, piece = col + length, at + length, piece + 1
    real = segment > 0
    if attention == "padding":
        out["attention_mask"] = real.astype(np.int32)
    else:
        mask = (segment[:, :, None] == segment[:, None, :]) & real[:, :, None]
        out["attention_mask"] = mask & np.tri(max_length, dtype=bool)[None] if attention == "block_causal" else mask
    return out


@pytest.mark.parametrize("rows", [3, 40])   # a few rows are laid out one by one, many through one mask
@pytest.mark.slow
def test_collate_flat_lays_out_every_piece_as_the_reference(rows: int) -> None:
    rng = np.random.default_rng(rows)
    for trial in range(150):
        max_length, max_docs = int(rng.integers(1, 24)), int(rng.integers(1, 5))
        full = trial % 3 == 0   # every row full: one copy per field
        docs, lengths = [], []
        for _ in range(rows):
            d = int(rng.integers(1 if full else 0, max_docs + 1))
            room = max_length if full or rng.random() < 0.3 else int(rng.integers(0, max_length + 1))
            cuts = np.sort(rng.integers(0, room + 1, d - 1)) if d else np.array([], int)
            docs.append(d)
            lengths += np.diff([0, *cuts, room]).tolist() if d else []
        total = sum(lengths)
        trailing = (2,) if trial % 5 == 0 else ()
        ids = rng.integers(0, 500, (total, *trailing)).astype(np.int32)
        labels = ids if trial % 2 else rng.integers(0, 9, (total, *trailing)).astype(np.int64)
        values, pads = {"input_ids": ids, "labels": labels}, {"input_ids": 7, "labels": -100}
        mask_first = trial % 4 != 0
        attention = ("padding", "block_diagonal", "block_causal")[trial % 3]
        got = collate_flat(np.array(docs), np.array(lengths, np.int64), values, max_length, max_docs, pads,
                           mask_first=mask_first, attention=attention)
        want = layout_reference(docs, lengths, values, max_length, max_docs, pads, mask_first, attention)
        assert got.keys() == want.keys()
        for name, w in want.items():
            assert got[name].dtype == w.dtype and got[name].shape == w.shape, (trial, name)
            np.testing.assert_array_equal(got[name], w, err_msg=f"trial {trial}, field {name}")


@pytest.mark.parametrize("max_docs", [1, 3, 64])
def test_row_counts_match_the_per_row_definition(max_docs: int) -> None:
    """row_counts (two cumulative sums over the pieces, no reduction along the rows) gives each row's
    seq_lens, cu_seqlens and tokens and each piece's first place as counted row by row, on rows of
    no piece, of max_docs pieces, of empty pieces, full and not; too many pieces or tokens raise."""
    from feedline._batching.rows import row_counts
    from feedline.errors import TaskError

    rng = np.random.default_rng(max_docs)
    for trial in range(200):
        n, max_length = int(rng.integers(0, 40)), int(rng.integers(1, 300))
        docs = rng.integers(0, max_docs + 1, n)
        parts = []
        for d in docs.tolist():   # a row's room: all of it, some, or (now and then) one token too many
            room = (max_length, int(rng.integers(0, max_length + 1)), max_length + int(trial % 25 == 0))[trial % 3]
            parts.append(np.diff([0, *np.sort(rng.integers(0, room + 1, d - 1)), room]) if d else [])
        lengths = np.concatenate([np.zeros(0, np.int64), *parts]).astype(np.int64)
        seq_lens = np.zeros((n, max_docs), np.int32)
        cu = np.zeros((n, max_docs + 1), np.int32)
        totals, first, p = np.zeros(n, np.int64), [], 0
        for r, d in enumerate(docs.tolist()):
            for j in range(d):
                first.append(r * max_length + int(totals[r]))
                seq_lens[r, j] = lengths[p]
                totals[r] += lengths[p]
                cu[r, j + 1:] = totals[r]
                p += 1
        if totals.max(initial=0) > max_length:
            with pytest.raises(TaskError, match="tokens but max_length"):
                row_counts(docs, lengths, max_length, max_docs)
            continue
        got = row_counts(docs, lengths, max_length, max_docs)
        for g, w in zip(got, (seq_lens, cu, totals, np.array(first, np.int64)), strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), trial
    with pytest.raises(TaskError, match="documents but max_docs_per_row"):
        row_counts(np.array([max_docs + 1]), np.ones(max_docs + 1, np.int64), 1024, max_docs)


def pack_lengths(lengths: list[int], capacity: int, **kw: Any) -> list[list[int]]:
    p: BestFitPacker[int] = BestFitPacker(capacity, **kw)
    for i, n in enumerate(lengths):
        p.push(n, i)
    p.flush()
    return list(p.ready)


def test_best_fit_decreasing_matches_the_trl_example() -> None:
    # TRL's documented bfd example (seq_length 4) after truncation: lengths 4, 2, 3, 1
    rows = pack_lengths([4, 2, 3, 1], 4, window=4, open_bins=0)
    assert rows == [[0], [2, 3], [1]]


def test_every_item_once_and_no_row_overflows() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 100, size=5000).tolist()
    rows = pack_lengths(lengths, 100, window=64, open_bins=8, max_items=5)
    assert sorted(i for r in rows for i in r) == list(range(5000))
    assert all(sum(lengths[i] for i in r) <= 100 and len(r) <= 5 for r in rows)


def test_open_bins_bound_what_is_buffered() -> None:
    p: BestFitPacker[int] = BestFitPacker(100, window=10, open_bins=3)
    for i in range(200):
        p.push(51, i)  # no two fit together: every bin stays open until closed by the bound
        assert len(p.open_contents()) <= 3
    assert p.pending < 10


def test_restore_continues_identically() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 64, size=400).tolist()
    a: BestFitPacker[int] = BestFitPacker(64, window=16, open_bins=4)
    for i in range(160):
        a.push(lengths[i], i)
    b: BestFitPacker[int] = BestFitPacker(64, window=16, open_bins=4)
    b.restore(list(a.ready), [[(lengths[i], i) for i in row] for row in a.open_contents()])
    for p in (a, b):
        for i in range(160, 400):
            p.push(lengths[i], i)
        p.flush()
    assert list(a.ready) == list(b.ready)


def test_carried_bins_beat_per_window_packing_on_the_wikipedia_histogram() -> None:
    if not HISTOGRAMS.exists():
        pytest.skip(f"reference histograms not available: {HISTOGRAMS}")
    spec = importlib.util.spec_from_file_location("histograms", HISTOGRAMS)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    hist = mod.wikipedia_histogram
    lengths = np.random.default_rng(0).choice(np.arange(1, 513), size=60_000, p=hist / hist.sum()).tolist()

    def efficiency(open_bins: int) -> float:
        rows = pack_lengths(lengths, 512, window=1000, open_bins=open_bins, max_items=64)
        return sum(lengths) / (len(rows) * 512)

    carried, fresh = efficiency(64), efficiency(0)
    assert carried >= 0.997
    assert carried > fresh


def test_assign_rows_gives_equal_rows_and_near_equal_tokens() -> None:
    rng = np.random.default_rng(2)
    tokens = rng.integers(1, 512, size=64)
    parts = assign_rows(tokens, 8)
    assert all(len(p) == 8 for p in parts)
    assert sorted(np.concatenate(parts).tolist()) == list(range(64))
    sums = [int(tokens[p].sum()) for p in parts]
    assert max(sums) - min(sums) <= int(tokens.max())
    assert all((np.diff(p) > 0).all() for p in parts), "rows keep their global order within a rank"
    with pytest.raises(SpecError, match="multiple of the world size"):
        assign_rows(tokens[:10], 4)


def test_slices_reassemble_and_remainder_rules() -> None:
    batch = {"input_ids": np.arange(12, dtype=np.int32).reshape(6, 2), "attention_mask": np.ones((6, 2), np.int32)}
    got = np.concatenate([slice_for_rank(batch, r, 3)["input_ids"] for r in range(3)])
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, batch["input_ids"].tolist()))
    short = {k: v[:5] for k, v in batch.items()}
    assert complete_batch(short, 6, 2, "drop", {}) is None
    padded = complete_batch(short, 6, 2, "pad", {"attention_mask": 0})
    assert padded is not None and len(padded["input_ids"]) == 6 and padded["attention_mask"][5].sum() == 0
    kept = complete_batch(short, 8, 2, "keep", {})
    assert kept is not None and len(kept["input_ids"]) == 6


def bucket_spec(corpus: str, tokenizer: str, **kw: Any) -> dict[str, Any]:
    return {"sources": [{"path": corpus}], "tokenizer": tokenizer, "seed": 3,
            "task": {"kind": "clm", "max_length": 64},
            "batching": {"strategy": "bucket", "batch_size": 4, "window_batches": 5, "remainder": "keep", **kw}}


@pytest.mark.slow
def test_bucket_pads_less_delivers_each_example_once_and_resumes(corpus: str, small_tokenizer: str) -> None:
    s = bucket_spec(corpus, small_tokenizer)
    it = iter(GlobalStream(Pipeline(s)))
    batches = [b for _s, b, _st in it]
    bucket_stats = it.it.stats
    it.close()
    pad = collect(Loader({**s, "batching": {"strategy": "pad", "batch_size": 4, "remainder": "keep"}}))
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    assert real == sum(int(b["attention_mask"].sum()) for b in pad)
    assert bucket_stats.efficiency > real / sum(b["input_ids"].size for b in pad)
    assert bucket_stats.tokens == real
    rows = sorted(tuple(r[m.astype(bool)].tolist()) for b in batches for r, m in zip(b["input_ids"], b["attention_mask"]))
    assert rows == sorted(tuple(r[m.astype(bool)].tolist()) for b in pad for r, m in zip(b["input_ids"], b["attention_mask"]))
    widths = [b["input_ids"].shape[1] for b in batches]
    assert widths != sorted(widths), "batches of a window come in shuffled order"
    assert assert_resumes_exactly(s, every=4) >= 3


def test_bucket_token_budget_is_checked(corpus: str, small_tokenizer: str) -> None:
    with pytest.raises(SpecError, match="max_tokens"):
        collect(Loader(bucket_spec(corpus, small_tokenizer, max_tokens=20)))


def test_pad_to_longest_max_length_and_multiple(corpus: str, small_tokenizer: str) -> None:
    base = {"sources": [{"path": corpus}], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 50}}
    longest = collect(Loader({**base, "batching": {"strategy": "pad", "batch_size": 4}}), limit=3)
    assert all(b["input_ids"].shape[1] == b["attention_mask"].sum(axis=1).max() for b in longest)
    fixed = collect(Loader({**base, "batching": {"strategy": "pad", "batch_size": 4, "pad_to": "max_length"}}), limit=3)
    assert all(b["input_ids"].shape[1] == 50 for b in fixed)
    multiple = collect(Loader({**base, "batching": {"strategy": "pad", "batch_size": 4, "pad_to_multiple_of": 16}}), limit=3)
    assert all(b["input_ids"].shape[1] % 16 == 0 for b in multiple)
    for b in multiple:
        assert (b["labels"][b["attention_mask"] == 0] == -100).all()


def test_joining_strategies_refuse_unpackable_tasks(tmp_path, small_tokenizer: str) -> None:
    """Classification rows carry one label each: packing or concatenating them would corrupt labels."""
    import feedline

    f = tmp_path / "labelled.jsonl"
    f.write_text('{"text": "good day", "label": "pos"}\n{"text": "bad day", "label": "neg"}\n')
    for strategy in ("pack", "concat"):
        spec = {"sources": [str(f)], "tokenizer": small_tokenizer,
                "task": {"kind": "classify", "label": "label", "labels": ["neg", "pos"], "max_length": 16},
                "batching": {"strategy": strategy, "batch_size": 2}}
        with pytest.raises(feedline.SpecError, match="use strategy 'pad' or 'bucket'"):
            list(feedline.Loader(spec))


def test_bucket_keeps_vector_fields_whole(tmp_path, small_tokenizer: str) -> None:
    import feedline

    f = tmp_path / "multi.jsonl"
    f.write_text("".join(f'{{"text": "{"word " * (i + 1)}", "labels": [{i % 3}]}}\n' for i in range(8)))
    spec = {"sources": [str(f)], "tokenizer": small_tokenizer,
            "task": {"kind": "classify", "label": "labels", "multi_label": True, "num_labels": 3, "max_length": 32},
            "batching": {"strategy": "bucket", "batch_size": 4}}
    for b in feedline.Loader(spec):
        assert b["labels"].shape == (4, 3) and b["labels"].dtype.kind == "f"
        assert set(b["labels"].sum(axis=1).tolist()) == {1.0}


@pytest.mark.parametrize("mean", [1, 3, 70, 1000])
def test_span_indices_and_piece_positions_match_the_per_piece_definition(mean: int) -> None:
    """``spans`` and ``piece_positions`` built from arange and repeat (no cumulative sum) give, piece
    by piece, ``starts[i] + 0..lengths[i]-1`` and ``0..lengths[i]-1``, empty pieces included."""
    from feedline._batching.rows import piece_positions
    from feedline._core.block import gather_spans, spans

    rng = np.random.default_rng(mean)
    for n in (0, 1, 5, 64, 65, 400):
        lengths = rng.integers(0, 2 * mean + 1, n)
        starts = rng.integers(0, 10**9, n)
        want = [s + k for s, m in zip(starts.tolist(), lengths.tolist(), strict=True) for k in range(m)]
        assert spans(starts, lengths).tolist() == want
        got = piece_positions(lengths)
        assert got.dtype == np.int32 and got.tolist() == [k for m in lengths.tolist() for k in range(m)]
        buf = np.arange(5000 + 2 * mean, dtype=np.int64) * 7  # gathered as slices or through an index
        starts %= 5000
        assert gather_spans(buf, starts, lengths).tolist() == buf[spans(starts, lengths)].tolist()


@pytest.mark.parametrize("seed", range(12))
def test_piece_pool_keep_finds_held_rows_and_joins_spans(seed: int) -> None:
    """The pool's keep finds the kept ids' rows by marking its id range where that is small and by
    sorting where it is not (ids given in any order; an id not held is a KeyError, in range or not),
    and its compaction copies runs of live pieces that lie end to end as one span: the rows are a
    sort and a search's, the spans the pieces' tokens in order."""
    from feedline._batching.pieces import _held_rows, _merged

    rng = np.random.default_rng(seed)
    spread = (1, 16, 100)[seed % 3]  # ids close together or ~16 apart (marked), or far apart (sorted)
    table = np.sort(rng.choice(3000 * spread, size=3000, replace=False)).astype(np.int64)
    ids = rng.permutation(rng.choice(table, size=int(rng.integers(1, 3000)), replace=False))
    assert _held_rows(table, ids).tolist() == np.searchsorted(table, np.sort(ids)).tolist()
    missing = np.setdiff1d(np.arange(table[0], table[-1]), table)
    if len(missing):
        with pytest.raises(KeyError):
            _held_rows(table, np.append(ids, missing[0]))
    with pytest.raises(KeyError):
        _held_rows(table, np.append(ids[1:], table[-1] + 1))
    lengths = rng.integers(1, 200, size=500)
    starts = np.cumsum(lengths + rng.choice([0, 0, 0, 5], size=500)) - lengths  # some end to end, some not
    a, n = _merged(starts, lengths)
    assert len(a) < len(starts)
    flat = np.arange(int(starts[-1] + lengths[-1]))
    assert np.concatenate([flat[s:s + k] for s, k in zip(a, n)]).tolist() == \
        np.concatenate([flat[s:s + k] for s, k in zip(starts, lengths)]).tolist()


def test_a_compacted_piece_pool_keeps_room_for_the_blocks_that_follow() -> None:
    """Compacted to its live tokens, the pool's arena keeps room for the blocks added until about the
    next compaction: adding them copies no held token again (it grew, doubling, at the next blocks:
    ~1.7 times the tokens added were copied again on ~70-token documents). The tokens stay the pieces'."""
    from feedline._batching.pieces import PiecePool

    rng = np.random.default_rng(3)
    pool = PiecePool()
    held: dict[int, np.ndarray] = {}
    compactions = grown_after = 0
    for w in range(24):
        lengths = rng.integers(20, 121, size=1000)
        tokens = (w * 1_000_000 + np.arange(int(lengths.sum()))).astype(np.int32)
        at = np.cumsum(lengths) - lengths
        before = pool.arena.get("input_ids")
        ids = pool.add(np.zeros((1000, 6), np.int64), lengths, at, {"input_ids": tokens, "labels": tokens})
        grown_after += compactions > 0 and before is not None and pool.arena["input_ids"] is not before
        held.update({i: tokens[a:a + n] for i, a, n in zip(ids, at.tolist(), lengths.tolist())})
        keep = sorted(rng.choice(list(held), size=min(len(held), 300), replace=False).tolist())
        held = {i: held[i] for i in keep}
        arena = pool.arena["input_ids"]
        pool.keep(np.array(keep, dtype=np.int64))
        compactions += pool.arena["input_ids"] is not arena
        rows = [[i] for i in keep[::7]]
        got = pool.locate(rows).values()["input_ids"]
        assert got.tolist() == np.concatenate([held[r[0]] for r in rows]).tolist()
    assert compactions >= 5 and grown_after == 0
