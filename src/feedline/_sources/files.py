"""Paths, globs, directories and URLs; streamed decompression chosen by file extension.

    >>> codec_of("shard-00.jsonl.zst"), strip_codec("shard-00.jsonl.zst")
    ('zstd', 'shard-00.jsonl')
"""

from __future__ import annotations

import bz2
import glob
import gzip
import io
import lzma
import os
from pathlib import Path
from typing import IO, Any

from feedline._sources.cache import ObjectCache
from feedline._sources.remote import access_error, missing_backend, missing_bucket
from feedline.errors import SourceError

__all__ = ["Bz2Stream", "ConcatenatedStream", "XzStream", "ZstdStream", "codec_of", "expand", "is_url", "open_binary", "open_raw",
           "size_of", "strip_codec", "use_cache"]

_CODECS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}


def is_url(path: str) -> bool:
    """True for ``scheme://...`` paths other than ``file://``."""
    return "://" in path and not path.startswith("file://")


def codec_of(path: str) -> str | None:
    """The compression codec implied by the file extension, or ``None``."""
    return _CODECS.get(os.path.splitext(path)[1].lower())


def strip_codec(path: str) -> str:
    """The path without its compression extension."""
    root, ext = os.path.splitext(path)
    return root if ext.lower() in _CODECS else path


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def expand(path: str) -> list[str]:
    """All files named by a path, glob, directory or URL, sorted for determinism.

    A link whose target is missing (dangling) is listed like a file: reading it fails, so the
    source's ``on_unreadable`` decides (stop, or count it as ``unreadable``), never a silent skip.

    Raises:
        SourceError: when nothing matches.
    """
    if is_url(path):
        return _expand_url(path)
    p = os.path.expanduser(_local(path))
    if any(c in p for c in "*?["):
        files = sorted(f for f in glob.glob(p, recursive=True) if os.path.isfile(f) or _dangling(f))
    elif os.path.isdir(p):
        files = sorted(
            str(f) for f in Path(p).rglob("*")
            if (f.is_file() or _dangling(str(f))) and not any(part.startswith(".") for part in f.relative_to(p).parts)
        )
    elif os.path.isfile(p):
        files = [p]
    else:
        raise SourceError(f"{path}: no such file or directory; check the source's 'path'")
    if not files:
        raise SourceError(f"{path}: no files match; check the glob or directory")
    return files


def _dangling(path: str) -> bool:
    """True for a symbolic link whose target does not exist."""
    return os.path.islink(path) and not os.path.exists(path)


# What each URL protocol needs beyond fsspec, and how to install it.
def _expand_url(url: str) -> list[str]:
    try:
        import fsspec
    except ImportError as e:  # pragma: no cover
        raise missing_backend(url, e) from e
    try:
        fs, root = fsspec.core.url_to_fs(url)
        fs.invalidate_cache()  # list what the store holds now (fsspec keeps listings per filesystem)
        protocol = url.split("://", 1)[0]
        if any(c in root for c in "*?["):
            found = sorted(fs.glob(root))
        elif protocol in ("http", "https"):
            return [url]
        else:
            # One paginated listing under the prefix (an object store lists 1,000 keys a request);
            # nothing under it, or only itself, means the URL names one object.
            found = sorted(f for f in fs.find(root.rstrip("/") + "/") if not f.endswith("/"))
            if not found:
                return [url]
    except ImportError as e:
        raise missing_backend(url, e) from e
    except (OSError, ValueError) as e:
        raise access_error(url, e) or missing_bucket(url, e) or SourceError(f"{url}: cannot list ({e})") from e
    except Exception as e:  # botocore's credential errors are not OSErrors
        refused = access_error(url, e)
        if refused is None:
            raise
        raise refused from e
    if not found:
        raise SourceError(f"{url}: no files match")
    return [f if "://" in f else f"{protocol}://{f}" for f in found]


def size_of(path: str) -> int | None:
    """The size in bytes of a local file, or ``None`` when unknown (URLs)."""
    if is_url(path):
        return None
    try:
        return os.path.getsize(_local(path))
    except OSError:
        return None


# Remote files whose source has ``cache: {dir, max_bytes}``: the URL -> its cache (set when the
# source lists its files; URLs are unique, and every process that reads a source lists it first).
_CACHES: dict[str, ObjectCache] = {}


def use_cache(urls: list[str], cache: ObjectCache | None) -> None:
    """Read ``urls`` through ``cache`` from now on (in this process); ``None`` reads them directly."""
    for url in urls:
        if not is_url(url):
            continue
        if cache is None:
            _CACHES.pop(url, None)
        else:
            _CACHES[url] = cache


def open_raw(path: str) -> IO[bytes]:
    """Open the file's bytes as stored (no decompression); a cached URL from its local copy."""
    if is_url(path):
        from feedline._sources.remote import open_url

        cache = _CACHES.get(path)
        if cache is not None:
            return cache.open(path, lambda: open_url(path))
        return open_url(path)
    try:
        return open(_local(path), "rb")
    except FileNotFoundError:
        if _dangling(_local(path)):
            raise SourceError(f"{path}: a link to {os.readlink(_local(path))}, which does not exist") from None
        raise SourceError(f"{path}: file not found (was it removed after listing?)") from None
    except OSError as e:
        raise SourceError(f"{path}: cannot open ({e.strerror})") from e


def open_binary(path: str) -> IO[bytes]:
    """Open a file or URL as a stream of decompressed bytes (never inflated to disk)."""
    raw = open_raw(path)
    codec = codec_of(path)
    if codec is None:
        return raw
    if codec == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    stream = ZstdStream(raw) if codec == "zstd" else XzStream(raw) if codec == "xz" else Bz2Stream(raw)
    return io.BufferedReader(stream, buffer_size=1 << 20)


class DecodingStream(io.RawIOBase):
    """A forward-only raw stream whose bytes come from :meth:`_fill` (decompressed, transcoded...)."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self.raw = raw
        self.pending = b""

    def _fill(self) -> bytes:
        """The next decoded bytes; ``b""`` at the end of the stream."""
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if not self.pending:
            self.pending = self._fill()
        n = min(len(view), len(self.pending))
        view[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


class ConcatenatedStream(DecodingStream):
    """Decompress concatenated streams (frames, members) of one codec, checking every one of them.

    A stream that ends inside a frame raises ``EOFError``; a decoder error (a corrupt block, a bad
    later frame, trailing garbage) raises ``OSError``, but only after every byte decoded before it
    was handed out: the input is fed :data:`_SLICE` bytes at a time, so what one failing call
    loses is bounded. (The standard library's ``BZ2File``/``LZMAFile`` drop a bad later stream
    without a word, and ``zstandard``'s ``stream_reader`` ends quietly on a truncated frame.)
    """

    codec = ""
    padding = b""  # bytes allowed between and after frames (xz stream padding)

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(raw)
        self.decoder = self._decoder()
        self.started = False  # the current frame has received input
        self.failed: BaseException | None = None  # raised at the next fill, after what came before it

    def _decoder(self) -> Any:
        """A fresh decoder with ``decompress``, ``eof`` and ``unused_data``."""
        raise NotImplementedError

    def _fill(self) -> bytes:
        if self.failed is not None:
            error, self.failed = self.failed, None
            raise error
        out = bytearray()
        while not out:
            chunk = self.raw.read(1 << 17)
            if not chunk:
                if self.started and not self.decoder.eof:
                    raise EOFError(f"{self.codec} stream ended inside a frame (truncated file?)")
                return b""
            for i in range(0, len(chunk), _SLICE):
                try:
                    self._decompress(chunk[i:i + _SLICE], out)
                except Exception as e:  # OSError, LZMAError, ZstdError: deliver what was decoded, then report it
                    error = e if isinstance(e, (OSError, EOFError)) else OSError(f"{type(e).__name__}: {e}")
                    if not out:
                        raise error from e
                    self.failed = error
                    return bytes(out)
        return bytes(out)

    def _decompress(self, data: bytes, out: bytearray) -> None:
        """Decode ``data`` into ``out``, across frame ends."""
        while data:
            if not self.started and self.padding:
                data = data.lstrip(self.padding)
                if not data:
                    return
            self.started = True
            out += self.decoder.decompress(data)
            data = b""
            if self.decoder.eof:  # next frame: feed it what the last one left over
                data = self.decoder.unused_data
                self.decoder = self._decoder()
                self.started = False


class ZstdStream(ConcatenatedStream):
    """Concatenated zstd frames (trailing zero bytes are garbage: zstd has no padding)."""

    codec = "zstd"

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard

        self.dctx = zstandard.ZstdDecompressor()
        super().__init__(raw)

    def _decoder(self) -> Any:
        return self.dctx.decompressobj()


class XzStream(ConcatenatedStream):
    """Concatenated xz streams, with the zero-byte stream padding the format allows between them."""

    codec = "xz"
    padding = b"\0"

    def _decoder(self) -> Any:
        return lzma.LZMADecompressor()


class Bz2Stream(ConcatenatedStream):
    """Concatenated bzip2 streams (as ``pbzip2`` writes them); zero bytes after one are padding, as gzip's."""

    codec = "bz2"
    padding = b"\0"

    def _decoder(self) -> Any:
        return bz2.BZ2Decompressor()


#: Compressed bytes given to a decoder per call (a corrupt block loses at most one call's output).
_SLICE = 1 << 10
