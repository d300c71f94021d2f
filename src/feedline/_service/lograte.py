"""Rate-limited logging for a long-running service: a flood of one message costs lines, not megabytes.

    >>> limit_log_rate(["asyncio", "aiohttp.server", "feedline.service"])    # doctest: +SKIP

A message (its logger and format string) is logged at most ``burst`` times per ``period``
seconds; the rest are counted, and the next one that passes says how many were suppressed. A
suppressed record keeps no traceback, so a hostile client cannot fill a disk with them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["RateLimit", "limit_log_rate"]


class RateLimit(logging.Filter):
    """A filter passing each (logger, message) at most ``burst`` times per ``period`` seconds."""

    def __init__(self, burst: int = 10, period: float = 60.0, clock: Callable[[], float] | None = None) -> None:
        super().__init__()
        self.burst, self.period = burst, period
        self._clock = clock or time.monotonic
        self._seen: dict[tuple[str, str], list[float]] = {}   # key -> [window start, passed, suppressed]
        self._lock = threading.Lock()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            if len(self._seen) > 10_000:   # many distinct messages: forget the oldest windows
                self._seen.clear()
            w = self._seen.setdefault(key, [now, 0, 0])
            if now - w[0] >= self.period:
                w[0], w[1] = now, 0
            if w[1] >= self.burst:
                w[2] += 1
                self.suppressed += 1
                return False
            w[1] += 1
            dropped, w[2] = int(w[2]), 0
        if dropped:
            record.msg = f"{record.msg} ({dropped} similar messages suppressed)"
        return True


def limit_log_rate(names: Iterable[str], burst: int = 10, period: float = 60.0) -> RateLimit:
    """Install one :class:`RateLimit` on each named logger (where their records are created)."""
    f = RateLimit(burst, period)
    for name in names:
        logging.getLogger(name).addFilter(f)
    return f
