"""Recipes and their stateful iterators: the protocol every pipeline stage follows.

A :class:`Dataset` is a *recipe*: immutable, cheap, built from options, doing no I/O. Iterating
it creates a :class:`DatasetIterator`, the *cursor*, which owns all mutable state and can save
and restore it::

    it = iter(dataset)
    first = next(it)
    state = it.get_state()      # nested, JSON-serialisable dict
    it2 = iter(dataset)
    it2.set_state(state)        # it2 now yields exactly what it would have yielded next

State is nested: a stage returns ``{"parent": parent.get_state(), ...its own small fields}``.
Keys are class constants; shapes stay constant over an iterator's life.

Restores ask the parent. A stage that holds records or examples across elements keeps their
keys/refs in its state and rebuilds them through its own recipe's parent chain:
``parent.fetch(keys)`` re-reads records (answered by the sources), ``parent.rebuild(refs)``
rebuilds examples (answered by the task map, which re-reads and re-processes their records in
one batched call). A stage that changes records or examples must override these two so a
restore sees what its iteration would have produced; a stage that only reorders or groups them
inherits the delegation.
"""

from __future__ import annotations

import functools
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from feedline.errors import StateError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from feedline._core.record import Example, ExampleRef, Key

__all__ = ["Dataset", "DatasetIterator", "State"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
State = dict[str, Any]


class DatasetIterator(ABC, Iterator[T_co]):
    """A stateful cursor over a recipe's elements.

    The base class owns what every stage repeats:

    - **parents**: ``self.parent`` (or :meth:`parents` for several) is closed by :meth:`close`
      after the stage's own :meth:`release`; closing is recursive and idempotent.
    - **declared keys**: ``STATE_KEYS`` names the stage's own fields (``STATE_DEFAULTS`` gives
      values for keys added later, so older states still load).
    - **state nesting**: a stage that declares its own keys in ``STATE_KEYS`` and implements
      :meth:`own_state` / :meth:`restore` gets ``get_state() == {"parent": <parent's state>,
      **own_state()}`` and a ``set_state`` that restores the parent, then hands :meth:`restore`
      exactly its own keys. A stage without a parent keeps only its own keys.
    - **errors**: a malformed state (a missing key, a wrong type) becomes a
      :class:`~feedline.errors.StateError` naming the stage and the keys it expects, in any
      ``set_state``, including ones a stage writes itself.

    Example, a stage that counts what passed through::

        class _CountIterator(DatasetIterator[T]):
            STATE_KEYS = ("seen",)

            def __init__(self, ds):
                self.parent, self.seen = iter(ds.parent), 0

            def __next__(self):
                x = next(self.parent)
                self.seen += 1
                return x

            def own_state(self):
                return {"seen": self.seen}

            def restore(self, own):
                self.seen = int(own["seen"])
    """

    #: The key of the parent's state in this stage's state.
    PARENT: ClassVar[str] = "parent"
    #: This stage's own state keys (the parent's excluded), as written by :meth:`own_state`.
    STATE_KEYS: ClassVar[tuple[str, ...]] = ()
    #: Values for own keys missing from a state saved before the key existed (how a stage adds a
    #: field without breaking old states).
    STATE_DEFAULTS: ClassVar[Mapping[str, Any]] = {}
    #: The stage's name in error messages (default: the class name).
    NAME: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "set_state" in cls.__dict__:
            cls.set_state = _wrapped_set_state(cls.__dict__["set_state"])  # type: ignore[method-assign]

    def __iter__(self) -> DatasetIterator[T_co]:
        return self

    @abstractmethod
    def __next__(self) -> T_co:
        """Return the next element or raise ``StopIteration`` at the end of the stream."""

    def take(self, n: int) -> Sequence[T_co]:
        """The next ``n`` elements (fewer at the end of the stream), the state then as after ``n``
        calls of ``next``. Stages that can read many elements faster than one by one override it
        (a pre-tokenized source returns its records as one :class:`~feedline._core.documents.TokenRecords`)."""
        return list(itertools.islice(self, n))

    # ----------------------------------------------------------------- state
    def get_state(self) -> State:
        """Return the JSON-serialisable state after the last element returned."""
        parent = self._single_parent()
        own = self.own_state()
        return own if parent is None else {self.PARENT: parent.get_state(), **own}

    def snapshot(self) -> State:
        """:meth:`get_state`, possibly with :class:`~feedline._core.deferred.Deferred` values (cheap to
        take after every element; :func:`~feedline._core.deferred.materialize` gives the state)."""
        return self.get_state()

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`get_state`; the next element is the one that followed it."""
        defaults = self.STATE_DEFAULTS
        own = {k: state[k] if k in state or k not in defaults else defaults[k] for k in self.STATE_KEYS}
        parent = self._single_parent()
        if parent is not None:
            parent.set_state(state[self.PARENT])
        self.restore(own)

    def _single_parent(self) -> DatasetIterator[Any] | None:
        p = getattr(self, "parent", None)
        return p if isinstance(p, DatasetIterator) else None

    def own_state(self) -> State:
        """This stage's own fields (``STATE_KEYS``), without the parent's."""
        if self.STATE_KEYS:
            raise NotImplementedError(f"{type(self).__name__} declares STATE_KEYS but does not implement own_state()")
        return {}

    def restore(self, own: Mapping[str, Any]) -> None:
        """Restore this stage's own fields (the parent is already restored)."""
        if self.STATE_KEYS:
            raise NotImplementedError(f"{type(self).__name__} declares STATE_KEYS but does not implement restore()")

    # ----------------------------------------------------------------- lifecycle
    def parents(self) -> tuple[DatasetIterator[Any], ...]:
        """The iterators this one reads from (default: ``self.parent`` when it is one).

        A stage with several parents (the mixture) overrides this for :meth:`close`, and writes
        their states itself.
        """
        p = self._single_parent()
        return () if p is None else (p,)

    def release(self) -> None:
        """Release this stage's own resources (threads, open files). Idempotent; default: nothing."""
        return None

    def close(self) -> None:
        """Release resources held by this iterator, then by its parents. Idempotent."""
        self.release()
        for p in self.parents():
            p.close()

    def __enter__(self) -> DatasetIterator[T_co]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wrapped_set_state(set_state: Any) -> Any:
    """``set_state`` that reports a malformed state as a StateError naming the stage."""
    if getattr(set_state, "_feedline_wrapped", False):
        return set_state

    @functools.wraps(set_state)
    def wrapper(self: DatasetIterator[Any], state: Mapping[str, Any]) -> None:
        try:
            set_state(self, state)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            keys = ", ".join((self.PARENT,) * bool(self.parents()) + self.STATE_KEYS) or "see its docstring"
            name = self.NAME or type(self).__name__
            raise StateError(f"{name}: malformed state ({type(e).__name__}: {e}); expected keys {keys}") from e

    wrapper._feedline_wrapped = True  # type: ignore[attr-defined]
    return wrapper


DatasetIterator.set_state = _wrapped_set_state(DatasetIterator.set_state)  # type: ignore[method-assign]


class Dataset(ABC, Generic[T_co]):
    """An immutable recipe; ``iter(dataset)`` returns a fresh :class:`DatasetIterator`."""

    @abstractmethod
    def __iter__(self) -> DatasetIterator[T_co]:
        """Create a new iterator positioned at the start of the stream."""

    def fetch(self, keys: Sequence[Key]) -> Mapping[Key, dict[str, Any]]:
        """Re-read records by key (asks the parent; record sources answer)."""
        return self._parent_for("fetch").fetch(keys)  # type: ignore[no-any-return]

    def rebuild(self, refs: Sequence[ExampleRef]) -> list[Example]:
        """Rebuild examples by ref, in order (asks the parent; the task map answers)."""
        return self._parent_for("rebuild").rebuild(refs)  # type: ignore[no-any-return]

    def _parent_for(self, what: str) -> Any:
        parent = getattr(self, "parent", None)
        if not isinstance(parent, Dataset):
            raise StateError(f"{type(self).__name__} has no parent to {what} from; a stage at the bottom of a "
                             f"pipeline must implement {what}() to restore the buffers above it")
        return parent
