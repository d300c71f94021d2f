"""Worker-to-parent frames (feedline/_partitions/frames.py): what a partition worker sends arrives
whole, equal and writable, over a real socket pair, and a pipe that breaks mid-message ends the
reader with EOFError instead of a garbled message or a hang."""

from __future__ import annotations

import doctest
import gc
import mmap
import multiprocessing
import socket
import threading
from typing import Any

import numpy as np
import pytest

from feedline._batching.compact import CompactBatch
from feedline._partitions import frames, ring, sockets
from feedline._partitions.frames import FrameReader, FrameWriter


def test_docstring_examples() -> None:
    assert doctest.testmod(frames).failed == 0
    assert doctest.testmod(sockets).failed == 0


def message() -> tuple[Any, ...]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50_000, 4 * 1024, dtype=np.int64).astype(np.int32)
    laid = {"input_ids": ids.reshape(4, 1024), "labels": ids.reshape(4, 1024)[:, ::2],   # not contiguous
            "scores": rng.random((4, 3)), "mask": np.ones((4, 1024), dtype=bool)}
    compact = CompactBatch(np.array([2, 1]), np.array([3, 2, 4]), {"input_ids": np.arange(9, dtype=np.int32)},
                           max_length=6, max_docs=3, pad_values={"input_ids": 0})
    state = {"step": 7, "pipeline": {"rejected": {"bad_json": 2}, "refs": [[0, 1, 2, 3]] * 50}}
    return ("many", [("batch", 3, 0, laid, state), ("batch", 3, 1, compact, state), ("end", 3, 1)])


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif isinstance(want, CompactBatch):
        assert_same(got.expand(), want.expand())
    else:
        assert got == want


@pytest.mark.parametrize("duplex", [True, False])   # a socket pair (out of band) / an os pipe (pickled, as on Windows)
def test_messages_arrive_whole_equal_and_writable(duplex: bool) -> None:
    parent, child = multiprocessing.Pipe(duplex=duplex)
    reader, writer = FrameReader(parent), FrameWriter(child)
    assert (reader.sock is not None) is duplex and (writer.sock is not None) is duplex
    big = ("batch", 1, 0, {"input_ids": np.arange(6 << 20, dtype=np.int32)}, {"step": 1})   # 24 MB: many socket buffers
    sent = [message(), ("ready",), big, message()]
    t = threading.Thread(target=lambda: [writer.send(m) for m in sent])
    t.start()
    got = [reader.recv() for _ in sent]
    t.join(timeout=30)
    assert_same(got, sent)
    ids = got[2][3]["input_ids"]
    ids[0] = -1   # the consumer may write into what it was given
    assert ids[0] == -1
    writer.close()
    reader.close()


def test_a_pipe_that_breaks_mid_message_is_eof_not_a_garbled_message() -> None:
    parent, child = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(parent), FrameWriter(child)
    writer.send(("ready",))
    assert reader.recv() == ("ready",)
    # a worker killed while writing: the prefix, part of the header, then nothing
    assert writer.sock is not None
    writer.sock.sendall(frames._PREFIX.pack(1, 400) + frames._SIZE.pack(1 << 20) + b"\x80\x05" * 10)
    writer.close()
    child.close()
    with pytest.raises(EOFError):
        reader.recv()
    reader.close()


def test_closing_the_reader_ends_a_thread_waiting_in_recv() -> None:
    parent, child = multiprocessing.Pipe(duplex=True)
    reader = FrameReader(parent)
    ended: list[BaseException] = []

    def wait() -> None:
        try:
            reader.recv()
        except (EOFError, OSError) as e:
            ended.append(e)

    t = threading.Thread(target=wait)
    t.start()
    t.join(timeout=0.3)
    assert t.is_alive()   # nothing sent: it waits
    reader.close()
    t.join(timeout=5)
    assert not t.is_alive() and ended
    child.close()


def test_a_corrupt_buffer_count_is_refused_before_anything_is_allocated() -> None:
    parent, child = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(parent), FrameWriter(child)
    assert writer.sock is not None
    writer.sock.sendall(frames._PREFIX.pack(frames.MAX_BUFFERS + 1, 10))
    with pytest.raises(EOFError, match="corrupt"):
        reader.recv()
    writer.close()
    reader.close()


def test_a_batchs_snapshot_crosses_as_its_state_serialised_once() -> None:
    """A worker sends each batch's state as its pipeline's snapshot: the deferred parts are computed
    while the frame is pickled (once), and the parent reads the plain state. It used to materialize
    the state first (a deep copy of it), then pickle the copy."""
    from feedline._core import deferred
    from feedline._core.deferred import Deferred, materialize

    assert doctest.testmod(deferred).failed == 0
    calls = []
    packed = np.arange(6, dtype=np.int64)

    def rows() -> dict[str, Any]:
        calls.append(1)
        return {"rows": packed.tolist(), "skip": 2}

    snap = {"step": 7, "pipeline": {"ready": Deferred(rows), "open": [Deferred(lambda: [[0, 3]])], "stats": {"rows": 4}}}
    a, b = multiprocessing.Pipe(duplex=True)
    FrameWriter(b).send(("batch", 0, 1, {"input_ids": np.arange(4, dtype=np.int32)}, snap))
    got = FrameReader(a).recv()[4]
    assert got == materialize(snap) == {"step": 7, "pipeline": {"ready": {"rows": [0, 1, 2, 3, 4, 5], "skip": 2},
                                                                "open": [[[0, 3]]], "stats": {"rows": 4}}}
    assert calls == [1] and not any(type(v) is Deferred for v in got["pipeline"].values())


def test_a_pack_snapshot_crosses_unpacked_and_is_packed_once_per_window_where_read(
        corpus: str, small_tokenizer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pack state's rows (lookups and zlib, ~0.3 ms a batch on short records) cost a worker
    nothing: a snapshot crosses as the window's parts, and the process that reads a state packs
    them, once per window however many of its batches' states arrived. Its states are the sender's
    exactly. On the old code the worker packed every window it sent a state of."""
    import collections
    import contextlib
    import gc
    import importlib
    import json
    import pickle

    from feedline import Spec, StateError
    from feedline._batching import pack
    from feedline._core import deferred
    from feedline._core.deferred import materialize
    from feedline._pipeline import Pipeline

    packs = []
    where = pack if hasattr(pack, "pack_ragged_array") else importlib.import_module("feedline._batching.packwindow")
    real = where.pack_ragged_array
    monkeypatch.setattr(where, "pack_ragged_array", lambda *a: packs.append(1) or real(*a))
    spec = Spec.load({"sources": [corpus], "tokenizer": small_tokenizer, "seed": 3, "shuffle": {"buffer": 50},
                      "task": {"kind": "clm", "max_length": 64},
                      "batching": {"strategy": "pack", "batch_size": 2, "window": 40, "open_bins": 8}})
    it = iter(Pipeline(spec).batches())
    snaps = [next(it) and it.snapshot() for _ in range(40)]
    it.close()
    a, b = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(a), FrameWriter(b)
    t = threading.Thread(target=lambda: [writer.send(("batch", 0, 0, {}, s)) for s in snaps])
    t.start()
    got = [reader.recv()[4] for _ in snaps]   # held, as the parent holds the states it was sent
    t.join(timeout=30)
    assert packs == []
    # a window goes whole once per stream (the socket above): a later batch of it carries its key
    # only; pickled outside a stream, every state carries its window
    def buffers(stream: bool) -> list[int]:
        counts = []
        with deferred.shipping(collections.OrderedDict()) if stream else contextlib.nullcontext():
            for snap in snaps:
                out: list[pickle.PickleBuffer] = []
                pickle.dumps(snap, protocol=5, buffer_callback=out.append)
                counts.append(len(out))
        return counts

    alone, streamed = buffers(False), buffers(True)
    assert alone == [1] * len(snaps) and 0 < sum(streamed) < len(snaps) // 2
    later = streamed.index(0)
    with deferred.shipping(collections.OrderedDict()):
        pickle.dumps(snaps[later - 1], protocol=5, buffer_callback=lambda b: None)
        orphan = pickle.dumps(snaps[later], protocol=5)
    states = [json.dumps(materialize(s)) for s in got]
    assert len(packs) == 2 * sum(streamed)   # two per window (ready and open rows), not per state
    assert states == [json.dumps(materialize(s)) for s in snaps]
    # a receiver that dropped the message carrying the window (one from before a restore) drops
    # the later ones too; reading such a state says why it cannot be
    del got
    gc.collect()
    with pytest.raises(StateError, match="dropped"):
        materialize(pickle.loads(orphan))
    writer.close()
    reader.close()


class _Counting:
    """A socket's stand-in counting the system calls made on it (the rest passed through)."""

    def __init__(self, sock: Any) -> None:
        self.sock, self.calls = sock, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sock, name)
        if name in ("recv_into", "recvmsg_into", "sendall", "sendmsg", "send"):
            def counted(*a: Any, **kw: Any) -> Any:
                self.calls += 1
                return attr(*a, **kw)
            return counted
        return attr


def test_a_batch_crosses_in_one_write_and_three_reads_and_unpickles_without_numpys_python_reduction() -> None:
    """The composing process's receiving thread is woken once per message, not once per field: a
    6-field batch (4 x 64 KB) is one sendmsg and three reads (prefix, header, every buffer at once,
    MSG_WAITALL); its arrays are made by numpy.ndarray (a C call), not numpy's _frombuffer."""
    parent, child = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(parent), FrameWriter(child)
    assert reader.sock is not None and writer.sock is not None
    rows = np.arange(16 * 1024, dtype=np.int32).reshape(16, 1024)
    batch = {"input_ids": rows, "labels": rows + 1, "position_ids": rows + 2, "attention_mask": np.ones_like(rows),
             "seq_lens": np.ones((16, 64), np.int32), "cu_seqlens": np.ones((16, 65), np.int32)}
    msg = ("batch", 1, 0, batch, {"step": 3})
    assert reader.io is not None   # (the reads go through its buffered socket)
    reader.io.sock, writer.sock = _Counting(reader.sock), _Counting(writer.sock)   # type: ignore[assignment]
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(reader.recv()))
    t.start()
    writer.send(msg)
    t.join(timeout=30)
    assert_same(got[0], msg)
    assert writer.sock.calls == 1, f"{writer.sock.calls} writes for one message"   # type: ignore[attr-defined]
    assert reader.sock.calls <= 3, f"{reader.sock.calls} reads for one message of 6 arrays"   # type: ignore[attr-defined]
    buffers: list[Any] = []
    assert b"_frombuffer" not in frames._dumps(msg, buffers) and len(buffers) == 6
    writer.close()
    reader.close()


def _queued(sock: Any) -> int:
    """Bytes waiting on a socket (FIONREAD)."""
    import fcntl
    import struct
    import termios

    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0])


def _in_ring(a: Any) -> bool:
    """Whether array ``a`` lies in a worker's ring (its memory's owner, down the chain of bases)."""
    while a is not None and not isinstance(a, mmap.mmap):
        a = getattr(a, "base", None) if not isinstance(a, memoryview) else a.obj
    return a is not None


def _laid(seed: int, rows: int = 4) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, 50_000, (rows, 1024), dtype=np.int64).astype(np.int32)
    return {"input_ids": ids, "labels": ids + 1, "attention_mask": np.ones_like(ids)}


@pytest.mark.skipif(not ring.HAS_RING, reason="shared memory with descriptor passing (Linux)")
def test_a_batchs_arrays_cross_through_shared_memory_and_the_socket_carries_only_their_place() -> None:
    """A 144 KB batch puts under 1 KB on the socket (its header and where its arrays lie in the
    worker's ring), arrives equal and writable, and holds its part of the ring until it is dropped."""
    parent, child = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(parent), FrameWriter(child)
    batch = _laid(0, rows=12)
    msg = ("batch", 1, 0, batch, None, 0)
    writer.send(msg, views=True)
    assert 0 < _queued(reader.sock) < 1024, f"{_queued(reader.sock)} bytes on the socket for a 144 KB batch"
    got = reader.recv()
    assert_same(got, msg)
    assert _in_ring(got[3]["labels"])
    got[3]["input_ids"][0, 0] = -1   # the consumer may write into what it was given
    assert got[3]["input_ids"][0, 0] == -1
    small = ("batch", 1, 0, {"x": np.arange(16, dtype=np.int32)}, None, 1)
    view = got[3]["labels"][2:, :5]   # a view of one array is enough to hold the batch's part
    del got
    writer.send(small)
    reader.recv()   # (taking a message gives back the parts of those no longer held, in order)
    assert writer.ring is not None and writer.ring.free() == writer.ring.capacity - 3 * 48 * 1024 - 64   # held
    del view
    gc.collect()
    writer.send(small)
    reader.recv()
    assert writer.ring.free() == writer.ring.capacity - 64   # only the last small one's part, until the next message
    writer.close()
    reader.close()


@pytest.mark.skipif(not ring.HAS_RING, reason="shared memory with descriptor passing (Linux)")
def test_batches_a_consumer_keeps_are_never_overwritten_and_a_full_ring_sends_by_the_socket() -> None:
    """A consumer that keeps batches (all of them, or one now and then) pins their parts of the ring:
    the worker writes only behind the oldest one kept, and what does not fit goes through the
    socket, in order; every batch kept stays equal to what was sent."""
    parent, child = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(parent), FrameWriter(child, ring=1 << 20)   # 21 batches of 48 KB
    sent = [("batch", 1, 0, _laid(i), None, i) for i in range(120)]
    kept: list[Any] = []
    t = threading.Thread(target=lambda: [writer.send(m, views=True) for m in sent], daemon=True)
    t.start()
    for i in range(len(sent)):
        got = reader.recv()
        if i < 30 or i % 7 == 0:   # the first 30 (more than the ring holds), then one in seven
            kept.append((i, got))
        assert _in_ring(got[3]["input_ids"]) or i >= 21, f"batch {i} came by the socket with room in the ring"
        del got
    t.join(timeout=30)
    for i, got in kept:
        assert_same(got, sent[i])
    kept.clear()
    del got
    writer.send(("ready",))
    reader.recv()   # (the parts of the batches no longer kept are given back at the next message)
    writer.send(sent[0], views=True)
    assert _in_ring(reader.recv()[3]["input_ids"])   # room again
    writer.close()
    reader.close()


@pytest.mark.skipif(not ring.HAS_RING, reason="shared memory with descriptor passing (Linux)")
def test_a_message_placed_outside_the_ring_is_refused_as_corrupt() -> None:
    parent, child = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(parent), FrameWriter(child, ring=1 << 16)
    writer.send(("batch", 1, 0, {"x": np.arange(4, dtype=np.int32)}, None, 0))
    reader.recv()
    assert writer.sock is not None
    header = frames._dumps(("batch", 1, 0, {"x": np.arange(4, dtype=np.int32)}, None, 1), [])
    writer.sock.sendall(frames._PREFIX.pack(1 | frames._IN_RING, len(header)) + frames._SIZE.pack(16)
                        + frames._SIZE.pack((1 << 16) - 8) + frames._SIZE.pack(1 << 16) + header)
    with pytest.raises(EOFError, match="corrupt"):
        reader.recv()
    writer.close()
    reader.close()


@pytest.mark.skipif(not ring.HAS_RING, reason="shared memory with descriptor passing (Linux)")
def test_a_message_the_parent_keeps_for_long_is_copied_out_of_the_ring() -> None:
    """A batch's state (an anchor, kept by the parent until the next one) crosses in the ring but is
    copied out, while the batch beside it is handed out where it lies: nothing the parent keeps
    holds the ring."""
    parent, child = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(parent), FrameWriter(child, ring=1 << 20)
    msg = ("batch", 1, 0, _laid(0), {"window": np.arange(20_000, dtype=np.int32)}, 0)
    writer.send(msg)
    assert _queued(reader.sock) < 1024
    got = reader.recv()
    assert_same(got, msg)
    assert _in_ring(got[3]["input_ids"]) and not _in_ring(got[4]["window"])
    state = got[4]
    del got
    writer.send(("ready",))
    reader.recv()
    assert writer.ring is not None and writer.ring.free() == writer.ring.capacity   # released though kept
    assert state["window"].tolist() == list(range(20_000))
    writer.close()
    reader.close()


@pytest.mark.skipif(not ring.HAS_RING, reason="shared memory with descriptor passing (Linux)")
def test_the_reader_takes_what_the_pipe_has_in_one_read_and_never_waits_for_a_message_not_begun() -> None:
    """The parent's end reads into a buffer of its own: messages already on the pipe (prefixes,
    headers) come in one read, ``recv_ready`` says ``None`` at once where nothing came, a message
    whose header outgrows the buffer arrives whole, and ``drained`` says the last read emptied the pipe."""
    parent, child = multiprocessing.Pipe(duplex=True)
    reader, writer = FrameReader(parent), FrameWriter(child)
    assert reader.recv_ready() is None and not reader.buffered()
    msgs = [("batch", 1, 0, _laid(i), None, i) for i in range(3)] + [("alive",), ("state", 1, 0, 5, {"big": "x" * 200_000})]
    for m in msgs:
        writer.send(m, views=True)
    assert reader.io is not None
    reader.io.sock = _Counting(reader.io.sock)   # type: ignore[assignment]
    got = [reader.recv_ready() for _ in msgs]
    assert [g[0] for g in got] == ["batch", "batch", "batch", "alive", "state"]
    assert all((g[3]["labels"] == m[3]["labels"]).all() for g, m in zip(got[:3], msgs))
    assert got[4][4]["big"] == "x" * 200_000
    assert reader.sock.calls <= 3   # type: ignore[attr-defined]   # (the small ones in one read; the big header beside it)
    assert reader.recv_ready() is None and reader.drained and not reader.buffered()
    del got
    writer.close()
    reader.close()


class _Stingy:
    """A real socket whose ``sendmsg`` takes at most 1000 bytes a call (as one interrupted by a signal)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.calls = sock, 0

    def sendmsg(self, views: list[Any], ancillary: Any = ()) -> int:
        self.calls += 1
        first = memoryview(views[0]).cast("B")[:1000]
        return self.sock.sendmsg([first], list(ancillary))


def test_a_frame_the_socket_takes_in_parts_is_written_whole_and_in_order() -> None:
    """``send_all`` with ``one`` tries the bytes whole; what the socket did not take goes after, in order."""
    a, b = multiprocessing.Pipe(duplex=True)
    out, inp = sockets.socket_of(b), sockets.socket_of(a)
    assert out is not None and inp is not None
    stingy = _Stingy(out)
    data = np.random.default_rng(1).integers(0, 256, 5500, dtype=np.uint8).tobytes()
    sockets.send_all(stingy, [data], None, True)   # type: ignore[arg-type]
    reader = sockets.BufferedSocket(inp, lambda fd: None)
    got = bytearray(len(data))
    reader.read_all([memoryview(got)])
    assert bytes(got) == data and stingy.calls == 6
    out.close()
    inp.close()
