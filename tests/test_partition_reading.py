"""The composing process reads its workers' pipes on the composing thread itself (feedline/_partitions/
launch.py, pool.py): no receiving thread per worker, and a state asked for from another thread while
the composing one waits for its consumer still comes from the worker, at once, and resumes exactly."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from feedline import Loader
from feedline._partitions import processes
from feedline.testing import assert_batches_equal, collect


def spec(corpus: str, tok: str, placement: str, **kw: Any) -> dict[str, Any]:
    parallel = {"placement": placement, "prefetch": 2, **({"warm_start": False} if placement == "processes" else {})}
    return {"sources": [corpus], "tokenizer": tok, "task": {"kind": "clm", "max_length": 48},
            "batching": {"strategy": "pack", "batch_size": 5, "window": 16, "first_window": 4}, "shuffle": {"buffer": 16},
            "partitions": 2, "parallel": parallel, "epochs": None, **kw}


@pytest.mark.slow
def test_no_thread_stands_between_a_workers_pipe_and_the_composing_stage(corpus: str, small_tokenizer: str) -> None:
    """A receiving thread per worker (a Prefetch over its pipe) used to take every message and queue
    it for the composing thread: two wake-ups in this process per batch instead of one."""
    want = collect(Loader(spec(corpus, small_tokenizer, "threads")), limit=12)
    with Loader(spec(corpus, small_tokenizer, "processes")) as loader:
        got = [dict(next(loader)) for _ in range(12)]
        names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("feedline-partitions-recv")], names
    assert_batches_equal(want, got, "processes read on the composing thread")


@pytest.mark.slow
def test_a_state_asked_while_the_composing_thread_waits_comes_from_the_worker(
        corpus: str, small_tokenizer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader's queue is full, so its composing thread reads no pipe; a checkpoint then asks the
    workers for states they kept (step 7: not one sent with its batch), and the asking thread reads
    the answer off the pipe itself: no 5 s wait, nothing made again here, and the state resumes exactly."""
    made_here: list[int] = []
    replay = processes.ProcessPlacement.replay_state
    monkeypatch.setattr(processes.ProcessPlacement, "replay_state",
                        lambda self, p, base, n: made_here.append(p) or replay(self, p, base, n))
    want = collect(Loader(spec(corpus, small_tokenizer, "threads")), limit=10)
    with Loader(spec(corpus, small_tokenizer, "processes")) as loader:
        got = [dict(next(loader)) for _ in range(7)]
        time.sleep(1.5)   # the loader's queue fills; its thread waits to put, and the workers keep beating
        t = time.monotonic()
        state = loader.state_dict()
        took = time.monotonic() - t
        got += [dict(next(loader)) for _ in range(3)]
    assert took < 3, f"the state took {took:.1f} s"
    assert made_here == [], "a state the worker kept was made again here"
    assert_batches_equal(want, got, "processes")
    with Loader(spec(corpus, small_tokenizer, "threads")) as again:
        again.load_state_dict(state)
        assert_batches_equal(want[7:], [dict(next(again)) for _ in range(3)], "resumed from the asked state")
