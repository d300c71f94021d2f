"""What this process is waiting on, in words, for whoever has to explain a wait.

A stage that notices something holding the stream back (a worker process gone silent, a pipeline
that sends nothing) posts a notice under a key of its own and clears it when the cause is gone. A
party that must explain a wait reads :func:`current`: the loader service answers a waiting client's
ping with it, so a trainer behind ``feedline serve`` learns *why* no batch comes, not only that
none does.

Example::

    >>> from feedline._core import notices
    >>> notices.post("w1", "the worker process of partitions [1] (pid 42) has said nothing for 15 s")
    >>> notices.current()
    'the worker process of partitions [1] (pid 42) has said nothing for 15 s'
    >>> notices.clear("w1"); notices.current() is None
    True
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

__all__ = ["clear", "clear_owner", "current", "post"]

MAX_CHARS = 2000   # what a reader gets at most (a client shows it in one log line)

_lock = threading.Lock()
_notes: dict[Hashable, str] = {}


def post(key: Hashable, text: str) -> None:
    """Say (or update) what ``key`` is waiting on."""
    with _lock:
        _notes[key] = text


def clear(key: Hashable) -> None:
    """``key``'s cause is gone (a no-op when it posted nothing)."""
    if key in _notes:   # the common case, a message from a healthy worker, takes no lock
        with _lock:
            _notes.pop(key, None)


def clear_owner(owner: object) -> None:
    """Clear every notice whose key is a tuple starting with ``owner`` (a closing stage's)."""
    with _lock:
        for key in [k for k in _notes if isinstance(k, tuple) and k and k[0] == owner]:
            del _notes[key]


def current() -> str | None:
    """Every notice now posted, oldest first, joined (at most ``MAX_CHARS``); ``None`` when there is none."""
    with _lock:
        text = "; ".join(_notes.values())
    return text[:MAX_CHARS] or None
