"""Each partition stage alone (issue 34 item 1): a placement opens partition p from its state as a
stage (next -> (batch, state), get_state/set_state/start/close, end_state), and every one of them
resumes exactly from any of its states and gives partition p's batches and states as threads do."""

from __future__ import annotations

import time
from typing import Any

import pytest

from feedline import Spec
from feedline._core.deferred import materialize
from feedline._core.prefetch import Prefetch
from feedline._partitions.placement import ThreadPlacement
from feedline._partitions.processes import ProcessPlacement
from feedline._partitions.streams import Handover, WorkerStream
from feedline._pipeline import PartitionStreams
from feedline.testing import assert_batches_equal, assert_stage_resumes


def placement(corpus: str, tok: str, kind: type, **parallel: Any) -> Any:
    s = Spec.load({"sources": [corpus], "tokenizer": tok, "task": {"kind": "clm", "max_length": 48},
                   "batching": {"strategy": "pack", "batch_size": 5, "window": 16, "first_window": 4},
                   "shuffle": {"buffer": 16}, "partitions": 2,
                   "parallel": {"placement": "processes", "prefetch": 2, "processes": 2, **parallel}})
    return kind(PartitionStreams(s), 2, s.parallel)


def drain(stage: Any) -> tuple[list[Any], list[Any], Any]:
    batches, states = [], []
    try:
        for batch, state in stage:
            batches.append(batch)
            states.append(materialize(state))   # (a worker's state may stay there until read)
        return batches, states, stage.end_state
    finally:
        stage.close()


def test_a_thread_stage_is_a_prefetch_over_the_partitions_pipeline(corpus: str, small_tokenizer: str) -> None:
    threads = placement(corpus, small_tokenizer, ThreadPlacement)
    assert isinstance(threads.open(1, None), Prefetch)
    assert assert_stage_resumes(lambda: threads.open(1, None), check=2, every=3) >= 3


@pytest.mark.slow
def test_a_worker_stream_resumes_alone_and_gives_the_threads_batches(corpus: str, small_tokenizer: str) -> None:
    """Every restore opens a new generation of the partition in the same worker; what the worker
    made for the old one is dropped on arrival."""
    threads = placement(corpus, small_tokenizer, ThreadPlacement)
    procs = placement(corpus, small_tokenizer, ProcessPlacement, warm_start=False)
    try:
        assert isinstance(procs.open(1, None), WorkerStream)
        assert assert_stage_resumes(lambda: procs.open(1, None), check=2, every=3) >= 3
        want, want_states, want_end = drain(threads.open(1, None))
        middle = want_states[2]
        got, got_states, got_end = drain(procs.open(1, middle))   # opened from a state, as a restore does
        assert_batches_equal(want[3:], got, "a worker stream from the threads' state after batch 3")
        assert got_states == want_states[3:] and got_end == want_end and len(procs.pids()) == 2
    finally:
        procs.close()


@pytest.mark.slow
def test_a_handover_is_local_until_its_worker_is_ready_then_exact(corpus: str, small_tokenizer: str) -> None:
    threads = placement(corpus, small_tokenizer, ThreadPlacement)
    warm = placement(corpus, small_tokenizer, ProcessPlacement, warm_start=True)
    try:
        want, want_states, _ = drain(threads.open(0, None))
        stage = warm.open(0, None)
        assert isinstance(stage, Handover)
        first = next(stage)   # here: the worker is not even started before start()
        assert stage.mode == "local" and warm.pids() == []
        stage.start()
        deadline = time.monotonic() + 120
        while not stage.remote.worker_ready():
            assert time.monotonic() < deadline, "the worker never said it was ready"
            warm.drain()
            time.sleep(0.05)
        local, here = stage.local, 1
        # the worker began at once, after what the thread had queued, which is still to be handed out
        assert stage.mode == "remote" and stage.remote.begun and local is not None and not local.running
        got, got_states = [], []
        for batch, state in stage:
            here += stage.local is not None   # (closed at the first ask after its last batch)
            got.append(batch)
            got_states.append(materialize(state))
        stage.close()
        assert local.finished   # every batch the thread had queued was handed out, then the worker's
        # it made what it handed out and, at most, the one it was making when cut (dropped)
        assert here <= local.pulled <= here + 1 and here < len(want), (local.pulled, here)
        assert_batches_equal(want, [first[0], *got], "a handover: a thread here, then its worker")
        assert [materialize(first[1]), *got_states] == want_states

        def started() -> Handover:   # restored while its worker is ready: the worker takes over at once
            stage = warm.open(0, None)
            stage.start()
            return stage

        assert assert_stage_resumes(started, check=2, every=3) >= 3
    finally:
        warm.close()


def test_partitions_that_start_together_all_start_at_the_first_ask(corpus: str, small_tokenizer: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The composing stage's one rule has one switch: a placement whose partitions start together
    (processes without warm start: each worker starts all its partitions; Ray) opens and starts
    every partition at the first ask, not after step 1 (a cold K = 8 had 7 pack windows still
    filling 5 s after the first batch)."""
    from feedline._partitions import placement as placements
    from feedline._pipeline import Pipeline

    class Together(ThreadPlacement):
        together = True

    monkeypatch.setitem(placements.PLACEMENTS, "threads", Together)
    s = Spec.load({"sources": [corpus], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 48},
                   "batching": {"strategy": "pack", "batch_size": 5, "window": 16, "first_window": 4},
                   "partitions": 3, "parallel": "threads"})
    it = iter(Pipeline(s).batches())
    try:
        next(it)
        assert all(isinstance(st, Prefetch) and st._thread is not None for st in it.stages)
    finally:
        it.close()
    assert ProcessPlacement(PartitionStreams(s), 3, s.parallel.__class__(placement="processes", warm_start=False)).together


@pytest.mark.slow
def test_a_worker_sends_a_state_every_anchor_and_every_state_read_is_exact(
        corpus: str, small_tokenizer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34 item 3: the worker pickles and sends a batch's state with it only every
    ANCHOR_EVERY batches (8 here, for a partition of 20; 64 in use); the others stay there until
    read. A state read is asked of the worker while it keeps it (the threads' state, identical),
    and made again here from the last state sent where it does not (another start of the
    partition, a restart): exact, the same batches follow it. The service reads every step's
    state: there (eager) each batch carries its own."""
    from feedline._core.deferred import Deferred
    from feedline._partitions import streams

    ANCHOR_EVERY = 8
    monkeypatch.setattr(streams, "ANCHOR_EVERY", ANCHOR_EVERY)

    threads = placement(corpus, small_tokenizer, ThreadPlacement)
    procs = placement(corpus, small_tokenizer, ProcessPlacement, warm_start=False)
    replayed: list[int] = []
    replay = procs.replay_state
    procs.replay_state = lambda p, base, n: replayed.append(n) or replay(p, base, n)
    try:
        want, want_states, _ = drain(threads.open(0, None))
        got = list(procs.open(0, None))
        sent = [i for i, (_, state) in enumerate(got) if type(state) is not Deferred]
        assert len(got) == len(want) > ANCHOR_EVERY and sent == list(range(0, len(got), ANCHOR_EVERY))
        half = len(got) // 2
        assert [materialize(s) for _, s in got[half:]] == want_states[half:] and not replayed   # asked of the worker
        next(procs.open(0, None))   # another start: the worker no longer keeps them
        made = [materialize(s) for _, s in got[:half]]
        assert replayed and max(replayed) < ANCHOR_EVERY   # made again here, from the last state sent
        for i, state in enumerate(made):   # exact: resumed, the batches after it (a pack state made again
            here = threads.open(0, state)  # may be another form of the same position)
            assert_batches_equal(want[i + 1:i + 3], [next(here)[0] for _ in want[i + 1:i + 3]], f"after state {i}")
            here.close()
        procs.eager = True
        assert all(type(s) is not Deferred for _, s in procs.open(0, None))
    finally:
        procs.close()
