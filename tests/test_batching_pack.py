"""The pack and concat batchers on real tokenized text: token conservation, boundaries, resume, ranks."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline import Loader
from feedline._batching.rows import flat_cu_seqlens
from feedline._core.deferred import materialize
from feedline._pipeline import GlobalStream, Pipeline
from feedline.errors import SpecError
from feedline.testing import assert_resumes_exactly, collect


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Small real corpora: the first 100 C4 documents and the first 4 Wikipedia articles."""
    d = tmp_path_factory.mktemp("prose")
    c4 = shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:100]
    wiki = shared("prose", "wiki_demo.txt").read_text(encoding="utf-8").splitlines(keepends=True)[:4]
    (d / "c4.jsonl").write_text("".join(c4), encoding="utf-8")
    (d / "wiki.txt").write_text("".join(wiki), encoding="utf-8")
    return {"c4": str(d / "c4.jsonl"), "wiki": str(d / "wiki.txt")}


def spec(docs: str, strategy: str = "pack", *, task_len: int | None = 512, **batching: Any) -> dict[str, Any]:
    return {
        "sources": [{"path": docs}],
        "tokenizer": str(shared("tokenizers", "gpt2")),
        "task": {"kind": "clm", "max_length": task_len},
        "batching": {"strategy": strategy, "batch_size": 8, "remainder": "keep", "max_length": 128, **batching},
    }


def example_tokens(s: dict[str, Any]) -> list[np.ndarray]:
    it = iter(Pipeline(s).examples())
    try:
        return [ex.fields["input_ids"] for ex in it]
    finally:
        it.close()


def global_batches(s: dict[str, Any]) -> tuple[list[dict[str, np.ndarray]], Any]:
    it = iter(GlobalStream(Pipeline(s)))
    try:
        return [b for _step, b, _st in it], it.it
    finally:
        it.close()


def real_pieces(batch: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
    """Each row's documents, cut at cu_seqlens."""
    out = []
    for r in range(len(batch["input_ids"])):
        cu = batch["cu_seqlens"][r]
        out.append([batch["input_ids"][r, cu[d]:cu[d + 1]] for d in range(len(cu) - 1) if cu[d + 1] > cu[d]])
    return out


def check_row_invariants(batch: dict[str, np.ndarray], max_length: int) -> None:
    ids, labels, pos, mask = batch["input_ids"], batch["labels"], batch["position_ids"], batch["attention_mask"]
    assert ids.shape[1] == max_length
    totals = batch["seq_lens"].sum(axis=1)
    assert (totals <= max_length).all()
    assert (mask.sum(axis=1) == totals).all()
    np.testing.assert_array_equal(batch["cu_seqlens"][:, 1:], np.cumsum(batch["seq_lens"], axis=1))
    for r in range(len(ids)):
        n = int(totals[r])
        starts = batch["cu_seqlens"][r][:-1][batch["seq_lens"][r] > 0]
        # positions restart exactly at the document starts given by cu_seqlens
        assert sorted(np.flatnonzero(pos[r, :n] == 0).tolist()) == sorted(starts.tolist())
        for d, length in enumerate(batch["seq_lens"][r][batch["seq_lens"][r] > 0]):
            s = int(starts[d])
            np.testing.assert_array_equal(pos[r, s:s + length], np.arange(length))
        # no loss on each document's first token, nor on padding; elsewhere labels are the tokens
        assert (labels[r, starts] == -100).all()
        assert (labels[r, n:] == -100).all()
        inner = np.ones(n, dtype=bool)
        inner[starts] = False
        np.testing.assert_array_equal(labels[r, :n][inner], ids[r, :n][inner])


def test_pack_preserves_tokens_and_boundaries_on_real_text(texts: dict[str, str]) -> None:
    s = spec(texts["c4"], window=40)
    batches, it = global_batches(s)
    docs = example_tokens(s)
    packed = [p for b in batches for row in real_pieces(b) for p in row]
    for b in batches:
        check_row_invariants(b, 128)
    # the multiset of real tokens is preserved (documents longer than a row are split, not lost)
    assert np.array_equal(np.sort(np.concatenate(packed)), np.sort(np.concatenate(docs)))
    # every piece is one document, or one row-sized slice of a longer one, cut at a multiple of 128
    slices = collections.Counter(d[i:i + 128].tobytes() for d in docs for i in range(0, len(d), 128))
    assert collections.Counter(p.tobytes() for p in packed) == slices
    assert it.stats.rows == sum(len(b["input_ids"]) for b in batches)
    assert it.stats.efficiency > 0.97
    assert it.stats.split_documents > 0


def test_pack_truncate_keeps_first_piece_and_counts_the_rest(texts: dict[str, str]) -> None:
    s = spec(texts["c4"], window=40, overflow="truncate")
    batches, it = global_batches(s)
    docs = example_tokens(s)
    kept = np.sort(np.concatenate([d[:128] for d in docs]))
    got = np.sort(np.concatenate([p for b in batches for row in real_pieces(b) for p in row]))
    np.testing.assert_array_equal(got, kept)
    assert it.stats.truncated_tokens == sum(max(0, len(d) - 128) for d in docs)


def test_pack_block_diagonal_mask_matches_segments(texts: dict[str, str]) -> None:
    batches, _ = global_batches(spec(texts["wiki"], window=40, attention="block_causal"))
    b = batches[0]
    mask = b["attention_mask"]
    assert mask.shape == (8, 128, 128) and mask.dtype == np.bool_
    for r in range(len(mask)):
        seg = np.zeros(128, dtype=int)
        for d, (lo, hi) in enumerate(zip(b["cu_seqlens"][r][:-1], b["cu_seqlens"][r][1:])):
            seg[lo:hi] = d + 1
        want = (seg[:, None] == seg[None, :]) & (seg[:, None] > 0) & np.tri(128, dtype=bool)
        np.testing.assert_array_equal(mask[r], want)


def test_pack_caps_documents_per_row(texts: dict[str, str]) -> None:
    batches, _ = global_batches(spec(texts["c4"], window=40, max_docs_per_row=2, task_len=None))
    assert all(b["seq_lens"].shape[1] == 2 for b in batches)
    assert all(((b["seq_lens"] > 0).sum(axis=1) <= 2).all() for b in batches)


@pytest.mark.slow
def test_pack_resumes_exactly_with_open_bins(texts: dict[str, str]) -> None:
    s = spec(texts["c4"], window=30, open_bins=8, batch_size=4)
    loader = Loader(s)
    _batches, states = collect(loader, with_states=True, limit=6)
    loader.close()
    assert any(st["pipeline"]["open"] for st in states), "the test must cover states with open bins"
    assert any(st["pipeline"]["ready"] for st in states), "and with rows waiting for a later batch"
    assert len(json.dumps(states[-1])) < 20_000
    assert assert_resumes_exactly(s, every=3, limit=12) >= 4


@pytest.mark.slow
def test_pack_restored_in_its_last_window_gives_the_states_of_the_run_it_resumes(texts: dict[str, str]) -> None:
    """A batcher restored after its last read (its window flushed, rows still to deliver) finds the
    end again without rebuilding its window: the states after its last batches are those of the
    run that was not restored (partitions compare them when a partition's tail is resumed)."""
    from feedline.testing import assert_stage_resumes

    lines = Path(texts["c4"]).read_text(encoding="utf-8").splitlines(keepends=True)[:30]
    small = str(Path(texts["c4"]).with_name("c4_small.jsonl"))
    Path(small).write_text("".join(lines), encoding="utf-8")
    stage = Pipeline(spec(small, window=64, batch_size=3)).batches()
    assert assert_stage_resumes(stage, every=1, check=4) >= 8


@pytest.mark.slow
def test_concat_chunks_the_document_stream_in_order(texts: dict[str, str]) -> None:
    s = spec(texts["c4"], "concat", task_len=None)
    batches, it = global_batches(s)
    for b in batches:
        check_row_invariants(b, 128)
    rows = [row for b in batches for row in real_pieces(b)]
    np.testing.assert_array_equal(np.concatenate([p for row in rows for p in row]), np.concatenate(example_tokens(s)))
    lengths = [sum(len(p) for p in row) for row in rows]
    assert all(n == 128 for n in lengths[:-1]) and 0 < lengths[-1] <= 128
    assert it.stats.split_documents > 0


@pytest.mark.slow
def test_concat_resumes_exactly_mid_document(texts: dict[str, str]) -> None:
    s = spec(texts["c4"], "concat", task_len=None, batch_size=4)
    loader = Loader(s)
    _b, states = collect(loader, with_states=True, limit=4)
    loader.close()
    assert any(st["pipeline"]["carry"] for st in states)
    assert assert_resumes_exactly(s, every=3, limit=10) >= 4


def test_concat_continuous_positions(texts: dict[str, str]) -> None:
    batches, _ = global_batches(spec(texts["c4"], "concat", task_len=None, reset_positions=False, mask_first_token=False))
    b = batches[0]
    np.testing.assert_array_equal(b["position_ids"][0], np.arange(128))
    np.testing.assert_array_equal(b["labels"][0], b["input_ids"][0])


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.slow
def test_rank_slices_reassemble_the_global_step(texts: dict[str, str], world_size: int) -> None:
    s = spec(texts["c4"], window=40, batch_size=8, remainder="pad")
    reference = collect(Loader(s))
    per_rank = [collect(Loader(s, rank=r, world_size=world_size)) for r in range(world_size)]
    assert all(len(p) == len(reference) for p in per_rank)
    for step, glob in enumerate(reference):
        slices = [p[step] for p in per_rank]
        assert len({len(x["input_ids"]) for x in slices}) == 1, "equal rows per rank"
        got = sorted(row.tobytes() for x in slices for row in x["input_ids"])
        assert got == sorted(row.tobytes() for row in glob["input_ids"])
        tokens = [int(x["attention_mask"].sum()) for x in slices]
        assert max(tokens) - min(tokens) <= 128, "near-equal real tokens"


@pytest.mark.slow
def test_elastic_resume_reslices_the_same_stream(texts: dict[str, str]) -> None:
    s = spec(texts["c4"], window=40, batch_size=8)
    reference = collect(Loader(s))
    one = Loader(s)
    _b, states = collect(one, with_states=True, limit=3)
    one.close()
    resumed = [collect(Loader(s, rank=r, world_size=2, state=states[-1])) for r in range(2)]
    assert len(resumed[0]) == len(reference) - 3
    for step, glob in enumerate(reference[3:]):
        got = sorted(row.tobytes() for x in (resumed[0][step], resumed[1][step]) for row in x["input_ids"])
        assert got == sorted(row.tobytes() for row in glob["input_ids"])


def test_flat_cu_seqlens_cover_the_flattened_batch(texts: dict[str, str]) -> None:
    batches, _ = global_batches(spec(texts["c4"], window=40))
    b = batches[0]
    cu = flat_cu_seqlens(b)
    assert cu[0] == 0 and cu[-1] == b["input_ids"].size and (np.diff(cu) > 0).all()
    flat_pos = b["position_ids"].ravel()
    real = b["attention_mask"].ravel().astype(bool)
    starts = set(cu[:-1].tolist())
    assert all(i in starts for i in np.flatnonzero((flat_pos == 0) & real))


def test_pack_needs_a_row_length(texts: dict[str, str]) -> None:
    with pytest.raises(SpecError, match="max_length"):
        collect(Loader(spec(texts["c4"], task_len=None, max_length=None)))
    with pytest.raises(SpecError, match="window"):
        Loader(spec(texts["c4"], window=0))


@pytest.mark.slow
def test_window_ramp_gives_an_early_first_batch_and_the_same_tokens(texts: dict[str, str]) -> None:
    """The first window holds ``first_window`` pieces, the next ones grow to ``window``."""
    ramp = iter(Pipeline(spec(texts["c4"], window=400, first_window=16)).batches())
    flat = iter(Pipeline(spec(texts["c4"], window=400, first_window=None)).batches())
    try:
        next(ramp), next(flat)
        assert ramp.stats.documents < 64 <= flat.stats.documents  # type: ignore[attr-defined]
        rest_ramp, rest_flat = list(ramp), list(flat)
    finally:
        ramp.close(), flat.close()
    tokens = [sorted(np.concatenate([b["input_ids"][b["attention_mask"].astype(bool)] for b in bs]).tolist())
              for bs in (rest_ramp, rest_flat)]
    assert len(tokens[0]) > 0
    assert abs(len(tokens[0]) - len(tokens[1])) < 8 * 128  # the same documents, up to one batch of rows


@pytest.mark.slow
def test_deferred_states_read_late_are_the_states_of_their_step(texts: dict[str, str]) -> None:
    """The loader's thread takes a snapshot after every batch and runs ahead; a snapshot read only
    after the stream moved on (windows packed, pieces dropped from the pool) is still the state of
    its own step, and nothing is computed for a state nobody reads."""
    s = spec(texts["c4"], window=16, first_window=None, open_bins=4)
    eager = [state for _step, _batch, state in GlobalStream(Pipeline(s))]
    assert len(eager) >= 6
    loader = Loader(s, prefetch=4)
    snaps = []
    for _ in range(len(eager)):
        next(loader)
        snaps.append(loader._stage.snapshot())  # type: ignore[attr-defined]
    assert "Deferred(pending)" in repr(snaps[0])  # not computed while the stream ran
    assert [json.loads(json.dumps(materialize(x))) for x in snaps] == [json.loads(json.dumps(x)) for x in eager]
    assert loader.state_dict()["pipeline"] == eager[-1]["pipeline"]
    loader.close()
