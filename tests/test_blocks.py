"""Gathers laid out in a worker's shared memory (feedline/_partitions/blocks.py, feedline/_core/memory.py):
a batch made there crosses to the parent with no copy, a block is written again only once the
parent read every message of it and dropped their arrays, and where no block is free the batches
go through the ring as before, equal."""

from __future__ import annotations

import doctest
import gc
import multiprocessing
from typing import Any

import numpy as np
import pytest

from feedline import Loader
from feedline._core import memory
from feedline._partitions import blocks
from feedline._partitions.frames import FrameReader, FrameWriter
from feedline._partitions.ring import HAS_RING
from feedline.testing import assert_batches_equal, collect
from test_placements import runner

pytestmark = pytest.mark.skipif(not HAS_RING, reason="shared memory with descriptor passing (Linux)")


def test_docstring_examples() -> None:
    from feedline._partitions import ring

    for module in (memory, blocks, ring):
        assert doctest.testmod(module).failed == 0, module.__name__


_OPEN: list[Any] = []


@pytest.fixture(autouse=True)
def _closed() -> Any:
    yield
    while _OPEN:
        _OPEN.pop().close()


def pair(count: int = 2, size: int = 1 << 16) -> tuple[FrameWriter, FrameReader]:
    """A worker's end with ``count`` blocks of ``size`` bytes after a 64 KB ring, and the parent's (closed after the test)."""
    parent, child = multiprocessing.Pipe(duplex=True)
    writer, reader = FrameWriter(child, ring=1 << 16, blocks=count, block=size), FrameReader(parent)
    _OPEN.extend([parent, child, writer, reader])
    return writer, reader


def batch_in(arena: blocks.BlockArena | None, rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, dtype in (("input_ids", np.int32), ("labels", np.int64), ("mask", np.bool_)):
        a = memory.empty(arena, (rows, 16), np.dtype(dtype))
        a[...] = rng.integers(0, 2 if dtype is np.bool_ else 1000, (rows, 16)).astype(dtype)
        out[name] = a
    return out


def send(writer: FrameWriter, seq: int, batch: dict[str, np.ndarray]) -> None:
    writer.send(("batch", 1, 0, batch, None, seq), True)


def primed(count: int = 2, size: int = 1 << 16) -> tuple[FrameWriter, FrameReader]:
    """:func:`pair`, after a first batch of :func:`batch_in`'s layout (a new layout goes pickled, through the ring)."""
    writer, reader = pair(count, size)
    send(writer, -1, batch_in(None, 1, 9))
    reader.recv()
    return writer, reader


def test_a_batch_laid_out_in_a_block_arrives_where_it_lies_with_no_copy() -> None:
    writer, reader = primed()
    arena = writer.arena(0, 1 << 12)
    assert arena is not None
    made = batch_in(arena, 4, 0)
    want = {k: v.copy() for k, v in made.items()}
    placed = writer.ring.head   # type: ignore[union-attr]
    send(writer, 0, made)
    got = reader.recv()
    assert got[:3] == ("batch", 1, 0) and got[5] == 0
    for k in want:
        np.testing.assert_array_equal(got[3][k], want[k])
        assert got[3][k].dtype == want[k].dtype
    assert writer.ring.head == placed and reader.ring.blocks.read == [1, 0]   # type: ignore[union-attr]
    made["input_ids"][0, 0] = -7   # the same memory: nothing was copied on the way
    assert got[3]["input_ids"][0, 0] == -7


def test_a_block_is_taken_again_only_once_every_message_is_read_and_dropped() -> None:
    writer, reader = primed(count=1)
    arena = writer.arena(0, 1 << 12)
    assert arena is not None and arena.block == 0
    first, second = batch_in(arena, 2, 1), batch_in(arena, 2, 2)
    send(writer, 0, first)
    send(writer, 1, second)
    assert writer.arena(0, 1 << 12) is None   # the gather after: its block retired, not free yet
    got = reader.recv()   # one message read of two: not freed, whatever the arrays
    del got
    gc.collect()
    reader.ring.release()   # type: ignore[union-attr]
    assert writer.arena(1, 1 << 12) is None
    kept = reader.recv()   # both read; the second's arrays still held
    reader.ring.release()   # type: ignore[union-attr]
    assert writer.arena(1, 1 << 12) is None
    want = {k: v.copy() for k, v in kept[3].items()}
    view = kept[3]["labels"][1:]   # a view keeps it too
    del kept
    gc.collect()
    reader.ring.release()   # type: ignore[union-attr]
    assert writer.arena(1, 1 << 12) is None
    np.testing.assert_array_equal(view, want["labels"][1:])
    del view
    gc.collect()
    reader.ring.release()   # type: ignore[union-attr]
    again = writer.arena(1, 1 << 12)
    assert again is not None and again.block == 0


def test_batches_not_wholly_in_a_block_go_through_the_ring_equal() -> None:
    writer, reader = primed(count=1, size=1 << 10)
    assert writer.arena(0, 1 << 11) is None   # a gather larger than a block: the heap's
    arena = writer.arena(0, 1 << 9)
    assert arena is not None
    mixed = batch_in(arena, 8, 3)   # 8 x 16 x (4 + 8 + 1) bytes: the labels no longer fit, the mask does
    assert writer.ring.blocks.locate(list(mixed.values())) is None   # type: ignore[union-attr]
    send(writer, 0, mixed)
    state = batch_in(arena, 1, 4)   # in the block, but with a state: pickled beside, through the ring
    writer.send(("batch", 1, 0, state, {"step": 1}, 1), False)
    for want in (mixed, state):
        got = reader.recv()
        for k in want:
            np.testing.assert_array_equal(got[3][k], want[k])
    assert reader.ring.blocks.read == [0]   # type: ignore[union-attr]


def test_a_message_placed_outside_the_blocks_is_refused() -> None:
    writer, reader = pair(count=1, size=1 << 10)
    send(writer, 0, {"x": np.arange(3, dtype=np.int32)})   # through the ring: its descriptor goes
    assert reader.recv()[3]["x"].tolist() == [0, 1, 2]
    for start, end in ((1 << 10, (1 << 10) + 8), (1000, 1100), (8, 4)):
        with pytest.raises(EOFError, match="blocks"):
            reader.ring.block_region(start, end)   # type: ignore[union-attr]


def spec(corpus: str, tok: str, placement: str) -> dict[str, Any]:
    parallel = {"placement": placement, "prefetch": 2, **({"warm_start": False} if placement == "processes" else {})}
    return {"sources": [corpus], "tokenizer": tok, "task": {"kind": "clm", "max_length": 48},
            "batching": {"strategy": "pack", "batch_size": 5, "window": 16, "first_window": 4}, "shuffle": {"buffer": 16},
            "partitions": 1, "parallel": parallel, "epochs": None}


def test_a_worker_lays_its_batches_out_in_its_blocks_and_a_consumer_that_keeps_them_gets_them_intact(
        corpus: str, small_tokenizer: str) -> None:
    """Every batch kept (its blocks never freed): the worker's later gathers find no free block and
    go through the ring, and none of the kept batches is written over; then, dropped as they are
    taken, the blocks are used again and again. The batches are the threads' throughout."""
    want = collect(Loader(spec(corpus, small_tokenizer, "threads")), limit=90)
    loader = Loader(spec(corpus, small_tokenizer, "processes"))
    kept = [next(loader) for _ in range(60)]
    held = runner(loader).pool.procs[0].reader.ring.blocks
    assert_batches_equal(want[:60], [dict(b) for b in kept], "kept")
    before = held.total
    assert before > 0, "no batch came from a block"
    assert all(held.held[b] for b in range(held.count)), "every block is held by the batches kept"
    del kept
    rest = [dict(next(loader)) for _ in range(30)]
    assert held.total > before, "the blocks were not used again once the batches were dropped"
    loader.close()
    assert_batches_equal(want[60:], rest, "after")


def test_a_pass_of_several_partitions_goes_a_batch_at_a_time_each_from_its_block_in_order() -> None:
    """A worker of several partitions sends a pass's batches as one message; laid out in as many
    blocks, they go back to back, each where it lies, and arrive in order."""
    writer, reader = primed(count=3)
    a, b = writer.arena(0, 1 << 12), writer.arena(1, 1 << 12)
    assert a is not None and b is not None and a.block != b.block
    one, two, heap = batch_in(a, 2, 5), batch_in(b, 2, 6), batch_in(None, 2, 7)
    writer.send(("many", [("batch", 1, 0, one, None, 0), ("batch", 1, 1, two, None, 0), ("batch", 1, 2, heap, None, 0)]), True)
    got = [reader.recv() for _ in range(3)]
    assert [m[2] for m in got] == [0, 1, 2]
    for m, want in zip(got, (one, two, heap)):
        for k in want:
            np.testing.assert_array_equal(m[3][k], want[k])
    assert sorted(reader.ring.blocks.read) == [0, 1, 1]   # type: ignore[union-attr]


class _Bump:
    """An arena over one numpy buffer (what a worker's block is to the batcher), counting what it handed out."""

    made = 0

    def __init__(self, nbytes: int) -> None:
        self.buf, self.at = np.empty(nbytes, dtype=np.uint8), 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = -(-self.at // 64) * 64
        if start + n > len(self.buf):
            return None
        self.at = start + n
        _Bump.made += 1
        return self.buf[start:start + n].view(dtype).reshape(shape)


@pytest.mark.parametrize("length", [48, 256])   # short pieces (laid out by one index), documents (a slice a piece)
def test_batches_laid_out_in_an_arena_are_the_heaps(tmp_path: Any, small_tokenizer: str, length: int) -> None:
    """The pack batcher lays a gather out in the arena its thread was given, array for array what
    it makes on the heap, for both ways it lays rows out."""
    import json

    rng = np.random.default_rng(1)
    words = ["the", "river", "ran", "past", "stone", "walls", "and", "quiet", "fields", "of", "barley"]
    (tmp_path / "c").mkdir()
    with open(tmp_path / "c" / "docs.jsonl", "w") as f:
        for _ in range(60):   # documents of ~40 to ~900 words
            f.write(json.dumps({"text": " ".join(rng.choice(words, int(rng.integers(40, 900))))}) + "\n")
    s = {"sources": [str(tmp_path / "c")], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": length},
         "batching": {"strategy": "pack", "batch_size": 4}}
    want = collect(Loader(s, prefetch=0))
    _Bump.made = 0
    with memory.providing(_Bump):
        got = collect(Loader(s, prefetch=0))
    assert _Bump.made > 0, "the batcher made nothing in the arena"
    assert_batches_equal(want, got, f"max_length {length}")
