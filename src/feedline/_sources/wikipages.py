"""The ``<page>`` elements of a MediaWiki XML dump as byte spans, whatever its line layout.

An expat parser runs over the decoded byte stream (:func:`pages`) and reports where each
``<page>`` child of the root starts and ends (``CurrentByteIndex``); the page's bytes are cut out
of a rolling buffer and handed on whole (:class:`Page`). Nothing depends on line breaks: a dump
written on one line yields the same pages as one with ``<page>`` on lines of their own.

A page's *position* is the offset of its ``<page`` tag, moved back over the spaces before it to
the start of its line when only spaces are there (so positions are those of the line-based reader
that came before, and saved states still resume). Reading resumes at any page position (and at
the position after a page: :attr:`Page.stop`): the parser is fed ``<mediawiki>`` and then the
bytes from there (:class:`PageStream`). A byte range of a plain dump (a split) starts at the
first ``<page`` tag whose position is in it (:func:`first_page`).

A dump broken inside a page (invalid XML) costs that page: it becomes a ``bad_xml`` span
(:attr:`Page.error`) and a fresh parser starts at the next ``<page`` tag. :func:`siteinfo` reads
the ``<siteinfo>`` at the head of a dump (namespace names, language).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import IO
from xml.parsers import expat

__all__ = ["LOOKBACK", "Page", "PageStream", "SiteInfo", "first_page", "siteinfo"]

#: Bytes before a position kept for :func:`_position` (spaces before a ``<page`` tag beyond this are not looked at).
LOOKBACK = 256
_CHUNK = 1 << 20
_PAGE_TAG = re.compile(rb"<page[\s>/]")
_ROOT = b"<mediawiki>"


@dataclass(frozen=True, slots=True)
class Page:
    """A ``<page>`` element: its position, where reading resumes after it, its first and last
    line (newlines counted from the start of reading) and its bytes, or why it has none."""

    start: int
    stop: int
    first: int
    last: int
    xml: bytes = b""
    error: str | None = None  # "bad_xml", "truncated" or "too_large", then ": " and the detail


def _position(buf: bytes | bytearray, at: int, base: int) -> int:
    """The position (index in ``buf``, whose first byte is at file offset ``base``) of a tag at
    ``buf[at]``: back over the spaces before it to its line's start, if only spaces are there."""
    i, lo = at, max(0, at - LOOKBACK)
    while i > lo and buf[i - 1] in b" \t\r":
        i -= 1
    if (i == 0 and base == 0) or (i > 0 and buf[i - 1] == 0x0A):
        return i
    return at


def first_page(f: IO[bytes], start: int) -> int | None:
    """The position of the first page positioned at or after ``start`` in a seekable stream, or ``None``."""
    base = max(0, start - LOOKBACK - 1)
    f.seek(base)
    buf = bytearray()
    search = start - base
    while True:
        chunk = f.read(_CHUNK)
        buf += chunk
        for m in _PAGE_TAG.finditer(buf, search):
            pos = _position(buf, m.start(), base)
            if pos + base >= start:
                return pos + base
            search = m.start() + 1
        if not chunk:
            return None
        cut = max(0, len(buf) - LOOKBACK - 8)
        search = max(search, cut) - cut
        del buf[:cut]
        base += cut


class PageStream:
    """The pages of a stream whose next byte is at ``position`` (0, a page's position or its
    :attr:`~Page.stop`), up to the first page positioned at or after ``end``.

    ``before`` are the :data:`LOOKBACK` + 1 bytes before ``position`` (fewer near the start);
    pages longer than ``limit`` bytes come as ``too_large`` without their bytes; :attr:`eof_at` is
    the stream's length once it was read to the end. Errors of a broken stream propagate.
    """

    def __init__(self, f: IO[bytes], position: int, before: bytes, *, limit: int, end: int | None = None) -> None:
        self.f, self.limit, self.end = f, limit, end
        self.buf, self.base = bytearray(before), position - len(before)
        self.lines, self.counted = 0, position  # newlines counted from `position` up to `counted`
        self.eof_at: int | None = None
        self.stopped = False  # a page positioned at or after `end` was reached
        self._restart(position)

    def _restart(self, at: int) -> None:
        """A fresh parser for the bytes from ``at`` (after ``<mediawiki>``, except at the start)."""
        prefix = b"" if at == 0 else _ROOT
        self.parser = expat.ParserCreate("UTF-8")
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.shift, self.fed = at - len(prefix), at
        self.depth, self.closed = 0, False
        self.open: tuple[int, int, int] | None = None  # the open page: its tag, position, first line
        self.oversized = False
        self.done: list[tuple[int, int, int, int, bool]] = []  # finished pages: position, first line, end, last line, oversized
        if prefix:
            self.parser.Parse(prefix, False)

    def _count(self, upto: int) -> int:
        if upto > self.counted:
            self.lines += self.buf.count(b"\n", self.counted - self.base, upto - self.base)
            self.counted = upto
        return self.lines

    def _start(self, name: str, _attrs: object) -> None:
        self.depth += 1
        if self.depth == 2 and name == "page":
            tag = self.parser.CurrentByteIndex + self.shift
            pos = _position(self.buf, tag - self.base, self.base) + self.base
            self.open, self.oversized = (tag, pos, self._count(pos)), False

    def _end(self, name: str) -> None:
        if self.depth == 2 and name == "page" and self.open is not None:
            close = self.buf.index(b">", self.parser.CurrentByteIndex + self.shift - self.base) + 1 + self.base
            self.done.append((self.open[1], self.open[2], close, self._count(close), self.oversized))
            self.open = None
        self.depth -= 1
        self.closed = self.depth == 0

    def __iter__(self) -> Iterator[Page]:
        eof = False
        while True:
            if self.fed < self.base + len(self.buf):  # bytes read while recovering, not parsed yet
                data = bytes(self.buf[self.fed - self.base:])
            else:
                data = self.f.read(_CHUNK)
                eof = not data
                self.buf += data
                if eof:
                    self.eof_at = self.base + len(self.buf)
            self.fed += len(data)
            error: str | None = None
            at = self.fed
            if not self.closed:
                try:
                    self.parser.Parse(data, eof)
                except expat.ExpatError as e:
                    error, at = expat.ErrorString(e.code), self.parser.ErrorByteIndex + self.shift
            eof = eof or (error is None and self.closed)
            yield from self._finished(eof or error is not None)
            if self.stopped:
                return
            if error is not None:
                if eof or self.closed:
                    yield from self._truncated(at)
                    return
                resume = yield from self._recover(error, at)
                if resume is None:
                    return
                self._restart(resume)
                continue
            if eof:
                if self.open is not None:
                    yield from self._truncated(at)
                return
            self._trim()

    def _finished(self, final: bool) -> Iterator[Page]:
        """The finished pages, while the bytes after each show where the next read starts."""
        while self.done:
            pos, first, close, last, oversized = self.done[0]
            if self.end is not None and pos >= self.end:
                self.stopped = True
                return
            close -= self.base
            i = close
            while i < len(self.buf) and self.buf[i] in b" \t\r":
                i += 1
            if i == len(self.buf) and not final:
                return  # the next bytes decide whether a newline belongs to this page
            stop = i + 1 if i < len(self.buf) and self.buf[i] == 0x0A else close
            del self.done[0]
            self._count(stop + self.base)
            if close + self.base - pos > self.limit or oversized:
                yield Page(pos, stop + self.base, first, last, error=f"too_large: {close + self.base - pos:,} bytes")
            else:
                yield Page(pos, stop + self.base, first, last, bytes(self.buf[pos - self.base:close]))

    def _trim(self) -> None:
        """Drop what no page needs; an open page over ``limit`` keeps only its tail."""
        keep = self.fed if self.open is None else self.open[1]
        if self.done:
            keep = min(keep, self.done[0][0])
        if self.open is not None and not self.done and self.fed - self.open[1] > self.limit:
            self.oversized, keep = True, self.fed
        cut = keep - LOOKBACK - 1
        if cut > self.base:
            self._count(cut)
            del self.buf[:cut - self.base]
            self.base = cut

    def _truncated(self, at: int) -> Iterator[Page]:
        if self.open is not None and (self.end is None or self.open[1] < self.end):
            _tag, pos, first = self.open
            yield Page(pos, pos, first, first, error="truncated: the dump ends inside a <page>")

    def _recover(self, error: str, at: int) -> Generator[Page, None, int | None]:
        """A ``bad_xml`` page for the open one (if any); returns where the next ``<page`` tag is."""
        start = self.open[0] + 1 if self.open is not None else max(at, self.shift + len(_ROOT) + 1)
        resume: int | None = None
        while resume is None:
            m = _PAGE_TAG.search(self.buf, max(0, start - self.base))
            if m is not None:
                resume = m.start() + self.base
                break
            chunk = self.f.read(_CHUNK)
            if not chunk:
                break
            self._count(self.base + len(self.buf))
            cut = self.base + len(self.buf) - LOOKBACK - 8
            if cut > self.base:
                del self.buf[:cut - self.base]
                self.base = cut
            self.buf += chunk
        if self.open is not None:
            _tag, pos, first = self.open
            if self.end is not None and pos >= self.end:
                self.stopped = True
                return None
            stop = resume if resume is not None else self.base + len(self.buf)
            stop = _position(self.buf, stop - self.base, self.base) + self.base if resume is not None else stop
            yield Page(pos, stop, first, first, error=f"bad_xml: {error} (byte {at})")
        if resume is None:
            self.eof_at = self.base + len(self.buf)
        return resume


@dataclass(frozen=True)
class SiteInfo:
    """What a dump's ``<siteinfo>`` says: the database name (``bgwiki``) and ``{key: [names]}``."""

    dbname: str = ""
    namespaces: dict[int, list[str]] = field(default_factory=dict)

    @property
    def language(self) -> str:
        return re.sub(r"(wiki|wiktionary|wikibooks|wikinews|wikiquote|wikisource|wikiversity|wikivoyage)$", "",
                      self.dbname).replace("_", "-")


def siteinfo(f: IO[bytes], limit: int = 4 << 20) -> SiteInfo:
    """The ``<siteinfo>`` of a dump read from its start (the first ``limit`` bytes at most)."""
    head = bytearray()
    while len(head) < limit:
        chunk = f.read(1 << 16)
        if not chunk:
            break
        head += chunk
        if b"</siteinfo>" in head or _PAGE_TAG.search(head):
            break
    m = re.search(rb"<siteinfo[\s>].*?</siteinfo\s*>", head, re.DOTALL)
    if m is None:
        return SiteInfo()
    try:
        el = ET.fromstring(m.group(0))
    except ET.ParseError:
        return SiteInfo()
    names: dict[int, list[str]] = {}
    dbname = ""
    for child in el:
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "dbname":
            dbname = (child.text or "").strip()
        elif tag == "namespaces":
            for ns in child:
                try:
                    key = int(ns.get("key", ""))
                except ValueError:
                    continue
                names.setdefault(key, []).append((ns.text or "").strip())
    return SiteInfo(dbname, names)
