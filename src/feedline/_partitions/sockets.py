"""A worker's pipe as a byte stream: written in one system call, read into a buffer of its own.

A duplex ``multiprocessing`` pipe is a socket pair on POSIX; :func:`socket_of` opens a socket over
a duplicate of its descriptor, so frames (:mod:`.frames`) go with ``sendmsg``/``recvmsg`` (several
buffers, and a descriptor, in one call). :class:`BufferedSocket` is the reading end: what the socket
has is read at once into a buffer (a frame's prefix and header, or several small frames, cost one
call, not two each), a descriptor that comes with a byte is handed to a callback, and large
payloads are read straight into their own memory.

    >>> import multiprocessing
    >>> a, b = multiprocessing.Pipe(duplex=True)
    >>> send_all(socket_of(b), [b"abc", b"defg"])
    >>> reader = BufferedSocket(socket_of(a), lambda fd: None)
    >>> bytes(reader.take(2)), bytes(reader.take(5))
    (b'ab', b'cdefg')
"""

from __future__ import annotations

import array
import os
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["BufferedSocket", "send_all", "socket_of"]

_WAITALL = getattr(socket, "MSG_WAITALL", 0)
_IOV_MAX = 512   # buffers per sendmsg/recvmsg call (the system's limit is at least 1024)
_ANCILLARY = socket.CMSG_SPACE(4) if hasattr(socket, "CMSG_SPACE") else 0   # room for one descriptor
_BUFFER = 1 << 16   # what is read at once (headers; large payloads are read into their own memory)


def socket_of(conn: Connection) -> socket.socket | None:
    """A socket over a duplicate of ``conn``'s descriptor, or ``None`` where it is not a socket."""
    try:
        fd = os.dup(conn.fileno())
    except (OSError, AttributeError):
        return None
    try:
        return socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None


def _advance(views: list[memoryview], n: int) -> list[memoryview]:
    """``views`` without their first ``n`` bytes."""
    i = 0
    while i < len(views) and n >= views[i].nbytes:
        n -= views[i].nbytes
        i += 1
    rest = views[i:]
    if n:
        rest[0] = rest[0][n:]
    return rest


def send_all(sock: socket.socket, views: list[Any], ancillary: list[Any] | None = None, one: bool = False) -> None:
    """Write ``views`` in order, in one system call where the socket takes them all (``sendmsg``;
    ``ancillary`` goes with the first byte); ``one``: a single ``bytes``, tried whole first."""
    if one:
        n = sock.sendmsg(views, ancillary or ())
        if n == len(views[0]):
            return
        views, ancillary = [memoryview(views[0])[n:]], None
    pending = [m for m in (memoryview(v).cast("B") for v in views) if m.nbytes]
    while pending:
        pending = _advance(pending, sock.sendmsg(pending[:_IOV_MAX], ancillary or []))
        ancillary = None


class BufferedSocket:
    """The reading end (one thread at a time): bytes taken in order, from the buffer first; each
    descriptor that comes with a byte goes to ``on_fd`` (which owns it), any more in one message are closed."""

    def __init__(self, sock: socket.socket, on_fd: Callable[[int], None], size: int = _BUFFER) -> None:
        self.sock, self.on_fd = sock, on_fd
        self.buf = bytearray(size)   # read from the socket, not yet taken: buf[lo:hi]
        self.view = memoryview(self.buf)
        self.lo = self.hi = 0
        self.drained = False   # the last read took all the socket had then

    def buffered(self) -> int:
        """The bytes read and not yet taken."""
        return self.hi - self.lo

    def fill(self, flags: int = 0) -> bool:
        """Read what the socket has (at least a byte: waits for one, unless ``flags`` says not to);
        ``False`` where nothing was there (``MSG_DONTWAIT``).

        Raises:
            EOFError: the other end closed the pipe.
        """
        if self.lo == self.hi:
            self.lo = self.hi = 0
        elif self.hi == len(self.buf):   # full
            self._compact()
        free = len(self.buf) - self.hi
        try:
            got, ancillary, _, _ = self.sock.recvmsg_into([self.view[self.hi:]], _ANCILLARY, flags)
        except BlockingIOError:
            self.drained = True
            return False
        if got == 0:
            raise EOFError("the partition worker closed its pipe")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                for fd in fds[1:]:
                    os.close(fd)
                if fds:
                    self.on_fd(fds[0])
        self.hi += got
        self.drained = got < free
        return True

    def _compact(self) -> None:
        """Move what is read and not yet taken to the buffer's start."""
        n = self.hi - self.lo
        self.buf[:n] = bytes(self.view[self.lo:self.hi])   # (a copy: the two overlap)
        self.lo, self.hi = 0, n

    def take(self, n: int) -> bytes | memoryview:
        """The next ``n`` bytes (waiting for them): where the buffer has them, a view of it, valid
        until the next read (so used at once), else a copy."""
        if self.hi - self.lo >= n:
            self.lo += n
            return self.view[self.lo - n:self.lo]
        if n > len(self.buf):   # (a large pickled header) read beside the buffer
            big = bytearray(n)
            self.read_all([memoryview(big)])
            return bytes(big)
        while self.hi - self.lo < n:
            if len(self.buf) - self.lo < n:   # not room enough after lo
                self._compact()
            self.fill()
        self.lo += n
        return bytes(self.view[self.lo - n:self.lo])

    def read_all(self, views: list[memoryview]) -> None:
        """Fill ``views`` in order (what the buffer has first), in one system call where the kernel has the rest (``MSG_WAITALL``)."""
        pending = [v.cast("B") for v in views if v.nbytes]
        while pending and self.lo < self.hi:
            k = min(pending[0].nbytes, self.hi - self.lo)
            pending[0][:k] = self.view[self.lo:self.lo + k]
            self.lo += k
            pending = _advance(pending, k)
        while pending:
            k = self.sock.recvmsg_into(pending[:_IOV_MAX], 0, _WAITALL)[0]
            if k == 0:
                raise EOFError("the partition worker closed its pipe")
            pending = _advance(pending, k)
