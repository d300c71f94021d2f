"""Decoded byte streams read a line at a time, with exact positions (what :mod:`.lines` reads).

:func:`open_decoded` opens a file or URL as UTF-8-ish bytes (a UTF-16 file with a BOM is
transcoded; a UTF-8 BOM is left for :func:`iter_lines` to strip, so positions stay file offsets);
:func:`iter_lines` yields ``(position, raw_line)`` from any position, a line longer than the bound
skipped in chunks as :class:`Oversized`; :func:`is_broken` tells a damaged stream's errors.
"""

from __future__ import annotations

import codecs
import functools
import io
import zlib
from collections.abc import Generator, Iterator
from typing import IO

from feedline._sources.files import DecodingStream, codec_of, is_url, open_binary
from feedline._sources.remote import ResumingStream, url_head

__all__ = ["BOM", "Oversized", "is_broken", "is_utf16", "iter_lines", "line_size", "lines_from", "open_decoded"]

BOM = codecs.BOM_UTF8
_UTF16 = {codecs.BOM_UTF16_LE: "utf-16-le", codecs.BOM_UTF16_BE: "utf-16-be"}

# What a broken stream raises: gzip/bz2/lzma (OSError, EOFError), zlib, zstandard (ZstdError is
# a plain Exception subclass, matched by name below).
_BROKEN: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, ValueError)


def is_broken(e: BaseException) -> bool:
    return isinstance(e, _BROKEN) or type(e).__name__ == "ZstdError"


class _Transcoder(DecodingStream):
    """UTF-16 bytes in, UTF-8 bytes out (forward only)."""

    def __init__(self, raw: IO[bytes], encoding: str) -> None:
        super().__init__(raw)
        self.decoder = codecs.getincrementaldecoder(encoding)(errors="replace")

    def _fill(self) -> bytes:
        while True:
            chunk = self.raw.read(1 << 16)
            out = self.decoder.decode(chunk, final=not chunk).encode("utf-8")
            if out or not chunk:
                return out


def open_decoded(path: str, position: int = 0) -> tuple[IO[bytes], bool]:
    """Open a file as UTF-8-ish bytes to be read from ``position``; returns ``(stream, seekable)``.

    A UTF-16 file with a BOM is transcoded to UTF-8 (BOM dropped); a UTF-8 BOM is left in place
    for :func:`iter_lines` to strip, so positions stay file offsets for plain files.
    """
    f = open_binary(path)
    if position and isinstance(getattr(f, "raw", None), ResumingStream):
        head = url_head(path, 4)  # a small ranged read: a peek would fetch a block at 0 just to seek away
    else:
        head = f.peek(4)[:4] if hasattr(f, "peek") else b""
    for bom, encoding in _UTF16.items():
        if head.startswith(bom):
            f.read(len(bom))
            return io.BufferedReader(_Transcoder(f, encoding)), False
    return f, codec_of(path) is None  # a URL seeks too: the next read is a ranged request there


def _skip(f: IO[bytes], n: int) -> None:
    while n > 0:
        got = f.read(min(n, 1 << 20))
        if not got:
            return
        n -= len(got)


class Oversized(bytes):
    """Stands for a line longer than the bound (its bytes were skipped): ``size`` is its length.

        >>> Oversized.of(10**9).size, len(Oversized.of(10**9))
        (1000000000, 0)
    """

    size: int

    @classmethod
    def of(cls, size: int) -> Oversized:
        o = cls()
        o.size = size
        return o


def _bounded(f: IO[bytes], limit: int) -> Iterator[bytes]:
    """The lines of ``f``; one longer than ``limit`` is read in chunks and comes as :class:`Oversized`."""
    while True:
        raw = f.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not raw.endswith(b"\n"):
            n = len(raw)
            del raw
            while True:
                chunk = f.readline(1 << 20)
                n += len(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield Oversized.of(n)
        else:
            yield raw


def line_size(raw: bytes) -> int:
    """The length of a line in the file (an :class:`Oversized` line's real size)."""
    return raw.size if isinstance(raw, Oversized) else len(raw)


def iter_lines(path: str, position: int = 0, *, align: bool = False,
               max_bytes: int | None = None) -> Generator[tuple[int, bytes], None, None]:
    """Yield ``(position, raw_line)`` from ``position`` to the end of the file.

    With ``align``, ``position`` may fall inside a line: reading starts at the first line that
    begins at or after it. With ``max_bytes``, a longer line is skipped in bounded memory and
    yielded as :class:`Oversized`. Errors of a broken stream propagate (see :class:`LineReader`).
    """
    f, seekable = open_decoded(path, position)
    with f:
        pos = position
        if align and position > 0:
            pos -= 1
        if pos:
            if seekable:
                f.seek(pos)
            else:
                _skip(f, pos)
        if align and position > 0:
            pos += line_size(next(_bounded(f, 1 << 20), b""))
        yield from lines_from(f, pos, max_bytes)


def lines_from(f: IO[bytes], pos: int, max_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(position, raw_line)`` of an open stream standing at byte ``pos`` (a line start):
    :func:`iter_lines` without opening, for a reader that seeks one open file to many lines."""
    for raw in (f if max_bytes is None else _bounded(f, max_bytes)):
        start = pos
        pos += line_size(raw)
        if start == 0 and raw.startswith(BOM) and not isinstance(raw, Oversized):
            raw, start = raw[len(BOM):], len(BOM)  # the record starts after the BOM
        yield start, raw


def is_utf16(path: str) -> bool:
    """Whether an uncompressed file or URL starts with a UTF-16 byte-order mark."""
    if codec_of(path) is not None:
        return False
    if is_url(path):
        return _remote_is_utf16(path)
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return False
    return head in _UTF16


@functools.lru_cache(maxsize=4096)
def _remote_is_utf16(url: str) -> bool:
    """:func:`is_utf16` of a URL, asked of the store once per process (a read of every split and
    every re-read of records would each cost a request otherwise)."""
    return url_head(url, 2) in _UTF16
