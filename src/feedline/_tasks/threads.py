"""How many task threads add throughput: :func:`useful_threads` and the count a runner starts.

    >>> thread_count(task, 14)    # doctest: +SKIP  (tokenizers' pool on: one, and a warning, once)
    1
"""

from __future__ import annotations

import logging
import os

from feedline._core.cores import OFF, usable_cores
from feedline._tasks.base import Task

__all__ = ["thread_count", "useful_threads"]

log = logging.getLogger("feedline")


def useful_threads(task: Task) -> int:
    """How many chunks of ``task`` at once add throughput: the most threads a :class:`ThreadRunner`
    starts, and ``workers: 0``'s count.

    One, where each call already spreads over every core: the ``tokenizers`` batch call runs on
    its own thread pool (Rayon) with the GIL released, and what remains is the task's Python under
    the GIL, so more calling threads only contend for both (``bench/scaling.py``: on 2 and on 16
    cores, ``workers`` 2-14 were 10-230x slower than 1 before chunks were bounded by size, and
    still slower after). Every usable core where calls run apart outside the GIL: the tokenizer's
    pool turned off (``TOKENIZERS_PARALLELISM=false``, as in Ray workers and forked children), or
    a task that says so (``parallel_calls = True``, for plug-ins whose work releases the GIL).
    Partitions (``partitions: K``) are what add cores to the Python part.
    """
    return _thread_limit(task)[0]


def _thread_limit(task: Task) -> tuple[int, str]:
    """:func:`useful_threads` and why, in words (for the log line when ``workers`` asks for more)."""
    if getattr(task, "parallel_calls", False):
        cores = usable_cores()
        return cores, f"the task's calls run apart (parallel_calls) and {cores} cores are usable"
    tokenizer = getattr(getattr(task, "ctx", None), "tokenizer", None)
    if tokenizer is not None and os.environ.get("TOKENIZERS_PARALLELISM", "").lower() in OFF:
        cores = usable_cores()
        return cores, f"the tokenizer's own pool is off (TOKENIZERS_PARALLELISM) and {cores} cores are usable"
    return 1, ("each task call already spreads over every core (the tokenizer's thread pool) and more "
               "calling threads only contend for the GIL; partitions: K adds cores")


_told: set[tuple[str, int, int]] = set()  # (task kind, requested, used) already logged in this process


def thread_count(task: Task, workers: int) -> int:
    """The threads a :class:`ThreadRunner` starts for ``workers``: at most :func:`useful_threads`.

    A request lowered is logged (a WARNING, once per process for each task kind and pair of counts):
    the spec asked for threads it does not get.
    """
    limit, why = _thread_limit(task)
    used = max(1, min(workers, limit))
    kind = str(getattr(task, "kind", type(task).__name__))
    if used < workers and (kind, workers, used) not in _told:
        _told.add((kind, workers, used))
        log.warning("workers: %d requested, %d used for task %r: %s", workers, used, kind, why)
    return used
