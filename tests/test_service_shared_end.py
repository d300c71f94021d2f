"""Shared mode at the stream's end: a healthy consumer does not wait a lease for the batches a slow consumer
has prefetched but not started (they are asked back and given to it), and each step still goes to exactly
one consumer. A real ``feedline serve`` process and real ``Loader(mode="shared")`` clients."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import feedline
from feedline.testing import collect
from service_helpers import make_spec, rows, start_server, stop, tokenizer_path, write_spec

pytestmark = pytest.mark.timeout(120)

LEASE = 9.0
SLOW_S = 3.0   # the slow consumer's time per batch: 4 of them outlast the lease


@pytest.mark.slow
def test_a_slow_consumers_prefetched_batches_go_to_the_waiting_one(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, tokenizer_path(tmp_path), docs=30)
    path = write_spec(tmp_path / "train.json", spec)
    step_of = {str(rows(b)): i + 1 for i, b in enumerate(collect(feedline.Loader(spec)))}
    proc, address = start_server(path, "--lease", str(LEASE), "--heartbeat", "0.2")
    slow_steps: list[int] = []
    fast_steps: list[int] = []
    first = threading.Event()
    fast_done: list[float] = []

    def slow() -> None:
        with feedline.Loader(address, mode="shared", prefetch=4) as loader:
            for batch in loader:
                slow_steps.append(step_of[str(rows(batch))])
                first.set()
                time.sleep(SLOW_S)

    def fast() -> None:
        first.wait(60)
        time.sleep(0.5)   # the slow one holds its prefetch now
        with feedline.Loader(address, mode="shared", prefetch=2) as loader:
            started = time.monotonic()
            for batch in loader:
                fast_steps.append(step_of[str(rows(batch))])
            fast_done.append(time.monotonic() - started)

    try:
        threads = [threading.Thread(target=slow), threading.Thread(target=fast)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=100)
        assert not any(t.is_alive() for t in threads)
    finally:
        stop(proc)
    total = len(step_of)
    assert sorted(slow_steps + fast_steps) == list(range(1, total + 1)), (slow_steps, fast_steps, total)
    # the fast consumer ends once the slow one acks the batch it works on (one SLOW_S), not after the
    # slow one went through its whole prefetch (4 x SLOW_S) or a lease (9 s)
    assert len(slow_steps) <= 2 and fast_done[0] < SLOW_S + 3.0, (slow_steps, fast_done)
