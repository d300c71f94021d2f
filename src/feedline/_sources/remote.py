"""Stream a URL through ``fsspec``, retrying and resuming a dropped connection.

    >>> with open_url("https://example.org/corpus.jsonl.zst") as f:     # doctest: +SKIP
    ...     head = f.read(1024)

:class:`ResumingStream` reads forward (``seek`` reopens it elsewhere). When a read fails (connection reset, a payload cut
short, a timeout) or the body ends before the announced size, it reopens the URL at the current
offset: HTTP(S) with a ``Range: bytes=N-`` request (a server that ignores ranges answers 200 and
the first ``N`` bytes are skipped), other filesystems (s3, gs, hf) with ``seek``. It gives up
after ``retries`` attempts in a row without progress, waiting ``backoff * 2**attempt`` seconds
between them. A missing object (HTTP 404) raises :class:`~feedline.errors.SourceError` at once.
"""

from __future__ import annotations

import io
import logging
import os
import time
from typing import IO, Any

from feedline.errors import MissingDependency, SourceError

__all__ = ["PositionedRaw", "ResumingStream", "access_error", "missing_backend", "missing_bucket", "open_url", "url_head"]

log = logging.getLogger("feedline")

_CHUNK = 1 << 20
_BLOCK = 8 << 20  # an object store's ranged request: bounded memory, and a seek never fetches far behind it


# http(s) is in the base install (aiohttp is a dependency): missing it means a broken install.
_BACKENDS = {"http": ("aiohttp", "'aiohttp>=3.9'"), "https": ("aiohttp", "'aiohttp>=3.9'"),
             "s3": ("s3fs", "s3fs"), "gs": ("gcsfs", "gcsfs"), "gcs": ("gcsfs", "gcsfs"),
             "hf": ("huggingface_hub", "'feedline[hf]'"), "az": ("adlfs", "adlfs"), "abfs": ("adlfs", "adlfs")}


def missing_backend(url: str, error: BaseException) -> MissingDependency:
    """The one-line error for a URL whose fsspec backend (or fsspec itself) is not installed."""
    protocol = url.split("://", 1)[0].lower()
    module, install = _BACKENDS.get(protocol, ("fsspec", "fsspec"))
    return MissingDependency(f"{url}: reading {protocol}:// URLs needs fsspec and {module} ({error}); "
                             f"install them with: pip install fsspec {install}")


class PositionedRaw(io.RawIOBase):
    """A readable, seekable raw stream that keeps its own offset in ``pos`` (subclasses: ``seek``, ``readinto``)."""

    pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos


class ResumingStream(PositionedRaw):
    """A forward-only raw stream over ``url`` that survives dropped connections.

    Args:
        url: any URL fsspec understands (``http(s)://``, ``s3://``, ``gs://``, ``hf://``).
        retries: attempts in a row without progress before giving up.
        backoff: seconds before the first retry (doubled each time).
    """

    def __init__(self, url: str, *, retries: int = 5, backoff: float = 0.2) -> None:
        super().__init__()
        import fsspec

        self.url = url
        self.retries = retries
        self.backoff = backoff
        self.fs, self.path = fsspec.core.url_to_fs(url)
        self.http = url.split("://", 1)[0] in ("http", "https")
        self.pos = 0
        self.size: int | None = None
        self.reopens = 0
        self._f: Any = None

    # --------------------------------------------------------------- io protocol
    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset``: the next read opens the object there (a ranged request), nothing is re-read.

        Raises:
            io.UnsupportedOperation: ``SEEK_END`` on an object whose size the store does not report.
        """
        if whence == io.SEEK_CUR:
            offset += self.pos
        elif whence == io.SEEK_END:
            if self.size is None:
                self.size = self._stat_size()
            if self.size is None:  # seeking from 0 instead would read the wrong bytes without a word
                raise io.UnsupportedOperation(f"{self.url}: cannot seek from the end: the server reports no size "
                                              "for it (no Content-Length); read it from the start instead")
            offset += self.size
        elif whence != io.SEEK_SET:
            raise ValueError(f"seek: whence {whence!r} is not SEEK_SET, SEEK_CUR or SEEK_END")
        if offset != self.pos:
            self._drop()
            self.pos = max(0, offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = len(view)
        failures = 0
        while True:
            try:
                if self._f is None:
                    self._open()
                data = self._f.read(min(want, _CHUNK))
            except FileNotFoundError as e:
                raise missing_bucket(self.url, e) or SourceError(f"{self.url}: not found (HTTP 404 or missing object)") from e
            except SourceError:
                raise  # retrying cannot mend it (a server that ignores ranges)
            except Exception as e:
                refused = access_error(self.url, e)
                if refused is not None:
                    raise refused from e
                failures = self._retry(failures, f"{type(e).__name__}: {e}")
                continue
            if not data and self.size is not None and self.pos < self.size:
                failures = self._retry(failures, f"body ended at byte {self.pos} of {self.size}")
                continue
            n = len(data)
            view[:n] = data
            self.pos += n
            return n

    def close(self) -> None:
        self._drop()
        super().close()

    # --------------------------------------------------------------- internals
    def _retry(self, failures: int, why: str) -> int:
        self._drop()
        if failures >= self.retries:
            raise SourceError(f"{self.url}: connection failed {failures + 1} times at byte {self.pos} ({why}); check the URL or the network")
        delay = self.backoff * (2 ** failures)
        log.warning("%s: %s; resuming at byte %d in %.1fs", self.url, why, self.pos, delay)
        time.sleep(delay)
        self.reopens += 1
        return failures + 1

    def _drop(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except Exception:
                pass
            self._f = None

    def _open(self) -> None:
        if self.http:
            headers = {"Range": f"bytes={self.pos}-"} if self.pos else {}
            f = self.fs.open(self.path, "rb", block_size=0, headers=headers)
            if self.size is None:
                self.size = _content_length(f)
            status = getattr(getattr(f, "r", None), "status", 206)
            if self.pos and status == 200:  # the server ignored the range: skip what we have
                _discard(f, self.pos)
        else:
            f = self.fs.open(self.path, "rb", block_size=_BLOCK)
            if self.size is None:
                self.size = getattr(f, "size", None)
            _check_ranges(f, self.url)
            if self.pos:
                f.seek(self.pos)
        self._f = f


    def _stat_size(self) -> int | None:
        try:
            return int(self.fs.size(self.path))
        except Exception:
            return None


def access_error(url: str, e: BaseException) -> SourceError | None:
    """A :class:`SourceError` for an error that retrying cannot mend (no or refused credentials), else ``None``."""
    name = type(e).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError") or "Unable to locate credentials" in str(e):
        return SourceError(
            f"{url}: no credentials for {url.split('://', 1)[0]}:// ({e}); set them the standard way: "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials "
            "(AWS_SHARED_CREDENTIALS_FILE); an S3-compatible server's address goes in AWS_ENDPOINT_URL_S3")
    if isinstance(e, PermissionError) or name in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return SourceError(f"{url}: access refused ({e}); check the credentials and the bucket's policy")
    return None


def missing_bucket(url: str, e: BaseException) -> SourceError | None:
    """A :class:`SourceError` naming the bucket and what to check, for a store's "no such bucket"; else ``None``."""
    said = f"{e} {e.__cause__ or ''}"
    if "NoSuchBucket" not in said and "bucket does not exist" not in said.lower():
        return None
    protocol, _, rest = url.partition("://")
    bucket = rest.split("/", 1)[0]
    endpoint = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")) if protocol in ("s3", "s3a") else None
    at = f"at {endpoint}" if endpoint else f"at {protocol}://'s default endpoint"
    return SourceError(f"{url}: bucket {bucket!r} does not exist {at}; check the bucket's name in the path, the endpoint "
                       "(an S3-compatible server's address goes in AWS_ENDPOINT_URL_S3), and that the credentials "
                       "(AWS_PROFILE, AWS_ACCESS_KEY_ID) are for the account or server that holds it")


def _check_ranges(f: Any, url: str) -> None:
    """Make ``f``'s block fetches (fsspec's ``cache.fetcher``) fail on a body longer than the range asked for.

    A server (or a proxy before it) that ignores ``Range`` answers every block with the whole object;
    fsspec would slice the wrong bytes out of it (a resume then finds no record where the state
    says, a file "changed"). A fetch from byte 0 of the whole object is the same either way.
    """
    cache: Any = getattr(f, "cache", None)
    fetch = getattr(cache, "fetcher", None)
    if fetch is None:
        return

    def ranged(start: int, end: int) -> bytes:
        data = fetch(start, end)
        if len(data) > end - start:
            raise SourceError(f"{url}: the server ignored the range request (asked for bytes {start}-{end - 1}, "
                              f"got {len(data):,} bytes: the whole object?); reading from an offset (a resume, any "
                              "block past the first) needs a server that honours Range: check the endpoint "
                              "(AWS_ENDPOINT_URL_S3) and any proxy in front of it")
        return data  # type: ignore[no-any-return]

    cache.fetcher = ranged


def _content_length(f: Any) -> int | None:
    r = getattr(f, "r", None)
    if r is None or getattr(r, "status", 200) != 200:
        return None
    value = r.headers.get("Content-Length")
    return int(value) if value and value.isdigit() else None


def _discard(f: Any, n: int) -> None:
    while n > 0:
        got = f.read(min(n, _CHUNK))
        if not got:
            raise OSError(f"body ended while skipping to byte {n}")
        n -= len(got)


def url_head(url: str, n: int) -> bytes:
    """The first ``n`` bytes of ``url`` by one small ranged request (``b""`` when it cannot be read:
    opening it for real then reports why)."""
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url)
        return bytes(fs.cat_file(path, start=0, end=n))
    except Exception:
        return b""


def open_url(url: str, *, retries: int = 5, backoff: float = 0.2) -> IO[bytes]:
    """Open ``url`` as a buffered byte stream that resumes dropped connections.

    It reads forward; :meth:`~io.BufferedReader.seek` moves it (the next read is a ranged
    request there), so a resume starts mid-object without reading what comes before.

    Raises:
        SourceError: the URL cannot be opened (missing fsspec, unknown protocol, 404).
    """
    try:
        raw = ResumingStream(url, retries=retries, backoff=backoff)
    except ImportError as e:
        raise missing_backend(url, e) from e
    except ValueError as e:
        raise SourceError(f"{url}: unsupported URL ({e})") from e
    return io.BufferedReader(raw, buffer_size=_CHUNK)
