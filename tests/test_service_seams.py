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
