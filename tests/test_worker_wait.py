"""A partition worker's wait (feedline/_partitions/worker.py, ``_Waker``): its loop sleeps until
the parent speaks on the real pipe or a partition's thread wakes it, and takes the parent's messages
in order, on both of its ways of waiting (``select.poll``, and ``multiprocessing.connection.wait``, the
one Windows takes, where pipes are not selectable)."""

from __future__ import annotations

import doctest
import multiprocessing
import os
import threading
import time

import pytest

from feedline._partitions import ring
from feedline._partitions.waker import Waker
from feedline._partitions.worker import _Waker


@pytest.fixture(params=[True, False], ids=["poll", "connection-wait"])
def pair(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    parent, child = multiprocessing.Pipe(duplex=True)
    waker = _Waker(child, poll=request.param)
    yield parent, waker
    waker.close()
    parent.close()
    child.close()


def test_a_wake_from_another_thread_ends_a_wait_in_progress(pair) -> None:  # type: ignore[no-untyped-def]
    _, waker = pair
    t0 = time.monotonic()
    waker.wait(0.2)   # nothing said: it waits out its timeout
    assert time.monotonic() - t0 >= 0.15
    threading.Timer(0.3, waker.wake).start()
    t0 = time.monotonic()
    waker.wait(10)
    assert 0.2 <= time.monotonic() - t0 < 5   # woken by the thread, long before the timeout
    assert list(waker.commands()) == []       # a wake is not a message


def test_wakes_are_taken_by_the_wait_and_never_block_the_thread_that_wakes(pair) -> None:  # type: ignore[no-untyped-def]
    _, waker = pair
    for _ in range(20_000):   # more than the socket's buffer: the extra wakes are dropped, not blocked on
        waker.wake()
    waker.wait(10)   # returns at once, and takes them all
    t0 = time.monotonic()
    waker.wait(0.2)
    assert time.monotonic() - t0 >= 0.15   # nothing left to wake it


def test_the_parents_messages_wake_the_wait_and_come_in_order(pair) -> None:  # type: ignore[no-untyped-def]
    parent, waker = pair
    threading.Timer(0.3, lambda: [parent.send(m) for m in (("credit", 0, 1, 2), ("state", 0, 1, 5))]).start()
    t0 = time.monotonic()
    waker.wait(10)
    assert time.monotonic() - t0 < 5
    time.sleep(0.1)   # (both sent)
    assert list(waker.commands()) == [("credit", 0, 1, 2), ("state", 0, 1, 5)]
    assert list(waker.commands()) == []
    parent.send(("stop",))
    parent.send(("credit", 0, 1, 1))
    waker.wait(10)
    assert list(waker.commands()) == [("stop",)]   # nothing after a stop is read


def test_a_closed_parent_pipe_reads_as_stop(pair) -> None:  # type: ignore[no-untyped-def]
    parent, waker = pair
    parent.close()
    waker.wait(10)   # an EOF wakes the wait
    assert list(waker.commands()) == [("stop",)]


def test_waker_docstring_examples() -> None:
    from feedline._partitions import waker

    assert doctest.testmod(waker).failed == 0


@pytest.mark.parametrize("poll", [True, False], ids=["poll", "connection-wait"])
def test_a_waker_over_many_pipes_names_those_with_something_to_read(poll: bool) -> None:
    """The composing process's wait on every worker's pipe: the ready ones by key, a closed one
    among them (its end is read as the worker's death), none once discarded, None on a timeout."""
    pipes = [multiprocessing.Pipe(duplex=True) for _ in range(3)]
    waker = Waker(poll)
    for w, (_, child) in enumerate(pipes):
        waker.add(child, w)
    assert waker.wait(0.05) is None
    pipes[2][0].send(("batch",))
    pipes[0][0].close()
    assert sorted(waker.wait(5) or []) == [0, 2]
    waker.discard(0)
    pipes[0][1].close()
    assert waker.wait(5) == [2]   # (level-triggered: still unread)
    assert pipes[2][1].recv() == ("batch",)
    threading.Timer(0.2, waker.wake).start()
    assert waker.wait(5) == []    # woken, nothing to read
    waker.close()


@pytest.mark.skipif(not ring.HAS_RING, reason="shared memory (Linux)")
def test_credit_counted_in_the_ring_wakes_the_worker_exactly_at_the_count_it_asked_for() -> None:
    """The parent counts its takes in the worker's ring (no message per credit); a worker out of
    credit asks to be woken at a count, and exactly the take that reaches it says to wake it."""
    writer = ring.RingWriter(1 << 16)
    reader = ring.RingReader(os.dup(writer.fd))
    try:
        assert not reader.took(0) and not reader.took(5) and writer.taken(0) == 1 and writer.taken(5) == 1
        assert writer.wake_at(0, 3)           # waits: at 1, woken at 3
        assert not reader.took(0)             # 2
        assert reader.took(0)                 # 3: this take wakes it
        assert not reader.took(0)             # 4: once
        assert not writer.wake_at(0, 4)       # reached already: it goes on without waiting (and the word is cleared)
        assert not reader.took(0) and writer.taken(0) == 5
        assert not reader.took(5)             # another partition's word
    finally:
        writer.close()
