"""MediaWiki XML export dumps (``*pages-articles*.xml.bz2``, multistream too), streamed.

    sources: [{path: "enwiki-latest-pages-articles-multistream.xml.bz2"}]     # format detected

Dumps put ``<page>`` and ``</page>`` on lines of their own, so pages are found line by line and
each page element is parsed on its own: memory holds one page, a page's position is the offset
of its ``<page>`` line (re-readable by seeking in an uncompressed dump), and a large
uncompressed dump splits into byte ranges like any line-based file. ``bz2`` multistream dumps
are concatenated streams, which the decompressor reads through.

Articles only by default (``namespaces: [0]``), redirects skipped. A record is
``{"text": <clean plain text>, "title": ..., "id": <page id>}``; the wikitext is cleaned with
:func:`~feedline.sources.wikitext.wikitext_to_text`. A page whose XML cannot be parsed is
rejected as ``bad_xml``; one with no text left after cleaning as ``empty``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

from feedline.core.record import Rejection
from feedline.sources.lines import LineReader, _locate
from feedline.sources.reader import Item
from feedline.sources.wikitext import wikitext_to_text

__all__ = ["WikiXmlReader", "page_record"]


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
    """Reads MediaWiki XML dumps page by page."""

    name = "wikixml"

    def records(self, lines: Iterator[tuple[int, bytes]], path: str, line: int, known: bool,
                end: int | None) -> Iterator[Item]:
        page: list[bytes] | None = None
        start = first = 0
        for pos, raw in lines:
            line += 1
            tag = raw.strip()
            if page is None:
                if tag.startswith(b"<page>") or tag == b"<page":
                    if end is not None and pos >= end:
                        return
                    page, start, first = [raw], pos, line
                    if tag.endswith(b"</page>") and len(tag) > 6:
                        page = None
                        rec = page_record(raw, path, first if known else None, self.spec.namespaces)
                        if rec is not None:
                            yield start, pos + len(raw), line, _locate(rec, start, known)
                continue
            page.append(raw)
            if tag.endswith(b"</page>"):
                rec = page_record(b"".join(page), path, first if known else None, self.spec.namespaces)
                page = None
                if rec is not None:
                    yield start, pos + len(raw), line, _locate(rec, start, known)
        if page is not None:
            yield start, start, line, Rejection(path, first if known else None, "truncated", "the dump ends inside a <page>")
