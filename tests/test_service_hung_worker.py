"""A trainer behind ``feedline serve`` is told why no batch comes when a partition worker hangs.

The server's pipeline names a silent worker in its own log; before, the client only said it had
waited N s and that the server had "nothing new to send". Now the server's answer to the client's
ping carries the pipeline's notice (``feedline._core.notices``), so the trainer's own log names the
worker, its partitions and pid, and the stream goes on after the restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import feedline
from service_helpers import make_spec, start_server, stop, tokenizer_path, write_spec

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def a_stopped_worker(server_pid: int) -> Iterator[int]:
    """SIGSTOP the last of the server's worker processes (yields its pid); SIGKILL it after if it still exists."""
    workers = [p for p in psutil.Process(server_pid).children(recursive=True) if "python" in p.name().lower()]
    assert len(workers) >= 2, workers
    victim = workers[-1].pid
    os.kill(victim, signal.SIGSTOP)
    try:
        yield victim
    finally:
        if psutil.pid_exists(victim):
            os.kill(victim, signal.SIGKILL)


def drain(it: Iterator[Any], steps: int, take: Callable[[Any], None]) -> threading.Event:
    """Take ``steps`` batches on a thread (enough that the stopped worker's partition must come round);
    the event is set when all came."""
    done = threading.Event()

    def run() -> None:
        for _ in range(steps):
            take(next(it))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


@pytest.mark.slow
def test_a_client_waiting_on_a_stopped_worker_is_told_which_and_the_stream_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from feedline._service import client as client_module

    monkeypatch.setattr(client_module, "WAIT_WARN_S", 1.0)
    monkeypatch.setattr(client_module, "WAIT_WARN_EVERY_S", 1.0)
    spec: dict[str, Any] = make_spec(tmp_path, tokenizer_path(tmp_path), docs=200)
    spec.update(partitions=2, parallel={"placement": "processes", "processes": 2, "prefetch": 1,
                                        "warm_start": False, "hang_timeout": 3})
    proc, address = start_server(write_spec(tmp_path / "spec.json", spec), "--heartbeat", "0.2", "--window", "2",
                                 "--max-prefetch", "1")
    got: list[int] = []
    try:
        loader = feedline.Loader(address, 0, 1, reconnect=30.0)
        it = iter(loader)
        for _ in range(3):
            got.append(next(it)["input_ids"].shape[0])
        with a_stopped_worker(proc.pid) as victim, caplog.at_level("WARNING", logger="feedline.service"):
            done = drain(it, 40, lambda b: got.append(b["input_ids"].shape[0]))
            assert done.wait(60), f"the stream did not go on after the worker was restarted ({len(got)} steps)"
        told = [r.getMessage() for r in caplog.records if "the server says" in r.getMessage()]
        assert any(f"(pid {victim})" in m and "has said nothing" in m for m in told), caplog.text
        loader.close()
    finally:
        stop(proc)
    assert len(got) == 43


@pytest.mark.slow
def test_a_client_of_another_stream_is_never_told_of_the_stopped_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Two streams in one server: ``slow`` runs worker processes, one is stopped; its client is told
    which (the notice exists), while every pong a ``train`` client gets in that time names nothing of it."""
    import zmq

    from feedline._service import client as client_module
    from feedline._service.protocol import PROTOCOL_VERSION, pack, unpack_header

    monkeypatch.setattr(client_module, "WAIT_WARN_S", 1.0)
    monkeypatch.setattr(client_module, "WAIT_WARN_EVERY_S", 1.0)
    spec: dict[str, Any] = make_spec(tmp_path, tokenizer_path(tmp_path), docs=200)
    spec["streams"] = {"slow": {"partitions": 2, "parallel": {"placement": "processes", "processes": 2, "prefetch": 1,
                                                               "warm_start": False, "hang_timeout": 3}}}
    proc, address = start_server(write_spec(tmp_path / "spec.json", spec), "--heartbeat", "0.2", "--window", "2",
                                 "--max-prefetch", "1")
    ctx = zmq.Context()
    other = ctx.socket(zmq.DEALER)   # a client of 'train' that holds its credit and pings, as a waiting client does
    other.setsockopt(zmq.LINGER, 0)
    pongs: list[str | None] = []
    try:
        other.connect(address)
        other.send(pack("hello", v=PROTOCOL_VERSION, stream="train", rank=0, world_size=1, prefetch=1))
        assert other.poll(30_000), "no welcome"
        assert unpack_header(other.recv())["op"] == "welcome"
        loader = feedline.Loader(address, 0, 1, stream="slow", reconnect=30.0)
        it = iter(loader)
        for _ in range(3):
            next(it)
        with a_stopped_worker(proc.pid) as victim, caplog.at_level("WARNING", logger="feedline.service"):
            done = drain(it, 40, lambda b: None)
            while not done.wait(0.2):
                other.send(pack("ping"))
                while other.poll(0):
                    h = unpack_header(other.recv())
                    if h["op"] == "pong":
                        pongs.append(h.get("stall"))
                assert len(pongs) < 300, "the 'slow' stream did not go on after the worker was restarted"
        told = [r.getMessage() for r in caplog.records if "the server says" in r.getMessage()]
        assert any(f"(pid {victim})" in m and "has said nothing" in m for m in told), caplog.text  # the notice was there
        assert len(pongs) >= 10
        assert [p for p in pongs if p is not None] == []   # ... and never told to the other stream's client
        loader.close()
    finally:
        other.close()
        ctx.term()
        stop(proc)
