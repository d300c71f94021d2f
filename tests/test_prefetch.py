"""Prefetch: the one thread stage behind the Loader, the service producer and the torch adapter."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from feedline._core.dataset import DatasetIterator, State
from feedline._core.prefetch import Prefetch
from feedline.errors import FeedlineError, SourceError, SpecError


class Counter(DatasetIterator[int]):
    """Yields 0..n-1; state {"i": next index}; optionally fails at one index."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.i, self.fail_at = n, 0, fail_at
        self.closed = 0
        self.thread: str | None = None

    def __next__(self) -> int:
        self.thread = threading.current_thread().name
        if self.i == self.fail_at:
            raise SourceError(f"bad record at {self.i}")
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def get_state(self) -> State:
        return {"i": self.i}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.i = int(state["i"])

    def close(self) -> None:
        self.closed += 1


def test_elements_arrive_with_the_state_after_them_from_a_thread() -> None:
    parent = Counter(5)
    pf = Prefetch(parent, depth=2, name="t-prefetch")
    assert pf.get_state() == {"i": 0}
    got = list(pf)
    assert got == [(i, {"i": i + 1}) for i in range(5)]
    assert parent.thread == "t-prefetch"
    assert pf.get_state() == {"i": 5}
    with pytest.raises(StopIteration):  # the end is sticky
        next(pf)


def test_state_names_what_the_consumer_took_not_what_the_thread_read() -> None:
    parent = Counter(100)
    pf = Prefetch(parent, depth=4)
    next(pf), next(pf)
    for _ in range(200):  # let the thread fill its queue
        if parent.i >= 7:
            break
        threading.Event().wait(0.01)
    threading.Event().wait(0.05)
    assert parent.i == 7  # two taken, four queued, one waiting to be put: bounded by depth
    assert pf.get_state() == {"i": 2}
    pf.set_state(pf.get_state())
    assert next(pf) == (2, {"i": 3})
    pf.close()


def test_set_state_rewinds_and_restarts() -> None:
    pf = Prefetch(Counter(10), depth=3)
    first = [next(pf) for _ in range(4)]
    pf.set_state({"i": 1})
    assert pf.get_state() == {"i": 1}
    assert [next(pf) for _ in range(3)] == first[1:4]
    pf.set_state({"i": 9})
    assert list(pf) == [(9, {"i": 10})]
    pf.set_state({"i": 8})  # after the end too
    assert next(pf) == (8, {"i": 9})
    pf.close()


def test_an_error_on_the_thread_reaches_the_consumer_after_the_good_elements() -> None:
    pf = Prefetch(Counter(10, fail_at=3), depth=2)
    assert [next(pf)[0] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(SourceError, match="bad record at 3"):
        next(pf)
    assert pf.get_state() == {"i": 3}
    assert not pf.running


def test_a_factory_parent_is_rebuilt_after_an_error_and_after_close() -> None:
    built: list[Counter] = []

    def make() -> Counter:
        built.append(Counter(6, fail_at=4 if not built else None))
        return built[-1]

    pf = Prefetch(make, depth=2)
    assert [next(pf)[0] for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(SourceError):
        next(pf)
    assert built[0].closed == 1
    assert next(pf) == (4, {"i": 5})  # a fresh parent, positioned at the consumer's state
    pf.close()
    pf.close()  # idempotent
    assert built[1].closed == 1
    assert list(pf) == [(5, {"i": 6})]
    assert len(built) == 3


@pytest.mark.slow
def test_a_thread_that_dies_without_a_reason_is_an_error_not_a_hang() -> None:
    class Dying(Prefetch):
        def _run(self, *args: Any) -> None:
            return  # ends without putting anything (as a killed thread would)

    with pytest.raises(FeedlineError, match="died without a reason"):
        next(Dying(Counter(3), depth=1, name="dying"))


def test_poll_never_blocks_and_wake_is_called_per_element() -> None:
    woken = threading.Semaphore(0)
    pf = Prefetch(Counter(3), depth=1, map=lambda x: x * 10, wake=woken.release)
    got: list[int] = []
    pf.start()
    while True:
        assert woken.acquire(timeout=5)
        try:
            item = pf.poll()
        except StopIteration:
            break
        if item is not None:
            got.append(item[0])
    assert got == [0, 10, 20]


def test_depth_must_be_positive() -> None:
    with pytest.raises(FeedlineError, match="depth 0"):
        Prefetch(Counter(1), depth=0)


class Slow(Counter):
    """A counter whose element ``block_at`` takes until ``release`` is set (or 5 s)."""

    def __init__(self, n: int, block_at: int, release: threading.Event, inside: threading.Event) -> None:
        super().__init__(n)
        self.block_at, self.release, self.inside = block_at, release, inside
        self.threads: set[str] = set()

    def __next__(self) -> int:
        self.threads.add(threading.current_thread().name)
        if self.i == self.block_at:
            self.inside.set()
            self.release.wait(5)
        return super().__next__()


def test_a_detached_stop_never_waits_for_a_busy_thread_nor_reuses_its_parent() -> None:
    import time

    release, inside = threading.Event(), threading.Event()
    made: list[Slow] = []

    def factory() -> Slow:
        made.append(Slow(10, block_at=2 if not made else -1, release=release, inside=inside))
        return made[-1]

    it = Prefetch(factory, 1, detach=True)
    assert next(it)[0] == 0
    assert inside.wait(5)   # the thread holds element 1 in the queue and is inside the parent for element 2
    t0 = time.monotonic()
    it.set_state({"i": 1})
    assert time.monotonic() - t0 < 0.5, "set_state waited for the thread"
    assert [next(it)[0] for _ in range(3)] == [1, 2, 3]   # from a fresh parent, while the old one is busy
    assert len(made) == 2 and made[0].closed == 0 and len(made[1].threads) == 1
    t0 = time.monotonic()
    it.close()
    assert time.monotonic() - t0 < 0.5
    deadline = time.monotonic() + 5
    while made[1].closed == 0 and time.monotonic() < deadline:   # now, or by the reaper when it was busy
        time.sleep(0.01)
    assert made[1].closed == 1 and made[0].closed == 0
    release.set()   # the old thread leaves its parent: only then is that parent closed
    deadline = time.monotonic() + 5
    while made[0].closed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert made[0].closed == 1 and made[0].i == 3   # it finished its one element and stopped


def test_without_detach_a_stop_still_joins_the_thread() -> None:
    release, inside = threading.Event(), threading.Event()
    parent = Slow(10, block_at=2, release=release, inside=inside)
    # an iterator cannot be rebuilt, so it cannot detach: refused, naming the fix, instead of silently joining
    with pytest.raises(SpecError, match="detach=True needs a factory parent.*not the Slow itself.*detach=False"):
        Prefetch(parent, 1, detach=True)
    it = Prefetch(parent, 1)
    assert next(it)[0] == 0 and inside.wait(5)
    threading.Timer(0.2, release.set).start()
    it.set_state({"i": 5})
    assert not it.running and [next(it)[0] for _ in range(2)] == [5, 6]
    it.close()


def _settle(parent: Counter, pf: Prefetch) -> int:
    """``parent.i`` once the thread has stopped reading (it is blocked on a full queue)."""
    import time

    last = -1
    while parent.i != last:
        last = parent.i
        time.sleep(0.05)
    return last


@pytest.mark.parametrize("hold", [False, True])
def test_hold_keeps_a_taken_elements_slot_until_release(hold: bool) -> None:
    """With ``hold`` the thread does not refill while the consumer still works on what it took."""
    parent = Counter(100)
    pf = Prefetch(parent, depth=2, hold=hold)
    assert next(pf) == (0, {"i": 1})
    pf.release()
    full = _settle(parent, pf)   # depth queued plus one in the thread's hands
    assert next(pf) == (1, {"i": 2})
    after_take = _settle(parent, pf)
    assert after_take == (full if hold else full + 1)
    pf.release()
    assert _settle(parent, pf) == full + 1
    pf.release()   # nothing held: a no-op
    assert _settle(parent, pf) == full + 1
    assert [next(pf)[0] for _ in range(5)] == [2, 3, 4, 5, 6]  # a take releases what the last one held
    pf.set_state({"i": 50})   # a rewind drops the held slot with the old thread
    assert next(pf) == (50, {"i": 51})
    assert [e for e, _ in pf] == list(range(51, 100))
    pf.close()
