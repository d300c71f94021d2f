"""One split decoded on a thread while the split before it is read.

A reader told which split comes next (:meth:`~feedline._sources.reader.Reader.read_ahead`) starts
its decoding here; reading that split then takes the result (:meth:`Ahead.result`, waiting for
the thread if it has not finished) instead of decoding it again. The decoder must release the GIL
for this to gain anything (Arrow's Parquet reader does). It runs on a plain thread of its own, one
per split: nothing outlives the decoding, nothing is shared with the reading thread but the result.
A failure there is not raised: the result is ``None`` and the reader decodes the split as before,
where the same error is raised with its usual message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Ahead"]


class Ahead:
    """``decode(*args)`` running on a thread."""

    def __init__(self, decode: Callable[..., Any], *args: Any) -> None:
        self._out: Any = None
        self._thread = threading.Thread(target=self._run, args=(decode, args), name="feedline-read-ahead")
        self._thread.start()

    def _run(self, decode: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._out = decode(*args)
        except Exception:  # met again where the split is decoded as before (see the module docstring)
            self._out = None

    def result(self) -> Any:
        """What ``decode`` returned (``None`` where it failed), once the thread is done."""
        self._thread.join()
        return self._out
