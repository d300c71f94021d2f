"""Deferred state values: parts of a state computed only when the state is read.

A stage whose state costs a pass over its buffers (the pack batcher's rows of piece refs) can
hand out a *snapshot* every step instead: the state with those parts as :class:`Deferred`
values, each a function of data the stage will never change again. :func:`materialize` turns a
snapshot into the plain JSON state, in any thread, at any later time::

    >>> snap = {"step": 3, "pipeline": {"ready": Deferred(lambda: [1, 2])}}
    >>> materialize(snap)
    {'step': 3, 'pipeline': {'ready': [1, 2]}}
    >>> snap == {"step": 3, "pipeline": {"ready": [1, 2]}}     # compares by value
    True

The prefetching loader takes a snapshot after every batch and materializes only the one a
caller asks for (``Loader.state_dict()``), so a run that checkpoints every thousand steps pays
for a thousand times fewer states.

A snapshot pickles as the state it stands for (each deferred value computed and pickled in the
same pass, no deep copy first)::

    >>> import pickle
    >>> pickle.loads(pickle.dumps(snap))
    {'step': 3, 'pipeline': {'ready': [1, 2]}}

A value made with ``ship=True`` pickles as itself, still pending: its function and the data it
reads travel instead, and the receiver computes it when (and if) its state is read. A partition
worker sends each batch's snapshot so, and the pack state's packing (lookups, zlib) is done only
by the process that reads a state (issue 34)::

    >>> from functools import partial
    >>> got = pickle.loads(pickle.dumps({"ready": Deferred(partial(sorted, [2, 1]), ship=True)}))
    >>> got
    {'ready': Deferred(pending)}
    >>> materialize(got)
    {'ready': [1, 2]}
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["Deferred", "arrived", "materialize", "sent_before", "shipping"]

_stream = threading.local()
#: The values one stream's ends keep by key (the oldest forgotten first: sent again, whole).
KEEP_SENT = 32


class Deferred:
    """A state value computed by ``fn()`` when the state is materialized (at most once); with
    ``ship``, pickled pending (``fn`` must pickle) where it would be computed first."""

    __slots__ = ("_fn", "_ship", "_value")

    def __init__(self, fn: Callable[[], Any], ship: bool = False) -> None:
        self._fn: Callable[[], Any] | None = fn
        self._ship = ship
        self._value: Any = None

    def __call__(self) -> Any:
        fn = self._fn
        if fn is not None:  # two threads may both compute it: the value is the same
            self._value, self._fn = fn(), None
        return self._value

    def __eq__(self, other: object) -> bool:  # a snapshot compares like the state it stands for
        return bool(self() == (other() if type(other) is Deferred else other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Deferred(computed)" if self._fn is None else "Deferred(pending)"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        fn = self._fn
        if self._ship and fn is not None:
            return Deferred, (fn, True)   # computed where it is read
        return _value, (self(),)   # unpickled as its value: a pickled snapshot is a plain state


def _value(value: Any) -> Any:
    return value


def materialize(state: Any) -> Any:
    """``state`` with every :class:`Deferred` value inside its dicts and lists computed (new dicts
    and lists throughout: a deep copy of a JSON state).

        >>> materialize([{"a": Deferred(lambda: 1)}, 2])
        [{'a': 1}, 2]
    """
    kind = type(state)
    if kind is Deferred:  # its value is copied too: the caller may change what it gets
        return materialize(state())
    if kind is dict:
        return {k: materialize(v) for k, v in state.items()}
    if kind is list:
        return [materialize(v) for v in state]
    return state


class shipping:
    """Pickle or unpickle, in this thread, one ordered stream (``kept`` is its end's memory): a value
    pickled by key (:func:`sent_before`, :func:`arrived`) goes whole only while the other end does
    not keep it. Both ends keep the last :data:`KEEP_SENT` keys in the same order, so they agree.
    (A class, not a generator: it wraps every message a worker sends and its parent reads.)"""

    __slots__ = ("kept",)

    def __init__(self, kept: OrderedDict[bytes, Any]) -> None:
        self.kept = kept

    def __enter__(self) -> None:
        _stream.kept = self.kept

    def __exit__(self, *exc: object) -> None:
        _stream.kept = None


def _note(kept: OrderedDict[bytes, Any], key: bytes, value: Any) -> None:
    kept[key] = value
    kept.move_to_end(key)
    if len(kept) > KEEP_SENT:
        kept.popitem(last=False)


def sent_before(key: bytes) -> bool:
    """Whether the stream being pickled for (see :func:`shipping`) carried ``key`` lately and its
    receiver keeps it; notes it as carried. Outside :func:`shipping`, never."""
    kept = getattr(_stream, "kept", None)
    if kept is None:
        return False
    known = key in kept
    _note(kept, key, None)
    return known


def arrived(key: bytes, value: Any) -> Any:
    """The receiving end of :func:`sent_before`: ``value`` when it came whole (kept under ``key``),
    else the value kept under ``key`` (``None``: unknown, outside a stream)."""
    kept = getattr(_stream, "kept", None)
    if kept is None:
        return value
    if value is None:
        value = kept.get(key)
    _note(kept, key, value)
    return value
