"""The cores this process may use, and how many of them a tokenizer's own thread pool takes.

A partition worker process (:mod:`feedline._partitions.worker`) sets ``RAYON_NUM_THREADS`` to its
share of the cores, and Ray workers and the ``pack`` tool turn the pool off with
``TOKENIZERS_PARALLELISM=false`` (they already run one process per core). ``tokenizers`` reads
both itself; :func:`pool_threads` gives the same answer to the encoders whose pool feedline sizes
(``sentencepiece``'s ``num_threads``), so every backend keeps to the same share.
"""

from __future__ import annotations

import os

__all__ = ["OFF", "pool_threads", "usable_cores"]

#: ``TOKENIZERS_PARALLELISM`` values that turn a tokenizer's pool off (as ``tokenizers`` reads them).
OFF = ("0", "false", "off", "no")


def usable_cores() -> int:
    """Cores this process may run on (``sched_getaffinity`` where the OS has it, else ``cpu_count``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def pool_threads() -> int:
    """Threads one tokenizer call may spread over: 1 where ``TOKENIZERS_PARALLELISM`` turns pools
    off, ``RAYON_NUM_THREADS`` where it is set to a count (a partition worker's share), else every
    usable core."""
    if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() in OFF:
        return 1
    try:
        share = int(os.environ.get("RAYON_NUM_THREADS", ""))
    except ValueError:
        share = 0
    return share if share > 0 else usable_cores()
