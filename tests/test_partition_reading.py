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


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.slow
def test_the_callers_thread_composes_where_the_partitions_run_in_worker_processes(
        corpus: str, small_tokenizer: str, k: int) -> None:
    """The loader ran the composing stage on a thread of its own (a Prefetch), which handed every
    batch to the caller over a queue, though the workers already make theirs ahead: one thread
    hand-off and one queue wake-up per batch more than needed. The caller's next() now reads the
    workers' pipes itself; an explicit prefetch still puts the composing stage on a thread."""
    with Loader(spec(corpus, small_tokenizer, "threads", partitions=k)) as threads:
        want = collect(threads, limit=12)
    before = set(threading.enumerate())   # (other tests' loaders may still be collected)
    with Loader(spec(corpus, small_tokenizer, "processes", partitions=k)) as loader:
        got = [dict(next(loader)) for _ in range(12)]
        names = [t.name for t in set(threading.enumerate()) - before]
    assert not [n for n in names if n.startswith("feedline-loader")], names
    assert_batches_equal(want, got, f"K={k} composed in the caller's thread")
    with Loader(spec(corpus, small_tokenizer, "processes", partitions=k), prefetch=2) as loader:
        assert_batches_equal(want[:3], [dict(next(loader)) for _ in range(3)], "composed on the loader's thread")
        assert "feedline-loader" in [t.name for t in set(threading.enumerate()) - before]


@pytest.mark.slow
def test_a_caller_that_stops_asking_for_a_while_is_not_taken_for_a_silent_worker(
        corpus: str, small_tokenizer: str, caplog: pytest.LogCaptureFixture) -> None:
    """With no thread here reading the workers' pipes between the caller's next() calls, their
    heartbeats wait on the pipes meanwhile: they are read before any silence is judged, so a
    caller busy for longer than hang_timeout finds its workers alive, named by nobody, not restarted."""
    parallel = {"placement": "processes", "prefetch": 2, "warm_start": False, "hang_timeout": 1.2}
    want = collect(Loader(spec(corpus, small_tokenizer, "threads")), limit=8)
    with caplog.at_level("WARNING", logger="feedline"), \
            Loader(spec(corpus, small_tokenizer, "processes", parallel=parallel)) as loader:
        got = []
        for _ in range(4):
            got += [dict(next(loader)), dict(next(loader))]
            time.sleep(1.5)   # longer than hang_timeout: a training step, an evaluation
        placement = loader._stage._parent.parent.parent.runner
        assert not any(placement.restarts), placement.restarts
    assert not [r for r in caplog.records if "said nothing" in r.getMessage() or "killed" in r.getMessage()], caplog.text
    assert_batches_equal(want, got, "after the pauses")
