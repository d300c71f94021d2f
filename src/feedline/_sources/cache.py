"""A bounded local cache of remote objects (``cache: {dir, max_bytes}`` on a source).

The first read of an object streams it from the store as usual and writes what it reads to a
temporary file beside the cache; when the read reaches the end with every byte, the copy is
renamed into place if it fits in ``max_bytes`` (copies that no process has used since this run
started make room, least recently used first). Later reads (the next epoch, a resume, another
process on the same machine) open the local copy::

    >>> cache = ObjectCache("/tmp/feedline-cache", max_bytes=50 << 30)         # doctest: +SKIP
    >>> with cache.open("s3://bucket/a.jsonl", lambda: open_url("s3://bucket/a.jsonl")) as f: ...

A copy is named by the URL and the object's identity as the store reports it (size and ETag or
modification time), so a changed object is fetched again, never served stale. A read that seeks
(a resume mid-object) or stops early leaves nothing behind; an object larger than ``max_bytes``
is never copied. Several processes may share one directory: copies appear by atomic rename, and
a copy removed while another process reads it stays readable to that process (POSIX).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from feedline._sources.remote import PositionedRaw
from feedline.errors import SpecError

__all__ = ["ObjectCache", "object_identity"]


def object_identity(url: str) -> tuple[int | None, str]:
    """``(size, version)`` of a remote object from one metadata request (``(None, "")`` if unknown)."""
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url)
        fs.invalidate_cache(path)  # what the store says now, not a listing cached earlier in this process
        info = fs.info(path)
    except Exception:
        return None, ""
    version = next((str(info[k]) for k in ("ETag", "etag", "md5Hash", "LastModified", "mtime", "updated")
                    if info.get(k) is not None), "")
    size = info.get("size")
    return (int(size) if size is not None else None), version


class ObjectCache:
    """Whole remote objects kept in ``directory``, at most ``max_bytes`` in all (least recently used go first)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.directory = os.path.abspath(os.path.expanduser(str(directory)))
        self.max_bytes = int(max_bytes)
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except OSError as e:
            raise SpecError(f"cache.dir: cannot create the cache folder {self.directory!r} ({e.strerror or e}); "
                            "set the source's cache: {dir: ...} to a folder this process can write, "
                            "or remove cache: to read the store directly") from e
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise SpecError(f"cache.dir: the cache folder {self.directory!r} is not writable by this process; "
                            "set the source's cache: {dir: ...} to a folder it can write, or remove cache:")
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.started = time.time() - 1.0  # copies used after this (by any process) are this run's

    def path_of(self, url: str, size: int | None, version: str) -> str:
        digest = hashlib.sha256(f"{url}\0{size}\0{version}".encode()).hexdigest()[:40]
        return os.path.join(self.directory, digest)

    def open(self, url: str, opener: Callable[[], IO[bytes]]) -> IO[bytes]:
        """The object at ``url``: its local copy, or ``opener()``'s stream, copied as it is read."""
        size, version = object_identity(url)
        if size is None or size > self.max_bytes:
            return opener()
        local = self.path_of(url, size, version)
        try:
            f = open(local, "rb")  # noqa: SIM115 (returned to the caller, who closes it)
        except FileNotFoundError:
            pass
        else:
            with contextlib.suppress(OSError):
                os.utime(local)  # most recently used
            with self._lock:
                self.hits += 1
            return f
        with self._lock:
            self.misses += 1
        return io.BufferedReader(_Tee(opener(), local, size, self._admit), buffer_size=1 << 20)  # type: ignore[arg-type]

    def _entries(self) -> list[tuple[float, int, str]]:
        out = []
        with os.scandir(self.directory) as it:
            for e in it:
                if e.is_file() and not e.name.startswith("."):
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat()
                        out.append((st.st_mtime, st.st_size, e.path))
        return out

    def _admit(self, path: str) -> None:
        """Keep the new copy at ``path`` within ``max_bytes``: copies no process has used since this
        cache started make room, least recently used first; if that is not enough, the new copy goes.

        An epoch reads every object in turn; evicting the least recently used for each new one would
        evict exactly the copy the next epoch needs first (a cache smaller than the data would never
        hit). Keeping the copies made first serves ``max_bytes`` of every later epoch from disk.
        """
        entries = sorted(self._entries())
        total = sum(size for _, size, _ in entries)
        for used, size, old in entries:
            if total <= self.max_bytes:
                return
            if old != path and used < self.started:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(old)
                total -= size
        if total > self.max_bytes:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


class _Tee(PositionedRaw):
    """Reads ``source`` and writes what it reads to a temporary file, kept only if it is the whole object."""

    def __init__(self, source: IO[bytes], final: str, size: int, done: Callable[[str], None]) -> None:
        super().__init__()
        self.source, self.final, self.size, self.done = source, final, size, done
        self.tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{os.getpid()}.{secrets.token_hex(4)}")
        self.copy: Any = open(self.tmp, "wb")  # noqa: SIM115 (closed when the copy is kept or abandoned)
        self.pos = 0

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset + (self.pos if whence == io.SEEK_CUR else self.size if whence == io.SEEK_END else 0)
        if target != self.pos:
            self._abandon()  # not a straight read of the whole object: no copy
            self.pos = self.source.seek(target)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        n = len(data)
        memoryview(buffer).cast("B")[:n] = data
        self.pos += n
        if self.copy is not None:
            if n:
                self.copy.write(data)
            elif self.pos == self.size:
                self._keep()
            else:
                self._abandon()
        return n

    def close(self) -> None:
        if not self.closed:
            self._abandon()
            self.source.close()
        super().close()

    def _keep(self) -> None:
        self.copy.close()
        self.copy = None
        os.replace(self.tmp, self.final)
        self.done(self.final)

    def _abandon(self) -> None:
        if self.copy is not None:
            self.copy.close()
            self.copy = None
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.tmp)
