"""A trainer behind ``feedline serve`` is told why no batch comes when a partition worker hangs.

The server's pipeline names a silent worker in its own log; before, the client only said it had
waited N s and that the server had "nothing new to send". Now the server's answer to the client's
ping carries the pipeline's notice (``feedline._core.notices``), so the trainer's own log names the
worker, its partitions and pid, and the stream goes on after the restart.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

import feedline
from service_helpers import make_spec, start_server, stop, tokenizer_path, write_spec

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
def test_a_client_waiting_on_a_stopped_worker_is_told_which_and_the_stream_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from feedline._service import client as client_module

    monkeypatch.setattr(client_module, "WAIT_WARN_S", 1.0)
    monkeypatch.setattr(client_module, "WAIT_WARN_EVERY_S", 1.0)
    spec: dict[str, Any] = make_spec(tmp_path, tokenizer_path(tmp_path), docs=200)
    spec.update(partitions=2, parallel={"placement": "processes", "processes": 2, "prefetch": 1,
                                        "warm_start": False, "hang_timeout": 8})
    proc, address = start_server(write_spec(tmp_path / "spec.json", spec), "--heartbeat", "0.2", "--window", "2",
                                 "--max-prefetch", "1")
    got: list[int] = []
    try:
        loader = feedline.Loader(address, 0, 1, reconnect=30.0)
        it = iter(loader)
        for _ in range(3):
            got.append(next(it)["input_ids"].shape[0])
        workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "python" in p.name().lower()]
        assert len(workers) >= 2, workers
        victim = workers[-1].pid
        os.kill(victim, signal.SIGSTOP)
        try:
            with caplog.at_level("WARNING", logger="feedline.service"):
                done = threading.Event()

                def drain() -> None:   # enough steps that the stopped worker's partition must come round
                    for _ in range(40):
                        got.append(next(it)["input_ids"].shape[0])
                    done.set()

                threading.Thread(target=drain, daemon=True).start()
                assert done.wait(60), f"the stream did not go on after the worker was restarted ({len(got)} steps)"
        finally:
            if psutil.pid_exists(victim):
                os.kill(victim, signal.SIGKILL)
        told = [r.getMessage() for r in caplog.records if "the server says" in r.getMessage()]
        assert any(f"(pid {victim})" in m and "has said nothing" in m for m in told), caplog.text
        loader.close()
    finally:
        stop(proc)
    assert len(got) == 43
