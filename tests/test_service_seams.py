"""The service's seams: errors keep their type across the wire, dispatch logic runs without sockets."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

import pytest

import feedline
from feedline._service.dispatch import Dispatcher
from feedline._service.options import ServerOptions
from feedline._service.protocol import PROTOCOL_VERSION, decode_batch, pack
from feedline._service.streams import load_streams
from feedline._service.transport import InProcTransport
from feedline.errors import RecordError
from feedline.service import serve_process
from feedline.testing import assert_batches_equal, make_corpus
from service_helpers import tokenizer_path

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("service_seams")


def _bad_corpus(tmp: Path) -> dict[str, Any]:
    lines = [json.dumps({"text": f"document number {i} " * 8}) for i in range(30)]
    lines[17] = '{"text": "a broken line'
    (tmp / "c.jsonl").write_text("\n".join(lines) + "\n")
    return {"sources": [str(tmp / "c.jsonl")], "tokenizer": tokenizer_path(tmp), "on_error": "raise",
            "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pad", "batch_size": 4}}


def _first_error(loader: Any) -> BaseException:
    try:
        for _ in loader:
            pass
    except Exception as e:
        return e
    finally:
        loader.close()
    raise AssertionError("no error raised")


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_a_record_error_in_the_server_arrives_as_record_error(tmp_path: Path) -> None:
    spec = _bad_corpus(tmp_path)
    local = _first_error(feedline.Loader(spec))
    assert isinstance(local, RecordError) and local.line == 18
    with serve_process(spec, args=["--heartbeat", "0.2", "--timeout", "2"]) as address:
        remote = _first_error(feedline.Loader(address))
    assert type(remote) is RecordError, repr(remote)
    assert (remote.path, remote.line, remote.reason) == (local.path, local.line, local.reason)
    assert str(local) in str(remote)


# ----------------------------------------------------------------------------- dispatch without sockets


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("seams")
    make_corpus(tmp / "c", files=1, docs=40)
    return {"sources": [str(tmp / "c")], "tokenizer": tokenizer_path(tmp), "seed": 5,
            "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pad", "batch_size": 4}}


@pytest.fixture()
def wired(spec: dict[str, Any]) -> Any:
    from feedline._pipeline import GlobalStream

    streams = load_streams(spec)
    it = iter(GlobalStream(streams["train"], 1))
    initial = {"train": it.get_state()}
    it.close()
    transport = InProcTransport()
    d = Dispatcher(streams, ServerOptions(window=2, lease=5.0), transport, initial=initial)
    yield d, transport
    d.close()


def _until(d: Dispatcher, t: InProcTransport, ident: bytes, op: str, now: float = 0.0) -> list[dict[str, Any]]:
    """Dispatch (the producer threads are real) until ``ident`` received an ``op`` message."""
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while not any(h["op"] == op for h, _ in got):
        assert time.monotonic() < deadline, f"{ident!r} never received {op!r}: {[h['op'] for h, _ in got]}"
        d.dispatch(now)
        got.extend(t.take(ident))
        time.sleep(0.01)
    return got


def _hello(**kw: Any) -> list[bytes]:
    return [pack("hello", v=PROTOCOL_VERSION, stream="train", **kw)]


def test_dispatch_serves_the_in_process_batches_without_sockets(spec: dict[str, Any], wired: Any) -> None:
    d, t = wired
    d.receive(b"a", _hello(rank=0, world_size=1, session="s"), now=0.0)
    assert [h["op"] for h, _ in t.take(b"a")] == ["welcome"]
    d.receive(b"a", [pack("credit", n=2)], now=0.0)
    got = [m for m in _until(d, t, b"a", "batch") if m[0]["op"] == "batch"]
    header, buffers = got[0]
    want = next(iter(feedline.Loader(spec)))
    assert_batches_equal([want], [decode_batch(header, buffers)], "first batch through the dispatcher")


def test_ready_steps_leave_in_one_message(spec: dict[str, Any]) -> None:
    """What the credit allows of the ready steps goes as one ``batches`` message (the per-message
    costs paid once for several steps), the first batch at once; the steps are the in-process ones."""
    from feedline._pipeline import GlobalStream

    streams = load_streams(spec)
    it = iter(GlobalStream(streams["train"], 1))
    initial = {"train": it.get_state()}
    it.close()
    t = InProcTransport()
    d = Dispatcher(streams, ServerOptions(window=8), t, initial=initial)
    try:
        d.receive(b"a", _hello(rank=0, world_size=1, session="s", prefetch=8), now=0.0)
        d.receive(b"a", [pack("credit", n=1)], now=0.0)
        _until(d, t, b"a", "batch")
        assert t.messages == 2   # welcome, the first batch at once
        cursor = d.cursors[("train", 1)][0]
        deadline = time.monotonic() + 30
        while cursor.produced < 6:   # steps 2..6 ready before any credit for them
            assert time.monotonic() < deadline
            d.dispatch(0.0)
            time.sleep(0.005)
        d.receive(b"a", [pack("credit", n=4, step=1)], now=0.0)
        d.dispatch(0.0)
        got = t.take(b"a")
        assert t.messages == 3 and [h["step"] for h, _ in got] == [2, 3, 4, 5]
        want = [b for _, b in zip(range(5), feedline.Loader(spec), strict=False)]
        assert_batches_equal(want[1:], [decode_batch(h, bufs) for h, bufs in got], "steps 2-5 in one message")
    finally:
        d.close()


class _Ready:
    """A delivery with ``n`` steps ready, the first produced ``age`` seconds ago (what a hold decides on)."""

    def __init__(self, n: int, age: float, final: bool = False) -> None:
        self.n, self.age, self.final = n, age, final

    def ready(self, client: Any) -> tuple[int, float, bool]:
        return self.n, time.monotonic() - self.age, self.final


@pytest.mark.parametrize("ready,credit,sent,held", [
    ((1, 0.0), 4, 1, True),           # one fresh step for a credit of 4: wait for more
    ((3, 0.0), 3, 1, False),          # as many as the credit allows
    ((4, 0.0), 8, 1, False),          # COALESCE of them
    ((1, 1.0), 4, 1, False),          # the first ready step has waited HOLD_S already
    ((1, 0.0), 1, 1, False),          # a credit of one
    ((1, 0.0), 4, 0, False),          # the client's first batch
    ((1, 0.0, True), 4, 1, False),    # no more can come before an ack (ended, failed, window full)
    ((0, 0.0), 4, 1, False),          # nothing to send
])
def test_a_send_waits_for_more_steps_only_briefly_and_only_when_more_can_come(
        wired: Any, ready: tuple[Any, ...], credit: int, sent: int, held: bool) -> None:
    from feedline._service.dispatch import HOLD_S
    from feedline._service.session import Client

    d, _t = wired
    client = Client(ident=b"c", stream="train", mode="ranked", rank=0, world_size=1, delivery=_Ready(*ready),
                    prefetch=8, last_seen=0.0, credit=credit, sent=sent)
    d.due = None
    before = time.monotonic()
    assert d._hold(client) is held
    assert (d.due is not None) is held   # the loop polls again by then
    if held:
        assert before < d.due <= time.monotonic() + HOLD_S


def test_a_held_rank_is_replaced_and_its_cursor_reused(wired: Any) -> None:
    d, t = wired
    d.receive(b"old", _hello(rank=0, world_size=2, session="first"), now=0.0)
    d.receive(b"new", _hello(rank=0, world_size=2, session="second"), now=0.0)
    assert [h.get("code") for h, _ in t.take(b"old")] == [None, "replaced"]   # welcome, then bye
    assert b"old" not in d.clients and [h["op"] for h, _ in t.take(b"new")] == ["welcome"]
    assert len(d.cursors[("train", 2)]) == 1


def test_an_expired_lease_goes_to_the_next_consumer(wired: Any) -> None:
    d, t = wired
    d.receive(b"slow", _hello(mode="shared", prefetch=1), now=0.0)
    d.receive(b"slow", [pack("credit", n=1)], now=0.0)
    first = next(h for h, _ in _until(d, t, b"slow", "batch") if h["op"] == "batch")
    d.receive(b"fast", _hello(mode="shared", prefetch=1), now=1.0)
    d.receive(b"fast", [pack("credit", n=1)], now=1.0)
    got = [h for h, _ in _until(d, t, b"fast", "batch", now=6.0) if h["op"] == "batch"]   # 5 s lease ran out
    assert got[0]["step"] == first["step"]
    assert d.queues["train"].lease_expired == 1


def test_errors_and_gone_peers_without_sockets(wired: Any) -> None:
    d, t = wired
    d.receive(b"x", _hello(rank=0, world_size=1, state='{"version":1,"step":Infinity}'), now=0.0)
    (error, _), = t.take(b"x")
    assert error["op"] == "error" and error["kind"] == "StateError"
    d.receive(b"x", [b"\x93garbage"], now=0.0)
    assert t.take(b"x")[0][0]["kind"] == "ProtocolError"
    d.receive(b"g", _hello(rank=0, world_size=1, session="g"), now=0.0)
    d.receive(b"g", [pack("credit", n=1)], now=0.0)
    t.gone.add(b"g")
    deadline = time.monotonic() + 30
    while b"g" in d.clients:
        assert time.monotonic() < deadline
        d.dispatch(0.0)
        time.sleep(0.01)


@pytest.mark.parametrize("epochs,settled", [(None, True), (1, False)])
@pytest.mark.slow
def test_a_server_settles_the_auto_backend_before_it_listens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              epochs: int | None, settled: bool) -> None:
    """``backend: auto``'s fastokens check runs in ``bind()``, so it never competes with the first clients'
    batches; a stream too small for the check to start in-process (20 short documents, once) skips it."""
    pytest.importorskip("fastokens")
    from conftest import shared
    from feedline._service.server import Server
    from feedline._tokenize import check

    monkeypatch.setattr(check, "_VERDICTS", collections.OrderedDict())  # no verdict left by other tests
    make_corpus(tmp_path / "c", files=1, docs=20)
    spec = {"sources": [str(tmp_path / "c" / "*.jsonl")], "tokenizer": str(shared("tokenizers", "gpt2")),
            "epochs": epochs, "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pack", "batch_size": 4}}
    server = Server(load_streams(spec), ServerOptions(bind="tcp://127.0.0.1:0"))
    try:
        server.bind()
        encoder = server.streams["train"].tokenizer.encoder
        if settled:   # checked, not deferred to the first batch
            assert encoder.pending is None and encoder.start is None and encoder.name == "fastokens"
        else:
            assert encoder.start is not None and not check._VERDICTS
    finally:
        server.close()


# ----------------------------------------------------------------------------- shared mode holds what it must
@pytest.fixture()
def long_lease(spec: dict[str, Any]) -> Any:
    """A dispatcher whose leases never run out during a test (``now`` stays below 600)."""
    from feedline._pipeline import GlobalStream

    streams = load_streams(spec)
    it = iter(GlobalStream(streams["train"], 1))
    initial = {"train": it.get_state()}
    it.close()
    transport = InProcTransport()
    d = Dispatcher(streams, ServerOptions(window=2, lease=600.0), transport, initial=initial)
    yield d, transport
    d.close()


def _consume(d: Dispatcher, t: InProcTransport, ident: bytes, limit: int, *, ack: bool = True) -> list[int]:
    """Steps ``ident`` receives (acking each, with one credit back) until ``limit`` or 2 s without one."""
    steps: list[int] = []
    quiet = time.monotonic() + 2.0
    while len(steps) < limit and time.monotonic() < quiet:
        d.dispatch(1.0)
        for h, _ in t.take(ident):
            if h["op"] == "batch":
                steps.append(h["step"])
                quiet = time.monotonic() + 2.0
                if ack:
                    d.receive(ident, [pack("credit", n=1, step=h["step"])], now=1.0)
            elif h["op"] == "end":
                return steps
        time.sleep(0.002)
    return steps


def _live_batches() -> int:
    import gc

    from feedline._service.producer import Produced

    gc.collect()
    return sum(type(o) is Produced for o in gc.get_objects())   # type(): no __getattr__ of lazy modules


@pytest.mark.slow
def test_an_acked_batch_is_released_at_its_ack_not_at_its_lease_end(long_lease: Any) -> None:
    d, t = long_lease
    d.receive(b"a", _hello(mode="shared", prefetch=2), now=0.0)
    d.receive(b"a", [pack("credit", n=2)], now=0.0)
    steps = _consume(d, t, b"a", 1000)
    q = d.queues["train"]
    assert len(steps) >= 12 and steps == sorted(steps)
    # every batch was acked within its 600 s lease: none of them may still be held
    live = _live_batches()
    assert live <= q.budget + 4, f"{live} batches still referenced after {len(steps)} acks"   # + the producer's depth
    assert q.watermark >= len(steps) - 2 and len(q.marks) <= 1
    assert q.holding <= q.budget and len(q.leases) <= 2 * q.live + 64


@pytest.mark.slow
def test_a_stuck_shared_consumer_holds_its_batches_not_the_window(long_lease: Any) -> None:
    d, t = long_lease   # window 2, leases of 600 s that never run out here
    d.receive(b"stuck", _hello(mode="shared", prefetch=2), now=0.0)
    d.receive(b"stuck", [pack("credit", n=2)], now=0.0)
    held = [h["step"] for h, _ in _until(d, t, b"stuck", "batch") if h["op"] == "batch"]
    held += [h["step"] for h, _ in t.take(b"stuck") if h["op"] == "batch"]
    d.receive(b"fast", _hello(mode="shared", prefetch=1), now=0.0)
    d.receive(b"fast", [pack("credit", n=1)], now=0.0)
    got = _consume(d, t, b"fast", 1000)
    q = d.queues["train"]
    # the healthy consumer gets every batch but the stuck one's, without waiting for a lease to end
    assert q.ended_at is not None, f"the healthy consumer stalled after {len(got)} batches (stuck holds {held})"
    assert sorted(got + held) == list(range(1, q.ended_at + 1))
    assert q.watermark < min(held) and q.holding == len(held) and len(q.marks) <= 2


def test_rewinding_a_cursor_never_waits_for_a_step_in_progress(spec: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A hello that rewinds a cursor runs on the event loop: it must not wait for the producer thread."""
    import threading

    from feedline._service import producer as producer_mod
    from feedline._service.ranked import RankedCursor

    inside, release, calls = threading.Event(), threading.Event(), [0]
    original = producer_mod._CompactSteps.__next__

    def slow_next(self: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:   # the first producer's third step takes until released
            inside.set()
            release.wait(10)
        return original(self)

    monkeypatch.setattr(producer_mod._CompactSteps, "__next__", slow_next)
    streams = load_streams(spec)
    cursor = RankedCursor("train", streams["train"], 1, None, window=4, wake=lambda: None)
    try:
        assert inside.wait(30)
        t0 = time.monotonic()
        cursor.rewind(None)
        stalled = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while cursor.produced < 1:
            assert time.monotonic() < deadline
            cursor.pump()
            time.sleep(0.01)
        first = cursor.buffer[0]
        assert stalled < 0.5, f"the rewind blocked the event loop for {stalled:.1f}s"
        assert first.step == 1
        assert_batches_equal([next(iter(feedline.Loader(spec)))], [first.slices[0]], "first step after a rewind")
    finally:
        release.set()
        cursor.close()


def test_a_closing_client_s_ack_and_bye_reach_a_server_that_is_slow_to_take_them() -> None:
    """A client closes while ZeroMQ has not yet written its last messages (nothing listens yet: as on
    a loaded machine, or a server coming back): its hello and bye still reach the server that binds
    0.3 s later. They were dropped at close (a linger of 0), and the server then took a client that
    acked its last step for a lost one and re-queued that step."""
    import socket
    import threading

    import zmq

    from feedline._service.connection import Connection
    from feedline._service.protocol import unpack_header

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    conn = Connection(address, hello={"stream": "train"}, resume=None, prefetch=2, keys=None, timeout=30.0,
                      reconnect=30.0, max_message=1 << 20)
    conn.start()
    time.sleep(0.2)   # the thread has connected (to nothing yet) and queued its hello
    ops: list[str] = []

    def server() -> None:
        time.sleep(0.3)
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.bind(address)
        until = time.monotonic() + 5
        while "bye" not in ops and time.monotonic() < until:
            if router.poll(100):
                ops.append(unpack_header(router.recv_multipart()[-1])["op"])
        router.close(linger=0)
        ctx.term()

    thread = threading.Thread(target=server)
    thread.start()
    t0 = time.monotonic()
    conn.close()
    took = time.monotonic() - t0
    thread.join()
    assert ops == ["hello", "bye"]
    assert took < 5 + 1.5   # close() stays bounded: its wait, and a second for the last words


def test_a_client_gone_after_acking_and_saying_bye_keeps_its_acks(wired: Any) -> None:
    """A client that acks its last step, says bye and closes at once: the server's next send to it
    may fail (gone) before it reads those last words. It was dropped there, its batches re-queued and
    its last ack then read for an unknown client (a shared stream's state one step short). It is
    dropped at the next dispatch instead, after what it sent was read."""
    d, t = wired
    d.receive(b"s", _hello(mode="shared", prefetch=2), now=0.0)
    d.receive(b"s", [pack("credit", n=1)], now=0.0)
    first = next(h for h, _ in _until(d, t, b"s", "batch") if h["op"] == "batch")
    queue = d.queues["train"]
    before = queue.watermark
    t.gone.add(b"s")
    d.receive(b"s", [pack("credit", n=2)], now=0.0)   # more credit: the next send finds it gone
    deadline = time.monotonic() + 30
    while not d.clients[b"s"].unreachable:
        assert time.monotonic() < deadline, "no send was tried"
        d.dispatch(0.0)
        time.sleep(0.01)
    assert b"s" in d.clients   # not yet dropped: what it sent may be waiting
    d.receive(b"s", [pack("credit", n=0, step=first["step"])], now=0.0)   # its last words, read now
    d.receive(b"s", [pack("bye")], now=0.0)
    d.dispatch(0.0)
    assert b"s" not in d.clients and before < queue.watermark == first["step"]
