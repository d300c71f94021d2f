"""The client trusts nothing it receives: a fake server (tests/hostile_server.py) sends crafted
welcomes, frames and floods, and the client answers each with a ``ProtocolError`` naming the
field (or an ``AuthError`` naming the key), within its timeout, without allocating what it was told."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
import zmq.auth

from feedline._service.auth import generate_keys
from feedline._service.client import RemoteLoader
from feedline._service.protocol import decode_batch, unpack_header
from feedline.errors import AuthError, ProtocolError
from hostile_server import DROP, HostileServer, compact_frames, joined, plain_frames

HERE = Path(__file__).resolve().parent


def outcome(fn: Callable[[], Any], within: float) -> BaseException | Any:
    """What ``fn`` raised or returned, failing the test when it takes longer than ``within`` seconds."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(within)
    assert box, f"the client was still running after {within}s"
    box.append(time.monotonic() - start)
    return box[0]


def first_batch(srv: HostileServer, **kwargs: Any) -> Any:
    loader = RemoteLoader(srv.address, timeout=kwargs.pop("timeout", 3.0), reconnect=kwargs.pop("reconnect", 6.0),
                          prefetch=kwargs.pop("prefetch", 2), **kwargs)
    try:
        return next(iter(loader))
    finally:
        loader.close()


def all_batches(srv: HostileServer, **kwargs: Any) -> list[Any]:
    loader = RemoteLoader(srv.address, timeout=3.0, reconnect=6.0, **kwargs)
    try:
        return list(loader)
    finally:
        loader.close()


def test_a_hostile_server_that_behaves_delivers_its_batch() -> None:
    with HostileServer(batches=lambda: [compact_frames()]) as srv:
        batch = outcome(lambda: first_batch(srv), 10)
    assert not isinstance(batch, BaseException), batch
    assert batch["input_ids"].shape == (2, 16) and batch["seq_lens"].tolist() == [[3, 2, 0, 0], [4, 0, 0, 0]]


U64 = np.array([2**64 - 1, 1, 0, 0], dtype=np.uint64)   # sums to 0 in uint64
# (crafted compact batch, the field the error must name); each allocated GBs or passed before
COMPACT = {
    "max_length_2^26": (dict(layout={"max_length": 1 << 26}), "max_length"),
    "max_docs_2^27": (dict(layout={"max_docs": 1 << 27}), "max_docs"),
    "trailing_dims": (dict(docs=[1], lengths=[0], values=np.zeros((0, 1 << 31), np.int32)), "budget"),
    "uint64_wrap": (dict(docs=[4], lengths=U64, values=np.zeros(0, np.int32)), "lengths"),
    "nan_pad": (dict(layout={"pad": {"input_ids": math.nan, "labels": -100}}), "pad"),
    "float_ids": (dict(values=np.arange(9, dtype=np.float32)), "input_ids"),
    "too_many_rows": (dict(docs=[1] * 5, lengths=[1] * 5, values=np.arange(5, dtype=np.int32)), "docs"),
    "negative_docs": (dict(docs=[-1, 4], lengths=[3, 2, 4]), "docs"),
}


@pytest.mark.parametrize("case", sorted(COMPACT))
def test_a_crafted_compact_frame_is_a_protocol_error_naming_its_field(case: str) -> None:
    kwargs, field = COMPACT[case]
    with HostileServer(batches=lambda: [compact_frames(**kwargs)]) as srv:
        got = outcome(lambda: first_batch(srv), 10)
    assert isinstance(got, ProtocolError), repr(got)
    assert field in str(got)


@pytest.mark.parametrize("case", sorted(set(COMPACT) - {"too_many_rows"}))   # rows: known from a welcome only
def test_compact_limits_hold_without_a_welcome_too(case: str) -> None:
    """``decode_batch`` alone (no stream limits): still a ProtocolError, never MemoryError or ValueError."""
    kwargs, _field = COMPACT[case]
    header, payload = compact_frames(**kwargs)
    with pytest.raises(ProtocolError):
        decode_batch(unpack_header(header), [payload])


PLAIN = {
    "float_ids": ({"input_ids": np.zeros((2, 4), np.float32)}, "input_ids"),
    "too_many_rows": ({"input_ids": np.zeros((9, 4), np.int32)}, "rows"),
    "too_long": ({"input_ids": np.zeros((2, 17), np.int32)}, "max_length"),
    "ragged": ({"input_ids": np.zeros((2, 4), np.int32), "attention_mask": np.zeros((3, 4), np.int32)}, "rows"),
    "scalar": ({"input_ids": np.zeros((), np.int32)}, "scalar"),
}


@pytest.mark.parametrize("case", sorted(PLAIN))
def test_a_crafted_plain_frame_is_a_protocol_error_naming_its_field(case: str) -> None:
    arrays, words = PLAIN[case]
    with HostileServer(batches=lambda: [plain_frames(**arrays)]) as srv:
        got = outcome(lambda: first_batch(srv), 10)
    assert isinstance(got, ProtocolError) and words in str(got), repr(got)


def test_a_batch_whose_fields_change_is_a_protocol_error() -> None:
    good = {"input_ids": np.zeros((2, 4), np.int32)}
    with HostileServer(batches=lambda: [plain_frames(1, **good), plain_frames(2, input_ids=np.zeros((2, 4), np.int64))]) as srv:
        def two() -> None:
            loader = RemoteLoader(srv.address, timeout=3, reconnect=6, prefetch=4)
            try:
                it = iter(loader)
                next(it)
                next(it)
            finally:
                loader.close()
        got = outcome(two, 10)
    assert isinstance(got, ProtocolError) and "input_ids" in str(got) and "first batch" in str(got), repr(got)


def test_batches_beyond_the_granted_credit_are_a_protocol_error() -> None:
    # 40 messages at once for a credit of 2: with 7, a consumer on a loaded machine could take each batch and
    # grant its credit before the server's thread sent the next, receive all within credit, and wait for more
    frames = [plain_frames(step, input_ids=np.zeros((2, 4), np.int32)) for step in range(1, 41)]
    with HostileServer(batches=lambda: frames) as srv:
        got = outcome(lambda: all_batches(srv, prefetch=2), 10)
    assert isinstance(got, ProtocolError) and "credit" in str(got), repr(got)


def first_batches(srv: HostileServer, n: int, **kwargs: Any) -> list[Any]:
    loader = RemoteLoader(srv.address, timeout=3.0, reconnect=6.0, **kwargs)
    try:
        it = iter(loader)
        return [next(it) for _ in range(n)]
    finally:
        loader.close()


def test_several_steps_in_one_message_are_each_checked_and_delivered() -> None:
    with HostileServer(batches=lambda: [joined(compact_frames(1), compact_frames(2, docs=(1, 1), lengths=(5, 4)))]) as srv:
        got = outcome(lambda: first_batches(srv, 2, prefetch=2), 10)
    assert not isinstance(got, BaseException), got
    assert [b["seq_lens"].tolist() for b in got] == [[[3, 2, 0, 0], [4, 0, 0, 0]], [[5, 0, 0, 0], [4, 0, 0, 0]]]


@pytest.mark.parametrize("message,words", [
    # three steps in one message to a client that granted two
    (lambda: joined(*(compact_frames(s) for s in (1, 2, 3))), "credit"),
    # the second step's layout is beyond the welcome's max_length: checked as a single batch would be
    (lambda: joined(compact_frames(1), compact_frames(2, layout={"max_length": 1 << 26})), "max_length"),
    # a payload frame per step, as a peer that splits them would send
    (lambda: [*joined(compact_frames(1), compact_frames(2)), b"\0" * 8], "one payload frame"),
    # items that do not tile the payload
    (lambda: [joined(compact_frames(1), compact_frames(2))[0], b"\0" * 8], "'at'"),
])
def test_a_hostile_batches_message_is_a_protocol_error(message: Callable[[], list[bytes]], words: str) -> None:
    with HostileServer(batches=lambda: [message()]) as srv:
        got = outcome(lambda: first_batches(srv, 3, prefetch=2), 10)
    assert isinstance(got, ProtocolError) and words in str(got), repr(got)


# every welcome field, broken; before: -1 blocked the poller forever, 0 spun it
WELCOMES = {
    "heartbeat_-1": ({"heartbeat": -1}, "heartbeat"),
    "heartbeat_0": ({"heartbeat": 0}, "heartbeat"),
    "heartbeat_huge": ({"heartbeat": 1e12}, "heartbeat"),
    "heartbeat_nan": ({"heartbeat": math.nan}, "heartbeat"),
    "heartbeat_str": ({"heartbeat": "1"}, "heartbeat"),
    "heartbeat_missing": ({"heartbeat": DROP}, "heartbeat"),
    "timeout_bool": ({"timeout": True}, "timeout"),
    "prefetch_0": ({"prefetch": 0}, "prefetch"),
    "prefetch_float": ({"prefetch": 2.0}, "prefetch"),
    "state_not_json": ({"state": "{"}, "state"),
    "state_list": ({"state": "[]"}, "state"),
    "state_bytes": ({"state": b"{}"}, "state"),
    "stream": ({"stream": "other"}, "stream"),
    "spec_hash": ({"spec_hash": 7}, "spec_hash"),
    "version": ({"v": 99}, "version"),
    "batch_missing": ({"batch": DROP}, "batch"),
    "batch_rows_0": ({"batch": {"rows": 0, "max_length": 16, "max_docs": 4}}, "batch.rows"),
    "batch_length_str": ({"batch": {"rows": 4, "max_length": "16", "max_docs": 4}}, "batch.max_length"),
}


@pytest.mark.parametrize("case", sorted(WELCOMES))
def test_every_welcome_field_is_checked_within_the_clients_timeout(case: str) -> None:
    overrides, field = WELCOMES[case]
    with HostileServer(welcome=overrides) as srv:
        got = outcome(lambda: first_batch(srv, timeout=3.0), 8)
    assert isinstance(got, ProtocolError) and field in str(got), repr(got)


def test_a_server_only_announces_a_heartbeat_its_clients_accept() -> None:
    from feedline._service.options import ServerOptions
    from feedline._service.trust import HEARTBEAT_RANGE
    from feedline.errors import SpecError

    ServerOptions(heartbeat=HEARTBEAT_RANGE[0], timeout=10)
    with pytest.raises(SpecError, match="heartbeat"):
        ServerOptions(heartbeat=HEARTBEAT_RANGE[0] / 2, timeout=10)


@pytest.mark.slow
def test_a_tiny_heartbeat_does_not_spin_the_client() -> None:
    """A legal but tiny heartbeat: the client waits for batches that never come without burning a core."""
    with HostileServer(welcome={"heartbeat": 0.01}) as srv:
        loader = RemoteLoader(srv.address, timeout=3.0, reconnect=6.0, prefetch=2)
        waiting = threading.Thread(target=lambda: outcome(lambda: next(iter(loader)), 30), daemon=True)
        waiting.start()
        time.sleep(0.5)
        cpu = time.process_time()
        time.sleep(1.5)
        used = time.process_time() - cpu
        loader.close()
        waiting.join(10)
    assert used < 0.75, f"{used:.1f}s of CPU in 1.5s while waiting"   # a spinning client takes all 1.5 s


def _keys(tmp: Path, *, wrong: bool) -> tuple[tuple[bytes, bytes], str]:
    """The server's key pair and a client keys folder (with another server's public key if ``wrong``)."""
    generate_keys(tmp)
    server = zmq.auth.load_certificate(str(tmp / "server.key_secret"))
    if wrong:
        (tmp / "server.key").unlink()
        other = tmp / "other"
        generate_keys(other)
        (other / "server.key").rename(tmp / "server.key")
    return (server[0], server[1] or b""), str(tmp)


@pytest.mark.slow
def test_a_wrong_server_key_is_an_auth_error_within_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's bound on failing handshakes (5 s; 0.75 s here), not its 30 s timeout nor its
    300 s reconnect, ends the wait: an ``AuthError`` naming the key."""
    from feedline._service import connection

    monkeypatch.setattr(connection, "HANDSHAKE_BOUND_S", 0.75)
    pair, keys = _keys(tmp_path, wrong=True)
    with HostileServer(keys=pair) as srv:
        got = outcome(lambda: first_batch(srv, keys=keys, timeout=30.0, reconnect=300.0), 20)
    assert isinstance(got, AuthError), repr(got)
    assert "server.key" in str(got)   # names the likely cause


def test_the_right_server_key_still_connects(tmp_path: Path) -> None:
    pair, keys = _keys(tmp_path, wrong=False)
    with HostileServer(keys=pair, batches=lambda: [compact_frames()]) as srv:
        got = outcome(lambda: first_batch(srv, keys=keys), 10)
    assert not isinstance(got, BaseException), repr(got)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.slow
def test_a_flooding_server_cannot_fill_the_clients_memory() -> None:
    """A server in another process sends 40 batches of 16 MB at once, ignoring credit: the client
    (prefetch 2) stops at the first batch beyond its credit, holding a few batches at most."""
    proc = subprocess.Popen([sys.executable, str(HERE / "hostile_server.py"), "--batches", "40", "--mb", "16"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])})
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().split()[1]
        base, peak = _rss_mb(), [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss_mb())
                time.sleep(0.01)

        threading.Thread(target=sample, daemon=True).start()

        def consume() -> None:
            loader = RemoteLoader(address, timeout=5, reconnect=10, prefetch=2, max_message=64 << 20)
            try:
                for _ in loader:
                    time.sleep(0.5)   # a slow trainer: the flood piles up unless refused
            finally:
                loader.close()

        got = outcome(consume, 30)
        done.set()
        assert isinstance(got, ProtocolError) and "credit" in str(got), repr(got)
        grown = peak[0] - base
        assert grown < 16 * 14, f"the client grew {grown:.0f} MB under a flood of 40 x 16 MB"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.kill()
        proc.wait()
