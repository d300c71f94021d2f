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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

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
