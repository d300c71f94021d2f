"""What this process is waiting on, in words, for whoever has to explain a wait.

A stage that notices something holding the stream back (a worker process gone silent, a pipeline
that sends nothing) posts a notice under a key of its own and clears it when the cause is gone. A
party that must explain a wait reads :func:`current`: the loader service answers a waiting client's
ping with it, so a trainer behind ``feedline serve`` learns *why* no batch comes, not only that
none does.

One server runs several streams, each on threads of its own: a notice belongs to the stream whose
thread posted it (the thread runs inside :func:`scope`), and ``current(stream)`` gives that
stream's notices and those posted outside any stream (the process's), never another stream's.

Example::

    >>> from feedline._core import notices
    >>> with notices.scope("train"):
    ...     notices.post("w1", "the worker process of partitions [1] (pid 42) has said nothing for 15 s")
    >>> notices.current("train")
    'the worker process of partitions [1] (pid 42) has said nothing for 15 s'
    >>> notices.current("validation") is None
    True
    >>> notices.clear("w1"); notices.current("train") is None
    True
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager

__all__ = ["clear", "clear_owner", "current", "post", "scope"]

MAX_CHARS = 2000   # what a reader gets at most (a client shows it in one log line)

_lock = threading.Lock()
_notes: dict[Hashable, tuple[str | None, str]] = {}   # key -> (the stream it concerns, or None: the process; text)
_local = threading.local()


@contextmanager
def scope(stream: str) -> Iterator[None]:
    """Notices posted on this thread inside the block concern ``stream`` (nests; restores the outer one)."""
    outer = getattr(_local, "stream", None)
    _local.stream = stream
    try:
        yield
    finally:
        _local.stream = outer


def post(key: Hashable, text: str) -> None:
    """Say (or update) what ``key`` is waiting on, for the stream of the calling thread's :func:`scope`."""
    with _lock:
        _notes[key] = (getattr(_local, "stream", None), text)


def clear(key: Hashable) -> None:
    """``key``'s cause is gone (a no-op when it posted nothing; from any thread)."""
    if key in _notes:   # the common case, a message from a healthy worker, takes no lock
        with _lock:
            _notes.pop(key, None)


def clear_owner(owner: object) -> None:
    """Clear every notice whose key is a tuple starting with ``owner`` (a closing stage's)."""
    with _lock:
        for key in [k for k in _notes if isinstance(k, tuple) and k and k[0] == owner]:
            del _notes[key]


def current(stream: str | None = None) -> str | None:
    """The notices of ``stream`` and of the process (``None``: the process's only), oldest first,
    joined (at most ``MAX_CHARS``); ``None`` when there is none."""
    with _lock:
        text = "; ".join(t for s, t in _notes.values() if s is None or s == stream)
    return text[:MAX_CHARS] or None
