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

The cache never costs a record. When writing a copy fails (a full disk, a folder turned
read-only, a file size limit: ``ENOSPC``, ``EROFS``, ``EACCES``, ``EFBIG``...), the cache steps
aside: the object goes on streaming from the store, uncached, one warning names the folder and
the error, and this process makes no new copies in that folder (copies already there are still
read). A temporary holds an exclusive ``flock`` while it is written; one whose writer died (a
SIGKILL mid-copy) is removed by the next :class:`ObjectCache` on the folder, and temporaries
count towards ``max_bytes`` while they exist.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from feedline._sources.remote import PositionedRaw
from feedline.errors import SpecError

__all__ = ["ObjectCache", "object_identity"]

log = logging.getLogger("feedline")

#: Cache folders this process stopped copying into after a write failed: folder -> the error.
_STEPPED_ASIDE: dict[str, str] = {}


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


def _is_temporary(name: str) -> bool:
    return name.startswith(".")


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
        self.swept = self._sweep()

    def path_of(self, url: str, size: int | None, version: str) -> str:
        digest = hashlib.sha256(f"{url}\0{size}\0{version}".encode()).hexdigest()[:40]
        return os.path.join(self.directory, digest)

    @property
    def copying(self) -> bool:
        """Whether new copies are made (``False`` once a write failed in this process: see :meth:`step_aside`)."""
        return self.directory not in _STEPPED_ASIDE

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
        if not self.copying:
            return opener()
        try:
            copy = _Copy(local)
        except OSError as e:
            self.step_aside(url, e)
            return opener()
        return io.BufferedReader(_Tee(opener(), copy, size, self, url), buffer_size=1 << 20)  # type: ignore[arg-type]

    def step_aside(self, url: str, error: OSError) -> None:
        """Make no new copies in this folder for the rest of the process; say so once, naming the error."""
        code = errno.errorcode.get(error.errno or 0, "")
        why = f"{code}: {error.strerror}" if code and error.strerror else f"{type(error).__name__}: {error}"
        with self._lock:
            first = self.directory not in _STEPPED_ASIDE
            _STEPPED_ASIDE.setdefault(self.directory, why)
        if first:
            log.warning("cache.dir: cannot write a copy of %s in the cache folder %s (%s); the cache steps aside: "
                        "objects stream from the store, uncached, for the rest of this process (copies already "
                        "there are still read, no record is lost). Free space or fix the folder's permissions, "
                        "or remove cache: from the source", url, self.directory, why)

    def _entries(self) -> list[tuple[float, int, str, bool]]:
        """``(mtime, size, path, temporary)`` of every file in the folder."""
        out = []
        with os.scandir(self.directory) as it:
            for e in it:
                with contextlib.suppress(FileNotFoundError):
                    if e.is_file():
                        st = e.stat()
                        out.append((st.st_mtime, st.st_size, e.path, _is_temporary(e.name)))
        return out

    def _sweep(self) -> int:
        """Remove the temporaries whose writer is gone (killed mid-copy): nobody holds their lock. Returns how many."""
        removed = 0
        for _mtime, _size, path, temporary in self._entries():
            if not temporary:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live writer (this or another process) holds it, or the folder has no locks
            else:
                with contextlib.suppress(OSError):
                    os.remove(path)
                    removed += 1
            finally:
                os.close(fd)
        return removed

    def _admit(self, path: str) -> None:
        """Keep the new copy at ``path`` within ``max_bytes`` (temporaries being written count too):
        copies no process has used since this cache started make room, least recently used first;
        if that is not enough, the new copy goes.

        An epoch reads every object in turn; evicting the least recently used for each new one would
        evict exactly the copy the next epoch needs first (a cache smaller than the data would never
        hit). Keeping the copies made first serves ``max_bytes`` of every later epoch from disk.
        """
        entries = sorted(self._entries())
        total = sum(size for _, size, _, _ in entries)
        for used, size, old, temporary in entries:
            if total <= self.max_bytes:
                return
            if old != path and used < self.started and not temporary:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(old)
                total -= size
        if total > self.max_bytes:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


class _Copy:
    """A temporary beside ``final``, created and locked (``flock``) for as long as it is written."""

    def __init__(self, final: str) -> None:
        self.final = final
        self.tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{os.getpid()}.{secrets.token_hex(4)}")
        self.fd: int | None = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with contextlib.suppress(OSError):  # a folder without locks (ENOLCK): no sweep can take it either
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            assert self.fd is not None
            view = view[os.write(self.fd, view):]  # short at a size limit; the next write raises (EFBIG)

    def keep(self) -> bool:
        """Rename the finished copy into place (still locked); ``False`` if a sweep removed it first."""
        try:
            os.replace(self.tmp, self.final)
        except FileNotFoundError:  # a sweep took it in the instant between create and lock
            self.abandon()
            return False
        except OSError:
            self.abandon()
            raise
        self._close()
        return True

    def abandon(self) -> None:
        self._close()
        with contextlib.suppress(OSError):  # a read-only folder keeps it: the next start removes it
            os.remove(self.tmp)

    def _close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            with contextlib.suppress(OSError):
                os.close(fd)


class _Tee(PositionedRaw):
    """Reads ``source`` and writes what it reads to ``copy``, kept only if it is the whole object.

    A write that fails hands the error to ``cache.step_aside`` and drops the copy; the read goes on.
    """

    def __init__(self, source: IO[bytes], copy: _Copy, size: int, cache: ObjectCache, url: str) -> None:
        super().__init__()
        self.source, self.size, self.cache, self.url = source, size, cache, url
        self.copy: _Copy | None = copy
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
            try:
                if n:
                    self.copy.write(data)
                elif self.pos == self.size:
                    self._keep()
                else:
                    self._abandon()
            except OSError as e:
                self._abandon()
                self.cache.step_aside(self.url, e)
        return n

    def close(self) -> None:
        if not self.closed:
            self._abandon()
            self.source.close()
        super().close()

    def _keep(self) -> None:
        copy, self.copy = self.copy, None
        if copy is not None and copy.keep():
            self.cache._admit(copy.final)

    def _abandon(self) -> None:
        if self.copy is not None:
            copy, self.copy = self.copy, None
            copy.abandon()
