"""Batches as integers (feedline/_partitions/flat.py): a message of laid-out batches crosses a real
socket pair with its arrays in the worker's ring and no pickle on either side; every dtype and shape
(0-d, empty) arrives equal and writable; anything else (a non-contiguous or object array, a mixed
message, a full ring) is pickled as before; a corrupt header is refused."""

from __future__ import annotations

import doctest
import mmap
import multiprocessing
import pickle
import struct
from typing import Any

import numpy as np
import pytest

from feedline._partitions import flat, frames, ring
from feedline._partitions.frames import FrameReader, FrameWriter

pytestmark = pytest.mark.skipif(not ring.HAS_RING, reason="shared memory with descriptor passing (Linux)")


def test_docstring_examples() -> None:
    assert doctest.testmod(flat).failed == 0


def _pair(ring_bytes: int = ring.CAPACITY) -> tuple[FrameReader, FrameWriter]:
    parent, child = multiprocessing.Pipe(duplex=True)
    return FrameReader(parent), FrameWriter(child, ring=ring_bytes)


def _same(got: Any, want: Any) -> None:
    if isinstance(want, np.ndarray):
        assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    else:
        assert got == want


def _in_ring(a: Any) -> bool:
    """Whether array ``a`` lies in a worker's ring (its memory's owner, down the chain of bases)."""
    while a is not None and not isinstance(a, mmap.mmap):
        a = getattr(a, "base", None) if not isinstance(a, memoryview) else a.obj
    return a is not None


def _kind(reader: FrameReader) -> int:
    """The next frame's kind word (peeked: the frame stays to be read)."""
    assert reader.sock is not None
    import socket

    return int(struct.unpack("<I", reader.sock.recv(4, socket.MSG_PEEK))[0])


def _every_dtype(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"i32": rng.integers(0, 1 << 20, (3, 5), dtype=np.int32), "i64": rng.integers(-9, 9, 7),
            "u8": rng.integers(0, 255, (2, 2, 2), dtype=np.uint8), "f16": rng.random(4).astype(np.float16),
            "f32": rng.random((2, 3)).astype(np.float32), "f64": rng.random(3), "bool": rng.random((4, 4)) < 0.5,
            "c64": (rng.random(2) + 1j).astype(np.complex64), "big": np.arange(6, dtype=">i4"),
            "scalar": np.array(7, dtype=np.int64), "empty": np.zeros((0, 1024), dtype=np.int32),
            "none": np.zeros((3, 0), dtype=np.float32)}


def test_batches_cross_as_integers_with_no_pickle_on_either_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dtype and shape (0-d, empty, big-endian) of a laid-out batch arrives equal, as
    plain writable arrays over the ring, one message of several batches too; neither end pickles."""
    reader, writer = _pair()
    writer.send(("batch", 1, 0, _every_dtype(0), None, 0))   # the first: its layout goes once (pickled)
    _same(reader.recv(), ("batch", 1, 0, _every_dtype(0), None, 0))

    def refused(*a: Any, **k: Any) -> Any:
        raise AssertionError("pickled")

    monkeypatch.setattr(frames, "_dumps", refused)
    monkeypatch.setattr(flat.pickle, "loads", refused)
    monkeypatch.setattr(frames.pickle, "loads", refused)
    msgs = [("batch", 1, 0, _every_dtype(i), None, i) for i in range(1, 4)]
    writer.send(("many", msgs))
    assert _kind(reader) & frames._FLAT
    got = reader.recv()
    _same(got, ("many", msgs))
    for m in got[1]:
        m[3]["i32"][0, 0] = -1   # the consumer may write into what it was given
        assert m[3]["i32"][0, 0] == -1 and m[3]["i32"].base is not None
    writer.close()
    reader.close()


def test_a_state_goes_pickled_and_copied_out_and_the_layout_once_per_stream() -> None:
    """A batch's state (every ANCHOR_EVERY batches) is pickled beside the integers, its arrays copied
    out of the ring; a second layout in the stream is sent when first used, the first one not again."""
    reader, writer = _pair()
    a = {"input_ids": np.arange(8, dtype=np.int32).reshape(2, 4)}
    b = {"input_ids": np.arange(3, dtype=np.int64), "labels": np.ones(3, dtype=np.int64)}
    state = {"step": 3, "window": np.arange(10_000, dtype=np.int32)}
    sent = [("batch", 1, 0, a, None, 0), ("batch", 1, 0, a, state, 1), ("batch", 2, 1, b, None, 0),
            ("batch", 1, 0, a, None, 2), ("batch", 2, 1, b, None, 1)]
    for m in sent:
        writer.send(m)
        got = reader.recv()
        _same(got, m)
    assert len(writer.layouts) == 2 and len(reader.layouts.known) == 2
    writer.send(sent[1])
    got = reader.recv()
    assert _in_ring(got[3]["input_ids"]) and not _in_ring(got[4]["window"])   # the state copied out
    writer.close()
    reader.close()


@pytest.mark.parametrize("odd", [
    {"x": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2]},            # not contiguous
    {"x": np.array([{"a": 1}, None], dtype=object)},                        # objects
    {"x": np.zeros(2, dtype=[("a", np.int32), ("b", np.float32)])},        # a record dtype
    {"x": np.ma.masked_array([1, 2], mask=[0, 1])},                         # a subclass
    {"x": np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[D]")},   # times (no buffer export)
])
def test_anything_else_is_pickled_as_before(odd: dict[str, Any]) -> None:
    reader, writer = _pair()
    msg = ("batch", 1, 0, odd, None, 0)
    writer.send(msg)
    assert not _kind(reader) & frames._FLAT
    got = reader.recv()
    assert type(got[3]["x"]) is type(odd["x"]) and got[3]["x"].dtype == odd["x"].dtype
    assert got[3]["x"].tolist() == odd["x"].tolist()
    for fieldless in [("batch", 1, 0, {}, None, 1), ("many", [])]:   # (no array at all)
        writer.send(fieldless)
        assert not _kind(reader) & frames._FLAT
        _same(reader.recv(), fieldless)
    mixed = ("many", [("batch", 1, 0, {"x": np.arange(3)}, None, 1), ("batch", 1, 0, {"y": np.arange(3)}, None, 2),
                      ("end", 1, 0, {"step": 3})])
    writer.send(mixed)
    assert not _kind(reader) & frames._FLAT
    _same(reader.recv(), mixed)
    writer.close()
    reader.close()


def test_a_full_ring_sends_by_the_socket_and_the_layout_is_still_sent_once_it_fits() -> None:
    """A batch that does not fit the ring goes pickled through the socket; what it noted as sent (a
    layout, a pack window) is not taken as sent, so the next batch that fits carries it."""
    reader, writer = _pair(ring_bytes=1 << 12)
    big = ("batch", 1, 0, {"x": np.arange(4096, dtype=np.int32)}, {"s": 1}, 0)
    writer.send(big)
    assert not _kind(reader) & frames._FLAT
    _same(reader.recv(), big)
    assert writer.layouts == {}
    small = ("batch", 1, 0, {"x": np.arange(16, dtype=np.int32)}, {"s": 2}, 1)
    writer.send(small)
    assert _kind(reader) & frames._FLAT
    _same(reader.recv(), small)
    writer.close()
    reader.close()


def test_a_corrupt_header_is_refused() -> None:
    reader, writer = _pair()
    writer.send(("batch", 1, 0, {"x": np.arange(4, dtype=np.int32)}, None, 0))
    reader.recv()
    assert writer.sock is not None
    one = struct.Struct("<qqqQQ")
    for number, offset, dims in [(0, 1 << 40, 4), (5, 0, 4), (0, 0, 1 << 20)]:   # outside / unknown layout / too long
        head = flat._HEAD.pack(1, number, 0, 0, 0, 64) + one.pack(1, 0, 1, offset, dims)
        writer.sock.sendall(frames._PREFIX.pack(frames._IN_RING | frames._FLAT, len(head)) + head)
        with pytest.raises(EOFError, match="corrupt"):
            reader.recv()
    writer.close()
    reader.close()


def test_layouts_in_a_pickled_state_survive_the_round_trip() -> None:
    """(The layout key itself pickles: names, dtype strings, dimensions.)"""
    key = flat.encode({}, [("batch", 0, 0, _every_dtype(1), None, 0)])
    assert key is not None and pickle.loads(pickle.dumps(key.key)) == key.key
