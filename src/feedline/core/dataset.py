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

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from feedline.errors import StateError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from feedline.core.record import Example, ExampleRef, Key

__all__ = ["Dataset", "DatasetIterator", "State"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
State = dict[str, Any]


class DatasetIterator(ABC, Iterator[T_co]):
    """A stateful cursor over a recipe's elements."""

    def __iter__(self) -> DatasetIterator[T_co]:
        return self

    @abstractmethod
    def __next__(self) -> T_co:
        """Return the next element or raise ``StopIteration`` at the end of the stream."""

    @abstractmethod
    def get_state(self) -> State:
        """Return the JSON-serialisable state after the last element returned."""

    @abstractmethod
    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`get_state`; the next element is the one that followed it."""

    def close(self) -> None:
        """Release resources held by this iterator and its parents. Idempotent."""

    def __enter__(self) -> DatasetIterator[T_co]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
