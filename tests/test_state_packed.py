"""Packed state tables: round trips, the list form of older states, corrupt tables, and size."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline import Loader, StateError
from feedline._core.packed import pack_ints, pack_ragged, unpack_ints, unpack_ragged
from feedline.testing import assert_batches_equal, collect, make_corpus


def test_pack_round_trips_every_column_shape() -> None:
    rng = np.random.default_rng(0)
    tables = [
        np.zeros((0, 4), np.int64),
        np.array([[0, 3, 7, 0]]),
        np.stack([rng.integers(0, 3, 500), rng.integers(0, 70_000, 500), rng.integers(0, 1 << 40, 500),
                  np.full(500, 2)], axis=1),
        np.array([[-5, -(1 << 62), 1 << 62, 0], [7, 1 << 62, -(1 << 62), 1]]),  # full 64-bit spans, negatives
    ]
    for t in tables:
        packed = json.loads(json.dumps(pack_ints(t, 4)))
        assert np.array_equal(unpack_ints(packed, 4), t)
    rows = [[[1, 2, 3, 0, 0, 0]], [], [[4, 5, 6, 0, 1, 9], [4, 5, 6, 0, 2, 0]]]
    assert unpack_ragged(json.loads(json.dumps(pack_ragged(rows, 6))), 6) == rows
    assert unpack_ragged(pack_ragged([], 6), 6) == []  # no rows: the same mapping shape as any rows


@pytest.mark.parametrize("bad", [
    {"packed": 2, "rows": 1, "cols": [[0, 0]], "data": ""},
    {"packed": 1, "rows": 3, "cols": [[0, 1]], "data": "AAAA"},
    {"packed": 1, "rows": 1, "cols": [[0, 0], [0, 0]], "data": ""},
    {"rows": 1},
    "abc",
])
def test_corrupt_or_unknown_tables_raise_state_error(bad: Any) -> None:
    with pytest.raises(StateError):
        unpack_ints(bad, 1)


def _to_lists(state: Any) -> Any:
    """The state as an older feedline wrote it: every packed table as JSON lists."""
    if isinstance(state, dict):
        if state.get("packed") == 1:
            return unpack_ints(state, len(state["cols"])).tolist()
        if set(state) == {"lengths", "refs"}:
            return unpack_ragged(state, len(state["refs"]["cols"]))
        return {k: _to_lists(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_to_lists(v) for v in state]
    return state


def test_shuffle_and_pack_state_is_packed_and_list_states_still_resume(corpus: str, small_tokenizer: str) -> None:
    spec = {"sources": [corpus], "tokenizer": small_tokenizer, "seed": 3, "shuffle": {"buffer": 50},
            "task": {"kind": "clm", "max_length": 64},
            "batching": {"strategy": "pack", "batch_size": 2, "window": 40, "open_bins": 8}}
    full = collect(Loader(spec))
    loader = Loader(spec)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    pipe = state["pipeline"]
    assert pipe["parent"]["parent"]["buffer"]["packed"] == 1
    assert pipe["open"] and "refs" in pipe["open"]
    old = _to_lists(copy.deepcopy(state))
    assert isinstance(old["pipeline"]["parent"]["parent"]["buffer"], list)
    assert isinstance(old["pipeline"]["open"], list)
    assert_batches_equal(collect(Loader(spec, state=state)), full[4:], "packed state")
    assert_batches_equal(collect(Loader(spec, state=old)), full[4:], "list state")
    bad = copy.deepcopy(state)
    bad["pipeline"]["parent"]["parent"]["buffer"]["data"] = "!!"
    with pytest.raises(StateError, match="shuffle buffer"):
        collect(Loader(spec, state=bad))
    # the ready rows are the window's, packed once, and how many were delivered since; the states
    # of earlier versions held only the undelivered rows, and still resume
    ready = pipe["ready"]
    assert set(ready) == {"rows", "skip"} and ready["skip"] >= 1
    prev = copy.deepcopy(state)
    prev["pipeline"]["ready"] = pack_ragged(unpack_ragged(ready["rows"], 6)[ready["skip"]:], 6)
    assert_batches_equal(collect(Loader(spec, state=prev)), full[4:], "state of the previous layout")
    bad = copy.deepcopy(state)
    bad["pipeline"]["ready"]["skip"] = 10_000
    with pytest.raises(StateError, match="skip"):
        collect(Loader(spec, state=bad))


def test_a_large_shuffle_buffer_state_is_several_times_smaller_than_lists(tmp_path: Path, small_tokenizer: str) -> None:
    make_corpus(tmp_path / "c", files=2, docs=500, max_words=20)
    spec = {"sources": [str(tmp_path / "c")], "tokenizer": small_tokenizer, "seed": 3, "shuffle": {"buffer": 300},
            "task": {"kind": "clm", "max_length": 64}, "batching": {"strategy": "pad", "batch_size": 64}}
    loader = Loader(spec)
    it = iter(loader)
    for _ in range(6):  # past the task stage's first chunk of 256 records: its state holds a full buffer
        next(it)
    buffer = loader.state_dict()["pipeline"]["parent"]["parent"]["buffer"]
    loader.close()
    assert buffer["rows"] == 300
    packed, lists = len(json.dumps(buffer)), len(json.dumps(_to_lists(buffer)))
    assert packed * 2 < lists, (packed, lists)
