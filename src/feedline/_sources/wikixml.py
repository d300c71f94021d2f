"""MediaWiki XML export dumps (``*pages-articles*.xml.bz2``, multistream too), streamed, in any language.

    sources: [{path: "bgwiki-latest-pages-articles-multistream.xml.bz2"}]     # format detected

Pages are found by an XML parser over the byte stream (:class:`~feedline._sources.wikipages.PageStream`,
expat), so any well-formed dump is read whatever its line layout (one long line too); each page
element is then parsed on its own: memory holds one page, a page's position is the offset of its
``<page>`` tag (moved back to its line's start over leading spaces), re-readable by seeking in an
uncompressed dump, and a large uncompressed dump splits into byte ranges that each start at the
first ``<page`` tag positioned in them. ``bz2`` multistream dumps are concatenated streams, which
the decompressor reads through.

Articles only by default (``namespaces: [0]``), redirects skipped. A record is
``{"text": <clean plain text>, "title": ..., "id": <page id>}``; the wikitext is cleaned with
:func:`~feedline._sources.wikitext.wikitext_to_text`, whose link rules
(:class:`~feedline._sources.wikins.LinkRules`) take the dump's own namespace names from its
``<siteinfo><namespaces>`` (``Файл``, ``Категория``) on top of a built-in table of names and
aliases in the most common languages. A page whose XML cannot be parsed is rejected as
``bad_xml`` (reading goes on at the next ``<page`` tag), one cut off by the end of the dump as
``truncated``, one with no text left after cleaning as ``empty``.

Cleaning runs off the reader's thread, on a shared process pool (:class:`PageParser`, one
process per CPU, ``FEEDLINE_PARSE_WORKERS`` to change it), in groups of pages whose results come
back in page order: the records and their positions are exactly the single-threaded reader's,
so resume states do not change.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures as cf
import logging
import os
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from typing import Any

from feedline._core import forkserver
from feedline._core.record import Rejection
from feedline._sources.files import codec_of, is_url, size_of
from feedline._sources.lines import LineReader, _broken, _locate, _shrank, _shrunk, is_broken, open_decoded
from feedline._sources.reader import Item, Reader, Split
from feedline._sources.wikins import LinkRules, siteinfo_names
from feedline._sources.wikipages import LOOKBACK, PageStream, first_page, siteinfo
from feedline._sources.wikitext import wikitext_to_text
from feedline.errors import SourceError, SpecError

__all__ = ["PageParser", "WikiXmlReader", "dump_names", "page_record", "parse_workers"]

log = logging.getLogger("feedline.sources")


def _child(el: ET.Element, name: str) -> ET.Element | None:
    for c in el:
        if c.tag.rsplit("}", 1)[-1] == name:
            return c
    return None


#: A dump's namespace names: (those of the hidden namespaces, all), from its siteinfo.
Names = tuple[tuple[str, ...], tuple[str, ...]]


def page_record(xml: bytes, path: str, line: int | None, namespaces: tuple[int, ...],
                names: Names = ((), ())) -> dict[str, Any] | Rejection | None:
    """The record of one ``<page>...</page>`` element; ``None`` for pages that are filtered out.
    ``names`` are the dump's namespace names (:func:`dump_names`)."""
    try:
        page = ET.fromstring(xml)
    except ET.ParseError as e:
        return Rejection(path, line, "bad_xml", str(e))
    ns_el, title_el, id_el = _child(page, "ns"), _child(page, "title"), _child(page, "id")
    try:
        ns = int(ns_el.text or 0) if ns_el is not None else 0
    except ValueError:
        return Rejection(path, line, "bad_xml", f"namespace {ns_el.text!r} is not a number")  # type: ignore[union-attr]
    if ns not in namespaces or _child(page, "redirect") is not None:
        return None
    rev = _child(page, "revision")
    text_el = _child(rev, "text") if rev is not None else None
    title = title_el.text if title_el is not None else None
    text = wikitext_to_text(text_el.text or "", LinkRules.of(*names)) if text_el is not None else ""
    if not text:
        return Rejection(path, line, "empty", f"page {title!r} has no text after removing markup")
    return {"text": text, "title": title, "id": id_el.text if id_el is not None else None}


class WikiXmlReader(LineReader):
    """Reads MediaWiki XML dumps page by page; pages are cleaned in parallel (:class:`PageParser`)."""

    name = "wikixml"

    def read_batches(self, split: Split, position: int, line: int) -> None:
        return None  # pages, not lines: always :meth:`read`

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        path, known = split.path, split.start == 0
        parser = PageParser(path, known, self.spec.namespaces, dump_names(path))
        last, last_line = position, line
        try:
            f, seekable = open_decoded(path)
            with f:
                if position == split.start and position > 0:  # a split: from its first page
                    found = first_page(f, position) if seekable else position
                    if found is None or (split.end is not None and found >= split.end):
                        return
                    position = last = found
                before = _before(f, seekable, position)
                if position == 0 or before.endswith(b"\n"):
                    line += 1  # `line` is the line before `position` (the last record's); this one starts a line
                stream = PageStream(f, position, before, limit=self.max_bytes, end=split.end)
                for page in stream:
                    first, end_line = line + page.first, line + page.last
                    if page.error is None:
                        yield from parser.push(page.start, page.stop, end_line, first, page.xml)
                    else:
                        kind, _, detail = page.error.partition(": ")
                        parser.ready(page.start, page.stop, end_line,
                                     Rejection(path, first if known else None, kind, detail))
                    last, last_line = page.stop, end_line
                yield from parser.flush()
            if stream.eof_at is not None and _shrank(path, stream.eof_at, split):
                yield stream.eof_at, stream.eof_at, last_line, _shrunk(path, stream.eof_at, split)
        except SourceError:
            raise
        except Exception as e:
            if not is_broken(e):
                raise
            yield from parser.flush()  # every page read whole before the break
            yield last, last, last_line, _broken(path, last, e)
        finally:
            parser.close()

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Seek to each position of a plain local dump; one forward pass otherwise."""
        if codec_of(path) is not None or is_url(path):
            return Reader.fetch(self, path, positions)
        found: dict[int, dict[str, Any]] = {}
        for p in sorted(set(positions)):
            items = self.read(Split(-1, path, 0, None), p, 0)
            try:
                item = next(items, None)
            finally:
                items.close()  # type: ignore[attr-defined]
            if item is None or item[0] != p or isinstance(item[3], Rejection):
                raise SourceError(f"{path}: no page at byte {p}; the dump changed since the state was saved")
            found[p] = item[3]
        return found


def _before(f: Any, seekable: bool, position: int) -> bytes:
    """The (up to ``LOOKBACK + 1``) bytes before ``position``; leaves ``f`` at ``position``."""
    lo = max(0, position - LOOKBACK - 1)
    if seekable:
        f.seek(lo)
    else:
        while lo > 0:
            got = f.read(min(lo, 1 << 20))
            if not got:
                break
            lo -= len(got)
    before = f.read(position - max(0, position - LOOKBACK - 1)) if position else b""
    return bytes(before)


_names_lock = threading.Lock()
_names: collections.OrderedDict[tuple[str, int | None], Names] = collections.OrderedDict()


def dump_names(path: str) -> Names:
    """The namespace names of a dump's ``<siteinfo>`` (read from its head once per file and size)."""
    key = (path, size_of(path) if not is_url(path) else None)
    with _names_lock:
        if key in _names:
            return _names[key]
    try:
        f, _seekable = open_decoded(path)
        with f:
            info = siteinfo(f)
    except Exception as e:
        if not is_broken(e):
            raise
        return (), ()
    names = siteinfo_names(info.namespaces)
    if info.namespaces:
        log.debug("wikixml %s: %s, %d namespaces from siteinfo", path, info.dbname or "?", len(info.namespaces))
    with _names_lock:
        _names[key] = names
        while len(_names) > 64:
            _names.popitem(last=False)
    return names


def parse_workers() -> int:
    """Processes that clean pages: ``FEEDLINE_PARSE_WORKERS`` if set (0 or 1: in the reader's
    thread), else the number of CPUs."""
    raw = os.environ.get("FEEDLINE_PARSE_WORKERS", "")
    if raw.strip():
        try:
            return max(0, int(raw))
        except ValueError:
            raise SpecError(f"FEEDLINE_PARSE_WORKERS={raw!r} is not an integer") from None
    return os.cpu_count() or 1


forkserver.preload_own(__name__)  # the parse processes run this module's _parse_group
_pool_lock = threading.Lock()
_pools: dict[int, _Pool] = {}


class _Pool:
    """A process pool started on a background thread (starting processes blocks for a while)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.executor: cf.ProcessPoolExecutor | None = None
        self.warm: list[cf.Future[None]] = []
        self.failed: BaseException | None = None
        threading.Thread(target=self._start, name="feedline-parse-pool", daemon=True).start()

    def _start(self) -> None:
        try:
            ex = cf.ProcessPoolExecutor(self.workers, mp_context=forkserver.context())  # the process's one server
            self.warm = [ex.submit(_warm) for _ in range(self.workers)]
            atexit.register(ex.shutdown, wait=False, cancel_futures=True)
            self.executor = ex
        except BaseException as e:  # no processes here (sandbox, frozen app): parse in the reader thread
            self.failed = e
            log.warning("wikixml: cannot start %d parse processes (%s); cleaning pages in the reader thread",
                        self.workers, e)

    def ready(self) -> cf.ProcessPoolExecutor | None:
        """The executor once every worker has started, else ``None`` (never blocks)."""
        ex = self.executor
        if ex is None or not all(f.done() for f in self.warm):
            return None
        if any(f.exception() is not None for f in self.warm):
            return None
        return ex


def _shared_pool(workers: int, start: bool = True) -> _Pool | None:
    """One pool per worker count and process, started on first use (``start``), else ``None``."""
    with _pool_lock:
        if workers not in _pools and start:
            _pools[workers] = _Pool(workers)
        return _pools.get(workers)


def _warm() -> None:
    """Run once per worker: importing this module is the start-up cost."""


def _parse_group(pages: list[bytes], path: str, lines: list[int | None], namespaces: tuple[int, ...],
                 names: Names = ((), ())) -> list[dict[str, Any] | Rejection | None]:
    return [page_record(xml, path, ln, namespaces, names) for xml, ln in zip(pages, lines, strict=True)]


class PageParser:
    """Cleans pages off the reader's thread, in order, ``GROUP`` pages per task.

    Pages go to a shared process pool (``parse_workers()`` processes; wikitext cleaning holds the
    GIL, so threads would not scale), at most ``2 x workers`` groups in flight; results come back
    in page order, so records, positions and resume states are those of the single-threaded
    reader. The pool starts once a reader has cleaned ``POOL_AFTER`` pages itself: short reads,
    fetches on resume and the first batch (64 pages of the test dump, with its redirects) do not
    pay for starting processes, which on 2 cores competed with the tokenizer and delayed the first
    batch (2.9 s -> 5-8 s). While the workers start, groups are still cleaned in this thread, so
    no record waits for them.
    """

    GROUP = 8
    POOL_AFTER = 256

    def __init__(self, path: str, known: bool, namespaces: tuple[int, ...], names: Names = ((), ())) -> None:
        self.path, self.known, self.namespaces, self.names = path, known, namespaces, names
        self.workers = parse_workers()
        self.pool = _shared_pool(self.workers, start=False) if self.workers > 1 else None
        self.cleaned = 0  # pages cleaned in this thread
        self.group: list[tuple[int, int, int, int, bytes]] = []
        self.queue: collections.deque[tuple[list[tuple[int, int, int]], Any]] = collections.deque()
        self.pooled = 0  # groups cleaned by the pool (the rest in this thread)

    def push(self, start: int, stop: int, line: int, first: int, xml: bytes) -> Iterator[Item]:
        """Add one page; yields the items that are ready, in order."""
        self.group.append((start, stop, line, first, xml))
        if len(self.group) >= self.GROUP:
            self._submit()
        while self.queue and (len(self.queue) > 2 * max(1, self.workers) or _done(self.queue[0][1])):
            yield from self._pop()

    def ready(self, start: int, stop: int, line: int, item: Rejection) -> None:
        """Queue an item that needs no parsing (after the pages before it)."""
        self._submit()
        self.queue.append(([(start, stop, line)], [item]))

    def flush(self) -> Iterator[Item]:
        self._submit()
        while self.queue:
            yield from self._pop()

    def _submit(self) -> None:
        if not self.group:
            return
        group, self.group = self.group, []
        where = [(s, e, ln) for s, e, ln, _f, _x in group]
        pages = [x for *_rest, x in group]
        firsts: list[int | None] = [f if self.known else None for _s, _e, _ln, f, _x in group]
        if self.pool is None and self.workers > 1 and self.cleaned >= self.POOL_AFTER:
            self.pool = _shared_pool(self.workers)
        ex = self.pool.ready() if self.pool is not None else None
        if ex is not None:
            handle: Any = ex.submit(_parse_group, pages, self.path, firsts, self.namespaces, self.names)
            self.pooled += 1
        else:
            handle = _parse_group(pages, self.path, firsts, self.namespaces, self.names)
            self.cleaned += len(pages)
        self.queue.append((where, handle))

    def _pop(self) -> Iterator[Item]:
        where, handle = self.queue.popleft()
        recs = handle.result() if isinstance(handle, cf.Future) else handle
        for (start, stop, line), rec in zip(where, recs, strict=True):
            if rec is not None:
                yield start, stop, line, _locate(rec, start, self.known)

    def close(self) -> None:
        """Forget pages in flight (a reader closed early, e.g. after a fetch)."""
        for _where, handle in self.queue:
            if isinstance(handle, cf.Future):
                handle.cancel()
        self.queue.clear()
        self.group = []


def _done(handle: Any) -> bool:
    return not isinstance(handle, cf.Future) or handle.done()
