"""Waiting on pipes, and on a wake of one's own, on every platform.

A :class:`Waker` waits until one of the pipes it was given has something to read, or until another
thread calls :meth:`Waker.wake` (a socket pair of its own, which never blocks the thread that wakes).
The partition worker's loop waits on the parent's pipe with one; the composing process waits on all
its workers' pipes with another, reading them itself (no thread between a worker's pipe and the
composing stage). :class:`Readable` tells whether one pipe has something to read, now or within a
timeout.

Where the system has ``poll`` (every platform but Windows), each is a ``select.poll`` registered once
(a wait, a wake and a look at a pipe: ~5 us); on Windows, whose pipes are named pipes that ``select``
does not take, :func:`multiprocessing.connection.wait` and ``Connection.poll`` (``poll=False``: ~15 us,
as it builds its waiter at every call).

    >>> import multiprocessing
    >>> a, b = multiprocessing.Pipe()
    >>> waker = Waker()
    >>> waker.add(b, "worker 0")
    >>> waker.wait(0.01) is None                 # nothing said, nobody woke it: the timeout passed
    True
    >>> waker.wake(); waker.wait(0.01)           # woken: no pipe to read
    []
    >>> a.send("hello"); waker.wait(0.01)
    ['worker 0']
"""

from __future__ import annotations

import select
import socket
from collections.abc import Hashable
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["HAS_POLL", "Readable", "Waker"]

#: ``select.poll`` takes this platform's pipes (not on Windows).
HAS_POLL = hasattr(select, "poll")


class Waker:
    """Waits on the pipes :meth:`add`-ed under their keys and on :meth:`wake` (see the module docstring)."""

    def __init__(self, poll: bool = HAS_POLL) -> None:
        self.r, self.w = socket.socketpair()   # (a loopback pair on Windows)
        self.r.setblocking(False)
        self.w.setblocking(False)
        self.keys: dict[int, Hashable] = {}          # a pipe's descriptor -> its key (poll)
        self.conns: dict[Hashable, Connection] = {}   # a key -> its pipe
        self.poller: Any = None
        if poll:
            self.poller = select.poll()
            self.poller.register(self.r.fileno(), select.POLLIN)

    def add(self, conn: Connection, key: Hashable) -> None:
        """Wait on ``conn`` too; :meth:`wait` names it ``key``."""
        self.conns[key] = conn
        if self.poller is not None:
            self.keys[conn.fileno()] = key
            self.poller.register(conn.fileno(), select.POLLIN)

    def discard(self, key: Hashable) -> None:
        """No longer wait on the pipe of ``key`` (before it is closed)."""
        conn = self.conns.pop(key, None)
        if conn is not None and self.poller is not None:
            fd = next((fd for fd, k in self.keys.items() if k == key), None)
            if fd is not None:
                del self.keys[fd]
                self.poller.unregister(fd)

    def wake(self) -> None:
        """End a :meth:`wait` (the one in progress, or the next); never blocks (any thread)."""
        try:
            self.w.send(b"\0")
        except OSError:   # full (BlockingIOError: the waiter is woken already), or closed
            pass

    def wait(self, timeout: float | None = None) -> list[Hashable] | None:
        """The keys of the pipes with something to read (an end of the pipe counts), once one has or
        :meth:`wake` was called (the wakes so far are taken); ``None`` where ``timeout`` seconds
        passed with neither."""
        if self.poller is not None:
            events = self.poller.poll(None if timeout is None else timeout * 1000)
            ready = [self.keys[fd] for fd, _ in events if fd in self.keys]
            woke = len(ready) < len(events)
        else:
            got = wait([*self.conns.values(), self.r], timeout)
            ready = [k for k, c in self.conns.items() if c in got]
            woke = self.r in got
        if woke:
            try:
                while self.r.recv(4096):
                    pass
            except OSError:   # (BlockingIOError: all taken)
                pass
        return ready if ready or woke else None

    def close(self) -> None:
        """Close the socket pair (a thread still waking it afterwards is ignored)."""
        self.r.close()
        self.w.close()


class Readable:
    """Whether ``conn`` has something to read (an end of the pipe counts): ``readable(timeout)``."""

    def __init__(self, conn: Connection, poll: bool = HAS_POLL) -> None:
        self.conn = conn
        self.poller: Any = None
        if poll:
            self.poller = select.poll()
            self.poller.register(conn.fileno(), select.POLLIN)

    def __call__(self, timeout: float | None = 0.0) -> bool:
        """Whether it has, now or within ``timeout`` seconds (``None``: until it has)."""
        if self.poller is not None:
            return bool(self.poller.poll(None if timeout is None else timeout * 1000))
        try:
            return self.conn.poll(timeout)
        except (OSError, EOFError):   # a broken pipe: the read says so
            return True
