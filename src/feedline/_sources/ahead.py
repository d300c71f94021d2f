"""One split decoded on a thread while the split before it is read.

A reader told which split comes next (:meth:`~feedline._sources.reader.Reader.read_ahead`) starts
its decoding here; reading that split then takes the result (:meth:`Ahead.result`, waiting for
it if it is not done) instead of decoding it again. The decoder must release the GIL for this to
gain anything (Arrow's Parquet reader does). Every reader of the process shares one thread
(``feedline-read-ahead``, started on first use, again in a forked child): starting a thread per
split made the reading thread wait for the new one to be scheduled, milliseconds on a busy machine.
A failure there is not raised: the result is ``None`` and the reader decodes the split as before,
where the same error is raised with its usual message. A forked child gets ``None`` too (no thread
there completes the parent's future).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["Ahead"]

_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the process it serves, the pool)


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None or _pool[0] != os.getpid():  # a forked child has the pool but not its thread
        _pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="feedline-read-ahead"))
    return _pool[1]


class Ahead:
    """``decode(*args)`` running on the read-ahead thread."""

    def __init__(self, decode: Callable[..., Any], *args: Any) -> None:
        self._future: Future[Any] = _executor().submit(decode, *args)
        self._pid = os.getpid()

    def result(self) -> Any:
        """What ``decode`` returned (``None`` where it failed, or in a forked child, whose copy of
        the future no thread completes), once it is done."""
        if os.getpid() != self._pid:
            return None
        try:
            return self._future.result()
        except Exception:  # met again where the split is decoded as before (see the module docstring)
            return None
