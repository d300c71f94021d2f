"""Reading a small file a user names (a spec, a state file) without hanging or filling memory.

A FIFO would block ``open()`` until a writer came, a device (a link to ``/dev/zero``) would never
end, and a huge file would be read whole. :func:`read_bounded` opens without blocking, looks at
what it opened before reading a byte, and reads at most one byte past the limit, so that the
caller can tell "too large" apart and say so in its own words.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = os.path.join(d, "spec.yaml")
    ...     _ = open(p, "w").write("task: clm\\n")
    ...     read_bounded(p, 4)
    b'task:'
"""

from __future__ import annotations

import os
import stat

__all__ = ["NotRegularFile", "read_bounded", "utf8_error"]


class NotRegularFile(OSError):
    """The path names a folder, a FIFO or a device, not a regular file; ``what`` says which."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: is {what}, not a regular file")
        self.what = what


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` (more than ``limit``: the file is too large).

    Raises:
        FileNotFoundError: nothing is at ``path``.
        NotRegularFile: a folder, FIFO or device is (checked before any byte is read).
        OSError: it cannot be opened or read (``strerror`` says why).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
            raise NotRegularFile(os.fspath(path), what)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def utf8_error(data: bytes, e: UnicodeDecodeError) -> tuple[int, str]:
    """Where ``data`` stops being UTF-8: its line and, in words, the byte (``byte 0xff at offset 41``)."""
    return data.count(b"\n", 0, e.start) + 1, f"byte 0x{data[e.start]:02x} at offset {e.start}"
