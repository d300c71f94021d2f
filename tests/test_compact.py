"""Compact pack batches: the service sends rows before layout and its clients lay them out,
bit-identical to the in-process batches (laid out, sliced per rank, over the wire, resumed)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import feedline
from feedline._batching.compact import CompactBatch
from feedline._batching.planner import rank_slices
from feedline._core.deferred import materialize
from feedline._pipeline import GlobalStream, Pipeline
from feedline._service.protocol import decode_batch, encode_batch, pack_state, unpack_header, unpack_state
from feedline.errors import ProtocolError
from feedline.service import serve_process
from feedline.testing import assert_batches_equal, collect, make_corpus
from service_helpers import tokenizer_path

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("compact")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("compact")
    make_corpus(tmp / "corpus", files=2, docs=60, seed=5)
    return {"tmp": tmp, "corpus": str(tmp / "corpus" / "*.jsonl"), "tok": tokenizer_path(tmp)}


def spec(env: dict[str, Any], **batching: Any) -> dict[str, Any]:
    return {"sources": [{"path": env["corpus"]}], "tokenizer": env["tok"], "seed": 2, "shuffle": {"buffer": 8},
            "task": {"kind": "clm", "max_length": 40},
            "batching": {"strategy": "pack", "batch_size": 4, "max_length": 48, "window": 20, "remainder": "keep",
                         **batching}}


def steps(s: dict[str, Any], *, compact: bool) -> list[tuple[int, Any, Any]]:
    """Every global step: laid out with the materialized state, or as the service's producer takes them."""
    it = iter(GlobalStream(Pipeline(s)))
    out = []
    try:
        while True:
            out.append(it.next_compact() if compact else next(it))
    except StopIteration:
        return out
    finally:
        it.close()


@pytest.mark.parametrize("batching", [{}, {"attention": "block_causal", "batch_size": 3},
                                      {"attention": "block_diagonal", "batch_size": 5},
                                      {"mask_first_token": False, "max_docs_per_row": 3, "batch_size": 7}])
def test_compact_batches_lay_out_as_the_pack_batcher_yields_them(env: dict, batching: dict) -> None:
    s = spec(env, **batching)
    laid, compact = steps(s, compact=False), steps(s, compact=True)
    assert [n for n, _b, _s in laid] == [n for n, _b, _s in compact] and len(laid) > 5
    kinds = [type(b) for _n, b, _s in compact]
    short = len(laid[-1][1]["input_ids"]) < s["batching"]["batch_size"]
    assert kinds[:-1] == [CompactBatch] * (len(kinds) - 1)
    assert kinds[-1] is (dict if short else CompactBatch)   # a short last batch is laid out where it is completed
    for (_n, a, sa), (_m, b, sb) in zip(laid, compact):
        assert_batches_equal([a], [b.expand() if isinstance(b, CompactBatch) else b])
        assert sa == materialize(sb)
        if isinstance(b, CompactBatch):
            assert b.tokens() == int(a["seq_lens"].sum()) and b.row_tokens().tolist() == a["seq_lens"].sum(1).tolist()


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_slices_of_a_compact_batch_are_the_laid_out_slices(env: dict, world_size: int) -> None:
    compact = [b for _n, b, _s in steps(spec(env, batch_size=8), compact=True) if isinstance(b, CompactBatch)]
    assert len(compact) > 3
    for b in compact:
        laid = rank_slices(b.expand(), world_size)
        cut = rank_slices(b, world_size)
        assert all(isinstance(c, CompactBatch) for c in cut)
        assert_batches_equal(laid, [c.expand() for c in cut])


def test_the_wire_carries_real_tokens_and_the_receiver_lays_them_out(env: dict) -> None:
    b = next(b for _n, b, _s in steps(spec(env), compact=True) if isinstance(b, CompactBatch))
    header, payload = encode_batch(b, step=7, state=b"\x80")
    h = unpack_header(header)
    names = [f[0] for f in h["fields"]]
    assert names == ["docs", "lengths", "values/input_ids"]   # labels shares input_ids' tokens: sent once
    assert dict(h["layout"]["fields"]) == {"input_ids": "input_ids", "labels": "input_ids"}
    _laid_header, laid_payload = encode_batch(b.expand(), step=7, state=b"\x80")
    assert len(payload) * 3 < len(laid_payload)
    got = decode_batch(h, [payload])
    assert_batches_equal([b.expand()], [got])
    assert all(a.flags.writeable for a in got.values())   # laid out into fresh arrays, not views of the frame


def corrupt(h: dict[str, Any], payload: bytes, how: str) -> tuple[dict[str, Any], list[bytes]]:
    h = json.loads(json.dumps({k: v for k, v in h.items() if k != "state"}))
    layout = h["layout"]
    if how == "attention":
        layout["attention"] = "sideways"
    elif how == "max_docs":
        layout["max_docs"] = 0
    elif how == "too_many_docs":
        layout["max_docs"] = 1
    elif how == "too_long":
        layout["max_length"] = 2
    elif how == "huge":
        layout["max_length"], layout["attention"] = 1 << 30, "block_causal"
    elif how == "unknown_field":
        layout["fields"].append(["extra", "nowhere"])
    elif how == "pad":
        layout["pad"]["input_ids"] = "x"
    elif how == "lengths":
        h["fields"][1][2] = [h["fields"][1][2][0] - 1]
    elif how == "not_a_map":
        h["layout"] = [1, 2]
    return h, [payload]


@pytest.mark.parametrize("how", ["attention", "max_docs", "too_many_docs", "too_long", "huge", "unknown_field", "pad",
                                 "lengths", "not_a_map"])
def test_a_compact_batch_that_does_not_describe_a_batch_is_a_protocol_error(env: dict, how: str) -> None:
    b = next(b for _n, b, _s in steps(spec(env, max_docs_per_row=4), compact=True)
             if isinstance(b, CompactBatch) and int(b.docs.max()) > 1)
    header, payload = encode_batch(b, step=1, state=b"\x80")
    h, frames = corrupt(unpack_header(header), payload, how)
    with pytest.raises(ProtocolError):
        decode_batch(h, frames)


def test_a_state_snapshot_packs_as_its_materialized_state(env: dict) -> None:
    it = iter(GlobalStream(Pipeline(spec(env))))
    try:
        for _ in range(3):
            _n, _b, snap = it.next_deferred()
            assert unpack_state(pack_state(snap)) == json.loads(json.dumps(materialize(snap)))
        huge = {"step": 1, "pipeline": {"x": 2**70}}   # beyond msgpack: JSON, materialized
        assert unpack_state(pack_state(huge)) == huge
    finally:
        it.close()


def in_process(s: dict[str, Any], rank: int, world_size: int) -> tuple[list, list]:
    with feedline.Loader(s, rank, world_size) as lo:
        return collect(lo, with_states=True)  # type: ignore[no-any-return]


def remote(address: str, world_size: int) -> list[tuple[list, list]]:
    """Every rank's batches and states, the ranks consumed in lockstep."""
    loaders = [feedline.Loader(address, r, world_size) for r in range(world_size)]
    got: list[tuple[list, list]] = [([], []) for _ in loaders]
    try:
        its = [iter(lo) for lo in loaders]
        while (step := [next(it, None) for it in its])[0] is not None:
            for (batches, states), b, lo in zip(got, step, loaders):
                batches.append({k: np.array(v) for k, v in b.items()})
                states.append(json.loads(json.dumps(lo.state_dict())))
        assert all(b is None for b in step), "ranks ended at different steps"
    finally:
        for lo in loaders:
            lo.close()
    return got


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_service_delivers_pack_batches_and_states_as_in_process(env: dict) -> None:
    s = spec(env, batch_size=6, attention="block_diagonal")
    with serve_process(s) as address:
        for w in (1, 3):
            for r, (batches, states) in enumerate(remote(address, w)):
                ref_batches, ref_states = in_process(s, r, w)
                assert_batches_equal(ref_batches, batches, f"rank {r} of {w}")
                assert states == ref_states
        # resume mid-stream from a remote state: the rest is the in-process rest
        ref_batches, ref_states = in_process(s, 0, 1)
        with feedline.Loader(address, state=ref_states[4]) as lo:
            assert_batches_equal(ref_batches[5:], collect(lo))
        with feedline.Loader(address, mode="shared") as lo:   # a shared-mode consumer lays them out too
            assert_batches_equal(ref_batches, collect(lo))
