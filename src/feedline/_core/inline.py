"""Inline: the :class:`~feedline._core.prefetch.Prefetch` stage's protocol with no thread.

    >>> it = Inline(lambda: iter(dataset))               # doctest: +SKIP
    >>> element, state = next(it)                        # made now, in the caller's thread

``Loader(spec, prefetch=0)`` uses it: each batch is made when the caller asks for it, as LitData's
``num_workers=0`` or a torch ``DataLoader`` without workers does. So does a partition worker
(:mod:`feedline._partitions.worker`), which makes its partitions' batches in turn on its one thread
as the parent's credit allows. Nothing overlaps the caller's
work, but no batch crosses a queue either: a thread hand-off costs a consumer that does little else
(a benchmark, a CPU-bound caller on a busy machine) ~30-100 us of CPU a batch in wake-ups and GIL
switches. Elements and states are those of :class:`Prefetch` (each element with the parent's
snapshot after it), so a state saved either way resumes either way.

After an error the parent is closed and rebuilt from the factory at the state after the last
element handed out (an error at the end of the stream stands at the end, as with :class:`Prefetch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from feedline._core.dataset import State
from feedline._core.deferred import materialize

__all__ = ["Inline"]


class Inline:
    """Yields ``(element, state_after_element)`` from ``factory()``'s iterator, made on demand."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._parent: Any = None
        self._snapshot: Callable[[], State] | None = None
        self._state: State | None = None     # state after the last element handed out (a snapshot)
        self._resolved: State | None = None  # the same, materialized
        self._rewind = False                 # the parent must be set to _state before producing
        self._ended = False
        #: The parent's state at its end, once the end was taken (``None`` before).
        self.end_state: State | None = None

    def __iter__(self) -> Inline:
        return self

    def __next__(self) -> tuple[Any, State]:
        if self._ended:
            raise StopIteration
        parent = self._ensure_parent()
        try:
            if self._rewind:
                parent.set_state(self._state)
                self._rewind = False
            element = next(parent)
        except StopIteration:
            self._ended = True
            self._state, self._resolved = self._snapshot(), None  # type: ignore[misc]
            self.end_state = self._state
            raise
        except BaseException as e:
            if getattr(e, "at_end", False):  # the stream ended with this error: stand at its end
                try:
                    self._state, self._resolved = parent.get_state(), None
                except Exception:  # the state is a courtesy here: the error is what matters
                    pass
            self._drop()
            raise
        self._state, self._resolved = self._snapshot(), None  # type: ignore[misc]
        return element, self._state

    def start(self) -> None:
        """Build the parent now rather than at the first :meth:`__next__` (what building it raises is raised here)."""
        if not self._ended:
            self._ensure_parent()

    def _ensure_parent(self) -> Any:
        if self._parent is None:
            self._parent = self._factory()
            self._snapshot = getattr(self._parent, "snapshot", self._parent.get_state)
            self._rewind = self._state is not None
        return self._parent

    def _drop(self) -> None:
        parent, self._parent = self._parent, None
        if parent is not None:
            parent.close()

    def get_state(self) -> State:
        """The parent's state after the last element handed out (its start state before any)."""
        if self._state is None:
            self._state = self._ensure_parent().get_state()
        if self._resolved is None:
            self._resolved = materialize(self._state)
        return self._resolved

    def snapshot(self) -> State:
        """:meth:`get_state` with its deferred parts not yet computed."""
        return self.get_state() if self._state is None else self._state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """The next element is the one that followed ``state``."""
        self._state = self._resolved = dict(state)
        self._rewind, self._ended, self.end_state = True, False, None

    def close(self) -> None:
        """Close the parent. Idempotent; iterating again rebuilds it where the caller stands."""
        self._drop()
