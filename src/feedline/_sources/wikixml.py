"""MediaWiki XML export dumps (``*pages-articles*.xml.bz2``, multistream too), streamed.

    sources: [{path: "enwiki-latest-pages-articles-multistream.xml.bz2"}]     # format detected

Dumps put ``<page>`` and ``</page>`` on lines of their own, so pages are found line by line and
each page element is parsed on its own: memory holds one page, a page's position is the offset
of its ``<page>`` line (re-readable by seeking in an uncompressed dump), and a large
uncompressed dump splits into byte ranges like any line-based file. ``bz2`` multistream dumps
are concatenated streams, which the decompressor reads through.

Articles only by default (``namespaces: [0]``), redirects skipped. A record is
``{"text": <clean plain text>, "title": ..., "id": <page id>}``; the wikitext is cleaned with
:func:`~feedline._sources.wikitext.wikitext_to_text`. A page whose XML cannot be parsed is
rejected as ``bad_xml``; one with no text left after cleaning as ``empty``.

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
import multiprocessing as mp
import os
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

from feedline._core.record import Rejection
from feedline._sources.lines import LineReader, _locate
from feedline._sources.reader import Item
from feedline._sources.wikitext import wikitext_to_text
from feedline.errors import SpecError

__all__ = ["PageParser", "WikiXmlReader", "page_record", "parse_workers"]

log = logging.getLogger("feedline.sources")


def _child(el: ET.Element, name: str) -> ET.Element | None:
    for c in el:
        if c.tag.rsplit("}", 1)[-1] == name:
            return c
    return None


def page_record(xml: bytes, path: str, line: int | None, namespaces: tuple[int, ...]) -> dict[str, Any] | Rejection | None:
    """The record of one ``<page>...</page>`` element; ``None`` for pages that are filtered out."""
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
    text = wikitext_to_text(text_el.text or "") if text_el is not None else ""
    if not text:
        return Rejection(path, line, "empty", f"page {title!r} has no text after removing markup")
    return {"text": text, "title": title, "id": id_el.text if id_el is not None else None}


class WikiXmlReader(LineReader):
    """Reads MediaWiki XML dumps page by page; pages are cleaned in parallel (:class:`PageParser`)."""

    name = "wikixml"

    def records(self, lines: Iterator[tuple[int, bytes]], path: str, line: int, known: bool,
                end: int | None) -> Iterator[Item]:
        parser = PageParser(path, known, self.spec.namespaces)
        try:
            page: list[bytes] | None = None
            start = first = 0
            for pos, raw in lines:
                line += 1
                tag = raw.strip()
                if page is None:
                    if tag.startswith(b"<page>") or tag == b"<page":
                        if end is not None and pos >= end:
                            break
                        page, start, first = [raw], pos, line
                        if tag.endswith(b"</page>") and len(tag) > 6:
                            page = None
                            yield from parser.push(start, pos + len(raw), line, first, raw)
                    continue
                page.append(raw)
                if tag.endswith(b"</page>"):
                    yield from parser.push(start, pos + len(raw), line, first, b"".join(page))
                    page = None
            else:
                if page is not None:
                    parser.ready(start, start, line, Rejection(path, first if known else None, "truncated",
                                                               "the dump ends inside a <page>"))
            yield from parser.flush()
        finally:
            parser.close()


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
            method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
            ex = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context(method))
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


def _parse_group(pages: list[bytes], path: str, lines: list[int | None],
                 namespaces: tuple[int, ...]) -> list[dict[str, Any] | Rejection | None]:
    return [page_record(xml, path, ln, namespaces) for xml, ln in zip(pages, lines, strict=True)]


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

    def __init__(self, path: str, known: bool, namespaces: tuple[int, ...]) -> None:
        self.path, self.known, self.namespaces = path, known, namespaces
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
            handle: Any = ex.submit(_parse_group, pages, self.path, firsts, self.namespaces)
            self.pooled += 1
        else:
            handle = _parse_group(pages, self.path, firsts, self.namespaces)
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
