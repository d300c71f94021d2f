"""A partition worker's wait (feedline/_partitions/worker.py, ``_Parent``): its loop sleeps until
the parent speaks on the real pipe (or closes it), and takes the parent's messages in order, on both
of its ways of waiting (``select.poll``, and ``multiprocessing.connection.wait``, the one Windows
takes, where pipes are not selectable); the composing process's :class:`Waker` over many pipes."""

from __future__ import annotations

import doctest
import multiprocessing
import os
import select
import threading
import time

import pytest

from feedline._partitions import ring
from feedline._partitions.waker import Waker
from feedline._partitions.worker import _Parent


@pytest.fixture(params=[True, False], ids=["poll", "connection-wait"])
def pair(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    parent, child = multiprocessing.Pipe(duplex=True)
    waker = _Parent(child, poll=request.param)
    yield parent, waker
    parent.close()
    child.close()


def test_a_wait_without_a_message_lasts_its_timeout_and_says_so(pair) -> None:  # type: ignore[no-untyped-def]
    _, waker = pair
    t0 = time.monotonic()
    assert waker.wait(0.2) is False   # nothing said: it waits out its timeout
    assert time.monotonic() - t0 >= 0.15
    assert list(waker.commands()) == []


def test_a_wait_without_a_timeout_lasts_until_the_parent_speaks(pair) -> None:  # type: ignore[no-untyped-def]
    parent, waker = pair
    threading.Timer(0.3, parent.send, args=(("credit", 0, 1, 0),)).start()
    t0 = time.monotonic()
    assert waker.wait(None) is True
    assert 0.2 <= time.monotonic() - t0 < 5
    assert list(waker.commands()) == [("credit", 0, 1, 0)]


def test_the_parents_messages_wake_the_wait_and_come_in_order(pair) -> None:  # type: ignore[no-untyped-def]
    parent, waker = pair
    threading.Timer(0.3, lambda: [parent.send(m) for m in (("credit", 0, 1, 2), ("state", 0, 1, 5))]).start()
    t0 = time.monotonic()
    assert waker.wait(10)
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


def _take_n(fd: int, n: int, wakes: int) -> None:
    """The parent's side in a process of its own: ``n`` takes counted, a byte on ``wakes`` for each that says to wake."""
    reader = ring.RingReader(fd)
    for _ in range(n):
        if reader.took(3):
            os.write(wakes, b"w")
    os._exit(0)


@pytest.mark.skipif(not ring.HAS_RING, reason="shared memory (Linux)")
def test_no_wake_is_lost_while_the_parent_counts_takes_in_another_process() -> None:
    """The two processes race on the count and the word thousands of times: every wait the worker
    asks for ends with a wake (a word read half written, as ``struct.pack_into`` wrote them, lost
    about one in thirty, and the worker slept until its heartbeat), and the count it reads never goes back."""
    writer = ring.RingWriter(1 << 16)
    n = 300_000
    r, w = os.pipe()
    child = multiprocessing.get_context("fork").Process(target=_take_n, args=(os.dup(writer.fd), n, w))
    child.start()
    lost = waits = back = 0
    last = 0
    try:
        while (seen := writer.taken(3)) < n - 2:
            back += seen < last
            last = seen
            if writer.wake_at(3, seen + 2):   # (at most n: the parent gets there)
                waits += 1
                ready, _, _ = select.select([r], [], [], 5.0)
                if not ready:
                    lost += 1
                    break
                os.read(r, 1)   # (a wake, or one left from a wait that did not happen: either ends this one)
    finally:
        child.join(10)
        writer.close()
        os.close(r)
        os.close(w)
    assert lost == 0 and back == 0 and waits > 100, (lost, back, waits)
