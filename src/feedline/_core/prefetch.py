"""Prefetch: run a stateful iterator on a background thread, ``depth`` elements ahead.

    >>> it = Prefetch(iter(dataset), depth=4)            # doctest: +SKIP
    >>> element, state = next(it)                        # the state *after* this element
    >>> it.get_state() == state                          # doctest: +SKIP
    True

Each element crosses the queue together with the parent's state after it (its
:meth:`~feedline._core.dataset.DatasetIterator.snapshot`: parts of it may be computed only when
:meth:`Prefetch.get_state` is called), so
:meth:`Prefetch.get_state` always describes what the *consumer* has received, however far the
thread ran ahead. :meth:`Prefetch.set_state` stops the thread and rewinds the parent; the next
:meth:`__next__` starts a fresh thread from there. An exception on the thread is raised to the
consumer; a thread that dies without one raises :class:`~feedline.errors.FeedlineError`
instead of hanging the consumer.

The parent may be an iterator or a zero-argument factory returning one (built on first use;
rebuilt after :meth:`close` or an error, then positioned at the consumer's state). ``map``
runs on the thread after each element (conversion, serialisation) and is not part of the state.
``wake`` is called when a put finds the queue empty, so an event loop polling with :meth:`poll`
never spins (a loop that is woken must then take everything ready, as it does not hear of the rest).

Stopping (:meth:`Prefetch.set_state`, :meth:`Prefetch.close`) joins the thread, which may be in
the middle of producing an element. With ``detach=True`` (an event loop's stages: the service's
producers) it never waits: a thread still inside its parent is left to finish in the background,
where its parent is closed after it, and the next start builds a fresh parent from the factory
(a parent an old thread may still be inside is never reused); an iterator parent, which cannot be
rebuilt, is refused with ``detach=True``.

With ``hold=True`` an element keeps its place in the queue after the consumer took it, until the
consumer calls :meth:`release` (or takes the next element): the thread is not woken, and does not
compete for the GIL, while the consumer is still finishing the element it took (the torch adapter
releases after making its stream wait for the batch, so its ``next()`` returns in microseconds
rather than after the thread's next burst of work).

:meth:`cut` stops the thread at once, keeping the elements it queued: the consumer takes those,
then ``StopIteration`` with :attr:`Prefetch.finished` set; ``cut`` returns the state after the last
of them (a handover: a warm-started worker starts there at once, while they are taken). The element
the thread was making is dropped, never handed out (at most one element's work lost), and the
thread is not waited for (``detach=True``: it leaves its parent in the background).

State: exactly the parent's state (a prefetch stage adds no fields of its own), so a state
saved with or without prefetching resumes either way.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from feedline._core.dataset import DatasetIterator, State
from feedline._core.deferred import materialize
from feedline.errors import FeedlineError, SpecError

__all__ = ["Prefetch"]

log = logging.getLogger("feedline")
_REAP_AFTER = 600.0   # seconds a detached thread may take to leave its parent before the parent is left open

class _End:
    """The end of the stream, with the parent's state there (``None`` where it could not be read)."""

    __slots__ = ("state",)

    def __init__(self, state: State | None) -> None:
        self.state = state


class _Failed:
    """An exception raised on the thread, on its way to the consumer; with the parent's state when
    the exception says the stream ended (``at_end``: its state there is whole)."""

    __slots__ = ("error", "state")

    def __init__(self, error: BaseException, state: State | None = None) -> None:
        self.error = error
        self.state = state


class Prefetch(DatasetIterator[tuple[Any, State]]):
    """Yields ``(element, state_after_element)`` from a thread running ``depth`` ahead.

    Args:
        parent: a stateful iterator, or a factory returning one.
        depth: elements produced ahead of the consumer (>= 1).
        map: applied to each element on the thread.
        wake: called when an element (or the end, or an error) is queued into an empty queue.
        name: the thread's name.
        detach: never join a busy thread on the caller's thread (needs a factory parent).
        hold: an element's slot is freed by :meth:`release` (or the next take), not by taking it.

    Raises:
        FeedlineError: ``depth`` below 1.
        SpecError: ``detach=True`` with an iterator for a parent (it could not be rebuilt).
    """

    def __init__(self, parent: Any, depth: int, *, map: Callable[[Any], Any] | None = None,
                 wake: Callable[[], None] | None = None, name: str = "feedline-prefetch",
                 detach: bool = False, hold: bool = False) -> None:
        if depth < 1:
            raise FeedlineError(f"prefetch depth {depth} must be >= 1")
        if callable(parent) and not hasattr(parent, "get_state"):
            self._factory: Callable[[], Any] | None = parent
            self._parent: Any = None
        elif detach:
            raise SpecError(f"{name}: detach=True needs a factory parent (a zero-argument callable returning the "
                            f"iterator), not the {type(parent).__name__} itself: a stop leaves a busy thread inside "
                            "its parent, so the next start must build a fresh one; pass the factory, or detach=False")
        else:
            self._factory, self._parent = None, parent
        self.depth = depth
        self.name = name
        self.detach = detach
        self.hold = hold
        self._held = False                 # hold: the element last taken still has its slot
        self._map = map
        self._wake = wake
        self._state: State | None = None   # state after the last element handed out (a snapshot)
        self._resolved: State | None = None  # the same, materialized (see get_state)
        self._rewind = False               # parent must be set to _state before producing
        self._ended = False
        #: The parent's state at its end, once the end was taken (a snapshot; ``None`` before, or
        #: when it could not be read): what a consumer that counts the whole stream reads.
        self.end_state: State | None = None
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=0 if hold else depth)
        self._slots = threading.Semaphore(depth)  # hold: the queue's bound, freed by release()
        self._stop = threading.Event()
        self._kept: deque[Any] | None = None   # cut: what the thread had queued, handed out next
        #: The thread was :meth:`cut` and every element it had queued was taken.
        self.finished = False
        self.pulled = 0  # elements the thread took from the parent since the last (re)start

    # ----------------------------------------------------------------- consumer side
    def __next__(self) -> tuple[Any, State]:
        item = self._take(block=True)
        assert item is not None
        return item  # type: ignore[no-any-return]

    def poll(self) -> tuple[Any, State] | None:
        """The next ``(element, state)`` if one is ready, else ``None`` (never blocks).

        Raises ``StopIteration`` at the end and the thread's exception on failure, like
        :meth:`__next__`.
        """
        return self._take(block=False)

    def _take(self, block: bool) -> tuple[Any, State] | None:
        if self._ended:
            raise StopIteration
        if self._kept is not None:   # cut: what the thread had queued, then the end
            if not self._kept:
                self._ended = self.finished = True
                raise StopIteration
            item = self._kept.popleft()
        else:
            if self._thread is None:
                self._start()
            self.release()
            item = self._get() if block else self._get_nowait()
            if item is None:
                return None
            self._held = self.hold
        if isinstance(item, _End):
            self._ended = True
            self.end_state = item.state
            self._halt()
            raise StopIteration
        if isinstance(item, _Failed):
            if item.state is not None:  # an error at the end of the stream: stand at the end (its counts)
                self._state, self._resolved = item.state, None
            self._halt(discard=True)
            raise item.error
        element, state = item
        self._state, self._resolved = state, None
        return element, state

    def _get(self) -> Any:
        while True:
            try:
                return self._queue.get(timeout=0.5)
            except queue.Empty:
                t = self._thread
                if (t is None or not t.is_alive()) and self._queue.empty():
                    return _Failed(FeedlineError(f"the {self.name} thread died without a reason"))

    def _get_nowait(self) -> Any:
        try:
            if not self._queue.qsize():   # the common empty case, without raising queue.Empty
                raise queue.Empty
            return self._queue.get_nowait()
        except queue.Empty:
            t = self._thread
            if (t is None or not t.is_alive()) and self._queue.empty():
                return _Failed(FeedlineError(f"the {self.name} thread died without a reason"))
            return None

    def release(self) -> None:
        """Free the queue slot of the element last taken (``hold=True``; otherwise nothing to do).

        Call it when done with the element, before the caller's next long piece of work: the
        thread then refills while the caller works, not while it is still taking the element.
        """
        if self._held:
            self._held = False
            self._slots.release()

    def cut(self) -> State | None:
        """Stop the thread now, keeping what it queued (see the module docstring): the state after
        the last element kept (after the last handed out, where none is), or ``None`` where the
        stream's end or an error is among them (handed out in turn: nothing comes after it)."""
        kept: deque[Any] = deque()
        if self._thread is not None:
            self._stop.set()   # the element in the making is the thread's last, and nobody's
            while True:   # (one the thread queues after this is dropped with its queue)
                try:
                    kept.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._halt(join=False)
        self._kept = kept
        last = kept[-1] if kept else None
        if isinstance(last, (_End, _Failed)):
            return None
        return self.snapshot() if last is None else last[1]  # type: ignore[no-any-return]

    def start(self) -> None:
        """Start producing now rather than at the first :meth:`__next__`/:meth:`poll`."""
        if self._thread is None and not self._ended:
            self._start()

    # ----------------------------------------------------------------- state
    def get_state(self) -> State:
        """The parent's state after the last element handed out (its start state before any)."""
        if self._state is None:
            self._state = self._ensure_parent().get_state()
        if self._resolved is None:  # the thread hands out snapshots: materialized only when asked
            self._resolved = materialize(self._state)
        return self._resolved

    def snapshot(self) -> State:
        """:meth:`get_state` as the thread took it (deferred parts not yet computed)."""
        if self._state is None:
            return self.get_state()
        return self._state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Stop the thread; the next element is the one that followed ``state``."""
        self._halt()
        self._state = self._resolved = dict(state)
        self._rewind = True
        self._ended = False
        self.end_state = None
        self._kept = None
        self.finished = False

    def close(self) -> None:
        """Stop the thread and close the parent. Idempotent; a factory parent is rebuilt on next use."""
        self._halt()
        self._kept = None   # (a cut's elements not taken are made again, if asked)
        parent, self._parent = self._parent, None
        if parent is not None:
            parent.close()
            if self._factory is None:
                self._parent = parent  # cannot be rebuilt; it raises its own error if used again

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # ----------------------------------------------------------------- thread
    def _ensure_parent(self) -> Any:
        if self._parent is None:
            assert self._factory is not None
            self._parent = self._factory()
        return self._parent

    def _start(self) -> None:
        fresh = self._parent is None
        parent = self._ensure_parent()
        if self._state is None:  # known before the thread runs, so get_state() never races it
            self._state = self._resolved = parent.get_state()
            fresh = False
        rewind = self.get_state() if self._rewind or fresh else None
        self._rewind = False
        self.pulled = 0
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=0 if self.hold else self.depth)
        self._slots, self._held = threading.Semaphore(self.depth), False
        self._thread = threading.Thread(target=self._run, args=(parent, rewind, self._queue, self._stop, self._slots),
                                        name=self.name, daemon=True)
        self._thread.start()

    def _halt(self, discard: bool = False, join: bool = True) -> None:
        """Stop the thread; the parent must be rewound to the consumer's state before producing again
        (``join=False``, detached: a busy thread is not waited for at all)."""
        t, self._thread = self._thread, None
        if t is None:
            return
        self._stop.set()
        self._slots.release(self.depth)  # unblock a held put (this run's semaphore is dropped with it)
        self._held = False
        try:  # unblock a put on a full queue
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        self._rewind = self._state is not None
        if self.detach and join and t is not threading.current_thread():
            t.join(timeout=0.05)   # a thread waiting to put leaves at once (the queue was just emptied)
        if self.detach and t.is_alive() and t is not threading.current_thread():
            parent, self._parent = self._parent, None   # the next start builds a fresh one
            threading.Thread(target=_reap, args=(t, parent), name=f"{self.name}-reaper", daemon=True).start()
            return
        if t is not threading.current_thread():
            t.join(timeout=30)
        if discard and self._factory is not None and self._parent is not None:
            parent, self._parent = self._parent, None  # after an error, start over from a fresh parent
            parent.close()

    def _put(self, q: queue.Queue[Any], stop: threading.Event, item: Any, slots: threading.Semaphore) -> bool:
        while not stop.is_set():
            if self.hold:
                if not slots.acquire(timeout=0.1):
                    continue
                if stop.is_set():
                    return False
                q.put(item)
            else:
                try:
                    q.put(item, timeout=0.1)
                except queue.Full:
                    continue
            if self._wake is not None and q.qsize() <= 1:  # more: the consumer was woken for the first
                self._wake()
            return True
        return False

    def _run(self, parent: Any, rewind: Mapping[str, Any] | None, q: queue.Queue[Any], stop: threading.Event,
             slots: threading.Semaphore) -> None:
        try:
            if rewind is not None:
                parent.set_state(rewind)
            fn = self._map
            snapshot = getattr(parent, "snapshot", parent.get_state)
            while not stop.is_set():
                try:
                    element = next(parent)
                except StopIteration:
                    try:
                        end = snapshot()
                    except Exception:  # the state is a courtesy here: the end is what matters
                        end = None
                    self._put(q, stop, _End(end), slots)
                    return
                if self._stop is stop:   # a detached old thread never counts into a newer run
                    self.pulled += 1
                if stop.is_set():   # halted while producing: the element is nobody's
                    return
                state = snapshot()
                if fn is not None:
                    element = fn(element)
                if not self._put(q, stop, (element, state), slots):
                    return
        except BaseException as e:  # forwarded to the consumer
            end = None
            if getattr(e, "at_end", False):
                try:
                    end = parent.get_state()
                except Exception:  # the state is a courtesy here: the error is what matters
                    end = None
            self._put(q, stop, _Failed(e, end), slots)


def _reap(thread: threading.Thread, parent: Any) -> None:
    """Wait (off the caller's thread) for a halted thread to leave ``parent``, then close it."""
    thread.join(timeout=_REAP_AFTER)
    if thread.is_alive():
        log.warning("%s: still producing %gs after it was stopped; its iterator is left open", thread.name, _REAP_AFTER)
        return
    if parent is not None:
        try:
            parent.close()
        except Exception as e:  # nobody waits for this close: say what failed
            log.warning("%s: closing its iterator after a stop failed: %s", thread.name, e)
