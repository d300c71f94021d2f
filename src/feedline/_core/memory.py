"""Where a batcher makes a gathered layout's arrays: an arena its thread was given, or numpy's heap.

A partition worker sends each batch's arrays to its parent through shared memory. Made on the
heap, a laid-out batch (16 x 1024, ~270 KB) was copied there once more before it went. A worker
gives the thread that makes its batches a *source* of arenas (:class:`providing`): the batcher
asks it for an arena the size of what it lays out at once (:func:`arena`: a gather of ready
rows, :mod:`feedline._batching.readyrows`) and makes those arrays in it (:func:`empty`), so the
batches sliced from them are already where the parent reads them. Anywhere else (in-process, a
thread, no room left) there is no arena and the arrays are numpy's own, as before.

    >>> import numpy as np
    >>> empty(arena(64), (2, 3), np.dtype(np.int32)).shape   # no source here: numpy's heap
    (2, 3)
    >>> class Bump:
    ...     def __init__(self, n): self.buf, self.at = np.zeros(n, np.uint8), 0
    ...     def empty(self, shape, dtype):
    ...         n = int(np.prod(shape)) * dtype.itemsize
    ...         if self.at + n > len(self.buf):
    ...             return None
    ...         self.at += n
    ...         return self.buf[self.at - n:self.at].view(dtype).reshape(shape)
    >>> with providing(Bump):
    ...     a = arena(64)
    ...     x, y = empty(a, (4,), np.dtype(np.int64)), empty(a, (8,), np.dtype(np.int64))
    >>> x.base is not None, y.base is None   # the second no longer fits: the heap's
    (True, True)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

__all__ = ["Arena", "arena", "empty", "providing"]

_local = threading.local()


class Arena(Protocol):
    """Memory handed out in order; ``None`` where an array no longer fits."""

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None: ...


def arena(nbytes: int) -> Arena | None:
    """An arena for ``nbytes`` of arrays made together, from this thread's source (``None``: none
    here, or it has no room: the caller makes them with numpy)."""
    source = getattr(_local, "source", None)
    return source(nbytes) if source is not None else None


def empty(where: Arena | None, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An uninitialised C-contiguous array, in ``where`` where it fits, else numpy's."""
    got = where.empty(shape, dtype) if where is not None else None
    return got if got is not None else np.empty(shape, dtype)


class providing:
    """``with providing(source):`` the batches this thread makes meanwhile lay their gathered arrays
    out in ``source(nbytes)``'s arenas (a class, not a generator: a worker enters it every batch)."""

    __slots__ = ("before", "source")

    def __init__(self, source: Callable[[int], Arena | None] | None) -> None:
        self.source = source
        self.before: Any = None

    def __enter__(self) -> None:
        self.before = getattr(_local, "source", None)
        _local.source = self.source

    def __exit__(self, *exc: object) -> None:
        _local.source = self.before
